//! `serve --trace FILE`: the trace file both transports write, in the format of
//! docs/trace-format.md ([`emmc_host::trace::TraceWriter`]), and how a failing file is
//! handled (logged once, tracing stops, the daemon serves on).

use std::io::BufWriter;
use std::path::Path;

use emmc_card::timing::Nanos;
use emmc_host::trace::TraceWriter;

use crate::pacing::Clock;

/// Where `serve --trace` writes.
pub type TraceSink = TraceWriter<BufWriter<std::fs::File>>;

/// Bytes buffered before a write reaches the file: one system call per ~1500 lines, and
/// a buffer that stays in the cache (with 1 MiB the mmc transport lost 11-18% of its
/// request rate to tracing, with 64 KiB 4-6%).
const BUFFER: usize = 1 << 16;

/// Create the trace file at `path`, times counted from card time `origin`.
pub fn open(path: &Path, origin: Nanos, heading: &str) -> Result<TraceSink, String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    TraceWriter::new(BufWriter::with_capacity(BUFFER, file), origin, heading)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The comment that places a trace's card time on `CLOCK_MONOTONIC` when a paced
/// session's clock starts (docs/trace-format.md), `card0` being the clock's start as the
/// trace counts time.
pub fn clock_comment(card0: Nanos, clock: &Clock) -> String {
    format!(
        "clock: card time {card0} ns is CLOCK_MONOTONIC {} ns, scale {}",
        clock.wall0_monotonic_ns(),
        clock.scale
    )
}

/// Stop tracing after a write error, saying so once.
pub fn stop_on_error(trace: &mut Option<impl Sized>, result: std::io::Result<()>) {
    if let Err(e) = result {
        log::error!("trace: {e}; tracing stops");
        *trace = None;
    }
}

/// The clock lines of a trace as (card time, `CLOCK_MONOTONIC`) pairs, each checked for
/// the format docs/trace-format.md gives, with scale 1 (tests of both transports).
#[cfg(test)]
pub(crate) fn clock_anchors(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# clock: card time "))
        .map(|rest| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(
                f.get(1..8),
                Some(&["ns", "is", "CLOCK_MONOTONIC", f[4], "ns,", "scale", "1"][..]),
                "{rest}"
            );
            (f[0].parse().unwrap(), f[4].parse().unwrap())
        })
        .collect()
}
