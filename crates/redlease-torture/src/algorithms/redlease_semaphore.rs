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

use redlease::{Client, LeaseOptions, Semaphore};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, Role, acquire_error, outlives_lease,
    redlease_client,
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

    fn supports(&self, fault: Fault) -> bool {
        fault != Fault::Clock
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let semaphore = env
                .names
                .iter()
                .map(|name| client.semaphore_with(name, PERMITS, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
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
    semaphore: Vec<Semaphore>,
    timeout: Duration,
}

impl LockClient for SemClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.semaphore[lock].acquire_timeout(self.timeout).await {
                Ok(permit) => Ok(Held::guard(permit, Role::Occupant)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
