//! The wake-up connection of a single Redis: RESP3, whose push messages reach the
//! waiters straight from redis-rs's connection task, and RESP2 pub/sub for a server
//! that refuses RESP3 (here: `HELLO` renamed away). Either way a release reaches a
//! waiter of another client at once — its lease and the holder's are 30 s, so a
//! waiter that missed the message would sit for 30 s — and a waiter whose connection
//! was cut is woken by the reconnect.
mod common;

use std::time::{Duration, Instant};

use common::*;
use redlease::LeaseOptions;
use redlease_testkit::RedisServer;

const LONG: Duration = Duration::from_secs(30);

/// The field `name` (`resp`, `id`, …) of every connection subscribed to a channel
/// (`CLIENT LIST`).
async fn subscribers(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await.unwrap();
    let prefix = format!("{name}=");
    list.lines()
        .filter(|line| line.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(prefix.as_str()))
                .map(str::to_owned)
        })
        .collect()
}

/// The `resp` field of every connection subscribed to a channel.
async fn subscribers_resp(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    subscribers(conn, "resp").await
}

/// A waiter of another client is handed the lock by the release, promptly, `rounds`
/// times; `cut` runs while the waiter waits, before the release.
async fn hand_overs<F, Fut>(server: &RedisServer, expect_resp: &str, rounds: usize, mut cut: F)
where
    F: FnMut(redis::aio::MultiplexedConnection) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let mut conn = raw(server).await;
    let options = LeaseOptions::new().ttl(LONG);
    for round in 0..rounds {
        let held = holder.mutex_with("wake", options).unwrap().lock().await.unwrap();
        let task = tokio::spawn({
            let mutex = waiter.mutex_with("wake", options).unwrap();
            async move { mutex.lock().await }
        });
        eventually(10.0, "the waiter subscribed", || {
            let mut conn = conn.clone();
            async move { subscribers_resp(&mut conn).await.len() == 1 }
        })
        .await;
        assert_eq!(subscribers_resp(&mut conn).await, [expect_resp], "round {round}");
        until_registered(&conn, "redlease:wake", 1).await;
        cut(conn.clone()).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let guard = within(10.0, &format!("round {round}: the waiter holds"), task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            released.elapsed() < Duration::from_secs(3),
            "round {round}: woken after {:?}, not by the release",
            released.elapsed()
        );
        guard.release().await.unwrap();
        // The waiter's client unsubscribes once it waits no more: the next round must
        // not mistake this round's subscription for its own.
        eventually(10.0, "the waiter unsubscribed", || {
            let mut conn = conn.clone();
            async move { subscribers_resp(&mut conn).await.is_empty() }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_arrive_over_resp3() {
    let server = server();
    hand_overs(&server, "3", 5, |_| async {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_resp3_wakes_over_resp2() {
    let server = RedisServer::builder()
        .directive("rename-command", ["HELLO", ""])
        .start()
        .unwrap();
    hand_overs(&server, "2", 5, |_| async {}).await;
}

/// The wake-up connection is cut while a waiter waits, and the holder releases at once:
/// the message may reach nobody, and the reconnect wakes the waiter instead.
async fn cut_wake_ups(server: &RedisServer, expect_resp: &str) {
    hand_overs(server, expect_resp, 3, |mut conn| async move {
        let ids = subscribers(&mut conn, "id").await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(&ids[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(killed, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_resp3_wake_up_connection_wakes_the_waiter() {
    cut_wake_ups(&server(), "3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_resp2_wake_up_connection_wakes_the_waiter() {
    let server = RedisServer::builder()
        .directive("rename-command", ["HELLO", ""])
        .start()
        .unwrap();
    cut_wake_ups(&server, "2").await;
}

/// A server that refuses RESP3 reached over a slow link (600 ms each way through the
/// test kit's proxy: a round trip takes 1.2 s, well within the 2 s a connection may
/// take): the refused RESP3 attempt and the RESP2 connection each take one round trip,
/// and the waiter's wake-up connection must still come up — and the release wake it
/// long before the 30 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_resp3_wakes_over_resp2_on_a_slow_link() {
    let server = RedisServer::builder()
        .directive("rename-command", ["HELLO", ""])
        .start()
        .unwrap();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    proxy.set_delay(Duration::from_millis(600));
    let holder = client(&server.url()).await;
    let waiter = within(20.0, "the waiter connects", client(&proxy.url())).await;
    let mut conn = raw(&server).await;
    let options = LeaseOptions::new().ttl(LONG);
    let held = holder.mutex_with("slow", options).unwrap().lock().await.unwrap();
    let task = tokio::spawn({
        let mutex = waiter.mutex_with("slow", options).unwrap();
        async move { mutex.lock().await }
    });
    eventually(20.0, "the waiter's wake-up connection subscribed", || {
        let mut conn = conn.clone();
        async move { subscribers_resp(&mut conn).await.len() == 1 }
    })
    .await;
    assert_eq!(subscribers_resp(&mut conn).await, ["2"]);
    until_registered(&conn, "redlease:slow", 1).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = within(20.0, "the waiter holds", task).await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "woken after {:?}, not by the release",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// A waiter whose subscription is confirmed only after it stopped waiting for the
/// confirmation (a second) goes on with an attempt and then waits for a message; a
/// release between that attempt and the confirmation reaches nobody. The confirmation
/// must wake it to look again — not leave it until it looks again by itself (after half
/// its registration's life, about 10 s). Its wake-up connection goes through a proxy
/// that delays everything by 700 ms each way (connecting and subscribing take about
/// 3 s), its commands straight to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_a_late_subscription_is_confirmed_is_not_missed() {
    use redlease_testkit::Proxy;
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    proxy.set_delay(Duration::from_millis(700));
    let holder = client(&server.url()).await;
    let waiter = redlease::Client::builder(redis::Client::open(proxy.url()).unwrap())
        .connection(raw(&server).await)
        .build()
        .await
        .unwrap();
    let mut conn = raw(&server).await;
    let options = LeaseOptions::new().ttl(LONG);
    let held = holder.mutex_with("late", options).unwrap().lock().await.unwrap();
    let attempts = command_calls(&mut conn, "evalsha").await;
    let task = tokio::spawn({
        let mutex = waiter.mutex_with("late", options).unwrap();
        async move { mutex.lock().await }
    });
    // Its first attempt registers it; the second comes when it stops waiting for the
    // subscription's confirmation.
    eventually(
        10.0,
        "the waiter's attempt after giving up on the confirmation",
        || {
            let mut conn = conn.clone();
            async move { command_calls(&mut conn, "evalsha").await >= attempts + 2 }
        },
    )
    .await;
    let subscribed: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("{redlease:late}:wake")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        subscribed.get(1),
        Some(&redis::Value::Int(0)),
        "the premise: not subscribed yet"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = within(40.0, "the waiter holds", task).await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(6),
        "woken after {:?}: the release was missed",
        released.elapsed()
    );
    guard.release().await.unwrap();
}
