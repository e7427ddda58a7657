//! What redlease says when Redis cannot be used, by what went wrong: every message on
//! one line with nothing raw in it, and a hint that names the actual fix.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::*;

/// The stderr of a failed run, checked for one-line messages without control characters.
#[track_caller]
fn failed(out: &Out, code: i32) -> (String, String) {
    assert_eq!(out.code, code, "{out:?}");
    let mut lines = out.stderr.lines();
    let error = lines.next().unwrap_or_default().to_owned();
    let hint = lines.next().unwrap_or_default().to_owned();
    assert!(
        error.starts_with("error: ") && hint.starts_with("hint: "),
        "{out:?}"
    );
    assert_eq!(lines.next(), None, "two lines: {out:?}");
    assert!(
        !out.stderr.chars().any(|c| c.is_control() && c != '\n'),
        "{out:?}"
    );
    (error, hint)
}

#[test]
fn a_wrong_password_a_missing_database_and_a_wrong_topology_are_named() {
    let server = server();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("sekret")
        .query(&mut conn(&server))
        .unwrap();
    let port = server.port();
    let url = |u: &str| vec!["--redis".to_owned(), u.to_owned()];
    let run = |global: Vec<String>| {
        let mut cmd = redlease();
        cmd.args(global).args(["status", "x"]);
        output(cmd)
    };
    for bad in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let (error, hint) = failed(&run(url(&bad)), 69);
        assert!(hint.contains("refused the credentials"), "{error}\n{hint}");
        assert!(
            !error.contains("wrong") && !hint.contains("wrong"),
            "the password is hidden: {error}\n{hint}"
        );
    }
    let good = format!("redis://:sekret@127.0.0.1:{port}");
    let (_, hint) = failed(&run(url(&format!("{good}/99"))), 69);
    assert!(hint.contains("has no such database"), "{hint}");
    let mut cluster = url(&good);
    cluster.push("--cluster".into());
    let (_, hint) = failed(&run(cluster), 69);
    assert!(hint.contains("is not a Redis Cluster"), "{hint}");
    assert_eq!(run(url(&good)).code, 0);
}

#[test]
fn something_that_is_not_redis_is_named_and_its_reply_kept_on_one_line() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        // Answer each connection as a web server would, then hang up.
        for stream in listener.incoming().take(4).flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 512];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n<html>\x1b[2J</html>\n");
        }
    });
    let mut cmd = redlease();
    cmd.args(["--redis", &format!("redis://127.0.0.1:{port}"), "status", "x"]);
    let (_, hint) = failed(&output(cmd), 69);
    assert!(hint.contains("does not speak the Redis protocol"), "{hint}");
    drop(server);
}

#[test]
fn the_same_redlock_master_twice_is_a_usage_error() {
    let server = server();
    let url = server.url();
    let mut cmd = redlease();
    for u in [&url, &url, &format!("{url}/1")] {
        cmd.args(["--redis", u]);
    }
    cmd.args(["--redlock", "run", "x", "--", "true"]);
    let out = output(cmd);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("was given twice"), "{out:?}");
    assert!(all_keys(&server).is_empty(), "nothing was taken");
}

#[test]
fn man_pages_go_into_a_directory_made_for_them() {
    let dir = std::env::temp_dir().join(format!("redlease-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let target = dir.join("man1");
    let mut cmd = redlease();
    cmd.arg("man").arg("--dir").arg(&target);
    let out = output(cmd);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(target.join("redlease.1").is_file(), "{out:?}");
    let mut cmd = redlease();
    cmd.args(["man", "--dir", "/proc/redlease-cannot-write-here"]);
    let out = output(cmd);
    assert_eq!(out.code, 73, "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn status_works_for_a_user_with_only_the_documented_acl_rules() {
    let server = server();
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER").arg("locker").arg("on").arg(">pw");
    for rule in redlease::acl_rules("redlease:") {
        acl.arg(rule);
    }
    let _: () = acl.query(&mut conn(&server)).unwrap();
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let run = |args: &[&str]| {
        let mut cmd = redlease();
        cmd.args(["--redis", &url]).args(args);
        output(cmd)
    };
    let taken = run(&["acquire", "x", "--ttl", "30s", "--no-wait"]);
    assert_eq!(taken.code, 0, "{taken:?}");
    let status = run(&["status", "x"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(status.stdout.contains("held:       yes"), "{status:?}");
}

#[test]
fn a_set_up_that_cannot_work_is_a_usage_error_and_no_password_or_control_character_is_shown() {
    let server = server();
    let url = server.url();
    // The same master twice, spelt differently (the library sees the same address).
    let mut cmd = redlease();
    for u in [url.clone(), format!("{url}/0"), format!("{url}/1")] {
        cmd.args(["--redis", &u]);
    }
    cmd.args(["--redlock", "run", "x", "--", "true"]);
    let out = output(cmd);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("was given twice"), "{out:?}");
    // An invalid cluster URL.
    let mut cmd = redlease();
    cmd.args([
        "--cluster",
        "--redis",
        "redis://127.0.0.1:notaport",
        "status",
        "x",
    ]);
    assert_eq!(output(cmd).code, 2);
    // Sentinels are named without their passwords.
    let mut cmd = redlease();
    cmd.args([
        "--sentinel",
        "redis://u:hunter2@127.0.0.1:1",
        "--master",
        "m",
        "status",
        "x",
    ]);
    let out = output(cmd);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(!out.stderr.contains("hunter2"), "{out:?}");
    // A URL with a line break in it.
    let mut cmd = redlease();
    cmd.args(["--redis", "redis://127.0.0.1:\r\n1", "status", "x"]);
    let out = output(cmd);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        !out.stderr.contains('\r') && out.stderr.lines().count() <= 2,
        "{out:?}"
    );
}
