//! The vhost-user-blk backend in process: a mock split queue in guest memory, requests
//! built as a guest driver would, and hostile ones a guest should not send.

use std::time::{Duration, Instant};

use vhost_user_backend::VhostUserBackend;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::{EmmcBlkBackend, Pacing, DEFAULT_SPIN, DEFAULT_SPIN_MAX, TIMER_EVENT};
use super::request::*;
use super::target::{CardTarget, DriverPolicy};
use crate::testing::{guest_memory, handle_event, mem_card, model, GuestQueue};
use emmc_card::model::{DeviceModel, TimingModel};
use emmc_card::store::{ImageLayout, MemStore, Store, StoreError};
use emmc_card::timing::Nanos;
use emmc_card::Card;
use emmc_host::iosched::Elevator;

struct Rig {
    backend: EmmcBlkBackend,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// The request queue, its structures at 0x10000.
    queue: GuestQueue,
}

impl Rig {
    fn new(model: DeviceModel, pacing: Pacing) -> Rig {
        Rig::with_policy(model, pacing, DriverPolicy::default())
    }

    fn with_policy(model: DeviceModel, pacing: Pacing, policy: DriverPolicy) -> Rig {
        let target = CardTarget::new(mem_card(&model), &model, &policy).unwrap();
        Rig::with_target(target, pacing)
    }

    fn with_target(target: CardTarget, pacing: Pacing) -> Rig {
        let backend = EmmcBlkBackend::new(target, pacing).unwrap();
        let mem = guest_memory(&backend);
        let queue = GuestQueue::new(&mem, 0x10000);
        Rig {
            backend,
            mem,
            queue,
        }
    }

    /// Put a chain of (addr, len, writable) descriptors on the queue.
    fn push(&mut self, descs: &[(u64, u32, bool)]) {
        self.queue.push(descs);
    }

    /// Write a chain and its avail slot, but not yet the avail index.
    fn stage(&mut self, descs: &[(u64, u32, bool)]) {
        self.queue.stage(descs);
    }

    /// Make the staged chains available (what the driver does before kicking).
    fn publish(&self) {
        self.queue.publish();
    }

    /// Record the backend's trace in a file in `dir`, from the card's time now; returns
    /// its path.
    fn trace_into(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("trace.txt");
        let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let origin = self.backend.card_now();
        self.backend
            .set_trace(emmc_host::trace::TraceWriter::new(file, origin, "test").unwrap());
        path
    }

    fn kick(&self) {
        handle_event(&self.backend, 0, std::slice::from_ref(&self.queue.vring));
    }

    fn tick(&self) {
        handle_event(
            &self.backend,
            TIMER_EVENT,
            std::slice::from_ref(&self.queue.vring),
        );
    }

    /// Used-ring entries added since the last call: (id, len).
    fn used(&mut self) -> Vec<(u32, u32)> {
        self.queue.used()
    }

    /// Let the pacing timer fire every millisecond until `n` more requests have
    /// completed; fails the test if that takes longer than `limit`.
    fn wait_used(&mut self, n: usize, limit: Duration) {
        let start = Instant::now();
        let mut done = 0;
        while done < n {
            assert!(
                start.elapsed() < limit,
                "{done} of {n} completed in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
            self.tick();
            done += self.used().len();
        }
    }

    fn write_header(&self, at: u64, kind: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.memory().write_slice(&h, GuestAddress(at)).unwrap();
    }

    fn status(&self, at: u64) -> u8 {
        self.mem.memory().read_obj(GuestAddress(at)).unwrap()
    }
}

const HDR: u64 = 0x2_0000;
const DATA: u64 = 0x3_0000;
const STATUS: u64 = 0x2_8000;

fn write(rig: &mut Rig, sector: u64, data: &[u8]) {
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, sector);
    rig.mem
        .memory()
        .write_slice(data, GuestAddress(DATA))
        .unwrap();
    rig.push(&[
        (HDR, 16, false),
        (DATA, data.len() as u32, false),
        (STATUS, 1, true),
    ]);
    rig.kick();
}

fn read(rig: &mut Rig, sector: u64, len: usize) -> Vec<u8> {
    rig.write_header(HDR, VIRTIO_BLK_T_IN, sector);
    rig.push(&[
        (HDR, 16, false),
        (DATA + 0x10_0000, len as u32, true),
        (STATUS, 1, true),
    ]);
    rig.kick();
    let mut buf = vec![0u8; len];
    rig.mem
        .memory()
        .read_slice(&mut buf, GuestAddress(DATA + 0x10_0000))
        .unwrap();
    buf
}

#[test]
fn write_then_read_round_trips_through_the_card() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    write(&mut rig, 100, &data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(
        rig.used(),
        vec![(0, 1)],
        "write: only the status byte was written"
    );
    assert_eq!(read(&mut rig, 100, 8192), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(rig.used(), vec![(3, 8193)], "read: data plus status");
    assert_eq!(
        rig.backend
            .with_target(|t| t.card().stats().sectors_written),
        16,
        "the card programmed it"
    );
}

/// libblkio and other userspace drivers ignore size_max; one 256 KiB segment must still
/// work (the ADMA2 table splits it as the sdhci driver would).
#[test]
fn a_segment_longer_than_size_max_is_split_not_refused() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let len = 4 * super::target::SIZE_MAX as usize;
    let data: Vec<u8> = (0..len as u32).map(|i| (i * 13 % 241) as u8).collect();
    write(&mut rig, 2048, &data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(read(&mut rig, 2048, len), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
}

/// A buffer in one piece of guest memory moves between the card and guest memory in
/// place, however many descriptors the guest split it into; one scattered over guest
/// memory goes through the driver's buffer. Both read back what was written.
#[test]
fn contiguous_buffers_move_in_place_and_scattered_ones_through_the_drivers_buffer() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let in_place = |rig: &Rig| rig.backend.with_target(|t| t.driver().stats().in_place);
    let data: Vec<u8> = (0..16384u32).map(|i| (i * 5 % 253) as u8).collect();
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 300);
    rig.mem
        .memory()
        .write_slice(&data, GuestAddress(DATA))
        .unwrap();
    rig.push(&[
        (HDR, 16, false),
        (DATA, 4096, false),
        (DATA + 4096, 4096, false),
        (DATA + 8192, 8192, false),
        (STATUS, 1, true),
    ]);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(in_place(&rig), 1, "three adjacent descriptors: one piece");
    // Read into two buffers 1 MiB apart: through the driver's buffer.
    let (a, b) = (DATA + 0x10_0000, DATA + 0x20_0000);
    rig.write_header(HDR, VIRTIO_BLK_T_IN, 300);
    rig.push(&[
        (HDR, 16, false),
        (a, 8192, true),
        (b, 8192, true),
        (STATUS, 1, true),
    ]);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(in_place(&rig), 1, "scattered: not in place");
    let mut back = vec![0u8; 8192];
    rig.mem
        .memory()
        .read_slice(&mut back, GuestAddress(a))
        .unwrap();
    assert_eq!(back, data[..8192]);
    rig.mem
        .memory()
        .read_slice(&mut back, GuestAddress(b))
        .unwrap();
    assert_eq!(back, data[8192..]);
    // One buffer: in place, and the status byte after it untouched by the data.
    assert_eq!(read(&mut rig, 300, 16384), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(in_place(&rig), 2);
}

#[test]
fn split_descriptors_and_a_status_sharing_the_data_descriptor_work() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 7);
    let data = vec![0x5Au8; 1024];
    rig.mem
        .memory()
        .write_slice(&data, GuestAddress(DATA))
        .unwrap();
    rig.push(&[
        (HDR, 8, false),
        (HDR + 8, 8, false),
        (DATA, 512, false),
        (DATA + 512, 512, false),
        (STATUS, 1, true),
    ]);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    rig.write_header(HDR, VIRTIO_BLK_T_IN, 7);
    rig.push(&[(HDR, 16, false), (DATA + 0x8000, 1025, true)]);
    rig.kick();
    let mut back = vec![0u8; 1025];
    rig.mem
        .memory()
        .read_slice(&mut back, GuestAddress(DATA + 0x8000))
        .unwrap();
    assert_eq!(&back[..1024], &data[..]);
    assert_eq!(back[1024], VIRTIO_BLK_S_OK);
}

