//! The read-write lock: many readers or one writer, writer-preferring.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::acquire::{Acquire, Busy, Reply};
use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait};
use crate::engine::guard::{GuardCore, Held, LockBase, guard_surface};
use crate::engine::heartbeat::{Heartbeat, WaiterTtl};
use crate::engine::metrics::Primitive;
#[allow(unused_imports)] // `Error` is named by the docs' links
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::{DEFAULT_WAITER_TTL, LeaseOptions};
use crate::script::reply::{array, holder, int, ms};
use crate::script::{
    LEASE_EXTEND, RW_DOWNGRADE, RW_READ, RW_READ_EXTEND, RW_READ_RELEASE, RW_STATUS, RW_WRITE,
    RW_WRITE_RELEASE, RW_WRITER_HEARTBEAT, ScriptCall,
};
use crate::token::{FencingToken, Token};

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
    base: LockBase,
    meta: Arc<str>,
    /// The fencing counter of the lock's hash slot and its floor (the writer's fencing
    /// tokens, shared with a plain mutex of the same name).
    fence_keys: [Arc<str>; 2],
    readers: Arc<str>,
    writers: Arc<str>,
    read_channel: Arc<str>,
    write_channel: Arc<str>,
    ttl_arg: Arc<str>,
    waiter: WaiterTtl,
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
    pub since: Option<std::time::SystemTime>,
    /// Read shares held with a live lease.
    pub readers: u64,
    /// Writers registered as waiting (they keep new readers out).
    pub waiting_writers: u64,
}

