//! The semaphore: N permits per name, each a lease that expires when its holder stops
//! renewing it; and its local queue (`local`): tasks of one client that want the same
//! permits line up behind the one that waits in Redis and get permits handed over in one
//! script.

mod local;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::acquire::{Acquire, Busy, Granted, Reply, grant_claim, register_life, still_reliable};
use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait};
use crate::engine::guard::{GuardCore, Held, LockBase, guard_surface};
use crate::engine::heartbeat::waiter_id;
use crate::engine::lease::LostReason;
use crate::engine::metrics::{AcquireCall, Handover, Primitive, handed_over};
use crate::engine::request::spawn_release;
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::LeaseOptions;
use crate::script::reply::{array, int, ms, opt_string};
use crate::script::{SEM_ACQUIRE, SEM_EXTEND, SEM_HANDOFF, SEM_RELEASE, SEM_STATUS, ScriptCall};
use crate::token::Token;
use local::{Entry, Handed, InRedis, LocalSemaphore, Request, Turn, Waiter};

/// The largest permit limit a semaphore accepts.
pub const MAX_PERMITS: u32 = 1_000_000;
/// The most permits one acquisition may take at once.
pub const MAX_PERMITS_PER_ACQUIRE: u32 = 1024;

/// A distributed counting semaphore: at most `limit` permits of one name are held at a
/// time, across every process.
///
/// The permits live in one sorted set at `<prefix><name>`: one member per held permit,
/// scored with its lease deadline on Redis's clock. An acquisition of `n` permits is one
/// [`Permit`] guard with its own token and lease, renewed automatically; every script
/// prunes permits whose deadline passed, so the permits of a holder that crashed, hung
/// or lost its network come back within their TTL — they never leak.
///
/// # Policy
///
/// Not fair: a request for many permits can be overtaken by requests for fewer. A
/// waiter that finds too few permits free registers; a release hands the permits it
/// frees straight to registered waiters that fit in them (the earliest registered
/// first), and tells each — only it, on a channel of its client's — so the waiter
/// holds its permits when the message arrives, without a request of its own. Nobody
/// polls: a waiter also looks again when the earliest held permit would lapse (its
/// holder may have died), and at least every half of its registration's life.
///
/// Tasks of one client that wait for the same number of permits under the same limit
/// do not all register: one waits in Redis, the others queue in the client, and permits
/// released by a task of the client go to the first of them in one request — moved to
/// that task's own token with a fresh lease, so nobody can slip in between — up to 16
/// times in a row; then they go back through Redis so that other processes get their
/// turn.
///
/// # The limit
///
/// The limit is the caller's: every handle names it ([`Client::semaphore`](crate::Client::semaphore)).
/// While any permit is held, it is fixed: a caller with a different limit gets
/// [`Error::LimitMismatch`] and changes nothing. When no permit is held, the next
/// acquisition's limit becomes the limit — to change it, let every holder of the old
/// limit finish, or use a new name.
///
/// # Failure model
///
/// At most `limit` permits are held at once while leases are valid and Redis keeps its
/// writes. A holder paused past its lease (or cut off from Redis) may still be running
/// when its permit has been given to someone else; [`Permit::lost`] tells it, when it
/// wakes, that it must stop.
///
/// `Semaphore` is a cheap handle (clone it freely); it holds no permit by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
/// // At most 3 concurrent exports across the fleet.
/// let exports = client.semaphore("exports", 3)?;
/// let permit = exports.acquire().await?;
/// // ... run one export ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    shared: Arc<SemShared>,
}

