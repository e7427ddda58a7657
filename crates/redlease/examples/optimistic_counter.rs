//! Sixteen tasks increment one counter by read-increment-write, each inside an
//! optimistic `WATCH`/`MULTI`/`EXEC` transaction that retries when another task got
//! there first. No lock is taken, and no update is lost.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example optimistic_counter
//! ```
//!
//! The last line is `expected=N actual=M retries=R`, with `actual` read back from Redis.

use std::time::Instant;

use redlease::optimistic::{ConnectionPool, Transaction};

const TASKS: usize = 16;
const ROUNDS: usize = 100;
const KEY: &str = "examples:optimistic-counter";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = redis::Client::open(url.as_str())?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await?;
    // Each transaction gets a connection of its own from the pool: WATCH is per connection.
    let pool = ConnectionPool::new(redis);

    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut retries = 0u64;
            for _ in 0..ROUNDS {
                let done = Transaction::new(&pool, &[KEY])
                    .max_attempts(1_000)
                    .run(|tx| async move {
                        // The classic `val = GET mykey; val = val + 1`, read after WATCH.
                        let value: Option<i64> = tx.get(KEY).await?;
                        tokio::task::yield_now().await; // widen the race window
                        let mut writes = redis::pipe();
                        writes.set(KEY, value.unwrap_or(0) + 1);
                        Ok(writes)
                    })
                    .await?;
                retries += u64::from(done.attempts - 1);
            }
            Ok::<_, redlease::Error>(retries)
        }));
    }
    let mut retries = 0;
    for task in tasks {
        retries += task.await??;
    }
    let elapsed = started.elapsed();
    let actual: i64 = redis::cmd("GET").arg(KEY).query_async(&mut conn).await?;
    let expected = (TASKS * ROUNDS) as i64;
    println!(
        "{expected} transactions by {TASKS} tasks in {elapsed:.2?} ({:.0} commits/s, {:.0} retries/s)",
        expected as f64 / elapsed.as_secs_f64(),
        retries as f64 / elapsed.as_secs_f64()
    );
    println!("expected={expected} actual={actual} retries={retries}");
    if actual != expected {
        return Err(format!("lost {} updates", expected - actual).into());
    }
    Ok(())
}
