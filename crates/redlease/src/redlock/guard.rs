//! The holder's side of a Redlock: the guard, and the task that renews its lease by
//! quorum.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{RedlockMutex, Renewal, call, fan_out};
use crate::error::{Error, Result};
use crate::keys;
use crate::lease::{Lease, LeaseShared, LostReason};
use crate::scripts::int;
use crate::token::Token;
use crate::wait::Pending;

/// Keeps a quorum lease alive: one round over all masters every TTL/3.
pub(super) async fn renew_loop(
    mutex: RedlockMutex,
    token: Token,
    lease: Arc<LeaseShared>,
    kick: Arc<Notify>,
) {
    loop {
        if lease.ended().is_some() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(lease.next_renewal()) => {}
            _ = kick.notified() => continue,
        }
        if lease.ended().is_some() {
            return;
        }
        let ttl = lease.ttl();
        let epoch = lease.epoch();
        match mutex.renew_round(&token, ttl).await {
            // An extend() that went out meanwhile is authoritative.
            Renewal::Confirmed { sent } if lease.epoch() == epoch => {
                lease.confirm(sent, ttl);
                tracing::trace!(lock = %lease.name, "quorum renewed");
            }
            Renewal::Confirmed { .. } => {}
            Renewal::Gone => {
                if lease.end(LostReason::Gone) {
                    mutex.release_everywhere(&token, ttl);
                }
                return;
            }
            Renewal::Unreachable { reachable, error } => {
                let now = Instant::now();
                let valid_until = lease.valid_until();
                if now >= valid_until {
                    if lease.end(LostReason::Expired) {
                        mutex.release_everywhere(&token, ttl);
                    }
                    return;
                }
                tracing::debug!(
                    lock = %lease.name, reachable, error = ?error.map(|e| e.to_string()),
                    "quorum renewal failed; retrying"
                );
                let retry =
                    (lease.interval() / 10).clamp(Duration::from_millis(20), Duration::from_millis(500));
                tokio::select! {
                    _ = tokio::time::sleep_until((now + retry).min(valid_until)) => {}
                    _ = kick.notified() => {}
                }
            }
        }
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
    pub(super) mutex: RedlockMutex,
    pub(super) token: Option<Token>,
    pub(super) lease: Lease,
    /// Wakes the renewal task: the TTL changed or the lease ended.
    pub(super) kick: Arc<Notify>,
    pub(super) acquired: usize,
}

impl RedlockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.mutex.name()
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

    /// The secret token stored on the masters. Never log it.
    pub fn token(&self) -> &Token {
        self.token
            .as_ref()
            .expect("token present until the guard is consumed")
    }

    /// The lease; clone it to watch for loss from another task.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the holder may rely on the lock: when the acquiring (or last
    /// confirmed renewing) round was sent, plus the shortest lease a majority granted,
    /// minus the drift margin — the algorithm's `ttl − elapsed − drift`.
    pub fn valid_until(&self) -> std::time::Instant {
        self.lease.valid_until()
    }

    /// Whether the lease is still valid: not lost, and not past `valid_until`.
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// Completes when the lease is lost (see [`Lease::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Sets the remaining lease on every master to `ttl`, from now. Succeeds when a
    /// majority confirmed it; auto-renewal (if on) continues with the new TTL.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not extend the lease; renewal continues either way.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the lease was already lost or a
    /// majority no longer holds the token (the lease then ends with
    /// [`LostReason::Gone`]); [`Error::NoQuorum`] when too few masters answered (the
    /// lease is unchanged).
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let name = self.mutex.name();
        keys::ttl_ms(name, ttl)?;
        let shared = &self.lease.shared;
        if shared.ended().is_some() {
            return Err(Error::NotHeld {
                name: name.to_owned(),
            });
        }
        // Makes a renewal round that is on its way now stale.
        shared.bump_epoch();
        match self.mutex.renew_round(self.token(), ttl).await {
            Renewal::Confirmed { sent } => {
                shared.set_ttl(ttl);
                shared.confirm(sent, ttl);
                self.kick.notify_one();
                Ok(())
            }
            Renewal::Gone => {
                if shared.end(LostReason::Gone) {
                    self.mutex.release_everywhere(self.token(), shared.ttl());
                }
                Err(Error::NotHeld {
                    name: name.to_owned(),
                })
            }
            Renewal::Unreachable { reachable, error } => {
                Err(self.mutex.no_quorum("extend", reachable, error))
            }
        }
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
    pub async fn release(mut self) -> Result<()> {
        let token = self
            .token
            .take()
            .expect("token present until the guard is consumed");
        let shared = self.lease.shared.clone();
        let valid = shared.ended().is_none() && Instant::now() < shared.valid_until();
        shared.end(LostReason::Released);
        self.kick.notify_one();
        let m = &self.mutex;
        let ttl = shared.ttl();
        let limit = m.node_timeout(ttl);
        let quorum = m.quorum();
        let requests = m.nodes().iter().map(|node| {
            let node = node.clone();
            let release = m.release_call(&node, &token);
            // Until this master answers, a cancelled or failed release must still happen.
            let pending = Pending::new(node.clone(), &m.shared.name, release.clone(), ttl);
            pending.arm();
            async move {
                let reply = call(&node, release.script, &release.cmd(), limit).await;
                if reply.is_ok() {
                    pending.disarm();
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
        if valid || released >= m.quorum() {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: m.shared.name.to_string(),
            })
        }
    }

    /// Stops renewing and gives up the guard *without* releasing: the lock stays held
    /// on the masters until its lease runs out.
    pub fn forget(mut self) -> Token {
        self.lease.shared.end(LostReason::Released);
        self.kick.notify_one();
        self.token
            .take()
            .expect("token present until the guard is consumed")
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let lease = &self.lease.shared;
            lease.end(LostReason::Released);
            self.kick.notify_one();
            self.mutex.release_everywhere(&token, lease.ttl());
        }
    }
}