#[derive(Debug)]
struct SemShared {
    base: LockBase,
    /// `[permits, limit, waiters, fencing counter, its floor]`: acquire and release.
    keys: Arc<[Arc<str>]>,
    /// `[permits, limit]`: extend. (During a slot migration a script naming a key that
    /// does not exist is refused with TRYAGAIN: renewals name only the keys that exist
    /// while permits are held.)
    lease_keys: Arc<[Arc<str>]>,
    /// `[permits, limit, waiters]`: status.
    status_keys: Arc<[Arc<str>]>,
    /// This client's channel, `{<key>}:wake:<client id>`, where releases hand permits
    /// to its waiters; `channel_prefix` is what precedes the id.
    channel: Arc<str>,
    channel_prefix: Arc<str>,
    ttl_arg: Arc<str>,
    /// How long permits handed to a waiter hold before it extends them, as the script
    /// argument.
    claim_arg: Arc<str>,
    /// How long a waiter's registration lives without a new attempt, as the script
    /// argument.
    register_arg: Arc<str>,
    limit: u32,
    limit_arg: Arc<str>,
    /// This client's tasks waiting for these permits (shared by every handle of the
    /// semaphore in this client).
    local: Arc<LocalSemaphore>,
}

/// What [`Semaphore::status`] reports. Never contains a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The limit in force: the one stored while permits are held, else this handle's.
    pub limit: u32,
    /// Permits held with a live lease.
    pub in_use: u32,
    /// Permits free right now (`limit - in_use`, never negative).
    pub available: u32,
    /// Until the earliest held permit lapses unless its holder renews it.
    pub next_lapse: Option<Duration>,
    /// How many acquisitions wait for permits (each waiting task counts): those
    /// registered in Redis, by any client, and the tasks of this client queued behind
    /// one of them.
    pub waiters: u64,
}

