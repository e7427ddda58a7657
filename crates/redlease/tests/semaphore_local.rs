//! The semaphore's local queue: tasks of one client that want as many permits under the
//! same limit queue in the client behind the one that waits in Redis, and permits a task
//! of the client gives back go to the first of them in one request — moved to its own
//! token, with a fresh lease of its own.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redlease::LeaseOptions;

/// Starts a task of `sem`'s client that wants `n` permits and waits in Redis for them:
/// returns once it registered there and its client read the busy answer (it subscribed
/// to its client's wake-up channel, which a waiter does only after a busy answer).
async fn park_in_redis(
    conn: &redis::aio::MultiplexedConnection,
    sem: &redlease::Semaphore,
    n: u32,
) -> tokio::task::JoinHandle<redlease::Result<redlease::Permit>> {
    let task = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_many(n).await }
    });
    registered_and_subscribed(conn, sem, 1).await;
    task
}

/// Starts a task that acquires one permit of `sem` and returns once it is queued in
/// its client: the semaphore counts one waiter more, and no registration more.
async fn queue_locally(
    conn: &redis::aio::MultiplexedConnection,
    sem: &redlease::Semaphore,
    waiting_before: u64,
) -> tokio::task::JoinHandle<redlease::Result<redlease::Permit>> {
    let task = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    eventually(5.0, "the task queued in its client", || {
        let sem = sem.clone();
        async move { sem.status().await.unwrap().waiters == waiting_before + 1 }
    })
    .await;
    let mut conn = conn.clone();
    assert_eq!(
        zcard(&mut conn, &waiters_key(sem)).await,
        waiting_before,
        "the queued task did not register in Redis"
    );
    task
}

