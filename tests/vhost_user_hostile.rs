//! A hostile vhost-user frontend (issue 7): the daemon, both transports, gets malformed
//! messages over its socket — wrong sizes, unknown requests, bad memory tables, vring
//! addresses outside memory, kicks before setup, truncated messages, garbage rings in
//! real shared memory — and after each it must still serve a well-behaved frontend (a
//! raw GET_FEATURES handshake; for blk also libblkio reading and writing), never crash
//! (exit status, signal) and never hang (every read has a time-out).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// ---- the protocol (vhost-user spec, "Message types") -------------------------------------

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const RESET_OWNER: u32 = 4;
const SET_MEM_TABLE: u32 = 5;
const SET_LOG_BASE: u32 = 6;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_BASE: u32 = 10;
const GET_VRING_BASE: u32 = 11;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_VRING_ENABLE: u32 = 18;
const GET_CONFIG: u32 = 24;
const ADD_MEM_REG: u32 = 37;

const VERSION: u32 = 0x1;
const NEED_REPLY: u32 = 0x8;
/// SET_VRING_KICK/CALL payload: no file descriptor is sent.
const NOFD: u64 = 1 << 8;
const VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;

const MEM_BYTES: usize = 1 << 20;
/// The most one log line may repeat during one case (each sends well under this many
/// messages and kicks).
const MAX_REPEATS: usize = 40;
/// Where our mappings pretend to live in the VMM's address space.
const USER_BASE: u64 = 0x7f00_0000_0000;

struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(transport: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("emmc.sock");
        let log = dir.path().join("daemon.log");
        let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .args([
                "serve",
                "--create",
                "--timing",
                "off",
                "--transport",
                transport,
                "--socket",
            ])
            .arg(&socket)
            .arg("--image")
            .arg(dir.path().join("card.img"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            socket,
            log,
            _dir: dir,
        };
        let t0 = Instant::now();
        while !d.socket.exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon is still running (not crashed, not exited).
    fn assert_alive(&mut self, case: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{case}: the daemon exited ({status:?}); its log:\n{}",
                self.log()
            );
        }
    }

    /// A well-behaved frontend gets its GET_FEATURES answered. The previous session may
    /// still be winding down (the daemon closes early connections after a grace period),
    /// so retry for a while.
    fn assert_serving(&mut self, case: &str) {
        let t0 = Instant::now();
        loop {
            self.assert_alive(case);
            if let Ok(mut c) = Client::connect(&self.socket) {
                c.send(GET_FEATURES, 0, &[], &[]);
                if let Some((req, payload)) = c.reply() {
                    if req == GET_FEATURES && payload.len() == 8 {
                        let features = u64::from_le_bytes(payload.try_into().unwrap());
                        assert_ne!(features & VERSION_1, 0, "{case}: VERSION_1 missing");
                        return;
                    }
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{case}: no well-behaved frontend served within 20 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid with SIGTERM.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

struct Client {
    s: UnixStream,
}

impl Client {
    fn connect(socket: &Path) -> std::io::Result<Client> {
        let s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(Client { s })
    }

    /// Send a header claiming `size` payload bytes, then `payload` (which may differ in
    /// length: that is the point of some cases), with `fds` attached to the first byte.
    fn send_sized(&mut self, req: u32, flags: u32, size: u32, payload: &[u8], fds: &[RawFd]) {
        let mut msg = Vec::with_capacity(12 + payload.len());
        msg.extend_from_slice(&req.to_le_bytes());
        msg.extend_from_slice(&(VERSION | flags).to_le_bytes());
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(payload);
        // Errors are fine: the daemon may have closed the connection already.
        let _ = send_with_fds(self.s.as_raw_fd(), &msg, fds);
    }

    fn send(&mut self, req: u32, flags: u32, payload: &[u8], fds: &[RawFd]) {
        self.send_sized(req, flags, payload.len() as u32, payload, fds);
    }

    /// The next reply (request code and payload), or `None` on close / time-out.
    fn reply(&mut self) -> Option<(u32, Vec<u8>)> {
        let mut hdr = [0u8; 12];
        self.s.read_exact(&mut hdr).ok()?;
        let req = u32::from_le_bytes(hdr[0..4].try_into().unwrap());
        let size = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
        if size > 4096 {
            return None;
        }
        let mut payload = vec![0u8; size];
        self.s.read_exact(&mut payload).ok()?;
        Some((req, payload))
    }

    /// Whether the daemon closed this connection (EOF) within the time-out.
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        matches!(self.s.read(&mut b), Ok(0)) || {
            // A reply may come first; then look again.
            matches!(self.s.read(&mut b), Ok(0))
        }
    }
}

fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8).max(1)];
    // SAFETY: msghdr is plain data; zeroed is a valid value that we fill in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` bytes we own, enough for one cmsghdr with
        // `fd_bytes` of data (CMSG_SPACE); CMSG_FIRSTHDR is therefore non-null and
        // CMSG_DATA points inside the buffer, with room for the fds copied there.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: `msg` describes one iovec over `bytes` and a control buffer we own, both
    // alive for the call; MSG_NOSIGNAL turns a closed peer into EPIPE, not SIGPIPE.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A memfd of `len` bytes (guest memory the frontend shares).
fn memfd(len: usize) -> OwnedFd {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"hostile-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
    owned
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn kick(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: write 8 bytes from a live buffer to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// A memory region: guest address, size, user address, mmap offset.
fn region(gpa: u64, size: u64, uaddr: u64, offset: u64) -> Vec<u8> {
    [gpa, size, uaddr, offset]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn mem_table(regions: &[Vec<u8>]) -> Vec<u8> {
    let mut p = (regions.len() as u32).to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    for r in regions {
        p.extend_from_slice(r);
    }
    p
}

fn u64p(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn vring_state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

fn vring_addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut p = [index.to_le_bytes(), 0u32.to_le_bytes()].concat();
    for v in [desc, used, avail, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

/// Feature negotiation and ownership, as every frontend starts.
fn handshake(c: &mut Client) -> u64 {
    c.send(GET_FEATURES, 0, &[], &[]);
    let features = c
        .reply()
        .map(|(_, p)| u64::from_le_bytes(p.try_into().unwrap_or([0; 8])))
        .unwrap_or(0);
    c.send(SET_FEATURES, 0, &u64p(features & !PROTOCOL_FEATURES), &[]);
    c.send(SET_OWNER, 0, &[], &[]);
    features
}

/// One hostile session: what it sends. The connection is dropped at its end.
type Case = (&'static str, fn(&mut Client));

/// Cases whose refusal must be logged with this text (the rest are refused by the
/// vhost-user library, which ends the session: "frontend detached: <why>").
const EXPECTED_LOG: &[(&str, &str)] = &[
    (
        "an avail index beyond the ring size, connection held",
        "avail ring unusable",
    ),
    (
        "SET_VRING_NUM 0, huge, not a power of two, bad index",
        "out of range",
    ),
];

fn cases() -> Vec<Case> {
    vec![
        ("unknown request", |c| {
            c.send(0xdead, 0, &[1, 2, 3, 4], &[]);
            c.send(999, NEED_REPLY, &[], &[]);
        }),
        ("version 0 header", |c| {
            let _ = c.s.write_all(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }),
        ("size larger than the payload sent", |c| {
            c.send_sized(SET_FEATURES, 0, 8, &[1, 2, 3], &[]);
        }),
        ("size smaller than the message needs", |c| {
            c.send(SET_FEATURES, 0, &[1], &[]);
            c.send(SET_VRING_ADDR, 0, &[0; 8], &[]);
        }),
        ("size beyond the protocol's maximum", |c| {
            c.send_sized(SET_MEM_TABLE, 0, 0x1000_0000, &[0; 64], &[]);
        }),
        ("truncated header, then disconnect", |c| {
            let _ = c.s.write_all(&[GET_FEATURES as u8, 0, 0]);
        }),
        ("SET_MEM_TABLE without fds", |c| {
            handshake(c);
            c.send(
                SET_MEM_TABLE,
                NEED_REPLY,
                &mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, 0)]),
                &[],
            );
        }),
        ("SET_MEM_TABLE with more regions than the limit", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            let regions: Vec<_> = (0..9)
                .map(|i| region(i * 0x10_0000, 0x1000, USER_BASE + i * 0x10_0000, 0))
                .collect();
            let fds = vec![m.as_raw_fd(); 9];
            c.send(SET_MEM_TABLE, NEED_REPLY, &mem_table(&regions), &fds);
        }),
        ("SET_MEM_TABLE claiming more regions than it carries", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            let mut p = mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, 0)]);
            p[0] = 4;
            c.send(SET_MEM_TABLE, NEED_REPLY, &p, &[m.as_raw_fd()]);
        }),
        ("SET_MEM_TABLE with a zero-size region", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            c.send(
                SET_MEM_TABLE,
                NEED_REPLY,
                &mem_table(&[region(0, 0, USER_BASE, 0)]),
                &[m.as_raw_fd()],
            );
        }),
        ("SET_MEM_TABLE with overlapping regions", |c| {
            handshake(c);
            let (a, b) = (memfd(MEM_BYTES), memfd(MEM_BYTES));
            c.send(
                SET_MEM_TABLE,
                NEED_REPLY,
                &mem_table(&[
                    region(0, MEM_BYTES as u64, USER_BASE, 0),
                    region(0x8_0000, MEM_BYTES as u64, USER_BASE + 0x10_0000, 0),
                ]),
                &[a.as_raw_fd(), b.as_raw_fd()],
            );
        }),
        ("SET_MEM_TABLE with a region larger than its memfd", |c| {
            handshake(c);
            let m = memfd(4096);
            c.send(
                SET_MEM_TABLE,
                NEED_REPLY,
                &mem_table(&[region(0, 1 << 30, USER_BASE, 0)]),
                &[m.as_raw_fd()],
            );
        }),
        (
            "a region larger than its memfd, rings past the file's end, kicked",
            |c| {
                handshake(c);
                let m = memfd(4096);
                c.send(
                    SET_MEM_TABLE,
                    0,
                    &mem_table(&[region(0, 1 << 30, USER_BASE, 0)]),
                    &[m.as_raw_fd()],
                );
                c.send(SET_VRING_NUM, 0, &vring_state(0, 256), &[]);
                let base = USER_BASE + 0x10_0000;
                c.send(
                    SET_VRING_ADDR,
                    0,
                    &vring_addr(0, base, base + 0x8000, base + 0x4000),
                    &[],
                );
                c.send(SET_VRING_BASE, 0, &vring_state(0, 0), &[]);
                let (k, call) = (eventfd(), eventfd());
                c.send(SET_VRING_CALL, 0, &u64p(0), &[call.as_raw_fd()]);
                c.send(SET_VRING_KICK, 0, &u64p(0), &[k.as_raw_fd()]);
                kick(&k);
                std::thread::sleep(Duration::from_millis(200));
            },
        ),
        ("SET_MEM_TABLE with an mmap offset past the memfd", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            c.send(
                SET_MEM_TABLE,
                NEED_REPLY,
                &mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, u64::MAX - 4095)]),
                &[m.as_raw_fd()],
            );
        }),
        (
            "SET_MEM_TABLE with a region wrapping the address space",
            |c| {
                handshake(c);
                let m = memfd(MEM_BYTES);
                c.send(
                    SET_MEM_TABLE,
                    NEED_REPLY,
                    &mem_table(&[region(
                        u64::MAX - 4095,
                        MEM_BYTES as u64,
                        u64::MAX - 4095,
                        0,
                    )]),
                    &[m.as_raw_fd()],
                );
            },
        ),
        ("ADD_MEM_REG without fd", |c| {
            handshake(c);
            let mut p = u64p(0);
            p.extend(region(0, MEM_BYTES as u64, USER_BASE, 0));
            c.send(ADD_MEM_REG, NEED_REPLY, &p, &[]);
        }),
        ("vring messages before SET_OWNER and memory", |c| {
            c.send(SET_VRING_NUM, 0, &vring_state(0, 128), &[]);
            c.send(SET_VRING_ADDR, 0, &vring_addr(0, 0, 0x1000, 0x2000), &[]);
            let k = eventfd();
            c.send(SET_VRING_KICK, 0, &u64p(0), &[k.as_raw_fd()]);
            kick(&k);
            c.send(GET_VRING_BASE, 0, &vring_state(0, 0), &[]);
            std::thread::sleep(Duration::from_millis(50));
        }),
        (
            "SET_VRING_NUM 0, huge, not a power of two, bad index",
            |c| {
                handshake(c);
                c.send(SET_VRING_NUM, NEED_REPLY, &vring_state(0, 0), &[]);
                c.send(SET_VRING_NUM, NEED_REPLY, &vring_state(0, 0xffff_ffff), &[]);
                c.send(SET_VRING_NUM, NEED_REPLY, &vring_state(0, 100), &[]);
                c.send(SET_VRING_NUM, NEED_REPLY, &vring_state(77, 128), &[]);
                c.send(
                    SET_VRING_BASE,
                    NEED_REPLY,
                    &vring_state(0xffff, 0xffff_ffff),
                    &[],
                );
            },
        ),
        ("SET_VRING_KICK before SET_MEM_TABLE, then kicks", |c| {
            handshake(c);
            c.send(SET_VRING_NUM, 0, &vring_state(0, 128), &[]);
            let (k, call) = (eventfd(), eventfd());
            c.send(SET_VRING_CALL, 0, &u64p(0), &[call.as_raw_fd()]);
            c.send(SET_VRING_KICK, 0, &u64p(0), &[k.as_raw_fd()]);
            for _ in 0..10 {
                kick(&k);
            }
            c.send(SET_VRING_KICK, 0, &u64p(NOFD | 0x55), &[]);
            c.send(SET_VRING_KICK, 0, &u64p(0), &[]); // "has an fd" but none attached
            std::thread::sleep(Duration::from_millis(100));
        }),
        ("SET_VRING_ADDR outside guest memory, then a kick", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            c.send(
                SET_MEM_TABLE,
                0,
                &mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, 0)]),
                &[m.as_raw_fd()],
            );
            c.send(SET_VRING_NUM, 0, &vring_state(0, 256), &[]);
            // Inside the VMM's mapping by a few bytes at the end, and far outside.
            let end = USER_BASE + MEM_BYTES as u64;
            c.send(
                SET_VRING_ADDR,
                NEED_REPLY,
                &vring_addr(0, end - 16, end - 8, end - 4),
                &[],
            );
            c.send(
                SET_VRING_ADDR,
                NEED_REPLY,
                &vring_addr(0, 0x1000, 0x2000, 0x3000),
                &[],
            );
            c.send(
                SET_VRING_ADDR,
                NEED_REPLY,
                &vring_addr(0, u64::MAX - 8, u64::MAX, USER_BASE),
                &[],
            );
            let (k, call) = (eventfd(), eventfd());
            c.send(SET_VRING_CALL, 0, &u64p(0), &[call.as_raw_fd()]);
            c.send(SET_VRING_KICK, 0, &u64p(0), &[k.as_raw_fd()]);
            kick(&k);
            std::thread::sleep(Duration::from_millis(100));
        }),
        ("garbage rings in shared memory, kicked", |c| {
            handshake(c);
            let m = memfd(MEM_BYTES);
            // Fill the guest's memory with a pattern: descriptors pointing anywhere,
            // chains that loop, indirect flags, lengths up to 4 GiB, avail idx far ahead.
            let mut garbage = vec![0u8; MEM_BYTES];
            let mut x = 0x1234_5678_9abc_def0u64;
            for chunk in garbage.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes());
            }
            // SAFETY: write to our own memfd from a live buffer of MEM_BYTES bytes.
            let n = unsafe { libc::pwrite(m.as_raw_fd(), garbage.as_ptr().cast(), MEM_BYTES, 0) };
            assert_eq!(n as usize, MEM_BYTES);
            // Queue 0's avail ring (guest 0x14000) promises 200 chains of garbage, with
            // heads inside the table so the chains are walked.
            for i in 0..256usize {
                let at = 0x14004 + 2 * i;
                let head = u16::from_le_bytes([garbage[at], garbage[at + 1]]) % 256;
                garbage[at..at + 2].copy_from_slice(&head.to_le_bytes());
            }
            // SAFETY: write to our own memfd from a live buffer of 512 bytes.
            let n = unsafe {
                libc::pwrite(
                    m.as_raw_fd(),
                    garbage[0x14004..].as_ptr().cast(),
                    512,
                    0x14004,
                )
            };
            assert_eq!(n, 512);
            let idx = 200u16.to_le_bytes();
            // SAFETY: write to our own memfd from a live 2-byte buffer.
            assert_eq!(
                unsafe { libc::pwrite(m.as_raw_fd(), idx.as_ptr().cast(), 2, 0x14002) },
                2
            );
            c.send(
                SET_MEM_TABLE,
                0,
                &mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, 0)]),
                &[m.as_raw_fd()],
            );
            let (k, call) = (eventfd(), eventfd());
            // Queue 0 only: the blk device has one queue (SET_VRING_NUM 1 ends the session).
            for q in 0..1 {
                c.send(SET_VRING_NUM, 0, &vring_state(q, 256), &[]);
                let base = USER_BASE + 0x1_0000 * u64::from(q + 1);
                c.send(
                    SET_VRING_ADDR,
                    0,
                    &vring_addr(q, base, base + 0x8000, base + 0x4000),
                    &[],
                );
                c.send(SET_VRING_BASE, 0, &vring_state(q, 0), &[]);
                c.send(SET_VRING_CALL, 0, &u64p(u64::from(q)), &[call.as_raw_fd()]);
                c.send(SET_VRING_KICK, 0, &u64p(u64::from(q)), &[k.as_raw_fd()]);
            }
            // Without PROTOCOL_FEATURES a ring is enabled by its kick fd; enabling it
            // by message is refused (the session ends there).
            for _ in 0..5 {
                kick(&k);
                std::thread::sleep(Duration::from_millis(20));
            }
            c.send(GET_VRING_BASE, 0, &vring_state(0, 0), &[]);
            let _ = c.reply();
            c.send(SET_VRING_ENABLE, 0, &vring_state(0, 1), &[]);
        }),
        (
            "an avail index beyond the ring size, connection held",
            |c| {
                handshake(c);
                let m = memfd(MEM_BYTES);
                // avail ring at 0x2000: flags 0, idx 0x8000 (a ring of 256 cannot hold that).
                let avail = [0u16.to_le_bytes(), 0x8000u16.to_le_bytes()].concat();
                // SAFETY: write to our own memfd from a live 4-byte buffer.
                let n = unsafe { libc::pwrite(m.as_raw_fd(), avail.as_ptr().cast(), 4, 0x2000) };
                assert_eq!(n, 4);
                c.send(
                    SET_MEM_TABLE,
                    0,
                    &mem_table(&[region(0, MEM_BYTES as u64, USER_BASE, 0)]),
                    &[m.as_raw_fd()],
                );
                c.send(SET_VRING_NUM, 0, &vring_state(0, 256), &[]);
                let (d, a, u) = (USER_BASE + 0x1000, USER_BASE + 0x2000, USER_BASE + 0x3000);
                c.send(SET_VRING_ADDR, 0, &vring_addr(0, d, u, a), &[]);
                c.send(SET_VRING_BASE, 0, &vring_state(0, 0), &[]);
                let (k, call) = (eventfd(), eventfd());
                c.send(SET_VRING_CALL, 0, &u64p(0), &[call.as_raw_fd()]);
                c.send(SET_VRING_KICK, 0, &u64p(0), &[k.as_raw_fd()]);
                for _ in 0..3 {
                    kick(&k);
                    std::thread::sleep(Duration::from_millis(20));
                }
                // Hold the session (no GET_VRING_BASE) while the daemon sees the ring.
                std::thread::sleep(Duration::from_millis(500));
            },
        ),
        ("GET_CONFIG with a bad offset and size", |c| {
            handshake(c);
            let mut p = [
                0xffff_fff0u32.to_le_bytes(),
                0x1000u32.to_le_bytes(),
                0u32.to_le_bytes(),
            ]
            .concat();
            p.extend(vec![0u8; 16]);
            c.send(GET_CONFIG, 0, &p, &[]);
            let _ = c.reply();
        }),
        ("SET_LOG_BASE without a log fd, RESET_OWNER twice", |c| {
            handshake(c);
            c.send(SET_LOG_BASE, NEED_REPLY, &[0; 16], &[]);
            c.send(RESET_OWNER, 0, &[], &[]);
            c.send(RESET_OWNER, 0, &[], &[]);
            c.send(GET_PROTOCOL_FEATURES, 0, &[], &[]);
        }),
        ("a flood of fds on one message", |c| {
            let fds: Vec<OwnedFd> = (0..32).map(|_| eventfd()).collect();
            let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
            c.send(SET_OWNER, 0, &[], &raw);
            c.send(GET_FEATURES, 0, &[], &raw[..4]);
        }),
    ]
}

