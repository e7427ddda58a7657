//! The read-write lock against a real redis-server: shared reads, exclusive writes,
//! writer preference, independent leases, downgrade, faults and cancellation.

mod common;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use redlease::{LeaseOptions, LostReason};

/// Who is inside, checked on every entry and exit.
#[derive(Default)]
struct Recorder {
    readers: usize,
    writers: usize,
    max_readers: usize,
    reads: usize,
    writes: usize,
    violations: Vec<String>,
}

impl Recorder {
    fn enter_read(&mut self) {
        self.readers += 1;
        self.reads += 1;
        self.max_readers = self.max_readers.max(self.readers);
        if self.writers > 0 {
            self.violations
                .push(format!("a reader entered beside {} writer(s)", self.writers));
        }
    }
    fn leave_read(&mut self) {
        self.readers -= 1;
    }
    fn enter_write(&mut self) {
        self.writers += 1;
        self.writes += 1;
        if self.writers > 1 || self.readers > 0 {
            self.violations.push(format!(
                "a writer entered beside {} reader(s) and {} writer(s)",
                self.readers,
                self.writers - 1
            ));
        }
    }
    fn leave_write(&mut self) {
        self.writers -= 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_while_writers_are_exclusive() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let recorder = Arc::new(StdMutex::new(Recorder::default()));
    const TASKS: usize = 12;
    const ROUNDS: usize = 8;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = clients[t % 2].rwlock("shared-doc").unwrap();
        let recorder = recorder.clone();
        tasks.push(tokio::spawn(async move {
            let mut fences = Vec::new();
            for round in 0..ROUNDS {
                if (t + round) % 4 == 0 {
                    let guard = lock.write().await.expect("write");
                    recorder.lock().unwrap().enter_write();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    recorder.lock().unwrap().leave_write();
                    fences.push(guard.fence());
                    guard.release().await.expect("release write");
                } else {
                    let guard = lock.read().await.expect("read");
                    recorder.lock().unwrap().enter_read();
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    recorder.lock().unwrap().leave_read();
                    guard.release().await.expect("release read");
                }
            }
            fences
        }));
    }
    let mut fences = Vec::new();
    for t in tasks {
        fences.extend(within(120.0, "every task finishes", t).await.unwrap());
    }
    let rec = recorder.lock().unwrap();
    assert!(rec.violations.is_empty(), "{:?}", rec.violations);
    assert_eq!(rec.reads + rec.writes, TASKS * ROUNDS);
    assert_eq!(rec.writes, TASKS * ROUNDS / 4);
    assert!(
        rec.max_readers >= 2,
        "readers never overlapped (max {})",
        rec.max_readers
    );
    eprintln!("max concurrent readers {}", rec.max_readers);
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), rec.writes, "every write got its own fencing token");
}

