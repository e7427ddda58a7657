//! Leases: how long a holder may act, and the signal that it may not any more.
//!
//! Every guard (mutex, permit, ...) owns one lease. The lease knows the instant until
//! which its holder may rely on it (`valid_until`), computed from when the acquiring or
//! renewing request was *sent* (not answered), minus a clock-drift margin, so it always
//! ends on the client before it can end on the server. It also knows how to renew and
//! release itself: a script call whose last argument is the TTL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::Cmd;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::scripts::LuaScript;

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Redis says this holder's token no longer holds the lock: the key expired on the
    /// server, was deleted, was taken over, or the server lost it (a restart without
    /// persistence, a failover to a replica that never saw it).
    Gone,
    /// The lease could not be confirmed before it would have expired: Redis was
    /// unreachable or too slow. It may still exist on the server, but the holder can no
    /// longer rely on it.
    Expired,
    /// This process ended the lease itself: it released it, dropped its guard, or
    /// forgot it. Not a loss of safety.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Gone => "the lock was lost on the server",
            LostReason::Expired => "the lease could not be renewed before it expired",
            LostReason::Released => "the lease was released",
        })
    }
}

/// A script call: the script, its keys and its leading arguments, shared cheaply
/// between the guard, its lease and the renewal task. Renewal calls get the TTL in
/// milliseconds appended as their last argument.
#[derive(Clone)]
pub(crate) struct ScriptCall {
    pub script: &'static LuaScript,
    pub keys: Arc<[Arc<str>]>,
    pub args: Arc<[Arc<str>]>,
}

impl ScriptCall {
    pub fn new(script: &'static LuaScript, keys: Arc<[Arc<str>]>, args: Arc<[Arc<str>]>) -> Self {
        ScriptCall { script, keys, args }
    }

    pub fn cmd(&self) -> Cmd {
        self.script.evalsha(&self.keys, &self.args, None)
    }

    pub fn cmd_with_ttl(&self, ttl_ms: u64) -> Cmd {
        self.script.evalsha(&self.keys, &self.args, Some(ttl_ms))
    }
}

/// Arguments carry tokens, so `Debug` shows only the script and its keys.
impl std::fmt::Debug for ScriptCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptCall")
            .field("script", &self.script.name)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug)]
struct LeaseState {
    valid_until: Instant,
    ended: Option<LostReason>,
}

/// The lease machinery shared by a guard, its [`Lease`] handles and the renewal task.
#[derive(Debug)]
pub(crate) struct LeaseShared {
    pub name: Arc<str>,
    state: std::sync::Mutex<LeaseState>,
    /// Signalled on every change of `state`.
    changed: Notify,
    ttl_ms: AtomicU64,
    /// Bumped whenever the renewal schedule of this lease changes; queue entries with an
    /// older epoch are stale.
    epoch: AtomicU64,
    /// The renewal call (TTL appended) and the release call of this lease.
    pub renew: ScriptCall,
    pub release: ScriptCall,
    pub auto_renew: bool,
    /// When the last successful acquire/renew was sent.
    confirmed_at: std::sync::Mutex<Instant>,
    /// Replicas that acknowledged the last acquire/extend under a replica-ack policy;
    /// `NO_ACK` without one.
    replicas_acked: AtomicU32,
}

const NO_ACK: u32 = u32::MAX;

/// The safety margin for clock drift between client and server over a lease of `ttl`:
/// 1% plus 2ms, as in the Redlock analysis.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

