//! The one guard core every guard is built on, and the public surface every guard
//! shows ([`Guard`]).
//!
//! A [`GuardCore`] owns one held acquisition: its token, its fencing token (when the
//! primitive has one) and its lease. It alone extends and releases — with retries,
//! the replica policy, and the rule that decides whether an earlier attempt of a
//! release whose reply was lost did land — and it releases in the background when it
//! is dropped. A primitive's guard wraps it and adds only what is its own (the plain
//! mutex's local hand-over, a read-write lock's downgrade, a semaphore's permit count).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::{Cmd, Value};
use tokio::time::Instant;

use super::context::Context;
use super::deadline::Deadline;
use super::lease::{Lease, LeaseState, LostReason, Renew};
use super::metrics::Primitive;
use super::request::{Acked, Claim, Op, spawn_release};
use crate::error::{Error, Result};
use crate::keys;
use crate::options::{LeaseOptions, OnShortfall};
use crate::script::ScriptCall;
use crate::script::reply::int;
use crate::token::{FencingToken, Token};

/// What every guard shows, whatever kind of lock it holds: tokio's guards all wrap one
/// releasing permit, and redlease's all wrap one lease.
///
/// Every guard type implements it, and also has the same methods of its own (as
/// `async fn`s, with its own documentation), so there is no need to import the trait
/// to use one guard. The trait is for code that holds "any lock" — a `Box<dyn Guard>`,
/// as the command-line tool does for every kind of lock it runs a command under.
///
/// # Examples
///
/// ```no_run
/// use redlease::Guard;
///
/// # async fn demo(client: redlease::Client, fair: bool) -> Result<(), redlease::Error> {
/// let guard: Box<dyn Guard> = if fair {
///     Box::new(client.fair_mutex("report")?.lock().await?)
/// } else {
///     Box::new(client.mutex("report")?.lock().await?)
/// };
/// println!("{} held with fencing token {:?}", guard.name(), guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub trait Guard: Send + Sync + std::fmt::Debug {
    /// The lock's name (without the prefix).
    fn name(&self) -> &str;

    /// The lock's Redis key.
    fn key(&self) -> &str;

    /// The fencing token of this acquisition, for the kinds of lock that issue one
    /// (the plain and fair mutex, a read-write lock's writer); `None` for the others,
    /// and for a lock over several names, which has one per name
    /// ([`MultiLockGuard::fences`](crate::MultiLockGuard::fences)).
    fn fence(&self) -> Option<FencingToken>;

    /// The lease; clone it to watch for loss from another task.
    fn lease(&self) -> &Lease;

    /// Until when the holder may rely on the lock (see [`Lease::valid_until`]).
    fn valid_until(&self) -> std::time::Instant {
        self.lease().valid_until()
    }

    /// Whether the lease is still valid: not lost, and not past `valid_until`.
    fn is_held(&self) -> bool {
        self.lease().is_held()
    }

    /// Completes when the lease is lost (see [`Lease::lost`]). Cancel safe.
    fn lost(&self) -> BoxFuture<'_, LostReason> {
        Box::pin(self.lease().lost())
    }

    /// Makes the lease last at least `ttl` from now; automatic renewals continue with
    /// `ttl`. A lease is never shortened.
    fn extend(&self, ttl: Duration) -> BoxFuture<'_, Result<()>>;

    /// Releases the lock and wakes waiters; [`Error::NotHeld`] when the lease had
    /// already been lost.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

/// How a lock is released and extended, and what names its errors: everything of a
/// primitive that its guards need.
#[derive(Clone, Debug)]
pub(crate) struct LockBase {
    pub ctx: Arc<Context>,
    pub name: Arc<str>,
    /// The lock's main key.
    pub key: Arc<str>,
    pub options: LeaseOptions,
    /// Lease lengths must be whole seconds (a legacy lock in seconds).
    pub whole_seconds: bool,
    /// The kind of lock, as the metrics label it.
    pub primitive: Primitive,
}

impl LockBase {
    /// The base of a `primitive`'s lock `name` at `key`, after checking `options` (the
    /// lease length, and the replica policy against the lease and the connection's
    /// reply timeout).
    pub fn new(
        ctx: Arc<Context>,
        primitive: Primitive,
        name: &str,
        key: &Arc<str>,
        options: LeaseOptions,
    ) -> Result<Self> {
        keys::ttl_ms(name, options.ttl)?;
        if let Some(policy) = &options.replica_ack {
            policy.validate(name, options.ttl, ctx.topology.response_timeout)?;
        }
        Ok(LockBase {
            ctx,
            name: name.into(),
            key: key.clone(),
            options,
            whole_seconds: false,
            primitive,
        })
    }

