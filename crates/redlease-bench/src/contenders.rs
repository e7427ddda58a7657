//! The locks being compared, behind one small interface.
//!
//! - `raw-redis`: the commands a careful hand-written lock issues — `SET key token NX PX`
//!   and a compare-and-delete script through EVALSHA — with redis-rs. Waiting spins on
//!   `SET NX` with no sleep, the fastest (and most wasteful) thing a client can do: the
//!   floor for latency, not a recommendation.
//! - `redlease`: this crate's plain mutex (notified waiting, fencing, renewal).
//! - `rslock`: the rslock crate (0.10), single node. It waits by retrying with a random
//!   sleep of up to `retry_delay`, and releases its own failed attempt after each one.
//!   Run at its default (3 retries, 200 ms) and at 10 ms, the delay its own test-suite
//!   uses, which is the fastest sane polling we found for it.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// Which lock implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Contender {
    #[serde(rename = "raw-redis")]
    Raw,
    #[serde(rename = "redlease")]
    Redlease,
    #[serde(rename = "rslock")]
    Rslock,
    #[serde(rename = "rslock-10ms")]
    Rslock10ms,
    #[serde(rename = "redlease-fair")]
    RedleaseFair,
}

impl Contender {
    pub const ALL: [Contender; 4] = [
        Contender::Raw,
        Contender::Redlease,
        Contender::Rslock,
        Contender::Rslock10ms,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Raw => "raw-redis",
            Contender::Redlease => "redlease",
            Contender::Rslock => "rslock",
            Contender::Rslock10ms => "rslock-10ms",
            Contender::RedleaseFair => "redlease-fair",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Contender::RedleaseFair])
            .find(|c| c.name() == s)
    }
}

const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const EXTEND: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/// A connected lock client of one contender.
pub enum Locker {
    Raw {
        conn: MultiplexedConnection,
        unlock: redis::Script,
        extend: redis::Script,
    },
    Redlease(redlease::Client),
    RedleaseFair(redlease::Client),
    Rslock(rslock::LockManager),
}

/// A held lock.
pub enum Held {
    Raw {
        key: String,
        token: String,
    },
    /// Any redlease lock (plain or fair mutex), through the surface every guard shares.
    Redlease(Box<dyn redlease::Guard>),
    Rslock(rslock::Lock),
}

impl Locker {
    /// Connects a client of `contender`. An error is the contender's failure.
    pub async fn connect(contender: Contender, url: &str) -> Result<Locker, String> {
        Ok(match contender {
            Contender::Raw => {
                let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                Locker::Raw {
                    conn,
                    unlock: redis::Script::new(UNLOCK),
                    extend: redis::Script::new(EXTEND),
                }
            }
            Contender::Redlease | Contender::RedleaseFair => {
                let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
                let redlease = redlease::Client::builder(client)
                    .build()
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                if contender == Contender::RedleaseFair {
                    Locker::RedleaseFair(redlease)
                } else {
                    Locker::Redlease(redlease)
                }
            }
            Contender::Rslock | Contender::Rslock10ms => {
                let mut mgr = rslock::LockManager::new(vec![url.to_owned()]);
                if contender == Contender::Rslock10ms {
                    mgr.set_retry(3, Duration::from_millis(10));
                }
                Locker::Rslock(mgr)
            }
        })
    }

    /// Takes `name`, waiting as long as it takes. An error is the contender's failure
    /// (the lock is not held).
    pub async fn lock(&self, name: &str, ttl: Duration) -> Result<Held, String> {
        match self {
            Locker::Raw { conn, .. } => {
                let token = format!("{:032x}", rand_u128()?);
                let mut conn = conn.clone();
                loop {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(name)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| format!("SET NX: {e}"))?;
                    if ok.is_some() {
                        return Ok(Held::Raw {
                            key: name.to_owned(),
                            token,
                        });
                    }
                    tokio::task::yield_now().await;
                }
            }
            Locker::Redlease(client) => {
                let mutex = client
                    .mutex_with(name, redlease::LeaseOptions::new().ttl(ttl))
                    .map_err(|e| format!("mutex: {e}"))?;
                let guard = mutex.lock().await.map_err(|e| format!("lock: {e}"))?;
                Ok(Held::Redlease(Box::new(guard)))
            }
            Locker::RedleaseFair(client) => {
                let mutex = client
                    .fair_mutex_with(name, redlease::LeaseOptions::new().ttl(ttl))
                    .map_err(|e| format!("fair mutex: {e}"))?;
                let guard = mutex.lock().await.map_err(|e| format!("lock: {e}"))?;
                Ok(Held::Redlease(Box::new(guard)))
            }
            Locker::Rslock(mgr) => mgr
                .acquire_no_guard(name, ttl)
                .await
                .map(Held::Rslock)
                .map_err(|e| format!("acquire: {e:?}")),
        }
    }

    /// Releases a held lock. An error (including a lock found already gone) is the
    /// contender's failure. rslock's unlock is best effort and reports nothing.
    pub async fn unlock(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Locker::Raw { conn, unlock, .. }, Held::Raw { key, token }) => {
                let mut conn = conn.clone();
                let deleted: i64 = unlock
                    .key(key)
                    .arg(token)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| format!("unlock: {e}"))?;
                if deleted == 1 {
                    Ok(())
                } else {
                    Err("unlock: the lock was no longer held".into())
                }
            }
            (Locker::Redlease(_) | Locker::RedleaseFair(_), Held::Redlease(guard)) => {
                guard.release().await.map_err(|e| format!("release: {e}"))
            }
            (Locker::Rslock(mgr), Held::Rslock(lock)) => {
                mgr.unlock(&lock).await;
                Ok(())
            }
            _ => Err("a lock released by another contender than the one that took it".into()),
        }
    }

    /// One manual renewal round trip of a held lock (for contenders without
    /// auto-renewal). An error means the lease is lost (rslock deletes the key of an
    /// extension that failed).
    pub async fn extend(&self, held: &Held, ttl: Duration) -> Result<(), String> {
        match (self, held) {
            (Locker::Raw { conn, extend, .. }, Held::Raw { key, token }) => {
                let mut conn = conn.clone();
                let extended: i64 = extend
                    .key(key)
                    .arg(token)
                    .arg(ttl.as_millis() as u64)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| format!("extend: {e}"))?;
                if extended == 1 {
                    Ok(())
                } else {
                    Err("extend: the lock was no longer held".into())
                }
            }
            (Locker::Rslock(mgr), Held::Rslock(lock)) => mgr
                .extend(lock, ttl)
                .await
                .map(drop)
                .map_err(|e| format!("extend: {e:?}")),
            _ => Ok(()),
        }
    }
}

