//! The fair mutex: waiters acquire in arrival order.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::engine::acquire::{Acquire, Busy, Granted, Reply};
use crate::engine::context::Context;
use crate::engine::deadline::Wait;
use crate::engine::guard::{GuardCore, LockBase, guard_surface};
use crate::engine::heartbeat::{Heartbeat, WaiterTtl, waiter_id};
use crate::engine::metrics::Primitive;
#[allow(unused_imports)] // `Error` is named by the docs' links
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::{DEFAULT_WAITER_TTL, LeaseOptions};
use crate::script::reply::{array, holder, int, ms, opt_string};
use crate::script::{FAIR_ACQUIRE, FAIR_HEARTBEAT, FAIR_RELEASE, FAIR_STATUS, MUTEX_EXTEND, ScriptCall};
use crate::token::{FencingToken, Token};

/// A distributed mutex that serves its waiters in arrival order (FIFO).
///
/// The lock itself is the plain [`Mutex`](crate::Mutex)'s: the key `<prefix><name>`
/// holding the holder's random token with a PX TTL, so a fair and a plain mutex of one
/// name exclude each other (as do redis-py, redsync and node-redlock clients) and share
/// one sequence of [`FencingToken`]s. The guard has the plain mutex's semantics: fencing
/// token, automatic renewal, [`lost`](FairMutexGuard::lost) signal, background release
/// on drop.
///
/// # Policy
///
/// First come, first served. A waiter joins a queue (`{<key>}:queue`) with a ticket
/// when it first finds the lock busy, and gets the lock only when every live waiter
/// ahead of it has had its turn; its position is kept across retries and reported by
/// [`lock_with_position`](FairMutex::lock_with_position) and [`status`](FairMutex::status).
/// A release hands the lock straight to the next waiter — it sets the lock to that
/// waiter's token and tells it, and only its process, on a channel of that client's —
/// so the next holder holds the lock as soon as the message arrives, without a request
/// of its own.
///
/// Clients that do not take part in the queue are not held to it: a plain `Mutex`,
/// redis-py or redsync client of the same name takes the lock whenever it finds it free,
/// ahead of queued waiters ("barging"), and the next fair waiter learns of its release
/// within one heartbeat interval of a queued waiter (a third of the waiter TTL), or when
/// that client's lease would have ended. Use one kind of client per name to keep the
/// order strict.
///
/// # Failure model
///
/// Each queue entry is a small lease of its own: the waiter heartbeats it every third
/// of the *waiter TTL* (default 5 s, at most the lock's TTL; see
/// [`with_waiter_ttl`](FairMutex::with_waiter_ttl)), with the deadline on Redis's clock.
/// A waiter that crashes or hangs stops heartbeating; its entry is dropped once its
/// deadline passes, and a lock handed to it lasts only until that deadline, after which
/// the next live waiter's heartbeat sets the queue moving again — so a dead waiter
/// delays those behind it by at most its waiter TTL plus one heartbeat interval, never
/// minutes. A waiter that gives up (timeout, cancellation) leaves the queue at once,
/// handing on a lock it was given meanwhile. A waiter whose own entry was dropped while
/// it was paused rejoins at the back. Mutual exclusion itself is that of the plain
/// mutex: it holds while leases are valid and Redis keeps its writes.
///
/// `FairMutex` is a cheap handle (clone it freely); it holds no lock by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
/// let printer = client.fair_mutex("printer")?;
/// let guard = printer
///     .lock_with_position(None, |ahead| eprintln!("{ahead} waiters ahead of us"))
///     .await?;
/// println!("printing with fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FairMutex {
    shared: Arc<FairShared>,
}

#[derive(Clone, Debug)]
struct FairShared {
    base: LockBase,
    /// `[lock, queue, alive, fencing counter, its floor]`: acquire.
    acquire_keys: Arc<[Arc<str>]>,
    /// `[lock, queue, alive, fencing counter, its floor, plain waiters]`: release.
    release_keys: Arc<[Arc<str>]>,
    /// `[lock, fencing counter, its floor, queue, alive]`: status.
    status_keys: Arc<[Arc<str>]>,
    /// `[lock]`: the plain mutex's extend script renews the holder. (During a slot
    /// migration a script naming a key that does not exist is refused with TRYAGAIN:
    /// renewals name only the key that exists while the lock is held.)
    lock_keys: Arc<[Arc<str>]>,
    /// `[lock, queue, alive]`: heartbeat.
    queue_keys: Arc<[Arc<str>]>,
    /// This client's fair channel, `{<key>}:wake:fair:<client id>`, where releases hand
    /// the lock to its queued waiters; `channel_prefix` is what precedes the id.
    channel: Arc<str>,
    channel_prefix: Arc<str>,
    /// The plain mutex's channel, `{<key>}:wake`.
    plain_channel: Arc<str>,
    ttl_arg: Arc<str>,
    waiter: WaiterTtl,
}

