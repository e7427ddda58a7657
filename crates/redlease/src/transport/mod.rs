//! The transport layer: the connection redlease sends its commands over, and what
//! differs between deployments — how a batch of commands travels (one pipeline, or one
//! per cluster node with redirects followed), how many wait on a channel, Sentinel's
//! master tracking and TLS.
//!
//! Nothing here knows about locks or scripts: it moves [`Cmd`]s and [`Value`]s.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

mod batch;
pub(crate) mod cluster;
mod pipeline;
pub(crate) mod sentinel;
#[cfg(feature = "tls")]
pub(crate) mod tls;
mod topology;
pub(crate) mod value;

pub(crate) use batch::{Batching, send_batch};
pub(crate) use topology::{Deployment, Topology};

/// A connection redlease can send commands over, shared by all its tasks.
///
/// Implemented for every cheaply clonable redis-rs async connection —
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection),
/// [`ConnectionManager`](redis::aio::ConnectionManager) and the cluster connection —
/// so hundreds of tasks share one socket without mixing replies. For a connection
/// pool, implement it on a wrapper that checks a connection out per call.
///
/// redlease never sends blocking commands or `WATCH` over this connection, so it can
/// be shared with the rest of the application.
pub trait CommandConnection: Send + Sync + 'static {
    /// Sends one command and returns its reply (server errors as `Err`).
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value>;

    /// Sends a pipeline (built with `ignore_errors`) and returns one result per command.
    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>>;

    /// Sends a pipeline of the application's as redis-rs's
    /// [`ConnectionLike::req_packed_commands`] does: `count` replies after skipping
    /// `offset` (a transaction's `MULTI` and queued replies). Used by
    /// [`Client::connection`](crate::Client::connection); redlease itself never calls
    /// it. The default refuses: implement it on a connection of your own to pass
    /// pipelines through.
    fn send_packed_commands<'a>(
        &'a self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let _ = (pipe, offset, count);
        Box::pin(async {
            Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "this connection takes no pipelines from the application",
            )))
        })
    }

    /// The database the connection uses (`SELECT`), as redis-rs's
    /// [`ConnectionLike::get_db`] reports it (0 when unknown).
    fn db(&self) -> i64 {
        0
    }
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

    fn send_packed_commands<'a>(
        &'a self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut conn = self.clone();
        Box::pin(async move { conn.req_packed_commands(pipe, offset, count).await })
    }

    fn db(&self) -> i64 {
        self.get_db()
    }
}

/// The connection redlease opens itself: a [`ConnectionManager`], whose commands go
/// through its own `send_packed_command` — as its `ConnectionLike` implementation
/// does, but without boxing each command's future a second time.
///
/// [`ConnectionManager`]: redis::aio::ConnectionManager
#[derive(Clone)]
pub(crate) struct Managed(pub redis::aio::ConnectionManager);

impl CommandConnection for Managed {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut conn = self.0.clone();
        // What `Cmd::query_async` does with the reply.
        Box::pin(async move { conn.send_packed_command(cmd).await?.extract_error() })
    }

    // Pipelines as any redis-rs connection sends them (the reply handling of
    // `Pipeline::query_async` is its own).
    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>> {
        CommandConnection::send_pipeline(&self.0, pipe)
    }

    fn send_packed_commands<'a>(
        &'a self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        CommandConnection::send_packed_commands(&self.0, pipe, offset, count)
    }

    fn db(&self) -> i64 {
        CommandConnection::db(&self.0)
    }
}

impl std::fmt::Debug for dyn CommandConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommandConnection")
    }
}

/// The first key of a command: the one Redis Cluster routes it by. `EVAL` and
/// `EVALSHA` carry it after the script and the key count; other commands first.
pub(crate) fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        args.nth(2)
    } else {
        args.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_key_skips_script_and_key_count() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("0123")
            .arg(2)
            .arg("lock")
            .arg("{lock}:meta")
            .arg("token");
        assert_eq!(first_key(&eval), Some(&b"lock"[..]));
        let mut get = redis::cmd("GET");
        get.arg("k");
        assert_eq!(first_key(&get), Some(&b"k"[..]));
        assert_eq!(first_key(&redis::cmd("PING")), None);
    }
}
