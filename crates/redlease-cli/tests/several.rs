//! `redlease run NAME NAME… -- CMD` through the real binary: every name held at once,
//! a fencing token per name in CMD's environment, and processes taking {A,B}, {B,A},
//! {A} and {B} concurrently that lose no update and never deadlock — on one server and
//! across the masters of a cluster.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use redis::Commands;
use redlease_testkit::RedisCluster;

/// CMD of the contention tests: under the lock, for each name given after the
/// directory, a read-modify-write of the file named after it, and the fencing token it
/// saw for that name appended to `<name>.fences`.
const CRITICAL: &str = r#"dir=$1; shift; i=0
for n in "$@"; do
  i=$((i + 1))
  if [ $# -gt 1 ]; then eval "f=\$REDLEASE_FENCE_$i"; else f=$REDLEASE_FENCE; fi
  v=$(cat "$dir/$n"); sleep 0.001; echo $((v + 1)) > "$dir/$n"; echo "$f" >> "$dir/$n.fences"
done"#;

/// A worker process: `rounds` times `redlease <global> run NAMES… -- CRITICAL`. Leases
/// of 90 s: a deadlock would outlast the tests' 30 s limit on every process.
const WORKER: &str = r#"bin=$1; rounds=$2; dir=$3; critical=$4; shift 4
global=$1; shift
i=0
while [ "$i" -lt "$rounds" ]; do
  # shellcheck disable=SC2086
  "$bin" $global run "$@" --ttl 90s --wait 60s -- sh -c "$critical" sh "$dir" "$@" || exit $?
  i=$((i + 1))
done"#;

/// Runs two workers for each of {a,b}, {b,a}, {a} and {b}, `rounds` times each, and
/// checks the names' counters and fences.
fn contend(global: &str, a: &str, b: &str, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    for name in [a, b] {
        std::fs::write(dir.path().join(name), "0\n").unwrap();
        std::fs::write(dir.path().join(format!("{name}.fences")), "").unwrap();
    }
    let sets: [&[&str]; 4] = [&[a, b], &[b, a], &[a], &[b]];
    let started = Instant::now();
    let workers: Vec<Child> = sets
        .iter()
        .flat_map(|set| [set, set])
        .map(|set| {
            Command::new("sh")
                .arg("-c")
                .arg(WORKER)
                .arg("worker")
                .arg(BIN)
                .arg(rounds.to_string())
                .arg(dir.path())
                .arg(CRITICAL)
                .arg(global)
                .args(*set)
                .env_remove("REDIS_URL")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for worker in workers {
        let out = finish(worker, started);
        assert_eq!(out.code, 0, "a worker failed: {out:?}");
    }
    eprintln!("{} runs in {:?}", 8 * rounds, started.elapsed());
    for name in [a, b] {
        // {a,b} x2, {b,a} x2 and one of {a}, {b} x2 include it.
        let expected = 6 * rounds;
        let value: usize = read(&dir.path().join(name)).trim().parse().unwrap();
        assert_eq!(value, expected, "lost {} updates of {name}", expected - value);
        let fences: Vec<u64> = read(&dir.path().join(format!("{name}.fences")))
            .lines()
            .map(|l| l.parse().expect("a fencing token per entry"))
            .collect();
        assert_eq!(fences.len(), expected);
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "the fences of {name} rise in order of entry: {fences:?}"
        );
    }
}

/// The `NAME=value` lines CMD printed.
fn env_vars(out: &Out) -> HashMap<String, String> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("REDLEASE_"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn run_with_several_names_holds_them_all_and_gives_a_fence_per_name() {
    let server = server();
    let out = output({
        let mut cmd = at(
            &server,
            &[
                // Background work left after the release would hold redlease up to this
                // long before it exits (or until the lease's next renewal, 20 s away).
                "--response-timeout",
                "30s",
                "run",
                "ledger",
                "audit",
                "--ttl",
                "60s",
                "--",
                "sh",
                "-c",
                r#"env | grep '^REDLEASE_' | sort
for n in ledger audit; do "$BIN" --redis "$URL" status "$n" --json; done"#,
            ],
        );
        // Stale values from an outer run must not reach CMD.
        cmd.env("REDLEASE_FENCE", "7")
            .env("REDLEASE_FENCE_3", "7")
            .env("BIN", BIN)
            .env("URL", server.url());
        cmd
    });
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.took < Duration::from_secs(10),
        "exits once CMD is done: {out:?}"
    );
    let vars = env_vars(&out);
    // While CMD ran, both names were held by this process, and the fences CMD got
    // were the last ones their shared fencing counter issued.
    let statuses: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(statuses.len(), 2, "{out:?}");
    let fences: Vec<u64> = (1..=2)
        .map(|i| vars[&format!("REDLEASE_FENCE_{i}")].parse().unwrap())
        .collect();
    for status in &statuses {
        assert_eq!(status["held"], true, "{out:?}");
        assert!(status["owner"].as_str().is_some(), "{out:?}");
        assert_mark(&status["last_fence"], fences[0].max(fences[1]));
    }
    assert_eq!(vars["REDLEASE_NAME"], "ledger+audit");
    assert_eq!(vars["REDLEASE_KEY"], "redlease:ledger+redlease:audit");
    assert_eq!(vars["REDLEASE_NAME_1"], "ledger");
    assert_eq!(vars["REDLEASE_NAME_2"], "audit");
    assert_eq!(vars["REDLEASE_KEY_2"], "redlease:audit");
    assert!(!vars.contains_key("REDLEASE_FENCE"), "{out:?}");
    assert!(!vars.contains_key("REDLEASE_FENCE_3"), "{out:?}");
    // The fences CMD saw are distinct, and still the last ones issued once released.
    assert_ne!(fences[0], fences[1]);
    for name in ["ledger", "audit"] {
        let status = json(&output(at(&server, &["status", name, "--json"])));
        assert_eq!(status["held"], false, "released");
        assert_mark(&status["last_fence"], fences[0].max(fences[1]));
    }
    assert_eq!(
        lock_keys(&server),
        Vec::<String>::new(),
        "only the fencing counter is left"
    );

    // One name held elsewhere: not acquired, naming it, and nothing else taken.
    let held = json(&output(at(
        &server,
        &["acquire", "audit", "--ttl", "30s", "--json"],
    )));
    let out = output(at(
        &server,
        &["run", "ledger", "audit", "--no-wait", "--", "echo", "ran"],
    ));
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("\"audit\""), "names the busy name: {out:?}");
    assert_eq!(out.stdout, "", "CMD did not run");
    assert!(
        !conn(&server).exists::<_, bool>("redlease:ledger").unwrap(),
        "nothing half-taken"
    );
    let token = held["token"].as_str().unwrap();
    assert_eq!(
        output(at(&server, &["release", "audit", "--token", token])).code,
        0
    );
}

#[test]
fn one_name_flags_and_a_repeated_name_are_usage_errors() {
    let server = server();
    for args in [
        &["run", "a", "b", "--fair", "--", "true"][..],
        &["run", "a", "b", "--legacy", "--", "true"],
        &["--wait-replicas", "1", "run", "a", "b", "--", "true"],
        &["run", "a", "b", "a", "--", "true"],
    ] {
        let out = output(at(&server, args));
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("hint:") || out.stderr.contains("help"),
            "{out:?}"
        );
    }
    assert_eq!(all_keys(&server), Vec::<String>::new(), "nothing taken");
}

#[test]
fn processes_taking_both_orders_and_single_names_lose_no_update() {
    let server = server();
    contend(&format!("--redis {}", server.url()), "A", "B", 10);
    assert_eq!(
        lock_keys(&server),
        Vec::<String>::new(),
        "only the fencing counter is left"
    );
}

#[test]
fn across_cluster_masters_processes_lose_no_update() {
    let cluster = RedisCluster::start(3, 0).unwrap_or_else(|e| panic!("{e}"));
    let on = |m: usize| {
        cluster
            .key_on_master(m, |n| format!("redlease:acct-{n}"))
            .unwrap()
            .trim_start_matches("redlease:")
            .to_owned()
    };
    let (a, b) = (on(0), on(2));
    let global: Vec<String> = cluster.urls().iter().map(|u| format!("--redis {u}")).collect();
    contend(&format!("--cluster {}", global.join(" ")), &a, &b, 6);
    for (m, name) in [(0, &a), (2, &b)] {
        let mut conn = cluster.master(m).client().get_connection().unwrap();
        assert!(
            !conn.exists::<_, bool>(format!("redlease:{name}")).unwrap(),
            "{name} released"
        );
    }
}
