//! `redlease-fair`: the library's FIFO mutex, its fencing token enforced by the
//! resource. The lock and token are the plain mutex's; the queue (heartbeated waiter
//! entries, a wake-up for the next waiter only) is what the faults test besides.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Client, FairMutex, FairMutexGuard, Lease, LeaseOptions};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, ReleaseOutcome, acquire_error,
    redlease_client, release_outcome,
};

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

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let mutex = client
                .fair_mutex_with(&env.name, LeaseOptions::new().ttl(env.ttl))
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
    mutex: FairMutex,
    timeout: Duration,
}

impl LockClient for FairClient {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Held>, AcquireError>> {
        Box::pin(async move {
            match self.mutex.lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Box::new(FairHeld(guard)) as Box<dyn Held>),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}

struct FairHeld(FairMutexGuard);

impl Held for FairHeld {
    fn fence(&self) -> u64 {
        self.0.fence().into()
    }

    fn lease(&self) -> Option<&Lease> {
        Some(self.0.lease())
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move { release_outcome(self.0.release().await) })
    }
}
