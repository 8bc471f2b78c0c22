//! The command line on images and models: `image create`, `inspect`, a bad model file,
//! and the self-check of 32 GiB cards in a few MiB.

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
