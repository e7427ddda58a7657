//! Take a lock, use its fencing token, release it.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example basic
//! ```

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), redlease::Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redlease::Client::connect(&url).await?;
    let mutex = client.mutex("examples:basic")?;

    let guard = mutex.lock_timeout(Duration::from_secs(5)).await?;
    println!("holding {} with fencing token {}", guard.key(), guard.fence());
    println!(
        "valid for another {:?}",
        guard.valid_until() - std::time::Instant::now()
    );

    // Someone else trying now is refused at once.
    match mutex.try_lock().await {
        Err(e) if e.is_contended() => println!("second try_lock: {e}"),
        other => panic!("expected contention, got {other:?}"),
    }

    let status = mutex.status().await?;
    println!(
        "status: held={} owner={:?} fence={:?}",
        status.held, status.owner, status.fence
    );
    guard.release().await?;
    println!("released");
    Ok(())
}
