//! The command line on images and models: `image create`, `inspect`, a bad model file,
//! the self-check of 32 GiB cards in a few MiB, and `models --explain`.

use std::process::Command as Process;

fn exe() -> Process {
    Process::new(env!("CARGO_BIN_EXE_vhost-user-emmc"))
}

#[test]
fn cli_image_create_then_inspect_shows_the_image_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cli.img");
    let out = exe()
        .args(["image", "create", "--model", "generic-emmc45"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        meta.len(),
        2 * 4 * 1024 * 1024 + 4 * 1024 * 1024 + 15_269_888 * 512
    );
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 < 1024 * 1024,
        "sparse: {} bytes allocated",
        meta.blocks() * 512
    );
    // A second create is refused.
    let out = exe().args(["image", "create"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    // inspect --image finds the model from the sidecar.
    let out = exe()
        .arg("inspect")
        .arg("--image")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("EMU45A"), "{text}");
    assert!(text.contains("SEC_COUNT [212]"), "{text}");
    assert!(text.contains("15269888"), "{text}");
}

#[test]
fn cli_rejects_a_bad_model_file_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let text = include_str!("../device-models/generic-emmc45.toml")
        .replace("rpmb_size_mult = 32", "rpmb_size_mult = 200");
    std::fs::write(&path, text).unwrap();
    let out = exe()
        .arg("inspect")
        .arg("--model")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rpmb_size_mult"), "{err}");
}

/// Wait for `child` and return its exit status and exact peak resident memory (KiB),
/// from the kernel's rusage for that child.
fn wait_with_peak_rss(child: &std::process::Child) -> (i32, i64) {
    let mut status = 0;
    // SAFETY: all-zero bytes are a valid `rusage` (integers and timevals).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes only into the two out-parameters, which are valid and live;
    // the pid is our own unwaited child.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as libc::pid_t, "wait4 failed");
    (status, usage.ru_maxrss)
}

#[test]
// The child is reaped by wait4 in `wait_with_peak_rss`, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn a_32_gib_card_runs_the_self_check_in_a_few_mib() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("big.toml");
    let text = include_str!("../device-models/generic-emmc45.toml")
        .replace("name = \"generic-emmc45\"", "name = \"big-32g\"")
        .replace("sec_count = 15269888", "sec_count = 67108864");
    std::fs::write(&model_path, text).unwrap();
    let mut child = exe()
        .arg("selfcheck")
        .arg("--model")
        .arg(&model_path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let (status, peak) = wait_with_peak_rss(&child);
    assert_eq!(status, 0, "{stdout}");
    assert!(stdout.contains("67108864 sectors"), "{stdout}");
    assert!(stdout.contains("0 failed"), "{stdout}");
    // The image is 32 GiB; the process must stay far below that (the bound leaves room
    // for a debug build's allocator and binary).
    eprintln!("32 GiB card self-check: peak RSS {peak} KiB");
    assert!(peak < 32 * 1024, "peak RSS {peak} KiB");
}

#[test]
// The child is reaped by wait4 in `wait_with_peak_rss`, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn the_32_gib_flash_models_run_the_self_check_in_a_few_mib() {
    for model in ["toshiba-mmc32g", "sandisk-sem32g"] {
        let mut child = exe()
            .arg("selfcheck")
            .arg("--model")
            .arg(model)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        let (status, peak) = wait_with_peak_rss(&child);
        assert_eq!(status, 0, "{stdout}");
        assert!(stdout.contains("67108864 sectors"), "{stdout}");
        assert!(stdout.contains("0 failed"), "{stdout}");
        eprintln!("{model} self-check: peak RSS {peak} KiB");
        assert!(peak < 32 * 1024, "{model}: peak RSS {peak} KiB");
    }
}

