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
//! - A pipeline must stay within one slot, so renewals are batched per slot.
//! - Wake-ups use sharded pub/sub (`SPUBLISH` / `SSUBSCRIBE`) on a second cluster
//!   connection speaking RESP3, whose push messages carry the notifications: a release
//!   reaches only the shard that owns the lock instead of every node of the cluster.
//! - `PUBSUB SHARDNUMSUB` (how many wait) is asked of the slot's master only.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionInfo, PushInfo, RedisResult, Value};
use tokio::sync::mpsc;

use crate::conn::CommandConnection;

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
