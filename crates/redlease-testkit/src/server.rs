//! One real `redis-server` process, owned by a test.
//!
//! Each server gets its own temporary directory (data files, log) and a loopback port
//! that no parallel test can take: ports are handed out from a per-process sequence,
//! checked with a bind first, and a server that still loses the race (its log says
//! "Address already in use") is started again on the next port.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::KitError;
use crate::tls::TlsFiles;

/// How long a server may take to say "Ready to accept connections".
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How many ports to try before giving up on starting a server.
const PORT_ATTEMPTS: usize = 50;

/// Durability settings for a test server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistence {
    /// `--save '' --appendonly no`: a restart comes back empty (the default).
    #[default]
    None,
    /// Append-only file with `appendfsync always`: a restart keeps every acknowledged write.
    AofAlways,
    /// Append-only file with `appendfsync everysec`.
    AofEverySec,
}

/// Builder for a [`RedisServer`].
#[derive(Clone, Debug, Default)]
pub struct ServerBuilder {
    persistence: Persistence,
    args: Vec<(String, Vec<String>)>,
    port: Option<u16>,
    /// `Some(auth_clients)`: a TLS-only server.
    tls: Option<bool>,
    /// Sentinel mode: the initial contents of `sentinel.conf`.
    sentinel: Option<String>,
    /// The server binary, instead of `$REDIS_SERVER_BIN` or `redis-server` from `PATH`.
    bin: Option<PathBuf>,
}

impl ServerBuilder {
    /// Chooses what survives a restart.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Adds a configuration directive, as `--name value` on the command line.
    pub fn arg(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.args.push((name.into(), vec![value.into()]));
        self
    }

    /// Adds a configuration directive of several arguments, as `--name value...` on the
    /// command line (say `rename-command HELLO ""`: `directive("rename-command",
    /// ["HELLO", ""])`).
    pub fn directive<I, V>(mut self, name: impl Into<String>, values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<String>,
    {
        self.args
            .push((name.into(), values.into_iter().map(Into::into).collect()));
        self
    }

    /// Serves TLS only (`--port 0 --tls-port <port>`), with certificates generated for
    /// this server (see [`RedisServer::tls`]). With `auth_clients`, the server refuses
    /// clients that present no certificate signed by its CA (`--tls-auth-clients yes`).
    pub fn tls(mut self, auth_clients: bool) -> Self {
        self.tls = Some(auth_clients);
        self
    }

    /// Runs this `redis-server` binary instead of `$REDIS_SERVER_BIN` or the one on
    /// `PATH` (an older version, say).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }

    /// Uses this port instead of allocating one (the caller guarantees it is free).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Runs `redis-server sentinel.conf --sentinel` instead of a data server. `config`
    /// (for example `sentinel monitor ...` lines) is written to `sentinel.conf` in the
    /// server's directory on the first start; Sentinel rewrites that file as it learns
    /// the topology, and a [`restart`](RedisServer::restart) keeps what it learned.
    pub fn sentinel(mut self, config: impl Into<String>) -> Self {
        self.sentinel = Some(config.into());
        self
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(self) -> Result<RedisServer, KitError> {
        let bin = match &self.bin {
            Some(bin) => bin.clone(),
            None => redis_server_bin()?,
        };
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("redlease-redis-")
                .tempdir()
                .map_err(|e| KitError::Io("create temp dir", e))?;
            let tls = match self.tls {
                Some(_) => Some(TlsFiles::generate(dir.path())?),
                None => None,
            };
            let mut server = RedisServer {
                bin: bin.clone(),
                dir,
                port: self.port.unwrap_or_else(free_port),
                builder: self.clone(),
                child: None,
                tls,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e @ KitError::PortTaken(_)) if self.port.is_none() => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(KitError::PortTaken(0)))
    }
}

/// A `redis-server` child process on `127.0.0.1`, killed and reaped on drop.
///
/// When the owning test panics, `Drop` prints the server's log to stderr, so a failed
/// test shows what the server saw.
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    builder: ServerBuilder,
    child: Option<Child>,
    tls: Option<TlsFiles>,
}

impl RedisServer {
    /// Starts a server with default settings (no persistence).
    pub fn start() -> Result<Self, KitError> {
        Self::builder().start()
    }

