//! The client: one connection for commands, one for wake-ups, one renewal task.

use std::sync::Arc;
use std::time::Duration;

use crate::election::Election;
use crate::engine::context::{Context, Settings};
use crate::engine::notify::{Notifier, ServerLookup};
use crate::error::{Error, Result};
use crate::fair::FairMutex;
use crate::keys;
use crate::legacy::{LegacyLock, LegacyOptions};
use crate::multi::MultiLock;
use crate::mutex::Mutex;
use crate::options::{
    DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT, DEFAULT_RETENTION, DEFAULT_RETRY_WINDOW, LeaseOptions,
};
use crate::redlock::Redlock;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::transport::sentinel::SentinelConnection;
use crate::transport::{Batching, CommandConnection, Deployment, Topology};

/// The entry point: hands out locks that share one command connection, one wake-up
/// connection and one renewal task.
///
/// Cheap to clone. Background tasks stop when the client and every lock and guard made
/// from it are dropped.
///
/// # Names
///
/// Every lock, semaphore and election lives at key `<prefix><name>`. A name is 1 to
/// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) (1024) bytes of UTF-8 without control
/// characters (ASCII below 0x20, DEL, or Unicode's). Redis Cluster keeps a lock's
/// auxiliary keys in its key's hash slot by wrapping the key in `{…}`, so a key with a
/// `}` must have a complete, non-empty hash tag (a `{`, then text, then `}`):
/// `{user42}.lock` and `a{b` (no `}`) are fine, `a}b` and `a{}b` are refused. Any other byte — spaces, `:`, `/`,
/// non-ASCII letters — is allowed, except a key that is the fencing counter of the
/// prefix, `{<prefix>fence}` (or its `:floor`). A lock's auxiliary keys are
/// `{<key>}:<suffix>` — `<key>:<suffix>` when the key has a hash tag — with suffixes
/// `alive`, `fence`, `floor`, `history`, `legacy`, `limit`, `meta`, `q`, `queue`,
/// `readers`, `term`, `waiters` and `writers`. With an empty prefix, a hash-tagged
/// prefix or hash-tagged names, do not also name a lock like another lock's auxiliary
/// key (`{orders}:q` beside `orders` under an empty prefix, `{t}orders:meta` beside
/// `{t}orders`): the two would share a key, and use it for different things — a
/// release can then fail with a wrong-type error and leave the lock to run out its
/// lease, and an election can overwrite the other's leader (which its leader is told:
/// it loses the leadership). A
/// refused name is [`Error::InvalidName`], whose message shows the name escaped and cut
/// after 64 characters.
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
    pub(crate) ctx: Arc<Context>,
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
        let redis = redis::Client::open(url).map_err(|e| crate::error::invalid_url(url, e))?;
        Client::builder(redis).build().await
    }

    /// Connects to a Redis Cluster through the given nodes (any subset of its
    /// nodes; the rest are discovered), with the default settings.
    ///
    /// Commands go to the node owning each lock's slot; wake-ups use sharded pub/sub.
    /// See [`cluster_builder`](Client::cluster_builder).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when a URL is invalid or none of the nodes can be reached.
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

    /// Starts configuring a client for a Redis Cluster reached through `nodes` (the
    /// URLs of any of its nodes, such as `redis://host:port`; user name and password from the first).
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
    /// [`ReplicaAck`](crate::ReplicaAck) policy narrows that window; fencing tokens make it harmless.
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

    /// Starts configuring a client for `redis` (a [`redis::Client`], re-exported as
    /// `redlease::redis::Client`), which is also used to open the wake-up connection:
    /// the same server, address, credentials and TLS settings, speaking RESP3 (whose
    /// push messages wake a waiter without a task in between), or RESP2 pub/sub when
    /// the server refuses RESP3.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redlease::redis::Client::open("redis://127.0.0.1:6379")?;
    /// let client = redlease::Client::builder(redis).prefix("billing:").build().await?;
    /// # let _ = client;
    /// # Ok(()) }
    /// ```
    pub fn builder(redis: redis::Client) -> ClientBuilder {
        ClientBuilder::new(Source::Standalone(redis))
    }

    /// A plain mutex at key `<prefix><name>` with default options (30 s lease, auto-renew).
    ///
    /// # Names
    ///
    /// The lock lives at key `<prefix><name>`. A name is 1 to
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) (1024) bytes of UTF-8 without control
    /// characters (ASCII below 0x20, DEL, or Unicode's). Redis Cluster keeps a lock's
    /// auxiliary keys in its key's hash slot by wrapping the key in `{…}`, so a key with
    /// a `}` must have a complete, non-empty hash tag: `{user42}.lock` and `a{b` are
    /// fine, `a}b` and `a{}b` are refused. Any other byte — spaces, `:`, `/`,
    /// non-ASCII letters — is allowed, except the fencing counter's key: see
    /// [`Client`]'s names.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks these rules; its message shows the
    /// name escaped and shortened.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A plain mutex with the given lease options. Names follow the [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<Mutex> {
        Mutex::new(self.ctx.clone(), name, options)
    }

    /// A lock over several names at once, taken all or none, with default options
    /// (30 s lease, auto-renew). Each name is exactly the plain [`mutex`](Client::mutex)
    /// of that name, with its own fencing token; see [`MultiLock`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name as for [`mutex`](Client::mutex);
    /// [`Error::InvalidArgument`] for an empty list or a name given twice.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(client: redlease::Client) -> Result<(), redlease::Error> {
    /// let guard = client.multi_lock(["inventory", "orders"])?.lock().await?;
    /// println!("fencing tokens {:?}", guard.fences());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<I>(&self, names: I) -> Result<MultiLock>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.multi_lock_with(names, LeaseOptions::default())
    }

    /// A lock over several names with the given lease options (one lease for all of
    /// them).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidTtl`] or [`Error::InvalidArgument`] (an
    /// empty list, a name given twice, or a [`ReplicaAck`](crate::ReplicaAck) policy,
    /// which a lock over several names does not support).
    pub fn multi_lock_with<I>(&self, names: I, options: LeaseOptions) -> Result<MultiLock>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        MultiLock::new(self.ctx.clone(), names, options)
    }

    /// A lock in the old `SETNX <unix time + timeout + 1>` format at key
    /// `<prefix><name>`, shared with unmodified old clients. An interop mode with
    /// weaker guarantees than [`mutex`](Client::mutex); see [`LegacyLock`]. Names follow
    /// the [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidTtl`] (with seconds, the timeout must be
    /// a whole number of seconds) or [`Error::InvalidArgument`] (a zero poll interval).
    pub fn legacy_lock(&self, name: &str, options: LegacyOptions) -> Result<LegacyLock> {
        LegacyLock::new(self.ctx.clone(), name, options)
    }

    /// A fair (FIFO) mutex at key `<prefix><name>` with default options (30 s lease,
    /// auto-renew, 5 s waiter TTL). See [`FairMutex`] for how it shares the key with
    /// the plain mutex.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the [name rules](Client#names).
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        self.fair_mutex_with(name, LeaseOptions::default())
    }

    /// A fair mutex with the given lease options. Names follow the
    /// [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn fair_mutex_with(&self, name: &str, options: LeaseOptions) -> Result<FairMutex> {
        FairMutex::new(self.ctx.clone(), name, options)
    }

    /// A writer-preferring read-write lock with default options (30 s leases,
    /// auto-renew, 5 s waiter TTL).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the [name rules](Client#names).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        self.rwlock_with(name, LeaseOptions::default())
    }

    /// A read-write lock with the given lease options (for readers and writers). Names follow the
    /// [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn rwlock_with(&self, name: &str, options: LeaseOptions) -> Result<RwLock> {
        RwLock::new(self.ctx.clone(), name, options)
    }

    /// A semaphore of `limit` permits with default options (30 s leases, auto-renew).
    /// Every user of the name must give the same limit while permits are held.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the [name rules](Client#names); [`Error::InvalidArgument`] when `limit` is 0 or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        self.semaphore_with(name, limit, LeaseOptions::default())
    }

    /// A semaphore of `limit` permits with the given lease options. Names follow the
    /// [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidTtl`] or [`Error::InvalidArgument`].
    pub fn semaphore_with(&self, name: &str, limit: u32, options: LeaseOptions) -> Result<Semaphore> {
        Semaphore::new(self.ctx.clone(), name, limit, options)
    }

    /// A leader election with default options (30 s lease, auto-renew): the leader is a
    /// hash at key `<prefix><name>`. See [`Election`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the [name rules](Client#names).
    pub fn election(&self, name: &str) -> Result<Election> {
        self.election_with(name, LeaseOptions::default())
    }

    /// A leader election whose leaderships have the given lease options. Names follow the
    /// [name rules](Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`].
    pub fn election_with(&self, name: &str, options: LeaseOptions) -> Result<Election> {
        Election::new(self.ctx.clone(), name, options)
    }

    /// The connection this client sends its commands over, for the application's own
    /// commands: a cheap handle that implements redis-rs's
    /// [`ConnectionLike`](redis::aio::ConnectionLike), so [`redis::cmd`]`(..).query_async`,
    /// [`redis::AsyncCommands`], pipelines and `MULTI`/`EXEC` pipelines
    /// ([`redis::Pipeline::atomic`]) work on it. It is the connection redlease opened —
    /// or the one given to [`ClientBuilder::connection`] — so it reconnects, follows a
    /// Sentinel failover or routes by cluster slot as that one does.
    ///
    /// The connection is shared with every lock of the client: send no blocking
    /// commands (`BLPOP`, `XREAD BLOCK`, `WAIT`), no `WATCH`, `SUBSCRIBE`, `SELECT` or
    /// `CLIENT REPLY` over it — a renewal queued behind a blocked command may come too
    /// late. Use [`optimistic`](crate::optimistic) or a connection of your own for those.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use redlease::redis::AsyncCommands;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
    /// let guard = client.mutex("invoice-run")?.lock().await?;
    /// let mut conn = client.connection();
    /// let last: Option<u64> = conn.get("invoices:last").await?;
    /// let _: () = conn.set("invoices:last", last.unwrap_or(0) + 1).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn connection(&self) -> SharedConnection {
        SharedConnection {
            conn: self.ctx.conn.clone(),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.ctx.prefix
    }

    /// The owner label stored beside every lock this client holds.
    pub fn owner_label(&self) -> &str {
        &self.ctx.label
    }

    /// Counters of this client's background renewal work.
    pub fn stats(&self) -> ClientStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = self.ctx.renewer.counters();
        ClientStats {
            renewal_ticks: c.ticks.load(Relaxed),
            renewal_round_trips: c.round_trips.load(Relaxed),
            leases_renewed: c.renewed.load(Relaxed),
            leases_lost_by_renewal: c.lost.load(Relaxed),
        }
    }
}

