//! The control socket (`serve --control PATH`): change faults, cut power and read
//! statistics while the daemon serves a guest (docs/faults.md, "Control while running").
//!
//! A Unix stream socket, created owner-only. Each request is one JSON object on one
//! line; each answer is one JSON object on one line, `{"ok": true, ...}` or
//! `{"ok": false, "error": "..."}`. Connections are served one at a time, requests in
//! order; a connection may send any number of requests. Requests act on the SDHCI host
//! and card between two guest requests (they take the backend's lock).
//!
//! | request | answer |
//! |---|---|
//! | `{"cmd": "stats"}` | counters of the card, the transport and its pacing; request latencies |
//! | `{"cmd": "faults"}` | the rules, how often each fired, the last injections |
//! | `{"cmd": "add_fault", "rule": {...}}` | `index` of the new rule (the `[[rule]]` schema of a fault plan, as JSON) |
//! | `{"cmd": "clear_faults"}` | — |
//! | `{"cmd": "power_cut", "restore": true}` | `at_ns`: a sudden power loss now; power returns unless `restore` is false |

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use emmc_card::timing::Nanos;
use emmc_card::Card;
use emmc_host::fault::{FaultInjector, FaultPlan, Rule};
use emmc_host::histogram::Histogram;
use emmc_host::mmc::{MmcHost, MmcHostOps};
use emmc_host::sdhci::SdhciMmio;

/// Longest request line accepted: a rule is a few hundred bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Injections listed by `faults`, newest last.
const HISTORY_SHOWN: usize = 32;

/// The controller and card a request acts on: the request-level host (blk, mmc) or the
/// register-level controller (sdhci).
pub trait ControlHost {
    /// Card time now.
    fn now(&self) -> Nanos;
    fn card_mut(&mut self) -> &mut Card;
    fn fault_injector(&self) -> Option<&FaultInjector>;
    fn fault_injector_mut(&mut self) -> Option<&mut FaultInjector>;
    fn set_fault_injector(&mut self, faults: Option<FaultInjector>);
}

impl ControlHost for MmcHost {
    fn now(&self) -> Nanos {
        MmcHostOps::now(self)
    }
    fn card_mut(&mut self) -> &mut Card {
        &mut self.card
    }
    fn fault_injector(&self) -> Option<&FaultInjector> {
        self.sdhci.fault_injector()
    }
    fn fault_injector_mut(&mut self) -> Option<&mut FaultInjector> {
        self.sdhci.fault_injector_mut()
    }
    fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        self.sdhci.set_fault_injector(faults)
    }
}

impl ControlHost for SdhciMmio {
    fn now(&self) -> Nanos {
        SdhciMmio::now(self)
    }
    fn card_mut(&mut self) -> &mut Card {
        SdhciMmio::card_mut(self)
    }
    fn fault_injector(&self) -> Option<&FaultInjector> {
        SdhciMmio::fault_injector(self)
    }
    fn fault_injector_mut(&mut self) -> Option<&mut FaultInjector> {
        SdhciMmio::fault_injector_mut(self)
    }
    fn set_fault_injector(&mut self, faults: Option<FaultInjector>) {
        SdhciMmio::set_fault_injector(self, faults)
    }
}

/// What a transport offers the control socket.
pub trait Controlled: Send + Sync + 'static {
    /// Run `f` on the controller and its card, between two guest requests (or register
    /// accesses), at the current card time.
    fn with_host(&self, f: &mut dyn FnMut(&mut dyn ControlHost));
    /// The transport's own statistics (pacing, driver, latencies).
    fn transport_stats(&self) -> Value;
}

/// One request on the control socket.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlRequest {
    // Empty struct variants, not unit ones: serde then refuses unknown keys for them too.
    Stats {},
    Faults {},
    AddFault { rule: Box<Rule> },
    ClearFaults {},
    PowerCut { restore: Option<bool> },
}

/// The pacing statistics of a transport.
pub fn pacing_json(p: &crate::pacing::PacingStats) -> Value {
    json!({
        "completed": p.completed,
        "lateness": latency_json(&p.late),
        "signalled_after_due": latency_json(&p.signalled),
        "timer_wake_late": latency_json(&p.wake_late),
        "spin_margin_us": p.margin.as_secs_f64() * 1e6,
    })
}