/// One task of `sem`'s client that waits in Redis for one permit, and one queued behind
/// it in the client.
async fn park_and_queue(
    conn: &redis::aio::MultiplexedConnection,
    sem: &redlease::Semaphore,
) -> (
    tokio::task::JoinHandle<redlease::Result<redlease::Permit>>,
    tokio::task::JoinHandle<redlease::Result<redlease::Permit>>,
) {
    let in_redis = park_in_redis(conn, sem, 1).await;
    (in_redis, queue_locally(conn, sem, 1).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_goes_to_a_queued_task_of_the_same_client_in_one_request_with_its_own_token() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("local", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let old = held.token().expose().to_owned();
    let old_lease = held.lease().clone();
    let (in_redis, queued) = park_and_queue(&conn, &sem).await;
    let scripts = command_calls(&mut conn, "evalsha").await;
    held.release().await.unwrap();
    let handed = within(2.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        command_calls(&mut conn, "evalsha").await - scripts,
        1,
        "one script hands the permit over"
    );
    assert!(handed.is_held());
    let new = handed.token().expose().to_owned();
    assert_ne!(new, old, "the permit moved to the task's own token");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(sem.key())
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members, vec![format!("{new}:1")]);
    assert!(!old_lease.is_held(), "the releaser's lease ended");
    assert!(!in_redis.is_finished(), "the task in Redis still waits");
    // With nobody queued, a permit goes back through Redis: to the task there.
    drop(handed);
    let got = within(5.0, "the task in Redis gets it", in_redis)
        .await
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
    assert_eq!(zcard(&mut conn, sem.key()).await, 0);
    assert_eq!(zcard(&mut conn, &waiters_key(&sem)).await, 0);
}

/// After a hand-over, the old holder's token holds nothing: a release with it (say, by
/// a supervisor that thinks the first job crashed) changes nothing, and nobody else
/// gets the permit of a limit of 1 while the new holder has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_token_holds_nothing_after_a_hand_over() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    let sem = c.semaphore("tok", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let old_token = held.token().clone();
    let (in_redis, queued) = park_and_queue(&conn, &sem).await;
    held.release().await.unwrap();
    let handed = within(2.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    let err = sem.release_token(&old_token).await.unwrap_err();
    assert!(matches!(err, redlease::Error::NotHeld { .. }), "{err}");
    let tried = other.semaphore("tok", 1).unwrap().try_acquire().await;
    assert!(
        matches!(tried, Err(redlease::Error::Contended { .. })),
        "{tried:?}"
    );
    assert!(handed.is_held());
    assert!(
        !in_redis.is_finished(),
        "the task in Redis got a permit held by another"
    );
    handed.release().await.unwrap();
    within(5.0, "the task in Redis", in_redis)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A handed permit is renewed as its new holder's handle says, not as the releaser's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_permit_keeps_the_lease_options_of_its_new_holder() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let ttl = Duration::from_secs(2);
    let manual = c
        .semaphore_with("opts", 1, LeaseOptions::new().ttl(ttl).auto_renew(false))
        .unwrap();
    let renewing = c
        .semaphore_with("opts", 1, LeaseOptions::new().ttl(ttl).auto_renew(true))
        .unwrap();
    let held = manual.acquire().await.unwrap();
    let (in_redis, queued) = park_and_queue(&conn, &renewing).await;
    held.release().await.unwrap();
    let handed = within(2.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    // Past the TTL: only a renewal keeps the permit.
    tokio::time::sleep(ttl + Duration::from_millis(700)).await;
    assert!(handed.is_held(), "a permit of an auto-renewing handle lapsed");
    assert!(!in_redis.is_finished(), "the task in Redis got the permit");
    handed.release().await.unwrap();
    within(5.0, "the task in Redis", in_redis)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A handed permit starts a full lease, however little the releaser had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_permit_starts_a_full_lease() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let ttl = Duration::from_secs(3);
    let sem = c
        .semaphore_with("spent", 1, LeaseOptions::new().ttl(ttl).auto_renew(false))
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = park_in_redis(&conn, &sem, 1).await;
    // Most of the releaser's lease is spent. (The task queues only now: a queued task
    // looks at Redis itself after a claim window, 2 s here, without a hand-over.)
    let spent_at = held.valid_until() - Duration::from_millis(600);
    tokio::time::sleep_until(spent_at.into()).await;
    let queued = queue_locally(&conn, &sem, 1).await;
    held.release().await.unwrap();
    let handed = within(2.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    let left = handed.valid_until().saturating_duration_since(Instant::now());
    assert!(
        left > ttl - Duration::from_millis(500),
        "a handed permit is valid for {left:?} only"
    );
    let score: f64 = redis::cmd("ZSCORE")
        .arg(sem.key())
        .arg(format!("{}:1", handed.token().expose()))
        .query_async(&mut conn)
        .await
        .unwrap();
    let now_ms: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let server_left = score - (now_ms.0 * 1000 + now_ms.1 / 1000) as f64;
    assert!(server_left > 2500.0, "the server holds it {server_left} ms more");
    handed.release().await.unwrap();
    in_redis.abort();
}

/// After `release()` handed the permit on, every clone of the releaser's lease says it
/// is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_releasers_lease_ends_with_the_hand_over() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("clone", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let lease = held.lease().clone();
    let (in_redis, queued) = park_and_queue(&conn, &sem).await;
    held.release().await.unwrap();
    let handed = within(2.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    within(1.0, "the releaser's lease ends", lease.lost()).await;
    assert!(!lease.is_held());
    handed.release().await.unwrap();
    in_redis.abort();
}

/// A task that wants fewer permits than a task of the same client waiting in Redis does
/// not queue behind it: it takes free permits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_for_fewer_permits_does_not_queue_behind_one_that_wants_more() {
    let server = server();
    let conn = raw(&server).await;
    let other = client(&server.url()).await;
    let c = client(&server.url()).await;
    let long_held = other.semaphore("big", 3).unwrap().acquire().await.unwrap();
    let sem = c.semaphore("big", 3).unwrap();
    let wants_all = park_in_redis(&conn, &sem, 3).await;
    assert_eq!(sem.status().await.unwrap().available, 2);
    let one = within(2.0, "one permit of the two free", sem.acquire())
        .await
        .unwrap();
    let two = within(2.0, "the other", sem.acquire()).await.unwrap();
    assert!(!wants_all.is_finished());
    drop((one, two, long_held));
    let all = within(5.0, "all three", wants_all).await.unwrap().unwrap();
    assert_eq!(all.permits(), 3);
    all.release().await.unwrap();
}

/// A handle of another limit does not queue behind a task of the same client: it is told
/// at once that permits are held under another limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_of_another_limit_does_not_queue_behind_a_task() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("lim", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = park_in_redis(&conn, &sem, 1).await;
    let other_limit = c.semaphore("lim", 2).unwrap();
    let err = within(
        2.0,
        "the answer",
        other_limit.acquire_timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            err,
            redlease::Error::LimitMismatch {
                limit: 2,
                existing: 1,
                ..
            }
        ),
        "{err}"
    );
    drop(held);
    let got = within(5.0, "the task in Redis", in_redis).await.unwrap().unwrap();
    got.release().await.unwrap();
}

/// A queued task that gives up leaves the queue; the next permit goes to the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_task_that_gives_up_leaves_the_queue() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("queue", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = park_in_redis(&conn, &sem, 1).await;
    let started = Instant::now();
    let err = sem.acquire_timeout(Duration::from_millis(200)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(sem.status().await.unwrap().waiters, 1, "it left the queue");
    let next = queue_locally(&conn, &sem, 1).await;
    held.release().await.unwrap();
    let got = within(2.0, "the next queued task", next).await.unwrap().unwrap();
    got.release().await.unwrap();
    let got = within(5.0, "the task in Redis", in_redis).await.unwrap().unwrap();
    got.release().await.unwrap();
    assert_eq!(zcard(&mut conn, sem.key()).await, 0);
    assert_eq!(zcard(&mut conn, &waiters_key(&sem)).await, 0);
}

