//! The plain distributed mutex, and its local queue (`local`): tasks of one client
//! line up locally and get the lock handed over in one script.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::engine::acquire::{Acquire, Busy, Granted, Reply, grant_claim, register_life, still_reliable};
use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait, later};
use crate::engine::guard::{GuardCore, Held, LockBase, guard_surface};
use crate::engine::heartbeat::waiter_id;
use crate::engine::metrics::{AcquireCall, Handover, Primitive, handed_over};
use crate::engine::request::spawn_release;
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::LeaseOptions;
use crate::script::reply::{array, holder, int, ms};
use crate::script::{MUTEX_ACQUIRE, MUTEX_EXTEND, MUTEX_HANDOFF, MUTEX_RELEASE, MUTEX_STATUS, ScriptCall};
use crate::token::{FencingToken, Token};

mod local;

use local::{Entry, Handed, LocalLock, Turn, Waiter};

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
    base: LockBase,
    /// `[lock key, fencing counter, its floor, waiters]`: acquire and release.
    keys: Arc<[Arc<str>]>,
    /// `[lock key, fencing counter, its floor]`: hand-over and status (made at first
    /// use: most handles never need it).
    fence_keys: std::sync::OnceLock<Arc<[Arc<str>]>>,
    /// The wake-up channel, `{<lock key>}:wake` (made at first use: a free lock never
    /// needs it).
    channel: std::sync::OnceLock<Arc<str>>,
    /// The TTL in milliseconds, as the script argument.
    ttl_arg: Arc<str>,
    /// How long a lock handed to a task of this handle holds before it extends it
    /// (see [`grant_claim`]), as the script argument.
    claim_arg: Arc<str>,
    /// The release's hand-over argument: `PUBLISH` or `SPUBLISH`, and how long a lock
    /// handed to a waiter holds before it extends it (see [`grant_claim`]).
    handover_arg: Arc<str>,
    /// How long a waiter's registration lives without a new attempt, as the script
    /// argument.
    register_arg: Arc<str>,
    /// This client's local queue for the lock (shared by every handle of it).
    local: Arc<LocalLock<HandedLock, Mutex>>,
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
    /// The holder's fencing token, when known. (The plain mutex does not record it:
    /// see `last_fence`.)
    pub fence: Option<FencingToken>,
    /// A fencing token at least as high as every one issued so far for this lock,
    /// and below every one issued later: the fencing mark of the lock's hash slot
    /// (which the locks sharing the slot share). `None` when no lock of the slot was
    /// taken for a day.
    pub last_fence: Option<FencingToken>,
    /// When the holder acquired the lock (Redis server time), when known. (Not
    /// recorded for the plain mutex.)
    pub since: Option<std::time::SystemTime>,
    /// How many client connections are waiting for the lock (each waiting process
    /// counts once, however many tasks in it wait).
    pub waiters: u64,
}

impl Mutex {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let base = LockBase::new(ctx, Primitive::Mutex, name, &keys.key, options)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let [counter, floor] = base.ctx.fence_keys.of(&keys);
        let millis = &base.ctx.millis;