/// The command connection of a [`Client`], for the application's own commands (see
/// [`Client::connection`]). Cheap to clone.
#[derive(Clone)]
pub struct SharedConnection {
    conn: Arc<dyn CommandConnection>,
}

impl std::fmt::Debug for SharedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedConnection")
    }
}

impl redis::aio::ConnectionLike for SharedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        self.conn.send(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.conn.send_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.db()
    }
}

/// Counters of one client's background renewal work (see [`Client::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Renewal ticks run: each renews every lease due at that moment in one batch.
    pub renewal_ticks: u64,
    /// Round trips those ticks made: one per tick (per node on a cluster), one more per
    /// node for each [`MultiLock`] renewed in the tick, plus the reloads after a server
    /// forgot its scripts.
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
    /// `redis::Client`, the cluster nodes given or the sentinels — because pub/sub
    /// needs a connection of its own. With Sentinel, a connection given here does not
    /// follow a failover.
    pub fn connection(mut self, conn: impl CommandConnection) -> Self {
        self.conn = Some(Arc::new(conn));
        self
    }

    /// Key prefix for every lock (default `redlease:`; may be empty). Like a name, at
    /// most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes without control characters:
    /// [`build`](Self::build) refuses another with [`Error::Config`]. (Under a prefix
    /// with a `}` but no hash tag, only names with a hash tag of their own are valid.)
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Human label stored beside each held lock, shown by status commands (default
    /// `host:pid`). Control characters and invisible marks become `?`, and it is cut
    /// to 128 bytes. Never put secrets in it.
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// How long the metadata of a fair mutex, a read-write lock or an election — owner,
    /// fencing token, since when — outlives the lease (default 60 s); an election's
    /// terms stay monotonic across a clock step-back of Redis's host shorter than this.
    /// (The plain mutex keeps no metadata: its fencing tokens come from a counter with a
    /// floor that lives a day; see [`FencingToken`](crate::FencingToken).)
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
    /// timeout, a broken connection, a server still loading or failing over, a server
    /// busy with another client's long script (`BUSY`) — is retried before the
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
        crate::transport::tls::install_crypto_provider();
        keys::check_prefix(&self.prefix)?;
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
                            .map_err(|e| {
                                let addr = redis.get_connection_info().addr().to_string();
                                let reason =
                                    format!("cannot connect to redis at {addr}{}", tls_hint(&redis, &e));
                                cannot_connect(addr, reason, e)
                            })?;
                        Arc::new(crate::transport::Managed(manager))
                    }
                };
                crate::script::preload(&*conn, false).await;
                let connector: ServerLookup = Arc::new(move || {
                    let redis = redis.clone();
                    Box::pin(async move { Ok(redis) })
                });
                (
                    conn,
                    Deployment::Standalone,
                    Notifier::spawn(connector),
                    Batching::OnePipeline,
                )
            }
            Source::Cluster(nodes) => {
                let unreachable = |e| {
                    let addr = addrs(&nodes);
                    let reason = format!("cannot connect to the redis cluster at {addr}");
                    cannot_connect(addr, reason, e)
                };
                let (conn, batching): (Arc<dyn CommandConnection>, Batching) = match self.conn {
                    // A caller's connection routes by slot only: batch per slot.
                    Some(conn) => (conn, Batching::PerSlot),
                    None => {
                        let client = crate::transport::cluster::command_client(&nodes, self.response_timeout)
                            .map_err(|e| Error::Config {
                                reason: "invalid redis cluster settings".into(),
                                source: Some(e),
                            })?;
                        let cluster = client.get_async_connection().await.map_err(unreachable)?;
                        let batching =
                            Batching::PerNode(crate::transport::cluster::NodeBatcher::new(cluster.clone()));
                        (Arc::new(cluster), batching)
                    }
                };
                crate::script::preload(&*conn, true).await;
                let (notifier, wake) = Notifier::spawn_sharded(&nodes).await.map_err(unreachable)?;
                (conn, Deployment::Cluster(wake.clone()), notifier, batching)
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
                sentinel.connect().await.map_err(|e| {
                    let reason = format!("cannot reach master {master:?} through the sentinels at {via}");
                    cannot_connect(via.clone(), reason, e)
                })?;
                let conn: Arc<dyn CommandConnection> = match self.conn {
                    Some(conn) => conn,
                    None => Arc::new(sentinel.clone()),
                };
                crate::script::preload(&*conn, false).await;
                let connector: ServerLookup = Arc::new(move || {
                    let sentinel = sentinel.clone();
                    Box::pin(async move { sentinel.master_client().await })
                });
                (
                    conn,
                    Deployment::Sentinel,
                    Notifier::spawn(connector),
                    Batching::OnePipeline,
                )
            }
        };
        check_server(&*conn, &self.prefix).await?;
        let topology = Topology {
            deployment,
            response_timeout,
        };
        let ctx = Context::new(Settings {
            conn,
            batching,
            notifier,
            prefix: self.prefix,
            label: crate::token::clean_label(&self.label.unwrap_or_else(default_label)),
            retention: self.retention,
            retry_window: self.retry_window,
            topology,
        });
        Ok(Client { ctx })
    }
}

