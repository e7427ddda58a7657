//! A semaphore of 3 permits shared by 12 jobs on two clients: never more than 3 run at
//! once, and all 3 are used.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example semaphore
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const PERMITS: u32 = 3;
const JOBS: usize = 12;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let clients = [
        redlease::Client::connect(&url).await?,
        redlease::Client::connect(&url).await?,
    ];
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for job in 0..JOBS {
        let exports = clients[job % 2].semaphore("examples:exports", PERMITS)?;
        let (running, most) = (running.clone(), most.clone());
        jobs.push(tokio::spawn(async move {
            let permit = exports.acquire_timeout(Duration::from_secs(30)).await?;
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            println!("job {job:2} runs ({now} running)");
            tokio::time::sleep(Duration::from_millis(50)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            permit.release().await
        }));
    }
    for job in jobs {
        job.await??;
    }
    let status = clients[0]
        .semaphore("examples:exports", PERMITS)?
        .status()
        .await?;
    println!(
        "at most {} jobs ran at once; now {} of {} permits in use",
        most.load(Ordering::SeqCst),
        status.in_use,
        status.limit
    );
    assert_eq!(most.load(Ordering::SeqCst), PERMITS as usize);

    // A different limit for the same name is refused while permits are held.
    let exports = clients[0].semaphore("examples:exports", PERMITS)?;
    let held = exports.acquire().await?;
    match clients[1].semaphore("examples:exports", 5)?.try_acquire().await {
        Err(e @ redlease::Error::LimitMismatch { .. }) => println!("{e}"),
        other => panic!("expected a limit mismatch, got {other:?}"),
    }
    held.release().await?;
    Ok(())
}
