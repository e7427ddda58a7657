//! The semaphore against a real redis-server: the limit under contention, expiring
//! permits, multi-permit acquisition, the limit contract, wake-ups, faults, cancellation.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redlease::{LeaseOptions, LostReason};

async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_holders_and_all_n_are_used() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    const N: u32 = 4;
    const TASKS: usize = 32;
    const ROUNDS: usize = 4;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let sem = clients[t % 2].semaphore("pool", N).unwrap();
        let (inside, max_inside) = (inside.clone(), max_inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let permit = sem.acquire().await.expect("acquire");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        within(120.0, "every task finishes", t).await.unwrap();
    }
    let max = max_inside.load(Ordering::SeqCst);
    assert!(max <= N as usize, "{max} holders of {N} permits");
    assert_eq!(max, N as usize, "the {N} permits were never all used at once");
    let mut conn = raw(&server).await;
    // (Permits handed to waiters drew marks from the slot's fencing counter, which
    // expires by itself.)
    assert!(
        keys_but_fencing(&mut conn).await.is_empty(),
        "nothing is left behind"
    );
}

/// A holder that stops renewing (crashed, hung, cut off) loses its permit within its
/// TTL, on Redis's clock, and a waiter gets it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back_within_its_ttl() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(600);
    let sem = client
        .semaphore_with("reclaim", 1, LeaseOptions::new().ttl(ttl))
        .unwrap();
    let permit = sem.acquire().await.unwrap();
    let _token = permit.forget(); // no more renewals, no release
    let crashed = Instant::now();
    assert!(sem.try_acquire().await.unwrap_err().is_contended());
    let status = sem.status().await.unwrap();
    assert_eq!((status.in_use, status.available), (1, 0));
    let next = within(5.0, "the permit comes back", sem.acquire()).await.unwrap();
    let waited = crashed.elapsed();
    eprintln!("a crashed holder's permit came back after {waited:?} (ttl {ttl:?})");
    assert!(waited >= ttl / 2, "the permit was not held: {waited:?}");
    assert!(waited <= ttl + Duration::from_millis(300), "{waited:?}");
    next.release().await.unwrap();

    // The same when the holder's whole runtime dies while holding.
    let url = server.url();
    let holder = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let permit = rt.block_on(async move {
            let client = common::client(&url).await;
            let sem = client
                .semaphore_with("reclaim", 1, LeaseOptions::new().ttl(ttl))
                .unwrap();
            sem.acquire().await.unwrap()
        });
        rt.shutdown_background();
        drop(permit); // outside any runtime: nothing can release it
        Instant::now()
    });
    let died = holder.join().unwrap();
    assert!(sem.try_acquire().await.unwrap_err().is_contended());
    let next = within(5.0, "the permit comes back", sem.acquire()).await.unwrap();
    assert!(died.elapsed() <= ttl + Duration::from_millis(300));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_permits_are_taken_all_or_nothing() {
    let server = server();
    let client = client(&server.url()).await;
    let sem = client.semaphore("many", 5).unwrap();
    let mut conn = raw(&server).await;
    let three = sem.acquire_many(3).await.unwrap();
    assert_eq!(three.permits(), 3);
    assert_eq!(zcard(&mut conn, "redlease:many").await, 3);
    let err = sem.try_acquire_many(3).await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert_eq!(zcard(&mut conn, "redlease:many").await, 3, "none taken");
    let two = sem.try_acquire_many(2).await.unwrap();
    let status = sem.status().await.unwrap();
    assert_eq!((status.limit, status.in_use, status.available), (5, 5, 0));
    assert!(status.next_lapse.unwrap() > Duration::from_secs(25));

    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_many_timeout(4, Duration::from_secs(5)).await }
    });
    eventually(5.0, "the 4-permit waiter registers", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:many}:waiters").await == 1 }
    })
    .await;
    two.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "2 free permits are not 4");
    three.release().await.unwrap();
    let four = within(5.0, "4 permits", waiter).await.unwrap().unwrap();
    assert_eq!(zcard(&mut conn, "redlease:many").await, 4);
    let token = four.forget();
    sem.release_token(&token).await.unwrap();
    assert_eq!(
        zcard(&mut conn, "redlease:many").await,
        0,
        "every permit of the token went"
    );
    assert!(sem.release_token(&token).await.unwrap_err().is_not_held());
    assert!(!exists(&mut conn, "redlease:many").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_limit_is_a_typed_error_while_permits_are_held() {
    let server = server();
    let client = client(&server.url()).await;
    let three = client.semaphore("limited", 3).unwrap();
    let five = client.semaphore("limited", 5).unwrap();
    let mut conn = raw(&server).await;
    let permit = three.acquire().await.unwrap();
    for result in [
        five.try_acquire().await,
        five.acquire_timeout(Duration::from_secs(1)).await,
    ] {
        match result.unwrap_err() {
            redlease::Error::LimitMismatch {
                name,
                limit,
                existing,
            } => {
                assert_eq!((name.as_str(), limit, existing), ("limited", 5, 3));
            }
            other => panic!("expected LimitMismatch, got {other:?}"),
        }
    }
    let err = five.try_acquire().await.unwrap_err();
    assert!(err.to_string().contains("limit of 3 permits, not 5"), "{err}");
    assert_eq!(zcard(&mut conn, "redlease:limited").await, 1, "nothing changed");
    assert_eq!(
        five.status().await.unwrap().limit,
        3,
        "status shows the limit in force"
    );
    permit.release().await.unwrap();
    assert!(!exists(&mut conn, "{redlease:limited}:limit").await);
    // Idle now: the next acquisition's limit becomes the limit.
    let permit = five.acquire().await.unwrap();
    assert_eq!(
        get(&mut conn, "{redlease:limited}:limit").await.as_deref(),
        Some("5")
    );
    assert!(matches!(
        three.try_acquire().await.unwrap_err(),
        redlease::Error::LimitMismatch { existing: 5, .. }
    ));
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_anything_is_sent() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    for limit in [0, redlease::MAX_PERMITS + 1, u32::MAX] {
        let err = client.semaphore("bad", limit).unwrap_err();
        assert!(err.is_invalid_input(), "{limit}: {err}");
        assert!(err.to_string().contains("permit limit"), "{err}");
    }
    assert!(matches!(
        client.semaphore("", 1).unwrap_err(),
        redlease::Error::InvalidName { .. }
    ));
    assert!(
        client
            .semaphore_with("bad", 1, LeaseOptions::new().ttl(Duration::from_millis(5)))
            .unwrap_err()
            .is_invalid_input()
    );
    let sem = client.semaphore("bad", 3).unwrap();
    for n in [0, 4, u32::MAX] {
        let err = sem.try_acquire_many(n).await.unwrap_err();
        assert!(err.is_invalid_input(), "{n}: {err}");
        assert!(err.to_string().contains("number of permits"), "{err}");
        assert!(sem.acquire_many(n).await.unwrap_err().is_invalid_input());
    }
    let huge = client.semaphore("bad", 100_000).unwrap();
    let err = huge
        .try_acquire_many(redlease::MAX_PERMITS_PER_ACQUIRE + 1)
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    let permit = huge
        .try_acquire_many(redlease::MAX_PERMITS_PER_ACQUIRE)
        .await
        .unwrap();
    assert_eq!(
        zcard(&mut conn, "redlease:bad").await,
        u64::from(redlease::MAX_PERMITS_PER_ACQUIRE)
    );
    permit.release().await.unwrap();
    assert!(
        all_keys(&mut conn).await.is_empty(),
        "rejected calls wrote nothing"
    );

    // A key of another type: a clear error, nothing written.
    let _: () = redis::cmd("SET")
        .arg("redlease:typed")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = client
        .semaphore("typed", 2)
        .unwrap()
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
    assert_eq!(all_keys(&mut conn).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_without_polling() {
    let server = server();
    let holder_client = client(&server.url()).await;
    let waiter_client = client(&server.url()).await;
    // 30 s leases: a waiter that polled on the permits' TTL would wait up to 30 s.
    let holder = holder_client.semaphore("handoff", 2).unwrap();
    let waiter = waiter_client.semaphore("handoff", 2).unwrap();
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let both = holder.acquire_many(2).await.unwrap();
        let w = waiter.clone();
        let task = tokio::spawn(async move {
            let p = w.acquire().await.unwrap();
            let at = Instant::now();
            p.release().await.unwrap();
            at
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let released = Instant::now();
        both.release().await.unwrap();
        let acquired = within(5.0, "woken by the release", task).await.unwrap();
        latencies.push(acquired.saturating_duration_since(released));
    }
    latencies.sort();
    let p50 = percentile(&latencies, 0.5);
    eprintln!(
        "semaphore hand-off p50 {p50:?} max {:?}",
        latencies.last().unwrap()
    );
    assert!(p50 < Duration::from_millis(20), "hand-off p50 {p50:?}");
    assert!(*latencies.last().unwrap() < Duration::from_millis(500));
}

/// A release hands the freed permit to a waiter of another client: one request (the
/// release) and one message, and the waiter holds the permit without a request of its
/// own — nobody is woken to race for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_permit_to_a_registered_waiter_in_one_request() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let mut conn = raw(&server).await;
    // The slot's fencing counter has issued a token: a waiter's busy answer carries its
    // mark, against which a hand-over is known to be current. (Without any, the waiter
    // confirms the hand-over with a request of its own.)
    a.mutex("handed-mark")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let holder = a.semaphore("handed", 1).unwrap().acquire().await.unwrap();
    // From here on only the waiter runs scripts until the release: its attempts are
    // counted.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let waiting = b.semaphore("handed", 1).unwrap();
    let (got_tx, got_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn(async move {
        let permit = waiting.acquire().await.unwrap();
        got_tx.send(()).unwrap();
        done_rx.await.unwrap();
        permit.release().await.unwrap();
    });
    // The waiter registers, and its second look (sent once its wake-up subscription is
    // confirmed) has run before the release: only the release is counted below.
    eventually(5.0, "the waiter registers and looks again", || {
        let mut conn = conn.clone();
        async move {
            zcard(&mut conn, "{redlease:handed}:waiters").await == 1
                && command_calls(&mut conn, "evalsha").await >= 2
        }
    })
    .await;
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        2,
        "the waiter's two attempts"
    );
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    holder.release().await.unwrap();
    within(5.0, "the waiter holds the permit", got_rx).await.unwrap();
    assert_eq!(command_calls(&mut conn, "evalsha").await, 1, "the release alone");
    assert_eq!(command_calls(&mut conn, "publish").await, 1, "one message");
    assert_eq!(zcard(&mut conn, "redlease:handed").await, 1);
    done_tx.send(()).unwrap();
    within(5.0, "released", waiter).await.unwrap();
    assert!(keys_but_fencing(&mut conn).await.is_empty());
}

/// A registered waiter whose process dies is handed a permit it never takes: the
/// permit is back within the claim window (here the 600 ms lease), and the next waiter
/// gets it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_handed_to_a_dead_waiter_comes_back_within_the_claim() {
    let server = server();
    let ttl = Duration::from_millis(600);
    let options = LeaseOptions::new().ttl(ttl);
    let holder_client = client(&server.url()).await;
    let conn = raw(&server).await;
    let holder = holder_client
        .semaphore_with("doomed", 1, options)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // The doomed waiter runs on its own runtime in its own thread.
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let url = server.url();
    let doomed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = client(&url).await;
            let sem = client.semaphore_with("doomed", 1, options).unwrap();
            tokio::select! {
                _ = sem.acquire() => panic!("the doomed waiter must not get the permit"),
                _ = kill_rx => {}
            }
        });
        // The process "dies": its tasks never run again (no background clean-up).
        rt.shutdown_background();
    });
    eventually(5.0, "the doomed waiter registers", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:doomed}:waiters").await == 1 }
    })
    .await;
    let next_client = client(&server.url()).await;
    let next = tokio::spawn(async move {
        let sem = next_client.semaphore_with("doomed", 1, options).unwrap();
        let permit = sem.acquire().await.unwrap();
        let at = Instant::now();
        permit.release().await.unwrap();
        at
    });
    eventually(5.0, "the next waiter registers behind", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:doomed}:waiters").await == 2 }
    })
    .await;
    kill_tx.send(()).unwrap();
    doomed.join().unwrap();
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = within(10.0, "the next waiter gets the permit", next)
        .await
        .unwrap();
    let stall = acquired.duration_since(released);
    eprintln!("a permit handed to a dead waiter came back after {stall:?}");
    assert!(stall <= ttl + Duration::from_millis(300), "stalled {stall:?}");
}

