//! Hand-overs and their margins: a lock or permits handed over (locally for the claim
//! window, or by a release) are never believed longer than the server holds them, are
//! relied on without a round trip on long leases too, give a handle without automatic
//! renewal its whole lease; an unconfirmed hand-over never holds or releases another's
//! lock; and under stalls and short leases two guards never hold at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use redlease::LeaseOptions;

/// The server's expiry of the mutex key is at most `received + pttl`: fails when the
/// guard's `valid_until` is later than that.
async fn assert_mutex_within_server(
    conn: &mut redis::aio::MultiplexedConnection,
    g: &redlease::MutexGuard,
    what: &str,
) {
    let vu = g.valid_until();
    let token: Option<String> = get(conn, g.key()).await;
    assert_eq!(
        token.as_deref(),
        Some(g.token().expose()),
        "{what}: the key is the guard's"
    );
    let p = pttl(conn, g.key()).await;
    let received = std::time::Instant::now();
    assert!(p > 0, "{what}: pttl {p}");
    let server_expiry_at_most = received + Duration::from_millis(p as u64 + 1);
    assert!(
        vu <= server_expiry_at_most,
        "{what}: the guard believes {:?} longer than the server holds (pttl {p} ms)",
        vu - server_expiry_at_most
    );
}

/// The semaphore permit's deadline on the server is at most `received + left`.
async fn assert_permit_within_server(
    conn: &mut redis::aio::MultiplexedConnection,
    p: &redlease::Permit,
    what: &str,
) {
    let vu = p.valid_until();
    let script = redis::Script::new(
        "local s = redis.call('ZSCORE', KEYS[1], ARGV[1]) if not s then return -1 end \
         local t = redis.call('TIME') return tonumber(s) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))",
    );
    let left: i64 = script
        .key(p.key())
        .arg(format!("{}:1", p.token().expose()))
        .invoke_async(conn)
        .await
        .unwrap();
    let received = std::time::Instant::now();
    assert!(left > 0, "{what}: left {left}");
    let at_most = received + Duration::from_millis(left as u64 + 1);
    assert!(
        vu <= at_most,
        "{what}: the permit believes {:?} longer than the server holds ({left} ms left)",
        vu - at_most
    );
}

/// Waits until the lease's valid_until moved past `before` (a renewal came back).
async fn until_renewed(lease: &redlease::Lease, before: std::time::Instant, secs: f64, what: &str) {
    eventually(secs, what, || {
        let lease = lease.clone();
        async move { lease.valid_until() > before }
    })
    .await;
}

/// A local hand-over to waiters of several handles (other TTL than the holder's,
/// with and without automatic renewal, very short): right after it, after an extend,
/// and after the first renewal, valid_until is never past the server's expiry; a
/// handed lock of a long lease outlives the claim window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_hand_over_valid_until_is_within_the_server_expiry() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let cases: &[(&str, u64, bool, u64, bool)] = &[
        // (name, holder ttl ms, holder auto, waiter ttl ms, waiter auto)
        ("long-waiter", 1000, true, 15_000, true),
        ("mid-waiter", 15_000, true, 3_000, true),
        ("manual-waiter", 1000, true, 5_000, false),
        ("short-waiter", 15_000, true, 50, true),
    ];
    for &(name, hold_ttl, hold_auto, wait_ttl, wait_auto) in cases {
        let holder = c
            .mutex_with(
                name,
                LeaseOptions::new()
                    .ttl(Duration::from_millis(hold_ttl))
                    .auto_renew(hold_auto),
            )
            .unwrap();
        let waiter = c
            .mutex_with(
                name,
                LeaseOptions::new()
                    .ttl(Duration::from_millis(wait_ttl))
                    .auto_renew(wait_auto),
            )
            .unwrap();
        let held = holder.lock().await.unwrap();
        let mut waiting = locking(&waiter);
        poll_once(&mut waiting).await;
        held.release().await.unwrap();
        let g = within(5.0, "the waiter gets the lock", waiting).await.unwrap();
        assert!(g.is_held(), "{name}: held");
        assert_mutex_within_server(&mut conn, &g, &format!("{name}: after the hand-over")).await;
        if wait_auto {
            let before = g.valid_until();
            until_renewed(g.lease(), before, 3.0, &format!("{name}: first renewal")).await;
            assert_mutex_within_server(&mut conn, &g, &format!("{name}: after the first renewal")).await;
        }
        if wait_auto && wait_ttl > 2000 {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert!(g.is_held(), "{name}: lost past the claim window");
            assert!(
                pttl(&mut conn, g.key()).await > 2000,
                "{name}: server pttl too short"
            );
        }
        g.release().await.unwrap();

        // extend() right after a local hand-over, for less than the claim window.
        let held = holder.lock().await.unwrap();
        let mut waiting = locking(&waiter);
        poll_once(&mut waiting).await;
        held.release().await.unwrap();
        let g = within(5.0, "the waiter gets the lock", waiting).await.unwrap();
        let short = Duration::from_millis(wait_ttl.clamp(20, 300));
        let ext = g.extend(short).await;
        if g.is_held() {
            ext.unwrap();
            assert_mutex_within_server(&mut conn, &g, &format!("{name}: after extend({short:?})")).await;
        }
        let _ = g.release().await;
    }
}

