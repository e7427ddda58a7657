//! Several names locked as one, against real redis-servers and a real Redis Cluster:
//! each name is the plain mutex's lock, taken all or none; opposite orders never
//! deadlock or lose an update; cancellation leaves nothing held; one renewal round trip
//! per node.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use redis::aio::ConnectionLike;
use redlease::{Client, FencingToken, LeaseOptions, LostReason, ReplicaAck};
use redlease_testkit::RedisCluster;

fn cluster(masters: usize) -> RedisCluster {
    RedisCluster::start(masters, 0).unwrap_or_else(|e| panic!("{e}"))
}

async fn cluster_client(cluster: &RedisCluster) -> Client {
    Client::cluster(cluster.urls()).await.expect("cluster client")
}

/// A lock name whose key `redlease:<name>` lives on master `master`.
fn name_on(cluster: &RedisCluster, master: usize, base: &str) -> String {
    let key = cluster
        .key_on_master(master, |n| format!("redlease:{base}-{n}"))
        .unwrap();
    key.trim_start_matches("redlease:").to_owned()
}

async fn raw_cluster(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .expect("raw cluster connection")
}

async fn get_any<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.expect("GET")
}

async fn exists_any<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .expect("EXISTS");
    n == 1
}

async fn pttl_any<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.expect("PTTL")
}

/// How a contender takes its names: all through one multi-lock, or one name through the
/// plain mutex.
#[derive(Clone, Debug)]
enum Takes {
    Multi(Vec<String>),
    Plain(String),
}

/// What the contenders saw of one name: how many critical sections included it, the
/// most holders inside at once, and each section's (value read, fencing token).
#[derive(Debug, Default)]
struct Seen {
    sections: usize,
    max_inside: usize,
    reads: Vec<(i64, FencingToken)>,
}

/// Leases far longer than the contention takes: a deadlock would only end when a lease
/// runs out, so the bound on the whole run catches it.
const LONG_LEASE: Duration = Duration::from_secs(90);
const NO_DEADLOCK_WITHIN: f64 = 45.0;

/// Runs every contender — its own client, as a separate process would have — taking
/// its names `rounds` times, each time read-modify-writing a counter per name with a
/// gap in the middle (which loses updates unless the names exclude). Returns what was
/// seen per name.
async fn contend<C>(clients: Vec<Client>, takes: Vec<Takes>, rounds: usize, conn: C) -> HashMap<String, Seen>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let inside: Arc<StdMutex<HashMap<String, (usize, Seen)>>> = Arc::default();
    let options = LeaseOptions::new().ttl(LONG_LEASE);
    let mut tasks = Vec::new();
    for (client, takes) in clients.into_iter().zip(takes) {
        let (inside, mut conn) = (inside.clone(), conn.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                // Hold every name: one guard, its names and their fencing tokens.
                let (guard, names, fences): (Box<dyn redlease::Guard>, Vec<String>, Vec<FencingToken>) =
                    match &takes {
                        Takes::Multi(names) => {
                            let g = client
                                .multi_lock_with(names, options)
                                .unwrap()
                                .lock()
                                .await
                                .expect("multi-lock");
                            let fences = g.fences().to_vec();
                            (Box::new(g), names.clone(), fences)
                        }
                        Takes::Plain(name) => {
                            let g = client
                                .mutex_with(name, options)
                                .unwrap()
                                .lock()
                                .await
                                .expect("lock");
                            let fence = g.fence();
                            (Box::new(g), vec![name.clone()], vec![fence])
                        }
                    };
                {
                    let mut seen = inside.lock().unwrap();
                    for name in &names {
                        let (now, s) = seen.entry(name.clone()).or_default();
                        *now += 1;
                        s.max_inside = s.max_inside.max(*now);
                        s.sections += 1;
                    }
                }
                let mut read = Vec::new();
                for name in &names {
                    let counter = format!("counter:{name}");
                    let v: i64 = get_any(&mut conn, &counter)
                        .await
                        .map_or(0, |s| s.parse().unwrap());
                    read.push(v);
                }
                tokio::time::sleep(Duration::from_micros(300)).await;
                for (name, v) in names.iter().zip(&read) {
                    let counter = format!("counter:{name}");
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(v + 1)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                {
                    let mut seen = inside.lock().unwrap();
                    for ((name, v), fence) in names.iter().zip(read).zip(fences) {
                        let (now, s) = seen.get_mut(name).unwrap();
                        *now -= 1;
                        s.reads.push((v, fence));
                    }
                }
                guard.release().await.expect("release");
            }
        }));
    }
    let all = futures_util::future::join_all(tasks);
    for task in within(NO_DEADLOCK_WITHIN, "every contender finishes (no deadlock)", all).await {
        task.unwrap();
    }
    let seen = std::mem::take(&mut *inside.lock().unwrap());
    seen.into_iter().map(|(name, (_, s))| (name, s)).collect()
}

