//! The semaphore's local queue at its edges: futures that are not polled, a queued task
//! that goes away while its hand-over is on the wire, a hand-over whose reply is lost,
//! permits freed without anyone being told, handles of other leases and limits.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlease::LeaseOptions;

/// With a task of `sem`'s client waiting in Redis and another queued behind it, releases
/// `held` (a permit of that client, whose connection goes through `proxy`) while the
/// proxy holds every reply back; returns once the hand-over to the queued task landed
/// in Redis: the task in Redis, the queued task and the release.
async fn hand_over_with_replies_held(
    conn: &redis::aio::MultiplexedConnection,
    proxy: &Proxy,
    sem: &redlease::Semaphore,
    held: redlease::Permit,
) -> (
    tokio::task::JoinHandle<redlease::Result<redlease::Permit>>,
    tokio::task::JoinHandle<redlease::Result<redlease::Permit>>,
    tokio::task::JoinHandle<redlease::Result<()>>,
) {
    let old = format!("{}:1", held.token().expose());
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    registered_and_subscribed(conn, sem, 1).await;
    let queued = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    until_waiters(sem, 2).await;
    proxy.hold_replies();
    let release = tokio::spawn(held.release());
    eventually(5.0, "the hand-over landed", || {
        let (conn, old, key) = (conn.clone(), old.clone(), sem.key().to_owned());
        async move {
            let m = members(&conn, &key).await;
            m.len() == 1 && m[0] != old
        }
    })
    .await;
    (in_redis, queued, release)
}

/// A task queued in its client whose future is not polled for a while (it sits in a
/// `select!` branch, say) is handed the permit by a local release. Nobody renews the
/// handed permit until the task is polled: it lapses, and another task takes it. When
/// the queued task is polled again, `acquire()` must not return `Ok` with a permit that
/// is not held (the Redis path never does: a grant it cannot rely on any more makes it
/// try again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_task_polled_late_gets_no_permit_that_lapsed_in_its_channel() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c
        .semaphore_with(
            "unpolled-handed",
            1,
            LeaseOptions::new().ttl(Duration::from_secs(1)),
        )
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    registered_and_subscribed(&conn, &sem, 1).await;
    let mut queued = acquiring(&sem);
    poll_until(&mut queued, until_waiters(&sem, 2)).await;
    // Handed to the queued task in one script.
    held.release().await.unwrap();
    // The handed permit is renewed by nobody: it lapses, and the task in Redis gets it.
    let other = within(6.0, "the task in Redis gets the lapsed permit", in_redis)
        .await
        .unwrap()
        .unwrap();
    assert!(other.is_held());
    match tokio::time::timeout(Duration::from_millis(500), &mut queued).await {
        Ok(Ok(late)) => assert!(
            late.is_held(),
            "acquire() returned Ok with a permit that is not held (it lapsed before it was \
             returned) while another task of the limit of 1 holds it (held: {})",
            other.is_held()
        ),
        Ok(Err(e)) => panic!("the queued task failed: {e}"),
        Err(_) => {
            // Still waiting, as it should: it gets the permit when the other gives it back.
            other.release().await.unwrap();
            let late = within(5.0, "the queued task", queued).await.unwrap();
            assert!(late.is_held());
        }
    }
}

/// The task that waits in Redis for its client is alive but not polled (a future kept
/// across loop iterations of a `select!`, say). A release through Redis grants it the
/// permit for a claim window; it does not take it up, the permit lapses and is free in
/// Redis. The client's other task, queued behind it, must get that free permit well
/// before its 8 s timeout, as a waiter registered in Redis would (a queued task looks at
/// Redis itself after a claim window without a hand-over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpolled_task_in_redis_does_not_hold_up_the_queue_while_permits_are_free() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    let lease = LeaseOptions::new().ttl(Duration::from_secs(2));
    let other_sem = other.semaphore_with("unpolled-rep", 1, lease).unwrap();
    let held = other_sem.acquire().await.unwrap();
    let sem = c.semaphore_with("unpolled-rep", 1, lease).unwrap();
    let mut in_redis = acquiring(&sem);
    poll_until(&mut in_redis, registered_and_subscribed(&conn, &sem, 1)).await;
    let queued = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_timeout(Duration::from_secs(8)).await }
    });
    until_waiters(&sem, 2).await;
    // Granted to the unpolled task's registration for its claim window (2 s), then free.
    held.release().await.unwrap();
    let got = within(10.0, "the queued task's answer", queued).await.unwrap();
    if let Err(e) = &got {
        let free = other_sem.try_acquire().await.map(|p| p.permits());
        panic!(
            "the queued task never got the permit ({e}); meanwhile another client's \
             try_acquire: {free:?}"
        );
    }
    drop(in_redis);
}