/// The same for the semaphore's local hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_hand_over_valid_until_is_within_the_server_expiry() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let cases: &[(&str, u64, u64, bool)] = &[
        ("s-long", 1000, 15_000, true),
        ("s-mid", 15_000, 3_000, true),
        ("s-manual", 1000, 5_000, false),
        ("s-short", 15_000, 50, true),
    ];
    for &(name, hold_ttl, wait_ttl, wait_auto) in cases {
        let holder = c
            .semaphore_with(name, 1, LeaseOptions::new().ttl(Duration::from_millis(hold_ttl)))
            .unwrap();
        let waiter = c
            .semaphore_with(
                name,
                1,
                LeaseOptions::new()
                    .ttl(Duration::from_millis(wait_ttl))
                    .auto_renew(wait_auto),
            )
            .unwrap();
        let held = holder.acquire().await.unwrap();
        // One task of the client waits in Redis; the next queues locally behind it.
        let in_redis = tokio::spawn({
            let s = holder.clone();
            async move { s.acquire_timeout(Duration::from_secs(30)).await }
        });
        registered_and_subscribed(&conn, &holder, 1).await;
        let mut queued: Boxed<redlease::Result<redlease::Permit>> = Box::pin({
            let s = waiter.clone();
            async move { s.acquire().await }
        });
        poll_once(&mut queued).await;
        held.release().await.unwrap();
        let p = within(5.0, "the queued task gets the permit", queued)
            .await
            .unwrap();
        assert!(p.is_held(), "{name}: held");
        assert_permit_within_server(&mut conn, &p, &format!("{name}: after the hand-over")).await;
        if wait_auto {
            let before = p.valid_until();
            until_renewed(p.lease(), before, 3.0, &format!("{name}: first renewal")).await;
            assert_permit_within_server(&mut conn, &p, &format!("{name}: after the first renewal")).await;
        }
        if wait_auto && wait_ttl > 2000 {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert!(p.is_held(), "{name}: lost past the claim window");
        }
        p.release().await.unwrap();
        let got = within(10.0, "the task in Redis", in_redis)
            .await
            .unwrap()
            .unwrap();
        got.release().await.unwrap();
    }
}

