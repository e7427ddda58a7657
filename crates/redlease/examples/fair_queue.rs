//! A fair mutex serves its waiters in arrival order: five workers queue up behind a
//! holder, report their place in line, and take the lock one after another.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example fair_queue
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redlease::Client::connect(&url).await?;
    let printer = client.fair_mutex("examples:printer")?;

    let holder = printer.lock_timeout(Duration::from_secs(5)).await?;
    println!("holder has the printer (fencing token {})", holder.fence());

    let served = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for worker in 0..5 {
        let (queued, served) = (printer.clone(), served.clone());
        workers.push(tokio::spawn(async move {
            let guard = queued
                .lock_with_position(Some(Duration::from_secs(10)), |ahead| {
                    println!("worker {worker}: {ahead} ahead of me")
                })
                .await?;
            served.lock().unwrap().push(worker);
            println!("worker {worker} prints (fencing token {})", guard.fence());
            guard.release().await
        }));
        // Let each worker take its ticket before the next one arrives.
        while printer.status().await?.queue_len < worker + 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let status = printer.status().await?;
    println!("queue: {} waiting, in order {:?}", status.queue_len, status.queue);

    holder.release().await?;
    for w in workers {
        w.await??;
    }
    let served = served.lock().unwrap().clone();
    println!("served in order {served:?}");
    assert_eq!(served, [0, 1, 2, 3, 4], "first come, first served");
    Ok(())
}
