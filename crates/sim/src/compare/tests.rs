use super::*;
use crate::blkbench::run_experiment;
use emmc_host::packing::PackingMode;
use emmc_host::trace::TraceWriter;

fn args(argv: &[&str]) -> CompareArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: CompareArgs,
    }
    let argv = std::iter::once("compare").chain(argv.iter().copied());
    <Cli as clap::Parser>::try_parse_from(argv).unwrap().args
}

fn quiet() -> Progress {
    Progress::default()
}

#[test]
fn every_combination_of_the_policies_runs_in_the_order_given() {
    let specs = [
        "packing=off,always,controlled".to_string(),
        "hpi=on,off".into(),
    ];
    let p = policies(&specs, &DriverSetup::default()).unwrap();
    let labels: Vec<&str> = p.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "packing=off hpi=on",
            "packing=off hpi=off",
            "packing=always hpi=on",
            "packing=always hpi=off",
            "packing=controlled(17) hpi=on",
            "packing=controlled(17) hpi=off",
        ]
    );
    assert_eq!(p[2].setup.packing, PackingMode::Always);
    assert!(p[2].setup.hpi.enabled && !p[3].setup.hpi.enabled);
    // The threshold of write packing control is a policy of its own.
    let specs = ["packing=controlled".to_string(), "wr-threshold=5,30".into()];
    let p = policies(&specs, &DriverSetup::default()).unwrap();
    assert_eq!(
        p.iter().map(|p| p.setup.packing).collect::<Vec<_>>(),
        [
            PackingMode::Controlled { threshold: 5 },
            PackingMode::Controlled { threshold: 30 }
        ]
    );
    // No policy: the base set-up alone, named by its packing.
    let p = policies(&[], &DriverSetup::default()).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].label, "packing=off");
}

#[test]
fn a_bad_policy_is_refused_with_its_reason() {
    for (spec, why) in [
        ("packing", "KEY=V1"),
        ("colour=red", "unknown key"),
        ("packing=sometimes", "off, always or controlled"),
        ("wr-threshold=many", "a number"),
        ("scheduler=bfq", "noop, deadline or cfq"),
        ("hpi=maybe", "on or off"),
        ("packing=off,", "empty value"),
    ] {
        let e = policies(&[spec.to_string()], &DriverSetup::default()).unwrap_err();
        assert!(e.contains(why), "{spec}: {e}");
    }
    let twice = ["hpi=on".to_string(), "hpi=off".into()];
    assert!(policies(&twice, &DriverSetup::default()).is_err());
}

fn done(submitted: Nanos, completed: Nanos) -> Completed {
    Completed {
        submitted,
        completed,
        lba: 0,
        sectors: 8,
        write: true,
    }
}

#[test]
fn a_stall_is_a_gap_between_completions_with_a_request_waiting() {
    const MS: Nanos = 1_000_000;
    let c = [
        done(0, MS),
        // Submitted at 1 ms, done at 300 ms: a 299 ms stall.
        done(MS, 300 * MS),
        // Idle from 300 to 1000 ms: no stall, nothing was waiting. Then 150 ms.
        done(1000 * MS, 1150 * MS),
        // Two outstanding together: the gap to the first completion counts once.
        done(1200 * MS, 1250 * MS),
        done(1200 * MS, 1390 * MS),
    ];
    let s = stalls(&c, 100 * MS);
    assert_eq!(s.count, 3, "{s:?}");
    assert!((s.longest_ms - 299.0).abs() < 1e-9);
    assert!((s.total_ms - (299.0 + 150.0 + 140.0)).abs() < 1e-9, "{s:?}");
    assert_eq!(stalls(&c, 400 * MS).count, 0);
    assert_eq!(stalls(&[], MS).count, 0);
}

