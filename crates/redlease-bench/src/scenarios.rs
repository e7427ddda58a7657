//! The scenarios. Each runs every contender in rounds, rotating the order each round,
//! so that a noisy machine slows all of them alike; results are the median of rounds.
//!
//! Besides its result, every scenario measures, per contender and round, over the
//! contender's measured window (and nothing else):
//!
//! - `redis_cpu_us_per_op`: the server's CPU (`INFO cpu`: `used_cpu_user` +
//!   `used_cpu_sys`, sampled at the window's start and end on a connection of its own,
//!   less one `INFO`'s own cost, measured at start-up) ÷ the ops in the window;
//! - `client_cpu_us_per_op`: the CPU of the process(es) doing the work
//!   (`getrusage(RUSAGE_SELF)` user + system: the coordinator's delta for scenarios run
//!   in it, each worker process's delta over the same window, summed, for the others)
//!   ÷ the same ops;
//! - `redis_idle_cpu_us_per_op`: the part of `redis_cpu_us_per_op` the server spends
//!   idle anyway (its idle rate, measured at start-up, × the window ÷ the ops);
//!
//! each the median over rounds of the per-round figure; and `failures`: the calls of
//! the contender that failed (errors from lock, unlock, renew; a worker process that
//! died counts one), summed over rounds. What one op is: `Outcome::op`, per scenario.
//! Keys the bench leaves behind are deleted between windows, outside them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::contenders::{Contender, Locker};
use crate::measure::{self, RedisProbe, ServerSample, median, percentile};
use crate::worker::{Failures, Job, Report};

/// How long and how often to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub round: Duration,
    pub handoff_samples: usize,
    pub renewal_leases: usize,
    pub renewal_window: Duration,
}

/// What every scenario needs: the server, the plan, and the probe on the server's CPU.
pub struct Bench {
    pub url: String,
    pub plan: Plan,
    pub probe: RedisProbe,
}

/// One scenario's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub name: String,
    pub unit: String,
    /// What one operation is in the `*_per_op` metrics.
    pub op: String,
    /// Median over rounds per contender.
    pub results: BTreeMap<String, f64>,
    /// Every round's value per contender.
    pub rounds: BTreeMap<String, Vec<f64>>,
    /// Secondary metrics: metric → contender → value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Every round's value of the `*_per_op` metrics: metric → contender → rounds.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metric_rounds: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// The first failure's message per contender that failed.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub failure_examples: BTreeMap<String, String>,
    /// Raw latency samples (µs) per contender, for distribution plots.
    #[serde(skip)]
    pub samples: BTreeMap<String, Vec<f64>>,
    pub higher_is_better: bool,
    /// Per-round CPU figures per contender, reduced to medians by `finish`.
    #[serde(skip)]
    costs: BTreeMap<String, Vec<RoundCost>>,
    #[serde(skip)]
    failures: BTreeMap<String, u64>,
}

/// One round's CPU per op of one contender.
#[derive(Clone, Copy, Debug)]
struct RoundCost {
    redis_us: Option<f64>,
    idle_us: Option<f64>,
    client_us: Option<f64>,
}

impl Outcome {
    fn new(name: &str, unit: &str, op: &str, higher_is_better: bool) -> Self {
        Outcome {
            name: name.into(),
            unit: unit.into(),
            op: op.into(),
            results: BTreeMap::new(),
            rounds: BTreeMap::new(),
            metrics: BTreeMap::new(),
            metric_rounds: BTreeMap::new(),
            failure_examples: BTreeMap::new(),
            samples: BTreeMap::new(),
            higher_is_better,
            costs: BTreeMap::new(),
            failures: BTreeMap::new(),
        }
    }

    fn record(&mut self, contender: Contender, value: f64) {
        self.failures.entry(contender.name().into()).or_default();
        self.rounds
            .entry(contender.name().into())
            .or_default()
            .push(value);
    }

    fn metric(&mut self, metric: &str, contender: Contender, value: f64) {
        self.metrics
            .entry(metric.into())
            .or_default()
            .insert(contender.name().into(), value);
    }

