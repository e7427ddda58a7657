//! Work that runs in child processes: contention across OS processes, and renewal load
//! measured in a process of its own (so CPU time and memory belong to one contender).
//!
//! The coordinator starts `redlease-bench worker <json spec>`; the worker prints one
//! JSON line with its results. A contender's failure (an error from its lock, unlock or
//! renewal call) never ends a worker: it is counted in the report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::contenders::{Contender, Held, Locker, PermitHeld, Permitter};
use crate::measure::{self, RedisProbe};

/// What a worker process is asked to do.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Job {
    /// `tasks` tasks on one client loop over `name` from `start_unix_ms` for
    /// `duration_ms`: work `work_us` outside the lock, lock, hold `hold_us`, unlock
    /// (both zero: lock/unlock back to back).
    Contended {
        contender: Contender,
        url: String,
        name: String,
        tasks: usize,
        start_unix_ms: u64,
        duration_ms: u64,
        #[serde(default)]
        work_us: u64,
        #[serde(default)]
        hold_us: u64,
    },
    /// `tasks` tasks on one client loop acquire/release of one permit of the `limit`-permit
    /// semaphore `name`, working `work_us` outside it and holding it `hold_us` (both
    /// zero: back to back).
    Semaphore {
        contender: Contender,
        url: String,
        name: String,
        limit: u32,
        tasks: usize,
        start_unix_ms: u64,
        duration_ms: u64,
        #[serde(default)]
        work_us: u64,
        #[serde(default)]
        hold_us: u64,
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
    /// Successful acquisitions in the window: acquired before the deadline and
    /// released without error (contended, semaphore).
    pub acquisitions: u64,
    /// Acquisitions of each task (contended).
    pub per_task: Vec<u64>,
    /// Time from calling lock to holding the lock, µs, per acquisition (contended; sampled).
    pub waits_us: Vec<f64>,
    /// Sum of the measured hold times of the counted acquisitions (lock returned →
    /// unlock called), µs.
    pub hold_us_total: f64,
    /// Sum and number of the measured work periods (outside the lock), µs.
    pub work_us_total: f64,
    pub works: u64,
    /// Renewal round trips per renewal interval.
    pub round_trips_per_tick: f64,
    /// CPU time over wall time during the measured window, in percent of one core.
    pub cpu_percent: f64,
    pub rss_mib: f64,
    /// This process's CPU (`getrusage(RUSAGE_SELF)`, user + system) over the measured
    /// window, µs.
    pub client_cpu_us: f64,
    /// Operations in the window for the CPU metrics where they are not `acquisitions`
    /// (renewal: lease-intervals).
    pub ops: f64,
    /// Renewal: server CPU between the worker's own `INFO` samples around its window,
    /// µs, not yet less the samples' cost (the coordinator knows it).
    pub redis_cpu_us: Option<f64>,
    /// Calls of the contender that failed, and the first failure's message.
    pub failures: u64,
    pub failure_example: Option<String>,
    /// How late the worker was ready for its window's start (setup took longer than
    /// the coordinator's lead), ms.
    pub late_ms: u64,
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
            work_us,
            hold_us,
        } => {
            let gate = Locker::connect(contender, &url).await.map(Gate::Lock);
            let pace = Pace {
                work: Duration::from_micros(work_us),
                hold: Duration::from_micros(hold_us),
            };
            contended(gate, &name, tasks, start_unix_ms, duration_ms, pace).await
        }
        Job::Semaphore {
            contender,
            url,
            name,
            limit,
            tasks,
            start_unix_ms,
            duration_ms,
            work_us,
            hold_us,
        } => {
            let gate = match Permitter::connect(contender, &url).await {
                Ok(Some(p)) => Ok(Gate::Semaphore(p, limit)),
                Ok(None) => Err(format!("{} has no semaphore", contender.name())),
                Err(e) => Err(e),
            };
            let pace = Pace {
                work: Duration::from_micros(work_us),
                hold: Duration::from_micros(hold_us),
            };
            contended(gate, &name, tasks, start_unix_ms, duration_ms, pace).await
        }
        Job::Renewal {
            contender,
            url,
            leases,
            ttl_ms,
            duration_ms,
        } => renewal(contender, &url, leases, ttl_ms, duration_ms).await,
    }
}

/// A lock or a semaphore, behind the two calls the contention loop makes.
enum Gate {
    Lock(Locker),
    Semaphore(Permitter, u32),
}

enum Taken {
    Lock(Held),
    Permit(PermitHeld),
}

impl Gate {
    async fn take(&self, name: &str, ttl: Duration) -> Result<Taken, String> {
        match self {
            Gate::Lock(l) => l.lock(name, ttl).await.map(Taken::Lock),
            Gate::Semaphore(p, limit) => p.acquire(name, *limit, ttl).await.map(Taken::Permit),
        }
    }

