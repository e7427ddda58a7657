//! The legacy timestamp lock: taking part in the same lock as old clients that use
//! `SETNX lock.foo <unix time + timeout + 1>` and `GET` + `GETSET` takeover.
//!
//! An interop mode for teams migrating away from that protocol (seeds 000 and 004),
//! never the default. Use [`Mutex`](crate::Mutex) for everything else.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::lease::{Lease, LeaseShared, LostReason, ScriptCall};
use crate::scripts::{LEGACY_ACQUIRE, LEGACY_RELEASE, LEGACY_RENEW, array, int};
use crate::token::Token;
use crate::wait::{Attempt, Pending, WaitSpec, acquire_loop, eval_retrying, spawn_release};

/// The resolution of the timestamp stored in a legacy lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimestampUnit {
    /// Unix seconds, as the seed articles write it: `SETNX lock.foo <now + timeout + 1>`.
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
    let ms = keys::ttl_ms(name, timeout)?;
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
///   current time, the `GETSET` takeover of the seed's "C4" client — done as one script,
///   so two takers never both win, whether they are redlease or old clients;
/// - **renew** (while the guard lives, every `timeout / 3`): a new timestamp, written
///   only if the key still holds the one this acquisition wrote;
/// - **release**: `DEL`, only if the key still holds our timestamp (compared inside the
///   script, as the seed's "check before DEL" advice asks).
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
/// - **A losing old client overwrites the winner's timestamp.** The seed's takeover
///   lets a client that loses the `GETSET` race leave its own timestamp in the key
///   ("not a problem" for old clients, which release by plain `DEL`). If that happens
///   to a lock redlease just took over, redlease can no longer prove it is its own: the
///   guard reports [`LostReason::Gone`] at its next renewal and `release` fails with
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
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// `[lock key, owner key]`.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    options: LegacyOptions,
    timeout_arg: Arc<str>,
}

impl LegacyShared {
    fn key(&self) -> &str {
        &self.keys[0]
    }
}

impl LegacyLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str, options: LegacyOptions) -> Result<Self> {
        let keys = LockKeys::new(&client.prefix, name)?;
        let ms = timeout_ms(name, options.unit, options.timeout)?;
        if options.poll_interval < Duration::from_millis(1) {
            return Err(Error::InvalidArgument {
                name: name.to_owned(),
                what: "poll interval",
                reason: "must be at least 1ms".into(),
            });
        }
        Ok(LegacyLock {
            shared: Arc::new(LegacyShared {
                channel: keys.aux("wake").into(),
                keys: Arc::new([keys.key.as_str().into(), keys.aux("legacy").into()]),
                name: name.into(),
                client,
                options,
                timeout_arg: ms.to_string().into(),
            }),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the lock: `<prefix><name>`.
    pub fn key(&self) -> &str {
        self.shared.key()
    }

    /// The options of this lock.
    pub fn options(&self) -> LegacyOptions {
        self.shared.options
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
        self.acquire(None).await
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
        self.acquire(Some(None)).await
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
        self.acquire(Some(Some(Instant::now() + timeout))).await
    }

    async fn acquire(&self, wait: Option<Option<Instant>>) -> Result<LegacyGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let cmd = LEGACY_ACQUIRE.evalsha(
            &s.keys,
            &[token.expose(), s.options.unit.arg(), &s.timeout_arg],
            None,
        );
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            self.release_call(&token),
            s.options.timeout,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &s.channel,
            wait,
            fallback: s.options.poll_interval,
        };
        let poll = s.options.poll_interval;
        let trying = wait.is_none();
        let (pending_ref, cmd_ref, token_ref) = (&pending, &cmd, &token);
        let lease = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let reply = eval_retrying(
                &s.client,
                &s.name,
                s.key(),
                "acquire",
                &LEGACY_ACQUIRE,
                cmd_ref,
                deadline,
                Some(pending_ref),
            )
            .await
            .inspect_err(|e| {
                if !e.is_unavailable() {
                    // A definite error reply: the script fails before any write.
                    pending_ref.answered_no();
                }
            })?;
            match array(&reply).unwrap_or_default() {
                [flag, remaining] if int(flag) == Some(1) => {
                    let remaining = int(remaining).ok_or_else(|| bad_reply(s))?;
                    let remaining = Duration::from_millis(remaining.max(0) as u64);
                    Ok(Attempt::Acquired(self.new_lease(token_ref, sent, remaining)))
                }
                [flag, wait] if int(flag) == Some(0) => {
                    pending_ref.answered_no();
                    let wait = int(wait).ok_or_else(|| bad_reply(s))?;
                    let expires = u64::try_from(wait).ok().map(Duration::from_millis);
                    if trying {
                        return Ok(Attempt::Busy { remaining: expires });
                    }
                    // Never sleep past the poll interval: old clients release silently.
                    Ok(Attempt::Busy {
                        remaining: Some(expires.map_or(poll, |e| e.min(poll))),
                    })
                }
                _ => Err(bad_reply(s)),
            }
        })
        .await?;
        pending.disarm();
        tracing::debug!(lock = %s.name, "legacy lock acquired");
        Ok(LegacyGuard {
            lock: self.clone(),
            token: Some(token),
            lease,
        })
    }

    fn new_lease(&self, token: &Token, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &LEGACY_RENEW,
            s.keys.clone(),
            Arc::new([token.shared(), s.options.unit.arg().into()]),
        );
        let shared = LeaseShared::new(
            s.name.clone(),
            sent,
            s.options.timeout,
            remaining,
            renew,
            self.release_call(token),
            s.options.auto_renew,
        );
        if shared.auto_renew {
            s.client.renewer.schedule(&shared);
        }
        Lease { shared }
    }

    fn release_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &LEGACY_RELEASE,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                s.channel.clone(),
                s.client.publish.clone(),
                s.client.retention_arg.clone(),
            ]),
        )
    }
}