/// Readers keep arriving so that some reader holds a share at every instant; a writer
/// must still get in, as soon as the readers that were inside when it arrived leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_behind_a_continuous_stream_of_readers() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let recorder = Arc::new(StdMutex::new(Recorder::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    const HOLD: Duration = Duration::from_millis(80);
    let mut readers = Vec::new();
    for r in 0..8 {
        let lock = clients[r % 2].rwlock("hot").unwrap();
        let (recorder, stop) = (recorder.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            // Staggered, so that shares overlap and never all end at once.
            tokio::time::sleep(HOLD * r as u32 / 8).await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let guard = lock.read().await.expect("read");
                recorder.lock().unwrap().enter_read();
                tokio::time::sleep(HOLD).await;
                recorder.lock().unwrap().leave_read();
                guard.release().await.expect("release read");
            }
        }));
    }
    let lock = clients[0].rwlock("hot").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        lock.try_write().await.unwrap_err().is_contended(),
        "the readers hold the lock continuously"
    );
    let mut waits = Vec::new();
    for _ in 0..3 {
        let inside = recorder.lock().unwrap().readers;
        assert!(inside > 0, "the reader stream has a gap");
        let started = Instant::now();
        let guard = within(10.0, "the writer gets in", lock.write()).await.unwrap();
        let waited = started.elapsed();
        recorder.lock().unwrap().enter_write();
        tokio::time::sleep(Duration::from_millis(20)).await;
        recorder.lock().unwrap().leave_write();
        guard.release().await.unwrap();
        waits.push(waited);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        within(10.0, "readers stop", r).await.unwrap();
    }
    eprintln!("writer waits behind the reader stream: {waits:?}");
    // Bounded by the shares held when the writer arrived (one HOLD), plus hand-over.
    for w in &waits {
        assert!(*w < HOLD * 4, "writer waited {w:?}");
    }
    let rec = recorder.lock().unwrap();
    assert!(rec.violations.is_empty(), "{:?}", rec.violations);
    assert!(
        rec.max_readers >= 4,
        "the stream was thin: max {}",
        rec.max_readers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_readers_share_lapses_within_its_ttl() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(600);
    let lock = client
        .rwlock_with("crashy", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let survivor = lock.read().await.unwrap();
    let crashed = lock.read().await.unwrap();
    // The reader stops renewing without releasing, as a crashed process would.
    let _token = crashed.forget();
    let forgotten = Instant::now();
    // The surviving reader leaves; only the crashed share blocks the writer now.
    survivor.release().await.unwrap();
    let guard = within(5.0, "the writer gets in", lock.write()).await.unwrap();
    let waited = forgotten.elapsed();
    eprintln!("writer waited {waited:?} for a crashed reader with ttl {ttl:?}");
    assert!(waited >= ttl / 2, "the crashed share was not held: {waited:?}");
    assert!(waited <= ttl + Duration::from_millis(300), "waited {waited:?}");
    let status = lock.status().await.unwrap();
    assert_eq!(status.readers, 0);
    assert!(status.write_held);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_leases_renew_and_end_independently() {
    let server = server();
    let client = client(&server.url()).await;
    let ttl = Duration::from_millis(300);
    let lock = client
        .rwlock_with("leases", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let a = lock.read().await.unwrap();
    let b = lock.read().await.unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(a.is_held() && b.is_held(), "renewal keeps both shares");
    assert_eq!(lock.status().await.unwrap().readers, 2);
    // Remove one share behind its back: only that reader is told.
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("ZREM")
        .arg("{redlease:leases}:readers")
        .arg(a.token().expose())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(within(2.0, "a loses", a.lost()).await, LostReason::Gone);
    assert!(b.is_held());
    b.extend(Duration::from_secs(60)).await.unwrap();
    assert!(a.extend(Duration::from_secs(60)).await.unwrap_err().is_not_held());
    assert!(a.release().await.unwrap_err().is_not_held());
    b.release().await.unwrap();
    assert!(!exists(&mut conn, "{redlease:leases}:readers").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_lets_no_writer_in_between() {
    let server = server();
    let client = client(&server.url()).await;
    let lock = client.rwlock("downgraded").unwrap();
    let mut conn = raw(&server).await;
    let writing = lock.write().await.unwrap();
    let first_fence = writing.fence();
    let next_writer = tokio::spawn({
        let lock = lock.clone();
        async move {
            let guard = lock.write().await.unwrap();
            (Instant::now(), guard.fence())
        }
    });
    eventually(5.0, "the second writer registers", || {
        let lock = lock.clone();
        async move { lock.status().await.unwrap().waiting_writers == 1 }
    })
    .await;
    let reading = within(5.0, "downgrade", writing.downgrade()).await.unwrap();
    let status = lock.status().await.unwrap();
    assert!(!status.write_held, "the write lock is gone");
    assert_eq!(status.readers, 1, "and a share took its place at once");
    assert!(!exists(&mut conn, "redlease:downgraded").await);
    // The waiting writer still waits (for our share), and keeps new readers out.
    assert!(lock.try_read().await.unwrap_err().is_contended());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !next_writer.is_finished(),
        "a writer got in beside the downgraded reader"
    );
    assert!(reading.is_held());
    let released = Instant::now();
    reading.release().await.unwrap();
    let (acquired, fence) = within(5.0, "the writer follows", next_writer).await.unwrap();
    assert!(fence > first_fence);
    assert!(
        acquired.duration_since(released) < Duration::from_millis(300),
        "woken by the last reader's release"
    );

    // Without writers waiting, a downgrade lets waiting readers in at once.
    let writing = lock.write().await.unwrap();
    let reader = tokio::spawn({
        let lock = lock.clone();
        async move {
            let guard = lock.read().await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    eventually(5.0, "the reader waits", || {
        let mut conn = conn.clone();
        async move {
            let subs: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("{redlease:downgraded}:wake:read")
                .query_async(&mut conn)
                .await
                .unwrap();
            subs[0].1 == 1
        }
    })
    .await;
    let downgraded = Instant::now();
    let reading = writing.downgrade().await.unwrap();
    let entered = within(5.0, "the reader enters", reader).await.unwrap();
    assert!(
        entered.duration_since(downgraded) < Duration::from_millis(300),
        "woken by the downgrade, not by its fallback"
    );
    reading.release().await.unwrap();
    let _ = &mut conn;
}

/// A writer that dies while waiting keeps readers out only until its registration
/// lapses (the waiter TTL), never for the lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiting_writer_keeps_readers_out_only_for_its_waiter_ttl() {
    let server = server();
    let client = client(&server.url()).await;
    let waiter_ttl = Duration::from_millis(500);
    let lock = client
        .rwlock("ghost")
        .unwrap()
        .with_waiter_ttl(waiter_ttl)
        .unwrap();
    let reading = lock.read().await.unwrap();
    // The writer's process dies while it waits: its runtime is torn down mid-wait, so
    // neither its heartbeat nor its clean-up ever runs.
    let (registered_tx, registered_rx) = std::sync::mpsc::channel();
    let url = server.url();
    let doomed = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let dying = common::client(&url).await;
            let lock = dying
                .rwlock("ghost")
                .unwrap()
                .with_waiter_ttl(waiter_ttl)
                .unwrap();
            let observer = lock.clone();
            tokio::select! {
                _ = lock.write() => panic!("the reader holds the lock"),
                _ = async {
                    while observer.status().await.unwrap().waiting_writers == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                } => {}
            }
        });
        rt.shutdown_background();
        registered_tx.send(Instant::now()).unwrap();
    });
    let died = registered_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    doomed.join().unwrap();
    assert_eq!(lock.status().await.unwrap().waiting_writers, 1);
    assert!(
        lock.try_read().await.unwrap_err().is_contended(),
        "writer preference"
    );
    let second = within(5.0, "a reader gets in after the registration lapses", lock.read())
        .await
        .unwrap();
    let waited = died.elapsed();
    eprintln!("readers were kept out {waited:?} by a dead writer (waiter ttl {waiter_ttl:?})");
    // The readers retry when the registration would lapse (plus up to 10% jitter).
    assert!(waited <= waiter_ttl + Duration::from_millis(400), "{waited:?}");
    assert_eq!(lock.status().await.unwrap().waiting_writers, 0);
    second.release().await.unwrap();
    reading.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_nothing_and_free_the_readers() {
    let server = server();
    let client = client(&server.url()).await;
    let lock = client.rwlock("cancelled").unwrap();
    let mut conn = raw(&server).await;

    // A writer that gives up withdraws its registration: readers may enter again.
    let reading = lock.read().await.unwrap();
    let err = lock.write_timeout(Duration::from_millis(300)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    eventually(2.0, "the registration is withdrawn", || {
        let lock = lock.clone();
        async move { lock.status().await.unwrap().waiting_writers == 0 }
    })
    .await;
    lock.try_read().await.unwrap().release().await.unwrap();

    // Readers kept out by a waiting writer are woken when it is cancelled.
    let writer = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().await }
    });
    eventually(5.0, "registered", || {
        let lock = lock.clone();
        async move { lock.status().await.unwrap().waiting_writers == 1 }
    })
    .await;
    let blocked_reader = tokio::spawn({
        let lock = lock.clone();
        async move { lock.read().await.map(|_| Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!blocked_reader.is_finished(), "writer preference");
    let cancelled = Instant::now();
    writer.abort();
    let entered = within(5.0, "the reader enters", blocked_reader)
        .await
        .unwrap()
        .unwrap();
    assert!(entered.duration_since(cancelled) < Duration::from_millis(300));
    reading.release().await.unwrap();

    // Acquisitions cancelled at any point leave nothing behind.
    for delay_us in [0u64, 20, 50, 100, 200, 400, 800, 1600] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), lock.write()).await;
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), lock.read()).await;
        eventually(2.0, "no orphan after cancellation", || {
            let mut conn = conn.clone();
            async move {
                let keys = keys_but_fencing(&mut conn).await;
                keys.iter().all(|(k, _)| k == "{redlease:cancelled}:meta")
            }
        })
        .await;
    }
    let _ = &mut conn;
}

