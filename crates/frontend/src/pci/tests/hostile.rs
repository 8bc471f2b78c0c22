//! A hostile client: every case gets an error reply or ends its own session, and the
//! server answers the next message or client.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::Duration;

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
};

use super::wire::{self, Wire};
use super::{memfd, reg, Irq, Rig};
use crate::pacing::Pacing;
use crate::pci::SessionEnd;

const BAR0: u32 = 0;
const CONFIG: u32 = 7;
const IDS: u32 = 0x0007_1b36;
const RW: u32 = 3;

fn enable(w: &mut Wire) {
    assert!(w.write(CONFIG, 4, &0x0006u16.to_le_bytes()));
}

#[test]
fn region_accesses_out_of_range_of_odd_sizes_or_to_absent_regions_are_refused() {
    let rig = Rig::start(Pacing::Off);
    let mut w = rig.wire();
    assert!(w.read(BAR0, 0, 4).is_none(), "memory space disabled");
    enable(&mut w);
    assert_eq!(w.read(BAR0, 0, 4), Some(vec![0; 4]));
    let bad_bar = [
        (0, 3),
        (0, 0),
        (0, 16),
        (2, 4),
        (4, 8),
        (1, 2),
        (256, 1),
        (252, 8),
        (u64::MAX - 1, 2),
        (0, 0x1000_0000),
    ];
    for (offset, count) in bad_bar {
        assert!(
            w.read(BAR0, offset, count).is_none(),
            "read {offset:#x}+{count}"
        );
        let data = vec![0u8; count.min(64) as usize];
        if data.len() == count as usize {
            assert!(!w.write(BAR0, offset, &data), "write {offset:#x}+{count}");
        }
    }
    assert!(w.read(CONFIG, 250, 8).is_none());
    assert!(w.read(CONFIG, 256, 1).is_none());
    assert!(!w.write(CONFIG, 255, &[0, 0]));
    assert_eq!(w.read(CONFIG, 0, 256).map(|b| b.len()), Some(256));
    for region in [1, 2, 5, 6, 8] {
        assert!(w.read(region, 0, 4).is_none(), "region {region}");
        assert!(!w.write(region, 0, &[0; 4]), "region {region}");
    }
    assert!(w.read(9, 0, 4).is_none(), "no region 9");
    // The errno: EINVAL where the crate refuses by itself, 0 (!) where our backend does.
    let read = |region: u32| {
        let mut p = 0u64.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&4u32.to_le_bytes());
        p
    };
    let r = w.call(wire::REGION_READ, &read(9), &[]);
    assert_eq!((r.is_error(), r.error), (true, libc::EINVAL as u32));
    let r = w.call(wire::REGION_READ, &read(1), &[]);
    assert_eq!((r.is_error(), r.error), (true, 0));
    assert!(w.read(u32::MAX, 0, 4).is_none());
    // In D3hot the BAR is not decoded; back in D0 it is.
    assert!(w.write(CONFIG, 0x84, &[3]));
    assert!(w.read(BAR0, 0, 4).is_none());
    assert!(w.write(CONFIG, 0x84, &[0]));
    assert!(w.read(BAR0, 0, 4).is_some());
    assert_eq!(w.ids(), IDS);
    let accesses = rig.log.lock().unwrap().accesses.len();
    assert_eq!(accesses, 2, "nothing refused reached the device");
    assert!(rig.server.stats().refused >= 30);
}

#[test]
fn bad_set_irqs_are_refused() {
    let rig = Rig::start(Pacing::Off);
    let mut w = rig.wire();
    let irq = Irq::new();
    let fd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    let none_unmask = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK;
    assert!(
        !w.set_irqs(0, none_unmask, 0, 1, &[]),
        "INTx not enabled yet"
    );
    assert!(!w.set_irqs(5, fd_trigger, 0, 1, &[irq.raw()]), "no index 5");
    assert!(!w.set_irqs(1, fd_trigger, 0, 1, &[irq.raw()]), "no MSI");
    assert!(!w.set_irqs(0, fd_trigger, 1, 1, &[irq.raw()]), "start 1");
    assert!(
        !w.set_irqs(0, fd_trigger, 0, 2, &[irq.raw(), irq.raw()]),
        "count 2"
    );
    assert!(!w.set_irqs(0, fd_trigger | VFIO_IRQ_SET_DATA_NONE, 0, 1, &[irq.raw()]));
    assert!(!w.set_irqs(
        0,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_MASK,
        0,
        1,
        &[irq.raw()]
    ));
    assert!(!w.set_irqs(0, 0, 0, 1, &[]), "no data type, no action");
    assert!(
        !w.set_irqs(0, none_unmask, 0, 1, &[irq.raw()]),
        "a descriptor with DATA_NONE"
    );
    // The crate refuses DATA_BOOL itself (and leaves its payload unread): send none.
    assert!(!w.set_irqs(
        0,
        VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_MASK,
        0,
        0,
        &[]
    ));
    // An unmask "eventfd" epoll cannot watch (a regular file).
    assert!(w.set_irqs(0, fd_trigger, 0, 1, &[irq.raw()]));
    let file = tempfile::tempfile().unwrap();
    let fd_unmask = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_UNMASK;
    assert!(!w.set_irqs(0, fd_unmask, 0, 1, &[file.as_raw_fd()]));
    // Disabling what has no vectors is fine, as the kernel has it.
    assert!(w.set_irqs(
        2,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        0,
        &[]
    ));
    assert_eq!(w.ids(), IDS);
}

