//! What a well-behaved VMM does, through the `vfio_user` client.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use super::{memfd, reg, wait_for, Irq, Rig};
use crate::pacing::Pacing;
use crate::pci::config::{COMMAND_MASTER, COMMAND_MEMORY};

const BAR0: u32 = 0;
const CONFIG: u32 = 7;
const RW: u32 = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
const SHORT: Duration = Duration::from_millis(50);
const LONG: Duration = Duration::from_secs(5);

fn cfg_read(c: &mut vfio_user::Client, offset: u64, len: usize) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(CONFIG, offset, &mut b[..len]).unwrap();
    u32::from_le_bytes(b)
}

fn cfg_write(c: &mut vfio_user::Client, offset: u64, data: &[u8]) {
    c.region_write(CONFIG, offset, data).unwrap();
}

/// Memory space and bus mastering on, as a driver's probe leaves them.
fn enable(c: &mut vfio_user::Client) {
    cfg_write(c, 4, &(COMMAND_MEMORY | COMMAND_MASTER).to_le_bytes());
}

fn bar_read32(c: &mut vfio_user::Client, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(BAR0, offset, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn bar_write32(c: &mut vfio_user::Client, offset: u64, v: u32) {
    c.region_write(BAR0, offset, &v.to_le_bytes()).unwrap();
}

fn bar_read64(c: &mut vfio_user::Client, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    c.region_read(BAR0, offset, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn trigger(c: &mut vfio_user::Client, irq: &Irq) {
    let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(0, flags, 0, 1, &[irq.raw()]).unwrap();
}

fn unmask(c: &mut vfio_user::Client) {
    let flags = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK;
    c.set_irqs(0, flags, 0, 1, &[]).unwrap();
}

#[test]
fn the_client_sees_the_identity_the_regions_and_a_sizable_bar0() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    let bar = c.region(BAR0).unwrap();
    assert_eq!((bar.size, bar.flags), (256, RW));
    let config = c.region(CONFIG).unwrap();
    assert_eq!((config.size, config.flags), (256, RW));
    for absent in [1, 2, 3, 4, 5, 6, 8] {
        assert_eq!(c.region(absent).unwrap().size, 0, "region {absent}");
    }
    let intx = c.get_irq_info(0).unwrap();
    assert_eq!(intx.count, 1);
    assert_eq!(
        intx.flags,
        VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED
    );
    for other in 1..5 {
        assert_eq!(c.get_irq_info(other).unwrap().count, 0, "index {other}");
    }

    assert_eq!(cfg_read(&mut c, 0, 4), 0x0007_1b36, "vendor, device");
    assert_eq!(
        cfg_read(&mut c, 8, 4),
        0x0805_0100,
        "class 08/05/01, revision"
    );
    assert_eq!(cfg_read(&mut c, 0x0e, 1), 0, "header type 0");
    assert_eq!(cfg_read(&mut c, 0x2c, 4), 0x1100_1af4, "subsystem");
    assert_eq!(cfg_read(&mut c, 0x3d, 1), 1, "INTA");
    assert_eq!(cfg_read(&mut c, 0x06, 2), 0x0010, "status: capability list");
    assert_eq!(cfg_read(&mut c, 0x34, 1), 0x80);
    assert_eq!(
        cfg_read(&mut c, 0x40, 1),
        0,
        "slot information: one slot, first BAR 0 (sdhci-pci reads it)"
    );
    assert_eq!(
        cfg_read(&mut c, 0x80, 4),
        0x0003_0001,
        "PM capability, the last"
    );
    assert_eq!(cfg_read(&mut c, 0x84, 2), 0x0008, "D0, No_Soft_Reset");
    // The whole space in one read, as QEMU reads it at realize.
    let mut all = [0u8; 256];
    c.region_read(CONFIG, 0, &mut all).unwrap();
    assert_eq!(&all[..4], &[0x36, 0x1b, 0x07, 0x00]);
    assert_eq!(
        all[0x40..0x80],
        [0; 0x40],
        "slot information 0, then nothing"
    );
    assert_eq!(all[0x88..], [0; 0x78], "unimplemented space reads 0");

    // BAR sizing: all ones reads back the size mask; an address then sticks.
    cfg_write(&mut c, 0x10, &u32::MAX.to_le_bytes());
    assert_eq!(cfg_read(&mut c, 0x10, 4), 0xffff_ff00);
    cfg_write(&mut c, 0x10, &0xfebf_1000u32.to_le_bytes());
    assert_eq!(cfg_read(&mut c, 0x10, 4), 0xfebf_1000);
    cfg_write(&mut c, 0x14, &u32::MAX.to_le_bytes());
    assert_eq!(cfg_read(&mut c, 0x14, 4), 0, "BAR1 is absent");
    // Read-only fields stay.
    cfg_write(&mut c, 0, &u32::MAX.to_le_bytes());
    cfg_write(&mut c, 8, &u32::MAX.to_le_bytes());
    assert_eq!(cfg_read(&mut c, 0, 4), 0x0007_1b36);
    assert_eq!(cfg_read(&mut c, 8, 4), 0x0805_0100);
    // Command: memory, master and INTx disable only.
    cfg_write(&mut c, 4, &0xffffu16.to_le_bytes());
    assert_eq!(cfg_read(&mut c, 4, 2), 0x0406);
}

#[test]
fn bar0_accesses_of_every_width_reach_the_device() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    enable(&mut c);
    c.region_write(BAR0, reg::SCRATCH, &0x1122_3344_5566_7788u64.to_le_bytes())
        .unwrap();
    assert_eq!(bar_read64(&mut c, reg::SCRATCH), 0x1122_3344_5566_7788);
    assert_eq!(bar_read32(&mut c, 4), 0x1122_3344);
    let mut w = [0u8; 2];
    c.region_read(BAR0, 2, &mut w).unwrap();
    assert_eq!(u16::from_le_bytes(w), 0x5566);
    c.region_write(BAR0, 1, &[0xab]).unwrap();
    let mut b = [0u8; 1];
    c.region_read(BAR0, 1, &mut b).unwrap();
    assert_eq!(b[0], 0xab);
    let log = rig.log.lock().unwrap();
    let widths: Vec<(bool, u64, usize)> = log.accesses.clone();
    assert_eq!(
        widths,
        [
            (true, 0, 8),
            (false, 0, 8),
            (false, 4, 4),
            (false, 2, 2),
            (true, 1, 1),
            (false, 1, 1)
        ]
    );
    assert_eq!(rig.server.stats().bar_reads, 4);
}

#[test]
fn the_device_copies_between_guest_addresses_in_a_memfd_by_dma() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    let mem = memfd(1 << 20);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    mem.write_all_at(&pattern, 0x1000).unwrap();
    const BASE: u64 = 0x1_0000_0000;
    c.dma_map(0, BASE, 1 << 20, mem.as_raw_fd()).unwrap();
    assert_eq!(rig.server.dma_maps(), (1, 1));
    enable(&mut c);
    let irq = Irq::new();
    trigger(&mut c, &irq);

    let copy = |c: &mut vfio_user::Client, src: u64, dst: u64, len: u32| {
        c.region_write(BAR0, reg::SRC, &src.to_le_bytes()).unwrap();
        c.region_write(BAR0, reg::DST, &dst.to_le_bytes()).unwrap();
        bar_write32(c, reg::LEN, len);
        bar_write32(c, reg::DELAY, 0);
        bar_write32(c, reg::GO, 1);
        assert_eq!(irq.wait(LONG), 1, "the copy's interrupt");
        let status = bar_read32(c, reg::STATUS);
        bar_write32(c, reg::STATUS, status);
        unmask(c);
        status
    };
    assert_eq!(
        copy(&mut c, BASE + 0x1000, BASE + 0x8_0000, 4096),
        reg::DONE
    );
    let mut back = vec![0; 4096];
    mem.read_exact_at(&mut back, 0x8_0000).unwrap();
    assert_eq!(back, pattern, "the client sees the device's write");

    // Past the end of the map, then with bus mastering off: the device gets an error.
    let status = copy(&mut c, BASE + (1 << 20) - 2048, BASE, 4096);
    assert_eq!(status, reg::DONE | reg::DMA_ERROR);
    cfg_write(&mut c, 4, &COMMAND_MEMORY.to_le_bytes());
    let status = copy(&mut c, BASE + 0x1000, BASE + 0x9_0000, 16);
    assert_eq!(status, reg::DONE | reg::DMA_ERROR, "no bus master");
    enable(&mut c);
    // Unmapped: nothing reaches the memfd any more.
    c.dma_unmap(BASE, 1 << 20).unwrap();
    assert_eq!(rig.server.dma_maps(), (0, 0));
    let status = copy(&mut c, BASE + 0x1000, BASE + 0xa_0000, 16);
    assert_eq!(status, reg::DONE | reg::DMA_ERROR);
    mem.read_exact_at(&mut back[..16], 0xa_0000).unwrap();
    assert_eq!(back[..16], [0; 16]);
}

#[test]
fn intx_fires_once_stays_masked_and_fires_again_on_unmask_while_asserted() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    enable(&mut c);
    let irq = Irq::new();
    trigger(&mut c, &irq);
    assert_eq!(irq.wait(SHORT), 0, "the line is low");

    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(LONG), 1, "the line rose");
    assert_eq!(cfg_read(&mut c, 6, 2) & 0x8, 0x8, "status: interrupt");
    for _ in 0..3 {
        bar_read32(&mut c, reg::STATUS);
        bar_write32(&mut c, reg::RAISE, 1);
    }
    assert_eq!(irq.wait(SHORT), 0, "masked until unmasked");
    unmask(&mut c);
    assert_eq!(irq.wait(LONG), 1, "still asserted: signalled again");
    bar_write32(&mut c, reg::STATUS, reg::DONE);
    assert_eq!(cfg_read(&mut c, 6, 2) & 0x8, 0, "status follows the line");
    unmask(&mut c);
    assert_eq!(irq.wait(SHORT), 0, "cleared before the unmask: nothing");
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(LONG), 1, "unmasked: the next rise fires");
    bar_write32(&mut c, reg::STATUS, reg::DONE);

    // The client's own mask.
    unmask(&mut c);
    let mask = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_MASK;
    c.set_irqs(0, mask, 0, 1, &[]).unwrap();
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(SHORT), 0, "masked by the client");
    unmask(&mut c);
    assert_eq!(irq.wait(LONG), 1);
    bar_write32(&mut c, reg::STATUS, reg::DONE);

    // The command register's Interrupt Disable.
    unmask(&mut c);
    cfg_write(&mut c, 4, &(COMMAND_MEMORY | 1 << 10).to_le_bytes());
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(SHORT), 0, "INTx disabled");
    cfg_write(&mut c, 4, &COMMAND_MEMORY.to_le_bytes());
    assert_eq!(irq.wait(LONG), 1, "enabled again with the line up");
    bar_write32(&mut c, reg::STATUS, reg::DONE);

    // KVM's resampler: an unmask eventfd, written by the client.
    let resample = Irq::new();
    let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_UNMASK;
    c.set_irqs(0, flags, 0, 1, &[resample.raw()]).unwrap();
    unmask(&mut c);
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(LONG), 1);
    resample.fd.write(1).unwrap();
    assert_eq!(
        irq.wait(LONG),
        1,
        "unmasked through the eventfd, still asserted"
    );

    // Disabled: nothing at all.
    let disable = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(0, disable, 0, 0, &[]).unwrap();
    resample.fd.write(1).unwrap();
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(SHORT), 0);
    assert_eq!(rig.server.stats().intx_signals, 7);
}