    /// Counts `n` failures of `contender` (printing the first one of each scenario).
    fn fail(&mut self, contender: Contender, n: u64, example: Option<String>) {
        *self.failures.entry(contender.name().into()).or_default() += n;
        if n == 0 {
            return;
        }
        if let Some(e) = example {
            if !self.failure_examples.contains_key(contender.name()) {
                eprintln!("  {} failed: {e}", contender.name());
                self.failure_examples.insert(contender.name().into(), e);
            }
        }
    }

    fn fail_with(&mut self, contender: Contender, failures: &Failures) {
        self.fail(contender, failures.count(), failures.first());
    }

    /// Records one round's CPU: `redis_us` and `client_us` over a window of `secs`
    /// seconds in which `ops` operations succeeded.
    fn cost(
        &mut self,
        contender: Contender,
        redis_us: Option<f64>,
        client_us: Option<f64>,
        secs: f64,
        ops: f64,
        idle_us_per_s: f64,
    ) {
        if ops <= 0.0 {
            return;
        }
        self.costs
            .entry(contender.name().into())
            .or_default()
            .push(RoundCost {
                redis_us: redis_us.map(|v| v / ops),
                idle_us: redis_us.map(|_| idle_us_per_s * secs / ops),
                client_us: client_us.map(|v| v / ops),
            });
    }

    fn finish(mut self) -> Self {
        for (name, values) in &self.rounds {
            self.results.insert(name.clone(), median(values));
        }
        let costs = std::mem::take(&mut self.costs);
        for (name, rounds) in costs {
            let mut put = |metric: &str, pick: fn(&RoundCost) -> Option<f64>| {
                let v: Vec<f64> = rounds.iter().filter_map(pick).collect();
                if !v.is_empty() {
                    self.metrics
                        .entry(metric.into())
                        .or_default()
                        .insert(name.clone(), median(&v));
                    self.metric_rounds
                        .entry(metric.into())
                        .or_default()
                        .insert(name.clone(), v);
                }
            };
            put("redis_cpu_us_per_op", |r| r.redis_us);
            put("redis_idle_cpu_us_per_op", |r| r.idle_us);
            put("client_cpu_us_per_op", |r| r.client_us);
        }
        for (name, n) in std::mem::take(&mut self.failures) {
            self.metrics
                .entry("failures".into())
                .or_default()
                .insert(name, n as f64);
        }
        self
    }
}

/// An in-process measured window: the server's sample first, then this process's
/// CPU, so that neither sample's own work falls inside the other's window.
struct Window {
    server: Option<ServerSample>,
    cpu: Duration,
    at: Instant,
}

/// What a closed window measured.
struct Measured {
    redis_us: Option<f64>,
    client_us: f64,
    secs: f64,
}

impl Bench {
    async fn open(&self) -> Window {
        let server = self.probe.sample().await.ok();
        Window {
            server,
            cpu: measure::cpu_time(),
            at: Instant::now(),
        }
    }

    async fn close(&self, w: Window) -> Measured {
        let cpu = measure::cpu_time();
        let secs = w.at.elapsed().as_secs_f64();
        let server = self.probe.sample().await.ok();
        Measured {
            redis_us: match (w.server, server) {
                (Some(a), Some(b)) => Some(self.probe.cpu_between(a, b)),
                _ => None,
            },
            client_us: cpu.saturating_sub(w.cpu).as_secs_f64() * 1e6,
            secs,
        }
    }

    fn record_cost(&self, out: &mut Outcome, c: Contender, m: &Measured, ops: f64) {
        out.cost(
            c,
            m.redis_us,
            Some(m.client_us),
            m.secs,
            ops,
            self.probe.idle_us_per_s,
        );
    }

    /// Deletes the keys of the round just measured (outside every window).
    async fn cleanup(&self) {
        if let Err(e) = self.probe.cleanup().await {
            eprintln!("warning: key cleanup failed: {e}");
        }
    }
}

