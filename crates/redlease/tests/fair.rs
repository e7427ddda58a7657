//! The fair mutex against a real redis-server: exact FIFO order, targeted wake-ups,
//! dead and departed waiters, interplay with the plain mutex, faults and cancellation.

mod common;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use redlease::{LeaseOptions, Token};

async fn labelled(url: &str, label: &str) -> redlease::Client {
    redlease::Client::builder(redis::Client::open(url).unwrap())
        .owner_label(label)
        .build()
        .await
        .expect("connect")
}

async fn queue_len(mutex: &redlease::FairMutex) -> u64 {
    mutex.status().await.unwrap().queue_len
}

/// Collects every message published on the fair channels of lock `name` (one per
/// client: hand-overs "g <id> <fence>" and "try again" notes "g <id> -"), each as
/// "<the channel's client id>|<message>".
async fn wake_log(server: &RedisServer, name: &str) -> Arc<StdMutex<Vec<String>>> {
    let log = Arc::new(StdMutex::new(Vec::new()));
    let probed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let channel = format!("{{redlease:{name}}}:wake:fair:probe");
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub
        .psubscribe(format!("{{redlease:{name}}}:wake:fair:*"))
        .await
        .unwrap();
    let (sink, seen) = (log.clone(), probed.clone());
    tokio::spawn(async move {
        let mut stream = pubsub.into_on_message();
        while let Some(msg) = stream.next().await {
            let payload: String = msg.get_payload().unwrap();
            if payload == "probe" {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
            } else {
                // "<client id>|<payload>"
                let client = msg.get_channel_name().rsplit(':').next().unwrap_or_default();
                sink.lock().unwrap().push(format!("{client}|{payload}"));
            }
        }
    });
    // Handshake: the subscription is live once a probe message comes through.
    let conn = raw(server).await;
    eventually(5.0, "the wake-up log is subscribed", || {
        let (mut conn, probed, channel) = (conn.clone(), probed.clone(), channel.clone());
        async move {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(&channel)
                .arg("probe")
                .query_async(&mut conn)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            probed.load(std::sync::atomic::Ordering::SeqCst)
        }
    })
    .await;
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_four_waiters_are_served_exactly_in_arrival_order() {
    let server = server();
    let clients = [
        labelled(&server.url(), "left:1").await,
        labelled(&server.url(), "right:2").await,
    ];
    let wakes = wake_log(&server, "fifo").await;
    const WAITERS: usize = 24;
    let observer = clients[0].fair_mutex("fifo").unwrap();
    let holder = observer.lock().await.unwrap();
    let first_fence = holder.fence();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let mutex = clients[i % 2].fair_mutex("fifo").unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.expect("lock in turn");
            order.lock().unwrap().push((i, guard.fence()));
            // Hold briefly, so a waiter served out of turn would have time to show up.
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.release().await.expect("release");
        }));
        // The next waiter arrives only after this one has its ticket.
        eventually(5.0, "the waiter joins the queue", || {
            let observer = observer.clone();
            async move { queue_len(&observer).await == i as u64 + 1 }
        })
        .await;
    }
    let status = observer.status().await.unwrap();
    assert_eq!(status.queue_len, WAITERS as u64);
    let expected_labels: Vec<&str> = (0..WAITERS)
        .map(|i| if i % 2 == 0 { "left:1" } else { "right:2" })
        .collect();
    assert_eq!(status.queue, expected_labels, "status shows the queue in order");
    assert!(wakes.lock().unwrap().is_empty(), "nobody was woken yet");

    holder.release().await.unwrap();
    for t in tasks {
        within(30.0, "every waiter gets its turn", t).await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let served: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(served, (0..WAITERS).collect::<Vec<_>>(), "served out of order");
    let mut last = first_fence;
    for (i, fence) in &order {
        assert!(*fence > last, "waiter {i}: fence {fence} not above {last}");
        last = *fence;
    }
    // Each release handed the lock to exactly one waiter, named in one message on its
    // own client's channel: no herd, and no request of the waiter's own. The fencing tokens the waiters hold are
    // the ones the hand-overs issued, in order.
    let wakes = wakes.lock().unwrap().clone();
    assert_eq!(wakes.len(), WAITERS, "one message per hand-over: {wakes:?}");
    let handed: Vec<(String, u64)> = wakes
        .iter()
        .map(|m| match m.split([' ', '|']).collect::<Vec<_>>()[..] {
            [client, "g", id, fence, ms] => {
                assert!(
                    ms.parse::<u64>().is_ok_and(|ms| ms > 0),
                    "how long the lock is set for: {m:?}"
                );
                assert!(id.starts_with(client), "told on another client's channel: {m:?}");
                (id.to_owned(), fence.parse().expect("a fence"))
            }
            _ => panic!("not a hand-over: {m:?}"),
        })
        .collect();
    let mut ids: Vec<&str> = handed.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), WAITERS, "every hand-over went to a different waiter");
    let fences: Vec<u64> = order.iter().map(|(_, f)| f.get()).collect();
    let issued: Vec<u64> = handed.iter().map(|(_, f)| *f).collect();
    assert_eq!(fences, issued, "each waiter holds the fence its hand-over issued");
    assert_eq!(queue_len(&observer).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_reported_while_waiting() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.fair_mutex("positions").unwrap();
    let holder = mutex.lock().await.unwrap();
    let mut tasks = Vec::new();
    let reports = Arc::new(StdMutex::new(Vec::new()));
    for i in 0..3u64 {
        let (waiter, log) = (mutex.clone(), reports.clone());
        tasks.push(tokio::spawn(async move {
            let guard = waiter
                .lock_with_position(Some(Duration::from_secs(10)), |p| {
                    log.lock().unwrap().push((i, p))
                })
                .await
                .unwrap();
            guard.release().await.unwrap();
        }));
        // The waiter has its ticket once it reported its place (the next one joins after).
        eventually(5.0, "joined and reported", || {
            let reports = reports.clone();
            async move { reports.lock().unwrap().len() as u64 == i + 1 }
        })
        .await;
    }
    assert_eq!(queue_len(&mutex).await, 3);
    assert_eq!(
        *reports.lock().unwrap(),
        [(0, 0), (1, 1), (2, 2)],
        "each waiter learns its place on joining"
    );
    holder.release().await.unwrap();
    for t in tasks {
        within(10.0, "served", t).await.unwrap();
    }
}

