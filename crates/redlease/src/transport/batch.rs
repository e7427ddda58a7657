//! Batches: many commands in as few round trips as the deployment allows.
//!
//! On one server (or a Sentinel-managed master) a batch is one pipeline. On a Redis
//! Cluster, redis-rs refuses pipelines whose keys span slots, so a batch is split: per
//! master node when redlease opened the cluster connection itself (it then knows the
//! slot map), per slot when the caller gave a cluster connection of its own. Either
//! way the parts travel at once, and each command gets its own result, in order.

use redis::{Cmd, RedisResult, Value};

use super::CommandConnection;
use super::cluster::NodeBatcher;
use super::pipeline::{group_by, one_pipeline, scatter};
use crate::keys::key_slot;

/// How a batch of commands travels.
#[derive(Clone, Debug, Default)]
pub(crate) enum Batching {
    /// One pipeline: one round trip (a single Redis or a Sentinel-managed master).
    #[default]
    OnePipeline,
    /// One pipeline per hash slot, all in flight at once: a cluster connection given by
    /// the caller, which redis-rs routes by slot and cannot be pinned to a node.
    PerSlot,
    /// One pipeline per master node, following `MOVED` and `ASK` per command:
    /// redlease's own cluster connection.
    PerNode(NodeBatcher),
}

/// Sends `cmds` as `batching` says: one result per command, in order, and the number
/// of round trips made (pipelines to different nodes or slots count apart).
pub(crate) async fn send_batch(
    conn: &dyn CommandConnection,
    batching: &Batching,
    cmds: &[Cmd],
) -> (Vec<RedisResult<Value>>, u64) {
    match batching {
        _ if cmds.is_empty() => (Vec::new(), 0),
        Batching::PerNode(nodes) => nodes.send(cmds).await,
        Batching::PerSlot if cmds.len() > 1 => per_slot(conn, cmds).await,
        _ => (one_pipeline(conn, cmds).await, 1),
    }
}

/// Groups `cmds` by the slot of their first key and sends one pipeline per slot.
async fn per_slot(conn: &dyn CommandConnection, cmds: &[Cmd]) -> (Vec<RedisResult<Value>>, u64) {
    let groups = group_by(cmds, |cmd| super::first_key(cmd).map_or(0, key_slot));
    if groups.len() == 1 {
        return (one_pipeline(conn, cmds).await, 1);
    }
    let sends = groups.iter().map(|members| {
        let group: Vec<Cmd> = members.iter().map(|&i| cmds[i].clone()).collect();
        async move { one_pipeline(conn, &group).await }
    });
    let answers = futures_util::future::join_all(sends).await;
    (scatter(cmds.len(), &groups, answers), groups.len() as u64)
}
