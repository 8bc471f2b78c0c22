//! Raw request round trips through the vhost-user socket: requests per second and
//! latency percentiles of CMD13, a 512-byte CMD17 read and a 4 KiB CMD23 + CMD18 read,
//! one at a time (each waits for the previous) and with several in flight.
//!
//! ```text
//! cargo build --release -p vhost-user-emmc
//! cargo run --release -p virtio-mmc-driver --bin virtio-mmc-bench -- [--seconds 2] [--depth 16] [--socket PATH] [--model ideal]
//! ```
//!
//! Without `--socket` it starts `vhost-user-emmc serve --transport mmc --timing off` on a
//! fresh image of `--model` (default `ideal`) and stops it at the end. VIRTIO_RING_F_EVENT_IDX
//! is negotiated unless `--no-event-idx`; `--always-kick` kicks on every chain even where
//! the device's avail event says it need not (to tell a notification problem from others).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use emmc_frontend::mmc::proto::*;
use emmc_host::mmc::mmc_init_card;
use virtio_mmc_driver::daemon::Daemon;
use virtio_mmc_driver::{Desc, VhostUserOptions, VhostUserTransport, VirtioMmcHost};
use vm_memory::ByteValued;

const HDR_LEN: u32 = std::mem::size_of::<VirtioMmcReqHdr>() as u32;
const RESP_LEN: u32 = std::mem::size_of::<VirtioMmcResp>() as u32;
/// Each request in flight has its own slot: header, response, 4 KiB of data.
const SLOT: usize = 8192;

/// Raw virtio-mmc request round trips through a vhost-user-emmc daemon.
#[derive(Debug, Parser)]
#[command(name = "virtio-mmc-bench")]
struct Args {
    /// Run time of each row, in seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Requests in flight in the second row of each request kind (1..=64).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=64))]
    depth: u16,
    /// Attach to this daemon instead of starting one.
    #[arg(long)]
    socket: Option<String>,
    /// Device model of the daemon this benchmark starts.
    #[arg(long, default_value = "ideal")]
    model: String,
    /// Do not negotiate VIRTIO_RING_F_EVENT_IDX.
    #[arg(long)]
    no_event_idx: bool,
    /// Kick on every chain, even where the device's avail event says it need not.
    #[arg(long)]
    always_kick: bool,
}

fn parse() -> Result<Args, String> {
    let a = Args::parse();
    if !a.seconds.is_finite() || a.seconds <= 0.0 {
        return Err("--seconds must be positive".into());
    }
    Ok(a)
}

/// One kind of request, laid out in a slot.
#[derive(Clone, Copy)]
enum Kind {
    Cmd13,
    Cmd17,
    Read4k,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cmd13 => "CMD13",
            Kind::Cmd17 => "CMD17 512 B",
            Kind::Read4k => "CMD23+CMD18 4 KiB",
        }
    }

    fn header(self) -> VirtioMmcReqHdr {
        let cmd = |opcode, arg| VirtioMmcCmd {
            opcode,
            resp_type: RESP_R1,
            arg,
            ..Default::default()
        };
        match self {
            Kind::Cmd13 => VirtioMmcReqHdr {
                cmd: cmd(13, 1 << 16),
                ..Default::default()
            },
            Kind::Cmd17 => VirtioMmcReqHdr {
                flags: REQ_F_DATA,
                cmd: cmd(17, 0),
                blksz: 512,
                blocks: 1,
                ..Default::default()
            },
            Kind::Read4k => VirtioMmcReqHdr {
                flags: REQ_F_SBC | REQ_F_DATA,
                sbc: cmd(23, 8),
                cmd: cmd(18, 0),
                blksz: 512,
                blocks: 8,
                ..Default::default()
            },
        }
    }

    fn chain(self, slot: usize) -> Vec<Desc> {
        let base = slot * SLOT;
        let mut c = vec![Desc::readable(base, HDR_LEN)];
        match self {
            Kind::Cmd13 => {}
            Kind::Cmd17 => c.push(Desc::writable(base + 4096, 512)),
            Kind::Read4k => c.push(Desc::writable(base + 4096, 4096)),
        }
        c.push(Desc::writable(base + 256, RESP_LEN));
        c
    }
}

struct Result_ {
    requests: u64,
    elapsed: Duration,
    lat_ns: Vec<u64>,
}