/// The contenders in the order of round `r` (rotated).
fn order(contenders: &[Contender], r: usize) -> Vec<Contender> {
    let mut v = contenders.to_vec();
    let n = v.len();
    v.rotate_left(r % n.max(1));
    v
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn run_id() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64
}

/// After a failed call a loop waits this long (a contender failing fast must not spin).
const FAILURE_BACKOFF: Duration = Duration::from_millis(1);

/// One task takes and releases distinct names back to back.
/// Op: one lock+unlock pair that succeeded.
pub async fn uncontended_sequential(b: &Bench, contenders: &[Contender]) -> Outcome {
    let mut out = Outcome::new("uncontended-sequential", "ops/s", "lock+unlock pair", true);
    let plan = b.plan;
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let locker = match Locker::connect(c, &b.url).await {
                Ok(l) => l,
                Err(e) => {
                    out.fail(c, 1, Some(e));
                    out.record(c, 0.0);
                    continue;
                }
            };
            let failures = Failures::default();
            // Warm up: connections, script caches.
            for i in 0..50 {
                let name = format!("bench:warm:{id}:{}:{i}", c.name());
                match locker.lock(&name, Duration::from_secs(30)).await {
                    Ok(h) => {
                        if let Err(e) = locker.unlock(h).await {
                            failures.add(e);
                        }
                    }
                    Err(e) => failures.add(e),
                }
            }
            let window = b.open().await;
            let start = Instant::now();
            let mut ops = 0u64;
            let mut i = 0u64;
            while start.elapsed() < plan.round {
                let name = format!("bench:seq:{id}:{}:{r}:{i}", c.name());
                i += 1;
                match locker.lock(&name, Duration::from_secs(30)).await {
                    Ok(held) => match locker.unlock(held).await {
                        Ok(()) => ops += 1,
                        Err(e) => failures.add(e),
                    },
                    Err(e) => {
                        failures.add(e);
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                    }
                }
            }
            let elapsed = start.elapsed().as_secs_f64();
            let measured = b.close(window).await;
            out.record(c, ops as f64 / elapsed);
            b.record_cost(&mut out, c, &measured, ops as f64);
            out.fail_with(c, &failures);
            drop(locker);
            b.cleanup().await;
        }
    }
    out.finish()
}

/// 64 tasks on one client take and release distinct names.
/// Op: one lock+unlock pair that succeeded.
pub async fn uncontended_parallel(b: &Bench, contenders: &[Contender]) -> Outcome {
    let mut out = Outcome::new("uncontended-parallel-64", "ops/s", "lock+unlock pair", true);
    let plan = b.plan;
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let locker = match Locker::connect(c, &b.url).await {
                Ok(l) => Arc::new(l),
                Err(e) => {
                    out.fail(c, 1, Some(e));
                    out.record(c, 0.0);
                    continue;
                }
            };
            let ops = Arc::new(AtomicU64::new(0));
            let failures = Arc::new(Failures::default());
            let window = b.open().await;
            let start = Instant::now();
            let deadline = start + plan.round;
            let mut tasks = Vec::new();
            for t in 0..64 {
                let (locker, ops, failures) = (locker.clone(), ops.clone(), failures.clone());
                tasks.push(tokio::spawn(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let name = format!("bench:par:{id}:{}:{r}:{t}:{i}", c.name());
                        i += 1;
                        match locker.lock(&name, Duration::from_secs(30)).await {
                            Ok(held) => match locker.unlock(held).await {
                                Ok(()) => {
                                    ops.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => failures.add(e),
                            },
                            Err(e) => {
                                failures.add(e);
                                tokio::time::sleep(FAILURE_BACKOFF).await;
                            }
                        }
                    }
                }));
            }
            for t in tasks {
                if let Err(e) = t.await {
                    failures.add(format!("task: {e}"));
                }
            }
            let elapsed = start.elapsed().as_secs_f64();
            let measured = b.close(window).await;
            let ops = ops.load(Ordering::Relaxed);
            out.record(c, ops as f64 / elapsed);
            b.record_cost(&mut out, c, &measured, ops as f64);
            out.fail_with(c, &failures);
            drop(locker);
            b.cleanup().await;
        }
    }
    out.finish()
}

