//! The read-write lock: many readers or one writer, writer-preferring.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::client::{ClientInner, LeaseOptions};
use crate::error::{Error, Result};
use crate::fair::DEFAULT_WAITER_TTL;
use crate::held::{Heartbeat, Held, bad_reply, ms, start_lease};
use crate::keys::{self, LockKeys};
use crate::lease::{Lease, LostReason, ScriptCall};
use crate::scripts::{
    MUTEX_EXTEND, RW_DOWNGRADE, RW_READ, RW_READ_EXTEND, RW_READ_RELEASE, RW_STATUS, RW_WRITE,
    RW_WRITE_RELEASE, RW_WRITER_HEARTBEAT, array, int, opt_string,
};
use crate::token::{FencingToken, Token};
use crate::wait::{Attempt, Pending, WaitSpec, acquire_loop, eval_retrying};

/// A distributed read-write lock: any number of readers, or one writer.
///
/// The write lock is the key `<prefix><name>` holding the writer's token with a PX
/// TTL — the plain mutex's format, so a plain [`Mutex`](crate::Mutex) of the same name
/// (or a redis-py / redsync client) excludes readers and writers alike, though it does
/// not itself wait for readers, and its release does not wake this lock's waiters (they
/// retry when its lease would have ended). Read shares live in a sorted set beside it
/// (`{<key>}:readers`, token → lease deadline on Redis's clock). Each write acquisition
/// gets a [`FencingToken`] from the same sequence as the plain mutex of that name.
///
/// # Policy
///
/// Writer-preferring: a writer that finds the lock busy registers as waiting
/// (`{<key>}:writers`), and while any writer waits no new reader is let in. Readers
/// already inside finish; then a waiting writer takes the lock. So a stream of readers
/// cannot starve a writer — a writer waits at most for the shares that were held when it
/// arrived. The price is the mirror image: a continuous stream of writers keeps readers
/// out. Writers are not ordered among themselves.
///
/// Releases wake precisely: the last reader out wakes one waiting writer per process; a
/// writer's release wakes the next waiting writer if there is one, otherwise every
/// waiting reader. Nobody polls; a missed wake-up costs at most the remaining lease of
/// whatever blocked the waiter.
///
/// # Failure model
///
/// Every reader and the writer hold independent leases that renew themselves and expire
/// on their own: a crashed reader's share lapses after its TTL (the deadline is on Redis's
/// clock, and every script prunes lapsed shares), without waiting for the other readers.
/// A waiting writer's registration is a lease too (the *waiter TTL*, default 5 s, at
/// most the lock's TTL), heartbeated while it waits: a writer that dies while waiting
/// keeps readers out for at most that long. Exclusion holds while leases are valid and
/// Redis keeps its writes, as for the plain mutex.
///
/// `RwLock` is a cheap handle (clone it freely); it holds nothing by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
/// let config = client.rwlock("config")?;
///
/// let reading = config.read().await?;
/// // ... read the configuration, alongside other readers ...
/// reading.release().await?;
///
/// let writing = config.write().await?;
/// // ... rewrite it, passing writing.fence() to the store ...
/// let reading = writing.downgrade().await?; // no writer can slip in between
/// reading.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    shared: Arc<RwShared>,
}

#[derive(Clone, Debug)]
struct RwShared {
    client: Arc<ClientInner>,
    name: Arc<str>,
    lock: Arc<str>,
    meta: Arc<str>,
    readers: Arc<str>,
    writers: Arc<str>,
    read_channel: Arc<str>,
    write_channel: Arc<str>,
    options: LeaseOptions,
    ttl_arg: Arc<str>,
    waiter_ttl: Duration,
    waiter_ttl_arg: Arc<str>,
}

/// What [`RwLock::status`] reports. Never contains a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockStatus {
    /// Whether a writer holds the lock (the lock key exists).
    pub write_held: bool,
    /// The writer's label; `None` when not write-held or held by a client other than
    /// redlease.
    pub writer: Option<String>,
    /// The writer's remaining lease; `None` when not write-held or without TTL.
    pub remaining: Option<Duration>,
    /// The writer's fencing token, when known.
    pub fence: Option<FencingToken>,
    /// The highest fencing token issued for this lock within the metadata retention.
    pub last_fence: Option<FencingToken>,
    /// When the writer acquired the lock (Redis server time), when known.
    pub since: Option<SystemTime>,
    /// Read shares held with a live lease.
    pub readers: u64,
    /// Writers registered as waiting (they keep new readers out).
    pub waiting_writers: u64,
}