/// A queued task is cancelled while the hand-over to it is on the wire (its reply held
/// back). The permit that landed on its token must go on — here to the task waiting in
/// Redis — and nothing may be left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_task_cancelled_during_its_hand_over_leaves_the_permit_to_the_next() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let mut conn = raw(&server).await;
    let c = client(&proxy.url()).await;
    let sem = c.semaphore("cancel-handed", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let (in_redis, queued, release) = hand_over_with_replies_held(&conn, &proxy, &sem, held).await;
    queued.abort();
    assert!(queued.await.unwrap_err().is_cancelled());
    proxy.release_replies();
    within(5.0, "the release returns", release)
        .await
        .unwrap()
        .expect("the hand-over landed");
    let got = within(5.0, "the task in Redis gets the permit", in_redis)
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_held());
    assert_eq!(
        members(&conn, sem.key()).await,
        vec![format!("{}:1", got.token().expose())]
    );
    got.release().await.unwrap();
    eventually(5.0, "nothing left", || {
        let mut conn = conn.clone();
        let (key, waiters) = (sem.key().to_owned(), waiters_key(&sem));
        async move { zcard(&mut conn, &key).await == 0 && zcard(&mut conn, &waiters).await == 0 }
    })
    .await;
    assert_eq!(sem.status().await.unwrap().waiters, 0);
    assert_eq!(zcard(&mut conn, sem.key()).await, 0);
}

/// The hand-over lands but its reply never comes back within the retry window: the
/// releaser gets an error, and the queued task must still end up with exactly the one
/// permit (found on its own token through Redis), with nobody else holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_reply_is_lost_gives_the_queued_task_the_permit_once() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let conn = raw(&server).await;
    let c = impatient_client(
        &proxy.url(),
        Duration::from_millis(200),
        Duration::from_millis(600),
    )
    .await;
    let outsider = client(&server.url()).await;
    let sem = c.semaphore("lost-handoff", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let (in_redis, queued, release) = hand_over_with_replies_held(&conn, &proxy, &sem, held).await;
    let released = within(5.0, "the release gives up", release).await.unwrap();
    proxy.release_replies();
    let got = within(5.0, "the queued task", queued).await.unwrap().unwrap();
    assert!(got.is_held());
    assert_eq!(
        members(&conn, sem.key()).await,
        vec![format!("{}:1", got.token().expose())],
        "(the release said {released:?})"
    );
    let tried = outsider.semaphore("lost-handoff", 1).unwrap().try_acquire().await;
    assert!(
        matches!(tried, Err(redlease::Error::Contended { .. })),
        "{tried:?}"
    );
    assert!(!in_redis.is_finished());
    got.release().await.unwrap();
    let next = within(5.0, "the task in Redis", in_redis).await.unwrap().unwrap();
    next.release().await.unwrap();
    eventually(5.0, "nothing left", || {
        let mut conn = conn.clone();
        let (key, waiters) = (sem.key().to_owned(), waiters_key(&sem));
        async move { zcard(&mut conn, &key).await == 0 && zcard(&mut conn, &waiters).await == 0 }
    })
    .await;
}

/// `status().waiters` counts each waiting task once: the one registered in Redis and
/// those queued behind it; a hand-over takes exactly one off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_each_waiting_task_once() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("count", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    registered_and_subscribed(&conn, &sem, 1).await;
    let mut queued = Vec::new();
    for i in 0..3 {
        queued.push(tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire().await }
        }));
        until_waiters(&sem, 2 + i).await;
    }
    held.release().await.unwrap();
    let first = within(2.0, "the first queued task", queued.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sem.status().await.unwrap().waiters, 3);
    drop(first);
    for q in queued {
        within(5.0, "the next queued task", q)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    within(5.0, "the task in Redis", in_redis)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(sem.status().await.unwrap().waiters, 0);
}

/// Tasks of two clients on a semaphore of 3, through handles of different TTLs, wanting
/// 1 or 2 permits, some giving up after a short timeout, some dropping their permits:
/// never more than 3 permits held at once, every task finishes, nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_requests_handles_and_cancellations_never_exceed_the_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = server();
    let conn = raw(&server).await;
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..12usize {
        let ttl = Duration::from_millis(if i % 3 == 0 { 2000 } else { 5000 });
        let sem = clients[i % 2]
            .semaphore_with("mixed", 3, LeaseOptions::new().ttl(ttl))
            .unwrap();
        let (holding, most) = (holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..20usize {
                let n = if (i + round) % 4 == 0 { 2 } else { 1 };
                let got = if (i + round) % 5 == 0 {
                    match sem.acquire_many_timeout(n, Duration::from_millis(3)).await {
                        Ok(p) => p,
                        Err(e) if e.is_timeout() => continue,
                        Err(e) => panic!("{e}"),
                    }
                } else {
                    sem.acquire_many(n).await.unwrap()
                };
                let now = holding.fetch_add(n as usize, Ordering::SeqCst) + n as usize;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                assert!(got.is_held());
                holding.fetch_sub(n as usize, Ordering::SeqCst);
                if round % 3 == 2 {
                    drop(got);
                } else {
                    got.release().await.unwrap();
                }
            }
        }));
    }
    within(90.0, "every task's rounds", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        most.load(Ordering::SeqCst) <= 3,
        "{} permits held at once",
        most.load(Ordering::SeqCst)
    );
    eventually(5.0, "every permit given back and no registration left", || {
        let mut conn = conn.clone();
        async move {
            zcard(&mut conn, "redlease:mixed").await == 0
                && zcard(&mut conn, "{redlease:mixed}:waiters").await == 0
        }
    })
    .await;
    let sem = clients[0].semaphore("mixed", 3).unwrap();
    assert_eq!(sem.status().await.unwrap().waiters, 0);
}

