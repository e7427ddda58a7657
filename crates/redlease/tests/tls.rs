//! TLS against real TLS-only redis-servers: a custom CA, mutual TLS, and the clear
//! failures — no client certificate, the wrong CA, plain TCP to a TLS port.
#![cfg(feature = "tls")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use redlease::{Client, LeaseOptions, Redlock, TlsOptions};

fn tls_server(auth_clients: bool) -> RedisServer {
    RedisServer::builder()
        .tls(auth_clients)
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn ca_only(server: &RedisServer) -> TlsOptions {
    TlsOptions::new().ca_file(&server.tls().unwrap().ca_cert)
}

fn mutual(server: &RedisServer) -> TlsOptions {
    let files = server.tls().unwrap();
    ca_only(server)
        .cert_file(&files.client_cert)
        .key_file(&files.client_key)
}

async fn connect(url: &str, tls: &TlsOptions) -> redlease::Result<Client> {
    let redis = tls.redis_client(url)?;
    within(10.0, "connect returns", Client::builder(redis).build()).await
}

/// Lock, contend, wait for a wake-up (over the TLS pub/sub connection) and release.
async fn exercise(a: &Client, b: &Client) {
    let options = LeaseOptions::new().ttl(Duration::from_secs(30));
    let held = a.mutex_with("tls-job", options).unwrap().lock().await.unwrap();
    let other = b.mutex_with("tls-job", options).unwrap();
    assert!(other.try_lock().await.unwrap_err().is_contended());
    let waiter = tokio::spawn(async move { other.lock().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = within(5.0, "the waiter is woken", waiter).await.unwrap().unwrap();
    assert!(released.elapsed() < Duration::from_secs(2), "woken, not expired");
    let status = guard.mutex().status().await.unwrap();
    assert!(status.held);
    assert_mark(status.last_fence, guard.fence(), "status");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_only_server_with_a_ca_file() {
    let server = tls_server(false);
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let a = connect(&server.url(), &ca_only(&server)).await.unwrap();
    let b = connect(&server.url(), &ca_only(&server)).await.unwrap();
    exercise(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let server = tls_server(true);
    let url = server.url();

    let t = Instant::now();
    let err = connect(&url, &ca_only(&server)).await.unwrap_err();
    let msg = error_chain(&err);
    assert!(
        matches!(
            err,
            redlease::Error::Certificate {
                problem: redlease::CertificateProblem::ClientCertificateRefused,
                ..
            }
        ),
        "{msg}"
    );
    assert!(err.is_certificate_problem() && !err.is_unavailable(), "{msg}");
    assert!(msg.contains("TLS with redis at 127.0.0.1:"), "{msg}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refused after {:?}",
        t.elapsed()
    );
    println!("mutual TLS without a client certificate: {msg}");

    let a = connect(&url, &mutual(&server)).await.unwrap();
    let b = connect(&url, &mutual(&server)).await.unwrap();
    exercise(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_and_wrong_protocol_fail_clearly_and_quickly() {
    let server = tls_server(false);
    let stranger = tls_server(false);
    let port = server.port();

    // A CA that did not sign the server's certificate.
    let t = Instant::now();
    let err = connect(&server.url(), &ca_only(&stranger)).await.unwrap_err();
    let msg = error_chain(&err);
    assert!(
        matches!(
            err,
            redlease::Error::Certificate {
                problem: redlease::CertificateProblem::UnknownIssuer,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("not signed by a CA this client trusts"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(5));
    println!("wrong CA: {msg}");

    // Plain TCP to the TLS port.
    let t = Instant::now();
    let err = within(
        10.0,
        "plain connect returns",
        Client::connect(&format!("redis://127.0.0.1:{port}")),
    )
    .await
    .unwrap_err();
    let took = t.elapsed();
    let msg = error_chain(&err);
    assert!(msg.contains("cannot connect to redis at 127.0.0.1:"), "{msg}");
    assert!(
        msg.contains("if the server requires TLS, use a rediss:// url"),
        "{msg}"
    );
    assert!(
        took < Duration::from_secs(5),
        "plain TCP to a TLS port took {took:?}"
    );
    println!("plain TCP to a TLS port failed after {took:?}: {msg}");

    // TLS to a plain port.
    let plain = server_plain();
    let t = Instant::now();
    let err = connect(&format!("rediss://127.0.0.1:{}", plain.port()), &ca_only(&server))
        .await
        .unwrap_err();
    let msg = error_chain(&err);
    assert!(msg.contains("cannot connect to redis"), "{msg}");
    assert!(
        msg.contains("if the server does not speak TLS, use a redis:// url"),
        "{msg}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    println!("TLS to a plain port: {msg}");

    // Files for a non-TLS URL are a configuration mistake, said so before connecting.
    let err = ca_only(&server)
        .redis_client(&format!("redis://127.0.0.1:{port}"))
        .unwrap_err();
    assert!(err.to_string().contains("needs a rediss:// url"), "{err}");
}

/// What the CLI's `--redlock --tls-ca` maps onto: one TlsOptions for every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_masters() {
    let servers: Vec<RedisServer> = (0..3).map(|_| tls_server(true)).collect();
    // One CA bundle for every master (as `--tls-ca` gives); each test server only
    // trusts client certificates of its own CA, so each master gets its own pair.
    let dir = tempdir();
    let bundle = dir.join("cas.pem");
    let mut pem = String::new();
    for s in &servers {
        pem.push_str(&std::fs::read_to_string(&s.tls().unwrap().ca_cert).unwrap());
    }
    std::fs::write(&bundle, pem).unwrap();
    let masters = servers
        .iter()
        .map(|s| {
            let files = s.tls().unwrap();
            TlsOptions::new()
                .ca_file(&bundle)
                .cert_file(&files.client_cert)
                .key_file(&files.client_key)
                .redis_client(&s.url())
                .unwrap()
        })
        .collect();
    let redlock = Redlock::connect(masters).await.unwrap();
    let guard = redlock.mutex("tls-quorum").unwrap().try_lock().await.unwrap();
    assert!(guard.acquired_on() >= 2);
    guard.release().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

fn server_plain() -> RedisServer {
    server()
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("redlease-tls-redlock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The error and its sources, as `{:#}` would show them.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
