//! `blkbench --stamps-out` against `vhost-user-emmc serve --timing realtime --trace`: the
//! client's stamps and the daemon's trace share CLOCK_MONOTONIC, request by request.
//!
//! Needs the daemon's binary beside blkbench's (`cargo test --workspace` builds both).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `vhost-user-emmc` binary of the same build as this blkbench.
fn daemon_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_blkbench")).with_file_name("vhost-user-emmc");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace`, which builds it",
        path.display()
    );
    path
}

fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid with SIGTERM.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            child.kill().ok();
            panic!("the daemon did not stop after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every paced request, set beside its trace line through the trace's clock line, was
/// queued before the daemon saw it, and the client woke for it only after its card time
/// had passed: pacing never shows a completion early, on the client's own clock.
#[test]
fn a_sleeping_clients_stamps_line_up_with_the_paced_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (socket, image, trace, stamps) = (
        dir.path().join("s.sock"),
        dir.path().join("card.img"),
        dir.path().join("trace.txt"),
        dir.path().join("stamps.txt"),
    );
    let daemon = Command::new(daemon_binary())
        .args(["serve", "--create", "--model", "generic-emmc45", "--timing"])
        .args(["realtime", "--socket"])
        .arg(&socket)
        .arg("--image")
        .arg(&image)
        .arg("--trace")
        .arg(&trace)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the daemon starts");
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_blkbench"))
        .args(["--seconds", "0.3", "--span", "64m", "--socket"])
        .arg(&socket)
        .arg("--stamps-out")
        .arg(&stamps)
        .arg("randread:4k:1")
        .output()
        .expect("blkbench runs");
    stop(daemon);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let text = std::fs::read_to_string(&trace).expect("trace");
    let anchor: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# clock: card time "))
        .map(|rest| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            (f[0].parse().unwrap(), f[4].parse().unwrap())
        })
        .collect();
    assert_eq!(anchor.len(), 1, "one clock line:\n{text}");
    let (card0, mono0) = anchor[0];
    let rows: Vec<(u64, u64)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (mono0 + f[0] - card0, mono0 + f[3] - card0)
        })
        .collect();
    let stamped: Vec<[u64; 3]> = std::fs::read_to_string(&stamps)
        .expect("stamps")
        .lines()
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            [f[0], f[1], f[2]]
        })
        .collect();
    assert!(
        stamped.len() >= 100,
        "{} requests in 0.3 s of 186 µs reads",
        stamped.len()
    );
    assert_eq!(
        rows.len(),
        stamped.len(),
        "one trace line per stamped request"
    );
    let mut slept = 0;
    for (i, (&(arrival, due), &[submit, wake, seen])) in rows.iter().zip(&stamped).enumerate() {
        // A microsecond for the two readings the daemon's clock line is made of.
        assert!(
            submit <= arrival + 1_000,
            "request {i} reached the ring at {arrival} ns, before it was queued at {submit}"
        );
        assert!(
            seen >= due,
            "request {i} was seen at {seen} ns, before its card time ended at {due}"
        );
        if wake != 0 {
            slept += 1;
            assert!(
                wake >= due && wake <= seen,
                "request {i}: woke at {wake} ns, due {due}, seen {seen}"
            );
        }
    }
    assert!(
        slept * 10 >= stamped.len() * 9,
        "the client slept for {slept} of {} paced requests",
        stamped.len()
    );
}
