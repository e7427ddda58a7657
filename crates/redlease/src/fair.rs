//! The fair mutex: waiters acquire in arrival order.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::client::{ClientInner, LeaseOptions};
#[allow(unused_imports)] // `Error` is named by the docs' links
use crate::error::{Error, Result};
use crate::held::{Heartbeat, Held, bad_reply, ms, start_lease, waiter_id};
use crate::keys::{self, LockKeys};
use crate::lease::{Lease, LostReason, ScriptCall};
use crate::scripts::{
    FAIR_ACQUIRE, FAIR_HEARTBEAT, FAIR_RELEASE, FAIR_STATUS, MUTEX_EXTEND, array, int, opt_string,
};
use crate::token::{FencingToken, Token};
use crate::wait::{Attempt, Pending, WaitSpec, acquire_loop, eval_by_token, eval_retrying};

/// Default time a waiter's place in the queue survives without a heartbeat (capped at
/// the lease TTL).
pub const DEFAULT_WAITER_TTL: Duration = Duration::from_secs(5);

/// A distributed mutex that serves its waiters in arrival order (FIFO).
///
/// The lock itself is the plain [`Mutex`](crate::Mutex)'s: the key `<prefix><name>`
/// holding the holder's random token with a PX TTL, and the same metadata, so a fair
/// and a plain mutex of one name exclude each other (as do redis-py, redsync and
/// node-redlock clients) and share one sequence of [`FencingToken`]s. The guard has the
/// plain mutex's semantics: fencing token, automatic renewal, [`lost`](FairMutexGuard::lost)
/// signal, background release on drop.
///
/// # Policy
///
/// First come, first served. A waiter joins a queue (`{<key>}:queue`) with a ticket
/// when it first finds the lock busy, and takes the lock only when every live waiter
/// ahead of it has had its turn; its position is kept across retries and reported by
/// [`lock_with_position`](FairMutex::lock_with_position) and [`status`](FairMutex::status).
/// A release wakes only the next waiter, on that waiter's own channel — not a herd.
///
/// Clients that do not take part in the queue are not held to it: a plain `Mutex`,
/// redis-py or redsync client of the same name takes the lock whenever it finds it free,
/// ahead of queued waiters ("barging"), and the next fair waiter learns of its release
/// only when that client's lease would have ended. Use one kind of client per name to
/// keep the order strict.
///
/// # Failure model
///
/// Each queue entry is a small lease of its own: the waiter heartbeats it every third
/// of the *waiter TTL* (default 5 s, at most the lock's TTL; see
/// [`with_waiter_ttl`](FairMutex::with_waiter_ttl)), with the deadline on Redis's clock.
/// A waiter that crashes or hangs stops heartbeating; its entry is pruned by the next
/// script that looks once its deadline passes, and every live waiter's heartbeat looks,
/// so a dead waiter delays those behind it by at most its waiter TTL plus one heartbeat
/// interval — never minutes. A waiter that gives up (timeout, cancellation) leaves the
/// queue at once. A waiter whose own entry was pruned while it was paused rejoins at the
/// back. Mutual exclusion itself is that of the plain mutex: it holds while leases are
/// valid and Redis keeps its writes.
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
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// `[lock, meta, queue, alive]`: acquire and status.
    keys: Arc<[Arc<str>]>,
    /// `[lock, meta]`: the plain mutex's extend script renews the holder.
    lock_keys: Arc<[Arc<str>]>,
    /// `[lock, queue, alive]`: heartbeat and release.
    queue_keys: Arc<[Arc<str>]>,
    /// A waiter's wake-up channel is this prefix plus its id: `{<key>}:wake:<id>`.
    channel_prefix: Arc<str>,
    /// The plain mutex's channel, `{<key>}:wake`.
    plain_channel: Arc<str>,
    options: LeaseOptions,
    ttl_arg: Arc<str>,
    waiter_ttl: Duration,
    waiter_ttl_arg: Arc<str>,
}

impl FairShared {
    fn key(&self) -> &str {
        &self.keys[0]
    }
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
    /// The holder's fencing token, when known.
    pub fence: Option<FencingToken>,
    /// The highest fencing token issued for this lock within the metadata retention.
    pub last_fence: Option<FencingToken>,
    /// When the holder acquired the lock (Redis server time), when known.
    pub since: Option<SystemTime>,
    /// How many live waiters are queued (each waiting task counts).
    pub queue_len: u64,
    /// The owner labels of the first 100 live waiters, in the order they will be served.
    pub queue: Vec<String>,
}