#[test]
fn hostile_chains_get_their_status_and_the_device_keeps_serving() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let cap = rig.backend.with_target(|t| t.limits().capacity);
    /// (what, request type, sector, chain, expected status; None = not reportable)
    type Case = (&'static str, u32, u64, Vec<(u64, u32, bool)>, Option<u8>);
    let cases: Vec<Case> = vec![
        (
            "unknown type",
            77,
            0,
            vec![(HDR, 16, false), (STATUS, 1, true)],
            Some(VIRTIO_BLK_S_UNSUPP),
        ),
        (
            "beyond capacity",
            VIRTIO_BLK_T_IN,
            cap,
            vec![(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
            Some(VIRTIO_BLK_S_IOERR),
        ),
        (
            "data outside guest memory",
            VIRTIO_BLK_T_IN,
            0,
            vec![
                (HDR, 16, false),
                (0x7FFF_0000, 512, true),
                (STATUS, 1, true),
            ],
            Some(VIRTIO_BLK_S_IOERR),
        ),
        (
            "wrong direction",
            VIRTIO_BLK_T_OUT,
            0,
            vec![(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)],
            Some(VIRTIO_BLK_S_IOERR),
        ),
        (
            "oversized",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 16, false), (DATA, 0x90_0000, true), (STATUS, 1, true)],
            Some(VIRTIO_BLK_S_IOERR),
        ),
        (
            "short header",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 4, false), (STATUS, 1, true)],
            Some(VIRTIO_BLK_S_IOERR),
        ),
        (
            "no status",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 16, false)],
            None,
        ),
    ];
    for (what, kind, sector, descs, want) in cases {
        rig.mem
            .memory()
            .write_obj(0xEEu8, GuestAddress(STATUS))
            .unwrap();
        rig.write_header(HDR, kind, sector);
        rig.push(&descs);
        rig.kick();
        let used = rig.used();
        assert_eq!(used.len(), 1, "{what}: the chain is returned");
        match want {
            Some(code) => {
                assert_eq!(rig.status(STATUS), code, "{what}");
                assert_eq!(
                    used[0].1, 1,
                    "{what}: only the status byte counts as written"
                );
            }
            None => assert_eq!(used[0].1, 0, "{what}: nothing written"),
        }
    }
    // Still serving.
    write(&mut rig, 0, &[1u8; 512]);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert_eq!(read(&mut rig, 0, 512), vec![1u8; 512]);
}

#[test]
fn get_id_flush_discard_and_write_zeroes() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.write_header(HDR, VIRTIO_BLK_T_GET_ID, 0);
    rig.push(&[(HDR, 16, false), (DATA, 20, true), (STATUS, 1, true)]);
    rig.kick();
    let mut id = [0u8; 20];
    rig.mem
        .memory()
        .read_slice(&mut id, GuestAddress(DATA))
        .unwrap();
    assert_eq!(&id[..6], b"EMMCAA", "manufacturer id in the serial");
    assert!(String::from_utf8_lossy(&id).contains("EMU45A"));
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);

    write(&mut rig, 64, &[9u8; 4096]);
    rig.write_header(HDR, VIRTIO_BLK_T_FLUSH, 0);
    rig.push(&[(HDR, 16, false), (STATUS, 1, true)]);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    assert!(
        rig.backend
            .with_target(|t| t.card().volatile_sectors().is_empty()),
        "flush made it durable"
    );

    for kind in [VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_T_DISCARD] {
        write(&mut rig, 64, &[9u8; 4096]);
        rig.write_header(HDR, kind, 0);
        let mut range = [0u8; 16];
        range[0..8].copy_from_slice(&66u64.to_le_bytes());
        range[8..12].copy_from_slice(&2u32.to_le_bytes());
        rig.mem
            .memory()
            .write_slice(&range, GuestAddress(HDR + 16))
            .unwrap();
        rig.push(&[(HDR, 32, false), (STATUS, 1, true)]);
        rig.kick();
        assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK, "kind {kind}");
        let back = read(&mut rig, 64, 4096);
        assert!(
            back[..1024].iter().all(|&b| b == 9),
            "kind {kind}: before the range untouched"
        );
        assert!(
            back[1024..2048].iter().all(|&b| b == 0),
            "kind {kind}: range zeroed"
        );
        assert!(
            back[2048..].iter().all(|&b| b == 9),
            "kind {kind}: after the range untouched"
        );
    }
}

#[test]
fn config_space_carries_the_user_area_capacity() {
    let rig = Rig::new(model(0), Pacing::Off);
    let cap = u64::from_le_bytes(rig.backend.get_config(0, 8).try_into().unwrap());
    assert_eq!(cap, 8 << 20);
    let blk_size = u32::from_le_bytes(rig.backend.get_config(20, 4).try_into().unwrap());
    assert_eq!(blk_size, 512);
    assert!(
        rig.backend.get_config(70, 100).is_empty(),
        "outside the config space"
    );
    assert!(rig.backend.get_config(u32::MAX, u32::MAX).is_empty());
    let f = rig.backend.features();
    for bit in [1u32, 2, 6, 9, 13, 14, 16, 29, 32] {
        assert_ne!(f & (1 << bit), 0, "feature bit {bit}");
    }
    assert_eq!(f & (1 << 5), 0, "not read-only");
}

