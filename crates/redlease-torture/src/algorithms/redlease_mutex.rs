//! `redlease`: the library's plain mutex, with its fencing token enforced by the
//! resource. `redlease-nofence`: the same lock whose token the resource ignores — it
//! shows what the lock alone cannot promise (a holder that stalls past its lease, a
//! server that forgets the lock), and that the fence is what protects the resource then.

use std::sync::Arc;

use redlease::{Client, Lease, LeaseOptions, Mutex, MutexGuard};

use super::{AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, ReleaseOutcome};

pub struct RedleaseMutex {
    pub fenced: bool,
}

impl Algorithm for RedleaseMutex {
    fn name(&self) -> &'static str {
        if self.fenced {
            "redlease"
        } else {
            "redlease-nofence"
        }
    }

    fn describe(&self) -> &'static str {
        if self.fenced {
            "redlease::Mutex with auto-renewed leases; the resource enforces its fencing tokens"
        } else {
            "redlease::Mutex, but the resource ignores its tokens (lock only, no fence): expected to fail"
        }
    }

    fn fenced(&self) -> bool {
        self.fenced
    }

    fn must_be_safe(&self) -> bool {
        self.fenced
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let redis = redis::Client::open(env.urls[0].as_str()).map_err(|e| e.to_string())?;
            let client = Client::builder(redis)
                .prefix("torture:")
                .owner_label(env.label.clone())
                .response_timeout(Some(env.response_timeout))
                .retry_window(env.retry_window)
                .build()
                .await
                .map_err(|e| e.to_string())?;
            let mutex = client
                .mutex_with(&env.name, LeaseOptions::new().ttl(env.ttl))
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(RedleaseClient {
                _client: client,
                mutex,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct RedleaseClient {
    _client: Client,
    mutex: Mutex,
    timeout: std::time::Duration,
}

impl LockClient for RedleaseClient {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Held>, AcquireError>> {
        Box::pin(async move {
            match self.mutex.lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Box::new(RedleaseHeld(guard)) as Box<dyn Held>),
                Err(e) if e.is_timeout() => Err(AcquireError::Timeout),
                Err(e) if e.is_unavailable() => Err(AcquireError::Unavailable(e.to_string())),
                Err(e) => Err(AcquireError::Other(e.to_string())),
            }
        })
    }
}

struct RedleaseHeld(MutexGuard);

impl Held for RedleaseHeld {
    fn fence(&self) -> u64 {
        self.0.fence().into()
    }

    fn lease(&self) -> Option<&Lease> {
        Some(self.0.lease())
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move {
            match self.0.release().await {
                Ok(()) => ReleaseOutcome::Released,
                Err(e) if e.is_not_held() => ReleaseOutcome::NotHeld,
                Err(_) => ReleaseOutcome::Failed,
            }
        })
    }
}