#[test]
fn bad_dma_maps_are_refused_and_maps_without_a_descriptor_are_ignored() {
    let rig = Rig::start(Pacing::Off);
    let mut w = rig.wire();
    let mem = memfd(0x10000);
    let fd = Some(mem.as_raw_fd());
    assert!(w.dma_map(RW, 0, 0x10000, 0x10000, fd));
    assert!(!w.dma_map(RW, 0, 0x18000, 0x10000, fd), "overlap");
    assert!(!w.dma_map(RW, 0, 0x30000, 0, fd), "empty");
    assert!(
        !w.dma_map(RW, 0x8000, 0x40000, 0x10000, fd),
        "past the file's end"
    );
    assert!(!w.dma_map(RW, 0, u64::MAX - 0xfff, 0x2000, fd), "wraps");
    assert!(
        !w.dma_map(RW, 0x123, 0x40000, 0x1000, fd),
        "unaligned offset"
    );
    assert!(!w.dma_map(0, 0, 0x40000, 0x1000, fd), "no access");
    let (sock, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let not_a_file = Some(sock.as_raw_fd());
    assert!(
        !w.dma_map(RW, 0, 0x40000, 0x1000, not_a_file),
        "not a regular file"
    );
    // Two descriptors: the crate refuses.
    let msg_fds = [mem.as_raw_fd(), mem.as_raw_fd()];
    let mut p = Vec::new();
    p.extend_from_slice(&32u32.to_le_bytes());
    p.extend_from_slice(&RW.to_le_bytes());
    for v in [0u64, 0x50000, 0x1000] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    assert!(w.call(wire::DMA_MAP, &p, &msg_fds).is_error());
    // No descriptor: accepted, remembered, unreachable.
    assert!(w.dma_map(RW, 0, 0x100000, 0x1000, None));
    assert_eq!(rig.server.dma_maps(), (2, 1));
    assert_eq!(rig.server.stats().maps_ignored, 1);
    assert!(!w.dma_unmap(0, 0x10000, 0x8000), "part of a map");
    assert!(!w.dma_unmap(0, 0x20000, 0x10000), "nothing there");
    assert!(!w.dma_unmap(1, 0x10000, 0x10000), "dirty bitmap");
    assert!(w.dma_unmap(0, 0x100000, 0x1000), "the ignored one");
    assert!(w.dma_unmap(2, 0, 0), "all (VFIO_DMA_UNMAP_FLAG_ALL)");
    assert_eq!(rig.server.dma_maps(), (0, 0));

    // The device's DMA into the unreachable map, or outside any, is its error.
    assert!(w.dma_map(RW, 0, 0x100000, 0x1000, None));
    enable(&mut w);
    for (src, dst) in [(0x100000u64, 0x0u64), (0xdead_0000, 0xbeef_0000)] {
        assert!(w.write(BAR0, reg::SRC, &src.to_le_bytes()));
        assert!(w.write(BAR0, reg::DST, &dst.to_le_bytes()));
        assert!(w.write(BAR0, reg::LEN, &64u32.to_le_bytes()));
        assert!(w.write(BAR0, reg::GO, &1u32.to_le_bytes()));
        super::wait_for(|| rig.log.lock().unwrap().copies > 0, "the copy");
        let status = w.read(BAR0, reg::STATUS, 4).unwrap();
        assert_eq!(status, (reg::DONE | reg::DMA_ERROR).to_le_bytes());
        assert!(w.write(BAR0, reg::STATUS, &status));
        rig.log.lock().unwrap().copies = 0;
    }
    assert_eq!(w.ids(), IDS);
}

#[test]
fn unknown_and_unsupported_commands_get_an_error_reply() {
    let rig = Rig::start(Pacing::Off);
    let mut w = rig.wire();
    for command in [0u16, 6, wire::DMA_READ, 12, 14, 15, 99, u16::MAX] {
        assert!(w.call(command, &[], &[]).is_error(), "command {command}");
        assert_eq!(w.ids(), IDS, "after command {command}");
    }
}

#[test]
fn a_client_that_vanishes_mid_message_or_sends_garbage_ends_only_its_own_session() {
    let rig = Rig::start(Pacing::Off);
    let mut ended = 0;
    let mut next = |rig: &Rig, what: &str| {
        ended += 1;
        rig.sessions(ended);
        assert_eq!(rig.wire().ids(), IDS, "served after: {what}");
        ended += 1;
        rig.sessions(ended);
    };
    // Half a header.
    let mut w = Wire::connect(&rig.path);
    w.s.write_all(&wire::header(1, wire::REGION_READ, 32)[..7])
        .unwrap();
    drop(w);
    next(&rig, "half a header");
    // A region write whose data never comes.
    let mut w = Wire::connect(&rig.path);
    let mut msg = wire::header(1, wire::REGION_WRITE, 16 + 16 + 64);
    msg.extend_from_slice(&0u64.to_le_bytes());
    msg.extend_from_slice(&CONFIG.to_le_bytes());
    msg.extend_from_slice(&64u32.to_le_bytes());
    msg.extend_from_slice(&[0; 10]);
    w.s.write_all(&msg).unwrap();
    drop(w);
    next(&rig, "a write cut short");
    // A DMA map cut short, with its descriptor.
    let mem = memfd(0x1000);
    let w = Wire::connect(&rig.path);
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    let msg = wire::header(1, wire::DMA_MAP, 48);
    w.s.send_with_fds(&[&msg[..]], &[mem.as_raw_fd()]).unwrap();
    drop(w);
    next(&rig, "a map cut short");
    // A version message too short for its own fields: the crate panics on it.
    let mut w = Wire::connect_bare(&rig.path);
    w.s.write_all(&wire::header(0, wire::VERSION, 0)).unwrap();
    w.s.write_all(&[0; 4]).unwrap();
    let _ = w.s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 1];
    assert_eq!(
        std::io::Read::read(&mut w.s, &mut buf).unwrap_or(0),
        0,
        "closed"
    );
    drop(w);
    next(&rig, "a short version message");
    // A version whose capabilities are not a C string (the crate unwraps it).
    let mut w = Wire::connect_bare(&rig.path);
    let mut msg = wire::header(0, wire::VERSION, 16 + 4 + 3);
    msg.extend_from_slice(&[0, 0, 1, 0, b'{', b'}', b'x']);
    w.s.write_all(&msg).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        std::io::Read::read(&mut w.s, &mut buf).unwrap_or(0),
        0,
        "closed"
    );
    drop(w);
    next(&rig, "a version without its NUL");
    // Garbage.
    let mut w = Wire::connect_bare(&rig.path);
    w.s.write_all(&[0xff; 64]).unwrap();
    drop(w);
    next(&rig, "garbage");
    assert!(rig.log.lock().unwrap().power_cycles >= 12);
}