/// A waiter whose process dies mid-queue (its runtime is torn down: no clean-up, no
/// more heartbeats) holds up the next one by at most its waiter TTL plus one heartbeat
/// interval — not the lock's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_delays_the_next_by_at_most_its_waiter_ttl() {
    let server = server();
    let waiter_ttl = Duration::from_millis(600);
    let holder_client = client(&server.url()).await;
    let observer = holder_client
        .fair_mutex("crash")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap();
    let holder = observer.lock().await.unwrap();

    // The doomed waiter runs on its own runtime in its own thread.
    let (joined_tx, joined_rx) = tokio::sync::oneshot::channel();
    let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
    let url = server.url();
    let doomed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = client(&url).await;
            let mutex = client
                .fair_mutex("crash")
                .unwrap()
                .with_waiter_ttl(waiter_ttl)
                .unwrap();
            let mut joined = Some(joined_tx);
            tokio::select! {
                _ = mutex.lock_with_position(None, |_| {
                    if let Some(tx) = joined.take() {
                        let _ = tx.send(());
                    }
                }) => panic!("the doomed waiter must not get the lock"),
                _ = kill_rx => {}
            }
        });
        // The process "dies": its tasks never run again (no background leave).
        rt.shutdown_background();
    });
    within(5.0, "the doomed waiter joins", joined_rx).await.unwrap();

    let next = client(&server.url()).await;
    let next_mutex = next
        .fair_mutex("crash")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap();
    let task = tokio::spawn(async move {
        let guard = next_mutex.lock().await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    eventually(5.0, "the next waiter queues behind", || {
        let observer = observer.clone();
        async move { queue_len(&observer).await == 2 }
    })
    .await;

    kill_tx.send(()).unwrap();
    doomed.join().unwrap();
    let crashed = Instant::now();
    assert_eq!(
        queue_len(&observer).await,
        2,
        "the crashed waiter left its entry behind"
    );
    holder.release().await.unwrap();
    let acquired = within(10.0, "the next waiter gets the lock", task).await.unwrap();
    let stall = acquired.duration_since(crashed);
    eprintln!("stalled by the crashed waiter for {stall:?}");
    assert!(
        stall <= waiter_ttl + waiter_ttl / 3 + Duration::from_millis(400),
        "stalled {stall:?}; waiter TTL {waiter_ttl:?}"
    );
    assert_eq!(queue_len(&observer).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.fair_mutex("quitter").unwrap();
    let holder = mutex.lock().await.unwrap();

    // One waiter is cancelled (aborted), another times out; both were ahead of `last`.
    let aborted = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock().await }
    });
    eventually(5.0, "joined", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 1 }
    })
    .await;
    let timed_out = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::from_millis(400)).await }
    });
    eventually(5.0, "joined", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 2 }
    })
    .await;
    let last = tokio::spawn({
        let mutex = mutex.clone();
        async move {
            let guard = mutex.lock().await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    eventually(5.0, "joined", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 3 }
    })
    .await;

    aborted.abort();
    assert!(aborted.await.unwrap_err().is_cancelled());
    eventually(2.0, "the cancelled waiter leaves", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 2 }
    })
    .await;
    let err = within(5.0, "timeout", timed_out).await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    eventually(2.0, "the timed-out waiter leaves", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 1 }
    })
    .await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = within(5.0, "the last waiter is served", last).await.unwrap();
    let handoff = acquired.duration_since(released);
    assert!(
        handoff < Duration::from_millis(300),
        "hand-off took {handoff:?}: a departed waiter blocked the queue"
    );
    // Nothing but the fencing counter remains.
    let mut conn = raw(&server).await;
    eventually(2.0, "no queue left", || {
        let mut conn = conn.clone();
        async move { keys_but_fencing(&mut conn).await.is_empty() }
    })
    .await;
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_neither_queues_nor_jumps_the_queue() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.fair_mutex("polite").unwrap();
    let holder = mutex.lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock().await }
    });
    eventually(5.0, "joined", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 1 }
    })
    .await;
    let err = mutex.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert_eq!(queue_len(&mutex).await, 1, "try_lock does not queue");

    // The lock is free for an instant after this release, but the queued waiter is first.
    let token = holder.forget();
    mutex.release_token(&token).await.unwrap();
    let raced = mutex.try_lock().await;
    let guard = within(5.0, "the waiter is served", waiter)
        .await
        .unwrap()
        .unwrap();
    if let Ok(g) = raced {
        panic!("try_lock jumped the queue with fence {}", g.fence());
    }
    assert!(mutex.try_lock().await.unwrap_err().is_contended());
    guard.release().await.unwrap();
    // Free and nobody waiting: try_lock succeeds.
    mutex.try_lock().await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_plain_mutexes_share_the_key_and_the_fence_sequence() {
    let server = server();
    let client = client(&server.url()).await;
    let fair = client.fair_mutex("shared").unwrap();
    let plain = client.mutex("shared").unwrap();
    let mut conn = raw(&server).await;
    assert_eq!(fair.key(), plain.key());

    let f = fair.lock().await.unwrap();
    assert_eq!(
        get(&mut conn, "redlease:shared").await.as_deref(),
        Some(f.token().expose()),
        "the lock key holds the token, as for the plain mutex"
    );
    assert!(plain.try_lock().await.unwrap_err().is_contended());
    let plain_status = plain.status().await.unwrap();
    assert!(plain_status.held);
    assert_mark(
        plain_status.last_fence,
        f.fence(),
        "the plain status sees the fair holder's fencing token as the latest",
    );
    let fence = f.fence();
    f.release().await.unwrap();

    let p = plain.lock().await.unwrap();
    assert!(p.fence() > fence);
    assert!(fair.try_lock().await.unwrap_err().is_contended());
    let fence = p.fence();
    p.release().await.unwrap();

    let f = fair.try_lock().await.unwrap();
    assert!(f.fence() > fence);
    // A redis-py style compare-and-delete release works too.
    let token = f.forget();
    let _: () = redis::cmd("DEL")
        .arg("redlease:shared")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(fair.release_token(&token).await.unwrap_err().is_not_held());
}