fn bad_reply(s: &LegacyShared) -> Error {
    Error::Redis {
        name: s.name.to_string(),
        op: "acquire",
        source: redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply")),
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
    lock: LegacyLock,
    token: Option<Token>,
    lease: Lease,
}

impl LegacyGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The lock's Redis key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// The lock this guard holds.
    pub fn legacy_lock(&self) -> &LegacyLock {
        &self.lock
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the holder may rely on the lock, assuming old clients' clocks agree
    /// with Redis's (see [`Lease::valid_until`]).
    pub fn valid_until(&self) -> std::time::Instant {
        self.lease.valid_until()
    }

    /// Whether the lease is still valid: not lost, and not past `valid_until`.
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// Completes when the lease is lost (see [`Lease::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Writes a fresh timestamp, `now + timeout + 1` with the new `timeout`, if the
    /// lock is still ours. Auto-renewal (if on) continues with the new timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lock; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] (with seconds, `timeout` must be whole seconds);
    /// [`Error::NotHeld`] when the lock is no longer ours (the guard then reports
    /// [`LostReason::Gone`]); Redis errors.
    pub async fn extend(&self, timeout: Duration) -> Result<()> {
        let s = &*self.lock.shared;
        let ms = timeout_ms(&s.name, s.options.unit, timeout)?;
        if self.lease.lost_reason().is_some() {
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        let shared = &self.lease.shared;
        let cmd = shared.renew.cmd_with_ttl(ms);
        let sent = Instant::now();
        let reply = eval_retrying(
            &s.client,
            &s.name,
            s.key(),
            "extend",
            &LEGACY_RENEW,
            &cmd,
            None,
            None,
        )
        .await?;
        if int(&reply) != Some(1) {
            shared.end(LostReason::Gone);
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        shared.set_ttl(timeout);
        shared.confirm(sent, timeout);
        if shared.auto_renew {
            s.client.renewer.schedule(shared);
        }
        Ok(())
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
    pub async fn release(mut self) -> Result<()> {
        self.token
            .take()
            .expect("token present until the guard is consumed");
        let shared = self.lease.shared.clone();
        let valid_until = shared.valid_until();
        shared.end(LostReason::Released);
        let s = self.lock.shared.clone();
        let call = shared.release.clone();
        let pending = Pending::new(s.client.clone(), &s.name, call.clone(), shared.ttl());
        pending.arm();
        let reply = eval_retrying(
            &s.client,
            &s.name,
            s.key(),
            "release",
            call.script,
            &call.cmd(),
            None,
            Some(&pending),
        )
        .await?;
        let answered = Instant::now();
        let doubted = pending.doubted();
        pending.disarm();
        match int(&reply) {
            // -1: an earlier attempt of this release, whose reply was lost, did it.
            Some(1 | -1) => {
                tracing::debug!(lock = %s.name, "legacy lock released");
                Ok(())
            }
            // Not ours any more, but an earlier attempt may have landed and this answer
            // came while our lock was still valid: it cannot have expired or been taken
            // over on the server before this retry ran, so that attempt released it
            // (and the next holder may already have overwritten its marker).
            Some(0) if doubted && answered < valid_until => {
                tracing::debug!(lock = %s.name, "legacy lock released by an earlier attempt");
                Ok(())
            }
            _ => Err(Error::NotHeld {
                name: s.name.to_string(),
            }),
        }
    }
}

impl Drop for LegacyGuard {
    fn drop(&mut self) {
        if self.token.take().is_some() {
            let lease = &self.lease.shared;
            lease.end(LostReason::Released);
            let s = &self.lock.shared;
            spawn_release(
                s.client.clone(),
                s.name.clone(),
                lease.release.clone(),
                lease.ttl(),
            );
        }
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
