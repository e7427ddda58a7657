//! The semaphore: N permits per name, each a lease that expires when its holder stops
//! renewing it.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::{Acquire, Busy, Granted, Reply, grant_claim, register_life};
use crate::engine::context::Context;
use crate::engine::deadline::Wait;
use crate::engine::guard::{GuardCore, LockBase, guard_surface};
use crate::engine::heartbeat::waiter_id;
use crate::engine::metrics::Primitive;
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::LeaseOptions;
use crate::script::reply::{array, int, ms, opt_string};
use crate::script::{SEM_ACQUIRE, SEM_EXTEND, SEM_RELEASE, SEM_STATUS, ScriptCall};
use crate::token::Token;

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
    /// How many acquisitions wait for permits (each waiting task counts).
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

    async fn acquire_inner(&self, n: u32, wait: Wait) -> Result<Permit> {
        self.check_count(n)?;
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        let token = Token::generate();
        let count: Arc<str> = n.to_string().into();
        // The waiter's public id starts with its client's: releases find the client's
        // channel from it.
        let id = format!("{}{}", ctx.id, waiter_id());
        let registration: Arc<str> = format!("{id}{}{n}/{}", token.expose(), s.limit).into();
        let attempt = |flag: &str| {
            SEM_ACQUIRE.evalsha(
                &s.keys,
                &[
                    &*registration,
                    &s.limit_arg,
                    &s.ttl_arg,
                    flag,
                    &s.register_arg,
                    &s.channel_prefix,
                    &ctx.publish,
                    &s.claim_arg,
                ],
                None,
            )
        };
        let waits = wait.waits();
        let cmd = attempt(if waits { "1" } else { "0" });
        // After a busy answer left a registration, an attempt that acquires leaves it.
        let cmd_registered = attempt("2");
        let spec = Acquire {
            script: &SEM_ACQUIRE,
            cmd: &cmd,
            cmd_registered: waits.then_some(&cmd_registered),
            channel: &s.channel,
            wait,
            // Gives back permits an attempt may have taken (or a release handed us),
            // and leaves the registration.
            undo: self.release_call(&token, &count, registration.clone()),
            renew: ScriptCall::new(
                &SEM_EXTEND,
                s.lease_keys.clone(),
                Arc::new([token.shared(), count.clone()]),
            ),
            release: self.release_call(&token, &count, "".into()),
            token,
            grant: waits.then(|| Granted {
                id: &id,
                claim: grant_claim(s.base.options.ttl),
            }),
        };
        let ttl = s.base.options.ttl;
        let core = s
            .base
            .acquire(spec, |reply, _| {
                if let Some(acquired) = Reply::acquired(reply, ttl, false) {
                    return Ok(acquired);
                }
                match array(reply).unwrap_or_default() {
                    [flag, remaining, _free, mark] if int(flag) == Some(0) => Ok(Reply::Busy {
                        busy: Busy {
                            remaining: ms(int(remaining)),
                            pass_on: false,
                            mark: int(mark).and_then(|m| u64::try_from(m).ok()),
                            foreign: false,
                        },
                        // A waiter left a registration behind: undo removes it.
                        queued: waits,
                    }),
                    [flag, existing] if int(flag) == Some(-1) => Err(Error::LimitMismatch {
                        name: s.base.name.to_string(),
                        limit: s.limit,
                        existing: int(existing).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
                    }),
                    _ => Err(s.base.op("acquire").bad_reply()),
                }
            })
            .await?;
        tracing::debug!(semaphore = %s.base.name, permits = n, "permits acquired");
        Ok(Permit {
            core,
            semaphore: self.clone(),
            permits: n,
        })
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
            waiters: int(waiting).unwrap_or(0).max(0) as u64,
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
/// permits back in the background when a tokio runtime is running (handing them to
/// waiters);
/// otherwise they lapse after their TTL.
#[must_use = "dropping the permit releases it"]
#[derive(Debug)]
pub struct Permit {
    core: GuardCore,
    semaphore: Semaphore,
    permits: u32,
}

guard_surface!(Permit, "these permits belong to", fence: |_g| None);

impl Permit {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The semaphore these permits belong to.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// How many permits this acquisition holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Gives the permits back, handing them to waiters.
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
    pub async fn release(self) -> Result<()> {
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the permits stay held
    /// until their lease lapses or someone calls [`Semaphore::release_token`] with the
    /// returned token.
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}
