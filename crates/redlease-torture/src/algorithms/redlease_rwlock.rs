//! `redlease-rwlock`: the library's read-write lock. Writers take the write lock and
//! read-increment-write the counter with its fencing token, as a mutex holder does;
//! readers take read shares and only mark where they begin and end (readers get no
//! token: they change nothing). One acquisition in three is a write.
//!
//! The checker holds writers to the mutex's rules and adds one for readers: no reader
//! may be inside while a writer is, both with valid leases (unless Redis lost the lock
//! meanwhile). Readers inside together are expected; the table's `max-in` shows it.

use std::sync::Arc;
use std::time::Duration;

use redlease::{Client, LeaseOptions, RwLock};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, Role, acquire_error, redlease_client,
};
use crate::checker::Check;
use crate::faults::Fault;

pub struct RedleaseRwLock;

impl Algorithm for RedleaseRwLock {
    fn name(&self) -> &'static str {
        "redlease-rwlock"
    }

    fn describe(&self) -> &'static str {
        "redlease::RwLock: writers (1 in 3) fenced read-increment-write, readers only observe"
    }

    fn fenced(&self) -> bool {
        true
    }

    fn must_be_safe(&self) -> bool {
        true
    }

    fn check(&self) -> Check {
        Check::RwLock
    }

    fn supports(&self, fault: Fault) -> bool {
        fault != Fault::Clock
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let lock = env
                .names
                .iter()
                .map(|name| client.rwlock_with(name, LeaseOptions::new().ttl(env.ttl)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(RwClient {
                _client: client,
                lock,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct RwClient {
    _client: Client,
    lock: Vec<RwLock>,
    timeout: Duration,
}

impl LockClient for RwClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            if getrandom::u64().unwrap_or(0) % 3 == 0 {
                match self.lock[lock].write_timeout(self.timeout).await {
                    Ok(guard) => Ok(Held::guard(guard, Role::Writer)),
                    Err(e) => Err(acquire_error(e)),
                }
            } else {
                match self.lock[lock].read_timeout(self.timeout).await {
                    Ok(guard) => Ok(Held::guard(guard, Role::Occupant)),
                    Err(e) => Err(acquire_error(e)),
                }
            }
        })
    }
}
