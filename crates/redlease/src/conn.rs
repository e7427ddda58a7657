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

fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs a script call (an EVALSHA built by [`LuaScript::evalsha`]), loading the
/// script once when the server does not know it.
pub(crate) async fn eval(conn: &dyn CommandConnection, script: &LuaScript, cmd: &Cmd) -> RedisResult<Value> {
    match conn.send(cmd).await {
        Err(e) if is_noscript(&e) => {
            tracing::debug!(
                script = script.name,
                "script not cached on the server; loading it"
            );
            conn.send(&script.load_cmd()).await?;
            conn.send(cmd).await
        }
        other => other,
    }
}

/// Runs many script calls in one round trip and returns one result per call, and how
/// many round trips it took (1, or more when the server answered NOSCRIPT: those calls
/// are sent once more after loading their scripts).
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
    let mut loaded: Vec<&str> = Vec::new();
    for &i in &missing {
        let script = calls[i].0;
        if !loaded.contains(&script.name) {
            *round_trips += 1;
            if let Err(e) = conn.send(&script.load_cmd()).await {
                for &j in &missing {
                    results[j] = Err(e.clone());
                }
                return results;
            }
            loaded.push(script.name);
        }
    }
    let mut retry = redis::pipe();
    retry.ignore_errors();
    for &i in &missing {
        retry.add_command(calls[i].1.clone());
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
