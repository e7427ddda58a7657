//! The semaphore: N permits per name, each a lease that expires when its holder stops
//! renewing it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{ClientInner, LeaseOptions};
use crate::error::{Error, Result};
use crate::held::{Held, bad_reply, listeners, ms, start_lease};
use crate::keys::{self, LockKeys};
use crate::lease::{Lease, LostReason, ScriptCall};
use crate::scripts::{SEM_ACQUIRE, SEM_EXTEND, SEM_RELEASE, SEM_STATUS, array, int, opt_string};
use crate::token::Token;
use crate::wait::{Attempt, Pending, WaitSpec, acquire_loop, eval_by_token, eval_retrying};

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
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// `[permits, limit]`, shared by every script of this semaphore.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    options: LeaseOptions,
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
    pub(crate) fn new(
        client: Arc<ClientInner>,
        name: &str,
        limit: u32,
        options: LeaseOptions,
    ) -> Result<Self> {
        let keys = LockKeys::new(&client.prefix, name)?;
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
                keys: Arc::new([keys.key.as_str().into(), keys.aux("limit").into()]),
                channel: keys.aux("wake").into(),
                name: name.into(),
                client,
                options,
                ttl_arg: ttl_ms.to_string().into(),
                limit,
                limit_arg: limit.to_string().into(),
            }),
        })
    }

    /// The semaphore's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the permit set: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.keys[0]
    }

    /// This handle's permit limit.
    pub fn limit(&self) -> u32 {
        self.shared.limit
    }

    /// The lease options of the permits.
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
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
        self.acquire_inner(1, None).await
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
        self.acquire_inner(1, Some(None)).await
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
        self.acquire_inner(1, Some(Some(Instant::now() + timeout))).await
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
        self.acquire_inner(n, None).await
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
        self.acquire_inner(n, Some(None)).await
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
        self.acquire_inner(n, Some(Some(Instant::now() + timeout))).await
    }

    fn check_count(&self, n: u32) -> Result<()> {
        let s = &*self.shared;
        let max = s.limit.min(MAX_PERMITS_PER_ACQUIRE);
        if n == 0 || n > max {
            return Err(Error::InvalidArgument {
                name: s.name.to_string(),
                what: "number of permits",
                reason: format!(
                    "{n} is not between 1 and {max} (the limit is {}; at most {MAX_PERMITS_PER_ACQUIRE} at once)",
                    s.limit
                ),
            });
        }
        Ok(())
    }

    async fn acquire_inner(&self, n: u32, wait: Option<Option<Instant>>) -> Result<Permit> {
        self.check_count(n)?;
        let s = &*self.shared;
        let token = Token::generate();
        let count: Arc<str> = n.to_string().into();
        let cmd = SEM_ACQUIRE.evalsha(&s.keys, &[token.expose(), &count, &s.limit_arg, &s.ttl_arg], None);
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            self.release_call(&token, &count),
            s.options.ttl,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &s.channel,
            wait,
            fallback: s.options.ttl,
        };
        let (pending_ref, cmd_ref, token_ref, count_ref) = (&pending, &cmd, &token, &count);
        let lease = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let reply = eval_retrying(
                &s.client,
                &s.name,
                &s.keys[0],
                "acquire",
                &SEM_ACQUIRE,
                cmd_ref,
                deadline,
                Some(pending_ref),
            )
            .await
            .inspect_err(|e| {
                if !e.is_unavailable() {
                    // A definite error reply: the script fails before it writes a permit.
                    pending_ref.answered_no();
                }
            })?;
            if int(&reply) == Some(1) {
                return Ok(Attempt::Acquired(self.new_lease(
                    token_ref,
                    count_ref,
                    sent,
                    s.options.ttl,
                )));
            }
            match array(&reply).unwrap_or_default() {
                [flag, remaining] if int(flag) == Some(1) => {
                    let remaining = ms(int(remaining)).unwrap_or_default();
                    Ok(Attempt::Acquired(
                        self.new_lease(token_ref, count_ref, sent, remaining),
                    ))
                }
                [flag, remaining, free] if int(flag) == Some(0) => {
                    pending_ref.answered_no();
                    let remaining = ms(int(remaining));
                    if int(free).unwrap_or(0) > 0 {
                        // Some permits are free, just not enough for us: another local
                        // waiter that needs fewer may use the wake-up.
                        Ok(Attempt::BusyPassOn { remaining })
                    } else {
                        Ok(Attempt::Busy { remaining })
                    }
                }
                [flag, existing] if int(flag) == Some(-1) => {
                    pending_ref.answered_no();
                    Err(Error::LimitMismatch {
                        name: s.name.to_string(),
                        limit: s.limit,
                        existing: int(existing).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32,
                    })
                }
                _ => Err(bad_reply(&s.name, "acquire")),
            }
        })
        .await?;
        pending.disarm();
        tracing::debug!(semaphore = %s.name, permits = n, "permits acquired");
        Ok(Permit {
            held: Held::new(s.client.clone(), s.name.clone(), s.keys[0].clone(), token, lease),
            semaphore: self.clone(),
            permits: n,
        })
    }

    fn new_lease(&self, token: &Token, count: &Arc<str>, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &SEM_EXTEND,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                count.clone(),
                s.channel.clone(),
                s.client.publish.clone(),
            ]),
        );
        start_lease(
            &s.client,
            &s.name,
            sent,
            s.options.ttl,
            remaining,
            renew,
            self.release_call(token, count),
            s.options.auto_renew,
        )
    }

    fn release_call(&self, token: &Token, count: &Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &SEM_RELEASE,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                count.clone(),
                s.channel.clone(),
                s.client.publish.clone(),
            ]),
        )
    }

    /// Gives back the `n` permits taken by one acquisition whose token is `token` (from
    /// [`Permit::forget`], possibly in another process), and wakes as many waiters.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not release the permits; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad `n`; [`Error::NotHeld`] when the token holds
    /// no permit (released before, or lapsed); Redis errors.
    pub async fn release_token(&self, token: &Token, n: u32) -> Result<()> {
        self.check_count(n)?;
        let s = &*self.shared;
        let call = self.release_call(token, &n.to_string().into());
        eval_by_token(
            &s.client,
            &s.name,
            &s.keys[0],
            "release",
            call.script,
            &call.cmd(),
        )
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
        let (reply, waiters) = tokio::join!(
            eval_retrying(
                &s.client,
                &s.name,
                &s.keys[0],
                "status",
                &SEM_STATUS,
                &cmd,
                None,
                None
            ),
            listeners(&s.client, &s.channel),
        );
        let reply = reply?;
        let items = array(&reply).ok_or_else(|| bad_reply(&s.name, "status"))?;
        let [stored, in_use, lapse] = items else {
            return Err(bad_reply(&s.name, "status"));
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
    held: Held,
    semaphore: Semaphore,
    permits: u32,
}

impl Permit {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.semaphore.name()
    }

    /// The semaphore these permits belong to.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// How many permits this acquisition holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The acquisition's secret token (its permits are `<token>:1 ..= <token>:n` in the
    /// permit set). Needed only to release from another process; never log it.
    pub fn token(&self) -> &Token {
        self.held.token()
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        self.held.lease()
    }

    /// Until when the holder may rely on the permits (see [`Lease::valid_until`]).
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.lease().valid_until()
    }

    /// Whether the lease is still valid.
    pub fn is_held(&self) -> bool {
        self.held.lease().is_held()
    }

    /// Completes when the lease is lost (see [`Lease::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.held.lease().lost().await
    }

    /// Sets the remaining lease of these permits to `ttl`, from now.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the permits were already lost;
    /// Redis errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
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
        self.held.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the permits stay held
    /// until their lease lapses or someone calls [`Semaphore::release_token`] with the
    /// returned token.
    pub fn forget(self) -> Token {
        self.held.forget()
    }
}
