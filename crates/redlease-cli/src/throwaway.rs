//! A throwaway `redis-server` for `redlease demo`: on a free loopback port, in a
//! directory of its own, persisting nothing, stopped (and its directory removed) when
//! dropped.
//!
//! The test kit starts servers for the tests; the installed `redlease` binary cannot
//! depend on it, so the demo keeps this much of its own.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How many free ports to try when another process takes the chosen one first.
const PORT_ATTEMPTS: usize = 5;

/// Why no throwaway server could be started.
#[derive(Debug)]
pub enum StartError {
    /// `redis-server` is not installed (or `$REDIS_SERVER_BIN` does not name it).
    NotInstalled { bin: String, error: std::io::Error },
    /// It started but did not answer, or exited.
    NotReady { detail: String },
    /// A file or port operation failed.
    Io(&'static str, std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::NotInstalled { bin, error } => write!(
                f,
                "cannot run {bin:?} ({error}); install Redis (`sudo apt-get install -y redis-server`, \
                 `sudo dnf install -y redis`, `brew install redis`) or set REDIS_SERVER_BIN"
            ),
            StartError::NotReady { detail } => write!(f, "redis-server did not start: {detail}"),
            StartError::Io(what, e) => write!(f, "{what}: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running throwaway server; dropping it kills it and removes its directory.
pub struct Throwaway {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Throwaway {
    /// Starts `$REDIS_SERVER_BIN` (or `redis-server` from `PATH`) and waits until it
    /// answers `PING`. Blocking.
    pub fn start() -> Result<Throwaway, StartError> {
        let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned());
        let mut last = None;
        for attempt in 0..PORT_ATTEMPTS {
            let port = free_port().map_err(|e| StartError::Io("find a free port", e))?;
            let dir = std::env::temp_dir().join(format!("redlease-demo-{}-{attempt}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| StartError::Io("create the server's directory", e))?;
            let child = Command::new(&bin)
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(error) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(StartError::NotInstalled { bin, error });
                }
            };
            let mut server = Throwaway { child, port, dir };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                // Most likely the port was taken meanwhile: try another.
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(StartError::NotReady {
            detail: "no attempt was made".into(),
        }))
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// Polls with `PING` until the server answers `+PONG`, it exits, or time runs out.
    fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .map_err(|e| StartError::Io("wait for redis-server", e))?
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                return Err(StartError::NotReady {
                    detail: format!(
                        "it exited ({status}): {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                    ),
                });
            }
            if ping(self.addr()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(StartError::NotReady {
                    detail: format!("no answer on {} within {START_TIMEOUT:?}", self.addr()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port no one listens on now (the kernel's choice for port 0).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Whether `addr` answers `PING` with `+PONG` within a short time.
fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
