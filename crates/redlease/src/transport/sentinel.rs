//! Sentinel: find the master by name, and find it again after a failover.
//!
//! redis-rs asks the sentinels for the master's address and checks that the server
//! there calls itself master, but its connections stay bound to that address. This
//! connection keeps one multiplexed connection to the current master and drops it when
//! a request shows the master is gone or demoted — the connection broke, timed out or
//! was refused, or a write was answered `READONLY` (the old master came back as a
//! replica; Sentinel also kills client connections when it reconfigures a server). The
//! next request asks the sentinels again. A `READONLY` answer is retried once at once
//! on the new master; other failures are left to the caller's retry loop, since while
//! the failover runs the sentinels still name the dead master.
//!
//! The wake-up connection is opened through the same sentinels, so after a failover it
//! reconnects to the new master, subscribes again and wakes every waiter.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::CommandConnection;

/// The sentinels and how to reach the master they name.
pub(crate) struct SentinelShared {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: std::sync::atomic::AtomicU64,
    config: AsyncConnectionConfig,
    master: String,
}

/// A [`CommandConnection`] to whichever server the sentinels name master.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    shared: Arc<SentinelShared>,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master", &self.shared.master)
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    /// Prepares connections to the master `master` monitored by `sentinels`; connects
    /// to nothing yet.
    pub fn new(
        sentinels: Vec<redis::ConnectionInfo>,
        master: &str,
        node: Option<SentinelNodeConnectionInfo>,
        response_timeout: Option<Duration>,
    ) -> RedisResult<Self> {
        let client = SentinelClient::build(sentinels, master, node, SentinelServerType::Master)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(response_timeout);
        Ok(SentinelConnection {
            shared: Arc::new(SentinelShared {
                sentinels: tokio::sync::Mutex::new(client),
                current: std::sync::Mutex::new(None),
                generation: std::sync::atomic::AtomicU64::new(0),
                config,
                master: master.to_owned(),
            }),
        })
    }

    /// Connects to the current master now (to fail fast at start-up).
    pub async fn connect(&self) -> RedisResult<()> {
        self.current().await.map(|_| ())
    }

    /// A redis-rs client for the current master, as the sentinels name it now.
    async fn discover(&self, sentinels: &mut SentinelClient) -> RedisResult<redis::Client> {
        sentinels.async_get_client().await.map_err(|e| {
            // Whatever went wrong (no sentinel reachable, the named master is down or not
            // yet replaced), asking again later may work: report it as a connection failure.
            RedisError::from((
                ErrorKind::Io,
                "the sentinels named no reachable master",
                format!("{} ({e})", self.shared.master),
            ))
        })
    }

    /// A redis-rs client for the master the sentinels name now (for the wake-up
    /// connection, which follows the master on its own).
    pub async fn master_client(&self) -> RedisResult<redis::Client> {
        let mut sentinels = self.shared.sentinels.lock().await;
        self.discover(&mut sentinels).await
    }

    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.shared.current.lock().expect("sentinel lock").clone() {
            return Ok(current);
        }
        // One task asks the sentinels and connects; the others wait for its answer.
        let mut sentinels = self.shared.sentinels.lock().await;
        if let Some(current) = self.shared.current.lock().expect("sentinel lock").clone() {
            return Ok(current);
        }
        let client = self.discover(&mut sentinels).await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        let generation = self
            .shared
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        tracing::debug!(
            master = %self.shared.master,
            addr = %client.get_connection_info().addr(),
            "connected to the master named by the sentinels"
        );
        *self.shared.current.lock().expect("sentinel lock") = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Forgets connection `generation` (if it is still the current one).
    fn forget(&self, generation: u64) {
        let mut current = self.shared.current.lock().expect("sentinel lock");
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            tracing::debug!(master = %self.shared.master, "master connection failed; asking the sentinels again");
            *current = None;
        }
    }
}

/// The master may have changed: the connection failed in a way a dead or demoted
/// master causes.
fn lost_master(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() || err.is_timeout()
}

fn is_readonly(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly) || err.code() == Some("READONLY")
}

impl CommandConnection for SentinelConnection {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut retried = false;
            loop {
                let (generation, mut conn) = self.current().await?;
                match cmd.query_async::<Value>(&mut conn).await {
                    Err(e) if is_readonly(&e) && !retried => {
                        self.forget(generation);
                        retried = true;
                    }
                    Err(e) => {
                        if lost_master(&e) || is_readonly(&e) {
                            self.forget(generation);
                        }
                        return Err(e);
                    }
                    ok => return ok,
                }
            }
        })
    }

    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>> {
        Box::pin(async move {
            let mut retried = false;
            loop {
                let (generation, mut conn) = self.current().await?;
                match pipe.query_async::<Vec<RedisResult<Value>>>(&mut conn).await {
                    Ok(results) => {
                        let demoted = results.iter().any(|r| matches!(r, Err(e) if is_readonly(e)));
                        if demoted {
                            self.forget(generation);
                            if !retried {
                                retried = true;
                                continue;
                            }
                        }
                        return Ok(results);
                    }
                    Err(e) => {
                        if lost_master(&e) {
                            self.forget(generation);
                        }
                        return Err(e);
                    }
                }
            }
        })
    }

    fn send_packed_commands<'a>(
        &'a self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let result =
                redis::aio::ConnectionLike::req_packed_commands(&mut conn, pipe, offset, count).await;
            if let Err(e) = &result {
                if lost_master(e) || is_readonly(e) {
                    self.forget(generation);
                }
            }
            result
        })
    }

    fn db(&self) -> i64 {
        use redis::aio::ConnectionLike;
        let current = self.shared.current.lock().expect("sentinel lock");
        current.as_ref().map_or(0, |(_, conn)| conn.get_db())
    }
}