    async fn give(&self, taken: Taken) -> Result<(), String> {
        match (self, taken) {
            (Gate::Lock(l), Taken::Lock(h)) => l.unlock(h).await,
            (Gate::Semaphore(p, _), Taken::Permit(h)) => p.release(h).await,
            _ => Err("released through the wrong gate".into()),
        }
    }
}

/// Time spent outside and inside the lock per loop of a contention task.
#[derive(Clone, Copy, Debug, Default)]
struct Pace {
    work: Duration,
    hold: Duration,
}

/// Failures of one process, shared by its tasks.
#[derive(Default)]
pub struct Failures {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Failures {
    pub fn add(&self, message: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert(message);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn first(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn fill(&self, report: &mut Report) {
        report.failures += self.count.load(Ordering::Relaxed);
        if report.failure_example.is_none() {
            report.failure_example = self.first.lock().unwrap_or_else(|e| e.into_inner()).clone();
        }
    }
}

/// After a failed call a task waits this long, so that a contender failing fast (a
/// broken connection) does not spin and take the CPU from the processes that work.
const FAILURE_BACKOFF: Duration = Duration::from_millis(1);

/// Sleeps until the window start, then returns the window's deadline (the window is
/// `[start_unix_ms, start_unix_ms + duration_ms]` on the wall clock, the same for every
/// worker and the coordinator's Redis samples) and how late this worker was.
async fn window(start_unix_ms: u64, duration_ms: u64) -> (Instant, u64) {
    let now_ms = unix_ms();
    let late_ms = now_ms.saturating_sub(start_unix_ms);
    tokio::time::sleep(Duration::from_millis(start_unix_ms.saturating_sub(now_ms))).await;
    let end_ms = start_unix_ms + duration_ms;
    (
        Instant::now() + Duration::from_millis(end_ms.saturating_sub(unix_ms())),
        late_ms,
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// The contention loop of `tasks` tasks on one client, measured over the window.
///
/// An acquisition counts when the lock was taken before the deadline and released
/// without error; its wait (lock called → lock held) and hold (lock held → unlock
/// called) are recorded with it. The process's CPU is read at the window's start and,
/// by a timer task, at its deadline.
async fn contended(
    gate: Result<Gate, String>,
    name: &str,
    tasks: usize,
    start_unix_ms: u64,
    duration_ms: u64,
    pace: Pace,
) -> Report {
    let failures = Arc::new(Failures::default());
    let gate = match gate {
        Ok(g) => Arc::new(g),
        Err(e) => {
            failures.add(e);
            let mut report = Report::default();
            failures.fill(&mut report);
            return report;
        }
    };
    let (deadline, late_ms) = window(start_unix_ms, duration_ms).await;
    let cpu0 = measure::cpu_time();
    let cpu_at_deadline = tokio::spawn(async move {
        tokio::time::sleep_until(deadline.into()).await;
        measure::cpu_time()
    });
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (gate, name, failures) = (gate.clone(), name.to_owned(), failures.clone());
        handles.push(tokio::spawn(async move {
            let mut t = TaskTally::default();
            let pause = measure::Pause::new();
            while Instant::now() < deadline {
                if !pace.work.is_zero() {
                    let worked = Instant::now();
                    pause.sleep(pace.work).await;
                    t.work_us += worked.elapsed().as_secs_f64() * 1e6;
                    t.works += 1;
                }
                let asked = Instant::now();
                let taken = match gate.take(&name, Duration::from_secs(10)).await {
                    Ok(taken) => taken,
                    Err(e) => {
                        failures.add(e);
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                        continue;
                    }
                };
                let got = Instant::now();
                if !pace.hold.is_zero() {
                    pause.sleep(pace.hold).await;
                }
                let held = got.elapsed();
                match gate.give(taken).await {
                    Ok(()) if got < deadline => {
                        t.count += 1;
                        t.hold_us += held.as_secs_f64() * 1e6;
                        if t.waits.len() < 20_000 {
                            t.waits.push((got - asked).as_secs_f64() * 1e6);
                        }
                    }
                    Ok(()) => {}
                    Err(e) => {
                        failures.add(e);
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                    }
                }
            }
            t
        }));
    }
    let mut report = Report {
        late_ms,
        ..Report::default()
    };
    for h in handles {
        match h.await {
            Ok(t) => {
                report.acquisitions += t.count;
                report.per_task.push(t.count);
                report.waits_us.extend(t.waits);
                report.hold_us_total += t.hold_us;
                report.work_us_total += t.work_us;
                report.works += t.works;
            }
            Err(e) => {
                failures.add(format!("task: {e}"));
                report.per_task.push(0);
            }
        }
    }
    let cpu1 = cpu_at_deadline.await.unwrap_or_else(|_| measure::cpu_time());
    report.client_cpu_us = cpu1.saturating_sub(cpu0).as_secs_f64() * 1e6;
    failures.fill(&mut report);
    report
}

#[derive(Default)]
struct TaskTally {
    count: u64,
    waits: Vec<f64>,
    hold_us: f64,
    work_us: f64,
    works: u64,
}

async fn renewal(contender: Contender, url: &str, leases: usize, ttl_ms: u64, duration_ms: u64) -> Report {
    let ttl = Duration::from_millis(ttl_ms);
    let failures = Arc::new(Failures::default());
    let mut report = Report::default();
    let locker = match Locker::connect(contender, url).await {
        Ok(l) => Arc::new(l),
        Err(e) => {
            failures.add(e);
            failures.fill(&mut report);
            return report;
        }
    };
    // Take every lock first (not measured).
    let mut held = Vec::with_capacity(leases);
    for i in 0..leases {
        match locker
            .lock(&format!("bench:renewal:{}:{i}", contender.name()), ttl)
            .await
        {
            Ok(h) => held.push(h),
            Err(e) => failures.add(e),
        }
    }
    let held_at_start = held.len();
    let round_trips = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let before = match &*locker {
        Locker::Redlease(client) => client.stats().renewal_round_trips,
        _ => 0,
    };
    let mut manual = Vec::new();
    if !matches!(&*locker, Locker::Redlease(_)) {
        // Without auto-renewal each lock needs its own timer: what users of raw
        // commands and rslock write by hand. A lease whose extension fails is lost:
        // its timer stops, as a user's would.
        let held: Vec<Arc<Held>> = held.drain(..).map(Arc::new).collect();
        for h in held {
            let (locker, round_trips, lost, stop, failures) = (
                locker.clone(),
                round_trips.clone(),
                lost.clone(),
                stop.clone(),
                failures.clone(),
            );
            manual.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(ttl / 3);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            let result = locker.extend(&h, ttl).await;
                            round_trips.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = result {
                                lost.fetch_add(1, Ordering::Relaxed);
                                failures.add(e);
                                return;
                            }
                        }
                        _ = stop.notified() => return,
                    }
                }
            }));
        }
    }
    // The server's CPU is sampled here, around this process's own window: the
    // coordinator cannot know when taking the leases ends.
    let probe = match RedisProbe::connect(url).await {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("warning: no Redis CPU for renewal-10k {}: {e}", contender.name());
            None
        }
    };
    let server0 = match &probe {
        Some(p) => p.sample().await.ok(),
        None => None,
    };
    let (cpu0, wall0) = (measure::cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
    let (cpu, wall) = (measure::cpu_time().saturating_sub(cpu0), wall0.elapsed());
    let server1 = match &probe {
        Some(p) => p.sample().await.ok(),
        None => None,
    };
    let rss = measure::rss_mib();
    let trips = match &*locker {
        Locker::Redlease(client) => client.stats().renewal_round_trips - before,
        _ => round_trips.load(Ordering::Relaxed),
    };
    // Leases lost by the end of the window: a failed extension (raw, rslock), or a
    // redlease guard that no longer holds its lease.
    let lost = match &*locker {
        Locker::Redlease(_) => {
            let gone = held
                .iter()
                .filter(|h| matches!(h, Held::Redlease(g) if !g.is_held()))
                .count() as u64;
            for _ in 0..gone {
                failures.add("renewal: a lease was lost".into());
            }
            gone
        }
        _ => lost.load(Ordering::Relaxed),
    };
    stop.notify_waiters();
    for t in manual {
        t.abort();
    }
    let ticks = wall.as_secs_f64() / (ttl.as_secs_f64() / 3.0);
    report.acquisitions = held_at_start as u64;
    report.round_trips_per_tick = trips as f64 / ticks;
    report.cpu_percent = 100.0 * cpu.as_secs_f64() / wall.as_secs_f64();
    report.rss_mib = rss;
    report.client_cpu_us = cpu.as_secs_f64() * 1e6;
    // One op = one lease kept for one renewal interval (ttl/3): the leases still held
    // at the end of the window times the intervals in it.
    report.ops = (held_at_start as u64).saturating_sub(lost) as f64 * ticks;
    report.redis_cpu_us = match (server0, server1) {
        (Some(a), Some(b)) => Some(b.cpu_us - a.cpu_us),
        _ => None,
    };
    failures.fill(&mut report);
    report
}
