//! A real Redis Cluster on loopback, owned by a test.
//!
//! `RedisCluster::start(masters, replicas_per_master)` starts one `redis-server` per node
//! with `--cluster-enabled yes`, its own `nodes.conf` in its temp dir and an explicit
//! cluster bus port (`port + 10000`, checked free like the client port), spreads the
//! 16384 slots evenly over the masters with `CLUSTER ADDSLOTSRANGE`, joins the nodes with
//! `CLUSTER MEET`, attaches replicas with `CLUSTER REPLICATE`, and waits until every
//! node reports `cluster_state:ok`. Doing this by hand instead of through
//! `redis-cli --cluster create` takes about a second and needs no extra binary.
//!
//! Nodes are plain [`RedisServer`]s: stop, restart or pause them for fault tests (a
//! restarted node keeps its identity through `nodes.conf`). [`RedisCluster::migrate_slot`]
//! reshards one slot the way `redis-cli --cluster reshard` does, and its three steps are
//! available separately so a test can act while a slot is half-migrated.

use std::time::{Duration, Instant};

use redis::Value;

use crate::KitError;
use crate::server::{RedisServer, free_port};

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// Node timeout of test clusters: long enough that a busy CI machine does not make a
/// node look failed, short enough for failure tests.
const NODE_TIMEOUT_MS: u32 = 5000;
/// How long the cluster may take to agree after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis Cluster of real `redis-server` processes on `127.0.0.1`; every node is killed
/// and reaped on drop, and each prints its log when the owning test panics.
#[derive(Debug)]
pub struct RedisCluster {
    masters: Vec<RedisServer>,
    master_ids: Vec<String>,
    /// Replicas, with the index of the master each replicates.
    replicas: Vec<(usize, RedisServer)>,
}

/// A slot migration in progress: see [`RedisCluster::begin_migration`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// The slot being moved.
    pub slot: u16,
    /// Index of the master it moves from.
    pub from: usize,
    /// Index of the master it moves to.
    pub to: usize,
}

impl RedisCluster {
    /// Starts `masters` masters (at least 1) with `replicas_per_master` replicas each and
    /// waits until the cluster is up.
    pub fn start(masters: usize, replicas_per_master: usize) -> Result<Self, KitError> {
        if masters == 0 {
            return Err(KitError::Setup("a cluster needs at least one master".into()));
        }
        let mut cluster = RedisCluster {
            masters: Vec::with_capacity(masters),
            master_ids: Vec::with_capacity(masters),
            replicas: Vec::new(),
        };
        for _ in 0..masters {
            cluster.masters.push(start_node()?);
        }
        for m in 0..masters {
            for _ in 0..replicas_per_master {
                cluster.replicas.push((m, start_node()?));
            }
        }
        for (i, node) in cluster.masters.iter().enumerate() {
            let first = (SLOTS as usize * i / masters) as u16;
            let last = (SLOTS as usize * (i + 1) / masters) as u16 - 1;
            let mut con = connect(node)?;
            query::<()>(
                &mut con,
                redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(first).arg(last),
            )?;
            cluster.master_ids.push(node_id(&mut con)?);
        }
        let first = cluster.masters[0].port();
        for node in cluster.nodes().skip(1) {
            let mut con = connect(node)?;
            query::<()>(
                &mut con,
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(first)
                    .arg(first as u32 + 10_000),
            )?;
        }
        for (m, replica) in &cluster.replicas {
            let id = &cluster.master_ids[*m];
            let mut con = connect(replica)?;
            // The replica must have heard of its master through gossip first.
            wait_for("the replica to learn its master", || {
                let nodes: String = query(&mut con, redis::cmd("CLUSTER").arg("NODES"))?;
                Ok(nodes.contains(id.as_str()))
            })?;
            query::<()>(&mut con, redis::cmd("CLUSTER").arg("REPLICATE").arg(id))?;
        }
        cluster.wait_until_ok()?;
        for (m, master) in cluster.masters.iter().enumerate() {
            let want = cluster.replicas.iter().filter(|(r, _)| *r == m).count();
            if want > 0 {
                wait_for_replicas(&mut connect(master)?, want)?;
            }
        }
        Ok(cluster)
    }

    /// URLs to connect with: every master's `redis://127.0.0.1:<port>`.
    pub fn urls(&self) -> Vec<String> {
        self.masters.iter().map(RedisServer::url).collect()
    }

    /// The masters, in slot order (master 0 owns the lowest slots at start).
    pub fn masters(&self) -> &[RedisServer] {
        &self.masters
    }

    /// Master `i`.
    pub fn master(&self, i: usize) -> &RedisServer {
        &self.masters[i]
    }

