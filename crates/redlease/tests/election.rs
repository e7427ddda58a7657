//! Leader election against real redis-servers: one leader at a time, rising terms,
//! prompt hand-over on resignation, observers that see every change in order, a leader
//! that vanished without a word, and the same on a Cluster and through Sentinel.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use redlease::{Client, Election, Leader, LeaderEvent, LeaseOptions, LostReason, Observer};
use redlease_testkit::{RedisCluster, RedisSentinel};

async fn labelled(url: &str, label: &str) -> Client {
    Client::builder(redis::Client::open(url).unwrap())
        .owner_label(label)
        .build()
        .await
        .expect("connect")
}

async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("NUMSUB reply {other:?}"),
    }
}

/// The next change an observer reports, within `secs`.
async fn next(observer: &mut Observer, secs: f64) -> LeaderEvent {
    within(secs, "the observer reports a change", observer.next())
        .await
        .expect("the stream never ends")
        .expect("the observer reads the election")
}

fn elected(event: &LeaderEvent) -> &Leader {
    match event {
        LeaderEvent::Elected(leader) => leader,
        other => panic!("expected an election, got {other:?}"),
    }
}

fn proclaimed(event: &LeaderEvent) -> &Leader {
    match event {
        LeaderEvent::Proclaimed(leader) => leader,
        other => panic!("expected a proclamation, got {other:?}"),
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_leads_at_once_and_the_leader_reads_back_without_its_token() {
    let server = server();
    let (alpha, beta) = (
        labelled(&server.url(), "alpha:1").await,
        labelled(&server.url(), "beta:2").await,
    );
    let election = alpha.election("scheduler").unwrap();
    assert_eq!(election.key(), "redlease:scheduler");
    assert_eq!(election.leader().await.unwrap(), None, "nobody leads yet");

    let leadership = election.campaign("10.0.0.7:8080").await.unwrap();
    let term = leadership.term();
    assert!(term.get() > 0);
    assert_eq!(leadership.fence(), term);
    assert_eq!(redlease::Guard::fence(&leadership), Some(term));
    assert!(leadership.is_held());
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(
        (leader.value.as_str(), leader.term, leader.owner.as_str()),
        ("10.0.0.7:8080", term, "alpha:1")
    );
    let left = leader.remaining.expect("a lease");
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    assert!(leader.since.is_some());

    // Another candidate that will not wait is told who is in the way, for how long.
    let other = beta.election("scheduler").unwrap();
    match other.try_campaign("10.0.0.8:8080").await.unwrap_err() {
        redlease::Error::Contended { remaining, .. } => {
            assert!(
                remaining.is_some_and(|r| r > Duration::from_secs(25)),
                "{remaining:?}"
            )
        }
        e => panic!("expected Contended, got {e:?}"),
    }

    leadership.proclaim("10.0.0.7:9090").await.unwrap();
    assert_eq!(leadership.value(), "10.0.0.7:9090");
    let leader = other.leader().await.unwrap().expect("a leader");
    assert_eq!((leader.value.as_str(), leader.term), ("10.0.0.7:9090", term));

    // Every key shares the election key's slot, expires on its own, and only the
    // leader's own hash and the term mark carry its token.
    let mut conn = raw(&server).await;
    let keys = all_keys(&mut conn).await;
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "redlease:scheduler",
            "{redlease:scheduler}:history",
            "{redlease:scheduler}:term"
        ]
    );
    for (key, ttl) in &keys {
        assert!(*ttl > 0, "{key} has no TTL");
    }
    let token: String = redis::cmd("HGET")
        .arg("redlease:scheduler")
        .arg("token")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(token, leadership.token().expose());
    let history: redis::Value = redis::cmd("XRANGE")
        .arg("{redlease:scheduler}:history")
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !format!("{history:?}").contains(&token),
        "the history never holds a token"
    );

    let too_long = "x".repeat(redlease::MAX_LEADER_VALUE_LEN + 1);
    assert!(
        leadership
            .proclaim(&too_long)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        other
            .try_campaign(&too_long)
            .await
            .unwrap_err()
            .is_invalid_input()
    );

    leadership.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
    let next = other.try_campaign("10.0.0.8:8080").await.unwrap();
    assert!(next.term() > term, "{} after {term}", next.term());
    next.resign().await.unwrap();
}

