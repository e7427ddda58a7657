//! Many tasks on two clients increment one counter with read-modify-write under the
//! lock; the final value proves no update was lost.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example counter
//! ```

use std::time::Instant;

const TASKS: usize = 16;
const ROUNDS: usize = 25;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let clients = [
        redlease::Client::connect(&url).await?,
        redlease::Client::connect(&url).await?,
    ];
    let redis = redis::Client::open(url.as_str())?;
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("DEL")
        .arg("examples:counter")
        .query_async(&mut conn)
        .await?;

    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mutex = clients[t % 2].mutex("examples:counter-lock")?;
        let mut conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let mut last_fence = None;
            for _ in 0..ROUNDS {
                let guard = mutex.lock().await?;
                assert!(last_fence < Some(guard.fence()), "fencing tokens rise");
                last_fence = Some(guard.fence());
                let value: Option<i64> = redis::cmd("GET")
                    .arg("examples:counter")
                    .query_async(&mut conn)
                    .await?;
                tokio::task::yield_now().await; // widen the race window
                let _: () = redis::cmd("SET")
                    .arg("examples:counter")
                    .arg(value.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await?;
                guard.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        task.await?.map_err(|e| e.to_string())?;
    }
    let value: i64 = redis::cmd("GET")
        .arg("examples:counter")
        .query_async(&mut conn)
        .await?;
    let expected = (TASKS * ROUNDS) as i64;
    println!(
        "{} locked increments in {:?}: counter={value} expected={expected}",
        TASKS * ROUNDS,
        started.elapsed()
    );
    if value != expected {
        return Err(format!("lost {} updates", expected - value).into());
    }
    Ok(())
}
