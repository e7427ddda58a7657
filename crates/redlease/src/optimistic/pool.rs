//! The connections transactions run on: each used by one transaction at a time.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Result;
use crate::transport::CommandConnection;

/// Settings of a [`ConnectionPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolOptions {
    /// Most connections open at once (default 32; at least 1, at most
    /// [`tokio::sync::Semaphore::MAX_PERMITS`]); transactions beyond this wait for a
    /// connection to come back.
    pub max_connections: usize,
    /// Reply timeout of each connection (default 2 s; `None`: wait forever).
    pub response_timeout: Option<Duration>,
    /// How long opening a connection may take (default 2 s).
    pub connect_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            max_connections: 32,
            response_timeout: Some(Duration::from_secs(2)),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

impl PoolOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the most connections open at once (at least 1, at most
    /// [`tokio::sync::Semaphore::MAX_PERMITS`]: as good as unbounded).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.clamp(1, Semaphore::MAX_PERMITS);
        self
    }

    /// Sets the reply timeout of each connection.
    pub fn response_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets how long opening a connection may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

/// Connections for transactions, each used by one transaction at a time.
///
/// Opens connections from a `redis::Client` on demand, up to
/// [`max_connections`](PoolOptions::max_connections), and keeps a connection for the
/// next transaction only when its transaction left it clean (no `WATCH` pending, not
/// inside `MULTI`); a connection whose transaction failed on the network, or was
/// cancelled half-way, is closed instead. A kept connection that turns out dead is
/// replaced once, transparently.
///
/// Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct ConnectionPool {
    pub(super) inner: Arc<PoolInner>,
}

pub(super) struct PoolInner {
    client: redis::Client,
    config: redis::AsyncConnectionConfig,
    idle: std::sync::Mutex<Vec<MultiplexedConnection>>,
    pub(super) permits: Arc<Semaphore>,
    options: PoolOptions,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("server", &self.inner.client.get_connection_info().addr())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl ConnectionPool {
    /// A pool opening connections from `client` with the default options. Opens
    /// nothing until the first transaction.
    pub fn new(client: redis::Client) -> Self {
        Self::with_options(client, PoolOptions::default())
    }

    /// A pool with the given options.
    pub fn with_options(client: redis::Client, options: PoolOptions) -> Self {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(options.response_timeout)
            .set_connection_timeout(Some(options.connect_timeout));
        ConnectionPool {
            inner: Arc::new(PoolInner {
                client,
                config,
                idle: std::sync::Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(
                    options.max_connections.clamp(1, Semaphore::MAX_PERMITS),
                )),
                options,
            }),
        }
    }

    /// A pool for the Redis at `url`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`](crate::Error::Config) when the URL is invalid. Nothing is connected yet.
    pub fn open(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(|e| crate::error::invalid_url(url, e))?;
        Ok(Self::new(client))
    }

    /// The pool's options.
    pub fn options(&self) -> PoolOptions {
        self.inner.options
    }

    /// An idle connection, if one is kept.
    pub(super) fn pop_idle(&self) -> Option<MultiplexedConnection> {
        self.inner.idle.lock().expect("pool lock").pop()
    }

    /// How many connections are open and idle right now.
    pub fn idle(&self) -> usize {
        self.inner.idle.lock().expect("pool lock").len()
    }

    pub(super) async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        self.inner
            .client
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await
    }
}

/// A connection held by one transaction.
pub(super) struct Held {
    pub conn: Arc<dyn CommandConnection>,
    /// The pooled connection, returned to the pool on drop when `clean`.
    pub pooled: Option<(ConnectionPool, MultiplexedConnection, OwnedSemaphorePermit)>,
    /// Whether it came from the pool's idle list (and so may be dead).
    pub reused: bool,
    /// No `WATCH` pending and not inside `MULTI`: fit for the next transaction.
    pub clean: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((pool, conn, _permit)) = self.pooled.take()
            && self.clean
        {
            pool.inner.idle.lock().expect("pool lock").push(conn);
        }
    }
}
