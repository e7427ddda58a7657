//! Least privilege: everything redlease does works as an ACL user limited by
//! `redlease::acl_rules`, the user needs every command in them, and it cannot touch
//! other keys, channels or commands.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use redlease::{Client, LeaderEvent, LeaseOptions, Redlock};

const USER: &str = "locker";
const PASSWORD: &str = "s3cret-pass";

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    raw(server).await
}

async fn create_user(admin: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(USER).arg("on").arg(format!(">{PASSWORD}"));
    for rule in redlease::acl_rules(prefix) {
        cmd.arg(rule);
    }
    let _: () = cmd
        .query_async(admin)
        .await
        .expect("ACL SETUSER with the documented rules");
}

fn user_url(server: &RedisServer) -> String {
    format!("redis://{USER}:{PASSWORD}@127.0.0.1:{}", server.port())
}

async fn acl_log(admin: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let entries: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query_async(admin).await.unwrap();
    entries.iter().map(|e| format!("{e:?}")).collect()
}

/// Commands with at least one call since the last `CONFIG RESETSTAT`.
async fn used_commands(admin: &mut redis::aio::MultiplexedConnection) -> BTreeSet<String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, stats) = line.split_once(':')?;
            let calls: u64 = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            (calls > 0).then(|| name.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_works_under_the_documented_acl_user() {
    let server = server();
    let mut admin = admin(&server).await;
    create_user(&mut admin, "redlease:").await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();

    let a = Client::connect(&user_url(&server))
        .await
        .expect("connect as the ACL user");
    let b = Client::connect(&user_url(&server)).await.unwrap();
    let ttl = Duration::from_millis(900);
    let options = LeaseOptions::new().ttl(ttl);

    // Lock; a second client waits (subscribed) while the lease is renewed for several
    // TTLs and the idle wake-up connection is pinged (every 5 s).
    let held = a.mutex_with("report", options).unwrap().lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex_with("report", options).unwrap();
        async move { m.lock_timeout(Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert!(
        held.is_held(),
        "renewal works under the ACL user: {:?}",
        held.lease().lost_reason()
    );
    let status = held.mutex().status().await.unwrap();
    assert!(status.held);
    assert_eq!(status.waiters, 1, "PUBSUB NUMSUB is allowed");
    assert_eq!(status.owner.as_deref(), Some(a.owner_label()));
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = within(5.0, "the waiter is woken", waiter).await.unwrap().unwrap();
    assert!(released.elapsed() < ttl, "woken by the release, not by expiry");
    guard.extend(Duration::from_secs(5)).await.unwrap();
    guard.release().await.unwrap();

    // Scripts flushed by an operator: the NOSCRIPT reload (SCRIPT LOAD) is allowed.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    a.mutex("after-flush")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Redlock (its own acquire script) over a master as the same user.
    let redlock = Redlock::new(vec![a.clone()]).unwrap();
    redlock
        .mutex("quorum")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // The other primitives, each with a waiter woken by a release: their scripts use
    // the sorted-set commands the rules grant.
    let fair = a.fair_mutex_with("queue", options).unwrap();
    let first = fair.lock().await.unwrap();
    let queued = tokio::spawn({
        let f = b.fair_mutex_with("queue", options).unwrap();
        async move { f.lock_timeout(Duration::from_secs(10)).await }
    });
    eventually(5.0, "the fair waiter queues", || {
        let fair = fair.clone();
        async move { fair.status().await.unwrap().queue_len == 1 }
    })
    .await;
    first.release().await.unwrap();
    let second = within(5.0, "the fair waiter is served", queued)
        .await
        .unwrap()
        .unwrap();
    second.release().await.unwrap();

    let rw = a.rwlock_with("table", options).unwrap();
    let reader = rw.read().await.unwrap();
    let writer = tokio::spawn({
        let rw = b.rwlock_with("table", options).unwrap();
        async move { rw.write_timeout(Duration::from_secs(10)).await }
    });
    eventually(5.0, "the writer waits", || {
        let rw = rw.clone();
        async move { rw.status().await.unwrap().waiting_writers == 1 }
    })
    .await;
    reader.release().await.unwrap();
    let write = within(5.0, "the writer gets in", writer).await.unwrap().unwrap();
    write.downgrade().await.unwrap().release().await.unwrap();

    let sem = a.semaphore_with("pool", 2, options).unwrap();
    let both = sem.acquire_many(2).await.unwrap();
    let wants = tokio::spawn({
        let sem = b.semaphore_with("pool", 2, options).unwrap();
        async move { sem.acquire_timeout(Duration::from_secs(10)).await }
    });
    eventually(5.0, "the permit waiter subscribes", || {
        let sem = sem.clone();
        async move { sem.status().await.unwrap().waiters == 1 }
    })
    .await;
    both.release().await.unwrap();
    within(5.0, "a freed permit wakes the waiter", wants)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();

    // An election: a leader that proclaims and resigns, a candidate woken by the
    // resignation, an observer of it all. Its leader is a hash and its history a
    // stream, with the commands the rules grant for them.
    let mut changes = b.election_with("leader", options).unwrap().observe();
    let mut change = async || {
        within(5.0, "the observer reports", changes.next())
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(change().await, LeaderEvent::Vacant { resigned: false });
    let leading = a
        .election_with("leader", options)
        .unwrap()
        .campaign("a")
        .await
        .unwrap();
    leading.proclaim("a2").await.unwrap();
    let candidate = tokio::spawn({
        let e = b.election_with("leader", options).unwrap();
        async move { e.campaign_timeout("b", Duration::from_secs(10)).await }
    });
    eventually(5.0, "the candidate subscribes", || {
        let mut admin = admin.clone();
        async move {
            let n: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("{redlease:leader}:wake")
                .query_async(&mut admin)
                .await
                .unwrap();
            n.get(1) == Some(&redis::Value::Int(1))
        }
    })
    .await;
    leading.resign().await.unwrap();
    let next = within(5.0, "the candidate leads", candidate)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(change().await, LeaderEvent::Elected(l) if l.value == "a"));
    assert!(matches!(change().await, LeaderEvent::Proclaimed(l) if l.value == "a2"));
    assert_eq!(change().await, LeaderEvent::Vacant { resigned: true });
    assert!(matches!(change().await, LeaderEvent::Elected(l) if l.term == next.term()));
    next.resign().await.unwrap();
    drop(changes);

    // The waiter's subscription ended after it acquired: UNSUBSCRIBE went out.
    drop((a, b, redlock));
    eventually(3.0, "the wake-up subscription is gone", || {
        let mut admin = admin.clone();
        async move {
            let n: Vec<redis::Value> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query_async(&mut admin)
                .await
                .unwrap();
            n.is_empty()
        }
    })
    .await;

    let denied = acl_log(&mut admin).await;
    assert!(
        denied.is_empty(),
        "commands refused to the redlease user: {denied:#?}"
    );

    // Minimal: every command in the rules was needed, and nothing else was used.
    let granted: BTreeSet<String> = redlease::acl_rules("redlease:")
        .iter()
        .filter_map(|r| r.strip_prefix('+').map(str::to_owned))
        .collect();
    // The test's own admin commands, and AUTH and HELLO (the wake-up connection speaks
    // RESP3), which every user may send.
    let not_redlease = [
        "acl|setuser",
        "acl|log",
        "config|resetstat",
        "script|flush",
        "info",
        "pubsub|channels",
        "auth",
        "hello",
    ];
    let mut used: BTreeSet<String> = used_commands(&mut admin)
        .await
        .into_iter()
        .filter(|c| !not_redlease.contains(&c.as_str()))
        .collect();
    // `ZRANK` is needed only by a fair waiter's attempt after it joined the queue, which
    // this run makes or not depending on timing (a waiter whose wake-up subscription is
    // ready at once joins with its first request and needs no second); it is granted
    // either way.
    used.insert("zrank".to_owned());
    assert_eq!(used, granted, "commands used by redlease vs commands granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_user_cannot_touch_anything_else() {
    let server = server();
    let mut admin = admin(&server).await;
    create_user(&mut admin, "redlease:").await;
    let _: () = redis::cmd("SET")
        .arg("billing:total")
        .arg("100")
        .query_async(&mut admin)
        .await
        .unwrap();
    let mut user = redis::Client::open(user_url(&server))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    let denied = |r: redis::RedisResult<redis::Value>, what: &str| {
        let err = r.expect_err(what);
        assert_eq!(err.code(), Some("NOPERM"), "{what}: {err}");
    };
    denied(
        redis::cmd("GET")
            .arg("billing:total")
            .query_async(&mut user)
            .await,
        "GET outside the prefix",
    );
    denied(
        redis::cmd("SET")
            .arg("billing:total")
            .arg("0")
            .query_async(&mut user)
            .await,
        "SET outside the prefix",
    );
    denied(
        redis::cmd("DEL")
            .arg("billing:total")
            .query_async(&mut user)
            .await,
        "DEL outside the prefix",
    );
    denied(redis::cmd("KEYS").arg("*").query_async(&mut user).await, "KEYS");
    denied(redis::cmd("FLUSHALL").query_async(&mut user).await, "FLUSHALL");
    denied(
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("*")
            .query_async(&mut user)
            .await,
        "CONFIG",
    );
    // EVAL is granted (the NOSCRIPT fallback), but a script runs with the user's
    // permissions: one that reads a key outside the prefix is refused.
    let refused: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
        .arg("return redis.call('GET', 'billing:total')")
        .arg(0)
        .query_async(&mut user)
        .await;
    let err = refused.expect_err("EVAL of a script reading outside the prefix");
    assert!(err.to_string().contains("can't access"), "{err}");
    denied(
        redis::cmd("PUBLISH")
            .arg("billing-events")
            .arg("x")
            .query_async(&mut user)
            .await,
        "PUBLISH outside the prefix",
    );
    // Even a script the user loads runs with the user's permissions: its redis.call
    // on a key outside the prefix is refused although the declared key is allowed.
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('GET', 'billing:total')")
        .query_async(&mut user)
        .await
        .unwrap();
    let err = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg("redlease:anything")
        .query_async::<redis::Value>(&mut user)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("can't access at least one of the keys"),
        "{err}"
    );

    // Inside the prefix the same user may read and write.
    let _: () = redis::cmd("SET")
        .arg("redlease:x")
        .arg("1")
        .query_async(&mut user)
        .await
        .unwrap();

    // A redlease client with another prefix is refused with a clear error and writes
    // nothing.
    let other = redlease::Client::builder(redis::Client::open(user_url(&server)).unwrap())
        .prefix("billing:")
        .retry_window(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let err = other.mutex("total").unwrap().try_lock().await.unwrap_err();
    assert!(
        matches!(&err, redlease::Error::Redis { op: "acquire", source, .. } if source.code() == Some("NOPERM")),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("no permissions to access one of the keys"),
        "{err}"
    );
    let total: String = redis::cmd("GET")
        .arg("billing:total")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(total, "100");
    assert!(
        !acl_log(&mut admin).await.is_empty(),
        "the refusals are in the ACL log"
    );
}
