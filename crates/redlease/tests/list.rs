//! `Client::list`: every held lock under the prefix, of every kind, against a real
//! server — and nothing that is not a held lock, and never a token.

mod common;

use std::time::Duration;

use common::*;
use redlease::{LegacyOptions, LockInfo, LockKind};

async fn labelled(url: &str, label: &str) -> redlease::Client {
    redlease::Client::builder(redis::Client::open(url).unwrap())
        .owner_label(label)
        .build()
        .await
        .expect("connect")
}

fn by_name<'a>(list: &'a [LockInfo], name: &str) -> &'a LockInfo {
    list.iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_held_lock_is_listed_and_nothing_else() {
    let server = server();
    let url = server.url();
    let a = labelled(&url, "host-a:1").await;
    let b = labelled(&url, "host-b:2").await;
    let mut conn = raw(&server).await;

    let mutex = a.mutex("deploy").unwrap().lock().await.unwrap();
    let fair_alone = a.fair_mutex("printer").unwrap().lock().await.unwrap();
    let fair = a.fair_mutex("queue").unwrap().lock().await.unwrap();
    let fair_waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.fair_mutex("queue")
                .unwrap()
                .lock_timeout(Duration::from_secs(20))
                .await
        }
    });
    let plain_waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.mutex("deploy")
                .unwrap()
                .lock_timeout(Duration::from_secs(20))
                .await
        }
    });
    let table = a.rwlock("table").unwrap();
    let r1 = table.read().await.unwrap();
    let r2 = b.rwlock("table").unwrap().read().await.unwrap();
    let writer = a.rwlock("config").unwrap().write().await.unwrap();
    let permits = a
        .semaphore("renderers", 3)
        .unwrap()
        .acquire_many(2)
        .await
        .unwrap();
    let leader = a
        .election("scheduler")
        .unwrap()
        .campaign("10.0.0.7:8080")
        .await
        .unwrap();
    let legacy = a
        .legacy_lock("old", LegacyOptions::new())
        .unwrap()
        .lock()
        .await
        .unwrap();
    // Another library's lock, a lock released, and keys that are not locks.
    let _: () = redis::cmd("SET")
        .arg("redlease:theirs")
        .arg("7d1f3c0a-2b5e-4c1d-9e8f-0a1b2c3d4e5f")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    a.mutex("released")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("redlease:a-hash")
        .arg("f")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("elsewhere:x")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();

    // The waiters register within a round trip or two: poll, bounded.
    let mut list = Vec::new();
    for _ in 0..500 {
        list = a.list("*").await.unwrap();
        if by_name(&list, "deploy").waiters == 1 && by_name(&list, "queue").waiters == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names: Vec<&str> = list.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "config",
            "deploy",
            "old",
            "printer",
            "queue",
            "renderers",
            "scheduler",
            "table",
            "theirs"
        ],
        "sorted, every held lock, nothing else: {list:#?}"
    );

    let deploy = by_name(&list, "deploy");
    assert_eq!(
        (deploy.kind, deploy.key.as_str()),
        (LockKind::Mutex, "redlease:deploy")
    );
    assert_eq!(deploy.owner.as_deref(), Some("host-a:1"));
    assert_eq!(
        (deploy.fence, deploy.foreign, deploy.waiters, deploy.holders),
        (None, false, 1, 1)
    );
    assert!(deploy.remaining.is_some_and(|r| r <= Duration::from_secs(30)));

    let queue = by_name(&list, "queue");
    assert_eq!(
        (queue.kind, queue.owner.as_deref()),
        (LockKind::FairMutex, Some("host-a:1"))
    );
    // (A fair mutex records no fencing token, as the plain one.)
    assert_eq!((queue.fence, queue.waiters), (None, 1));
    // Held alone, a fair mutex looks like a plain one: the same token.
    let printer = by_name(&list, "printer");
    assert_eq!(
        (printer.kind, printer.fence, printer.owner.as_deref()),
        (LockKind::Mutex, None, Some("host-a:1"))
    );
    let config = by_name(&list, "config");
    assert_eq!(
        (config.kind, config.fence),
        (LockKind::Mutex, Some(writer.fence()))
    );

    let table_info = by_name(&list, "table");
    assert_eq!(
        (table_info.kind, table_info.holders, table_info.owner.as_deref()),
        (LockKind::RwLock, 2, None)
    );
    assert!(
        table_info
            .remaining
            .is_some_and(|r| r > Duration::ZERO && r <= Duration::from_secs(30))
    );

    let renderers = by_name(&list, "renderers");
    assert_eq!(
        (renderers.kind, renderers.holders, renderers.fence),
        (LockKind::Semaphore, 2, None)
    );

    let scheduler = by_name(&list, "scheduler");
    assert_eq!(
        (scheduler.kind, scheduler.owner.as_deref()),
        (LockKind::Election, Some("host-a:1"))
    );
    assert_eq!(scheduler.fence, Some(leader.term()));

    assert_eq!(by_name(&list, "old").kind, LockKind::Legacy);
    let theirs = by_name(&list, "theirs");
    assert_eq!(
        (theirs.kind, theirs.foreign, theirs.owner.as_deref()),
        (LockKind::Mutex, true, None)
    );

    // Never a token: not the plain mutex's, not a foreign one.
    let token: String = redis::cmd("GET")
        .arg("redlease:deploy")
        .query_async(&mut conn)
        .await
        .unwrap();
    let secret = &token[..32];
    let shown = format!("{list:?}");
    assert!(!shown.contains(secret) && !shown.contains("7d1f3c0a"), "{shown}");

    // A glob on names.
    let some: Vec<String> = a
        .list("[pq]*")
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(some, ["printer", "queue"]);
    assert!(a.list("nothing-*").await.unwrap().is_empty());

    mutex.release().await.unwrap();
    fair_alone.release().await.unwrap();
    fair.release().await.unwrap();
    plain_waiter.await.unwrap().unwrap().release().await.unwrap();
    fair_waiter.await.unwrap().unwrap().release().await.unwrap();
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    writer.release().await.unwrap();
    permits.release().await.unwrap();
    leader.resign().await.unwrap();
    legacy.release().await.unwrap();
    let left: Vec<String> = a.list("*").await.unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(left, ["theirs"], "released locks leave the list");
}

/// Under a prefix with a hash tag every key of every lock shares one slot, and the
/// auxiliary keys are appended to the lock key: they are still not listed as locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_tagged_prefix_and_names_list_the_locks_not_their_keys() {
    let server = server();
    let client = redlease::Client::builder(redis::Client::open(server.url()).unwrap())
        .prefix("{tenant}:")
        .build()
        .await
        .unwrap();
    let m = client.mutex("job:meta").unwrap().lock().await.unwrap();
    let f = client.fair_mutex("line").unwrap().lock().await.unwrap();
    let r = client.rwlock("shared").unwrap().read().await.unwrap();
    let s = client.semaphore("pool", 2).unwrap().acquire().await.unwrap();
    let list = client.list("*").await.unwrap();
    let kinds: Vec<(&str, LockKind)> = list.iter().map(|l| (l.name.as_str(), l.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("job:meta", LockKind::Mutex),
            ("line", LockKind::Mutex),
            ("pool", LockKind::Semaphore),
            ("shared", LockKind::RwLock)
        ],
        "{list:#?}"
    );
    assert_eq!(by_name(&list, "shared").key, "{tenant}:shared");
    m.release().await.unwrap();
    f.release().await.unwrap();
    r.release().await.unwrap();
    s.release().await.unwrap();
}