/// A closed-loop run written out as a trace and replayed open-loop reproduces every
/// completion: the replay puts each request on the same driver at the same instant.
#[test]
fn the_trace_of_a_run_replays_to_the_same_completions() {
    let m = DeviceModel::load("toshiba-mmc32g").unwrap();
    let setup = DriverSetup {
        elevator: SchedulerArg::Noop.elevator(0),
        ..DriverSetup::default()
    };
    let job = Experiment::Job {
        op: Op::Write,
        pattern: Pattern::Random,
        bs: 8,
        qd: 4,
        count: 300,
        seed: 7,
    };
    let first = run_experiment(&m, &setup, &job).unwrap();
    // Completion order is submission order here (noop, one card); the sort is stable, so
    // requests submitted at one instant keep the order the driver saw them in.
    let mut reqs = first.completed.clone();
    reqs.sort_by_key(|c| c.submitted);
    let origin = reqs[0].submitted;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.trace");
    let file = std::fs::File::create(&path).unwrap();
    let mut w = TraceWriter::new(file, origin, "test").unwrap();
    for c in &reqs {
        w.record(
            c.submitted,
            Op::Write,
            c.lba * 512,
            u64::from(c.sectors) * 512,
            c.completed,
        );
    }
    w.flush().unwrap();
    drop(w);
    let text = std::fs::read_to_string(&path).unwrap();
    let trace = Trace::parse(text.as_bytes()).unwrap();
    assert_eq!(trace.len(), 300);
    let replay = Experiment::Replay {
        trace,
        qd: 256,
        name: "t".into(),
    };
    let second = run_experiment(&m, &setup, &replay).unwrap();
    let key = |c: &Completed| (c.submitted - origin, c.completed - origin, c.lba, c.sectors);
    let origin2 = second.completed.iter().map(|c| c.submitted).min().unwrap();
    let mut a: Vec<_> = first.completed.iter().map(key).collect();
    let mut b: Vec<_> = second
        .completed
        .iter()
        .map(|c| {
            (
                c.submitted - origin2,
                c.completed - origin2,
                c.lba,
                c.sectors,
            )
        })
        .collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a.len(), b.len());
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        panic!("request {i}: run {:?}, replay {:?}", a[i], b[i]);
    }
    assert!(
        (first.write.mb_per_s - second.write.mb_per_s).abs() / first.write.mb_per_s < 1e-6,
        "{} vs {}",
        first.write.mb_per_s,
        second.write.mb_per_s
    );
}

