//! Inputs at the edges of the public API — found by an adversarial review — that used to
//! panic, mislead, echo secrets or control characters, or let a lock's key collide with
//! redlease's own: each is now refused with a typed error, or handled.

mod common;

use std::time::Duration;

use common::*;
use redlease::optimistic::{CasOutcome, ConnectionPool, PoolOptions, Transaction, compare_and_set};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_with_the_longest_timeout_and_backoff_runs() {
    let server = server();
    let pool = ConnectionPool::new(server.client());
    // A timeout too long to add to the clock is no deadline (it used to panic).
    let committed = Transaction::new(&pool, &["k"])
        .timeout(Duration::MAX)
        .run(|_tx| async move { Ok(redis::pipe()) })
        .await
        .expect("commits");
    assert_eq!(committed.attempts, 1);
    // The longest backoff, after a conflict, gives up as asked (it used to overflow).
    let conn = raw(&server).await;
    let err = Transaction::new(&pool, &["k"])
        .backoff(Duration::MAX, Duration::MAX)
        .max_attempts(1)
        .run(move |_tx| {
            let mut conn = conn.clone();
            async move {
                // Someone else writes the watched key: EXEC is refused.
                let _: () = redis::cmd("INCR").arg("k").query_async(&mut conn).await.unwrap();
                let mut p = redis::pipe();
                p.set("k", "mine");
                Ok(p)
            }
        })
        .await
        .unwrap_err();
    assert!(err.is_too_much_contention(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_unbounded_size_is_as_good_as_unbounded() {
    let server = server();
    // It used to panic inside tokio (more permits than a semaphore holds).
    let pool = ConnectionPool::with_options(server.client(), PoolOptions::new().max_connections(usize::MAX));
    assert_eq!(
        pool.options().max_connections,
        tokio::sync::Semaphore::MAX_PERMITS
    );
    let committed = Transaction::new(&pool, &["k"])
        .run(|_tx| async move { Ok(redis::pipe()) })
        .await
        .expect("commits");
    assert_eq!(committed.attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_without_keys_is_refused_before_anything_is_sent() {
    let server = server();
    let pool = ConnectionPool::new(server.client());
    let none: &[&str] = &[];
    let err = Transaction::new(&pool, none)
        .run(|_tx| async move { Ok(redis::pipe()) })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(err.to_string().contains("at least one key"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_messages_in_transaction_errors_never_carry_raw_control_characters() {
    let server = server();
    let pool = ConnectionPool::new(server.client());
    // Refused while queueing: Redis's message repeats the unknown command's name.
    let err = Transaction::new(&pool, &["k"])
        .run(|_tx| async move {
            let mut p = redis::pipe();
            p.cmd("SE\x1b[31mT").arg("k").arg("v");
            Ok(p)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, redlease::Error::TransactionRejected { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        !text.contains('\x1b') && text.contains(r"SE\u{1b}[31mT"),
        "{text:?}"
    );
    // Failed when EXEC ran.
    let err = Transaction::new(&pool, &["k"])
        .run(|_tx| async move {
            let mut p = redis::pipe();
            p.cmd("EVAL")
                .arg("return redis.error_reply('bad \x1b[31m thing')")
                .arg(0);
            Ok(p)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, redlease::Error::TransactionPartlyFailed { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        !text.contains('\x1b') && text.contains(r"\u{1b}[31m thing"),
        "{text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_on_bytes_that_are_not_text_is_a_typed_error() {
    let server = server();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SET")
        .arg("bin")
        .arg(&[0xffu8, 0xfe, b'a'][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    // Reported lossily, the value could never be matched by a retry.
    let err = compare_and_set(&conn, "bin", Some("nope"), Some("new"))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    let kept: Vec<u8> = redis::cmd("GET").arg("bin").query_async(&mut conn).await.unwrap();
    assert_eq!(kept, [0xff, 0xfe, b'a'], "the value is left alone");
    // Text still works as before.
    let _: () = redis::cmd("SET")
        .arg("txt")
        .arg("é")
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = compare_and_set(&conn, "txt", Some("nope"), Some("new"))
        .await
        .unwrap();
    assert_eq!(
        out,
        CasOutcome::Mismatch {
            current: Some("é".into())
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_a_lone_closing_brace_is_blamed_not_the_name() {
    let server = server();
    let client = redlease::Client::builder(server.client())
        .prefix("app}")
        .build()
        .await
        .unwrap();
    let err = client.mutex("orders").unwrap_err();
    assert!(matches!(err, redlease::Error::InvalidName { .. }), "{err:?}");
    assert!(err.to_string().contains("the prefix contains '}'"), "{err}");
    // A name with a hash tag of its own still makes a valid key.
    let guard = client.mutex("{t}orders").unwrap().try_lock().await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_url_is_reported_without_its_password() {
    for url in [
        "redis://user:hunter2@127.0.0.1:notaport",
        "redis://user:hun#ter2@127.0.0.1:notaport",
    ] {
        for connect in [
            redlease::Client::connect(url).await.map(|_| ()),
            ConnectionPool::open(url).map(|_| ()),
        ] {
            let text = connect.unwrap_err().to_string();
            assert!(!text.contains("hunter2") && !text.contains("ter2"), "{text}");
            assert!(text.contains("redis://user:***@127.0.0.1:"), "{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_names_cannot_take_the_fencing_keys() {
    let server = server();
    let mut conn = raw(&server).await;
    // An empty prefix is the key layout of redis-py's Lock.
    let bare = redlease::Client::builder(server.client())
        .prefix("")
        .build()
        .await
        .unwrap();
    // A lock on the fencing counter made other locks' acquisitions fail; one on its
    // floor was overwritten by the next seed (then looked held for a day).
    for name in ["{fence}", "{fence}:floor"] {
        let err = bare.mutex(name).unwrap_err();
        assert!(
            matches!(err, redlease::Error::InvalidName { .. }),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains("fencing tokens"), "{err}");
    }
    // Names that only look alike still work.
    for name in ["fence", "{fence}x", "orders:q"] {
        let guard = bare.mutex(name).unwrap().try_lock().await.expect(name);
        guard.release().await.unwrap();
    }
    let left: Vec<_> = all_keys(&mut conn)
        .await
        .into_iter()
        .filter(|(k, _)| k != "{fence}" && k != "{fence}:floor")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_invisible_or_line_breaking_characters_are_escaped_in_messages() {
    let server = server();
    let holder = client(&server.url()).await;
    let other = client(&server.url()).await;
    for name in [
        "a\u{2028}b",
        "a\u{2029}b",
        "a\u{200b}\u{feff}b",
        "a\u{061c}b",
        "a\u{200e}b\u{200f}",
    ] {
        let guard = holder.mutex(name).unwrap().lock().await.unwrap();
        let text = other
            .mutex(name)
            .unwrap()
            .try_lock()
            .await
            .unwrap_err()
            .to_string();
        assert!(
            !text.chars().any(|c| matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{200b}' | '\u{feff}' | '\u{061c}' | '\u{200e}' | '\u{200f}'
            )),
            "{name:?}: {text:?}"
        );
        assert!(text.contains(r"a\u{"), "{name:?}: {text:?}");
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_labels_are_stored_clean_for_every_kind_of_lock() {
    let server = server();
    let label = format!("evil\x1b[2J\r\n\u{202e}{}", "x".repeat(1 << 20));
    let c = redlease::Client::builder(server.client())
        .owner_label(label)
        .build()
        .await
        .unwrap();
    let clean = c.owner_label().to_owned();
    assert!(
        clean.starts_with("evil?[2J???x") && clean.len() == 128,
        "{clean:?}"
    );
    let m = c.mutex("m").unwrap().lock().await.unwrap();
    let w = c.rwlock("rw").unwrap().write().await.unwrap();
    let e = c.election("e").unwrap().campaign("v").await.unwrap();
    assert_eq!(
        c.mutex("m").unwrap().status().await.unwrap().owner.as_deref(),
        Some(&*clean)
    );
    assert_eq!(
        c.rwlock("rw").unwrap().status().await.unwrap().writer.as_deref(),
        Some(&*clean)
    );
    assert_eq!(
        c.election("e")
            .unwrap()
            .leader()
            .await
            .unwrap()
            .map(|l| l.owner)
            .as_deref(),
        Some(&*clean)
    );
    for info in c.list("*").await.unwrap() {
        assert_eq!(info.owner.as_deref(), Some(&*clean), "{}", info.name);
    }
    m.release().await.unwrap();
    w.release().await.unwrap();
    e.release().await.unwrap();
}
