//! Taking a lock as `--wait` / `--no-wait` say, whatever its kind, with a signal to
//! redlease cancelling the wait, and the messages of a lock not acquired. Also the
//! deadlines of user-given durations: instants are only ever computed with checked
//! arithmetic, and one that cannot be represented is never reached.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::cli::{How, WaitArgs, signal_status};
use crate::connect::Global;
use crate::exit::{self, Failure};
use crate::output::human;
use crate::signals::Signals;

/// What taking a lock needs besides the lock itself.
pub struct Taker<'a> {
    pub name: &'a str,
    /// `--wait` / `--no-wait`.
    pub wait: &'a WaitArgs,
    /// A signal to redlease cancels the wait.
    pub signals: &'a mut Signals,
    pub global: &'a Global,
}

impl Taker<'_> {
    /// Takes the lock, whatever its kind, as `--wait`/`--no-wait` say: `now` with
    /// `--no-wait`, `within` the limit of `--wait`, `forever` without either.
    ///
    /// Fails with status 128+N when signal N interrupted the wait: the attempt's token
    /// is then compare-and-deleted in the background (see `finish_background_work`), so
    /// nothing is left behind.
    pub async fn take<T, Now, Within, Forever>(
        self,
        now: impl FnOnce() -> Now,
        within: impl FnOnce(Duration) -> Within,
        forever: impl FnOnce() -> Forever,
    ) -> Result<T, Failure>
    where
        Now: Future<Output = redlease::Result<T>>,
        Within: Future<Output = redlease::Result<T>>,
        Forever: Future<Output = redlease::Result<T>>,
    {
        let attempt = async {
            match self.wait.how() {
                How::Now => now().await,
                How::Within(limit) => within(limit).await,
                How::Forever => forever().await,
            }
        };
        acquire_with(self.name, attempt, self.wait, self.signals, self.global).await
    }
}

/// Runs an acquire `attempt` of lock `name`; a signal to redlease cancels it (every
/// primitive's acquire leaves nothing behind when cancelled).
async fn acquire_with<T>(
    name: &str,
    attempt: impl Future<Output = redlease::Result<T>>,
    wait: &WaitArgs,
    signals: &mut Signals,
    global: &Global,
) -> Result<T, Failure> {
    tokio::select! {
        result = attempt => result.map_err(|e| not_acquired(e, name, wait, global)),
        received = signals.recv() => Err(Failure::new(
            signal_status(received.signal as i32),
            format!("interrupted by {} while waiting for lock {name:?}; nothing was left behind", received.signal),
        )),
    }
}

fn not_acquired(err: redlease::Error, name: &str, wait: &WaitArgs, global: &Global) -> Failure {
    match &err {
        redlease::Error::Contended { remaining, .. } => {
            let left = remaining.map_or(String::new(), |r| format!("; its lease ends in {}", human(r)));
            Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {name:?} is held by another owner{left}; not acquired {}",
                    wait.describe()
                ),
            )
            .hint("wait for it with --wait DUR, or leave out --no-wait to wait as long as it takes")
        }
        redlease::Error::Timeout { .. } => Failure::new(
            exit::NOT_ACQUIRED,
            format!("lock {name:?} was not acquired {}", wait.describe()),
        )
        .hint("wait longer with --wait DUR, or leave --wait out to wait as long as it takes"),
        _ => Failure::from_lock(err, &global.shown_url),
    }
}

/// `d` after `t`; `None` (never) when that instant cannot be represented.
pub fn after(t: Instant, d: Duration) -> Option<Instant> {
    t.checked_add(d)
}

/// Sleeps until `deadline`; forever when there is none.
pub async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
