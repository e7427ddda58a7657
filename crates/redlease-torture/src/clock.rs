//! One clock for every process of a run: `CLOCK_MONOTONIC`, in nanoseconds.
//!
//! The coordinator (which hosts the resource) and the workers are processes on the same
//! machine, so their `CLOCK_MONOTONIC` readings are directly comparable. That lets the
//! checker order events across processes: when the resource refused a write, when the
//! writer's `lost()` fired, until when its lease was valid.

use std::time::Instant;

use nix::time::{ClockId, clock_gettime};

/// Now, in nanoseconds of `CLOCK_MONOTONIC`.
pub fn mono_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always available");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// A std (or tokio) `Instant` on the same scale. `Instant` is `CLOCK_MONOTONIC` on Linux
/// but opaque, so it is placed relative to a paired reading of both clocks.
pub fn instant_ns(t: Instant) -> u64 {
    let (now, ns) = (Instant::now(), mono_ns());
    if t >= now {
        ns + (t - now).as_nanos() as u64
    } else {
        ns.saturating_sub((now - t).as_nanos() as u64)
    }
}

/// How far this process's wall clock is set off (the `clock` fault), in milliseconds.
static SKEW_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets this process's wall-clock skew (the `clock` fault steps it, then back to 0).
pub fn set_skew_ms(ms: i64) {
    SKEW_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// The wall clock as this process's clients see it: Unix milliseconds, plus the skew.
/// Only algorithms that read the client's clock (the old SETNX timestamp lock) use it;
/// redlease reads Redis's clock (`TIME`) and never this one.
pub fn wall_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    (now + SKEW_MS.load(std::sync::atomic::Ordering::Relaxed)).max(0) as u64
}
