//! The plain distributed mutex.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::client::{ClientInner, LeaseOptions};
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::lease::{Lease, LeaseShared, LostReason, ScriptCall};
use crate::local::{Entry, Handed, LocalLock, Turn, Waiter};
use crate::replicas::{OnShortfall, eval_acked};
use crate::scripts::{
    MUTEX_ACQUIRE, MUTEX_EXTEND, MUTEX_HANDOFF, MUTEX_RELEASE, MUTEX_STATUS, array, int, opt_string,
};
use crate::token::{FencingToken, Token};
use crate::wait::{Attempt, Pending, WaitSpec, acquire_loop, eval_by_token, eval_retrying, spawn_release};

/// A distributed mutual-exclusion lock on one Redis key.
///
/// The lock is the key `<prefix><name>` holding the holder's random token, with a PX
/// TTL: the format redis-py's `Lock`, node-redlock and redsync use, so those clients
/// and redlease exclude each other on the same key. Each acquisition gets a
/// [`FencingToken`] that rises strictly with every acquisition of the name.
///
/// # Policy
///
/// Not fair: when the lock is released, every process waiting for it is woken and one
/// of them wins (within one process, one waiter per release is woken). Waiters are
/// woken through Redis pub/sub, never by polling; a missed wake-up costs at most the
/// holder's remaining lease.
///
/// # Guarantees
///
/// At most one holder at a time *while leases are valid and Redis keeps its writes*. A
/// holder that stalls past its lease (a long pause) or a Redis failover that loses the
/// key can break this; [`MutexGuard::lost`] tells the holder, and fencing tokens let
/// the protected resource refuse the stale holder.
///
/// `Mutex` is a cheap handle (clone it freely); it holds no lock by itself.
#[derive(Clone, Debug)]
pub struct Mutex {
    shared: Arc<MutexShared>,
}

#[derive(Debug)]
struct MutexShared {
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// `[lock key, meta key]`, shared by every script call of this mutex.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    options: LeaseOptions,
    /// The TTL in milliseconds, as the script argument.
    ttl_arg: Arc<str>,
    /// This client's local queue for the lock (shared by every handle of it).
    local: Arc<LocalLock<HandedLock>>,
}

impl MutexShared {
    fn key(&self) -> &str {
        &self.keys[0]
    }
}

/// What [`Mutex::status`] reports. Never contains the token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MutexStatus {
    /// Whether the lock key exists.
    pub held: bool,
    /// The holder's label (`host:pid` by default); `None` when free or held by a client
    /// other than redlease.
    pub owner: Option<String>,
    /// The holder's remaining lease; `None` when free or when the key has no TTL.
    pub remaining: Option<Duration>,
    /// The holder's fencing token, when known.
    pub fence: Option<FencingToken>,
    /// The highest fencing token issued for this lock within the metadata retention.
    pub last_fence: Option<FencingToken>,
    /// When the holder acquired the lock (Redis server time), when known.
    pub since: Option<SystemTime>,
    /// How many client connections are waiting for the lock (each waiting process
    /// counts once, however many tasks in it wait).
    pub waiters: u64,
}

