//! Process measurements: CPU time, resident memory, percentiles, medians.

use std::time::Duration;

/// User + system CPU time of this process so far.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Resident set size of this process in MiB (from /proc/self/statm).
pub fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    pages * page / (1024.0 * 1024.0)
}

/// The `p` quantile (0..=1) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// The median of some values.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// The Redis server's own accounting at one moment, from one `INFO cpu stats` reply.
#[derive(Clone, Copy, Debug)]
pub struct ServerSample {
    /// `used_cpu_user` + `used_cpu_sys`: the server process's CPU time (every thread of
    /// it: Redis takes these from `getrusage(RUSAGE_SELF)`), in µs.
    pub cpu_us: f64,
    /// `total_commands_processed`.
    pub commands: u64,
}

/// A dedicated connection for reading the server's accounting.
///
/// Taking a sample costs the server CPU itself: the part of an `INFO` after the server
/// read its counters and the part of the next one before it did fall inside the window
/// between two samples. `calibrate` measures that cost (`info_cost_us`, one `INFO`'s
/// worth per window) so windows can subtract it, and the server's idle CPU rate
/// (`idle_us_per_s`: its timer, `serverCron`, runs whether or not anyone locks).
pub struct RedisProbe {
    client: redis::Client,
    /// Replaced when it breaks (the server's counters do not care which connection
    /// reads them).
    conn: std::sync::Mutex<redis::aio::MultiplexedConnection>,
    /// Redis before 7.0 takes one INFO section per call; then the default set is read.
    multi_section: bool,
    pub info_cost_us: f64,
    pub idle_us_per_s: f64,
}