/// One process waits for 2 permits and for 1; a single permit is freed. The waiter that
/// registered first needs 2 and cannot use it: the permit must reach the other at once
/// (the release hands it to the first registered waiter it fits; a wake-up the 2-permit
/// waiter could not use would be passed on) — never sit unused behind the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_the_woken_waiter_cannot_use_is_passed_on() {
    let server = server();
    let client = client(&server.url()).await;
    let sem = client.semaphore("mixed", 2).unwrap();
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    let wants_two = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_many_timeout(2, Duration::from_secs(10)).await }
    });
    let conn = raw(&server).await;
    let registered = async |n: u64| {
        eventually(5.0, &format!("{n} waiters registered"), || {
            let mut conn = conn.clone();
            async move { zcard(&mut conn, "{redlease:mixed}:waiters").await == n }
        })
        .await
    };
    registered(1).await;
    let wants_one = tokio::spawn({
        let sem = sem.clone();
        async move {
            let p = sem.acquire_timeout(Duration::from_secs(10)).await.unwrap();
            (Instant::now(), p)
        }
    });
    registered(2).await;
    let released = Instant::now();
    a.release().await.unwrap();
    let (acquired, one) = within(5.0, "the one-permit waiter is served", wants_one)
        .await
        .unwrap();
    let took = acquired.duration_since(released);
    assert!(
        took < Duration::from_millis(300),
        "the wake-up was swallowed: {took:?}"
    );
    assert!(!wants_two.is_finished());
    one.release().await.unwrap();
    b.release().await.unwrap();
    let two = within(5.0, "the two-permit waiter", wants_two)
        .await
        .unwrap()
        .unwrap();
    two.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_renew_extend_and_report_loss() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(300);
    let sem = client
        .semaphore_with("leased", 2, LeaseOptions::new().ttl(ttl))
        .unwrap();
    let mut conn = raw(&server).await;
    let permit = sem.acquire_many(2).await.unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(permit.is_held(), "renewal keeps the permits");
    assert!(sem.try_acquire().await.unwrap_err().is_contended());
    let keys = all_keys(&mut conn).await;
    assert_eq!(
        keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["redlease:leased", "{redlease:leased}:limit"]
    );
    assert!(keys.iter().all(|(_, t)| *t > 0 && *t <= 300), "{keys:?}");
    permit.extend(Duration::from_secs(60)).await.unwrap();
    assert!(pttl(&mut conn, "redlease:leased").await > 55_000);
    assert!(pttl(&mut conn, "{redlease:leased}:limit").await > 55_000);
    permit.extend(ttl).await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg("redlease:leased")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(within(2.0, "lost()", permit.lost()).await, LostReason::Gone);
    assert!(permit.release().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_or_dropped_acquisitions_leave_nothing() {
    let server = server();
    let client = client(&server.url()).await;
    let sem = client.semaphore("cancelled", 1).unwrap();
    let mut conn = raw(&server).await;
    let holder = sem.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    eventually(5.0, "the waiter registers", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:cancelled}:waiters").await == 1 }
    })
    .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    // Dropping the permit gives it back in the background.
    drop(holder);
    eventually(2.0, "background release", || {
        let mut conn = conn.clone();
        async move { keys_but_fencing(&mut conn).await.is_empty() }
    })
    .await;
    for delay_us in [0u64, 20, 50, 100, 200, 400, 800, 1600] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), sem.acquire_many(1)).await;
        eventually(2.0, "no orphan after cancellation", || {
            let mut conn = conn.clone();
            async move { keys_but_fencing(&mut conn).await.is_empty() }
        })
        .await;
    }
    let _ = &mut conn;
}

