//! The acquire machinery every primitive shares: retrying requests whose reply was
//! lost, waiting for wake-ups with a bounded fallback, and cleaning up acquisitions
//! that were abandoned after their request may have reached Redis.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::conn::eval;
use crate::error::{Error, Result, is_transient};
use crate::lease::ScriptCall;
use crate::scripts::{LuaScript, int};

/// First delay before retrying a request that failed in a way that may be temporary.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest delay between retries.
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Sends a script call, retrying failures that may be temporary (timeout, broken
/// connection, server loading) with exponential backoff for up to the client's retry
/// window or until `deadline`. Every script is idempotent under such a retry.
///
/// `pending` (if given) learns when a request failed after it may have reached Redis.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn eval_retrying(
    client: &ClientInner,
    name: &str,
    key: &str,
    op: &'static str,
    script: &LuaScript,
    cmd: &Cmd,
    deadline: Option<Instant>,
    pending: Option<&Pending>,
) -> Result<Value> {
    retrying(client, name, key, op, deadline, pending, || {
        eval(&*client.conn, script, cmd)
    })
    .await
}

/// Runs a by-token script that replies 1 when the token holds the lock (release or
/// extend by a token from outside a guard), retrying as [`eval_retrying`] does; any
/// other reply is [`Error::NotHeld`].
pub(crate) async fn eval_by_token(
    client: &ClientInner,
    name: &str,
    key: &str,
    op: &'static str,
    script: &LuaScript,
    cmd: &Cmd,
) -> Result<()> {
    let reply = eval_retrying(client, name, key, op, script, cmd, None, None).await?;
    match crate::scripts::int(&reply) {
        Some(1) => Ok(()),
        _ => Err(Error::NotHeld {
            name: name.to_owned(),
        }),
    }
}

/// Runs `send` — an idempotent request — retrying it as [`eval_retrying`] does.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn retrying<T, F, Fut>(
    client: &ClientInner,
    name: &str,
    key: &str,
    op: &'static str,
    deadline: Option<Instant>,
    pending: Option<&Pending>,
    mut send: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = redis::RedisResult<T>>,
{
    let started = Instant::now();
    let mut delay = RETRY_FIRST;
    loop {
        match send().await {
            Ok(v) => return Ok(v),
            Err(e) if is_transient(&e) => {
                if let Some(p) = pending {
                    p.doubted.store(true, Ordering::Relaxed);
                }
                let now = Instant::now();
                let give_up =
                    now + delay > started + client.retry_window || deadline.is_some_and(|d| now + delay > d);
                if give_up {
                    return Err(Error::from_redis(name, key, op, e));
                }
                tracing::debug!(lock = %name, op, error = %e, "request failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
            Err(e) => return Err(Error::from_redis(name, key, op, e)),
        }
    }
}

/// An acquisition whose request may have reached Redis. If it is dropped while armed
/// — the caller's future was cancelled, or it failed after a lost reply — the token is
/// compare-and-deleted in the background, so no orphan lock stays behind.
#[derive(Debug)]
pub(crate) struct Pending {
    client: Arc<ClientInner>,
    name: Arc<str>,
    release: Option<ScriptCall>,
    ttl: Duration,
    /// A request is on its way, or one's outcome is unknown.
    armed: AtomicBool,
    /// Some request failed after it may have reached Redis.
    doubted: AtomicBool,
}

impl Pending {
    pub fn new(client: Arc<ClientInner>, name: &Arc<str>, release: ScriptCall, ttl: Duration) -> Self {
        Pending {
            client,
            name: name.clone(),
            release: Some(release),
            ttl,
            armed: AtomicBool::new(false),
            doubted: AtomicBool::new(false),
        }
    }

    /// A request is about to be sent: from now on it may land.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Redis answered definitely that it did not take the request; stays armed only if
    /// an earlier request's outcome is unknown.
    pub fn answered_no(&self) {
        let doubted = self.doubted.load(Ordering::Relaxed);
        self.armed.store(doubted, Ordering::Relaxed);
    }

    /// Whether some request failed after it may have reached Redis.
    pub fn doubted(&self) -> bool {
        self.doubted.load(Ordering::Relaxed)
    }

    /// The acquisition succeeded (or was definitely refused); nothing to clean up.
    pub fn disarm(mut self) {
        self.armed.store(false, Ordering::Relaxed);
        self.release = None;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed.load(Ordering::Relaxed)
            && let Some(call) = self.release.take()
        {
            spawn_release(self.client.clone(), self.name.clone(), call, self.ttl);
        }
    }
}

/// Runs `call` (a compare-and-delete) in the background until Redis gives a definite
/// answer or the lease would have expired anyway. Does nothing outside a runtime; the
/// TTL then frees the lock.
pub(crate) fn spawn_release(client: Arc<ClientInner>, name: Arc<str>, call: ScriptCall, ttl: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(lock = %name, "no runtime to release in; the lease will expire");
        return;
    };
    handle.spawn(async move {
        let give_up = Instant::now() + ttl + Duration::from_secs(1);
        let mut delay = Duration::from_millis(50);
        loop {
            match eval(&*client.conn, call.script, &call.cmd()).await {
                Ok(v) => {
                    tracing::debug!(lock = %name, released = int(&v) == Some(1), "background release done");
                    return;
                }
                Err(e) if Instant::now() + delay < give_up && is_transient(&e) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    tracing::warn!(lock = %name, error = %e, "background release failed; the lease will expire");
                    return;
                }
            }
        }
    });
}

