//! `redlease-fair`: the library's FIFO mutex, its fencing token enforced by the
//! resource. The lock and token are the plain mutex's; the queue (heartbeated waiter
//! entries, a wake-up for the next waiter only) is what the faults test besides.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Client, FairMutex, LeaseOptions};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, Role, acquire_error, redlease_client,
};
use crate::faults::Fault;

pub struct RedleaseFair;

impl Algorithm for RedleaseFair {
    fn name(&self) -> &'static str {
        "redlease-fair"
    }

    fn describe(&self) -> &'static str {
        "redlease::FairMutex (FIFO queue, heartbeated waiters); the resource enforces its fencing tokens"
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

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let mutex = env
                .names
                .iter()
                .map(|name| client.fair_mutex_with(name, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(FairClient {
                _client: client,
                mutex,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct FairClient {
    _client: Client,
    mutex: Vec<FairMutex>,
    timeout: Duration,
}

impl LockClient for FairClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.mutex[lock].lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Held::guard(guard, Role::Writer)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