/// The Redis version below which no lock works: every lease renews with
/// `PEXPIRE … GT`.
const OLDEST_SUPPORTED: &str = "7.0";

/// Refuses a server too old for redlease, naming its version: asks it to run
/// `PEXPIRE <key> 1 GT` — which never shortens a TTL, whatever the key holds — and an
/// older server refuses the `GT`. Any other failure (a user without the permission, a
/// timeout) is left to the operations that follow: this check must not make a working
/// set-up fail.
async fn check_server(conn: &dyn CommandConnection, prefix: &str) -> Result<()> {
    let mut probe = redis::cmd("PEXPIRE");
    probe
        .arg(format!("{prefix}redlease-server-check"))
        .arg(1)
        .arg("GT");
    let Err(e) = conn.send(&probe).await else {
        return Ok(());
    };
    let Some((needs, feature)) = crate::error::too_old_for(&e.to_string()) else {
        tracing::debug!(error = %e, "could not check the server's version");
        return Ok(());
    };
    debug_assert_eq!(needs, OLDEST_SUPPORTED);
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let version = match conn.send(&info).await {
        Ok(redis::Value::BulkString(text)) => redis_version(&String::from_utf8_lossy(&text)),
        Ok(redis::Value::VerbatimString { text, .. }) => redis_version(&text),
        _ => None,
    };
    Err(Error::UnsupportedServer {
        version,
        needs,
        feature,
    })
}