impl RwLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&client.prefix, name)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let waiter_ttl = options.ttl.min(DEFAULT_WAITER_TTL);
        Ok(RwLock {
            shared: Arc::new(RwShared {
                lock: keys.key.as_str().into(),
                meta: keys.aux("meta").into(),
                readers: keys.aux("readers").into(),
                writers: keys.aux("writers").into(),
                read_channel: keys.aux("wake:read").into(),
                write_channel: keys.aux("wake:write").into(),
                name: name.into(),
                client,
                options,
                ttl_arg: ttl_ms.to_string().into(),
                waiter_ttl,
                waiter_ttl_arg: (waiter_ttl.as_millis() as u64).to_string().into(),
            }),
        })
    }

    /// Sets how long a waiting writer's registration survives without a heartbeat: the
    /// longest a writer that died while waiting keeps new readers out.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL out of range (10 ms ..= 30 days).
    pub fn with_waiter_ttl(self, ttl: Duration) -> Result<Self> {
        let ttl_ms = keys::ttl_ms(&self.shared.name, ttl)?;
        let mut shared = Arc::unwrap_or_clone(self.shared);
        shared.waiter_ttl = ttl;
        shared.waiter_ttl_arg = ttl_ms.to_string().into();
        Ok(RwLock {
            shared: Arc::new(shared),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the write lock: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.lock
    }

    /// The lease options of this lock (for readers and writers alike).
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
    }

    /// How long a waiting writer's registration survives without a heartbeat.
    pub fn waiter_ttl(&self) -> Duration {
        self.shared.waiter_ttl
    }

    /// Takes a read share if no writer holds the lock or waits for it. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no share behind: an attempt that may have reached
    /// Redis is released in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when a writer holds or waits; [`Error::WrongType`],
    /// [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be used.
    pub async fn try_read(&self) -> Result<RwLockReadGuard> {
        self.acquire_read(None).await
    }

    /// Takes a read share, waiting as long as it takes for writers (holding or waiting)
    /// to finish.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no share behind, and a
    /// wake-up it consumed is passed on to another waiter.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be
    /// used (after retrying temporary failures for the client's retry window).
    pub async fn read(&self) -> Result<RwLockReadGuard> {
        self.acquire_read(Some(None)).await
    }

    /// Takes a read share, waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](RwLock::read).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when no share was granted in time, and the errors of
    /// [`read`](RwLock::read).
    pub async fn read_timeout(&self, timeout: Duration) -> Result<RwLockReadGuard> {
        self.acquire_read(Some(Some(Instant::now() + timeout))).await
    }

    /// Takes the write lock if no writer holds it and no reader holds a share, without
    /// registering as waiting. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no lock behind.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when the lock is held; otherwise as [`write`](RwLock::write).
    pub async fn try_write(&self) -> Result<RwLockWriteGuard> {
        self.acquire_write(None).await
    }

    /// Takes the write lock, waiting as long as it takes. While it waits, new readers
    /// are kept out.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future stops the registration's heartbeat and
    /// withdraws it in the background (waking readers it kept out), and removes any
    /// lock an in-flight attempt may have taken.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot be
    /// used (after retrying temporary failures for the client's retry window).
    pub async fn write(&self) -> Result<RwLockWriteGuard> {
        self.acquire_write(Some(None)).await
    }

    /// Takes the write lock, waiting at most `timeout`; a writer that times out
    /// withdraws its registration.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](RwLock::write).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was not acquired in time, and the errors of
    /// [`write`](RwLock::write).
    pub async fn write_timeout(&self, timeout: Duration) -> Result<RwLockWriteGuard> {
        self.acquire_write(Some(Some(Instant::now() + timeout))).await
    }

    async fn acquire_read(&self, wait: Option<Option<Instant>>) -> Result<RwLockReadGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let cmd = RW_READ.evalsha(
            &[&s.lock, &s.readers, &s.writers],
            &[token.expose(), &s.ttl_arg],
            None,
        );
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            self.read_release_call(&token),
            s.options.ttl,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &s.read_channel,
            wait,
            fallback: s.options.ttl,
        };
        let (pending_ref, cmd_ref, token_ref) = (&pending, &cmd, &token);
        let lease = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let reply = eval_retrying(
                &s.client,
                &s.name,
                &s.lock,
                "read",
                &RW_READ,
                cmd_ref,
                deadline,
                Some(pending_ref),
            )
            .await
            .inspect_err(|e| {
                if !e.is_unavailable() {
                    // A definite error reply: the script fails before it writes a share.
                    pending_ref.answered_no();
                }
            })?;
            if int(&reply) == Some(1) {
                return Ok(Attempt::Acquired(self.read_lease(token_ref, sent, s.options.ttl)));
            }
            match array(&reply).unwrap_or_default() {
                [flag, remaining] if int(flag) == Some(1) => {
                    let remaining = ms(int(remaining)).unwrap_or_default();
                    Ok(Attempt::Acquired(self.read_lease(token_ref, sent, remaining)))
                }
                [flag, remaining] if int(flag) == Some(0) => {
                    pending_ref.answered_no();
                    Ok(Attempt::Busy {
                        remaining: ms(int(remaining)),
                    })
                }
                _ => Err(bad_reply(&s.name, "read")),
            }
        })
        .await?;
        pending.disarm();
        tracing::debug!(lock = %s.name, "read share acquired");
        Ok(RwLockReadGuard {
            held: Held::new(s.client.clone(), s.name.clone(), s.lock.clone(), token, lease),
            lock: self.clone(),
        })
    }

    fn read_lease(&self, token: &Token, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &RW_READ_EXTEND,
            Arc::new([s.readers.clone()]),
            Arc::new([token.shared()]),
        );
        start_lease(
            &s.client,
            &s.name,
            sent,
            s.options.ttl,
            remaining,
            renew,
            self.read_release_call(token),
            s.options.auto_renew,
        )
    }

    fn read_release_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &RW_READ_RELEASE,
            Arc::new([s.readers.clone(), s.writers.clone()]),
            Arc::new([token.shared(), s.client.publish.clone(), s.write_channel.clone()]),
        )
    }

    async fn acquire_write(&self, wait: Option<Option<Instant>>) -> Result<RwLockWriteGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let cmd = RW_WRITE.evalsha(
            &[&s.lock, &s.meta, &s.readers, &s.writers],
            &[
                token.expose(),
                &s.ttl_arg,
                &s.client.label,
                &s.client.retention_arg,
                &s.waiter_ttl_arg,
                if wait.is_some() { "1" } else { "0" },
            ],
            None,
        );
        // Withdraws the registration and any lock an attempt may have taken.
        let withdraw = self.write_release_call(&token, true);
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            withdraw.clone(),
            s.options.ttl.max(s.waiter_ttl),
        );
        let heartbeat = Heartbeat::new(
            s.client.clone(),
            &s.name,
            s.waiter_ttl,
            ScriptCall::new(
                &RW_WRITER_HEARTBEAT,
                Arc::new([s.writers.clone()]),
                Arc::new([token.shared()]),
            ),
            withdraw,
        );
        let spec = WaitSpec {
            client: &s.client,
            name: &s.name,
            channel: &s.write_channel,
            wait,
            fallback: s.options.ttl,
        };
        let (pending_ref, heartbeat_ref, cmd_ref, token_ref) = (&pending, &heartbeat, &cmd, &token);
        let waits = wait.is_some();
        let (fence, lease) = acquire_loop(spec, move |deadline| async move {
            pending_ref.arm();
            let sent = Instant::now();
            let reply = eval_retrying(
                &s.client,
                &s.name,
                &s.lock,
                "write",
                &RW_WRITE,
                cmd_ref,
                deadline,
                Some(pending_ref),
            )
            .await?;
            if let Some(fence) = int(&reply) {
                return Ok(Attempt::Acquired((
                    fence as u64,
                    self.write_lease(token_ref, sent, s.options.ttl),
                )));
            }
            match array(&reply).unwrap_or_default() {
                [flag, fence, pttl] if int(flag) == Some(1) => {
                    let fence = int(fence).ok_or_else(|| bad_reply(&s.name, "write"))? as u64;
                    let remaining = ms(int(pttl)).unwrap_or(s.options.ttl);
                    Ok(Attempt::Acquired((
                        fence,
                        self.write_lease(token_ref, sent, remaining),
                    )))
                }
                [flag, remaining, registered] if int(flag) == Some(0) => {
                    if waits {
                        heartbeat_ref.joined(sent, int(registered) == Some(1));
                    } else {
                        pending_ref.answered_no();
                    }
                    Ok(Attempt::Busy {
                        remaining: ms(int(remaining)),
                    })
                }
                _ => Err(bad_reply(&s.name, "write")),
            }
        })
        .await?;
        heartbeat.stop();
        pending.disarm();
        tracing::debug!(lock = %s.name, fence, "write lock acquired");
        Ok(RwLockWriteGuard {
            held: Held::new(s.client.clone(), s.name.clone(), s.lock.clone(), token, lease),
            lock: self.clone(),
            fence: FencingToken::new(fence),
        })
    }

    fn write_lease(&self, token: &Token, sent: Instant, remaining: Duration) -> Lease {
        let s = &*self.shared;
        let renew = ScriptCall::new(
            &MUTEX_EXTEND,
            Arc::new([s.lock.clone(), s.meta.clone()]),
            Arc::new([token.shared(), s.client.retention_arg.clone()]),
        );
        start_lease(
            &s.client,
            &s.name,
            sent,
            s.options.ttl,
            remaining,
            renew,
            self.write_release_call(token, false),
            s.options.auto_renew,
        )
    }

    fn write_release_call(&self, token: &Token, withdraw: bool) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &RW_WRITE_RELEASE,
            Arc::new([s.lock.clone(), s.writers.clone()]),
            Arc::new([
                token.shared(),
                if withdraw { "1" } else { "0" }.into(),
                s.client.publish.clone(),
                s.read_channel.clone(),
                s.write_channel.clone(),
            ]),
        )
    }

    /// Whether a writer holds the lock, how many readers hold shares and how many
    /// writers wait, with the writer's fencing token and label.
    ///
    /// Reads only; never reveals a token.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when a key is not a lock's, and Redis errors.
    pub async fn status(&self) -> Result<RwLockStatus> {
        let s = &*self.shared;
        let cmd = RW_STATUS.evalsha(&[&s.lock, &s.meta, &s.readers, &s.writers], &[] as &[&str], None);
        let reply = eval_retrying(
            &s.client, &s.name, &s.lock, "status", &RW_STATUS, &cmd, None, None,
        )
        .await?;
        let items = array(&reply).ok_or_else(|| bad_reply(&s.name, "status"))?;
        let [held, pttl, label, fence, since, last, readers, writers] = items else {
            return Err(bad_reply(&s.name, "status"));
        };
        let fence_of = |v: &redis::Value| opt_string(v).and_then(|x| x.parse().ok()).map(FencingToken::new);
        Ok(RwLockStatus {
            write_held: int(held) == Some(1),
            writer: opt_string(label),
            remaining: ms(int(pttl)),
            fence: fence_of(fence),
            last_fence: fence_of(last),
            since: opt_string(since)
                .and_then(|x| x.parse::<u64>().ok())
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
            readers: int(readers).unwrap_or(0).max(0) as u64,
            waiting_writers: int(writers).unwrap_or(0).max(0) as u64,
        })
    }
}