/// Short leases (10–50 ms, with and without automatic renewal), with stalls: lock
/// futures polled once and left alone for a while, release futures polled once and
/// left alone for a while, then awaited or dropped. Whenever a task gets a guard, no
/// other guard is still valid, and fences rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_leases_with_stalls_never_overlap() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    type Holders = Vec<(u64, redlease::Lease, String)>;
    let holders: Arc<std::sync::Mutex<Holders>> = Arc::default();
    let max_fence = Arc::new(std::sync::Mutex::new((0u64, String::new())));
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for t in 0..6u64 {
            let ttl = Duration::from_millis([10, 25, 50, 2500][(t % 4) as usize]);
            let auto = t % 2 == 0 || t == 3;
            let m = c
                .mutex_with("short-stalls", LeaseOptions::new().ttl(ttl).auto_renew(auto))
                .unwrap();
            let (holders, max_fence) = (holders.clone(), max_fence.clone());
            tasks.push(tokio::spawn(async move {
                let mut got = 0;
                for round in 0..30u64 {
                    let k = (t * 5 + round * 3 + ci as u64) % 5;
                    let mut f: Locking = {
                        let m = m.clone();
                        Box::pin(async move { m.lock_timeout(Duration::from_secs(20)).await })
                    };
                    if k == 1 {
                        // Polled once, then left alone for a while (a stalled task).
                        let r = std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await;
                        if let std::task::Poll::Ready(r) = r {
                            drop(r);
                            continue;
                        }
                        tokio::time::sleep(Duration::from_millis(5 + (round % 4) * 40)).await;
                    }
                    let r = f.await;
                    let g = match r {
                        Ok(g) => g,
                        Err(e) if e.is_timeout() => continue,
                        Err(e) => panic!("{e}"),
                    };
                    let me = format!("client {ci} task {t} round {round} kind {k}");
                    {
                        let mut hs = holders.lock().unwrap();
                        if g.is_held() {
                            for (f, l, who) in hs.iter() {
                                assert!(
                                    !l.is_held(),
                                    "two holders: {me} (fence {}) while {who} (fence {f}) is still valid for {:?}",
                                    g.fence(),
                                    l.valid_until().saturating_duration_since(std::time::Instant::now())
                                );
                            }
                        }
                        let mut mf = max_fence.lock().unwrap();
                        let left = g.valid_until().saturating_duration_since(std::time::Instant::now());
                        if g.is_held() {
                            assert!(
                                g.fence().get() > mf.0,
                                "fence backwards: {me} got {} (still valid for {left:?}) after {} ({})",
                                g.fence(),
                                mf.0,
                                mf.1
                            );
                        }
                        if g.fence().get() > mf.0 {
                            *mf = (g.fence().get(), me.clone());
                        }
                        hs.retain(|(_, l, _)| l.is_held());
                        hs.push((g.fence().get(), g.lease().clone(), me));
                    }
                    got += 1;
                    tokio::task::yield_now().await;
                    match (round + t) % 4 {
                        0 => drop(g),
                        1 => {
                            // The release polled once, stalled, then finished.
                            let mut rel: Boxed<redlease::Result<()>> = Box::pin(g.release());
                            let r = std::future::poll_fn(|cx| std::task::Poll::Ready(rel.as_mut().poll(cx))).await;
                            if r.is_pending() {
                                tokio::time::sleep(Duration::from_millis(30)).await;
                                let _ = rel.await;
                            }
                        }
                        2 => {
                            // The release polled once, stalled, then dropped.
                            let mut rel: Boxed<redlease::Result<()>> = Box::pin(g.release());
                            let r = std::future::poll_fn(|cx| std::task::Poll::Ready(rel.as_mut().poll(cx))).await;
                            if r.is_pending() {
                                tokio::time::sleep(Duration::from_millis(15)).await;
                                drop(rel);
                            }
                        }
                        _ => {
                            let _ = g.release().await;
                        }
                    }
                }
                got
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += within(180.0, "all tasks finish", t).await.unwrap();
    }
    eprintln!("acquired {total}");
    assert!(total > 50, "only {total}");
}

/// The semaphore: short leases, stalls and cancellations; never more valid
/// permits than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_short_leases_with_stalls_never_exceed_the_limit() {
    let server = server();
    let conn = raw(&server).await;
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let holders: Arc<std::sync::Mutex<Vec<(redlease::Lease, String)>>> = Arc::default();
    let mut tasks = Vec::new();
    for (ci, c) in clients.iter().enumerate() {
        for t in 0..6u64 {
            let ttl = Duration::from_millis([10, 25, 50, 2500][(t % 4) as usize]);
            let auto = t % 2 == 0 || t == 3;
            let sem = c
                .semaphore_with("s-short-stalls", 2, LeaseOptions::new().ttl(ttl).auto_renew(auto))
                .unwrap();
            let holders = holders.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = 0;
                for round in 0..30u64 {
                    let k = (t * 5 + round * 3 + ci as u64) % 5;
                    let mut f: Boxed<redlease::Result<redlease::Permit>> = {
                        let sem = sem.clone();
                        Box::pin(async move { sem.acquire_timeout(Duration::from_secs(20)).await })
                    };
                    if k == 1 {
                        let r = std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await;
                        if let std::task::Poll::Ready(r) = r {
                            drop(r);
                            continue;
                        }
                        tokio::time::sleep(Duration::from_millis(5 + (round % 4) * 10)).await;
                    } else if k == 2 {
                        // Polled once and dropped.
                        let r = std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await;
                        drop(r);
                        drop(f);
                        continue;
                    }
                    let p = match f.await {
                        Ok(p) => p,
                        Err(e) if e.is_timeout() => continue,
                        Err(e) => panic!("{e}"),
                    };
                    let me = format!("client {ci} task {t} round {round} kind {k}");
                    {
                        let mut hs = holders.lock().unwrap();
                        hs.retain(|(l, _)| l.is_held());
                        if p.is_held() {
                            assert!(
                                hs.len() < 2,
                                "{me} holds while {} other permits are valid: {:?}",
                                hs.len(),
                                hs.iter().map(|(_, w)| w.clone()).collect::<Vec<_>>()
                            );
                        }
                        hs.push((p.lease().clone(), me));
                    }
                    got += 1;
                    tokio::task::yield_now().await;
                    match (round + t) % 4 {
                        0 => drop(p),
                        1 => {
                            let mut rel: Boxed<redlease::Result<()>> = Box::pin(p.release());
                            let r = std::future::poll_fn(|cx| std::task::Poll::Ready(rel.as_mut().poll(cx)))
                                .await;
                            if r.is_pending() {
                                tokio::time::sleep(Duration::from_millis(30)).await;
                                let _ = rel.await;
                            }
                        }
                        2 => {
                            let mut rel: Boxed<redlease::Result<()>> = Box::pin(p.release());
                            let r = std::future::poll_fn(|cx| std::task::Poll::Ready(rel.as_mut().poll(cx)))
                                .await;
                            if r.is_pending() {
                                tokio::time::sleep(Duration::from_millis(15)).await;
                                drop(rel);
                            }
                        }
                        _ => {
                            let _ = p.release().await;
                        }
                    }
                }
                got
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += within(180.0, "all tasks finish", t).await.unwrap();
    }
    eprintln!("acquired {total}");
    assert!(total > 50, "only {total}");
    eventually(10.0, "every permit given back", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "redlease:s-short-stalls").await == 0 }
    })
    .await;
}

