//! The mutex on a real Redis Cluster: slot layout, exclusion and sharded wake-ups across
//! masters, a resharding in the middle of use, a restarted master, replica acks.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redlease::{LeaseOptions, LostReason, OnShortfall, ReplicaAck};
use redlease_testkit::RedisCluster;

fn cluster(masters: usize, replicas: usize) -> RedisCluster {
    RedisCluster::start(masters, replicas).unwrap_or_else(|e| panic!("{e}"))
}

async fn cluster_client(cluster: &RedisCluster) -> redlease::Client {
    redlease::Client::cluster(cluster.urls())
        .await
        .expect("cluster client")
}

/// A plain redis-rs cluster connection, for the protected counters.
async fn raw_cluster(cluster: &RedisCluster) -> ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .expect("raw cluster connection")
}

/// A lock name whose key `redlease:<name>` lives on master `master`.
fn name_on(cluster: &RedisCluster, master: usize, base: &str) -> String {
    let key = cluster
        .key_on_master(master, |n| format!("redlease:{base}-{n}"))
        .unwrap();
    key.trim_start_matches("redlease:").to_owned()
}

async fn shard_numsub(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("SHARDNUMSUB reply {other:?}"),
    }
}

/// A counter from `INFO` / `CLUSTER INFO` text (`name:value` or `name:calls=N,...`).
fn stat(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| {
            let v = v.strip_prefix("calls=").unwrap_or(v);
            v.split(',').next().unwrap_or("0").trim().parse().unwrap_or(0)
        })
        .unwrap_or(0)
}

