//! The plain mutex against a real redis-server: exclusion, fencing, leases, waiting.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redlease::{LeaseOptions, LostReason, Token};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_update_with_32_tasks_across_two_clients() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    const TASKS: usize = 32;
    const ROUNDS: usize = 10;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let mutex = clients[t % 2].mutex("counter").unwrap();
        let mut conn = raw(&server).await;
        let (inside, max_inside) = (inside.clone(), max_inside.clone());
        handles.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for _ in 0..ROUNDS {
                let guard = mutex.lock().await.expect("lock");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                // Read-modify-write with a gap in the middle: loses updates unless exclusive.
                let v: i64 = get(&mut conn, "value").await.map_or(0, |s| s.parse().unwrap());
                tokio::task::yield_now().await;
                let _: () = redis::cmd("SET")
                    .arg("value")
                    .arg(v + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                fences.push(guard.fence());
                guard.release().await.expect("release");
            }
            fences
        }));
    }
    let mut fences = Vec::new();
    for h in handles {
        fences.extend(within(120.0, "all tasks finish", h).await.unwrap());
    }
    let mut conn = raw(&server).await;
    assert_eq!(get(&mut conn, "value").await.as_deref(), Some("320"));
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    fences.sort();
    fences.dedup();
    assert_eq!(
        fences.len(),
        TASKS * ROUNDS,
        "every acquisition got its own fencing token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_over_1000_acquisitions_and_across_deletion() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("fenced").unwrap();
    let mut conn = raw(&server).await;
    let mut last = 0u64;
    // The fencing counter of the lock's hash slot, and its floor (found after the
    // first acquisition).
    let mut counter = String::new();
    for i in 0..1000 {
        if i == 300 {
            // Delete the counter and its floor: tokens go on from Redis's clock, which
            // is ahead of every token issued (they rise by one per acquisition).
            del(&mut conn, &[&counter, &format!("{counter}:floor")]).await;
        }
        if i == 600 {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        }
        if i == 900 {
            // The counter alone is lost early (as after an eviction): the floor keeps
            // the next token above every earlier one.
            del(&mut conn, &[&counter]).await;
        }
        if i == 950 {
            // A floor ahead of Redis's clock (as after the clock stepped back) and no
            // counter: the next token is the floor plus one, not the clock.
            del(&mut conn, &[&counter]).await;
            let _: () = redis::cmd("SET")
                .arg(format!("{counter}:floor"))
                .arg(8_000_000_000_000_000u64)
                .query_async(&mut conn)
                .await
                .unwrap();
            last = 8_000_000_000_000_000;
        }
        let guard = mutex.try_lock().await.expect("free lock");
        let fence = guard.fence().get();
        assert!(fence > last, "acquisition {i}: fence {fence} not above {last}");
        if i == 0 {
            // The floor lives a day (the counter only 100 ms).
            let keys = all_keys(&mut conn).await;
            let floor = keys
                .iter()
                .find(|(k, _)| k.starts_with("{redlease:fence") && k.ends_with("}:floor"))
                .unwrap_or_else(|| panic!("a fencing floor: {keys:?}"));
            counter = floor.0.strip_suffix(":floor").unwrap().to_owned();
        }
        if i == 950 {
            assert_eq!(
                fence, 8_000_000_000_000_001,
                "one above a floor ahead of the clock"
            );
        }
        last = fence;
        guard.release().await.unwrap();
    }
}

