//! Drives the real `redlease` binary against real redis-server processes (one per test):
//! exit statuses, JSON shapes, tokens, signals, lease loss, and the issue's acceptance
//! test (6 processes × 25 runs of a read-modify-write on one file).

mod common;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis::Commands;
use redlease_testkit::free_port;
use serde_json::Value;

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).expect("send a signal");
}

/// A CMD that announces itself, reports the signals it gets, and exits on TERM (3) or
/// INT (4). The loop keeps it responsive: sh runs a trap once `sleep` returns.
const TRAPPING_CMD: &str = r#"trap 'echo got-TERM; exit 3' TERM
trap 'echo got-INT; exit 4' INT
echo ready
while :; do sleep 0.02; done"#;

#[test]
fn usage_errors_exit_2_name_the_fix_and_leave_nothing() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let m = marker.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "x", "--bogus", "--", "touch", m], "--bogus"),
        (&["run", "x", "--ttl", "5", "--", "touch", m], "--ttl"),
        (&["run", "x", "--ttl", "1ms", "--", "touch", m], "at least 10ms"),
        (&["run", "x", "--wait", "soon", "--", "touch", m], "--wait"),
        (
            &["run", "x", "--wait", "1s", "--no-wait", "--", "touch", m],
            "--no-wait",
        ),
        (&["run", "x", "--grace=-1s", "--", "touch", m], "--grace"),
        (
            &["run", "x", "--lost-signal", "NOPE", "--", "touch", m],
            "--lost-signal",
        ),
        (&["run", "", "--", "touch", m], "must not be empty"),
        (&["run", "x", "touch", m], "'--"),
        (&["run", "x", "--"], "<CMD>"),
        (&["run", "a}b", "--", "touch", m], "NAME"),
        (&["acquire", "x"], "--ttl"),
        (&["acquire", "x", "--ttl", "0s"], "--ttl"),
        (&["release", "x"], "--token"),
        (&["release", "x", "--token", ""], "--token"),
        (&["extend", "x", "--token", "t"], "--ttl"),
        (&["status"], "<NAME>"),
        (&["nonsense"], "nonsense"),
    ];
    for (args, needle) in cases {
        let out = output(at(&server, args));
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(needle),
            "{args:?} should mention {needle:?}: {out:?}"
        );
        assert!(!out.stderr.contains("panicked"), "{out:?}");
    }
    let out = output({
        let mut c = redlease();
        c.args(["--redis", "nope://x", "run", "x", "--", "touch", m]);
        c
    });
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--redis"), "{out:?}");
    assert!(!marker.exists(), "CMD must not run after a usage error");
    assert_eq!(all_keys(&server), Vec::<String>::new(), "nothing left behind");
}

/// A rejected value is echoed, but escaped and shortened: a name refused for its control
/// characters does not rewrite the terminal, and a 10 KB name does not fill it. Nothing
/// is written.
#[test]
fn rejected_values_are_echoed_escaped_and_shortened() {
    let server = server();
    let long = "n".repeat(10 * 1024);
    let long_prefix = format!("{long}:");
    let cases: &[(&[&str], &str)] = &[
        (&["status", "\x1b[31mred\r"], r"'\u{1b}[31mred\r'"),
        (&["run", "a\nb", "--", "true"], r"'a\nb'"),
        (&["acquire", &long, "--ttl", "5s"], "…(10240 bytes)"),
        (&["status", "--name", "-\x07bell"], r"'-\u{7}bell'"),
        (&["--prefix", "p\r:", "status", "x"], r"'p\r:'"),
        (&["--prefix", &long_prefix, "status", "x"], "…(10241 bytes)"),
        (&["status", "x", "--\x1b[2Jbogus"], r"'--\u{1b}[2Jbogus'"),
        (
            &["run", "x", "--wait", "\x1b[31m5s", "--", "true"],
            r"'\u{1b}[31m5s'",
        ),
        (&["\x1b]0;title\x07"], r"'\u{1b}]0;title\u{7}'"),
    ];
    for (args, shown) in cases {
        let out = output(at(&server, args));
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(shown),
            "{args:?} should show {shown:?}: {out:?}"
        );
        assert!(
            !out.stderr.contains(['\x1b', '\r', '\x07']),
            "a control character reached the terminal: {out:?}"
        );
        assert!(
            out.stderr.len() < 1200,
            "{args:?}: {} bytes of error",
            out.stderr.len()
        );
        assert!(!out.stderr.contains("panicked"), "{out:?}");
    }
    assert_eq!(all_keys(&server), Vec::<String>::new(), "nothing written");
}

/// Every command that takes a NAME also takes it as `--name NAME`, so a name that starts
/// with `-` can be locked, run under, inspected, extended and released.
#[test]
fn a_name_starting_with_a_dash_is_addressable_by_every_command() {
    let server = server();
    // Given as a NAME, it reads as an unknown option; the tip is --name (after '--'
    // comes CMD).
    for args in [&["run", "-dash", "--", "true"][..], &["status", "-dash"]] {
        let out = output(at(&server, args));
        assert_eq!(out.code, 2, "{out:?}");
        assert!(out.stderr.contains("use '--name=-dash'"), "{out:?}");
    }
    let mut redis = conn(&server);
    let acquired = json(&output(at(
        &server,
        &["acquire", "--name", "-dash", "--ttl", "30s", "--json"],
    )));
    assert_eq!(acquired["name"], "-dash");
    assert_eq!(acquired["key"], "redlease:-dash");
    let token = acquired["token"].as_str().unwrap().to_owned();
    assert!(redis.exists::<_, bool>("redlease:-dash").unwrap());
    let status = json(&output(at(&server, &["status", "--name=-dash", "--json"])));
    assert_eq!(
        (status["name"].as_str(), status["held"].as_bool()),
        (Some("-dash"), Some(true))
    );
    let out = output(at(
        &server,
        &["extend", "--name", "-dash", "--token", &token, "--ttl", "1m"],
    ));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(redis.pttl::<_, i64>("redlease:-dash").unwrap() > 30_000);
    let out = output(at(&server, &["release", "--name", "-dash", "--token", &token]));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!redis.exists::<_, bool>("redlease:-dash").unwrap());

    let env = "echo $REDLEASE_NAME $REDLEASE_KEY";
    for args in [
        &["run", "--name", "-dash", "--", "sh", "-c", env][..],
        &["run", "--name", "-dash", "--fair", "--", "sh", "-c", env],
        &[
            "semaphore",
            "run",
            "--name",
            "-dash",
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            env,
        ],
        &[
            "rwlock", "run", "--name", "-dash", "--write", "--", "sh", "-c", env,
        ],
        &["elect", "--name", "-dash", "--", "sh", "-c", env],
    ] {
        let out = output(at(&server, args));
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        assert_eq!(out.stdout.trim(), "-dash redlease:-dash", "{args:?}");
    }
    for (args, field) in [
        (&["rwlock", "status", "--name", "-dash", "--json"][..], "name"),
        (&["semaphore", "status", "--name", "-dash", "--json"], "name"),
        (&["leader", "--name", "-dash", "--json"], "name"),
        (&["status", "--fair", "--name", "-dash", "--json"], "name"),
    ] {
        let out = json(&output(at(&server, args)));
        assert_eq!(out[field], "-dash", "{args:?}: {out}");
    }
    // `run` holds several names: positional ones first, then each --name.
    let out = output(at(
        &server,
        &[
            "run",
            "plain",
            "--name",
            "-dash",
            "--name=-two",
            "--",
            "sh",
            "-c",
            "echo $REDLEASE_NAME",
        ],
    ));
    assert_eq!((out.code, out.stdout.trim()), (0, "plain+-dash+-two"), "{out:?}");
    // The name once, not both ways; and a positional name still works.
    let out = output(at(&server, &["status", "x", "--name", "y"]));
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--name"), "{out:?}");
    assert_eq!(
        json(&output(at(&server, &["status", "x", "--json"])))["name"],
        "x"
    );
}

