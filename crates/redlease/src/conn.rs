//! The connection redlease sends its commands over, and script execution on it.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value};

use crate::scripts::LuaScript;

/// A connection redlease can send commands over, shared by all its tasks.
///
/// Implemented for every cheaply clonable redis-rs async connection —
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection),
/// [`ConnectionManager`](redis::aio::ConnectionManager) and, with the `cluster`
/// feature, the cluster connection — so hundreds of tasks share one socket without
/// mixing replies. For a connection pool, implement it on a wrapper that checks a
/// connection out per call.
///
/// redlease never sends blocking commands or `WATCH` over this connection, so it can
/// be shared with the rest of the application.
pub trait CommandConnection: Send + Sync + 'static {
    /// Sends one command and returns its reply (server errors as `Err`).
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value>;

    /// Sends a pipeline (built with `ignore_errors`) and returns one result per command.
    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>>;
}

impl<C> CommandConnection for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut conn = self.clone();
        Box::pin(async move { cmd.query_async(&mut conn).await })
    }

    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>> {
        let mut conn = self.clone();
        Box::pin(async move { pipe.query_async(&mut conn).await })
    }
}

pub(crate) fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs a script call (an EVALSHA built by [`LuaScript::evalsha`]); when the server
/// does not know the script, sends the same call once more as EVAL, which also caches it.
///
/// EVAL rather than `SCRIPT LOAD` + EVALSHA: one round trip instead of two, and it is
/// routed by its first key like the EVALSHA, so on a cluster it reaches the node that
/// owns the lock's slot (a `SCRIPT LOAD` fans out to every node and fails if any is down).
pub(crate) async fn eval(conn: &dyn CommandConnection, script: &LuaScript, cmd: &Cmd) -> RedisResult<Value> {
    match conn.send(cmd).await {
        Err(e) if is_noscript(&e) => {
            tracing::debug!(
                script = script.name,
                "script not cached on the server; sending it"
            );
            conn.send(&script.eval_from(cmd)).await
        }
        other => other,
    }
}

/// Runs many script calls in one round trip and returns one result per call, and how
/// many round trips it took: 1, or 2 when the server answered NOSCRIPT (those calls are
/// sent once more as EVAL, which also loads the script).
pub(crate) async fn eval_many(
    conn: &dyn CommandConnection,
    calls: &[(&'static LuaScript, Cmd)],
) -> (Vec<RedisResult<Value>>, u64) {
    let mut round_trips = 0;
    let results = eval_many_inner(conn, calls, &mut round_trips).await;
    (results, round_trips)
}

async fn eval_many_inner(
    conn: &dyn CommandConnection,
    calls: &[(&'static LuaScript, Cmd)],
    round_trips: &mut u64,
) -> Vec<RedisResult<Value>> {
    if calls.is_empty() {
        return Vec::new();
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for (_, cmd) in calls {
        pipe.add_command(cmd.clone());
    }
    *round_trips += 1;
    let mut results = match conn.send_pipeline(&pipe).await {
        Ok(results) if results.len() == calls.len() => results,
        Ok(results) => {
            let err = redis::RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "pipeline reply count mismatch",
                format!("{} replies for {} commands", results.len(), calls.len()),
            ));
            return vec![Err(err); calls.len()];
        }
        Err(e) => return vec![Err(e); calls.len()],
    };
    let missing: Vec<usize> = (0..calls.len())
        .filter(|&i| matches!(&results[i], Err(e) if is_noscript(e)))
        .collect();
    if missing.is_empty() {
        return results;
    }
    let mut retry = redis::pipe();
    retry.ignore_errors();
    for &i in &missing {
        retry.add_command(calls[i].0.eval_from(&calls[i].1));
    }
    *round_trips += 1;
    match conn.send_pipeline(&retry).await {
        Ok(again) if again.len() == missing.len() => {
            for (i, r) in missing.into_iter().zip(again) {
                results[i] = r;
            }
        }
        Ok(_) | Err(_) => {
            let err = redis::RedisError::from((ErrorKind::Io, "pipeline retry after NOSCRIPT failed"));
            for i in missing {
                results[i] = Err(err.clone());
            }
        }
    }
    results
}

/// How a batch of script calls travels.
#[derive(Clone, Debug, Default)]
pub(crate) enum Batching {
    /// One pipeline: one round trip (a single Redis or a Sentinel-managed master).
    #[default]
    OnePipeline,
    /// One pipeline per hash slot, all in flight at once: a cluster connection given by
    /// the caller, which redis-rs routes by slot and cannot be pinned to a node.
    PerSlot,
    /// One pipeline per master node: redlease's own cluster connection.
    PerNode(crate::cluster::NodeBatcher),
}

/// Runs many script calls, batched as `batching` says: one result per call, in order,
/// and the number of round trips made (pipelines to different nodes or slots count apart).
pub(crate) async fn eval_batch(
    conn: &dyn CommandConnection,
    calls: &[(&'static LuaScript, Cmd)],
    batching: &Batching,
) -> (Vec<RedisResult<Value>>, u64) {
    match batching {
        Batching::OnePipeline => return eval_many(conn, calls).await,
        Batching::PerNode(nodes) if calls.len() > 1 => return nodes.eval(calls).await,
        _ if calls.len() < 2 => return eval_many(conn, calls).await,
        _ => {}
    }
    // Group by the slot of each call's first key (EVALSHA sha numkeys KEY ...).
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    let mut index: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for (i, (_, cmd)) in calls.iter().enumerate() {
        let slot = match cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => crate::keys::key_slot(key),
            _ => 0,
        };
        let g = *index.entry(slot).or_insert_with(|| {
            groups.push((slot, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }
    if groups.len() == 1 {
        return eval_many(conn, calls).await;
    }
    let batches = groups.iter().map(|(_, members)| {
        let group: Vec<(&'static LuaScript, Cmd)> = members.iter().map(|&i| calls[i].clone()).collect();
        async move { eval_many(conn, &group).await }
    });
    let answers = futures_util::future::join_all(batches).await;
    let mut results: Vec<Option<RedisResult<Value>>> = (0..calls.len()).map(|_| None).collect();
    let mut round_trips = 0;
    for ((_, members), (answer, trips)) in groups.iter().zip(answers) {
        round_trips += trips;
        for (&i, result) in members.iter().zip(answer) {
            results[i] = Some(result);
        }
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("every call belongs to one group"))
        .collect();
    (results, round_trips)
}