    /// An operation on this lock.
    pub fn op(&self, what: &'static str) -> Op<'_> {
        Op::new(&self.ctx, &self.name, &self.key, what)
    }

    /// Checks a new lease length for this lock — and its replica policy against it: the
    /// wait for replicas eats into every lease as into the first — and returns it in
    /// milliseconds.
    pub fn ttl_ms(&self, ttl: Duration) -> Result<u64> {
        let ms = keys::ttl_ms(&self.name, ttl)?;
        if self.whole_seconds && ttl.subsec_nanos() != 0 {
            return Err(Error::InvalidTtl {
                name: self.name.to_string(),
                ttl,
                reason: "a legacy lock in seconds needs a whole number of seconds",
            });
        }
        if let Some(policy) = &self.options.replica_ack {
            policy.validate(&self.name, ttl, self.ctx.topology.response_timeout)?;
        }
        Ok(ms)
    }

    /// A claim undone by `release`, for a lease of the lock's TTL.
    pub fn claim(&self, release: ScriptCall) -> Claim {
        Claim::new(self.ctx.clone(), &self.name, release, self.options.ttl)
    }

    /// Starts the lease of an acquisition confirmed by a request sent at `sent` that
    /// left `remaining` on the server, renewed by `renew` (TTL appended) and released
    /// by `release`, and returns its guard core.
    pub fn hold(&self, held: Held) -> GuardCore {
        let Held {
            token,
            fence,
            sent,
            remaining,
            renew,
            release,
        } = held;
        let state = LeaseState::new(
            self.name.clone(),
            sent,
            self.options.ttl,
            remaining,
            Renew::Script(renew.clone()),
            self.options.auto_renew,
            Some(self.primitive),
        );
        // Renewed, or watched for running out.
        self.ctx.renewer.schedule(&state);
        GuardCore {
            keeper: Keeper::Script {
                base: self.clone(),
                renew,
                release,
            },
            token: Some(token),
            fence: fence.map(FencingToken::new),
            lease: Lease::new(state),
        }
    }

    /// Releases `lease` through `call` (a compare-and-delete whose reply follows
    /// [`Released::of`]). The lease is still renewed while the release is on its way,
    /// so `valid_until` stays a lower bound of the server's expiry until the answer. A
    /// release whose request may have landed but whose reply was lost finishes in the
    /// background if this future is dropped.
    pub async fn release(&self, call: &ScriptCall, lease: &LeaseState) -> Result<()> {
        let op = self.op("release");
        let claim = Claim::new(self.ctx.clone(), &self.name, call.clone(), lease.ttl());
        claim.arm();
        let sent = Instant::now();
        let valid_until = lease.valid_until();
        let reply = op.call(call, Deadline::Never, Some(&claim)).await?;
        let doubted = claim.doubted();
        claim.disarm();
        match Released::of(&reply) {
            Released::Now => Ok(()),
            // Free, and we were its last holder: if an earlier attempt of this release
            // may have landed while the lease was still valid, that attempt released it.
            Released::FreeAfterUs if doubted && sent < valid_until => Ok(()),
            // Not ours: if an earlier attempt may have landed and this answer came back
            // while the lease was still valid (renewals kept it so meanwhile), the key
            // cannot have expired on the server before this retry ran. As long as Redis
            // kept its writes, that earlier attempt deleted it — and its wake-up let the
            // next holder in. (The clock is read only here: a moment after the answer
            // came, which only makes the test stricter.)
            Released::NotOurs if doubted && Instant::now() < lease.valid_until() => Ok(()),
            _ => Err(op.not_held()),
        }
    }

    /// Runs a status script (which only reads) and, given the lock's wake-up `channel`,
    /// counts the processes listening on it at the same time; returns the elements of
    /// the script's reply and that count.
    pub async fn status(
        &self,
        script: &'static crate::script::LuaScript,
        cmd: &Cmd,
        channel: Option<&str>,
    ) -> Result<(Vec<Value>, u64)> {
        let op = self.op("status");
        let listeners = async {
            match channel {
                Some(channel) => self.ctx.listeners(channel).await,
                None => 0,
            }
        };
        let (reply, waiters) = tokio::join!(op.eval(script, cmd, Deadline::Never, None), listeners);
        match reply? {
            Value::Array(items) => Ok((items, waiters)),
            _ => Err(op.bad_reply()),
        }
    }

    /// Runs a by-token script — release or extend a lock held by a token from outside
    /// a guard — that replies 1 when the token holds the lock; any other reply is
    /// [`Error::NotHeld`]. Extends (with `release` given, to undo a shortfall) wait for
    /// replicas under the lock's policy.
    pub async fn by_token(
        &self,
        what: &'static str,
        call: &Cmd,
        script: &'static crate::script::LuaScript,
        release: Option<&ScriptCall>,
    ) -> Result<()> {
        let op = self.op(what);
        let ack = release.and(self.options.replica_ack.as_ref());
        let Acked { reply, acked, .. } = op.eval_acked(script, call, ack, Deadline::Never, None).await?;
        if int(&reply) != Some(1) {
            return Err(op.not_held());
        }
        match release {
            Some(release) => self.check_replicas(acked, None, release).await,
            None => Ok(()),
        }
    }

    /// Applies the replica policy after an acquire or extend that `acked` replicas
    /// acknowledged: on a shortfall under [`OnShortfall::Release`], ends `lease`,
    /// releases through `call` and fails with [`Error::NotReplicated`].
    pub async fn check_replicas(
        &self,
        acked: Option<u32>,
        lease: Option<&LeaseState>,
        call: &ScriptCall,
    ) -> Result<()> {
        let (Some(policy), Some(n)) = (&self.options.replica_ack, acked) else {
            return Ok(());
        };
        if let Some(lease) = lease {
            lease.set_replicas_acked(n);
        }
        if n >= policy.replicas {
            return Ok(());
        }
        tracing::warn!(lock = %self.name, acked = n, wanted = policy.replicas, "too few replicas acknowledged the lock");
        if policy.on_shortfall == OnShortfall::Proceed {
            return Ok(());
        }
        if let Some(lease) = lease {
            lease.end(LostReason::Released);
        }
        let claim = self.claim(call.clone());
        claim.arm();
        // On failure the claim releases in the background.
        if self
            .op("release")
            .call(call, Deadline::Never, Some(&claim))
            .await
            .is_ok()
        {
            claim.disarm();
        }
        Err(Error::NotReplicated {
            name: self.name.to_string(),
            acked: n,
            wanted: policy.replicas,
        })
    }
}

/// What a new guard core holds.
pub(crate) struct Held {
    pub token: Token,
    pub fence: Option<u64>,
    /// When the confirming request was sent.
    pub sent: Instant,
    /// What the reply said is left of the lease (at most the TTL).
    pub remaining: Duration,
    /// Renews the lease (the TTL is appended).
    pub renew: ScriptCall,
    /// Releases it; its reply follows [`Released::of`].
    pub release: ScriptCall,
}

/// What a release script answered. Every release script replies `1` when it released
/// now, `-1` when the lock is free and this token was its last holder, and `0` when the
/// token does not hold it (held by another, or free after another holder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    Now,
    FreeAfterUs,
    NotOurs,
}

