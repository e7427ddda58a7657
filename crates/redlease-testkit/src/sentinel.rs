//! A Sentinel-managed Redis on loopback: one master, its replicas and (by default)
//! three sentinels (`redis-server sentinel.conf --sentinel`), with failure detection
//! and failover timeouts short enough that a failover completes in a few seconds.
//!
//! `start()` returns once every sentinel knows the master, the replicas and the other
//! sentinels, so killing the master right away leads to a failover. Replicas can be
//! made to replicate through an address of the test's choosing (a
//! [`Proxy`](crate::Proxy) in front of the master), so a test can hold the replication
//! stream back and produce writes that a failover loses.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::KitError;
use crate::cluster::{query, wait_for};
use crate::server::RedisServer;

/// Builder for a [`RedisSentinel`] set-up.
#[derive(Clone, Debug)]
pub struct SentinelBuilder {
    replicas: usize,
    sentinels: usize,
    master_name: String,
    down_after: Duration,
    failover_timeout: Duration,
    master_port: Option<u16>,
    replicate_from: Option<SocketAddr>,
}

impl Default for SentinelBuilder {
    fn default() -> Self {
        SentinelBuilder {
            replicas: 1,
            sentinels: 3,
            master_name: "redlease-master".into(),
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
            master_port: None,
            replicate_from: None,
        }
    }
}

impl SentinelBuilder {
    /// Number of replicas (default 1).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n;
        self
    }

    /// Number of sentinels (default 3; the quorum is a majority of them).
    pub fn sentinels(mut self, n: usize) -> Self {
        self.sentinels = n.max(1);
        self
    }

    /// The name the sentinels monitor the master under (default `redlease-master`).
    pub fn master_name(mut self, name: impl Into<String>) -> Self {
        self.master_name = name.into();
        self
    }

    /// `down-after-milliseconds` (default 1 s): how long the master must be silent
    /// before a sentinel considers it down.
    pub fn down_after(mut self, d: Duration) -> Self {
        self.down_after = d;
        self
    }

    /// `failover-timeout` (default 3 s).
    pub fn failover_timeout(mut self, d: Duration) -> Self {
        self.failover_timeout = d;
        self
    }

    /// Starts the master on this port (so a test can put a proxy in front of it first).
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    /// Replicas replicate from `addr` instead of the master's own address — typically
    /// a [`Proxy`](crate::Proxy) whose upstream is the master.
    pub fn replicate_from(mut self, addr: SocketAddr) -> Self {
        self.replicate_from = Some(addr);
        self
    }

    /// Starts everything and waits until the sentinels see the whole set-up.
    pub fn start(self) -> Result<RedisSentinel, KitError> {
        // Start replicas' first sync at once instead of waiting 5 s for more of them.
        let mut builder = RedisServer::builder().arg("repl-diskless-sync-delay", "0");
        if let Some(port) = self.master_port {
            builder = builder.port(port);
        }
        let master = builder.start()?;
        let source = self.replicate_from.unwrap_or_else(|| master.addr());
        let mut replicas = Vec::with_capacity(self.replicas);
        for _ in 0..self.replicas {
            replicas.push(
                RedisServer::builder()
                    .arg("replicaof", format!("{} {}", source.ip(), source.port()))
                    .arg("repl-diskless-sync-delay", "0")
                    .start()?,
            );
        }
        let mut con = crate::cluster::connect(&master)?;
        crate::cluster::wait_for_replicas(&mut con, self.replicas)?;
        let quorum = self.sentinels / 2 + 1;
        let config = format!(
            "sentinel monitor {name} 127.0.0.1 {port} {quorum}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {failover}\n\
             sentinel parallel-syncs {name} 1\n",
            name = self.master_name,
            port = master.port(),
            down = self.down_after.as_millis(),
            failover = self.failover_timeout.as_millis(),
        );
        let mut sentinels = Vec::with_capacity(self.sentinels);
        for _ in 0..self.sentinels {
            sentinels.push(start_sentinel(&config)?);
        }
        let set = RedisSentinel {
            master,
            replicas,
            sentinels,
            name: self.master_name,
        };
        set.wait_until_monitored()?;
        Ok(set)
    }
}