#[test]
fn realtime_pacing_holds_completions_until_card_time_has_elapsed() {
    // 20 ms to program a write: long enough to see the wait, short for a test. No cache,
    // so the write goes to the medium.
    let mut m = model(20_000_000);
    m.ext_csd.cache_size = 0;
    let mut rig = Rig::new(m, Pacing::Realtime { scale: 1.0 });
    let start = Instant::now();
    write(&mut rig, 0, &[3u8; 512]);
    assert!(rig.used().is_empty(), "not complete before its card time");
    while rig.used().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(5), "never completed");
        std::thread::sleep(Duration::from_millis(1));
        rig.tick();
    }
    assert!(
        start.elapsed() >= Duration::from_millis(20),
        "completed after {:?}",
        start.elapsed()
    );
    let stats = rig.backend.pacing_stats();
    assert_eq!(stats.completed, 1);
    assert!(
        stats.wake_late.count() >= 1,
        "the timer fired and its lateness was measured"
    );
    assert!(stats.margin >= DEFAULT_SPIN && stats.margin <= DEFAULT_SPIN_MAX);
}

#[test]
fn the_trace_records_each_request_with_its_modelled_completion() {
    let mut m = model(3_000_000);
    m.ext_csd.cache_size = 0;
    let mut rig = Rig::new(m, Pacing::Off);
    let dir = tempfile::tempdir().unwrap();
    let path = rig.trace_into(dir.path());
    write(&mut rig, 8, &[1u8; 4096]);
    read(&mut rig, 8, 4096);
    rig.backend.shutdown();
    let text = std::fs::read_to_string(&path).unwrap();
    let rows = trace_rows(&path);
    let ops: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(ops, ["W", "R"], "{text}");
    assert_eq!(&rows[0][1..3], &[4096, 4096]);
    let write_ns = rows[0][3] - rows[0][0];
    assert!(
        write_ns >= 3_000_000,
        "the write's modelled latency {write_ns} ns includes its 3 ms programming"
    );
    assert!(rows[1][0] >= rows[0][0], "times never go back");
    // Without pacing the read arrives while the card still programs: it starts when the
    // card is free, and its own service time is short.
    let read_start = rows[1][0].max(rows[0][3]);
    assert!(
        rows[1][3] > rows[0][3],
        "one card serves one request at a time"
    );
    assert!(
        rows[1][3] - read_start < 1_000_000,
        "a 4 KiB read takes {} ns",
        rows[1][3] - read_start
    );
}

#[test]
fn an_idle_backend_polls_the_ring_for_the_next_request_within_its_window() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    rig.backend.set_poll(Duration::from_millis(400));
    rig.write_header(HDR, VIRTIO_BLK_T_FLUSH, 0);
    rig.stage(&[(HDR, 16, false), (STATUS, 1, true)]);
    // The driver publishes the request 5 ms from now and never kicks.
    let (mem, avail, idx) = (rig.mem.clone(), rig.queue.avail, rig.queue.next_avail);
    let publisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        mem.memory()
            .write_obj(u16::to_le(idx), GuestAddress(avail + 2))
            .unwrap();
    });
    rig.tick(); // a timer wake-up with nothing pending: the backend starts polling
    publisher.join().unwrap();
    assert_eq!(rig.used(), vec![(0, 1)], "served without a kick");
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);

    rig.backend.set_poll(Duration::ZERO);
    rig.stage(&[(HDR, 16, false), (STATUS, 1, true)]);
    rig.publish();
    rig.tick();
    assert!(
        rig.used().is_empty(),
        "without polling, only a kick is noticed"
    );
    rig.kick();
    assert_eq!(rig.used().len(), 1);
}

/// Linux's virtio_blk sends requests up to max_sectors_kb (1280 KiB by default), more than
/// one MMC request carries: they are split, not refused.
#[test]
fn a_request_larger_than_the_host_takes_is_split_into_mmc_requests() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let len = 1280 * 1024;
    let data: Vec<u8> = (0..len as u32).map(|i| (i / 512 % 251) as u8).collect();
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 4096);
    rig.mem
        .memory()
        .write_slice(&data, GuestAddress(DATA))
        .unwrap();
    let mut chain = vec![(HDR, 16, false)];
    chain.extend((0..20u64).map(|i| (DATA + i * 65536, 65536, false)));
    chain.push((STATUS, 1, true));
    rig.push(&chain);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    let before = rig.backend.with_target(|t| t.card().stats().commands);
    assert_eq!(read(&mut rig, 4096, len), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    let commands = rig.backend.with_target(|t| t.card().stats().commands) - before;
    assert!(
        commands >= 3 * 2,
        "1280 KiB at 512 KiB per request is three CMD23+CMD18 pairs, saw {commands} commands"
    );
}

/// Writes queued together go out as packed commands when the driver packs, and every
/// byte lands where its request said.
#[test]
fn queued_writes_are_packed_by_the_host_driver_and_read_back_intact() {
    let policy = DriverPolicy {
        packing: emmc_host::packing::PackingMode::Always,
        ..Default::default()
    };
    let mut rig = Rig::with_policy(model(0), Pacing::Off, policy);
    // Eight 4 KiB writes in one kick, each with its own header, data and status.
    for i in 0..8u64 {
        let hdr = HDR + i * 16;
        let data = DATA + i * 4096;
        let status = STATUS + i;
        rig.write_header(hdr, VIRTIO_BLK_T_OUT, 1000 + i * 64);
        rig.mem
            .memory()
            .write_slice(&[i as u8 + 1; 4096], GuestAddress(data))
            .unwrap();
        rig.stage(&[(hdr, 16, false), (data, 4096, false), (status, 1, true)]);
    }
    rig.publish();
    rig.kick();
    assert_eq!(rig.used().len(), 8);
    for i in 0..8u64 {
        assert_eq!(rig.status(STATUS + i), VIRTIO_BLK_S_OK, "write {i}");
    }
    let packed = rig
        .backend
        .with_target(|t| t.driver().stats().packed_writes);
    assert!(packed >= 1, "the writes were packed");
    for i in 0..8u64 {
        assert_eq!(read(&mut rig, 1000 + i * 64, 4096), vec![i as u8 + 1; 4096]);
    }
}

