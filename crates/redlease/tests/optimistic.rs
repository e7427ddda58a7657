//! Optimistic transactions and compare-and-set against a real redis-server.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use redis::Value;
use redlease::Error;
use redlease::optimistic::{
    CasOutcome, ConnectionPool, PoolOptions, Transaction, Tx, compare_and_set, transaction,
};
use tokio::sync::{mpsc, oneshot};

fn pool(server: &RedisServer) -> ConnectionPool {
    ConnectionPool::new(server.client())
}

async fn set(conn: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_commits_its_writes_and_reports_replies() {
    let server = server();
    let pool = pool(&server);
    let mut conn = raw(&server).await;
    set(&mut conn, "n", "41").await;
    let done = transaction(&pool, &["n"], |tx| async move {
        let n: i64 = tx.get("n").await?;
        let mut writes = redis::pipe();
        writes.set("n", n + 1).incr("other", 5);
        Ok(writes)
    })
    .await
    .unwrap();
    assert_eq!(done.attempts, 1);
    assert_eq!(done.replies, vec![Value::Okay, Value::Int(5)]);
    assert_eq!(get(&mut conn, "n").await.as_deref(), Some("42"));
    assert_eq!(pool.idle(), 1, "a clean connection goes back to the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_time_and_queue_time_errors_are_distinct() {
    let server = server();
    let pool = pool(&server);
    let mut conn = raw(&server).await;
    set(&mut conn, "k", "1").await;
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();

    // Exec-time: INCR on a list fails when EXEC runs it; the other commands took effect.
    let err = transaction(&pool, &["k"], |_tx| async move {
        let mut writes = redis::pipe();
        writes.set("k", 2).incr("list", 1).set("k2", "x");
        Ok(writes)
    })
    .await
    .unwrap_err();
    match &err {
        Error::TransactionPartlyFailed {
            keys,
            failed,
            replies,
        } => {
            assert_eq!(keys, &["k".to_string()]);
            assert_eq!(failed.len(), 1, "{failed:?}");
            assert_eq!(failed[0].0, 1);
            assert!(failed[0].1.contains("WRONGTYPE"), "{failed:?}");
            assert_eq!(replies.len(), 3);
            assert_eq!(replies[0], Value::Okay);
            assert!(matches!(replies[1], Value::ServerError(_)));
            assert_eq!(replies[2], Value::Okay);
        }
        other => panic!("expected an exec-time error, got {other:?}"),
    }
    assert!(err.to_string().contains("took effect"), "{err}");
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("2"), "no rollback");
    assert_eq!(get(&mut conn, "k2").await.as_deref(), Some("x"), "no rollback");

    // Queue-time: a wrong-arity command is refused while queueing; EXEC is aborted.
    let err = transaction(&pool, &["k"], |_tx| async move {
        let mut writes = redis::pipe();
        writes.set("k", 3);
        writes.add_command(redis::cmd("SET").arg("k").clone());
        writes.set("k3", "y");
        Ok(writes)
    })
    .await
    .unwrap_err();
    match &err {
        Error::TransactionRejected {
            index,
            command,
            message,
            ..
        } => {
            assert_eq!(*index, 1);
            assert_eq!(command, "SET");
            assert!(message.contains("wrong number of arguments"), "{message}");
        }
        other => panic!("expected a queue-time error, got {other:?}"),
    }
    assert!(err.to_string().contains("nothing was written"), "{err}");
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("2"), "nothing ran");
    assert!(!exists(&mut conn, "k3").await, "nothing ran");

    // An unknown command is a queue-time error too.
    let err = transaction(&pool, &["k"], |_tx| async move {
        let mut writes = redis::pipe();
        writes.add_command(redis::cmd("NOSUCHCOMMAND").arg("k").clone());
        Ok(writes)
    })
    .await
    .unwrap_err();
    assert!(
        matches!(&err, Error::TransactionRejected { index: 0, command, .. } if command == "NOSUCHCOMMAND"),
        "{err:?}"
    );

    // After both kinds of failure the connection was clean and is reused.
    assert_eq!(pool.idle(), 1);
    let done = transaction(&pool, &["k"], |_tx| async move {
        let mut writes = redis::pipe();
        writes.set("k", 4);
        Ok(writes)
    })
    .await
    .unwrap();
    assert_eq!(done.attempts, 1);
    assert_eq!(get(&mut conn, "k").await.as_deref(), Some("4"));
}

