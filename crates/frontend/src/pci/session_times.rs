//! Where one session's time went, as the daemon sees it, logged when the client leaves
//! (`pci session: ...`). Under TCG every register access is a round trip through QEMU's
//! vfio-user client; when the guest's figures are poor, this line says whether the time
//! was the daemon's (handling an access, spinning out an event) or the other side's (the
//! client's round trip between two accesses, the guest's answer to an interrupt).

use std::fmt;
use std::time::{Duration, Instant};

use emmc_host::histogram::Histogram;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The message thread's side: register accesses and interrupts, under the function's lock.
#[derive(Debug, Default)]
pub(crate) struct AccessTimes {
    /// From a BAR access's arrival in the backend to its return (the lock, the model).
    handling: Histogram,
    /// From the end of one BAR access to the start of the next read: the client's part
    /// of a read's round trip (a vCPU waits on each read; QEMU may post writes), the
    /// guest's own work between the two, and the message thread's wake-up.
    before_read: Histogram,
    /// From an INTx signal to the next BAR access: how soon the guest's handler reads
    /// the controller after the daemon raised the line.
    irq_to_access: Histogram,
    last_end: Option<Instant>,
    pending_signal: Option<Instant>,
}

impl AccessTimes {
    /// A BAR access (a read if `read`) that arrived at `start` has been handled; it
    /// ends now.
    pub(crate) fn access(&mut self, start: Instant, read: bool) {
        let end = Instant::now();
        self.handling
            .record(nanos(end.saturating_duration_since(start)));
        if let (Some(last), true) = (self.last_end, read) {
            self.before_read
                .record(nanos(start.saturating_duration_since(last)));
        }
        if let Some(signal) = self.pending_signal.take() {
            self.irq_to_access
                .record(nanos(start.saturating_duration_since(signal)));
        }
        self.last_end = Some(end);
    }

    /// The INTx trigger was written (the first signal before an access counts).
    pub(crate) fn signalled(&mut self) {
        self.pending_signal.get_or_insert_with(Instant::now);
    }
}

/// The timer thread's side: its wake-ups and what it spun.
#[derive(Debug, Default)]
pub(crate) struct TimerTimes {
    /// How late the timerfd woke the thread, after the instant it was armed for.
    pub(crate) late: Histogram,
    /// Time spent spinning from the wake-up to the event's instant.
    pub(crate) spun: Duration,
    /// The spin margin when the session ended.
    pub(crate) margin: Duration,
}

impl TimerTimes {
    pub(crate) fn woke(&mut self, late: Duration) {
        self.late.record(nanos(late));
    }

    /// Add what the timer thread measured since its last pass under the lock, and
    /// start `local` afresh.
    pub(crate) fn take_from(&mut self, local: &mut TimerTimes) {
        if local.late.count() > 0 {
            self.late.merge(&std::mem::take(&mut local.late));
        }
        self.spun += std::mem::take(&mut local.spun);
        self.margin = local.margin;
    }
}

/// One session's summary line.
pub(crate) struct SessionSummary<'a> {
    pub(crate) wall: Duration,
    pub(crate) accesses: &'a AccessTimes,
    pub(crate) timer: &'a TimerTimes,
    pub(crate) intx_signals: u64,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl fmt::Display for SessionSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.accesses;
        let wall = self.wall.as_secs_f64();
        let count = a.handling.count();
        let busy_ns = a.handling.mean() * count as f64;
        write!(
            f,
            "{wall:.1} s, {count} BAR accesses ({:.0}/s); handling p50/p99 {:.1}/{:.1} µs \
             ({:.1}% of the session); from an access to the next read p50/p99 {:.1}/{:.1} µs; \
             {} INTx signals, to the next access p50/p99 {:.1}/{:.1} µs",
            if wall > 0.0 { count as f64 / wall } else { 0.0 },
            us(a.handling.quantile(0.5)),
            us(a.handling.quantile(0.99)),
            if wall > 0.0 {
                busy_ns / 1e9 / wall * 100.0
            } else {
                0.0
            },
            us(a.before_read.quantile(0.5)),
            us(a.before_read.quantile(0.99)),
            self.intx_signals,
            us(a.irq_to_access.quantile(0.5)),
            us(a.irq_to_access.quantile(0.99)),
        )?;
        let t = self.timer;
        write!(
            f,
            "; timer: {} wake-ups, late p50/p99 {:.1}/{:.1} µs, spun {:.3} s ({:.1}%), \
             margin {} µs",
            t.late.count(),
            us(t.late.quantile(0.5)),
            us(t.late.quantile(0.99)),
            t.spun.as_secs_f64(),
            if wall > 0.0 {
                t.spun.as_secs_f64() / wall * 100.0
            } else {
                0.0
            },
            t.margin.as_micros(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_measure_the_gap_between_them_and_from_a_signal_to_the_next_one() {
        let mut a = AccessTimes::default();
        let first = Instant::now();
        a.access(first, false);
        // A signal, then an access that starts 2 ms after the first ended.
        a.signalled();
        let signal = a.pending_signal.expect("a signal is pending");
        a.signalled(); // a second signal before the access does not move the first
        assert_eq!(a.pending_signal, Some(signal));
        let start = a.last_end.unwrap() + Duration::from_millis(2);
        a.access(start, true);
        assert_eq!(a.handling.count(), 2);
        assert_eq!(a.before_read.count(), 1);
        // Within the histogram's 1/64 bucket error.
        let gap = a.before_read.quantile(0.5);
        assert!((1_960_000..=2_000_000).contains(&gap), "{gap} ns");
        assert_eq!(a.irq_to_access.count(), 1);
        assert!(a.irq_to_access.quantile(0.5) >= 1_960_000);
        // The signal was answered: the next access does not count it again; a write is
        // not a read's round trip.
        a.access(Instant::now(), false);
        assert_eq!(a.irq_to_access.count(), 1);
        assert_eq!(a.before_read.count(), 1);
    }

    #[test]
    fn the_summary_names_each_share_of_the_session() {
        let mut a = AccessTimes::default();
        a.access(Instant::now(), true);
        let mut t = TimerTimes {
            spun: Duration::from_millis(250),
            margin: Duration::from_micros(150),
            ..TimerTimes::default()
        };
        t.woke(Duration::from_micros(40));
        // What the timer thread gathers between passes adds up under the lock.
        let mut session = TimerTimes::default();
        session.take_from(&mut t);
        let mut more = TimerTimes {
            spun: Duration::from_millis(50),
            margin: Duration::from_micros(300),
            ..TimerTimes::default()
        };
        more.woke(Duration::from_micros(60));
        session.take_from(&mut more);
        assert_eq!(more.spun, Duration::ZERO, "the local part starts afresh");
        assert_eq!(more.late.count(), 0);
        let line = SessionSummary {
            wall: Duration::from_secs(10),
            accesses: &a,
            timer: &session,
            intx_signals: 3,
        }
        .to_string();
        assert!(line.starts_with("10.0 s, 1 BAR accesses (0/s)"), "{line}");
        assert!(line.contains("3 INTx signals"), "{line}");
        assert!(line.contains("timer: 2 wake-ups"), "{line}");
        assert!(
            line.contains("spun 0.300 s (3.0%), margin 300 µs"),
            "{line}"
        );
    }
}