/// 128 random bits from the OS for raw-redis tokens (the same source and strength redlease uses).
fn rand_u128() -> Result<u128, String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| format!("OS random source: {e}"))?;
    Ok(u128::from_le_bytes(b))
}

const SEM_ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// A counting semaphore of one contender: the classic Redis sorted-set semaphore
/// (expiring members, spin-polled) as the floor, or redlease's `Semaphore`.
pub enum Permitter {
    Raw {
        conn: MultiplexedConnection,
        acquire: redis::Script,
    },
    Redlease(redlease::Client),
}

// Held on the stack of the task that measures it: boxing the permit would add an
// allocation to what is measured.
#[allow(clippy::large_enum_variant)]
pub enum PermitHeld {
    Raw { key: String, member: String },
    Redlease(redlease::Permit),
}

impl Permitter {
    /// Connects a semaphore client of `contender`; `Ok(None)` for contenders without
    /// a semaphore.
    pub async fn connect(contender: Contender, url: &str) -> Result<Option<Permitter>, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
        Ok(match contender {
            Contender::Raw => Some(Permitter::Raw {
                conn: client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("connect: {e}"))?,
                acquire: redis::Script::new(SEM_ACQUIRE),
            }),
            Contender::Redlease => Some(Permitter::Redlease(
                redlease::Client::builder(client)
                    .build()
                    .await
                    .map_err(|e| format!("connect: {e}"))?,
            )),
            _ => None,
        })
    }

    pub async fn acquire(&self, name: &str, limit: u32, ttl: Duration) -> Result<PermitHeld, String> {
        match self {
            Permitter::Raw { conn, acquire } => {
                let member = format!("{:032x}", rand_u128()?);
                let mut conn = conn.clone();
                loop {
                    let got: i64 = acquire
                        .key(name)
                        .arg(limit)
                        .arg(ttl.as_millis() as u64)
                        .arg(&member)
                        .invoke_async(&mut conn)
                        .await
                        .map_err(|e| format!("acquire: {e}"))?;
                    if got == 1 {
                        return Ok(PermitHeld::Raw {
                            key: name.to_owned(),
                            member,
                        });
                    }
                    tokio::task::yield_now().await;
                }
            }
            Permitter::Redlease(client) => {
                let sem = client
                    .semaphore_with(name, limit, redlease::LeaseOptions::new().ttl(ttl))
                    .map_err(|e| format!("semaphore: {e}"))?;
                sem.acquire()
                    .await
                    .map(PermitHeld::Redlease)
                    .map_err(|e| format!("acquire: {e}"))
            }
        }
    }

    pub async fn release(&self, held: PermitHeld) -> Result<(), String> {
        match (self, held) {
            (Permitter::Raw { conn, .. }, PermitHeld::Raw { key, member }) => {
                let mut conn = conn.clone();
                let removed: i64 = redis::cmd("ZREM")
                    .arg(key)
                    .arg(member)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| format!("ZREM: {e}"))?;
                if removed == 1 {
                    Ok(())
                } else {
                    Err("release: the permit was no longer held".into())
                }
            }
            (Permitter::Redlease(_), PermitHeld::Redlease(permit)) => {
                permit.release().await.map_err(|e| format!("release: {e}"))
            }
            _ => Err("a permit released by another contender than the one that took it".into()),
        }
    }
}
