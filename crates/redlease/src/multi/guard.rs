//! The holder's side of a multi-lock: the guard, and how the engine keeps its one lease
//! over every name — a renewal of all of them in one round trip per node, an extend
//! and a release of all of them at once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Holding, MultiLock, Shared};
use crate::engine::guard::{CustomKeeper, GuardCore, guard_surface};
use crate::engine::lease::{LeaseState, RenewRound, Renewal};
use crate::error::Result;
use crate::token::{FencingToken, Token};

/// The renewal task's view of a multi-lock's lease: one script call per hash slot,
/// batched into one round trip per node.
///
/// It refers to the lock weakly: the renewal task keeps a lease until its next due
/// time, and the lock keeps the client's context — a strong reference would keep the
/// client's background tasks alive that long after the guard was gone.
#[derive(Debug)]
pub(super) struct Renewing {
    pub lock: Weak<Shared>,
    pub token: Token,
    pub holding: Arc<Holding>,
}

impl RenewRound for Renewing {
    fn renew(&self, ttl: Duration) -> BoxFuture<'static, Renewal> {
        let (lock, token, holding) = (self.lock.upgrade(), self.token.clone(), self.holding.clone());
        Box::pin(async move {
            match lock {
                Some(shared) => MultiLock { shared }.renew_round(&token, ttl, &holding).await,
                // The guard, and so its lease, is gone: nothing to renew.
                None => Renewal::Gone,
            }
        })
    }
}

/// Extends and releases every name of a multi-lock together.
#[derive(Debug)]
pub(super) struct Keeper {
    pub lock: MultiLock,
    pub token: Token,
    pub lease: Arc<LeaseState>,
    pub holding: Arc<Holding>,
}

impl CustomKeeper for Keeper {
    fn extend<'a>(&'a self, lease: &'a Arc<LeaseState>, ttl: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.lock.extend(&self.token, lease, ttl))
    }

    fn release(&self, _valid: bool, _ttl: Duration) -> BoxFuture<'static, Result<()>> {
        let (lock, token, lease, holding) = (
            self.lock.clone(),
            self.token.clone(),
            self.lease.clone(),
            self.holding.clone(),
        );
        Box::pin(async move { lock.release(&token, &lease, &holding).await })
    }

    fn release_in_background(&self, ttl: Duration) {
        self.lock.release_in_background(&self.token, ttl);
    }
}

/// Proof of holding every name of a [`MultiLock`], with one lease over all of them and
/// a fencing token per name.
///
/// The lease is renewed automatically (unless the lock was made with
/// `auto_renew(false)`), every name in the same round: one round trip per node that
/// holds some of them. If any name is found gone, the lease ends with
/// [`LostReason::Gone`](crate::LostReason::Gone) and the other names are released.
///
/// Where the common guard surface speaks of one lock, a guard over several names shows
/// them all: [`name`](Self::name) is the names joined with `+` (`"a+b"`) and
/// [`key`](Self::key) their keys joined with `+`, for messages and logs;
/// [`names`](MultiLock::names), [`keys`](MultiLock::keys) and [`fences`](Self::fences)
/// give them one by one. Through the [`Guard`](crate::Guard) trait,
/// [`fence`](crate::Guard::fence) is `None`: no single number fences several
/// resources.
///
/// # Drop
///
/// Dropping the guard without [`release`](MultiLockGuard::release) stops renewal and
/// releases every name in the background when a tokio runtime is running; otherwise
/// the leases simply expire after their TTL.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct MultiLockGuard {
    pub(super) core: GuardCore,
    pub(super) lock: MultiLock,
    /// One per name, in the order given.
    pub(super) fences: Vec<FencingToken>,
}

guard_surface!(MultiLockGuard, "this guard holds", fence: |_g| None);

impl MultiLockGuard {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The multi-lock this guard holds.
    pub fn multi_lock(&self) -> &MultiLock {
        &self.lock
    }

    /// The fencing token of each name, in the order the names were given: each
    /// strictly greater than that of every earlier acquisition of the same name, by a
    /// multi-lock or a plain [`Mutex`](crate::Mutex). Hand each resource the token of
    /// its own name.
    pub fn fences(&self) -> &[FencingToken] {
        &self.fences
    }

    /// The fencing token of `name`, or `None` when this guard does not hold it.
    pub fn fence_of(&self, name: &str) -> Option<FencingToken> {
        let i = self.lock.names().position(|n| n == name)?;
        self.fences.get(i).copied()
    }

    /// Releases every name, as the plain mutex releases it: compare-and-delete, and a
    /// hand-over to a plain [`Mutex`](crate::Mutex) waiter registered for that name or
    /// a wake-up of its registered waiters. One script call per hash slot the names
    /// span, sent at once. Until each is answered, the names it has not released yet
    /// stay renewed (a slot migration can hold one up).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld), naming a name the guard no longer
    /// held, when the lease had already been lost — the protected work may have
    /// overlapped another holder's (the names still held are released all the same);
    /// Redis errors (the release is then retried in the background until the lease
    /// would have expired).
    pub async fn release(self) -> Result<()> {
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: every name stays
    /// held until its lease runs out or someone releases it with the returned token
    /// (the same for every name: [`Mutex::release_token`](crate::Mutex::release_token)
    /// of each name releases it).
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}