/// A lost reply under retry, for permits: the acquire lands, its reply is held past the client's
/// timeout; the retry must report the permits it holds, and hold them only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_reports_the_permits_it_already_took() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(3)).await;
    let sem = client.semaphore("retried", 3).unwrap();
    let mut conn = raw(&server).await;

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let sem = sem.clone();
        async move { sem.try_acquire_many(3).await }
    });
    eventually(2.0, "the permits are written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:retried").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    proxy.release_replies();
    let permit = within(5.0, "try_acquire_many returns", attempt)
        .await
        .unwrap()
        .expect("the retry finds its own permits, although none are free now");
    assert_eq!(zcard(&mut conn, "redlease:retried").await, 3, "held once");
    permit.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:retried").await);

    // When the reply never comes back in time, the permits are returned in the background.
    let hasty = impatient_client(
        &proxy.url(),
        Duration::from_millis(150),
        Duration::from_millis(400),
    )
    .await;
    let sem = hasty.semaphore("retried", 3).unwrap();
    proxy.hold_replies();
    let attempt = tokio::spawn(async move { sem.try_acquire().await });
    // It lands while its reply is held. (Observed before the attempt gives up: the
    // clean-up request it sends then is not held, only its reply.)
    eventually(2.0, "the permit is written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:retried").await }
    })
    .await;
    let err = within(5.0, "gives up", attempt).await.unwrap().unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    proxy.release_replies();
    eventually(5.0, "the orphan permit is released", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:retried").await }
    })
    .await;
}

