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

/// The `resp` field of every connection subscribed to a channel (`CLIENT LIST`).
async fn subscribers_resp(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await.unwrap();
    list.lines()
        .filter(|line| line.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("resp="))
                .map(str::to_owned)
        })
        .collect()
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
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .unwrap();
        let ids: Vec<String> = list
            .lines()
            .filter(|line| line.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
            .filter_map(|line| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix("id="))
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(ids.len(), 1, "{list}");
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
