//! Running scripts: EVALSHA, and once more as EVAL when the server does not know the
//! script — alone, or many at once in a batch.

use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

use super::LuaScript;
use crate::transport::{Batching, CommandConnection, send_batch};

fn is_noscript(err: &redis::RedisError) -> bool {
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

/// Runs a script call followed by `then` in one pipeline — so on the same connection
/// and node, right after it — with the NOSCRIPT fallback of [`eval`]. Returns both
/// replies (server errors as `Err`).
pub(crate) async fn eval_then(
    conn: &dyn CommandConnection,
    script: &LuaScript,
    cmd: &Cmd,
    then: &Cmd,
) -> RedisResult<(RedisResult<Value>, RedisResult<Value>)> {
    let mut replies = pair(conn, cmd.clone(), then).await?;
    if matches!(&replies.0, Err(e) if is_noscript(e)) {
        replies = pair(conn, script.eval_from(cmd), then).await?;
    }
    Ok(replies)
}

async fn pair(
    conn: &dyn CommandConnection,
    first: Cmd,
    then: &Cmd,
) -> RedisResult<(RedisResult<Value>, RedisResult<Value>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(first).add_command(then.clone());
    let mut results = conn.send_pipeline(&pipe).await?.into_iter();
    match (results.next(), results.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(redis::RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "pipeline reply count mismatch",
        ))),
    }
}

/// Runs many script calls as one batch (see [`Batching`]) and returns one result per
/// call, and the round trips made. Calls the server answered NOSCRIPT are sent once
/// more as EVAL, in a second batch of their own.
pub(crate) async fn eval_batch(
    conn: &dyn CommandConnection,
    batching: &Batching,
    calls: &[(&'static LuaScript, Cmd)],
) -> (Vec<RedisResult<Value>>, u64) {
    let cmds: Vec<Cmd> = calls.iter().map(|(_, cmd)| cmd.clone()).collect();
    let (mut results, mut round_trips) = send_batch(conn, batching, &cmds).await;
    let missing: Vec<usize> = (0..calls.len())
        .filter(|&i| matches!(&results[i], Err(e) if is_noscript(e)))
        .collect();
    if missing.is_empty() {
        return (results, round_trips);
    }
    let evals: Vec<Cmd> = missing
        .iter()
        .map(|&i| calls[i].0.eval_from(&calls[i].1))
        .collect();
    let (again, trips) = send_batch(conn, batching, &evals).await;
    round_trips += trips;
    for (i, result) in missing.into_iter().zip(again) {
        results[i] = result;
    }
    (results, round_trips)
}

/// Loads every script into the server's cache, so that the first acquire is a single
/// EVALSHA: in one pipeline on a single server; on a cluster each `SCRIPT LOAD` fans
/// out to every node. Best effort: a failure here only means the first use of a script
/// pays one NOSCRIPT reload.
pub(crate) async fn preload(conn: &dyn CommandConnection, cluster: bool) {
    if cluster {
        let loads = super::all().into_iter().map(|script| async move {
            if let Err(e) = conn.send(&script.load_cmd()).await {
                tracing::debug!(script = script.name, error = %e, "could not preload a script on every node");
            }
        });
        futures_util::future::join_all(loads).await;
        return;
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for script in super::all() {
        pipe.add_command(script.load_cmd());
    }
    if let Err(e) = conn.send_pipeline(&pipe).await {
        tracing::debug!(error = %e, "could not preload scripts");
    }
}
