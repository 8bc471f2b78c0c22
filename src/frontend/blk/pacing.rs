//! How early the pacing timer fires.
//!
//! A completion is signalled by spinning out the last stretch before it is due; the timer
//! only has to wake the event loop before that stretch begins. How long it must be depends
//! on how late the timer wakes us, which on a virtualised or loaded host varies from tens
//! of microseconds to several hundred. [`SpinMargin`] keeps the lateness of recent timer
//! wake-ups and sets the margin to cover nearly all of them, between a floor and a ceiling
//! the user chose: more margin costs CPU (spinning), less lets the wake-up latency show in
//! the completions.

use std::time::Duration;

/// Wake-ups remembered.
const WINDOW: usize = 128;
/// The margin is recomputed after this many new wake-ups.
const REFRESH: u32 = 16;
/// The margin covers this share of the remembered wake-ups…
const COVER: f64 = 0.99;
/// …plus this much for the work between the wake-up and the spin (running the driver).
const HEADROOM: Duration = Duration::from_micros(20);

/// The pacing timer's margin: at least `min`, at most `max`, in between what the recent
/// wake-ups needed.
#[derive(Debug, Clone)]
pub struct SpinMargin {
    min: Duration,
    max: Duration,
    /// Lateness of the latest wake-ups, a ring of nanoseconds.
    recent: Vec<u64>,
    next: usize,
    since_refresh: u32,
    current: Duration,
}

impl SpinMargin {
    /// A margin that adapts between `min` and `max` (`max` below `min` counts as `min`:
    /// a fixed margin).
    pub fn new(min: Duration, max: Duration) -> SpinMargin {
        SpinMargin {
            min,
            max: max.max(min),
            recent: Vec::with_capacity(WINDOW),
            next: 0,
            since_refresh: 0,
            current: min,
        }
    }

    /// A margin that never changes.
    pub fn fixed(margin: Duration) -> SpinMargin {
        SpinMargin::new(margin, margin)
    }

    /// How early the timer should fire now.
    pub fn get(&self) -> Duration {
        self.current
    }

    pub fn bounds(&self) -> (Duration, Duration) {
        (self.min, self.max)
    }

    /// The timer woke the loop `late` after the instant it was armed for.
    pub fn observe(&mut self, late: Duration) {
        if self.min == self.max {
            return;
        }
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        if self.recent.len() < WINDOW {
            self.recent.push(ns);
        } else {
            self.recent[self.next] = ns;
        }
        self.next = (self.next + 1) % WINDOW;
        self.since_refresh += 1;
        if self.since_refresh >= REFRESH {
            self.since_refresh = 0;
            self.refresh();
        }
    }

    fn refresh(&mut self) {
        let mut sorted = self.recent.clone();
        sorted.sort_unstable();
        let rank = ((sorted.len() as f64 * COVER).ceil() as usize).clamp(1, sorted.len());
        let covered = Duration::from_nanos(sorted[rank - 1]) + HEADROOM;
        self.current = covered.clamp(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_margin_follows_the_recent_wake_up_lateness_within_its_bounds() {
        let mut m = SpinMargin::new(50 * US, 1000 * US);
        assert_eq!(m.get(), 50 * US, "it starts at the floor");
        for _ in 0..WINDOW {
            m.observe(300 * US);
        }
        assert_eq!(m.get(), 320 * US, "lateness plus headroom");
        for _ in 0..WINDOW {
            m.observe(10 * US);
        }
        assert_eq!(
            m.get(),
            50 * US,
            "back to the floor once wake-ups are prompt"
        );
        for _ in 0..WINDOW {
            m.observe(5000 * US);
        }
        assert_eq!(m.get(), 1000 * US, "never past the ceiling");
    }

    #[test]
    fn a_single_outlier_does_not_raise_the_margin_but_a_few_percent_do() {
        let mut m = SpinMargin::new(50 * US, 1000 * US);
        for i in 0..WINDOW {
            m.observe(if i == 7 { 900 * US } else { 100 * US });
        }
        assert_eq!(
            m.get(),
            120 * US,
            "one wake-up in 128 is below the 99th percentile"
        );
        for i in 0..WINDOW {
            m.observe(if i % 32 == 0 { 400 * US } else { 100 * US });
        }
        assert_eq!(m.get(), 420 * US, "four in 128 are above it");
    }

    #[test]
    fn a_fixed_margin_ignores_wake_ups() {
        let mut m = SpinMargin::fixed(150 * US);
        for _ in 0..WINDOW {
            m.observe(800 * US);
        }
        assert_eq!(m.get(), 150 * US);
        let m = SpinMargin::new(200 * US, 100 * US);
        assert_eq!(m.bounds(), (200 * US, 200 * US));
    }
}