async fn del(conn: &mut redis::aio::MultiplexedConnection, keys: &[&str]) {
    let _: () = redis::cmd("DEL").arg(keys).query_async(conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_is_plain_and_nothing_lives_forever() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("layout").unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    assert_eq!(mutex.key(), "redlease:layout");
    assert_eq!(
        get(&mut conn, "redlease:layout").await.as_deref(),
        Some(guard.token().expose())
    );
    let ttl = pttl(&mut conn, "redlease:layout").await;
    assert!((29_000..=30_000).contains(&ttl), "lock ttl {ttl}");
    let keys = all_keys(&mut conn).await;
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    // The lock, its slot's fencing floor, and the slot's counter unless its 100 ms
    // have passed.
    assert_eq!(names[0], "redlease:layout", "{names:?}");
    let floor = names.last().unwrap();
    assert!(
        floor.starts_with("{redlease:fence") && floor.ends_with("}:floor"),
        "{names:?}"
    );
    assert!(
        names.len() == 2 || (names.len() == 3 && format!("{}:floor", names[1]) == *floor),
        "{names:?}"
    );
    assert!(keys.iter().all(|(_, t)| *t > 0), "a key without TTL: {keys:?}");
    guard.release().await.unwrap();
    let keys = all_keys(&mut conn).await;
    // Nothing of the lock itself stays; the counter (of the slot, shared by every
    // lock in it) lives 100 ms from when it was made, its floor a day.
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        names.len() <= 2 && names.iter().all(|k| k.starts_with("{redlease:fence")),
        "{keys:?}"
    );
    for (key, ttl) in &keys {
        let limit = if key.ends_with(":floor") { 86_400_000 } else { 100 };
        assert!(*ttl > 0 && *ttl <= limit, "{key}: ttl {ttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excludes_and_is_excluded_by_the_common_set_nx_px_format() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client
        .mutex_with("shared", LeaseOptions::new().auto_renew(false))
        .unwrap();
    let mut conn = raw(&server).await;
    // A redis-py / redsync style holder.
    let set: Option<String> = redis::cmd("SET")
        .arg("redlease:shared")
        .arg("py-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let err = mutex.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    let status = mutex.status().await.unwrap();
    assert!(status.held);
    assert_eq!(status.owner, None, "a foreign holder has no redlease label");
    // The foreign holder releases with a plain compare-and-delete.
    let _: () = redis::cmd("DEL")
        .arg("redlease:shared")
        .query_async(&mut conn)
        .await
        .unwrap();
    let guard = mutex.try_lock().await.unwrap();
    let set: Option<String> = redis::cmd("SET")
        .arg("redlease:shared")
        .arg("py-token")
        .arg("NX")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(set, None, "the foreign client must not get our lock");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_release_and_extend_fail_and_leave_the_lock() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("guarded").unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    let wrong = Token::from_secret("not-the-token").unwrap();
    let err = mutex.release_token(&wrong).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(
        err.to_string().contains("\"guarded\""),
        "message names the lock: {err}"
    );
    let err = mutex
        .extend_token(&wrong, Duration::from_secs(100))
        .await
        .unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(
        get(&mut conn, "redlease:guarded").await.as_deref(),
        Some(guard.token().expose())
    );
    assert!(pttl(&mut conn, "redlease:guarded").await <= 30_000);
    // The right token works.
    let token = guard.forget();
    mutex
        .extend_token(&token, Duration::from_secs(100))
        .await
        .unwrap();
    assert!(pttl(&mut conn, "redlease:guarded").await > 90_000);
    mutex.release_token(&token).await.unwrap();
    assert!(!exists(&mut conn, "redlease:guarded").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_reports_contention_with_remaining_lease() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("busy").unwrap();
    let guard = mutex.try_lock().await.unwrap();
    let err = mutex.try_lock().await.unwrap_err();
    match &err {
        redlease::Error::Contended { name, remaining } => {
            assert_eq!(name, "busy");
            let r = remaining.expect("a TTL");
            assert!(
                r > Duration::from_secs(25) && r <= Duration::from_secs(30),
                "{r:?}"
            );
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    let err = mutex.lock_timeout(Duration::from_millis(200)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lease_alive_for_five_ttls() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(300);
    let mutex = client
        .mutex_with("renewed", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let other = client
        .mutex_with("renewed", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    let start = Instant::now();
    while start.elapsed() < ttl * 6 {
        assert!(guard.is_held(), "lease lapsed after {:?}", start.elapsed());
        assert!(other.try_lock().await.unwrap_err().is_contended());
        tokio::time::sleep(ttl / 4).await;
    }
    assert!(guard.valid_until() > Instant::now());
    assert_eq!(guard.lease().lost_reason(), None);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_renewal_the_lease_expires_and_lost_fires() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(200);
    let mutex = client
        .mutex_with("short", LeaseOptions::new().ttl(ttl).auto_renew(false))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    let reason = within(1.0, "lost() after valid_until", guard.lost()).await;
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_held());
    // valid_until ends before the server-side expiry.
    let mut conn = raw(&server).await;
    eventually(1.0, "key expires", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:short").await }
    })
    .await;
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_within_one_renewal_interval_after_external_delete() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(900);
    let mutex = client
        .mutex_with("deleted", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("DEL")
        .arg("redlease:deleted")
        .query_async(&mut conn)
        .await
        .unwrap();
    let deleted = Instant::now();
    let reason = within(2.0, "lost() after delete", guard.lost()).await;
    assert_eq!(reason, LostReason::Gone);
    let took = deleted.elapsed();
    // One renewal interval is ttl/3 = 300 ms; allow scheduling slack.
    assert!(
        took <= ttl / 3 + Duration::from_millis(150),
        "lost() took {took:?}"
    );
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_after_the_server_restarts_empty() {
    let mut server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(1500);
    let mutex = client
        .mutex_with("restarted", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    server.restart().unwrap();
    let restarted = Instant::now();
    let reason = within(3.0, "lost() after restart", guard.lost()).await;
    assert_eq!(
        reason,
        LostReason::Gone,
        "renewal reconnects and finds the key gone"
    );
    let took = restarted.elapsed();
    assert!(
        took <= ttl / 3 + Duration::from_millis(300),
        "lost() took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_changes_the_lease_and_renewal_follows() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("extended").unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    guard.extend(Duration::from_secs(120)).await.unwrap();
    assert!(pttl(&mut conn, "redlease:extended").await > 110_000);
    assert_eq!(guard.lease().ttl(), Duration::from_secs(120));
    // Shrinking works too, and renewal keeps the short lease alive.
    guard.extend(Duration::from_millis(300)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(guard.is_held());
    assert!(exists(&mut conn, "redlease:extended").await);
    let err = guard.extend(Duration::ZERO).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_releases_in_the_background() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("dropped").unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    let lease = guard.lease().clone();
    drop(guard);
    assert_eq!(lease.lost_reason(), Some(LostReason::Released));
    eventually(2.0, "background release", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:dropped").await }
    })
    .await;
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_leaves_no_key() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.mutex("cancelled").unwrap();
    let mut conn = raw(&server).await;
    // Cancelled while waiting behind a holder.
    let holder = mutex.lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    holder.release().await.unwrap();
    // Cancelled at every point of an uncontended acquire: never an orphan.
    for delay_us in [0u64, 20, 50, 100, 200, 400, 800, 1600] {
        let fut = mutex.lock();
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), fut).await;
        eventually(2.0, "no orphan after cancellation", || {
            let mut conn = conn.clone();
            async move { !exists(&mut conn, "redlease:cancelled").await }
        })
        .await;
    }
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_release_not_by_polling() {
    let server = server();
    let holder_client = client(&server.url()).await;
    let waiter_client = client(&server.url()).await;
    // 30 s leases: a poller bounded by the holder's TTL would wait up to 30 s.
    let holder = holder_client.mutex("handoff").unwrap();
    let waiter = waiter_client.mutex("handoff").unwrap();
    let mut latencies = Vec::new();
    for _ in 0..30 {
        let guard = holder.lock().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let w = waiter.clone();
        let task = tokio::spawn(async move {
            let _ = tx.send(());
            let g = w.lock().await.unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        });
        rx.await.unwrap();
        // Let the waiter make its first attempt and subscribe.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let acquired = within(5.0, "waiter acquires after release", task).await.unwrap();
        latencies.push(acquired.saturating_duration_since(released));
    }
    latencies.sort();
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    eprintln!("handoff p50 {p50:?} p99 {p99:?}");
    assert!(
        p50 < Duration::from_millis(20),
        "handoff p50 {p50:?} (a 100 ms poller would need ~50 ms)"
    );
    assert!(p99 < Duration::from_millis(500), "handoff p99 {p99:?}");
}

/// Tasks of one client queue locally, in arrival order, behind one representative that
/// waits in Redis (one subscription for all of them); each release hands the lock to
/// the next local task. A current-thread runtime makes the arrival order exact.
#[tokio::test(flavor = "current_thread")]
async fn many_waiters_in_one_process_queue_in_order_behind_one_subscription() {
    let server = server();
    let holder_client = client(&server.url()).await;
    let client = client(&server.url()).await;
    let mutex = client.mutex("crowd").unwrap();
    let mut conn = raw(&server).await;
    let holder = holder_client.mutex("crowd").unwrap().lock().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (mutex, order) = (mutex.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = mutex.lock().await.unwrap();
            order.lock().unwrap().push((i, g.fence()));
            g.release().await.unwrap();
        }));
    }
    eventually(5.0, "the representative subscribes", || {
        let mut conn = conn.clone();
        async move {
            let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("{redlease:crowd}:wake")
                .query_async(&mut conn)
                .await
                .unwrap();
            subs[0].1 == 1
        }
    })
    .await;
    let status = mutex.status().await.unwrap();
    assert_eq!(status.waiters, 1, "one subscription for 50 local waiters");
    let before = client.stats();
    holder.release().await.unwrap();
    for t in tasks {
        within(20.0, "every waiter gets the lock in turn", t)
            .await
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    let arrival: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(arrival, (0..50).collect::<Vec<_>>(), "served in arrival order");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "every hand-over issued a higher fencing token"
    );
    assert_eq!(
        client.stats().leases_lost_by_renewal,
        before.leases_lost_by_renewal
    );
    let status = mutex.status().await.unwrap();
    assert!(!status.held);
    eventually(2.0, "the subscription is dropped with the last waiter", || {
        let mutex = mutex.clone();
        async move { mutex.status().await.unwrap().waiters == 0 }
    })
    .await;
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_owner_but_never_the_token() {
    let server = server();
    let client = redlease::Client::builder(server.client())
        .owner_label("builder-7:4242")
        .build()
        .await
        .unwrap();
    let mutex = client.mutex("observed").unwrap();
    let free = mutex.status().await.unwrap();
    assert!(!free.held && free.owner.is_none() && free.fence.is_none());
    let guard = mutex.lock().await.unwrap();
    let status = mutex.status().await.unwrap();
    assert!(status.held);
    assert_eq!(status.owner.as_deref(), Some("builder-7:4242"));
    assert_eq!(status.fence, None, "not recorded for the plain mutex");
    // The slot's fencing mark: the last token issued, or once the counter's 100 ms
    // ran out, its floor.
    assert_mark(status.last_fence, guard.fence(), "the slot's fencing mark");
    assert!(status.remaining.unwrap() > Duration::from_secs(25));
    assert!(status.since.is_none());
    assert!(!format!("{status:?}").contains(guard.token().expose()));
    assert!(!format!("{guard:?}").contains(guard.token().expose()));
    let fence = guard.fence();
    guard.release().await.unwrap();
    let after = mutex.status().await.unwrap();
    assert!(!after.held && after.owner.is_none());
    assert_mark(after.last_fence, fence, "the fencing mark outlives the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_tasks_share_one_connection_without_mixing_replies() {
    let server = server();
    let client = client(&server.url()).await;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..400 {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mutex = client.mutex(&format!("lock-{i}")).unwrap();
            for _ in 0..5 {
                let guard = mutex.try_lock().await.expect("distinct names are free");
                // The reply our task got must be about our key.
                assert_eq!(guard.key(), format!("redlease:lock-{i}"));
                let status = mutex.status().await.unwrap();
                // Other locks may share the slot's fencing mark, which is never below
                // the fence of ours.
                assert!(
                    status.held && status.last_fence >= Some(guard.fence()),
                    "status of lock-{i} belongs to it"
                );
                guard.release().await.unwrap();
            }
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    for t in tasks {
        within(60.0, "all tasks", t).await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_batches_every_lease_into_one_round_trip_per_tick() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..1000 {
        let mutex = client
            .mutex_with(&format!("batch-{i}"), LeaseOptions::new().ttl(ttl))
            .unwrap();
        guards.push(mutex.try_lock().await.unwrap());
    }
    let before = client.stats();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = client.stats();
    let ticks = after.renewal_ticks - before.renewal_ticks;
    let renewed = after.leases_renewed - before.leases_renewed;
    // Every lease renews about every 200 ms: ~10 renewals each in 2 s.
    assert!(renewed >= 1000 * 6, "renewed {renewed}");
    // Batched: a handful of ticks, each a single round trip — not one per lease.
    assert!((5..=40).contains(&ticks), "ticks {ticks}");
    assert_eq!(after.renewal_round_trips - before.renewal_round_trips, ticks);
    assert_eq!(after.leases_lost_by_renewal, 0);
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A waiter in another client is handed the lock by the release itself: the release
/// sets the lock to the waiter's token and tells it, so the waiter sends no acquire of
/// its own — one hop after the release instead of a wake-up and a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_registered_waiter() {
    let server = server();
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let first = holder.mutex("handed").unwrap().lock().await.unwrap();
    let mutex = waiter.mutex("handed").unwrap();
    let task = tokio::spawn(async move { mutex.lock().await });
    // The waiter registered for a hand-over (and listens).
    eventually(10.0, "the waiter registers", || {
        let mut conn = conn.clone();
        async move {
            let n: i64 = redis::cmd("ZCARD")
                .arg("{redlease:handed}:q")
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 1
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let evalsha = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = evalsha(info);
    let first_fence = first.fence();
    first.release().await.unwrap();
    let second = within(10.0, "handed over", task).await.unwrap().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let after = evalsha(info);
    assert!(second.is_held());
    assert!(second.fence() > first_fence);
    assert_eq!(
        get(&mut conn, "redlease:handed").await.as_deref(),
        Some(second.token().expose())
    );
    // The release, then at most the renewal that extends the short claim window: no
    // acquire attempt by the waiter.
    assert!(
        after - before <= 2,
        "{} script calls for the hand-over",
        after - before
    );
    // The claim window is extended to the full lease right away.
    eventually(5.0, "extended to the full lease", || {
        let mut conn = conn.clone();
        async move { pttl(&mut conn, "redlease:handed").await > 20_000 }
    })
    .await;
    let n: i64 = redis::cmd("ZCARD")
        .arg("{redlease:handed}:q")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 0, "the registration went with the hand-over");
    second.release().await.unwrap();
}

/// A waiter whose whole client stalls (a long GC-like pause of its thread) while a
/// release hands it the lock must not take that hand-over once it runs again if the
/// lock has meanwhile expired and gone to someone else: the grant is stale, whatever
/// the waiter did first when it woke up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_went_stale_during_a_stall_is_not_taken() {
    use std::sync::mpsc;
    let server = server();
    let url = server.url();
    let mut conn = raw(&server).await;
    let holder = client(&url).await;
    let other = client(&url).await;
    // A short lease, so that a hand-over's claim window is short too.
    let opts = LeaseOptions::default().ttl(Duration::from_millis(300));
    for round in 0..8 {
        let name = format!("stale-grant-{round}");
        let first = holder.mutex_with(&name, opts).unwrap().lock().await.unwrap();
        // The waiter: its own client on its own single thread, which the test stalls.
        let (to_waiter, commands) = mpsc::channel::<Option<Duration>>();
        let (events, from_waiter) = mpsc::channel::<&'static str>();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let (url, wname, wopts) = (url.clone(), name.clone(), opts);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = client(&url).await;
                let mutex = client.mutex_with(&wname, wopts).unwrap();
                let task = tokio::spawn(async move { mutex.lock().await.expect("lock") });
                // Stall the whole thread on command.
                let commands = Arc::new(std::sync::Mutex::new(commands));
                let next = {
                    let commands = commands.clone();
                    move || commands.lock().unwrap().recv().ok().flatten()
                };
                let stall = tokio::task::spawn_blocking(next.clone()).await.unwrap();
                if let Some(stall) = stall {
                    tokio::spawn(async move {
                        events.send("stalled").unwrap();
                        std::thread::sleep(stall);
                        events.send("running").unwrap();
                    });
                }
                let guard = task.await.unwrap();
                let _ = done_tx.send((guard.fence(), Instant::now()));
                // Held until the test is done with the round.
                tokio::task::spawn_blocking(next).await.unwrap();
                guard.release().await.unwrap();
            });
        });
        let q = format!("{{redlease:{name}}}:q");
        eventually(10.0, "the waiter registers", || {
            let (mut conn, q) = (conn.clone(), q.clone());
            async move {
                let n: i64 = redis::cmd("ZCARD").arg(&q).query_async(&mut conn).await.unwrap();
                n == 1
            }
        })
        .await;
        to_waiter.send(Some(Duration::from_millis(1500))).unwrap();
        assert_eq!(from_waiter.recv_timeout(Duration::from_secs(10)), Ok("stalled"));
        // Handed to the stalled waiter, whose short claim runs out; then another client
        // takes the lock.
        first.release().await.unwrap();
        let key = format!("redlease:{name}");
        let taken = within(
            10.0,
            "the hand-over runs out and another client takes the lock",
            async {
                loop {
                    match other.mutex(&name).unwrap().try_lock().await {
                        Ok(guard) => break guard,
                        Err(e) if e.is_contended() => tokio::time::sleep(Duration::from_millis(10)).await,
                        Err(e) => panic!("{e}"),
                    }
                }
            },
        )
        .await;
        assert!(exists(&mut conn, &key).await);
        if round % 2 == 1 {
            // As if another client's pipelined INCR had just found the fencing counter
            // expired: it reads 1 until a script seeds it. The waiter's next attempt
            // must not take that for the fencing mark.
            let _: () = redis::cmd("DEL")
                .arg("{redlease:fence}")
                .query_async(&mut conn)
                .await
                .unwrap();
            let one: i64 = redis::cmd("INCR")
                .arg("{redlease:fence}")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(one, 1);
        }
        assert_eq!(from_waiter.recv_timeout(Duration::from_secs(10)), Ok("running"));
        // Give the waiter time to act on what it found when it woke up.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        let taken_fence = taken.fence();
        taken.release().await.unwrap();
        let (fence, at) = within(10.0, "the waiter acquires after the release", done)
            .await
            .unwrap();
        assert!(
            at >= released_at,
            "round {round}: the waiter took a stale hand-over while another client held the lock \
             (fence {fence:?}, the other client's {taken_fence:?})"
        );
        assert!(fence > taken_fence, "round {round}: fencing tokens out of order");
        to_waiter.send(None).unwrap();
        thread.join().unwrap();
    }
}

/// The application's own commands go over the client's connection: single commands,
/// pipelines and MULTI/EXEC transactions, beside a held lock that keeps renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_connection_serves_the_applications_commands() {
    use redlease::redis::{self, AsyncCommands};

    let server = server();
    let client = redlease::Client::builder(redlease::redis::Client::open(server.url()).unwrap())
        .build()
        .await
        .unwrap();
    let guard = client
        .mutex_with(
            "app",
            redlease::LeaseOptions::new().ttl(Duration::from_millis(300)),
        )
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mut conn = client.connection();
    let _: () = conn.set("app:counter", 41).await.unwrap();
    let n: i64 = conn.incr("app:counter", 1).await.unwrap();
    assert_eq!(n, 42);
    let (a, b): (i64, Option<String>) = redis::pipe()
        .get("app:counter")
        .get("app:missing")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((a, b), (42, None));
    let (x, y): (i64, i64) = redis::pipe()
        .atomic()
        .incr("app:counter", 1)
        .incr("app:counter", 1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((x, y), (43, 44));
    // A server error comes back as an error, and the connection goes on.
    let err = redis::cmd("NOSUCHCOMMAND")
        .query_async::<()>(&mut conn)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown command"), "{err}");
    assert_eq!(redis::aio::ConnectionLike::get_db(&conn), 0);
    // The lease was renewed meanwhile (300 ms TTL, renewed every 100 ms).
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(guard.is_held());
    let _: i64 = conn.get("app:counter").await.unwrap();
    guard.release().await.unwrap();
}

/// A waiter behind a holder that is not redlease — another library's `SET NX PX` lock,
/// or a key without a TTL — gets in soon after that holder deletes the key, although
/// nothing announces the release: it polls such a holder. (Without polling it would
/// wait out the foreign lease: 10 s here, or its own TTL for a key without one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_in_soon_after_a_foreign_holder_lets_go() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    for (name, ttl) in [("foreign-px", Some(10_000)), ("foreign-no-ttl", None)] {
        let key = format!("redlease:{name}");
        take_as_foreign(&mut conn, &key, ttl).await;
        let waiter = tokio::spawn({
            let mutex = client.mutex(name).unwrap();
            async move {
                let guard = mutex.lock_timeout(Duration::from_secs(8)).await;
                (guard, Instant::now())
            }
        });
        // The waiter has registered (and found the holder foreign) before the holder
        // lets go.
        until_registered(&conn, &key, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await; // into the longer polls
        assert!(!waiter.is_finished(), "{name}: the foreign holder still holds");
        del(&mut conn, &[&key]).await;
        let released = Instant::now();
        let (guard, acquired_at) = within(10.0, "the waiter", waiter).await.unwrap();
        let guard = guard.unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = acquired_at - released;
        assert!(
            after < Duration::from_millis(150),
            "{name}: in {after:?} after the foreign release, not after the foreign lease"
        );
        guard.release().await.unwrap();
    }
}

/// A lock handed to a waiter whose client was held up for most of the claim window:
/// the waiter cannot rely on the hand-over and tries again, and the acquire script —
/// finding the lock its own — gives it the full lease from that request on. (It
/// answered with what was left of the claim, less than the drift margin: `lock()`
/// returned a guard already lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_taken_late_in_its_claim_window_gives_a_full_lease() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let mut conn = raw(&server).await;
    let a = client(&server.url()).await;
    let w = client(&proxy.url()).await;
    let ttl = Duration::from_secs(30);
    let held = a
        .mutex_with("late", LeaseOptions::new().ttl(ttl))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let mutex_w = w.mutex_with("late", LeaseOptions::new().ttl(ttl)).unwrap();
    let waiter = tokio::spawn(async move { mutex_w.lock().await });
    until_registered(&conn, "redlease:late", 1).await;
    // W's client hears nothing for most of the 2 s claim window of the hand-over.
    proxy.hold_replies();
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1750)).await;
    let left: i64 = redis::cmd("PTTL")
        .arg("redlease:late")
        .query_async(&mut conn)
        .await
        .unwrap();
    proxy.release_replies();
    let guard = within(5.0, "W's lock returns", waiter).await.unwrap().unwrap();
    assert!(
        guard.is_held(),
        "W holds (the hand-over had {left} ms left): {:?}",
        guard.lease().lost_reason()
    );
    assert!(
        guard.valid_until() > Instant::now() + Duration::from_secs(20),
        "the full lease"
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg("redlease:late")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 25_000, "extended on the server: {pttl} ms");
    guard.release().await.unwrap();
}
