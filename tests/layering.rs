//! The crate graph is the layering (docs/architecture.md): card ← host ← simulator, and
//! card ← host ← frontends, with the binary on top. Each crate's normal dependencies, as
//! `cargo tree` resolves them for that crate alone, must not reach what its layer forbids.
//! A change that makes the card link vhost, or the daemon's serving path link the
//! simulator or a plotting crate, fails here.

use std::collections::BTreeSet;
use std::process::Command;

/// The packages `cargo tree <args>` lists through normal (linked) dependencies.
fn tree(args: &[&str]) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every package `cargo tree -p crate` reaches through normal (linked) dependencies.
fn linked(krate: &str) -> BTreeSet<String> {
    let names = tree(&["-p", krate]);
    assert!(names.contains(krate), "cargo tree -p {krate} lists {krate}");
    names
}

fn check(krate: &str, needs: &[&str], forbidden: &[&str]) {
    let names = linked(krate);
    for n in needs {
        assert!(
            names.contains(*n),
            "{krate} should depend on {n}: {names:?}"
        );
    }
    let bad: Vec<&&str> = forbidden.iter().filter(|f| names.contains(**f)).collect();
    assert!(
        bad.is_empty(),
        "{krate} must not depend on {bad:?} (docs/architecture.md, \"Crates\")"
    );
}

/// Transports and guest memory: only the frontends speak them.
const VIRT: &[&str] = &[
    "vhost",
    "vhost-user-backend",
    "virtio-queue",
    "virtio-bindings",
    "vm-memory",
    "vmm-sys-util",
];
/// What the simulator's reports and the command lines bring.
const PRESENTATION: &[&str] = &["plotters", "indicatif", "ttf-noto-sans", "clap"];

#[test]
fn the_card_is_a_library_without_transports_or_presentation() {
    let mut forbidden = vec!["emmc-host", "emmc-sim", "emmc-frontend", "vhost-user-emmc"];
    forbidden.extend(VIRT);
    forbidden.extend(PRESENTATION);
    check("emmc-card", &["hmac", "sha2", "toml"], &forbidden);
}

#[test]
fn the_host_depends_on_the_card_alone_of_ours() {
    let mut forbidden = vec!["emmc-sim", "emmc-frontend", "vhost-user-emmc"];
    forbidden.extend(VIRT);
    forbidden.extend(PRESENTATION);
    check("emmc-host", &["emmc-card"], &forbidden);
}

#[test]
fn the_simulator_knows_no_frontend() {
    let mut forbidden = vec!["emmc-frontend", "vhost-user-emmc"];
    forbidden.extend(VIRT);
    check(
        "emmc-sim",
        &["emmc-card", "emmc-host", "plotters"],
        &forbidden,
    );
}

#[test]
fn the_frontends_link_no_simulator_plotting_or_terminal_crates() {
    check(
        "emmc-frontend",
        &["emmc-card", "emmc-host", "vhost-user-backend"],
        &[
            "emmc-sim",
            "vhost-user-emmc",
            "plotters",
            "indicatif",
            "ttf-noto-sans",
        ],
    );
}

/// vfio-user (the SDHCI PCI function, issue 14) is a transport like vhost-user: only the
/// frontends speak it, and the layers below never link it.
#[test]
fn only_the_frontends_speak_vfio_user() {
    const VFIO: &[&str] = &["vfio_user", "vfio-bindings"];
    check("emmc-frontend", VFIO, &[]);
    for krate in ["emmc-card", "emmc-host", "emmc-sim"] {
        check(krate, &[], VFIO);
    }
}

/// The shared test rigs are a dev-dependency only: no member of the workspace links them,
/// and they link none of our crates, so what a test checks with them (an RPMB MAC, say)
/// never comes from the code under test.
#[test]
fn the_test_support_crate_is_dev_only_and_independent_of_the_code_it_checks() {
    let dependents = tree(&["--workspace", "-i", "emmc-test-support"]);
    assert_eq!(
        dependents.into_iter().collect::<Vec<_>>(),
        ["emmc-test-support"],
        "a crate links emmc-test-support outside [dev-dependencies]"
    );
    check(
        "emmc-test-support",
        &["hmac", "sha2"],
        &[
            "emmc-card",
            "emmc-host",
            "emmc-sim",
            "emmc-frontend",
            "vhost-user-emmc",
        ],
    );
}

/// `emmc_host::testing` (request builders and rigs for tests) is behind the host crate's
/// `test-support` feature, which only dev-dependencies turn on: the binary never has it.
#[test]
fn the_binary_builds_the_host_without_its_test_support() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p} [{f}]", "-p", "vhost-user-emmc"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let host = text
        .lines()
        .find(|l| l.starts_with("emmc-host "))
        .expect("the binary links emmc-host");
    assert!(host.contains("clap"), "features are listed: {host}");
    assert!(!host.contains("test-support"), "{host}");
}