impl Mutex {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&client.prefix, name)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let key: Arc<str> = keys.key.as_str().into();
        Ok(Mutex {
            shared: Arc::new(MutexShared {
                channel: keys.aux("wake").into(),
                local: client.locals.get(&key),
                keys: Arc::new([key, keys.aux("meta").into()]),
                name: name.into(),
                client,
                options,
                ttl_arg: ttl_ms.to_string().into(),
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

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
    }

    /// Takes the lock if it is free, without waiting. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the request was sent leaves no lock behind: the
    /// attempt's token is compare-and-deleted in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when someone else holds the lock; [`Error::NotReplicated`]
    /// when the lock's [`ReplicaAck`](crate::ReplicaAck) policy releases on a shortfall
    /// and too few replicas acknowledged in time (the lock was released again);
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn try_lock(&self) -> Result<MutexGuard> {
        self.acquire(None).await
    }

    /// Takes the lock, waiting as long as it takes.
    ///
    /// One round trip when the lock is free. Otherwise the task waits for a release to
    /// be announced through Redis, never polling; a missed announcement costs at most
    /// the holder's remaining lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no lock behind (an attempt
    /// that may have reached Redis is compare-and-deleted in the background), and a
    /// wake-up it consumed is passed on to another waiter.
    ///
    /// # Errors
    ///
    /// [`Error::NotReplicated`] as for [`try_lock`](Mutex::try_lock) (the call does not
    /// wait for replicas to come back); [`Error::WrongType`], [`Error::ReadOnly`] or
    /// [`Error::Redis`] when Redis cannot be used (after retrying temporary failures
    /// for the client's retry window).
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire(Some(None)).await
    }

    /// Takes the lock, waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Mutex::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was not acquired in time, and the errors of
    /// [`lock`](Mutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(Some(Some(Instant::now() + timeout))).await
    }

    async fn acquire(&self, wait: Option<Option<Instant>>) -> Result<MutexGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        // Tasks of this client queue locally behind the local holder; one at a time
        // goes to Redis.
        let turn = match s.local.enter(&token, wait.is_none()) {
            None => {
                // Held (or being acquired) by a task of this client: no need to try, but
                // tell the caller how long the lease has left.
                let mut pttl = redis::cmd("PTTL");
                pttl.arg(s.key());
                let remaining = s.client.conn.send(&pttl).await.ok().and_then(|v| ms(int(&v)));
                return Err(Error::Contended {
                    name: s.name.to_string(),
                    remaining,
                });
            }
            Some(Entry::Representative(turn)) => turn,
            Some(Entry::Queued(id, rx)) => match self.wait_locally(id, rx, wait.flatten()).await? {
                Handed::Lock(handed) => {
                    tracing::debug!(lock = %s.name, fence = handed.fence, "lock handed over locally");
                    return Ok(handed.into_guard());
                }
                Handed::Turn(turn) => turn,
            },
        };
        let mut guard = self.acquire_through_redis(token, wait).await?;
        s.local.acquired_through_redis();
        guard.turn = Some(turn);
        Ok(guard)
    }

    /// Waits behind the local holder for a hand-over or the turn to go to Redis.
    async fn wait_locally(
        &self,
        id: u64,
        mut rx: tokio::sync::oneshot::Receiver<Handed<HandedLock>>,
        deadline: Option<Instant>,
    ) -> Result<Handed<HandedLock>> {
        let started = Instant::now();
        let got = match deadline {
            None => (&mut rx).await.ok(),
            Some(d) => tokio::time::timeout_at(d, &mut rx)
                .await
                .ok()
                .and_then(Result::ok),
        };
        match got {
            Some(handed) => Ok(handed),
            None => {
                // Gave up: leave the queue. Whatever was sent meanwhile is dropped with
                // `rx`, which passes it on (a turn) or releases it (a handed lock).
                self.shared.local.leave(id);
                Err(Error::Timeout {
                    name: self.shared.name.to_string(),
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// Acquires through Redis with `token` (as this client's representative).
    async fn acquire_through_redis(&self, token: Token, wait: Option<Option<Instant>>) -> Result<MutexGuard> {
        let s = &*self.shared;
        let cmd = MUTEX_ACQUIRE.evalsha(
            &s.keys,
            &[
                token.expose(),
                &s.ttl_arg,
                &s.client.label,
                &s.client.retention_arg,
            ],
            None,
        );
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            self.release_call(&token),
            s.options.ttl,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &s.channel,
            wait,
            fallback: s.options.ttl,
        };
        let (pending_ref, cmd_ref, token_ref) = (&pending, &cmd, &token);
        let (fence, lease, acked) = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let (reply, acked) = match &s.options.replica_ack {
                None => eval_retrying(
                    &s.client,
                    &s.name,
                    s.key(),
                    "acquire",
                    &MUTEX_ACQUIRE,
                    cmd_ref,
                    deadline,
                    Some(pending_ref),
                )
                .await
                .map(|reply| (reply, None)),
                Some(policy) => eval_acked(
                    &s.client,
                    &s.name,
                    s.key(),
                    "acquire",
                    &MUTEX_ACQUIRE,
                    cmd_ref,
                    policy,
                    deadline,
                    Some(pending_ref),
                )
                .await
                .map(|(reply, n)| (reply, Some(n))),
            }
            .inspect_err(|e| {
                if !e.is_unavailable() {
                    // A definite error reply: the script fails before any write.
                    pending_ref.answered_no();
                }
            })?;
            if let Some(fence) = int(&reply) {
                // The common case: acquired now, for the full TTL.
                return Ok(Attempt::Acquired((
                    fence as u64,
                    self.new_lease(token_ref, sent, s.options.ttl),
                    acked,
                )));
            }
            match array(&reply).unwrap_or_default() {
                [flag, fence, pttl] if int(flag) == Some(1) => {
                    let fence = int(fence).ok_or_else(|| bad_reply(s, "acquire"))? as u64;
                    let remaining = ms(int(pttl)).unwrap_or(s.options.ttl);
                    Ok(Attempt::Acquired((
                        fence,
                        self.new_lease(token_ref, sent, remaining),
                        acked,
                    )))
                }
                [flag, pttl] if int(flag) == Some(0) => {
                    pending_ref.answered_no();
                    Ok(Attempt::Busy {
                        remaining: ms(int(pttl)),
                    })
                }
                _ => Err(bad_reply(s, "acquire")),
            }
        })
        .await?;
        if let (Some(policy), Some(n)) = (&s.options.replica_ack, acked) {
            lease.shared.set_replicas_acked(n);
            if n < policy.replicas {
                tracing::warn!(lock = %s.name, acked = n, wanted = policy.replicas, "too few replicas acknowledged the lock");
                if policy.on_shortfall == OnShortfall::Release {
                    lease.shared.end(LostReason::Released);
                    let call = self.release_call(&token);
                    let released = eval_retrying(
                        &s.client,
                        &s.name,
                        s.key(),
                        "release",
                        call.script,
                        &call.cmd(),
                        None,
                        Some(&pending),
                    )
                    .await;
                    // On failure `pending` stays armed and releases in the background.
                    if released.is_ok() {
                        pending.disarm();
                    }
                    return Err(Error::NotReplicated {
                        name: s.name.to_string(),
                        acked: n,
                        wanted: policy.replicas,
                    });
                }
            }
        }
        pending.disarm();
        tracing::debug!(lock = %s.name, fence, "lock acquired");
        Ok(MutexGuard {
            mutex: self.clone(),
            token: Some(token),
            fence: FencingToken::new(fence),
            lease,
            turn: None,
        })
    }

    fn new_lease(&self, token: &Token, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &MUTEX_EXTEND,
            s.keys.clone(),
            Arc::new([token.shared(), s.client.retention_arg.clone()]),
        );
        let shared = LeaseShared::new(
            s.name.clone(),
            sent,
            s.options.ttl,
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

    /// Ends a holding: hands the lock to the next local waiter when there is one (within
    /// the hand-over budget), else releases it through Redis and passes this client's
    /// turn on.
    async fn finish(
        &self,
        token: Token,
        lease: &Arc<LeaseShared>,
        valid_until: Instant,
        turn: Option<Turn>,
    ) -> Result<()> {
        let s = &*self.shared;
        // A hand-over skips the replica acknowledgement of an acquire, so locks with
        // a replica policy always go through Redis.
        if s.options.replica_ack.is_none()
            && let Some(turn) = turn
        {
            let Some(waiter) = s.local.next_for_handoff() else {
                let released = self.release_through_redis(&token, lease, valid_until).await;
                drop(turn);
                return released;
            };
            let popped = Popped {
                waiter: Some(waiter),
                turn: Some(turn),
                mutex: self.clone(),
            };
            return self.hand_over(&token, lease, popped).await;
        }
        let released = self.release_through_redis(&token, lease, valid_until).await;
        drop(turn);
        released
    }

    /// Moves the lock from `token` to the picked local waiter in one script.
    async fn hand_over(&self, token: &Token, lease: &Arc<LeaseShared>, popped: Popped) -> Result<()> {
        let s = &*self.shared;
        let cmd = MUTEX_HANDOFF.evalsha(
            &s.keys,
            &[
                token.expose(),
                popped.token().expose(),
                &s.ttl_arg,
                &s.client.label,
                &s.client.retention_arg,
            ],
            None,
        );
        // If this future is dropped or fails before Redis answers, our own token is
        // compare-and-deleted in the background (a no-op if the hand-over landed), and
        // `popped` gives the waiter the turn.
        let pending = Pending::new(s.client.clone(), &s.name, lease.release.clone(), lease.ttl());
        pending.arm();
        let sent = Instant::now();
        let reply = eval_retrying(
            &s.client,
            &s.name,
            s.key(),
            "hand over",
            &MUTEX_HANDOFF,
            &cmd,
            None,
            Some(&pending),
        )
        .await?;
        pending.disarm();
        let handed = match (int(&reply), array(&reply).unwrap_or_default()) {
            (Some(fence), _) if fence > 0 => Some((fence as u64, s.options.ttl)),
            (_, [flag, fence, pttl]) if int(flag) == Some(1) => {
                let fence = int(fence).ok_or_else(|| bad_reply(s, "hand over"))? as u64;
                Some((fence, ms(int(pttl)).unwrap_or(s.options.ttl)))
            }
            (Some(0), _) => None,
            _ => return Err(bad_reply(s, "hand over")),
        };
        match handed {
            Some((fence, remaining)) => {
                tracing::debug!(lock = %s.name, fence, "lock handed to a local waiter");
                popped.hand_over(fence, sent, remaining);
                Ok(())
            }
            // Our lease was already gone: the waiter gets the turn and competes in Redis.
            None => Err(Error::NotHeld {
                name: s.name.to_string(),
            }),
        }
    }

    /// Releases through Redis (compare-and-delete and a wake-up).
    async fn release_through_redis(
        &self,
        token: &Token,
        lease: &Arc<LeaseShared>,
        valid_until: Instant,
    ) -> Result<()> {
        let s = &*self.shared;
        let call = lease.release.clone();
        debug_assert_eq!(call.args[0], token.shared());
        // Until Redis answers, a cancelled or failed release must still happen.
        let pending = Pending::new(s.client.clone(), &s.name, call.clone(), lease.ttl());
        pending.arm();
        let sent = Instant::now();
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
            Some(1) => {
                tracing::debug!(lock = %s.name, "lock released");
                Ok(())
            }
            // Free, and we were its last holder: if an earlier attempt of this release
            // may have landed while the lease was still valid, that attempt released it.
            Some(-1) if doubted && sent < valid_until => Ok(()),
            // Held by another token, or free after another holder: if an earlier attempt
            // may have landed and this answer came back while our lease was still valid,
            // our key cannot have expired on the server before this retry ran. As long as
            // Redis kept its writes, that earlier attempt deleted it — and its wake-up
            // let the next holder in before the retry arrived.
            Some(0 | -2) if doubted && answered < valid_until => Ok(()),
            _ => Err(Error::NotHeld {
                name: s.name.to_string(),
            }),
        }
    }

    fn release_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &MUTEX_RELEASE,
            s.keys.clone(),
            Arc::new([token.shared(), s.channel.clone(), s.client.publish.clone()]),
        )
    }

    /// Releases the lock held by `token` (for example a token printed by
    /// `redlease acquire`), and wakes a waiter.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not release the lock; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the token does not hold the lock (nothing is changed),
    /// and Redis errors.
    pub async fn release_token(&self, token: &Token) -> Result<()> {
        let s = &*self.shared;
        let call = self.release_call(token);
        eval_by_token(&s.client, &s.name, s.key(), "release", call.script, &call.cmd()).await
    }

    /// Sets the remaining lease of the lock held by `token` to `ttl`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`], [`Error::NotHeld`] when the token does not hold the lock
    /// (nothing is changed), [`Error::NotReplicated`] as for
    /// [`MutexGuard::extend`], and Redis errors.
    pub async fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        let s = &*self.shared;
        let ttl_ms = keys::ttl_ms(&s.name, ttl)?;
        let (held, acked) = self.send_extend(token, ttl_ms).await?;
        if !held {
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        self.check_replicas(token, acked, None).await
    }

    /// Extends the lease held by `token` to `ttl_ms`, waiting for replicas when the
    /// lock has a policy. Returns whether the token held the lock, and how many
    /// replicas acknowledged.
    async fn send_extend(&self, token: &Token, ttl_ms: u64) -> Result<(bool, Option<u32>)> {
        let s = &*self.shared;
        let cmd = MUTEX_EXTEND.evalsha(&s.keys, &[token.expose(), &s.client.retention_arg], Some(ttl_ms));
        let (reply, acked) = match &s.options.replica_ack {
            None => (
                eval_retrying(
                    &s.client,
                    &s.name,
                    s.key(),
                    "extend",
                    &MUTEX_EXTEND,
                    &cmd,
                    None,
                    None,
                )
                .await?,
                None,
            ),
            Some(policy) => {
                let (reply, n) = eval_acked(
                    &s.client,
                    &s.name,
                    s.key(),
                    "extend",
                    &MUTEX_EXTEND,
                    &cmd,
                    policy,
                    None,
                    None,
                )
                .await?;
                (reply, Some(n))
            }
        };
        Ok((int(&reply) == Some(1), acked))
    }

    /// Applies the replica-ack policy after a successful extend: on a shortfall under
    /// [`OnShortfall::Release`], ends `lease` (if any), releases the lock and fails.
    async fn check_replicas(
        &self,
        token: &Token,
        acked: Option<u32>,
        lease: Option<&LeaseShared>,
    ) -> Result<()> {
        let s = &*self.shared;
        let (Some(policy), Some(n)) = (&s.options.replica_ack, acked) else {
            return Ok(());
        };
        if let Some(lease) = lease {
            lease.set_replicas_acked(n);
        }
        if n >= policy.replicas {
            return Ok(());
        }
        tracing::warn!(lock = %s.name, acked = n, wanted = policy.replicas, "too few replicas acknowledged the extension");
        if policy.on_shortfall == OnShortfall::Proceed {
            return Ok(());
        }
        if let Some(lease) = lease {
            lease.end(LostReason::Released);
        }
        let call = self.release_call(token);
        let released = eval_retrying(
            &s.client,
            &s.name,
            s.key(),
            "release",
            call.script,
            &call.cmd(),
            None,
            None,
        )
        .await;
        if released.is_err() {
            spawn_release(s.client.clone(), s.name.clone(), call, s.options.ttl);
        }
        Err(Error::NotReplicated {
            name: s.name.to_string(),
            acked: n,
            wanted: policy.replicas,
        })
    }

    /// Who holds the lock, for how long, its fencing tokens and how many wait.
    ///
    /// Reads only; never reveals the token.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when the key is not a lock, and Redis errors.
    pub async fn status(&self) -> Result<MutexStatus> {
        let s = &*self.shared;
        let cmd = MUTEX_STATUS.evalsha(&s.keys, &[] as &[&str], None);
        let (reply, waiters) = tokio::join!(
            eval_retrying(
                &s.client,
                &s.name,
                s.key(),
                "status",
                &MUTEX_STATUS,
                &cmd,
                None,
                None
            ),
            s.client.topology.subscribers(&*s.client.conn, &s.channel),
        );
        let reply = reply?;
        let waiters = waiters.unwrap_or(0);
        let items = array(&reply).ok_or_else(|| bad_reply(s, "status"))?;
        let [held, pttl, label, fence, since, last] = items else {
            return Err(bad_reply(s, "status"));
        };
        let fence_of = |v: &redis::Value| opt_string(v).and_then(|x| x.parse().ok()).map(FencingToken::new);
        Ok(MutexStatus {
            held: int(held) == Some(1),
            owner: opt_string(label),
            remaining: ms(int(pttl)),
            fence: fence_of(fence),
            last_fence: fence_of(last),
            since: opt_string(since)
                .and_then(|x| x.parse::<u64>().ok())
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
            waiters: waiters.max(0) as u64,
        })
    }
}