    /// Master `i`, to stop, restart or pause it.
    pub fn master_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.masters[i]
    }

    /// The cluster node id of master `i`.
    pub fn master_id(&self, i: usize) -> &str {
        &self.master_ids[i]
    }

    /// The replicas, each with the index of its master.
    pub fn replicas(&self) -> impl Iterator<Item = (usize, &RedisServer)> {
        self.replicas.iter().map(|(m, r)| (*m, r))
    }

    /// Replica `i` (in start order), to stop, restart or pause it.
    pub fn replica_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.replicas[i].1
    }

    /// Every node, masters first.
    pub fn nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.masters.iter().chain(self.replicas.iter().map(|(_, r)| r))
    }

    /// The hash slot of `key` (asked of a running node, so it is Redis's own answer).
    pub fn slot_of(&self, key: &str) -> Result<u16, KitError> {
        let node = self.running_master()?;
        query(&mut connect(node)?, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The index of the master that serves `slot`, as that master itself reports it.
    pub fn master_of_slot(&self, slot: u16) -> Result<usize, KitError> {
        for (i, node) in self.masters.iter().enumerate() {
            if !node.is_running() {
                continue;
            }
            let mut con = connect(node)?;
            if own_slots(&mut con)?.iter().any(|&(a, b)| (a..=b).contains(&slot)) {
                return Ok(i);
            }
        }
        Err(KitError::Setup(format!("no running master serves slot {slot}")))
    }

    /// The first of `make(0)`, `make(1)`, ... whose hash slot master `master` serves:
    /// a way to pick lock names that live on a given node.
    pub fn key_on_master(&self, master: usize, make: impl Fn(u32) -> String) -> Result<String, KitError> {
        for n in 0..10_000 {
            let key = make(n);
            if self.master_of_slot(self.slot_of(&key)?)? == master {
                return Ok(key);
            }
        }
        Err(KitError::Setup(format!("no key found for master {master}")))
    }

    /// Moves `slot` with all its keys to master `to`, the way `redis-cli --cluster
    /// reshard` does: [`begin_migration`](Self::begin_migration),
    /// [`migrate_keys`](Self::migrate_keys), [`finish_migration`](Self::finish_migration).
    pub fn migrate_slot(&self, slot: u16, to: usize) -> Result<Migration, KitError> {
        let migration = self.begin_migration(slot, to)?;
        self.migrate_keys(&migration)?;
        self.finish_migration(&migration)?;
        Ok(migration)
    }

    /// Marks `slot` IMPORTING on master `to` and MIGRATING on its current master. From
    /// now on the old owner answers `ASK` for keys of the slot it no longer has, and
    /// multi-key commands whose keys are split answer `TRYAGAIN`.
    pub fn begin_migration(&self, slot: u16, to: usize) -> Result<Migration, KitError> {
        let from = self.master_of_slot(slot)?;
        if from == to {
            return Err(KitError::Setup(format!(
                "slot {slot} already lives on master {to}"
            )));
        }
        let mut dst = connect(&self.masters[to])?;
        let mut src = connect(&self.masters[from])?;
        query::<()>(
            &mut dst,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&self.master_ids[from]),
        )?;
        query::<()>(
            &mut src,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&self.master_ids[to]),
        )?;
        Ok(Migration { slot, from, to })
    }

    /// Moves every key of the migrating slot to its new master with `MIGRATE` (TTLs are
    /// kept). Returns how many keys moved.
    pub fn migrate_keys(&self, migration: &Migration) -> Result<usize, KitError> {
        let mut src = connect(&self.masters[migration.from])?;
        let dst = &self.masters[migration.to];
        let mut moved = 0;
        loop {
            let keys: Vec<String> = query(
                &mut src,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(migration.slot)
                    .arg(100),
            )?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut cmd = redis::cmd("MIGRATE");
            cmd.arg("127.0.0.1")
                .arg(dst.port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys);
            query::<Value>(&mut src, &cmd)?;
            moved += keys.len();
        }
    }

    /// Assigns the slot to its new master on every master (the new owner first), ending
    /// the migration. The old owner then drops its sharded pub/sub subscribers of the
    /// slot's channels (they receive `sunsubscribe`).
    pub fn finish_migration(&self, migration: &Migration) -> Result<(), KitError> {
        let id = &self.master_ids[migration.to];
        let mut order = vec![migration.to, migration.from];
        order.extend((0..self.masters.len()).filter(|i| *i != migration.to && *i != migration.from));
        for i in order {
            if !self.masters[i].is_running() {
                continue;
            }
            let mut con = connect(&self.masters[i])?;
            query::<()>(
                &mut con,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(migration.slot)
                    .arg("NODE")
                    .arg(id),
            )?;
        }
        Ok(())
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_until_ok(&self) -> Result<(), KitError> {
        for node in self.nodes().filter(|n| n.is_running()) {
            let mut con = connect(node)?;
            wait_for("cluster_state:ok", || {
                let info: String = query(&mut con, redis::cmd("CLUSTER").arg("INFO"))?;
                Ok(info.contains("cluster_state:ok"))
            })?;
        }
        Ok(())
    }

    fn running_master(&self) -> Result<&RedisServer, KitError> {
        self.masters
            .iter()
            .find(|m| m.is_running())
            .ok_or_else(|| KitError::Setup("no master is running".into()))
    }
}

