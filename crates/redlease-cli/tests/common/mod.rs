//! Helpers of the CLI tests: the built binary, real servers, bounded waits.
#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Commands;
use redlease_testkit::RedisServer;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_redlease");

/// How long any single invocation may take before the test calls it hung.
pub const LIMIT: Duration = Duration::from_secs(30);

pub fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

pub fn conn(server: &RedisServer) -> redis::Connection {
    server
        .client()
        .get_connection()
        .expect("connect to the test server")
}

pub fn all_keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = conn(server).keys("*").expect("KEYS");
    keys.sort();
    keys
}

/// Every key in the server but the fencing counter and floor of the plain mutexes
/// (`{redlease:fence}` and its floor, shared by every plain mutex), sorted.
pub fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut keys = all_keys(server);
    keys.retain(|k| !k.starts_with("{redlease:fence"));
    keys
}

/// Checks that `mark`, the `last_fence` a mutex's status reports, is that of a slot
/// whose last fencing token is `fence`: the token itself while the slot's counter
/// lives, afterwards its floor (one counter life, 100 ms in microseconds, above the
/// seed the token came from).
#[track_caller]
pub fn assert_mark(mark: &serde_json::Value, fence: u64) {
    let mark = mark.as_u64().unwrap_or_else(|| panic!("no fencing mark: {mark}"));
    assert!(
        mark >= fence && mark <= fence + 100_000,
        "mark {mark} for the last token {fence}"
    );
}

/// `redlease` with a clean environment: no REDIS_URL or REDLEASE_TOKEN from outside.
pub fn redlease() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("REDIS_URL").env_remove("REDLEASE_TOKEN");
    cmd
}

/// `redlease --redis <server> ARGS...`.
pub fn at(server: &RedisServer, args: &[&str]) -> Command {
    let mut cmd = redlease();
    cmd.arg("--redis").arg(server.url()).args(args);
    cmd
}

pub struct Out {
    /// Exit code, or 128+N when killed by signal N.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {} after {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.took, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion (at most `LIMIT`), capturing its output.
pub fn output(mut cmd: Command) -> Out {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlease");
    finish(child, started)
}

/// Waits for `child` (at most `LIMIT`) and collects what it printed.
pub fn finish(mut child: Child, started: Instant) -> Out {
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redlease did not finish within {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().expect("a code or a signal"));
    Out {
        code,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        took: started.elapsed(),
    }
}

pub fn json(out: &Out) -> Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// Starts `cmd` with piped stdin/stdout and waits for its first stdout line to be `ready`.
pub fn start_until_ready(mut cmd: Command) -> (Child, BufReader<ChildStdout>) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlease");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    assert_eq!(line.trim(), "ready", "CMD did not start");
    (child, stdout)
}

/// Polls `check` every 10 ms until it holds, for at most `secs` seconds.
pub fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {secs}s: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}
