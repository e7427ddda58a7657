//! `redlease-multi`: the library's lock over several names, two names per critical
//! section. A client task asks for its lock and the next one (of at least four, so the
//! pairs form a cycle: {0,1}, {1,2}, {2,3}, {3,0}), listing them in one order and then the
//! other on alternate acquisitions; its holder read-increment-writes the counter of
//! each name, fenced by that name's own token. A lock over several names that held one
//! name while waiting for another would deadlock here; one whose names were not each
//! exactly the name's lock would lose increments.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redlease::{Client, LeaseOptions, MultiLock};

use super::{AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, acquire_error, redlease_client};
use crate::faults::Fault;

pub struct RedleaseMulti;

impl Algorithm for RedleaseMulti {
    fn name(&self) -> &'static str {
        "redlease-multi"
    }

    fn describe(&self) -> &'static str {
        "redlease::MultiLock over two names at once (both orders, pairs in a cycle); a fenced counter per name"
    }

    fn fenced(&self) -> bool {
        true
    }

    fn must_be_safe(&self) -> bool {
        true
    }

    fn supports(&self, fault: Fault) -> bool {
        fault != Fault::Clock
    }

    fn min_locks(&self) -> usize {
        // A cycle of pairs in which two holders can still be inside at once.
        4
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let n = env.names.len();
            let options = LeaseOptions::new().ttl(env.ttl);
            // For each lock: it and the next, in both orders.
            let mut pairs = Vec::with_capacity(n);
            for first in 0..n {
                let second = (first + 1) % n;
                let lock = |a: usize, b: usize| {
                    client
                        .multi_lock_with([&env.names[a], &env.names[b]], options)
                        .map(|lock| (lock, [a, b]))
                        .map_err(|e| e.to_string())
                };
                pairs.push([lock(first, second)?, lock(second, first)?]);
            }
            Ok(Arc::new(MultiClient {
                _client: client,
                pairs,
                calls: AtomicUsize::new(0),
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct MultiClient {
    _client: Client,
    /// Per lock: the multi-locks of it and the next one, in both orders, with the
    /// indices of their names.
    pairs: Vec<[(MultiLock, [usize; 2]); 2]>,
    /// Acquisitions so far: the order alternates with each.
    calls: AtomicUsize,
    timeout: Duration,
}

impl LockClient for MultiClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            let order = self.calls.fetch_add(1, Ordering::Relaxed) % 2;
            let (multi, names) = &self.pairs[lock][order];
            match multi.lock_timeout(self.timeout).await {
                Ok(guard) => {
                    let locks = names
                        .iter()
                        .zip(guard.fences())
                        .map(|(&i, fence)| (i, fence.get()))
                        .collect();
                    Ok(Held::several(guard, locks))
                }
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
