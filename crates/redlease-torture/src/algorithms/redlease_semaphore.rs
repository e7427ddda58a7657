//! `redlease-semaphore`: the library's counting semaphore with 3 permits among the
//! phase's 12 clients. Holders mark where they begin and end; the checker counts every
//! entry that finds 3 others inside (`over_limit`).
//!
//! A permit has no fencing token, so nothing stops a holder that outlives its lease —
//! stalled past it, or forgotten by a Redis that restarted empty — from still being
//! inside when its permit has gone to someone else. Under those faults
//! (`client-pause`, `process-pause`, `server-restart`, and `mixed`, which has them) the
//! rows are informative, as `redlease-nofence`'s are; under the others, more than 3
//! inside fails the run. The JSON's `over_limit_with_valid_leases` counts the entries
//! where more than 3 of those inside still had valid leases by their own clocks.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Client, Lease, LeaseOptions, Permit, Semaphore};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, ReleaseOutcome, Role, acquire_error,
    outlives_lease, redlease_client, release_outcome,
};
use crate::checker::Check;
use crate::faults::Fault;

/// Permits of the torture semaphore.
pub const PERMITS: u32 = 3;

pub struct RedleaseSemaphore;

impl Algorithm for RedleaseSemaphore {
    fn name(&self) -> &'static str {
        "redlease-semaphore"
    }

    fn describe(&self) -> &'static str {
        "redlease::Semaphore, 3 permits: at most 3 inside (no token; informative under pauses and empty restarts)"
    }

    fn fenced(&self) -> bool {
        false
    }

    fn must_be_safe(&self) -> bool {
        true
    }

    fn must_be_safe_under(&self, faults: &[Fault]) -> bool {
        !faults.iter().any(|&f| outlives_lease(f))
    }

    fn kind(&self) -> &'static str {
        "conditional"
    }

    fn check(&self) -> Check {
        Check::Semaphore { limit: PERMITS }
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let semaphore = client
                .semaphore_with(&env.name, PERMITS, LeaseOptions::new().ttl(env.ttl))
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(SemClient {
                _client: client,
                semaphore,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct SemClient {
    _client: Client,
    semaphore: Semaphore,
    timeout: Duration,
}

impl LockClient for SemClient {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Held>, AcquireError>> {
        Box::pin(async move {
            match self.semaphore.acquire_timeout(self.timeout).await {
                Ok(permit) => Ok(Box::new(Holding(permit)) as Box<dyn Held>),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}

struct Holding(Permit);

impl Held for Holding {
    fn role(&self) -> Role {
        Role::Occupant
    }

    fn fence(&self) -> u64 {
        0
    }

    fn lease(&self) -> Option<&Lease> {
        Some(self.0.lease())
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move { release_outcome(self.0.release().await) })
    }
}