/// A resignation wakes the waiting candidate through Redis, and it leads within a few
/// round trips — not at the end of the lease (30 s here) as it would without the
/// wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resignation_hands_over_to_a_waiting_candidate_within_a_few_round_trips() {
    let server = server();
    let clients = [client(&server.url()).await, client(&server.url()).await];
    let mut conn = raw(&server).await;
    let mut rtts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        rtts.push(t.elapsed());
    }
    const ROUNDS: usize = 12;
    let mut handovers = Vec::new();
    let mut last_term = 0;
    for round in 0..ROUNDS {
        let (leader_side, candidate_side) = (&clients[round % 2], &clients[(round + 1) % 2]);
        let leadership = leader_side
            .election("handover")
            .unwrap()
            .campaign("old")
            .await
            .unwrap();
        assert!(leadership.term().get() > last_term);
        let candidate = candidate_side.election("handover").unwrap();
        let waiting = tokio::spawn(async move { candidate.campaign("new").await });
        eventually(10.0, "the candidate waits for a wake-up", || {
            let mut conn = conn.clone();
            async move { numsub(&mut conn, "{redlease:handover}:wake").await == 1 }
        })
        .await;
        let resigned = Instant::now();
        leadership.resign().await.unwrap();
        let next = within(10.0, "the candidate leads", waiting)
            .await
            .unwrap()
            .unwrap();
        handovers.push(resigned.elapsed());
        last_term = next.term().get();
        next.resign().await.unwrap();
    }
    let (rtt, took) = (median(rtts), median(handovers.clone()));
    let worst = *handovers.iter().max().unwrap();
    eprintln!("hand-over after resign: median {took:?}, worst {worst:?} (PING round trip {rtt:?})");
    assert!(
        took < Duration::from_millis(200),
        "median hand-over {took:?}: {handovers:?}"
    );
    assert!(
        worst < Duration::from_secs(3),
        "a hand-over waited for the lease: {handovers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_take_turns_one_at_a_time_with_rising_terms() {
    let server = server();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in 0..3 {
        let client = labelled(&server.url(), &format!("candidate:{c}")).await;
        let (inside, most, terms) = (inside.clone(), most.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            let election = client.election("turns").unwrap();
            for _ in 0..5 {
                let leadership = election.campaign(&format!("candidate {c}")).await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                terms.lock().unwrap().push(leadership.term().get());
                tokio::time::sleep(Duration::from_millis(15)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.unwrap();
            }
        }));
    }
    for t in tasks {
        within(60.0, "every candidate leads five times", t).await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two candidates led at once");
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 15);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms did not rise: {terms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_keep_rising_when_the_term_mark_and_history_are_gone() {
    let server = server();
    let client = client(&server.url()).await;
    let election = client.election("marks").unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let l = election.campaign("x").await.unwrap();
        assert!(l.term().get() > last);
        last = l.term().get();
        l.resign().await.unwrap();
    }
    let mut conn = raw(&server).await;
    let _: i64 = redis::cmd("DEL")
        .arg("{redlease:marks}:term")
        .arg("{redlease:marks}:history")
        .query_async(&mut conn)
        .await
        .unwrap();
    let l = election.campaign("x").await.unwrap();
    assert!(l.term().get() > last, "{} after {last}", l.term());
    l.resign().await.unwrap();
}

