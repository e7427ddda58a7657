//! Redis Cluster: the connections a cluster client opens, and the commands that must
//! reach the node owning a lock's slot.
//!
//! Every key of a lock shares the slot of its main key (see `keys.rs`), so each script
//! runs on one node, and redis-rs routes it there by its first key, following `MOVED`
//! and `ASK` redirections and retrying `TRYAGAIN` while a slot migrates. What redis-rs
//! cannot know is handled here and in its callers:
//!
//! - A NOSCRIPT reload is an `EVAL` routed like the `EVALSHA` (see `conn.rs`), not a
//!   `SCRIPT LOAD`, which fans out to every node and fails when one is down.
//! - redis-rs refuses pipelines that span slots, so renewals are grouped by node (from
//!   `CLUSTER SLOTS`) and each group is routed to its node explicitly: one round trip
//!   per master per renewal tick.
//! - Wake-ups use sharded pub/sub (`SPUBLISH` / `SSUBSCRIBE`) on a second cluster
//!   connection speaking RESP3, whose push messages carry the notifications: a release
//!   reaches only the shard that owns the lock instead of every node of the cluster.
//! - `PUBSUB SHARDNUMSUB` (how many wait) is asked of the slot's master only.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ConnectionInfo, PushInfo, RedisResult, Value};
use tokio::sync::mpsc;

use crate::conn::CommandConnection;
use crate::scripts::LuaScript;

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often redis-rs retries a request after a redirection, `TRYAGAIN` or a broken
/// node connection, before giving the error back (redlease then retries within its
/// retry window).
const RETRIES: u32 = 6;

fn builder(nodes: &[ConnectionInfo], response_timeout: Option<Duration>) -> ClusterClientBuilder {
    let mut builder = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(CONNECT_TIMEOUT)
        .retries(RETRIES)
        // redis-rs waits at least 1.28 s before retrying TRYAGAIN by default; a
        // migrating lock should not stall its users that long.
        .min_retry_wait(10)
        .max_retry_wait(500)
        .retry_wait_formula(10, 2);
    if let Some(timeout) = response_timeout {
        builder = builder.response_timeout(timeout);
    }
    builder
}

/// The client for redlease's own command connection.
pub(crate) fn command_client(
    nodes: &[ConnectionInfo],
    response_timeout: Option<Duration>,
) -> RedisResult<ClusterClient> {
    builder(nodes, response_timeout).build()
}

/// Opens the wake-up connection: RESP3, with every push message (sharded messages,
/// server-side unsubscriptions after a slot moved, disconnections) sent to the
/// returned receiver. Also used to ask a slot's master how many wait.
pub(crate) async fn wake_connection(
    nodes: &[ConnectionInfo],
) -> RedisResult<(ClusterConnection, mpsc::UnboundedReceiver<PushInfo>)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let client = builder(nodes, Some(Duration::from_secs(2)))
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(tx)
        .build()?;
    Ok((client.get_async_connection().await?, rx))
}

/// `PUBSUB SHARDNUMSUB channel`, asked of the master that owns the channel's slot:
/// how many connections wait there.
pub(crate) async fn shard_subscribers(router: &ClusterConnection, channel: &str) -> RedisResult<i64> {
    let mut cmd = redis::cmd("PUBSUB");
    cmd.arg("SHARDNUMSUB").arg(channel);
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        channel,
        SlotAddr::Master,
    )));
    let reply = router.clone().route_command(cmd, route).await?;
    Ok(count_of(&reply, channel).unwrap_or(0))
}

/// The count for `channel` in a `PUBSUB (SHARD)NUMSUB` reply (a flat array in RESP2,
/// a map in RESP3).
pub(crate) fn count_of(reply: &Value, channel: &str) -> Option<i64> {
    let matches = |v: &Value| match v {
        Value::BulkString(b) => b.as_slice() == channel.as_bytes(),
        Value::SimpleString(s) => s == channel,
        _ => false,
    };
    match reply {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && matches(&pair[0]))
            .and_then(|pair| crate::scripts::int(&pair[1])),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| matches(k))
            .and_then(|(_, v)| crate::scripts::int(v)),
        _ => None,
    }
}

/// Loads every script on every node (each `SCRIPT LOAD` fans out), so the first use of
/// a script on any node is one EVALSHA. Best effort.
pub(crate) async fn preload(conn: &dyn CommandConnection) {
    let loads = crate::scripts::all().into_iter().map(|script| async move {
        if let Err(e) = conn.send(&script.load_cmd()).await {
            tracing::debug!(script = script.name, error = %e, "could not preload a script on every node");
        }
    });
    futures_util::future::join_all(loads).await;
}

/// Renewal batches on a cluster: one pipeline per master per tick, whatever the number
/// of slots its leases live in (redis-rs refuses pipelines that span slots, so each
/// batch is routed to its node explicitly). Which slots a node serves comes from a
/// cached `CLUSTER SLOTS`, refreshed after a redirection; a stale map only costs the
/// redirected renewals one retry.
#[derive(Clone)]
pub(crate) struct NodeBatcher {
    conn: ClusterConnection,
    slots: std::sync::Arc<std::sync::Mutex<SlotMap>>,
}

