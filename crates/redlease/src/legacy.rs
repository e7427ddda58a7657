//! The legacy timestamp lock: taking part in the same lock as old clients that use
//! `SETNX lock.foo <unix time + timeout + 1>` and `GET` + `GETSET` takeover — the
//! locking pattern once documented on the Redis `SETNX` page.
//!
//! An interop mode for teams migrating away from that protocol, never the default.
//! Use [`Mutex`](crate::Mutex) for everything else.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::{Acquire, Busy, Reply};
use crate::engine::context::Context;
use crate::engine::deadline::Wait;
use crate::engine::guard::{GuardCore, LockBase, guard_surface};
use crate::engine::metrics::Primitive;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::options::LeaseOptions;
use crate::script::reply::{array, int};
use crate::script::{LEGACY_ACQUIRE, LEGACY_RELEASE, LEGACY_RENEW, ScriptCall};
use crate::token::Token;

/// The resolution of the timestamp stored in a legacy lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimestampUnit {
    /// Unix seconds, as the locking pattern of the Redis `SETNX` documentation writes
    /// it: `SETNX lock.foo <now + timeout + 1>`.
    #[default]
    Seconds,
    /// Unix milliseconds, for old clients that store `now_ms + timeout_ms + 1`.
    Milliseconds,
}

impl TimestampUnit {
    fn arg(self) -> &'static str {
        match self {
            TimestampUnit::Seconds => "s",
            TimestampUnit::Milliseconds => "ms",
        }
    }
}

/// Default time between tries while waiting for a legacy lock (old clients announce
/// no releases, so a waiter has to look).
pub const DEFAULT_LEGACY_POLL: Duration = Duration::from_millis(100);

/// Options of a [`LegacyLock`]; every client of one lock must agree on `timeout` and
/// `unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LegacyOptions {
    /// The lock timeout: the stored timestamp is `now + timeout + 1` (default 30 s).
    /// With [`TimestampUnit::Seconds`] it must be a whole number of seconds.
    pub timeout: Duration,
    /// Seconds (default) or milliseconds.
    pub unit: TimestampUnit,
    /// Push the timestamp out every `timeout / 3` while the guard lives (default `true`).
    pub auto_renew: bool,
    /// Longest time between tries while waiting (default 100 ms).
    pub poll_interval: Duration,
}

impl Default for LegacyOptions {
    fn default() -> Self {
        LegacyOptions {
            timeout: Duration::from_secs(30),
            unit: TimestampUnit::Seconds,
            auto_renew: true,
            poll_interval: DEFAULT_LEGACY_POLL,
        }
    }
}

impl LegacyOptions {
    /// The defaults: 30 s timeout in seconds, auto-renewal, 100 ms polling.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lock timeout old clients use.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the timestamp resolution.
    pub fn unit(mut self, unit: TimestampUnit) -> Self {
        self.unit = unit;
        self
    }

    /// Turns renewal on or off.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Sets the longest time between tries while waiting.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }
}

/// Checks a timeout for `unit` and returns it in milliseconds.
fn timeout_ms(name: &str, unit: TimestampUnit, timeout: Duration) -> Result<u64> {
    let ms = crate::keys::ttl_ms(name, timeout)?;
    if unit == TimestampUnit::Seconds && (timeout.subsec_nanos() != 0 || timeout.is_zero()) {
        return Err(Error::InvalidTtl {
            name: name.to_owned(),
            ttl: timeout,
            reason: "a legacy lock in seconds needs a whole number of seconds",
        });
    }
    Ok(ms)
}