/// Starts one cluster-enabled node whose client and bus ports are both free.
fn start_node() -> Result<RedisServer, KitError> {
    let mut last = None;
    for _ in 0..50 {
        let port = free_port();
        let started = RedisServer::builder()
            .port(port)
            .arg("cluster-enabled", "yes")
            .arg("cluster-config-file", "nodes.conf")
            .arg("cluster-port", (port as u32 + 10_000).to_string())
            .arg("cluster-node-timeout", NODE_TIMEOUT_MS.to_string())
            // Start replicas' first sync at once instead of waiting 5 s for more of them.
            .arg("repl-diskless-sync-delay", "0")
            .start();
        match started {
            Ok(node) => return Ok(node),
            Err(e @ KitError::PortTaken(_)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(KitError::PortTaken(0)))
}

/// A synchronous connection with short timeouts, for setting up and inspecting nodes.
pub(crate) fn connect(node: &RedisServer) -> Result<redis::Connection, KitError> {
    let con = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(|e| KitError::Setup(format!("cannot connect to {}: {e}", node.addr())))?;
    con.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| KitError::Setup(format!("{e}")))?;
    Ok(con)
}

pub(crate) fn query<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    cmd: &redis::Cmd,
) -> Result<T, KitError> {
    cmd.query(con).map_err(|e| KitError::Setup(format!("{e}")))
}

/// Polls `check` every 20 ms until it is true, for at most [`SETTLE_TIMEOUT`].
pub(crate) fn wait_for(
    what: &str,
    mut check: impl FnMut() -> Result<bool, KitError>,
) -> Result<(), KitError> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) | Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(false) => return Err(KitError::Setup(format!("timed out waiting for {what}"))),
            Err(e) => return Err(e),
        }
    }
}

/// Waits until `n` replicas of the master behind `con` are in sync *and streaming*.
///
/// `INFO replication` says `state=online` as soon as a replica has its snapshot, but
/// after a diskless sync the master holds the command stream back until the replica's
/// first `REPLCONF ACK`, up to a second later. So: write something every replica must
/// receive (`FLUSHALL` of the fresh, empty server) and `WAIT` for all of them on the
/// same connection.
pub(crate) fn wait_for_replicas(con: &mut redis::Connection, n: usize) -> Result<(), KitError> {
    wait_for("replicas to sync", || {
        let info: String = query(con, redis::cmd("INFO").arg("replication"))?;
        Ok(info.matches(",state=online,").count() >= n)
    })?;
    wait_for("replicas to acknowledge writes", || {
        query::<()>(con, &redis::cmd("FLUSHALL"))?;
        let acked: usize = query(con, redis::cmd("WAIT").arg(n).arg(200))?;
        Ok(acked >= n)
    })
}

fn node_id(con: &mut redis::Connection) -> Result<String, KitError> {
    query(con, redis::cmd("CLUSTER").arg("MYID"))
}

/// The slot ranges a node serves, from its own line of `CLUSTER NODES`.
fn own_slots(con: &mut redis::Connection) -> Result<Vec<(u16, u16)>, KitError> {
    let nodes: String = query(con, redis::cmd("CLUSTER").arg("NODES"))?;
    let line = nodes
        .lines()
        .find(|l| l.split(' ').nth(2).is_some_and(|flags| flags.contains("myself")))
        .ok_or_else(|| KitError::Setup("CLUSTER NODES has no 'myself' line".into()))?;
    let mut ranges = Vec::new();
    for field in line.split(' ').skip(8) {
        // "[slot->-id]" / "[slot-<-id]" mark migrations in progress, not ownership.
        if field.starts_with('[') {
            continue;
        }
        let parse = |s: &str| {
            s.parse::<u16>()
                .map_err(|e| KitError::Setup(format!("slot {s:?}: {e}")))
        };
        match field.split_once('-') {
            Some((a, b)) => ranges.push((parse(a)?, parse(b)?)),
            None => {
                let s = parse(field)?;
                ranges.push((s, s));
            }
        }
    }
    Ok(ranges)
}
