//! Requests: one script call on one lock, retried while its failure may be temporary,
//! bounded by the caller's deadline — including a request already in flight — and
//! cleaned up when it may have landed but nobody will use what it did.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{Cmd, RedisError, Value};
use tokio::time::Instant;

use super::context::Context;
use super::deadline::{Deadline, later};
use super::metrics;
use crate::error::{Error, Result, is_transient};
use crate::options::ReplicaAck;
use crate::script::reply::int;
use crate::script::{LuaScript, ScriptCall, eval, eval_then};

/// First delay before retrying a request that failed in a way that may be temporary.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest delay between retries.
const RETRY_MAX: Duration = Duration::from_millis(500);
/// The least time a request is given to answer, even when the caller's deadline is
/// closer: a deadline that (almost) passed still lets Redis answer a last attempt, so
/// `lock_timeout(Duration::ZERO)` on a free lock acquires it, while a stalled server
/// delays the call by at most this much past its deadline.
pub(crate) const REQUEST_FLOOR: Duration = Duration::from_millis(250);

/// One operation on one lock: what its requests go over and what their errors name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op<'a> {
    pub ctx: &'a Context,
    /// The lock's name.
    pub name: &'a str,
    /// The key Redis errors are reported against.
    pub key: &'a str,
    /// The operation: "acquire", "release", "extend", "status", ...
    pub what: &'static str,
}

impl<'a> Op<'a> {
    pub fn new(ctx: &'a Context, name: &'a str, key: &'a str, what: &'static str) -> Self {
        Op { ctx, name, key, what }
    }

    /// Sends a script call, retrying as [`retrying`](Op::retrying) does.
    pub async fn eval(
        &self,
        script: &LuaScript,
        cmd: &Cmd,
        deadline: Deadline,
        claim: Option<&Claim>,
    ) -> Result<Value> {
        Ok(self.eval_sent(script, cmd, deadline, claim).await?.0)
    }

    /// As [`eval`](Op::eval), also returning when the request that was answered was
    /// sent (the last attempt, after retries).
    pub async fn eval_sent(
        &self,
        script: &LuaScript,
        cmd: &Cmd,
        deadline: Deadline,
        claim: Option<&Claim>,
    ) -> Result<(Value, Instant)> {
        let conn = &*self.ctx.conn;
        self.retrying(deadline, claim, || eval(conn, script, cmd)).await
    }

    /// Sends `call`, retrying as [`retrying`](Op::retrying) does.
    pub async fn call(&self, call: &ScriptCall, deadline: Deadline, claim: Option<&Claim>) -> Result<Value> {
        self.eval(call.script, &call.cmd(), deadline, claim).await
    }

    /// Sends a script call and, under a replica policy, `WAIT` right behind it in the
    /// same pipeline; returns the script's reply, how many replicas acknowledged
    /// (`None` without a policy), and when the request that was answered was sent.
    /// Retries as [`retrying`](Op::retrying) does.
    pub async fn eval_acked(
        &self,
        script: &LuaScript,
        cmd: &Cmd,
        ack: Option<&ReplicaAck>,
        deadline: Deadline,
        claim: Option<&Claim>,
    ) -> Result<Acked> {
        let Some(policy) = ack else {
            let (reply, sent) = self.eval_sent(script, cmd, deadline, claim).await?;
            return Ok(Acked {
                reply,
                acked: None,
                sent,
            });
        };
        let wait = policy.wait_cmd();
        let conn = &*self.ctx.conn;
        let ((reply, acked), sent) = self
            .retrying(deadline, claim, || async {
                let (reply, acked) = eval_then(conn, script, cmd, &wait).await?;
                let acked = int(&acked?).ok_or_else(|| {
                    RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "WAIT did not return a count",
                    ))
                })?;
                Ok((reply?, acked.clamp(0, i64::from(u32::MAX)) as u32))
            })
            .await?;
        tracing::debug!(lock = %self.name, op = self.what, acked, wanted = policy.replicas, "replicas acknowledged");
        Ok(Acked {
            reply,
            acked: Some(acked),
            sent,
        })
    }

    /// Runs `send` — an idempotent request — until it succeeds, fails for good, or
    /// fails in a way that may be temporary (timeout, broken connection, server loading,
    /// cluster redirection) for longer than the client's retry window. The whole call,
    /// a request in flight included, ends at `deadline` — or [`REQUEST_FLOOR`] after the
    /// last request was sent, whichever is later: then the error says Redis did not
    /// answer in time.
    ///
    /// `claim` (if given) learns when a request failed after it may have reached Redis.
    ///
    /// Returns, with the reply, when the attempt that was answered was sent: a lease
    /// confirmed by a retried request runs from the retry, not from the first attempt.
    pub async fn retrying<T, F, Fut>(
        &self,
        deadline: Deadline,
        claim: Option<&Claim>,
        mut send: F,
    ) -> Result<(T, Instant)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // The retry window runs from the first attempt (looked at only after a failure).
        let mut first_sent = None;
        let mut delay = RETRY_FIRST;
        loop {
            let sent = Instant::now();
            let started = *first_sent.get_or_insert(sent);
            let Some(outcome) = deadline.at_least(REQUEST_FLOOR).bound(send()).await else {
                if let Some(c) = claim {
                    c.doubt();
                }
                return Err(self.error(no_reply_in_time()));
            };
            match outcome {
                Ok(v) => return Ok((v, sent)),
                Err(e) if is_transient(&e) => {
                    if let Some(c) = claim {
                        c.doubt();
                    }
                    let next = later(Instant::now(), delay);
                    let window = Deadline::from(started, self.ctx.retry_window);
                    if window.before(next) || deadline.before(next) {
                        return Err(self.error(e));
                    }
                    tracing::debug!(lock = %self.name, op = self.what, error = %e, "request failed; retrying");
                    metrics::request_retried(self.what);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    /// The error of this operation for a redis-rs error.
    pub fn error(&self, e: RedisError) -> Error {
        Error::from_redis(self.name, self.key, self.what, e)
    }

    /// The error for a reply of an unexpected shape.
    pub fn bad_reply(&self) -> Error {
        crate::script::reply::bad_reply(self.name, self.what)
    }

    /// [`Error::NotHeld`] for this lock.
    pub fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_owned(),
        }
    }
}

