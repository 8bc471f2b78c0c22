//! The machine probes, measured with no backend: `blkbench --wake-probe-us` (its
//! wake-up) and `blkbench --handover-probe` (its cross-CPU hand-over of fresh blocks).

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

#[test]
fn the_handover_probe_reports_the_crossing_and_its_reference() {
    let out = blkbench(
        &["--handover-probe", "64k", "--seconds", "0.2"],
        Duration::from_secs(30),
    );
    let two_cpus = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    if !two_cpus {
        // One CPU: nothing to cross, and the probe says so instead of measuring one.
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs two CPUs"));
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8(out.stdout).expect("utf-8").trim())
            .expect("one JSON object");
    assert_eq!(line["handover_block"], 65536);
    for key in ["cross_cpu_gb_per_s", "same_cpu_gb_per_s"] {
        let rate = line[key].as_f64().unwrap_or(f64::NAN);
        // At least one 64 KiB block in 0.2 s, and no machine copies a petabyte a second:
        // a rate outside that is a broken measurement (a zero count, a zero time).
        assert!(rate > 64e3 / 0.2 / 1e9 && rate < 1e6, "{key}: {line}");
    }
}

#[test]
fn the_handover_probe_refuses_nothing_to_measure() {
    fails_saying(&["--handover-probe", "0"], "is nothing to measure");
    fails_saying(
        &["--handover-probe", "64k", "--seconds", "0"],
        "is nothing to measure",
    );
    fails_saying(
        &["--handover-probe", "64k", "randread:4k:1"],
        "cannot be used with",
    );
}