/// `redis_version` from an `INFO server` reply.
fn redis_version(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
}

/// The error of a connection that failed: [`Error::Certificate`] when a certificate was
/// refused (the server is up; its certificate or ours is wrong), else [`Error::Config`].
fn cannot_connect(addr: String, reason: String, source: redis::RedisError) -> Error {
    #[cfg(feature = "tls")]
    if let Some(problem) = crate::transport::tls::certificate_problem(&source) {
        return Error::Certificate {
            addr,
            problem,
            source,
        };
    }
    let _ = addr;
    Error::Config {
        reason,
        source: Some(source),
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

/// Building a Redlock from clients, one per master (the public face makes the
/// clients; the Redlock itself only needs what they share with their locks).
impl Redlock {
    /// A Redlock over the masters behind `clients`, one client per master.
    ///
    /// Every client must have been built for a different, independent master (this
    /// cannot be checked) with the same key prefix (this is). An odd number of at
    /// least three masters is the sensible choice; one master degenerates to a plain
    /// lock without fencing, two need both.
    ///
    /// `Client::connect` fails for a master that is down; use
    /// [`connect`](Redlock::connect) to start while a minority is down.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty list, the same client given twice, or differing
    /// key prefixes.
    pub fn new(clients: Vec<Client>) -> Result<Redlock> {
        Redlock::from_contexts(clients.into_iter().map(|c| c.ctx).collect())
    }

    /// Connects to one master per `redis::Client` with the default client settings,
    /// tolerating masters that are down: their connections are made when they come
    /// back. Build the `redis::Client`s with [`TlsOptions::redis_client`](crate::TlsOptions::redis_client)
    /// for TLS.
    ///
    /// Returns once every master was tried once: at once for masters that answer or
    /// refuse the connection, after up to twice the 2 s connect timeout for one that
    /// does not answer at all.
    ///
    /// # Errors
    ///
    /// As [`new`](Redlock::new).
    pub async fn connect(masters: Vec<redis::Client>) -> Result<Redlock> {
        Self::connect_with(masters, |builder| builder).await
    }

    /// As [`connect`](Redlock::connect), with each master's [`ClientBuilder`] passed
    /// through `configure` first (to set the prefix, owner label, ...). The command
    /// connection is always redlease's own, so
    /// [`connection`](ClientBuilder::connection) and
    /// [`response_timeout`](ClientBuilder::response_timeout) are ignored; every request
    /// to a master is bounded by the [node timeout](Redlock::node_timeout) instead.
    ///
    /// # Errors
    ///
    /// As [`new`](Redlock::new) — also for the same address and database given twice
    /// (two names of one server are not caught) — and the errors of
    /// [`ClientBuilder::build`].
    pub async fn connect_with(
        masters: Vec<redis::Client>,
        configure: impl Fn(ClientBuilder) -> ClientBuilder,
    ) -> Result<Redlock> {
        // The same address and database twice would make one server count twice.
        let places: Vec<String> = masters
            .iter()
            .map(|m| {
                let info = m.get_connection_info();
                format!("{}/{}", info.addr(), info.redis_settings().db())
            })
            .collect();
        for (i, place) in places.iter().enumerate() {
            if places[..i].contains(place) {
                return Err(Error::Config {
                    reason: format!(
                        "redis master {place} was given twice; a Redlock needs independent masters, one per server"
                    ),
                    source: None,
                });
            }
        }
        let builds = masters.into_iter().map(|redis| {
            // A lazy connection: a master that is down now does not fail the Redlock.
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(DEFAULT_RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_number_of_retries(1);
            let manager = redis::aio::ConnectionManager::new_lazy_with_config(redis.clone(), config);
            let builder = configure(Client::builder(redis.clone()));
            async move {
                let manager = manager.map_err(|e| Error::Config {
                    reason: format!(
                        "cannot set up the connection to redis master {}",
                        redis.get_connection_info().addr()
                    ),
                    source: Some(e),
                })?;
                builder
                    .connection(crate::transport::Managed(manager))
                    .build()
                    .await
            }
        });
        let clients = futures_util::future::join_all(builds)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        Redlock::new(clients)
    }
}
