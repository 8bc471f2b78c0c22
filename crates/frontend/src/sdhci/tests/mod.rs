//! The SDHCI function end to end, without QEMU: [`SdhciBar0`] behind a [`PciServer`] on a
//! real Unix socket, driven by a small register driver (`driver.rs`) over the
//! `vfio_user` client, with guest memory a memfd the client DMA-maps (as QEMU does with
//! `memory-backend-memfd`) and interrupts through the INTx eventfd with VFIO's
//! auto-mask and the client's unmask after each one. Hostile messages, which the crate's
//! client cannot send or whose error replies it cannot read, go through the hand-written
//! wire messages of the PCI function's own tests (`pci/tests/wire.rs`).
//!
//! Every test runs inside [`within`], so a hang is a failure, not a stuck test run.

mod data;
mod driver;
mod features;
mod hostile;
mod identity;

// The PCI function's own wire helpers, shared rather than copied: its test module is
// private to `pci`, so the file is included here too.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../pci/tests/wire.rs"]
mod wire;

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::{Card, Partition};
use emmc_host::sdhci::{SdhciConfig, SdhciMmio};

use super::SdhciBar0;
use crate::pacing::{Pacing, SpinMargin};
use crate::pci::{PciIdentity, PciOptions, PciServer};

/// A built-in device model.
pub(super) fn model(name: &str) -> DeviceModel {
    DeviceModel::load(name).unwrap()
}

/// generic-emmc45 on constant-cost timing set by `f`, without a cache (so a write's busy
/// is its programming).
pub(super) fn constant_model(
    f: impl FnOnce(&mut emmc_card::model::ConstantTimingModel),
) -> DeviceModel {
    let mut m = model("generic-emmc45");
    f(m.timing.constant_mut());
    m.ext_csd.cache_size = 0;
    m
}

/// The server of one test: a card of a model on an in-memory store, behind the SDHCI
/// controller, served on a socket in a private directory until the rig is dropped.
pub(super) struct Rig {
    pub server: Arc<PciServer<SdhciBar0>>,
    pub path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Rig {
    pub fn start(m: &DeviceModel, identity: PciIdentity, pacing: Pacing) -> Rig {
        let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(m)))).unwrap();
        let config = SdhciConfig::for_model(&m.host.controller_only());
        let mmio = SdhciMmio::new(card, config, &m.host);
        let device = SdhciBar0::new(mmio, &identity.ids());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sdhci.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let options = PciOptions {
            identity,
            pacing,
            spin: SpinMargin::fixed(Duration::from_micros(200)),
        };
        let server = Arc::new(PciServer::from_listener(listener, device, options).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::spawn(move || server.serve(&stop).unwrap())
        };
        Rig {
            server,
            path,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// generic-emmc45 as the default (Intel) identity, card time not paced.
    pub fn generic() -> Rig {
        Rig::start(
            &model("generic-emmc45"),
            PciIdentity::default(),
            Pacing::Off,
        )
    }

    /// Run `f` on the card, between two register accesses.
    pub fn card<R>(&self, f: impl FnOnce(&mut Card) -> R) -> R {
        self.server.with_device(|d| f(d.mmio_mut().card_mut()))
    }

    /// `blocks` sectors of the user area as the card holds them.
    pub fn peek(&self, lba: u64, blocks: usize) -> Vec<u8> {
        let mut buf = vec![0u8; blocks * 512];
        self.card(|c| c.peek(Partition::User, lba, &mut buf))
            .unwrap();
        buf
    }

    /// Wait until `n` sessions have ended.
    pub fn sessions(&self, n: u64) {
        let until = Instant::now() + Duration::from_secs(5);
        while self.server.stats().sessions < n {
            assert!(Instant::now() < until, "timed out waiting for {n} sessions");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept with a client that leaves at once.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run `f` on its own thread and fail if it has not finished within `limit` (a hang in
/// the server or the client is then a failure with a name, not a stuck test).
pub(super) fn within(limit: Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the test did not finish within {limit:?}: a hang")
        }
    }
}

/// The usual limit of one test.
pub(super) const LIMIT: Duration = Duration::from_secs(30);

/// Bytes that differ from block to block and from seed to seed.
pub(super) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(u32::from(seed) * 7 + (i as u32 >> 9)) as u8
        })
        .collect()
}