#[test]
fn with_timing_off_an_event_runs_at_once_and_card_time_jumps_to_it() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    enable(&mut c);
    let irq = Irq::new();
    trigger(&mut c, &irq);
    assert_eq!(bar_read64(&mut c, reg::NOW), 0, "no card time has passed");
    bar_write32(&mut c, reg::DELAY, 4_000_000_000);
    let start = Instant::now();
    bar_write32(&mut c, reg::GO, 1);
    assert_eq!(irq.wait(LONG), 1);
    assert!(start.elapsed() < Duration::from_secs(2), "not paced");
    assert_eq!(
        bar_read64(&mut c, reg::NOW),
        4_000_000_000,
        "card time is the event's"
    );
    assert_eq!(bar_read32(&mut c, reg::STATUS), reg::DONE);
    assert_eq!(rig.server.stats().timer_events, 1);
    let times = rig.log.lock().unwrap().times.clone();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn in_realtime_an_event_fires_when_its_card_time_has_passed_on_the_wall_clock() {
    for (scale, delay_ms) in [(1.0, 30u64), (2.0, 15)] {
        let rig = Rig::start(Pacing::Realtime { scale });
        let mut c = rig.client();
        enable(&mut c);
        let irq = Irq::new();
        trigger(&mut c, &irq);
        bar_write32(&mut c, reg::DELAY, (delay_ms * 1_000_000) as u32);
        let start = Instant::now();
        bar_write32(&mut c, reg::GO, 1);
        let go_at = rig.log.lock().unwrap().times.last().copied().unwrap();
        assert_eq!(irq.wait(LONG), 1);
        let waited = start.elapsed();
        let wall = Duration::from_secs_f64(delay_ms as f64 * scale / 1e3);
        assert!(
            waited >= wall - Duration::from_millis(1),
            "{scale}: {waited:?}"
        );
        assert!(
            waited < wall + Duration::from_millis(500),
            "{scale}: {waited:?}"
        );
        let now = bar_read64(&mut c, reg::NOW);
        assert!(now >= go_at + delay_ms * 1_000_000, "card time passed");
        // A register access waits for no timer: with an event far off, it answers at once.
        bar_write32(&mut c, reg::STATUS, reg::DONE);
        bar_write32(&mut c, reg::DELAY, 4_000_000_000);
        bar_write32(&mut c, reg::GO, 1);
        let t = Instant::now();
        for _ in 0..10 {
            bar_read32(&mut c, reg::STATUS);
        }
        assert!(t.elapsed() < Duration::from_millis(500));
        assert_eq!(irq.wait(SHORT), 0);
    }
}