        Ok(Mutex {
            shared: Arc::new(MutexShared {
                channel: std::sync::OnceLock::new(),
                local: base.ctx.locals.get(&base.key),
                keys: Arc::new([base.key.clone(), counter, floor, keys.aux_shared("q")]),
                fence_keys: std::sync::OnceLock::new(),
                ttl_arg: millis.arg(ttl_ms),
                claim_arg: millis.arg(grant_claim(options.ttl).as_millis() as u64),
                handover_arg: base.ctx.handover.arg(grant_claim(options.ttl).as_millis() as u64),
                register_arg: millis.arg(register_life(options.ttl).as_millis() as u64),
                base,
            }),
        })
    }

    /// `[lock key, fencing counter, its floor]`.
    fn fence_keys(&self) -> &Arc<[Arc<str>]> {
        let s = &*self.shared;
        s.fence_keys.get_or_init(|| Arc::from(&s.keys[..3]))
    }

    /// The wake-up channel: the waiters' key `{<lock key>}:q` with `wake` for its `q`.
    fn channel(&self) -> &Arc<str> {
        let s = &*self.shared;
        s.channel.get_or_init(|| {
            let waiters = &s.keys[3];
            keys::shared_concat(&[&waiters[..waiters.len() - 1], "wake"])
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

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.base.options
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
    /// [`Error::Contended`] when someone else holds the lock (or a task of this client
    /// holds or is acquiring it); [`Error::NotReplicated`] when the lock's
    /// [`ReplicaAck`](crate::ReplicaAck) policy releases on a shortfall and too few
    /// replicas acknowledged in time (the lock was released again);
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn try_lock(&self) -> Result<MutexGuard> {
        self.acquire(Wait::Try).await
    }

    /// Takes the lock, waiting as long as it takes.
    ///
    /// One round trip when the lock is free. Otherwise the task waits for a release to
    /// be announced through Redis, never polling; a missed announcement costs at most
    /// the holder's remaining lease. Tasks of this client queue locally behind the
    /// local holder, and are bounded by its lease in the same way.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no lock behind (an attempt
    /// that may have reached Redis is compare-and-deleted in the background), and a
    /// wake-up it consumed is passed on to another waiter.
    ///
    /// A future that is neither polled nor dropped (its task stalled): a lock or a turn
    /// another task of this client handed it is taken back after the claim window
    /// (the lease, at most 2 s — but a lock handed to a task of a handle without
    /// automatic renewal holds for that handle's whole lease, and is taken back only
    /// then), and the tasks queued behind it move on. One that is
    /// itself acquiring through Redis keeps this client's place until it is polled or
    /// dropped, as a pending `tokio::sync::Mutex::lock()` keeps its place.
    ///
    /// # Errors
    ///
    /// [`Error::NotReplicated`] as for [`try_lock`](Mutex::try_lock) (the call does not
    /// wait for replicas to come back); [`Error::WrongType`], [`Error::ReadOnly`] or
    /// [`Error::Redis`] when Redis cannot be used (after retrying temporary failures
    /// for the client's retry window).
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire(Wait::FOREVER).await
    }

    /// Takes the lock, waiting at most `timeout` — which bounds the whole call, a
    /// request already in flight included (each request is still given at least 250 ms
    /// to answer, so a zero timeout takes a free lock). A timeout of a century or more
    /// (such as `Duration::MAX`) waits as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Mutex::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was still held by someone else at the
    /// deadline; [`Error::Redis`] (with [`is_unavailable`](Error::is_unavailable)) when
    /// Redis had not answered by then; and the errors of [`lock`](Mutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire(Wait::timeout(timeout)).await
    }

    /// Acquires as `wait` says, counting the call in the metrics.
    async fn acquire(&self, wait: Wait) -> Result<MutexGuard> {
        let call = AcquireCall::start(Primitive::Mutex);
        let started = call.started();
        call.finish(self.acquire_uncounted(wait, started).await)
    }

    /// Acquires as `wait` says, for a call that started at `started`.
    async fn acquire_uncounted(&self, wait: Wait, started: Instant) -> Result<MutexGuard> {
        let s = &*self.shared;
        let mut token = Token::for_owner(&s.base.ctx.label);
        // Tasks of this client queue locally behind the local holder; one at a time
        // goes to Redis. A hand-over gives a waiter the lease its own handle asks for (its
        // claim window at first, which its renewal extends).
        let claim = grant_claim(s.base.options.ttl);
        let turn = match s.local.enter(&token, !wait.waits(), claim, || self.clone()) {
            Entry::Busy => {
                // Held (or being acquired) by a task of this client: no need to try, but
                // tell the caller how long the lease has left.
                let mut pttl = redis::cmd("PTTL");
                pttl.arg(&*s.base.key);
                let remaining = s.base.ctx.conn.send(&pttl).await.ok().and_then(|v| ms(int(&v)));
                return Err(Error::Contended {
                    name: s.base.name.to_string(),
                    remaining,
                });
            }
            Entry::Representative(turn) => Some(turn),
            Entry::Queued(mut queued) => {
                // Waits for a hand-over or the turn — and looks every claim window
                // whether the lock was handed to a task of this client that has not
                // taken it up (its future is not polled) and lapsed in Redis: the turn
                // is then revoked and passed on.
                let mut picked = false;
                loop {
                    let bound = Deadline::after(claim).min(wait.deadline());
                    match s.local.wait(&mut queued, bound).await {
                        Some(Handed::Lock(handed)) => match handed.if_reliable() {
                            Ok(guard) => {
                                tracing::debug!(lock = %s.base.name, fence = guard.fence.get(), "lock handed over locally");
                                return Ok(guard);
                            }
                            // Taken up too late (the task was not polled): ask Redis,
                            // with the token the lock was handed to.
                            Err(turn) => {
                                s.local.taken_up(&turn);
                                break Some(turn);
                            }
                        },
                        Some(Handed::Turn(turn)) => {
                            s.local.taken_up(&turn);
                            break Some(turn);
                        }
                        None if wait.deadline().passed() => {
                            // Gave up: leave the queue. Whatever was sent meanwhile is
                            // dropped with `queued`, which passes it on (a turn) or
                            // releases it (a lock).
                            s.local.leave(queued.id);
                            return Err(Error::Timeout {
                                name: s.base.name.to_string(),
                                waited: started.elapsed(),
                            });
                        }
                        None => {
                            s.local.look();
                            // Picked for a hand-over under way onto our token, and still
                            // nothing a claim window later: the releasing task has
                            // stalled (its future is not polled). To Redis with a fresh
                            // token, taking over the turn the stalled hand-over carries
                            // (the tasks behind wait for this one, not for the stalled
                            // release); a hand-over that still lands on the old token
                            // comes to nobody here, and is released.
                            let out = !s.local.is_queued(queued.id);
                            if picked && out {
                                let turn = s.local.take_over(queued.id);
                                drop(queued);
                                token = Token::for_owner(&s.base.ctx.label);
                                break turn;
                            }
                            picked = out;
                        }
                    }
                }
            }
        };
        let core = self.acquire_through_redis(token, wait).await?;
        if turn.is_some() {
            s.local.acquired_through_redis();
        }
        Ok(self.guard(core, turn))
    }

    /// The guard of a holding, with this client's turn.
    fn guard(&self, core: GuardCore, turn: Option<Turn>) -> MutexGuard {
        if let Some(turn) = &turn {
            self.shared.local.hold(turn, core.lease());
        }
        MutexGuard {
            fence: core.fence().unwrap_or(FencingToken::new(0)),
            core: Some(core),
            mutex: self.clone(),
            turn,
        }
    }

    /// Acquires through Redis with `token` (as this client's representative).
    async fn acquire_through_redis(&self, token: Token, wait: Wait) -> Result<GuardCore> {
        // A free lock first, without a script.
        let pending = match self.acquire_free(&token, wait.deadline()).await? {
            Free::Acquired(core) => return Ok(core),
            Free::Not(pending) => pending,
        };
        // Boxed: the script's future is large, and a free lock never needs it — the
        // future of every `lock()` would otherwise be sized (and moved) for it.
        let core = Box::pin(self.acquire_scripted(token, wait)).await?;
        if let Some(claim) = pending {
            claim.disarm();
        }
        Ok(core)
    }

    /// Takes the lock if it is free in one round trip without a script: `SET NX PX` and
    /// `INCR` of the fencing counter, pipelined. The fencing token is as good as one
    /// issued by a script: the INCR runs after the SET that took the lock (same
    /// connection, in order) and before the release that frees it (sent after the
    /// reply), so tokens rise with the acquisitions. Anything else — the lock is taken
    /// (or is ours already: a retry after a lost reply), the counter must be started
    /// (see `mark.lua`) — is left to the acquire script, which answers it in full. On a
    /// Redis Cluster, where a slot migration can split the two commands between nodes,
    /// and under a replica policy, the script does it all.
    ///
    /// `Free::Not` carries the claim on a lock an attempt may have taken, for the
    /// caller to keep until the script acquired (it then disarms it) or gave up (then
    /// dropping it releases the lock in the background).
    async fn acquire_free(&self, token: &Token, deadline: Deadline) -> Result<Free> {
        let s = &*self.shared;
        if s.base.ctx.topology.is_cluster() || s.base.options.replica_ack.is_some() {
            return Ok(Free::Not(None));
        }
        let (key, counter) = (&s.keys[0], &s.keys[1]);
        // Sized up front, so that building the pipeline allocates once per command.
        let mut set = redis::Cmd::with_capacity(6, key.len() + token.expose().len() + s.ttl_arg.len() + 16);
        set.arg("SET")
            .arg(&**key)
            .arg(token.expose())
            .arg("NX")
            .arg("PX")
            .arg(&*s.ttl_arg);
        let mut incr = redis::Cmd::with_capacity(2, counter.len() + 4);
        incr.arg("INCR").arg(&**counter);
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.add_command(set).add_command(incr);
        let release = self.release_call(token);
        let claim = s.base.claim(release.clone());
        claim.arm();
        let op = s.base.op("acquire");
        let conn = &*s.base.ctx.conn;
        let (replies, sent) = op
            .retrying(deadline, Some(&claim), || conn.send_pipeline(&pipe))
            .await?;
        let [set, incr] = &replies[..] else {
            return Err(op.bad_reply());
        };
        let taken = match set {
            Ok(Value::Nil) => false,
            Ok(Value::Okay) => true,
            Ok(Value::SimpleString(ok)) if ok == "OK" => true,
            Ok(_) => return Err(op.bad_reply()),
            Err(e) => return Err(op.error(e.clone())),
        };
        if !taken {
            // Held by someone else (or by us: a retried SET after a lost reply).
            claim.answered_no();
            return Ok(Free::Not(Some(claim)));
        }
        let fence = match incr {
            Ok(v) => int(v).and_then(|f| u64::try_from(f).ok()),
            Err(e) => {
                // A counter key of another type: give the lock back at once.
                let _ = op.call(&release, deadline, None).await;
                claim.disarm();
                return Err(op.error(e.clone()));
            }
        };
        match fence {
            Some(fence) if fence > SEEDED => {
                let core = s.base.hold(Held {
                    token: token.clone(),
                    fence: Some(fence),
                    sent,
                    remaining: s.base.options.ttl,
                    renew: renew_call(&release),
                    release,
                });
                claim.disarm();
                tracing::debug!(lock = %s.base.name, fence, "acquired");
                Ok(Free::Acquired(core))
            }
            // Ours, but the counter is not seeded yet: the script seeds it and gives us
            // a fencing token.
            _ => Ok(Free::Not(Some(claim))),
        }
    }

    /// Acquires through Redis with the acquire script.
    async fn acquire_scripted(&self, token: Token, wait: Wait) -> Result<GuardCore> {
        let s = &*self.shared;
        // Waiters register, so that a release wakes them: for a hand-over (kind ' '),
        // unless the lock waits for replicas, which a hand-over would skip; then only to
        // be woken (kind '!').
        let waits = wait.waits();
        let grants = waits && s.base.options.replica_ack.is_none();
        let id = waiter_id();
        let id_kind = format!("{id}{}", if grants { ' ' } else { '!' });
        let cmd = MUTEX_ACQUIRE.evalsha(
            &s.keys,
            &[
                token.expose(),
                &s.ttl_arg,
                &id_kind,
                if waits { "1" } else { "0" },
                &s.register_arg,
            ],
            None,
        );
        let registration: Arc<str> = format!("{id_kind}{}", token.expose()).into();
        let release = self.release_call(&token);
        let spec = Acquire {
            script: &MUTEX_ACQUIRE,
            cmd: &cmd,
            channel: self.channel(),
            wait,
            // Gives back a lock an attempt may have taken (or was handed), and leaves
            // the registration.
            undo: self.release_call_leaving(&token, registration),
            renew: renew_call(&release),
            release,
            token,
            grant: grants.then(|| Granted {
                id: &id,
                claim: grant_claim(s.base.options.ttl),
            }),
        };
        let ttl = s.base.options.ttl;
        s.base
            .acquire_step(spec, |reply, _| {
                let parsed = parse_acquire(reply, ttl, &s.base)?;
                Ok(match parsed {
                    // A waiter left a registration behind: undo removes it.
                    Reply::Busy { busy, .. } => Reply::Busy { busy, queued: waits },
                    acquired => acquired,
                })
            })
            .await
    }

    fn release_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        let args = Arc::new([token.shared(), s.handover_arg.clone()]);
        ScriptCall::new(&MUTEX_RELEASE, s.keys.clone(), args)
    }

    /// The release call that also leaves `registration` (a waiter that gives up).
    fn release_call_leaving(&self, token: &Token, registration: Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        let args = Arc::new([token.shared(), s.handover_arg.clone(), registration]);
        ScriptCall::new(&MUTEX_RELEASE, s.keys.clone(), args)
    }

    /// Ends a holding: hands the lock to the next local waiter when there is one (within
    /// the hand-over budget), else releases it through Redis and passes this client's
    /// turn on.
    async fn finish(&self, core: GuardCore, turn: Option<Turn>) -> Result<()> {
        let s = &*self.shared;
        // A hand-over skips the replica acknowledgement of an acquire, so locks with
        // a replica policy always go through Redis.
        let waiter = match &turn {
            // Nor to a waiter whose handle has a replica policy: it gets the turn, and
            // acquires through Redis, acknowledged.
            Some(turn) if s.base.options.replica_ack.is_none() => s
                .local
                .next_for_handoff(turn, |m: &Mutex| m.shared.base.options.replica_ack.is_none()),
            _ => None,
        };
        let Some(waiter) = waiter else {
            let released = core.release().await;
            drop(turn);
            return released;
        };
        let popped = Popped {
            waiter: Some(waiter),
            turn,
            mutex: self.clone(),
        };
        // Boxed for the same reason as the acquire script: most releases do not hand over.
        Box::pin(self.hand_over(core, popped)).await
    }

    /// Moves the lock from `core`'s token to the picked local waiter in one script.
    async fn hand_over(&self, core: GuardCore, popped: Popped) -> Result<()> {
        let s = &*self.shared;
        let release = self.release_call(core.token());
        let (token, _) = core.take();
        // The lock holds for the waiter's claim window, as a lock a release hands to a
        // waiter in Redis does: a waiter whose task is not polled holds it up no longer
        // than that; one that takes it up renews it within a third of it. (Without
        // automatic renewal nobody would: then for the waiter's whole lease.)
        let (lease, lease_arg) = popped.lease();
        let cmd = MUTEX_HANDOFF.evalsha(
            self.fence_keys(),
            &[token.expose(), popped.token().expose(), lease_arg],
            None,
        );
        // If this future is dropped or fails before Redis answers, our own token is
        // compare-and-deleted in the background (a no-op if the hand-over landed), and
        // `popped` gives the waiter the turn.
        let claim = s.base.claim(release);
        claim.arm();
        let op = s.base.op("hand over");
        let (reply, sent) = op
            .eval_sent(&MUTEX_HANDOFF, &cmd, Deadline::Never, Some(&claim))
            .await?;
        claim.disarm();
        match parse_acquire(&reply, lease, &s.base) {
            Ok(Reply::Acquired { fence, remaining }) => {
                handed_over(Primitive::Mutex, Handover::Local);
                tracing::debug!(lock = %s.base.name, ?fence, "lock handed to a local waiter");
                popped.hand_over(fence.unwrap_or(0), sent, remaining);
                Ok(())
            }
            // Our lease was already gone: the waiter gets the turn and competes in Redis.
            Ok(Reply::Busy { .. }) => Err(op.not_held()),
            Err(e) => Err(e),
        }
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
        let call = self.release_call(token);
        self.shared
            .base
            .by_token("release", &call.cmd(), call.script, None)
            .await
    }

    /// Makes the lease of the lock held by `token` last at least `ttl` from now (it is
    /// never shortened).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`], [`Error::InvalidArgument`] when the lock's replica policy
    /// waits longer than half of `ttl` (nothing is sent), [`Error::NotHeld`] when the
    /// token does not hold the lock (nothing is changed), [`Error::NotReplicated`] as
    /// for [`MutexGuard::extend`], and Redis errors.
    pub async fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        let s = &*self.shared;
        let ttl_ms = s.base.ttl_ms(ttl)?;
        let release = self.release_call(token);
        let call = renew_call(&release);
        s.base
            .by_token("extend", &call.cmd_with_ttl(ttl_ms), call.script, Some(&release))
            .await
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
        let cmd = MUTEX_STATUS.evalsha(self.fence_keys(), &[] as &[&str], None);
        let (items, waiters) = s.base.status(&MUTEX_STATUS, &cmd, Some(self.channel())).await?;
        let h = holder(&items).ok_or_else(|| s.base.op("status").bad_reply())?;
        Ok(MutexStatus {
            held: h.held,
            owner: h.owner,
            remaining: h.remaining,
            fence: h.fence,
            last_fence: h.last_fence,
            since: h.since,
            waiters,
        })
    }
}