/// Negative durations, for every flag that takes one, are refused as negative (not as
/// an unknown option `-1`); 0 is not a reply timeout.
#[test]
fn negative_durations_and_a_zero_response_timeout_are_refused_clearly() {
    let server = server();
    let cases: &[&[&str]] = &[
        &["run", "x", "--wait", "-1s", "--", "true"],
        &["run", "x", "--ttl", "-30s", "--", "true"],
        &["run", "x", "--grace", "-1s", "--", "true"],
        &["acquire", "x", "--ttl", "-5s"],
        &["extend", "x", "--token", "t", "--ttl", "-5s"],
        &["demo", "--duration", "-2s"],
        &["--response-timeout", "-1s", "status", "x"],
        &["--wait-replicas", "1", "--replica-timeout", "-.5s", "status", "x"],
    ];
    for args in cases {
        let out = output(at(&server, args));
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        // The flag whose value is negative.
        let negative = args.iter().position(|a| {
            a.starts_with("-.")
                || a.starts_with("-1")
                || a.starts_with("-3")
                || a.starts_with("-5")
                || a.starts_with("-2")
        });
        let flag = args[negative.expect("a negative value") - 1];
        assert!(
            out.stderr.contains("durations cannot be negative")
                && out.stderr.contains(&format!("'{flag} <DUR>'")),
            "{args:?}: {out:?}"
        );
        assert!(!out.stderr.contains("unexpected argument"), "{out:?}");
    }
    let out = output(at(&server, &["--response-timeout", "0", "status", "x"]));
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--response-timeout") && out.stderr.contains("at least 1ms"),
        "{out:?}"
    );
    let help = output({
        let mut c = redlease();
        c.arg("--help");
        c
    });
    assert!(
        help.stdout.contains("0 is refused"),
        "--help documents it: {help:?}"
    );
    assert_eq!(all_keys(&server), Vec::<String>::new(), "nothing written");
}

/// A duration longer than an instant can hold (300000000000years) and one longer than a
/// `Duration` can (584942417355years).
const TOO_LONG: [&str; 2] = ["300000000000years", "584942417355years"];

/// Absurd durations are usage errors that name the flag and its allowed range: none
/// panics (status 101), runs CMD or leaves anything behind.
#[test]
fn absurd_durations_exit_2_naming_the_flag_and_its_range() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let m = marker.to_str().unwrap();
    for long in TOO_LONG {
        let cases: &[(&[&str], &str, &str)] = &[
            (
                &["run", "x", "--ttl", long, "--", "touch", m],
                "--ttl",
                "10ms to 30 days",
            ),
            (
                &["run", "x", "--grace", long, "--", "touch", m],
                "--grace",
                "0s to 30 days",
            ),
            (
                &["run", "x", "--legacy", "--grace", long, "--", "touch", m],
                "--grace",
                "0s to 30 days",
            ),
            (
                &[
                    "semaphore",
                    "run",
                    "x",
                    "--permits",
                    "2",
                    "--ttl",
                    long,
                    "--",
                    "touch",
                    m,
                ],
                "--ttl",
                "10ms to 30 days",
            ),
            (
                &["rwlock", "run", "x", "--write", "--grace", long, "--", "touch", m],
                "--grace",
                "0s to 30 days",
            ),
            (&["acquire", "x", "--ttl", long], "--ttl", "10ms to 30 days"),
            (
                &["extend", "x", "--token", "t", "--ttl", long],
                "--ttl",
                "10ms to 30 days",
            ),
            (&["demo", "--duration", long], "--duration", "0s to 30 days"),
            (
                &["--response-timeout", long, "status", "x"],
                "--response-timeout",
                "1ms to 30 days",
            ),
            (
                &["run", "x", "--response-timeout", long, "--", "touch", m],
                "--response-timeout",
                "1ms to 30 days",
            ),
            (
                &[
                    "--wait-replicas",
                    "1",
                    "--replica-timeout",
                    long,
                    "run",
                    "x",
                    "--",
                    "touch",
                    m,
                ],
                "--replica-timeout",
                "1ms to 15 days",
            ),
        ];
        for (args, flag, range) in cases {
            let out = output(at(&server, args));
            assert_eq!(out.code, 2, "{args:?}: {out:?}");
            assert!(out.stderr.contains(flag), "{args:?} should name {flag}: {out:?}");
            assert!(
                out.stderr.contains(range),
                "{args:?} should give the range: {out:?}"
            );
            assert!(!out.stderr.contains("panicked"), "{out:?}");
        }
    }
    // Within the flag's range but not the lock's: refused by the library, still status 2
    // with the flag named.
    for timeout in ["0s", "20s", "5s"] {
        let args = [
            "--wait-replicas",
            "1",
            "--replica-timeout",
            timeout,
            "run",
            "x",
            "--",
            "touch",
            m,
        ];
        let out = output(at(&server, &args));
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert!(out.stderr.contains("--replica-timeout"), "{args:?}: {out:?}");
    }
    assert!(!marker.exists(), "CMD must not run after a usage error");
    assert_eq!(all_keys(&server), Vec::<String>::new(), "nothing left behind");
}