impl Semaphore {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, limit: u32, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let base = LockBase::new(ctx, Primitive::Semaphore, name, &keys.key, options)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        if limit == 0 || limit > MAX_PERMITS {
            return Err(Error::InvalidArgument {
                name: name.to_owned(),
                what: "permit limit",
                reason: format!("{limit} is not between 1 and {MAX_PERMITS}"),
            });
        }
        let (permits, limit_key): (Arc<str>, Arc<str>) = (base.key.clone(), keys.aux("limit").into());
        let waiters: Arc<str> = keys.aux("waiters").into();
        let [counter, floor] = base.ctx.fence_keys.of(&keys);
        let channel_prefix: Arc<str> = keys.aux("wake:").into();
        Ok(Semaphore {
            shared: Arc::new(SemShared {
                keys: Arc::new([
                    permits.clone(),
                    limit_key.clone(),
                    waiters.clone(),
                    counter,
                    floor,
                ]),
                lease_keys: Arc::new([permits.clone(), limit_key.clone()]),
                status_keys: Arc::new([permits, limit_key, waiters]),
                channel: format!("{channel_prefix}{}", base.ctx.id).into(),
                channel_prefix,
                ttl_arg: ttl_ms.to_string().into(),
                claim_arg: grant_claim(options.ttl).as_millis().to_string().into(),
                register_arg: register_life(options.ttl).as_millis().to_string().into(),
                local: base.ctx.locals.get(&format!("{}\0semaphore", base.key).into()),
                base,
                limit,
                limit_arg: limit.to_string().into(),
            }),
        })
    }

    /// The semaphore's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.base.name
    }

    /// The Redis key of the permit set: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.base.key
    }

    /// This handle's permit limit.
    pub fn limit(&self) -> u32 {
        self.shared.limit
    }

    /// The lease options of the permits.
    pub fn options(&self) -> LeaseOptions {
        self.shared.base.options
    }

    /// Takes one permit if one is free, without waiting. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no permit behind: an attempt that may have reached
    /// Redis is released in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when no permit is free; [`Error::LimitMismatch`] when permits
    /// are held under another limit; [`Error::WrongType`], [`Error::ReadOnly`] or
    /// [`Error::Redis`] when Redis cannot be used.
    pub async fn try_acquire(&self) -> Result<Permit> {
        self.acquire_inner(1, Wait::Try).await
    }

    /// Takes one permit, waiting as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no permit behind, and a
    /// wake-up it consumed is passed on to another waiter.
    ///
    /// # Errors
    ///
    /// [`Error::LimitMismatch`], and [`Error::WrongType`], [`Error::ReadOnly`] or
    /// [`Error::Redis`] when Redis cannot be used (after retrying temporary failures for
    /// the client's retry window).
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquire_inner(1, Wait::FOREVER).await
    }

    /// Takes one permit, waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when no permit was free in time, and the errors of
    /// [`acquire`](Semaphore::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        self.acquire_inner(1, Wait::timeout(timeout)).await
    }

    /// Takes `n` permits at once (all or none) if that many are free, without waiting.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Semaphore::try_acquire).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `n` is 0, above the limit or above
    /// [`MAX_PERMITS_PER_ACQUIRE`]; otherwise as [`try_acquire`](Semaphore::try_acquire).
    pub async fn try_acquire_many(&self, n: u32) -> Result<Permit> {
        self.acquire_inner(n, Wait::Try).await
    }

    /// Takes `n` permits at once (all or none), waiting as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad `n` (see
    /// [`try_acquire_many`](Semaphore::try_acquire_many)); otherwise as
    /// [`acquire`](Semaphore::acquire).
    pub async fn acquire_many(&self, n: u32) -> Result<Permit> {
        self.acquire_inner(n, Wait::FOREVER).await
    }

    /// Takes `n` permits at once (all or none), waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], and the errors of [`acquire_many`](Semaphore::acquire_many).
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Permit> {
        self.acquire_inner(n, Wait::timeout(timeout)).await
    }

    fn check_count(&self, n: u32) -> Result<()> {
        let s = &*self.shared;
        let max = s.limit.min(MAX_PERMITS_PER_ACQUIRE);
        if n == 0 || n > max {
            return Err(Error::InvalidArgument {
                name: s.base.name.to_string(),
                what: "number of permits",
                reason: format!(
                    "{n} is not between 1 and {max} (the limit is {}; at most {MAX_PERMITS_PER_ACQUIRE} at once)",
                    s.limit
                ),
            });
        }
        Ok(())
    }

    /// Counted in the metrics as one call, whether the permits came through Redis or
    /// from a task of this client.
    async fn acquire_inner(&self, n: u32, wait: Wait) -> Result<Permit> {
        let call = AcquireCall::start(Primitive::Semaphore);
        call.finish(self.acquire_uncounted(n, wait).await)
    }

    async fn acquire_uncounted(&self, n: u32, wait: Wait) -> Result<Permit> {
        self.check_count(n)?;
        let s = &*self.shared;
        let mut token = Token::generate();
        let request = Request {
            permits: n,
            limit: s.limit,
        };
        // Behind a task of this client that waits in Redis for the same request, wait
        // in the client. (A hand-over skips the replica acknowledgement of an acquire:
        // under a replica policy every acquisition goes through Redis.)
        let started = Instant::now();
        let in_redis = if wait.waits() && s.base.options.replica_ack.is_none() {
            // A queued task looks at Redis itself after a claim window without a
            // hand-over (see `local`).
            let look_again = Deadline::after(grant_claim(s.base.options.ttl)).min(wait.deadline());
            match s.local.enter(request, &token, self) {
                Entry::Redis(in_redis) => Some(in_redis),
                Entry::Queued(mut queued) => {
                    let mut bound = look_again;
                    let mut picked = false;
                    loop {
                        match queued.wait(bound).await {
                            Some(Handed::Permits(handed)) => match handed.if_reliable() {
                                Ok(permit) => {
                                    tracing::debug!(semaphore = %s.base.name, permits = n, "permits handed over locally");
                                    return Ok(permit);
                                }
                                // Taken up too late (the task was not polled), or a
                                // hand-over that may or may not have landed: ask Redis,
                                // with the token the permits were moved to.
                                Err(Some(turn)) => break Some(turn.into_redis(&s.local, request)),
                                Err(None) => break Some(s.local.to_redis(request)),
                            },
                            Some(Handed::Turn(turn)) => break Some(turn.into_redis(&s.local, request)),
                            None if wait.deadline().passed() => {
                                return Err(Error::Timeout {
                                    name: s.base.name.to_string(),
                                    waited: started.elapsed(),
                                });
                            }
                            // Out of the queue: to Redis ourselves.
                            None if !picked && queued.leave() => break Some(s.local.to_redis(request)),
                            // Picked for a hand-over under way onto our token — which we
                            // must not use in Redis meanwhile: what it sends arrives,
                            // normally within a round trip.
                            None if !picked => {
                                picked = true;
                                bound = Deadline::after(grant_claim(s.base.options.ttl)).min(wait.deadline());
                            }
                            // Still nothing a claim window later: the releasing task has
                            // stalled (its future is not polled). To Redis with a fresh
                            // token; permits the hand-over may still move onto the old
                            // one come to nobody here, and are released.
                            None => {
                                drop(queued);
                                token = Token::generate();
                                break Some(s.local.to_redis(request));
                            }
                        }
                    }
                }
            }
        } else {
            None
        };
        let core = self
            .acquire_through_redis(n, token, wait, in_redis.as_ref())
            .await
            .map_err(|e| match e {
                // The whole wait, the local queue's part included.
                Error::Timeout { name, .. } => Error::Timeout {
                    name,
                    waited: started.elapsed(),
                },
                e => e,
            })?;
        tracing::debug!(semaphore = %s.base.name, permits = n, "permits acquired");
        Ok(self.permit(core, n))
    }

    /// Acquires `n` permits through Redis with `token`; a first busy answer is told to
    /// `in_redis` (this client's tasks for the same request then queue behind this one).
    async fn acquire_through_redis(
        &self,
        n: u32,
        token: Token,
        wait: Wait,
        in_redis: Option<&InRedis>,
    ) -> Result<GuardCore> {
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        let count: Arc<str> = n.to_string().into();
        // The waiter's public id starts with its client's: releases find the client's
        // channel from it.
        let id = format!("{}{}", ctx.id, waiter_id());
        let registration: Arc<str> = format!("{id}{}{n}/{}", token.expose(), s.limit).into();
        let waits = wait.waits();
        let cmd = SEM_ACQUIRE.evalsha(
            &s.keys,
            &[
                &*registration,
                &s.limit_arg,
                &s.ttl_arg,
                if waits { "1" } else { "0" },
                &s.register_arg,
                &s.channel_prefix,
                &ctx.publish,
                &s.claim_arg,
            ],
            None,
        );
        let spec = Acquire {
            script: &SEM_ACQUIRE,
            cmd: &cmd,
            channel: &s.channel,
            wait,
            // Gives back permits an attempt may have taken (or a release handed us),
            // and leaves the registration.
            undo: self.release_call(&token, &count, registration.clone()),
            renew: self.renew_call(&token, &count),
            release: self.release_call(&token, &count, "".into()),
            token,
            grant: waits.then(|| Granted {
                id: &id,
                claim: grant_claim(s.base.options.ttl),
            }),
        };
        let ttl = s.base.options.ttl;
        s.base
            .acquire_step(spec, |reply, _| {
                if let Some(acquired) = Reply::acquired(reply, ttl, false) {
                    return Ok(acquired);
                }
                match array(reply).unwrap_or_default() {
                    [flag, remaining, _free, mark] if int(flag) == Some(0) => {
                        if let Some(in_redis) = in_redis {
                            in_redis.found_busy();
                        }
                        Ok(Reply::Busy {
                            busy: Busy {
                                remaining: ms(int(remaining)),
                                pass_on: false,
                                mark: int(mark).and_then(|m| u64::try_from(m).ok()),
                                foreign: false,
                            },
                            // A waiter left a registration behind: undo removes it.
                            queued: waits,
                        })
                    }
                    [flag, existing] if int(flag) == Some(-1) => Err(Error::LimitMismatch {
                        name: s.base.name.to_string(),
                        limit: s.limit,
                        existing: int(existing).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
                    }),
                    _ => Err(s.base.op("acquire").bad_reply()),
                }
            })
            .await
    }

    fn permit(&self, core: GuardCore, permits: u32) -> Permit {
        Permit {
            core: Some(core),
            semaphore: self.clone(),
            permits,
        }
    }

    fn renew_call(&self, token: &Token, count: &Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &SEM_EXTEND,
            s.lease_keys.clone(),
            Arc::new([token.shared(), count.clone()]),
        )
    }

    /// The release of the `count` permits of `token` (`"0"`: every permit of the
    /// token), leaving `registration` (or none: `""`).
    fn release_call(&self, token: &Token, count: &Arc<str>, registration: Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &SEM_RELEASE,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                count.clone(),
                s.limit_arg.clone(),
                s.channel_prefix.clone(),
                s.base.ctx.publish.clone(),
                s.claim_arg.clone(),
                registration,
            ]),
        )
    }

    /// Gives back every permit taken by the acquisition whose token is `token` (from
    /// [`Permit::forget`], possibly in another process), handing them to waiters.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not release the permits; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the token holds no permit (released before, or lapsed);
    /// Redis errors.
    pub async fn release_token(&self, token: &Token) -> Result<()> {
        let call = self.release_call(token, &"0".into(), "".into());
        self.shared
            .base
            .by_token("release", &call.cmd(), call.script, None)
            .await
    }

    /// How many permits are in use and free, and how many acquisitions wait.
    ///
    /// Reads only; never reveals a token.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when a key is not a semaphore's, and Redis errors.
    pub async fn status(&self) -> Result<SemaphoreStatus> {
        let s = &*self.shared;
        let cmd = SEM_STATUS.evalsha(&s.status_keys, &[] as &[&str], None);
        let (items, _) = s.base.status(&SEM_STATUS, &cmd, None).await?;
        let [stored, in_use, lapse, waiting] = &items[..] else {
            return Err(s.base.op("status").bad_reply());
        };
        let in_use = int(in_use).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32;
        let limit = opt_string(stored)
            .and_then(|l| l.parse().ok())
            .filter(|_| in_use > 0)
            .unwrap_or(s.limit);
        Ok(SemaphoreStatus {
            limit,
            in_use,
            available: limit.saturating_sub(in_use),
            next_lapse: ms(int(lapse)),
            waiters: (int(waiting).unwrap_or(0).max(0) as u64).saturating_add(s.local.queued() as u64),
        })
    }
}