/// A hand-over that finds the releaser's permits gone (released by token meanwhile)
/// fails with `NotHeld`, and the queued task it picked goes to Redis instead: it gets
/// the next permit from there, nobody is left waiting for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_of_permits_already_gone_sends_the_task_to_redis() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("gone", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let (in_redis, queued) = park_and_queue(&conn, &sem).await;
    // Released by token: Redis hands the permit to the task registered there.
    sem.release_token(held.token()).await.unwrap();
    let first = within(5.0, "the task in Redis", in_redis).await.unwrap().unwrap();
    let err = held.release().await.unwrap_err();
    assert!(matches!(err, redlease::Error::NotHeld { .. }), "{err}");
    // The queued task went to Redis and registered there.
    eventually(5.0, "the queued task registered", || {
        let (mut conn, key) = (conn.clone(), waiters_key(&sem));
        async move { zcard(&mut conn, &key).await == 1 }
    })
    .await;
    first.release().await.unwrap();
    let second = within(5.0, "the queued task", queued).await.unwrap().unwrap();
    second.release().await.unwrap();
    assert_eq!(zcard(&mut conn, sem.key()).await, 0);
}

/// Local hand-overs are bounded: a waiter in another process gets a permit while the
/// tasks of a busy client keep handing it to each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_overs_leave_other_processes_their_turn() {
    other_process_gets_a_permit_from_a_busy_client("shared", LeaseOptions::new()).await;
}

/// After 16 local hand-overs a permit goes back through Redis, to the registration with
/// the earliest deadline — its last attempt plus the registration's life. A waiter of
/// another process whose handle has a longer lease (120 s, against the busy client's
/// 30 s) must still get its turn (when the life grew with the lease, it never came
/// first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_overs_leave_a_process_with_a_longer_lease_its_turn() {
    let long = LeaseOptions::new().ttl(Duration::from_secs(120));
    other_process_gets_a_permit_from_a_busy_client("long-lease", long).await;
}

/// Four tasks of a busy client take and give back permit `name` (a limit of 1) in a
/// loop; a waiter of another client, with `options`, must get a permit within 10 s and
/// within one budget of local hand-overs and the round through Redis that follows,
/// twice (it may register just after a round).
async fn other_process_gets_a_permit_from_a_busy_client(name: &str, options: LeaseOptions) {
    let server = server();
    let busy = client(&server.url()).await;
    let other = client(&server.url()).await;
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let sem = busy.semaphore(name, 1).unwrap();
        let (acquisitions, stop) = (acquisitions.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let permit = sem.acquire().await.unwrap();
                acquisitions.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                permit.release().await.unwrap();
            }
        }));
    }
    eventually(5.0, "the busy client is going", || async {
        acquisitions.load(Ordering::SeqCst) > 20
    })
    .await;
    let at = acquisitions.load(Ordering::SeqCst);
    let sem = other.semaphore_with(name, 1, options).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), sem.acquire()).await;
    let waited_for = acquisitions.load(Ordering::SeqCst) - at;
    stop.store(true, Ordering::SeqCst);
    let permit = got
        .unwrap_or_else(|_| {
            panic!("the other process got no permit in 10 s ({waited_for} local acquisitions)")
        })
        .unwrap();
    permit.release().await.unwrap();
    within(10.0, "the busy client's tasks stop", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        waited_for <= 40,
        "the other process waited for {waited_for} acquisitions"
    );
}

/// Many tasks of two clients on a semaphore of 2: never more than 2 hold at once, every
/// acquisition is released, and nothing is left in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_holders_than_permits_with_local_hand_overs() {
    let server = server();
    let mut conn = raw(&server).await;
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let sem = clients[i % 2].semaphore("pair", 2).unwrap();
        let (holding, most, done) = (holding.clone(), most.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25 {
                let permit = sem.acquire().await.unwrap();
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                assert!(permit.is_held());
                holding.fetch_sub(1, Ordering::SeqCst);
                if round % 5 == 4 {
                    drop(permit); // handed on or released in the background
                } else {
                    permit.release().await.unwrap();
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    within(60.0, "every task's rounds", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert_eq!(done.load(Ordering::SeqCst), 300);
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "{} held at once",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(most.load(Ordering::SeqCst), 2, "the permits were used");
    eventually(5.0, "every permit given back", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "redlease:pair").await == 0 }
    })
    .await;
    assert_eq!(zcard(&mut conn, "{redlease:pair}:waiters").await, 0);
}