/// A lock in the old `SETNX` timestamp format, shared with unmodified old clients.
///
/// The key `<prefix><name>` holds `<unix time + timeout + 1>` — seconds by default,
/// milliseconds as an option — exactly as old clients write it, so old clients and
/// redlease exclude each other:
///
/// - **acquire**: `SETNX` when the key is free; when its timestamp is older than the
///   current time, the `GETSET` takeover of the documented pattern — done as one script,
///   so two takers never both win, whether they are redlease or old clients;
/// - **renew** (while the guard lives, every `timeout / 3`): a new timestamp, written
///   only if the key still holds the one this acquisition wrote;
/// - **release**: `DEL`, only if the key still holds our timestamp (compared inside the
///   script, as the pattern's "check before DEL" advice asks).
///
/// The current time is always Redis's (`TIME` inside the script), never this host's.
///
/// # Weaker guarantees than [`Mutex`](crate::Mutex)
///
/// This is an interop mode; the old protocol limits what it can promise:
///
/// - **Clocks.** Old clients compare the timestamp with *their own* clock. One whose
///   clock runs `d` ahead takes over `d` early, while redlease's
///   [`valid_until`](LegacyGuard::valid_until) assumes it agrees with Redis's. All
///   clients must also use the same timeout.
/// - **No token in the key.** The key holds only a timestamp. redlease recognises its
///   own acquisitions by an owner record beside the key plus a Redis TTL on the key
///   (which old clients never set), so an equal timestamp written by someone else —
///   likely with second resolution — is not mistaken for its own. Old clients have no
///   such check: one that stalls past its timeout and then `DEL`s removes the next
///   holder's lock.
/// - **A losing old client overwrites the winner's timestamp.** The pattern's takeover
///   lets a client that loses the `GETSET` race leave its own timestamp in the key
///   ("not a problem" for old clients, which release by plain `DEL`). If that happens
///   to a lock redlease just took over, redlease can no longer prove it is its own: the
///   guard reports [`LostReason::Gone`](crate::LostReason::Gone) at its next renewal and `release` fails with
///   [`Error::NotHeld`] without deleting, and the key frees itself when the loser's
///   timestamp expires. Exclusion holds — with one timeout and agreeing clocks, the
///   loser's timestamp is no earlier than ours — but the redlease holder is told to stop
///   early, and up to one timeout of availability is lost.
/// - **No fencing tokens**, and no owner label for status commands.
/// - **Waiting polls.** Old clients announce no releases, so a waiter tries again every
///   [`poll_interval`](LegacyOptions::poll_interval) (and when the holder's timestamp
///   expires); releases by redlease do wake redlease waiters at once.
///
/// Besides the protocol's key, redlease writes the owner record `{<key>}:legacy` and
/// gives the key a Redis TTL of one second past its timestamp, so a lock redlease took
/// never outlives its holder by more than that even if nobody takes it over.
///
/// `LegacyLock` is a cheap handle (clone it freely); it holds no lock by itself.
#[derive(Clone, Debug)]
pub struct LegacyLock {
    shared: Arc<LegacyShared>,
}

#[derive(Debug)]
struct LegacyShared {
    base: LockBase,
    /// `[lock key, owner key]`.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    legacy: LegacyOptions,
    timeout_arg: Arc<str>,
}

impl LegacyLock {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, options: LegacyOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let ms = timeout_ms(name, options.unit, options.timeout)?;
        if options.poll_interval < Duration::from_millis(1) {
            return Err(Error::InvalidArgument {
                name: name.to_owned(),
                what: "poll interval",
                reason: "must be at least 1ms".into(),
            });
        }
        let lease = LeaseOptions::new()
            .ttl(options.timeout)
            .auto_renew(options.auto_renew);
        let mut base = LockBase::new(ctx, Primitive::Legacy, name, &keys.key, lease)?;
        base.whole_seconds = options.unit == TimestampUnit::Seconds;
        Ok(LegacyLock {
            shared: Arc::new(LegacyShared {
                channel: keys.aux("wake").into(),
                keys: Arc::new([base.key.clone(), keys.aux("legacy").into()]),
                base,
                legacy: options,
                timeout_arg: ms.to_string().into(),
            }),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.base.name
    }

    /// The Redis key of the lock: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.base.key
    }

    /// The options of this lock.
    pub fn options(&self) -> LegacyOptions {
        self.shared.legacy
    }

    /// Takes the lock if it is free or its timestamp has expired, without waiting. One
    /// round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request was sent leaves no lock behind: the
    /// attempt is released in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when the lock is held (with the time until its timestamp
    /// expires, when it holds one); [`Error::WrongType`], [`Error::ReadOnly`] or
    /// [`Error::Redis`] when Redis cannot be used.
    pub async fn try_lock(&self) -> Result<LegacyGuard> {
        self.acquire(Wait::Try).await
    }

    /// Takes the lock, waiting as long as it takes.
    ///
    /// Tries again when a redlease holder announces its release, when the holder's
    /// timestamp expires, and at least every
    /// [`poll_interval`](LegacyOptions::poll_interval) (old clients announce nothing).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no lock behind.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`].
    pub async fn lock(&self) -> Result<LegacyGuard> {
        self.acquire(Wait::FOREVER).await
    }