/// Proof of holding permits of a [`Semaphore`]: one acquisition of one or more permits,
/// with its own token and lease.
///
/// The lease renews automatically (unless the semaphore was made with
/// `auto_renew(false)`); [`is_held`](Permit::is_held) and [`lost`](Permit::lost) tell when
/// the permits can no longer be relied on — for instance after a pause long enough for
/// them to lapse and be given to someone else.
///
/// # Drop
///
/// Dropping the permit without [`release`](Permit::release) stops renewal and gives the
/// permits back in the background when a tokio runtime is running (handing them to a
/// task of this client that waits for as many, or to waiters in Redis); otherwise they
/// lapse after their TTL.
#[must_use = "dropping the permit releases it"]
#[derive(Debug)]
pub struct Permit {
    /// Taken out only by `release`, `forget` and `drop`.
    core: Option<GuardCore>,
    semaphore: Semaphore,
    permits: u32,
}

guard_surface!(Permit, "these permits belong to", fence: |_g| None);

impl Permit {
    fn core(&self) -> &GuardCore {
        self.core.as_ref().expect("present until the permit is consumed")
    }

    /// The semaphore these permits belong to.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// How many permits this acquisition holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Gives the permits back, handing them to waiters: to a task of this client that
    /// waits for as many (moved to its token in one request), else through Redis.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the permits had already lapsed — someone else may have
    /// held them meanwhile; Redis errors.
    pub async fn release(mut self) -> Result<()> {
        let core = self.core.take().expect("present until the permit is consumed");
        self.semaphore.finish(core, self.permits).await
    }

