//! Limits of the lease engine, against real redis-server: durations too long to be
//! represented, a local waiter bounded by the local holder's lease, replica
//! acknowledgement on every primitive, a failing fair acquire that writes nothing,
//! waiter TTLs capped at the lease, and a semaphore released by token alone.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::*;
use redlease::{Error, LeaseOptions, LegacyOptions, Redlock};
use tokio::task::JoinHandle;

/// Awaits a spawned task, failing the test (with the task's panic message, if it
/// panicked) when it does not finish within `secs` seconds or does not finish cleanly.
async fn join<T>(secs: f64, what: &str, task: JoinHandle<T>) -> T {
    match within(secs, what, task).await {
        Ok(value) => value,
        Err(e) => panic!("{what}: the task did not finish cleanly: {e}"),
    }
}

/// Polls until `waiting` is true — or until `task` has finished, so that a task that
/// failed (or panicked) early is reported by [`join`] rather than as a timeout here.
async fn until_waiting<T, F, Fut>(task: &JoinHandle<T>, what: &str, mut waiting: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(20.0, what, async {
        while !task.is_finished() && !waiting().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Subscribers of a pub/sub channel (a waiting process listens on its lock's channel).
async fn subscribers(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .expect("PUBSUB NUMSUB");
    reply.1
}

async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// A sorted set with its scores, exactly as Redis returns them.
async fn zset(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

/// Redis's clock, in milliseconds.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * 1000 + micros / 1000
}

/// When (Redis ms) the lease of the lock key `key` started, for a lease of `ttl` not
/// renewed since: its expiry minus `ttl`. (A renewal moves it later, never earlier.)
async fn lease_start_ms(conn: &mut redis::aio::MultiplexedConnection, key: &str, ttl: Duration) -> i64 {
    let now = server_ms(conn).await;
    let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.expect("PTTL");
    assert!(pttl > 0, "{key} is held with a TTL: {pttl}");
    now + pttl - ttl.as_millis() as i64
}

// ---------------------------------------------------------------------------------
// 1. Durations too long to be represented: no panic anywhere.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_lock_timeout_max_waits_for_the_holder() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let held = a.mutex("max-mutex").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = b.mutex("max-mutex").unwrap();
        async move { mutex.lock_timeout(Duration::MAX).await }
    });
    until_waiting(&waiter, "the waiter listens for a release", || {
        let mut conn = conn.clone();
        async move { subscribers(&mut conn, "{redlease:max-mutex}:wake").await >= 1 }
    })
    .await;
    let first = held.fence();
    held.release().await.unwrap();
    let guard = join(15.0, "lock_timeout(Duration::MAX)", waiter)
        .await
        .expect("acquired once the holder released");
    assert!(guard.fence() > first);
    assert_eq!(
        get(&mut conn, "redlease:max-mutex").await.as_deref(),
        Some(guard.token().expose())
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mutex_lock_timeout_max_waits_for_the_holder() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let held = a.fair_mutex("max-fair").unwrap().lock().await.unwrap();
    let fair = b.fair_mutex("max-fair").unwrap();
    let waiter = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock_timeout(Duration::MAX).await }
    });
    until_waiting(&waiter, "the waiter joins the queue", || {
        let fair = fair.clone();
        async move { fair.status().await.unwrap().queue_len == 1 }
    })
    .await;
    let first = held.fence();
    held.release().await.unwrap();
    let guard = join(15.0, "fair lock_timeout(Duration::MAX)", waiter)
        .await
        .expect("acquired once the holder released");
    assert!(guard.fence() > first);
    assert_eq!(
        get(&mut conn, "redlease:max-fair").await.as_deref(),
        Some(guard.token().expose())
    );
    assert_eq!(
        zcard(&mut conn, "{redlease:max-fair}:queue").await,
        0,
        "the waiter left the queue"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_read_timeout_max_waits_for_the_writer() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let writing = a.rwlock("max-read").unwrap().write().await.unwrap();
    let reader = tokio::spawn({
        let rw = b.rwlock("max-read").unwrap();
        async move { rw.read_timeout(Duration::MAX).await }
    });
    until_waiting(&reader, "the reader listens for the writer's release", || {
        let mut conn = conn.clone();
        async move { subscribers(&mut conn, "{redlease:max-read}:wake:read").await >= 1 }
    })
    .await;
    writing.release().await.unwrap();
    let reading = join(15.0, "read_timeout(Duration::MAX)", reader)
        .await
        .expect("a share once the writer released");
    assert!(reading.is_held());
    assert_eq!(zcard(&mut conn, "{redlease:max-read}:readers").await, 1);
    assert!(!exists(&mut conn, "redlease:max-read").await);
    reading.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_write_timeout_max_waits_for_the_reader() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let reading = a.rwlock("max-write").unwrap().read().await.unwrap();
    let rw = b.rwlock("max-write").unwrap();
    let writer = tokio::spawn({
        let rw = rw.clone();
        async move { rw.write_timeout(Duration::MAX).await }
    });
    until_waiting(&writer, "the writer registers as waiting", || {
        let rw = rw.clone();
        async move { rw.status().await.unwrap().waiting_writers == 1 }
    })
    .await;
    reading.release().await.unwrap();
    let writing = join(15.0, "write_timeout(Duration::MAX)", writer)
        .await
        .expect("the write lock once the reader released");
    assert_eq!(
        get(&mut conn, "redlease:max-write").await.as_deref(),
        Some(writing.token().expose())
    );
    writing.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_acquire_timeout_max_waits_for_a_permit() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let held = a.semaphore("max-sem", 1).unwrap().acquire().await.unwrap();
    let sem = b.semaphore("max-sem", 1).unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_timeout(Duration::MAX).await }
    });
    until_waiting(&waiter, "the waiter listens for a freed permit", || {
        let sem = sem.clone();
        async move { sem.status().await.unwrap().waiters >= 1 }
    })
    .await;
    held.release().await.unwrap();
    let permit = join(15.0, "acquire_timeout(Duration::MAX)", waiter)
        .await
        .expect("a permit once the holder released");
    assert!(permit.is_held());
    assert_eq!(sem.status().await.unwrap().in_use, 1);
    permit.release().await.unwrap();
    assert_eq!(sem.status().await.unwrap().in_use, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_lock_timeout_max_waits_for_the_holder() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let held = a
        .legacy_lock("max-legacy", LegacyOptions::new())
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = b.legacy_lock("max-legacy", LegacyOptions::new()).unwrap();
        async move { lock.lock_timeout(Duration::MAX).await }
    });
    until_waiting(&waiter, "the waiter listens for a release", || {
        let mut conn = conn.clone();
        async move { subscribers(&mut conn, "{redlease:max-legacy}:wake").await >= 1 }
    })
    .await;
    held.release().await.unwrap();
    let guard = join(15.0, "legacy lock_timeout(Duration::MAX)", waiter)
        .await
        .expect("acquired once the holder released");
    assert!(guard.is_held());
    // The owner record, "<stamp> <token>", names the waiter's acquisition.
    let owner = get(&mut conn, "{redlease:max-legacy}:legacy")
        .await
        .unwrap_or_default();
    assert!(
        owner.ends_with(guard.token().expose()),
        "the waiter owns the lock"
    );
    assert!(exists(&mut conn, "redlease:max-legacy").await);
    guard.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:max-legacy").await);
}

