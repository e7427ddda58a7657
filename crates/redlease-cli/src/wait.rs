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

/// What is taken: a lock, or the leadership of an election (`elect`). Only the words
/// of messages differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taking {
    Lock,
    Leadership,
}

impl Taking {
    /// `lock "x" is held by another owner` / `election "x" has another leader`.
    fn busy(self, name: &str) -> String {
        match self {
            Taking::Lock => format!("lock {name:?} is held by another owner"),
            Taking::Leadership => format!("election {name:?} has another leader"),
        }
    }

    /// `lock "x" was not acquired` / `election "x" was not won`.
    fn not_taken(self, name: &str) -> String {
        match self {
            Taking::Lock => format!("lock {name:?} was not acquired"),
            Taking::Leadership => format!("election {name:?} was not won"),
        }
    }

    /// `lock "x"` / `the leadership of election "x"`: what was lost or waited for.
    pub fn what(self, name: &str) -> String {
        match self {
            Taking::Lock => format!("lock {name:?}"),
            Taking::Leadership => format!("the leadership of election {name:?}"),
        }
    }
}

/// What taking a lock needs besides the lock itself.
pub struct Taker<'a> {
    pub name: &'a str,
    /// What is taken, for messages.
    pub taking: Taking,
    /// `--wait` / `--no-wait`.
    pub wait: &'a WaitArgs,
    /// A signal to redlease cancels the wait.
    pub signals: &'a mut Signals,
    pub global: &'a Global,
}

impl Taker<'_> {
    /// Takes the lock, whatever its kind, as `--wait`/`--no-wait` say: `now` with
    /// `--no-wait` (or `--wait 0s`), `within` the limit of `--wait`, `forever` without
    /// either (or with a `--wait` too long to represent).
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
        let how = self.wait.how();
        let started = Instant::now();
        let attempt = async {
            match how {
                How::Now => now().await,
                How::Within(limit) => within(limit).await,
                How::Forever => forever().await,
            }
        };
        let (name, taking) = (self.name, self.taking);
        tokio::select! {
            result = attempt => result.map_err(|e| {
                // The library cuts off a request still in flight at the deadline, and
                // says Redis did not answer in time: the lock was not acquired within
                // --wait, as when it was held all along.
                let ran_out = matches!(how, How::Within(limit) if started.elapsed() >= limit);
                not_acquired(e, name, taking, self.wait, ran_out, self.global)
            }),
            received = self.signals.recv() => Err(Failure::new(
                signal_status(received.signal as i32),
                format!(
                    "interrupted by {} while waiting for {}; nothing was left behind",
                    received.signal,
                    taking.what(name)
                ),
            )),
        }
    }
}

/// The failure of an acquire of lock `name` (or a campaign) that failed with `err`;
/// `ran_out` when the `--wait` limit has passed.
fn not_acquired(
    err: redlease::Error,
    name: &str,
    taking: Taking,
    wait: &WaitArgs,
    ran_out: bool,
    global: &Global,
) -> Failure {
    // Of several names, the error names the one that kept the lock from being taken.
    let name = &err.lock_name().unwrap_or(name).to_owned();
    match &err {
        redlease::Error::Contended { remaining, .. } => {
            let left = remaining.map_or(String::new(), |r| format!("; its lease ends in {}", human(r)));
            Failure::new(
                exit::NOT_ACQUIRED,
                format!("{}{left}; not {} {}", taking.busy(name), match taking {
                    Taking::Lock => "acquired",
                    Taking::Leadership => "elected",
                }, wait.describe()),
            )
            .hint(if wait.no_wait {
                "wait for it with --wait DUR, or leave out --no-wait to wait as long as it takes"
            } else {
                "wait for it with a longer --wait DUR, or leave --wait out to wait as long as it takes"
            })
        }
        redlease::Error::Timeout { .. } => Failure::new(
            exit::NOT_ACQUIRED,
            format!("{} {}", taking.not_taken(name), wait.describe()),
        )
        .hint("wait longer with --wait DUR, or leave --wait out to wait as long as it takes"),
        e if ran_out && e.is_unavailable() => Failure::new(
            exit::NOT_ACQUIRED,
            format!("{} {}: {e}", taking.not_taken(name), wait.describe()),
        )
        .hint(format!(
            "Redis ({}) did not answer before --wait ran out; wait longer with --wait DUR, or check the server",
            global.shown_url
        )),
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