/// `models --explain` lists each knob by table with its value, tag and reason, then the
/// counts per kind and which knobs were fitted to each seed figure.
#[test]
fn models_explain_gives_every_knob_its_provenance_and_inverts_the_fitted_ones() {
    let out = exe()
        .args(["models", "--explain", "toshiba-mmc32g"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "[timing.nand]",
        "read_page_slow_ns = 250000",
        "[fitted s003-toshiba-scatter-slow-page]",
        "[host]",
        // From sdhci-hs52, which the model's host profile extends: the file is named.
        "(device-models/hosts/sdhci-hs52.toml:",
        "summary: ",
        "s003-toshiba-scatter-slow-page ← timing.nand.read_page_slow_ns",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }

    let out = exe()
        .args(["models", "--explain", "msm-emmc45-ddr50", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let knobs = v["knobs"].as_array().unwrap();
    let summary = &v["summary"];
    assert_eq!(summary["knobs"].as_u64().unwrap() as usize, knobs.len());
    let counted: u64 = summary["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(counted as usize, knobs.len());
    let mut fitted = 0;
    for k in knobs {
        let kind = k["kind"].as_str().unwrap();
        assert!(
            ["seed", "fitted", "spec", "linux", "assumed", "derived"].contains(&kind),
            "{k}"
        );
        assert!(!k["reason"].as_str().unwrap().is_empty(), "{k}");
        if kind == "fitted" {
            fitted += 1;
            for row in k["fitted"].as_array().unwrap() {
                let knobs = summary["fitted_figures"][row.as_str().unwrap()]
                    .as_array()
                    .unwrap();
                assert!(knobs.contains(&k["path"]), "{k}");
            }
        }
    }
    assert_eq!(summary["fitted_knobs"], fitted);
    // The DDR model states no knob of its own: the card's come from the SDR model, the
    // bus mode from the DDR host profile.
    let timing = knobs.iter().find(|k| k["path"] == "host.timing").unwrap();
    assert_eq!(timing["file"], "device-models/hosts/msm-sdcc-ddr50.toml");
    assert_eq!(timing["tag"], "seed 000");

    let out = exe()
        .args(["models", "--explain", "no-such-model"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-model"));
    let out = exe().args(["models", "--json"]).output().unwrap();
    assert!(!out.status.success(), "--json needs --explain");
}

#[test]
fn serve_refuses_a_missing_image_naming_it_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("nope.img");
    let socket = dir.path().join("s.sock");
    for transport in ["blk", "sdhci", "mmc"] {
        let out = exe()
            .args(["serve", "--transport", transport, "--socket"])
            .arg(&socket)
            .arg("--image")
            .arg(&image)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{transport}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{}: no such image", image.display()))
                && err.contains("--create")
                && err.contains("image create"),
            "{transport}: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{transport}: {left:?}");
    }
}

#[test]
fn inspect_of_a_missing_image_names_the_image_not_its_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("missing.img");
    let out = exe()
        .arg("inspect")
        .arg("--image")
        .arg(&image)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}: No such file", image.display())),
        "{err}"
    );
    assert!(!err.contains("sidecar"), "{err}");
}

/// A pipe: (reader, writer).
fn pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills both descriptors on success; each is owned exactly once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe(2), not owned elsewhere.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Run the binary with its stdout on a pipe whose reader has already gone, so every
/// write fails with EPIPE (as under `| head` once head has exited).
fn run_into_a_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = pipe();
    drop(reader);
    exe()
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn printing_subcommands_end_quietly_when_their_reader_goes_away() {
    for args in [
        &["inspect"][..],
        &["models"],
        &["models", "--explain", "toshiba-mmc32g"],
        &["simulate", "--workload", "seq-read", "--count", "16"],
        &[
            "simulate",
            "--workload",
            "seq-read",
            "--count",
            "16",
            "--json",
        ],
        &["selfcheck", "--model", "generic-emmc45"],
    ] {
        let out = run_into_a_closed_pipe(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
    }
    // A failing command still fails: the broken pipe does not hide its status.
    let out = run_into_a_closed_pipe(&["inspect", "--model", "no-such-model"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-model"));
    // … nor does a closed stderr (`2>&1 | head`) turn its message into a panic.
    let (reader, writer) = pipe();
    drop(reader);
    let out = exe()
        .args(["inspect", "--model", "no-such-model"])
        .stderr(writer)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a plain failure, not a panic (101)"
    );
}

#[test]
fn the_readme_model_table_lists_every_built_in_model() {
    let out = exe().arg("models").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let models: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("host profiles"))
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(models.len() >= 7, "{models:?}");
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    // The table's first column: every `name` in a row under the "| model |" header.
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| model |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('|').nth(1))
        .collect();
    assert!(!table.is_empty(), "README has no model table");
    for m in &models {
        let cell = format!("`{m}`");
        assert!(
            table.iter().any(|c| c.contains(&cell)),
            "README's model table lacks {m}"
        );
    }
    // and names no model that does not exist
    for c in &table {
        for name in c.split('`').skip(1).step_by(2) {
            assert!(models.contains(&name), "README lists unknown model {name}");
        }
    }
}
