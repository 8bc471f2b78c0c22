//! Starting the daemon for tests and the benchmark: `vhost-user-emmc serve --transport mmc`
//! on a socket and a card image in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `vhost-user-emmc` binary: `$VHOST_USER_EMMC_BIN`, else the workspace's
/// `target/{release,debug}/vhost-user-emmc` (the one of this build's profile first).
/// `cargo test --workspace` builds it; alone, run `cargo build -p vhost-user-emmc` first.
pub fn daemon_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VHOST_USER_EMMC_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let profiles: [&str; 2] = if cfg!(debug_assertions) {
        ["debug", "release"]
    } else {
        ["release", "debug"]
    };
    profiles
        .iter()
        .map(|p| target.join(p).join("vhost-user-emmc"))
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!(
                "no vhost-user-emmc binary under {}: run `cargo build -p vhost-user-emmc` or set VHOST_USER_EMMC_BIN",
                target.display()
            )
        })
}

/// A daemon serving one card over virtio-mmc; killed and reaped on drop.
pub struct Daemon {
    child: Child,
    pub socket: PathBuf,
    pub image: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// `serve --transport mmc --timing off` (unless `extra` names a `--timing`) for a fresh
    /// image of `model`, plus `extra` arguments; returns once the socket exists.
    pub fn spawn(model: &str, extra: &[&str]) -> Result<Daemon, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let socket = dir.path().join("mmc.sock");
        let image = dir.path().join("card.img");
        let bin = daemon_binary()?;
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .args(["--create", "--transport", "mmc", "--model", model]);
        if !extra.contains(&"--timing") {
            cmd.args(["--timing", "off"]);
        }
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--image")
            .arg(&image)
            .args(extra)
            .stdin(Stdio::null());
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", bin.display()))?;
        let start = Instant::now();
        while !socket.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!("the daemon exited before serving: {st}"));
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the daemon did not create its socket in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Daemon {
            child,
            socket,
            image,
            _dir: dir,
        })
    }

    pub fn socket_str(&self) -> &str {
        self.socket.to_str().expect("temporary paths are UTF-8")
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kill the daemon now (e.g. to test a vanished device).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}