/// A positive millisecond count as a duration.
fn ms(v: Option<i64>) -> Option<Duration> {
    v.filter(|&x| x >= 0).map(|x| Duration::from_millis(x as u64))
}

fn bad_reply(s: &MutexShared, op: &'static str) -> Error {
    Error::Redis {
        name: s.name.to_string(),
        op,
        source: redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply")),
    }
}

/// Proof of holding a [`Mutex`], with its lease and fencing token.
///
/// While the guard lives its lease is renewed automatically (unless the lock was made
/// with `auto_renew(false)`). Check [`is_held`](MutexGuard::is_held) or await
/// [`lost`](MutexGuard::lost) to learn when it can no longer be relied on, and pass
/// [`fence`](MutexGuard::fence) to the resource you protect.
///
/// # Drop
///
/// Dropping the guard without [`release`](MutexGuard::release) stops renewal and
/// releases the lock in the background when a tokio runtime is running; otherwise the
/// lease simply expires after its TTL. Prefer `release().await`: it tells you whether
/// you still held the lock.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct MutexGuard {
    mutex: Mutex,
    token: Option<Token>,
    fence: FencingToken,
    lease: Lease,
    /// This client's turn: passed on (or the lock handed over) when the guard goes.
    turn: Option<Turn>,
}

