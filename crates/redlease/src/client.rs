//! The client: one connection for commands, one for wake-ups, one renewal task.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::CommandConnection;
use crate::error::{Error, Result};
use crate::fair::FairMutex;
use crate::keys;
use crate::legacy::{LegacyLock, LegacyOptions};
use crate::mutex::Mutex;
use crate::notify::{Notifier, PubSubConnector};
use crate::renewer::Renewer;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;

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
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            ttl: DEFAULT_TTL,
            auto_renew: true,
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
        #[cfg(feature = "tls")]
        crate::tls::install_crypto_provider();
        let redis = redis::Client::open(url).map_err(|e| Error::Config {
            reason: format!("invalid redis url {url:?}"),
            source: Some(e),
        })?;
        Client::builder(redis).build().await
    }

    /// Starts configuring a client for `redis`, which is also used to open the
    /// wake-up connection.
    pub fn builder(redis: redis::Client) -> ClientBuilder {
        ClientBuilder {
            redis,
            conn: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            label: None,
            retention: DEFAULT_RETENTION,
            response_timeout: Some(DEFAULT_RESPONSE_TIMEOUT),
            retry_window: DEFAULT_RETRY_WINDOW,
        }
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

/// Configures a [`Client`].
#[derive(Debug)]
#[must_use]
pub struct ClientBuilder {
    redis: redis::Client,
    conn: Option<Arc<dyn CommandConnection>>,
    prefix: String,
    label: Option<String>,
    retention: Duration,
    response_timeout: Option<Duration>,
    retry_window: Duration,
}

impl ClientBuilder {
    /// Sends commands over `conn` (a `MultiplexedConnection`, `ConnectionManager`, ...)
    /// instead of opening a connection. The wake-up connection is still opened from the
    /// `redis::Client`, because pub/sub needs a connection of its own.
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
        if self.retention > keys::MAX_TTL {
            return Err(Error::Config {
                reason: "metadata retention may be at most 30 days".into(),
                source: None,
            });
        }
        let conn: Arc<dyn CommandConnection> = match self.conn {
            Some(conn) => conn,
            None => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(self.response_timeout)
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(1);
                let manager = redis::aio::ConnectionManager::new_with_config(self.redis.clone(), config)
                    .await
                    .map_err(|e| Error::Config {
                        reason: format!(
                            "cannot connect to redis at {}{}",
                            self.redis.get_connection_info().addr(),
                            tls_hint(&self.redis, &e)
                        ),
                        source: Some(e),
                    })?;
                Arc::new(manager)
            }
        };
        crate::scripts::preload(&*conn).await;
        let redis = self.redis.clone();
        let connector: PubSubConnector = Arc::new(move || {
            let redis = redis.clone();
            Box::pin(async move { redis.get_async_pubsub().await })
        });
        let inner = ClientInner {
            notifier: Notifier::spawn(connector),
            renewer: Renewer::spawn(conn.clone()),
            conn,
            prefix: self.prefix,
            label: self.label.unwrap_or_else(default_label).into(),
            retention_arg: self.retention.as_millis().to_string().into(),
            publish: "PUBLISH".into(),
            subscribe_timeout: Duration::from_secs(1),
            retry_window: self.retry_window,
        };
        Ok(Client {
            inner: Arc::new(inner),
        })
    }
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