/// A --wait too long to represent waits without limit, as documented in --help: a free
/// lock is taken at once, and a held one is waited for until it is released.
#[test]
fn a_wait_too_long_to_represent_waits_without_limit() {
    let help = output({
        let mut c = redlease();
        c.args(["run", "--help"]);
        c
    });
    assert!(help.stdout.contains("too long to represent"), "{help:?}");
    assert!(help.stdout.contains("without limit"), "{help:?}");
    let server = server();
    let long_ones = [TOO_LONG[0], TOO_LONG[1], "99999999999999999999999s"];
    for long in long_ones {
        let out = output(at(&server, &["run", "free", "--wait", long, "--", "true"]));
        assert_eq!(out.code, 0, "{long}: {out:?}");
        let out = output(at(&server, &["acquire", "taken", "--ttl", "1m", "--wait", long]));
        assert_eq!(out.code, 0, "{long}: {out:?}");
        let token = out
            .stdout
            .lines()
            .next()
            .unwrap()
            .strip_prefix("REDLEASE_TOKEN=")
            .unwrap();
        let out = output(at(&server, &["release", "taken", "--token", token]));
        assert_eq!(out.code, 0, "{out:?}");
    }

    let held = json(&output(at(
        &server,
        &["acquire", "busy", "--ttl", "1m", "--json"],
    )));
    let started = Instant::now();
    let waiters: Vec<Child> = long_ones
        .iter()
        .map(|long| {
            at(&server, &["run", "busy", "--wait", long, "--", "echo", "ran"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    eventually(20, "every run is waiting", || {
        json(&output(at(&server, &["status", "busy", "--json"])))["waiters"] == 3
    });
    let token = held["token"].as_str().unwrap();
    assert_eq!(
        output(at(&server, &["release", "busy", "--token", token])).code,
        0
    );
    for waiter in waiters {
        let out = finish(waiter, started);
        assert_eq!(out.code, 0, "{out:?}");
        assert_eq!(out.stdout, "ran\n", "{out:?}");
    }
    assert!(!conn(&server).exists::<_, bool>("redlease:busy").unwrap());
}

/// A short --wait is about the lock, never a Redis failure: `--wait 0s` is one attempt
/// (like --no-wait), and a --wait that runs out while Redis has not answered yet exits
/// 75 (not acquired within --wait), not 69.
#[test]
fn short_waits_exit_0_or_75_never_69() {
    let server = server();
    for i in 0..5 {
        let out = output(at(
            &server,
            &["run", &format!("free{i}"), "--wait", "0s", "--", "true"],
        ));
        assert_eq!(out.code, 0, "a free lock is taken with --wait 0s: {out:?}");
    }
    let held = output(at(&server, &["acquire", "held", "--ttl", "1m"]));
    assert_eq!(held.code, 0, "{held:?}");
    let out = output(at(&server, &["run", "held", "--wait", "0s", "--", "true"]));
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("--wait"), "{out:?}");

    // Writes (the acquire script) wait while clients are paused: --wait runs out first.
    let pause = Duration::from_secs(2);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis() as u64)
        .arg("WRITE")
        .query(&mut conn(&server))
        .unwrap();
    let paused = Instant::now();
    let out = output(at(&server, &["run", "slow", "--wait", "200ms", "--", "true"]));
    if out.code == 0 {
        // Only if redlease was so slow to start that the pause was over.
        assert!(paused.elapsed() >= pause, "{out:?}");
    } else {
        assert_eq!(out.code, 75, "{out:?}");
        assert!(out.stderr.contains("within 200ms (--wait)"), "{out:?}");
    }
}

#[test]
fn unreachable_redis_exits_69_and_hides_the_password() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let url = format!("redis://:hunter2@127.0.0.1:{port}");
    let runs: &[&[&str]] = &[
        &["run", "x", "--", "touch", marker.to_str().unwrap()],
        &["acquire", "x", "--ttl", "10s"],
        &["status", "x", "--json"],
        &["release", "x", "--token", "abc"],
        &["extend", "x", "--token", "abc", "--ttl", "1m"],
    ];
    for args in runs {
        let out = output({
            let mut c = redlease();
            c.arg("--redis").arg(&url).args(*args);
            c
        });
        assert_eq!(out.code, 69, "{args:?}: {out:?}");
        assert!(out.stderr.starts_with("error: "), "{out:?}");
        assert!(out.stderr.contains("--redis"), "the hint names the flag: {out:?}");
        assert!(!out.stderr.contains("hunter2"), "password leaked: {out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
    // The environment variable is honoured too.
    let out = output({
        let mut c = redlease();
        c.env("REDIS_URL", &url).args(["status", "x"]);
        c
    });
    assert_eq!(out.code, 69, "{out:?}");
    assert!(!marker.exists(), "CMD must not run without the lock");
}

#[test]
fn run_passes_the_exit_status_and_environment_through_and_releases() {
    let server = server();
    let out = output(at(
        &server,
        &[
            "run",
            "job",
            "--",
            "sh",
            "-c",
            r#"echo "$REDLEASE_NAME $REDLEASE_KEY $REDLEASE_FENCE"; exit 7"#,
        ],
    ));
    assert_eq!(out.code, 7, "{out:?}");
    let fields: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(fields[..2], ["job", "redlease:job"], "{out:?}");
    let fence: u64 = fields[2].parse().expect("REDLEASE_FENCE is a decimal number");
    assert!(
        !conn(&server).exists::<_, bool>("redlease:job").unwrap(),
        "released"
    );

    let status = json(&output(at(&server, &["status", "job", "--json"])));
    assert_eq!(status["held"], false);
    assert_mark(&status["last_fence"], fence); // the fence CMD saw is the lock's

    let ok = output(at(&server, &["run", "job", "--", "true"]));
    assert_eq!(ok.code, 0, "{ok:?}");
    for (cmd, code) in [
        ("kill -USR1 $$", 128 + 10),
        ("kill -KILL $$", 128 + 9),
        ("exit 200", 200),
    ] {
        let out = output(at(&server, &["run", "job", "--", "sh", "-c", cmd]));
        assert_eq!(out.code, code, "{cmd}: {out:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("not-executable");
    std::fs::write(&not_executable, "echo hi\n").unwrap();
    let not_executable = not_executable.to_str().unwrap();
    for (program, code) in [("/nonexistent/cmd", 127), (not_executable, 126)] {
        let out = output(at(&server, &["run", "job", "--", program]));
        assert_eq!(out.code, code, "{program}: {out:?}");
        assert!(out.stderr.contains(program), "{out:?}");
    }
    assert_eq!(
        lock_keys(&server),
        Vec::<String>::new(),
        "nothing of the lock is left"
    );
    // Every key left expires (-1: no TTL). The fencing counter lives 100 ms, so it may
    // be gone (-2) by the time it is looked at.
    for key in all_keys(&server) {
        let pttl: i64 = conn(&server).pttl(&key).unwrap();
        assert!(pttl > 0 || pttl == -2, "{key} expires: PTTL {pttl}");
    }
}

#[test]
fn a_held_lock_exits_75_without_running_cmd() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let m = marker.to_str().unwrap();
    let held = json(&output(at(
        &server,
        &["acquire", "busy", "--ttl", "30s", "--json"],
    )));
    let token = held["token"].as_str().unwrap().to_owned();

    let out = output(at(&server, &["run", "busy", "--no-wait", "--", "touch", m]));
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stderr.contains("--wait"), "the hint names the flag: {out:?}");
    assert!(
        out.took < Duration::from_secs(5),
        "--no-wait does not wait: {out:?}"
    );

    let out = output(at(&server, &["run", "busy", "--wait", "300ms", "--", "touch", m]));
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.took >= Duration::from_millis(300), "waited --wait: {out:?}");

    let out = output(at(&server, &["acquire", "busy", "--ttl", "5s", "--no-wait"]));
    assert_eq!(out.code, 75, "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");

    assert!(!marker.exists(), "CMD must not run without the lock");
    let value: String = conn(&server).get("redlease:busy").unwrap();
    assert_eq!(value, token, "the holder keeps the lock");
}

#[test]
fn acquire_extend_release_and_status_round_trip() {
    let server = server();
    let mut redis = conn(&server);
    let acquired = json(&output(at(
        &server,
        &["acquire", "deploy", "--ttl", "30s", "--json"],
    )));
    assert_eq!(acquired["name"], "deploy");
    assert_eq!(acquired["key"], "redlease:deploy");
    assert_eq!(acquired["ttl_ms"], 30_000);
    let token = acquired["token"].as_str().expect("token is a string").to_owned();
    let fence = acquired["fence"].as_u64().expect("fence is a number");
    let (random, owner) = token.split_at(32);
    assert!(
        random.bytes().all(|b| b.is_ascii_hexdigit()),
        "128-bit hex token: {token}"
    );
    assert!(
        owner.starts_with('@') && owner.len() > 1,
        "then the owner label: {token}"
    );
    let value: String = redis.get("redlease:deploy").unwrap();
    assert_eq!(value, token, "the key holds the printed token");
    let pttl: i64 = redis.pttl("redlease:deploy").unwrap();
    assert!((1..=30_000).contains(&pttl), "PX ttl set: {pttl}");

    // Status shows the holder but never the token, in either format.
    let plain = output(at(&server, &["status", "deploy"]));
    let out = output(at(&server, &["status", "deploy", "--json"]));
    for o in [&plain, &out] {
        assert_eq!(o.code, 0, "{o:?}");
        assert!(
            !o.stdout.contains(&token) && !o.stderr.contains(&token),
            "token shown: {o:?}"
        );
    }
    let status = json(&out);
    assert_eq!(status["held"], true);
    // The plain mutex records no holder's fence; the slot's mark stands for it.
    assert_eq!(status["fence"], Value::Null);
    assert_mark(&status["last_fence"], fence);
    assert_eq!(status["waiters"], 0);
    assert!(
        status["owner"].as_str().is_some_and(|o| !o.is_empty()),
        "{status}"
    );
    let ttl_ms = status["ttl_ms"].as_u64().expect("ttl_ms is a number");
    assert!((1..=30_000).contains(&ttl_ms), "{status}");
    assert!(plain.stdout.contains("held:       yes"), "{plain:?}");

    // A wrong token changes nothing.
    for args in [
        &["release", "deploy", "--token", "not-the-token"][..],
        &["extend", "deploy", "--token", "not-the-token", "--ttl", "10m"],
    ] {
        let out = output(at(&server, args));
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert!(out.stderr.contains("not held"), "{out:?}");
        assert!(out.stderr.contains("--token"), "the hint names the flag: {out:?}");
        let value: String = redis.get("redlease:deploy").unwrap();
        assert_eq!(value, token, "{args:?} left the lock alone");
        assert!(redis.pttl::<_, i64>("redlease:deploy").unwrap() <= 30_000);
    }

    // The right token extends and releases; the token may come from the environment.
    let out = output(at(
        &server,
        &["extend", "deploy", "--token", &token, "--ttl", "10m"],
    ));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(redis.pttl::<_, i64>("redlease:deploy").unwrap() > 500_000);
    let out = output({
        let mut c = at(&server, &["release", "deploy"]);
        c.env("REDLEASE_TOKEN", &token);
        c
    });
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!redis.exists::<_, bool>("redlease:deploy").unwrap());
    let out = output(at(&server, &["release", "deploy", "--token", &token]));
    assert_eq!(out.code, 1, "a second release finds it gone: {out:?}");

    let status = json(&output(at(&server, &["status", "deploy", "--json"])));
    assert_eq!(status["held"], false);
    assert_eq!(status["owner"], Value::Null);
    assert_eq!(status["ttl_ms"], Value::Null);
    assert_mark(&status["last_fence"], fence);
}

/// `extend` makes the lease last at least --ttl from now and never shortens it, as its
/// --help says.
#[test]
fn extend_never_shortens_the_lease_and_says_so() {
    let help = output({
        let mut c = redlease();
        c.args(["extend", "--help"]);
        c
    });
    assert_eq!(help.code, 0, "{help:?}");
    assert!(help.stdout.contains("at least --ttl from now"), "{help:?}");
    assert!(help.stdout.contains("never shortened"), "{help:?}");

    let server = server();
    let mut redis = conn(&server);
    let acquired = json(&output(at(
        &server,
        &["acquire", "job", "--ttl", "10m", "--json"],
    )));
    let token = acquired["token"].as_str().unwrap();
    let out = output(at(&server, &["extend", "job", "--token", token, "--ttl", "1s"]));
    assert_eq!(out.code, 0, "{out:?}");
    let pttl: i64 = redis.pttl("redlease:job").unwrap();
    assert!(pttl > 500_000, "a 1s extend left the 10m lease alone: {pttl}");
    let out = output(at(&server, &["extend", "job", "--token", token, "--ttl", "1h"]));
    assert_eq!(out.code, 0, "{out:?}");
    let pttl: i64 = redis.pttl("redlease:job").unwrap();
    assert!(pttl > 3_000_000, "a 1h extend lengthened it: {pttl}");
}

#[test]
fn acquire_prints_eval_ready_lines_and_honours_an_empty_prefix() {
    let server = server();
    let out = output(at(
        &server,
        &["--prefix", "", "acquire", "lock.foo", "--ttl", "1m"],
    ));
    assert_eq!(out.code, 0, "{out:?}");
    let vars: std::collections::HashMap<&str, &str> = out
        .stdout
        .lines()
        .map(|l| l.split_once('=').expect("NAME=value lines"))
        .collect();
    assert_eq!(vars.len(), 3, "{out:?}");
    assert_eq!(vars["REDLEASE_TTL_MS"], "60000");
    assert!(vars["REDLEASE_FENCE"].parse::<u64>().is_ok(), "{out:?}");
    let value: String = conn(&server).get("lock.foo").unwrap();
    assert_eq!(value, vars["REDLEASE_TOKEN"], "the key is exactly the name");
}

#[test]
fn a_waiting_run_is_counted_and_woken_by_release() {
    let server = server();
    let held = json(&output(at(
        &server,
        &["acquire", "queue", "--ttl", "30s", "--json"],
    )));
    let token = held["token"].as_str().unwrap().to_owned();
    let started = Instant::now();
    let waiter = at(&server, &["run", "queue", "--wait", "20s", "--", "echo", "ran"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "status counts the waiter", || {
        json(&output(at(&server, &["status", "queue", "--json"])))["waiters"] == 1
    });
    let release = output(at(&server, &["release", "queue", "--token", &token]));
    assert_eq!(release.code, 0, "{release:?}");
    let released_at = Instant::now();
    let out = finish(waiter, started);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "ran\n");
    // Woken by the release, not by the 30 s lease running out.
    assert!(released_at.elapsed() < Duration::from_secs(10), "{out:?}");
    assert!(!conn(&server).exists::<_, bool>("redlease:queue").unwrap());
}

#[test]
fn signals_reach_cmd_once_and_the_lock_is_released() {
    let server = server();
    for (sig, code, line) in [
        (Signal::SIGTERM, 3, "got-TERM"),
        (Signal::SIGINT, 4, "got-INT"),
        (Signal::SIGHUP, 128 + 1, ""),
    ] {
        let started = Instant::now();
        let (child, mut stdout) =
            start_until_ready(at(&server, &["run", "sig", "--", "sh", "-c", TRAPPING_CMD]));
        assert!(
            conn(&server).exists::<_, bool>("redlease:sig").unwrap(),
            "held while CMD runs"
        );
        signal(&child, sig);
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let out = finish(child, started);
        assert_eq!(out.code, code, "{sig}: {out:?}");
        let expected: Vec<&str> = if line.is_empty() { vec![] } else { vec![line] };
        assert_eq!(
            rest.lines().collect::<Vec<_>>(),
            expected,
            "CMD got {sig} exactly once"
        );
        assert!(
            !conn(&server).exists::<_, bool>("redlease:sig").unwrap(),
            "released after {sig}"
        );
    }
}

/// Ctrl-C typed at a terminal: the terminal signals its foreground process group, CMD
/// included, so redlease must not pass the signal on a second time — unless CMD left the
/// process group (`setsid`), when only redlease's forwarding can reach it. Runs redlease
/// on a pseudo-terminal with util-linux `script`.
#[test]
fn ctrl_c_at_a_terminal_reaches_cmd_exactly_once() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: util-linux `script` is not installed");
        return;
    }
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let child = dir.path().join("child.sh");
    // Keeps running for ~0.5 s after the Ctrl-C and reports every SIGINT it gets.
    std::fs::write(
        &child,
        "trap 'echo got-INT' INT\necho ready\ni=0\nwhile [ $i -lt 25 ]; do sleep 0.02; i=$((i + 1)); done\necho done\n",
    )
    .unwrap();
    for wrapper in ["", "setsid "] {
        let line = format!(
            "exec '{BIN}' --redis {} run tty -- {wrapper}sh '{}'",
            server.url(),
            child.display()
        );
        let started = Instant::now();
        let mut cmd = Command::new("script");
        cmd.args(["-qfec", &line, "/dev/null"]).env_remove("REDIS_URL");
        let (mut term, mut stdout) = start_until_ready(cmd);
        let mut stdin = term.stdin.take().unwrap();
        stdin.write_all(b"\x03").unwrap(); // Ctrl-C
        stdin.flush().unwrap();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        drop(stdin);
        let out = finish(term, started);
        assert_eq!(out.code, 0, "{wrapper}: {rest} {out:?}");
        assert_eq!(
            rest.matches("got-INT").count(),
            1,
            "{wrapper}sh: CMD got SIGINT once: {rest:?}"
        );
        assert!(rest.contains("done"), "CMD kept running after its trap: {rest:?}");
        assert!(
            !conn(&server).exists::<_, bool>("redlease:tty").unwrap(),
            "released"
        );
    }
}