    /// A builder for servers with persistence or extra configuration.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://...` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The certificates of a TLS server (see [`ServerBuilder::tls`]); `None` for a
    /// plain one.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// A redis-rs client for this server (plain TCP servers only: a client of a TLS
    /// server needs the CA in [`tls`](Self::tls)).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback url is valid")
    }

    /// The server's working directory (data files and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running (not stopped by [`stop`](Self::stop)).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Kills the server (SIGKILL: no shutdown save) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port and directory.
    ///
    /// Without persistence it comes back empty; with [`Persistence::AofAlways`] it keeps
    /// every write it acknowledged.
    pub fn restart(&mut self) -> Result<(), KitError> {
        self.stop();
        // The port was ours a moment ago; a late TIME_WAIT cannot block it because
        // redis-server sets SO_REUSEADDR. Retry a few times in case of a slow kernel.
        let mut last = None;
        for _ in 0..20 {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(KitError::PortTaken(p)) => {
                    last = Some(KitError::PortTaken(p));
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(KitError::PortTaken(self.port)))
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered.
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGSTOP);
        }
    }

    /// Thaws a server frozen by [`pause`](Self::pause).
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn command_line(&self) -> Vec<String> {
        let dir = self.dir.path().display().to_string();
        let mut args: Vec<String> = Vec::new();
        if self.builder.sentinel.is_some() {
            args.push(self.dir.path().join("sentinel.conf").display().to_string());
            args.push("--sentinel".into());
        }
        match (&self.tls, self.builder.tls) {
            (Some(files), Some(auth_clients)) => {
                let path = |p: &Path| p.display().to_string();
                args.extend([
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    self.port.to_string(),
                    "--tls-cert-file".into(),
                    path(&files.server_cert),
                    "--tls-key-file".into(),
                    path(&files.server_key),
                    "--tls-ca-cert-file".into(),
                    path(&files.ca_cert),
                    "--tls-auth-clients".into(),
                    if auth_clients { "yes" } else { "no" }.into(),
                ]);
            }
            _ => args.extend(["--port".into(), self.port.to_string()]),
        }
        args.extend([
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir,
            "--logfile".into(),
            self.log_path().display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ]);
        if self.builder.sentinel.is_some() {
            for (name, values) in &self.builder.args {
                args.push(format!("--{name}"));
                args.extend(values.iter().cloned());
            }
            return args;
        }
        args.extend(["--save".into(), String::new()]);
        // DEBUG must be enabled from Redis 7.0 on; older servers know no such directive.
        if major_version(&self.bin).is_none_or(|major| major >= 7) {
            args.extend(["--enable-debug-command".into(), "local".into()]);
        }
        match self.builder.persistence {
            Persistence::None => args.extend(["--appendonly".into(), "no".into()]),
            Persistence::AofAlways => args.extend([
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
            ]),
            Persistence::AofEverySec => args.extend([
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "everysec".into(),
            ]),
        }
        for (name, values) in &self.builder.args {
            args.push(format!("--{name}"));
            args.extend(values.iter().cloned());
        }
        args
    }

    fn spawn(&mut self) -> Result<(), KitError> {
        if let Some(config) = &self.builder.sentinel {
            let path = self.dir.path().join("sentinel.conf");
            if !path.exists() {
                std::fs::write(&path, config).map_err(|e| KitError::Io("write sentinel.conf", e))?;
            }
        }
        // Sentinel never says "Ready to accept connections"; it logs its ID once it listens.
        let ready = if self.builder.sentinel.is_some() {
            "Sentinel ID is"
        } else {
            "Ready to accept connections"
        };
        let log_len_before = std::fs::metadata(self.log_path()).map(|m| m.len()).unwrap_or(0);
        let child = Command::new(&self.bin)
            .args(self.command_line())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| KitError::Io("spawn redis-server", e))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let log = self.log_since(log_len_before);
            if log.contains(ready) {
                return Ok(());
            }
            let child = self.child.as_mut().expect("just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = err.read_to_string(&mut stderr);
                }
                self.child = None;
                let log = self.log_since(log_len_before);
                if log.contains("Address already in use") || stderr.contains("Address already in use") {
                    return Err(KitError::PortTaken(self.port));
                }
                return Err(KitError::ServerExited {
                    status: status.to_string(),
                    log: format!("{stderr}{log}"),
                });
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(KitError::StartTimeout {
                    log: self.log_since(log_len_before),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let Ok(file) = std::fs::File::open(self.log_path()) else {
            return String::new();
        };
        let mut reader = BufReader::new(file);
        let mut skipped = 0u64;
        let mut out = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if skipped >= offset {
                out.push_str(&line);
            }
            skipped += line.len() as u64;
            line.clear();
        }
        out
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail(&format!("redis-server :{}", self.port), &self.log());
        }
        self.stop();
    }
}

/// Prints the last lines of a log to stderr under a header (used when a test fails).
pub(crate) fn print_log_tail(what: &str, log: &str) {
    let lines: Vec<&str> = log.lines().collect();
    let start = lines.len().saturating_sub(200);
    eprintln!("----- {what} log (last {} lines) -----", lines.len() - start);
    for line in &lines[start..] {
        eprintln!("{line}");
    }
    eprintln!("----- end of {what} log -----");
}

/// Finds `redis-server`: `$REDIS_SERVER_BIN`, then `PATH`, then the usual system places.
/// The major version of the `redis-server` at `bin` (`redis-server --version` says
/// `v=7.0.15`), when it can tell; asked once per binary.
fn major_version(bin: &Path) -> Option<u32> {
    static KNOWN: std::sync::Mutex<Vec<(PathBuf, Option<u32>)>> = std::sync::Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, major)) = known.iter().find(|(b, _)| b == bin) {
        return *major;
    }
    let major = Command::new(bin).arg("--version").output().ok().and_then(|out| {
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
        version.split('.').next()?.parse().ok()
    });
    known.push((bin.to_owned(), major));
    major
}

pub fn redis_server_bin() -> Result<PathBuf, KitError> {
    find_bin("REDIS_SERVER_BIN", "redis-server")
}

pub(crate) fn find_bin(env: &str, name: &str) -> Result<PathBuf, KitError> {
    if let Some(path) = std::env::var_os(env) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(KitError::NotInstalled {
            name: name.to_owned(),
            detail: format!("${env} points at {}, which is not a file", path.display()),
        });
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let candidates =
        std::env::split_paths(&path).chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from));
    for dir in candidates {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(KitError::NotInstalled {
        name: name.to_owned(),
        detail: format!("not found on PATH and ${env} is not set"),
    })
}

/// Hands out loopback ports below the Linux ephemeral range (32768+), so outgoing
/// connections never collide with them, in a sequence that differs per process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    const SPAN: u32 = 12_000; // 10000..22000, leaving +10000 for cluster bus ports below 32768
    let _ = NEXT.compare_exchange(
        0,
        (std::process::id().wrapping_mul(7919) ^ nanos()) % SPAN + 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + n % SPAN) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}