/// With real-time pacing a request that arrives while the card is busy waits in the
/// driver's queue, as on hardware: writes arriving during a slow write are packed.
#[test]
fn in_real_time_requests_arriving_while_the_card_is_busy_queue_behind_it() {
    // 150 ms per program: one write keeps the card busy long enough that the next three
    // arrive during it even when this machine's scheduler is slow to wake the test.
    let mut m = model(150_000_000);
    m.ext_csd.cache_size = 0;
    let policy = DriverPolicy {
        packing: emmc_host::packing::PackingMode::Always,
        ..Default::default()
    };
    let mut rig = Rig::with_policy(m, Pacing::Realtime { scale: 1.0 }, policy);
    let start = Instant::now();
    // The first write occupies the card.
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 0);
    rig.push(&[(HDR, 16, false), (DATA, 4096, false), (STATUS, 1, true)]);
    rig.kick();
    // Three more arrive a little later, one kick each, while it programs.
    for i in 1..4u64 {
        std::thread::sleep(Duration::from_millis(1));
        let hdr = HDR + i * 16;
        rig.write_header(hdr, VIRTIO_BLK_T_OUT, i * 64);
        rig.push(&[
            (hdr, 16, false),
            (DATA + i * 4096, 4096, false),
            (STATUS + i, 1, true),
        ]);
        rig.kick();
    }
    rig.wait_used(4, Duration::from_secs(10));
    let (packed, requests) = rig.backend.with_target(|t| {
        let s = t.driver().stats();
        (s.packed_writes, s.mmc_requests)
    });
    assert_eq!(
        packed, 1,
        "the three that queued behind the first went as one packed write"
    );
    assert_eq!(requests, 2);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "two programs of 150 ms each, took {:?}",
        start.elapsed()
    );
}

/// The numeric fields of each data line of a trace file: arrival, offset, length,
/// completion (docs/trace-format.md).
fn trace_rows(path: &std::path::Path) -> Vec<Vec<u64>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .collect()
}

/// A paced rig whose card takes `program_ns` per 4 KiB program (no cache), with a trace
/// in the returned directory.
fn paced_traced_rig(program_ns: u64) -> (Rig, tempfile::TempDir, std::path::PathBuf) {
    let mut m = model(program_ns);
    m.ext_csd.cache_size = 0;
    let rig = Rig::new(m, Pacing::Realtime { scale: 1.0 });
    let dir = tempfile::tempdir().unwrap();
    let path = rig.trace_into(dir.path());
    (rig, dir, path)
}

/// A request that arrives after the card has idled for a while starts when it arrives,
/// not when the card went idle: its modelled completion is its arrival plus its service.
#[test]
fn in_real_time_a_request_never_starts_before_it_arrived() {
    let (mut rig, _dir, path) = paced_traced_rig(3_000_000);
    let wait_used = |rig: &mut Rig| {
        let t0 = Instant::now();
        loop {
            assert!(t0.elapsed() < Duration::from_secs(5), "never completed");
            std::thread::sleep(Duration::from_millis(1));
            rig.tick();
            if !rig.used().is_empty() {
                return;
            }
        }
    };
    write(&mut rig, 0, &[1u8; 4096]);
    wait_used(&mut rig);
    std::thread::sleep(Duration::from_millis(30));
    write(&mut rig, 64, &[2u8; 4096]);
    wait_used(&mut rig);
    rig.backend.shutdown();
    let rows: Vec<(u64, u64)> = trace_rows(&path).iter().map(|f| (f[0], f[3])).collect();
    assert_eq!(rows.len(), 2);
    let (arrival, done) = rows[1];
    assert!(
        arrival >= rows[0].1 + 25_000_000,
        "it arrived after the idle gap"
    );
    assert!(
        done >= arrival + 3_000_000,
        "completed at {done}, arrived at {arrival}: the 3 ms program starts on arrival"
    );
}

/// A paced trace says where its card time is on CLOCK_MONOTONIC, so that a client's own
/// stamps can be set beside it (`ci/request-path.py`): a request's arrival, taken there,
/// falls between the instants the driver read just before and just after making it
/// available, 30 ms after the first one.
#[test]
fn a_paced_trace_places_its_card_time_on_the_monotonic_clock() {
    use crate::pacing::monotonic_ns;
    let (mut rig, _dir, path) = paced_traced_rig(3_000_000);
    let mut kicked = Vec::new();
    for sector in [0, 64] {
        let before = monotonic_ns();
        write(&mut rig, sector, &[1u8; 4096]);
        kicked.push((before, monotonic_ns()));
        rig.wait_used(1, Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(30));
    }
    rig.backend.shutdown();
    let text = std::fs::read_to_string(&path).unwrap();
    let anchors = crate::trace::clock_anchors(&text);
    assert_eq!(anchors.len(), 1, "one clock line per session:\n{text}");
    let (card0, mono0) = anchors[0];
    let rows = trace_rows(&path);
    assert_eq!(rows.len(), 2);
    for (row, (before, after)) in rows.iter().zip(kicked) {
        let arrival = mono0 + (row[0] - card0);
        assert!(
            before <= arrival && arrival <= after,
            "arrival at {arrival} ns on CLOCK_MONOTONIC, made available between {before} \
             and {after}"
        );
    }
}

/// A paced rig whose card takes 200 ms per 4 KiB program (no cache), with a fixed spin
/// margin and a trace in the returned directory.
fn slow_program_rig(margin: Duration) -> (Rig, tempfile::TempDir, std::path::PathBuf) {
    let (rig, dir, path) = paced_traced_rig(200_000_000);
    rig.backend.set_spin(margin, margin);
    (rig, dir, path)
}

/// Stage a 4 KiB read of `sector`, not yet available: the returned thread (the driver)
/// makes it available after `after` and returns when it did.
fn read_made_available_after(
    rig: &mut Rig,
    sector: u64,
    after: Duration,
) -> std::thread::JoinHandle<Instant> {
    let hdr = HDR + 0x100;
    rig.write_header(hdr, VIRTIO_BLK_T_IN, sector);
    rig.stage(&[
        (hdr, 16, false),
        (DATA + 0x10_0000, 4096, true),
        (STATUS + 1, 1, true),
    ]);
    let publish = rig.queue.publisher();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        publish();
        Instant::now()
    })
}