#[test]
fn a_signal_while_waiting_exits_128_plus_n_and_leaves_nothing() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let held = json(&output(at(
        &server,
        &["acquire", "wait", "--ttl", "30s", "--json"],
    )));
    let started = Instant::now();
    let waiter = at(&server, &["run", "wait", "--", "touch", marker.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(10, "the run is waiting", || {
        json(&output(at(&server, &["status", "wait", "--json"])))["waiters"] == 1
    });
    signal(&waiter, Signal::SIGTERM);
    let out = finish(waiter, started);
    assert_eq!(out.code, 128 + 15, "{out:?}");
    assert!(out.stderr.contains("SIGTERM"), "{out:?}");
    assert!(!marker.exists(), "CMD never ran");
    let value: String = conn(&server).get("redlease:wait").unwrap();
    assert_eq!(
        value,
        held["token"].as_str().unwrap(),
        "the holder keeps the lock"
    );
    assert_eq!(lock_keys(&server), ["redlease:wait"]);
}

#[test]
fn a_lost_lease_signals_cmd_and_exits_79() {
    let server = server();
    let mut redis = conn(&server);

    // CMD stops on SIGTERM: lease renewal (every 1s/3) finds the key gone.
    let started = Instant::now();
    let trap = "trap 'echo got-TERM; exit 0' TERM; echo ready; while :; do sleep 0.02; done";
    let (child, mut stdout) = start_until_ready(at(
        &server,
        &["run", "lease", "--ttl", "1s", "--", "sh", "-c", trap],
    ));
    let _: () = redis.del("redlease:lease").unwrap();
    let deleted = Instant::now();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = finish(child, started);
    assert_eq!(out.code, 79, "{out:?}");
    assert_eq!(rest, "got-TERM\n", "CMD got SIGTERM");
    assert!(out.stderr.contains("lost"), "{out:?}");
    assert!(
        deleted.elapsed() < Duration::from_secs(5),
        "noticed within a renewal interval: {out:?}"
    );

    // CMD ignores SIGTERM: SIGKILL after --grace; the lost-signal is configurable.
    let started = Instant::now();
    let ignore = "trap '' TERM; trap 'echo got-USR1' USR1; echo ready; while :; do sleep 0.02; done";
    let (child, mut stdout) = start_until_ready(at(
        &server,
        &[
            "run",
            "lease",
            "--ttl",
            "1s",
            "--lost-signal",
            "USR1",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            ignore,
        ],
    ));
    let _: () = redis.del("redlease:lease").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = finish(child, started);
    assert_eq!(out.code, 79, "{out:?}");
    assert_eq!(rest, "got-USR1\n", "CMD got --lost-signal");
    assert!(out.stderr.contains("SIGKILL"), "{out:?}");

    // A loss that renewal has not noticed yet is caught at release: CMD (a 30 s lease,
    // renewed every 10 s) exits right after the key was taken over.
    let started = Instant::now();
    let (mut child, _stdout) = start_until_ready(at(
        &server,
        &["run", "lease", "--", "sh", "-c", "echo ready; read line; exit 0"],
    ));
    let _: () = redis.set("redlease:lease", "someone-else").unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = finish(child, started);
    assert_eq!(out.code, 79, "{out:?}");
    assert!(out.stderr.contains("exited with status 0"), "{out:?}");
    let value: String = redis.get("redlease:lease").unwrap();
    assert_eq!(value, "someone-else", "the new holder's lock is untouched");
}

/// The issue's acceptance test: 6 processes × 25 `redlease run … --wait 60s`, each doing
/// a read-modify-write of one file, lose no increment, and the REDLEASE_FENCE values
/// they see rise strictly in order of entry.
#[test]
fn six_processes_lose_no_increment_and_fences_rise_in_order() {
    const PROCESSES: usize = 6;
    const ROUNDS: usize = 25;
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    let fences = dir.path().join("fences");
    std::fs::write(&counter, "0\n").unwrap();
    std::fs::write(&fences, "").unwrap();
    // Under the lock: read the counter, give another process a chance to interleave,
    // write it back + 1, and log the fencing token this entry saw.
    let critical = r#"n=$(cat "$1"); sleep 0.001; echo $((n + 1)) > "$1"; echo "$REDLEASE_FENCE" >> "$2""#;
    let worker = r#"bin=$1; url=$2; rounds=$3; critical=$4; counter=$5; fences=$6
i=0
while [ "$i" -lt "$rounds" ]; do
  "$bin" --redis "$url" run counter --wait 60s -- sh -c "$critical" sh "$counter" "$fences" || exit $?
  i=$((i + 1))
done"#;
    let started = Instant::now();
    let processes: Vec<Child> = (0..PROCESSES)
        .map(|_| {
            Command::new("sh")
                .arg("-c")
                .arg(worker)
                .arg("worker")
                .arg(BIN)
                .arg(server.url())
                .arg(ROUNDS.to_string())
                .arg(critical)
                .arg(&counter)
                .arg(&fences)
                .env_remove("REDIS_URL")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in processes {
        let out = finish(p, started);
        assert_eq!(out.code, 0, "a worker failed: {out:?}");
    }
    let took = started.elapsed();
    let total = PROCESSES * ROUNDS;
    let value: usize = read(&counter).trim().parse().unwrap();
    assert_eq!(value, total, "lost {} increments", total - value);
    let seen: Vec<u64> = read(&fences).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(seen.len(), total);
    for pair in seen.windows(2) {
        assert!(
            pair[0] < pair[1],
            "fences out of order: {} then {}",
            pair[0],
            pair[1]
        );
    }
    assert!(!conn(&server).exists::<_, bool>("redlease:counter").unwrap());
    eprintln!("{total} locked read-modify-writes by {PROCESSES} processes in {took:?}");
}

#[test]
fn demo_on_a_given_server_loses_nothing_and_cleans_up() {
    let server = server();
    let out = output(at(&server, &["demo", "--workers", "4", "--duration", "1s"]));
    assert_eq!(out.code, 0, "{out:?}");
    let lost = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("lost updates"))
        .unwrap_or_else(|| panic!("no summary: {out:?}"));
    assert_eq!(lost.split_whitespace().nth(2), Some("0"), "{out:?}");
    assert!(out.stdout.contains("fencing tokens   monotonic"), "{out:?}");
    let acquisitions: u64 = out
        .stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("acquisitions"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no acquisition count: {out:?}"));
    assert!(acquisitions > 10, "the workers took turns: {out:?}");
    let keys = lock_keys(&server);
    assert!(
        keys.iter().all(|k| k.ends_with("}:meta")),
        "only expiring metadata left: {keys:?}"
    );
}

#[test]
fn demo_without_redis_starts_and_stops_a_throwaway_server() {
    if std::net::TcpStream::connect(("127.0.0.1", 6379)).is_ok() {
        eprintln!("skipped: something answers at 127.0.0.1:6379, so the demo would use it");
        return;
    }
    let out = output({
        let mut c = redlease();
        c.args(["demo", "--workers", "3", "--duration", "1s"]);
        c
    });
    assert_eq!(out.code, 0, "{out:?}");
    let addr = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped the throwaway redis-server on "))
        .unwrap_or_else(|| panic!("no throwaway server: {out:?}"));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the throwaway server at {addr} was stopped"
    );
    let port = addr.rsplit(':').next().unwrap();
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("redlease-demo-"))
        .filter(|e| std::fs::read_to_string(e.path().join("redis.log")).is_ok_and(|log| log.contains(port)))
        .collect();
    assert!(dirs.is_empty(), "the server's directory was removed: {dirs:?}");

    // Without redis-server the demo says how to install it, or to pass --redis.
    let out = output({
        let mut c = redlease();
        c.args(["demo", "--duration", "1s"])
            .env("REDIS_SERVER_BIN", "/nonexistent/redis-server");
        c
    });
    assert_eq!(out.code, 69, "{out:?}");
    assert!(
        out.stderr.contains("apt-get install -y redis-server") && out.stderr.contains("--redis"),
        "{out:?}"
    );
}

#[test]
fn completions_man_page_help_and_version() {
    for shell in ["bash", "zsh", "fish"] {
        let out = output({
            let mut c = redlease();
            c.args(["completions", shell]);
            c
        });
        assert_eq!(out.code, 0, "{out:?}");
        assert!(
            out.stdout.contains("redlease") && out.stdout.contains("acquire"),
            "{shell}"
        );
    }
    // The man page, next to the completions: one on stdout, or one per command.
    let man = output({
        let mut c = redlease();
        c.arg("man");
        c
    });
    assert_eq!(man.code, 0, "{man:?}");
    assert!(
        man.stdout.starts_with(".ie") && man.stdout.contains(".TH redlease 1"),
        "{man:?}"
    );
    assert!(
        man.stdout.contains("Exit status:") && man.stdout.contains("redlease\\-run(1)"),
        "{man:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = output({
        let mut c = redlease();
        c.args(["man", "--dir"]).arg(dir.path());
        c
    });
    assert_eq!(out.code, 0, "{out:?}");
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for page in [
        "redlease.1",
        "redlease-run.1",
        "redlease-semaphore-run.1",
        "redlease-status.1",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} missing from {pages:?}");
    }
    let run = read(&dir.path().join("redlease-run.1"));
    assert!(
        run.contains(".TH redlease-run 1") && run.contains("lost\\-signal"),
        "{run}"
    );

    let help = output({
        let mut c = redlease();
        c.arg("--help");
        c
    });
    assert_eq!(help.code, 0);
    for needle in [
        "Exit status:",
        "75 ",
        "79 ",
        "69 ",
        "[default: redis://127.0.0.1:6379]",
        "[default: redlease:]",
    ] {
        assert!(help.stdout.contains(needle), "--help lacks {needle:?}");
    }
    let run_help = output({
        let mut c = redlease();
        c.args(["run", "--help"]);
        c
    });
    for needle in [
        "[default: 30s]",
        "[default: 10s]",
        "[default: TERM]",
        "REDLEASE_FENCE",
        "status 79",
    ] {
        assert!(run_help.stdout.contains(needle), "run --help lacks {needle:?}");
    }
    let version = output({
        let mut c = redlease();
        c.arg("--version");
        c
    });
    assert!(version.stdout.starts_with("redlease "), "{version:?}");
}

