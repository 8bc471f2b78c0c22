//! The cost of one MMIO round trip on the SDHCI transport (issue 14), daemon side: a
//! 4-byte BAR0 read of Present State as QEMU's vfio-user-pci forwards it (one
//! REGION_READ message over the Unix socket, the server's message loop, the function's
//! lock, the register model, the reply), against the same read made in-process on the
//! register model alone. The guest's share (a TCG MMIO exit into QEMU and QEMU's own
//! vfio-user client) comes on top: docs/sdhci-transport.md, "Performance".
//!
//! `cargo bench -p emmc-frontend --bench mmio_roundtrip`

use std::os::unix::net::UnixListener;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use emmc_card::model::DeviceModel;
use emmc_card::store::MemStore;
use emmc_card::Card;
use emmc_frontend::pacing::Pacing;
use emmc_frontend::pci::{PciIdentity, PciMmio, PciOptions, PciServer};
use emmc_frontend::sdhci::SdhciBar0;
use emmc_host::sdhci::mmio::NoDmaMemory;
use emmc_host::sdhci::{SdhciConfig, SdhciMmio};

/// BAR0 and the configuration space, as VFIO numbers the regions.
const BAR0: u32 = 0;
const CONFIG: u32 = 7;
const PRESENT_STATE: u64 = 0x24;

fn controller() -> SdhciBar0 {
    let m = DeviceModel::load("generic-emmc45").unwrap();
    let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(&m)))).unwrap();
    let mmio = SdhciMmio::new(
        card,
        SdhciConfig::for_model(&m.host.controller_only()),
        &m.host,
    );
    SdhciBar0::new(mmio, &PciIdentity::default().ids())
}

fn roundtrip(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sdhci.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let options = PciOptions {
        pacing: Pacing::Off,
        ..PciOptions::default()
    };
    let server = Arc::new(PciServer::from_listener(listener, controller(), options).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    {
        let server = server.clone();
        std::thread::spawn(move || {
            let _ = server.serve_session();
        });
    }
    let mut client = vfio_user::Client::new(&path).unwrap();
    // Memory space on, as the guest's PCI core sets it before the driver binds.
    client.region_write(CONFIG, 0x04, &[0x06, 0x00]).unwrap();
    let mut word = [0u8; 4];
    client.region_read(BAR0, PRESENT_STATE, &mut word).unwrap();
    assert_ne!(
        u32::from_le_bytes(word),
        0,
        "Present State: the card is inserted"
    );

    let mut g = c.benchmark_group("mmio");
    g.bench_function("bar0_read_over_vfio_user", |b| {
        b.iter(|| {
            client.region_read(BAR0, PRESENT_STATE, &mut word).unwrap();
            word
        })
    });
    let mut local = controller();
    let mut now = 0;
    g.bench_function("bar0_read_in_process", |b| {
        b.iter(|| {
            now += 1;
            local.read(now, PRESENT_STATE, &mut word, &NoDmaMemory);
            word
        })
    });
    g.finish();
    drop(client);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