/// The hand-over does not land (the holder's lock was taken away: deleted and taken
/// by another client X): the picked waiter gets an unconfirmed hand-over, goes to Redis
/// with its token, and must wait for X — not believe it holds. Dropped unread instead,
/// its background release must leave X's lock alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_unlanded_hand_over_neither_holds_nor_releases_anothers_lock() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    for read in [true, false] {
        let name = if read { "unlanded-read" } else { "unlanded-dropped" };
        let m = c
            .mutex_with(name, LeaseOptions::new().ttl(Duration::from_secs(5)))
            .unwrap();
        let held = m.lock().await.unwrap();
        let mut w = locking(&m);
        poll_once(&mut w).await;
        // The lock is taken away from the holder: deleted, and taken by X.
        let _: () = redis::cmd("DEL")
            .arg(m.key())
            .query_async(&mut conn)
            .await
            .unwrap();
        let x = other.mutex(name).unwrap().try_lock().await.unwrap();
        let err = held.release().await;
        assert!(
            err.is_err(),
            "the holder's release says it no longer held: {err:?}"
        );
        if read {
            let w = tokio::spawn(w);
            // X holds: the waiter must not get a guard.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(!w.is_finished(), "the waiter returned while X holds");
            assert_eq!(get(&mut conn, m.key()).await.as_deref(), Some(x.token().expose()));
            x.release().await.unwrap();
            let g = within(10.0, "the waiter after X", w).await.unwrap().unwrap();
            assert!(g.is_held());
            assert_eq!(get(&mut conn, m.key()).await.as_deref(), Some(g.token().expose()));
            g.release().await.unwrap();
        } else {
            drop(w);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(
                get(&mut conn, m.key()).await.as_deref(),
                Some(x.token().expose()),
                "X's lock was released"
            );
            assert!(x.is_held());
            x.release().await.unwrap();
            // The turn passed on: a new task of the client takes the free lock.
            let g = within(5.0, "a new task", m.lock_timeout(Duration::from_secs(3)))
                .await
                .unwrap();
            g.release().await.unwrap();
        }
    }
}