/// A lost reply under retry, for both sides: the request lands, the reply is held past the client's
/// timeout, and the retry reports what it already holds — exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_acquires_report_what_they_already_took() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(200), Duration::from_secs(3)).await;
    let lock = client.rwlock("retried").unwrap();
    let mut conn = raw(&server).await;

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_write().await }
    });
    eventually(2.0, "the write lock is written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "redlease:retried").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    proxy.release_replies();
    let writing = within(5.0, "try_write returns", attempt)
        .await
        .unwrap()
        .expect("the retry finds its own token");
    assert_eq!(
        get(&mut conn, "redlease:retried").await.as_deref(),
        Some(writing.token().expose())
    );
    assert_eq!(lock.status().await.unwrap().fence, Some(writing.fence()));
    writing.release().await.unwrap();

    proxy.hold_replies();
    let attempt = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_read().await }
    });
    eventually(2.0, "the share is written", || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, "{redlease:retried}:readers").await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    proxy.release_replies();
    let reading = within(5.0, "try_read returns", attempt)
        .await
        .unwrap()
        .expect("the retry finds its own share");
    let shares: u64 = redis::cmd("ZCARD")
        .arg("{redlease:retried}:readers")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(shares, 1, "one share, not two");
    reading.release().await.unwrap();
    assert!(!exists(&mut conn, "{redlease:retried}:readers").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_fences_and_expiry() {
    let server = server();
    let client = client(&server.url()).await;
    let lock = client.rwlock("layout").unwrap();
    let plain = client.mutex("layout").unwrap();
    let mut conn = raw(&server).await;

    // Write fences continue the plain mutex's sequence, and the plain mutex excludes.
    let p = plain.lock().await.unwrap();
    assert!(lock.try_read().await.unwrap_err().is_contended());
    assert!(lock.try_write().await.unwrap_err().is_contended());
    let plain_fence = p.fence();
    p.release().await.unwrap();
    let w = lock.write().await.unwrap();
    assert!(w.fence() > plain_fence);
    assert!(plain.try_lock().await.unwrap_err().is_contended());
    assert_eq!(
        get(&mut conn, "redlease:layout").await.as_deref(),
        Some(w.token().expose())
    );
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.write().await.map(|g| g.fence()) }
    });
    eventually(5.0, "registered", || {
        let lock = lock.clone();
        async move { lock.status().await.unwrap().waiting_writers == 1 }
    })
    .await;
    let status = lock.status().await.unwrap();
    assert!(status.write_held);
    assert_eq!(status.fence, Some(w.fence()));
    assert!(status.writer.is_some());
    let keys = keys_but_fencing(&mut conn).await;
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "redlease:layout",
            "{redlease:layout}:meta",
            "{redlease:layout}:writers"
        ]
    );
    assert!(keys.iter().all(|(_, t)| *t > 0), "a key without TTL: {keys:?}");
    let first = w.fence();
    w.release().await.unwrap();
    let second = within(5.0, "the waiting writer follows", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(second > first);
    let r = lock.read().await.unwrap();
    let keys = keys_but_fencing(&mut conn).await;
    assert!(keys.iter().all(|(_, t)| *t > 0), "a key without TTL: {keys:?}");
    assert!(keys.iter().any(|(k, _)| k == "{redlease:layout}:readers"));
    r.release().await.unwrap();
    eventually(2.0, "only metadata is left", || {
        let mut conn = conn.clone();
        async move {
            let keys = keys_but_fencing(&mut conn).await;
            keys.len() == 1 && keys[0].0 == "{redlease:layout}:meta"
        }
    })
    .await;
    let _ = &mut conn;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_wrong_types_are_clear_errors() {
    let server = server();
    let client = client(&server.url()).await;
    assert!(matches!(
        client.rwlock("a}b").unwrap_err(),
        redlease::Error::InvalidName { .. }
    ));
    assert!(
        client
            .rwlock_with("x", LeaseOptions::new().ttl(Duration::from_secs(40 * 24 * 3600)))
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        client
            .rwlock("x")
            .unwrap()
            .with_waiter_ttl(Duration::ZERO)
            .unwrap_err()
            .is_invalid_input()
    );
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SET")
        .arg("{redlease:typed}:readers")
        .arg("not a set")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lock = client.rwlock("typed").unwrap();
    let err = lock.try_read().await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
    let err = lock.try_write().await.unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err:?}");
    assert!(!exists(&mut conn, "redlease:typed").await, "no half-written lock");
}