impl Released {
    pub fn of(reply: &Value) -> Released {
        match int(reply) {
            Some(1) => Released::Now,
            Some(-1) => Released::FreeAfterUs,
            _ => Released::NotOurs,
        }
    }
}

/// A lease kept by something other than scripts on one server: a Redlock's quorum.
pub(crate) trait CustomKeeper: Send + Sync + std::fmt::Debug + 'static {
    /// Makes the lease last at least `ttl` more (see [`Guard::extend`]).
    fn extend<'a>(&'a self, lease: &'a Arc<LeaseState>, ttl: Duration) -> BoxFuture<'a, Result<()>>;
    /// Releases the lock, which was valid (not lost, not past `valid_until`) or not.
    fn release(&self, valid: bool, ttl: Duration) -> BoxFuture<'static, Result<()>>;
    /// Releases the lock in the background (the guard was dropped).
    fn release_in_background(&self, ttl: Duration);
}

#[derive(Debug)]
enum Keeper {
    Script {
        base: LockBase,
        renew: ScriptCall,
        release: ScriptCall,
    },
    Custom {
        keeper: Arc<dyn CustomKeeper>,
        key: Arc<str>,
    },
}

/// One held acquisition: its token, fencing token and lease. Dropping it while it
/// still owns the token releases in the background.
#[derive(Debug)]
pub(crate) struct GuardCore {
    keeper: Keeper,
    token: Option<Token>,
    fence: Option<FencingToken>,
    lease: Lease,
}

