//! The binary beyond one plain Redis: `--cluster`, `--redlock`, `--sentinel/--master`,
//! `--tls-ca/--tls-cert/--tls-key` and `--wait-replicas`, against real servers.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use redis::Commands;
use redlease_testkit::{RedisCluster, RedisSentinel, RedisServer};

/// `redlease` with these global arguments, then `args`.
fn with(global: &[String], args: &[&str]) -> Command {
    let mut cmd = redlease();
    cmd.args(global).args(args);
    cmd
}

fn redis_args(urls: &[String]) -> Vec<String> {
    urls.iter()
        .flat_map(|u| ["--redis".to_owned(), u.clone()])
        .collect()
}

/// Starts a `run` whose CMD prints `ready` and holds until its stdin gets a line.
fn hold(mut cmd: Command) -> (Child, BufReader<ChildStdout>) {
    cmd.args(["--", "sh", "-c", "echo ready; read line"]);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "the holder did not start");
    (child, stdout)
}

fn let_go(mut child: Child) -> Out {
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    finish(child, Instant::now())
}

fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn(server))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn cluster_runs_on_names_on_different_masters_lose_no_update() {
    const PROCESSES: usize = 3;
    const ROUNDS: usize = 8;
    let cluster = RedisCluster::start(3, 0).unwrap_or_else(|e| panic!("{e}"));
    let global: Vec<String> = ["--cluster".to_owned()]
        .into_iter()
        .chain(redis_args(&cluster.urls()))
        .collect();
    let names: Vec<String> = (0..3)
        .map(|m| {
            cluster
                .key_on_master(m, |n| format!("redlease:job-{m}-{n}"))
                .unwrap()
                .trim_start_matches("redlease:")
                .to_owned()
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut children = Vec::new();
    for name in &names {
        let counter = dir.path().join(name);
        std::fs::write(&counter, "0\n").unwrap();
        for _ in 0..PROCESSES {
            let body = format!(
                r#"for i in $(seq {ROUNDS}); do
  "$0" "$@" run {name} --wait 60s -- sh -c 'n=$(cat "$0"); sleep 0.003; echo $((n + 1)) > "$0"' '{}' || exit $?
done"#,
                counter.display()
            );
            children.push(
                Command::new("sh")
                    .arg("-c")
                    .arg(body)
                    .arg(BIN)
                    .args(&global)
                    .env_remove("REDIS_URL")
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        }
    }
    for child in children {
        let out = finish(child, started);
        assert_eq!(out.code, 0, "a worker failed: {out:?}");
    }
    for name in &names {
        let value: usize = read(&dir.path().join(name)).trim().parse().unwrap();
        assert_eq!(value, PROCESSES * ROUNDS, "lost updates on {name}");
    }
    // Releases woke waiters through sharded pub/sub on each lock's own master.
    for m in 0..3 {
        let master = cluster.master(m);
        assert!(command_calls(master, "spublish") > 0, "no SPUBLISH on master {m}");
        assert_eq!(
            command_calls(master, "publish"),
            0,
            "a plain PUBLISH on master {m}"
        );
    }
    eprintln!(
        "{} locked increments on 3 masters in {:?}",
        3 * PROCESSES * ROUNDS,
        started.elapsed()
    );
}

#[test]
fn redlock_works_with_one_master_down_and_refuses_with_two_down() {
    let mut masters: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let global: Vec<String> = ["--redlock".to_owned()]
        .into_iter()
        .chain(redis_args(&urls))
        .collect();
    // All up: held, and a second holder is refused while it is.
    let (holder, _stdout) = hold(with(&global, &["run", "nightly"]));
    for m in &masters {
        assert!(conn(m).exists::<_, bool>("redlease:nightly").unwrap());
    }
    let refused = output(with(&global, &["run", "nightly", "--no-wait", "--", "true"]));
    assert_eq!(refused.code, 75, "{refused:?}");
    let out = let_go(holder);
    assert_eq!(out.code, 0, "{out:?}");
    for m in &masters {
        assert!(
            !conn(m).exists::<_, bool>("redlease:nightly").unwrap(),
            "released everywhere"
        );
    }
    // One down: still works.
    masters[0].stop();
    let one_down = output(with(
        &global,
        &[
            "run",
            "nightly",
            "--wait",
            "10s",
            "--",
            "sh",
            "-c",
            "test -z \"$REDLEASE_FENCE\"",
        ],
    ));
    assert_eq!(one_down.code, 0, "{one_down:?}");
    // Two down: a quick, clear refusal, and nothing left on the survivor.
    masters[1].stop();
    let two_down = output(with(
        &global,
        &[
            "run",
            "nightly",
            "--wait",
            "10s",
            "--",
            "touch",
            "/nonexistent/ran",
        ],
    ));
    assert_eq!(two_down.code, 69, "{two_down:?}");
    assert!(two_down.took < Duration::from_secs(8), "took {:?}", two_down.took);
    assert!(two_down.stderr.contains("masters"), "{two_down:?}");
    assert!(!conn(&masters[2]).exists::<_, bool>("redlease:nightly").unwrap());
    // Subcommands that act on one server's keys are refused up front.
    let usage = output(with(&global, &["status", "nightly"]));
    assert_eq!(usage.code, 2, "{usage:?}");
    let too_few = output(with(
        &["--redlock".into(), "--redis".into(), urls[2].clone()],
        &["run", "x", "--", "true"],
    ));
    assert_eq!(too_few.code, 2, "{too_few:?}");
}

#[test]
fn tls_with_a_ca_file_and_mutual_tls_work_and_failures_are_clear() {
    let server = RedisServer::builder()
        .tls(true)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let files = server.tls().unwrap().clone();
    let ca = files.ca_cert.display().to_string();
    let base = vec![
        "--redis".to_owned(),
        server.url(),
        "--tls-ca".to_owned(),
        ca.clone(),
    ];
    // tls-auth-clients yes: no certificate, no entry.
    let refused = output(with(&base, &["run", "x", "--", "true"]));
    assert_eq!(refused.code, 69, "{refused:?}");
    assert!(refused.stderr.contains("Certificate"), "{refused:?}");
    let mut mutual = base.clone();
    mutual.extend([
        "--tls-cert".to_owned(),
        files.client_cert.display().to_string(),
        "--tls-key".to_owned(),
        files.client_key.display().to_string(),
    ]);
    let ok = output(with(
        &mutual,
        &["run", "x", "--", "sh", "-c", "test -n \"$REDLEASE_FENCE\""],
    ));
    assert_eq!(ok.code, 0, "{ok:?}");
    let status = json(&output(with(&mutual, &["status", "x", "--json"])));
    assert_eq!(status["held"], false, "{status}");
    // Plain TCP to the TLS port fails clearly.
    let plain = format!("redis://127.0.0.1:{}", server.port());
    let wrong = output(with(&["--redis".to_owned(), plain], &["run", "x", "--", "true"]));
    assert_eq!(wrong.code, 69, "{wrong:?}");
    assert!(wrong.stderr.contains("rediss://"), "{wrong:?}");
    // A certificate without its key is a usage error.
    let half = output(with(
        &[
            "--redis".to_owned(),
            server.url(),
            "--tls-cert".to_owned(),
            files.client_cert.display().to_string(),
        ],
        &["run", "x", "--", "true"],
    ));
    assert_eq!(half.code, 2, "{half:?}");
}

/// A refused certificate is named as such, with how to make one that works — never
/// with the hint that Redis may be down. Following the hint for an X.509 v1 client
/// certificate (what `openssl x509 -req` makes without `-extfile`) makes one that works.
#[test]
fn certificate_problems_are_named_with_how_to_fix_them() {
    let server = RedisServer::builder()
        .tls(true)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let files = server.tls().unwrap().clone();
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (key, csr, v1) = (at("client.key"), at("client.csr"), at("client-v1.crt"));
    let (ca, ca_key) = (
        files.ca_cert.display().to_string(),
        files.ca_key.display().to_string(),
    );
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=v1-client",
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-set_serial",
        "9",
        "-days",
        "2",
        "-out",
        &v1,
    ]);
    let tls = |cert: Option<&str>, ca: &str| {
        let mut args = vec![
            "--redis".to_owned(),
            server.url(),
            "--tls-ca".to_owned(),
            ca.to_owned(),
        ];
        if let Some(cert) = cert {
            args.extend([
                "--tls-cert".to_owned(),
                cert.to_owned(),
                "--tls-key".to_owned(),
                key.clone(),
            ]);
        }
        output(with(&args, &["status", "x"]))
    };
    let v1_out = tls(Some(&v1), &ca);
    let no_cert = tls(None, &ca);
    let wrong_ca = tls(Some(&v1), &files.client_cert.display().to_string());
    for (out, needles) in [
        (
            &v1_out,
            &[
                "the client certificate is an X.509 v1 certificate",
                "-extfile v3.ext",
            ][..],
        ),
        (
            &no_cert,
            &[
                "requires one and none was given",
                "--tls-cert FILE --tls-key FILE",
            ],
        ),
        (&wrong_ca, &["X.509 v1"]),
    ] {
        assert_eq!(out.code, 69, "{out:?}");
        assert!(out.stderr.contains("TLS with redis at 127.0.0.1"), "{out:?}");
        for needle in needles {
            assert!(out.stderr.contains(needle), "{needle:?}: {out:?}");
        }
        assert!(!out.stderr.contains("is Redis running"), "{out:?}");
    }
    // Do what the hint says, in a shell.
    let recipe: Vec<String> = v1_out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .map(|l| {
            l.replace("CERT.csr", &csr)
                .replace("CERT.crt", &at("client-v3.crt"))
                .replace("ca.crt", &ca)
                .replace("ca.key", &ca_key)
        })
        .collect();
    assert_eq!(recipe.len(), 2, "a printf and an openssl line: {v1_out:?}");
    let made = Command::new("sh")
        .arg("-c")
        .arg(recipe.join("\n"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let v3_out = tls(Some(&at("client-v3.crt")), &ca);
    assert_eq!(v3_out.code, 0, "the certificate the hint makes works: {v3_out:?}");
    // With the v3 certificate, a wrong CA is named.
    let untrusted = tls(
        Some(&at("client-v3.crt")),
        &files.client_cert.display().to_string(),
    );
    assert_eq!(untrusted.code, 69, "{untrusted:?}");
    assert!(
        untrusted.stderr.contains("not signed by a CA") && untrusted.stderr.contains("--tls-ca"),
        "{untrusted:?}"
    );
    assert!(!untrusted.stderr.contains("is Redis running"), "{untrusted:?}");
}

#[test]
fn tls_without_client_certificates_needs_only_the_ca() {
    let server = RedisServer::builder()
        .tls(false)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let ca = server.tls().unwrap().ca_cert.display().to_string();
    let ok = output(with(
        &["--redis".to_owned(), server.url(), "--tls-ca".to_owned(), ca],
        &["run", "x", "--", "true"],
    ));
    assert_eq!(ok.code, 0, "{ok:?}");
}

#[test]
fn sentinel_finds_the_master_by_name() {
    let set = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let mut global: Vec<String> = set
        .sentinel_urls()
        .into_iter()
        .flat_map(|u| ["--sentinel".to_owned(), u])
        .collect();
    global.extend(["--master".to_owned(), set.master_name().to_owned()]);
    let (holder, _stdout) = hold(with(&global, &["run", "deploy"]));
    assert!(
        conn(set.master()).exists::<_, bool>("redlease:deploy").unwrap(),
        "the lock is on the master"
    );
    let status = json(&output(with(&global, &["status", "deploy", "--json"])));
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(let_go(holder).code, 0);
    let missing = output(with(&global[..global.len() - 2], &["run", "x", "--", "true"]));
    assert_eq!(missing.code, 2, "--sentinel needs --master: {missing:?}");
}

#[test]
fn wait_replicas_reports_acks_and_a_shortfall_releases_and_exits_69() {
    let master = RedisServer::builder()
        .arg("repl-diskless-sync-delay", "0")
        .start()
        .unwrap();
    let _replica = RedisServer::builder()
        .arg("replicaof", format!("127.0.0.1 {}", master.port()))
        .start()
        .unwrap();
    eventually(20, "the replica is in sync", || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn(&master))
            .unwrap();
        info.contains("connected_slaves:1") && info.contains("state=online")
    });
    // Online is not yet acknowledging: wait until a write is acknowledged.
    eventually(20, "the replica acknowledges writes", || {
        let mut c = conn(&master);
        let _: () = redis::cmd("SET").arg("warm-up").arg(1).query(&mut c).unwrap();
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut c).unwrap();
        acked == 1
    });
    let base = vec!["--redis".to_owned(), master.url()];
    let mut one = base.clone();
    // A generous acknowledgement timeout: the machine may be busy.
    one.extend([
        "--wait-replicas".to_owned(),
        "1".to_owned(),
        "--replica-timeout".to_owned(),
        "1500ms".to_owned(),
    ]);
    let ok = output(with(&one, &["run", "payroll", "--", "true"]));
    assert_eq!(ok.code, 0, "{ok:?}");
    assert!(ok.stderr.contains("acknowledged by 1 replica"), "{ok:?}");
    let mut two = base.clone();
    two.extend([
        "--wait-replicas".to_owned(),
        "2".to_owned(),
        "--replica-timeout".to_owned(),
        "200ms".to_owned(),
    ]);
    let short = output(with(&two, &["run", "payroll", "--", "touch", "/nonexistent/ran"]));
    assert_eq!(short.code, 69, "{short:?}");
    assert!(short.stderr.contains("replica"), "{short:?}");
    assert!(
        !conn(&master).exists::<_, bool>("redlease:payroll").unwrap(),
        "released after the shortfall"
    );
    let fair = output(with(&one, &["run", "payroll", "--fair", "--", "true"]));
    assert_eq!(fair.code, 2, "--wait-replicas is for the plain lock: {fair:?}");
}

/// A server older than Redis 7.0 is refused by its version, with the upgrade as the
/// hint — not "is Redis running". Needs `$REDLEASE_OLD_REDIS_SERVER` (scripts/test).
#[test]
fn an_old_server_is_named_with_the_version_it_needs() {
    let Some(bin) = std::env::var_os("REDLEASE_OLD_REDIS_SERVER") else {
        eprintln!("skipped: REDLEASE_OLD_REDIS_SERVER is not set (scripts/test sets it)");
        return;
    };
    let server = RedisServer::builder()
        .bin(bin)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    for args in [&["status", "x"][..], &["run", "x", "--", "true"], &["list"]] {
        let out = output(with(&["--redis".to_owned(), server.url()], args));
        assert_eq!(out.code, 69, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("redis 6.2.") && out.stderr.contains("needs Redis 7.0 or newer"),
            "{out:?}"
        );
        assert!(out.stderr.contains("hint: upgrade the server"), "{out:?}");
        assert!(!out.stderr.contains("is Redis running"), "{out:?}");
    }
}