/// A reply to a request that may have waited for replicas.
#[derive(Debug)]
pub(crate) struct Acked {
    pub reply: Value,
    /// How many replicas acknowledged, under a replica policy.
    pub acked: Option<u32>,
    /// When the request that was answered was sent.
    pub sent: Instant,
}

/// The error of a request cut off by its caller's deadline.
fn no_reply_in_time() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from redis before the call's deadline",
    ))
}

/// Something a request may have left on the server — a lock taken by an acquire whose
/// reply was lost, a queue entry — that must be undone unless the caller ends up using
/// it. If the claim is dropped while armed (the caller's future was cancelled, or it
/// failed after a lost reply), its release call runs in the background, so no orphan
/// lock stays behind.
#[derive(Debug)]
pub(crate) struct Claim {
    ctx: Arc<Context>,
    name: Arc<str>,
    release: Option<ScriptCall>,
    ttl: Duration,
    /// A request is on its way, or one's outcome is unknown.
    armed: AtomicBool,
    /// Some request failed after it may have reached Redis.
    doubted: AtomicBool,
}

impl Claim {
    /// A claim undone by `release`, which is pointless once `ttl` has passed.
    pub fn new(ctx: Arc<Context>, name: &Arc<str>, release: ScriptCall, ttl: Duration) -> Self {
        Claim {
            ctx,
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

    /// A request failed after it may have reached Redis.
    pub fn doubt(&self) {
        self.doubted.store(true, Ordering::Relaxed);
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

    /// What the requests did is used (or was definitely refused): nothing to undo.
    pub fn disarm(mut self) {
        self.armed.store(false, Ordering::Relaxed);
        self.release = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.armed.load(Ordering::Relaxed)
            && let Some(call) = self.release.take()
        {
            spawn_release(self.ctx.clone(), self.name.clone(), call, self.ttl);
        }
    }
}

/// Runs `call` (a compare-and-delete) in the background until Redis gives a definite
/// answer or the lease would have expired anyway. Does nothing outside a runtime; the
/// TTL then frees the lock.
pub(crate) fn spawn_release(ctx: Arc<Context>, name: Arc<str>, call: ScriptCall, ttl: Duration) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(lock = %name, "no runtime to release in; the lease will expire");
        return;
    };
    handle.spawn(async move {
        let give_up = Deadline::after(ttl.saturating_add(Duration::from_secs(1)));
        let mut delay = Duration::from_millis(50);
        loop {
            let sent = give_up.bound(eval(&*ctx.conn, call.script, &call.cmd())).await;
            match sent {
                Some(Ok(v)) => {
                    tracing::debug!(lock = %name, released = int(&v) == Some(1), "background release done");
                    return;
                }
                Some(Err(e)) if is_transient(&e) && !give_up.before(later(Instant::now(), delay)) => {
                    metrics::request_retried("release");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Some(Err(e)) => {
                    tracing::warn!(lock = %name, error = %e, "background release failed; the lease will expire");
                    return;
                }
                None => {
                    tracing::warn!(lock = %name, "background release got no answer; the lease will expire");
                    return;
                }
            }
        }
    });
}
