//! The client: one connection for commands, one for wake-ups, one renewal task.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::{Batching, CommandConnection};
use crate::error::{Error, Result};
use crate::fair::FairMutex;
use crate::keys;
use crate::legacy::{LegacyLock, LegacyOptions};
use crate::mutex::Mutex;
use crate::notify::{Notifier, PubSubConnector};
use crate::renewer::Renewer;
use crate::replicas::ReplicaAck;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::sentinel::SentinelConnection;
use crate::topology::{Deployment, Topology};

/// Default lease length.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "redlease:";
/// Default time a lock's metadata (fencing mark, owner, release record) outlives the lease.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(60);
/// Default time a request that may have failed temporarily is retried.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(3);
/// Default per-command reply timeout of the connection redlease opens itself.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings shared by every lock a client hands out.
#[derive(Debug)]
pub(crate) struct ClientInner {
    pub conn: Arc<dyn CommandConnection>,
    pub notifier: Notifier,
    /// In-process queues of the plain mutexes, by lock key.
    pub locals: crate::local::Registry<crate::mutex::HandedLock>,
    pub renewer: Renewer,
    pub prefix: String,
    pub label: Arc<str>,
    /// Metadata retention in milliseconds, as the script argument.
    pub retention_arg: Arc<str>,
    /// `PUBLISH` or `SPUBLISH`, as the script argument.
    pub publish: Arc<str>,
    /// How long a waiter waits for its subscription to be confirmed before polling.
    pub subscribe_timeout: Duration,
    /// For how long a request that failed in a way that may be temporary (timeout,
    /// broken connection) is retried before the error is returned.
    pub retry_window: Duration,
    /// Standalone, Sentinel or Cluster, and what that changes.
    pub topology: Topology,
}

impl std::fmt::Debug for dyn CommandConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommandConnection")
    }
}

/// Options for one lock: how long its leases last and whether they renew themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// Lease length (default 30 s). The lock frees itself this long after its holder
    /// stops renewing it.
    pub ttl: Duration,
    /// Renew the lease every `ttl / 3` until it is released (default `true`).
    pub auto_renew: bool,
    /// Wait for replicas to acknowledge each acquire and extend (default: off, no
    /// `WAIT` is sent). See [`ReplicaAck`].
    pub replica_ack: Option<ReplicaAck>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            ttl: DEFAULT_TTL,
            auto_renew: true,
            replica_ack: None,
        }
    }
}

impl LeaseOptions {
    /// The defaults: 30 s leases with auto-renewal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease length (at least 10 ms, at most 30 days; checked when the lock is made).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Turns auto-renewal on or off. Without it the lease ends `ttl` after it was
    /// acquired (or last extended) unless the holder calls `extend`.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// After each acquire and extend, waits for replicas as `policy` says (checked when
    /// the lock is made). See [`ReplicaAck`] for what this does and does not protect.
    pub fn replica_ack(mut self, policy: ReplicaAck) -> Self {
        self.replica_ack = Some(policy);
        self
    }

    /// Shorthand for `replica_ack(ReplicaAck::new(replicas))`: `replicas` replicas must
    /// acknowledge each acquire and extend within 500 ms, or the lock is released and
    /// the call fails with [`Error::NotReplicated`]. (The CLI's `--wait-replicas K`.)
    pub fn wait_replicas(self, replicas: u32) -> Self {
        self.replica_ack(ReplicaAck::new(replicas))
    }
}