/// The semaphore: the hand-over does not land (the holder's permit was taken
/// away and the room taken by X): the queued task goes to Redis and must not get a
/// permit beyond the limit; dropped unread, it must not release X's permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_unlanded_hand_over_neither_holds_nor_releases_anothers_permit() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let other = client(&server.url()).await;
    for read in [true, false] {
        let name = if read {
            "s-unlanded-read"
        } else {
            "s-unlanded-dropped"
        };
        let sem = c
            .semaphore_with(name, 1, LeaseOptions::new().ttl(Duration::from_secs(5)))
            .unwrap();
        let held = sem.acquire().await.unwrap();
        let in_redis = tokio::spawn({
            let s = sem.clone();
            async move { s.acquire_timeout(Duration::from_secs(30)).await }
        });
        registered_and_subscribed(&conn, &sem, 1).await;
        let mut q: Boxed<redlease::Result<redlease::Permit>> = Box::pin({
            let s = sem.clone();
            async move { s.acquire_timeout(Duration::from_secs(30)).await }
        });
        poll_once(&mut q).await;
        // The holder's permit is taken away, and X takes the room.
        let _: () = redis::cmd("ZREM")
            .arg(sem.key())
            .arg(format!("{}:1", held.token().expose()))
            .query_async(&mut conn)
            .await
            .unwrap();
        let x = other.semaphore(name, 1).unwrap().try_acquire().await.unwrap();
        let err = held.release().await;
        assert!(
            err.is_err(),
            "the holder's release says it no longer held: {err:?}"
        );
        if read {
            let q = tokio::spawn(q);
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(
                !q.is_finished(),
                "the queued task returned while X holds the only permit"
            );
            assert!(
                !in_redis.is_finished(),
                "the task in Redis returned while X holds the only permit"
            );
            x.release().await.unwrap();
            let (mut a, mut b) = (q, in_redis);
            let (first, a_first) = within(10.0, "one of them gets the permit", async {
                tokio::select! {
                    r = &mut a => (r, true),
                    r = &mut b => (r, false),
                }
            })
            .await;
            let p = first.unwrap().unwrap();
            assert!(p.is_held());
            p.release().await.unwrap();
            let other = if a_first { b } else { a };
            let p = within(10.0, "the other gets the permit", other)
                .await
                .unwrap()
                .unwrap();
            assert!(p.is_held());
            p.release().await.unwrap();
        } else {
            drop(q);
            tokio::time::sleep(Duration::from_millis(500)).await;
            let m = members(&conn, sem.key()).await;
            assert_eq!(
                m,
                vec![format!("{}:1", x.token().expose())],
                "X's permit was released"
            );
            assert!(x.is_held());
            x.release().await.unwrap();
            let p = within(10.0, "the task in Redis", in_redis)
                .await
                .unwrap()
                .unwrap();
            p.release().await.unwrap();
        }
        let _ = &mut conn;
    }
}

/// A waiter in Redis whose handle does not renew automatically, granted the lock by
/// another client's release, holds it for its whole lease — not the release's claim
/// window, which nobody would extend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_renew_waiter_granted_by_a_release_gets_its_lease() {
    let server = server();
    let mut conn = raw(&server).await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let ma = a
        .mutex_with("granted-manual", LeaseOptions::new().ttl(Duration::from_secs(15)))
        .unwrap();
    let mb = b
        .mutex_with(
            "granted-manual",
            LeaseOptions::new().ttl(Duration::from_secs(15)).auto_renew(false),
        )
        .unwrap();
    let held = ma.lock().await.unwrap();
    let waiting = tokio::spawn(async move { mb.lock().await });
    eventually(5.0, "b registered", || {
        let mut conn = conn.clone();
        async move { zcard(&mut conn, "{redlease:granted-manual}:q").await == 1 }
    })
    .await;
    held.release().await.unwrap();
    let g = within(5.0, "b gets the lock", waiting).await.unwrap().unwrap();
    let left = g
        .valid_until()
        .saturating_duration_since(std::time::Instant::now());
    let p = pttl(&mut conn, g.key()).await;
    eprintln!("granted manual-renew guard: valid for {left:?}, server pttl {p} ms");
    assert!(
        left > Duration::from_secs(10),
        "a 15 s manual lease granted for {left:?} (server {p} ms)"
    );
}