/// What the contention workers loop over.
#[derive(Clone, Copy, Debug)]
enum Gate {
    /// One lock; `work_us` outside it and `hold_us` inside it per loop.
    Lock { work_us: u64, hold_us: u64 },
    /// One permit of a semaphore of `limit` permits; `work_us` outside it and `hold_us`
    /// holding it per loop.
    Semaphore { limit: u32, work_us: u64, hold_us: u64 },
}

/// 16 tasks in 2 OS processes (8 each, one client per process) contend for one name
/// with zero hold time. Also reports Redis commands per successful acquisition.
/// Op: one acquisition (taken in the window and released without error); the CPU of
/// all waiting (spinning, polling, wake-ups, failed attempts) is part of it.
pub async fn contended(b: &Bench, contenders: &[Contender]) -> Outcome {
    let gate = Gate::Lock {
        work_us: 0,
        hold_us: 0,
    };
    contention(b, "contended-1key-16", contenders, gate).await
}

/// 16 tasks in 2 OS processes (8 each, one client per process) loop: work 1 ms outside
/// the lock, take it, hold it 1 ms, release it. The lock is wanted far more than it is
/// free (16 × 1 ms held per ≈ 2 ms + hand-over of each task's loop), so the ideal
/// lock is never idle: `utilization` = acquisitions/s × measured mean hold.
///
/// "Work" and "hold" are sleeps, not busy loops: a lock is held across I/O (a database
/// write, a call to another service) far more often than across computation, and on a
/// 2-core machine 16 tasks spinning 2 ms per loop would make the CPU, not the lock, the
/// bottleneck (and a spinning task blocks the runtime thread that should run the
/// release or the wake-up). Tokio's timer has 1 ms granularity (a 1 ms
/// `tokio::time::sleep` lasts 1–2 ms), so the sleeps are on a `timerfd` instead
/// (`measure::Pause`); what they really last on a busy machine is measured all the same
/// and reported (`hold_mean_us`, `work_mean_us`), and utilization uses the measured
/// hold.
/// Op: one acquisition, as in `contended-1key-16`.
pub async fn contended_hold(b: &Bench, contenders: &[Contender]) -> Outcome {
    let gate = Gate::Lock {
        work_us: 1000,
        hold_us: 1000,
    };
    contention(b, "contended-hold-1ms", contenders, gate).await
}

/// The plain mutex against the fair one, in the contended set-up: what FIFO order
/// costs in throughput and buys in fairness and tail latency. Op: one acquisition.
pub async fn fair_vs_unfair(b: &Bench) -> Outcome {
    let gate = Gate::Lock {
        work_us: 0,
        hold_us: 0,
    };
    contention(
        b,
        "fair-vs-unfair",
        &[Contender::Redlease, Contender::RedleaseFair],
        gate,
    )
    .await
}

/// 16 tasks in 2 processes share a 4-permit semaphore with zero hold time: the classic
/// spin-polled sorted-set semaphore against redlease's. Op: one permit acquired (in
/// the window) and released without error.
pub async fn semaphore(b: &Bench, contenders: &[Contender]) -> Outcome {
    let contenders = with_a_semaphore(contenders);
    let gate = Gate::Semaphore {
        limit: 4,
        work_us: 0,
        hold_us: 0,
    };
    contention(b, "semaphore", &contenders, gate).await
}

/// The semaphore with real work, as `contended-hold-1ms` is for the lock: 16 tasks in
/// 2 processes share a 4-permit semaphore, each loop working 1 ms outside it and holding
/// a permit 1 ms (on the same `timerfd` sleeps). The permits are wanted far more than
/// they are free, so the ideal semaphore never has one idle: `utilization` =
/// acquisitions/s × measured mean hold ÷ 4. Op: one permit acquired and released.
pub async fn semaphore_hold(b: &Bench, contenders: &[Contender]) -> Outcome {
    let contenders = with_a_semaphore(contenders);
    let gate = Gate::Semaphore {
        limit: 4,
        work_us: 1000,
        hold_us: 1000,
    };
    contention(b, "semaphore-hold-1ms", &contenders, gate).await
}