/// Percentiles of a latency histogram, in microseconds.
pub fn latency_json(h: &Histogram) -> Value {
    let us = |ns: u64| (ns as f64 / 1e3 * 10.0).round() / 10.0;
    json!({
        "count": h.count(),
        "p50_us": us(h.quantile(0.5)),
        "p99_us": us(h.quantile(0.99)),
        "p999_us": us(h.quantile(0.999)),
        "max_us": us(h.max()),
    })
}

fn faults_json(f: Option<&FaultInjector>) -> Value {
    let Some(f) = f else {
        return json!({ "rules": [], "commands": 0, "injections": [] });
    };
    let rules: Vec<Value> = f
        .rules()
        .enumerate()
        .map(|(i, r)| json!({ "index": i, "fired": f.fired(i), "rule": r }))
        .collect();
    let history = f.history();
    let shown = &history[history.len().saturating_sub(HISTORY_SHOWN)..];
    let injections: Vec<Value> = shown
        .iter()
        .map(|i| {
            json!({
                "command_number": i.command_number,
                "opcode": i.opcode,
                "rule": i.rule,
                "at_ns": i.at_ns,
            })
        })
        .collect();
    json!({
        "seed": f.seed(),
        "rules": rules,
        "commands": f.commands(),
        "bytes_written": f.bytes_written(),
        "injections_total": f.injected(),
        "injections": injections,
    })
}

/// Carry out one request line; the answer line (without its newline).
pub fn handle_line<C: Controlled + ?Sized>(target: &C, line: &str) -> String {
    let reply = match serde_json::from_str::<ControlRequest>(line) {
        Ok(req) => execute(target, req),
        Err(e) => Err(format!("bad request: {e}")),
    };
    let value = match reply {
        Ok(Value::Object(mut m)) => {
            m.insert("ok".into(), Value::Bool(true));
            Value::Object(m)
        }
        Ok(other) => json!({ "ok": true, "value": other }),
        Err(e) => json!({ "ok": false, "error": e }),
    };
    value.to_string()
}

fn execute<C: Controlled + ?Sized>(target: &C, req: ControlRequest) -> Result<Value, String> {
    let mut out: Result<Value, String> = Ok(json!({}));
    match req {
        ControlRequest::Stats {} => {
            let mut card = Value::Null;
            let mut faults = Value::Null;
            target.with_host(&mut |h| {
                card = json!({
                    "now_ns": h.now(),
                    "counters": h.card_mut().stats(),
                });
                faults = faults_json(h.fault_injector());
            });
            out = Ok(json!({
                "card": card,
                "faults": faults,
                "transport": target.transport_stats(),
            }));
        }
        ControlRequest::Faults {} => {
            target.with_host(&mut |h| out = Ok(faults_json(h.fault_injector())));
        }
        ControlRequest::AddFault { rule } => {
            target.with_host(&mut |h| {
                if h.fault_injector().is_none() {
                    match FaultInjector::new(FaultPlan::default()) {
                        Ok(f) => h.set_fault_injector(Some(f)),
                        Err(e) => {
                            out = Err(e.to_string());
                            return;
                        }
                    }
                }
                if let Some(f) = h.fault_injector_mut() {
                    out = f
                        .add_rule((*rule).clone())
                        .map(|index| json!({ "index": index }))
                        .map_err(|e| e.to_string());
                }
            });
            if let Ok(v) = &out {
                log::info!("control: fault rule {} added", v["index"]);
            }
        }
        ControlRequest::ClearFaults {} => {
            target.with_host(&mut |h| {
                if let Some(f) = h.fault_injector_mut() {
                    f.clear();
                }
            });
            log::info!("control: fault rules cleared");
        }
        ControlRequest::PowerCut { restore } => {
            let restore = restore.unwrap_or(true);
            target.with_host(&mut |h| {
                let at = h.now();
                h.card_mut().sudden_power_loss(at, restore);
                out = Ok(json!({ "at_ns": at, "restored": restore }));
            });
            log::warn!("control: sudden power loss (power restored: {restore})");
        }
    }
    out
}

