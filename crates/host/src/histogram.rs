//! A latency histogram with bounded memory and bounded relative error: each power of two
//! is split into `SUB` linear buckets, so a recorded value is known to within 1/SUB of
//! itself (under 1.6 %) whatever its magnitude. Minimum, maximum, count and sum are exact.

use emmc_card::timing::Nanos;

/// Linear sub-buckets per power of two.
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: Nanos,
    max: Nanos,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

/// Bucket index of `v`: values below SUB have their own bucket; above, the exponent picks
/// a group of SUB buckets and the next SUB_BITS bits pick the bucket within it.
fn bucket(v: Nanos) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let sub = ((v >> shift) as usize) & (SUB - 1);
    ((exp - SUB_BITS + 1) as usize) * SUB + sub
}

/// Smallest value that falls in bucket `b`.
fn bucket_low(b: usize) -> Nanos {
    if b < SUB {
        return b as u64;
    }
    let group = (b / SUB) as u32; // = exp - SUB_BITS + 1
    let exp = group + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    (1u64 << exp) | (sub << (exp - SUB_BITS))
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: Vec::new(),
            count: 0,
            sum: 0,
            min: Nanos::MAX,
            max: 0,
        }
    }

    pub fn record(&mut self, v: Nanos) {
        let b = bucket(v);
        if b >= self.counts.len() {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> Nanos {
        if self.count == 0 {
            0
        } else {
            self.max
        }
    }

    pub fn min(&self) -> Nanos {
        if self.count == 0 {
            0
        } else {
            self.min
        }
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The value at quantile `q` (0..=1): the lower edge of the bucket holding the
    /// ⌈q·count⌉-th smallest value, clamped to the exact min and max (the largest rank
    /// is the exact maximum).
    pub fn quantile(&self, q: f64) -> Nanos {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        if rank >= self.count {
            return self.max;
        }
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_low(b).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn merge(&mut self, other: &Histogram) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_their_lower_edges_round_trip() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 40, u64::MAX / 3, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last || v < 100_000, "bucket order at {v}");
            last = b;
            let low = bucket_low(b);
            assert!(low <= v, "{v}: low {low}");
            assert!(v - low <= v / SUB as u64, "{v}: error {}", v - low);
            assert_eq!(bucket(low), b);
        }
    }

    #[test]
    fn quantiles_are_within_the_bucket_error() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.min(), 1000);
        assert_eq!(h.max(), 10_000_000);
        for (q, exact) in [(0.5, 5_000_000u64), (0.99, 9_900_000), (0.999, 9_990_000)] {
            let got = h.quantile(q);
            assert!(
                got <= exact && exact - got <= exact / 64,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.quantile(1.0), 10_000_000);
        assert!((h.mean() - 5_000_500.0).abs() < 1.0);
    }

    #[test]
    fn empty_and_merged_histograms() {
        let h = Histogram::new();
        assert_eq!(
            (h.quantile(0.5), h.max(), h.min(), h.mean()),
            (0, 0, 0, 0.0)
        );
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!((a.count(), a.min(), a.max()), (2, 10, 1_000_000));
    }
}
