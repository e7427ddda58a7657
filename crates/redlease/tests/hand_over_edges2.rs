//! More hand-overs at their edges: a grant from an older redlease, the local queue's
//! order and size behind a long holder, a waiter picked by a release that stalls, a
//! hand-over that is never taken up, what a timeout reports.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use redlease::LeaseOptions;

/// A release by an older redlease publishes "g <id> <fence>" without the claim field,
/// after setting the lock to the waiter's token for *its* claim window (here 200 ms: a
/// releaser whose lease is 200 ms). A waiter that trusted such a grant for its own
/// window (2 s) would be a second holder once the key lapses after 200 ms and a third
/// client takes it: a grant without the field is confirmed with a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_from_an_older_releaser_without_a_claim_field_is_not_trusted_past_its_real_window() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b, c) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let name = "old-grant";
    let ten = LeaseOptions::new().ttl(Duration::from_secs(10));
    let holder = a.mutex_with(name, ten).unwrap();
    let long = b.mutex_with(name, ten).unwrap();
    let third = c.mutex_with(name, ten).unwrap();
    let held = holder.lock().await.unwrap();
    let waiter = tokio::spawn({
        let long = long.clone();
        async move { long.lock_timeout(Duration::from_secs(10)).await }
    });
    until_registered(&conn, holder.key(), 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The older releaser: today's release script with the old message (no claim field),
    // its claim window 200 ms.
    let token = held.forget();
    let code = include_str!("../src/script/mutex_release.lua")
        .replace("--[[mark.lua]]", include_str!("../src/script/mark.lua"))
        .replace(
            "string.format('g %s %.0f %s', string.sub(waiter, 1, 16), fence, claim_ms)",
            "string.format('g %s %.0f', string.sub(waiter, 1, 16), fence)",
        );
    assert!(!code.contains("fence, claim_ms)"), "the old message format");
    let key = holder.key().to_string();
    let released: i64 = redis::cmd("EVAL")
        .arg(&code)
        .arg(4)
        .arg(&key)
        .arg("{redlease:fence}")
        .arg("{redlease:fence}:floor")
        .arg(format!("{{{key}}}:q"))
        .arg(token.expose())
        .arg("PUBLISH 200")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(released, 1, "handed over");
    let granted = within(5.0, "the waiter is granted the lock", waiter)
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        if !exists(&mut conn, long.key()).await && granted.is_held() {
            let taken = third.try_lock().await;
            assert!(
                taken.is_err() || !granted.is_held(),
                "two holders: the waiter granted by an older release trusts the grant for its \
                 own window (valid for {:?} more) while another client took the lock, {:?} after \
                 the grant",
                granted.valid_until().saturating_duration_since(Instant::now()),
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Local arrival order: W1 queues behind the client's holder and waits past its claim
/// window (1 s lease: 1 s); W2 queues later. W1 must get the lock first ("tasks of one
/// client that want the same lock line up here, in arrival order") — a queued task
/// does not leave for Redis after a claim window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_local_arrival_does_not_overtake_a_task_waiting_past_its_claim_window() {
    let server = server();
    let c = client(&server.url()).await;
    let m = c
        .mutex_with("order", LeaseOptions::new().ttl(Duration::from_secs(1)))
        .unwrap();
    let held = m.lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let task = |who: &'static str| {
        let (m, order) = (m.clone(), order.clone());
        tokio::spawn(async move {
            let g = m.lock_timeout(Duration::from_secs(10)).await.unwrap();
            order.lock().unwrap().push(who);
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
        })
    };
    let w1 = task("W1 (first)");
    // W1 waits in the local queue past its claim window (1 s lease: 1 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!w1.is_finished());
    let w2 = task("W2 (later)");
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    within(10.0, "W1", w1).await.unwrap();
    within(10.0, "W2", w2).await.unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        vec!["W1 (first)", "W2 (later)"],
        "the later local arrival got the lock first"
    );
}

