//! Real faults: replies held back past the client timeout, connections cut, the server
//! paused, flushed, restarted, or read-only.

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlease::{LeaseOptions, LostReason};

/// A lost reply under retry: the SET lands, its reply is late, the client times out and retries. The
/// retry must see its own token and report success — never "failed" while holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_then_retry_reports_the_lock_we_hold() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(3)).await;
    let mutex = client.mutex("lost-reply").unwrap();
    let mut conn = raw(&server).await;

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.try_lock().await }
    });
    // The SET reaches Redis even though its reply does not reach the client.
    eventually(2.0, "the lock key is written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:lost-reply").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await; // past the 200 ms reply timeout
    proxy.release_replies();
    let guard = within(5.0, "try_lock returns", attempt)
        .await
        .unwrap()
        .expect("the retry finds our own token");
    assert_eq!(
        get(&mut conn, "redlease:lost-reply").await.as_deref(),
        Some(guard.token().expose())
    );
    let fence = guard.fence();
    let status = mutex.status().await.unwrap();
    assert_mark(
        status.last_fence,
        fence,
        "the retry reports the fence it was given",
    );
    guard.release().await.unwrap();
    assert!(!exists(&mut conn, "redlease:lost-reply").await);
}

/// The reply never comes back within the retry window: the caller gets an error, and
/// the lock it may have taken is removed in the background once Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_without_recovery_leaves_no_orphan() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(
        &proxy.url(),
        Duration::from_millis(150),
        Duration::from_millis(400),
    )
    .await;
    let mutex = client.mutex("orphan").unwrap();
    let mut conn = raw(&server).await;

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.try_lock().await }
    });
    eventually(2.0, "the SET lands while its reply is held", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:orphan").await }
    })
    .await;
    // Requests still flow while replies are held, so the background clean-up would
    // land at once: hold it back too, to see the orphan survive the caller's error.
    proxy.hold_requests();
    let err = within(5.0, "try_lock gives up", attempt)
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_unavailable(), "expected a timeout-class error, got {err}");
    assert!(
        exists(&mut conn, "redlease:orphan").await,
        "the lock the failed attempt took is still there"
    );
    proxy.release_requests();
    proxy.release_replies();
    eventually(5.0, "the orphan is compare-and-deleted", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:orphan").await }
    })
    .await;
    // And the lock is usable again.
    let guard = within(5.0, "lock after recovery", mutex.lock()).await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_acquire_never_leave_a_false_result() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(300), Duration::from_secs(3)).await;
    let mutex = client.mutex("cut").unwrap();
    let mut conn = raw(&server).await;
    for round in 0..20 {
        proxy.set_delay(Duration::from_millis(5));
        let attempt = tokio::spawn({
            let mutex = mutex.clone();
            async move { mutex.try_lock().await }
        });
        tokio::time::sleep(Duration::from_millis(3 + round % 5)).await;
        proxy.cut();
        proxy.set_delay(Duration::ZERO);
        match within(10.0, "try_lock after cut", attempt).await.unwrap() {
            Ok(guard) => {
                assert_eq!(
                    get(&mut conn, "redlease:cut").await.as_deref(),
                    Some(guard.token().expose()),
                    "round {round}: acquired, so the key must hold our token"
                );
                guard.release().await.unwrap();
            }
            Err(err) => assert!(err.is_unavailable(), "round {round}: {err}"),
        }
        eventually(5.0, "no orphan after the round", || {
            let mut conn = conn.clone();
            async move { !exists(&mut conn, "redlease:cut").await }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_the_lease_expire_on_the_client_first() {
    let server = server();
    let client = impatient_client(
        &server.url(),
        Duration::from_millis(100),
        Duration::from_millis(200),
    )
    .await;
    let ttl = Duration::from_millis(600);
    let mutex = client.mutex_with("paused", LeaseOptions::new().ttl(ttl)).unwrap();
    let guard = mutex.lock().await.unwrap();
    let valid_until = guard.valid_until();
    server.pause();
    let paused = Instant::now();
    let reason = within(3.0, "lost() while the server is frozen", guard.lost()).await;
    let fired = Instant::now();
    server.resume();
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_held());
    // The renewal task counts the lease it could not confirm in time, whoever noticed
    // first that it ran out.
    eventually(5.0, "the lost lease counted", || {
        let lost = client.stats().leases_lost_by_renewal;
        async move { lost == 1 }
    })
    .await;
    // The holder stopped believing in its lease before the lease could have ended on the
    // server (is_held() turns false at valid_until), and was told promptly after: the
    // margin only absorbs this process being scheduled late on a busy machine.
    assert!(
        valid_until <= paused + ttl,
        "valid_until past the server's expiry"
    );
    assert!(
        fired <= valid_until + Duration::from_millis(500),
        "lost() fired {:?} after valid_until",
        fired - valid_until
    );
    assert!(
        fired + Duration::from_millis(50) >= valid_until,
        "fired before valid_until"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_after_script_flush_is_reloaded_for_every_operation() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(300);
    let mutex = client
        .mutex_with("flushed", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let mut conn = raw(&server).await;
    let flush = |mut conn: redis::aio::MultiplexedConnection| async move {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    };
    flush(conn.clone()).await;
    let guard = mutex.lock().await.expect("acquire reloads its script");
    flush(conn.clone()).await;
    // Renewal runs through a pipeline; it must reload too.
    tokio::time::sleep(ttl * 3).await;
    assert!(guard.is_held(), "renewal survived SCRIPT FLUSH");
    flush(conn.clone()).await;
    guard
        .extend(Duration::from_secs(5))
        .await
        .expect("extend reloads");
    flush(conn.clone()).await;
    mutex.status().await.expect("status reloads");
    flush(conn.clone()).await;
    guard.release().await.expect("release reloads");
    assert!(!exists(&mut conn, "redlease:flushed").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrongtype_at_the_key_is_a_clear_error_and_changes_nothing() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("RPUSH")
        .arg("redlease:listy")
        .arg("a")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mutex = client.mutex("listy").unwrap();
    for result in [mutex.try_lock().await.map(|_| ()), mutex.lock().await.map(|_| ())] {
        let err = result.unwrap_err();
        assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
        assert!(err.to_string().contains("listy"), "{err}");
    }
    let err = mutex.status().await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
    // A fencing counter of a different type is caught before any write, too. (Its
    // name is found from the floor an acquisition leaves behind.)
    let metaless = client.mutex("metaless").unwrap();
    metaless.try_lock().await.unwrap().release().await.unwrap();
    let keys = all_keys(&mut conn).await;
    let floor = keys
        .iter()
        .map(|(k, _)| k.clone())
        .find(|k| k.starts_with("{redlease:fence") && k.ends_with("}:floor"))
        .unwrap_or_else(|| panic!("a fencing floor: {keys:?}"));
    let counter = floor.strip_suffix(":floor").unwrap().to_owned();
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(&counter)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = metaless.try_lock().await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
    // A lock the attempt may have written is compare-and-deleted — at once, or in the
    // background when the error came back some other way — well within its 30 s TTL.
    eventually(2.0, "no half-written lock", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:metaless").await }
    })
    .await;
    let names: Vec<String> = all_keys(&mut conn).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        names,
        ["redlease:listy".to_owned(), counter.clone(), floor.clone()],
        "nothing else was written"
    );

    // A garbled floor of the right type is replaced: the fence starts again from TIME.
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&floor)
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .unwrap();
    let guard = metaless.try_lock().await.unwrap();
    assert!(
        guard.fence().get() > 1_700_000_000_000_000,
        "fence from server time: {}",
        guard.fence()
    );
    let written: u64 = get(&mut conn, &floor).await.unwrap().parse().unwrap();
    assert_eq!(
        written,
        guard.fence().get() + 100_000,
        "the floor is one counter life ahead"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_refuses_clearly() {
    let primary = server();
    let replica = RedisServer::builder()
        .arg("replicaof", format!("127.0.0.1 {}", primary.port()))
        .start()
        .unwrap();
    let client = client(&replica.url()).await;
    let err = client.mutex("replicated").unwrap().try_lock().await.unwrap_err();
    assert!(matches!(err, redlease::Error::ReadOnly { .. }), "{err:?}");
    assert!(err.to_string().contains("read-only replica"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_clear_error() {
    let port = redlease_testkit::free_port();
    let err = redlease::Client::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("cannot connect"), "{err}");
    let err = redlease::Client::connect("not a url").await.unwrap_err();
    assert!(matches!(err, redlease::Error::Config { .. }), "{err:?}");

    // A server that goes away after the client connected.
    let mut server = server();
    let client = impatient_client(
        &server.url(),
        Duration::from_millis(200),
        Duration::from_millis(300),
    )
    .await;
    let mutex = client.mutex("gone").unwrap();
    server.stop();
    let started = Instant::now();
    let err = within(5.0, "try_lock fails", mutex.try_lock()).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "failed within the retry window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_survives_a_server_restart() {
    let mut server = server();
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let held = holder
        .mutex_with("restart-wait", LeaseOptions::new().ttl(Duration::from_secs(3)))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let task = tokio::spawn({
        let mutex = waiter.mutex("restart-wait").unwrap();
        async move { mutex.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart().unwrap(); // comes back empty: the lock is gone
    let started = Instant::now();
    let guard = within(10.0, "the waiter acquires after the restart", task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by the reconnect, not the 30 s TTL"
    );
    assert_eq!(held.lost().await, LostReason::Gone);
    guard.release().await.unwrap();
}

/// A release whose reply is lost still released the lock — and woke the next waiter,
/// which took it before the retried release arrived. The retry finds another holder,
/// but the lease was valid all along: the release must be reported as done, not as
/// "not held" (which tells the caller its work may have overlapped another holder's).
/// Found by the torture run under `conn-reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_is_not_reported_as_lost_after_a_handoff() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let holder = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(5)).await;
    let waiter = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let guard = holder.mutex("handoff").unwrap().lock().await.unwrap();
    let waiting = tokio::spawn({
        let mutex = waiter.mutex("handoff").unwrap();
        async move { mutex.lock().await }
    });
    eventually(5.0, "the waiter subscribes", || {
        let mut conn = conn.clone();
        async move {
            let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("{redlease:handoff}:wake")
                .query_async(&mut conn)
                .await
                .unwrap();
            subs[0].1 == 1
        }
    })
    .await;

    proxy.hold_replies();
    let release = tokio::spawn(guard.release());
    let next = within(5.0, "the waiter takes over", waiting)
        .await
        .unwrap()
        .unwrap();
    // Past the holder's 200 ms reply timeout: its release is retried and finds the waiter.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.release_replies();
    let released = within(5.0, "release returns", release).await.unwrap();
    assert!(
        released.is_ok(),
        "a release that succeeded, with its reply lost, reported {released:?}"
    );
    assert_eq!(
        get(&mut conn, "redlease:handoff").await.as_deref(),
        Some(next.token().expose())
    );
    next.release().await.unwrap();
}

/// `BUSY` replies from the server while another application's Lua script runs past
/// `busy-reply-threshold`. A `BUSY` request was not run, and the server will answer
/// again when the script ends or is killed: an acquisition retries it within the retry
/// window instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_rides_out_a_busy_script() {
    use redlease_testkit::Proxy;
    let server = RedisServer::builder()
        .arg("busy-reply-threshold", "50")
        .start()
        .unwrap();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_secs(2), Duration::from_secs(10)).await;
    let mut probe = raw(&server).await;
    let busy_replies = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_BUSY:count="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for round in 0..5 {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut probe)
            .await
            .unwrap();
        // The acquisition's first request waits in the proxy until the server is busy.
        proxy.hold_requests();
        let mutex = client.mutex(&format!("busy-{round}")).unwrap();
        let task = tokio::spawn(async move { mutex.try_lock().await.map(|g| g.is_held()) });
        let script = tokio::spawn({
            let mut conn = raw(&server).await;
            async move {
                let reply: redis::RedisResult<()> = redis::cmd("EVAL")
                    .arg("while true do end")
                    .arg(0)
                    .query_async(&mut conn)
                    .await;
                reply
            }
        });
        let mut own_busy = 0;
        eventually(10.0, "the server answers BUSY", || {
            let mut probe = probe.clone();
            let busy = async move {
                let reply: redis::RedisResult<String> =
                    redis::cmd("GET").arg("x").query_async(&mut probe).await;
                matches!(reply, Err(e) if e.code() == Some("BUSY"))
            };
            own_busy += 1;
            busy
        })
        .await;
        proxy.release_requests();
        // Let the acquisition meet the busy server before the script ends.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !task.is_finished(),
            "round {round}: the acquisition gave up: {:?}",
            task.await
        );
        let _: () = redis::cmd("SCRIPT")
            .arg("KILL")
            .query_async(&mut probe)
            .await
            .unwrap();
        assert!(within(5.0, "the script ends", script).await.unwrap().is_err());
        let held = within(10.0, "the acquisition completes", task).await.unwrap();
        assert!(held.unwrap(), "round {round}");
        let info: String = redis::cmd("INFO")
            .arg("errorstats")
            .query_async(&mut probe)
            .await
            .unwrap();
        let busy = busy_replies(info);
        // The probe's own BUSY replies (one per check, the last one certain) aside, the
        // acquisition must have been answered BUSY at least once for this round to count.
        if busy > own_busy {
            return;
        }
    }
    panic!("the acquisition never reached the server while it was busy");
}

/// An extend whose reply comes back only after the lease ran out on the client: the
/// lease ended for good (`lost()` said so, and a late reply does not revive it), so the
/// extend must not report success — the holder would believe it holds for the new TTL,
/// with no renewal behind it and `is_held()` saying otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_answered_after_the_lease_ran_out_reports_not_held() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    // Replies are held for longer than the lease: the response timeout must not cut in.
    let client = impatient_client(&proxy.url(), Duration::from_secs(10), Duration::from_secs(3)).await;
    let mutex = client
        .mutex_with(
            "late-extend",
            LeaseOptions::new().ttl(Duration::from_secs(1)).auto_renew(false),
        )
        .unwrap();
    let guard = mutex.try_lock().await.unwrap();
    let lease = guard.lease().clone();

    proxy.hold_replies();
    let extend = tokio::spawn(async move {
        let extended = guard.extend(Duration::from_secs(30)).await;
        (extended, guard)
    });
    // The lease runs out on the client while the extend's reply is held back.
    assert_eq!(
        within(5.0, "the lease runs out", lease.lost()).await,
        LostReason::Expired
    );
    proxy.release_replies();
    let (extended, guard) = within(5.0, "the extend returns", extend).await.unwrap();
    assert!(!guard.is_held(), "a late reply does not revive the lease");
    let err = extended.expect_err("the extend was answered after the lease had ended");
    assert!(err.is_not_held(), "{err}");
    assert_eq!(guard.lease().lost_reason(), Some(LostReason::Expired));
}
