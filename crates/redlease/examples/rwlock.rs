//! A read-write lock: readers share it, a writer waits for them and keeps new readers
//! out meanwhile, then downgrades to a reader without letting another writer in.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example rwlock
//! ```

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redlease::Client::connect(&url).await?;
    let config = client.rwlock("examples:config")?;

    let first = config.read().await?;
    let second = config.read().await?;
    println!("two readers inside: {} shares", config.status().await?.readers);

    let writer = tokio::spawn({
        let config = config.clone();
        async move {
            let started = Instant::now();
            let guard = config.write_timeout(Duration::from_secs(10)).await?;
            println!(
                "writer in after {:?}, fencing token {}",
                started.elapsed(),
                guard.fence()
            );
            Ok::<_, redlease::Error>(guard)
        }
    });
    while config.status().await?.waiting_writers == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Writer preference: with a writer waiting, a new reader is turned away.
    match config.try_read().await {
        Err(e) if e.is_contended() => println!("a third reader must wait: {e}"),
        other => panic!("expected contention, got {other:?}"),
    }
    first.release().await?;
    second.release().await?;

    let writing = writer.await??;
    let reading = writing.downgrade().await?;
    let status = config.status().await?;
    println!(
        "downgraded: write_held={} readers={}",
        status.write_held, status.readers
    );
    reading.release().await?;
    Ok(())
}