async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

async fn deadline_left_ms(conn: &mut redis::aio::MultiplexedConnection, key: &str, member: &str) -> i64 {
    let score: f64 = redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(conn)
        .await
        .unwrap();
    score as i64 - server_ms(conn).await
}

/// A waiter's first attempt registers but its reply is lost; the retry (the same
/// request) finds a permit free and takes it. The registration must go with it: left
/// behind, the next release handed permits to it and rewrote the holder's deadline to
/// the 2 s claim window — the permit lapsed under a holder that believed it held for
/// its 30 s lease, and others took it (three holders of a 2-permit semaphore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_that_acquires_leaves_the_registration_its_lost_reply_made() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let mut conn = raw(&server).await;
    let a = client(&server.url()).await;
    let w = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(5)).await;

    let h1 = a.semaphore("s", 2).unwrap().acquire().await.unwrap();
    // A second holder that crashed: its 400 ms permit is not renewed.
    let short = a
        .semaphore_with(
            "s",
            2,
            LeaseOptions::new()
                .ttl(Duration::from_millis(400))
                .auto_renew(false),
        )
        .unwrap();
    let _ = short.acquire().await.unwrap().forget();

    // W's first attempt lands (busy: it registers) but its reply is held past the
    // client's timeout; its retries land after the crashed holder's permit lapsed.
    proxy.hold_replies();
    let sem_w = w.semaphore("s", 2).unwrap();
    let waiter = tokio::spawn(async move { sem_w.acquire().await });
    eventually(2.0, "W registered", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:s}:waiters").await == 1 }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.release_replies();
    let permit_w = within(6.0, "W acquires", waiter)
        .await
        .unwrap()
        .expect("W acquires");
    assert_eq!(zcard(&mut conn, "redlease:s").await, 2, "h1 and W hold");
    assert_eq!(
        zcard(&mut conn, "{redlease:s}:waiters").await,
        0,
        "W's registration went when it acquired"
    );
    let member = format!("{}:1", permit_w.token().expose());
    assert!(deadline_left_ms(&mut conn, "redlease:s", &member).await > 20_000);

    h1.release().await.unwrap();
    assert!(
        deadline_left_ms(&mut conn, "redlease:s", &member).await > 20_000,
        "a release leaves W's deadline alone"
    );
    // Past the claim window, one permit is free, not two.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let sem_b = client(&server.url()).await.semaphore("s", 2).unwrap();
    let b1 = sem_b.try_acquire().await.expect("the free permit");
    let err = sem_b.try_acquire().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert!(permit_w.is_held());
    b1.release().await.unwrap();
    permit_w.release().await.unwrap();
}