#[test]
fn compare_runs_every_model_under_every_policy_and_shows_their_differences() {
    let a = args(&[
        "--models",
        "generic-emmc45,msm-emmc45-sdr50",
        "--workload",
        "lmdd-write",
        "--size",
        "4M",
        "--policy",
        "packing=off,always",
    ]);
    let progress = Progress::default();
    let c = compare(&a, &progress).unwrap();
    let labels: Vec<&str> = c.runs.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "generic-emmc45 · packing=off",
            "generic-emmc45 · packing=always",
            "msm-emmc45-sdr50 · packing=off",
            "msm-emmc45-sdr50 · packing=always",
        ]
    );
    assert_eq!(progress.runs.load(Ordering::Relaxed), 4);
    assert_eq!(
        progress.runs_done.load(Ordering::Relaxed),
        4,
        "progress heard of every run"
    );
    assert_eq!(
        progress.requests.load(Ordering::Relaxed),
        0,
        "lmdd has no request count"
    );
    for r in &c.runs {
        assert_eq!(r.report.write.bytes, 4 << 20, "{}", r.label);
        assert_eq!(r.report.completed.len() as u64, r.report.write.ops);
    }
    assert_eq!(c.runs[0].report.driver.packed_writes, 0);
    assert!(c.runs[3].report.driver.packed_writes > 0);
    // Seed 000: packing speeds the msm card's buffered writes up by well over a third.
    let (off, on) = (
        c.runs[2].report.write.mb_per_s,
        c.runs[3].report.write.mb_per_s,
    );
    assert!(on > off * 1.3, "packing {off:.1} → {on:.1} MB/s");
    // Flash counters where the model has them.
    assert!(c.runs[0].write_amplification.is_none());
    assert!(c.runs[2].write_amplification.is_some());

    let text = c.to_text();
    for needle in [
        "generic-emmc45",
        "packing=always",
        "write MB/s",
        "write latency p99.9",
        "stalls > 100 ms",
        "GC time (ms)",
        "write amplification",
        "stop: reached max packed entries",
        "packs of 17+",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    assert!(!text.contains("read MB/s"), "no reads, no read rows");
    let json: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 4);
    assert_eq!(json["runs"][3]["policy"], "packing=always");
    assert_eq!(json["runs"][3]["model"], "msm-emmc45-sdr50");
    assert!(json["runs"][3]["write"]["mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["runs"][3]["stalls"]["count"].is_u64());
    assert!(json["runs"][3]["write_packing"]["packed"].is_array());
}

#[test]
fn models_differ_where_their_timing_does() {
    let a = args(&[
        "--models",
        "generic-emmc45,toshiba-mmc32g",
        "--workload",
        "rand-write",
        "--count",
        "200",
        "--jobs",
        "1",
    ]);
    let progress = Progress::default();
    let c = compare(&a, &progress).unwrap();
    assert_eq!(progress.requests.load(Ordering::Relaxed), 400);
    assert_eq!(progress.requests_done.load(Ordering::Relaxed), 400);
    let (g, t) = (&c.runs[0].report.write, &c.runs[1].report.write);
    assert_eq!((g.ops, t.ops), (200, 200));
    // Toshiba has no cache: every 4 KiB write programs (milliseconds); the generic card
    // caches them.
    assert!(t.p50_us > 5.0 * g.p50_us, "{} vs {}", t.p50_us, g.p50_us);
    assert!(c.runs[1].write_amplification.unwrap() > 1.0);
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    for argv in [
        &["--models", "no-such-model", "--workload", "seq-read"][..],
        &[
            "--models",
            "ideal",
            "--workload",
            "seq-read",
            "--bs",
            "1000",
        ],
        &["--models", "ideal", "--workload", "seq-read", "--qd", "0"],
        &[
            "--models",
            "ideal",
            "--workload",
            "seq-read",
            "--stall-ms",
            "0",
        ],
        &["--models", "ideal", "--trace", "/nonexistent/trace"],
    ] {
        assert!(compare(&args(argv), &quiet()).is_err(), "{argv:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.trace");
    std::fs::write(&bad, "0 X 0 512\n").unwrap();
    let e = compare(
        &args(&["--models", "ideal", "--trace", bad.to_str().unwrap()]),
        &quiet(),
    )
    .unwrap_err();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn out_writes_the_table_and_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let a = args(&[
        "--models",
        "ideal",
        "--workload",
        "seq-read",
        "--count",
        "50",
        "--out",
        out.to_str().unwrap(),
    ]);
    let printed = run_command(&a).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("compare.txt")).unwrap(),
        printed
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    assert_eq!(json["runs"][0]["read"]["ops"], 50);
    for plot in ["latency-cdf", "throughput", "latency-offset", "packing"] {
        for ext in ["png", "svg"] {
            let f = out.join(format!("{plot}.{ext}"));
            assert!(
                std::fs::metadata(&f).unwrap().len() > 500,
                "{}",
                f.display()
            );
        }
    }
    let svg = std::fs::read_to_string(out.join("latency-cdf.svg")).unwrap();
    assert!(
        svg.contains("ideal · packing=off"),
        "the legend names model and policy"
    );
}

#[test]
fn the_plots_get_every_completed_request_of_every_run() {
    let a = args(&[
        "--models",
        "generic-emmc45,toshiba-mmc32g",
        "--workload",
        "rand-write",
        "--count",
        "100",
        "--qd",
        "4",
        "--policy",
        "packing=always",
    ]);
    let c = compare(&a, &quiet()).unwrap();
    let series = plot_series(&c);
    assert_eq!(series.len(), 2);
    for (s, r) in series.iter().zip(&c.runs) {
        assert_eq!(s.label, r.label);
        assert_eq!(s.samples.len(), 100);
        assert!(s.samples.iter().all(|x| x.write && x.len == 4096));
        assert!(s.samples.iter().all(|x| x.complete_ns > x.submit_ns));
        assert_eq!(s.packing, r.report.write_packing.packed);
    }
    assert!(!series[1].packing.is_empty(), "toshiba packs queued writes");
}

/// A replay submits each request at its trace time, or when one of `qd` slots frees.
#[test]
fn a_replay_keeps_trace_times_and_its_queue_depth_bound() {
    let m = DeviceModel::load("generic-emmc45").unwrap();
    let setup = DriverSetup {
        elevator: SchedulerArg::Noop.elevator(0),
        ..DriverSetup::default()
    };
    // Ten reads at 0, then ten reads 50 ms apart.
    let mut text = String::new();
    for i in 0..10u64 {
        text.push_str(&format!("0 R {} 65536\n", i << 20));
    }
    for i in 0..10u64 {
        text.push_str(&format!("{} R {} 4096\n", (i + 1) * 50_000_000, i << 20));
    }
    let run = |qd| {
        let exp = Experiment::Replay {
            trace: Trace::parse(text.as_bytes()).unwrap(),
            qd,
            name: "t".into(),
        };
        let mut c = run_experiment(&m, &setup, &exp).unwrap().completed;
        c.sort_by_key(|c| (c.submitted, c.completed));
        c
    };
    let one = run(1);
    let t0 = one[0].submitted;
    for w in one[..10].windows(2) {
        assert_eq!(
            w[1].submitted, w[0].completed,
            "qd 1: next when one completes"
        );
    }
    for (i, c) in one[10..].iter().enumerate() {
        assert_eq!(
            c.submitted - t0,
            (i as u64 + 1) * 50_000_000,
            "at its trace time"
        );
    }
    let deep = run(16);
    assert!(
        deep[..10].iter().all(|c| c.submitted == t0),
        "all ten at once"
    );
    assert!(
        deep[9].latency() > 5 * deep[0].latency(),
        "the tenth waited its turn"
    );
}