/// Which master serves which slots, as last read from `CLUSTER SLOTS`.
#[derive(Debug, Default)]
struct SlotMap {
    /// `(first slot, last slot, node address)`, sorted; empty until first needed.
    ranges: Vec<(u16, u16, String)>,
    /// A renewal was redirected: read the map again before the next batch.
    stale: bool,
}

impl std::fmt::Debug for NodeBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeBatcher")
    }
}

impl NodeBatcher {
    pub fn new(conn: ClusterConnection) -> Self {
        NodeBatcher {
            conn,
            slots: Default::default(),
        }
    }

    async fn refresh(&self) -> RedisResult<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = self
            .conn
            .clone()
            .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
            .await?;
        let mut ranges = Vec::new();
        for entry in crate::scripts::array(&reply).unwrap_or_default() {
            let Some([start, end, master, ..]) = crate::scripts::array(entry) else {
                continue;
            };
            let (Some(start), Some(end)) = (crate::scripts::int(start), crate::scripts::int(end)) else {
                continue;
            };
            let addr = match crate::scripts::array(master) {
                Some([host, port, ..]) => format!(
                    "{}:{}",
                    crate::scripts::opt_string(host).unwrap_or_default(),
                    crate::scripts::int(port).unwrap_or(0)
                ),
                _ => continue,
            };
            ranges.push((start as u16, end as u16, addr));
        }
        ranges.sort();
        *self.slots.lock().expect("slot map lock") = SlotMap { ranges, stale: false };
        Ok(())
    }

    fn node_of(ranges: &[(u16, u16, String)], slot: u16) -> Option<&str> {
        let i = ranges.partition_point(|(start, _, _)| *start <= slot);
        let (start, end, addr) = ranges.get(i.checked_sub(1)?)?;
        (*start <= slot && slot <= *end).then_some(addr.as_str())
    }

    /// Runs `calls` in one pipeline per node; one result per call, and the round trips.
    pub async fn eval(&self, calls: &[(&'static LuaScript, Cmd)]) -> (Vec<RedisResult<Value>>, u64) {
        let needs_refresh = {
            let map = self.slots.lock().expect("slot map lock");
            map.ranges.is_empty() || map.stale
        };
        if needs_refresh && let Err(e) = self.refresh().await {
            tracing::debug!(error = %e, "CLUSTER SLOTS failed; batching renewals per slot");
        }
        // Group by node; the first slot seen for a node routes its pipeline.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        {
            let map = self.slots.lock().expect("slot map lock");
            let mut by_node: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
            for (i, (_, cmd)) in calls.iter().enumerate() {
                let slot = match cmd.args_iter().nth(3) {
                    Some(redis::Arg::Simple(key)) => crate::keys::key_slot(key),
                    _ => 0,
                };
                let node = Self::node_of(&map.ranges, slot)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("slot {slot}"));
                let g = *by_node.entry(node).or_insert_with(|| {
                    groups.push((slot, Vec::new()));
                    groups.len() - 1
                });
                groups[g].1.push(i);
            }
        }
        let batches = groups.iter().map(|(slot, members)| {
            let route = NodeRoute {
                conn: self.conn.clone(),
                slot: *slot,
            };
            let group: Vec<(&'static LuaScript, Cmd)> = members.iter().map(|&i| calls[i].clone()).collect();
            async move { crate::conn::eval_many(&route, &group).await }
        });
        let answers = futures_util::future::join_all(batches).await;
        let mut results: Vec<Option<RedisResult<Value>>> = (0..calls.len()).map(|_| None).collect();
        let mut round_trips = 0;
        let mut redirected = false;
        for ((_, members), (answer, trips)) in groups.iter().zip(answers) {
            round_trips += trips;
            for (&i, result) in members.iter().zip(answer) {
                redirected |= matches!(&result, Err(e) if e.redirect_node().is_some()
                    || e.code() == Some("MOVED") || e.code() == Some("ASK"));
                results[i] = Some(result);
            }
        }
        if redirected {
            self.slots.lock().expect("slot map lock").stale = true;
        }
        let results = results
            .into_iter()
            .map(|r| r.expect("every call belongs to one group"))
            .collect();
        (results, round_trips)
    }
}

/// The cluster connection pinned to the master of one slot: everything sent through it
/// goes to that node, whatever its keys (each script still touches one slot only).
struct NodeRoute {
    conn: ClusterConnection,
    slot: u16,
}

impl NodeRoute {
    fn route(&self) -> SingleNodeRoutingInfo {
        SingleNodeRoutingInfo::SpecificNode(Route::new(self.slot, SlotAddr::Master))
    }
}

impl CommandConnection for NodeRoute {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        let mut conn = self.conn.clone();
        let route = RoutingInfo::SingleNode(self.route());
        Box::pin(async move { conn.route_command(cmd.clone(), route).await })
    }

    fn send_pipeline<'a>(
        &'a self,
        pipe: &'a redis::Pipeline,
    ) -> redis::RedisFuture<'a, Vec<RedisResult<Value>>> {
        let mut conn = self.conn.clone();
        let route = self.route();
        Box::pin(async move {
            let values = conn.route_pipeline(pipe.clone(), 0, pipe.len(), route).await?;
            Ok(values
                .into_iter()
                .map(|v| match v {
                    Value::ServerError(e) => Err(e.into()),
                    v => Ok(v),
                })
                .collect())
        })
    }
}
