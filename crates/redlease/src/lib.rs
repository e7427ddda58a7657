//! Distributed locks and leases on Redis, with fencing tokens, notified waiting and a
//! signal when a lease is lost.
//!
//! # A map of the crate
//!
//! - [`Client`]: the entry point. Holds one command connection (yours or its own), one
//!   pub/sub connection for wake-ups (RESP3, read straight into the waiters), and one
//!   renewal task for all leases.
//! - [`Mutex`] / [`MutexGuard`]: the plain lock, at key `<prefix><name>` in the format
//!   redis-py, node-redlock and redsync use.
//! - [`FairMutex`]: the same lock, served in arrival order (FIFO), with a heartbeated
//!   queue that dead waiters leave within seconds.
//! - [`RwLock`]: many readers or one writer, writer-preferring; every share its own lease.
//! - [`Semaphore`] / [`Permit`]: N permits per name, each acquisition a lease that comes
//!   back when its holder stops renewing it.
//! - [`MultiLock`] / [`MultiLockGuard`]: several names held as one, taken all or none —
//!   each name exactly the plain [`Mutex`] of that name, with its own fencing token —
//!   without ever holding one name while waiting for another, so takers of overlapping
//!   sets cannot deadlock; across the masters of a Redis Cluster too.
//! - [`Election`] / [`Leadership`]: leader election — one leader among candidates,
//!   for a term that is a fencing token; the value it publishes ([`Leader`]), and a
//!   stream of changes ([`Observer`], [`LeaderEvent`]).
//! - [`Lease`]: how long a holder may act (`valid_until`) and a [`lost`](Lease::lost)
//!   signal; [`FencingToken`]: the number to hand the protected resource.
//! - [`optimistic`]: no lock at all — `WATCH`/`MULTI`/`EXEC` transactions with bounded
//!   retry, and a server-side compare-and-set, with measurements of when each wins.
//! - [`LegacyLock`]: an interop mode that takes part in old `SETNX`/`GETSET`
//!   timestamp locks beside unmodified old clients (weaker guarantees; never the default).
//! - [`Redlock`] / [`RedlockMutex`] / [`RedlockGuard`]: a quorum lock over N
//!   independent masters (antirez's Redlock): survives a minority of masters down,
//!   assumes bounded clock drift, and gives no fencing token (see [`Redlock`] for why).
//! - [`TlsOptions`]: `rediss://` with a custom CA and client certificates (rustls).
//! - [`acl_rules`]: the least-privilege ACL rules of a Redis user for redlease.
//! - [`Client::list`] / [`LockInfo`]: every held lock under the prefix, of every kind,
//!   found with `SCAN` and never showing a token.
//! - [`Error`]: one error type; messages name the lock.
//! - [`ReplicaAck`] / [`OnShortfall`]: an opt-in per-lock durability policy (`WAIT`
//!   for replicas after acquire and extend).
//!
//! - [`describe_metrics`]: metrics of acquisitions, waits, hold times, renewals, lost
//!   leases, hand-overs and retries, through the `metrics` facade.
//!
//! - [`Guard`]: what every guard shows — name, fencing token, lease, `lost()`,
//!   `extend`, `release` — for code that holds any kind of lock.
//!
//! # Layers
//!
//! Inside, the layers are the folders; each imports only from those below it:
//!
//! - the public face: `client` (the [`Client`]), `list` (what every primitive's keys
//!   look like, for [`Client::list`]), `options`, `error`, and the
//!   vocabulary every layer shares (`token`, `keys`);
//! - the primitives — `mutex` (with its local queue), `fair`, `rwlock`, `semaphore`,
//!   `legacy`, `redlock`, `election`, `multi`: only what is specific to each, its
//!   keys, scripts, reply shapes and waiting policy;
//! - `engine/`: the lease engine — leases and their ordering, the renewal task,
//!   wake-ups, the acquire loop, requests with retries and deadlines, and the one
//!   guard core every guard is built on;
//! - `script/`: the Lua scripts (one per state change), running them, reading replies;
//! - `transport/`: the connection, batching per deployment (Cluster redirects
//!   followed), Sentinel, TLS.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), redlease::Error> {
//! let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
//! let mutex = client.mutex("invoice-run")?;
//!
//! let guard = mutex.lock_timeout(Duration::from_secs(10)).await?;
//! let fence = guard.fence();
//! tokio::select! {
//!     // Do the work, passing `fence` to the resource so a stale holder is refused.
//!     _ = do_work(fence) => {}
//!     // The lease could not be kept: stop touching the resource.
//!     reason = guard.lost() => eprintln!("lost the lock: {reason}"),
//! }
//! guard.release().await?;
//! # Ok(()) }
//! # async fn do_work(_: redlease::FencingToken) {}
//! ```
//!
//! # What a Redis lock guarantees
//!
//! - **Mutual exclusion while the lease is valid and Redis keeps its writes.** Only the
//!   holder of the random token in the key can extend or release it; acquiring is one
//!   atomic script, so there is no `SETNX`/`EXPIRE` gap and no deleting someone else's
//!   lock.
//! - **Lost replies are harmless.** A retried acquire that finds its own token reports
//!   success; an acquire that fails or is cancelled after its request may have landed
//!   compare-and-deletes its token in the background.
//! - **A holder learns when its lease is gone.** Leases renew every TTL/3; a renewal
//!   that finds the key gone, or cannot confirm it before `valid_until`, fires
//!   [`Lease::lost`]. `valid_until` is measured from when the request was *sent*, minus
//!   a drift margin, so it ends on the client before it ends on the server.
//! - **What it cannot promise.** A holder that pauses longer than its lease (GC, swap,
//!   SIGSTOP) may act after another process took the lock; a Redis failover may promote
//!   a replica that never saw the lock; Redis's clock jumping forward expires leases
//!   early. In each case the lock alone cannot stop the second writer — the
//!   [`FencingToken`] can, if the resource rejects tokens lower than the highest it saw.
//!
//! # Topologies
//!
//! - **One Redis**: [`Client::connect`] / [`Client::builder`].
//! - **Redis Cluster**: [`Client::cluster`] / [`Client::cluster_builder`] with the
//!   URLs of some of its nodes. The plain-mutex key stays exactly `<prefix><name>`; every auxiliary key and
//!   the wake-up channel share its hash slot, so each operation runs on the one node
//!   that owns the lock. Releases publish with `SPUBLISH` and waiters `SSUBSCRIBE` on
//!   that node only (no cluster-wide broadcast). `MOVED`/`ASK` are followed and a
//!   resharding costs retries, not exclusion — but acquiring a *free* lock whose slot
//!   is mid-migration is refused by Redis (`TRYAGAIN`) until the migration ends; it is
//!   retried for the client's [retry window](ClientBuilder::retry_window).
//! - **Sentinel**: [`Client::sentinel`] / [`Client::sentinel_builder`] with the
//!   sentinels' URLs and the master name. After a failover the client follows the
//!   promoted replica. Locks whose write had not reached it are lost: another client
//!   can take them before the holder learns it (at its next renewal, as
//!   [`LostReason::Gone`]). Jepsen showed Sentinel loses acknowledged writes this way;
//!   [`ReplicaAck`] narrows the window (it does not close it), fencing tokens make it
//!   harmless to a resource that checks them. Set the retry window above your
//!   failover time so that calls ride through a failover instead of failing.
//!
//! # Waiting
//!
//! A release publishes on the lock's channel in the same script that frees it (a plain
//! mutex's only when a waiter registered); waiting processes are woken through one
//! shared pub/sub connection per client instead of polling. Where the release knows who is next — a registered waiter of the plain
//! mutex, the head of a fair mutex's queue, registered waiters of a semaphore that fit
//! in the permits freed — it hands the lock or the permits straight to that waiter and
//! tells only its client, so the waiter holds them when the message arrives. A missed
//! wake-up (a dropped connection, a non-redlease client releasing) costs at most the
//! holder's remaining lease.

