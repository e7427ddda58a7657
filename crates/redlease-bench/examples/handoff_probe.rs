//! Where the time of a hand-over goes, step by step from the floor up. Each sample starts
//! after 15 ms of silence, as in the bench's `handoff-latency`:
//!
//! 1. an idle round trip (`PING`): the bench's denominator;
//! 2. a bare `PUBLISH` reaching a redis-rs subscriber task in this process;
//! 3. a two-command script (`DEL`, `PUBLISH`) doing the same;
//! 4. redlease's release script handing a lock to a registered waiter, invoked bare,
//!    its message read by a bare subscriber;
//! 5. the same script handing the lock to a redlease waiter (the waiter's side), and
//!    when a bare subscriber beside the waiter read the same message;
//! 6. redlease to redlease, as the bench measures it (holder's release to the waiter
//!    holding the lock).
//!
//! With `--current-thread` everything runs on one thread: no wake-up crosses threads,
//! which is where most of a multi-threaded runtime's idle round trip goes on a quiet
//! machine.
//!
//! ```text
//! cargo run --release -p redlease-bench --example handoff_probe -- redis://127.0.0.1:6379 [samples] [--current-thread]
//! ```
//!
//! It writes keys under `probe:` and `redlease:probe:`; use a Redis that serves nothing else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

const IDLE: Duration = Duration::from_millis(15);
const TTL: Duration = Duration::from_secs(30);

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn micros(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e6
}

/// A subscriber task: the instant each message on `channel` was read.
async fn subscriber(
    client: &redis::Client,
    channel: &str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<Instant>,
) {
    let mut pubsub = client.get_async_pubsub().await.expect("subscriber connection");
    pubsub.subscribe(channel).await.expect("SUBSCRIBE");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = pubsub.into_on_message();
        while stream.next().await.is_some() {
            let _ = tx.send(Instant::now());
        }
    });
    (task, rx)
}

/// redlease's release script, as redlease assembles it.
fn release_script() -> redis::Script {
    let code = include_str!("../../redlease/src/script/mutex_release.lua").replace(
        "--[[mark.lua]]",
        include_str!("../../redlease/src/script/mark.lua"),
    );
    redis::Script::new(&code)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let current = args.iter().any(|a| a == "--current-thread");
    let mut rest = args.iter().filter(|a| !a.starts_with("--"));
    let url = rest
        .next()
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let n: usize = rest.next().and_then(|s| s.parse().ok()).unwrap_or(200).max(1);
    let rt = if current {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    }
    .expect("runtime");
    println!(
        "{n} samples, {} runtime, each after {IDLE:?} idle (p50, µs)",
        if current { "current-thread" } else { "multi-thread" }
    );
    rt.block_on(run(&url, n));
}

