//! Shared helpers for the integration tests: every test starts its own redis-server.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

#[allow(unused_imports)]
pub use redlease_testkit::{Persistence, Proxy, RedisServer};

/// A fresh server (no persistence); panics with install instructions if missing.
pub fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

/// A redlease client for `url` with default settings.
pub async fn client(url: &str) -> redlease::Client {
    redlease::Client::connect(url).await.expect("connect")
}

/// A client with a short reply timeout and retry window, for fault tests.
pub async fn impatient_client(url: &str, timeout: Duration, retry_window: Duration) -> redlease::Client {
    redlease::Client::builder(redis::Client::open(url).unwrap())
        .response_timeout(Some(timeout))
        .retry_window(retry_window)
        .build()
        .await
        .expect("connect")
}

/// A plain redis-rs connection for inspecting and tampering with keys.
pub async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Awaits `fut` for at most `secs` seconds, failing the test with `what` otherwise.
pub async fn within<T>(secs: f64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs_f64(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs}s: {what}"))
}

/// Polls `check` every 10 ms until it returns true, for at most `secs` seconds.
pub async fn eventually<F, Fut>(secs: f64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(secs, what, async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

pub async fn get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.expect("GET")
}

pub async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .expect("EXISTS");
    n == 1
}

pub async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.expect("PTTL")
}

/// How many times the server ran `command` (lower case, as `INFO commandstats` names
/// it) since it started or since `CONFIG RESETSTAT`.
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

/// Every key in the server with its TTL in ms (-1: none).
pub async fn all_keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(conn).await.expect("KEYS");
    let mut out = Vec::new();
    for k in keys {
        let t = pttl(conn, &k).await;
        out.push((k, t));
    }
    out.sort();
    out
}

/// Every key with its PTTL, like [`all_keys`], but the fencing counters and floors of
/// the plain mutexes (`{redlease:fence}` and its floor; on a cluster one pair per slot).
pub async fn keys_but_fencing(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, i64)> {
    let mut keys = all_keys(conn).await;
    keys.retain(|(k, _)| !k.starts_with("{redlease:fence"));
    keys
}

/// Checks that `mark`, a lock's fencing mark as `status` reports it, is that of a slot
/// whose last token is `fence`: the token itself while the slot's counter lives, or
/// afterwards its floor, one counter life (100 ms, in microseconds) above the seed the
/// token came from.
#[track_caller]
pub fn assert_mark(mark: Option<redlease::FencingToken>, fence: redlease::FencingToken, what: &str) {
    let mark = mark.unwrap_or_else(|| panic!("{what}: no fencing mark"));
    assert!(
        mark >= fence && mark.get() <= fence.get() + 100_000,
        "{what}: mark {mark} for the last token {fence}"
    );
}

/// Takes `key` as another library's lock would: `SET key <value> NX`, with `PX ttl_ms`
/// when given (`None`: a key without a TTL).
pub async fn take_as_foreign(conn: &mut redis::aio::MultiplexedConnection, key: &str, ttl_ms: Option<u64>) {
    let mut set = redis::cmd("SET");
    set.arg(key).arg("0f1e2d3c4b5a69788796a5b4c3d2e1f0").arg("NX");
    if let Some(ms) = ttl_ms {
        set.arg("PX").arg(ms);
    }
    let taken: Option<String> = set.query_async(conn).await.unwrap();
    assert_eq!(taken.as_deref(), Some("OK"), "{key} taken");
}