/// A retry window too long to be represented means "retry as long as the call may":
/// a `lock_timeout` whose replies never come back still ends at its own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_retry_window_still_ends_at_the_call_deadline() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(100), Duration::MAX).await;
    let mutex = client.mutex("max-window").unwrap();
    let conn = raw(&server).await;
    proxy.hold_replies();
    let started = Instant::now();
    let attempt = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::from_millis(500)).await }
    });
    let result = join(10.0, "lock_timeout(500ms) with replies held", attempt).await;
    let took = started.elapsed();
    let err = result.expect_err("no reply ever came back");
    assert!(err.is_unavailable(), "expected a no-answer error, got {err:?}");
    assert!(
        took < Duration::from_secs(5),
        "gave up around the call's 500 ms deadline: {took:?}"
    );
    proxy.release_replies();
    // The acquire may have landed: it is compare-and-deleted in the background.
    eventually(15.0, "no lock left behind", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:max-window").await }
    })
    .await;
}

/// `extend(Duration::MAX)` is an invalid TTL on every kind of guard, not a panic, and
/// leaves the lease as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_by_duration_max_is_an_invalid_ttl() {
    fn invalid(what: &str, result: redlease::Result<()>) {
        match result {
            Err(Error::InvalidTtl { ttl, .. }) => assert_eq!(ttl, Duration::MAX, "{what}"),
            other => panic!("{what}: expected InvalidTtl, got {other:?}"),
        }
    }
    let server = server();
    let client = client(&server.url()).await;

    let g = client.mutex("ext-mutex").unwrap().lock().await.unwrap();
    invalid("mutex", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();

    let g = client.fair_mutex("ext-fair").unwrap().lock().await.unwrap();
    invalid("fair mutex", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();

    let rw = client.rwlock("ext-rw").unwrap();
    let g = rw.write().await.unwrap();
    invalid("write guard", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();
    let g = rw.read().await.unwrap();
    invalid("read guard", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();

    let g = client.semaphore("ext-sem", 2).unwrap().acquire().await.unwrap();
    invalid("permit", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();

    let g = client
        .legacy_lock("ext-legacy", LegacyOptions::new())
        .unwrap()
        .lock()
        .await
        .unwrap();
    invalid("legacy guard", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();

    let redlock = Redlock::new(vec![client.clone()]).unwrap();
    let g = redlock.mutex("ext-redlock").unwrap().lock().await.unwrap();
    invalid("redlock guard", g.extend(Duration::MAX).await);
    assert!(g.is_held());
    g.release().await.unwrap();
}

// ---------------------------------------------------------------------------------
// 2. A waiter in the same client is bounded by the local holder's lease.
// ---------------------------------------------------------------------------------

const SHORT: Duration = Duration::from_secs(1);

fn short_lease() -> LeaseOptions {
    LeaseOptions::new().ttl(SHORT).auto_renew(false)
}

/// Client A holds a 1 s lease it never renews, and keeps the guard. Another task of A,
/// queued locally behind it, gets the lock about when that lease runs out — not at its
/// own 4 s timeout — and never while the lease is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_gets_the_lock_when_the_local_holders_lease_runs_out() {
    let server = server();
    let a = client(&server.url()).await;
    let mut conn = raw(&server).await;
    // Both handles name the same lock, so they share client A's local queue; the
    // waiter's handle has a long, renewed lease so that what it holds afterwards can be
    // checked at leisure.
    let short = a.mutex_with("bounded", short_lease()).unwrap();
    let long = a.mutex("bounded").unwrap();
    let long_ttl = long.options().ttl;
    let g1 = short.lock().await.unwrap();
    let since1 = lease_start_ms(&mut conn, "redlease:bounded", SHORT).await;

    let started = Instant::now();
    let waiter = tokio::spawn(async move {
        let result = long.lock_timeout(Duration::from_secs(4)).await;
        (result, Instant::now())
    });
    // Exclusion: the waiter does not get in while g1's lease is valid. (`finished` is
    // read first: a lease seen valid afterwards was valid then too — it is never
    // renewed.)
    within(10.0, "g1's lease runs out", async {
        loop {
            let finished = waiter.is_finished();
            if !g1.is_held() {
                break;
            }
            assert!(!finished, "the local waiter got in while g1's lease was valid");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let (result, acquired_at) = join(10.0, "the local waiter", waiter).await;
    let g2 = result.expect("the local waiter acquires once g1's lease ran out");
    let waited = acquired_at - started;
    assert!(
        waited < Duration::from_secs(3),
        "bounded by g1's 1 s lease, not by its own 4 s timeout: {waited:?}"
    );
    assert!(
        acquired_at >= g1.valid_until(),
        "acquired before g1's lease ended"
    );
    assert!(g2.fence() > g1.fence());
    let since2 = lease_start_ms(&mut conn, "redlease:bounded", long_ttl).await;
    assert!(
        since2 - since1 >= SHORT.as_millis() as i64 - 10,
        "Redis kept g1's lease for its full TTL before the waiter took it: {since1} -> {since2}"
    );

    // g1 no longer holds anything, and its release does not touch the new holder.
    let err = g1.release().await.expect_err("g1's lease ran out");
    assert!(err.is_not_held(), "{err:?}");
    assert!(g2.is_held());
    assert_eq!(
        get(&mut conn, "redlease:bounded").await.as_deref(),
        Some(g2.token().expose())
    );
    assert!(pttl(&mut conn, "redlease:bounded").await > 0);
    g2.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:bounded").await);
}

/// Once the local holder's lease ran out and Redis holds nothing, `try_lock` in the
/// same client goes to Redis and succeeds instead of reporting `Contended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_after_the_local_holders_lease_ran_out_acquires() {
    let server = server();
    let a = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let short = a.mutex_with("lapsed", short_lease()).unwrap();
    let long = a.mutex("lapsed").unwrap();
    let g1 = short.lock().await.unwrap();

    // While g1's lease is valid, nobody else of client A gets in.
    let early = long.try_lock().await;
    if g1.is_held() {
        let err = early.expect_err("g1's lease is valid");
        assert!(err.is_contended(), "{err:?}");
    } else {
        // The machine stalled for a whole second: nothing can be concluded.
        drop(early);
    }

    eventually(10.0, "g1's lease ran out and Redis dropped its key", || {
        let mut conn = conn.clone();
        let held = g1.is_held();
        async move { !held && !exists(&mut conn, "redlease:lapsed").await }
    })
    .await;
    let g2 = long
        .try_lock()
        .await
        .expect("the lock is free in Redis; g1's lease is over");
    assert!(g2.fence() > g1.fence());

    let err = g1.release().await.expect_err("g1's lease ran out");
    assert!(err.is_not_held(), "{err:?}");
    assert!(g2.is_held());
    assert_eq!(
        get(&mut conn, "redlease:lapsed").await.as_deref(),
        Some(g2.token().expose())
    );
    assert!(pttl(&mut conn, "redlease:lapsed").await > 0);
    g2.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:lapsed").await);
}

// ---------------------------------------------------------------------------------
// 3. Replica acknowledgement on every primitive.
// ---------------------------------------------------------------------------------

/// A master and `n` replicas in sync with it (as in tests/replicas.rs).
async fn replicated(n: usize) -> (RedisServer, Vec<RedisServer>) {
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
    eventually(30.0, "replicas in sync", || {
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
    // "online" comes before a fresh replica's first ACK: wait until one is seen.
    eventually(30.0, "replicas acknowledge writes", || {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_reports_the_replicas_that_acknowledged() {
    let (master, replicas) = replicated(1).await;
    let client = client(&master.url()).await;
    let durable = LeaseOptions::new().wait_replicas(1);

    let fair = client.fair_mutex_with("acked-fair", durable).unwrap();
    let g = fair.try_lock().await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "fair mutex");
    let mut replica = raw(&replicas[0]).await;
    assert_eq!(
        get(&mut replica, "redlease:acked-fair").await.as_deref(),
        Some(g.token().expose()),
        "the acknowledged lock is on the replica"
    );
    g.release().await.unwrap();
    let g = fair.lock_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "fair mutex, waiting");
    g.release().await.unwrap();

    let rw = client.rwlock_with("acked-rw", durable).unwrap();
    let g = rw.try_write().await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "write lock");
    g.release().await.unwrap();
    let g = rw.write_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "write lock, waiting");
    g.release().await.unwrap();
    let g = rw.try_read().await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "read share");
    g.release().await.unwrap();
    let g = rw.read_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "read share, waiting");
    g.release().await.unwrap();

    let sem = client.semaphore_with("acked-sem", 2, durable).unwrap();
    let g = sem.try_acquire().await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "permit");
    g.release().await.unwrap();
    let g = sem.acquire_many_timeout(2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.replicas_acked(), Some(1), "permits, waiting");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_releases_on_a_replica_shortfall() {
    let (master, _replicas) = replicated(1).await;
    let client = client(&master.url()).await;
    let mut conn = raw(&master).await;
    let too_many = LeaseOptions::new().wait_replicas(2);
    fn shortfall<T: std::fmt::Debug>(what: &str, result: redlease::Result<T>) {
        match result {
            Err(Error::NotReplicated { acked, wanted, .. }) => {
                assert_eq!((acked, wanted), (1, 2), "{what}")
            }
            other => panic!("{what}: expected NotReplicated, got {other:?}"),
        }
    }

    let fair = client.fair_mutex_with("short-fair", too_many).unwrap();
    shortfall("fair try_lock", fair.try_lock().await);
    assert!(!exists(&mut conn, "redlease:short-fair").await, "fair: released");
    shortfall(
        "fair lock_timeout",
        fair.lock_timeout(Duration::from_secs(5)).await,
    );
    assert!(!exists(&mut conn, "redlease:short-fair").await, "fair: released");
    assert_eq!(zcard(&mut conn, "{redlease:short-fair}:queue").await, 0);

    let rw = client.rwlock_with("short-rw", too_many).unwrap();
    shortfall("try_write", rw.try_write().await);
    assert!(!exists(&mut conn, "redlease:short-rw").await, "write: released");
    shortfall("write_timeout", rw.write_timeout(Duration::from_secs(5)).await);
    assert!(!exists(&mut conn, "redlease:short-rw").await, "write: released");
    assert_eq!(zcard(&mut conn, "{redlease:short-rw}:writers").await, 0);
    shortfall("try_read", rw.try_read().await);
    assert_eq!(
        zcard(&mut conn, "{redlease:short-rw}:readers").await,
        0,
        "read: released"
    );
    shortfall("read_timeout", rw.read_timeout(Duration::from_secs(5)).await);
    assert_eq!(
        zcard(&mut conn, "{redlease:short-rw}:readers").await,
        0,
        "read: released"
    );

    let sem = client.semaphore_with("short-sem", 3, too_many).unwrap();
    shortfall("try_acquire", sem.try_acquire().await);
    assert_eq!(zcard(&mut conn, "redlease:short-sem").await, 0, "permit released");
    shortfall(
        "acquire_many_timeout",
        sem.acquire_many_timeout(2, Duration::from_secs(5)).await,
    );
    assert_eq!(
        zcard(&mut conn, "redlease:short-sem").await,
        0,
        "permits released"
    );
    assert_eq!(sem.status().await.unwrap().in_use, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_replica_policy() {
    let server = server();
    let redlock = Redlock::new(vec![client(&server.url()).await]).unwrap();
    let err = redlock
        .mutex_with("durable", LeaseOptions::new().wait_replicas(1))
        .expect_err("a Redlock does not wait for replicas");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.is_invalid_input(), "{err:?}");
    // Without the policy the same name is fine.
    redlock.mutex_with("durable", LeaseOptions::new()).unwrap();
}

// ---------------------------------------------------------------------------------
// 4. A fair acquire that fails on a key of the wrong type writes nothing.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrongtype_fair_acquire_does_not_prune_the_queue() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let (queue, alive) = ("{redlease:wrong}:queue", "{redlease:wrong}:alive");
    // A dead waiter: queued first, its deadline long past on Redis's clock.
    let dead = "00000000deadbeef:dead-host:1";
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(queue)
        .arg(1)
        .arg(dead)
        .ignore()
        .cmd("ZADD")
        .arg(alive)
        .arg(1)
        .arg(dead)
        .ignore()
        .cmd("LPUSH")
        .arg("redlease:wrong")
        .arg("x")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = (zset(&mut conn, queue).await, zset(&mut conn, alive).await);
    assert_eq!(before.0, vec![dead.to_owned(), "1".to_owned()]);
    let keys_before = all_keys(&mut conn).await;

    let fair = client.fair_mutex("wrong").unwrap();
    let err = fair.try_lock().await.expect_err("the lock key is a list");
    assert!(matches!(err, Error::WrongType { .. }), "try_lock: {err:?}");
    assert_eq!(
        (zset(&mut conn, queue).await, zset(&mut conn, alive).await),
        before,
        "try_lock changed the queue"
    );

    let err = within(
        10.0,
        "lock_timeout fails",
        fair.lock_timeout(Duration::from_secs(2)),
    )
    .await
    .expect_err("the lock key is a list");
    assert!(matches!(err, Error::WrongType { .. }), "lock_timeout: {err:?}");
    assert_eq!(
        (zset(&mut conn, queue).await, zset(&mut conn, alive).await),
        before,
        "lock_timeout changed the queue"
    );
    assert_eq!(
        all_keys(&mut conn).await,
        keys_before,
        "no key was created or removed"
    );
    let list: Vec<String> = redis::cmd("LRANGE")
        .arg("redlease:wrong")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(list, vec!["x".to_owned()]);
}

// ---------------------------------------------------------------------------------
// 5. Waiter TTLs are capped at the lease TTL.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_ttls_are_capped_at_the_lease_ttl() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    let two = LeaseOptions::new().ttl(Duration::from_secs(2));
    let long = Duration::from_secs(60);

    let fair = b
        .fair_mutex_with("cap-fair", two)
        .unwrap()
        .with_waiter_ttl(long)
        .unwrap();
    assert_eq!(fair.waiter_ttl(), Duration::from_secs(2));
    let rw = b
        .rwlock_with("cap-rw", two)
        .unwrap()
        .with_waiter_ttl(long)
        .unwrap();
    assert_eq!(rw.waiter_ttl(), Duration::from_secs(2));

    // And the cap is what goes to Redis: a queued waiter's deadline is at most 2 s out.
    let held = a.fair_mutex_with("cap-fair", two).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock_timeout(Duration::from_secs(20)).await }
    });
    until_waiting(&waiter, "the fair waiter queues", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:cap-fair}:alive").await == 1 }
    })
    .await;
    let deadline: Vec<String> = zset(&mut conn, "{redlease:cap-fair}:alive").await;
    let now = server_ms(&mut conn).await;
    let ahead = deadline[1].parse::<f64>().unwrap() as i64 - now;
    assert!(ahead <= 2_000, "the fair waiter's entry lives {ahead} ms");
    held.release().await.unwrap();
    join(15.0, "the fair waiter", waiter)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let reading = a.rwlock_with("cap-rw", two).unwrap().read().await.unwrap();
    let writer = tokio::spawn({
        let rw = rw.clone();
        async move { rw.write_timeout(Duration::from_secs(20)).await }
    });
    until_waiting(&writer, "the writer registers", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:cap-rw}:writers").await == 1 }
    })
    .await;
    let deadline: Vec<String> = zset(&mut conn, "{redlease:cap-rw}:writers").await;
    let now = server_ms(&mut conn).await;
    let ahead = deadline[1].parse::<f64>().unwrap() as i64 - now;
    assert!(ahead <= 2_000, "the writer's registration lives {ahead} ms");
    reading.release().await.unwrap();
    join(15.0, "the writer", writer)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------
// 6. A semaphore released by token gives back every permit of the acquisition.
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_token_gives_back_every_permit_of_the_acquisition() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let sem = client.semaphore("by-token", 5).unwrap();
    let other = sem.acquire().await.unwrap();
    let token = sem.acquire_many(3).await.unwrap().forget();
    assert_eq!(zcard(&mut conn, "redlease:by-token").await, 4);
    sem.release_token(&token).await.unwrap();
    assert_eq!(
        zcard(&mut conn, "redlease:by-token").await,
        1,
        "all three permits of the token came back; the other acquisition's stays"
    );
    assert_eq!(sem.status().await.unwrap().in_use, 1);
    let err = sem.release_token(&token).await.expect_err("already released");
    assert!(err.is_not_held(), "{err:?}");
    assert!(other.is_held());
    other.release().await.unwrap();
    assert_eq!(
        zcard(&mut conn, "redlease:by-token").await,
        0,
        "the permit set is empty"
    );
}