/// What one acquire attempt found.
pub(crate) enum Attempt<T> {
    /// Got it.
    Acquired(T),
    /// Someone else has it; the wait should not outlast `remaining` (their lease).
    Busy { remaining: Option<Duration> },
    /// Busy for this waiter, but what was freed could serve another local waiter (a
    /// semaphore waiter that needs more permits than are free): a wake-up this waiter
    /// consumed is passed on, at most once per message, instead of being swallowed.
    BusyPassOn { remaining: Option<Duration> },
}

/// How an acquire waits.
pub(crate) struct WaitSpec<'a> {
    pub client: &'a ClientInner,
    pub name: &'a str,
    pub channel: &'a str,
    /// `None`: try once (`try_*`). `Some(None)`: wait forever. `Some(Some(t))`: until `t`.
    pub wait: Option<Option<Instant>>,
    /// Fallback wait when the holder's remaining lease is unknown.
    pub fallback: Duration,
}

/// Runs `attempt` until it acquires, waiting for wake-ups in between.
///
/// The first attempt goes out at once (one round trip when uncontended). After a busy
/// answer the waiter subscribes to the lock's channel, waits for the subscription to
/// be confirmed, and tries again — a release between the two attempts is thus never
/// missed. From then on it sleeps until a wake-up, the holder's remaining lease (plus
/// jitter), or its deadline, whichever comes first.
pub(crate) async fn acquire_loop<T, F, Fut>(spec: WaitSpec<'_>, mut attempt: F) -> Result<T>
where
    F: FnMut(Option<Instant>) -> Fut,
    Fut: Future<Output = Result<Attempt<T>>>,
{
    let started = Instant::now();
    let deadline = spec.wait.flatten();
    let mut sub = None;
    let mut debt: Option<crate::notify::WakeDebt> = None;
    // The wake-up generation seen by the previous attempt: a pass-on does not bump it,
    // so a wake-up is passed on only by waiters that had not yet tried since it came.
    let mut previous = None;
    loop {
        let seen = sub.as_ref().map(crate::notify::Subscription::generation);
        let outcome = attempt(deadline).await;
        let pass_on = matches!(outcome, Ok(Attempt::BusyPassOn { .. })) && seen != previous;
        previous = seen;
        if let Some(d) = debt.take() {
            if pass_on {
                drop(d); // an unsettled debt wakes another local waiter
            } else {
                d.settle();
            }
        }
        let remaining = match outcome? {
            Attempt::Acquired(value) => {
                tracing::debug!(lock = %spec.name, waited = ?started.elapsed(), "acquired");
                return Ok(value);
            }
            Attempt::Busy { remaining } | Attempt::BusyPassOn { remaining } => remaining,
        };
        let Some(_) = spec.wait else {
            return Err(Error::Contended {
                name: spec.name.to_owned(),
                remaining,
            });
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timeout(spec.name, started));
        }
        let Some(s) = sub.as_ref() else {
            tracing::debug!(lock = %spec.name, "busy; waiting for a release");
            let s = spec.client.notifier.subscribe(spec.channel);
            let wait_for = deadline.map_or(spec.client.subscribe_timeout, |d| {
                (d - now).min(spec.client.subscribe_timeout)
            });
            if !s.ready(wait_for).await {
                tracing::debug!(lock = %spec.name, "wake-up subscription not confirmed; polling");
            }
            sub = Some(s);
            continue;
        };
        let fallback = remaining.unwrap_or(spec.fallback).max(Duration::from_millis(1));
        let mut wake_at = now + fallback + jitter(fallback);
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        let woken = tokio::select! {
            _ = s.woken() => true,
            _ = tokio::time::sleep_until(wake_at) => false,
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            if woken {
                // Do not swallow a wake-up another local waiter could use.
                s.pass_on();
            }
            return Err(timeout(spec.name, started));
        }
        if woken {
            debt = Some(s.debt());
        }
    }
}

fn timeout(name: &str, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    }
}

/// A random extra delay of up to a tenth of `base` plus 5 ms, so fallback wakers spread out.
fn jitter(base: Duration) -> Duration {
    let max = (base / 10 + Duration::from_millis(5)).as_micros() as u64;
    let r = getrandom::u64().unwrap_or(0);
    Duration::from_micros(r % max.max(1))
}
