//! `vhost-user-emmc simulate` end to end: JSON output, trace replay, argument errors.

use std::process::Command;

/// Run the binary with `args`.
fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
        .args(args)
        .output()
        .unwrap()
}

fn simulate(args: &[&str]) -> std::process::Output {
    let mut all = vec!["simulate"];
    all.extend_from_slice(args);
    cli(&all)
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_report_counts_every_request_and_replays_by_seed() {
    let args = [
        "--workload",
        "rand-write",
        "--count",
        "300",
        "--bs",
        "8k",
        "--seed",
        "9",
        "--json",
    ];
    let a = json(&simulate(&args));
    assert_eq!(a["requests"], 300);
    assert_eq!(a["write"]["ops"], 300);
    assert_eq!(a["write"]["bytes"], 300 * 8192);
    assert_eq!(a["errors"], 0);
    assert!(a["write"]["p50_us"].as_f64().unwrap() > 0.0);
    let b = json(&simulate(&args));
    assert_eq!(a, b, "the same seed gives the same run");
}

#[test]
fn a_trace_replays_with_its_ops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.trace");
    std::fs::write(
        &path,
        "0 W 0 4096\n0 W 4096 4096\n1000000 R 0 8192\n2000000 F 0 0\n3000000 D 0 8192\n",
    )
    .unwrap();
    let r = json(&simulate(&[
        "--workload",
        "trace",
        "--trace",
        path.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(r["requests"], 5);
    assert_eq!(r["write"]["ops"], 2);
    assert_eq!(r["read"]["ops"], 1);
    assert!(
        r["card_time_s"].as_f64().unwrap() >= 0.003,
        "trace times hold requests back"
    );
    assert_eq!(r["card"]["flushes"], 1);
    assert_eq!(r["card"]["erases"], 1);
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, want) in [
        (
            vec!["--workload", "seq-write", "--bs", "1000"],
            "multiple of 512",
        ),
        (vec!["--workload", "trace"], "--trace"),
        (vec!["--workload", "seq-read", "--offset", "100G"], "beyond"),
        (
            vec!["--workload", "seq-read", "--model", "no-such-model"],
            "no-such-model",
        ),
        // Values that cannot describe a run are refused, naming the option.
        (vec!["--workload", "seq-read", "--count", "0"], "--count"),
        (vec!["--workload", "rand-write", "--qd", "0"], "--qd"),
        (vec!["--workload", "align-read", "--tries", "0"], "--tries"),
        (vec!["--workload", "open-au", "--open-au", "0"], "--open-au"),
        (
            vec!["--workload", "open-au", "--erasesize", "0"],
            "--erasesize",
        ),
        (vec!["--workload", "seq-read", "--span", "0"], "--span"),
        (
            vec!["--workload", "lmdd-write", "--write-depth", "0"],
            "--write-depth",
        ),
        (vec!["--workload", "power-cut", "--cuts", "0"], "--cuts"),
        (
            vec!["--workload", "power-cut", "--hpi-percent", "101"],
            "--hpi-percent",
        ),
        (
            vec!["--workload", "parallel-rw", "--duration", "0"],
            "--duration",
        ),
    ] {
        let out = simulate(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn flashbench_workloads_print_flashbench_rows_and_ftl_counters() {
    let out = simulate(&[
        "--model",
        "toshiba-mmc32g",
        "--workload",
        "align-write",
        "--bs",
        "1024",
        "--tries",
        "1",
        "--span",
        "64M",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("write align 8192\tpre"), "{text}");
    assert!(text.contains("flash: write amplification"), "{text}");
    let j = json(&simulate(&[
        "--model",
        "sandisk-sem32g",
        "--workload",
        "open-au",
        "--open-au",
        "3",
        "--bs",
        "512",
        "--smallest",
        "512k",
        "--json",
    ]));
    let rows = j["open_au"]["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        4,
        "4 MiB, 2 MiB, 1 MiB, 512 KiB: from erasesize down to --smallest: {j}"
    );
    assert!(rows
        .iter()
        .all(|r| r["bytes_per_sec"].as_f64().unwrap() > 0.0));
    assert!(j["flash"]["write_amplification"].as_f64().unwrap() >= 1.0);
}

#[test]
fn the_ideal_model_has_no_flash_counters_and_rand_write_reports_them_on_flash_models() {
    let ideal = json(&simulate(&[
        "--model",
        "ideal",
        "--workload",
        "rand-write",
        "--count",
        "100",
        "--json",
    ]));
    assert!(ideal["flash"].is_null());
    let flash = json(&simulate(&[
        "--model",
        "toshiba-mmc32g",
        "--workload",
        "rand-write",
        "--count",
        "200",
        "--json",
    ]));
    assert!(flash["flash"]["host_sectors"].as_u64().unwrap() >= 1600);
    // The text names what made the amplification: on Toshiba's buffer-A card, 4 KiB
    // random writes go to the small-write log and are merged later, with no AU
    // collection, so "0 GC" alone would not explain a figure far above 1.
    let out = simulate(&[
        "--model",
        "toshiba-mmc32g",
        "--workload",
        "rand-write",
        "--count",
        "2000",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("flash:")).unwrap();
    assert!(
        line.contains("NAND bytes programmed per host byte")
            && line.contains("2000 small writes into the log (buffer A)")
            && line.contains("log merges into an AU")
            && line.contains("0 AU collections (GC)"),
        "{line}"
    );
}

#[test]
fn driver_workloads_report_packing_and_throughput_as_json() {
    let on = json(&simulate(&[
        "--model",
        "msm-emmc45-sdr50",
        "--workload",
        "lmdd-write",
        "--size",
        "8M",
        "--packing",
        "always",
        "--json",
    ]));
    let off = json(&simulate(&[
        "--model",
        "msm-emmc45-sdr50",
        "--workload",
        "lmdd-write",
        "--size",
        "8M",
        "--json",
    ]));
    assert_eq!(on["write"]["bytes"], 8 << 20);
    assert!(on["driver"]["packed_writes"].as_u64().unwrap() > 0);
    assert_eq!(off["driver"]["packed_writes"], 0);
    assert!(on["write"]["mb_per_s"].as_f64().unwrap() > off["write"]["mb_per_s"].as_f64().unwrap());
    assert!(!on["write_packing"]["packed"].as_array().unwrap().is_empty());
    let rw = json(&simulate(&[
        "--model",
        "msm-emmc45-sdr50",
        "--workload",
        "parallel-rw",
        "--duration",
        "0.5",
        "--scheduler",
        "deadline",
        "--json",
    ]));
    assert!(rw["read"]["mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(rw["write"]["mb_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rw["scheduler"], "deadline");
    let io = json(&simulate(&[
        "--model",
        "sandisk-emmc45",
        "--workload",
        "iozone-write",
        "--size",
        "2M",
        "--json",
    ]));
    assert!(io["iozone_kb_per_s"][0].as_f64().unwrap() > 0.0);
}

#[test]
fn a_threshold_sweep_prints_a_row_per_threshold() {
    let out = simulate(&[
        "--model",
        "msm-emmc45-sdr50",
        "--workload",
        "parallel-rw",
        "--duration",
        "0.3",
        "--sweep",
        "wr-threshold=0..3",
        "--json",
    ]);
    let j = json(&out);
    let rows = j["sweep"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[3]["wr_threshold"], 3);
    let text = simulate(&[
        "--model",
        "msm-emmc45-sdr50",
        "--workload",
        "parallel-rw",
        "--duration",
        "0.2",
        "--sweep",
        "wr-threshold=16..17",
    ]);
    assert!(text.status.success());
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(s.contains("wr-threshold") && s.contains("read MB/s"), "{s}");
}

#[test]
fn bad_driver_arguments_are_refused_with_a_message() {
    for args in [
        vec!["--workload", "parallel-rw", "--sweep", "wr-threshold=5..2"],
        vec!["--workload", "parallel-rw", "--sweep", "threshold=1..2"],
        vec!["--workload", "seq-write", "--sweep", "wr-threshold=1..2"],
        vec!["--workload", "parallel-rw", "--duration", "-1"],
        vec!["--workload", "parallel-rw", "--read-bs", "1000"],
        vec!["--workload", "lmdd-write", "--write-bs", "0"],
        vec!["--workload", "parallel-rw", "--read-depth", "0"],
    ] {
        let out = simulate(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
}

#[test]
fn a_fault_plan_is_applied_and_a_bad_one_stops_with_the_rule_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "seed = 3\n[[rule]]\ncommand = 25\nevery = 2\neffect = { kind = \"data_crc\" }\n",
    )
    .unwrap();
    let args = [
        "--workload",
        "lmdd-write",
        "--size",
        "4M",
        "--fault-plan",
        plan.to_str().unwrap(),
        "--json",
    ];
    let a = json(&simulate(&args));
    assert!(a["faults_injected"].as_u64().unwrap() > 0, "{a}");
    assert!(a["driver"]["retries"].as_u64().unwrap() > 0, "{a}");
    assert_eq!(a["driver"]["failed"], 0, "every fault was retried away");
    assert_eq!(a, json(&simulate(&args)), "the plan replays");

    std::fs::write(
        &plan,
        "[[rule]]\nname = \"typo\"\nprobability = 2.0\neffect = { kind = \"data_crc\" }\n",
    )
    .unwrap();
    for cmd in [
        &["simulate", "--workload", "seq-write"][..],
        &[
            "serve",
            "--socket",
            "/nonexistent/s",
            "--image",
            "/nonexistent/i",
        ][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
            .args(cmd)
            .args(["--fault-plan", plan.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("rule 1 (\"typo\")") && err.contains("`probability` must be in (0, 1]"),
            "{cmd:?}: {err}"
        );
    }
}

#[test]
fn power_cut_workload_reports_zero_violations_and_exits_zero() {
    let out = simulate(&[
        "--workload",
        "power-cut",
        "--cuts",
        "30",
        "--seed",
        "4",
        "--cut-store",
        "mem",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(r["cuts"], 30);
    assert_eq!(r["violations"]["durable_lost"], 0);
    assert_eq!(r["violations"]["torn_reliable"], 0);
    assert_eq!(r["violations"]["outside_written"], 0);
    assert_eq!(r["violations"]["corrupt"], 0);
    assert!(r["operations"].as_u64().unwrap() > 30);
}

#[test]
fn legacy_reliable_is_refused_outside_power_cut() {
    let out = simulate(&["--workload", "seq-write", "--legacy-reliable"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--legacy-reliable"));
}

/// `compare` end to end: the table on stdout, nothing on stderr when stderr is not a
/// terminal (no progress bar in logs), JSON, and a clear refusal of bad arguments.
#[test]
fn compare_prints_one_column_per_run_and_stays_quiet_off_a_terminal() {
    let out = cli(&[
        "compare",
        "--models",
        "generic-emmc45,toshiba-mmc32g",
        "--policy",
        "packing=off,always",
        "--workload",
        "rand-write",
        "--count",
        "64",
        "--qd",
        "8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let heads: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(
        heads,
        [
            "generic-emmc45",
            "generic-emmc45",
            "toshiba-mmc32g",
            "toshiba-mmc32g"
        ]
    );
    let policies: Vec<&str> = text.lines().nth(3).unwrap().split_whitespace().collect();
    assert_eq!(
        policies,
        [
            "packing=off",
            "packing=always",
            "packing=off",
            "packing=always"
        ]
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("packed writes"))
        .unwrap();
    let packed: Vec<u64> = row
        .split_whitespace()
        .skip(2)
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(packed[0], 0);
    assert!(
        packed[3] > 0,
        "eight queued random writes on toshiba get packed: {row}"
    );

    let out = cli(&[
        "compare",
        "--models",
        "ideal",
        "--workload",
        "rand-read",
        "--json",
    ]);
    let j = json(&out);
    assert_eq!(j["runs"][0]["read"]["ops"], 2000);

    let out = cli(&[
        "compare",
        "--models",
        "ideal",
        "--workload",
        "rand-read",
        "--policy",
        "packing=never",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("off, always or controlled"));
}

#[test]
fn fidelity_prints_a_row_per_seed_figure_and_refuses_an_unknown_model() {
    let out = cli(&["fidelity", "--seed", "4", "--json"]);
    let rows = json(&out);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4, "seed 004 has four figures");
    for r in rows {
        assert_eq!(r["seed"], 4);
        assert_eq!(r["model"], "sandisk-emmc45");
        assert!(r["simulated"][0].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            ["ok", "gap"].contains(&r["status"].as_str().unwrap()),
            "{r}"
        );
        let cmd = r["commands"][0].as_str().unwrap();
        assert!(cmd.starts_with("vhost-user-emmc simulate --model sandisk-emmc45 "));
    }
    let md = cli(&["fidelity", "--seed", "4", "--markdown"]);
    assert!(md.status.success());
    let md = String::from_utf8(md.stdout).unwrap();
    assert!(md.contains("| `s004-iozone-write-off` |"), "{md}");
    assert!(md.contains("1. `vhost-user-emmc simulate --model sandisk-emmc45"));
    let bad = cli(&["fidelity", "--model", "no-such-card"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no row matches"));
}