async fn info(conn: &mut MultiplexedConnection, section: &[&str]) -> String {
    let mut cmd = redis::cmd(section[0]);
    for arg in &section[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_lock_shares_its_slot_and_the_key_stays_plain() {
    let cluster = cluster(3, 0);
    let client = cluster_client(&cluster).await;
    for name in ["slot-check", "{tenant-7}:job"] {
        let mutex = client.mutex(name).unwrap();
        let key = format!("redlease:{name}");
        assert_eq!(mutex.key(), key);
        let guard = mutex.lock().await.unwrap();
        let slot = cluster.slot_of(&key).unwrap();
        let owner = cluster.master_of_slot(slot).unwrap();
        let mut conn = raw(cluster.master(owner)).await;
        assert_eq!(
            get(&mut conn, &key).await.as_deref(),
            Some(guard.token().expose()),
            "the token is stored at exactly <prefix><name>"
        );
        let mut stored: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(10)
            .query_async(&mut conn)
            .await
            .unwrap();
        stored.sort();
        // The lock key, the fencing floor of its slot, and the slot's counter unless its
        // 100 ms have run out.
        assert!(
            stored.contains(&key)
                && stored
                    .iter()
                    .any(|k| k.starts_with("{redlease:fence") && k.ends_with("}:floor"))
                && (2..=3).contains(&stored.len()),
            "lock key, fencing counter and floor: {stored:?}"
        );
        for aux in &stored {
            assert_eq!(
                cluster.slot_of(aux).unwrap(),
                slot,
                "{aux} shares the slot of {key}"
            );
            assert!(pttl(&mut conn, aux).await > 0, "{aux} has a TTL");
        }
        // The wake-up channel too: sharded channels hash like keys.
        let channel = if name.contains('{') {
            format!("{key}:wake")
        } else {
            format!("{{{key}}}:wake")
        };
        assert_eq!(cluster.slot_of(&channel).unwrap(), slot);
        let status = mutex.status().await.unwrap();
        assert!(status.held);
        assert_mark(status.last_fence, guard.fence(), "status");
        assert_eq!(status.waiters, 0);
        // A waiting client shows up, counted on the node that owns the slot.
        let other = cluster_client(&cluster).await;
        let waiter = tokio::spawn({
            let mutex = other.mutex(name).unwrap();
            async move { mutex.lock().await.map(|g| g.forget()) }
        });
        eventually(5.0, "status counts the waiter", || {
            let mutex = mutex.clone();
            async move { mutex.status().await.unwrap().waiters == 1 }
        })
        .await;
        guard.release().await.unwrap();
        let token = within(5.0, "the waiter gets the lock", waiter)
            .await
            .unwrap()
            .unwrap();
        mutex.release_token(&token).await.unwrap();
        assert!(!exists(&mut conn, &key).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lost_update_on_three_masters_with_sharded_wakeups() {
    const TASKS_PER_NAME: usize = 6; // 3 per client
    const ROUNDS: usize = 8;
    let cluster = cluster(3, 0);
    let names: Vec<String> = (0..3).map(|m| name_on(&cluster, m, "counter")).collect();
    let clients = [cluster_client(&cluster).await, cluster_client(&cluster).await];
    let counters = raw_cluster(&cluster).await;
    // Per name: tasks inside, most ever inside, release instants and handoff times.
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
    let max_inside: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
    // name -> (task that released last, when it started releasing)
    let released_at: Arc<StdMutex<HashMap<usize, (usize, Instant)>>> = Arc::default();
    let handoffs: Arc<StdMutex<Vec<Duration>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));

    // Watch the owning masters: waiters subscribe there, and only there.
    let mut owner_conns = Vec::new();
    for m in 0..3 {
        owner_conns.push(raw(cluster.master(m)).await);
    }
    let channels: Vec<String> = names.iter().map(|n| format!("{{redlease:{n}}}:wake")).collect();
    let monitor = tokio::spawn({
        let (done, channels) = (done.clone(), channels.clone());
        let mut conns = owner_conns.clone();
        async move {
            // seen[m][c]: most subscribers of channel c seen on master m.
            let mut seen = [[0i64; 3]; 3];
            while !done.load(Ordering::SeqCst) {
                for (m, conn) in conns.iter_mut().enumerate() {
                    for (c, channel) in channels.iter().enumerate() {
                        seen[m][c] = seen[m][c].max(shard_numsub(conn, channel).await);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        }
    });

    let started = Instant::now();
    let mut handles = Vec::new();
    for (n, name) in names.iter().enumerate() {
        for t in 0..TASKS_PER_NAME {
            let me = n * TASKS_PER_NAME + t;
            let mutex = clients[t % 2].mutex(name).unwrap();
            let mut conn = counters.clone();
            let counter = format!("{{redlease:{name}}}:value");
            let (inside, max_inside) = (inside.clone(), max_inside.clone());
            let (released_at, handoffs) = (released_at.clone(), handoffs.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = mutex.lock_timeout(Duration::from_secs(60)).await.expect("lock");
                    // A handoff: another task released and this one, waiting, got it.
                    if let Some((by, at)) = released_at.lock().unwrap().remove(&n)
                        && by != me
                    {
                        handoffs.lock().unwrap().push(at.elapsed());
                    }
                    let now = inside[n].fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside[n].fetch_max(now, Ordering::SeqCst);
                    let v: Option<i64> = redis::cmd("GET")
                        .arg(&counter)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    // Held a while, so that the other client's waiter is seen subscribed
                    // (a hand-over without a hold is over between two samples).
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let _: () = redis::cmd("SET")
                        .arg(&counter)
                        .arg(v.unwrap_or(0) + 1)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    inside[n].fetch_sub(1, Ordering::SeqCst);
                    released_at.lock().unwrap().insert(n, (me, Instant::now()));
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for h in handles {
        within(120.0, "every task finishes", h).await.unwrap();
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let seen = monitor.await.unwrap();

    let mut conn = counters.clone();
    for (n, name) in names.iter().enumerate() {
        let v: Option<i64> = redis::cmd("GET")
            .arg(format!("{{redlease:{name}}}:value"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(v, Some((TASKS_PER_NAME * ROUNDS) as i64), "lost update on {name}");
        assert_eq!(
            max_inside[n].load(Ordering::SeqCst),
            1,
            "two holders of {name} at once"
        );
    }
    // Each name's waiters subscribed on the master that owns it, and only there.
    for (m, row) in seen.iter().enumerate() {
        for (c, &most) in row.iter().enumerate() {
            if m == c {
                assert!(
                    most >= 1,
                    "waiters of {} subscribed on its master: {seen:?}",
                    names[c]
                );
                assert!(most <= 2, "one subscription per client: {seen:?}");
            } else {
                assert_eq!(
                    most, 0,
                    "a subscription on a master that does not own it: {seen:?}"
                );
            }
        }
    }
    // Releases published with SPUBLISH on the owning shard; nothing was broadcast.
    for (m, conn) in owner_conns.iter_mut().enumerate() {
        let stats = info(conn, &["INFO", "commandstats"]).await;
        assert!(
            stat(&stats, "cmdstat_spublish") > 0,
            "master {m} published sharded: {stats}"
        );
        assert_eq!(stat(&stats, "cmdstat_publish"), 0, "master {m} used PUBLISH");
        let bus = info(conn, &["CLUSTER", "INFO"]).await;
        assert_eq!(
            stat(&bus, "cluster_stats_messages_publish_sent"),
            0,
            "a release was broadcast over the cluster bus: {bus}"
        );
    }
    let mut handoffs = handoffs.lock().unwrap().clone();
    handoffs.sort();
    let (p50, p99) = (percentile(&handoffs, 0.5), percentile(&handoffs, 0.99));
    eprintln!(
        "cluster: {} acquisitions on 3 masters in {elapsed:?}; handoff p50 {p50:?} p99 {p99:?} max {:?}",
        3 * TASKS_PER_NAME * ROUNDS,
        handoffs.last().unwrap()
    );
    // A poller would wait for the holder's lease (30 s); a wake-up takes milliseconds.
    assert!(p50 < Duration::from_millis(100), "handoff p50 {p50:?}");
    assert!(p99 < Duration::from_secs(5), "handoff p99 {p99:?}");
}

/// While a slot migrates, a held lock keeps working: renewal and release touch keys
/// that all exist on one side (the old owner, or the new one reached through `ASK`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_renews_and_releases_throughout_a_slow_migration() {
    let cluster = cluster(3, 0);
    let name = name_on(&cluster, 0, "held-while-moving");
    let key = format!("redlease:{name}");
    let slot = cluster.slot_of(&key).unwrap();
    let client = cluster_client(&cluster).await;
    // Renewed every 500 ms: several renewals land in each phase below, each of which
    // outlasts the lease.
    let guard = client
        .mutex_with(&name, LeaseOptions::new().ttl(Duration::from_millis(1500)))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let migration = cluster.begin_migration(slot, 1).unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(guard.is_held(), "renewed on the old owner while MIGRATING");
    assert_eq!(cluster.migrate_keys(&migration).unwrap(), 2);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(guard.is_held(), "renewed on the new owner through ASK");
    let mut new_owner = raw(cluster.master(1)).await;
    // The slot is still IMPORTING there: ask with ASKING.
    let (remaining,): (i64,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("PTTL")
        .arg(&key)
        .query_async(&mut new_owner)
        .await
        .unwrap();
    assert!(
        remaining > 200,
        "the renewals moved the expiry on the new owner: {remaining} ms"
    );
    cluster.finish_migration(&migration).unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(guard.is_held(), "renewed after the move");
    assert_eq!(guard.lease().lost_reason(), None);
    guard.release().await.unwrap();
    assert!(!exists(&mut new_owner, &key).await);
}

/// Tasks on two clients contend for one lock while its slot moves twice, the way
/// `redis-cli --cluster reshard` moves it. Acquiring a *free* lock is impossible while
/// its slot migrates — Redis answers TRYAGAIN to any multi-key request whose keys are
/// not all on one side — so acquisitions retry through the migration, and must never
/// fail, overlap or go backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharding_mid_use_keeps_exclusion_and_progress() {
    const TASKS: usize = 4;
    let cluster = cluster(3, 0);
    let name = name_on(&cluster, 0, "moving");
    let key = format!("redlease:{name}");
    let slot = cluster.slot_of(&key).unwrap();
    let channel = format!("{{{key}}}:wake");
    let clients = [cluster_client(&cluster).await, cluster_client(&cluster).await];
    let counters = raw_cluster(&cluster).await;
    let counter = format!("{{{key}}}:value");
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let rounds = Arc::new(AtomicUsize::new(0));
    let fences: Arc<StdMutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let mutex = clients[t % 2].mutex(&name).unwrap();
        let mut conn = counters.clone();
        let counter = counter.clone();
        let (inside, max_inside, rounds) = (inside.clone(), max_inside.clone(), rounds.clone());
        let (fences, stop) = (fences.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = mutex.lock_timeout(Duration::from_secs(30)).await.expect("lock");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now, Ordering::SeqCst);
                fences.lock().unwrap().push(guard.fence().get());
                let v: Option<i64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                let _: () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(v.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                rounds.fetch_add(1, Ordering::SeqCst);
                guard.release().await.expect("release");
            }
        }));
    }
    let progress = |what: &'static str| {
        let rounds = rounds.clone();
        let from = rounds.load(Ordering::SeqCst);
        eventually(30.0, what, move || {
            let rounds = rounds.clone();
            async move { rounds.load(Ordering::SeqCst) >= from + 20 }
        })
    };
    progress("the tasks get going").await;

    // Move the slot 0 -> 1, pausing at each step with the tasks running. Master 1 has
    // forgotten its scripts, so the first call there is reloaded on that node.
    let mut target = raw(cluster.master(1)).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut target)
        .await
        .unwrap();
    let step = Duration::from_millis(300);
    let started = Instant::now();
    let migration = cluster.begin_migration(slot, 1).unwrap();
    tokio::time::sleep(step).await;
    let moved = cluster.migrate_keys(&migration).unwrap();
    assert!(moved >= 2, "the lock's keys moved: {moved}");
    tokio::time::sleep(step).await;
    cluster.finish_migration(&migration).unwrap();
    progress("progress after the first move").await;
    let first_move = started.elapsed();
    let mut new_owner = raw(cluster.master(1)).await;
    eventually(10.0, "waiters subscribe on the new owner", || {
        let (mut conn, channel) = (new_owner.clone(), channel.clone());
        async move { shard_numsub(&mut conn, &channel).await >= 1 }
    })
    .await;
    // And once more, 1 -> 2, in one go.
    let started = Instant::now();
    cluster.migrate_slot(slot, 2).unwrap();
    progress("progress after the second move").await;
    let second_move = started.elapsed();

    stop.store(true, Ordering::SeqCst);
    for h in handles {
        within(60.0, "every task finishes", h).await.unwrap();
    }
    let total = rounds.load(Ordering::SeqCst);
    let mut conn = counters.clone();
    let v: Option<i64> = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, Some(total as i64), "lost update across the resharding");
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    let fences = fences.lock().unwrap().clone();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens rise across the migrations"
    );
    let stats = info(&mut target, &["INFO", "commandstats"]).await;
    assert!(
        stat(&stats, "cmdstat_eval") > 0,
        "a NOSCRIPT on the new owner was answered with EVAL there: {stats}"
    );
    assert_eq!(cluster.master_of_slot(slot).unwrap(), 2);
    let mut old_owner = raw(cluster.master(0)).await;
    assert_eq!(shard_numsub(&mut old_owner, &channel).await, 0);
    assert_eq!(shard_numsub(&mut new_owner, &channel).await, 0);
    eprintln!(
        "resharding: {total} acquisitions; 20 more within {first_move:?} of starting a stepwise move \
         (2 x {step:?} pauses) and {second_move:?} of a one-go move"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_master_loses_its_locks_and_waiters_move_on() {
    let mut cluster = cluster(3, 0);
    let name = name_on(&cluster, 1, "restart");
    let holder = cluster_client(&cluster).await;
    let waiter = cluster_client(&cluster).await;
    let options = LeaseOptions::new().ttl(Duration::from_secs(3));
    let held = holder.mutex_with(&name, options).unwrap().lock().await.unwrap();
    let task = tokio::spawn({
        let mutex = waiter.mutex_with(&name, options).unwrap();
        async move { mutex.lock_timeout(Duration::from_secs(20)).await }
    });
    // Wait until the waiter is subscribed, then restart the lock's master empty.
    let mut conn = raw(cluster.master(1)).await;
    let channel = format!("{{redlease:{name}}}:wake");
    eventually(5.0, "the waiter subscribes", || {
        let (mut conn, channel) = (conn.clone(), channel.clone());
        async move { shard_numsub(&mut conn, &channel).await == 1 }
    })
    .await;
    cluster.master_mut(1).restart().unwrap();
    let restarted = Instant::now();
    let guard = within(15.0, "the waiter acquires after the restart", task)
        .await
        .unwrap()
        .unwrap();
    let waited = restarted.elapsed();
    assert_eq!(
        within(5.0, "the holder is told", held.lost()).await,
        LostReason::Gone
    );
    conn = raw(cluster.master(1)).await;
    assert_eq!(
        get(&mut conn, &format!("redlease:{name}")).await.as_deref(),
        Some(guard.token().expose())
    );
    eprintln!("cluster master restart: waiter acquired {waited:?} after the restart");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_on_a_cluster_count_the_shard_replicas() {
    let mut cluster = cluster(3, 1);
    let client = cluster_client(&cluster).await;
    let name = name_on(&cluster, 2, "durable");
    let strict = LeaseOptions::new().replica_ack(ReplicaAck::new(1).timeout(Duration::from_millis(300)));
    let guard = client
        .mutex_with(&name, strict)
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(1));
    guard.release().await.unwrap();

    // Freeze master 2's replica: the WAIT times out with no acknowledgement.
    let replica = cluster.replicas().position(|(m, _)| m == 2).unwrap();
    cluster.replica_mut(replica).pause();
    let started = Instant::now();
    let err = client
        .mutex_with(&name, strict)
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            redlease::Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    let mut conn = raw(cluster.master(2)).await;
    assert!(
        !exists(&mut conn, &format!("redlease:{name}")).await,
        "released after the shortfall"
    );

    let lenient = strict.replica_ack(
        ReplicaAck::new(1)
            .timeout(Duration::from_millis(300))
            .on_shortfall(OnShortfall::Proceed),
    );
    let guard = client
        .mutex_with(&name, lenient)
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert_eq!(guard.replicas_acked(), Some(0));
    assert!(guard.is_held());
    cluster.replica_mut(replica).resume();
    guard.release().await.unwrap();
}

/// Renewal sends one pipeline per master per tick, not one per slot: 600 leases spread
/// over hundreds of slots on 3 masters renew in at most 3 round trips a tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_one_round_trip_per_master_per_tick() {
    let cluster = cluster(3, 0);
    let client = cluster_client(&cluster).await;
    let ttl = Duration::from_millis(900);
    let mut guards = Vec::new();
    for i in 0..600 {
        let mutex = client
            .mutex_with(&format!("many-{i}"), LeaseOptions::new().ttl(ttl))
            .unwrap();
        guards.push(mutex.try_lock().await.unwrap());
    }
    let slots: std::collections::HashSet<u16> = guards
        .iter()
        .map(|g| redis::cluster_routing::Slot::for_key(g.key()))
        .map(|s| {
            format!("{s:?}")
                .trim_start_matches("Slot(")
                .trim_end_matches(')')
                .parse()
                .unwrap()
        })
        .collect();
    assert!(slots.len() > 300, "the leases span many slots: {}", slots.len());
    let before = client.stats();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = client.stats();
    let ticks = after.renewal_ticks - before.renewal_ticks;
    let trips = after.renewal_round_trips - before.renewal_round_trips;
    let renewed = after.leases_renewed - before.leases_renewed;
    eprintln!("cluster renewal: {ticks} ticks, {trips} round trips, {renewed} renewals");
    assert!(renewed >= 600 * 5, "every lease renewed every ~300 ms: {renewed}");
    assert!(ticks >= 5, "ticks {ticks}");
    assert!(
        trips <= ticks * 3,
        "{trips} round trips in {ticks} ticks on 3 masters"
    );
    assert_eq!(after.leases_lost_by_renewal, 0);
    assert!(guards.iter().all(|g| g.is_held()));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// `list` scans every master: locks of several kinds on each of three masters are all
/// listed, the per-slot fencing counters are not, and the kinds read right on each node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_the_locks_on_every_master() {
    let cluster = cluster(3, 0);
    let client = cluster_client(&cluster).await;
    let mut guards = Vec::new();
    let mut readers = Vec::new();
    let mut leaders = Vec::new();
    let mut want = Vec::new();
    for master in 0..3 {
        let mutex = name_on(&cluster, master, "m");
        guards.push(client.mutex(&mutex).unwrap().lock().await.unwrap());
        want.push((mutex, redlease::LockKind::Mutex));
        let table = name_on(&cluster, master, "r");
        readers.push(client.rwlock(&table).unwrap().read().await.unwrap());
        want.push((table, redlease::LockKind::RwLock));
        let election = name_on(&cluster, master, "e");
        leaders.push(client.election(&election).unwrap().campaign("v").await.unwrap());
        want.push((election, redlease::LockKind::Election));
    }
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let list = client.list("*").await.unwrap();
    let got: Vec<(String, redlease::LockKind)> = list.iter().map(|l| (l.name.clone(), l.kind)).collect();
    assert_eq!(got, want, "{list:#?}");
    assert_eq!(client.list("m-*").await.unwrap().len(), 3);
    for g in guards {
        g.release().await.unwrap();
    }
    for r in readers {
        r.release().await.unwrap();
    }
    for l in leaders {
        l.resign().await.unwrap();
    }
    assert!(client.list("*").await.unwrap().is_empty());
}