/// A release() future that is polled once (it picked its local waiter and sent the
/// hand-over) and then left alone. The hand-over lands: the lock is on the waiter's
/// token, with nobody to renew it, and lapses after the waiter's 3 s lease. The picked
/// waiter now waits for the releasing future only (`picked`: bound = its own
/// deadline), although the local docs say a queued task that gets neither a hand-over
/// nor the turn within a claim window goes to Redis itself: it times out with the lock
/// free in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_picked_by_an_unpolled_release_gets_the_lapsed_lock() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let m = c
        .mutex_with(
            "unpolled-release",
            // Long enough for the holder's renewal to keep it on a loaded machine (the
            // release's first poll must find it held).
            LeaseOptions::new().ttl(Duration::from_secs(3)),
        )
        .unwrap();
    let held = m.lock().await.unwrap();
    let mut waiting: Boxed<_> = Box::pin({
        let m = m.clone();
        async move { m.lock_timeout(Duration::from_secs(12)).await }
    });
    poll_once(&mut waiting).await;
    let started = Instant::now();
    let waiter = tokio::spawn(async move { (waiting.await, started.elapsed()) });
    let mut releasing: Boxed<_> = Box::pin(held.release());
    poll_release_once(&mut releasing).await;
    // The hand-over lands on the waiter's token (nobody polls the release any more).
    let (result, waited) = within(20.0, "the picked waiter", waiter).await.unwrap();
    match result {
        Ok(guard) => {
            assert!(guard.is_held());
            assert_eq!(
                get(&mut conn, m.key()).await.as_deref(),
                Some(guard.token().expose())
            );
        }
        Err(e) => panic!(
            "the waiter picked by a release future that is no longer polled never got the \
             lock, free in Redis since ~1 s: {e} after {waited:?} (key now: {:?})",
            get(&mut conn, m.key()).await
        ),
    }
    drop(releasing);
}

/// The semaphore's form of the above. A release() future polled once picks
/// the queued task and moves the permit onto its token, then is left alone. The permit
/// lapses after the queued task's 3 s lease; the client's task in Redis takes it and
/// gives it back. The picked task waits only for the unpolled release, never for Redis
/// ("after the claim window of a hand-over (at most 2 s) without a hand-over, a queued
/// task leaves the queue and goes to Redis itself — so a permit ... handed to a waiter
/// whose task is not being polled ... is found by a queued task within the same
/// window"): it is stuck while the permit is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_task_picked_by_an_unpolled_release_gets_the_free_permit() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c
        .semaphore_with(
            "sem-unpolled-release",
            1,
            LeaseOptions::new().ttl(Duration::from_secs(3)),
        )
        .unwrap();
    let waiters = format!("{{{}}}:waiters", sem.key());
    let held = sem.acquire().await.unwrap();
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move {
            let p = sem.acquire_timeout(Duration::from_secs(16)).await?;
            p.release().await
        }
    });
    eventually(5.0, "the first task registered in Redis", || {
        let (mut conn, waiters) = (conn.clone(), waiters.clone());
        async move {
            let n: u64 = redis::cmd("ZCARD")
                .arg(&waiters)
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 1
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_timeout(Duration::from_secs(16)).await }
    });
    eventually(5.0, "2 waiters", || {
        let sem = sem.clone();
        async move { sem.status().await.unwrap().waiters == 2 }
    })
    .await;
    let mut releasing: Boxed<_> = Box::pin(held.release());
    poll_release_once(&mut releasing).await;
    within(
        20.0,
        "the task in Redis gets the lapsed permit and gives it back",
        in_redis,
    )
    .await
    .unwrap()
    .unwrap();
    let released = Instant::now();
    match within(20.0, "the picked task", queued).await.unwrap() {
        Ok(p) => assert!(p.is_held()),
        Err(e) => panic!(
            "the task picked by a release future that is no longer polled never got the \
             permit, free in Redis for {:?}: {e}",
            released.elapsed()
        ),
    }
    drop(releasing);
}

