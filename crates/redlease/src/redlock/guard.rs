//! The holder's side of a Redlock: the guard, and how the engine keeps its lease — a
//! renewal round over all masters, an extend by quorum, a release everywhere.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{RedlockMutex, call, fan_out};
use crate::engine::guard::{CustomKeeper, GuardCore, guard_surface};
use crate::engine::lease::{LeaseState, LostReason, RenewRound, Renewal};
use crate::engine::request::Claim;
use crate::error::{Error, Result};
use crate::keys;
use crate::script::reply::int;
use crate::token::Token;

/// The renewal task's view of a Redlock lease: one round over all masters.
#[derive(Debug)]
pub(super) struct RenewRoundOf {
    pub mutex: RedlockMutex,
    pub token: Token,
}

impl RenewRound for RenewRoundOf {
    fn renew(&self, ttl: Duration) -> BoxFuture<'static, Renewal> {
        let (mutex, token) = (self.mutex.clone(), self.token.clone());
        Box::pin(async move {
            let outcome = mutex.renew_round(&token, ttl).await;
            if matches!(outcome, Renewal::Gone) {
                // A majority cannot come back: free the masters that still hold it.
                mutex.release_everywhere(&token, ttl);
            }
            outcome
        })
    }
}

/// Extends and releases a Redlock lease by quorum.
#[derive(Debug)]
pub(super) struct Keeper {
    pub mutex: RedlockMutex,
    pub token: Token,
}

impl CustomKeeper for Keeper {
    fn extend<'a>(&'a self, lease: &'a Arc<LeaseState>, ttl: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let name = self.mutex.name();
            keys::ttl_ms(name, ttl)?;
            let not_held = || Error::NotHeld {
                name: name.to_owned(),
            };
            if lease.ended().is_some() {
                return Err(not_held());
            }
            match self.mutex.renew_round_counted(&self.token, ttl).await {
                (Renewal::Confirmed { sent }, ..) => {
                    lease.set_ttl(ttl);
                    // Answered after the lease ran out: it stays ended.
                    if !lease.confirm(sent, ttl) {
                        return Err(not_held());
                    }
                    self.mutex.nodes()[0].renewer.schedule(lease);
                    Ok(())
                }
                (Renewal::Gone, ..) => {
                    if lease.end(LostReason::Gone) {
                        self.mutex.release_everywhere(&self.token, lease.ttl());
                    }
                    Err(not_held())
                }
                (Renewal::Unreachable { .. }, reachable, error) => {
                    Err(self.mutex.no_quorum("extend", reachable, error))
                }
            }
        })
    }

    fn release(&self, valid: bool, ttl: Duration) -> BoxFuture<'static, Result<()>> {
        let (m, token) = (self.mutex.clone(), self.token.clone());
        Box::pin(async move {
            let limit = m.node_timeout(ttl);
            let quorum = m.quorum();
            let requests = m.nodes().iter().map(|node| {
                let node = node.clone();
                let release = m.release_call(&node, &token);
                // Until this master answers, a cancelled or failed release must still happen.
                let claim = Claim::new(node.clone(), &m.shared.name, release.clone(), ttl);
                claim.arm();
                async move {
                    let reply = call(&node, release.script, &release.cmd(), limit).await;
                    if reply.is_ok() {
                        claim.disarm();
                    }
                    matches!(reply, Ok(v) if int(&v) == Some(1))
                }
            });
            // Masters slower than a majority finish in the background.
            let results = fan_out(requests, |r: &[Option<bool>]| {
                r.iter().filter(|&&x| x == Some(true)).count() >= quorum
            })
            .await;
            let released = results.into_iter().filter(|&r| r == Some(true)).count();
            tracing::debug!(lock = %m.shared.name, released, "quorum lock released");
            // A lease that ran out on the client while a majority kept the token was
            // never lost on the servers.
            if valid || released >= quorum {
                Ok(())
            } else {
                Err(Error::NotHeld {
                    name: m.shared.name.to_string(),
                })
            }
        })
    }

    fn release_in_background(&self, ttl: Duration) {
        self.mutex.release_everywhere(&self.token, ttl);
    }
}

/// Proof of holding a [`RedlockMutex`] on a majority of masters, with its lease.
///
/// The lease is renewed automatically (unless the lock was made with
/// `auto_renew(false)`) by one round over all masters every TTL/3; a round that finds
/// fewer than a majority still holding the token ends it with [`LostReason::Gone`],
/// and one that cannot reach a majority before `valid_until` ends it with
/// [`LostReason::Expired`]. Either way the remaining keys are released at once.
///
/// Its `valid_until` is when the acquiring (or last confirmed renewing) round was
/// sent, plus the shortest lease a majority granted, minus the drift margin — the
/// algorithm's `ttl − elapsed − drift`.
///
/// There is no fencing token: see [`Redlock`](crate::Redlock) for why.
///
/// # Drop
///
/// Dropping the guard without [`release`](RedlockGuard::release) stops renewal and
/// releases the lock on every master in the background when a tokio runtime is
/// running; otherwise the lease simply expires after its TTL.
#[must_use = "dropping the guard releases the lock"]
#[derive(Debug)]
pub struct RedlockGuard {
    pub(super) core: GuardCore,
    pub(super) mutex: RedlockMutex,
    pub(super) acquired: usize,
}

guard_surface!(RedlockGuard, "this guard holds", fence: |_g| None);

impl RedlockGuard {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The mutex this guard holds.
    pub fn mutex(&self) -> &RedlockMutex {
        &self.mutex
    }

    /// How many masters had granted the acquisition when the quorum was reached (at
    /// least the quorum). The acquiring round does not wait for slower masters; those
    /// that grant it later hold it too, and renewal and release cover every master.
    pub fn acquired_on(&self) -> usize {
        self.acquired
    }

    /// Releases the lock on every master (compare-and-delete) and wakes waiters.
    ///
    /// Masters that do not answer within the node timeout are released in the
    /// background until the lease would have expired.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, masters not yet released are released in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already been lost (expired or taken over)
    /// and a majority no longer held the token — the protected work may have
    /// overlapped another holder's. (A lease that ran out on the client while a
    /// majority kept the token was never lost on the servers: that release is `Ok`.)
    pub async fn release(self) -> Result<()> {
        self.core.release().await
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// on the masters until its lease runs out.
    pub fn forget(self) -> Token {
        self.core.forget()
    }
}