fn run_cases(transport: &str) -> Daemon {
    let mut daemon = Daemon::start(transport);
    daemon.assert_serving("before any hostile frontend");
    let mut seen = daemon.log().len();
    for (name, case) in cases() {
        let case_name = format!("{transport}: {name}");
        {
            let mut c = Client::connect(&daemon.socket)
                .unwrap_or_else(|e| panic!("{case_name}: connect: {e}"));
            case(&mut c);
            // Give the daemon a moment, then let go (or find it already let go).
            let _ = c.s.set_read_timeout(Some(Duration::from_millis(300)));
            let _ = c.closed();
        }
        daemon.assert_serving(&case_name);
        // What the daemon said about it (shown with --nocapture; docs/robustness.md).
        let log = daemon.log();
        let mut said: Vec<(String, usize)> = Vec::new();
        for line in log[seen..].lines() {
            // Without the timestamp, repeats counted.
            let text = line.split_once("] ").map_or(line, |(_, t)| t).to_string();
            match said.iter_mut().find(|(t, _)| *t == text) {
                Some((_, n)) => *n += 1,
                None => said.push((text, 1)),
            }
        }
        eprintln!("== {case_name}");
        for (text, n) in &said {
            eprintln!("   {n}x {text}");
        }
        // A hostile frontend must not turn the daemon into a log (and CPU) sink: no line
        // repeats more than a few times per message or kick it sent.
        for (text, n) in &said {
            assert!(*n <= MAX_REPEATS, "{case_name}: logged {n} times: {text}");
        }
        if let Some((_, expected)) = EXPECTED_LOG.iter().find(|(c, _)| *c == name) {
            assert!(
                said.iter().any(|(t, _)| t.contains(expected)),
                "{case_name}: the refusal was not logged ({expected:?})"
            );
        }
        seen = log.len();
    }
    daemon
}