impl GuardCore {
    /// A core whose lease is kept by `keeper`.
    pub fn custom(keeper: Arc<dyn CustomKeeper>, key: Arc<str>, token: Token, lease: Lease) -> Self {
        GuardCore {
            keeper: Keeper::Custom { keeper, key },
            token: Some(token),
            fence: None,
            lease,
        }
    }

    pub fn name(&self) -> &str {
        self.lease.name()
    }

    pub fn key(&self) -> &str {
        match &self.keeper {
            Keeper::Script { base, .. } => &base.key,
            Keeper::Custom { key, .. } => key,
        }
    }

    pub fn fence(&self) -> Option<FencingToken> {
        self.fence
    }

    pub fn token(&self) -> &Token {
        self.token
            .as_ref()
            .expect("token present until the guard is consumed")
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn state(&self) -> &Arc<LeaseState> {
        &self.lease.state
    }

    /// Makes the lease last at least `ttl` from now (never shorter), waiting for
    /// replicas under the lock's policy; renewals continue with `ttl`.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let state = &self.lease.state;
        let (base, renew, release) = match &self.keeper {
            Keeper::Custom { keeper, .. } => return keeper.extend(state, ttl).await,
            Keeper::Script { base, renew, release } => (base, renew, release),
        };
        let ttl_ms = base.ttl_ms(ttl)?;
        let op = base.op("extend");
        if let Some(reason) = state.ended() {
            tracing::debug!(lock = %base.name, %reason, "extend after the lease ended");
            return Err(op.not_held());
        }
        // The lease runs from when the answered attempt was sent, after retries.
        let Acked { reply, acked, sent } = op
            .eval_acked(
                renew.script,
                &renew.cmd_with_ttl(ttl_ms),
                base.options.replica_ack.as_ref(),
                Deadline::Never,
                None,
            )
            .await?;
        if int(&reply) != Some(1) {
            state.end(LostReason::Gone);
            return Err(op.not_held());
        }
        state.set_ttl(ttl);
        // Answered after the lease ran out (or ended otherwise meanwhile): it stays ended,
        // and the extend did not keep it.
        if !state.confirm(sent, ttl) {
            tracing::debug!(lock = %base.name, "extend answered after the lease ended");
            return Err(op.not_held());
        }
        base.ctx.renewer.schedule(state);
        base.check_replicas(acked, Some(state), release).await
    }

    /// Releases the lock and wakes waiters.
    pub async fn release(mut self) -> Result<()> {
        self.token
            .take()
            .expect("token present until the guard is consumed");
        let state = self.lease.state.clone();
        // Renewals go on until the release is answered (or this future is dropped).
        let (valid, _releasing) = state.begin_release();
        match &self.keeper {
            Keeper::Script { base, release, .. } => base.release(release, &state).await,
            Keeper::Custom { keeper, .. } => keeper.release(valid, state.ttl()).await,
        }
    }

    /// Stops renewing and hands back the token without releasing.
    pub fn forget(mut self) -> Token {
        self.lease.state.end(LostReason::Released);
        self.token
            .take()
            .expect("token present until the guard is consumed")
    }

    /// Ends the lease without releasing and returns the token and what the lease was
    /// valid until: the caller finishes the holding itself (a hand-over, a downgrade).
    pub fn take(mut self) -> (Token, Instant) {
        let valid_until = self.lease.state.valid_until();
        self.lease.state.end(LostReason::Released);
        (
            self.token
                .take()
                .expect("token present until the guard is consumed"),
            valid_until,
        )
    }
}

impl Drop for GuardCore {
    fn drop(&mut self) {
        if self.token.take().is_none() {
            return;
        }
        let state = &self.lease.state;
        state.end(LostReason::Released);
        match &self.keeper {
            Keeper::Script { base, release, .. } => {
                spawn_release(base.ctx.clone(), base.name.clone(), release.clone(), state.ttl())
            }
            Keeper::Custom { keeper, .. } => keeper.release_in_background(state.ttl()),
        }
    }
}

