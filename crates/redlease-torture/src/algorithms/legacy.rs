//! The legacy timestamp lock of the Redis SETNX page (`SETNX lock.foo <now + timeout +
//! 1>`, a stale lock taken over with `GET` + `GETSET`, release by `DEL`), in
//! milliseconds so that it works with the run's 1 s TTL.
//!
//! - `redlease-legacy`: `redlease::LegacyLock`, which speaks that protocol with Redis's
//!   clock (`TIME` inside its scripts) and renews its timestamp while held. No fencing
//!   token (the protocol's key holds only a timestamp), so it is informative under the
//!   faults that let a holder outlive its lease, like `redlease-nofence`; under the
//!   others, and under `clock`, it must keep the counter exact.
//! - `naive-legacy`: the old SETNX client, command for command, with *its own* clock
//!   (the worker's wall clock, which the `clock` fault skews): no renewal, no token.
//!
//! The `clock` fault skews the wall clock of one worker process at a time. The old
//! client there then takes over live locks (clock ahead) or writes timestamps that
//! others find already expired (clock behind); redlease never reads that clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use redlease::{Client, LegacyLock, LegacyOptions, TimestampUnit};

use super::{
    AcquireError, Algorithm, BoxFuture, Held, LockClient, LockEnv, NaiveHeld, ReleaseOutcome, Role,
    acquire_error, classify, naive_connection, outlives_lease, poll_delay, redlease_client,
};
use crate::clock::wall_ms;
use crate::faults::Fault;

pub struct RedleaseLegacy;

impl Algorithm for RedleaseLegacy {
    fn name(&self) -> &'static str {
        "redlease-legacy"
    }

    fn describe(&self) -> &'static str {
        "redlease::LegacyLock (SETNX/GETSET timestamps in ms, Redis's clock), no token (informative under pauses, empty restarts)"
    }

    fn fenced(&self) -> bool {
        false
    }

    fn must_be_safe(&self) -> bool {
        true
    }

    fn must_be_safe_under(&self, faults: &[Fault]) -> bool {
        !faults.iter().any(|&f| outlives_lease(f))
    }

    fn kind(&self) -> &'static str {
        "conditional"
    }

    fn supports(&self, fault: Fault) -> bool {
        // LegacyLock is not one of the primitives redlease runs on Redis Cluster.
        fault != Fault::Cluster
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            let client = redlease_client(env).await?;
            let options = LegacyOptions::new()
                .unit(TimestampUnit::Milliseconds)
                .timeout(env.ttl)
                .poll_interval(Duration::from_millis(20));
            let lock = env
                .names
                .iter()
                .map(|name| client.legacy_lock(name, options))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(LegacyClient {
                _client: client,
                lock,
                timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

struct LegacyClient {
    _client: Client,
    lock: Vec<LegacyLock>,
    timeout: Duration,
}

impl LockClient for LegacyClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            match self.lock[lock].lock_timeout(self.timeout).await {
                Ok(guard) => Ok(Held::guard(guard, Role::Writer)),
                Err(e) => Err(acquire_error(e)),
            }
        })
    }
}

pub struct NaiveLegacy;

impl Algorithm for NaiveLegacy {
    fn name(&self) -> &'static str {
        "naive-legacy"
    }

    fn describe(&self) -> &'static str {
        "the old client of the timestamp protocol: SETNX <now+timeout+1>, GET + GETSET takeover, DEL; its own clock; no renewal, no token"
    }

    fn fenced(&self) -> bool {
        false
    }

    fn must_be_safe(&self) -> bool {
        false
    }

    fn supports(&self, fault: Fault) -> bool {
        // Not a redlease guard (nothing to extend), and a single-server client.
        !matches!(fault, Fault::Cluster | Fault::Extend)
    }

    fn connect<'a>(&'a self, env: &'a LockEnv) -> BoxFuture<'a, Result<Arc<dyn LockClient>, String>> {
        Box::pin(async move {
            Ok(Arc::new(OldClient {
                conn: naive_connection(env).await?,
                keys: env.names.iter().map(|n| format!("naive:{n}")).collect(),
                timeout_ms: env.ttl.as_millis() as u64,
                acquire_timeout: env.acquire_timeout,
            }) as Arc<dyn LockClient>)
        })
    }
}

/// The old client, in milliseconds.
struct OldClient {
    conn: ConnectionManager,
    keys: Vec<String>,
    timeout_ms: u64,
    acquire_timeout: Duration,
}

fn stamp(value: &Option<String>) -> Option<u64> {
    value.as_deref().and_then(|v| v.parse().ok())
}

impl OldClient {
    /// One pass: `SETNX`; else `GET`, and if the stamp is older than my clock, `GETSET`
    /// (won if it returned an expired stamp). Returns my stamp when I won.
    async fn try_lock(&self, conn: &mut ConnectionManager, key: &str) -> redis::RedisResult<Option<u64>> {
        let mine = wall_ms() + self.timeout_ms + 1;
        if conn.set_nx::<_, _, bool>(key, mine).await? {
            return Ok(Some(mine));
        }
        let current: Option<String> = conn.get(key).await?;
        // Held by a live stamp, freed meanwhile (the next pass's SETNX takes it), or
        // not a stamp at all: try again later.
        if stamp(&current).is_none_or(|t| t >= wall_ms()) {
            return Ok(None);
        }
        let now = wall_ms();
        let mine = now + self.timeout_ms + 1;
        let old: Option<String> = redis::cmd("GETSET").arg(key).arg(mine).query_async(conn).await?;
        Ok(match stamp(&old) {
            None if old.is_none() => Some(mine),
            Some(t) if t < now => Some(mine),
            _ => None,
        })
    }
}

impl LockClient for OldClient {
    fn acquire(&self, lock: usize) -> BoxFuture<'_, Result<Held, AcquireError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let deadline = Instant::now() + self.acquire_timeout;
            loop {
                if let Some(mine) = self
                    .try_lock(&mut conn, &self.keys[lock])
                    .await
                    .map_err(|e| classify(&e))?
                {
                    return Ok(Held::naive(OldLock {
                        conn,
                        key: self.keys[lock].clone(),
                        mine,
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

struct OldLock {
    conn: ConnectionManager,
    key: String,
    mine: u64,
}

impl NaiveHeld for OldLock {
    fn release(self: Box<Self>) -> BoxFuture<'static, ReleaseOutcome> {
        Box::pin(async move {
            // The SETNX page's advice: DEL only if my timeout has not expired (by my clock).
            if wall_ms() >= self.mine {
                return ReleaseOutcome::NotHeld;
            }
            let mut conn = self.conn;
            match conn.del::<_, i64>(&self.key).await {
                Ok(1) => ReleaseOutcome::Released,
                Ok(_) => ReleaseOutcome::NotHeld,
                Err(_) => ReleaseOutcome::Failed,
            }
        })
    }
}
