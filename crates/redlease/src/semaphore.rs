//! The semaphore: N permits per name, each a lease that expires when its holder stops
//! renewing it.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::{Acquire, Busy, Reply};
use crate::engine::context::Context;
use crate::engine::deadline::Wait;
use crate::engine::guard::{GuardCore, LockBase, guard_surface};
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
/// Not fair: when permits are freed, waiters race for them, and a request for many
/// permits can be overtaken by requests for fewer. A release publishes how many permits
/// it freed, and each waiting process wakes that many of its waiters; a woken waiter
/// that needs more permits than are free hands its wake-up to another local waiter
/// instead of swallowing it. Nobody polls: a missed wake-up costs at most the time until
/// the earliest held permit would lapse.
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
    /// `[permits, limit]`, shared by every script of this semaphore.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    ttl_arg: Arc<str>,
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
    /// How many client connections wait for permits (each waiting process counts once,
    /// however many tasks in it wait).
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
        Ok(Semaphore {
            shared: Arc::new(SemShared {
                keys: Arc::new([base.key.clone(), keys.aux("limit").into()]),
                channel: keys.aux("wake").into(),
                base,
                ttl_arg: ttl_ms.to_string().into(),
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
        let token = Token::generate();
        let count: Arc<str> = n.to_string().into();
        let cmd = SEM_ACQUIRE.evalsha(&s.keys, &[token.expose(), &count, &s.limit_arg, &s.ttl_arg], None);
        let release = self.call(&SEM_RELEASE, &token, &count);
        let spec = Acquire {
            script: &SEM_ACQUIRE,
            cmd: &cmd,
            cmd_registered: None,
            channel: &s.channel,
            wait,
            undo: release.clone(),
            renew: self.call(&SEM_EXTEND, &token, &count),
            release,
            token,
            grant: None,
        };
        let ttl = s.base.options.ttl;
        let core = s
            .base
            .acquire(spec, |reply, _| {
                if let Some(acquired) = Reply::acquired(reply, ttl, false) {
                    return Ok(acquired);
                }
                match array(reply).unwrap_or_default() {
                    [flag, remaining, free] if int(flag) == Some(0) => Ok(Reply::Busy {
                        busy: Busy {
                            remaining: ms(int(remaining)),
                            // Some permits are free, just not enough for us: another
                            // local waiter that needs fewer may use the wake-up.
                            pass_on: int(free).unwrap_or(0) > 0,
                            mark: None,
                            foreign: false,
                        },
                        queued: false,
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

    /// A call of `script` (extend or release) for the `count` permits of `token`.
    fn call(&self, script: &'static crate::script::LuaScript, token: &Token, count: &Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            script,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                count.clone(),
                s.channel.clone(),
                s.base.ctx.publish.clone(),
            ]),
        )
    }

    /// Gives back every permit taken by the acquisition whose token is `token` (from
    /// [`Permit::forget`], possibly in another process), and wakes as many waiters.
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
        let call = self.call(&SEM_RELEASE, token, &"0".into());
        self.shared
            .base
            .by_token("release", &call.cmd(), call.script, None)
            .await
    }

    /// How many permits are in use and free, and how many processes wait.
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
        let cmd = SEM_STATUS.evalsha(&s.keys, &[] as &[&str], None);
        let (items, waiters) = s.base.status(&SEM_STATUS, &cmd, Some(&s.channel)).await?;
        let [stored, in_use, lapse] = &items[..] else {
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
            waiters,
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
/// permits back in the background when a tokio runtime is running (waking waiters);
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

    /// Gives the permits back and wakes as many waiters.
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
