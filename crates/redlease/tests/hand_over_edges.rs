//! Hand-overs at their edges: a grant whose claim window is the releaser's, a local
//! hand-over between handles of different leases or replica policies, a hand-over to a
//! task that does not take it up, a waiter with a short lease behind a lapsed grant.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::*;
use redlease::{Error, LeaseOptions, ReplicaAck};

type Locking = Pin<Box<dyn Future<Output = redlease::Result<redlease::MutexGuard>> + Send>>;

fn locking(m: &redlease::Mutex) -> Locking {
    let m = m.clone();
    Box::pin(async move { m.lock().await })
}

/// Polls `fut` until `until` is done, then leaves it alone (alive, not polled).
async fn poll_until(fut: &mut Locking, until: impl Future<Output = ()>) {
    tokio::select! {
        biased;
        _ = until => {}
        r = fut.as_mut() => panic!("the acquisition finished early: {:?}", r.map(|g| g.fence())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_is_not_relied_on_past_the_claim_window_the_releaser_set() {
    let server = server();
    let mut conn = raw(&server).await;
    let (a, b, c) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let name = "grant-claims";
    let short = a
        .mutex_with(name, LeaseOptions::new().ttl(Duration::from_millis(200)))
        .unwrap();
    let long = b
        .mutex_with(name, LeaseOptions::new().ttl(Duration::from_secs(10)))
        .unwrap();
    let third = c
        .mutex_with(name, LeaseOptions::new().ttl(Duration::from_secs(10)))
        .unwrap();
    let held = short.lock().await.unwrap();
    let waiter = tokio::spawn({
        let long = long.clone();
        async move { long.lock_timeout(Duration::from_secs(10)).await }
    });
    until_registered(&conn, short.key(), 1).await;
    held.release().await.unwrap();
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
                "two holders: the granted waiter's guard says held (valid for {:?} more) while \
                 another client took the lock, {:?} after the grant",
                granted.valid_until().saturating_duration_since(Instant::now()),
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(granted.is_held(), "the granted waiter lost its lock");
}

/// Two handles of one lock in one client, with different leases. A task of the handle
/// with a 10 s lease (no renewal: the user wants the lock for 10 s) queues behind the
/// holder of the handle with a 300 ms lease. The local hand-over builds the waiter's
/// guard from the *releaser's* handle: the lock is set for 300 ms and the guard is lost
/// after 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_hand_over_gives_the_waiter_its_own_lease() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let name = "handles";
    let short = c
        .mutex_with(
            name,
            LeaseOptions::new()
                .ttl(Duration::from_millis(300))
                .auto_renew(false),
        )
        .unwrap();
    let long = c
        .mutex_with(
            name,
            LeaseOptions::new().ttl(Duration::from_secs(10)).auto_renew(false),
        )
        .unwrap();
    let held = short.lock().await.unwrap();
    let mut waiting = locking(&long);
    poll_once(&mut waiting).await;
    held.release().await.unwrap();
    let guard = within(5.0, "the local waiter gets the lock", waiting)
        .await
        .unwrap();
    let pttl = pttl(&mut conn, long.key()).await;
    assert_eq!(
        guard.mutex().options().ttl,
        Duration::from_secs(10),
        "the guard belongs to the waiter's handle (PTTL {pttl} ms)"
    );
    assert!(
        pttl > 5000,
        "the lock was acquired through a handle with a 10 s lease, but Redis holds it for {pttl} ms"
    );
}

/// A task of a handle with a replica policy queues behind the client's holder of a
/// handle without one. The release hands the lock over locally, which skips the
/// replica acknowledgement the waiter's handle requires ("a hand-over skips the
/// replica acknowledgement of an acquire, so locks with a replica policy always go
/// through Redis" — checked only for the releaser's handle). On a server without
/// replicas the waiter must get `NotReplicated`, as it does on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_replica_policy_is_not_handed_an_unacknowledged_lock() {
    let server = server();
    let c = client(&server.url()).await;
    let name = "replicas";
    let plain = c.mutex(name).unwrap();
    let strict = c
        .mutex_with(
            name,
            LeaseOptions::new().replica_ack(ReplicaAck::new(1).timeout(Duration::from_millis(100))),
        )
        .unwrap();
    let err = strict.try_lock().await.unwrap_err();
    assert!(matches!(err, Error::NotReplicated { .. }), "sanity: {err:?}");
    let held = plain.lock().await.unwrap();
    let mut waiting = locking(&strict);
    poll_once(&mut waiting).await;
    held.release().await.unwrap();
    match within(5.0, "the strict waiter", waiting).await {
        Err(Error::NotReplicated { .. }) => {}
        Ok(guard) => panic!(
            "a lock acquired through a handle that requires 1 replica's acknowledgement was \
             returned without one (replicas_acked: {:?}; the server has no replica)",
            guard.replicas_acked()
        ),
        Err(e) => panic!("unexpected: {e:?}"),
    }
}

/// The lock is handed to a queued task whose future is not polled; nobody renews it and
/// it lapses in Redis after its 1 s lease. The client's next queued task must not wait
/// behind the unpolled one for a hand-over or a turn that never comes while the lock is
/// free in Redis: it looks at Redis itself after a claim window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_task_behind_an_unpolled_hand_over_gets_the_lapsed_lock() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let name = "unpolled-mutex";
    let m = c
        .mutex_with(name, LeaseOptions::new().ttl(Duration::from_secs(1)))
        .unwrap();
    let held = m.lock().await.unwrap();
    let mut unpolled = locking(&m);
    poll_once(&mut unpolled).await;
    let started = Instant::now();
    let mut behind: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin({
        let m = m.clone();
        async move { m.lock_timeout(Duration::from_secs(8)).await }
    });
    poll_once(&mut behind).await;
    let behind = tokio::spawn(async move { (behind.await, started.elapsed()) });
    // Handed to the unpolled task, renewed by nobody: it lapses in Redis after 1 s.
    held.release().await.unwrap();
    let (result, waited) = within(10.0, "the task behind", behind).await.unwrap();
    match result {
        Ok(guard) => {
            assert!(guard.is_held());
            assert_eq!(
                get(&mut conn, m.key()).await.as_deref(),
                Some(guard.token().expose()),
                "the task behind holds the lock in Redis"
            );
            assert!(
                waited < Duration::from_secs(4),
                "the lock was free in Redis from ~1 s; the queued task got it after {waited:?}"
            );
        }
        Err(e) => panic!(
            "the queued task behind the unpolled hand-over never got the lock, free in Redis \
             since ~1 s: {e} after {waited:?}"
        ),
    }
    drop(unpolled);
}