impl MutexGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.mutex.name()
    }

    /// The lock's Redis key.
    pub fn key(&self) -> &str {
        self.mutex.key()
    }

    /// The mutex this guard holds.
    pub fn mutex(&self) -> &Mutex {
        &self.mutex
    }

    /// The fencing token of this acquisition: strictly greater than that of every
    /// earlier acquisition of the same lock.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The secret token stored in the lock key. Needed only to hand the lock to another
    /// process; never log it.
    pub fn token(&self) -> &Token {
        self.token
            .as_ref()
            .expect("token present until the guard is consumed")
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// How many replicas acknowledged the acquire (or the last [`extend`](Self::extend))
    /// when the lock has a [`ReplicaAck`](crate::ReplicaAck) policy; `None` without one.
    pub fn replicas_acked(&self) -> Option<u32> {
        self.lease.replicas_acked()
    }

    /// Until when the holder may rely on the lock (see [`Lease::valid_until`]).
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

    /// Sets the remaining lease to `ttl`, from now. Auto-renewal (if on) continues with
    /// the new TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the lease was already lost (the
    /// guard then reports [`LostReason::Gone`]); [`Error::NotReplicated`] when the lock
    /// has a [`ReplicaAck`](crate::ReplicaAck) policy that releases on a shortfall and
    /// too few replicas acknowledged the extension (the lock was released and the lease
    /// ended); Redis errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let s = &*self.mutex.shared;
        let ttl_ms = keys::ttl_ms(&s.name, ttl)?;
        if let Some(reason) = self.lease.lost_reason() {
            tracing::debug!(lock = %s.name, %reason, "extend after the lease ended");
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        let sent = Instant::now();
        let (held, acked) = self.mutex.send_extend(self.token(), ttl_ms).await?;
        if !held {
            self.lease.shared.end(LostReason::Gone);
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        let shared = &self.lease.shared;
        shared.set_ttl(ttl);
        shared.confirm(sent, ttl);
        if shared.auto_renew {
            s.client.renewer.schedule(shared);
        }
        self.mutex.check_replicas(self.token(), acked, Some(shared)).await
    }

    /// Releases the lock (compare-and-delete) and wakes a waiter.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already been lost — the protected work may
    /// have overlapped another holder's; Redis errors (the release is then retried in
    /// the background until the lease would have expired).
    pub async fn release(mut self) -> Result<()> {
        let token = self
            .token
            .take()
            .expect("token present until the guard is consumed");
        let lease = self.lease.shared.clone();
        let valid_until = lease.valid_until();
        lease.end(LostReason::Released);
        let turn = self.turn.take();
        self.mutex.finish(token, &lease, valid_until, turn).await
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out or someone releases it with the returned token.
    pub fn forget(mut self) -> Token {
        self.lease.shared.end(LostReason::Released);
        // Local waiters get their turn: they will find the lock held until it expires.
        drop(self.turn.take());
        self.token
            .take()
            .expect("token present until the guard is consumed")
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let lease = self.lease.shared.clone();
            let valid_until = lease.valid_until();
            lease.end(LostReason::Released);
            let turn = self.turn.take();
            let mutex = self.mutex.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        let _ = mutex.finish(token, &lease, valid_until, turn).await;
                    });
                }
                Err(_) => {
                    tracing::debug!(lock = %mutex.name(), "no runtime to release in; the lease will expire");
                    drop(turn);
                }
            }
        }
    }
}