/// Waits (at most 5 s) until `n` waiters are registered on the plain mutex whose key is
/// `key` (its `{<key>}:q` set).
pub async fn until_registered(conn: &redis::aio::MultiplexedConnection, key: &str, n: i64) {
    let q = format!("{{{key}}}:q");
    eventually(5.0, &format!("{n} waiters registered on {key}"), || {
        let (mut conn, q) = (conn.clone(), q.clone());
        async move {
            let registered: i64 = redis::cmd("ZCARD").arg(&q).query_async(&mut conn).await.unwrap();
            registered == n
        }
    })
    .await;
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// A future kept alive and polled by hand (to leave it unpolled for a while).
pub type Boxed<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// A `lock()` kept alive to be polled by hand.
pub type Locking = Boxed<redlease::Result<redlease::MutexGuard>>;

pub fn locking(m: &redlease::Mutex) -> Locking {
    let m = m.clone();
    Box::pin(async move { m.lock().await })
}

pub fn locking_timeout(m: &redlease::Mutex, timeout: Duration) -> Locking {
    let m = m.clone();
    Box::pin(async move { m.lock_timeout(timeout).await })
}

/// A semaphore's `acquire()` kept alive to be polled by hand.
pub type Acquiring = Boxed<redlease::Result<redlease::Permit>>;

pub fn acquiring(sem: &redlease::Semaphore) -> Acquiring {
    let sem = sem.clone();
    Box::pin(async move { sem.acquire().await })
}

pub fn acquiring_timeout(sem: &redlease::Semaphore, timeout: Duration) -> Acquiring {
    let sem = sem.clone();
    Box::pin(async move { sem.acquire_timeout(timeout).await })
}

/// Polls `fut` until `until` is done, then leaves it alone (alive, not polled).
pub async fn poll_until(fut: &mut Acquiring, until: impl Future<Output = ()>) {
    tokio::select! {
        biased;
        _ = until => {}
        r = fut.as_mut() => panic!("the acquisition finished early: {:?}", r.map(|p| p.permits())),
    }
}

/// Waits until `sem`'s status counts `n` waiting connections.
pub async fn until_waiters(sem: &redlease::Semaphore, n: u64) {
    eventually(5.0, &format!("{n} waiters"), || {
        let sem = sem.clone();
        async move { sem.status().await.unwrap().waiters == n }
    })
    .await;
}

/// Polls a `release()` future once (it picks its local waiter and sends the hand-over),
/// then leaves it. It is normally still waiting for Redis's answer; on a loaded machine
/// the thread may be preempted between sending and looking for the answer, and the
/// release is then complete — the stall it stands for did not happen, which the
/// callers' assertions allow. Returns whether it is still pending.
pub async fn poll_release_once<T>(fut: &mut Boxed<T>) -> bool {
    let mut pending = None;
    std::future::poll_fn(|cx| {
        if pending.is_none() {
            pending = Some(fut.as_mut().poll(cx).is_pending());
        }
        std::task::Poll::Ready(())
    })
    .await;
    pending.unwrap_or(true)
}

/// Polls `fut` once, which must leave it pending (a lock() joins its client's local
/// queue on its first poll; a release() picks its local waiter and sends the hand-over).
pub async fn poll_once<T>(fut: &mut Boxed<T>) {
    let mut done = false;
    std::future::poll_fn(|cx| {
        if !done {
            done = true;
            assert!(fut.as_mut().poll(cx).is_pending(), "it must be pending");
        }
        std::task::Poll::Ready(())
    })
    .await;
}

pub async fn zcard(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query_async(conn).await.unwrap()
}

/// Every member of the sorted set at `key`, lowest score first.
pub async fn members(conn: &redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let mut conn = conn.clone();
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The semaphore's registrations in Redis.
pub fn waiters_key(sem: &redlease::Semaphore) -> String {
    format!("{{{}}}:waiters", sem.key())
}

/// Waits (at most 5 s) until `n` waiters are registered on semaphore `sem` and its
/// client subscribed to its wake-up channel — which a waiter does only after a busy
/// answer, i.e. once it counts as waiting in Redis.
pub async fn registered_and_subscribed(
    conn: &redis::aio::MultiplexedConnection,
    sem: &redlease::Semaphore,
    n: u64,
) {
    let (waiters, channels) = (waiters_key(sem), format!("{{{}}}:wake:*", sem.key()));
    eventually(5.0, "waiters registered and subscribed", || {
        let (mut conn, waiters, channels) = (conn.clone(), waiters.clone(), channels.clone());
        async move {
            let subscribed: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(&channels)
                .query_async(&mut conn)
                .await
                .unwrap();
            zcard(&mut conn, &waiters).await == n && !subscribed.is_empty()
        }
    })
    .await;
}
