//! Image persistence across reopen, image/model checks, and the command line.

mod common;

use std::path::Path;
use std::process::Command as Process;

use common::{ext, pattern, Host};
use vhost_user_emmc::card::{r1, Card, Partition, PowerDown};
use vhost_user_emmc::model::DeviceModel;
use vhost_user_emmc::store::ImageStore;

fn open(model: &DeviceModel, path: &Path, create: bool) -> Host {
    let layout = Card::layout_for(model);
    let store = if create {
        ImageStore::create(path, layout, &model.name).unwrap()
    } else {
        ImageStore::open(path, layout, &model.name).unwrap()
    };
    Host {
        card: Card::new(model.clone(), Box::new(store)).unwrap(),
        now: 0,
    }
}

#[test]
fn data_and_persistent_state_survive_reopening_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let model = common::model();
    let user = pattern(1, 16);
    let boot = pattern(2, 4);
    let gp = pattern(3, 2);
    {
        let mut h = open(&model, &path, true);
        h.init();
        h.write(12345, &user, 0);
        h.switch_ok(ext::FLUSH_CACHE, 1);
        h.select_partition(Partition::Boot1);
        h.write(0, &boot, 1 << 31);
        h.select_partition(Partition::User);
        h.switch_ok(ext::PARTITION_CONFIG, 0x08); // boot from boot1
        h.switch_ok(ext::BOOT_WP, 0x80 | 0x08 | 0x04); // boot2 permanently protected
        h.r1b(28, 4096); // temporary WP of the group at 4096
        h.switch_ok(ext::GP_SIZE_MULT, 1);
        h.switch_ok(ext::PARTITION_SETTING_COMPLETED, 1);
        let written = pattern(4, 1);
        h.write(9, &written, 0); // cached and never flushed: the daemon is killed
                                 // A killed daemon: no clean shutdown, the card object just disappears.
    }
    {
        let mut h = open(&model, &path, false);
        h.init();
        assert_eq!(
            h.card.partition_sectors(Partition::Gp(0)),
            1024,
            "partitioning took effect at power-on"
        );
        assert_data_eq!(h.read(12345, 16), user, "flushed user data");
        assert!(
            h.read(9, 1).iter().all(|&b| b == 0),
            "unflushed cached data is gone"
        );
        let e = h.ext_csd();
        assert_eq!(
            e[ext::PARTITION_CONFIG as usize],
            0x08,
            "boot enable kept, access reset"
        );
        assert_eq!(
            e[ext::BOOT_WP_STATUS],
            0b1000,
            "boot2 permanent protection kept"
        );
        assert_eq!(e[163], 1, "BKOPS_EN kept");
        assert_ne!(
            h.write(4096, &pattern(5, 1), 0) & r1::WP_VIOLATION,
            0,
            "temporary WP kept"
        );
        h.select_partition(Partition::Boot1);
        assert_data_eq!(h.read(0, 4), boot, "reliable boot write");
        h.select_partition(Partition::Gp(0));
        assert_eq!(h.write(1022, &gp, 0) & r1::ERRORS, 0);
        h.card.power_off(h.now, PowerDown::Clean);
    }
    let mut h = open(&model, &path, false);
    h.init();
    h.select_partition(Partition::Gp(0));
    assert_data_eq!(h.read(1022, 2), gp, "clean shutdown flushed the cache");
}

#[test]
fn opening_an_image_with_another_model_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("card.img");
    let model = common::model();
    ImageStore::create(&path, Card::layout_for(&model), &model.name).unwrap();
    let mut other = model.clone();
    other.ext_csd.sec_count *= 2;
    let err = ImageStore::open(&path, Card::layout_for(&other), &model.name).unwrap_err();
    assert!(err.to_string().contains("user area"), "{err}");
    let err = ImageStore::open(&path, Card::layout_for(&model), "toshiba-mmc32g").unwrap_err();
    assert!(err.to_string().contains("toshiba-mmc32g"), "{err}");
}

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
