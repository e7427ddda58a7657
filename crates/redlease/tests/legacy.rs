//! The legacy timestamp lock against a real redis-server, beside old-style clients that
//! follow the locking pattern of the Redis SETNX page (SETNX, GET, GETSET, DEL) to the letter.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use redis::aio::MultiplexedConnection;
use redlease::{Error, LegacyLock, LegacyOptions, LostReason, TimestampUnit};

/// The lock key old clients use; redlease reaches it with an empty prefix.
const KEY: &str = "lock.foo";

async fn legacy_client(server: &RedisServer) -> redlease::Client {
    redlease::Client::builder(server.client())
        .prefix("")
        .build()
        .await
        .expect("connect")
}

fn lock(client: &redlease::Client, options: LegacyOptions) -> LegacyLock {
    client.legacy_lock(KEY, options).expect("legacy lock")
}

fn seconds(timeout: u64) -> LegacyOptions {
    LegacyOptions::new()
        .timeout(Duration::from_secs(timeout))
        .poll_interval(Duration::from_millis(10))
}

/// Redis's clock, in seconds and milliseconds.
async fn redis_now(conn: &mut MultiplexedConnection) -> (u64, u64) {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    (s, s * 1000 + us / 1000)
}

/// Leaves the lock as a holder that crashed long ago would: an old timestamp, no TTL.
async fn leave_stale_lock(conn: &mut MultiplexedConnection) {
    let (now, _) = redis_now(conn).await;
    let _: () = redis::cmd("SET")
        .arg(KEY)
        .arg(now - 100)
        .query_async(conn)
        .await
        .unwrap();
}

/// An unmodified old client: the algorithm of the Redis SETNX page,
/// command for command, with its own clock in Unix seconds.
struct OldClient {
    conn: MultiplexedConnection,
    timeout: u64,
    poll: Duration,
}

#[derive(Debug, PartialEq, Eq)]
enum OldOutcome {
    /// `SETNX` returned 1.
    Set(u64),
    /// `GETSET` returned an expired timestamp (or nothing): the takeover won.
    TookOver(u64),
    /// The lock is held (`GET` showed a live timestamp, or `GETSET` returned one).
    Held,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn stamp(value: &Option<String>) -> Option<u64> {
    value.as_deref().and_then(|v| v.parse().ok())
}

impl OldClient {
    async fn new(server: &RedisServer, timeout: u64) -> Self {
        OldClient {
            conn: raw(server).await,
            timeout,
            poll: Duration::from_millis(10),
        }
    }

    /// `SETNX lock.foo <now + timeout + 1>`.
    async fn setnx(&mut self) -> Option<u64> {
        let value = unix_now() + self.timeout + 1;
        let set: i64 = redis::cmd("SETNX")
            .arg(KEY)
            .arg(value)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        (set == 1).then_some(value)
    }

    /// `GET lock.foo`: the timestamp, if it is older than now (expired).
    async fn get_expired(&mut self) -> Option<u64> {
        let current: Option<String> = redis::cmd("GET")
            .arg(KEY)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        stamp(&current).filter(|&t| t < unix_now())
    }

    /// `GETSET lock.foo <now + timeout + 1>`: won if the old value is still expired.
    async fn getset(&mut self) -> OldOutcome {
        let now = unix_now();
        let value = now + self.timeout + 1;
        let old: Option<String> = redis::cmd("GETSET")
            .arg(KEY)
            .arg(value)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        // GETSET on a missing key returned nil and set it: nobody else can have it.
        match stamp(&old) {
            None if old.is_none() => OldOutcome::TookOver(value),
            Some(t) if t < now => OldOutcome::TookOver(value),
            _ => OldOutcome::Held,
        }
    }

    /// One pass of the algorithm: SETNX; else GET; if expired, GETSET.
    async fn try_lock(&mut self) -> OldOutcome {
        if let Some(v) = self.setnx().await {
            return OldOutcome::Set(v);
        }
        if self.get_expired().await.is_none() {
            return OldOutcome::Held;
        }
        self.getset().await
    }

    /// Retries the pass, sleeping in between, until it wins; returns its timestamp.
    async fn lock(&mut self) -> u64 {
        loop {
            match self.try_lock().await {
                OldOutcome::Set(v) | OldOutcome::TookOver(v) => return v,
                OldOutcome::Held => tokio::time::sleep(self.poll).await,
            }
        }
    }

