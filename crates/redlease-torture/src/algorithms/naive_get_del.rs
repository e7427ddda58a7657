//! `naive-get-del`: the "fixed" version (unique value, `GET` then `DEL`) that is still broken.
//!
//! `SET key <random> NX PX ttl` through a client that retries a request whose reply
//! timed out, taking a nil reply to the retry as "not acquired" — although the first
//! `SET` may have landed (a lost reply under retry: the caller thinks it failed while the lock is its
//! own). Release reads the key and deletes it if it still holds our value, in two
//! commands without a script: between them the lease can run out and the next holder's
//! lock be deleted. No renewal, no fencing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, NaiveHeld, ReleaseOutcome, classify,
    naive_connection, poll_delay,
};

pub struct NaiveGetDel;

impl Algorithm for NaiveGetDel {
    fn name(&self) -> &'static str {
        "naive-get-del"
    }

    fn describe(&self) -> &'static str {
        "SET NX PX with a random value, retried on timeout (a retried nil = failure); release by GET then DEL; no token"
    }

    fn fenced(&self) -> bool {
        false
    }

    fn must_be_safe(&self) -> bool {
        false
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            Ok(Arc::new(Client {
                conn: naive_connection(env).await?,
                keys: env.names.iter().map(|n| format!("naive:{n}")).collect(),
                ttl_ms: env.ttl.as_millis() as u64,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct Client {
    conn: ConnectionManager,
    keys: Vec<String>,
    ttl_ms: u64,
    timeout: Duration,
}

/// `SET key value NX PX ttl`, resent once when the reply times out (the client library's
/// internal retry). A nil reply — to the first try or the retry — means "not acquired".
async fn set_with_retry(
    conn: &mut ConnectionManager,
    key: &str,
    value: &str,
    ttl_ms: u64,
) -> redis::RedisResult<bool> {
    let set = || {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
        cmd
    };
    match set().query_async::<Option<String>>(conn).await {
        Ok(reply) => Ok(reply.is_some()),
        Err(e) if e.is_timeout() => Ok(set().query_async::<Option<String>>(conn).await?.is_some()),
        Err(e) => Err(e),
    }
}

impl LockClient for Client {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let value = format!(
                "{:016x}{:016x}",
                getrandom::u64().unwrap_or(1),
                getrandom::u64().unwrap_or(2)
            );
            let deadline = Instant::now() + self.timeout;
            loop {
                if set_with_retry(&mut conn, &self.keys[lock], &value, self.ttl_ms)
                    .await
                    .map_err(|e| classify(&e))?
                {
                    return Ok(Held::naive(Lock {
                        conn,
                        key: self.keys[lock].clone(),
                        value,
                    }));
                }
                if Instant::now() >= deadline {
                    return Err(AcquireError::Timeout);
                }
                tokio::time::sleep(poll_delay()).await;
            }
        })
    }
}

struct Lock {
    conn: ConnectionManager,
    key: String,
    value: String,
}

impl NaiveHeld for Lock {
    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move {
            let mut conn = self.conn;
            match conn.get::<_, Option<String>>(&self.key).await {
                // The race: the key may expire, and another client take it, right here.
                Ok(Some(v)) if v == self.value => match conn.del::<_, i64>(&self.key).await {
                    Ok(_) => ReleaseOutcome::Released,
                    Err(_) => ReleaseOutcome::Failed,
                },
                Ok(_) => ReleaseOutcome::NotHeld,
                Err(_) => ReleaseOutcome::Failed,
            }
        })
    }
}
