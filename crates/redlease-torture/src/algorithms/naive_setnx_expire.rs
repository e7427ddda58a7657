//! `naive-setnx-expire`: `SETNX` then `EXPIRE`, as found in countless code bases.
//!
//! ```text
//! if setnx(key, 1) == 1 { expire(key, 30); do something; del(key) }
//! ```
//!
//! Broken three ways, all reproduced here: `SETNX` and `EXPIRE` are two commands, so
//! an error between them (a cut connection, a lost reply) leaves a lock that never
//! expires; `DEL` deletes whoever holds the lock by then; and there is no renewal and
//! no fencing, so a holder that stalls past the TTL writes next to the next holder.
//!
//! The value is unique per acquisition (the textbook version stores `1`) only so that the harness can
//! recognise a lock that stays immortal and break it, as an operator would; the
//! algorithm itself never reads it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, NaiveHeld, ReleaseOutcome, classify,
    naive_connection, poll_delay,
};

/// A lock without TTL that keeps its value this long is broken by the harness: longer
/// than any stall the faults inject, so only a truly immortal lock is touched.
const STUCK_AFTER: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct NaiveSetnxExpire {
    /// Immortal-looking locks seen by `repair`, by key: the value and when it was
    /// first seen.
    suspect: std::sync::Mutex<HashMap<String, (String, Instant)>>,
}

fn key(name: &str) -> String {
    format!("naive:{name}")
}

impl Algorithm for NaiveSetnxExpire {
    fn name(&self) -> &'static str {
        "naive-setnx-expire"
    }

    fn describe(&self) -> &'static str {
        "SETNX, then a separate EXPIRE; release by plain DEL; polls; no renewal, no token"
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
                keys: env.names.iter().map(|n| key(n)).collect(),
                ttl_secs: env.ttl.as_secs().max(1),
                timeout: env.acquire_timeout,
                label: env.label.clone(),
                seq: AtomicU64::new(0),
            }) as Arc<dyn LockClient>)
        })
    }

    fn repair<'a>(
        &'a self,
        conn: &'a mut redis::aio::MultiplexedConnection,
        name: &'a str,
    ) -> BoxFuture<'a, u64> {
        Box::pin(async move {
            let key = key(name);
            let Ok((value, pttl)): redis::RedisResult<(Option<String>, i64)> =
                redis::pipe().get(&key).pttl(&key).query_async(conn).await
            else {
                return 0;
            };
            let stuck_value = {
                let mut suspects = self.suspect.lock().expect("suspect lock");
                match (value, pttl) {
                    (Some(v), -1) => match suspects.get(&key) {
                        Some((seen, since)) if *seen == v => (since.elapsed() >= STUCK_AFTER).then_some(v),
                        _ => {
                            suspects.insert(key.clone(), (v, Instant::now()));
                            None
                        }
                    },
                    _ => {
                        suspects.remove(&key);
                        None
                    }
                }
            };
            let Some(v) = stuck_value else { return 0 };
            let script = redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            );
            let deleted: i64 = script.key(&key).arg(&v).invoke_async(conn).await.unwrap_or(0);
            self.suspect.lock().expect("suspect lock").remove(&key);
            deleted as u64
        })
    }
}

struct Client {
    conn: ConnectionManager,
    keys: Vec<String>,
    ttl_secs: u64,
    timeout: Duration,
    label: String,
    seq: AtomicU64,
}

impl LockClient for Client {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let deadline = Instant::now() + self.timeout;
            loop {
                let value = format!("{}:{}", self.label, self.seq.fetch_add(1, Ordering::Relaxed));
                let won: bool = conn
                    .set_nx(&self.keys[lock], &value)
                    .await
                    .map_err(|e| classify(&e))?;
                if won {
                    // The gap: an error here leaves a lock that never expires.
                    let _: bool = conn
                        .expire(&self.keys[lock], self.ttl_secs as i64)
                        .await
                        .map_err(|e| classify(&e))?;
                    return Ok(Held::naive(Lock {
                        conn,
                        key: self.keys[lock].clone(),
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
}

impl NaiveHeld for Lock {
    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move {
            let mut conn = self.conn;
            // Deletes the lock whoever holds it now.
            match conn.del::<_, i64>(&self.key).await {
                Ok(1) => ReleaseOutcome::Released,
                Ok(_) => ReleaseOutcome::NotHeld,
                Err(_) => ReleaseOutcome::Failed,
            }
        })
    }
}