/// The entry point: hands out locks that share one command connection, one wake-up
/// connection and one renewal task.
///
/// Cheap to clone. Background tasks stop when the client and every lock and guard made
/// from it are dropped.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
/// let mutex = client.mutex("nightly-report")?;
/// let guard = mutex.lock().await?;
/// println!("fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl Client {
    /// Connects to the Redis at `url` with the default settings.
    ///
    /// Opens a [`ConnectionManager`](redis::aio::ConnectionManager), which reconnects
    /// after a broken connection or a server restart.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the URL is invalid or the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Client> {
        let redis = redis::Client::open(url).map_err(|e| Error::Config {
            reason: format!("invalid redis url {url:?}"),
            source: Some(e),
        })?;
        Client::builder(redis).build().await
    }

    /// Connects to a Redis Cluster through the given seed nodes (any subset of its
    /// nodes; the rest are discovered), with the default settings.
    ///
    /// Commands go to the node owning each lock's slot; wake-ups use sharded pub/sub.
    /// See [`cluster_builder`](Client::cluster_builder).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when a URL is invalid or no seed node can be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redlease::Error> {
    /// let client = redlease::Client::cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]).await?;
    /// let guard = client.mutex("invoice-run")?.lock().await?;
    /// # guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn cluster<I>(nodes: I) -> Result<Client>
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        Client::cluster_builder(nodes)?.build().await
    }

    /// Starts configuring a client for a Redis Cluster reached through `nodes` (seed
    /// URLs such as `redis://host:port`; user name and password from the first).
    ///
    /// The client opens two cluster connections: one for commands (unless
    /// [`connection`](ClientBuilder::connection) gives yours — it must then be a cluster
    /// connection) and a RESP3 one for sharded pub/sub wake-ups. Every key of a lock
    /// lives in one slot, so every operation runs on one node; redis-rs follows `MOVED`
    /// and `ASK` redirections, so a resharding while locks are in use costs retries,
    /// never exclusion.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when a URL is invalid or the list is empty.
    pub fn cluster_builder<I>(nodes: I) -> Result<ClientBuilder>
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        let nodes = connection_infos(nodes, "cluster node")?;
        Ok(ClientBuilder::new(Source::Cluster(nodes)))
    }

    /// Connects through Sentinel to the master the sentinels at `sentinels` know as
    /// `master`, with the default settings. See [`sentinel_builder`](Client::sentinel_builder).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when a URL is invalid or the sentinels name no reachable master.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redlease::Error> {
    /// let client = redlease::Client::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub async fn sentinel<I>(sentinels: I, master: &str) -> Result<Client>
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        Client::sentinel_builder(sentinels, master)?.build().await
    }

    /// Starts configuring a client for the master the sentinels at `sentinels` monitor
    /// under the name `master`.
    ///
    /// Commands and wake-ups go to the server the sentinels name master. When a request
    /// finds it gone or demoted (a broken connection, `READONLY`), the client asks the
    /// sentinels again, so after a failover it follows the promoted replica; the
    /// wake-up connection does the same and wakes every waiter when it reconnects.
    ///
    /// Sentinel keeps Redis available, not every acknowledged write: a lock acquired
    /// just before a failover may be missing on the promoted replica. Its holder
    /// learns it at the next renewal ([`LostReason::Gone`](crate::LostReason::Gone)),
    /// but another client may take the lock before then. A
    /// [`ReplicaAck`] policy narrows that window; fencing tokens make it harmless.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when a URL is invalid or the list is empty.
    pub fn sentinel_builder<I>(sentinels: I, master: &str) -> Result<ClientBuilder>
    where
        I: IntoIterator,
        I::Item: redis::IntoConnectionInfo,
    {
        let sentinels = connection_infos(sentinels, "sentinel")?;
        if master.is_empty() {
            return Err(Error::Config {
                reason: "the sentinel master name is empty".into(),
                source: None,
            });
        }
        Ok(ClientBuilder::new(Source::Sentinel {
            sentinels,
            master: master.to_owned(),
            node: None,
        }))
    }

    /// Starts configuring a client for `redis`, which is also used to open the
    /// wake-up connection.
    pub fn builder(redis: redis::Client) -> ClientBuilder {
        ClientBuilder::new(Source::Standalone(redis))
    }

    /// A plain mutex at key `<prefix><name>` with default options (30 s lease, auto-renew).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty or over-long name, or one whose key could not
    /// keep its auxiliary keys in its cluster slot.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A plain mutex with the given lease options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<Mutex> {
        keys::ttl_ms(name, options.ttl)?;
        if let Some(policy) = &options.replica_ack {
            policy.validate(name, options.ttl, self.inner.topology.response_timeout)?;
        }
        Mutex::new(self.inner.clone(), name, options)
    }

    /// A lock in the old `SETNX <unix time + timeout + 1>` format at key
    /// `<prefix><name>`, shared with unmodified old clients. An interop mode with
    /// weaker guarantees than [`mutex`](Client::mutex); see [`LegacyLock`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidTtl`] (with seconds, the timeout must be
    /// a whole number of seconds) or [`Error::InvalidArgument`] (a zero poll interval).
    pub fn legacy_lock(&self, name: &str, options: LegacyOptions) -> Result<LegacyLock> {
        LegacyLock::new(self.inner.clone(), name, options)
    }

    /// A fair (FIFO) mutex at key `<prefix><name>` with default options (30 s lease,
    /// auto-renew, 5 s waiter TTL). See [`FairMutex`] for how it shares the key with
    /// the plain mutex.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], as for [`mutex`](Client::mutex).
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        self.fair_mutex_with(name, LeaseOptions::default())
    }

    /// A fair mutex with the given lease options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn fair_mutex_with(&self, name: &str, options: LeaseOptions) -> Result<FairMutex> {
        FairMutex::new(self.inner.clone(), name, options)
    }

    /// A writer-preferring read-write lock with default options (30 s leases,
    /// auto-renew, 5 s waiter TTL).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], as for [`mutex`](Client::mutex).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        self.rwlock_with(name, LeaseOptions::default())
    }

    /// A read-write lock with the given lease options (for readers and writers).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn rwlock_with(&self, name: &str, options: LeaseOptions) -> Result<RwLock> {
        RwLock::new(self.inner.clone(), name, options)
    }

    /// A semaphore of `limit` permits with default options (30 s leases, auto-renew).
    /// Every user of the name must give the same limit while permits are held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::InvalidArgument`] when `limit` is 0 or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        self.semaphore_with(name, limit, LeaseOptions::default())
    }

    /// A semaphore of `limit` permits with the given lease options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidTtl`] or [`Error::InvalidArgument`].
    pub fn semaphore_with(&self, name: &str, limit: u32, options: LeaseOptions) -> Result<Semaphore> {
        Semaphore::new(self.inner.clone(), name, limit, options)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The owner label stored beside every lock this client holds.
    pub fn owner_label(&self) -> &str {
        &self.inner.label
    }

    /// Counters of this client's background renewal work.
    pub fn stats(&self) -> ClientStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = self.inner.renewer.counters();
        ClientStats {
            renewal_ticks: c.ticks.load(Relaxed),
            renewal_round_trips: c.round_trips.load(Relaxed),
            leases_renewed: c.renewed.load(Relaxed),
            leases_lost_by_renewal: c.lost.load(Relaxed),
        }
    }
}

