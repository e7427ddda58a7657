//! Sentinel: locks through a master found by name, and what a failover does to them.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use redlease::{Client, LeaseOptions, LostReason};
use redlease_testkit::{RedisSentinel, free_port};

async fn sentinel_client(set: &RedisSentinel, retry_window: Duration) -> Client {
    Client::sentinel_builder(set.sentinel_urls(), set.master_name())
        .unwrap()
        .retry_window(retry_window)
        .build()
        .await
        .expect("sentinel client")
}

async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("NUMSUB reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_by_master_name_and_locks_there() {
    let set = tokio::task::spawn_blocking(|| RedisSentinel::start().unwrap())
        .await
        .unwrap();
    let client = sentinel_client(&set, Duration::from_secs(3)).await;
    let guard = client.mutex("by-name").unwrap().lock().await.unwrap();
    let mut master = raw(set.master()).await;
    assert_eq!(
        get(&mut master, "redlease:by-name").await.as_deref(),
        Some(guard.token().expose())
    );
    guard.release().await.unwrap();

    let err = Client::sentinel(set.sentinel_urls(), "no-such-master")
        .await
        .unwrap_err();
    assert!(matches!(err, redlease::Error::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-master"), "{err}");
    assert!(Client::sentinel(Vec::<String>::new(), "x").await.is_err());
}

/// The master dies. Sentinel promotes its replica; new acquisitions succeed there as
/// soon as it is promoted, and the wake-up connection follows. What happens to the
/// locks held at that moment depends on whether their write had reached the replica:
/// a replicated lock survives (its holder keeps renewing it on the new master); one
/// whose write was still in flight is gone — its holder is told `Gone` at its next
/// renewal, but another client may take the lock before that. This is the window
/// Jepsen found in Redis Sentinel, and the reason for fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_new_acquisitions_and_loses_only_unreplicated_locks() {
    // Replication runs through a proxy, so the test can hold the replication stream.
    let master_port = free_port();
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], master_port)))
        .await
        .unwrap();
    let replicate_from = proxy.addr();
    let mut set = tokio::task::spawn_blocking(move || {
        RedisSentinel::builder()
            .replicas(1)
            .master_port(master_port)
            .replicate_from(replicate_from)
            .start()
            .unwrap()
    })
    .await
    .unwrap();
    let old_master = set.master().addr();
    let holder = sentinel_client(&set, Duration::from_secs(3)).await;
    // Rides through the failover: retries for longer than a failover takes.
    let other = sentinel_client(&set, Duration::from_secs(20)).await;
    let ttl = LeaseOptions::new().ttl(Duration::from_secs(15));

    // A lock the replica has, and one whose write the proxy holds back.
    let replicated = holder
        .mutex_with("replicated", ttl)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mut replica = raw(&set.replicas()[0]).await;
    eventually(5.0, "the replica has the first lock", || {
        let mut replica = replica.clone();
        async move { exists(&mut replica, "redlease:replicated").await }
    })
    .await;
    proxy.hold_replies();
    let unreplicated = holder
        .mutex_with("unreplicated", ttl)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let old_fence = unreplicated.fence();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!exists(&mut replica, "redlease:unreplicated").await);
    // With a replica-ack policy the same situation is refused instead of lost later.
    let err = holder
        .mutex_with("guarded", ttl.wait_replicas(1))
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            redlease::Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err:?}"
    );

    // Kill the master; start acquiring a fresh lock at once.
    set.master_mut().stop();
    let killed = Instant::now();
    let fresh = tokio::spawn({
        let mutex = other.mutex_with("fresh", ttl).unwrap();
        async move {
            let guard = mutex.lock_timeout(Duration::from_secs(30)).await;
            (guard, killed.elapsed())
        }
    });
    let set = tokio::task::spawn_blocking(move || {
        let new = set
            .wait_for_failover(old_master, Duration::from_secs(30))
            .unwrap();
        (set, new)
    });
    let (set, new_master) = set.await.unwrap();
    let failover = killed.elapsed();
    assert_eq!(new_master, set.replicas()[0].addr());
    let (fresh, fresh_after) = within(30.0, "a new acquisition after the failover", fresh)
        .await
        .unwrap();
    let fresh = fresh.expect("acquired on the promoted master");
    let mut promoted = raw(&set.replicas()[0]).await;
    assert_eq!(
        get(&mut promoted, "redlease:fresh").await.as_deref(),
        Some(fresh.token().expose())
    );

    // The unreplicated lock is gone from the new master, so another client takes it —
    // typically while its first holder still believes it holds it (it learns at its
    // next renewal, up to a third of the TTL later).
    let second = other
        .mutex_with("unreplicated", ttl)
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    let overlapped = unreplicated.is_held();
    assert!(
        second.fence() > old_fence,
        "fences still rise: {} after {old_fence}",
        second.fence()
    );
    let reason = within(20.0, "the holder of the lost lock is told", unreplicated.lost()).await;
    let told_after = killed.elapsed();
    assert_eq!(reason, LostReason::Gone);

    // The replicated lock survives: the holder renews it on the new master, and a
    // contender is refused.
    // A renewal sent after the kill confirms the lease past kill + TTL - drift; the
    // last one before the kill could not.
    let renewed_past = killed + Duration::from_millis(15_000 - 150 - 2);
    eventually(15.0, "the holder renews on the promoted master", || {
        let valid_until = replicated.valid_until();
        async move { valid_until > renewed_past }
    })
    .await;
    assert!(pttl(&mut promoted, "redlease:replicated").await > 5_000);
    assert!(replicated.is_held());
    assert_eq!(replicated.lease().lost_reason(), None);
    let err = other.mutex("replicated").unwrap().try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");

    // Wake-ups follow the master: a waiter on the old client is woken by a release.
    let handoff = holder.mutex_with("handoff", ttl).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = other.mutex_with("handoff", ttl).unwrap();
        async move { mutex.lock_timeout(Duration::from_secs(30)).await }
    });
    eventually(10.0, "the waiter subscribes on the new master", || {
        let mut promoted = promoted.clone();
        async move { numsub(&mut promoted, "{redlease:handoff}:wake").await == 1 }
    })
    .await;
    let released = Instant::now();
    handoff.release().await.unwrap();
    let woken = within(10.0, "the waiter is woken", waiter)
        .await
        .unwrap()
        .unwrap();
    let handoff_latency = released.elapsed();
    assert!(
        handoff_latency < Duration::from_secs(2),
        "woken by the release, not the 15 s lease: {handoff_latency:?}"
    );

    eprintln!(
        "sentinel failover: sentinels promoted the replica {failover:?} after the master was killed; \
         a fresh lock was acquired there {fresh_after:?} after the kill; \
         the unreplicated lock (fence {old_fence}) was gone on the new master: another client took it \
         with fence {} (first holder still believed it held it: {overlapped}), and the first holder \
         was told {reason:?} {told_after:?} after the kill; \
         the replicated lock was still held and renewed on the new master; \
         a wake-up after the failover took {handoff_latency:?}",
        second.fence()
    );
    // New acquisitions wait for the promotion, not much longer.
    assert!(
        fresh_after < failover + Duration::from_secs(3),
        "fresh lock after {fresh_after:?}, failover after {failover:?}"
    );
    for guard in [fresh, second, woken, replicated] {
        guard.release().await.unwrap();
    }
    drop(proxy);
}