    /// Stops renewing and gives up the guard *without* releasing: the permits stay held
    /// until their lease lapses or someone calls [`Semaphore::release_token`] with the
    /// returned token.
    pub fn forget(mut self) -> Token {
        self.core
            .take()
            .expect("present until the permit is consumed")
            .forget()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(core) = self.core.take() else {
            return;
        };
        core.state().end(LostReason::Released);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let (semaphore, permits) = (self.semaphore.clone(), self.permits);
                runtime.spawn(async move {
                    let _ = semaphore.finish(core, permits).await;
                });
            }
            Err(_) => {
                tracing::debug!(semaphore = %self.semaphore.name(), "no runtime to release in; the lease will expire");
                drop(core);
            }
        }
    }
}

impl Semaphore {
    /// Ends a holding of `permits` permits: hands them to the first task of this client
    /// queued for as many under this limit (within the hand-over budget), else releases
    /// them through Redis.
    async fn finish(&self, core: GuardCore, permits: u32) -> Result<()> {
        let s = &*self.shared;
        let request = Request {
            permits,
            limit: s.limit,
        };
        let waiter = match s.base.options.replica_ack {
            None => s.local.next_for_handoff(request),
            Some(_) => None,
        };
        match waiter {
            None => core.release().await,
            // Boxed: most releases do not hand over.
            Some(waiter) => {
                let popped = Popped {
                    waiter: Some(waiter),
                    local: s.local.clone(),
                };
                Box::pin(self.hand_over(core, popped)).await
            }
        }
    }

