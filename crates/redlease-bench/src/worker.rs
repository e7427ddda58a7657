//! Work that runs in child processes: contention across OS processes, and renewal load
//! measured in a process of its own (so CPU time and memory belong to one contender).
//!
//! The coordinator starts `redlease-bench worker <json spec>`; the worker prints one
//! JSON line with its results.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::contenders::{Contender, Held, Locker, Permitter};
use crate::measure;

/// What a worker process is asked to do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Job {
    /// `tasks` tasks on one client loop lock/unlock of `name` with zero hold time from
    /// `start_unix_ms` for `duration_ms`.
    Contended {
        contender: Contender,
        url: String,
        name: String,
        tasks: usize,
        start_unix_ms: u64,
        duration_ms: u64,
    },
    /// `tasks` tasks on one client loop acquire/release of one permit of the `limit`-permit
    /// semaphore `name` with zero hold time.
    Semaphore {
        contender: Contender,
        url: String,
        name: String,
        limit: u32,
        tasks: usize,
        start_unix_ms: u64,
        duration_ms: u64,
    },
    /// Holds `leases` locks with `ttl_ms` leases, renewed every ttl/3, for `duration_ms`.
    Renewal {
        contender: Contender,
        url: String,
        leases: usize,
        ttl_ms: u64,
        duration_ms: u64,
    },
}

/// What a worker reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub acquisitions: u64,
    /// Acquisitions of each task (contended).
    pub per_task: Vec<u64>,
    /// Time from calling lock to holding the lock, µs, per acquisition (contended; sampled).
    pub waits_us: Vec<f64>,
    /// Renewal round trips per renewal interval.
    pub round_trips_per_tick: f64,
    /// CPU time over wall time during the measured window, in percent of one core.
    pub cpu_percent: f64,
    pub rss_mib: f64,
}

pub async fn run(job: Job) -> Report {
    match job {
        Job::Contended {
            contender,
            url,
            name,
            tasks,
            start_unix_ms,
            duration_ms,
        } => contended(contender, &url, &name, tasks, start_unix_ms, duration_ms).await,
        Job::Semaphore {
            contender,
            url,
            name,
            limit,
            tasks,
            start_unix_ms,
            duration_ms,
        } => semaphore(contender, &url, &name, limit, tasks, start_unix_ms, duration_ms).await,
        Job::Renewal {
            contender,
            url,
            leases,
            ttl_ms,
            duration_ms,
        } => renewal(contender, &url, leases, ttl_ms, duration_ms).await,
    }
}

async fn contended(
    contender: Contender,
    url: &str,
    name: &str,
    tasks: usize,
    start_unix_ms: u64,
    duration_ms: u64,
) -> Report {
    let locker = Arc::new(Locker::connect(contender, url).await);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(start_unix_ms.saturating_sub(now_ms))).await;
    let deadline = Instant::now() + Duration::from_millis(duration_ms);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (locker, name) = (locker.clone(), name.to_owned());
        handles.push(tokio::spawn(async move {
            let mut count = 0u64;
            let mut waits = Vec::new();
            while Instant::now() < deadline {
                let asked = Instant::now();
                let held = locker.lock(&name, Duration::from_secs(10)).await;
                if Instant::now() < deadline {
                    count += 1;
                    if waits.len() < 20_000 {
                        waits.push(asked.elapsed().as_secs_f64() * 1e6);
                    }
                }
                locker.unlock(held).await;
            }
            (count, waits)
        }));
    }
    let mut report = Report::default();
    for h in handles {
        let (count, waits) = h.await.expect("task");
        report.acquisitions += count;
        report.per_task.push(count);
        report.waits_us.extend(waits);
    }
    report
}

async fn semaphore(
    contender: Contender,
    url: &str,
    name: &str,
    limit: u32,
    tasks: usize,
    start_unix_ms: u64,
    duration_ms: u64,
) -> Report {
    let permitter = Arc::new(
        Permitter::connect(contender, url)
            .await
            .expect("a semaphore contender"),
    );
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(start_unix_ms.saturating_sub(now_ms))).await;
    let deadline = Instant::now() + Duration::from_millis(duration_ms);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (permitter, name) = (permitter.clone(), name.to_owned());
        handles.push(tokio::spawn(async move {
            let mut count = 0u64;
            let mut waits = Vec::new();
            while Instant::now() < deadline {
                let asked = Instant::now();
                let held = permitter.acquire(&name, limit, Duration::from_secs(10)).await;
                if Instant::now() < deadline {
                    count += 1;
                    if waits.len() < 20_000 {
                        waits.push(asked.elapsed().as_secs_f64() * 1e6);
                    }
                }
                permitter.release(held).await;
            }
            (count, waits)
        }));
    }
    let mut report = Report::default();
    for h in handles {
        let (count, waits) = h.await.expect("task");
        report.acquisitions += count;
        report.per_task.push(count);
        report.waits_us.extend(waits);
    }
    report
}

async fn renewal(contender: Contender, url: &str, leases: usize, ttl_ms: u64, duration_ms: u64) -> Report {
    let ttl = Duration::from_millis(ttl_ms);
    let locker = Arc::new(Locker::connect(contender, url).await);
    // Take every lock first (not measured).
    let mut held = Vec::with_capacity(leases);
    for i in 0..leases {
        held.push(
            locker
                .lock(&format!("bench:renewal:{}:{i}", contender.name()), ttl)
                .await,
        );
    }
    let round_trips = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let before = match &*locker {
        Locker::Redlease(client) => client.stats().renewal_round_trips,
        _ => 0,
    };
    let mut manual = Vec::new();
    if !matches!(&*locker, Locker::Redlease(_)) {
        // Without auto-renewal each lock needs its own timer: what users of raw
        // commands and rslock write by hand.
        let held: Vec<Arc<Held>> = held.drain(..).map(Arc::new).collect();
        for h in held {
            let (locker, round_trips, stop) = (locker.clone(), round_trips.clone(), stop.clone());
            manual.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(ttl / 3);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            locker.extend(&h, ttl).await;
                            round_trips.fetch_add(1, Ordering::Relaxed);
                        }
                        _ = stop.notified() => return,
                    }
                }
            }));
        }
    }
    let (cpu0, wall0) = (measure::cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
    let (cpu, wall) = (measure::cpu_time() - cpu0, wall0.elapsed());
    let rss = measure::rss_mib();
    let trips = match &*locker {
        Locker::Redlease(client) => client.stats().renewal_round_trips - before,
        _ => round_trips.load(Ordering::Relaxed),
    };
    stop.notify_waiters();
    for t in manual {
        t.abort();
    }
    let ticks = wall.as_secs_f64() / (ttl.as_secs_f64() / 3.0);
    Report {
        acquisitions: leases as u64,
        round_trips_per_tick: trips as f64 / ticks,
        cpu_percent: 100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        rss_mib: rss,
        ..Report::default()
    }
}
