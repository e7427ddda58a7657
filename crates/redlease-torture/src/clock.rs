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
