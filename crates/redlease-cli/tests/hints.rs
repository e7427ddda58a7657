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
