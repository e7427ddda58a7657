//! Bad input gets a typed error, sends nothing and writes nothing.

mod common;

use std::time::Duration;

use common::*;
use redlease::{LeaseOptions, Token};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_input_table() {
    let server = server();
    let client = client(&server.url()).await;
    let mut conn = raw(&server).await;

    let long = "n".repeat(redlease::MAX_NAME_LEN + 1);
    let bad_names: &[(&str, &str)] = &[
        ("", "empty"),
        (&long, "longer than 1024"),
        ("tab\there", "control"),
        ("a}b", "hash tag"),
        ("a{}b", "hash tag"),
    ];
    for (name, why) in bad_names {
        let err = client.mutex(name).unwrap_err();
        assert!(
            matches!(err, redlease::Error::InvalidName { .. }),
            "{name:?}: {err:?}"
        );
        assert!(err.to_string().contains(why), "{name:?}: {err}");
    }

    let bad_ttls = [
        (Duration::ZERO, "longer than zero"),
        (Duration::from_micros(500), "at least 10ms"),
        (Duration::from_millis(9), "at least 10ms"),
        (Duration::from_secs(31 * 24 * 3600), "at most 30 days"),
        (Duration::MAX, "at most 30 days"),
    ];
    for (ttl, why) in bad_ttls {
        let err = client
            .mutex_with("ttl", LeaseOptions::new().ttl(ttl))
            .unwrap_err();
        assert!(
            matches!(err, redlease::Error::InvalidTtl { .. }),
            "{ttl:?}: {err:?}"
        );
        assert!(err.to_string().contains(why), "{ttl:?}: {err}");
        assert!(err.is_invalid_input());
    }

    // Tokens from outside are checked.
    assert!(Token::from_secret("").is_none());
    assert!(Token::from_secret("t".repeat(600)).is_none());

    // extend with a bad TTL is refused before anything is sent.
    let mutex = client.mutex("ok").unwrap();
    let guard = mutex.lock().await.unwrap();
    for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        assert!(guard.extend(ttl).await.unwrap_err().is_invalid_input());
        let token = Token::from_secret("whatever").unwrap();
        assert!(
            mutex
                .extend_token(&token, ttl)
                .await
                .unwrap_err()
                .is_invalid_input()
        );
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();

    // Unicode names are fine and stored verbatim.
    let g = client.mutex("déploiement-生产").unwrap().lock().await.unwrap();
    assert!(exists(&mut conn, "redlease:déploiement-生产").await);
    g.release().await.unwrap();

    // An empty prefix is allowed: the key is exactly the name.
    let bare = redlease::Client::builder(server.client())
        .prefix("")
        .build()
        .await
        .unwrap();
    let g = bare.mutex("lock.foo").unwrap().lock().await.unwrap();
    assert_eq!(
        get(&mut conn, "lock.foo").await.as_deref(),
        Some(g.token().expose())
    );
    g.release().await.unwrap();

    // Nothing was left behind by the rejected calls: only the fencing counters of the
    // real acquisitions' slots, which expire.
    let keys = all_keys(&mut conn).await;
    assert!(
        keys.iter()
            .all(|(k, t)| (k.starts_with("{redlease:fence") || k.starts_with("{fence")) && *t > 0),
        "{keys:?}"
    );

    // A builder setting out of range is a Config error.
    let err = redlease::Client::builder(server.client())
        .metadata_retention(Duration::from_secs(365 * 24 * 3600))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, redlease::Error::Config { .. }), "{err:?}");
}