/// The renewal (and extend) call of the holding that `release` releases: its first key,
/// the lock key, and its first argument, the token, shared with the release call.
/// (During a slot migration a script naming a key that does not exist is refused with
/// TRYAGAIN: the calls that must keep working then — renewals — name only the key that
/// exists while the lock is held.)
fn renew_call(release: &ScriptCall) -> ScriptCall {
    release.leading(&MUTEX_EXTEND, 1, 1)
}

/// Every fencing token is above this (2^50): a counter below it was made by a pipelined
/// `INCR` and still has to be started (see `mark.lua`).
const SEEDED: u64 = 1 << 50;

/// What [`Mutex::acquire_free`] found.
enum Free {
    Acquired(GuardCore),
    /// Not acquired without the script, with the claim on what the attempt may have
    /// left behind.
    Not(Option<crate::engine::request::Claim>),
}

/// Reads the reply of `mutex_acquire.lua` (and `mutex_handoff.lua`, whose replies have
/// the same shapes, and `0` for "the old token does not hold the lock"). The fencing
/// mark of a busy reply is a decimal string.
fn parse_acquire(reply: &Value, ttl: Duration, base: &LockBase) -> Result<Reply> {
    if let Some(acquired) = Reply::acquired(reply, ttl, true) {
        return Ok(acquired);
    }
    match array(reply).unwrap_or_default() {
        [flag, pttl] if int(flag) == Some(0) => Ok(Reply::busy(ms(int(pttl)))),
        [flag, pttl, mark, foreign] if int(flag) == Some(0) => Ok(Reply::Busy {
            busy: Busy {
                remaining: ms(int(pttl)),
                pass_on: false,
                mark: int(mark).and_then(|m| u64::try_from(m).ok()),
                foreign: int(foreign) == Some(1),
            },
            queued: false,
        }),
        _ if int(reply) == Some(0) => Ok(Reply::busy(None)),
        _ => Err(base.op("acquire").bad_reply()),
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
    /// `None` once consumed by `release` or `forget`.
    core: Option<GuardCore>,
    fence: FencingToken,
    mutex: Mutex,
    /// This client's turn: passed on (or the lock handed over) when the guard goes.
    turn: Option<Turn>,
}

guard_surface!(MutexGuard, "this guard holds", fence: |g| Some(g.fence));

impl MutexGuard {
    /// The mutex this guard holds.
    pub fn mutex(&self) -> &Mutex {
        &self.mutex
    }

    /// The fencing token of this acquisition: strictly greater than that of every
    /// earlier acquisition of the same lock.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// Releases the lock (compare-and-delete) and wakes a waiter — or, when a task of
    /// this client waits for it, hands it to that task in one script.
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
        let core = self.core.take().expect("present until the guard is consumed");
        let turn = self.turn.take();
        self.mutex.finish(core, turn).await
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out or someone releases it with the returned token.
    pub fn forget(mut self) -> Token {
        // Local waiters get their turn: they will find the lock held until it expires.
        drop(self.turn.take());
        self.core
            .take()
            .expect("present until the guard is consumed")
            .forget()
    }

    fn core(&self) -> &GuardCore {
        self.core.as_ref().expect("present until the guard is consumed")
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        let Some(core) = self.core.take() else {
            return;
        };
        let turn = self.turn.take();
        core.state().end(crate::engine::lease::LostReason::Released);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let mutex = self.mutex.clone();
                runtime.spawn(async move {
                    let _ = mutex.finish(core, turn).await;
                });
            }
            Err(_) => {
                tracing::debug!(lock = %self.mutex.name(), "no runtime to release in; the lease will expire");
                drop(turn);
                drop(core);
            }
        }
    }
}

