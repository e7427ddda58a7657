//! In-process queueing of the plain mutex: tasks of one client line up behind the
//! local holder and get the lock handed over in one script.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// Waiters that give up at random points — while queued, while representative, just as
/// a hand-over reaches them — never stall the others, never leave the lock behind, and
/// never let two tasks hold it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_local_waiters_stall_nobody_and_leave_nothing() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("churn").unwrap();
    let mut conn = raw(&server).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let acquired = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..24u64 {
        let (mutex, inside, acquired) = (mutex.clone(), inside.clone(), acquired.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..40u64 {
                // Every third attempt gives up after a few hundred microseconds.
                let patience = if (t + round) % 3 == 0 {
                    Duration::from_micros(100 + (t * 37 + round * 11) % 700)
                } else {
                    Duration::from_secs(30)
                };
                if let Ok(Ok(guard)) = tokio::time::timeout(patience, mutex.lock()).await {
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    acquired.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        within(60.0, "all tasks finish", t).await.unwrap();
    }
    assert!(
        acquired.load(Ordering::SeqCst) >= 24 * 40 * 2 / 3 - 10,
        "{acquired:?}"
    );
    eventually(3.0, "no lock left behind", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:churn").await }
    })
    .await;
    // And the lock works afterwards: nobody local still thinks it is busy.
    let g = within(2.0, "lock after the churn", mutex.try_lock())
        .await
        .unwrap();
    g.release().await.unwrap();
    let _ = &mut conn;
}

/// Local hand-overs are bounded: two clients whose tasks all loop on one lock with no
/// hold time both get a fair share, not one client starving the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hand_over_budget_shares_the_lock_between_clients() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let counts = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for c in 0..2 {
        for _ in 0..6 {
            let mutex = clients[c].mutex("shared").unwrap();
            let count = counts[c].clone();
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let g = mutex.lock().await.unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        within(30.0, "tasks finish", t).await.unwrap();
    }
    let (a, b) = (
        counts[0].load(Ordering::Relaxed),
        counts[1].load(Ordering::Relaxed),
    );
    eprintln!("acquisitions per client: {a} / {b}");
    assert!(a + b > 200, "progress: {a} + {b}");
    let share = a.min(b) as f64 / (a + b) as f64;
    assert!(share > 0.2, "one client starved the other: {a} vs {b}");
}

/// A hand-over whose reply is lost still ends with the waiter holding the lock: the
/// retried hand-over, or the waiter's own acquire with its token, recognises it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_reply_is_lost_still_reaches_the_waiter() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(150), Duration::from_secs(3)).await;
    let mutex = client.mutex("handover").unwrap();
    let mut conn = raw(&server).await;
    let holder = mutex.lock().await.unwrap();
    let first_fence = holder.fence();
    let first_token = holder.token().expose().to_owned();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await; // the waiter queues locally
    proxy.hold_replies();
    let release = tokio::spawn(holder.release());
    eventually(3.0, "the hand-over lands while its reply is held", || {
        let mut conn = conn.clone();
        let first = first_token.clone();
        async move {
            let holder = get(&mut conn, "redlease:handover").await;
            holder.is_some_and(|t| t != first)
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // past the reply timeout
    proxy.release_replies();
    within(5.0, "release returns", release)
        .await
        .unwrap()
        .expect("the hand-over happened");
    let guard = within(5.0, "the waiter gets the lock", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(guard.fence() > first_fence);
    assert_eq!(
        get(&mut conn, "redlease:handover").await.as_deref(),
        Some(guard.token().expose())
    );
    guard.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:handover").await);
}