/// User-facing text — the README, docs/, rustdoc and every --help — names failures and
/// patterns in its own words: it never refers readers to "seed" articles they have
/// never seen. (The torture run's `--seed`, the seed of its random fault schedule, is
/// what the word means there.)
#[test]
fn user_facing_text_never_speaks_of_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut texts: Vec<(String, String)> = Vec::new();
    let mut add_file = |path: std::path::PathBuf, rustdoc_only: bool| {
        let text = std::fs::read_to_string(&path).unwrap();
        let text = if rustdoc_only {
            text.lines()
                .filter(|l| {
                    let l = l.trim_start();
                    l.starts_with("///") || l.starts_with("//!") || l.starts_with("#[doc")
                })
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            text
        };
        texts.push((path.display().to_string(), text));
    };
    add_file(root.join("README.md"), false);
    for dir in ["docs", "crates/redlease/src", "crates/redlease-cli/src"] {
        let mut stack = vec![root.join(dir)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                match path.extension().and_then(|e| e.to_str()) {
                    _ if path.is_dir() => stack.push(path),
                    Some("md") => add_file(path, false),
                    Some("rs") => add_file(path, true),
                    _ => {}
                }
            }
        }
    }
    let mut helps = vec![vec!["--help"]];
    for sub in [
        "run",
        "acquire",
        "release",
        "extend",
        "status",
        "elect",
        "leader",
        "demo",
        "completions",
    ] {
        helps.push(vec![sub, "--help"]);
    }
    for (family, sub) in [
        ("semaphore", "run"),
        ("semaphore", "status"),
        ("rwlock", "run"),
        ("rwlock", "status"),
    ] {
        helps.push(vec![family, sub, "--help"]);
    }
    for args in helps {
        let out = output({
            let mut c = redlease();
            c.args(&args);
            c
        });
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
        texts.push((format!("redlease {}", args.join(" ")), out.stdout));
    }
    assert!(texts.len() > 40, "read only {} texts", texts.len());
    for (what, text) in &texts {
        for (i, line) in text.lines().enumerate() {
            let lower = line.to_lowercase().replace("--seed", "");
            assert!(!lower.contains("seed"), "{what}, line {}: {line}", i + 1);
        }
    }
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// CMD never outlives its lock: when redlease is killed with SIGKILL (which it cannot
/// catch), CMD gets --lost-signal from the kernel at once — for every command that runs
/// a CMD — and the next holder gets a higher fencing token once the lease has lapsed.
#[test]
fn cmd_gets_lost_signal_when_redlease_is_killed_and_the_next_holder_is_fenced_higher() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    // CMD records its pid and fencing token, and the signal it gets.
    let script = r#"trap 'echo got-USR1 > "$0.sig"; exit 0' USR1