/// The timeout error says how long the task waited: a task that waited in
/// the local queue, then went to Redis (after its claim window, or with the turn), times
/// out in the engine, whose `waited` counts only the Redis part (the engine's own
/// start): a 3 s `lock_timeout` reports about 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_local_queue_reports_the_whole_wait() {
    let server = server();
    let c = client(&server.url()).await;
    let m = c
        .mutex_with("waited", LeaseOptions::new().ttl(Duration::from_secs(10)))
        .unwrap();
    let held = m.lock().await.unwrap();
    let started = Instant::now();
    let err = within(
        10.0,
        "the waiter times out",
        m.lock_timeout(Duration::from_secs(3)),
    )
    .await
    .unwrap_err();
    let elapsed = started.elapsed();
    match err {
        redlease::Error::Timeout { waited, .. } => assert!(
            waited + Duration::from_millis(200) >= elapsed,
            "the call waited {elapsed:?}; the error says {waited:?}"
        ),
        e => panic!("unexpected: {e:?}"),
    }
    held.release().await.unwrap();
}

/// The lock is handed to a queued task whose future is alive but not polled; the
/// hand-over carries the client's turn, so `busy` stays true for as long as that future
/// lives — although the hand-over lapsed in Redis long ago. Every later acquisition of
/// the client is then treated as queued behind a local holder: `try_lock()` says
/// `Contended` on a free lock, and `lock()` waits a full claim window (here 1 s) before
/// it looks at Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_hand_over_to_an_unpolled_task_does_not_wedge_the_client() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let m = c
        .mutex_with("wedged", LeaseOptions::new().ttl(Duration::from_secs(1)))
        .unwrap();
    let held = m.lock().await.unwrap();
    let mut unpolled: Boxed<_> = Box::pin({
        let m = m.clone();
        async move { m.lock().await }
    });
    poll_once(&mut unpolled).await;
    held.release().await.unwrap();
    // Handed to the unpolled task, renewed by nobody: gone from Redis after 1 s.
    eventually(5.0, "the hand-over lapsed", || {
        let (mut conn, key) = (conn.clone(), m.key().to_owned());
        async move { !exists(&mut conn, &key).await }
    })
    .await;
    assert!(!exists(&mut conn, m.key()).await);
    let tried = m.try_lock().await.map(|g| g.fence());
    let started = Instant::now();
    let locked = within(5.0, "lock() on a free lock", m.lock()).await;
    let took = started.elapsed();
    assert!(
        tried.is_ok() && locked.is_ok() && took < Duration::from_millis(500),
        "on a lock free in Redis: try_lock() = {tried:?}; lock() = {:?} after {took:?}",
        locked.as_ref().map(|g| g.fence())
    );
    drop(unpolled);
}

/// "One of them at a time — the representative — acquires through Redis (and waits for
/// wake-ups there); the others wait for their turn" (mutex/local.rs). Behind a local
/// holder that keeps the lock longer than a claim window (2 s), every queued task now
/// leaves the queue and registers in Redis on its own: 8 tasks of one client, 8
/// registrations (each re-attempting at least once per lease), and each served by Redis
/// grants from then on rather than by local hand-overs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_queued_behind_a_long_local_holder_stay_in_the_local_queue() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let m = c
        .mutex_with("one-at-a-time", LeaseOptions::new().ttl(Duration::from_secs(10)))
        .unwrap();
    let held = m.lock().await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move {
                let g = m.lock_timeout(Duration::from_secs(20)).await.unwrap();
                g.release().await.unwrap();
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let registered: i64 = redis::cmd("ZCARD")
        .arg(format!("{{{}}}:q", m.key()))
        .query_async(&mut conn)
        .await
        .unwrap();
    held.release().await.unwrap();
    for t in tasks {
        within(20.0, "a queued task", t).await.unwrap();
    }
    assert!(
        registered <= 1,
        "{registered} tasks of one client registered in Redis behind the client's own holder"
    );
}
