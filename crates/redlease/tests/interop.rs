//! Mixed fleets: redlease waiting behind locks taken by the peer clients themselves —
//! redis-py's `Lock` and node-redlock — installed by `scripts/interop-setup` into a
//! cache (target/interop, or $REDLEASE_INTEROP_DIR). Their releases announce nothing,
//! so a redlease waiter polls such a holder; it must get in soon after the peer lets
//! go, not when the peer's lease would have run out.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// The cache of peer clients, installed on first use.
fn peers() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let setup = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/interop-setup");
        let out = std::process::Command::new(&setup)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", setup.display()));
        assert!(
            out.status.success(),
            "{} failed (it needs python3 with venv, npm, and the package registries):\n{}",
            setup.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

/// Starts a peer holding `key` for `ttl`; returns it once it holds.
async fn hold(peer: &str, port: u16, key: &str, ttl: Duration) -> (Child, BufReader<ChildStdout>) {
    let dir = peers();
    let mut cmd = match peer {
        "redis-py" => {
            let mut c = Command::new(dir.join("venv/bin/python"));
            c.arg(script("hold_redis_py.py"))
                .arg(port.to_string())
                .arg(key)
                .arg(ttl.as_secs_f64().to_string());
            c
        }
        "node-redlock" => {
            let mut c = Command::new("node");
            c.arg(script("hold_node_redlock.js"))
                .arg(port.to_string())
                .arg(key)
                .arg(ttl.as_millis().to_string())
                .env("NODE_PATH", dir.join("node/node_modules"));
            c
        }
        other => panic!("unknown peer {other}"),
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {peer}: {e}"));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    expect_line(&mut out, "held", peer).await;
    (child, out)
}

async fn expect_line(out: &mut BufReader<ChildStdout>, want: &str, peer: &str) {
    let mut line = String::new();
    within(30.0, &format!("{peer} prints {want:?}"), out.read_line(&mut line))
        .await
        .unwrap();
    assert_eq!(line.trim(), want, "{peer}");
}

async fn waiter_gets_in_soon_after(peer: &str) {
    let server = server();
    let client = client(&server.url()).await;
    let conn = raw(&server).await;
    let name = format!("interop-{peer}");
    let key = format!("redlease:{name}");
    // The peer's lease (10 s) outlasts the waiter's patience (8 s): only noticing the
    // release lets the waiter in.
    let (mut child, mut out) = hold(peer, server.port(), &key, Duration::from_secs(10)).await;
    let waiter = tokio::spawn({
        let mutex = client.mutex(&name).unwrap();
        async move {
            let guard = mutex.lock_timeout(Duration::from_secs(8)).await;
            (guard, Instant::now())
        }
    });
    until_registered(&conn, &key, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the peer holds on a while
    assert!(!waiter.is_finished(), "{peer} still holds the lock");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"release\n").await.unwrap();
    stdin.flush().await.unwrap();
    expect_line(&mut out, "released", peer).await;
    let released = Instant::now();
    let (guard, acquired_at) = within(10.0, "the waiter", waiter).await.unwrap();
    let guard = guard.unwrap_or_else(|e| panic!("behind {peer}: {e}"));
    let after = acquired_at.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(150),
        "in {after:?} after {peer}'s release, not when its lease would have run out"
    );
    guard.release().await.unwrap();
    let status = within(10.0, "the peer exits", child.wait()).await.unwrap();
    assert!(status.success(), "{peer}: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_in_soon_after_redis_py_releases() {
    waiter_gets_in_soon_after("redis-py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_in_soon_after_node_redlock_releases() {
    waiter_gets_in_soon_after("node-redlock").await;
}