/// After the limit changed, a waiter of the old limit that gives up frees no room
/// beyond the limit in force: its release hands nothing out under its own, larger
/// limit (it handed permits to the other waiters of the old limit: three holders
/// under a limit of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_an_old_limit_that_gives_up_hands_out_nothing_past_the_new_one() {
    let server = server();
    let mut conn = raw(&server).await;
    // The old limit's client talks through a proxy that holds its requests while the
    // limit changes: a request it sent meanwhile would land after the change (and fail
    // the test with a limit mismatch instead of the waiter's timeout).
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let old = client(&proxy.url()).await;
    let new = client(&server.url()).await;
    // Start the fencing counter, so that busy replies carry a mark and a hand-over can
    // be relied on without a round trip.
    new.mutex("start")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // The old limit, 5: all five permits held (forgotten: nobody renews them, so the
    // waiter below is the only one to run scripts until the limit changes).
    let _ = old
        .semaphore("s", 5)
        .unwrap()
        .acquire_many(5)
        .await
        .unwrap()
        .forget();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The waiter that will give up. (Long enough for the limit to change first: it
    // must not have finished before then, which is checked below.)
    let sem5 = old.semaphore("s", 5).unwrap();
    let w5a = tokio::spawn({
        let s = sem5.clone();
        async move { s.acquire_timeout(Duration::from_secs(3)).await }
    });
    // It has settled: its first attempt registered, and its second (sent once its
    // wake-up subscription is confirmed) has run. After that it sends nothing until it
    // gives up. (Its registration alone does not tell: the second attempt could still
    // be on its way.)
    eventually(5.0, "the waiter registered and looked again", || {
        let mut conn = conn.clone();
        async move {
            zcard(&mut conn, "{redlease:s}:waiters").await == 1
                && command_calls(&mut conn, "evalsha").await >= 2
        }
    })
    .await;
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        2,
        "the waiter's two attempts, nothing else"
    );
    let w5a_registration = members(&conn, "{redlease:s}:waiters").await;
    // Two more waiters of the old limit, for one permit each, registered as other
    // processes' waiters would be (they do not look again by themselves): a release
    // under the old limit would hand them the room it frees.
    let others: Vec<String> = (1..=2)
        .map(|i| {
            format!(
                "{}{}1/5",
                format!("{i:x}").repeat(32),
                format!("c{i:x}").repeat(16)
            )
        })
        .collect();
    for reg in &others {
        let _: () = redis::cmd("ZADD")
            .arg("{redlease:s}:waiters")
            .arg(i64::MAX / 2)
            .arg(reg)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    proxy.hold_requests();
    // The old holder crashed and its permits lapsed (their deadlines moved to the past:
    // waiting out the lease would wake the waiters at the same moment).
    let lapse = async |conn: &mut redis::aio::MultiplexedConnection, members: &[String]| {
        for m in members {
            let _: i64 = redis::cmd("ZADD")
                .arg("redlease:s")
                .arg("XX")
                .arg(1)
                .arg(m)
                .query_async(conn)
                .await
                .unwrap();
        }
    };
    let held = members(&conn, "redlease:s").await;
    assert_eq!(held.len(), 5);
    lapse(&mut conn, &held).await;
    // The new limit, 2, takes over: one permit held, the other taken by a holder that
    // crashed at once (its permit lapsed, left unpruned).
    let sem2 = new.semaphore("s", 2).unwrap();
    let c2 = sem2.try_acquire().await.expect("the new limit takes over");
    let crashed = sem2.try_acquire().await.expect("the second permit of 2").forget();
    lapse(&mut conn, &[format!("{}:1", crashed.expose())]).await;
    assert!(!w5a.is_finished(), "the waiter gave up before the limit changed");
    proxy.release_requests();

    // w5a gives up; its release runs under limit 5 (in the background: it is done when
    // its registration is gone).
    let gave_up = within(10.0, "w5a times out", w5a).await.unwrap();
    let err = gave_up.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    eventually(5.0, "the give-up's release ran", || {
        let (conn, w5a_registration) = (conn.clone(), w5a_registration.clone());
        async move {
            let waiting = members(&conn, "{redlease:s}:waiters").await;
            !waiting.iter().any(|w| w5a_registration.contains(w))
        }
    })
    .await;
    assert_eq!(
        members(&conn, "redlease:s").await,
        vec![format!("{}:1", c2.token().expose())],
        "the new limit's holder alone (the lapsed permit pruned, nothing handed out)"
    );
    let mut waiting = members(&conn, "{redlease:s}:waiters").await;
    waiting.sort();
    assert_eq!(waiting, others, "the old limit's waiters were handed nothing");
    let status = sem2.status().await.unwrap();
    assert_eq!(status.limit, 2);
    assert!(status.in_use <= 2, "{status:?}");
    assert!(c2.is_held());
    c2.release().await.unwrap();
}