/// What [`FairMutex::status`] reports. Never contains a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairMutexStatus {
    /// Whether the lock key exists.
    pub held: bool,
    /// The holder's label; `None` when free or held by a client other than redlease.
    pub owner: Option<String>,
    /// The holder's remaining lease; `None` when free or when the key has no TTL.
    pub remaining: Option<Duration>,
    /// The holder's fencing token, when known. (Not recorded, as for the plain mutex:
    /// see `last_fence`.)
    pub fence: Option<FencingToken>,
    /// A fencing token at least as high as every one issued so far for this lock, and
    /// below every one issued later (see [`MutexStatus::last_fence`](crate::MutexStatus::last_fence)).
    pub last_fence: Option<FencingToken>,
    /// When the holder acquired the lock (Redis server time), when known. (Not
    /// recorded, as for the plain mutex.)
    pub since: Option<std::time::SystemTime>,
    /// How many live waiters are queued (each waiting task counts).
    pub queue_len: u64,
    /// The owner labels of the first 100 live waiters, in the order they will be served.
    pub queue: Vec<String>,
}

impl FairMutex {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let base = LockBase::new(ctx, Primitive::FairMutex, name, &keys.key, options)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let lock = base.key.clone();
        let queue: Arc<str> = keys.aux("queue").into();
        let alive: Arc<str> = keys.aux("alive").into();
        let [counter, floor] = base.ctx.fence_keys.of(&keys);
        Ok(FairMutex {
            shared: Arc::new(FairShared {
                acquire_keys: Arc::new([
                    lock.clone(),
                    queue.clone(),
                    alive.clone(),
                    counter.clone(),
                    floor.clone(),
                ]),
                release_keys: Arc::new([
                    lock.clone(),
                    queue.clone(),
                    alive.clone(),
                    counter.clone(),
                    floor.clone(),
                    keys.aux("q").into(),
                ]),
                status_keys: Arc::new([lock.clone(), counter, floor, queue.clone(), alive.clone()]),
                lock_keys: Arc::new([lock.clone()]),
                queue_keys: Arc::new([lock, queue, alive]),
                channel: format!("{}{}", keys.aux("wake:fair:"), base.ctx.id).into(),
                channel_prefix: keys.aux("wake:fair:").into(),
                plain_channel: keys.aux("wake").into(),
                base,
                ttl_arg: ttl_ms.to_string().into(),
                waiter: WaiterTtl::new(DEFAULT_WAITER_TTL, options.ttl),
            }),
        })
    }

    /// Sets how long a waiter's place survives without a heartbeat: the longest a
    /// crashed or hung waiter can hold up those behind it (plus one heartbeat interval,
    /// a third of it). Capped at the lock's lease TTL. Heartbeats cost one small script
    /// call per waiter per interval.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL out of range (10 ms ..= 30 days).
    pub fn with_waiter_ttl(self, ttl: Duration) -> Result<Self> {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        shared.waiter = WaiterTtl::checked(&shared.base.name, ttl, shared.base.options.ttl)?;
        Ok(FairMutex {
            shared: Arc::new(shared),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.base.name
    }

    /// The Redis key of the lock: `<prefix><name>`, as for the plain mutex.
    pub fn key(&self) -> &str {
        &self.shared.base.key
    }

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.base.options
    }

    /// How long a waiter's place survives without a heartbeat.
    pub fn waiter_ttl(&self) -> Duration {
        self.shared.waiter.ttl
    }

    /// Takes the lock if it is free and nobody waits for it, without queueing. One
    /// round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no lock behind: an attempt that may have reached Redis
    /// is released in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when the lock is held or others are queued for it;
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be
    /// used (after retrying temporary failures for the client's retry window).
    pub async fn try_lock(&self) -> Result<FairMutexGuard> {
        self.acquire(Wait::Try, |_| {}).await
    }

    /// Takes the lock in turn, waiting as long as it takes.
    ///
    /// One round trip when the lock is free and nobody waits. Otherwise the task joins
    /// the queue (one more round trip), heartbeats its place, and waits until the
    /// release before its turn hands it the lock: it holds the lock when that message
    /// arrives, with no request of its own. Never polls (except, when first in line,
    /// behind a holder that is not a redlease client: its release announces nothing).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future stops the heartbeat and removes its queue entry
    /// in the background, handing on to the next waiter any lock an in-flight attempt
    /// may have taken or a release may have handed it.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be
    /// used (after retrying temporary failures for the client's retry window).
    pub async fn lock(&self) -> Result<FairMutexGuard> {
        self.acquire(Wait::FOREVER, |_| {}).await
    }

    /// Takes the lock in turn, waiting at most `timeout`; a waiter that times out
    /// leaves the queue.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](FairMutex::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was not acquired in time, and the errors of
    /// [`lock`](FairMutex::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<FairMutexGuard> {
        self.acquire(Wait::timeout(timeout), |_| {}).await
    }

    /// As [`lock`](FairMutex::lock) (`timeout: None`) or
    /// [`lock_timeout`](FairMutex::lock_timeout), reporting the number of live waiters
    /// ahead of this one (0: next in line) whenever it changes.
    ///
    /// The position is learned by the waiter's own checks of the queue: when it joins,
    /// and whenever its fallback timer fires or it is told to look again. Hand-overs
    /// and departures ahead of it are not announced to everyone, so between those
    /// checks the number may be higher than the truth, and a waiter the lock is handed
    /// to need not have seen 0; [`status`](FairMutex::status) shows the whole queue at
    /// any time.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](FairMutex::lock).
    ///
    /// # Errors
    ///
    /// As [`lock_timeout`](FairMutex::lock_timeout).
    pub async fn lock_with_position(
        &self,
        timeout: Option<Duration>,
        on_position: impl FnMut(u64) + Send,
    ) -> Result<FairMutexGuard> {
        self.acquire(Wait::optional(timeout), on_position).await
    }

    async fn acquire(&self, wait: Wait, on_position: impl FnMut(u64) + Send) -> Result<FairMutexGuard> {
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        let token = Token::for_owner(&ctx.label);
        // The waiter's public id starts with its client's: releases find the client's
        // channel from it.
        let id = format!("{}{}", ctx.id, waiter_id());
        let member: Arc<str> = format!("{id}{}", token.expose()).into();
        let cmd = FAIR_ACQUIRE.evalsha(
            &s.acquire_keys,
            &[
                &*member,
                &s.ttl_arg,
                &s.waiter.arg,
                if wait.waits() { "1" } else { "0" },
                &s.channel_prefix,
                &ctx.publish,
            ],
            None,
        );
        let heartbeat = Heartbeat::new(
            ctx.clone(),
            &s.base.name,
            s.waiter.ttl,
            ScriptCall::new(
                &FAIR_HEARTBEAT,
                s.queue_keys.clone(),
                Arc::new([member.clone(), s.channel_prefix.clone(), ctx.publish.clone()]),
            ),
        );
        let spec = Acquire {
            script: &FAIR_ACQUIRE,
            cmd: &cmd,
            channel: &s.channel,
            wait,
            // Leaving removes our queue entry, and hands on the lock an attempt may have
            // taken or a release may have handed us.
            undo: self.release_call(&token, member),
            renew: self.renew_call(&token),
            release: self.release_call(&token, "".into()),
            token,
            // A release hands the lock to the first live waiter until that waiter's own
            // deadline, which is at least a waiter TTL after its last attempt.
            grant: wait.waits().then(|| Granted {
                id: &id,
                claim: s.waiter.ttl,
            }),
        };
        let ttl = s.base.options.ttl;
        let position = StdMutex::new((None::<u64>, on_position));
        let core = s
            .base
            .acquire(spec, |reply, sent| {
                if let Some(acquired) = Reply::acquired(reply, ttl, true) {
                    return Ok(acquired);
                }
                match array(reply).unwrap_or_default() {
                    [flag, pttl, place, joined, mark, foreign] if int(flag) == Some(0) => {
                        let place = int(place).and_then(|p| u64::try_from(p).ok());
                        if let Some(place) = place {
                            heartbeat.joined(sent, int(joined) == Some(1));
                            let mut report = position.lock().expect("position lock");
                            let (last, on_position) = &mut *report;
                            if *last != Some(place) {
                                *last = Some(place);
                                on_position(place);
                            }
                        }
                        Ok(Reply::Busy {
                            busy: Busy {
                                remaining: ms(int(pttl)),
                                pass_on: false,
                                mark: int(mark).and_then(|m| u64::try_from(m).ok()),
                                foreign: int(foreign) == Some(1),
                            },
                            // Queued: leaving must remove the entry.
                            queued: place.is_some(),
                        })
                    }
                    _ => Err(s.base.op("acquire").bad_reply()),
                }
            })
            .await?;
        heartbeat.stop();
        Ok(FairMutexGuard {
            fence: core.fence().unwrap_or(FencingToken::new(0)),
            core,
            mutex: self.clone(),
        })
    }

    fn release_call(&self, token: &Token, member: Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &FAIR_RELEASE,
            s.release_keys.clone(),
            Arc::new([
                token.shared(),
                member,
                s.channel_prefix.clone(),
                s.base.ctx.publish.clone(),
                s.plain_channel.clone(),
            ]),
        )
    }

    fn renew_call(&self, token: &Token) -> ScriptCall {
        ScriptCall::new(
            &MUTEX_EXTEND,
            self.shared.lock_keys.clone(),
            Arc::new([token.shared()]),
        )
    }

    /// Releases the lock held by `token`, handing it to the next waiter in the queue.
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
        let call = self.release_call(token, "".into());
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
    /// for [`FairMutexGuard::extend`], and Redis errors.
    pub async fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        let s = &*self.shared;
        let ttl_ms = s.base.ttl_ms(ttl)?;
        let cmd = self.renew_call(token).cmd_with_ttl(ttl_ms);
        let release = self.release_call(token, "".into());
        s.base
            .by_token("extend", &cmd, &MUTEX_EXTEND, Some(&release))
            .await
    }

    /// Who holds the lock, its fencing tokens, and who waits in which order.
    ///
    /// Reads only; never reveals a token. Waiters whose heartbeat lapsed are left out.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when a key is not a lock's, and Redis errors.
    pub async fn status(&self) -> Result<FairMutexStatus> {
        let s = &*self.shared;
        let cmd = FAIR_STATUS.evalsha(&s.status_keys, &[] as &[&str], None);
        let (items, _) = s.base.status(&FAIR_STATUS, &cmd, None).await?;
        let (Some(h), [_, _, _, _, _, _, waiting, labels]) = (holder(&items), &items[..]) else {
            return Err(s.base.op("status").bad_reply());
        };
        Ok(FairMutexStatus {
            held: h.held,
            owner: h.owner,
            remaining: h.remaining,
            fence: h.fence,
            last_fence: h.last_fence,
            since: h.since,
            queue_len: int(waiting).unwrap_or(0).max(0) as u64,
            queue: array(labels)
                .unwrap_or_default()
                .iter()
                .filter_map(opt_string)
                .collect(),
        })
    }
}

