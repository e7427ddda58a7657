//! `redlease-redlock`: the library's Redlock over 3 independent redis-servers, each
//! behind its own fault proxy. Most fault events hit the first server only (a minority,
//! which Redlock exists to survive); a third of the proxy and pause events hit all
//! three at once.
//!
//! Redlock has no fencing token (see `redlease::Redlock`), so the resource cannot refuse
//! a holder that outlived its lease: like `redlease-nofence` it is informative under
//! `client-pause`, `process-pause`, `server-restart` (antirez's algorithm assumes a
//! master that restarts keeps its keys or stays down for a TTL) and `mixed`. Under the
//! other faults — lost replies, cut connections, frozen masters, restarts from an
//! `appendfsync always` AOF — it must keep the counter exact.

use std::sync::Arc;
use std::time::Duration;

use redlease::{LeaseOptions, Redlock, RedlockMutex};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, PREFIX, Role, acquire_error,
    outlives_lease,
};
use crate::faults::Fault;

/// Masters of the torture Redlock.
pub const MASTERS: usize = 3;

pub struct RedleaseRedlock;

impl Algorithm for RedleaseRedlock {
    fn name(&self) -> &'static str {
        "redlease-redlock"
    }

    fn describe(&self) -> &'static str {
        "redlease::Redlock over 3 servers, no token (informative under pauses and empty restarts)"
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

    fn supports(&self, fault: Fault) -> bool {
        // Redlock's masters are independent servers, not a cluster.
        !matches!(fault, Fault::Clock | Fault::Cluster)
    }

    fn servers(&self) -> usize {
        MASTERS
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let masters = env.urls[..MASTERS]
                .iter()
                .map(|u| redis::Client::open(u.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let label = env.label.clone();
            let redlock =
                Redlock::connect_with(masters, move |b| b.prefix(PREFIX).owner_label(label.clone()))
                    .await
                    .map_err(|e| e.to_string())?
                    // As for the other clients: a reply later than this counts as lost.
                    .node_timeout(env.response_timeout.min(env.ttl / 10));
            let mutex = env
                .names
                .iter()
                .map(|name| redlock.mutex_with(name, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(RedlockClient {
                mutex,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct RedlockClient {
    mutex: Vec<RedlockMutex>,
    timeout: Duration,
}

impl LockClient for RedlockClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.mutex[lock].lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Held::guard(guard, Role::Writer)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