/// An acquisition that fails because a key it needs holds something else (here the
/// fencing counter, which hands lapsed permits to a registered waiter) leaves nothing
/// behind: no permit taken for a caller that was told it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_fails_on_a_corrupted_counter_takes_no_permit() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let sem = c.semaphore("broken", 3).unwrap();
    let short = c
        .semaphore_with(
            "broken",
            3,
            redlease::LeaseOptions::new()
                .ttl(Duration::from_millis(300))
                .auto_renew(false),
        )
        .unwrap();
    let kept = sem.acquire().await.unwrap();
    let lapsing = short.acquire().await.unwrap();
    // A waiter for one permit, registered as another client's would be (it will not
    // look again by itself).
    let registration = format!("{}{}1/3", "ab".repeat(16), "cd".repeat(16));
    let _: () = redis::cmd("ZADD")
        .arg("{redlease:broken}:waiters")
        .arg(i64::MAX / 2)
        .arg(&registration)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Lapsed on the server's clock (the client believes it a little less long).
    let lapsed_member = format!("{}:1", lapsing.token().expose());
    let _ = lapsing.forget();
    eventually(3.0, "the short permit lapsed on the server", || {
        let (mut conn, member) = (conn.clone(), lapsed_member.clone());
        async move {
            let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            let score: f64 = redis::cmd("ZSCORE")
                .arg("redlease:broken")
                .arg(&member)
                .query_async(&mut conn)
                .await
                .unwrap();
            score < (secs * 1000 + micros / 1000) as f64
        }
    })
    .await;
    // Someone wrote the fencing counter as a list.
    let _: () = redis::cmd("DEL")
        .arg("{redlease:fence}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("{redlease:fence}")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = sem.try_acquire().await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err}");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("redlease:broken")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        members,
        vec![format!("{}:1", kept.token().expose())],
        "the failed acquisition took a permit (or the lapsed one was not pruned)"
    );
    drop(kept);
}