/// Counters of one client's background renewal work (see [`Client::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Renewal ticks run: each renews every lease due at that moment in one batch.
    pub renewal_ticks: u64,
    /// Round trips those ticks made: one per tick (per node on a cluster), plus the
    /// reloads after a server forgot its scripts.
    pub renewal_round_trips: u64,
    /// Lease renewals that succeeded.
    pub leases_renewed: u64,
    /// Leases a renewal found gone, or could not confirm before they expired.
    pub leases_lost_by_renewal: u64,
}

/// Where a client finds Redis.
#[derive(Debug)]
enum Source {
    Standalone(redis::Client),
    Cluster(Vec<redis::ConnectionInfo>),
    Sentinel {
        sentinels: Vec<redis::ConnectionInfo>,
        master: String,
        node: Option<redis::sentinel::SentinelNodeConnectionInfo>,
    },
}

fn connection_infos<I>(urls: I, what: &str) -> Result<Vec<redis::ConnectionInfo>>
where
    I: IntoIterator,
    I::Item: redis::IntoConnectionInfo,
{
    let infos = urls
        .into_iter()
        .map(redis::IntoConnectionInfo::into_connection_info)
        .collect::<redis::RedisResult<Vec<_>>>()
        .map_err(|e| Error::Config {
            reason: format!("invalid {what} url"),
            source: Some(e),
        })?;
    if infos.is_empty() {
        return Err(Error::Config {
            reason: format!("no {what} url given"),
            source: None,
        });
    }
    Ok(infos)
}

