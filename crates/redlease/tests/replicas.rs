//! Replica acknowledgement (`WAIT`) against a real master with real replicas.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlease::{Error, LeaseOptions, LostReason, OnShortfall, ReplicaAck};

/// A master and `n` replicas in sync with it.
async fn replicated(n: usize) -> (RedisServer, Vec<RedisServer>) {
    // Sync replicas at once instead of waiting 5 s for more of them.
    let master = RedisServer::builder()
        .arg("repl-diskless-sync-delay", "0")
        .start()
        .unwrap();
    let replicas: Vec<RedisServer> = (0..n)
        .map(|_| {
            RedisServer::builder()
                .arg("replicaof", format!("127.0.0.1 {}", master.port()))
                .start()
                .unwrap()
        })
        .collect();
    let conn = raw(&master).await;
    eventually(20.0, "replicas in sync", || {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap();
            info.matches(",state=online,").count() == n
        }
    })
    .await;
    // And streaming: "online" is reported before a freshly synced replica has sent its
    // first ACK, until which the master holds the stream back. A write (FLUSHALL of the
    // empty server) that every replica acknowledges proves they are past that point.
    eventually(20.0, "replicas acknowledge writes", || {
        let mut conn = conn.clone();
        async move {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            let acked: i64 = redis::cmd("WAIT")
                .arg(n)
                .arg(200)
                .query_async(&mut conn)
                .await
                .unwrap();
            acked == n as i64
        }
    })
    .await;
    (master, replicas)
}

fn strict(replicas: u32) -> LeaseOptions {
    LeaseOptions::new().replica_ack(ReplicaAck::new(replicas).timeout(Duration::from_millis(300)))
}

fn lenient(replicas: u32) -> LeaseOptions {
    LeaseOptions::new().replica_ack(
        ReplicaAck::new(replicas)
            .timeout(Duration::from_millis(300))
            .on_shortfall(OnShortfall::Proceed),
    )
}

