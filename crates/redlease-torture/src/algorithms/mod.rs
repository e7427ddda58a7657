//! The locks under test, behind one small interface.
//!
//! Adding an algorithm is one module here that implements [`Algorithm`] and
//! [`LockClient`], plus one line in [`all`]: a redlease lock hands back its guard as a
//! [`Held::guard`] (any guard, through the common [`redlease::Guard`] surface), a
//! baseline its own [`NaiveHeld`]. The harness does the rest: clients in tasks
//! and processes, the resource, faults and the checker.
//!
//! A lock over several names ([`Held::several`]) holds several of the environment's
//! locks at once, each with its own fencing token: its holder read-increment-writes
//! the counter of each, each with that name's token.
//!
//! A holder either read-increment-writes the counter with its fencing token
//! ([`Role::Writer`]: mutexes, a read-write lock's writers) or only marks where its
//! critical section begins and ends ([`Role::Occupant`]: readers, permit holders, which
//! have no token); [`Algorithm::check`] says what the checker demands of the log.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redlease::Lease;

use crate::checker::Check;
use crate::faults::Fault;

mod legacy;
mod naive_get_del;
mod naive_setnx_expire;
mod redlease_election;
mod redlease_fair;
mod redlease_multi;
mod redlease_mutex;
mod redlease_redlock;
mod redlease_rwlock;
mod redlease_semaphore;

/// The key prefix of every redlease lock of the run: lock `name` lives at
/// `torture:<name>`.
pub const PREFIX: &str = "torture:";

/// A boxed, sendable future (the interface is object-safe so algorithms can be listed).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Every algorithm the harness knows, in table order.
pub fn all() -> Vec<Arc<dyn Algorithm>> {
    vec![
        Arc::new(redlease_mutex::RedleaseMutex { fenced: true }),
        Arc::new(redlease_mutex::RedleaseMutex { fenced: false }),
        Arc::new(redlease_fair::RedleaseFair),
        Arc::new(redlease_election::RedleaseElection),
        Arc::new(redlease_rwlock::RedleaseRwLock),
        Arc::new(redlease_semaphore::RedleaseSemaphore),
        Arc::new(redlease_redlock::RedleaseRedlock),
        Arc::new(redlease_multi::RedleaseMulti),
        Arc::new(legacy::RedleaseLegacy),
        Arc::new(naive_setnx_expire::NaiveSetnxExpire::default()),
        Arc::new(naive_get_del::NaiveGetDel),
        Arc::new(legacy::NaiveLegacy),
    ]
}

/// Faults under which a lock *without* a token the resource checks cannot keep the
/// resource safe, by design: a holder stalled or frozen past its lease acts after its
/// successor came (`client-pause`, `process-pause`), or Redis forgets the lock
/// (`server-restart`). Algorithms without fencing are informative under these.
pub fn outlives_lease(fault: Fault) -> bool {
    matches!(
        fault,
        Fault::ClientPause | Fault::ProcessPause | Fault::ServerRestart
    )
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
    /// The names of the locks its clients take (each algorithm gets its own); a
    /// client task takes always the same one of them. One client serves them all, so
    /// its renewal ticks carry the leases of several locks.
    pub names: Vec<String>,
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
    /// The URLs are a Redis Cluster's masters (only algorithms that support
    /// [`Fault::Cluster`] are connected to one).
    pub cluster: bool,
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

    /// Whether a violation under these faults fails the run (default:
    /// [`must_be_safe`](Algorithm::must_be_safe)). Locks without fencing tokens are
    /// must-be-safe only where no holder can outlive its lease unnoticed.
    fn must_be_safe_under(&self, _faults: &[Fault]) -> bool {
        self.must_be_safe()
    }

    /// What `list` calls it.
    fn kind(&self) -> &'static str {
        if self.must_be_safe() {
            "must be safe"
        } else {
            "baseline"
        }
    }

    /// What the checker demands of its counter's log.
    fn check(&self) -> Check {
        Check::Mutex
    }

    /// How many independent lock servers it needs (Redlock: several).
    fn servers(&self) -> usize {
        1
    }

    /// The fewest locks (names, each with its own counter) it needs: a lock over
    /// several names needs several, whatever the phase.
    fn min_locks(&self) -> usize {
        1
    }

    /// Whether runs under `fault` apply to it (default: every fault but `clock`, which
    /// only old-style clients feel, `cluster`, which needs Redis Cluster support, and
    /// `extend`, which needs a redlease guard).
    fn supports(&self, fault: Fault) -> bool {
        !matches!(fault, Fault::Clock | Fault::Cluster | Fault::Extend)
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
    /// Waits for lock `lock` (an index into the environment's names), at most the
    /// environment's acquire timeout.
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>>;
}

/// What a holder does with the counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads, increments and writes back, with its fencing token.
    Writer,
    /// Only begins and ends (tokenless: never fenced).
    Occupant,
}

