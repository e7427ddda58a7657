//! Leader election: three candidates take turns leading — each proclaims its progress,
//! then resigns and the next leads at once — while an observer prints every change.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example election
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use redlease::LeaderEvent;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let watcher = redlease::Client::connect(&url).await?;
    let mut changes = watcher.election("examples:scheduler")?.observe();
    // The election as it is when observing begins (nobody leads yet).
    println!(
        "observer: {:?}",
        changes.next().await.expect("a stream never ends")?
    );

    let mut candidates = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        // One client per candidate, as if each were its own process.
        let client = redlease::Client::connect(&url).await?;
        candidates.push(tokio::spawn(async move {
            let election = client.election("examples:scheduler")?;
            let leadership = election.campaign(name).await?;
            println!("{name} leads, term {}", leadership.term());
            tokio::time::sleep(Duration::from_millis(50)).await;
            leadership.proclaim(&format!("{name}: halfway")).await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            leadership.resign().await?;
            Ok::<_, redlease::Error>(())
        }));
    }
    for c in candidates {
        c.await??;
    }

    // Three terms, each elected, proclaimed and resigned: nine changes, in order.
    let mut terms = Vec::new();
    for _ in 0..9 {
        let change = tokio::time::timeout(Duration::from_secs(10), changes.next())
            .await?
            .expect("a stream never ends")?;
        match &change {
            LeaderEvent::Elected(leader) => {
                println!("observer: term {} — {} leads", leader.term, leader.value);
                terms.push(leader.term);
            }
            LeaderEvent::Proclaimed(leader) => println!("observer: the leader says {:?}", leader.value),
            LeaderEvent::Vacant { resigned } => println!("observer: vacant (resigned: {resigned})"),
            other => println!("observer: {other:?}"),
        }
    }
    assert_eq!(terms.len(), 3, "every term was seen");
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms rise: {terms:?}");
    Ok(())
}