/// The contenders that have a semaphore.
fn with_a_semaphore(contenders: &[Contender]) -> Vec<Contender> {
    contenders
        .iter()
        .copied()
        .filter(|c| matches!(c, Contender::Raw | Contender::Redlease))
        .collect()
}

/// Workers per contention round and tasks per worker.
const PROCESSES: usize = 2;
const TASKS_PER_PROCESS: usize = 8;
/// How long before the window the workers are started (their set-up).
const LEAD: Duration = Duration::from_millis(700);

async fn contention(b: &Bench, scenario: &str, contenders: &[Contender], gate: Gate) -> Outcome {
    let op = match gate {
        Gate::Semaphore { .. } => "permit acquired and released",
        Gate::Lock { .. } => "acquisition (lock+unlock)",
    };
    let mut out = Outcome::new(scenario, "acquisitions/s", op, true);
    let plan = b.plan;
    let round_secs = plan.round.as_secs_f64();
    let mut commands: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut waits: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut jain: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut idle: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut utilization: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut hold_mean: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut work_mean: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let name = format!("bench:{scenario}:{id}:{}:{r}", c.name());
            let start_unix_ms = unix_ms() + LEAD.as_millis() as u64;
            let duration_ms = plan.round.as_millis() as u64;
            let job = match gate {
                Gate::Lock { work_us, hold_us } => Job::Contended {
                    contender: c,
                    url: b.url.clone(),
                    name,
                    tasks: TASKS_PER_PROCESS,
                    start_unix_ms,
                    duration_ms,
                    work_us,
                    hold_us,
                },
                Gate::Semaphore {
                    limit,
                    work_us,
                    hold_us,
                } => Job::Semaphore {
                    contender: c,
                    url: b.url.clone(),
                    name,
                    limit,
                    tasks: TASKS_PER_PROCESS,
                    start_unix_ms,
                    duration_ms,
                    work_us,
                    hold_us,
                },
            };
            let workers = spawn_workers(&vec![job; PROCESSES], LEAD + plan.round + WORKER_SLACK);
            // The window is the workers' own: sample the server at its start and end.
            sleep_until_unix_ms(start_unix_ms).await;
            let s0 = b.probe.sample().await.ok();
            sleep_until_unix_ms(start_unix_ms + duration_ms).await;
            let s1 = b.probe.sample().await.ok();
            let mut reports: Vec<Report> = Vec::new();
            for result in collect_workers(workers).await {
                match result {
                    Ok(report) => {
                        if report.late_ms > 0 {
                            eprintln!(
                                "  warning: a {} worker was {} ms late for its window (set-up longer than {LEAD:?})",
                                c.name(),
                                report.late_ms
                            );
                        }
                        out.fail(c, report.failures, report.failure_example.clone());
                        reports.push(report);
                    }
                    // A worker that died: one failure; its tasks count as having
                    // acquired nothing.
                    Err(e) => out.fail(c, 1, Some(e)),
                }
            }
            let acquisitions: u64 = reports.iter().map(|r| r.acquisitions).sum();
            let mut per_task: Vec<f64> = reports
                .iter()
                .flat_map(|r| r.per_task.iter().map(|&x| x as f64))
                .collect();
            per_task.resize(PROCESSES * TASKS_PER_PROCESS, 0.0);
            jain.entry(c).or_default().push(jain_index(&per_task));
            let starved = per_task
                .iter()
                .filter(|&&x| x < acquisitions as f64 / per_task.len() as f64 / 10.0)
                .count();
            idle.entry(c).or_default().push(starved as f64);
            waits
                .entry(c)
                .or_default()
                .extend(reports.iter().flat_map(|r| r.waits_us.iter().copied()));
            out.record(c, acquisitions as f64 / round_secs);
            let (redis_us, cmds) = match (s0, s1) {
                (Some(a), Some(b2)) => (
                    Some(b.probe.cpu_between(a, b2)),
                    Some(RedisProbe::commands_between(a, b2)),
                ),
                _ => (None, None),
            };
            let client_us: f64 = reports.iter().map(|r| r.client_cpu_us).sum();
            out.cost(
                c,
                redis_us,
                (!reports.is_empty()).then_some(client_us),
                round_secs,
                acquisitions as f64,
                b.probe.idle_us_per_s,
            );
            if let (Some(cmds), true) = (cmds, acquisitions > 0) {
                commands
                    .entry(c)
                    .or_default()
                    .push(cmds as f64 / acquisitions as f64);
            }
            let (hold_us, units) = match gate {
                Gate::Lock { hold_us, .. } => (hold_us, 1.0),
                Gate::Semaphore { limit, hold_us, .. } => (hold_us, f64::from(limit)),
            };
            if hold_us > 0 {
                let held_us: f64 = reports.iter().map(|r| r.hold_us_total).sum();
                utilization
                    .entry(c)
                    .or_default()
                    .push(held_us / 1e6 / round_secs / units);
                if acquisitions > 0 {
                    hold_mean
                        .entry(c)
                        .or_default()
                        .push(held_us / acquisitions as f64);
                }
                let works: u64 = reports.iter().map(|r| r.works).sum();
                if works > 0 {
                    let work_us: f64 = reports.iter().map(|r| r.work_us_total).sum();
                    work_mean.entry(c).or_default().push(work_us / works as f64);
                }
            }
            b.cleanup().await;
        }
    }
    for (c, v) in commands {
        out.metric("redis_commands_per_acquisition", c, median(&v));
    }
    for (c, v) in utilization {
        out.metric("utilization", c, median(&v));
    }
    for (c, v) in hold_mean {
        out.metric("hold_mean_us", c, median(&v));
    }
    for (c, v) in work_mean {
        out.metric("work_mean_us", c, median(&v));
    }
    for (c, v) in jain {
        out.metric("fairness_jain_index", c, median(&v));
    }
    for (c, v) in idle {
        out.metric("tasks_starved_of_16", c, median(&v));
    }
    for (c, mut v) in waits {
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        out.metric("wait_p50_us", c, percentile(&v, 0.5));
        out.metric("wait_p99_us", c, percentile(&v, 0.99));
    }
    out.finish()
}

