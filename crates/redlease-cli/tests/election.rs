//! `redlease elect` and `redlease leader` through the real binary: candidate processes
//! that run their CMD one at a time, a leader killed outright, lost leadership, the
//! leader's JSON and the watch of its changes, on one server, a Cluster and through
//! Sentinel.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis::Commands;
use redlease_testkit::{RedisCluster, RedisSentinel};
use serde_json::Value;

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).expect("send a signal");
}

/// Whether process `pid` still exists.
/// Whether process `pid` runs (a zombie nobody reaped yet does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// `n` shell workers, each running `body` (with `$1` the binary, `$2` the URL and `$3`
/// its number) to the end.
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

/// The lines a child prints, read in a thread so that a test can wait for each one
/// with a bound.
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines(rx)
    }

    fn next(&self, what: &str) -> String {
        self.0
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("no line within {LIMIT:?}: {what}"))
    }

    fn json(&self, what: &str) -> Value {
        let line = self.next(what);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }
}

/// The pid in an owner label `host:pid`.
fn owner_pid(owner: &Value) -> i32 {
    owner
        .as_str()
        .and_then(|o| o.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("owner label {owner}"))
}

/// Markers CMDs append to one file: `start <term> <ns>` / `stop <term> <ns>`.
const MARKING_CMD: &str = r#"echo "start $REDLEASE_TERM $(date +%s%N)" >> "$LOG"; sleep 0.3; echo "stop $REDLEASE_TERM $(date +%s%N)" >> "$LOG""#;

/// Three candidate processes, each electing itself twice: exactly one CMD runs at any
/// moment (every start is followed by its own stop before the next start), terms rise,
/// and each CMD's exit hands leadership to a waiting candidate at once — far sooner
/// than the 30 s lease would.
#[test]
fn three_candidates_run_one_cmd_at_a_time_and_hand_over_when_it_exits() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    std::fs::write(&log, "").unwrap();
    let body = format!(
        r#"export LOG='{}'
for i in 1 2; do
  "$1" --redis "$2" elect turns --value "worker $3" -- sh -c '{MARKING_CMD}' || exit $?
done"#,
        log.display()
    );
    let started = Instant::now();
    for w in workers(3, &server.url(), &body) {
        let out = finish(w, started);
        assert_eq!(out.code, 0, "a candidate failed: {out:?}");
    }
    let lines: Vec<(String, u64, u128)> = read(&log)
        .lines()
        .map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            (
                parts[0].to_owned(),
                parts[1].parse().unwrap(),
                parts[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(lines.len(), 12, "six runs: {lines:?}");
    let mut gaps = Vec::new();
    for (i, pair) in lines.chunks(2).enumerate() {
        let [(start, term, t0), (stop, term2, _)] = pair else {
            unreachable!()
        };
        assert_eq!(
            (start.as_str(), stop.as_str(), term),
            ("start", "stop", term2),
            "run {i} overlapped another: {lines:?}"
        );
        if i > 0 {
            let previous = &lines[2 * i - 1];
            assert!(*term > previous.1, "terms must rise: {lines:?}");
            gaps.push(Duration::from_nanos((t0 - previous.2) as u64));
        }
    }
    gaps.sort();
    eprintln!(
        "6 leaderships by 3 candidate processes in {:?}; CMD exit to next CMD start: median {:?}, worst {:?}",
        started.elapsed(),
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1]
    );
    // A hand-over costs a resignation, a wake-up, a campaign and starting sh: well
    // under a second even on a loaded machine; the lease (30 s) never ran out.
    assert!(gaps[gaps.len() - 1] < Duration::from_secs(5), "{gaps:?}");
    assert!(all_keys(&server).iter().all(|k| !k.ends_with(":wake")));
}