/// A lock handed over by a local holder, on its way to the waiter it was moved to.
/// Dropped unclaimed (the waiter has gone), it becomes a guard and is dropped: released,
/// or handed on to the next local waiter.
pub(crate) struct HandedLock {
    mutex: Mutex,
    token: Option<Token>,
    fence: u64,
    sent: Instant,
    remaining: Duration,
    turn: Option<Turn>,
    /// The hand-over is confirmed. When not (its reply never came), the lock may or may
    /// not be on the waiter's token: the waiter asks Redis — or, if it has gone, the
    /// token is compare-and-deleted.
    landed: bool,
}

impl HandedLock {
    /// The guard, if the hand-over can still be relied on without a round trip; else
    /// the turn (the lock may still be on the waiter's token: its own acquire through
    /// Redis finds it there, with a full lease).
    fn if_reliable(mut self) -> std::result::Result<MutexGuard, Turn> {
        let ttl = self.mutex.shared.base.options.ttl;
        if self.landed && still_reliable(self.sent, self.remaining, ttl) {
            return Ok(self.into_guard());
        }
        self.token = None;
        Err(self.turn.take().expect("a hand-over carries the turn"))
    }

    fn into_guard(mut self) -> MutexGuard {
        let m = &self.mutex;
        let token = self.token.take().expect("present until consumed");
        let release = m.release_call(&token);
        let core = m.shared.base.hold(Held {
            fence: Some(self.fence),
            sent: self.sent,
            remaining: self.remaining,
            renew: renew_call(&release),
            release,
            token,
        });
        let turn = self.turn.take();
        m.guard(core, turn)
    }
}