    /// Moves the permits from `core`'s token to the picked waiter's in one script.
    async fn hand_over(&self, core: GuardCore, popped: Popped) -> Result<()> {
        let s = &*self.shared;
        let count: Arc<str> = popped.waiter().request().permits.to_string().into();
        let release = self.release_call(core.token(), &count, "".into());
        let (token, _) = core.take();
        let next = popped.waiter();
        // The permits hold for the waiter's claim window, as permits a release hands to
        // a waiter in Redis do: a waiter whose task is not polled holds them up no
        // longer than that; one that takes them up renews them within a third of it.
        // (Without automatic renewal nobody would: then for the waiter's whole lease.)
        let (lease, lease_arg) = {
            let next = &next.semaphore.shared;
            match next.base.options.auto_renew {
                true => (grant_claim(next.base.options.ttl), &next.claim_arg),
                false => (next.base.options.ttl, &next.ttl_arg),
            }
        };
        let cmd = SEM_HANDOFF.evalsha(
            &s.lease_keys,
            &[token.expose(), next.token.expose(), &count, lease_arg],
            None,
        );
        // If this future is dropped or fails before Redis answers, our own permits are
        // released in the background (nothing, if the hand-over landed), and `popped`
        // gives the waiter the turn.
        let claim = s.base.claim(release);
        claim.arm();
        let op = s.base.op("hand over");
        let (reply, sent) = op
            .eval_sent(&SEM_HANDOFF, &cmd, Deadline::Never, Some(&claim))
            .await?;
        claim.disarm();
        match Reply::acquired(&reply, lease, false) {
            Some(Reply::Acquired { remaining, .. }) => {
                handed_over(Primitive::Semaphore, Handover::Local);
                tracing::debug!(semaphore = %s.base.name, permits = %count, "permits handed to a local waiter");
                popped.hand_over(sent, remaining);
                Ok(())
            }
            // Our permits were gone already: the waiter gets the turn and goes to Redis.
            _ if int(&reply) == Some(0) => Err(op.not_held()),
            _ => Err(op.bad_reply()),
        }
    }
}

/// Permits moved to a queued task's token, on their way to it. Dropped unclaimed (the
/// task has gone), they become a permit that is dropped: handed on, or released.
pub(crate) struct HandedPermits {
    semaphore: Semaphore,
    token: Option<Token>,
    permits: u32,
    sent: Instant,
    remaining: Duration,
    /// The hand-over is confirmed. When not (its reply never came: the releasing
    /// future was dropped, or the script failed), the permits may or may not be on the
    /// waiter's token: the waiter asks Redis with it — or, if it has gone, whatever is
    /// on the token is given back.
    landed: bool,
    /// The turn to go to Redis, with an unconfirmed hand-over: passed on if the waiter
    /// has gone.
    turn: Option<Turn>,
}