async fn wait_calls(master: &RedisServer) -> u64 {
    let mut conn = raw(master).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|v| v.split(',').next())
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enough_replicas_report_their_count_and_no_policy_sends_no_wait() {
    let (master, replicas) = replicated(2).await;
    let client = client(&master.url()).await;
    let before = wait_calls(&master).await; // set-up sent one

    // Off by default: no WAIT at all.
    let plain = client.mutex("plain").unwrap().lock().await.unwrap();
    assert_eq!(plain.replicas_acked(), None);
    plain.extend(Duration::from_secs(20)).await.unwrap();
    plain.release().await.unwrap();
    assert_eq!(
        wait_calls(&master).await,
        before,
        "a lock without a policy sent WAIT"
    );

    let guard = client
        .mutex_with("durable", strict(2))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(2));
    // The lock really is on both replicas.
    for replica in &replicas {
        let mut conn = raw(replica).await;
        assert_eq!(
            get(&mut conn, "redlease:durable").await.as_deref(),
            Some(guard.token().expose())
        );
    }
    guard.extend(Duration::from_secs(40)).await.unwrap();
    assert_eq!(guard.replicas_acked(), Some(2));
    assert_eq!(
        wait_calls(&master).await,
        before + 2,
        "one WAIT per acquire and per extend"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortfall_under_the_release_policy_fails_and_releases() {
    let (master, replicas) = replicated(2).await;
    let client = client(&master.url()).await;
    let mut conn = raw(&master).await;
    replicas[1].pause();

    for waiting in [false, true] {
        let mutex = client.mutex_with("strict", strict(2)).unwrap();
        let started = Instant::now();
        let result = if waiting {
            mutex.lock_timeout(Duration::from_secs(5)).await
        } else {
            mutex.try_lock().await
        };
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotReplicated {
                    acked: 1,
                    wanted: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.is_not_replicated());
        assert!(err.to_string().contains("\"strict\""), "{err}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "waited for the WAIT timeout, not for the lock: {took:?}"
        );
        assert!(
            !exists(&mut conn, "redlease:strict").await,
            "the lock was released"
        );
    }

    // An extend that too few replicas acknowledge ends the lease and releases too.
    let guard = client
        .mutex_with("extended", strict(1))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(1));
    replicas[0].pause();
    let err = guard.extend(Duration::from_secs(60)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(guard.replicas_acked(), Some(0));
    assert_eq!(guard.lease().lost_reason(), Some(LostReason::Released));
    assert!(!guard.is_held());
    assert!(!exists(&mut conn, "redlease:extended").await);
    assert!(guard.release().await.unwrap_err().is_not_held());
    replicas[0].resume();
    replicas[1].resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortfall_under_the_proceed_policy_keeps_the_lock_and_reports_it() {
    let (master, replicas) = replicated(2).await;
    let client = client(&master.url()).await;
    let mut conn = raw(&master).await;
    replicas[1].pause();
    let guard = client
        .mutex_with("lenient", lenient(2))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(1));
    assert!(guard.is_held());
    assert_eq!(
        get(&mut conn, "redlease:lenient").await.as_deref(),
        Some(guard.token().expose())
    );
    replicas[0].pause();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert_eq!(guard.replicas_acked(), Some(0));
    assert!(pttl(&mut conn, "redlease:lenient").await > 50_000);
    replicas[0].resume();
    replicas[1].resume();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_without_replicas_never_satisfies_a_policy() {
    let server = server();
    let client = client(&server.url()).await;
    let err = client
        .mutex_with("lonely", strict(1))
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let guard = client
        .mutex_with("lonely", lenient(1))
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(0));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_that_cannot_work_are_rejected_up_front() {
    let server = server();
    let client = client(&server.url()).await;
    let cases = [
        (ReplicaAck::new(0), "replica count"),
        (ReplicaAck::new(1).timeout(Duration::ZERO), "replica timeout"),
        (
            ReplicaAck::new(1).timeout(Duration::from_micros(500)),
            "replica timeout",
        ),
        // WAIT blocks the connection: it must answer before the reply timeout (2 s).
        (
            ReplicaAck::new(1).timeout(Duration::from_secs(2)),
            "replica timeout",
        ),
    ];
    // The wait eats into the lease, which runs from when the acquire was sent.
    let short = LeaseOptions::new()
        .ttl(Duration::from_millis(500))
        .replica_ack(ReplicaAck::new(1).timeout(Duration::from_millis(300)));
    let err = client.mutex_with("bad", short).unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(err.to_string().contains("half the lease"), "{err}");
    for (policy, what) in cases {
        let err = client
            .mutex_with("bad", LeaseOptions::new().replica_ack(policy))
            .unwrap_err();
        assert!(err.is_invalid_input(), "{policy:?}: {err:?}");
        assert!(
            matches!(&err, Error::InvalidArgument { what: w, .. } if *w == what),
            "{err:?}"
        );
        assert!(err.to_string().contains("\"bad\""), "{err}");
    }
    let mut conn = raw(&server).await;
    assert!(all_keys(&mut conn).await.is_empty(), "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_too_short_for_the_replica_wait_is_rejected_up_front() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    // No replica answers here: keep the lock on a shortfall.
    let policy = ReplicaAck::new(1)
        .timeout(Duration::from_millis(100))
        .on_shortfall(OnShortfall::Proceed);
    let mutex = client
        .mutex_with(
            "short",
            LeaseOptions::new()
                .ttl(Duration::from_secs(30))
                .replica_ack(policy),
        )
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    let before = pttl(&mut conn, "redlease:short").await;
    let err = guard.extend(Duration::from_millis(150)).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(err.to_string().contains("half the lease"), "{err}");
    // Nothing was sent: the lease is as it was, and still ours.
    let after = pttl(&mut conn, "redlease:short").await;
    assert!(after > 25_000 && after <= before, "{before} → {after}");
    assert!(guard.is_held());
    guard.extend(Duration::from_secs(10)).await.unwrap();
    // So is an extend by token, of the plain and of the fair mutex.
    let token = guard.forget();
    let err = mutex
        .extend_token(&token, Duration::from_millis(150))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    mutex.release_token(&token).await.unwrap();
    let fair = client
        .fair_mutex_with(
            "fair-short",
            LeaseOptions::new()
                .ttl(Duration::from_secs(30))
                .replica_ack(policy),
        )
        .unwrap();
    let token = fair.lock().await.unwrap().forget();
    let err = fair
        .extend_token(&token, Duration::from_millis(150))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    fair.release_token(&token).await.unwrap();
}