impl Drop for HandedLock {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if !self.landed {
            // Whatever may have landed on the token is given back; then the turn passes on.
            let s = &self.mutex.shared;
            spawn_release(
                s.base.ctx.clone(),
                s.base.name.clone(),
                self.mutex.release_call(&token),
                s.base.options.ttl,
            );
            drop(self.turn.take());
            return;
        }
        let handed = HandedLock {
            mutex: self.mutex.clone(),
            token: Some(token),
            fence: self.fence,
            sent: self.sent,
            remaining: self.remaining,
            turn: self.turn.take(),
            landed: true,
        };
        drop(handed.into_guard());
    }
}

/// A local waiter picked for a hand-over that is under way. If the hand-over does not
/// complete (the script failed, or the releasing future was dropped), the waiter gets
/// the turn instead and acquires through Redis with its own token — which also
/// recognises a hand-over that did land. If the waiter has gone too, a hand-over that
/// may have landed on its token is compare-and-deleted.
struct Popped {
    waiter: Option<Waiter<HandedLock, Mutex>>,
    turn: Option<Turn>,
    mutex: Mutex,
}

impl Popped {
    fn token(&self) -> &Token {
        &self.waiter.as_ref().expect("present until consumed").token
    }

    fn waiter(&self) -> &Waiter<HandedLock, Mutex> {
        self.waiter.as_ref().expect("present until consumed")
    }

