//! The other kinds of lock through the real binary: `semaphore run`, `rwlock run`,
//! `run --fair` and `run --legacy` (beside unmodified old-style clients), and their
//! `status` output.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use redis::Commands;

/// `n` shell workers, each running `body` (with `$bin` and `$url` set) to the end.
fn workers(n: usize, server_url: &str, body: &str) -> Vec<Child> {
    (0..n)
        .map(|i| {
            Command::new("sh")
                .arg("-c")
                .arg(body)
                .arg("worker")
                .arg(BIN)
                .arg(server_url)
                .arg(i.to_string())
                .env_remove("REDIS_URL")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// As `workers`, with one more variable in the workers' environment.
fn workers_with_env(n: usize, server_url: &str, body: &str, (key, value): (&str, &str)) -> Vec<Child> {
    (0..n)
        .map(|i| {
            Command::new("sh")
                .arg("-c")
                .arg(body)
                .arg("worker")
                .arg(BIN)
                .arg(server_url)
                .arg(i.to_string())
                .env_remove("REDIS_URL")
                .env(key, value)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn numbers(path: &Path) -> Vec<u64> {
    read(path)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// A CMD that records how many holders are inside (a file per holder in `$DIR`),
/// stays a moment, and leaves. A holder's file exists only while it holds, so the
/// count can never exceed the true number of concurrent holders.
const COUNTING_CMD: &str = r#"touch "$DIR/$$"; sleep 0.15; ls "$DIR" | wc -l >> "$LOG"; rm "$DIR/$$""#;

#[test]
fn nine_processes_never_run_more_than_three_under_a_three_permit_semaphore() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("inside");
    std::fs::create_dir(&inside).unwrap();
    let log = dir.path().join("log");
    std::fs::write(&log, "").unwrap();
    let body = format!(
        r#"bin=$1; url=$2
export DIR='{}' LOG='{}'
for i in 1 2; do
  "$bin" --redis "$url" semaphore run pool --permits 3 --wait 60s -- sh -c '{COUNTING_CMD}' || exit $?
done"#,
        inside.display(),
        log.display()
    );
    let started = Instant::now();
    for p in workers(9, &server.url(), &body) {
        let out = finish(p, started);
        assert_eq!(out.code, 0, "a worker failed: {out:?}");
    }
    let counts = numbers(&log);
    assert_eq!(counts.len(), 18, "every run ran once: {counts:?}");
    let most = *counts.iter().max().unwrap();
    assert!(
        most <= 3,
        "{most} commands ran at once under 3 permits: {counts:?}"
    );
    assert!(most >= 2, "the permits were never used in parallel: {counts:?}");
    // Every permit was given back.
    let status = json(&output(at(
        &server,
        &["semaphore", "status", "pool", "--permits", "3", "--json"],
    )));
    assert_eq!(status["in_use"], 0, "{status}");
    assert_eq!(status["limit"], 3, "{status}");
    eprintln!(
        "18 semaphore runs by 9 processes in {:?}; at most {most} at once",
        started.elapsed()
    );
}

#[test]
fn semaphore_status_shows_permits_in_use_and_a_full_semaphore_exits_75() {
    let server = server();
    let mut holder = at(
        &server,
        &["semaphore", "run", "gpu", "--permits", "2", "--count", "2", "--"],
    );
    holder.args(["sh", "-c", "echo \"ready $REDLEASE_PERMITS\"; read line"]);
    let (mut child, mut stdout) = start_until_ready_with(holder, "ready 2");
    let status = json(&output(at(
        &server,
        &["semaphore", "status", "gpu", "--permits", "2", "--json"],
    )));
    assert_eq!(
        (status["in_use"].as_u64(), status["available"].as_u64()),
        (Some(2), Some(0)),
        "{status}"
    );
    let text = output(at(&server, &["semaphore", "status", "gpu", "--permits", "2"]));
    assert!(text.stdout.contains("2 of 2 in use"), "{text:?}");
    let busy = output(at(
        &server,
        &[
            "semaphore",
            "run",
            "gpu",
            "--permits",
            "2",
            "--no-wait",
            "--",
            "true",
        ],
    ));
    assert_eq!(busy.code, 75, "{busy:?}");
    let mismatch = output(at(
        &server,
        &[
            "semaphore",
            "run",
            "gpu",
            "--permits",
            "5",
            "--no-wait",
            "--",
            "true",
        ],
    ));
    assert_eq!(
        mismatch.code, 2,
        "a different limit is a usage error: {mismatch:?}"
    );
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let out = finish_child(&mut child, &mut stdout);
    assert_eq!(out, 0);
    let status = json(&output(at(
        &server,
        &["semaphore", "status", "gpu", "--permits", "2", "--json"],
    )));
    assert_eq!(status["in_use"], 0, "{status}");
}

#[test]
fn rwlock_readers_overlap_and_a_writer_is_alone_with_a_fence() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("inside");
    std::fs::create_dir(&inside).unwrap();
    let (readers_log, writers_log) = (dir.path().join("readers"), dir.path().join("writers"));
    std::fs::write(&readers_log, "").unwrap();
    std::fs::write(&writers_log, "").unwrap();
    // Readers and writers share the directory: a writer must always find itself alone.
    let body = format!(
        r#"bin=$1; url=$2; i=$3
export DIR='{dir}'
for round in 1 2 3; do
  if [ "$i" -lt 2 ]; then
    "$bin" --redis "$url" rwlock run doc --write --wait 60s -- sh -c 'touch "$DIR/$$"; echo "$(ls "$DIR" | wc -l) $REDLEASE_FENCE" >> "{w}"; sleep 0.05; rm "$DIR/$$"' || exit $?
  else
    "$bin" --redis "$url" rwlock run doc --read --wait 60s -- sh -c 'test -z "$REDLEASE_FENCE" || exit 9; export LOG="{r}"; {COUNTING_CMD}' || exit $?
  fi
done"#,
        dir = inside.display(),
        w = writers_log.display(),
        r = readers_log.display(),
    );
    let started = Instant::now();
    for p in workers(6, &server.url(), &body) {
        let out = finish(p, started);
        assert_eq!(out.code, 0, "a worker failed: {out:?}");
    }
    let readers = numbers(&readers_log);
    assert_eq!(readers.len(), 12);
    assert!(
        *readers.iter().max().unwrap() >= 2,
        "readers never overlapped: {readers:?}"
    );
    let writers: Vec<(u64, u64)> = read(&writers_log)
        .lines()
        .map(|l| {
            let (n, fence) = l.trim().split_once(' ').expect("count and fence");
            (n.trim().parse().unwrap(), fence.parse().unwrap())
        })
        .collect();
    assert_eq!(writers.len(), 6);
    for (inside, fence) in &writers {
        assert_eq!(*inside, 1, "a writer was not alone: {writers:?}");
        assert!(*fence > 0);
    }
    for pair in writers.windows(2) {
        assert!(pair[0].1 < pair[1].1, "write fences must rise: {writers:?}");
    }
    let status = json(&output(at(&server, &["rwlock", "status", "doc", "--json"])));
    assert_eq!(
        (status["readers"].as_u64(), status["write_held"].as_bool()),
        (Some(0), Some(false)),
        "{status}"
    );
}

#[test]
fn a_held_write_lock_keeps_readers_out_and_status_shows_it() {
    let server = server();
    let mut writer = at(&server, &["rwlock", "run", "cfg", "--write", "--"]);
    writer.args(["sh", "-c", "echo ready; read line"]);
    let (mut child, mut stdout) = start_until_ready_with(writer, "ready");
    let reader = output(at(
        &server,
        &["rwlock", "run", "cfg", "--read", "--no-wait", "--", "true"],
    ));
    assert_eq!(reader.code, 75, "{reader:?}");
    let status = json(&output(at(&server, &["rwlock", "status", "cfg", "--json"])));
    assert_eq!(status["write_held"], true, "{status}");
    assert!(status["fence"].as_u64().is_some(), "{status}");
    let text = output(at(&server, &["rwlock", "status", "cfg"]));
    assert!(text.stdout.contains("writer:     yes"), "{text:?}");
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert_eq!(finish_child(&mut child, &mut stdout), 0);
    let reader = output(at(
        &server,
        &["rwlock", "run", "cfg", "--read", "--no-wait", "--", "true"],
    ));
    assert_eq!(reader.code, 0, "{reader:?}");
    let usage = output(at(&server, &["rwlock", "run", "cfg", "--", "true"]));
    assert_eq!(usage.code, 2, "--read or --write is required: {usage:?}");
}

#[test]
fn fair_runs_enter_in_arrival_order_and_status_shows_the_queue() {
    const WAITERS: usize = 5;
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let order = dir.path().join("order");
    std::fs::write(&order, "").unwrap();
    let mut holder = at(&server, &["run", "line", "--fair", "--"]);
    holder.args(["sh", "-c", "echo ready; read line"]);
    let (mut child, mut stdout) = start_until_ready_with(holder, "ready");
    let started = Instant::now();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let mut cmd = at(&server, &["run", "line", "--fair", "--wait", "60s", "--"]);
        cmd.args(["sh", "-c", &format!("echo {i} >> '{}'", order.display())]);
        waiters.push(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
        // The next one starts only once this one is in the queue.
        eventually(20, "the waiter joined the queue", || {
            json(&output(at(&server, &["status", "line", "--fair", "--json"])))["waiters"].as_u64()
                == Some(i as u64 + 1)
        });
    }
    let status = json(&output(at(&server, &["status", "line", "--fair", "--json"])));
    assert_eq!(
        status["queue"].as_array().map(Vec::len),
        Some(WAITERS),
        "{status}"
    );
    assert!(status.get("token").is_none());
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(finish_child(&mut child, &mut stdout), 0);
    for w in waiters {
        let out = finish(w, started);
        assert_eq!(out.code, 0, "{out:?}");
    }
    let seen = numbers(&order);
    assert_eq!(
        seen,
        (0..WAITERS as u64).collect::<Vec<_>>(),
        "not served in arrival order"
    );
}

fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// An unmodified old-style client, exactly as the Redis SETNX page describes it: `SETNX key
/// <now + timeout + 1>`; on failure `GET`, and if that timestamp has passed, `GETSET`
/// and own the lock only if the value it replaced had passed too; `DEL` on release
/// only if its own timestamp has not passed.
fn old_client(url: &str, rounds: usize, counter: &Path) {
    const TIMEOUT: u64 = 2;
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..rounds {
        let mine = loop {
            assert!(Instant::now() < deadline, "old client starved");
            let stamp = unix_secs() + TIMEOUT + 1;
            if conn.set_nx::<_, _, bool>("lock.foo", stamp).unwrap() {
                break stamp;
            }
            let current: Option<u64> = conn.get("lock.foo").unwrap();
            if current.is_some_and(|t| t < unix_secs()) {
                let stamp = unix_secs() + TIMEOUT + 1;
                let previous: Option<u64> = conn.getset("lock.foo", stamp).unwrap();
                if previous.is_none_or(|t| t < unix_secs()) {
                    break stamp;
                }
            }
            thread::sleep(Duration::from_millis(10));
        };
        let n: u64 = read(counter).trim().parse().unwrap();
        thread::sleep(Duration::from_millis(2));
        std::fs::write(counter, format!("{}\n", n + 1)).unwrap();
        if unix_secs() < mine {
            let _: () = conn.del("lock.foo").unwrap();
        }
    }
}

#[test]
fn legacy_runs_and_old_clients_lose_no_update_starting_from_a_crashed_holder() {
    const ROUNDS: usize = 10;
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0\n").unwrap();
    // A holder crashed long ago: its timestamp has passed, and nobody deleted it.
    let _: () = conn(&server).set("lock.foo", unix_secs() - 30).unwrap();
    let body = format!(
        r#"bin=$1; url=$2
for i in $(seq {ROUNDS}); do
  "$bin" --redis "$url" --prefix '' run lock.foo --legacy --ttl 2s --wait 60s -- sh -c 'test -z "$REDLEASE_FENCE" || exit 9; n=$(cat "$0"); sleep 0.002; echo $((n + 1)) > "$0"' '{}' || exit $?
done"#,
        counter.display()
    );
    let started = Instant::now();
    // An outer run's fencing token must not leak into a legacy run's CMD.
    let processes: Vec<Child> = workers_with_env(2, &server.url(), &body, ("REDLEASE_FENCE", "12345"));
    let olds: Vec<_> = (0..2)
        .map(|_| {
            let (url, counter) = (server.url(), counter.clone());
            thread::spawn(move || old_client(&url, ROUNDS, &counter))
        })
        .collect();
    for p in processes {
        let out = finish(p, started);
        assert_eq!(out.code, 0, "a redlease worker failed: {out:?}");
    }
    for t in olds {
        t.join().expect("an old client failed");
    }
    let value: usize = read(&counter).trim().parse().unwrap();
    assert_eq!(value, 4 * ROUNDS, "lost {} increments", 4 * ROUNDS - value);
    eprintln!(
        "{} legacy-locked increments (2 old clients, 2 redlease processes) in {:?}",
        4 * ROUNDS,
        started.elapsed()
    );
}

/// Starts `cmd` with piped stdin/stdout and waits for its first stdout line to be `ready`.
fn start_until_ready_with(
    mut cmd: Command,
    ready: &str,
) -> (Child, std::io::BufReader<std::process::ChildStdout>) {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlease");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    assert_eq!(line.trim(), ready, "CMD did not start");
    (child, stdout)
}

/// Waits (bounded) for a child started with `start_until_ready_with`; its exit code.
fn finish_child(child: &mut Child, _stdout: &mut std::io::BufReader<std::process::ChildStdout>) -> i32 {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "redlease did not finish");
        thread::sleep(Duration::from_millis(5));
    }
}

/// `status NAME` on a name another kind of lock uses says which kind, and how to see
/// it: readers of a read-write lock leave no plain lock key (the name looked free), and
/// a semaphore's or an election's keys cannot be read as a plain lock (it failed with
/// "wrong type", status 69).
#[test]
fn status_of_a_name_held_by_another_kind_names_that_kind() {
    let server = server();
    let holding = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--", "sh", "-c", "echo ready; read line"]);
        start_until_ready(at(&server, &all))
    };
    let mut holders = vec![
        holding(&["rwlock", "run", "rw", "--read"]),
        holding(&["semaphore", "run", "s", "--permits", "2"]),
        holding(&["elect", "sched"]),
    ];
    let rw = output(at(&server, &["status", "rw"]));
    assert_eq!(rw.code, 0, "{rw:?}");
    assert!(rw.stdout.contains("held:       no"), "{rw:?}");
    assert!(
        rw.stdout
            .contains("held as:    rwlock (see `redlease rwlock status rw`)"),
        "{rw:?}"
    );
    let rw = json(&output(at(&server, &["status", "rw", "--json"])));
    assert_eq!(rw["held_as"], "rwlock", "{rw}");
    for (name, kind, command) in [
        ("s", "a semaphore", "redlease semaphore status s --permits N"),
        ("sched", "an election", "redlease leader sched"),
    ] {
        let out = output(at(&server, &["status", name]));
        assert_eq!(out.code, 2, "{out:?}");
        assert!(
            out.stderr
                .contains(&format!("is held as {kind}, not as a plain lock")),
            "{out:?}"
        );
        assert!(out.stderr.contains(command), "{out:?}");
    }
    let free = json(&output(at(&server, &["status", "nothing", "--json"])));
    assert_eq!(free["held"], false);
    assert!(free.get("held_as").is_none(), "{free}");
    for (mut child, _) in holders.drain(..) {
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert_eq!(finish(child, Instant::now()).code, 0);
    }
}