/// Waiters of one client share one subscription to the lock's channel: a waiter that
/// finds it already confirmed joins it before its first request, and queues in that
/// one request (without it, it would subscribe afterwards and ask again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_waiter_of_a_client_queues_in_one_request() {
    let server = server();
    let client = client(&server.url()).await;
    let fair = client.fair_mutex("one-request").unwrap();
    let mut conn = raw(&server).await;
    let holder = fair.lock().await.unwrap();
    let probe = conn.clone();
    let queued = |n: i64| {
        let conn = probe.clone();
        move || {
            let mut conn = conn.clone();
            async move {
                let len: i64 = redis::cmd("ZCARD")
                    .arg("{redlease:one-request}:queue")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                len == n
            }
        }
    };
    let first = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock().await.unwrap().release().await.unwrap() }
    });
    eventually(5.0, "the first waiter queues", queued(1)).await;
    eventually(5.0, "its subscription is confirmed", || {
        let mut conn = conn.clone();
        async move {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("{redlease:one-request}:wake:fair:*")
                .query_async(&mut conn)
                .await
                .unwrap();
            channels.len() == 1
        }
    })
    .await;
    // Let the first waiter's second look (after its own subscription) go out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let second = tokio::spawn({
        let fair = fair.clone();
        async move { fair.lock().await.unwrap().release().await.unwrap() }
    });
    eventually(5.0, "the second waiter queues", queued(2)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        1,
        "the second waiter queued in one request"
    );
    holder.release().await.unwrap();
    within(5.0, "the first waiter is served", first).await.unwrap();
    within(5.0, "the second waiter is served", second).await.unwrap();
}