/// Configures a [`Client`].
#[derive(Debug)]
#[must_use]
pub struct ClientBuilder {
    source: Source,
    conn: Option<Arc<dyn CommandConnection>>,
    prefix: String,
    label: Option<String>,
    retention: Duration,
    response_timeout: Option<Duration>,
    retry_window: Duration,
}

impl ClientBuilder {
    fn new(source: Source) -> Self {
        ClientBuilder {
            source,
            conn: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            label: None,
            retention: DEFAULT_RETENTION,
            response_timeout: Some(DEFAULT_RESPONSE_TIMEOUT),
            retry_window: DEFAULT_RETRY_WINDOW,
        }
    }

    /// Sentinel only: how to connect to the master and replicas the sentinels name
    /// (TLS, user name and password, database), when it differs from the defaults.
    pub fn sentinel_node_info(mut self, info: redis::sentinel::SentinelNodeConnectionInfo) -> Self {
        if let Source::Sentinel { node, .. } = &mut self.source {
            *node = Some(info);
        }
        self
    }

    /// Sends commands over `conn` (a `MultiplexedConnection`, `ConnectionManager`, ...;
    /// for a cluster client, a redis-rs cluster connection) instead of opening a
    /// connection. The wake-up connection is still opened by redlease — from the
    /// `redis::Client`, the cluster's seed nodes or the sentinels — because pub/sub
    /// needs a connection of its own. With Sentinel, a connection given here does not
    /// follow a failover.
    pub fn connection(mut self, conn: impl CommandConnection) -> Self {
        self.conn = Some(Arc::new(conn));
        self
    }

