//! Arithmetic on samples, and a fixed stream of pseudo-random numbers.
//!
//! Latencies come from `Instant` around the call; percentiles are nearest-rank.

use std::time::Duration;

/// Nearest-rank percentile of sorted samples.
pub fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort_unstable();
    v
}

pub fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / v.len() as u32
}

/// splitmix64: a fixed, dependency-free stream of well-mixed numbers.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A duration in `[lo, hi)`, picked by `seed`.
pub fn jitter(seed: u64, lo: Duration, hi: Duration) -> Duration {
    let span = (hi - lo).as_nanos().max(1) as u64;
    lo + Duration::from_nanos(mix(seed) % span)
}