/// SIGKILL of the leader's redlease: nobody resigns, so another candidate leads once
/// the lease runs out — within TTL + 1 s — with a higher term. The killed leader's CMD
/// gets --lost-signal from the kernel (TERM) and is gone within a second, long before
/// the next leader starts.
#[test]
fn a_killed_leader_is_replaced_within_its_ttl_with_a_higher_term() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    std::fs::write(&log, "").unwrap();
    let ttl = Duration::from_secs(2);
    let mut candidates: Vec<Child> = (0..3)
        .map(|i| {
            at(
                &server,
                &[
                    "elect",
                    "killed",
                    "--ttl",
                    "2s",
                    "--value",
                    &format!("c{i}"),
                    "--",
                    "sh",
                    "-c",
                    r#"echo "$REDLEASE_TERM $$" >> "$LOG"; exec sleep 600"#,
                ],
            )
            .env("LOG", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let entries = || -> Vec<(u64, i32)> {
        read(&log)
            .lines()
            .map(|l| {
                let (term, pid) = l.split_once(' ').unwrap();
                (term.parse().unwrap(), pid.parse().unwrap())
            })
            .collect()
    };
    eventually(20, "one candidate leads", || entries().len() == 1);
    let leader = json(&output(at(&server, &["leader", "killed", "--json"])));
    assert_eq!(leader["leader"], true, "{leader}");
    let pid = owner_pid(&leader["owner"]);
    let index = candidates
        .iter()
        .position(|c| c.id() as i32 == pid)
        .expect("the leader is one of ours");
    let mut killed = candidates.remove(index);
    let (old_term, old_cmd) = entries()[0];
    assert_eq!(leader["term"], old_term, "{leader}");

    let at_kill = Instant::now();
    killed.kill().unwrap();
    killed.wait().unwrap();
    while alive(old_cmd) {
        if at_kill.elapsed() >= Duration::from_secs(1) {
            let _ = kill(Pid::from_raw(old_cmd), Signal::SIGKILL); // leave no orphan behind
            panic!("the killed leader's CMD still ran a second later");
        }
        thread::sleep(Duration::from_millis(5));
    }
    eventually(20, "another candidate leads", || entries().len() == 2);
    let took = at_kill.elapsed();
    let (new_term, new_cmd) = entries()[1];
    eprintln!("a SIGKILLed leader (--ttl {ttl:?}) was replaced after {took:?}");
    assert!(took < ttl + Duration::from_secs(1), "took {took:?}");
    assert!(new_term > old_term, "{new_term} after {old_term}");
    assert_ne!(new_cmd, old_cmd);
    assert_eq!(
        entries().len(),
        2,
        "the third candidate still waits: {:?}",
        entries()
    );

    // Clean up: the candidates (SIGTERM reaches their CMD, which ends, and each
    // resigns).
    for c in &candidates {
        signal(c, Signal::SIGTERM);
    }
    for c in candidates {
        let out = finish(c, Instant::now());
        assert_eq!(out.code, 128 + 15, "the leader's CMD, or the waiting: {out:?}");
    }
}

#[test]
fn lost_leadership_signals_cmd_and_exits_79() {
    let server = server();
    let mut leader = at(
        &server,
        &[
            "elect",
            "fragile",
            "--ttl",
            "600ms",
            "--",
            "sh",
            "-c",
            r#"trap 'echo got-TERM; exit 3' TERM
echo "ready $REDLEASE_NAME $REDLEASE_TERM $REDLEASE_FENCE"
while :; do sleep 0.02; done"#,
        ],
    );
    let mut child = leader
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let ready = lines.next("CMD starts");
    let fields: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(fields[..2], ["ready", "fragile"], "{ready}");
    assert_eq!(fields[2], fields[3], "REDLEASE_FENCE is the term: {ready}");
    let term: u64 = fields[2].parse().unwrap();

    // Another candidate that will not wait is refused with 75.
    let busy = output(at(&server, &["elect", "fragile", "--no-wait", "--", "true"]));
    assert_eq!(busy.code, 75, "{busy:?}");
    assert!(busy.stderr.contains("another leader"), "{busy:?}");

    let _: i64 = conn(&server).del("redlease:fragile").unwrap();
    assert_eq!(lines.next("CMD is told"), "got-TERM");
    let out = finish(child, Instant::now());
    assert_eq!(out.code, 79, "{out:?}");
    assert!(
        out.stderr
            .contains("the leadership of election \"fragile\" was lost"),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("REDLEASE_TERM"),
        "the hint names the term: {out:?}"
    );
    // The next leader's term is higher.
    let next = output(at(
        &server,
        &[
            "elect",
            "fragile",
            "--no-wait",
            "--",
            "sh",
            "-c",
            "echo $REDLEASE_TERM",
        ],
    ));
    assert_eq!(next.code, 0, "{next:?}");
    assert!(next.stdout.trim().parse::<u64>().unwrap() > term, "{next:?}");
}

/// `leader` shows the leader (never its token); `leader --watch` prints the election as
/// it is, then one line per change, until interrupted (status 130).
#[test]
fn leader_shows_the_leader_and_watch_prints_each_change_until_interrupted() {
    let server = server();
    let none = json(&output(at(&server, &["leader", "watched", "--json"])));
    assert_eq!(none["leader"], false, "{none}");
    for field in ["value", "term", "owner", "ttl_ms"] {
        assert!(none[field].is_null(), "{field}: {none}");
    }
    let human = output(at(&server, &["leader", "watched"]));
    assert_eq!(human.code, 0);
    assert!(human.stdout.contains("leader:     none"), "{human:?}");

    let mut watch_json = at(&server, &["leader", "watched", "--watch", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut watch_text = at(&server, &["leader", "watched", "--watch"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (json_lines, text_lines) = (Lines::of(&mut watch_json), Lines::of(&mut watch_text));
    let first = json_lines.json("the election as it is");
    assert_eq!(
        (first["event"].as_str(), &first["leader"]),
        (Some("vacant"), &Value::Bool(false))
    );
    assert!(text_lines.next("the election as it is").ends_with("nobody leads"));

    // A leader that holds until told, then two that come and go.
    let (mut holder, _out) = start_until_ready(at(
        &server,
        &[
            "elect",
            "watched",
            "--value",
            "a",
            "--",
            "sh",
            "-c",
            "echo ready; read line",
        ],
    ));
    let shown = json(&output(at(&server, &["leader", "watched", "--json"])));
    assert_eq!(
        (shown["leader"].as_bool(), shown["value"].as_str()),
        (Some(true), Some("a"))
    );
    assert!(
        shown["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t > 25_000 && t <= 30_000),
        "{shown}"
    );
    assert_eq!(owner_pid(&shown["owner"]), holder.id() as i32, "{shown}");
    for field in ["name", "key", "term", "since_ms"] {
        assert!(!shown[field].is_null(), "{field}: {shown}");
    }
    let token: String = conn(&server).hget("redlease:watched", "token").unwrap();
    let text = output(at(&server, &["leader", "watched"]));
    assert!(text.stdout.contains("value:      \"a\""), "{text:?}");
    assert!(
        !text.stdout.contains(&token) && !shown.to_string().contains(&token),
        "never a token"
    );

    holder.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(finish(holder, Instant::now()).code, 0);
    for value in ["b", "c"] {
        let out = output(at(&server, &["elect", "watched", "--value", value, "--", "true"]));
        assert_eq!(out.code, 0, "{out:?}");
    }

    let events: Vec<Value> = (0..6).map(|_| json_lines.json("a change")).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["elected", "vacant", "elected", "vacant", "elected", "vacant"],
        "{events:?}"
    );
    let values: Vec<&str> = events
        .iter()
        .step_by(2)
        .map(|e| e["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["a", "b", "c"]);
    let terms: Vec<u64> = events
        .iter()
        .step_by(2)
        .map(|e| e["term"].as_u64().unwrap())
        .collect();
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms rise: {terms:?}");
    assert_eq!(terms[0], shown["term"].as_u64().unwrap());
    assert!(
        events.iter().skip(1).step_by(2).all(|e| e["resigned"] == true),
        "{events:?}"
    );
    let text: Vec<String> = (0..6).map(|_| text_lines.next("a change")).collect();
    assert!(
        text[0].contains(" elected ") && text[0].contains("value \"a\""),
        "{text:?}"
    );
    assert!(text[1].ends_with("the leader resigned"), "{text:?}");

    for w in [&watch_json, &watch_text] {
        signal(w, Signal::SIGINT);
    }
    for w in [watch_json, watch_text] {
        let out = finish(w, Instant::now());
        assert_eq!(out.code, 130, "{out:?}");
        assert!(out.stderr.is_empty(), "interrupting a watch is no error: {out:?}");
    }
}

/// On a 3-master Cluster and through Sentinel: `elect` and `leader` work as on one
/// server.
#[test]
fn elect_and_leader_on_a_cluster_and_through_sentinel() {
    let cluster = RedisCluster::start(3, 0).unwrap_or_else(|e| panic!("{e}"));
    let mut global: Vec<String> = cluster
        .urls()
        .into_iter()
        .flat_map(|u| ["--redis".to_owned(), u])
        .collect();
    global.push("--cluster".to_owned());
    let sentinels = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let mut via_sentinel: Vec<String> = sentinels
        .sentinel_urls()
        .into_iter()
        .flat_map(|u| ["--sentinel".to_owned(), u])
        .collect();
    via_sentinel.extend(["--master".to_owned(), sentinels.master_name().to_owned()]);

    let wake = "{redlease:everywhere}:wake";
    let master = cluster
        .master_of_slot(cluster.slot_of("redlease:everywhere").unwrap())
        .unwrap();
    let listeners = |topology: &str| -> i64 {
        let (mut conn, command) = match topology {
            "cluster" => (conn(cluster.master(master)), "SHARDNUMSUB"),
            _ => (conn(sentinels.master()), "NUMSUB"),
        };
        let reply: Vec<redis::Value> = redis::cmd("PUBSUB")
            .arg(command)
            .arg(wake)
            .query(&mut conn)
            .unwrap();
        match reply.get(1) {
            Some(redis::Value::Int(n)) => *n,
            other => panic!("{command} reply {other:?}"),
        }
    };
    for (topology, global) in [("cluster", &global), ("sentinel", &via_sentinel)] {
        let with = |args: &[&str]| {
            let mut cmd = redlease();
            cmd.args(global.iter()).args(args);
            cmd
        };
        let (mut holder, _out) = start_until_ready(with(&[
            "elect",
            "everywhere",
            "--value",
            topology,
            "--",
            "sh",
            "-c",
            "echo ready; read line",
        ]));
        let shown = json(&output(with(&["leader", "everywhere", "--json"])));
        assert_eq!(
            (shown["leader"].as_bool(), shown["value"].as_str()),
            (Some(true), Some(topology)),
            "{topology}: {shown}"
        );
        let busy = output(with(&["elect", "everywhere", "--no-wait", "--", "true"]));
        assert_eq!(busy.code, 75, "{topology}: {busy:?}");
        // A waiting candidate takes over as soon as the holder's CMD exits.
        let waiting = with(&["elect", "everywhere", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        eventually(20, "the candidate waits for a wake-up", || {
            listeners(topology) == 1
        });
        let resigned = Instant::now();
        holder.stdin.take().unwrap().write_all(b"go\n").unwrap();
        assert_eq!(finish(holder, Instant::now()).code, 0, "{topology}");
        let out = finish(waiting, Instant::now());
        assert_eq!(out.code, 0, "{topology}: {out:?}");
        assert!(
            resigned.elapsed() < Duration::from_secs(10),
            "{topology}: the candidate waited for the lease: {:?}",
            resigned.elapsed()
        );
        let after = json(&output(with(&["leader", "everywhere", "--json"])));
        assert_eq!(after["leader"], false, "{topology}: {after}");
    }
}