/// A request the driver makes available while the device thread spins toward a
/// completion (and so does not take it) arrives, for the card model and the trace, when
/// the spin first saw it, not when the spin ended and the request was taken.
#[test]
fn a_request_made_available_during_a_spin_arrives_when_the_spin_saw_it() {
    // A 200 ms program, and a spin margin longer than that: the kick that submits the
    // write spins until its completion is signalled.
    let (mut rig, _dir, path) = slow_program_rig(Duration::from_millis(300));
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 0);
    rig.push(&[(HDR, 16, false), (DATA, 4096, false), (STATUS, 1, true)]);
    // The read; the driver makes it available shortly after the kick, while the write
    // programs.
    let driver = read_made_available_after(&mut rig, 64, Duration::from_millis(20));
    let kicked = Instant::now();
    rig.kick();
    assert_eq!(
        rig.used().len(),
        1,
        "the kick spun until the write completed"
    );
    driver.join().unwrap();
    assert!(
        kicked.elapsed() >= Duration::from_millis(200),
        "the kick spun through the program: returned after {:?}",
        kicked.elapsed()
    );
    // Take the read; it completes in card time.
    rig.kick();
    let t0 = Instant::now();
    while rig.used().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "never completed");
        std::thread::sleep(Duration::from_millis(1));
        rig.tick();
    }
    rig.backend.shutdown();
    let rows = trace_rows(&path);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (write_arrival, write_done) = (rows[0][0], rows[0][3]);
    let read_arrival = rows[1][0];
    assert!(write_done >= write_arrival + 200_000_000, "{rows:?}");
    assert!(
        read_arrival < write_done,
        "the read was published during the write's programming, so it arrived before the \
         write completed: {rows:?}"
    );
    assert!(read_arrival > write_arrival, "{rows:?}");
}

/// When the card's next event is less than two spin margins away, the timer would fire in
/// less than a margin: the device thread spins instead of sleeping, so that it sees the
/// driver's next request when it is made available (not when a late wake-up lets it look),
/// and goes back to the event loop to take it.
#[test]
fn a_wait_shorter_than_the_margin_is_spun_and_ends_at_a_request() {
    // A 200 ms program and a 150 ms margin: the timer would fire 50 ms after the kick.
    let (mut rig, _dir, path) = slow_program_rig(Duration::from_millis(150));

    // Alone, the write's kick spins through the wait and the margin, and returns with the
    // write completed.
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 0);
    rig.push(&[(HDR, 16, false), (DATA, 4096, false), (STATUS, 1, true)]);
    let kicked = Instant::now();
    rig.kick();
    assert!(
        kicked.elapsed() >= Duration::from_millis(200),
        "the kick returned after {:?}, before the program's end",
        kicked.elapsed()
    );
    assert_eq!(rig.used().len(), 1, "the write completed within the kick");

    // A second write, and a read the driver makes available 20 ms later: the kick ends
    // when the spin sees the read, before the write completes.
    rig.write_header(HDR, VIRTIO_BLK_T_OUT, 64);
    rig.push(&[(HDR, 16, false), (DATA, 4096, false), (STATUS, 1, true)]);
    let driver = read_made_available_after(&mut rig, 128, Duration::from_millis(20));
    let kicked = Instant::now();
    rig.kick();
    let returned = kicked.elapsed();
    let published = driver.join().unwrap().duration_since(kicked);
    assert!(
        returned >= published,
        "the kick returned after {returned:?}, before the read was made available \
         ({published:?}): it slept instead of spinning"
    );
    assert!(
        rig.used().is_empty(),
        "the kick returned at the read, before the write's completion"
    );
    // The driver's kick comes late; the read still arrived when the spin saw it.
    std::thread::sleep(Duration::from_millis(120));
    let taken = kicked.elapsed();
    rig.kick();
    rig.wait_used(2, Duration::from_secs(5));
    rig.backend.shutdown();
    let rows = trace_rows(&path);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let (write_arrival, read_arrival) = (rows[1][0], rows[2][0]);
    let after = Duration::from_nanos(read_arrival - write_arrival);
    assert!(
        after < taken - Duration::from_millis(10),
        "the read arrived {after:?} after the write, as late as it was taken ({taken:?}): \
         {rows:?}"
    );
}

/// A target on an in-memory card of `m`, outside any backend, with 1 MiB of guest memory
/// holding `len` bytes of `fill` at 0x1000.
fn bare_target(
    m: &DeviceModel,
    fill: u8,
    len: usize,
) -> (CardTarget, GuestMemoryAtomic<GuestMemoryMmap>) {
    let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(m)))).unwrap();
    let mut target = CardTarget::new(card, m, &DriverPolicy::default()).unwrap();
    let guest: GuestMemoryMmap =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
    guest
        .write_slice(&vec![fill; len], GuestAddress(0x1000))
        .unwrap();
    let mem = GuestMemoryAtomic::new(guest);
    target.set_memory(Some(mem.clone()));
    (target, mem)
}

/// A request of one `len`-byte segment at guest address `addr`, its status at 0xF000.
fn one_segment(kind: RequestKind, sector: u64, addr: u64, len: u32) -> Request {
    Request {
        kind,
        sector,
        data: vec![Segment {
            addr: GuestAddress(addr),
            len,
        }],
        data_len: u64::from(len),
        ranges: Vec::new(),
        status: GuestAddress(0xF000),
    }
}

/// A request that arrives while the driver is already past its arrival (busy with
/// something it cannot interrupt) enters the driver's queue then, but keeps its true
/// arrival: the latency the trace records and the pacing sees counts from it.
#[test]
fn a_request_arriving_behind_the_drivers_clock_keeps_its_arrival() {
    let mut m = model(3_000_000);
    m.ext_csd.cache_size = 0;
    let (mut target, mem) = bare_target(&m, 7, 4096);
    let guest = mem.memory();
    let request = |kind, addr| one_segment(kind, 16, addr, 4096);
    let t0 = target.now();
    target.submit(&*guest, 0, request(RequestKind::Write, 0x1000), t0);
    target.run_until(Nanos::MAX);
    let write = target.take_finished();
    assert_eq!(write.len(), 1);
    assert_eq!(write[0].status, VIRTIO_BLK_S_OK);
    let busy_end = target.now();
    assert!(busy_end >= t0 + 3_000_000, "the write programmed for 3 ms");

    // The read arrived 1 ms into the write's programming.
    let arrival = t0 + 1_000_000;
    target.submit(&*guest, 1, request(RequestKind::Read, 0x2000), arrival);
    target.run_until(Nanos::MAX);
    let read = target.take_finished();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].status, VIRTIO_BLK_S_OK);
    assert_eq!(
        read[0].arrival, arrival,
        "the arrival is the guest's, not the driver's"
    );
    assert!(
        read[0].at >= busy_end,
        "it could not start before the card was free"
    );
    let mut back = [0u8; 4096];
    guest.read_slice(&mut back, GuestAddress(0x2000)).unwrap();
    assert!(
        back.iter().all(|&b| b == 7),
        "the read returns what was written"
    );
}