/// An observer sees each term with its value, each proclamation and each vacancy, in
/// order — also the changes that happened in a burst while nobody polled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_reports_every_term_value_and_vacancy_in_order() {
    let server = server();
    let (a, b) = (
        labelled(&server.url(), "a:1").await,
        labelled(&server.url(), "b:2").await,
    );
    let watcher = labelled(&server.url(), "watcher:3").await;
    let mut observer = watcher.election("feed").unwrap().observe();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: false }
    );

    let ea = a.election("feed").unwrap();
    let la = ea.campaign("a").await.unwrap();
    let first = next(&mut observer, 10.0).await;
    let leader = elected(&first);
    assert_eq!(
        (leader.value.as_str(), leader.term, leader.owner.as_str()),
        ("a", la.term(), "a:1")
    );
    assert!(leader.remaining.is_some());

    la.proclaim("a2").await.unwrap();
    la.proclaim("a2").await.unwrap(); // the same value again: nothing to report
    let p = next(&mut observer, 10.0).await;
    assert_eq!(
        (proclaimed(&p).value.as_str(), proclaimed(&p).term),
        ("a2", la.term())
    );

    // A hand-over: the resignation and the next election both reach the observer.
    let eb = b.election("feed").unwrap();
    let waiting = tokio::spawn(async move { eb.campaign("b").await });
    let conn = raw(&server).await;
    eventually(10.0, "b waits", || {
        let mut conn = conn.clone();
        async move { numsub(&mut conn, "{redlease:feed}:wake").await == 1 }
    })
    .await;
    la.resign().await.unwrap();
    let lb = within(10.0, "b leads", waiting).await.unwrap().unwrap();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
    let e = next(&mut observer, 10.0).await;
    assert_eq!((elected(&e).value.as_str(), elected(&e).term), ("b", lb.term()));

    // A burst while nobody polls the observer: every change comes out, in order.
    lb.proclaim("b2").await.unwrap();
    lb.proclaim("b3").await.unwrap();
    lb.resign().await.unwrap();
    let la2 = ea.campaign("a again").await.unwrap();
    let term_a2 = la2.term();
    la2.resign().await.unwrap();
    let burst = [
        next(&mut observer, 10.0).await,
        next(&mut observer, 10.0).await,
        next(&mut observer, 10.0).await,
        next(&mut observer, 10.0).await,
        next(&mut observer, 10.0).await,
    ];
    assert_eq!(proclaimed(&burst[0]).value, "b2", "{burst:?}");
    assert_eq!(proclaimed(&burst[1]).value, "b3", "{burst:?}");
    assert_eq!(burst[2], LeaderEvent::Vacant { resigned: true }, "{burst:?}");
    assert_eq!(
        (elected(&burst[3]).value.as_str(), elected(&burst[3]).term),
        ("a again", term_a2)
    );
    assert_eq!(
        elected(&burst[3]).remaining,
        None,
        "that term had ended when it was read"
    );
    assert_eq!(burst[4], LeaderEvent::Vacant { resigned: true }, "{burst:?}");

    // A leader whose lease runs out (it stopped renewing, as a crashed one would): the
    // observer reports the vacancy when the lease ends, and the next term after it.
    let short = a
        .election_with(
            "feed",
            LeaseOptions::new()
                .ttl(Duration::from_millis(600))
                .auto_renew(false),
        )
        .unwrap();
    let lc = short.campaign("c").await.unwrap();
    let term_c = lc.term();
    let e = next(&mut observer, 10.0).await;
    assert_eq!(elected(&e).term, term_c);
    std::mem::forget(lc); // no resignation: the lease simply runs out
    let started = Instant::now();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: false }
    );
    eprintln!("vacancy of a lapsed lease reported after {:?}", started.elapsed());
    let ld = eb_after(&b).await;
    let e = next(&mut observer, 10.0).await;
    assert_eq!((elected(&e).value.as_str(), elected(&e).term), ("d", ld.term()));
    assert!(ld.term() > term_c);

    // A second observer begins with the election as it is.
    let mut late = watcher.election("feed").unwrap().observe();
    let now = next(&mut late, 10.0).await;
    assert_eq!(
        (elected(&now).value.as_str(), elected(&now).term),
        ("d", ld.term())
    );
    ld.resign().await.unwrap();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
    assert_eq!(
        next(&mut late, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
    drop((observer, late));
    eventually(10.0, "observers unsubscribe when dropped", || {
        let mut conn = conn.clone();
        async move { numsub(&mut conn, "{redlease:feed}:watch").await == 0 }
    })
    .await;
}

async fn eb_after(b: &Client) -> redlease::Leadership {
    b.election("feed").unwrap().campaign("d").await.unwrap()
}

/// A leader key deleted by hand (or lost by Redis) announces nothing: observers and
/// waiting candidates learn it when the lease they last saw would have ended, and the
/// leader at its next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_vanished_silently_is_noticed_within_its_lease() {
    let server = server();
    let ttl = Duration::from_secs(1);
    let options = LeaseOptions::new().ttl(ttl);
    let (a, b, w) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let leadership = a
        .election_with("silent", options)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    let mut observer = w.election_with("silent", options).unwrap().observe();
    elected(&next(&mut observer, 10.0).await);
    let candidate = b.election_with("silent", options).unwrap();
    let waiting = tokio::spawn(async move { candidate.campaign("b").await });
    let mut conn = raw(&server).await;
    eventually(10.0, "b waits", || {
        let mut conn = conn.clone();
        async move { numsub(&mut conn, "{redlease:silent}:wake").await == 1 }
    })
    .await;

    let deleted = Instant::now();
    let _: i64 = redis::cmd("DEL")
        .arg("redlease:silent")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        within(10.0, "the leader learns it", leadership.lost()).await,
        LostReason::Gone
    );
    assert!(leadership.proclaim("still me?").await.unwrap_err().is_not_held());
    let lb = within(10.0, "b leads", waiting).await.unwrap().unwrap();
    let took = deleted.elapsed();
    let events = [next(&mut observer, 10.0).await, next(&mut observer, 10.0).await];
    let noticed = deleted.elapsed();
    eprintln!("after a silent deletion: b led after {took:?}, the observer knew after {noticed:?}");
    assert!(took < ttl + Duration::from_secs(1), "{took:?}");
    assert!(noticed < ttl + Duration::from_secs(1), "{noticed:?}");
    assert_eq!(events[0], LeaderEvent::Vacant { resigned: false });
    assert_eq!(elected(&events[1]).term, lb.term());
    assert!(leadership.resign().await.unwrap_err().is_not_held());
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_leadership_resigns_in_the_background_and_wakes_a_candidate() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let leadership = a.election("dropped").unwrap().campaign("a").await.unwrap();
    let candidate = b.election("dropped").unwrap();
    let waiting = tokio::spawn(async move { candidate.campaign("b").await });
    let conn = raw(&server).await;
    eventually(10.0, "b waits", || {
        let mut conn = conn.clone();
        async move { numsub(&mut conn, "{redlease:dropped}:wake").await == 1 }
    })
    .await;
    let dropped = Instant::now();
    drop(leadership);
    let lb = within(10.0, "b leads", waiting).await.unwrap().unwrap();
    assert!(
        dropped.elapsed() < Duration::from_secs(3),
        "the drop did not resign: b waited {:?} (the lease is 30 s)",
        dropped.elapsed()
    );
    lb.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_that_times_out_or_is_cancelled_leaves_nothing_behind() {
    let server = server();
    let (a, b) = (client(&server.url()).await, client(&server.url()).await);
    let leadership = a.election("patience").unwrap().campaign("a").await.unwrap();
    let other = b.election("patience").unwrap();
    let started = Instant::now();
    let err = other
        .campaign_timeout("b", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    let cancelled = tokio::time::timeout(Duration::from_millis(200), other.campaign("b")).await;
    assert!(cancelled.is_err(), "a leader is in office");
    let conn = raw(&server).await;
    eventually(10.0, "the candidate stops listening", || {
        let mut conn = conn.clone();
        async move { numsub(&mut conn, "{redlease:patience}:wake").await == 0 }
    })
    .await;
    leadership.resign().await.unwrap();
    assert_eq!(other.leader().await.unwrap(), None, "no leftover leader");
    assert_eq!(other.try_campaign("b").await.unwrap().value(), "b");
}

/// On a 3-master Redis Cluster every key of an election lives in one slot, and
/// candidates and observers are told through sharded pub/sub on that slot's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_on_a_cluster_keeps_to_one_slot_and_hands_over() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0).unwrap())
        .await
        .unwrap();
    let key = cluster
        .key_on_master(2, |n| format!("redlease:election-{n}"))
        .unwrap();
    let name = key.trim_start_matches("redlease:").to_owned();
    let (a, b, w) = (
        Client::cluster(cluster.urls()).await.unwrap(),
        Client::cluster(cluster.urls()).await.unwrap(),
        Client::cluster(cluster.urls()).await.unwrap(),
    );
    let mut observer = w.election(&name).unwrap().observe();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: false }
    );
    let la = a.election(&name).unwrap().campaign("a").await.unwrap();
    let term_a = la.term();
    assert_eq!(elected(&next(&mut observer, 10.0).await).term, term_a);

    let slot = cluster.slot_of(&key).unwrap();
    let mut master = raw(cluster.master(2)).await;
    let keys = all_keys(&mut master).await;
    assert_eq!(keys.len(), 3, "{keys:?}");
    for (k, ttl) in &keys {
        assert_eq!(cluster.slot_of(k).unwrap(), slot, "{k}");
        assert!(*ttl > 0, "{k} has no TTL");
    }

    let candidate = b.election(&name).unwrap();
    let waiting = tokio::spawn(async move { candidate.campaign("b").await });
    let wake = format!("{{{key}}}:wake");
    eventually(10.0, "b waits on the slot's master", || {
        let (mut master, wake) = (master.clone(), wake.clone());
        async move {
            let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&wake)
                .query_async(&mut master)
                .await
                .unwrap();
            matches!(reply.get(1), Some(redis::Value::Int(1)))
        }
    })
    .await;
    let resigned = Instant::now();
    la.resign().await.unwrap();
    let lb = within(10.0, "b leads", waiting).await.unwrap().unwrap();
    let took = resigned.elapsed();
    eprintln!("cluster hand-over after resign: {took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(lb.term() > term_a);
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
    assert_eq!(elected(&next(&mut observer, 10.0).await).term, lb.term());
    lb.resign().await.unwrap();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
}

