//! Deadlines: when a call gives up, computed with checked arithmetic so that no
//! duration — `Duration::MAX` included — can overflow an `Instant`.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// When a call gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// Never: the call runs until it succeeds or fails for good.
    Never,
    /// At this instant.
    At(Instant),
}

impl Deadline {
    /// `d` from now; a duration of a century or more — too long for any timer to
    /// represent, such as `Duration::MAX` — means never.
    pub fn after(d: Duration) -> Self {
        Self::from(Instant::now(), d)
    }

    /// `d` after `start`; never for a century or more, or when it cannot be
    /// represented.
    pub fn from(start: Instant, d: Duration) -> Self {
        if d >= CENTURY {
            return Deadline::Never;
        }
        start.checked_add(d).map_or(Deadline::Never, Deadline::At)
    }

    /// The deadline, but not before `floor` from now: what a request just sent is
    /// given, so that a deadline that has (almost) passed still lets Redis answer one
    /// last attempt.
    pub fn at_least(self, floor: Duration) -> Deadline {
        match self {
            Deadline::Never => Deadline::Never,
            Deadline::At(t) => Deadline::At(t.max(later(Instant::now(), floor))),
        }
    }

    /// The instant, unless never.
    pub fn at(self) -> Option<Instant> {
        match self {
            Deadline::Never => None,
            Deadline::At(t) => Some(t),
        }
    }

    /// Whether the deadline has passed.
    pub fn passed(self) -> bool {
        self.at().is_some_and(|t| Instant::now() >= t)
    }

    /// Whether the deadline passes before `t`.
    pub fn before(self, t: Instant) -> bool {
        self.at().is_some_and(|d| d < t)
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        match (self, other) {
            (Deadline::Never, d) | (d, Deadline::Never) => d,
            (Deadline::At(a), Deadline::At(b)) => Deadline::At(a.min(b)),
        }
    }

    /// The time left (zero once passed); `None` for never.
    pub fn remaining(self) -> Option<Duration> {
        self.at().map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// Runs `fut` until it completes or the deadline passes (then `None`; `fut` is
    /// dropped).
    pub async fn bound<F: Future>(self, fut: F) -> Option<F::Output> {
        match self {
            Deadline::Never => Some(fut.await),
            Deadline::At(t) => tokio::time::timeout_at(t, fut).await.ok(),
        }
    }

    /// Sleeps until the deadline (forever for never).
    pub async fn sleep(self) {
        match self {
            Deadline::Never => std::future::pending().await,
            Deadline::At(t) => tokio::time::sleep_until(t).await,
        }
    }
}

/// How an acquire waits for a lock someone else holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Not at all: one attempt (`try_lock`).
    Try,
    /// Until the deadline (`lock` waits until [`Deadline::Never`]).
    Until(Deadline),
}

impl Wait {
    /// Waits as long as it takes.
    pub const FOREVER: Wait = Wait::Until(Deadline::Never);

    /// Waits at most `timeout` from now; a timeout too long to be represented waits
    /// as long as it takes.
    pub fn timeout(timeout: Duration) -> Self {
        Wait::Until(Deadline::after(timeout))
    }

    /// Waits until `timeout` from now when given, else as long as it takes.
    pub fn optional(timeout: Option<Duration>) -> Self {
        timeout.map_or(Wait::FOREVER, Wait::timeout)
    }

    /// The deadline of the whole call: never for one attempt (each request is bounded
    /// by the retry window instead).
    pub fn deadline(self) -> Deadline {
        match self {
            Wait::Try => Deadline::Never,
            Wait::Until(d) => d,
        }
    }

    /// Whether the call waits at all.
    pub fn waits(self) -> bool {
        matches!(self, Wait::Until(_))
    }
}

/// A century: longer than any deadline or timer needs to be.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `t + d`, but at most a century ahead of `t`: for timers that must be armed with
/// some instant, whatever the duration.
pub(crate) fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d.min(CENTURY)).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_durations_mean_never() {
        assert_eq!(Deadline::after(Duration::MAX), Deadline::Never);
        assert_eq!(Deadline::after(CENTURY), Deadline::Never);
        assert_ne!(Deadline::after(CENTURY / 2), Deadline::Never);
        assert_eq!(Wait::timeout(Duration::MAX).deadline(), Deadline::Never);
        assert!(!Deadline::after(Duration::MAX).passed());
        assert!(later(Instant::now(), Duration::MAX) > Instant::now());
    }

    #[test]
    fn min_prefers_the_earlier_instant() {
        let soon = Deadline::after(Duration::from_secs(1));
        let late = Deadline::after(Duration::from_secs(60));
        assert_eq!(soon.min(late), soon);
        assert_eq!(Deadline::Never.min(late), late);
        assert_eq!(late.min(Deadline::Never), late);
        assert_eq!(Deadline::Never.min(Deadline::Never), Deadline::Never);
        assert!(soon.before(late.at().unwrap()));
        assert!(!Deadline::Never.before(Instant::now()));
    }

    #[test]
    fn a_passed_deadline_still_leaves_a_request_its_floor() {
        let passed = Deadline::At(Instant::now());
        let floor = passed.at_least(Duration::from_millis(250)).at().unwrap();
        assert!(floor >= Instant::now() + Duration::from_millis(200));
        let far = Deadline::after(Duration::from_secs(60));
        assert_eq!(far.at_least(Duration::from_millis(250)), far);
        assert_eq!(
            Deadline::Never.at_least(Duration::from_millis(250)),
            Deadline::Never
        );
    }

    #[tokio::test]
    async fn bound_cuts_a_future_off_at_the_deadline() {
        let d = Deadline::after(Duration::from_millis(20));
        assert_eq!(d.bound(std::future::pending::<()>()).await, None);
        assert_eq!(Deadline::Never.bound(async { 7 }).await, Some(7));
    }
}