/// A master, its replicas and the sentinels watching them; all killed and reaped on
/// drop, each printing its log when the owning test panics.
#[derive(Debug)]
pub struct RedisSentinel {
    master: RedisServer,
    replicas: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    name: String,
}

impl RedisSentinel {
    /// One master, one replica, three sentinels.
    pub fn start() -> Result<Self, KitError> {
        Self::builder().start()
    }

    /// A builder for other shapes and timeouts.
    pub fn builder() -> SentinelBuilder {
        SentinelBuilder::default()
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `redis://127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The server that was master at start (after a failover it may be dead or a replica).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The first master, to kill or pause it.
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The replicas, in start order.
    pub fn replicas(&self) -> &[RedisServer] {
        &self.replicas
    }

    /// Replica `i`, to stop or pause it.
    pub fn replica_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.replicas[i]
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Every data server that is running (master and replicas, whatever their role now).
    pub fn data_servers(&self) -> impl Iterator<Item = &RedisServer> {
        std::iter::once(&self.master)
            .chain(self.replicas.iter())
            .filter(|s| s.is_running())
    }

    /// The master address a majority of the running sentinels report.
    pub fn current_master(&self) -> Result<SocketAddr, KitError> {
        let mut votes: Vec<(SocketAddr, usize)> = Vec::new();
        let running: Vec<&RedisServer> = self.sentinels.iter().filter(|s| s.is_running()).collect();
        for sentinel in &running {
            let Ok(mut con) = crate::cluster::connect(sentinel) else {
                continue;
            };
            let reply: Option<(String, u16)> = query(
                &mut con,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.name),
            )
            .unwrap_or(None);
            if let Some((host, port)) = reply
                && let Ok(ip) = host.parse()
            {
                let addr = SocketAddr::new(ip, port);
                match votes.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, n)) => *n += 1,
                    None => votes.push((addr, 1)),
                }
            }
        }
        votes
            .into_iter()
            .find(|(_, n)| *n > running.len() / 2)
            .map(|(addr, _)| addr)
            .ok_or_else(|| KitError::Setup("the sentinels do not agree on a master".into()))
    }

    /// Waits until a majority of sentinels name a master other than `old` that also
    /// calls itself master, and returns its address.
    pub fn wait_for_failover(&self, old: SocketAddr, timeout: Duration) -> Result<SocketAddr, KitError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(addr) = self.current_master()
                && addr != old
                && let Some(server) = self.data_servers().find(|s| s.addr() == addr)
                && let Ok(mut con) = crate::cluster::connect(server)
                && let Ok(info) = query::<String>(&mut con, redis::cmd("INFO").arg("replication"))
                && info.contains("role:master")
            {
                return Ok(addr);
            }
            if Instant::now() > deadline {
                return Err(KitError::Setup(format!(
                    "no failover away from {old} within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every sentinel knows the replicas and the other sentinels: before
    /// that, a failover could not reach a quorum or find a replica to promote.
    fn wait_until_monitored(&self) -> Result<(), KitError> {
        let others = self.sentinels.len() - 1;
        for sentinel in &self.sentinels {
            let mut con = crate::cluster::connect(sentinel)?;
            wait_for("the sentinels to discover each other and the replicas", || {
                let peers: Vec<redis::Value> =
                    query(&mut con, redis::cmd("SENTINEL").arg("SENTINELS").arg(&self.name))?;
                let replicas: Vec<redis::Value> =
                    query(&mut con, redis::cmd("SENTINEL").arg("REPLICAS").arg(&self.name))?;
                Ok(peers.len() >= others && replicas.len() >= self.replicas.len())
            })?;
        }
        Ok(())
    }
}

fn start_sentinel(config: &str) -> Result<RedisServer, KitError> {
    RedisServer::builder().sentinel(config).start()
}
