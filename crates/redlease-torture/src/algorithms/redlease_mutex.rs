//! `redlease`: the library's plain mutex, with its fencing token enforced by the
//! resource. `redlease-nofence`: the same lock whose token the resource ignores — it
//! shows what the lock alone cannot promise (a holder that stalls past its lease, a
//! server that forgets the lock), and that the fence is what protects the resource then.

use std::sync::Arc;

use std::time::Duration;

use redlease::{Client, LeaseOptions, Mutex};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, Role, acquire_error, redlease_client,
};
use crate::faults::Fault;

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

    fn supports(&self, fault: Fault) -> bool {
        // The cluster phase runs the fenced mutex; the unfenced one would only repeat it.
        fault != Fault::Clock && (self.fenced || fault != Fault::Cluster)
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let mutex = env
                .names
                .iter()
                .map(|name| client.mutex_with(name, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
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
    mutex: Vec<Mutex>,
    timeout: Duration,
}

impl LockClient for RedleaseClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.mutex[lock].lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Held::guard(guard, Role::Writer)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}