echo "$$ ${REDLEASE_FENCE:-none}" > "$0.tmp" && mv "$0.tmp" "$0"
while :; do sleep 0.05; done"#;
    let kinds: &[(&str, &[&str])] = &[
        ("mutex", &["run", "k-mutex"]),
        ("fair", &["run", "k-fair", "--fair"]),
        ("semaphore", &["semaphore", "run", "k-sem", "--permits", "1"]),
        ("writer", &["rwlock", "run", "k-rw", "--write"]),
        ("leader", &["elect", "k-elect"]),
    ];
    for (kind, args) in kinds {
        let record = dir.path().join(kind);
        let mut cmd = at(&server, args);
        cmd.args(["--ttl", "1s", "--lost-signal", "USR1", "--", "sh", "-c", script])
            .arg(&record)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut redlease = cmd.spawn().unwrap();
        eventually(10, &format!("{kind}: CMD started"), || record.exists());
        let line = read(&record);
        let (pid, fence) = line.trim().split_once(' ').unwrap();
        let pid: i32 = pid.parse().unwrap();

        signal(&redlease, Signal::SIGKILL);
        let killed = Instant::now();
        redlease.wait().unwrap();
        while !ended(pid) {
            if killed.elapsed() >= Duration::from_secs(1) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL); // leave no orphan behind
                panic!("{kind}: CMD (pid {pid}) still ran a second after redlease was killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let sig = record.with_extension("sig");
        eventually(1, &format!("{kind}: CMD's trap ran"), || sig.exists());
        assert_eq!(read(&sig).trim(), "got-USR1", "{kind}: CMD got --lost-signal");

        // The lease lapses within --ttl; the next holder gets in, fenced higher.
        let name = args.iter().find(|a| a.starts_with("k-")).unwrap();
        let next: Vec<&str> = match *kind {
            "semaphore" => vec!["semaphore", "run", name, "--permits", "1"],
            "writer" => vec!["rwlock", "run", name, "--write"],
            "leader" => vec!["elect", name],
            _ => vec!["run", name],
        };
        let mut next_cmd = at(&server, &next);
        next_cmd.args(["--wait", "5s", "--", "sh", "-c", "echo ${REDLEASE_FENCE:-none}"]);
        let out = output(next_cmd);
        assert_eq!(out.code, 0, "{kind}: the next holder got in: {out:?}");
        if *kind == "semaphore" {
            assert_eq!(
                (fence, out.stdout.trim()),
                ("none", "none"),
                "a semaphore has no fence"
            );
        } else {
            let (first, second): (u64, u64) = (fence.parse().unwrap(), out.stdout.trim().parse().unwrap());
            assert!(second > first, "{kind}: fence {second} after {first}");
        }
    }
}

