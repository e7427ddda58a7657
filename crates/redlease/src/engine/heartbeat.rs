//! Waiter entries: a fair-mutex place or a waiting writer's registration is a small
//! lease of its own, kept alive by the client's renewal task while its waiter waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::context::Context;
use super::lease::{LeaseState, LostReason, Renew};
use crate::script::ScriptCall;

/// Keeps a waiter's entry alive while it waits. Stops when dropped, so an abandoned
/// wait stops heartbeating at once.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    ctx: Arc<Context>,
    name: Arc<str>,
    ttl: Duration,
    renew: ScriptCall,
    lease: std::sync::Mutex<Option<Arc<LeaseState>>>,
}

impl Heartbeat {
    /// A heartbeat of entries that live `ttl` without one, renewed by `renew` (the TTL
    /// is appended).
    pub fn new(ctx: Arc<Context>, name: &str, ttl: Duration, renew: ScriptCall) -> Self {
        Heartbeat {
            ctx,
            name: format!("{name} (waiting)").into(),
            ttl,
            renew,
            lease: std::sync::Mutex::new(None),
        }
    }

    /// A request sent at `sent` found or wrote the entry (`fresh`: created it): keep it
    /// alive from now on. A running heartbeat is kept unless the entry is fresh — then
    /// the old one may be about to learn that the previous entry was gone, and a new
    /// one takes over.
    pub fn joined(&self, sent: Instant, fresh: bool) {
        let mut lease = self.lease.lock().expect("heartbeat lock");
        if let Some(old) = lease.as_ref() {
            if !fresh && old.ended().is_none() {
                return;
            }
            old.end(LostReason::Released);
        }
        let state = LeaseState::new(
            self.name.clone(),
            sent,
            self.ttl,
            self.ttl,
            Renew::Script(self.renew.clone()),
            true,
            // A waiter's entry is no holding: not in the metrics.
            None,
        );
        self.ctx.renewer.schedule(&state);
        *lease = Some(state);
    }

    /// Stops heartbeating.
    pub fn stop(&self) {
        if let Some(lease) = self.lease.lock().expect("heartbeat lock").take() {
            lease.end(LostReason::Released);
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a waiter's entry survives without a heartbeat, and the same as a script
/// argument: at most the lock's lease TTL.
#[derive(Clone, Debug)]
pub(crate) struct WaiterTtl {
    pub ttl: Duration,
    /// The TTL in milliseconds, as the script argument.
    pub arg: Arc<str>,
}

impl WaiterTtl {
    /// `ttl`, capped at the lease TTL `lease`.
    pub fn new(ttl: Duration, lease: Duration) -> Self {
        let ttl = ttl.min(lease);
        WaiterTtl {
            ttl,
            arg: (ttl.as_millis() as u64).to_string().into(),
        }
    }

    /// `ttl` for lock `name` with lease `lease`, checked, then capped.
    pub fn checked(name: &str, ttl: Duration, lease: Duration) -> crate::error::Result<Self> {
        crate::keys::ttl_ms(name, ttl)?;
        Ok(Self::new(ttl, lease))
    }
}

/// A random public id for a waiter: 16 hex digits. Not a secret (it names a channel).
pub(crate) fn waiter_id() -> String {
    crate::token::public_id()
}
