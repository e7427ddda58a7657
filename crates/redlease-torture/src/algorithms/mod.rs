//! The locks under test, behind one small interface.
//!
//! Adding an algorithm (a fair mutex, a read-write lock's write side, a one-permit
//! semaphore, Redlock, the legacy timestamp mode) is one module here that implements
//! [`Algorithm`], [`LockClient`] and [`Held`], plus one line in [`all`]. The harness does
//! the rest: clients in tasks and processes, the resource, faults and the checker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redlease::Lease;

use crate::faults::Fault;

mod naive_get_del;
mod naive_setnx_expire;
mod redlease_mutex;

/// A boxed, sendable future (the interface is object-safe so algorithms can be listed).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Every algorithm the harness knows, in table order.
pub fn all() -> Vec<Arc<dyn Algorithm>> {
    vec![
        Arc::new(redlease_mutex::RedleaseMutex { fenced: true }),
        Arc::new(redlease_mutex::RedleaseMutex { fenced: false }),
        Arc::new(naive_setnx_expire::NaiveSetnxExpire::default()),
        Arc::new(naive_get_del::NaiveGetDel),
    ]
}

/// The algorithm called `name`.
pub fn by_name(name: &str) -> Option<Arc<dyn Algorithm>> {
    all().into_iter().find(|a| a.name() == name)
}

/// Where and how a client connects, the same for every algorithm of a phase.
#[derive(Clone, Debug)]
pub struct LockEnv {
    /// One URL per lock server, each through its own fault proxy; an algorithm uses the
    /// first [`Algorithm::servers`] of them.
    pub urls: Vec<String>,
    /// The lock's name (each algorithm gets its own).
    pub name: String,
    pub ttl: Duration,
    /// How long a client waits for one reply before treating it as lost.
    pub response_timeout: Duration,
    /// How long a client may keep retrying a request that failed in a way that may be
    /// temporary (for algorithms that retry at all).
    pub retry_window: Duration,
    /// How long one acquire may wait for the lock.
    pub acquire_timeout: Duration,
    /// A label for the client (worker/group), for owner metadata.
    pub label: String,
}

/// A lock algorithm under test.
pub trait Algorithm: Send + Sync {
    /// The name in tables, JSON and `--algorithms`.
    fn name(&self) -> &'static str;

    /// One line for `list`.
    fn describe(&self) -> &'static str;

    /// Whether the resource enforces this algorithm's fencing tokens.
    fn fenced(&self) -> bool;

    /// Whether any violation fails the run. False for baselines, which exist to show
    /// that the checker catches broken locks.
    fn must_be_safe(&self) -> bool;

    /// How many independent lock servers it needs (Redlock: several).
    fn servers(&self) -> usize {
        1
    }

    /// Whether runs under `fault` apply to it.
    fn supports(&self, fault: Fault) -> bool {
        fault != Fault::Clock
    }

    /// Connects one client; the tasks of a group share it.
    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>>;

    /// Called about twice a second by the coordinator with a direct (unproxied)
    /// connection to the first lock server: the place for an operator's intervention a
    /// broken algorithm needs to make progress at all (a lock that can never expire).
    /// Returns how many times it intervened. Correct algorithms never need it.
    fn repair<'a>(
        &'a self,
        _conn: &'a mut redis::aio::MultiplexedConnection,
        _name: &'a str,
    ) -> BoxFuture<'a, u64> {
        Box::pin(async { 0 })
    }
}

/// One client of an algorithm.
pub trait LockClient: Send + Sync {
    /// Waits for the lock, at most the environment's acquire timeout.
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Held>, AcquireError>>;
}

/// A held lock.
pub trait Held: Send {
    /// The fencing token handed to the resource (0 when the algorithm has none).
    fn fence(&self) -> u64;

    /// The lease, when the algorithm tells its holder until when it may act.
    fn lease(&self) -> Option<&Lease>;

    /// Releases the lock.
    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome>;
}

/// Why an acquire gave up.
#[derive(Debug)]
pub enum AcquireError {
    /// The lock stayed busy for the whole acquire timeout.
    Timeout,
    /// Redis could not be reached or did not answer in time.
    Unavailable(String),
    /// Anything else.
    Other(String),
}

/// What a release reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    /// The lock was no longer ours.
    NotHeld,
    Failed,
}

impl ReleaseOutcome {
    pub fn name(self) -> &'static str {
        match self {
            ReleaseOutcome::Released => "released",
            ReleaseOutcome::NotHeld => "not-held",
            ReleaseOutcome::Failed => "failed",
        }
    }
}

/// A connection for the naive baselines: a reconnecting connection with a reply
/// timeout, as a Jedis pool with `soTimeout` would give.
pub(crate) async fn naive_connection(env: &LockEnv) -> Result<redis::aio::ConnectionManager, String> {
    let client = redis::Client::open(env.urls[0].as_str()).map_err(|e| e.to_string())?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(env.response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(1);
    redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| e.to_string())
}

/// A polling delay for the naive baselines (they wait by sleeping and retrying, as
/// redis-py, redsync and rslock do).
pub(crate) fn poll_delay() -> Duration {
    Duration::from_millis(20 + getrandom::u64().unwrap_or(0) % 40)
}

pub(crate) fn classify(e: &redis::RedisError) -> AcquireError {
    use redis::{ErrorKind, ServerErrorKind};
    let loading = matches!(e.kind(), ErrorKind::Server(ServerErrorKind::BusyLoading));
    if loading || e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
    {
        AcquireError::Unavailable(e.to_string())
    } else {
        AcquireError::Other(e.to_string())
    }
}