/// A task that writes `key` whenever asked, and says when it is done.
fn spawn_writer(
    mut conn: redis::aio::MultiplexedConnection,
    key: &'static str,
) -> (mpsc::Sender<oneshot::Sender<()>>, Arc<AtomicU32>) {
    let (ask, mut asked) = mpsc::channel::<oneshot::Sender<()>>(1);
    let writes = Arc::new(AtomicU32::new(0));
    let count = writes.clone();
    tokio::spawn(async move {
        while let Some(done) = asked.recv().await {
            let _: i64 = redis::cmd("INCR").arg(key).query_async(&mut conn).await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let _ = done.send(());
        }
    });
    (ask, writes)
}

async fn interfere(ask: &mpsc::Sender<oneshot::Sender<()>>) {
    let (done, wait) = oneshot::channel();
    ask.send(done).await.unwrap();
    wait.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_bound_is_honoured_exactly() {
    let server = server();
    let pool = pool(&server);
    let (ask, writes) = spawn_writer(raw(&server).await, "hot");
    let runs = Arc::new(AtomicU32::new(0));
    const BOUND: u32 = 7;
    let (r, a) = (runs.clone(), ask.clone());
    let err = within(
        30.0,
        "the transaction gives up",
        Transaction::new(&pool, &["hot"])
            .max_attempts(BOUND)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .run(move |tx: Tx| {
                let (runs, ask) = (r.clone(), a.clone());
                async move {
                    assert_eq!(tx.attempt(), runs.fetch_add(1, Ordering::SeqCst) + 1);
                    let n: Option<i64> = tx.get("hot").await?;
                    // Another task changes the watched key after every read.
                    interfere(&ask).await;
                    let mut writes = redis::pipe();
                    writes.set("hot", n.unwrap_or(0) + 1000);
                    Ok(writes)
                }
            }),
    )
    .await
    .unwrap_err();
    match err {
        Error::TooMuchContention { keys, attempts, .. } => {
            assert_eq!(keys, ["hot".to_string()]);
            assert_eq!(attempts, BOUND);
        }
        other => panic!("expected TooMuchContention, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        BOUND,
        "the closure ran once per attempt"
    );
    assert_eq!(writes.load(Ordering::SeqCst), BOUND);
    let mut conn = raw(&server).await;
    assert_eq!(
        get(&mut conn, "hot").await.as_deref(),
        Some("7"),
        "only the interfering writes landed; no EXEC ran"
    );

    // Interference on the first three attempts only: commits on the fourth.
    let runs = Arc::new(AtomicU32::new(0));
    let (r, a) = (runs.clone(), ask.clone());
    let done = Transaction::new(&pool, &["hot"])
        .max_attempts(BOUND)
        .run(move |tx: Tx| {
            let (runs, ask) = (r.clone(), a.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let n: i64 = tx.get("hot").await?;
                if tx.attempt() <= 3 {
                    interfere(&ask).await;
                }
                let mut writes = redis::pipe();
                writes.set("hot", n + 1000);
                Ok(writes)
            }
        })
        .await
        .unwrap();
    assert_eq!(done.attempts, 4);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // 7 + 3 interfering increments, then the committed read-plus-1000.
    assert_eq!(get(&mut conn, "hot").await.as_deref(), Some("1010"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_bounds_the_retries() {
    let server = server();
    let pool = pool(&server);
    let (ask, writes) = spawn_writer(raw(&server).await, "hot");
    let started = std::time::Instant::now();
    let err = Transaction::new(&pool, &["hot"])
        .max_attempts(u32::MAX)
        .timeout(Duration::from_millis(300))
        .backoff(Duration::from_millis(20), Duration::from_millis(20))
        .run(move |tx: Tx| {
            let ask = ask.clone();
            async move {
                let _: Option<i64> = tx.get("hot").await?;
                interfere(&ask).await;
                Ok(redis::pipe())
            }
        })
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    let Error::TooMuchContention { attempts, .. } = err else {
        panic!("expected TooMuchContention, got {err:?}");
    };
    assert!(attempts >= 2, "{attempts} attempts");
    assert_eq!(writes.load(Ordering::SeqCst), attempts);
    assert!(elapsed < Duration::from_millis(1500), "gave up after {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_read_increment_write_loses_nothing_and_retries() {
    let server = server();
    let pool = pool(&server);
    const TASKS: usize = 16;
    const ROUNDS: usize = 25;
    let retries = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (pool, retries) = (pool.clone(), retries.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let done = Transaction::new(&pool, &["counter"])
                    .max_attempts(1000)
                    .run(|tx| async move {
                        let n: Option<i64> = tx.get("counter").await?;
                        tokio::task::yield_now().await; // widen the race window
                        let mut writes = redis::pipe();
                        writes.set("counter", n.unwrap_or(0) + 1);
                        Ok(writes)
                    })
                    .await
                    .expect("transaction");
                retries.fetch_add(u64::from(done.attempts - 1), Ordering::SeqCst);
            }
        }));
    }
    for h in handles {
        within(120.0, "all tasks finish", h).await.unwrap();
    }
    let mut conn = raw(&server).await;
    assert_eq!(
        get(&mut conn, "counter").await,
        Some((TASKS * ROUNDS).to_string())
    );
    assert!(retries.load(Ordering::SeqCst) > 0, "no contention was exercised");
    assert!(pool.idle() <= TASKS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_never_opens_more_than_its_limit() {
    let server = server();
    let pool = ConnectionPool::with_options(server.client(), PoolOptions::new().max_connections(2));
    let mut handles = Vec::new();
    for i in 0..8 {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            let key = format!("k{i}");
            transaction(&pool, &[key.as_str()], |_tx| {
                let key = key.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let mut writes = redis::pipe();
                    writes.set(&key, 1);
                    Ok(writes)
                }
            })
            .await
            .unwrap()
        }));
    }
    for h in handles {
        within(30.0, "transactions finish", h).await.unwrap();
    }
    let mut conn = raw(&server).await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The pool's two plus this inspection connection.
    assert_eq!(clients.lines().count(), 3, "{clients}");
    assert_eq!(pool.idle(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_error_abandons_the_attempt_and_unwatches() {
    let server = server();
    let pool = pool(&server);
    let mut conn = raw(&server).await;
    set(&mut conn, "k", "not a number").await;
    let err = transaction(&pool, &["k"], |tx| async move {
        let n: i64 = tx.get("k").await?;
        let mut writes = redis::pipe();
        writes.set("k", n + 1);
        Ok(writes)
    })
    .await
    .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Redis {
                op: "transaction read",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(pool.idle(), 1, "UNWATCH left the connection clean");
    // The connection carries no stale WATCH: a change to "k" now does not abort a
    // transaction on another key.
    set(&mut conn, "k", "1").await;
    let done = transaction(&pool, &["other"], |_tx| async move {
        let mut writes = redis::pipe();
        writes.set("other", 1);
        Ok(writes)
    })
    .await
    .unwrap();
    assert_eq!(done.attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tx_handle_refuses_control_commands_and_expires() {
    let server = server();
    let pool = pool(&server);
    let (leak, leaked) = oneshot::channel::<Tx>();
    let mut leak = Some(leak);
    transaction(&pool, &["k"], |tx| {
        let leak = leak.take();
        async move {
            for name in ["MULTI", "exec", "WATCH", "UNWATCH", "DISCARD"] {
                let err = tx.query::<Value>(&redis::cmd(name)).await.unwrap_err();
                assert!(err.is_invalid_input(), "{name}: {err:?}");
            }
            if let Some(leak) = leak {
                leak.send(tx.clone()).unwrap();
            }
            Ok(redis::pipe())
        }
    })
    .await
    .unwrap();
    let tx = leaked.await.unwrap();
    let err = tx.get::<Option<String>>("k").await.unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(err.to_string().contains("is over"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_supplied_connection_works_and_sheds_stale_watches() {
    let server = server();
    let mut own = server.client().get_multiplexed_async_connection().await.unwrap();
    // A watch left behind by some earlier, abandoned use of this connection.
    let _: () = redis::cmd("WATCH")
        .arg("stale")
        .query_async(&mut own)
        .await
        .unwrap();
    let mut conn = raw(&server).await;
    set(&mut conn, "stale", "changed").await;
    let done = Transaction::on_connection(own.clone(), &["n"])
        .max_attempts(1)
        .run(|tx| async move {
            let n: Option<i64> = tx.get("n").await?;
            let mut writes = redis::pipe();
            writes.set("n", n.unwrap_or(0) + 1);
            Ok(writes)
        })
        .await
        .unwrap();
    assert_eq!(
        done.attempts, 1,
        "the stale watch did not abort the first attempt"
    );
    assert_eq!(get(&mut conn, "n").await.as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pooled_connection_is_replaced() {
    let mut server = server();
    let pool = pool(&server);
    let write = |v: i64| {
        let pool = pool.clone();
        async move {
            transaction(&pool, &["n"], |_tx| async move {
                let mut writes = redis::pipe();
                writes.set("n", v);
                Ok(writes)
            })
            .await
        }
    };
    write(1).await.unwrap();
    assert_eq!(pool.idle(), 1);
    server.restart().unwrap();
    let done = within(10.0, "transaction after restart", write(2)).await.unwrap();
    assert_eq!(done.attempts, 1);
    let mut conn = raw(&server).await;
    assert_eq!(get(&mut conn, "n").await.as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_semantics() {
    let server = server();
    let conn = raw(&server).await;
    let mut inspect = raw(&server).await;

    // Absent expected: creates.
    let r = compare_and_set(&conn, "c", None, Some("1")).await.unwrap();
    assert_eq!(r, CasOutcome::Swapped);
    assert_eq!(get(&mut inspect, "c").await.as_deref(), Some("1"));
    // Absent expected but present: mismatch with the current value.
    let r = compare_and_set(&conn, "c", None, Some("9")).await.unwrap();
    assert_eq!(
        r,
        CasOutcome::Mismatch {
            current: Some("1".into())
        }
    );
    // Wrong value: mismatch, unchanged.
    let r = compare_and_set(&conn, "c", Some("0"), Some("9")).await.unwrap();
    assert_eq!(
        r,
        CasOutcome::Mismatch {
            current: Some("1".into())
        }
    );
    assert_eq!(get(&mut inspect, "c").await.as_deref(), Some("1"));
    // Right value: swapped, and the TTL is kept.
    let _: () = redis::cmd("PEXPIRE")
        .arg("c")
        .arg(60_000)
        .query_async(&mut inspect)
        .await
        .unwrap();
    let r = compare_and_set(&conn, "c", Some("1"), Some("2")).await.unwrap();
    assert!(r.swapped());
    assert_eq!(get(&mut inspect, "c").await.as_deref(), Some("2"));
    assert!(pttl(&mut inspect, "c").await > 50_000, "TTL kept");
    // Delete on match.
    let r = compare_and_set(&conn, "c", Some("2"), None).await.unwrap();
    assert!(r.swapped());
    assert!(!exists(&mut inspect, "c").await);
    // Expected a value but absent: mismatch with None.
    let r = compare_and_set(&conn, "c", Some("2"), Some("3")).await.unwrap();
    assert_eq!(r, CasOutcome::Mismatch { current: None });
    assert!(!exists(&mut inspect, "c").await);
    // Empty strings are values, not absence.
    let r = compare_and_set(&conn, "e", None, Some("")).await.unwrap();
    assert!(r.swapped());
    let r = compare_and_set(&conn, "e", None, Some("x")).await.unwrap();
    assert_eq!(
        r,
        CasOutcome::Mismatch {
            current: Some(String::new())
        }
    );
    let r = compare_and_set(&conn, "e", Some(""), Some("x")).await.unwrap();
    assert!(r.swapped());
    // Not a string: typed error, nothing changed.
    let _: () = redis::cmd("RPUSH")
        .arg("l")
        .arg("x")
        .query_async(&mut inspect)
        .await
        .unwrap();
    let err = compare_and_set(&conn, "l", None, Some("x")).await.unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    // After SCRIPT FLUSH the script is reloaded transparently.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut inspect)
        .await
        .unwrap();
    let r = compare_and_set(&conn, "e", Some("x"), Some("y")).await.unwrap();
    assert!(r.swapped());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_is_atomic_under_concurrency() {
    let server = server();
    // One shared multiplexed connection for all tasks: a script needs no exclusivity.
    let conn = raw(&server).await;
    const TASKS: usize = 16;
    const ROUNDS: usize = 50;
    let mismatches = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let (conn, mismatches) = (conn.clone(), mismatches.clone());
        handles.push(tokio::spawn(async move {
            let mut seen: Option<String> = None;
            for _ in 0..ROUNDS {
                loop {
                    let next = seen.as_deref().map_or(0, |v| v.parse::<i64>().unwrap()) + 1;
                    let next = next.to_string();
                    match compare_and_set(&conn, "counter", seen.as_deref(), Some(&next))
                        .await
                        .unwrap()
                    {
                        CasOutcome::Swapped => {
                            seen = Some(next);
                            break;
                        }
                        CasOutcome::Mismatch { current } => {
                            mismatches.fetch_add(1, Ordering::SeqCst);
                            seen = current;
                        }
                    }
                }
            }
        }));
    }
    for h in handles {
        within(120.0, "all tasks finish", h).await.unwrap();
    }
    let mut inspect = raw(&server).await;
    assert_eq!(
        get(&mut inspect, "counter").await,
        Some((TASKS * ROUNDS).to_string())
    );
    assert!(
        mismatches.load(Ordering::SeqCst) > 0,
        "no contention was exercised"
    );
}
