//! `blkbench --wake-probe-us`: the machine's wake-up, measured with no backend.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run blkbench with `args`, killing it if it has not finished in `limit`: a probe whose
/// signaller never signals must fail the test, not hang it.
fn blkbench(args: &[&str], limit: Duration) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_blkbench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("blkbench starts");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("blkbench {args:?} did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn the_wake_probe_reports_one_distribution_per_gap() {
    let out = blkbench(
        &["--wake-probe-us", "20,500", "--seconds", "0.3"],
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, gap) in lines.iter().zip([20.0, 500.0]) {
        assert_eq!(line["wake_gap_us"], gap);
        let n = line["wakeups"].as_u64().unwrap();
        // Each wake-up takes at least the gap: 0.3 s holds at most 0.3 s / gap of them.
        // How many fewer depends on the machine (703 of 15000 at 20 µs, on a day when
        // its wake-ups took hundreds of microseconds), but a working probe gets dozens.
        let most = (0.3e6 / gap) as u64;
        assert!(n <= most && n >= 10, "{n} wake-ups after {gap} µs gaps");
        let (p50, p99, max) = (
            line["p50_us"].as_f64().unwrap(),
            line["p99_us"].as_f64().unwrap(),
            line["max_us"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{line}");
    }
}

/// blkbench with `args` fails, and says something containing `says`.
fn fails_saying(args: &[&str], says: &str) {
    let out = blkbench(args, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

#[test]
fn a_probe_needs_gaps_that_are_durations_and_jobs_need_a_socket() {
    fails_saying(&["--wake-probe-us=-5"], "is not a duration");
    fails_saying(&["randread:4k:1"], "--socket");
    fails_saying(
        &["--wake-signaller", "1,2"],
        "expected READY_FD,GO_FD,GAP_NS,SECONDS",
    );
}