    /// What a hand-over gives the waiter before it extends the lock: its claim window
    /// (its whole lease when it does not renew automatically), and that as the script
    /// argument.
    fn lease(&self) -> (Duration, &str) {
        let next = &self.waiter().handle.shared;
        if next.base.options.auto_renew {
            (grant_claim(next.base.options.ttl), &next.claim_arg)
        } else {
            (next.base.options.ttl, &next.ttl_arg)
        }
    }

    fn hand_over(mut self, fence: u64, sent: Instant, remaining: Duration) {
        let waiter = self.waiter.take().expect("present until consumed");
        if let Some(turn) = &self.turn {
            // Until the waiter takes it up; if it does not in time, its turn is revoked.
            self.mutex.shared.local.handed_over(turn, later(sent, remaining));
        }
        let handed = HandedLock {
            // The guard is the waiter's: its handle's lease and options.
            mutex: waiter.handle.clone(),
            token: Some(waiter.token.clone()),
            fence,
            sent,
            remaining,
            turn: self.turn.take(),
            landed: true,
        };
        // A waiter that has gone drops the value it is given back: released.
        let _ = waiter.send(Handed::Lock(handed));
    }
}

impl Drop for Popped {
    fn drop(&mut self) {
        let Some(waiter) = self.waiter.take() else {
            return;
        };
        // The hand-over may have landed on the waiter's token: the waiter is given the
        // turn with the duty to find out (its acquire through Redis recognises the lock
        // as its own); dropped unclaimed — the waiter has gone, now or before it takes
        // it up — the token is compare-and-deleted and the turn passed on.
        if let Some(turn) = &self.turn {
            // Until the waiter takes it up; if it does not in time (its task is not
            // polled), its turn is revoked.
            let grace = grant_claim(waiter.handle.shared.base.options.ttl);
            self.mutex
                .shared
                .local
                .handed_over(turn, later(Instant::now(), grace));
        }
        let handed = HandedLock {
            mutex: waiter.handle.clone(),
            token: Some(waiter.token.clone()),
            fence: 0,
            sent: Instant::now(),
            remaining: Duration::ZERO,
            turn: self.turn.take(),
            landed: false,
        };
        let _ = waiter.send(Handed::Lock(handed));
    }
}