impl RwLock {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let base = LockBase::new(ctx, Primitive::RwLock, name, &keys.key, options)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let [counter, floor] = base.ctx.fence_keys.of(&keys);
        Ok(RwLock {
            shared: Arc::new(RwShared {
                fence_keys: [counter, floor],
                base,
                meta: keys.aux("meta").into(),
                readers: keys.aux("readers").into(),
                writers: keys.aux("writers").into(),
                read_channel: keys.aux("wake:read").into(),
                write_channel: keys.aux("wake:write").into(),
                ttl_arg: ttl_ms.to_string().into(),
                waiter: WaiterTtl::new(DEFAULT_WAITER_TTL, options.ttl),
            }),
        })
    }

    /// Sets how long a waiting writer's registration survives without a heartbeat: the
    /// longest a writer that died while waiting keeps new readers out. Capped at the
    /// lock's lease TTL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`] for a TTL out of range (10 ms ..= 30 days).
    pub fn with_waiter_ttl(self, ttl: Duration) -> Result<Self> {
        let mut shared = Arc::unwrap_or_clone(self.shared);
        shared.waiter = WaiterTtl::checked(&shared.base.name, ttl, shared.base.options.ttl)?;
        Ok(RwLock {
            shared: Arc::new(shared),
        })
    }

    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.base.name
    }

    /// The Redis key of the write lock: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.base.key
    }

    /// The lease options of this lock (for readers and writers alike).
    pub fn options(&self) -> LeaseOptions {
        self.shared.base.options
    }

    /// How long a waiting writer's registration survives without a heartbeat.
    pub fn waiter_ttl(&self) -> Duration {
        self.shared.waiter.ttl
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
        self.acquire_read(Wait::Try).await
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
        self.acquire_read(Wait::FOREVER).await
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
        self.acquire_read(Wait::timeout(timeout)).await
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
        self.acquire_write(Wait::Try).await
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
        self.acquire_write(Wait::FOREVER).await
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
        self.acquire_write(Wait::timeout(timeout)).await
    }

    async fn acquire_read(&self, wait: Wait) -> Result<RwLockReadGuard> {
        let s = &*self.shared;
        let token = Token::generate();
        let cmd = RW_READ.evalsha(
            &[&s.base.key, &s.readers, &s.writers],
            &[token.expose(), &s.ttl_arg],
            None,
        );
        let release = self.read_release_call(&token);
        let spec = Acquire {
            script: &RW_READ,
            cmd: &cmd,
            channel: &s.read_channel,
            wait,
            undo: release.clone(),
            renew: self.read_renew_call(&token),
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
                    [flag, remaining] if int(flag) == Some(0) => Ok(Reply::busy(ms(int(remaining)))),
                    _ => Err(s.base.op("read").bad_reply()),
                }
            })
            .await?;
        Ok(RwLockReadGuard {
            core,
            lock: self.clone(),
        })
    }

    fn read_renew_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &RW_READ_EXTEND,
            Arc::new([s.readers.clone()]),
            Arc::new([token.shared()]),
        )
    }

    fn read_release_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &RW_READ_RELEASE,
            Arc::new([s.readers.clone(), s.writers.clone()]),
            Arc::new([
                token.shared(),
                s.base.ctx.publish.clone(),
                s.write_channel.clone(),
            ]),
        )
    }

    async fn acquire_write(&self, wait: Wait) -> Result<RwLockWriteGuard> {
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        let token = Token::generate();
        let [counter, floor] = &s.fence_keys;
        let cmd = RW_WRITE.evalsha(
            &[&s.base.key, &s.meta, &s.readers, &s.writers, counter, floor],
            &[
                token.expose(),
                &s.ttl_arg,
                &ctx.label,
                &ctx.retention_arg,
                &s.waiter.arg,
                if wait.waits() { "1" } else { "0" },
            ],
            None,
        );
        let heartbeat = Heartbeat::new(
            ctx.clone(),
            &s.base.name,
            s.waiter.ttl,
            ScriptCall::new(
                &RW_WRITER_HEARTBEAT,
                Arc::new([s.writers.clone()]),
                Arc::new([token.shared()]),
            ),
        );
        let spec = Acquire {
            script: &RW_WRITE,
            cmd: &cmd,
            channel: &s.write_channel,
            wait,
            // Withdraws the registration and any lock an attempt may have taken.
            undo: self.write_release_call(&token, true),
            renew: ScriptCall::new(
                &LEASE_EXTEND,
                Arc::new([s.base.key.clone(), s.meta.clone()]),
                Arc::new([token.shared(), ctx.retention_arg.clone()]),
            ),
            release: self.write_release_call(&token, false),
            token,
            grant: None,
        };
        let ttl = s.base.options.ttl;
        let waits = wait.waits();
        let core = s
            .base
            .acquire(spec, |reply, sent| {
                if let Some(acquired) = Reply::acquired(reply, ttl, true) {
                    return Ok(acquired);
                }
                match array(reply).unwrap_or_default() {
                    [flag, remaining, registered] if int(flag) == Some(0) => {
                        if waits {
                            heartbeat.joined(sent, int(registered) == Some(1));
                        }
                        Ok(Reply::Busy {
                            busy: Busy {
                                remaining: ms(int(remaining)),
                                pass_on: false,
                                mark: None,
                                foreign: false,
                            },
                            // A waiting writer's registration must be withdrawn.
                            queued: waits,
                        })
                    }
                    _ => Err(s.base.op("write").bad_reply()),
                }
            })
            .await?;
        heartbeat.stop();
        Ok(RwLockWriteGuard {
            fence: core.fence().unwrap_or(FencingToken::new(0)),
            core,
            lock: self.clone(),
        })
    }

    fn write_release_call(&self, token: &Token, withdraw: bool) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &RW_WRITE_RELEASE,
            Arc::new([s.base.key.clone(), s.writers.clone()]),
            Arc::new([
                token.shared(),
                if withdraw { "1" } else { "0" }.into(),
                s.base.ctx.publish.clone(),
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
        let op = s.base.op("status");
        let cmd = RW_STATUS.evalsha(
            &[&s.base.key, &s.meta, &s.readers, &s.writers],
            &[] as &[&str],
            None,
        );
        let reply = op.eval(&RW_STATUS, &cmd, Deadline::Never, None).await?;
        let items = array(&reply).ok_or_else(|| op.bad_reply())?;
        let (Some(h), [.., readers, writers]) = (holder(items), items) else {
            return Err(op.bad_reply());
        };
        if items.len() != 8 {
            return Err(op.bad_reply());
        }
        Ok(RwLockStatus {
            write_held: h.held,
            writer: h.owner,
            remaining: h.remaining,
            fence: h.fence,
            last_fence: h.last_fence,
            since: h.since,
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
    core: GuardCore,
    lock: RwLock,
}

guard_surface!(RwLockReadGuard, "this share belongs to", fence: |_g| None);

impl RwLockReadGuard {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The read-write lock this share belongs to.
    pub fn rwlock(&self) -> &RwLock {
        &self.lock
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
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the share stays until
    /// its lease lapses.
    pub fn forget(self) -> Token {
        self.core.forget()
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
    core: GuardCore,
    fence: FencingToken,
    lock: RwLock,
}

guard_surface!(RwLockWriteGuard, "this guard holds", fence: |g| Some(g.fence));

impl RwLockWriteGuard {
    fn core(&self) -> &GuardCore {
        &self.core
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
        self.core.release().await
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
        let RwLockWriteGuard { core, lock, .. } = self;
        let s = &*lock.shared;
        let op = s.base.op("downgrade");
        let reader = Token::generate();
        let cmd = RW_DOWNGRADE.evalsha(
            &[&s.base.key, &s.readers, &s.writers],
            &[
                core.token().expose(),
                reader.expose(),
                &s.ttl_arg,
                &s.base.ctx.publish,
                &s.read_channel,
            ],
            None,
        );
        // Until Redis answers, the share may exist: release it if we stop here. `core`
        // releases the write lock if we stop here (a no-op once the downgrade landed).
        let claim = s.base.claim(lock.read_release_call(&reader));
        claim.arm();
        let (reply, sent) = op
            .eval_sent(&RW_DOWNGRADE, &cmd, Deadline::Never, Some(&claim))
            .await?;
        if int(&reply) != Some(1) {
            claim.answered_no();
            core.state().end(crate::engine::lease::LostReason::Gone);
            return Err(op.not_held());
        }
        claim.disarm();
        // The write lock became the share: nothing of it is left to release.
        let _ = core.take();
        tracing::debug!(lock = %s.base.name, "write lock downgraded to a read share");
        let core = s.base.hold(Held {
            fence: None,
            sent,
            remaining: s.base.options.ttl,
            renew: lock.read_renew_call(&reader),
            release: lock.read_release_call(&reader),
            token: reader,
        });
        Ok(RwLockReadGuard {
            core,
            lock: lock.clone(),
        })
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// until its lease runs out.
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}
