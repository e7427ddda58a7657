//! A small seeded generator (SplitMix64) for fault schedules and jitter. Runs are timing
//! dependent anyway; the seed makes the *schedule* repeatable.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn from_entropy() -> Self {
        Rng(getrandom::u64().unwrap_or(0x9E37_79B9_7F4A_7C15))
    }

    /// A generator for a sub-stream (a worker, a task) that does not repeat this one.
    pub fn fork(&self, stream: u64) -> Self {
        let mut r = Rng(self.0 ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo, hi) = (lo.as_micros() as u64, hi.as_micros().max(lo.as_micros()) as u64);
        Duration::from_micros(lo + self.below(hi - lo + 1))
    }

    /// Uniform in `lo..=hi` times `base`.
    pub fn scaled(&mut self, base: Duration, lo: f64, hi: f64) -> Duration {
        self.between(base.mul_f64(lo), base.mul_f64(hi))
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}
