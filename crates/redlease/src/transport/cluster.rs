//! Redis Cluster: the connections a cluster client opens, and the commands that must
//! reach the node owning a lock's slot.
//!
//! Every key of a lock shares the slot of its main key (see `keys.rs`), so each script
//! runs on one node, and redis-rs routes it there by its first key, following `MOVED`
//! and `ASK` redirections and retrying `TRYAGAIN` while a slot migrates. What redis-rs
//! cannot know is handled here and in its callers:
//!
//! - A NOSCRIPT reload is an `EVAL` routed like the `EVALSHA` (see `script/`), not a
//!   `SCRIPT LOAD`, which fans out to every node and fails when one is down.
//! - redis-rs refuses pipelines that span slots, so batches (renewals) are grouped by
//!   node (from `CLUSTER SLOTS`) and each group is routed to its node explicitly: one
//!   round trip per master per renewal tick. Inside such a pipeline redis-rs does not
//!   follow a redirect of one command, so [`NodeBatcher`] does: the commands answered
//!   `ASK` (a slot being migrated) go to the importing node behind `ASKING`, those
//!   answered `MOVED` to the new owner, one pipeline per node again.
//! - Wake-ups use sharded pub/sub (`SPUBLISH` / `SSUBSCRIBE`) on a second cluster
//!   connection speaking RESP3, whose push messages carry the notifications: a release
//!   reaches only the shard that owns the lock instead of every node of the cluster.
//! - `PUBSUB SHARDNUMSUB` (how many wait) is asked of the slot's master only.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ConnectionInfo, RedisResult, Value};

use super::CommandConnection;
use super::pipeline::{group_by, one_pipeline, scatter};
use super::value::{array, int, opt_string};
use crate::keys::key_slot;

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
/// server-side unsubscriptions after a slot moved, disconnections) given to `pushes`.
/// redis-rs calls `pushes` from the cluster connection's own task, which receives the
/// push messages of every node connection in one queue and hands them on in that order
/// (on a disconnection, after asking for the node's reconnect). Also used to ask a
/// slot's master how many wait.
pub(crate) async fn wake_connection(
    nodes: &[ConnectionInfo],
    pushes: impl redis::aio::AsyncPushSender,
) -> RedisResult<ClusterConnection> {
    let client = builder(nodes, Some(Duration::from_secs(2)))
        .use_protocol(redis::ProtocolVersion::RESP3)
        .push_sender(pushes)
        .build()?;
    client.get_async_connection().await
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

/// The first slot of each master, from `CLUSTER SLOTS`: a route to every master, for
/// the commands that must run on each of them (`SCAN`).
pub(crate) async fn one_slot_per_master(router: &ClusterConnection) -> RedisResult<Vec<u16>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply = router
        .clone()
        .route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
        .await?;
    let mut first_slots: std::collections::BTreeMap<String, u16> = Default::default();
    for entry in array(&reply).unwrap_or_default() {
        let Some([start, _end, master, ..]) = array(entry) else {
            continue;
        };
        let (Some(start), Some([host, port, ..])) = (int(start), array(master)) else {
            continue;
        };
        let addr = format!(
            "{}:{}",
            opt_string(host).unwrap_or_default(),
            int(port).unwrap_or(0)
        );
        let slot = start as u16;
        first_slots
            .entry(addr)
            .and_modify(|s| *s = (*s).min(slot))
            .or_insert(slot);
    }
    Ok(first_slots.into_values().collect())
}

/// Sends commands to the master that serves one slot, whatever their keys.
pub(crate) struct SlotNode {
    conn: ClusterConnection,
    slot: u16,
}

impl SlotNode {
    pub fn new(conn: ClusterConnection, slot: u16) -> Self {
        SlotNode { conn, slot }
    }
}