#[test]
fn an_injected_persistent_error_is_ioerr_and_the_device_keeps_serving() {
    let mut rig = Rig::new(model(0), Pacing::Off);
    let plan = emmc_host::fault::FaultPlan::from_toml_str(
        "[[rule]]\ndirection = \"read\"\nlba = { start = 2048, end = 2056 }\neffect = { kind = \"data_crc\" }\n",
    )
    .unwrap();
    rig.backend.with_target(|t| {
        t.set_fault_injector(Some(emmc_host::fault::FaultInjector::new(plan).unwrap()))
    });
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 3 % 253) as u8).collect();
    write(&mut rig, 2048, &data);
    assert_eq!(
        rig.status(STATUS),
        VIRTIO_BLK_S_OK,
        "writes are not affected"
    );
    write(&mut rig, 4096, &data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    rig.used();
    read(&mut rig, 2048, 4096);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_IOERR);
    assert_eq!(rig.used().len(), 1, "the failed request completed");
    let retries = rig.backend.with_target(|t| t.driver().stats().retries);
    assert_eq!(
        retries,
        u64::from(emmc_host::blkdrv::MMC_BLK_RETRIES),
        "the driver retried before giving up"
    );
    // The device keeps serving, outside the range and inside it once the rule is gone.
    assert_eq!(read(&mut rig, 4096, 4096), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    rig.backend
        .with_target(|t| t.fault_injector_mut().unwrap().clear());
    assert_eq!(read(&mut rig, 2048, 4096), data);
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
}

/// The frontend leaves while the card is still programming its last write (or busy with
/// anything else): the restart waits for the card, writes back, power-cycles it and
/// brings it up again. A command sent to a busy card is one it does not answer.
#[test]
fn a_frontend_leaving_while_the_card_programs_is_followed_by_a_clean_restart() {
    let mut m = model(3_000_000);
    m.ext_csd.cache_size = 0;
    let (mut target, mem) = bare_target(&m, 9, 4096);
    let guest = mem.memory();
    let write = one_segment(RequestKind::Write, 64, 0x1000, 4096);
    let t0 = target.now();
    target.submit(&*guest, 0, write, t0);
    target.run_until(t0 + 500_000);
    assert!(
        target.card().busy_until().is_some_and(|t| t > target.now()),
        "the card is still programming when the frontend goes"
    );
    target.set_memory(None);
    target
        .restart()
        .expect("the card comes back up for the next frontend");
    let mut back = vec![0u8; 4096];
    target
        .driver_mut()
        .host_mut()
        .card
        .peek(emmc_card::Partition::User, 64, &mut back)
        .unwrap();
    assert!(back.iter().all(|&b| b == 9), "the write was programmed");
}

/// A power cut while the card programs, the driver's recovery, more writes, then the
/// frontend leaves: the restart brings the card up again (the guest test's faults set).
#[test]
fn a_restart_after_a_power_cut_and_the_drivers_recovery_brings_the_card_up() {
    let m = model(3_000_000);
    let (mut target, mem) = bare_target(&m, 5, 0x8000);
    let guest = mem.memory();
    let request = |kind, sector| one_segment(kind, sector, 0x1000, 0x8000);
    for round in 0..4u64 {
        for i in 0..8u64 {
            let t = target.now();
            target.submit(
                &*guest,
                i as u16,
                request(RequestKind::Write, 1024 * round + 64 * i),
                t,
            );
        }
        let t = target.now();
        target.run_until(t + 700_000);
        let h = target.driver_mut().host_mut();
        let at = emmc_host::mmc::MmcHostOps::now(h);
        h.card.sudden_power_loss(at, true);
        target.run_until(Nanos::MAX);
        let _ = target.take_finished();
        let t = target.now();
        target.submit(&*guest, 99, request(RequestKind::Flush, 0), t);
        target.run_until(t + 1_000);
        target.set_memory(None);
        target
            .restart()
            .expect("the card comes back up for the next frontend");
        target.set_memory(Some(mem.clone()));
        let t = target.now();
        target.submit(&*guest, 100, request(RequestKind::Read, 0), t);
        target.run_until(Nanos::MAX);
        let done = target.take_finished();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].status, VIRTIO_BLK_S_OK, "round {round}");
    }
}

/// Serve's default driver (`DriverPolicy::default`, from `BlkConfig::served`) lets a
/// guest's read overtake the writeback the guest queued before it, as seed 000's CFQ
/// did; noop, which keeps the guest's order, makes it wait for every write. A guest's
/// virtqueue holds 128 requests (QEMU's vhost-user-blk), so this is the difference
/// between a reader at its own rate and one at 1.8 MB/s (docs/host-driver.md, "serve's
/// defaults and seed 000").
#[test]
fn by_default_a_read_overtakes_the_writeback_queued_before_it() {
    let m = DeviceModel::load("msm-emmc45-sdr50").unwrap();
    let order = |policy: &DriverPolicy| {
        let card = Card::new(m.clone(), Box::new(MemStore::new(Card::layout_for(&m)))).unwrap();
        let mut target = CardTarget::new(card, &m, policy).unwrap();
        let guest: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let mem = GuestMemoryAtomic::new(guest);
        target.set_memory(Some(mem.clone()));
        let guest = mem.memory();
        let t0 = target.now();
        // A full virtqueue of 64 KiB writeback, then a 128 KiB read 1 ms later.
        for i in 0..127u16 {
            let sector = 1_000_000 + u64::from(i) * 128;
            let w = one_segment(RequestKind::Write, sector, 0x1000, 65_536);
            target.submit(&*guest, i, w, t0);
        }
        let r = one_segment(RequestKind::Read, 0, 0x20000, 131_072);
        target.submit(&*guest, 1000, r, t0 + 1_000_000);
        target.run_until(Nanos::MAX);
        let done = target.take_finished();
        assert_eq!(done.len(), 128);
        assert!(done.iter().all(|f| f.status == VIRTIO_BLK_S_OK));
        done.iter().position(|f| f.head == 1000).unwrap()
    };
    let served = order(&DriverPolicy::default());
    assert!(
        served <= 4,
        "with serve's defaults the read waited for {served} writes"
    );
    let noop = order(&DriverPolicy {
        elevator: emmc_host::iosched::Elevator::Noop,
        ..Default::default()
    });
    assert!(noop >= 120, "under noop the read waited for {noop} writes");
}