impl RedisProbe {
    pub async fn connect(url: &str) -> Result<RedisProbe, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect {url}: {e}"))?;
        let mut probe = RedisProbe {
            client,
            conn: std::sync::Mutex::new(conn),
            multi_section: true,
            info_cost_us: 0.0,
            idle_us_per_s: 0.0,
        };
        if probe.sample().await.is_err() {
            probe.multi_section = false;
            probe.sample().await?;
        }
        Ok(probe)
    }

    /// Runs `cmd` on the probe's connection, reconnecting once if it broke.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match cmd.query_async(&mut conn).await {
            Ok(v) => Ok(v),
            Err(e) if e.is_unrecoverable_error() || e.is_io_error() => {
                let mut conn = self
                    .client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| format!("reconnect: {e}"))?;
                *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = conn.clone();
                cmd.query_async(&mut conn).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    pub async fn sample(&self) -> Result<ServerSample, String> {
        let mut cmd = redis::cmd("INFO");
        if self.multi_section {
            cmd.arg("cpu").arg("stats");
        }
        let info: String = self.query(&cmd).await.map_err(|e| format!("INFO: {e}"))?;
        let field = |name: &str| -> Option<f64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
        };
        match (
            field("used_cpu_user"),
            field("used_cpu_sys"),
            field("total_commands_processed"),
        ) {
            (Some(user), Some(sys), Some(commands)) => Ok(ServerSample {
                cpu_us: (user + sys) * 1e6,
                commands: commands as u64,
            }),
            _ => Err("INFO reply without used_cpu_user, used_cpu_sys, total_commands_processed".into()),
        }
    }

    /// Measures `info_cost_us` (the median of 7 batches of 60 samples back to back)
    /// and `idle_us_per_s` (2 s with nothing but this connection's two samples), with
    /// nothing else running.
    pub async fn calibrate(&mut self) -> Result<(), String> {
        const BATCHES: usize = 7;
        const N: usize = 60;
        let mut costs = Vec::with_capacity(BATCHES);
        for _ in 0..BATCHES {
            let first = self.sample().await?;
            for _ in 0..N {
                self.sample().await?;
            }
            let last = self.sample().await?;
            // Between the first and the last sample's counter reads: N whole INFOs,
            // the first's tail and the last's head, i.e. N + 1 INFOs.
            costs.push((last.cpu_us - first.cpu_us) / (N + 1) as f64);
        }
        // The median batch: the machine is shared, a batch may run on a slow core.
        self.info_cost_us = median(&costs);
        let idle = Duration::from_secs(2);
        let before = self.sample().await?;
        tokio::time::sleep(idle).await;
        let after = self.sample().await?;
        self.idle_us_per_s =
            ((after.cpu_us - before.cpu_us - self.info_cost_us) / idle.as_secs_f64()).max(0.0);
        Ok(())
    }

    /// Server CPU between two samples of this probe, less the samples' own cost, in µs.
    pub fn cpu_between(&self, before: ServerSample, after: ServerSample) -> f64 {
        (after.cpu_us - before.cpu_us - self.info_cost_us).max(0.0)
    }

    /// Commands between two samples of this probe, less the first sample's `INFO`.
    pub fn commands_between(before: ServerSample, after: ServerSample) -> u64 {
        after.commands.saturating_sub(before.commands).saturating_sub(1)
    }

    /// Connections to the server other than this one.
    pub async fn other_clients(&self) -> Result<usize, String> {
        let list: String = self
            .query(redis::cmd("CLIENT").arg("LIST"))
            .await
            .map_err(|e| format!("CLIENT LIST: {e}"))?;
        Ok(list
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
            .saturating_sub(1))
    }

    /// Deletes every key the bench made (every name contains `bench:`; redlease's
    /// auxiliary keys embed the name), so that keys left behind — redlease keeps a
    /// lock's metadata for a minute, renewal leases outlive their worker — do not
    /// expire inside a later window. Returns how many keys it deleted. `DEL`, not
    /// `UNLINK`: freeing in a background thread could spill into the next window.
    pub async fn cleanup(&self) -> Result<u64, String> {
        let mut cursor: u64 = 0;
        let mut deleted = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = self
                .query(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg("*bench:*")
                        .arg("COUNT")
                        .arg(1000),
                )
                .await
                .map_err(|e| format!("SCAN: {e}"))?;
            if !keys.is_empty() {
                let n: u64 = self
                    .query(redis::cmd("DEL").arg(&keys))
                    .await
                    .map_err(|e| format!("DEL: {e}"))?;
                deleted += n;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if deleted > 1000 {
            // The server shrinks its key tables from its timer (10 times a second)
            // and rehashes them incrementally: let that happen here, not in the next
            // window.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(deleted)
    }
}

/// A sleep with microsecond resolution for the contention workers' "work" and "hold":
/// a Linux `timerfd` awaited through the runtime's reactor (no spinning), where tokio's
/// own timer rounds up to whole milliseconds (a 1 ms tokio sleep lasts 1–2 ms).
/// Falls back to tokio's timer where no timerfd can be made.
pub struct Pause {
    #[cfg(target_os = "linux")]
    timer: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Pause {
    pub fn new() -> Pause {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::{FromRawFd, OwnedFd};
            // SAFETY: timerfd_create has no preconditions; a valid fd is owned by us.
            let fd = unsafe {
                libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
            };
            let timer = (fd >= 0)
                .then(|| unsafe { OwnedFd::from_raw_fd(fd) })
                .and_then(|fd| {
                    // SAFETY: an OwnedFd is open, and the same fd, until it is dropped.
                    unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
                    }
                    .ok()
                });
            Pause { timer }
        }
        #[cfg(not(target_os = "linux"))]
        Pause {}
    }

    pub async fn sleep(&self, d: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(timer) = &self.timer {
            if !d.is_zero() && Self::timerfd_sleep(timer, d).await.is_ok() {
                return;
            }
        }
        tokio::time::sleep(d).await;
    }

    #[cfg(target_os = "linux")]
    async fn timerfd_sleep(
        timer: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        d: Duration,
    ) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = timer.get_ref().as_raw_fd();
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: fd is our timerfd; spec is a valid itimerspec; no old value wanted.
        if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        loop {
            let mut ready = timer.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let n = unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), 8) };
            if n == 8 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(err);
            }
            // Readiness left over from the previous expiration: wait for this one.
            ready.clear_ready();
        }
    }
}