fn check_resp(t: &VhostUserTransport, slot: usize) -> Result<(), String> {
    use virtio_mmc_driver::Transport;
    let off = slot * SLOT + 256;
    let mut r = VirtioMmcResp::default();
    r.as_mut_slice()
        .copy_from_slice(&t.mem_ref()[off..off + RESP_LEN as usize]);
    if r.status != STATUS_OK || r.cmd.error != ERR_NONE || r.data_error != ERR_NONE {
        return Err(format!("request failed: {r:?}"));
    }
    Ok(())
}

fn run(
    t: &mut VhostUserTransport,
    kind: Kind,
    depth: usize,
    dur: Duration,
) -> Result<Result_, String> {
    use virtio_mmc_driver::Transport;
    let hdr = kind.header();
    for s in 0..depth {
        let off = s * SLOT;
        t.mem()[off..off + HDR_LEN as usize].copy_from_slice(hdr.as_slice());
    }
    let mut inflight: HashMap<u16, (usize, Instant)> = HashMap::new();
    let mut lat = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    for s in 0..depth {
        let id = t
            .submit(REQUEST_QUEUE, &kind.chain(s))
            .map_err(|e| e.to_string())?;
        inflight.insert(id, (s, Instant::now()));
    }
    let mut n = 0u64;
    loop {
        let (id, _) = t.wait(REQUEST_QUEUE).map_err(|e| e.to_string())?;
        let (slot, at) = inflight
            .remove(&id)
            .ok_or(format!("completion of unknown chain {id}"))?;
        lat.push(at.elapsed().as_nanos() as u64);
        check_resp(t, slot)?;
        n += 1;
        if start.elapsed() < dur {
            let id = t
                .submit(REQUEST_QUEUE, &kind.chain(slot))
                .map_err(|e| e.to_string())?;
            inflight.insert(id, (slot, Instant::now()));
        } else if inflight.is_empty() {
            break;
        }
    }
    Ok(Result_ {
        requests: n,
        elapsed: start.elapsed(),
        lat_ns: lat,
    })
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtio-mmc-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<(), String> {
    let args = parse()?;
    let daemon = match &args.socket {
        Some(_) => None,
        None => Some(Daemon::spawn(&args.model, &[])?),
    };
    let path = args
        .socket
        .clone()
        .unwrap_or_else(|| daemon.as_ref().expect("spawned").socket_str().to_string());
    let t = VhostUserTransport::connect_with(
        &path,
        VhostUserOptions {
            // Spin for completions rather than sleep: round trips are microseconds.
            spin: Duration::from_millis(10),
            event_idx: !args.no_event_idx,
            always_kick: args.always_kick,
            ..VhostUserOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let mut h = VirtioMmcHost::new(t).map_err(|e| e.to_string())?;
    let caps = h.host_caps();
    mmc_init_card(&mut h, &caps).map_err(|e| format!("bring-up: {e}"))?;
    let mut t = h.into_transport();
    let dur = Duration::from_secs_f64(args.seconds);
    println!(
        "virtio-mmc raw round trips, {} s each, model {}, EVENT_IDX {}{}",
        args.seconds,
        args.model,
        if args.no_event_idx { "off" } else { "on" },
        if args.socket.is_some() {
            " (external daemon)"
        } else {
            ", --timing off"
        }
    );
    println!(
        "{:<20} {:>5} {:>10} {:>12} {:>9} {:>9} {:>9}",
        "request", "depth", "requests", "requests/s", "p50 µs", "p99 µs", "max µs"
    );
    for kind in [Kind::Cmd13, Kind::Cmd17, Kind::Read4k] {
        for depth in [1, usize::from(args.depth)] {
            let mut r = run(&mut t, kind, depth, dur)?;
            r.lat_ns.sort_unstable();
            println!(
                "{:<20} {:>5} {:>10} {:>12.0} {:>9.1} {:>9.1} {:>9.1}",
                kind.name(),
                depth,
                r.requests,
                r.requests as f64 / r.elapsed.as_secs_f64(),
                pct(&r.lat_ns, 0.5),
                pct(&r.lat_ns, 0.99),
                pct(&r.lat_ns, 1.0),
            );
            if depth == usize::from(args.depth) {
                break;
            }
        }
    }
    drop(daemon);
    Ok(())
}