/// A held lock: a redlease guard of any kind, or a naive baseline's lock.
///
/// Every redlease algorithm's holding is the same adapter over the surface every
/// redlease guard shares ([`redlease::Guard`]): its fencing token (if the primitive has
/// one), its lease, `extend`, `release`. Only the role — what the holder does with the
/// counter — comes from the algorithm. The baselines are not redlease guards; they have
/// no lease and no token, and only release.
pub enum Held {
    /// Any redlease guard, in the role its algorithm gave it.
    Guard {
        guard: Box<dyn redlease::Guard>,
        role: Role,
    },
    /// A naive baseline's lock.
    Naive(Box<dyn NaiveHeld>),
    /// A redlease guard over several of the environment's locks (indices into its
    /// names), each with its own fencing token; its holder writes every one of them.
    Several {
        guard: Box<dyn redlease::Guard>,
        locks: Vec<(usize, u64)>,
    },
}

impl Held {
    /// A redlease guard held in `role`.
    pub fn guard(guard: impl redlease::Guard + 'static, role: Role) -> Held {
        Held::Guard {
            guard: Box::new(guard),
            role,
        }
    }

    /// A naive baseline's lock.
    pub fn naive(held: impl NaiveHeld + 'static) -> Held {
        Held::Naive(Box::new(held))
    }

    /// A redlease guard holding several locks: `(lock index, fencing token)` each.
    pub fn several(guard: impl redlease::Guard + 'static, locks: Vec<(usize, u64)>) -> Held {
        Held::Several {
            guard: Box::new(guard),
            locks,
        }
    }

    /// The locks held, with the fencing token handed to each one's resource counter:
    /// `lock` (the one the client asked for) with [`fence`](Held::fence), or each lock
    /// of a guard over several.
    pub fn parts(&self, lock: usize) -> Vec<(usize, u64)> {
        match self {
            Held::Several { locks, .. } => locks.clone(),
            _ => vec![(lock, self.fence())],
        }
    }

    /// What the holder does in its critical section (a baseline's holder writes).
    pub fn role(&self) -> Role {
        match self {
            Held::Guard { role, .. } => *role,
            Held::Naive(_) | Held::Several { .. } => Role::Writer,
        }
    }

    /// The fencing token handed to the resource (0 when the lock has none).
    pub fn fence(&self) -> u64 {
        match self {
            Held::Guard { guard, .. } => guard.fence().map_or(0, u64::from),
            Held::Naive(_) | Held::Several { .. } => 0,
        }
    }

    /// The lease, when the lock tells its holder until when it may act.
    pub fn lease(&self) -> Option<&Lease> {
        self.redlease().map(redlease::Guard::lease)
    }

    /// The redlease guard, if this is one.
    pub fn redlease(&self) -> Option<&dyn redlease::Guard> {
        match self {
            Held::Guard { guard, .. } | Held::Several { guard, .. } => Some(&**guard),
            Held::Naive(_) => None,
        }
    }

    /// Releases the lock.
    pub async fn release(self) -> ReleaseOutcome {
        match self {
            Held::Guard { guard, .. } | Held::Several { guard, .. } => release_outcome(guard.release().await),
            Held::Naive(held) => held.release().await,
        }
    }
}

/// A naive baseline's held lock: no lease, no token, only a release.
pub trait NaiveHeld: Send + Sync {
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

/// Maps a redlease acquire error.
pub(crate) fn acquire_error(e: redlease::Error) -> AcquireError {
    if e.is_timeout() {
        AcquireError::Timeout
    } else if e.is_unavailable() {
        AcquireError::Unavailable(e.to_string())
    } else {
        AcquireError::Other(e.to_string())
    }
}

/// Maps a redlease release result.
pub(crate) fn release_outcome(r: redlease::Result<()>) -> ReleaseOutcome {
    match r {
        Ok(()) => ReleaseOutcome::Released,
        Err(e) if e.is_not_held() => ReleaseOutcome::NotHeld,
        Err(_) => ReleaseOutcome::Failed,
    }
}

/// A redlease client as every redlease algorithm here configures it: for the first lock
/// server, or for the Redis Cluster whose masters are the environment's URLs.
pub(crate) async fn redlease_client(env: &LockEnv) -> Result<redlease::Client, String> {
    let builder = if env.cluster {
        redlease::Client::cluster_builder(env.urls.iter().map(String::as_str)).map_err(|e| e.to_string())?
    } else {
        redlease::Client::builder(redis::Client::open(env.urls[0].as_str()).map_err(|e| e.to_string())?)
    };
    builder
        .prefix(PREFIX)
        .owner_label(env.label.clone())
        .response_timeout(Some(env.response_timeout))
        .retry_window(env.retry_window)
        .build()
        .await
        .map_err(|e| e.to_string())
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