/// Proof of holding a [`FairMutex`], with its lease and fencing token.
///
/// Behaves as [`MutexGuard`](crate::MutexGuard): the lease renews automatically (unless
/// the lock was made with `auto_renew(false)`), [`is_held`](FairMutexGuard::is_held) and
/// [`lost`](FairMutexGuard::lost) tell when it can no longer be relied on, and
/// [`fence`](FairMutexGuard::fence) is the number to hand the protected resource.
/// Releasing hands the lock to the next waiter in the queue, and tells only it.
///
/// # Drop
///
/// Dropping the guard without [`release`](FairMutexGuard::release) stops renewal and
/// releases the lock in the background (handing it to the next waiter) when a tokio
/// runtime is running; otherwise the lease simply expires after its TTL, and the next
/// waiter takes the lock when its fallback timer (the holder's remaining lease) fires or
/// a queued waiter's heartbeat finds the lock free.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct FairMutexGuard {
    core: GuardCore,
    fence: FencingToken,
    mutex: FairMutex,
}

guard_surface!(FairMutexGuard, "this guard holds", fence: |g| Some(g.fence));

impl FairMutexGuard {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The fair mutex this guard holds.
    pub fn mutex(&self) -> &FairMutex {
        &self.mutex
    }

    /// The fencing token of this acquisition: strictly greater than that of every
    /// earlier acquisition of the same lock, fair or plain.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// Releases the lock (compare-and-delete), handing it to the next waiter in the
    /// queue.
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
    pub async fn release(self) -> Result<()> {
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out or someone releases it with the returned token
    /// ([`FairMutex::release_token`]).
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}