/// Serve one connection: request lines in, answer lines out, until it closes.
fn serve_connection<C: Controlled + ?Sized>(target: &C, stream: UnixStream) {
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut out = std::io::BufWriter::new(write_half);
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        match reader
            .by_ref()
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let answer = if line.len() > MAX_LINE && !line.ends_with(b"\n") {
            log::warn!("control: a request line over {MAX_LINE} bytes; closing");
            let _ = writeln!(
                out,
                "{}",
                json!({ "ok": false, "error": format!("request longer than {MAX_LINE} bytes") })
            );
            let _ = out.flush();
            return;
        } else {
            match std::str::from_utf8(&line) {
                Ok(text) if text.trim().is_empty() => continue,
                Ok(text) => handle_line(target, text.trim()),
                Err(_) => json!({ "ok": false, "error": "request is not UTF-8" }).to_string(),
            }
        };
        if writeln!(out, "{answer}").and_then(|_| out.flush()).is_err() {
            return;
        }
    }
}

/// The control socket: bound owner-only, served on its own thread for the daemon's life.
pub struct ControlSocket {
    path: PathBuf,
}

impl ControlSocket {
    /// Bind `path` (mode 0600 from the start) and serve it on a thread.
    pub fn spawn<C: Controlled>(path: &Path, target: Arc<C>) -> Result<ControlSocket, String> {
        if path.exists() {
            return Err(format!(
                "{}: already exists (a daemon running, or a stale socket to remove)",
                path.display()
            ));
        }
        // SAFETY: umask only changes this process's file-creation mask, restored at once;
        // this runs before the daemon's worker threads create any file.
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    match stream {
                        Ok(s) => serve_connection(&*target, s),
                        Err(e) => log::warn!("control socket: {e}"),
                    }
                }
            })
            .map_err(|e| format!("control thread: {e}"))?;
        log::info!("control socket on {}", path.display());
        Ok(ControlSocket {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `vhost-user-emmc control`: send one request and print the answer.
#[derive(Debug, Clone, clap::Args)]
pub struct ControlArgs {
    /// The daemon's control socket (`serve --control PATH`).
    #[arg(long)]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub request: ControlCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ControlCommand {
    /// Counters of the card and the transport, request latencies, faults.
    Stats,
    /// The fault rules, how often each fired, the last injections.
    Faults,
    /// Add a fault rule, written as one `[[rule]]` of a fault plan (TOML), e.g.
    /// 'command = 25
    /// every = 10
    /// effect = { kind = "data_crc" }'.
    AddFault {
        /// The rule's TOML (the keys of a `[[rule]]` table).
        rule: String,
    },
    /// Remove every fault rule.
    ClearFaults,
    /// Cut the card's power now (sudden power loss).
    PowerCut {
        /// Leave the power off (the card stops answering).
        #[arg(long)]
        no_restore: bool,
    },
    /// Send a raw JSON request line.
    Raw { json: String },
}

fn request_line(cmd: &ControlCommand) -> Result<String, String> {
    Ok(match cmd {
        ControlCommand::Stats => json!({ "cmd": "stats" }).to_string(),
        ControlCommand::Faults => json!({ "cmd": "faults" }).to_string(),
        ControlCommand::ClearFaults => json!({ "cmd": "clear_faults" }).to_string(),
        ControlCommand::PowerCut { no_restore } => {
            json!({ "cmd": "power_cut", "restore": !no_restore }).to_string()
        }
        ControlCommand::AddFault { rule } => {
            let rule: Rule =
                toml::from_str(rule).map_err(|e| format!("the rule is not a valid rule: {e}"))?;
            rule.validate()
                .map_err(|e| format!("the rule is not valid: {e}"))?;
            json!({ "cmd": "add_fault", "rule": rule }).to_string()
        }
        ControlCommand::Raw { json } => json.clone(),
    })
}

/// Send the request, print the answer pretty; an `ok: false` answer is an error.
pub fn control(args: &ControlArgs) -> Result<(), String> {
    let line = request_line(&args.request)?;
    let mut stream =
        UnixStream::connect(&args.socket).map_err(|e| format!("{}: {e}", args.socket.display()))?;
    writeln!(stream, "{line}").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    let value: Value = serde_json::from_str(&answer)
        .map_err(|e| format!("the daemon answered {answer:?}: {e}"))?;
    let text = serde_json::to_string_pretty(&value).unwrap_or(answer.clone());
    // A reader that went away (`| head`) is not an error of the request.
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(format!("writing to stdout: {e}"))
        }
        _ => {}
    }
    if value["ok"] == Value::Bool(true) {
        Ok(())
    } else {
        Err(value["error"]
            .as_str()
            .unwrap_or("request failed")
            .to_string())
    }
}