/// `list` shows every held lock under the prefix — plain, another library's, a
/// semaphore's permits — as a table or JSON, filtered by a glob, never with a token.
#[test]
fn list_shows_every_held_lock_never_a_token() {
    let server = server();
    let mut redis = conn(&server);
    let deploy = json(&output(at(
        &server,
        &["acquire", "deploy", "--ttl", "30s", "--json"],
    )));
    let token = deploy["token"].as_str().unwrap().to_owned();
    let job = json(&output(at(
        &server,
        &["acquire", "job-1", "--ttl", "30s", "--json"],
    )));
    let _: () = redis::cmd("SET")
        .arg("redlease:theirs")
        .arg("d3b07384-d9a0-4c9b-8f1e-0a1b2c3d4e5f")
        .arg("PX")
        .arg(60_000)
        .query(&mut redis)
        .unwrap();
    let (sem, _stdout) = start_until_ready(at(
        &server,
        &[
            "semaphore",
            "run",
            "pool",
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ],
    ));

    let out = output(at(&server, &["list", "--json"]));
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        !out.stdout.contains(&token[..32]) && !out.stdout.contains("d3b07384"),
        "{out:?}"
    );
    let list = json(&out);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["deploy", "job-1", "pool", "theirs"], "{list}");
    let first = &list[0];
    assert_eq!(first["kind"], "mutex");
    assert_eq!(first["key"], "redlease:deploy");
    assert_eq!(first["held"], true);
    assert_eq!(first["owner"], deploy["owner"]);
    assert_eq!(first["fence"], Value::Null, "a plain mutex records no fence");
    assert_eq!(
        (first["waiters"].as_u64(), first["foreign"].as_bool()),
        (Some(0), Some(false))
    );
    assert!(
        first["ttl_ms"].as_u64().is_some_and(|t| t > 0 && t <= 30_000),
        "{first}"
    );
    assert_eq!(list[1]["owner"], job["owner"]);
    assert_eq!(
        (list[2]["kind"].as_str(), list[2]["holders"].as_u64()),
        (Some("semaphore"), Some(1))
    );
    assert_eq!(list[2]["owner"], Value::Null);
    assert_eq!(
        (list[3]["kind"].as_str(), list[3]["foreign"].as_bool()),
        (Some("mutex"), Some(true))
    );
    assert_eq!(list[3]["owner"], Value::Null);

    let jobs = json(&output(at(&server, &["list", "job-*", "--json"])));
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "{jobs}");
    assert_eq!(jobs[0]["name"], "job-1");

    let table = output(at(&server, &["list"]));
    assert_eq!(table.code, 0, "{table:?}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{table:?}");
    assert!(
        lines[0].starts_with("KIND") && lines[0].contains("WAITERS"),
        "{table:?}"
    );
    assert!(
        lines[1].starts_with("mutex") && lines[1].contains("deploy"),
        "{table:?}"
    );
    assert!(
        lines[4].contains("theirs") && lines[4].contains("(another library)"),
        "{table:?}"
    );
    let none = output(at(&server, &["list", "nothing*"]));
    assert_eq!(
        (none.code, none.stdout.as_str()),
        (0, "(no lock held)\n"),
        "{none:?}"
    );

    signal(&sem, Signal::SIGTERM);
    let out = finish(sem, Instant::now());
    assert_eq!(out.code, 128 + 15, "{out:?}");
}