impl CommandConnection for SlotNode {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
            self.slot,
            SlotAddr::Master,
        )));
        let mut conn = self.conn.clone();
        Box::pin(async move { conn.route_command(cmd.clone(), route).await })
    }

    fn send_pipeline<'a>(
        &'a self,
        pipe: &'a redis::Pipeline,
    ) -> redis::RedisFuture<'a, Vec<RedisResult<Value>>> {
        Box::pin(async move {
            let mut results = Vec::new();
            for cmd in pipe.cmd_iter() {
                results.push(self.send(cmd).await);
            }
            Ok(results)
        })
    }
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
            .and_then(|pair| int(&pair[1])),
        Value::Map(pairs) => pairs.iter().find(|(k, _)| matches(k)).and_then(|(_, v)| int(v)),
        _ => None,
    }
}

/// How many redirections of one command a batch follows before giving the error back
/// (the caller retries later): an `ASK` during a migration, a `MOVED` after it, and
/// one more for a slot that moved again meanwhile.
const MAX_REDIRECTS: usize = 3;

/// Batches on a cluster: one pipeline per master per batch, whatever the number of
/// slots its commands live in (redis-rs refuses pipelines that span slots, so each
/// group is routed to its node explicitly), with `ASK` and `MOVED` followed per
/// command. Which slots a node serves comes from a cached `CLUSTER SLOTS`, read again
/// after a `MOVED`; a stale map only costs the redirected commands one more round trip.
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
    /// A command was moved: read the map again before the next batch.
    stale: bool,
}

impl std::fmt::Debug for NodeBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeBatcher")
    }
}