#[test]
fn blk_daemon_survives_hostile_frontends() {
    let mut daemon = run_cases("blk");
    // A real frontend still does I/O afterwards.
    let t0 = Instant::now();
    let mut b = loop {
        let mut b = blkio::Blkio::new("virtio-blk-vhost-user").unwrap();
        b.set_str("path", daemon.socket.to_str().unwrap()).unwrap();
        if b.connect().is_ok() {
            break b;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "libblkio cannot connect"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    b.set_i32("num-queues", 1).unwrap();
    let mut started = b.start().unwrap();
    let mut q = started.queues.pop().unwrap();
    let region = b.alloc_mem_region(4096).unwrap();
    b.map_mem_region(&region).unwrap();
    let buf = region.addr as *mut u8;
    // SAFETY: the region is 4096 bytes we allocated and mapped.
    unsafe { std::ptr::write_bytes(buf, 0x5a, 4096) };
    q.write(0, buf, 4096, 0, blkio::ReqFlags::empty());
    let mut done = [std::mem::MaybeUninit::<blkio::Completion>::uninit()];
    let n = q
        .do_io(&mut done, 1, Some(&mut Duration::from_secs(10)), None)
        .unwrap();
    assert_eq!(n, 1);
    // SAFETY: do_io returned 1: the first completion is initialised.
    assert_eq!(unsafe { done[0].assume_init_ref() }.ret, 0);
    // SAFETY: as above, the buffer is ours.
    unsafe { std::ptr::write_bytes(buf, 0, 4096) };
    q.read(0, buf, 4096, 0, blkio::ReqFlags::empty());
    let n = q
        .do_io(&mut done, 1, Some(&mut Duration::from_secs(10)), None)
        .unwrap();
    assert_eq!(n, 1);
    // SAFETY: as above.
    assert_eq!(unsafe { done[0].assume_init_ref() }.ret, 0);
    // SAFETY: the buffer is 4096 bytes, initialised by the read.
    let data = unsafe { std::slice::from_raw_parts(buf, 4096) };
    assert!(data.iter().all(|&x| x == 0x5a), "data did not round-trip");
    drop(q);
    drop(started);
    drop(b);
    let status = daemon.stop();
    assert!(status.success(), "daemon exit after SIGTERM: {status:?}");
}

#[test]
fn mmc_daemon_survives_hostile_frontends() {
    let mut daemon = run_cases("mmc");
    let status = daemon.stop();
    assert!(status.success(), "daemon exit after SIGTERM: {status:?}");
    let log = daemon.log();
    assert!(
        log.contains("frontend attached"),
        "no session logged:\n{log}"
    );
}