/// A plain-mutex client barges in ahead of the queue and releases without telling the
/// fair waiters (its release knows nothing of them). The first of them is served
/// within one heartbeat interval of the queue — not when the plain holder's 30 s lease
/// would have ended — and the next fair release hands the lock on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_free_by_a_plain_client_goes_to_the_queue_within_a_heartbeat() {
    let server = server();
    let waiter_ttl = Duration::from_millis(600);
    let client = client(&server.url()).await;
    let fair = client
        .fair_mutex("barged")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap();
    let holder = fair.lock().await.unwrap();
    let first = tokio::spawn({
        let fair = fair.clone();
        async move {
            let guard = fair.lock().await.unwrap();
            let at = Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
            at
        }
    });
    eventually(5.0, "the first waiter queues", || {
        let fair = fair.clone();
        async move { queue_len(&fair).await == 1 }
    })
    .await;
    let second = tokio::spawn({
        let fair = fair.clone();
        async move {
            let guard = fair.lock().await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    eventually(5.0, "the second waiter queues", || {
        let fair = fair.clone();
        async move { queue_len(&fair).await == 2 }
    })
    .await;
    // The fair holder's lock is taken over by a plain holder (as if its lease had run
    // out and a plain client had been quicker), which then releases it.
    let token = holder.forget();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("DEL")
        .arg("redlease:barged")
        .query_async(&mut conn)
        .await
        .unwrap();
    let plain = client
        .mutex_with("barged", LeaseOptions::new().ttl(Duration::from_secs(30)))
        .unwrap()
        .try_lock()
        .await
        .expect("the plain client barges in");
    assert!(fair.release_token(&token).await.unwrap_err().is_not_held());
    let released = Instant::now();
    plain.release().await.unwrap();
    let first = within(5.0, "the first waiter is served", first).await.unwrap();
    let second = within(5.0, "the second waiter is served", second).await.unwrap();
    let waited = first.duration_since(released);
    eprintln!("the queue learned of the plain release after {waited:?}");
    assert!(
        waited <= waiter_ttl / 3 + Duration::from_millis(300),
        "the first waiter waited {waited:?} after the plain release"
    );
    assert!(second > first, "served out of order");
    assert_eq!(queue_len(&fair).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_renews_extends_and_reports_loss() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(300);
    let mutex = client
        .fair_mutex_with("leased", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(guard.is_held(), "renewal keeps the lease");
    guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(pttl(&mut conn, "redlease:leased").await > 55_000);
    guard.extend(ttl).await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg("redlease:leased")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = within(2.0, "lost() after delete", guard.lost()).await;
    assert_eq!(reason, redlease::LostReason::Gone);
    assert!(guard.release().await.unwrap_err().is_not_held());
    // Extending a token that holds nothing changes nothing.
    let stranger = Token::from_secret("stranger").unwrap();
    assert!(
        mutex
            .extend_token(&stranger, Duration::from_secs(5))
            .await
            .unwrap_err()
            .is_not_held()
    );
    assert!(!exists(&mut conn, "redlease:leased").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires_and_a_dropped_guard_wakes_the_next() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.fair_mutex("layout").unwrap();
    let mut conn = raw(&server).await;
    let guard = mutex.lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock().await.map(|g| g.fence()) }
    });
    eventually(5.0, "joined", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 1 }
    })
    .await;
    let keys = keys_but_fencing(&mut conn).await;
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "redlease:layout",
            "{redlease:layout}:alive",
            "{redlease:layout}:queue",
        ]
    );
    assert!(keys.iter().all(|(_, t)| *t > 0), "a key without TTL: {keys:?}");
    // Queue keys live about one waiter TTL (5 s by default), refreshed by heartbeats.
    for (key, ttl) in &keys {
        if key.ends_with(":queue") || key.ends_with(":alive") {
            assert!(*ttl <= 5_000, "{key}: {ttl}");
        }
    }

    let dropped = Instant::now();
    drop(guard);
    let fence = within(5.0, "dropping the guard wakes the next waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        dropped.elapsed() < Duration::from_secs(2),
        "woken by the background release, not the 30 s TTL"
    );
    assert!(fence.get() > 0);
    // The waiter's guard was dropped too: nothing is left but the fencing counter.
    eventually(2.0, "no key is left", || {
        let mut conn = conn.clone();
        async move { keys_but_fencing(&mut conn).await.is_empty() }
    })
    .await;
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_nothing_at_any_point() {
    let server = server();
    let client = client(&server.url()).await;
    let mutex = client.fair_mutex("cancelled").unwrap();
    let mut conn = raw(&server).await;
    let holder = client.fair_mutex("cancelled").unwrap().lock().await.unwrap();
    for delay_us in [0u64, 50, 200, 800, 3_000, 20_000, 100_000] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), mutex.lock()).await;
        eventually(2.0, "no queue entry after cancellation", || {
            let mutex = mutex.clone();
            async move { queue_len(&mutex).await == 0 }
        })
        .await;
    }
    holder.release().await.unwrap();
    for delay_us in [0u64, 20, 50, 100, 200, 400, 800, 1600] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), mutex.lock()).await;
        eventually(2.0, "no orphan after cancellation", || {
            let mut conn = conn.clone();
            async move { keys_but_fencing(&mut conn).await.is_empty() }
        })
        .await;
    }
    let _ = &mut conn;
}