#[test]
fn a_device_reset_resets_the_device_and_the_config_space() {
    let rig = Rig::start(Pacing::Off);
    let mut c = rig.client();
    enable(&mut c);
    cfg_write(&mut c, 0x10, &0xfebf_1000u32.to_le_bytes());
    cfg_write(&mut c, 0x3c, &[11]);
    bar_write32(&mut c, reg::SCRATCH, 0xdead_beef);
    let irq = Irq::new();
    trigger(&mut c, &irq);
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(LONG), 1);
    c.reset().unwrap();
    assert_eq!(rig.log.lock().unwrap().resets, 1);
    assert_eq!(cfg_read(&mut c, 4, 2), 0, "command");
    assert_eq!(cfg_read(&mut c, 6, 2), 0x10, "status: no interrupt");
    assert_eq!(cfg_read(&mut c, 0x10, 4), 0, "BAR0");
    assert_eq!(cfg_read(&mut c, 0x3c, 1), 0, "interrupt line");
    enable(&mut c);
    assert_eq!(bar_read32(&mut c, reg::SCRATCH), 0);
    // The eventfd stays, and the auto-mask went with the line.
    bar_write32(&mut c, reg::RAISE, 1);
    assert_eq!(irq.wait(LONG), 1);
    assert_eq!(rig.server.stats().resets, 1);
}