async fn sleep_until_unix_ms(at_ms: u64) {
    tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(unix_ms()))).await;
}

/// Jain's fairness index of per-task shares: 1 = perfectly even, 1/n = one task got all.
fn jain_index(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        0.0
    } else {
        sum * sum / (x.len() as f64 * sq)
    }
}

/// Time from the holder starting its release to the waiter holding the lock.
/// Op: one hand-over sample: the holder's lock+unlock, the waiter's lock (with all its
/// waiting) +unlock, and the holder's 15 ms idle sleep before releasing.
pub async fn handoff(b: &Bench, contenders: &[Contender], rtt_us: f64) -> Outcome {
    let mut out = Outcome::new(
        "handoff-latency",
        "µs (p50)",
        "hand-over (2 lock+unlock pairs, 15 ms idle)",
        false,
    );
    let plan = b.plan;
    let id = run_id();
    let per_round = plan.handoff_samples.div_ceil(plan.rounds.max(1));
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let (holder, waiter) = match (Locker::connect(c, &b.url).await, Locker::connect(c, &b.url).await)
            {
                (Ok(h), Ok(w)) => (Arc::new(h), Arc::new(w)),
                (Err(e), _) | (_, Err(e)) => {
                    out.fail(c, 1, Some(e));
                    continue;
                }
            };
            let failures = Failures::default();
            let name = format!("bench:handoff:{id}:{}:{r}", c.name());
            let mut samples = Vec::with_capacity(per_round);
            let window = b.open().await;
            for _ in 0..per_round {
                let taken =
                    tokio::time::timeout(HANDOFF_LIMIT, holder.lock(&name, Duration::from_secs(30))).await;
                let held = match taken {
                    Ok(Ok(h)) => h,
                    Ok(Err(e)) => {
                        failures.add(e);
                        tokio::time::sleep(FAILURE_BACKOFF).await;
                        continue;
                    }
                    Err(_) => {
                        failures.add(format!(
                            "the holder did not get the lock within {HANDOFF_LIMIT:?}"
                        ));
                        continue;
                    }
                };
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
                let mut task = tokio::spawn({
                    let (waiter, name) = (waiter.clone(), name.clone());
                    async move {
                        let _ = ready_tx.send(());
                        let held = waiter.lock(&name, Duration::from_secs(30)).await?;
                        let at = Instant::now();
                        waiter.unlock(held).await?;
                        Ok::<Instant, String>(at)
                    }
                });
                let _ = ready_rx.await;
                // Give the waiter time to make its first attempt and start waiting.
                tokio::time::sleep(HANDOFF_IDLE).await;
                let released = Instant::now();
                if let Err(e) = holder.unlock(held).await {
                    failures.add(e);
                }
                match tokio::time::timeout(HANDOFF_LIMIT, &mut task).await {
                    Ok(Ok(Ok(acquired))) => {
                        samples.push(acquired.saturating_duration_since(released).as_secs_f64() * 1e6)
                    }
                    Ok(Ok(Err(e))) => failures.add(e),
                    Ok(Err(e)) => failures.add(format!("waiter task: {e}")),
                    Err(_) => {
                        task.abort();
                        failures.add(format!(
                            "the waiter did not get the lock within {HANDOFF_LIMIT:?}"
                        ));
                    }
                }
            }
            let measured = b.close(window).await;
            b.record_cost(&mut out, c, &measured, samples.len() as f64);
            out.fail_with(c, &failures);
            drop((holder, waiter));
            b.cleanup().await;
            if samples.is_empty() {
                continue;
            }
            out.samples
                .entry(c.name().into())
                .or_default()
                .extend(samples.iter().copied());
            samples.sort_by(f64::total_cmp);
            out.record(c, percentile(&samples, 0.5));
        }
    }
    // A hand-over starts after the holder slept (as every waiter did): on an idle
    // machine the first round trip after a sleep pays for waking the client and the
    // server up. Measure that round trip the same way, so the ratio can be read both
    // against a busy loop's round trip and against this one.
    let idle_rtt_us = idle_round_trip_us(&b.url, per_round.max(50), HANDOFF_IDLE).await;
    for c in contenders {
        if let Some(samples) = out.samples.get_mut(c.name()) {
            samples.sort_by(f64::total_cmp);
            let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
            out.metric("p99_us", *c, p99);
            out.metric("p50_over_loopback_rtt", *c, p50 / rtt_us);
            if let Some(idle_rtt_us) = idle_rtt_us {
                out.metric("p50_over_idle_rtt", *c, p50 / idle_rtt_us);
                out.metric("idle_rtt_us", *c, idle_rtt_us);
            }
        }
    }
    out.finish()
}