/// Proof of holding a read share of an [`RwLock`], with its own lease.
///
/// The lease renews automatically (unless the lock was made with `auto_renew(false)`)
/// independently of other readers'; [`is_held`](RwLockReadGuard::is_held) and
/// [`lost`](RwLockReadGuard::lost) tell when it can no longer be relied on. Readers get
/// no fencing token: they do not modify the resource.
///
/// # Drop
///
/// Dropping the guard without [`release`](RwLockReadGuard::release) stops renewal and
/// gives the share back in the background when a tokio runtime is running (waking a
/// waiting writer if it was the last share); otherwise the share lapses after its TTL.
#[must_use = "dropping the guard releases the read share"]
#[derive(Debug)]
pub struct RwLockReadGuard {
    held: Held,
    lock: RwLock,
}

impl RwLockReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The read-write lock this share belongs to.
    pub fn rwlock(&self) -> &RwLock {
        &self.lock
    }

    /// The share's secret token. Never log it.
    pub fn token(&self) -> &Token {
        self.held.token()
    }

    /// The share's lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        self.held.lease()
    }

    /// Until when the reader may rely on its share (see [`Lease::valid_until`]).
    pub fn valid_until(&self) -> std::time::Instant {
        self.held.lease().valid_until()
    }

    /// Whether the share's lease is still valid.
    pub fn is_held(&self) -> bool {
        self.held.lease().is_held()
    }

    /// Completes when the share's lease is lost (see [`Lease::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.held.lease().lost().await
    }

    /// Sets the share's remaining lease to `ttl`, from now.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the share was already lost;
    /// Redis errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    /// Gives the share back; the last reader out wakes a waiting writer.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the share had already lapsed — a writer may have been let
    /// in meanwhile; Redis errors.
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the share stays until
    /// its lease lapses.
    pub fn forget(self) -> Token {
        self.held.forget()
    }
}