#[test]
fn when_the_client_leaves_its_maps_go_the_card_is_power_cycled_and_the_next_is_served() {
    let rig = Rig::start(Pacing::Off);
    let mem = memfd(1 << 16);
    {
        let mut c = rig.client();
        c.dma_map(0, 0x10_0000, 1 << 16, mem.as_raw_fd()).unwrap();
        enable(&mut c);
        let irq = Irq::new();
        trigger(&mut c, &irq);
        bar_write32(&mut c, reg::SCRATCH, 7);
        bar_write32(&mut c, reg::DELAY, 1_000_000_000);
        bar_write32(&mut c, reg::GO, 1);
        assert_eq!(irq.wait(LONG), 1);
        c.shutdown().unwrap();
    }
    rig.sessions(1);
    assert_eq!(rig.server.dma_maps(), (0, 0));
    assert_eq!(rig.log.lock().unwrap().power_cycles, 1);
    let mut c = rig.client();
    assert_eq!(cfg_read(&mut c, 4, 2), 0, "the config space is fresh");
    enable(&mut c);
    assert_eq!(bar_read32(&mut c, reg::SCRATCH), 0, "the device is fresh");
    assert!(
        bar_read64(&mut c, reg::NOW) >= 1_000_000_000,
        "card time goes on from where the session before left it"
    );
    drop(c);
    rig.sessions(2);
    assert_eq!(rig.log.lock().unwrap().power_cycles, 2);
}