impl FairMutex {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&client.prefix, name)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let lock: Arc<str> = keys.key.as_str().into();
        let meta: Arc<str> = keys.aux("meta").into();
        let queue: Arc<str> = keys.aux("queue").into();
        let alive: Arc<str> = keys.aux("alive").into();
        let waiter_ttl = options.ttl.min(DEFAULT_WAITER_TTL);
        Ok(FairMutex {
            shared: Arc::new(FairShared {
                keys: Arc::new([lock.clone(), meta.clone(), queue.clone(), alive.clone()]),
                lock_keys: Arc::new([lock.clone(), meta]),
                queue_keys: Arc::new([lock, queue, alive]),
                channel_prefix: keys.aux("wake:").into(),
                plain_channel: keys.aux("wake").into(),
                name: name.into(),
                client,
                options,
                ttl_arg: ttl_ms.to_string().into(),
                waiter_ttl,
                waiter_ttl_arg: (waiter_ttl.as_millis() as u64).to_string().into(),
            }),
        })
    }

    /// Sets how long a waiter's place survives without a heartbeat: the longest a
    /// crashed or hung waiter can hold up those behind it (plus one heartbeat interval,
    /// a third of it). Heartbeats cost one small script call per waiter per interval.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL out of range (10 ms ..= 30 days).
    pub fn with_waiter_ttl(self, ttl: Duration) -> Result<Self> {
        let ttl_ms = keys::ttl_ms(&self.shared.name, ttl)?;
        let mut shared = Arc::unwrap_or_clone(self.shared);
        shared.waiter_ttl = ttl;
        shared.waiter_ttl_arg = ttl_ms.to_string().into();
        Ok(FairMutex {
            shared: Arc::new(shared),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the lock: `<prefix><name>`, as for the plain mutex.
    pub fn key(&self) -> &str {
        self.shared.key()
    }

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
    }

    /// How long a waiter's place survives without a heartbeat.
    pub fn waiter_ttl(&self) -> Duration {
        self.shared.waiter_ttl
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
        self.acquire(None, |_| {}).await
    }

    /// Takes the lock in turn, waiting as long as it takes.
    ///
    /// One round trip when the lock is free and nobody waits. Otherwise the task joins
    /// the queue, heartbeats its place, and waits until a release or a pruned dead
    /// waiter makes it the next in line; it is woken on its own channel, never by
    /// polling.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future stops the heartbeat and removes its queue entry
    /// (and any lock an in-flight attempt may have taken) in the background, waking the
    /// next waiter if it was first in line.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be
    /// used (after retrying temporary failures for the client's retry window).
    pub async fn lock(&self) -> Result<FairMutexGuard> {
        self.acquire(Some(None), |_| {}).await
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
        self.acquire(Some(Some(Instant::now() + timeout)), |_| {}).await
    }

    /// As [`lock`](FairMutex::lock) (`timeout: None`) or
    /// [`lock_timeout`](FairMutex::lock_timeout), reporting the number of live waiters
    /// ahead of this one (0: next in line) whenever it changes.
    ///
    /// The position is learned by the waiter's own checks of the queue: when it joins,
    /// and whenever it is woken or its fallback timer fires. Waiters ahead that leave
    /// are not announced to everyone, so between those checks the number may be higher
    /// than the truth; [`status`](FairMutex::status) shows the whole queue at any time.
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
        self.acquire(Some(timeout.map(|t| Instant::now() + t)), on_position)
            .await
    }

    async fn acquire(
        &self,
        wait: Option<Option<Instant>>,
        on_position: impl FnMut(u64) + Send,
    ) -> Result<FairMutexGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let id = waiter_id();
        let member: Arc<str> = format!("{id}:{}", s.client.label).into();
        let channel = format!("{}{id}", s.channel_prefix);
        let cmd = FAIR_ACQUIRE.evalsha(
            &s.keys,
            &[
                token.expose(),
                &member,
                &s.ttl_arg,
                &s.client.label,
                &s.client.retention_arg,
                &s.waiter_ttl_arg,
                if wait.is_some() { "1" } else { "0" },
                &s.channel_prefix,
                &s.client.publish,
            ],
            None,
        );
        // Leaving removes the lock an attempt may have taken and our queue entry.
        let leave = self.release_call(&token, member.clone());
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            leave.clone(),
            s.options.ttl.max(s.waiter_ttl),
        );
        let heartbeat = Heartbeat::new(
            s.client.clone(),
            &s.name,
            s.waiter_ttl,
            ScriptCall::new(
                &FAIR_HEARTBEAT,
                s.queue_keys.clone(),
                Arc::new([member, s.channel_prefix.clone(), s.client.publish.clone()]),
            ),
            leave,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &channel,
            wait,
            fallback: s.options.ttl,
        };
        let position = std::sync::Mutex::new((None::<u64>, on_position));
        let (pending_ref, heartbeat_ref, cmd_ref, token_ref, position_ref) =
            (&pending, &heartbeat, &cmd, &token, &position);
        let (fence, lease) = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let reply = eval_retrying(
                &s.client,
                &s.name,
                s.key(),
                "acquire",
                &FAIR_ACQUIRE,
                cmd_ref,
                deadline,
                Some(pending_ref),
            )
            .await?;
            if let Some(fence) = int(&reply) {
                return Ok(Attempt::Acquired((
                    fence as u64,
                    self.new_lease(token_ref, sent, s.options.ttl),
                )));
            }
            match array(&reply).unwrap_or_default() {
                [flag, fence, pttl] if int(flag) == Some(1) => {
                    let fence = int(fence).ok_or_else(|| bad_reply(&s.name, "acquire"))? as u64;
                    let remaining = ms(int(pttl)).unwrap_or(s.options.ttl);
                    Ok(Attempt::Acquired((
                        fence,
                        self.new_lease(token_ref, sent, remaining),
                    )))
                }
                [flag, pttl, place, joined] if int(flag) == Some(0) => {
                    match int(place) {
                        Some(place) if place >= 0 => {
                            heartbeat_ref.joined(sent, int(joined) == Some(1));
                            let mut report = position_ref.lock().expect("position lock");
                            let (last, on_position) = &mut *report;
                            if *last != Some(place as u64) {
                                *last = Some(place as u64);
                                on_position(place as u64);
                            }
                        }
                        // Only tried: nothing was queued.
                        _ => pending_ref.answered_no(),
                    }
                    Ok(Attempt::Busy {
                        remaining: ms(int(pttl)),
                    })
                }
                _ => Err(bad_reply(&s.name, "acquire")),
            }
        })
        .await?;
        heartbeat.stop();
        pending.disarm();
        tracing::debug!(lock = %s.name, fence, "fair lock acquired");
        Ok(FairMutexGuard {
            held: Held::new(s.client.clone(), s.name.clone(), s.keys[0].clone(), token, lease),
            mutex: self.clone(),
            fence: FencingToken::new(fence),
        })
    }

    fn new_lease(&self, token: &Token, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &MUTEX_EXTEND,
            s.lock_keys.clone(),
            Arc::new([token.shared(), s.client.retention_arg.clone()]),
        );
        start_lease(
            &s.client,
            &s.name,
            sent,
            s.options.ttl,
            remaining,
            renew,
            self.release_call(token, "".into()),
            s.options.auto_renew,
        )
    }

    fn release_call(&self, token: &Token, member: Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &FAIR_RELEASE,
            s.queue_keys.clone(),
            Arc::new([
                token.shared(),
                member,
                s.channel_prefix.clone(),
                s.client.publish.clone(),
                s.plain_channel.clone(),
            ]),
        )
    }

    /// Releases the lock held by `token` and wakes the next waiter in the queue.
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
        let call = self.release_call(token, "".into());
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
    /// (nothing is changed), and Redis errors.
    pub async fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        let s = &*self.shared;
        let ttl_ms = keys::ttl_ms(&s.name, ttl)?;
        let cmd = MUTEX_EXTEND.evalsha(
            &s.lock_keys,
            &[token.expose(), &s.client.retention_arg],
            Some(ttl_ms),
        );
        eval_by_token(&s.client, &s.name, s.key(), "extend", &MUTEX_EXTEND, &cmd).await
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
        let cmd = FAIR_STATUS.evalsha(&s.keys, &[] as &[&str], None);
        let reply = eval_retrying(
            &s.client,
            &s.name,
            s.key(),
            "status",
            &FAIR_STATUS,
            &cmd,
            None,
            None,
        )
        .await?;
        let items = array(&reply).ok_or_else(|| bad_reply(&s.name, "status"))?;
        let [held, pttl, label, fence, since, last, waiting, labels] = items else {
            return Err(bad_reply(&s.name, "status"));
        };
        let fence_of = |v: &redis::Value| opt_string(v).and_then(|x| x.parse().ok()).map(FencingToken::new);
        Ok(FairMutexStatus {
            held: int(held) == Some(1),
            owner: opt_string(label),
            remaining: ms(int(pttl)),
            fence: fence_of(fence),
            last_fence: fence_of(last),
            since: opt_string(since)
                .and_then(|x| x.parse::<u64>().ok())
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
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
/// Releasing wakes the next waiter in the queue, and only it.
///
/// # Drop
///
/// Dropping the guard without [`release`](FairMutexGuard::release) stops renewal and
/// releases the lock in the background (waking the next waiter) when a tokio runtime is
/// running; otherwise the lease simply expires after its TTL, and the next waiter takes
/// the lock when its fallback timer (the holder's remaining lease) fires.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct FairMutexGuard {
    held: Held,
    mutex: FairMutex,
    fence: FencingToken,
}

impl FairMutexGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.mutex.name()
    }

    /// The lock's Redis key.
    pub fn key(&self) -> &str {
        self.mutex.key()
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

    /// The secret token stored in the lock key. Needed only to hand the lock to another
    /// process; never log it.
    pub fn token(&self) -> &Token {
        self.held.token()
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        self.held.lease()
    }

    /// Until when the holder may rely on the lock (see [`Lease::valid_until`]).
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.lease().valid_until()
    }

    /// Whether the lease is still valid: not lost, and not past `valid_until`.
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
    /// guard then reports [`LostReason::Gone`]); Redis errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    /// Releases the lock (compare-and-delete) and wakes the next waiter in the queue.
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
        let fence = self.fence;
        let name = self.mutex.shared.name.clone();
        self.held.release().await?;
        tracing::debug!(lock = %name, %fence, "fair lock released");
        Ok(())
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out or someone releases it with the returned token
    /// ([`FairMutex::release_token`]).
    pub fn forget(self) -> Token {
        self.held.forget()
    }
}