/// Gives a guard type the common surface: the methods every guard has, as its own
/// (documented, `async`) methods, and the [`Guard`] trait. The type has a method
/// `core(&self) -> &GuardCore`, and `release(self)` of its own; `fence` says how to get
/// its fencing token for the trait.
macro_rules! guard_surface {
    ($guard:ty, $what:literal, fence: |$g:ident| $fence:expr) => {
        impl $guard {
            #[doc = concat!("The name of the lock ", $what, " belongs to.")]
            pub fn name(&self) -> &str {
                self.core().name()
            }

            /// The lock's Redis key.
            pub fn key(&self) -> &str {
                self.core().key()
            }

            /// The secret token stored in Redis for this acquisition. Needed only to
            /// release or extend it from another process; never log it.
            pub fn token(&self) -> &$crate::token::Token {
                self.core().token()
            }

            /// The lease; clone it to watch for loss from another task.
            pub fn lease(&self) -> &$crate::engine::lease::Lease {
                self.core().lease()
            }

            /// How many replicas acknowledged the acquire (or the last
            /// [`extend`](Self::extend)) when the lock has a
            /// [`ReplicaAck`](crate::ReplicaAck) policy; `None` without one.
            pub fn replicas_acked(&self) -> Option<u32> {
                self.core().lease().replicas_acked()
            }

            /// Until when the holder may rely on the lock (see
            /// [`Lease::valid_until`](crate::Lease::valid_until)).
            pub fn valid_until(&self) -> std::time::Instant {
                self.core().lease().valid_until()
            }

            /// Whether the lease is still valid: not lost, and not past `valid_until`.
            pub fn is_held(&self) -> bool {
                self.core().lease().is_held()
            }

            /// Completes when the lease is lost (see [`Lease::lost`](crate::Lease::lost)).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe.
            pub async fn lost(&self) -> $crate::engine::lease::LostReason {
                self.core().lease().lost().await
            }

            /// Makes the lease last at least `ttl` from now; automatic renewal (if on)
            /// continues with `ttl`. The lease is never shortened: an extend for less
            /// than what is left leaves it as it is (and later renewals use `ttl`).
            ///
            /// Extends and automatic renewals may be in flight together, and their
            /// replies may come back in any order: the lease ends up as if they had
            /// been sent one after the other.
            ///
            /// # Cancel safety
            ///
            /// Dropping the future may or may not extend the lease; renewal continues
            /// either way.
            ///
            /// # Errors
            ///
            /// [`Error::InvalidTtl`](crate::Error::InvalidTtl);
            /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the lock
            /// has a replica policy whose timeout is more than half of `ttl` (nothing
            /// is sent; the lease is as it was);
            /// [`Error::NotHeld`](crate::Error::NotHeld) when the lease was already
            /// lost (the lease then reports [`LostReason::Gone`](crate::LostReason::Gone)),
            /// or ran out before the answer came (it stays
            /// [`LostReason::Expired`](crate::LostReason::Expired): a late answer does not
            /// revive it);
            /// [`Error::NotReplicated`](crate::Error::NotReplicated) when the lock's
            /// replica policy releases on a shortfall and too few replicas
            /// acknowledged (the lock was released); Redis errors.
            pub async fn extend(&self, ttl: std::time::Duration) -> $crate::error::Result<()> {
                self.core().extend(ttl).await
            }
        }

        impl $crate::engine::guard::Guard for $guard {
            fn name(&self) -> &str {
                self.core().name()
            }

            fn key(&self) -> &str {
                self.core().key()
            }

            fn fence(&self) -> Option<$crate::token::FencingToken> {
                let $g = self;
                $fence
            }

            fn lease(&self) -> &$crate::engine::lease::Lease {
                self.core().lease()
            }

            fn extend(
                &self,
                ttl: std::time::Duration,
            ) -> futures_util::future::BoxFuture<'_, $crate::error::Result<()>> {
                Box::pin(self.core().extend(ttl))
            }

            fn release(
                self: Box<Self>,
            ) -> futures_util::future::BoxFuture<'static, $crate::error::Result<()>> {
                Box::pin((*self).release())
            }
        }
    };
}

pub(crate) use guard_surface;