async fn run(url: &str, n: usize) {
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");

    let mut rtt = Vec::new();
    for _ in 0..n {
        tokio::time::sleep(IDLE).await;
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
        rtt.push(micros(t, Instant::now()));
    }
    let rtt = p50(rtt);
    let line = |what: &str, us: f64| println!("  {what:52} {us:7.1}  {:4.2} × idle RTT", us / rtt);
    line("1. idle round trip (PING)", rtt);

    {
        let (task, mut rx) = subscriber(&client, "probe:bare").await;
        let mut v = Vec::new();
        for _ in 0..n {
            tokio::time::sleep(IDLE).await;
            let t = Instant::now();
            let _: i64 = redis::cmd("PUBLISH")
                .arg("probe:bare")
                .arg("x")
                .query_async(&mut conn)
                .await
                .expect("PUBLISH");
            v.push(micros(t, rx.recv().await.expect("message")));
        }
        task.abort();
        line("2. PUBLISH → subscriber task", p50(v));
    }

    {
        let (task, mut rx) = subscriber(&client, "probe:tiny").await;
        let script =
            redis::Script::new("redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], 'x') return 1");
        let mut v = Vec::new();
        for _ in 0..n {
            tokio::time::sleep(IDLE).await;
            let t = Instant::now();
            let _: i64 = script
                .key("probe:k")
                .key("probe:tiny")
                .invoke_async(&mut conn)
                .await
                .expect("script");
            v.push(micros(t, rx.recv().await.expect("message")));
        }
        task.abort();
        line("3. script DEL + PUBLISH → subscriber task", p50(v));
    }

    let script = release_script();
    {
        let (task, mut rx) = subscriber(&client, "{probe:lock}:wake").await;
        let mut v = Vec::new();
        for _ in 0..n {
            let _: () = redis::pipe()
                .cmd("SET")
                .arg("probe:lock")
                .arg("holder")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .ignore()
                .cmd("ZADD")
                .arg("{probe:lock}:q")
                .arg(9_999_999_999_999u64)
                .arg("0123456789abcdef waiter")
                .ignore()
                .query_async(&mut conn)
                .await
                .expect("set up");
            tokio::time::sleep(IDLE).await;
            let t = Instant::now();
            let _: i64 = script
                .key("probe:lock")
                .key("{probe:lock}:fence")
                .key("{probe:lock}:floor")
                .key("{probe:lock}:q")
                .arg("holder")
                .arg("PUBLISH 2000")
                .invoke_async(&mut conn)
                .await
                .expect("release script");
            v.push(micros(t, rx.recv().await.expect("message")));
        }
        task.abort();
        line("4. redlease's release script handing over → subscriber", p50(v));
    }

    let waiter = Arc::new(
        redlease::Client::builder(client.clone())
            .build()
            .await
            .expect("redlease client"),
    );
    {
        // A holder that is not a redlease client but looks like one (so the waiter
        // waits for the release's message instead of polling), releasing with the script.
        let token = "0123456789abcdef0123456789abcdef@probe";
        // A bare subscriber on the same channels: when the message reached a task of
        // this process, beside when the waiter held the lock.
        let mut pubsub = client.get_async_pubsub().await.expect("subscriber connection");
        for i in 0..4 {
            pubsub
                .subscribe(format!("{{redlease:probe:bare:{i}}}:wake"))
                .await
                .expect("SUBSCRIBE");
        }
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let listener = tokio::spawn(async move {
            let mut stream = pubsub.into_on_message();
            while stream.next().await.is_some() {
                let _ = seen_tx.send(Instant::now());
            }
        });
        let (mut v, mut read) = (Vec::new(), Vec::new());
        for i in 0..n {
            let name = format!("probe:bare:{}", i % 4);
            let key = format!("redlease:{name}");
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(token)
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("SET");
            let task = spawn_waiter(&waiter, &name).await;
            tokio::time::sleep(IDLE).await;
            let t = Instant::now();
            let _: i64 = script
                .key(&key)
                .key("{redlease:fence}")
                .key("{redlease:fence}:floor")
                .key(format!("{{{key}}}:q"))
                .arg(token)
                .arg("PUBLISH 2000")
                .invoke_async(&mut conn)
                .await
                .expect("release script");
            v.push(micros(t, task.await.expect("waiter")));
            let mut message = None;
            while let Ok(at) = seen.try_recv() {
                message.get_or_insert(at);
            }
            if let Some(at) = message {
                read.push(micros(t, at));
            }
        }
        listener.abort();
        line("5. the same script → a redlease waiter holding", p50(v));
        line("   (its message read by a bare subscriber beside it)", p50(read));
    }

    {
        let holder = redlease::Client::builder(client.clone())
            .build()
            .await
            .expect("redlease client");
        let mut v = Vec::new();
        for i in 0..n {
            let name = format!("probe:handoff:{}", i % 4);
            let guard = holder
                .mutex_with(&name, redlease::LeaseOptions::new().ttl(TTL))
                .expect("mutex")
                .lock()
                .await
                .expect("lock");
            let task = spawn_waiter(&waiter, &name).await;
            tokio::time::sleep(IDLE).await;
            let t = Instant::now();
            guard.release().await.expect("release");
            v.push(micros(t, task.await.expect("waiter")));
        }
        line("6. redlease release → redlease waiter holding", p50(v));
    }
}

/// A task that waits for `name` and reports when it holds it (then releases it).
async fn spawn_waiter(client: &Arc<redlease::Client>, name: &str) -> tokio::task::JoinHandle<Instant> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let (client, name) = (client.clone(), name.to_owned());
        async move {
            let _ = ready_tx.send(());
            let mutex = client
                .mutex_with(&name, redlease::LeaseOptions::new().ttl(TTL))
                .expect("mutex");
            let guard = mutex.lock().await.expect("waiter's lock");
            let at = Instant::now();
            guard.release().await.expect("waiter's release");
            at
        }
    });
    let _ = ready_rx.await;
    task
}