/// Proof of holding the write lock of an [`RwLock`], with its lease and fencing token.
///
/// Behaves as [`MutexGuard`](crate::MutexGuard): automatic renewal, a
/// [`lost`](RwLockWriteGuard::lost) signal, and [`fence`](RwLockWriteGuard::fence) to
/// hand the protected resource. [`downgrade`](RwLockWriteGuard::downgrade) turns it into
/// a read share without letting another writer in between.
///
/// # Drop
///
/// Dropping the guard without [`release`](RwLockWriteGuard::release) stops renewal and
/// releases the lock in the background when a tokio runtime is running (waking the next
/// writer, or the readers); otherwise the lease expires after its TTL.
#[must_use = "dropping the guard releases the write lock"]
#[derive(Debug)]
pub struct RwLockWriteGuard {
    held: Held,
    lock: RwLock,
    fence: FencingToken,
}

impl RwLockWriteGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The lock's Redis key.
    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// The read-write lock this guard holds.
    pub fn rwlock(&self) -> &RwLock {
        &self.lock
    }

    /// The fencing token of this write acquisition: strictly greater than that of every
    /// earlier write acquisition (and plain-mutex acquisition) of the same name.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The secret token stored in the lock key. Never log it.
    pub fn token(&self) -> &Token {
        self.held.token()
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        self.held.lease()
    }

    /// Until when the writer may rely on the lock (see [`Lease::valid_until`]).
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

    /// Sets the remaining lease to `ttl`, from now.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the lease was already lost;
    /// Redis errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    /// Releases the write lock; wakes the next waiting writer, or else every waiting
    /// reader.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already been lost; Redis errors.
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }

    /// Turns the write lock into a read share in one atomic step: no other writer can
    /// take the lock in between. Other waiting readers are let in too, unless a writer
    /// waits (writer preference). The share has a fresh token and lease.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases in the background whatever it held at that point —
    /// the write lock, or the read share the downgrade may already have made — so
    /// nothing is left behind.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the write lease had already been lost (nothing is held
    /// afterwards); Redis errors (the background release then runs as on cancellation).
    pub async fn downgrade(self) -> Result<RwLockReadGuard> {
        let RwLockWriteGuard { held, lock, .. } = self;
        let s = &*lock.shared;
        let reader = Token::generate();
        let cmd = RW_DOWNGRADE.evalsha(
            &[&s.lock, &s.readers, &s.writers],
            &[
                held.token().expose(),
                reader.expose(),
                &s.ttl_arg,
                &s.client.publish,
                &s.read_channel,
            ],
            None,
        );
        // Until Redis answers, the share may exist: release it if we stop here. `held`
        // releases the write lock if we stop here (a no-op once the downgrade landed).
        let pending = Pending::new(
            s.client.clone(),
            &s.name,
            lock.read_release_call(&reader),
            s.options.ttl,
        );
        pending.arm();
        let sent = Instant::now();
        let reply = eval_retrying(
            &s.client,
            &s.name,
            &s.lock,
            "downgrade",
            &RW_DOWNGRADE,
            &cmd,
            None,
            Some(&pending),
        )
        .await?;
        if int(&reply) != Some(1) {
            pending.answered_no();
            held.lease().shared.end(LostReason::Gone);
            return Err(Error::NotHeld {
                name: s.name.to_string(),
            });
        }
        pending.disarm();
        held.disown();
        tracing::debug!(lock = %s.name, "write lock downgraded to a read share");
        let lease = lock.read_lease(&reader, sent, s.options.ttl);
        Ok(RwLockReadGuard {
            held: Held::new(s.client.clone(), s.name.clone(), s.lock.clone(), reader, lease),
            lock: lock.clone(),
        })
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out.
    pub fn forget(self) -> Token {
        self.held.forget()
    }
}
