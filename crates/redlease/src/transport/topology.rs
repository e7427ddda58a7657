//! What kind of deployment a client talks to, and the few things that differ with it:
//! how batches travel, how releases are published, and where "how many wait" is asked.

use std::time::Duration;

use redis::RedisResult;

use super::CommandConnection;

/// The deployment behind a client.
#[derive(Clone, Default)]
pub(crate) enum Deployment {
    /// One Redis server (or anything that looks like one, such as a proxy).
    #[default]
    Standalone,
    /// A master found through Sentinel; behaves like a standalone server between
    /// failovers.
    Sentinel,
    /// A Redis Cluster. The connection is the wake-up connection, which also routes
    /// `PUBSUB SHARDNUMSUB` to a slot's master.
    Cluster(redis::cluster_async::ClusterConnection),
}

/// The deployment, plus what the client knows about its command connection.
#[derive(Clone, Default)]
pub(crate) struct Topology {
    pub deployment: Deployment,
    /// Reply timeout of the command connection, when redlease opened it.
    pub response_timeout: Option<Duration>,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.deployment {
            Deployment::Standalone => "standalone",
            Deployment::Sentinel => "sentinel",
            Deployment::Cluster(_) => "cluster",
        };
        f.debug_struct("Topology")
            .field("deployment", &kind)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl Topology {
    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.deployment, Deployment::Cluster(_))
    }

    /// The command release scripts publish wake-ups with.
    pub fn publish_command(&self) -> &'static str {
        if self.is_cluster() { "SPUBLISH" } else { "PUBLISH" }
    }

    /// How many client connections are subscribed to `channel`: each waiting process
    /// counts once.
    pub async fn subscribers(&self, conn: &dyn CommandConnection, channel: &str) -> RedisResult<i64> {
        match &self.deployment {
            Deployment::Cluster(router) => super::cluster::shard_subscribers(router, channel).await,
            Deployment::Standalone | Deployment::Sentinel => {
                let mut cmd = redis::cmd("PUBSUB");
                cmd.arg("NUMSUB").arg(channel);
                let reply = conn.send(&cmd).await?;
                Ok(super::cluster::count_of(&reply, channel).unwrap_or(0))
            }
        }
    }
}

/// How many keys one `SCAN` call looks at.
const SCAN_COUNT: usize = 1000;

impl Topology {
    /// Every key matching the glob `pattern`, found with `SCAN` (never `KEYS`, which
    /// blocks the server while it walks the whole keyspace): on a cluster, on every
    /// master. A key that appears in several calls (SCAN may repeat one) is returned
    /// once; keys added or removed during the scan may or may not be returned.
    pub async fn scan(&self, conn: &dyn CommandConnection, pattern: &str) -> RedisResult<Vec<String>> {
        let mut keys = std::collections::BTreeSet::new();
        match &self.deployment {
            Deployment::Cluster(router) => {
                for slot in super::cluster::one_slot_per_master(router).await? {
                    let node = super::cluster::SlotNode::new(router.clone(), slot);
                    scan_node(&node, pattern, &mut keys).await?;
                }
            }
            Deployment::Standalone | Deployment::Sentinel => scan_node(conn, pattern, &mut keys).await?,
        }
        Ok(keys.into_iter().collect())
    }
}

/// Walks one server's keyspace with `SCAN ... MATCH pattern` until the cursor is 0.
async fn scan_node(
    conn: &dyn CommandConnection,
    pattern: &str,
    keys: &mut std::collections::BTreeSet<String>,
) -> RedisResult<()> {
    use super::value::{array, int, text};
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let reply = conn.send(&cmd).await?;
        let (next, batch) = match array(&reply) {
            Some([next, batch]) => (int(next), array(batch)),
            _ => (None, None),
        };
        let (Some(next), Some(batch)) = (next, batch) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "SCAN replied with something other than a cursor and keys",
            )));
        };
        keys.extend(batch.iter().filter_map(text).map(str::to_owned));
        if next == 0 {
            return Ok(());
        }
        cursor = next as u64;
    }
}