impl LeaseShared {
    /// A lease confirmed by a request sent at `sent` whose reply said it has
    /// `remaining` (at most `ttl`) left on the server.
    pub fn new(
        name: Arc<str>,
        sent: Instant,
        ttl: Duration,
        remaining: Duration,
        renew: ScriptCall,
        release: ScriptCall,
        auto_renew: bool,
    ) -> Arc<Self> {
        let remaining = remaining.min(ttl);
        // Treat a lease with less than its full TTL left (a retried acquire) as one
        // that started earlier, so its first renewal comes early enough.
        let started = sent.checked_sub(ttl - remaining).unwrap_or(sent);
        let state = std::sync::Mutex::new(LeaseState {
            valid_until: sent + remaining.saturating_sub(drift(ttl)),
            ended: None,
        });
        Arc::new(LeaseShared {
            name,
            state,
            changed: Notify::new(),
            ttl_ms: AtomicU64::new(ttl.as_millis() as u64),
            epoch: AtomicU64::new(0),
            renew,
            release,
            auto_renew,
            confirmed_at: std::sync::Mutex::new(started),
            replicas_acked: AtomicU32::new(NO_ACK),
        })
    }

    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed))
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms.load(Ordering::Relaxed)
    }

    pub fn set_ttl(&self, ttl: Duration) {
        self.ttl_ms.store(ttl.as_millis() as u64, Ordering::Relaxed);
    }

    /// How often auto-renewal runs: a third of the TTL.
    pub fn interval(&self) -> Duration {
        self.ttl() / 3
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn bump_epoch(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn state(&self) -> LeaseState {
        *self.state.lock().expect("lease lock")
    }

    pub fn valid_until(&self) -> Instant {
        self.state().valid_until
    }

    pub fn ended(&self) -> Option<LostReason> {
        self.state().ended
    }

    /// When the next renewal is due.
    pub fn next_renewal(&self) -> Instant {
        *self.confirmed_at.lock().expect("lease lock") + self.interval()
    }

    /// Records how many replicas acknowledged the last acquire or extend.
    pub fn set_replicas_acked(&self, n: u32) {
        self.replicas_acked.store(n.min(NO_ACK - 1), Ordering::Relaxed);
    }

    pub fn replicas_acked(&self) -> Option<u32> {
        Some(self.replicas_acked.load(Ordering::Relaxed)).filter(|&n| n != NO_ACK)
    }

    /// Records that a request sent at `sent` confirmed the lease for `ttl` more.
    pub fn confirm(&self, sent: Instant, ttl: Duration) {
        *self.confirmed_at.lock().expect("lease lock") = sent;
        {
            let mut state = self.state.lock().expect("lease lock");
            if state.ended.is_some() {
                return;
            }
            state.valid_until = sent + ttl.saturating_sub(drift(ttl));
        }
        self.changed.notify_waiters();
    }

    /// Ends the lease; the first reason wins. Returns whether this call ended it.
    pub fn end(&self, reason: LostReason) -> bool {
        let ended = {
            let mut state = self.state.lock().expect("lease lock");
            let first = state.ended.is_none();
            if first {
                state.ended = Some(reason);
            }
            first
        };
        if ended {
            self.changed.notify_waiters();
            self.bump_epoch();
            match reason {
                LostReason::Released => tracing::debug!(lock = %self.name, "lease ended"),
                _ => tracing::warn!(lock = %self.name, %reason, "lease lost"),
            }
        }
        ended
    }
}

/// A handle on a held lease: until when it is safe to act, and a signal when it is lost.
///
/// Cheap to clone; clones observe the same lease, so one can be moved into a task that
/// watches [`lost`](Lease::lost) while the guard stays with the code doing the work.
#[derive(Clone, Debug)]
pub struct Lease {
    pub(crate) shared: Arc<LeaseShared>,
}

impl Lease {
    /// The lock this lease belongs to.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The current lease length (renewals extend the lease by this much).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl()
    }

    /// The instant until which the holder may rely on the lease: when the last
    /// confirming request was sent, plus the TTL, minus a drift margin (1% + 2ms).
    pub fn valid_until(&self) -> std::time::Instant {
        self.shared.valid_until().into_std()
    }

    /// Whether the lease has neither ended nor run past [`valid_until`](Lease::valid_until).
    pub fn is_held(&self) -> bool {
        self.shared.ended().is_none() && Instant::now() < self.shared.valid_until()
    }

    /// How many replicas acknowledged the last acquire or explicit extend, when the lock
    /// has a [`ReplicaAck`](crate::ReplicaAck) policy; `None` without one. Automatic
    /// renewals do not wait for replicas and leave this unchanged.
    pub fn replicas_acked(&self) -> Option<u32> {
        self.shared.replicas_acked()
    }

    /// Why the lease ended, or `None` while it has not.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.ended()
    }

    /// Completes when the lease ends, with the reason.
    ///
    /// Fires with [`LostReason::Gone`] when a renewal finds the token no longer holds
    /// the lock, and with [`LostReason::Expired`] once `valid_until` passes without a
    /// confirming renewal — even if the renewal task itself is stuck. Fires with
    /// [`LostReason::Released`] when this process releases the lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn lost(&self) -> LostReason {
        let shared = &self.shared;
        loop {
            let changed = shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let state = shared.state();
            if let Some(reason) = state.ended {
                return reason;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(state.valid_until) => {
                    if shared.valid_until() <= Instant::now() {
                        shared.end(LostReason::Expired);
                    }
                }
            }
        }
    }
}