/// A lock handed over by a local holder, on its way to the waiter it was moved to.
/// Dropped unclaimed (the waiter has gone), it becomes a guard and is dropped: released,
/// or handed on to the next local waiter.
pub(crate) struct HandedLock {
    mutex: Mutex,
    token: Token,
    fence: u64,
    sent: Instant,
    remaining: Duration,
    turn: Option<Turn>,
}

impl HandedLock {
    fn into_guard(mut self) -> MutexGuard {
        let turn = self.turn.take();
        MutexGuard {
            lease: self.mutex.new_lease(&self.token, self.sent, self.remaining),
            mutex: self.mutex.clone(),
            token: Some(self.token.clone()),
            fence: FencingToken::new(self.fence),
            turn,
        }
    }
}

impl Drop for HandedLock {
    fn drop(&mut self) {
        if let Some(turn) = self.turn.take() {
            let guard = HandedLock {
                mutex: self.mutex.clone(),
                token: self.token.clone(),
                fence: self.fence,
                sent: self.sent,
                remaining: self.remaining,
                turn: Some(turn),
            }
            .into_guard();
            drop(guard);
        }
    }
}

/// A local waiter picked for a hand-over that is under way. If the hand-over does not
/// complete (the script failed, or the releasing future was dropped), the waiter gets
/// the turn instead and acquires through Redis with its own token — which also
/// recognises a hand-over that did land. If the waiter has gone too, a hand-over that
/// may have landed on its token is compare-and-deleted.
struct Popped {
    waiter: Option<Waiter<HandedLock>>,
    turn: Option<Turn>,
    mutex: Mutex,
}

impl Popped {
    fn token(&self) -> &Token {
        &self.waiter.as_ref().expect("present until consumed").token
    }

    fn hand_over(mut self, fence: u64, sent: Instant, remaining: Duration) {
        let waiter = self.waiter.take().expect("present until consumed");
        let handed = HandedLock {
            mutex: self.mutex.clone(),
            token: waiter.token.clone(),
            fence,
            sent,
            remaining,
            turn: self.turn.take(),
        };
        // A waiter that has gone drops the value it is given back: released.
        let _ = waiter.send(Handed::Lock(handed));
    }
}

impl Drop for Popped {
    fn drop(&mut self) {
        if let (Some(waiter), Some(turn)) = (self.waiter.take(), self.turn.take()) {
            let token = waiter.token.clone();
            if waiter.send(Handed::Turn(turn)).is_err() {
                let s = &self.mutex.shared;
                spawn_release(
                    s.client.clone(),
                    s.name.clone(),
                    self.mutex.release_call(&token),
                    s.options.ttl,
                );
            }
        }
    }
}