/// Through Sentinel: the election lives on the master the sentinels name, and works
/// as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_through_sentinel_leads_on_the_master_and_hands_over() {
    let set = tokio::task::spawn_blocking(|| RedisSentinel::start().unwrap())
        .await
        .unwrap();
    let connect = || async {
        Client::sentinel(set.sentinel_urls(), set.master_name())
            .await
            .expect("sentinel client")
    };
    let (a, b, w) = (connect().await, connect().await, connect().await);
    let election: Election = a.election("through-sentinel").unwrap();
    let mut observer = w.election("through-sentinel").unwrap().observe();
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: false }
    );
    let la = election.campaign("a").await.unwrap();
    let term_a = la.term();
    assert_eq!(elected(&next(&mut observer, 10.0).await).term, term_a);
    let mut master = raw(set.master()).await;
    assert!(
        exists(&mut master, "redlease:through-sentinel").await,
        "on the master"
    );

    let candidate = b.election("through-sentinel").unwrap();
    let waiting = tokio::spawn(async move { candidate.campaign("b").await });
    eventually(10.0, "b waits", || {
        let mut master = master.clone();
        async move { numsub(&mut master, "{redlease:through-sentinel}:wake").await == 1 }
    })
    .await;
    let resigned = Instant::now();
    la.resign().await.unwrap();
    let lb = within(10.0, "b leads", waiting).await.unwrap().unwrap();
    assert!(
        resigned.elapsed() < Duration::from_secs(3),
        "{:?}",
        resigned.elapsed()
    );
    assert!(lb.term() > term_a);
    assert_eq!(
        next(&mut observer, 10.0).await,
        LeaderEvent::Vacant { resigned: true }
    );
    assert_eq!(elected(&next(&mut observer, 10.0).await).term, lb.term());
    lb.resign().await.unwrap();
}