#![warn(missing_docs)]

/// The redis-rs crate redlease is built on, re-exported: its types appear in redlease's
/// API ([`Client::builder`] takes a [`redis::Client`], [`Error::Redis`] carries a
/// [`redis::RedisError`], [`Client::connection`] is a [`redis::aio::ConnectionLike`]),
/// and `redlease::redis` is always the version that fits. Depend on `redis` yourself
/// only for features redlease does not enable, with a version compatible with this one.
pub use redis;

// The public face, and the vocabulary every layer shares.
mod acl;
mod client;
mod error;
mod keys;
mod list;
mod options;
mod token;

pub use acl::acl_rules;
pub use client::{Client, ClientBuilder, ClientStats, SharedConnection};
pub use error::{CertificateProblem, Error, Result, needs_escape, redact_url};
pub use keys::{MAX_NAME_LEN, MAX_TTL, MIN_TTL};
pub use list::{LockInfo, LockKind};
pub use options::{
    DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETENTION, DEFAULT_RETRY_WINDOW, DEFAULT_TTL,
    LeaseOptions, OnShortfall, ReplicaAck,
};
pub use token::{FencingToken, Token};

// The primitives.
mod election;
mod fair;
mod legacy;
mod multi;
mod mutex;
pub mod optimistic;
mod redlock;
mod rwlock;
mod semaphore;

pub use election::{Election, Leader, LeaderEvent, Leadership, MAX_LEADER_VALUE_LEN, Observer};
pub use fair::{FairMutex, FairMutexGuard, FairMutexStatus};
pub use legacy::{DEFAULT_LEGACY_POLL, LegacyGuard, LegacyLock, LegacyOptions, TimestampUnit};
pub use multi::{MultiLock, MultiLockGuard};
pub use mutex::{Mutex, MutexGuard, MutexStatus};
pub use redlock::{DEFAULT_NODE_TIMEOUT, Redlock, RedlockGuard, RedlockMutex};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockStatus, RwLockWriteGuard};
pub use semaphore::{MAX_PERMITS, MAX_PERMITS_PER_ACQUIRE, Permit, Semaphore, SemaphoreStatus};

// The lease engine.
mod engine;

pub use engine::{Guard, Lease, LostReason, describe_metrics};

// Scripts and transport.
mod script;
mod transport;

pub use transport::CommandConnection;
#[cfg(feature = "tls")]
pub use transport::tls::TlsOptions;