#[test]
fn a_session_ending_in_a_panic_is_reported_as_such_and_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(super::FakeLog::default()));
    let server = crate::pci::PciServer::from_listener(
        listener,
        super::Fake::new(log.clone()),
        crate::pci::PciOptions::default(),
    )
    .unwrap();
    let client = std::thread::spawn(move || {
        let mut w = Wire::connect_bare(&path);
        w.s.write_all(&wire::header(0, wire::VERSION, 0)).unwrap();
        w.s.write_all(&[0; 4]).unwrap();
        let mut buf = [0u8; 1];
        let _ = std::io::Read::read(&mut w.s, &mut buf);
    });
    let end = server.serve_session().unwrap();
    assert!(matches!(end, SessionEnd::Panicked(_)), "{end:?}");
    client.join().unwrap();
    assert_eq!(log.lock().unwrap().power_cycles, 1);
}

#[test]
fn a_client_that_never_acknowledges_its_interrupt_gets_one_signal() {
    let rig = Rig::start(Pacing::Off);
    let mut w = rig.wire();
    enable(&mut w);
    let irq = Irq::new();
    let fd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    assert!(w.set_irqs(0, fd_trigger, 0, 1, &[irq.raw()]));
    for _ in 0..200 {
        assert!(w.write(BAR0, reg::RAISE, &1u32.to_le_bytes()));
        assert!(w.write(BAR0, reg::STATUS, &reg::DONE.to_le_bytes()));
    }
    assert_eq!(
        irq.wait(Duration::from_millis(100)),
        1,
        "masked after the first"
    );
    assert_eq!(rig.server.stats().intx_signals, 1);
}
