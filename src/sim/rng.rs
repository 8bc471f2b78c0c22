//! The simulator's random numbers: SplitMix64, seeded by the user, so a run replays
//! exactly. (Small, fast, and statistically fine for choosing offsets.)

#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth mentioning for n ≪ 2^64.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_values_stay_below_the_bound() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let mut c = SplitMix64::new(8);
        let xs: Vec<u64> = (0..100).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(1000)).collect();
        let zs: Vec<u64> = (0..100).map(|_| c.below(1000)).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
        assert!(xs.iter().all(|&x| x < 1000));
        // Roughly uniform: every decile is hit.
        let mut deciles = [0; 10];
        let mut r = SplitMix64::new(1);
        for _ in 0..10_000 {
            deciles[(r.below(100) / 10) as usize] += 1;
        }
        assert!(
            deciles.iter().all(|&d| (800..1200).contains(&d)),
            "{deciles:?}"
        );
    }
}