    /// Key prefix for every lock (default `redlease:`; may be empty).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Human label stored beside each held lock, shown by status commands (default
    /// `host:pid`). Never put secrets in it.
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// How long a lock's metadata — its fencing high-water mark, owner and release
    /// record — outlives the lease (default 60 s). Fencing tokens stay monotonic across
    /// a clock step-back of Redis's host shorter than this.
    pub fn metadata_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Reply timeout of the command connection redlease opens (default 2 s; `None`
    /// waits forever). Ignored when [`connection`](Self::connection) is given.
    pub fn response_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// For how long a request that failed in a way that may be temporary — a reply
    /// timeout, a broken connection, a server still loading — is retried before the
    /// error is returned (default 3 s; zero: no retries). Safe for every operation: an
    /// acquire retried after a lost reply recognises the lock it already took.
    pub fn retry_window(mut self, window: Duration) -> Self {
        self.retry_window = window;
        self
    }

    /// Opens the command connection (unless one was given) and starts the background tasks.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the server cannot be reached or a setting is out of range.
    pub async fn build(self) -> Result<Client> {
        // rustls needs a process-wide crypto provider before any rediss:// connection.
        #[cfg(feature = "tls")]
        crate::tls::install_crypto_provider();
        if self.retention > keys::MAX_TTL {
            return Err(Error::Config {
                reason: "metadata retention may be at most 30 days".into(),
                source: None,
            });
        }
        // The reply timeout is known only for a connection redlease opens itself.
        let response_timeout = if self.conn.is_some() {
            None
        } else {
            self.response_timeout
        };
        let (conn, deployment, notifier, batching): (
            Arc<dyn CommandConnection>,
            Deployment,
            Notifier,
            Batching,
        ) = match self.source {
            Source::Standalone(redis) => {
                let conn: Arc<dyn CommandConnection> = match self.conn {
                    Some(conn) => conn,
                    None => {
                        let config = redis::aio::ConnectionManagerConfig::new()
                            .set_response_timeout(self.response_timeout)
                            .set_connection_timeout(Some(Duration::from_secs(2)))
                            .set_number_of_retries(1);
                        let manager = redis::aio::ConnectionManager::new_with_config(redis.clone(), config)
                            .await
                            .map_err(|e| Error::Config {
                                reason: format!(
                                    "cannot connect to redis at {}{}",
                                    redis.get_connection_info().addr(),
                                    tls_hint(&redis, &e)
                                ),
                                source: Some(e),
                            })?;
                        Arc::new(manager)
                    }
                };
                crate::scripts::preload(&*conn).await;
                let connector: PubSubConnector = Arc::new(move || {
                    let redis = redis.clone();
                    Box::pin(async move { redis.get_async_pubsub().await })
                });
                (
                    conn,
                    Deployment::Standalone,
                    Notifier::spawn(connector),
                    Batching::OnePipeline,
                )
            }
            Source::Cluster(nodes) => {
                let unreachable = |e| Error::Config {
                    reason: format!("cannot connect to the redis cluster at {}", addrs(&nodes)),
                    source: Some(e),
                };
                let (conn, batching): (Arc<dyn CommandConnection>, Batching) = match self.conn {
                    // A caller's connection routes by slot only: batch per slot.
                    Some(conn) => (conn, Batching::PerSlot),
                    None => {
                        let client =
                            crate::cluster::command_client(&nodes, self.response_timeout).map_err(|e| {
                                Error::Config {
                                    reason: "invalid redis cluster settings".into(),
                                    source: Some(e),
                                }
                            })?;
                        let cluster = client.get_async_connection().await.map_err(unreachable)?;
                        let batching = Batching::PerNode(crate::cluster::NodeBatcher::new(cluster.clone()));
                        (Arc::new(cluster), batching)
                    }
                };
                crate::cluster::preload(&*conn).await;
                let (wake, pushes) = crate::cluster::wake_connection(&nodes)
                    .await
                    .map_err(unreachable)?;
                (
                    conn,
                    Deployment::Cluster(wake.clone()),
                    Notifier::spawn_sharded(wake, pushes),
                    batching,
                )
            }
            Source::Sentinel {
                sentinels,
                master,
                node,
            } => {
                let via = addrs(&sentinels);
                let sentinel = SentinelConnection::new(sentinels, &master, node, self.response_timeout)
                    .map_err(|e| Error::Config {
                        reason: "invalid sentinel settings".into(),
                        source: Some(e),
                    })?;
                sentinel.connect().await.map_err(|e| Error::Config {
                    reason: format!("cannot reach master {master:?} through the sentinels at {via}"),
                    source: Some(e),
                })?;
                let conn: Arc<dyn CommandConnection> = match self.conn {
                    Some(conn) => conn,
                    None => Arc::new(sentinel.clone()),
                };
                crate::scripts::preload(&*conn).await;
                let connector: PubSubConnector = Arc::new(move || {
                    let sentinel = sentinel.clone();
                    Box::pin(async move { sentinel.pubsub().await })
                });
                (
                    conn,
                    Deployment::Sentinel,
                    Notifier::spawn(connector),
                    Batching::OnePipeline,
                )
            }
        };
        let topology = Topology {
            deployment,
            response_timeout,
        };
        let inner = ClientInner {
            notifier,
            locals: Default::default(),
            renewer: Renewer::spawn(conn.clone(), batching),
            conn,
            prefix: self.prefix,
            label: self.label.unwrap_or_else(default_label).into(),
            retention_arg: self.retention.as_millis().to_string().into(),
            publish: topology.publish_command().into(),
            subscribe_timeout: Duration::from_secs(1),
            retry_window: self.retry_window,
            topology,
        };
        Ok(Client {
            inner: Arc::new(inner),
        })
    }
}

/// `host:port, host:port, ...` of a list of connection infos, for messages.
fn addrs(infos: &[redis::ConnectionInfo]) -> String {
    infos
        .iter()
        .map(|i| i.addr().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `host:pid`, from the kernel's hostname when available.
fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host}:{}", std::process::id())
}

/// A hint for the classic mix-up of plain TCP and TLS, whose symptoms are a reset
/// connection (plain client, TLS server) or a handshake that never completes (TLS
/// client, plain server).
fn tls_hint(redis: &redis::Client, err: &redis::RedisError) -> &'static str {
    let tls = matches!(
        redis.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    );
    if tls && err.is_timeout() {
        "; if the server does not speak TLS, use a redis:// url"
    } else if !tls && err.is_connection_dropped() && !err.is_connection_refusal() {
        "; if the server requires TLS, use a rediss:// url"
    } else {
        ""
    }
}
