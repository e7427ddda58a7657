//! Redlock over three real, independent redis-server masters: all up, one down, two
//! down, contention, split votes, quorum loss while held.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use redlease::{Error, LeaseOptions, LostReason, Redlock};

const KEY: &str = "redlease:job";

fn masters(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| server()).collect()
}

async fn redlock(servers: &[RedisServer]) -> Redlock {
    let clients = servers
        .iter()
        .map(|s| redis::Client::open(s.url()).unwrap())
        .collect();
    within(10.0, "connect the redlock", Redlock::connect(clients))
        .await
        .expect("connect")
}

/// The value of `key` on every running master (`None` for stopped ones or no key).
async fn values(servers: &[RedisServer], key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for s in servers {
        if s.is_running() {
            out.push(get(&mut raw(s).await, key).await);
        } else {
            out.push(None);
        }
    }
    out
}

/// Waits until no running master holds a key. A release returns once a majority
/// released; the other masters follow in the background.
async fn all_released(servers: &[RedisServer]) {
    let none = vec![0; servers.iter().filter(|s| s.is_running()).count()];
    eventually(5.0, "every master released", || async {
        key_counts(servers).await == none
    })
    .await;
}

async fn key_counts(servers: &[RedisServer]) -> Vec<usize> {
    let mut out = Vec::new();
    for s in servers.iter().filter(|s| s.is_running()) {
        out.push(all_keys(&mut raw(s).await).await.len());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_masters_up_lock_excludes_and_releases_everywhere() {
    let servers = masters(3);
    let a = redlock(&servers).await;
    let b = redlock(&servers).await;
    assert_eq!((a.nodes(), a.quorum()), (3, 2));
    let ttl = Duration::from_secs(10);
    let mutex = a.mutex_with("job", LeaseOptions::new().ttl(ttl)).unwrap();
    assert_eq!(mutex.key(), KEY);

    let t = Instant::now();
    let guard = mutex.try_lock().await.unwrap();
    let took = t.elapsed();
    // The round ends as soon as a majority granted it; the third master follows.
    assert!(guard.acquired_on() >= 2, "{}", guard.acquired_on());
    assert!(guard.is_held());
    // Same key format on every master as node-redlock and redsync: token, PX TTL.
    let token = guard.token().expose().to_owned();
    eventually(2.0, "every master holds the token", || async {
        values(&servers, KEY).await == vec![Some(token.clone()); 3]
    })
    .await;
    for s in &servers {
        let left = pttl(&mut raw(s).await, KEY).await;
        assert!(left > 9_000 && left <= 10_000, "pttl {left}");
        // Nothing but the lock key: a Redlock writes no fencing metadata.
        assert_eq!(all_keys(&mut raw(s).await).await.len(), 1);
    }
    // validity = ttl - elapsed - drift (1% + 2 ms), measured from before the round.
    let validity = guard
        .valid_until()
        .saturating_duration_since(std::time::Instant::now());
    assert!(
        validity <= ttl - Duration::from_millis(102)
            && validity > ttl - Duration::from_millis(102) - took - Duration::from_millis(50),
        "validity {validity:?} after {took:?}"
    );

    // A second holder is refused while the quorum lock is held.
    let other = b.mutex("job").unwrap();
    let err = other.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    if let Error::Contended { remaining, .. } = &err {
        assert!(
            remaining.is_some_and(|r| r > Duration::from_secs(9)),
            "{remaining:?}"
        );
    }
    let err = other.lock_timeout(Duration::from_millis(300)).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(
        values(&servers, KEY).await,
        vec![Some(token); 3],
        "the refused attempts changed nothing"
    );

    guard.release().await.unwrap();
    let released = values(&servers, KEY).await.iter().filter(|v| v.is_none()).count();
    assert!(
        released >= 2,
        "a majority released before the call returned: {released}"
    );
    all_released(&servers).await;
    println!("redlock acquire with 3 of 3 masters up: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_down_still_locks_and_renews() {
    let mut servers = masters(3);
    // Down before the Redlock is even built: connecting must tolerate it.
    servers[0].stop();
    let a = redlock(&servers).await;
    let b = redlock(&servers).await;
    let ttl = Duration::from_millis(600);
    let mutex = a.mutex_with("job", LeaseOptions::new().ttl(ttl)).unwrap();

    let mut took = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let guard = within(5.0, "lock with one master down", mutex.lock())
            .await
            .unwrap();
        took.push(t.elapsed());
        guard.release().await.unwrap();
    }
    let guard = mutex.lock().await.unwrap();
    assert_eq!(guard.acquired_on(), 2);
    let token = guard.token().expose().to_owned();
    assert_eq!(
        values(&servers, KEY).await,
        vec![None, Some(token.clone()), Some(token.clone())]
    );
    let err = b.mutex("job").unwrap().try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");

    // Renewal by quorum keeps the lease for many TTLs with one master down.
    tokio::time::sleep(ttl * 5).await;
    assert!(guard.is_held(), "lost: {:?}", guard.lease().lost_reason());
    assert_eq!(
        values(&servers, KEY).await,
        vec![None, Some(token.clone()), Some(token)]
    );
    guard.release().await.unwrap();
    assert_eq!(key_counts(&servers).await, vec![0, 0]);
    took.sort();
    println!(
        "redlock acquire with 2 of 3 masters up: median {:?}, max {:?}",
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_down_refuses_quickly_and_leaves_nothing() {
    let mut servers = masters(3);
    let a = redlock(&servers).await;
    let mutex = a.mutex("job").unwrap();
    // Warm: the masters were reachable, then two die.
    mutex.try_lock().await.unwrap().release().await.unwrap();
    servers[1].stop();
    servers[2].stop();

    for (what, attempt) in [("try_lock", false), ("lock", true)] {
        let t = Instant::now();
        let result = within(10.0, what, async {
            if attempt {
                mutex.lock().await
            } else {
                mutex.try_lock().await
            }
        })
        .await;
        let took = t.elapsed();
        let err = result.expect_err("no quorum, no lock");
        assert!(
            matches!(
                &err,
                Error::NoQuorum {
                    nodes: 3,
                    quorum: 2,
                    reachable: 1,
                    op: "acquire",
                    ..
                }
            ),
            "{what}: {err}"
        );
        assert!(err.is_unavailable());
        let msg = err.to_string();
        assert!(
            msg.contains("needs 2 of 3 redis masters") && msg.contains("only 1 answered"),
            "{msg}"
        );
        // Bounded by the client's retry window (3 s) plus one round.
        assert!(took < Duration::from_secs(5), "{what} took {took:?}");
        println!("redlock {what} with 1 of 3 masters up refused after {took:?}: {msg}");
        // The surviving master's claim is rolled back: before the error is returned when
        // it answered within the node timeout, else (a loaded machine: 1 in 20 runs) in
        // the background once it answers.
        eventually(5.0, &format!("{what} leaves no keys behind"), || {
            let servers = &servers;
            async move { key_counts(servers).await == vec![0] }
        })
        .await;
    }

    // A client with a short retry window refuses at once.
    let clients = servers
        .iter()
        .map(|s| redis::Client::open(s.url()).unwrap())
        .collect();
    let quick = Redlock::connect_with(clients, |b| b.retry_window(Duration::ZERO))
        .await
        .unwrap();
    let t = Instant::now();
    let err = quick.mutex("job").unwrap().lock().await.unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, Error::NoQuorum { .. }), "{err}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    println!("redlock lock with 1 of 3 up and no retry window refused after {took:?}");
    assert_eq!(key_counts(&servers).await, vec![0]);
}

/// A paused master accepts connections but never answers. A round does not wait for
/// it once a majority decided the outcome, and never longer than one node timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_costs_at_most_one_node_timeout() {
    let servers = masters(3);
    let a = redlock(&servers).await.node_timeout(Duration::from_millis(100));
    let b = redlock(&servers).await.node_timeout(Duration::from_millis(100));
    let mutex = a.mutex("job").unwrap();
    mutex.try_lock().await.unwrap().release().await.unwrap();
    servers[2].pause();
    let t = Instant::now();
    let guard = mutex.try_lock().await.unwrap();
    let took = t.elapsed();
    assert_eq!(guard.acquired_on(), 2);
    assert!(
        took < Duration::from_millis(90),
        "waited for the frozen master: {took:?}"
    );
    println!("redlock acquire with one frozen master: {took:?}");

    // A competitor is refused as quickly: two busy masters decide its round.
    let t = Instant::now();
    let err = b.mutex("job").unwrap().try_lock().await.unwrap_err();
    let took = t.elapsed();
    assert!(err.is_contended(), "{err}");
    assert!(
        took < Duration::from_millis(90),
        "waited for the frozen master: {took:?}"
    );

    // The frozen master runs our SET after the thaw, so the release must cover every
    // master, including one that did not answer.
    guard.release().await.unwrap();
    servers[2].resume();
    eventually(5.0, "no key left on the thawed master", || async {
        values(&servers, KEY).await == vec![None, None, None]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_redlock_holders_on_a_majority_exclude_us() {
    let servers = masters(3);
    let a = redlock(&servers).await;
    let mutex = a.mutex("job").unwrap();
    // node-redlock / redsync style holders: SET key <their value> NX PX.
    for s in &servers[..2] {
        let _: () = redis::cmd("SET")
            .arg(KEY)
            .arg("their-token")
            .arg("NX")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut raw(s).await)
            .await
            .unwrap();
    }
    let err = mutex.try_lock().await.unwrap_err();
    assert!(err.is_contended(), "{err}");
    // The call returns once a majority refused; the claim the free master granted is
    // rolled back then, or in the background when its answer came later.
    let want = vec![Some("their-token".into()), Some("their-token".into()), None];
    eventually(5.0, "our claim on the free master is rolled back", || async {
        values(&servers, KEY).await == want
    })
    .await;
    // Theirs on one master only: we still get a majority.
    let _: () = redis::cmd("DEL")
        .arg(KEY)
        .query_async(&mut raw(&servers[0]).await)
        .await
        .unwrap();
    let guard = mutex.try_lock().await.unwrap();
    assert_eq!(guard.acquired_on(), 2);
    guard.release().await.unwrap();
    assert_eq!(
        values(&servers, KEY).await,
        vec![None, Some("their-token".into()), None]
    );
}

/// A holder whose majority dies while it holds the lock is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_quorum_while_held_fires_lost() {
    let mut servers = masters(3);
    let a = redlock(&servers).await;
    let ttl = Duration::from_millis(900);
    let mutex = a.mutex_with("job", LeaseOptions::new().ttl(ttl)).unwrap();
    let guard = mutex.lock().await.unwrap();
    let lease = guard.lease().clone();
    tokio::time::sleep(ttl / 2).await;
    assert!(guard.is_held());
    let killed = Instant::now();
    servers[0].stop();
    servers[1].stop();
    let reason = within(5.0, "lost() fires", lease.lost()).await;
    let after = killed.elapsed();
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_held());
    // No later than the lease's validity: at most one TTL after the last renewal.
    assert!(after <= ttl + Duration::from_millis(100), "lost after {after:?}");
    let err = guard.extend(ttl).await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(guard.release().await.unwrap_err().is_not_held());
    // The surviving master's key is released, not left to expire.
    assert_eq!(values(&servers, KEY).await, vec![None, None, None]);
    assert_eq!(key_counts(&servers).await, vec![0]);
    println!("quorum lost {after:?} after two of three masters were killed (ttl {ttl:?})");
}

/// Keys deleted on a majority (a flush, a restart without persistence): the next
/// renewal round finds the majority gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_gone_on_a_majority_fire_lost_gone() {
    let servers = masters(3);
    let a = redlock(&servers).await;
    let ttl = Duration::from_millis(900);
    let mutex = a.mutex_with("job", LeaseOptions::new().ttl(ttl)).unwrap();
    let guard = mutex.lock().await.unwrap();
    // The lock returns at a majority; the last master's SET may still be on its way
    // (deleting the key before it lands would leave a majority holding).
    let token = guard.token().expose().to_owned();
    eventually(2.0, "every master holds the lock", || async {
        values(&servers, KEY).await == vec![Some(token.clone()); 3]
    })
    .await;
    // One master losing it is tolerated.
    let _: () = redis::cmd("DEL")
        .arg(KEY)
        .query_async(&mut raw(&servers[0]).await)
        .await
        .unwrap();
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held(), "{:?}", guard.lease().lost_reason());
    let deleted = Instant::now();
    let _: () = redis::cmd("DEL")
        .arg(KEY)
        .query_async(&mut raw(&servers[1]).await)
        .await
        .unwrap();
    let reason = within(5.0, "lost() fires", guard.lost()).await;
    assert_eq!(reason, LostReason::Gone);
    assert!(
        deleted.elapsed() <= ttl / 3 + Duration::from_millis(200),
        "{:?}",
        deleted.elapsed()
    );
    // The minority key it still had is released at once.
    eventually(2.0, "the last key is released", || async {
        values(&servers, KEY).await == vec![None, None, None]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_by_quorum() {
    let mut servers = masters(3);
    let a = redlock(&servers).await;
    let mutex = a
        .mutex_with(
            "job",
            LeaseOptions::new().ttl(Duration::from_secs(2)).auto_renew(false),
        )
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    // The call returns once a majority extended; the last master follows.
    let mut extended = 0;
    for s in &servers {
        if pttl(&mut raw(s).await, KEY).await > 19_000 {
            extended += 1;
        }
    }
    assert!(
        extended >= 2,
        "a majority extended before the call returned: {extended}"
    );
    eventually(5.0, "every master extended", || async {
        for s in &servers {
            if pttl(&mut raw(s).await, KEY).await <= 18_000 {
                return false;
            }
        }
        true
    })
    .await;
    assert!(guard.valid_until() > std::time::Instant::now() + Duration::from_secs(19));
    servers[0].stop();
    guard.extend(Duration::from_secs(30)).await.unwrap();
    servers[1].stop();
    let err = guard.extend(Duration::from_secs(40)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NoQuorum {
                op: "extend",
                reachable: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(guard.is_held(), "an unconfirmed extend keeps the previous lease");
    assert!(
        pttl(&mut raw(&servers[2]).await, KEY).await > 35_000,
        "the reachable master took it"
    );
}

/// Many clients, each with its own Redlock over the same masters, fight for one lock:
/// never two holders at once, every one gets through (split votes resolve), and a
/// release wakes a waiter instead of leaving it to its fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_never_overlaps_and_makes_progress() {
    let servers = masters(3);
    let holders = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let rl = redlock(&servers).await;
        for _ in 0..2 {
            let (rl, holders, done) = (rl.clone(), holders.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                // A long TTL: progress must come from wake-ups, not expiry.
                let mutex = rl
                    .mutex_with("job", LeaseOptions::new().ttl(Duration::from_secs(30)))
                    .unwrap();
                for _ in 0..5 {
                    let guard = mutex.lock_timeout(Duration::from_secs(20)).await.unwrap();
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    let t = Instant::now();
    within(30.0, "all contenders finish", async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    assert_eq!(done.load(Ordering::SeqCst), 40);
    all_released(&servers).await;
    println!(
        "40 contended redlock acquisitions by 8 tasks in 4 clients: {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_is_woken_by_a_release() {
    let servers = masters(3);
    let a = redlock(&servers).await;
    let b = redlock(&servers).await;
    let ttl = Duration::from_secs(30);
    let held = a
        .mutex_with("job", LeaseOptions::new().ttl(ttl))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex_with("job", LeaseOptions::new().ttl(ttl)).unwrap();
        async move {
            let g = m.lock().await.unwrap();
            (Instant::now(), g)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (got, guard) = within(5.0, "the waiter is woken", waiter).await.unwrap();
    let handoff = got - released;
    assert!(handoff < Duration::from_millis(500), "handoff took {handoff:?}");
    assert!(guard.acquired_on() >= 2);
    guard.release().await.unwrap();
    println!("redlock handoff to a waiter: {handoff:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_lock_leaves_no_keys() {
    let servers = masters(3);
    let a = redlock(&servers).await;
    let b = redlock(&servers).await;
    let held = a.mutex("job").unwrap().lock().await.unwrap();
    let m = b.mutex("job").unwrap();
    let waiting = tokio::spawn(async move { m.lock().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    waiting.abort();
    let _ = waiting.await;
    held.release().await.unwrap();
    all_released(&servers).await;

    // Dropped guard: released in the background on every master.
    let guard = b.mutex("job").unwrap().lock().await.unwrap();
    drop(guard);
    eventually(2.0, "a dropped guard is released everywhere", || async {
        key_counts(&servers).await == vec![0, 0, 0]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configurations_are_refused() {
    assert!(matches!(Redlock::new(Vec::new()), Err(Error::Config { .. })));
    let s1 = server();
    let s2 = server();
    let c1 = client(&s1.url()).await;
    let other = redlease::Client::builder(s2.client())
        .prefix("other:")
        .build()
        .await
        .unwrap();
    let err = Redlock::new(vec![c1.clone(), other]).unwrap_err();
    assert!(err.to_string().contains("same key prefix"), "{err}");
    let err = Redlock::new(vec![c1.clone(), c1.clone()]).unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");
    let rl = Redlock::new(vec![c1]).unwrap();
    assert!(rl.mutex("").unwrap_err().is_invalid_input());
    assert!(
        rl.mutex_with("x", LeaseOptions::new().ttl(Duration::ZERO))
            .unwrap_err()
            .is_invalid_input()
    );
}
