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
        Daemon::start_with(model, &[])
    }

    /// With `extra` arguments; `@DIR@` in them stands for the daemon's directory.
    fn start_with(model: &str, extra: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("emmc.sock");
        let image = dir.path().join("card.img");
        let dirname = dir.path().to_str().unwrap().to_string();
        let extra: Vec<String> = extra.iter().map(|a| a.replace("@DIR@", &dirname)).collect();
        let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .args([
                "serve", "--create", "--timing", "off", "--model", model, "--socket",
            ])
            .arg(&socket)
            .arg("--image")
            .arg(&image)
            .args(&extra)
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

    fn flush(&mut self) -> i32 {
        self.q.flush(0, ReqFlags::empty());
        let mut c = [std::mem::MaybeUninit::<Completion>::uninit()];
        let n = self
            .q
            .do_io(&mut c, 1, Some(&mut Duration::from_secs(10)), None)
            .unwrap();
        assert_eq!(n, 1, "no completion of the flush");
        // SAFETY: do_io returned 1, so the first completion is initialised.
        unsafe { c[0].assume_init_ref() }.ret
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
    // `--create` made the image and said so.
    assert!(
        log.contains(&format!(
            "created {} for model generic-emmc45",
            image.display()
        )),
        "{log}"
    );
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

/// One request line to the control socket, its answer.
fn control(path: &Path, line: &str) -> serde_json::Value {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    writeln!(s, "{line}").unwrap();
    let mut answer = String::new();
    std::io::BufReader::new(s).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
}

/// `serve --control`: faults added and cleared, a power cut, statistics and hostile
/// requests, all while a frontend is attached and served.
#[test]
fn the_control_socket_injects_faults_cuts_power_and_reports_statistics() {
    let mut d = Daemon::start_with("generic-emmc45", &["--control", "@DIR@/control.sock"]);
    let ctl = d.socket.with_file_name("control.sock");
    let t0 = Instant::now();
    while !ctl.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no control socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mode = std::fs::metadata(&ctl).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the control socket is owner-only");
    let mut s = connect(&d.socket).unwrap();

    // A flushed write, then one only in the card's volatile cache.
    s.fill(0x11);
    assert_eq!(s.io(true, 0), 0);
    assert_eq!(s.flush(), 0);
    s.fill(0x22);
    assert_eq!(s.io(true, 8192), 0);
    let st = control(&ctl, r#"{"cmd": "stats"}"#);
    assert_eq!(st["ok"], true, "{st}");
    assert!(
        st["card"]["counters"]["sectors_written"].as_u64().unwrap() >= 8,
        "{st}"
    );
    assert_eq!(st["transport"]["write_latency"]["count"], 2, "{st}");
    assert!(st["transport"]["write_latency"]["p50_us"].as_f64().unwrap() > 0.0);

    // Every read now fails its data CRC: the driver retries, then the guest gets EIO.
    let added = control(
        &ctl,
        r#"{"cmd": "add_fault", "rule": {"direction": "read", "effect": {"kind": "data_crc"}}}"#,
    );
    assert_eq!(
        (added["ok"].clone(), added["index"].clone()),
        (true.into(), 0.into()),
        "{added}"
    );
    assert!(
        s.io(false, 0) < 0,
        "an injected persistent error reaches the guest"
    );
    let f = control(&ctl, r#"{"cmd": "faults"}"#);
    assert!(
        f["rules"][0]["fired"].as_u64().unwrap() >= 2,
        "retried: {f}"
    );
    assert_eq!(control(&ctl, r#"{"cmd": "clear_faults"}"#)["ok"], true);
    assert_eq!(s.io(false, 0), 0, "served again once the rule is gone");
    assert_eq!(s.first_byte(), 0x11);

    // A power cut: what was flushed survives, what sat in the cache does not, and the
    // host driver brings the card back up on its own.
    let cut = control(&ctl, r#"{"cmd": "power_cut"}"#);
    assert_eq!(cut["ok"], true, "{cut}");
    assert_eq!(s.io(false, 8192), 0, "the driver re-initialised the card");
    assert_eq!(
        s.first_byte(),
        0,
        "the cached write was lost with the power"
    );
    assert_eq!(s.io(false, 0), 0);
    assert_eq!(s.first_byte(), 0x11, "the flushed write survived");
    let st = control(&ctl, r#"{"cmd": "stats"}"#);
    assert_eq!(st["transport"]["driver"]["resets"], 1, "{st}");

    // Hostile requests get an error answer and change nothing.
    for bad in [
        "not json",
        r#"{"cmd": "format_the_disk"}"#,
        r#"{"cmd": "add_fault", "rule": {"probability": 2.0, "effect": {"kind": "data_crc"}}}"#,
        r#"{"cmd": "add_fault", "rule": {"effect": {"kind": "no_such_effect"}}}"#,
        r#"{"cmd": "stats", "extra": 1}"#,
    ] {
        let a = control(&ctl, bad);
        assert_eq!(a["ok"], false, "{bad} → {a}");
        assert!(a["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    {
        use std::io::{BufRead, Write};
        let mut c = std::os::unix::net::UnixStream::connect(&ctl).unwrap();
        let long = vec![b'x'; 100 * 1024];
        let _ = c.write_all(&long);
        let mut answer = String::new();
        let _ = std::io::BufReader::new(c).read_line(&mut answer);
        assert!(answer.contains("\"ok\":false"), "{answer}");
    }
    assert_eq!(
        control(&ctl, r#"{"cmd": "faults"}"#)["rules"],
        serde_json::json!([])
    );

    // The CLI: a rule written as TOML, and a refused request as a failed command.
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .arg("control")
            .arg("--socket")
            .arg(&ctl)
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&[
        "add-fault",
        "direction = \"write\"\neffect = { kind = \"data_crc\" }",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"index\": 0"),
        "{out:?}"
    );
    s.fill(0x33);
    assert!(s.io(true, 16_384) < 0, "the rule added from the CLI acts");
    assert!(cli(&["clear-faults"]).status.success());
    assert_eq!(s.io(true, 16_384), 0);
    let refused = cli(&["raw", r#"{"cmd": "nope"}"#]);
    assert!(
        !refused.status.success(),
        "a refused request fails the command"
    );
    let bad_rule = cli(&[
        "add-fault",
        "effect = { kind = \"data_crc\" }\nprobability = 7.0",
    ]);
    assert!(
        !bad_rule.status.success(),
        "an invalid rule is refused before sending"
    );
    assert_eq!(s.io(false, 0), 0, "the guest is still served");
    drop(s);
    let log = d.stop();
    assert!(log.contains("control: sudden power loss"), "{log}");
    assert!(!ctl.exists(), "the control socket is removed at exit");
}

/// The machine's aggregate CPU latency request, in microseconds.
fn cpu_latency_now() -> i32 {
    let bytes = std::fs::read("/dev/cpu_dma_latency").unwrap();
    i32::from_ne_bytes(bytes[..4].try_into().unwrap())
}

#[test]
fn a_cpu_latency_request_is_held_while_serving_and_withdrawn_at_exit() {
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok();
    if !writable {
        // Without the right to make the request, the daemon says so and does not serve.
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .args(["serve", "--create", "--cpu-latency-us", "0", "--socket"])
            .arg(dir.path().join("s.sock"))
            .arg("--image")
            .arg(dir.path().join("card.img"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("/dev/cpu_dma_latency"), "{err}");
        assert!(!dir.path().join("s.sock").exists());
        return;
    }
    let before = cpu_latency_now();
    // A request below whatever is in force, so that it shows in the aggregate.
    let asked = before.saturating_sub(1).max(0);
    if asked == before {
        eprintln!("another request of 0 µs is in force: this one cannot show");
        return;
    }
    let mut d = Daemon::start_with("ideal", &["--cpu-latency-us", &asked.to_string()]);
    assert_eq!(
        cpu_latency_now(),
        asked,
        "the request is in force while serving"
    );
    let log = d.stop();
    assert!(
        log.contains(&format!("CPU latency request of {asked} µs")),
        "{log}"
    );
    assert_eq!(
        cpu_latency_now(),
        before,
        "the request goes with the daemon"
    );
}
