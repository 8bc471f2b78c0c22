//! The daemon over a real vhost-user socket, driven by libblkio's virtio-blk-vhost-user
//! driver as an outside frontend: sessions one after another, a second frontend refused,
//! and what was written reaching the image.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blkio::{Blkio, Blkioq, Completion, ReqFlags};

const BLOCK: usize = 4096;

struct Daemon {
    child: Child,
    socket: PathBuf,
    image: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(model: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("emmc.sock");
        let image = dir.path().join("card.img");
        let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .args(["serve", "--timing", "off", "--model", model, "--socket"])
            .arg(&socket)
            .arg("--image")
            .arg(&image)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            socket,
            image,
            _dir: dir,
        };
        let t0 = Instant::now();
        while !d.socket.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// SIGTERM, then the daemon's log.
    fn stop(&mut self) -> String {
        // SAFETY: kill(2) on our own child's pid with SIGTERM.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut log = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        log
    }
}

/// One libblkio session with one queue and a buffer of BLOCK bytes.
struct Session {
    _b: Blkio,
    q: Blkioq,
    buf: *mut u8,
}

fn connect(socket: &Path) -> Result<Session, String> {
    let mut b = Blkio::new("virtio-blk-vhost-user").map_err(|e| e.message().to_string())?;
    b.set_str("path", socket.to_str().unwrap())
        .map_err(|e| e.message().to_string())?;
    b.connect().map_err(|e| e.message().to_string())?;
    b.set_i32("num-queues", 1)
        .map_err(|e| e.message().to_string())?;
    let mut started = b.start().map_err(|e| e.message().to_string())?;
    let q = started.queues.pop().ok_or("no queue")?;
    let region = b
        .alloc_mem_region(BLOCK)
        .map_err(|e| e.message().to_string())?;
    b.map_mem_region(&region)
        .map_err(|e| e.message().to_string())?;
    Ok(Session {
        buf: region.addr as *mut u8,
        _b: b,
        q,
    })
}

impl Session {
    fn io(&mut self, write: bool, offset: u64) -> i32 {
        if write {
            self.q
                .write(offset, self.buf as *const u8, BLOCK, 0, ReqFlags::empty());
        } else {
            self.q.read(offset, self.buf, BLOCK, 0, ReqFlags::empty());
        }
        let mut c = [std::mem::MaybeUninit::<Completion>::uninit()];
        let n = self
            .q
            .do_io(&mut c, 1, Some(&mut Duration::from_secs(10)), None)
            .unwrap();
        assert_eq!(
            n, 1,
            "no completion within 10 s: the daemon stopped serving"
        );
        // SAFETY: do_io returned 1, so the first completion is initialised.
        unsafe { c[0].assume_init_ref() }.ret
    }

    fn fill(&mut self, byte: u8) {
        // SAFETY: `buf` is the mapped region of BLOCK bytes owned by this session.
        unsafe { std::ptr::write_bytes(self.buf, byte, BLOCK) };
    }

    fn first_byte(&self) -> u8 {
        // SAFETY: as above; the read has completed.
        unsafe { *self.buf }
    }
}

fn user_area_offset(image: &Path) -> u64 {
    let sidecar = std::fs::read_to_string(format!("{}.emmc.toml", image.display())).unwrap();
    let field = |name: &str| -> u64 {
        sidecar
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .trim()
                    .strip_prefix('=')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap()
    };
    2 * field("boot_bytes") + field("rpmb_bytes")
}

#[test]
fn sessions_follow_one_another_a_second_frontend_is_refused_and_data_reaches_the_image() {
    let mut d = Daemon::start("generic-emmc45");
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is owner-only");

    // Session 1 writes and leaves.
    let mut s = connect(&d.socket).unwrap();
    s.fill(0xA5);
    assert_eq!(s.io(true, 8 * BLOCK as u64), 0);
    drop(s);

    // Session 2 connects at once (a restarted QEMU), sees the data and writes more.
    let mut s = connect(&d.socket).expect("a reconnecting frontend is served");
    s.fill(0);
    assert_eq!(s.io(false, 8 * BLOCK as u64), 0);
    assert_eq!(s.first_byte(), 0xA5);
    s.fill(0x5A);
    assert_eq!(s.io(true, 9 * BLOCK as u64), 0);

    // A second frontend while session 2 is attached is turned away...
    let t0 = Instant::now();
    let other = connect(&d.socket);
    assert!(other.is_err(), "a second frontend was accepted");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // ...and session 2 keeps working.
    assert_eq!(s.io(false, 9 * BLOCK as u64), 0);
    assert_eq!(s.first_byte(), 0x5A);
    drop(s);

    // Session 3, after the refused one.
    let mut s = connect(&d.socket).expect("served after a refusal");
    assert_eq!(s.io(false, 8 * BLOCK as u64), 0);
    assert_eq!(s.first_byte(), 0xA5);
    drop(s);

    let image = d.image.clone();
    let log = d.stop();
    assert!(log.contains("refusing a second frontend"), "{log}");
    // The cache was written back at shutdown: both blocks are in the image.
    let file = std::fs::File::open(&image).unwrap();
    let base = user_area_offset(&image);
    let at = |block: u64| {
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut b, base + block * BLOCK as u64)
            .unwrap();
        b[0]
    };
    assert_eq!((at(8), at(9)), (0xA5, 0x5A));
}