/// Checks what `contend` saw, and the counters: no update lost on any name, one holder
/// at a time, and fencing tokens rising with every critical section of a name.
async fn assert_no_lost_update<C: ConnectionLike + Send>(seen: &HashMap<String, Seen>, conn: &mut C) {
    for (name, s) in seen {
        let counter: i64 = get_any(conn, &format!("counter:{name}"))
            .await
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(counter as usize, s.sections, "no update of {name} was lost");
        assert_eq!(s.max_inside, 1, "one holder of {name} at a time");
        let mut reads = s.reads.clone();
        reads.sort();
        assert!(
            reads.iter().enumerate().all(|(i, &(v, _))| v == i as i64),
            "every section of {name} read the value the previous one wrote"
        );
        assert!(
            reads.windows(2).all(|w| w[0].1 < w[1].1),
            "the fencing tokens of {name} rise with every section"
        );
    }
}

/// {A,B}, {B,A}, {A} and {B}, two contenders each: the orders a hand-rolled multi-lock
/// deadlocks on.
fn opposite_orders(a: &str, b: &str) -> Vec<Takes> {
    let (a, b) = (a.to_owned(), b.to_owned());
    [
        Takes::Multi(vec![a.clone(), b.clone()]),
        Takes::Multi(vec![b.clone(), a.clone()]),
        Takes::Plain(a.clone()),
        Takes::Plain(b.clone()),
    ]
    .into_iter()
    .flat_map(|t| [t.clone(), t])
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_lose_no_update_and_never_deadlock() {
    let server = server();
    let takes = opposite_orders("A", "B");
    let mut clients = Vec::new();
    for _ in 0..takes.len() {
        clients.push(client(&server.url()).await);
    }
    let started = Instant::now();
    let seen = contend(clients, takes, 25, raw(&server).await).await;
    eprintln!("standalone: {:?} for 200 sections", started.elapsed());
    assert_eq!(seen["A"].sections, 25 * 6, "{{A,B}} x2, {{B,A}} x2, {{A}} x2");
    assert_eq!(seen["B"].sections, 25 * 6);
    assert_no_lost_update(&seen, &mut raw(&server).await).await;
    let mut conn = raw(&server).await;
    assert!(!exists(&mut conn, "redlease:A").await && !exists(&mut conn, "redlease:B").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_across_cluster_masters_lose_no_update_and_never_deadlock() {
    let cluster = cluster(3);
    let a = name_on(&cluster, 0, "acct");
    let b = name_on(&cluster, 1, "acct");
    let takes = opposite_orders(&a, &b);
    let mut clients = Vec::new();
    for _ in 0..takes.len() {
        clients.push(cluster_client(&cluster).await);
    }
    // The multi-locks really span two masters.
    let lock = clients[0].multi_lock([&a, &b]).unwrap();
    let slots: Vec<u16> = lock.keys().map(|k| cluster.slot_of(k).unwrap()).collect();
    assert_ne!(
        cluster.master_of_slot(slots[0]).unwrap(),
        cluster.master_of_slot(slots[1]).unwrap()
    );
    let started = Instant::now();
    let seen = contend(clients, takes, 20, raw_cluster(&cluster).await).await;
    eprintln!("cluster: {:?} for 160 sections", started.elapsed());
    assert_eq!(seen[&a].sections, 20 * 6);
    assert_eq!(seen[&b].sections, 20 * 6);
    let mut conn = raw_cluster(&cluster).await;
    assert_no_lost_update(&seen, &mut conn).await;
    for key in lock.keys() {
        assert!(!exists_any(&mut conn, key).await, "{key} is free at the end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_name_is_the_plain_mutex_lock_with_its_own_fencing_sequence() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let plain = client.mutex("ledger").unwrap();
    let before = plain.lock().await.unwrap().fence();
    // (dropped: released in the background)
    let multi = client.multi_lock(["ledger", "audit"]).unwrap();
    assert_eq!(multi.names().collect::<Vec<_>>(), ["ledger", "audit"]);
    assert_eq!(
        multi.keys().collect::<Vec<_>>(),
        ["redlease:ledger", "redlease:audit"]
    );
    let guard = within(5.0, "the multi-lock follows the dropped guard", multi.lock())
        .await
        .unwrap();
    // The plain format: the token at exactly <prefix><name>, with a TTL.
    for key in ["redlease:ledger", "redlease:audit"] {
        assert_eq!(get(&mut conn, key).await.as_deref(), Some(guard.token().expose()));
        assert!(
            (20_000..=30_000).contains(&pttl(&mut conn, key).await),
            "{key} has the lease's TTL"
        );
    }
    let &[ledger, audit] = guard.fences() else {
        panic!("one fence per name")
    };
    assert!(ledger > before, "the name's fencing sequence goes on");
    assert_eq!(guard.fence_of("audit"), Some(audit));
    assert_eq!(guard.fence_of("elsewhere"), None);
    assert_eq!(
        redlease::Guard::fence(&guard),
        None,
        "no single token fences both"
    );
    assert_eq!(guard.name(), "ledger+audit");
    assert_eq!(guard.key(), "redlease:ledger+redlease:audit");
    // One counter issues the fencing tokens of every name on one server: the two names
    // got distinct ones.
    assert_ne!(ledger, audit);
    // A plain mutex's status sees the multi-lock's holding as its own kind.
    let status = plain.status().await.unwrap();
    assert!(status.held);
    assert_eq!(status.owner.as_deref(), Some(client.owner_label()));
    assert_mark(status.last_fence, ledger.max(audit), "ledger");
    let audit_status = client.mutex("audit").unwrap().status().await.unwrap();
    assert!(audit_status.held);
    assert_eq!(audit_status.owner.as_deref(), Some(client.owner_label()));
    guard.release().await.unwrap();
    for key in ["redlease:ledger", "redlease:audit"] {
        assert!(!exists(&mut conn, key).await, "{key} released");
    }
    let after = plain.lock().await.unwrap();
    assert!(after.fence() > ledger, "and goes on after it");
    after.release().await.unwrap();
    // A name given on its own takes the plain lock too.
    let one = client.multi_lock(["ledger"]).unwrap().try_lock().await.unwrap();
    assert_eq!(
        get(&mut conn, "redlease:ledger").await.as_deref(),
        Some(one.token().expose())
    );
    one.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_mutex_excludes_a_multi_lock_and_the_other_way_round() {
    let server = server();
    let holder = client(&server.url()).await;
    let taker = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let multi = taker.multi_lock(["left", "right"]).unwrap();

    // A plain holder of one name keeps the multi-lock out, and it takes nothing else.
    let right = holder.mutex("right").unwrap().lock().await.unwrap();
    let err = multi.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    assert!(
        err.to_string().contains("\"right\""),
        "names the busy name: {err}"
    );
    assert!(!exists(&mut conn, "redlease:left").await, "nothing half-taken");
    let err = multi.lock_timeout(Duration::from_millis(300)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(err.to_string().contains("\"right\""), "{err}");
    assert!(
        !exists(&mut conn, "redlease:left").await,
        "nothing held while waiting"
    );
    // A waiting multi-lock holds nothing meanwhile, and is woken by the release (the
    // holder's lease has 30 s left).
    let waiting = tokio::spawn({
        let multi = multi.clone();
        async move { multi.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !exists(&mut conn, "redlease:left").await,
        "nothing held while waiting"
    );
    let left = holder
        .mutex("left")
        .unwrap()
        .try_lock()
        .await
        .expect("left is free meanwhile");
    left.release().await.unwrap();
    let released = Instant::now();
    right.release().await.unwrap();
    let guard = within(5.0, "woken by the release", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));

    // And the multi-lock keeps plain lockers of either name out until it releases.
    for name in ["left", "right"] {
        let err = holder.mutex(name).unwrap().try_lock().await.unwrap_err();
        assert!(err.is_contended(), "{name}: {err}");
    }
    let plain = tokio::spawn({
        let mutex = holder.mutex("left").unwrap();
        async move { mutex.lock().await }
    });
    // (Once it waits, the plain waiter registers, and the release hands it the name
    // straight away, as a plain mutex's release would.)
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left_fence = guard.fence_of("left").unwrap();
    guard.release().await.unwrap();
    let got = within(5.0, "the plain waiter gets the name", plain)
        .await
        .unwrap()
        .unwrap();
    assert!(got.fence() > left_fence, "the name's fencing sequence goes on");
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_multi_lock_leaves_nothing_held() {
    let server = server();
    let client = client(&server.url()).await;
    let other = self::client(&server.url()).await;
    let mut conn = raw(&server).await;
    let multi = client.multi_lock(["c1", "c2", "c3"]).unwrap();
    let keys = ["redlease:c1", "redlease:c2", "redlease:c3"];
    // Cancelled at every point of an uncontended acquire.
    for delay_us in [0u64, 20, 50, 100, 200, 400, 800, 1600, 3200] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), multi.lock()).await;
        eventually(2.0, "no name held after cancellation", || {
            let mut conn = conn.clone();
            async move {
                for key in keys {
                    if exists(&mut conn, key).await {
                        return false;
                    }
                }
                true
            }
        })
        .await;
    }
    // Cancelled while waiting for a busy name.
    let c3 = other.mutex("c3").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let multi = multi.clone();
        async move { multi.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert!(!exists(&mut conn, "redlease:c1").await && !exists(&mut conn, "redlease:c2").await);
    c3.release().await.unwrap();
    // A dropped guard releases every name.
    let guard = multi.lock().await.unwrap();
    drop(guard);
    eventually(2.0, "a dropped guard releases every name", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:c1").await && !exists(&mut conn, "redlease:c3").await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_masters_a_busy_name_is_waited_for_holding_nothing_and_cancelling_leaves_nothing() {
    let cluster = cluster(3);
    let client = cluster_client(&cluster).await;
    let other = cluster_client(&cluster).await;
    let mut conn = raw_cluster(&cluster).await;
    let (a, b) = (name_on(&cluster, 0, "x"), name_on(&cluster, 2, "y"));
    let multi = client.multi_lock([&b, &a]).unwrap();
    // The second name in slot order is busy: every attempt takes the first, finds the
    // second busy and gives the first back. Cancelled at any point of that, and left to
    // wait, it leaves nothing.
    let slot = |name: &str| cluster.slot_of(&format!("redlease:{name}")).unwrap();
    let (first, second) = if slot(&a) < slot(&b) { (a, b) } else { (b, a) };
    let (first_key, second_key) = (format!("redlease:{first}"), format!("redlease:{second}"));
    let first = &first_key;
    let held = other.mutex(&second).unwrap().lock().await.unwrap();
    for delay_us in [0u64, 100, 300, 1000, 3000, 10_000] {
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), multi.lock()).await;
        eventually(3.0, "the first name is given back", || {
            let (mut conn, first) = (conn.clone(), first.clone());
            async move { !exists_any(&mut conn, &first).await }
        })
        .await;
    }
    let err = multi.try_lock().await.unwrap_err();
    assert!(
        err.is_contended() && err.to_string().contains(second.as_str()),
        "{err}"
    );
    assert!(!exists_any(&mut conn, first).await);
    let waiting = tokio::spawn({
        let multi = multi.clone();
        async move { multi.lock().await }
    });
    // While it waits, it holds nothing: a plain lock of the first name gets in (woken
    // by the give-back if it came during an attempt), though the waiter's lease would
    // have 30 s.
    let plain_first = within(
        5.0,
        "the first name is free while the multi-lock waits",
        other.mutex(first.trim_start_matches("redlease:")).unwrap().lock(),
    )
    .await
    .unwrap();
    plain_first.release().await.unwrap();
    held.release().await.unwrap();
    let guard = within(5.0, "woken by the release on the other master", waiting)
        .await
        .unwrap()
        .unwrap();
    for key in [&first_key, &second_key] {
        assert_eq!(
            get_any(&mut conn, key).await.as_deref(),
            Some(guard.token().expose())
        );
    }
    guard.release().await.unwrap();
    for key in [&first_key, &second_key] {
        assert!(!exists_any(&mut conn, key).await, "{key} released");
    }
}

/// Holds `lock` for a while with a short TTL and checks that each renewal of its lease
/// took `per_renewal` round trips of the client's renewal work (give or take one round
/// that the stats caught between its round trips and its confirmation).
async fn assert_round_trips_per_renewal(client: &Client, lock: &redlease::MultiLock, per_renewal: u64) {
    let guard = lock.try_lock().await.unwrap();
    let before = client.stats();
    // A 300 ms lease renews every 100 ms.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = client.stats();
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let renewed = after.leases_renewed - before.leases_renewed;
    let trips = after.renewal_round_trips - before.renewal_round_trips;
    assert!(renewed >= 4, "renewed {renewed} times in 1 s");
    assert_eq!(after.leases_lost_by_renewal, 0);
    assert!(
        (per_renewal * (renewed - 1)..=per_renewal * (renewed + 1)).contains(&trips),
        "{trips} round trips for {renewed} renewals of {:?}; expected {per_renewal} each",
        lock.names().collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_one_round_trip_per_node() {
    let ttl = LeaseOptions::new().ttl(Duration::from_millis(300));
    let server = server();
    let client = client(&server.url()).await;
    let three = client.multi_lock_with(["r1", "r2", "r3"], ttl).unwrap();
    assert_round_trips_per_renewal(&client, &three, 1).await;

    let cluster = cluster(3);
    let client = cluster_client(&cluster).await;
    let apart = [name_on(&cluster, 0, "r"), name_on(&cluster, 1, "r")];
    let lock = client.multi_lock_with(&apart, ttl).unwrap();
    assert_round_trips_per_renewal(&client, &lock, 2).await;
    let tagged = client.multi_lock_with(["{t}r1", "{t}r2", "{t}r3"], ttl).unwrap();
    assert_round_trips_per_renewal(&client, &tagged, 1).await;
    // And the keys' TTLs really were kept up on both masters.
    let guard = lock.try_lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut conn = raw_cluster(&cluster).await;
    for key in lock.keys() {
        assert!(pttl_any(&mut conn, key).await > 100, "{key} renewed");
    }
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_name_loses_the_lease_and_frees_the_others() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let opts = LeaseOptions::new().ttl(Duration::from_millis(600));
    let guard = client
        .multi_lock_with(["keep", "lose"], opts)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg("redlease:lose")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = within(2.0, "lost within a renewal interval", guard.lost()).await;
    assert_eq!(reason, LostReason::Gone);
    assert!(!guard.is_held());
    eventually(2.0, "the other name is freed", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:keep").await }
    })
    .await;
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_reaches_every_name_and_refuses_a_lost_lease() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let guard = client.multi_lock(["e1", "e2"]).unwrap().lock().await.unwrap();
    guard.extend(Duration::from_secs(120)).await.unwrap();
    for key in ["redlease:e1", "redlease:e2"] {
        assert!(pttl(&mut conn, key).await > 100_000, "{key} extended");
    }
    assert_eq!(guard.lease().ttl(), Duration::from_secs(120));
    assert!(guard.valid_until() > std::time::Instant::now() + Duration::from_secs(100));
    let _: () = redis::cmd("SET")
        .arg("redlease:e2")
        .arg("someone-else")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = guard.extend(Duration::from_secs(60)).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(guard.lease().lost_reason(), Some(LostReason::Gone));
    eventually(2.0, "the name still held is freed", || {
        let mut conn = conn.clone();
        async move { !exists(&mut conn, "redlease:e1").await }
    })
    .await;
    assert_eq!(
        get(&mut conn, "redlease:e2").await.as_deref(),
        Some("someone-else"),
        "not ours to free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_a_wrong_type_takes_nothing() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let none: [&str; 0] = [];
    for err in [
        client.multi_lock(none).unwrap_err(),
        client.multi_lock(["a", "b", "a"]).unwrap_err(),
        client.multi_lock(["a", ""]).unwrap_err(),
        client
            .multi_lock_with(["a", "b"], LeaseOptions::new().ttl(Duration::ZERO))
            .unwrap_err(),
        client
            .multi_lock_with(["a", "b"], LeaseOptions::new().replica_ack(ReplicaAck::new(1)))
            .unwrap_err(),
    ] {
        assert!(err.is_invalid_input(), "{err}");
    }
    let _: () = redis::cmd("LPUSH")
        .arg("redlease:listy")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = client
        .multi_lock(["fine", "listy"])
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(matches!(err, redlease::Error::WrongType { .. }), "{err}");
    assert!(!exists(&mut conn, "redlease:fine").await, "nothing taken");
    assert!(
        !exists(&mut conn, "{redlease:fence}").await,
        "no fencing token used"
    );
    // A fencing counter that is not a number: nothing is taken either.
    let _: () = redis::cmd("SET")
        .arg("{redlease:fence}")
        .arg("not-a-number")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = client
        .multi_lock(["fine", "also-fine"])
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(!err.is_contended(), "{err}");
    for key in ["redlease:fine", "redlease:also-fine"] {
        assert!(!exists(&mut conn, key).await, "{key} given back");
    }
}

/// A release whose request for one master is held up by a slot migration (Redis answers
/// TRYAGAIN while the slot's keys are split between the two owners) for longer than the
/// lease: the names of that slot stay renewed until their release lands, so nobody can
/// take them in between, and the release reports success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_held_up_by_a_slot_migration_keeps_renewing_what_it_has_not_released() {
    let cluster = cluster(3);
    let client = Client::cluster_builder(cluster.urls())
        .unwrap()
        .retry_window(Duration::from_secs(30))
        .build()
        .await
        .expect("cluster client");
    let mut conn = raw_cluster(&cluster).await;
    let (a, b) = (name_on(&cluster, 0, "stay"), name_on(&cluster, 1, "move"));
    let (a_key, b_key) = (format!("redlease:{a}"), format!("redlease:{b}"));
    let b_slot = cluster.slot_of(&b_key).unwrap();
    // Renewed every 200 ms.
    let ttl = Duration::from_millis(600);
    let guard = client
        .multi_lock_with([&a, &b], LeaseOptions::new().ttl(ttl))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let token = guard.token().expose().to_owned();
    let lease = guard.lease().clone();

    // b's slot starts moving to master 2 and its keys go there: the release of b names
    // its waiters key too, which exists on neither side, so it is answered TRYAGAIN
    // until the slot has moved. Renewals name only keys that exist, and follow ASK.
    let migration = cluster.begin_migration(b_slot, 2).unwrap();
    assert!(cluster.migrate_keys(&migration).unwrap() >= 1);
    let release_began = Instant::now();
    let renewed_before = client.stats().leases_renewed;
    let release = tokio::spawn(guard.release());
    eventually(5.0, "a is released at once", || {
        let (mut conn, a_key) = (conn.clone(), a_key.clone());
        async move { !exists_any(&mut conn, &a_key).await }
    })
    .await;
    // Twice the lease passes with b's release held up: without renewals b would have
    // expired by then, free for anyone to take before the release lands.
    eventually(
        10.0,
        "b is renewed for twice its lease while its release waits",
        || {
            let renewed = client.stats().leases_renewed - renewed_before;
            async move { renewed >= 6 && release_began.elapsed() > 2 * ttl }
        },
    )
    .await;
    assert!(!release.is_finished(), "the release of b waits for the migration");
    let mut importing = raw(cluster.master(2)).await;
    let (value, remaining): (Option<String>, i64) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("GET")
        .arg(&b_key)
        .cmd("ASKING")
        .ignore()
        .cmd("PTTL")
        .arg(&b_key)
        .query_async(&mut importing)
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some(token.as_str()), "b is still held");
    assert!(remaining > 0, "b's lease was renewed: PTTL {remaining} ms");

    cluster.finish_migration(&migration).unwrap();
    let released = within(10.0, "the release lands once the slot has moved", release)
        .await
        .unwrap();
    assert!(
        released.is_ok(),
        "every name was held until released: {released:?}"
    );
    for key in [&a_key, &b_key] {
        assert!(!exists_any(&mut conn, key).await, "{key} released");
    }
    assert_eq!(lease.lost_reason(), Some(LostReason::Released));
    assert_eq!(client.stats().leases_lost_by_renewal, 0);
}

/// The entries of a name's waiters (`{<key>}:q`, the plain mutex's registrations).
async fn registrations<C: ConnectionLike + Send>(conn: &mut C, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(format!("{{{key}}}:q"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

/// A release announces itself only to registered waiters, so a waiting multi-lock
/// registers on the names that keep it out — as a waiter to wake, never to hand the
/// name to — and leaves the registrations when it gets every name, gives up or is
/// cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_registers_on_the_busy_names_only_and_leaves_when_done() {
    let server = server();
    let holder = client(&server.url()).await;
    let taker = client(&server.url()).await;
    let mut conn = raw(&server).await;
    let multi = taker.multi_lock(["free", "busy"]).unwrap();
    let busy = holder.mutex("busy").unwrap();
    let registered = |conn: &redis::aio::MultiplexedConnection, key: &'static str| {
        let mut conn = conn.clone();
        async move { registrations(&mut conn, key).await }
    };

    // Gets every name once the holder releases: woken, though the holder's lease had
    // 30 s left.
    let guard = busy.lock().await.unwrap();
    let waiting = tokio::spawn({
        let multi = multi.clone();
        async move { multi.lock().await }
    });
    eventually(5.0, "the waiter registers on the busy name", || {
        let conn = conn.clone();
        async move { registered(&conn, "redlease:busy").await.len() == 1 }
    })
    .await;
    let entries = registered(&conn, "redlease:busy").await;
    assert!(
        entries[0].len() == 17 && entries[0].ends_with('!'),
        "an id and the kind a release only wakes: {entries:?}"
    );
    assert!(
        registered(&conn, "redlease:free").await.is_empty(),
        "not on the free name"
    );
    assert!(!exists(&mut conn, "redlease:free").await, "holding nothing");
    guard.release().await.unwrap();
    let got = within(5.0, "woken by the release", waiting)
        .await
        .unwrap()
        .unwrap();
    for key in ["redlease:free", "redlease:busy"] {
        assert!(
            registered(&conn, key).await.is_empty(),
            "{key}: left once acquired"
        );
    }
    got.release().await.unwrap();

    // Gives up at its deadline, or is cancelled: the registration is left.
    let guard = busy.lock().await.unwrap();
    let err = multi.lock_timeout(Duration::from_millis(300)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    eventually(5.0, "left after a timeout", || {
        let conn = conn.clone();
        async move { registered(&conn, "redlease:busy").await.is_empty() }
    })
    .await;
    let waiting = tokio::spawn({
        let multi = multi.clone();
        async move { multi.lock().await }
    });
    eventually(5.0, "registered again", || {
        let conn = conn.clone();
        async move { registered(&conn, "redlease:busy").await.len() == 1 }
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    eventually(5.0, "left after a cancellation", || {
        let conn = conn.clone();
        async move { registered(&conn, "redlease:busy").await.is_empty() }
    })
    .await;
    // With no multi-lock registered, a plain waiter gets the name handed over by the
    // release.
    let plain = tokio::spawn({
        let mutex = taker.mutex("busy").unwrap();
        async move { mutex.lock().await }
    });
    eventually(5.0, "the plain waiter registers", || {
        let conn = conn.clone();
        async move { registered(&conn, "redlease:busy").await.len() == 1 }
    })
    .await;
    guard.release().await.unwrap();
    let got = within(5.0, "the plain waiter gets the name", plain)
        .await
        .unwrap()
        .unwrap();
    assert!(registered(&conn, "redlease:busy").await.is_empty());
    got.release().await.unwrap();
}

/// Plain and multi-lock acquisitions of a name draw their fencing tokens from the same
/// counter — on one server one per prefix, which a plain mutex on a free lock bumps
/// with a pipelined INCR; on a cluster one per slot — so the tokens of the name rise
/// across both kinds, also when the counter expired in between; and names taken by one
/// script get distinct tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_multi_lock_fencing_tokens_rise_together() {
    async fn alternate<C: ConnectionLike + Send + Clone + 'static>(
        client: &Client,
        conn: &C,
        names: [&str; 2],
        counter: &str,
    ) {
        let plain = client.mutex(names[0]).unwrap();
        let multi = client.multi_lock(names).unwrap();
        let mut last = FencingToken::new(0);
        for round in 0..12 {
            if round % 4 == 3 {
                // Let the counter expire (it lives 100 ms from its seed): the next
                // acquisition seeds it again.
                let counter = counter.to_owned();
                eventually(5.0, "the fencing counter expires", || {
                    let (mut conn, counter) = (conn.clone(), counter.clone());
                    async move { !exists_any(&mut conn, &counter).await }
                })
                .await;
            }
            let guard = plain.try_lock().await.unwrap();
            assert!(
                guard.fence() > last,
                "round {round}: plain {} after {last}",
                guard.fence()
            );
            last = guard.fence();
            guard.release().await.unwrap();
            let guard = multi.try_lock().await.unwrap();
            let &[first, second] = guard.fences() else {
                panic!("one fence per name")
            };
            assert!(first > last, "round {round}: multi {first} after {last}");
            assert!(
                second > last && second != first,
                "round {round}: {second}, {first}"
            );
            last = first;
            guard.release().await.unwrap();
        }
    }
    let server = server();
    let client = client(&server.url()).await;
    let conn = raw(&server).await;
    alternate(&client, &conn, ["ta", "tb"], "{redlease:fence}").await;

    let cluster = cluster(3);
    let client = cluster_client(&cluster).await;
    let conn = raw_cluster(&cluster).await;
    // The counter of the names' slot: the only key but theirs the acquisitions write
    // in it.
    let guard = client
        .multi_lock(["{s}a", "{s}b"])
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let slot = cluster.slot_of("redlease:{s}a").unwrap();
    let mut node = raw(cluster.master(cluster.master_of_slot(slot).unwrap())).await;
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query_async(&mut node)
        .await
        .unwrap();
    let counter = keys
        .iter()
        .find(|k| k.starts_with("{redlease:fence:") && k.ends_with('}'))
        .unwrap_or_else(|| panic!("a fencing counter in the slot: {keys:?}"))
        .clone();
    alternate(&client, &conn, ["{s}a", "{s}b"], &counter).await;
}

/// A multi-lock waiting behind a holder of one name that is not redlease — another
/// library's `SET NX PX` lock, or a key without a TTL — whose release announces nothing,
/// polls that holder, and gets every name soon after it lets go. (Without polling it
/// would wait out the foreign lease: 10 s here, or half its registration's life for a
/// key without a TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_in_soon_after_a_foreign_holder_lets_go() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;
    for (name, ttl) in [("foreign-px", Some(10_000)), ("foreign-no-ttl", None)] {
        let key = format!("redlease:{name}");
        take_as_foreign(&mut conn, &key, ttl).await;
        let waiter = tokio::spawn({
            let multi = client.multi_lock(["beside", name]).unwrap();
            async move {
                let guard = multi.lock_timeout(Duration::from_secs(8)).await;
                (guard, Instant::now())
            }
        });
        eventually(5.0, "the waiter registered", || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move { registrations(&mut conn, &key).await.len() == 1 }
        })
        .await;
        // Into the longer polls.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "{name}: the foreign holder still holds");
        let _: () = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
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
