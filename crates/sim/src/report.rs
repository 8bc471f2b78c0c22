//! What `vhost-user-emmc simulate` prints: throughput, IOPS, latency percentiles for reads
//! and writes, and the card's counters — as text, or as one JSON object.

use serde::Serialize;

use super::workload::RunStats;
use emmc_card::timing::{FlashStats, Nanos};
use emmc_card::CardStats;
use emmc_host::histogram::Histogram;

#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub ops: u64,
    pub bytes: u64,
    pub mb_per_s: f64,
    pub iops: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

fn us(ns: Nanos) -> f64 {
    ns as f64 / 1000.0
}

impl LatencySummary {
    pub fn new(h: &Histogram, bytes: u64, elapsed_ns: Nanos) -> LatencySummary {
        let secs = elapsed_ns.max(1) as f64 / 1e9;
        LatencySummary {
            ops: h.count(),
            bytes,
            mb_per_s: bytes as f64 / 1e6 / secs,
            iops: h.count() as f64 / secs,
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.quantile(0.5)),
            p99_us: us(h.quantile(0.99)),
            p999_us: us(h.quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// The card's counters after the run.
#[derive(Debug, Clone, Serialize)]
pub struct CardCounters {
    pub commands: u64,
    pub sectors_written: u64,
    pub sectors_destaged: u64,
    pub packed_writes: u64,
    pub hpi_interrupts: u64,
    pub flushes: u64,
    pub erases: u64,
    /// Card time spent in BKOPS.
    pub bkops_ms: f64,
    pub bkops_outstanding_ms: f64,
}

impl CardCounters {
    pub fn new(stats: &CardStats, bkops_outstanding_ns: Nanos) -> CardCounters {
        CardCounters {
            commands: stats.commands,
            sectors_written: stats.sectors_written,
            sectors_destaged: stats.sectors_destaged,
            packed_writes: stats.packed_writes,
            hpi_interrupts: stats.hpi_interrupts,
            flushes: stats.flushes,
            erases: stats.erases,
            bkops_ms: stats.bkops_ns as f64 / 1e6,
            bkops_outstanding_ms: bkops_outstanding_ns as f64 / 1e6,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub workload: String,
    pub seed: u64,
    pub queue_depth: usize,
    pub requests: u64,
    pub errors: u64,
    pub card_time_s: f64,
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub card: CardCounters,
    /// The flash translation layer's counters (flash timing models only).
    pub flash: Option<FlashStats>,
}

/// `v` with at most `places` decimals, trailing zeros dropped ("1.5", "20", never "-0").
pub(crate) fn trimmed(v: f64, places: usize) -> String {
    let s = format!("{v:.places$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

/// `%.3g` for magnitudes below 1000 (no exponent form): three significant digits,
/// trailing zeros dropped.
pub(crate) fn sig3(v: f64) -> String {
    let places = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    trimmed(v, places)
}

/// One line of FTL counters for text reports. Write amplification is NAND bytes
/// programmed per host byte; the line names the FTL operations that programmed them, so
/// a figure far above 1 can be traced to its cause (on a buffer-A card, small writes go
/// to a log a page and an index page at a time and are merged into their AU later,
/// without any AU collection).
pub fn flash_line(f: &FlashStats) -> String {
    let c = &f.ftl;
    let causes: Vec<String> = [
        (c.buffer_b_writes, "write units written into their AU"),
        (c.read_modify_writes, "of them read-modify-written"),
        (c.buffer_a_writes, "small writes into the log (buffer A)"),
        (c.log_merges, "log merges into an AU"),
        (c.slc_writes, "SLC-cache writes"),
        (c.temp_page_programs, "temporary-page programs"),
        (c.gc_copied_units, "write units copied by AU collections"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    format!(
        "flash: write amplification {:.2} (NAND bytes programmed per host byte{}{}); {} AU collections (GC), {} AU evictions, {} AUs open at the end, P/E max {} mean {:.2}, {:.1} ms background debt\n",
        f.write_amplification,
        if causes.is_empty() { "" } else { ", from " },
        causes.join(", "),
        c.gc_runs,
        c.au_evictions,
        f.open_aus,
        f.pe_max,
        f.pe_mean,
        f.debt_ns as f64 / 1e6
    )
}

impl Report {
    pub fn new(
        model: &str,
        workload: String,
        seed: u64,
        queue_depth: usize,
        stats: &RunStats,
        card: CardCounters,
        flash: Option<FlashStats>,
    ) -> Report {
        Report {
            model: model.to_string(),
            workload,
            seed,
            queue_depth,
            requests: stats.requests(),
            errors: stats.errors,
            card_time_s: stats.elapsed_ns as f64 / 1e9,
            read: LatencySummary::new(&stats.reads, stats.bytes_read, stats.elapsed_ns),
            write: LatencySummary::new(&stats.writes, stats.bytes_written, stats.elapsed_ns),
            card,
            flash,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report is plain data")
    }

    pub fn to_text(&self) -> String {
        let mut out = format!(
            "model {}  workload {}  seed {}  qd {}\n{} requests ({} errors) in {:.3} s of card time\n",
            self.model, self.workload, self.seed, self.queue_depth, self.requests, self.errors, self.card_time_s
        );
        out.push_str(
            "        ops      MB/s        IOPS   mean µs    p50 µs    p99 µs  p99.9 µs    max µs\n",
        );
        for (name, l) in [("read", &self.read), ("write", &self.write)] {
            if l.ops == 0 {
                continue;
            }
            out.push_str(&format!(
                "{name:<5} {:>6} {:>9.2} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
                l.ops, l.mb_per_s, l.iops, l.mean_us, l.p50_us, l.p99_us, l.p999_us, l.max_us
            ));
        }
        let c = &self.card;
        out.push_str(&format!(
            "card: {} commands, {} sectors written, {} destaged from cache, {} flushes, {} erases, {} HPI, {:.1} ms background work outstanding\n",
            c.commands, c.sectors_written, c.sectors_destaged, c.flushes, c.erases, c.hpi_interrupts, c.bkops_outstanding_ms
        ));
        if let Some(f) = &self.flash {
            out.push_str(&flash_line(f));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_rates_come_from_bytes_and_card_time() {
        let mut stats = RunStats::default();
        for _ in 0..1000 {
            stats.writes.record(1_000_000);
        }
        stats.bytes_written = 1000 * 4096;
        stats.elapsed_ns = 1_000_000_000;
        let r = Report::new(
            "m",
            "w".into(),
            1,
            1,
            &stats,
            CardCounters::new(&CardStats::default(), 0),
            None,
        );
        assert!((r.write.mb_per_s - 4.096).abs() < 1e-9);
        assert!((r.write.iops - 1000.0).abs() < 1e-9);
        assert!((r.write.p50_us - 1000.0).abs() / 1000.0 < 0.02);
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["write"]["ops"], 1000);
        assert_eq!(json["read"]["ops"], 0);
        assert!(r.to_text().contains("write"));
        assert!(
            !r.to_text().contains("\nread "),
            "an empty direction is not printed"
        );
    }
}