/// A lost reply under retry, for the fair mutex: the acquire lands, its reply is held past the client's
/// timeout, and the retry must report the lock it already took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_reports_the_lock_it_already_took() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(3)).await;
    let mutex = client.fair_mutex("retried").unwrap();
    let mut conn = raw(&server).await;

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.try_lock().await }
    });
    eventually(2.0, "the lock key is written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:retried").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    proxy.release_replies();
    let guard = within(5.0, "try_lock returns", attempt)
        .await
        .unwrap()
        .expect("the retry finds its own token");
    assert_eq!(
        get(&mut conn, "redlease:retried").await.as_deref(),
        Some(guard.token().expose())
    );
    let status = mutex.status().await.unwrap();
    assert!(status.held);
    assert!(status.owner.is_some(), "the holder's label is in its token");
    assert!(status.last_fence >= Some(guard.fence()));

    // A retried enqueue keeps one entry (and its place), not two.
    let (joined_tx, mut joined_rx) = tokio::sync::mpsc::unbounded_channel();
    proxy.hold_replies();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move {
            mutex
                .lock_with_position(Some(Duration::from_secs(10)), |p| {
                    let _ = joined_tx.send(p);
                })
                .await
        }
    });
    eventually(2.0, "the enqueue lands", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "{redlease:retried}:queue").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await; // the client retries meanwhile
    proxy.release_replies();
    let position = within(5.0, "the retried enqueue answers", joined_rx.recv())
        .await
        .unwrap();
    assert_eq!(position, 0, "the retry found its own entry at the front");
    let raw_len: u64 = redis::cmd("ZCARD")
        .arg("{redlease:retried}:queue")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(raw_len, 1, "one entry, not two");
    assert_eq!(queue_len(&mutex).await, 1);
    guard.release().await.unwrap();
    let second = within(5.0, "waiter served", waiter).await.unwrap().unwrap();
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_anything_is_sent() {
    let server = server();
    let client = client(&server.url()).await;
    assert!(matches!(
        client.fair_mutex("").unwrap_err(),
        redlease::Error::InvalidName { .. }
    ));
    assert!(matches!(
        client
            .fair_mutex_with("x", LeaseOptions::new().ttl(Duration::ZERO))
            .unwrap_err(),
        redlease::Error::InvalidTtl { .. }
    ));
    let err = client
        .fair_mutex("x")
        .unwrap()
        .with_waiter_ttl(Duration::from_millis(1))
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    let mut conn = raw(&server).await;
    assert!(keys_but_fencing(&mut conn).await.is_empty());
    // The default waiter TTL is 5 s, capped by a shorter lease.
    assert_eq!(
        client.fair_mutex("x").unwrap().waiter_ttl(),
        Duration::from_secs(5)
    );
    let short = client
        .fair_mutex_with("x", LeaseOptions::new().ttl(Duration::from_secs(2)))
        .unwrap();
    assert_eq!(short.waiter_ttl(), Duration::from_secs(2));

    // A key of the wrong type is a clear error and nothing is written.
    let _: () = redis::cmd("RPUSH")
        .arg("{redlease:typed}:queue")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let typed = client.fair_mutex("typed").unwrap();
    let err = typed.lock_timeout(Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
}

/// A waiter presumed dead (its entry pruned while it was paused, here removed behind
/// its back) is told by its next heartbeat, rejoins at the back at once, and keeps the
/// new entry alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_entry_vanished_rejoins_at_the_back_and_stays() {
    let server = server();
    let client = client(&server.url()).await;
    let waiter_ttl = Duration::from_millis(300);
    let mutex = client
        .fair_mutex("vanished")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap();
    let mut conn = raw(&server).await;
    let holder = mutex.lock().await.unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let (tx, mut positions) = tokio::sync::mpsc::unbounded_channel();
    let first = tokio::spawn({
        let (mutex, order) = (mutex.clone(), order.clone());
        async move {
            let guard = mutex
                .lock_with_position(None, |p| {
                    let _ = tx.send(p);
                })
                .await
                .unwrap();
            order.lock().unwrap().push("first");
            guard.release().await.unwrap();
        }
    });
    assert_eq!(within(5.0, "joined", positions.recv()).await, Some(0));
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("{redlease:vanished}:queue")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members.len(), 1);
    let second = tokio::spawn({
        let (mutex, order) = (mutex.clone(), order.clone());
        async move {
            let guard = mutex.lock().await.unwrap();
            order.lock().unwrap().push("second");
            guard.release().await.unwrap();
        }
    });
    eventually(5.0, "the second waiter joins", || {
        let mutex = mutex.clone();
        async move { queue_len(&mutex).await == 2 }
    })
    .await;
    // The first waiter's entry vanishes (as if pruned while its process was paused).
    let removed: i64 = redis::cmd("EVAL")
        .arg("return redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[2], ARGV[1])")
        .arg(2)
        .arg("{redlease:vanished}:queue")
        .arg("{redlease:vanished}:alive")
        .arg(&members[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(removed, 2);
    // Its next heartbeat (within a third of the waiter TTL) finds the entry gone and
    // wakes it; it rejoins behind the second waiter.
    let position = within(2.0, "the waiter rejoins", positions.recv()).await;
    assert_eq!(position, Some(1), "rejoined at the back");
    // Several waiter TTLs later both entries are alive: the new one is heartbeated.
    tokio::time::sleep(waiter_ttl * 4).await;
    assert_eq!(queue_len(&mutex).await, 2, "the rejoined entry lapsed");
    holder.release().await.unwrap();
    within(5.0, "first served", first).await.unwrap();
    within(5.0, "second served", second).await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["second", "first"]);
    let _ = &mut conn;
}

/// Redis holds back writes (`CLIENT PAUSE … WRITE`) for longer than the waiter TTL
/// while pub/sub keeps working, so the waiters' heartbeats cannot refresh their places
/// in time: after the pause the holder's release still reaches both queued waiters
/// promptly — not after the lock's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_promptly_after_writes_were_paused_past_their_waiter_ttl() {
    let server = server();
    let mut conn = raw(&server).await;
    let waiter_ttl = Duration::from_millis(800);
    let holder_client = client(&server.url()).await;
    let holder = holder_client
        .fair_mutex("paused")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiter_client = client(&server.url()).await;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mutex = waiter_client
            .fair_mutex("paused")
            .unwrap()
            .with_waiter_ttl(waiter_ttl)
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }));
    }
    eventually(2.0, "both waiters queued", || {
        let mut conn = conn.clone();
        async move {
            let n: u64 = redis::cmd("ZCARD")
                .arg("{redlease:paused}:queue")
                .query_async(&mut conn)
                .await
                .unwrap();
            n == 2
        }
    })
    .await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3000)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    within(5.0, "both waiters get the lock after the release", async {
        for t in tasks {
            let at = t.await.unwrap();
            assert!(at >= released);
        }
    })
    .await;
}