/// How long a hand-over may take before the sample counts as a failure.
const HANDOFF_LIMIT: Duration = Duration::from_secs(5);

/// 10,000 leases held by one process with renewal: round trips per renewal tick, CPU
/// share and resident memory, each contender in a fresh process.
/// Op: one lease kept for one renewal interval (ttl/3 = 1 s): the leases still held at
/// the end of the window × the intervals in the window. The server's CPU is sampled by
/// the worker around its own window (it alone knows when taking the leases is over).
pub async fn renewal(b: &Bench, contenders: &[Contender]) -> Outcome {
    let mut out = Outcome::new(
        "renewal-10k",
        "round trips per tick",
        "lease kept for one renewal interval",
        false,
    );
    let plan = b.plan;
    // One round: each contender takes minutes of setup otherwise, and the figures
    // (counts, CPU, memory) are steady.
    for c in contenders {
        if *c == Contender::Rslock10ms {
            continue; // same renewal path as rslock
        }
        let job = Job::Renewal {
            contender: *c,
            url: b.url.clone(),
            leases: plan.renewal_leases,
            ttl_ms: 3000,
            duration_ms: plan.renewal_window.as_millis() as u64,
        };
        let limit = plan.renewal_window + Duration::from_secs(120);
        let result = collect_workers(spawn_workers(&[job], limit)).await.remove(0);
        b.cleanup().await;
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                out.fail(*c, 1, Some(e));
                continue;
            }
        };
        out.fail(*c, report.failures, report.failure_example.clone());
        out.record(*c, report.round_trips_per_tick);
        out.metric("cpu_percent_of_one_core", *c, report.cpu_percent);
        out.metric("rss_mib", *c, report.rss_mib);
        let redis_us = report.redis_cpu_us.map(|v| (v - b.probe.info_cost_us).max(0.0));
        out.cost(
            *c,
            redis_us,
            Some(report.client_cpu_us),
            plan.renewal_window.as_secs_f64(),
            report.ops,
            b.probe.idle_us_per_s,
        );
    }
    out.finish()
}