impl HandedPermits {
    /// The permit, if the hand-over is confirmed and can still be relied on without a
    /// round trip; else the turn it carries, if any (the permits may still be on the
    /// waiter's token: its own acquire through Redis finds them there, with a full
    /// lease).
    fn if_reliable(mut self) -> std::result::Result<Permit, Option<Turn>> {
        let ttl = self.semaphore.shared.base.options.ttl;
        if self.landed && still_reliable(self.sent, self.remaining, ttl) {
            return Ok(self.into_permit());
        }
        self.token = None;
        Err(self.turn.take())
    }

    fn into_permit(mut self) -> Permit {
        let sem = &self.semaphore;
        let token = self.token.take().expect("present until consumed");
        let count: Arc<str> = self.permits.to_string().into();
        let core = sem.shared.base.hold(Held {
            fence: None,
            sent: self.sent,
            remaining: self.remaining,
            renew: sem.renew_call(&token, &count),
            release: sem.release_call(&token, &count, "".into()),
            token,
        });
        sem.permit(core, self.permits)
    }
}

impl Drop for HandedPermits {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        if !self.landed {
            // Whatever may have landed on the token is given back (to the waiters in
            // Redis); then the turn passes on.
            let s = &self.semaphore.shared;
            spawn_release(
                s.base.ctx.clone(),
                s.base.name.clone(),
                self.semaphore
                    .release_call(&token, &self.permits.to_string().into(), "".into()),
                s.base.options.ttl,
            );
            drop(self.turn.take());
            return;
        }
        let handed = HandedPermits {
            semaphore: self.semaphore.clone(),
            token: Some(token),
            permits: self.permits,
            sent: self.sent,
            remaining: self.remaining,
            landed: true,
            turn: self.turn.take(),
        };
        drop(handed.into_permit());
    }
}

/// A queued task picked for a hand-over that is under way. If the hand-over does not
/// complete (the script failed, our permits were gone, or the releasing future was
/// dropped), the task gets an unconfirmed hand-over carrying the turn instead, and
/// acquires through Redis with its own token — which also finds a hand-over that did
/// land. If the task has gone, now or before it reads what it was sent, permits that
/// may have landed on its token are released.
struct Popped {
    waiter: Option<Waiter>,
    local: Arc<LocalSemaphore>,
}

impl Popped {
    fn waiter(&self) -> &Waiter {
        self.waiter.as_ref().expect("present until consumed")
    }

    fn hand_over(mut self, sent: Instant, remaining: Duration) {
        let waiter = self.waiter.take().expect("present until consumed");
        let handed = HandedPermits {
            semaphore: waiter.semaphore.clone(),
            token: Some(waiter.token.clone()),
            permits: waiter.request().permits,
            sent,
            remaining,
            landed: true,
            turn: None,
        };
        // A task that has gone drops what it is given back: handed on or released.
        let _ = waiter.send(Handed::Permits(handed));
    }
}

impl Drop for Popped {
    fn drop(&mut self) {
        let Some(waiter) = self.waiter.take() else {
            return;
        };
        // The hand-over may have landed on the waiter's token: the waiter is given the
        // turn with the duty to find out (its acquire through Redis recognises the
        // permits as its own); dropped unread — the waiter has gone, now or before it
        // reads it — the token's permits are given back and the turn passed on.
        let handed = HandedPermits {
            semaphore: waiter.semaphore.clone(),
            token: Some(waiter.token.clone()),
            permits: waiter.request().permits,
            sent: Instant::now(),
            remaining: Duration::ZERO,
            landed: false,
            turn: Some(Turn::for_waiter(&self.local, &waiter)),
        };
        let _ = waiter.send(Handed::Permits(handed));
    }
}