/// A local hand-over holds for the claim window (2 s). Believed minus the drift margin
/// of the waiter's *whole* lease (1% + 2 ms), from a lease of about 190 s up that
/// margin ate the whole window: the hand-over was never relied on, and every waiter
/// went to Redis again with the token it was handed, paying the round trip the
/// hand-over exists to save. A 300 s lease costs what a 30 s one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_hand_over_on_a_long_lease_is_relied_on_without_a_round_trip() {
    let server = server();
    let mut conn = raw(&server).await;
    let c = client(&server.url()).await;
    let mut extra = Vec::new();
    for secs in [30u64, 300] {
        let name = format!("long-lease-{secs}");
        let m = c
            .mutex_with(&name, LeaseOptions::new().ttl(Duration::from_secs(secs)))
            .unwrap();
        let held = m.lock().await.unwrap();
        let mut waiting = locking(&m);
        poll_once(&mut waiting).await;
        let before = (
            command_calls(&mut conn, "set").await,
            command_calls(&mut conn, "evalsha").await,
        );
        held.release().await.unwrap();
        let g = within(5.0, "the waiter gets the lock", waiting).await.unwrap();
        let after = (
            command_calls(&mut conn, "set").await,
            command_calls(&mut conn, "evalsha").await,
        );
        assert!(g.is_held());
        // The hand-over is one evalsha (with one SET inside, which commandstats counts);
        // anything more is the waiter going to Redis again.
        extra.push((secs, after.0 - before.0, after.1 - before.1));
        g.release().await.unwrap();

        let sem = c
            .semaphore_with(
                &format!("s-{name}"),
                1,
                LeaseOptions::new().ttl(Duration::from_secs(secs)),
            )
            .unwrap();
        let p = sem.acquire().await.unwrap();
        let spawned = command_calls(&mut conn, "evalsha").await;
        let in_redis = tokio::spawn({
            let s = sem.clone();
            async move { s.acquire_timeout(Duration::from_secs(30)).await }
        });
        registered_and_subscribed(&conn, &sem, 1).await;
        // Its attempt once subscribed, which would otherwise fall in the count below.
        eventually(5.0, "the waiter's attempt after subscribing", || {
            let mut conn = conn.clone();
            async move { command_calls(&mut conn, "evalsha").await >= spawned + 2 }
        })
        .await;
        let mut queued: Boxed<redlease::Result<redlease::Permit>> = Box::pin({
            let s = sem.clone();
            async move { s.acquire().await }
        });
        poll_once(&mut queued).await;
        let before = command_calls(&mut conn, "evalsha").await;
        p.release().await.unwrap();
        let q = within(5.0, "the queued task gets the permit", queued)
            .await
            .unwrap();
        let after = command_calls(&mut conn, "evalsha").await;
        assert!(q.is_held());
        extra.push((secs * 1000, 0, after - before));
        q.release().await.unwrap();
        within(10.0, "in redis", in_redis)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    eprintln!("(ttl, set calls, evalsha calls) per hand-over (semaphore rows: ttl x1000): {extra:?}");
    let (_, short_set, short_mutex) = extra[0];
    let (_, _, short_sem) = extra[1];
    let (_, long_set, long_mutex) = extra[2];
    let (_, _, long_sem) = extra[3];
    assert!(
        long_set == short_set && long_mutex == short_mutex && long_sem == short_sem,
        "a hand-over on a 300 s lease costs more round trips than on a 30 s lease: {extra:?}"
    );
}