/// Where a redirected command goes next.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Redirect {
    /// `host:port` of the node named by the redirection.
    addr: String,
    /// `ASK`: a one-time redirection during a migration, sent behind `ASKING`.
    ask: bool,
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
        for entry in array(&reply).unwrap_or_default() {
            let Some([start, end, master, ..]) = array(entry) else {
                continue;
            };
            let (Some(start), Some(end)) = (int(start), int(end)) else {
                continue;
            };
            let addr = match array(master) {
                Some([host, port, ..]) => format!(
                    "{}:{}",
                    opt_string(host).unwrap_or_default(),
                    int(port).unwrap_or(0)
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

    /// Sends `cmds` in one pipeline per node, following redirections of single
    /// commands; one result per command, and the round trips made.
    pub async fn send(&self, cmds: &[Cmd]) -> (Vec<RedisResult<Value>>, u64) {
        if cmds.len() == 1 {
            // The routed connection follows redirections of a single command itself.
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot_of(&cmds[0]),
                SlotAddr::Master,
            )));
            let reply = self.conn.clone().route_command(cmds[0].clone(), route).await;
            return (vec![reply], 1);
        }
        let needs_refresh = {
            let map = self.slots.lock().expect("slot map lock");
            map.ranges.is_empty() || map.stale
        };
        if needs_refresh && let Err(e) = self.refresh().await {
            tracing::debug!(error = %e, "CLUSTER SLOTS failed; batching per slot");
        }
        // Group by node; the first slot seen for a node routes its pipeline.
        let slots: Vec<u16> = cmds.iter().map(slot_of).collect();
        let groups = {
            let map = self.slots.lock().expect("slot map lock");
            group_by(&slots, |&slot| {
                Self::node_of(&map.ranges, slot)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("slot {slot}"))
            })
        };
        let sends = groups.iter().map(|members| {
            let route = NodeRoute {
                conn: self.conn.clone(),
                route: SingleNodeRoutingInfo::SpecificNode(Route::new(slots[members[0]], SlotAddr::Master)),
            };
            let group: Vec<Cmd> = members.iter().map(|&i| cmds[i].clone()).collect();
            async move { one_pipeline(&route, &group).await }
        });
        let answers = futures_util::future::join_all(sends).await;
        let mut results = scatter(cmds.len(), &groups, answers);
        let mut round_trips = groups.len() as u64;
        for _ in 0..MAX_REDIRECTS {
            let trips = self.follow_redirects(cmds, &mut results).await;
            if trips == 0 {
                break;
            }
            round_trips += trips;
        }
        (results, round_trips)
    }

    /// Sends again every command whose result is a redirection, one pipeline per
    /// target node (behind `ASKING` for `ASK`), and replaces those results. Returns the
    /// round trips made (0: nothing was redirected).
    async fn follow_redirects(&self, cmds: &[Cmd], results: &mut [RedisResult<Value>]) -> u64 {
        let redirected: Vec<(usize, Redirect)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let e = r.as_ref().err()?;
                let (addr, _) = e.redirect_node()?;
                let ask = matches!(e.kind(), redis::ErrorKind::Server(redis::ServerErrorKind::Ask));
                Some((
                    i,
                    Redirect {
                        addr: addr.to_owned(),
                        ask,
                    },
                ))
            })
            .collect();
        if redirected.is_empty() {
            return 0;
        }
        if redirected.iter().any(|(_, r)| !r.ask) {
            self.slots.lock().expect("slot map lock").stale = true;
        }
        let groups = group_by(&redirected, |(_, r)| r.clone());
        tracing::debug!(
            commands = redirected.len(),
            nodes = groups.len(),
            "following cluster redirections"
        );
        let sends = groups.iter().map(|members| {
            let target = redirected[members[0]].1.clone();
            let group: Vec<Cmd> = members.iter().map(|&m| cmds[redirected[m].0].clone()).collect();
            async move { self.send_to(&target, &group).await }
        });
        let answers = futures_util::future::join_all(sends).await;
        for (members, answer) in groups.iter().zip(answers) {
            for (&m, result) in members.iter().zip(answer) {
                results[redirected[m].0] = result;
            }
        }
        groups.len() as u64
    }

    /// Sends `cmds` to the node at `target` in one pipeline, each behind `ASKING` for
    /// an `ASK` redirection. When that node cannot be addressed directly (no connection
    /// to it yet), sends each command through the routed connection instead, which
    /// follows the redirection itself.
    async fn send_to(&self, target: &Redirect, cmds: &[Cmd]) -> Vec<RedisResult<Value>> {
        let route = target
            .addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
            .map(|(host, port)| NodeRoute {
                conn: self.conn.clone(),
                route: SingleNodeRoutingInfo::ByAddress { host, port },
            });
        if let Some(route) = route {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for cmd in cmds {
                if target.ask {
                    pipe.cmd("ASKING");
                }
                pipe.add_command(cmd.clone());
            }
            let per_cmd = if target.ask { 2 } else { 1 };
            match route.send_pipeline(&pipe).await {
                Ok(replies) if replies.len() == cmds.len() * per_cmd => {
                    return replies.into_iter().skip(per_cmd - 1).step_by(per_cmd).collect();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, node = %target.addr, "redirected pipeline failed; sending one by one")
                }
            }
        }
        let sends = cmds.iter().map(|cmd| {
            let mut conn = self.conn.clone();
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                slot_of(cmd),
                SlotAddr::Master,
            )));
            async move { conn.route_command(cmd.clone(), route).await }
        });
        futures_util::future::join_all(sends).await
    }
}

fn slot_of(cmd: &Cmd) -> u16 {
    super::first_key(cmd).map_or(0, key_slot)
}

/// The cluster connection pinned to one node: everything sent through it goes to that
/// node, whatever its keys (each script still touches one slot only).
struct NodeRoute {
    conn: ClusterConnection,
    route: SingleNodeRoutingInfo,
}

impl CommandConnection for NodeRoute {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        let mut conn = self.conn.clone();
        let route = RoutingInfo::SingleNode(self.route.clone());
        Box::pin(async move { conn.route_command(cmd.clone(), route).await })
    }

    fn send_pipeline<'a>(
        &'a self,
        pipe: &'a redis::Pipeline,
    ) -> redis::RedisFuture<'a, Vec<RedisResult<Value>>> {
        let mut conn = self.conn.clone();
        let route = self.route.clone();
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