/// A release grants the lock to an earlier-registered waiter that is not polled (or
/// died); that grant lapses after its claim window (2 s for a 30 s lease) and nobody is
/// told. A waiter with a 1 s lease behind it must find the lock soon after — it looks
/// again at least once per its own lease — not only after half a registration's life
/// ("a waiter that died after registering holds up the lock for at most the claim
/// window").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_waiter_finds_a_lock_freed_by_a_lapsed_grant_soon() {
    let server = server();
    let conn = raw(&server).await;
    let (a, d, b) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let name = "lapsed-grant";
    let long = LeaseOptions::new().ttl(Duration::from_secs(30));
    let holder = a.mutex_with(name, long).unwrap();
    let dead = d.mutex_with(name, long).unwrap();
    let short = b
        .mutex_with(name, LeaseOptions::new().ttl(Duration::from_secs(1)))
        .unwrap();
    let held = holder.lock().await.unwrap();
    // An earlier waiter (another process), registered, then not polled any more.
    let mut unpolled = locking(&dead);
    poll_until(&mut unpolled, until_registered(&conn, holder.key(), 1)).await;
    let waiter = tokio::spawn({
        let short = short.clone();
        async move { short.lock_timeout(Duration::from_secs(20)).await }
    });
    until_registered(&conn, holder.key(), 2).await;
    // Let the short-lease waiter settle into its sleep after its registering attempt.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = within(25.0, "the short-lease waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    assert!(guard.is_held());
    assert!(
        took < Duration::from_secs(5),
        "the lock was free in Redis ~2 s after the release (the unpolled waiter's grant \
         lapsed); the waiter with a 1 s lease got it only {took:?} after the release"
    );
    drop(unpolled);
}