#[test]
fn small_image_writes_held_back_for_a_round_read_back_and_reach_the_image_at_a_flush() {
    use emmc_card::store::ImageStore;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let model = model(0);
    let mut store = ImageStore::create(&path, Card::layout_for(&model), &model.name).unwrap();
    store.set_io_threads(true).unwrap();
    let user = store.layout().user_offset();
    let card = Card::new(model.clone(), Box::new(store)).unwrap();
    let target = CardTarget::new(card, &model, &DriverPolicy::default()).unwrap();
    let mut rig = Rig::with_target(target, Pacing::Off);
    // 20 writes of 4 KiB per round over 256 blocks (1 MiB, twice the card's cache, so
    // the cache destages into the store during the rounds), blocks written again and
    // again: the last version of each must win.
    const BLOCKS: u64 = 256;
    let mut last = vec![0u8; BLOCKS as usize];
    for round in 0..12u64 {
        for i in 0..20u64 {
            let block = (round * 97 + i * 13) % BLOCKS;
            let version = (round * 20 + i) as u8 + 1;
            last[block as usize] = version;
            let (hdr, data, status) = (HDR + 16 * i, DATA + 4096 * i, STATUS + i);
            rig.write_header(hdr, VIRTIO_BLK_T_OUT, block * 8);
            rig.mem
                .memory()
                .write_slice(&[version; 4096], GuestAddress(data))
                .unwrap();
            rig.stage(&[(hdr, 16, false), (data, 4096, false), (status, 1, true)]);
        }
        rig.publish();
        rig.kick();
        assert_eq!(rig.used().len(), 20, "round {round}");
        assert!((0..20).all(|i| rig.status(STATUS + i) == VIRTIO_BLK_S_OK));
    }
    for block in 0..BLOCKS {
        let want = last[block as usize];
        assert_eq!(
            read(&mut rig, block * 8, 4096),
            vec![want; 4096],
            "block {block}"
        );
    }
    rig.write_header(HDR, VIRTIO_BLK_T_FLUSH, 0);
    rig.push(&[(HDR, 16, false), (STATUS, 1, true)]);
    rig.kick();
    assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
    // The flush is complete: everything is in the image file, read past the daemon.
    let file = std::fs::File::open(&path).unwrap();
    for block in 0..BLOCKS {
        let mut b = vec![0u8; 4096];
        file.read_exact_at(&mut b, user + block * 4096).unwrap();
        let want = last[block as usize];
        assert_eq!(b, vec![want; 4096], "block {block} in the image");
    }
}

#[test]
fn reads_copied_ahead_on_the_image_thread_return_what_reads_on_the_device_thread_do() {
    // With the card's cache the round's writes wait in it (the card lays them over the
    // copies); without, each goes to the image at once (and voids the copy of its range).
    // CFQ serves a round's reads before its writes; noop keeps ring order, so that
    // writes reach the image between a read's copy and the card's read.
    for cache in [true, false] {
        for elevator in [DriverPolicy::default().elevator, Elevator::Noop] {
            reads_copied_ahead_match_reads_on_the_device_thread(cache, elevator);
        }
    }
}

fn reads_copied_ahead_match_reads_on_the_device_thread(cache: bool, elevator: Elevator) {
    use emmc_card::store::ImageStore;
    let dir = tempfile::tempdir().unwrap();
    let mut model = model(0);
    if !cache {
        model.ext_csd.cache_size = 0;
    }
    // The same rounds through two daemons: one whose image copies a round's reads ahead
    // on its helper thread (I/O threads on, no pacing), one that reads each on the
    // device thread. Every round mixes 16 reads with 8 writes of the same 64 blocks, in
    // ring order and out, so that writes land between a read's copy and the card's read.
    let rig = |name: &str, threads: bool| {
        let path = dir.path().join(name);
        let mut store = ImageStore::create(&path, Card::layout_for(&model), &model.name).unwrap();
        store.set_io_threads(threads).unwrap();
        let card = Card::new(model.clone(), Box::new(store)).unwrap();
        let policy = DriverPolicy {
            elevator,
            ..DriverPolicy::default()
        };
        let target = CardTarget::new(card, &model, &policy).unwrap();
        Rig::with_target(target, Pacing::Off)
    };
    let (mut ahead, mut here) = (rig("ahead.img", true), rig("here.img", false));
    const BLOCKS: u64 = 64;
    const READS: u64 = 16;
    const WRITES: u64 = 8;
    let read_buf = |i: u64| DATA + 0x40_0000 + 4096 * i;
    for round in 0..16u64 {
        let mut results = Vec::new();
        for rig in [&mut ahead, &mut here] {
            for i in 0..READS + WRITES {
                let (hdr, status) = (HDR + 16 * i, STATUS + i);
                if i % 3 == 2 {
                    let w = i / 3;
                    let block = (round * 11 + w * 7) % BLOCKS;
                    let data = DATA + 4096 * w;
                    rig.write_header(hdr, VIRTIO_BLK_T_OUT, block * 8);
                    let version = (round * WRITES + w) as u8 + 1;
                    rig.mem
                        .memory()
                        .write_slice(&[version; 4096], GuestAddress(data))
                        .unwrap();
                    rig.stage(&[(hdr, 16, false), (data, 4096, false), (status, 1, true)]);
                } else {
                    let r = i - i / 3;
                    let block = (round * 5 + r * 9) % BLOCKS;
                    rig.write_header(hdr, VIRTIO_BLK_T_IN, block * 8);
                    rig.mem
                        .memory()
                        .write_slice(&[0xEE; 4096], GuestAddress(read_buf(r)))
                        .unwrap();
                    rig.stage(&[
                        (hdr, 16, false),
                        (read_buf(r), 4096, true),
                        (status, 1, true),
                    ]);
                }
            }
            rig.publish();
            rig.kick();
            assert_eq!(
                rig.used().len() as u64,
                READS + WRITES,
                "round {round}, cache {cache}"
            );
            let statuses: Vec<u8> = (0..READS + WRITES)
                .map(|i| rig.status(STATUS + i))
                .collect();
            assert!(
                statuses.iter().all(|&s| s == VIRTIO_BLK_S_OK),
                "round {round}"
            );
            let reads: Vec<Vec<u8>> = (0..READS)
                .map(|r| {
                    let mut b = vec![0u8; 4096];
                    rig.mem
                        .memory()
                        .read_slice(&mut b, GuestAddress(read_buf(r)))
                        .unwrap();
                    b
                })
                .collect();
            results.push(reads);
        }
        for (r, (a, h)) in results[0].iter().zip(&results[1]).enumerate() {
            assert!(
                a == h,
                "cache {cache}, {elevator:?}, round {round}, read {r}: {:?} against {:?}",
                &a[..4],
                &h[..4]
            );
        }
    }
}