    /// Takes the lock, waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](LegacyLock::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], and the errors of [`lock`](LegacyLock::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<LegacyGuard> {
        self.acquire(Wait::timeout(timeout)).await
    }

    async fn acquire(&self, wait: Wait) -> Result<LegacyGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let unit = s.legacy.unit.arg();
        let cmd = LEGACY_ACQUIRE.evalsha(&s.keys, &[token.expose(), unit, &s.timeout_arg], None);
        let release = ScriptCall::new(
            &LEGACY_RELEASE,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                s.channel.clone(),
                s.base.ctx.publish.clone(),
                s.base.ctx.retention_arg.clone(),
            ]),
        );
        let spec = Acquire {
            script: &LEGACY_ACQUIRE,
            cmd: &cmd,
            channel: &s.channel,
            wait,
            undo: release.clone(),
            renew: ScriptCall::new(
                &LEGACY_RENEW,
                s.keys.clone(),
                Arc::new([token.shared(), unit.into()]),
            ),
            release,
            token,
            grant: None,
        };
        let poll = s.legacy.poll_interval;
        let core = s
            .base
            .acquire(spec, |reply, _| {
                let bad = || s.base.op("acquire").bad_reply();
                match array(reply).unwrap_or_default() {
                    [flag, remaining] if int(flag) == Some(1) => Ok(Reply::Acquired {
                        fence: None,
                        remaining: Duration::from_millis(int(remaining).ok_or_else(bad)?.max(0) as u64),
                    }),
                    [flag, until] if int(flag) == Some(0) => {
                        let expires = u64::try_from(int(until).ok_or_else(bad)?)
                            .ok()
                            .map(Duration::from_millis);
                        // Never sleep past the poll interval when waiting: old clients
                        // release silently.
                        let remaining = if wait.waits() {
                            Some(expires.map_or(poll, |e| e.min(poll)))
                        } else {
                            expires
                        };
                        Ok(Reply::Busy {
                            busy: Busy {
                                remaining,
                                pass_on: false,
                                mark: None,
                                foreign: false,
                            },
                            queued: false,
                        })
                    }
                    _ => Err(bad()),
                }
            })
            .await?;
        Ok(LegacyGuard {
            core,
            lock: self.clone(),
        })
    }
}

/// Proof of holding a [`LegacyLock`], with its lease.
///
/// While the guard lives, the timestamp is pushed out every `timeout / 3` (unless the
/// lock was made with `auto_renew(false)`). [`is_held`](LegacyGuard::is_held) and
/// [`lost`](LegacyGuard::lost) say when the lock can no longer be relied on — taken
/// over after a stall, deleted, or its timestamp overwritten by an old client (see
/// [`LegacyLock`]).
///
/// # Drop
///
/// Dropping the guard without [`release`](LegacyGuard::release) stops renewal and
/// releases the lock in the background when a tokio runtime is running; otherwise the
/// timestamp expires after the timeout, and old clients take the lock over.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct LegacyGuard {
    core: GuardCore,
    lock: LegacyLock,
}

guard_surface!(LegacyGuard, "this guard holds", fence: |_g| None);

impl LegacyGuard {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The lock this guard holds.
    pub fn legacy_lock(&self) -> &LegacyLock {
        &self.lock
    }

    /// Deletes the lock if its timestamp is still ours, and wakes a redlease waiter.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lock was no longer ours — taken over, deleted, or
    /// its timestamp overwritten by an old client — and nothing was deleted; Redis
    /// errors (the release is then retried in the background until the lock would
    /// have expired).
    pub async fn release(self) -> Result<()> {
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the timestamp stays
    /// until it expires and old clients take the lock over.
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_need_whole_seconds() {
        assert!(timeout_ms("n", TimestampUnit::Seconds, Duration::from_millis(1500)).is_err());
        assert!(timeout_ms("n", TimestampUnit::Seconds, Duration::from_millis(10)).is_err());
        assert_eq!(
            timeout_ms("n", TimestampUnit::Seconds, Duration::from_secs(2)).unwrap(),
            2000
        );
        assert_eq!(
            timeout_ms("n", TimestampUnit::Milliseconds, Duration::from_millis(1500)).unwrap(),
            1500
        );
        assert!(timeout_ms("n", TimestampUnit::Milliseconds, Duration::ZERO).is_err());
    }
}