    /// `DEL lock.foo`, after checking that our timeout did not expire (the SETNX page's advice).
    async fn unlock(&mut self, value: u64) {
        if unix_now() < value {
            let _: i64 = redis::cmd("DEL")
                .arg(KEY)
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speaks_the_old_protocol_in_seconds_and_milliseconds() {
    let server = server();
    let client = legacy_client(&server).await;
    let mut conn = raw(&server).await;

    let guard = lock(&client, seconds(10)).try_lock().await.unwrap();
    let (now_s, _) = redis_now(&mut conn).await;
    let value: u64 = get(&mut conn, KEY)
        .await
        .unwrap()
        .parse()
        .expect("a plain integer");
    assert!(
        (now_s + 10..=now_s + 11).contains(&value),
        "value {value}, redis time {now_s}"
    );
    assert!(pttl(&mut conn, KEY).await > 10_000, "redlease's own keys expire");
    // An old client sees a live lock.
    let mut old = OldClient::new(&server, 10).await;
    assert_eq!(old.try_lock().await, OldOutcome::Held);
    guard.release().await.unwrap();
    assert!(!exists(&mut conn, KEY).await);
    // Now the old client gets it with SETNX.
    assert!(matches!(old.try_lock().await, OldOutcome::Set(_)));
    let _: i64 = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await.unwrap();

    let ms = LegacyOptions::new()
        .unit(TimestampUnit::Milliseconds)
        .timeout(Duration::from_millis(1500));
    let guard = lock(&client, ms).try_lock().await.unwrap();
    let (_, now_ms) = redis_now(&mut conn).await;
    let value: u64 = get(&mut conn, KEY)
        .await
        .unwrap()
        .parse()
        .expect("a plain integer");
    assert!(
        value > now_ms + 1400 && value <= now_ms + 1501,
        "value {value}, redis time {now_ms}"
    );
    guard.release().await.unwrap();
    assert!(!exists(&mut conn, KEY).await);

    let err = client
        .legacy_lock(KEY, LegacyOptions::new().timeout(Duration::from_millis(2500)))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_clients_live_lock_excludes_redlease_until_it_expires() {
    let server = server();
    let client = legacy_client(&server).await;
    let mut old = OldClient::new(&server, 1).await;
    let value = old.lock().await;
    let legacy = lock(&client, seconds(1));
    let err = legacy.try_lock().await.unwrap_err();
    let Error::Contended { remaining, .. } = err else {
        panic!("expected Contended, got {err:?}");
    };
    let remaining = remaining.expect("a timestamp tells when it expires");
    assert!(remaining <= Duration::from_secs(3), "{remaining:?}");

    // The old holder "crashes": redlease takes over once the timestamp is older than
    // Redis's clock, without anyone deleting the key.
    let started = Instant::now();
    let guard = within(10.0, "takeover", legacy.lock()).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "took over after only {waited:?}"
    );
    let mut conn = raw(&server).await;
    let now: u64 = get(&mut conn, KEY).await.unwrap().parse().unwrap();
    assert!(now > value, "a takeover writes a later timestamp");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_redlease_takers_of_a_stale_lock_exactly_one_wins() {
    let server = server();
    let a = lock(&legacy_client(&server).await, seconds(5));
    let b = lock(&legacy_client(&server).await, seconds(5));
    let mut conn = raw(&server).await;
    let (mut wins_a, mut wins_b) = (0, 0);
    for round in 0..200 {
        leave_stale_lock(&mut conn).await;
        let (ra, rb) = tokio::join!(a.try_lock(), b.try_lock());
        match (ra, rb) {
            (Ok(g), Err(e)) => {
                assert!(e.is_contended(), "round {round}: {e:?}");
                wins_a += 1;
                g.release().await.unwrap();
            }
            (Err(e), Ok(g)) => {
                assert!(e.is_contended(), "round {round}: {e:?}");
                wins_b += 1;
                g.release().await.unwrap();
            }
            (Ok(_), Ok(_)) => panic!("round {round}: both took over the stale lock"),
            (Err(ea), Err(eb)) => panic!("round {round}: nobody took it: {ea:?} / {eb:?}"),
        }
    }
    assert_eq!(wins_a + wins_b, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_client_and_redlease_racing_for_a_stale_lock_exactly_one_wins() {
    let server = server();
    let client = legacy_client(&server).await;
    let legacy = lock(&client, seconds(5));
    let mut old = OldClient::new(&server, 5).await;
    let mut conn = raw(&server).await;

    // Forced interleaving 1: the old client GETs the stale value, redlease's script runs,
    // then the old client's GETSET: it gets redlease's live timestamp back and loses —
    // but leaves its own timestamp in the key, as the SETNX page says it may.
    leave_stale_lock(&mut conn).await;
    assert!(old.setnx().await.is_none());
    assert!(
        old.get_expired().await.is_some(),
        "the old client saw the stale lock"
    );
    let guard = legacy.try_lock().await.expect("redlease takes over");
    assert!(pttl(&mut conn, KEY).await > 0);
    assert_eq!(old.getset().await, OldOutcome::Held, "the old client lost");
    assert!(guard.is_held());
    // The key now holds the loser's timestamp (in the same second, an equal one) and no
    // TTL: redlease can no longer prove it is its own, so it must not DEL.
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert!(exists(&mut conn, KEY).await, "the loser's timestamp stays");
    assert_eq!(
        pttl(&mut conn, KEY).await,
        -1,
        "written by the old client's GETSET"
    );

    // Forced interleaving 2: the old client's GET + GETSET first; redlease finds a live lock.
    leave_stale_lock(&mut conn).await;
    assert!(matches!(old.try_lock().await, OldOutcome::TookOver(_)));
    let err = legacy.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");

    // Free-running races: the old client has seen the stale lock (SETNX failed, GET
    // showed it expired); its GETSET and redlease's script go out together, in
    // alternating order.
    let (mut old_wins, mut redlease_wins) = (0, 0);
    for round in 0..200 {
        leave_stale_lock(&mut conn).await;
        assert!(old.setnx().await.is_none());
        assert!(old.get_expired().await.is_some());
        let (o, r) = if round % 2 == 0 {
            tokio::join!(old.getset(), legacy.try_lock())
        } else {
            let (r, o) = tokio::join!(legacy.try_lock(), old.getset());
            (o, r)
        };
        let old_won = matches!(o, OldOutcome::TookOver(_));
        match r {
            Ok(guard) => {
                assert!(!old_won, "round {round}: both won");
                redlease_wins += 1;
                // The losing GETSET overwrote our timestamp: not ours to delete.
                assert!(guard.release().await.unwrap_err().is_not_held());
            }
            Err(e) => {
                assert!(e.is_contended(), "round {round}: {e:?}");
                assert!(old_won, "round {round}: nobody won");
                old_wins += 1;
            }
        }
    }
    assert_eq!(old_wins + redlease_wins, 200);
    assert!(
        old_wins > 0 && redlease_wins > 0,
        "both orders happened: {old_wins} / {redlease_wins}"
    );
    eprintln!("old client won {old_wins}, redlease won {redlease_wins}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_clients_and_redlease_lose_no_update_starting_from_a_crashed_holder() {
    let server = server();
    let mut conn = raw(&server).await;
    leave_stale_lock(&mut conn).await;
    const ROUNDS: usize = 25;
    const TIMEOUT: u64 = 2;
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let not_held_at_release = Arc::new(AtomicUsize::new(0));
    let critical = |mut conn: MultiplexedConnection, inside: Arc<AtomicUsize>, max: Arc<AtomicUsize>| async move {
        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(now, Ordering::SeqCst);
        let v: i64 = get(&mut conn, "counter").await.map_or(0, |s| s.parse().unwrap());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let _: () = redis::cmd("SET")
            .arg("counter")
            .arg(v + 1)
            .query_async(&mut conn)
            .await
            .unwrap();
        inside.fetch_sub(1, Ordering::SeqCst);
    };
    let mut handles = Vec::new();
    for _ in 0..2 {
        let mut old = OldClient::new(&server, TIMEOUT).await;
        let work = raw(&server).await;
        let (inside, max) = (inside.clone(), max_inside.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let value = old.lock().await;
                critical(work.clone(), inside.clone(), max.clone()).await;
                old.unlock(value).await;
            }
        }));
    }
    for _ in 0..2 {
        let legacy = lock(&legacy_client(&server).await, seconds(TIMEOUT));
        let work = raw(&server).await;
        let (inside, max, not_held) = (inside.clone(), max_inside.clone(), not_held_at_release.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = legacy.lock().await.expect("lock");
                critical(work.clone(), inside.clone(), max.clone()).await;
                if let Err(e) = guard.release().await {
                    // An old client lost a takeover race to us and overwrote the
                    // timestamp: documented, and the key frees itself.
                    assert!(e.is_not_held(), "{e:?}");
                    not_held.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for h in handles {
        within(120.0, "all clients finish", h).await.unwrap();
    }
    assert_eq!(
        get(&mut conn, "counter").await,
        Some((4 * ROUNDS).to_string()),
        "no lost update"
    );
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    eprintln!(
        "redlease releases that found the timestamp overwritten: {}",
        not_held_at_release.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_timestamp_written_by_someone_else_is_not_ours() {
    let server = server();
    let client = legacy_client(&server).await;
    let mut conn = raw(&server).await;

    // An old client DELs our lock and SETNXes the very same timestamp: redlease must not
    // take it for its own (the key has no TTL: old clients never set one).
    let guard = lock(&client, seconds(10)).try_lock().await.unwrap();
    let ours = get(&mut conn, KEY).await.unwrap();
    let _: i64 = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await.unwrap();
    let set: i64 = redis::cmd("SETNX")
        .arg(KEY)
        .arg(&ours)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(set, 1);
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(
        get(&mut conn, KEY).await,
        Some(ours),
        "the other holder's lock stays"
    );
    let _: i64 = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await.unwrap();

    // Two redlease acquisitions with the same timestamp (same second, same timeout):
    // the first one's release must not delete the second one's lock.
    let first = lock(&client, seconds(10)).try_lock().await.unwrap();
    let first_value = get(&mut conn, KEY).await.unwrap();
    let _: i64 = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await.unwrap();
    let second = lock(&legacy_client(&server).await, seconds(10))
        .try_lock()
        .await
        .unwrap();
    let second_value = get(&mut conn, KEY).await.unwrap();
    let err = first.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err:?}");
    assert_eq!(get(&mut conn, KEY).await, Some(second_value.clone()));
    eprintln!("timestamps: first {first_value}, second {second_value}");
    second.release().await.unwrap();
    assert!(!exists(&mut conn, KEY).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_timestamp_ahead_and_loss_is_reported() {
    let server = server();
    let client = legacy_client(&server).await;
    let mut conn = raw(&server).await;
    let options = LegacyOptions::new()
        .unit(TimestampUnit::Milliseconds)
        .timeout(Duration::from_millis(300));
    let guard = lock(&client, options).try_lock().await.unwrap();
    let first: u64 = get(&mut conn, KEY).await.unwrap().parse().unwrap();
    // Five timeouts later the lock is still live for an old client (in milliseconds).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guard.is_held());
    let now: u64 = get(&mut conn, KEY).await.unwrap().parse().unwrap();
    let (_, now_ms) = redis_now(&mut conn).await;
    assert!(now > first + 1000, "renewed: {first} -> {now}");
    assert!(
        now >= now_ms,
        "an old client would find it live: {now} vs {now_ms}"
    );

    // An old client overwrites the timestamp: the holder is told at the next renewal.
    let _: () = redis::cmd("SET")
        .arg(KEY)
        .arg(now_ms + 10_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = within(1.0, "lost() fires", guard.lost()).await;
    assert_eq!(reason, LostReason::Gone);
    assert!(!guard.is_held());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held());
    assert!(exists(&mut conn, KEY).await, "not ours: not deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_polls_for_an_old_clients_silent_release() {
    let server = server();
    let client = legacy_client(&server).await;
    let legacy = lock(&client, seconds(30).poll_interval(Duration::from_millis(50)));
    let mut old = OldClient::new(&server, 30).await;
    let value = old.lock().await;
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let guard = legacy.lock_timeout(Duration::from_secs(5)).await;
        (guard, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    old.unlock(value).await;
    let (guard, waited) = within(6.0, "waiter", waiter).await.unwrap();
    let guard = guard.expect("acquired after the old client's DEL");
    let lag = released.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    // Found within one poll interval (plus scheduling slack on a busy machine).
    assert!(lag < Duration::from_millis(50 + 250), "noticed after {lag:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_has_a_deadline_and_cancellation_leaves_nothing() {
    let server = server();
    let client = legacy_client(&server).await;
    let legacy = lock(&client, seconds(30));
    let mut conn = raw(&server).await;
    let mut old = OldClient::new(&server, 30).await;
    let value = old.lock().await;
    let started = Instant::now();
    let err = legacy.lock_timeout(Duration::from_millis(200)).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(700));
    old.unlock(value).await;

    // A value that is not a timestamp is never taken over.
    let _: () = redis::cmd("SET")
        .arg(KEY)
        .arg("not-a-timestamp")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = legacy.try_lock().await.unwrap_err();
    assert!(matches!(err, Error::Contended { remaining: None, .. }), "{err:?}");
    let _: i64 = redis::cmd("DEL").arg(KEY).query_async(&mut conn).await.unwrap();

    // A lock() future dropped right after it was sent leaves no lock behind.
    for _ in 0..20 {
        let fut = legacy.lock();
        let _ = tokio::time::timeout(Duration::from_micros(200), fut).await;
        eventually(3.0, "no orphan lock", || {
            let mut conn = conn.clone();
            async move { !exists(&mut conn, KEY).await }
        })
        .await;
    }
}