/// (used index, writes held, which call) at the end of a store's round.
type RoundEnd = (u16, usize, &'static str);

/// A store that holds writes back until the round ends, as the image store does with
/// small ones, and notes the used index of a queue each time it is told the round ended.
struct HoldingStore {
    inner: MemStore,
    held: Vec<(u64, Vec<u8>)>,
    seen: HoldingSeen,
}

/// What a [`HoldingStore`] was told, shared with the test that owns its card.
#[derive(Clone, Default)]
struct HoldingSeen {
    /// Guest memory and the used ring's index address, once the rig has them.
    used_idx: std::sync::Arc<std::sync::OnceLock<(GuestMemoryAtomic<GuestMemoryMmap>, u64)>>,
    /// (used index, writes held, which call) at each `end_batch` ("end") and
    /// `end_batch_here` ("here").
    log: std::sync::Arc<std::sync::Mutex<Vec<RoundEnd>>>,
    /// What `hold_large_writes` was last told.
    hold_large: std::sync::Arc<std::sync::Mutex<Option<bool>>>,
}

impl HoldingStore {
    /// A card target for model `m` on a holding store, and what the store will see.
    fn target(m: &DeviceModel) -> (CardTarget, HoldingSeen) {
        let seen = HoldingSeen::default();
        let store = HoldingStore {
            inner: MemStore::new(Card::layout_for(m)),
            held: Vec::new(),
            seen: seen.clone(),
        };
        let card = Card::new(m.clone(), Box::new(store)).unwrap();
        (
            CardTarget::new(card, m, &DriverPolicy::default()).unwrap(),
            seen,
        )
    }

    fn note(&mut self, call: &'static str) {
        if let Some((mem, at)) = self.seen.used_idx.get() {
            let idx = mem.memory().read_obj(GuestAddress(*at)).unwrap();
            self.seen
                .log
                .lock()
                .unwrap()
                .push((idx, self.held.len(), call));
        }
    }

    fn settle(&mut self) {
        for (offset, buf) in std::mem::take(&mut self.held) {
            self.inner.write_at(offset, &buf).unwrap();
        }
    }
}

impl Store for HoldingStore {
    fn layout(&self) -> ImageLayout {
        self.inner.layout()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.settle();
        self.inner.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.held.push((offset, buf.to_vec()));
        Ok(())
    }
    fn end_batch(&mut self) {
        self.note("end");
        self.settle();
    }
    fn end_batch_here(&mut self) {
        // Its writes are all small: quick to write here.
        self.note("here");
        self.settle();
    }
    fn hold_large_writes(&mut self, on: bool) {
        *self.seen.hold_large.lock().unwrap() = Some(on);
    }
    fn fill(&mut self, offset: u64, len: u64, byte: u8) -> Result<(), StoreError> {
        self.settle();
        self.inner.fill(offset, len, byte)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        self.settle();
        self.inner.sync()
    }
    fn load_card_state(&self) -> Option<toml::Table> {
        self.inner.load_card_state()
    }
    fn save_card_state(&mut self, state: &toml::Table) -> Result<(), StoreError> {
        self.inner.save_card_state(state)
    }
}

#[test]
fn a_paced_round_ends_the_stores_round_before_the_completion_but_hands_over_only_with_room() {
    // Paced, the device thread writes the held-back writes while it waits for the
    // completion's instant: after signalling, they would delay its look for the
    // client's next request (and so the arrival the card is given for it). With the
    // completion at least HAND_OVER_ROOM (1 ms) off, the store may hand them to its
    // writer thread (`end_batch`); nearer, it may only write them itself
    // (`end_batch_here`), as a thread woken within the spin margin can take the device
    // thread's CPU until past the completion's instant.
    // A cache of two 4 KiB lines (64 kibibits): from the third write on, each write
    // destages an older one into the store as its programming ends.
    // (A write of 10 ms leaves the check 9 ms for a loaded machine's stalls.)
    for (write_ns, call) in [(10_000_000, "end"), (400_000, "here")] {
        held_writes_reach_the_store(write_ns, call);
    }
}

/// Writes of 4 KiB into the cache take `write_ns`.
fn held_writes_reach_the_store(write_ns: u64, call: &'static str) {
    let mut m = model(write_ns);
    m.ext_csd.cache_size = 64;
    if let TimingModel::Constant(c) = &mut m.timing {
        c.cache_block_ns = write_ns / 8;
    }
    let (target, seen) = HoldingStore::target(&m);
    let mut rig = Rig::with_target(target, Pacing::Realtime { scale: 1.0 });
    assert_eq!(
        *seen.hold_large.lock().unwrap(),
        Some(true),
        "a paced daemon has the store hold large writes for the round"
    );
    // A margin longer than the program: each kick spins through to its completion.
    let margin = Duration::from_millis(50);
    rig.backend.set_spin(margin, margin);
    seen.used_idx
        .set((rig.mem.clone(), rig.queue.used_ring + 2))
        .unwrap();
    for i in 0..8u16 {
        write(&mut rig, u64::from(i) * 8, &[i as u8 + 1; 4096]);
        assert_eq!(rig.used().len(), 1, "write {i}");
        assert_eq!(rig.status(STATUS), VIRTIO_BLK_S_OK);
        // Every end of a round since the last write, as (used index, writes held, call).
        let ends = std::mem::take(&mut *seen.log.lock().unwrap());
        let gave: Vec<_> = ends.iter().filter(|&&(_, held, _)| held > 0).collect();
        if i < 2 {
            assert!(gave.is_empty(), "write {i}: the cache had room: {ends:?}");
            continue;
        }
        assert_eq!(
            gave,
            [&(i, 1, call)],
            "write {i}, writes of {write_ns} ns: the destage of an older line must \
            reach the store through `{call}` before this write's completion is signalled \
            (used index {i}): {ends:?}"
        );
    }
    for i in 0..8u64 {
        assert_eq!(read(&mut rig, i * 8, 4096), vec![i as u8 + 1; 4096]);
    }
}

#[test]
fn only_a_paced_daemon_has_the_store_hold_large_writes() {
    let (target, seen) = HoldingStore::target(&model(0));
    let _rig = Rig::with_target(target, Pacing::Off);
    assert_ne!(*seen.hold_large.lock().unwrap(), Some(true));
}