/// A permit freed without a hand-out — released by token through a handle of another
/// limit, which "frees room but hands nothing out: the waiters of the limit in force
/// learn of it on their next attempt" — is free in Redis while the client's task there
/// sleeps until its next look (half its registration's life: 10 s). A new task of the
/// client asking for it with a 3 s timeout must not time out queued behind the sleeping
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_freed_without_a_hand_out_goes_to_a_new_task_of_the_client() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    let held = other.semaphore("quiet", 1).unwrap().acquire().await.unwrap();
    let sem = c.semaphore("quiet", 1).unwrap();
    let before = command_calls(&mut conn, "evalsha").await;
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    registered_and_subscribed(&conn, &sem, 1).await;
    // A waiter tries once more when its subscription is confirmed (a release may have
    // come in between): that attempt must have found the permit held, or it would take
    // the permit freed below (on a busy machine it can come late).
    eventually(5.0, "the waiter's attempt after subscribing", || {
        let mut conn = conn.clone();
        async move { command_calls(&mut conn, "evalsha").await >= before + 2 }
    })
    .await;
    let token = held.forget();
    other
        .semaphore("quiet", 5)
        .unwrap()
        .release_token(&token)
        .await
        .unwrap();
    assert_eq!(zcard(&mut conn, sem.key()).await, 0, "the permit is free");
    let got = within(
        5.0,
        "the new task's answer",
        sem.acquire_timeout(Duration::from_secs(3)),
    )
    .await;
    let permit = got.expect("a free permit, asked for by a new task of the client");
    assert!(permit.is_held());
    permit.release().await.unwrap();
    in_redis.abort();
}

/// A queued task is picked for a hand-over whose reply is held back past the claim
/// window after which a queued task looks at Redis itself. Picked, the task must wait
/// for what the hand-over sends — not go to Redis with the token the permit is being
/// moved to: the permit handed to a task that had gone would then be released under
/// the task that acquired with that same token, and another would get it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_picked_for_a_slow_hand_over_waits_for_it() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let conn = raw(&server).await;
    let c = client(&proxy.url()).await;
    // A claim window of 1 s: a queued task looks at Redis itself after 1 s.
    let sem = c
        .semaphore_with(
            "slow-hand-over",
            1,
            LeaseOptions::new().ttl(Duration::from_secs(1)),
        )
        .unwrap();
    let held = sem.acquire().await.unwrap();
    let (mut in_redis, queued, release) = hand_over_with_replies_held(&conn, &proxy, &sem, held).await;
    // Past the claim window: the picked task must still be waiting for its hand-over.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    proxy.release_replies();
    let _ = within(10.0, "the release returns", release).await;
    let got = within(10.0, "the queued task gets the permit", queued)
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_held());
    assert_eq!(
        members(&conn, sem.key()).await,
        vec![format!("{}:1", got.token().expose())],
        "the permit is the queued task's"
    );
    // Nobody else holds the permit of a limit of 1 while the queued task holds it. (The
    // task in Redis may come back with a lease that ran out while its reply was held
    // back: not held.)
    let other = tokio::time::timeout(Duration::from_millis(1500), &mut in_redis).await;
    if let Ok(Ok(Ok(permit))) = &other {
        assert!(
            !(permit.is_held() && got.is_held()),
            "the task in Redis and the queued task both hold the only permit"
        );
    }
    assert_eq!(
        members(&conn, sem.key()).await,
        vec![format!("{}:1", got.token().expose())],
        "the permit is still the queued task's"
    );
    assert!(got.is_held());
    got.release().await.unwrap();
    if other.is_err() {
        let last = within(5.0, "the task in Redis", in_redis).await.unwrap().unwrap();
        last.release().await.unwrap();
    }
}

/// A task that waited in its client's queue, then went on to Redis and timed out there,
/// reports the whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_after_the_local_queue_reports_the_whole_wait() {
    let server = server();
    let conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("waited", 1).unwrap();
    let held = sem.acquire().await.unwrap();
    let in_redis = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    registered_and_subscribed(&conn, &sem, 1).await;
    // Queued behind the task in Redis; after a claim window (2 s) it goes on to Redis,
    // where it times out.
    let started = Instant::now();
    let err = within(10.0, "the timeout", sem.acquire_timeout(Duration::from_secs(3)))
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
    within(5.0, "the task in Redis", in_redis)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}