#[test]
fn a_session_ends_with_a_summary_of_its_accesses_its_interrupts_and_its_timer() {
    let rig = Rig::start(Pacing::Realtime { scale: 1.0 });
    {
        let mut c = rig.client();
        enable(&mut c);
        let irq = Irq::new();
        trigger(&mut c, &irq);
        bar_write32(&mut c, reg::LEN, 0);
        // Far enough ahead that the timer thread sleeps for it even on a loaded machine.
        bar_write32(&mut c, reg::DELAY, 20_000_000);
        bar_write32(&mut c, reg::GO, 1);
        assert_eq!(irq.wait(LONG), 1, "the event ran on the timer thread");
        assert_eq!(bar_read32(&mut c, reg::STATUS) & reg::DONE, reg::DONE);
        bar_write32(&mut c, reg::STATUS, reg::DONE);
        c.shutdown().unwrap();
    }
    rig.sessions(1);
    let line = rig.server.last_session().expect("a summary");
    // Five BAR accesses, not the config-space ones; one signal, answered by the read.
    assert!(line.contains(" 5 BAR accesses "), "{line}");
    assert!(
        line.contains("1 INTx signals, to the next access p50/p99 "),
        "{line}"
    );
    let answered: f64 = line
        .split("to the next access p50/p99 ")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|v| v.parse().ok())
        .expect("the interrupt's answer in µs");
    assert!(answered > 0.0, "{line}");
    // The 20 ms event: the timer armed once, woke and spun the margin's rest.
    assert!(line.contains("timer: 1 wake-ups"), "{line}");
    assert!(line.ends_with("margin 200 µs"), "{line}");
}

#[test]
fn a_daemon_stopping_mid_session_logs_its_summary_once() {
    let rig = Rig::start(Pacing::Off);
    let handle = rig.server.handle();
    assert_eq!(handle.log_live_session("no session yet"), None);
    let mut c = rig.client();
    enable(&mut c);
    bar_write32(&mut c, reg::SCRATCH, 1);
    bar_read32(&mut c, reg::SCRATCH);
    let so_far = handle.live_session().expect("a client is attached");
    assert!(so_far.contains(" 2 BAR accesses "), "{so_far}");
    let live = handle
        .log_live_session("a signal")
        .expect("the live session's summary");
    assert!(live.contains(" 2 BAR accesses "), "{live}");
    assert_eq!(handle.live_session(), None, "taken");
    assert_eq!(
        handle.log_live_session("a second signal"),
        None,
        "only once"
    );
    drop(c);
    rig.sessions(1);
    assert_eq!(
        rig.server.last_session(),
        None,
        "the session's end found its summary logged already"
    );
    assert_eq!(
        handle.log_live_session("between clients"),
        None,
        "a server waiting for its next client has no session to sum up"
    );
}

#[test]
fn a_second_client_is_refused_while_one_is_attached() {
    let rig = Rig::start(Pacing::Off);
    let mut first = rig.client();
    cfg_read(&mut first, 0, 4);
    let start = Instant::now();
    assert!(vfio_user::Client::new(&rig.path).is_err(), "refused");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(cfg_read(&mut first, 0, 4), 0x0007_1b36, "the first goes on");
    drop(first);
    rig.sessions(1);
    wait_for(
        || {
            vfio_user::Client::new(&rig.path)
                .map(|mut c| cfg_read(&mut c, 0, 4) == 0x0007_1b36)
                .unwrap_or(false)
        },
        "the next client to be served",
    );
}

#[test]
fn bind_creates_an_owner_only_socket_replaces_a_stale_one_and_refuses_other_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pci.sock");
    let log = std::sync::Arc::new(std::sync::Mutex::new(super::FakeLog::default()));
    let fake = || super::Fake::new(log.clone());
    let options = || crate::pci::PciOptions {
        identity: crate::pci::PciIdentity::Generic,
        ..Default::default()
    };
    {
        let _stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    }
    let server = crate::pci::PciServer::bind(&path, fake(), options()).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing left over"
    );
    let client = std::thread::spawn({
        let path = path.clone();
        move || {
            let mut c = vfio_user::Client::new(&path).unwrap();
            cfg_read(&mut c, 0, 4)
        }
    });
    assert_eq!(
        server.serve_session().unwrap(),
        crate::pci::SessionEnd::Closed
    );
    assert_eq!(client.join().unwrap(), 0x0007_1b36);
    drop(server);
    assert!(!path.exists(), "removed with the server");
    std::fs::write(&path, b"not a socket").unwrap();
    assert!(crate::pci::PciServer::bind(&path, fake(), options()).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}