/// How long the holder waits before releasing in `handoff-latency`.
const HANDOFF_IDLE: Duration = Duration::from_millis(15);

/// The p50 of a PING sent after `idle` of silence: the round trip as a hand-over sees it.
async fn idle_round_trip_us(url: &str, samples: usize, idle: Duration) -> Option<f64> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        tokio::time::sleep(idle).await;
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.ok()?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(f64::total_cmp);
    Some(percentile(&out, 0.5))
}

/// The p50 of back-to-back PINGs: the loopback round trip of a busy connection.
pub async fn loopback_rtt_us(url: &str) -> Result<f64, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connect {url}: {e}"))?;
    let mut samples = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("PING: {e}"))?;
        if i >= 200 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(percentile(&samples, 0.5))
}

/// How long a contention worker may overrun its window before it is killed.
const WORKER_SLACK: Duration = Duration::from_secs(30);

type WorkerHandle = tokio::task::JoinHandle<Result<Report, String>>;

/// Starts jobs in child processes of this binary, each collected by a task of its own
/// (its output read as it comes, so a chatty worker never blocks on a full pipe), and
/// killed if it runs longer than `limit`.
fn spawn_workers(jobs: &[Job], limit: Duration) -> Vec<WorkerHandle> {
    jobs.iter()
        .map(|job| {
            let job = job.clone();
            tokio::spawn(async move {
                let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
                let spec = serde_json::to_string(&job).map_err(|e| format!("job: {e}"))?;
                let child = tokio::process::Command::new(&exe)
                    .arg("worker")
                    .arg(spec)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| format!("spawn worker: {e}"))?;
                let output = match tokio::time::timeout(limit, child.wait_with_output()).await {
                    Ok(Ok(output)) => output,
                    Ok(Err(e)) => return Err(format!("worker: {e}")),
                    Err(_) => return Err(format!("worker still running after {limit:?}: killed")),
                };
                let stderr = String::from_utf8_lossy(&output.stderr);
                if !output.status.success() {
                    // The end of what it said (a panic's message), not all of it.
                    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    let mut said = tail.join(" | ");
                    if said.len() > 400 {
                        let mut cut = 400;
                        while !said.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        said.truncate(cut);
                    }
                    return Err(format!("worker died ({}): {said}", output.status));
                }
                for line in stderr.lines().take(5) {
                    eprintln!("  worker: {line}");
                }
                let line = String::from_utf8_lossy(&output.stdout);
                serde_json::from_str(line.trim()).map_err(|e| format!("worker report: {e}"))
            })
        })
        .collect()
}

async fn collect_workers(handles: Vec<WorkerHandle>) -> Vec<Result<Report, String>> {
    let mut reports = Vec::with_capacity(handles.len());
    for h in handles {
        reports.push(match h.await {
            Ok(result) => result,
            Err(e) => Err(format!("worker collector: {e}")),
        });
    }
    reports
}
