//! Measures three ways for concurrent tasks to increment a counter by
//! read-modify-write: an optimistic `WATCH`/`MULTI`/`EXEC` transaction, a server-side
//! compare-and-set loop, and a redlease `Mutex` around `GET` + `SET`. Once with every
//! task on one hot key, once with each task on its own key (no contention).
//!
//! ```text
//! cargo build --release -p redlease-testkit -p redlease --examples --bins
//! target/release/with-redis target/release/examples/optimistic_bench
//! # or against your own server:
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p redlease --example optimistic_bench
//! ```
//!
//! `TASKS` (default 16) and `OPS` (increments per task, default 300) change the load.
//! The figures in the `redlease::optimistic` docs come from this program.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redlease::optimistic::{CasOutcome, ConnectionPool, Transaction, compare_and_set};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Watch,
    Cas,
    CasBackoff,
    Mutex,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::Watch => "WATCH/MULTI/EXEC",
            Method::Cas => "compare_and_set",
            Method::CasBackoff => "CAS + backoff",
            Method::Mutex => "Mutex + GET/SET",
        }
    }
}

struct Env {
    conn: MultiplexedConnection,
    pool: ConnectionPool,
    client: redlease::Client,
    tasks: usize,
    ops: usize,
}

/// Runs `tasks` × `ops` increments; returns (elapsed, wasted tries).
async fn run(env: &Env, method: Method, hot: bool) -> Result<(Duration, u64), BoxError> {
    let keys: Vec<String> = (0..env.tasks)
        .map(|t| {
            if hot {
                "bench:hot".to_string()
            } else {
                format!("bench:key{t}")
            }
        })
        .collect();
    let mut conn = env.conn.clone();
    for key in &keys {
        let _: () = redis::cmd("DEL").arg(key).query_async(&mut conn).await?;
    }
    let started = Instant::now();
    let mut handles = Vec::new();
    for (task, key) in keys.iter().cloned().enumerate() {
        let (pool, conn, client, ops) = (env.pool.clone(), env.conn.clone(), env.client.clone(), env.ops);
        let key: Arc<str> = key.into();
        handles.push(tokio::spawn(async move {
            let mut wasted = 0u64;
            match method {
                Method::Watch => {
                    for _ in 0..ops {
                        let k = key.clone();
                        let done = Transaction::new(&pool, &[&*key])
                            .max_attempts(100_000)
                            .run(move |tx| {
                                let k = k.clone();
                                async move {
                                    let v: Option<i64> = tx.get(&k).await?;
                                    let mut writes = redis::pipe();
                                    writes.set(&*k, v.unwrap_or(0) + 1);
                                    Ok(writes)
                                }
                            })
                            .await?;
                        wasted += u64::from(done.attempts - 1);
                    }
                }
                Method::Cas | Method::CasBackoff => {
                    let mut seen: Option<String> = None;
                    // xorshift64, started from a per-task value so the tasks' pauses differ.
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(task as u64 + 1);
                    for _ in 0..ops {
                        let mut streak = 0u32;
                        loop {
                            let next = seen.as_deref().map_or(Ok(0), str::parse::<i64>)? + 1;
                            let next = next.to_string();
                            match compare_and_set(&conn, &key, seen.as_deref(), Some(&next)).await? {
                                CasOutcome::Swapped => {
                                    seen = Some(next);
                                    break;
                                }
                                CasOutcome::Mismatch { current } => {
                                    wasted += 1;
                                    seen = current;
                                    if method == Method::CasBackoff {
                                        // The transaction's default: full jitter over
                                        // 1 ms doubling per conflict, capped at 50 ms.
                                        streak += 1;
                                        let cap_us = (1000u64 << (streak - 1).min(6)).min(50_000);
                                        rng ^= rng << 13;
                                        rng ^= rng >> 7;
                                        rng ^= rng << 17;
                                        tokio::time::sleep(Duration::from_micros(rng % cap_us)).await;
                                    }
                                }
                            }
                        }
                    }
                }
                Method::Mutex => {
                    let mutex = client.mutex(&format!("lock:{key}"))?;
                    let mut conn = conn.clone();
                    for _ in 0..ops {
                        let guard = mutex.lock().await?;
                        let v: Option<i64> = redis::cmd("GET").arg(&*key).query_async(&mut conn).await?;
                        let _: () = redis::cmd("SET")
                            .arg(&*key)
                            .arg(v.unwrap_or(0) + 1)
                            .query_async(&mut conn)
                            .await?;
                        guard.release().await?;
                    }
                }
            }
            Ok::<_, BoxError>(wasted)
        }));
    }
    let mut wasted = 0;
    for h in handles {
        wasted += h.await??;
    }
    let elapsed = started.elapsed();
    let mut total = 0i64;
    let mut distinct = keys.clone();
    distinct.dedup();
    for key in &distinct {
        let v: i64 = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
        total += v;
    }
    let expected = (env.tasks * env.ops) as i64;
    if total != expected {
        return Err(format!("{}: lost {} updates", method.label(), expected - total).into());
    }
    Ok((elapsed, wasted))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let number = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let redis = redis::Client::open(url.as_str())?;
    let env = Env {
        conn: redis.get_multiplexed_async_connection().await?,
        pool: ConnectionPool::new(redis.clone()),
        client: redlease::Client::connect(&url).await?,
        tasks: number("TASKS", 16),
        ops: number("OPS", 300),
    };
    println!("{} tasks x {} increments each", env.tasks, env.ops);
    println!(
        "{:<12} {:<18} {:>14} {:>16}",
        "keys", "method", "increments/s", "wasted tries/s"
    );
    for hot in [true, false] {
        for method in [Method::Watch, Method::Cas, Method::CasBackoff, Method::Mutex] {
            // Warm up connections and scripts, then measure.
            run(&env, method, hot).await?;
            let (elapsed, wasted) = run(&env, method, hot).await?;
            let secs = elapsed.as_secs_f64();
            let wasted = match method {
                Method::Mutex => "-".to_string(),
                _ => format!("{:.0}", wasted as f64 / secs),
            };
            println!(
                "{:<12} {:<18} {:>14.0} {:>16}",
                if hot { "one hot key" } else { "one per task" },
                method.label(),
                (env.tasks * env.ops) as f64 / secs,
                wasted
            );
        }
    }
    Ok(())
}
