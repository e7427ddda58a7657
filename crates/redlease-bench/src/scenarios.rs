//! The scenarios. Each runs every contender in rounds, rotating the order each round,
//! so that a noisy machine slows all of them alike; results are the median of rounds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::contenders::{Contender, Locker};
use crate::measure::{median, percentile};
use crate::worker::{Job, Report};

/// How long and how often to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub round: Duration,
    pub handoff_samples: usize,
    pub renewal_leases: usize,
    pub renewal_window: Duration,
}

/// One scenario's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub name: String,
    pub unit: String,
    /// Median over rounds per contender.
    pub results: BTreeMap<String, f64>,
    /// Every round's value per contender.
    pub rounds: BTreeMap<String, Vec<f64>>,
    /// Secondary metrics: metric → contender → value.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, BTreeMap<String, f64>>,
    /// Raw latency samples (µs) per contender, for distribution plots.
    #[serde(skip)]
    pub samples: BTreeMap<String, Vec<f64>>,
    pub higher_is_better: bool,
}

impl Outcome {
    fn new(name: &str, unit: &str, higher_is_better: bool) -> Self {
        Outcome {
            name: name.into(),
            unit: unit.into(),
            results: BTreeMap::new(),
            rounds: BTreeMap::new(),
            metrics: BTreeMap::new(),
            samples: BTreeMap::new(),
            higher_is_better,
        }
    }

    fn record(&mut self, contender: Contender, value: f64) {
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

    fn finish(mut self) -> Self {
        for (name, values) in &self.rounds {
            self.results.insert(name.clone(), median(values));
        }
        self
    }
}

/// The contenders in the order of round `r` (rotated).
fn order(contenders: &[Contender], r: usize) -> Vec<Contender> {
    let mut v = contenders.to_vec();
    let n = v.len();
    v.rotate_left(r % n.max(1));
    v
}

fn run_id() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

/// One task takes and releases distinct names back to back.
pub async fn uncontended_sequential(url: &str, contenders: &[Contender], plan: Plan) -> Outcome {
    let mut out = Outcome::new("uncontended-sequential", "ops/s", true);
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let locker = Locker::connect(c, url).await;
            // Warm up: connections, script caches.
            for i in 0..50 {
                let h = locker
                    .lock(
                        &format!("bench:warm:{id}:{}:{i}", c.name()),
                        Duration::from_secs(30),
                    )
                    .await;
                locker.unlock(h).await;
            }
            let start = Instant::now();
            let mut ops = 0u64;
            while start.elapsed() < plan.round {
                let name = format!("bench:seq:{id}:{}:{r}:{ops}", c.name());
                let held = locker.lock(&name, Duration::from_secs(30)).await;
                locker.unlock(held).await;
                ops += 1;
            }
            out.record(c, ops as f64 / start.elapsed().as_secs_f64());
        }
    }
    out.finish()
}

/// 64 tasks on one client take and release distinct names.
pub async fn uncontended_parallel(url: &str, contenders: &[Contender], plan: Plan) -> Outcome {
    let mut out = Outcome::new("uncontended-parallel-64", "ops/s", true);
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let locker = Arc::new(Locker::connect(c, url).await);
            let ops = Arc::new(AtomicU64::new(0));
            let start = Instant::now();
            let deadline = start + plan.round;
            let mut tasks = Vec::new();
            for t in 0..64 {
                let (locker, ops) = (locker.clone(), ops.clone());
                tasks.push(tokio::spawn(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let name = format!("bench:par:{id}:{}:{r}:{t}:{i}", c.name());
                        let held = locker.lock(&name, Duration::from_secs(30)).await;
                        locker.unlock(held).await;
                        ops.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            out.record(
                c,
                ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
            );
        }
    }
    out.finish()
}

/// 16 tasks in 2 OS processes (8 each, one client per process) contend for one name
/// with zero hold time. Also reports Redis commands per successful acquisition.
pub async fn contended(url: &str, contenders: &[Contender], plan: Plan) -> Outcome {
    contention("contended-1key-16", url, contenders, plan, None).await
}

/// The plain mutex against the fair one, in the contended set-up: what FIFO order
/// costs in throughput and buys in fairness and tail latency.
pub async fn fair_vs_unfair(url: &str, plan: Plan) -> Outcome {
    contention(
        "fair-vs-unfair",
        url,
        &[Contender::Redlease, Contender::RedleaseFair],
        plan,
        None,
    )
    .await
}

/// 16 tasks in 2 processes share a 4-permit semaphore with zero hold time: the classic
/// spin-polled sorted-set semaphore against redlease's.
pub async fn semaphore(url: &str, contenders: &[Contender], plan: Plan) -> Outcome {
    let contenders: Vec<Contender> = contenders
        .iter()
        .copied()
        .filter(|c| matches!(c, Contender::Raw | Contender::Redlease))
        .collect();
    contention("semaphore", url, &contenders, plan, Some(4)).await
}

async fn contention(
    scenario: &str,
    url: &str,
    contenders: &[Contender],
    plan: Plan,
    permits: Option<u32>,
) -> Outcome {
    let mut out = Outcome::new(scenario, "acquisitions/s", true);
    let mut commands: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut waits: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut jain: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let mut idle: BTreeMap<Contender, Vec<f64>> = BTreeMap::new();
    let id = run_id();
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let name = format!("bench:{scenario}:{id}:{}:{r}", c.name());
            let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64 + 700;
            let duration_ms = plan.round.as_millis() as u64;
            let job = match permits {
                None => Job::Contended {
                    contender: c,
                    url: url.into(),
                    name,
                    tasks: 8,
                    start_unix_ms: start,
                    duration_ms,
                },
                Some(limit) => Job::Semaphore {
                    contender: c,
                    url: url.into(),
                    name,
                    limit,
                    tasks: 8,
                    start_unix_ms: start,
                    duration_ms,
                },
            };
            let before = total_commands(url).await;
            let reports = run_workers(&[job.clone(), job]).await;
            let after = total_commands(url).await;
            let acquisitions: u64 = reports.iter().map(|r| r.acquisitions).sum();
            let per_task: Vec<f64> = reports
                .iter()
                .flat_map(|r| r.per_task.iter().map(|&x| x as f64))
                .collect();
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
            out.record(c, acquisitions as f64 / plan.round.as_secs_f64());
            commands
                .entry(c)
                .or_default()
                .push((after - before) as f64 / acquisitions.max(1) as f64);
        }
    }
    for (c, v) in commands {
        out.metric("redis_commands_per_acquisition", c, median(&v));
    }
    for (c, v) in jain {
        out.metric("fairness_jain_index", c, median(&v));
    }
    for (c, v) in idle {
        out.metric("tasks_starved_of_16", c, median(&v));
    }
    for (c, mut v) in waits {
        v.sort_by(f64::total_cmp);
        out.metric("wait_p50_us", c, percentile(&v, 0.5));
        out.metric("wait_p99_us", c, percentile(&v, 0.99));
    }
    out.finish()
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
pub async fn handoff(url: &str, contenders: &[Contender], plan: Plan, rtt_us: f64) -> Outcome {
    let mut out = Outcome::new("handoff-latency", "µs (p50)", false);
    let id = run_id();
    let per_round = plan.handoff_samples.div_ceil(plan.rounds.max(1));
    for r in 0..plan.rounds {
        for c in order(contenders, r) {
            let holder = Arc::new(Locker::connect(c, url).await);
            let waiter = Arc::new(Locker::connect(c, url).await);
            let name = format!("bench:handoff:{id}:{}:{r}", c.name());
            let mut samples = Vec::with_capacity(per_round);
            for _ in 0..per_round {
                let held = holder.lock(&name, Duration::from_secs(30)).await;
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
                let task = tokio::spawn({
                    let (waiter, name) = (waiter.clone(), name.clone());
                    async move {
                        let _ = ready_tx.send(());
                        let held = waiter.lock(&name, Duration::from_secs(30)).await;
                        let at = Instant::now();
                        waiter.unlock(held).await;
                        at
                    }
                });
                ready_rx.await.expect("waiter started");
                // Give the waiter time to make its first attempt and start waiting.
                tokio::time::sleep(HANDOFF_IDLE).await;
                let released = Instant::now();
                holder.unlock(held).await;
                let acquired = task.await.expect("waiter");
                samples.push(acquired.saturating_duration_since(released).as_secs_f64() * 1e6);
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
    let idle_rtt_us = idle_round_trip_us(url, per_round.max(50), HANDOFF_IDLE).await;
    for c in contenders {
        if let Some(samples) = out.samples.get_mut(c.name()) {
            samples.sort_by(f64::total_cmp);
            let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
            out.metric("p99_us", *c, p99);
            out.metric("p50_over_loopback_rtt", *c, p50 / rtt_us);
            out.metric("p50_over_idle_rtt", *c, p50 / idle_rtt_us);
            out.metric("idle_rtt_us", *c, idle_rtt_us);
        }
    }
    out.finish()
}

/// 10,000 leases held by one process with renewal: round trips per renewal tick, CPU
/// share and resident memory, each contender in a fresh process.
pub async fn renewal(url: &str, contenders: &[Contender], plan: Plan) -> Outcome {
    let mut out = Outcome::new("renewal-10k", "round trips per tick", false);
    // One round: each contender takes minutes of setup otherwise, and the figures
    // (counts, CPU, memory) are steady.
    for c in contenders {
        if *c == Contender::Rslock10ms {
            continue; // same renewal path as rslock
        }
        let job = Job::Renewal {
            contender: *c,
            url: url.into(),
            leases: plan.renewal_leases,
            ttl_ms: 3000,
            duration_ms: plan.renewal_window.as_millis() as u64,
        };
        let report = run_workers(&[job]).await.remove(0);
        out.record(*c, report.round_trips_per_tick);
        out.metric("cpu_percent_of_one_core", *c, report.cpu_percent);
        out.metric("rss_mib", *c, report.rss_mib);
    }
    out.finish()
}

/// Median round trip of a PING on loopback, in µs.
/// How long the holder waits before releasing in `handoff-latency`.
const HANDOFF_IDLE: Duration = Duration::from_millis(15);

/// The p50 of a PING sent after `idle` of silence: the round trip as a hand-over sees it.
async fn idle_round_trip_us(url: &str, samples: usize, idle: Duration) -> f64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        tokio::time::sleep(idle).await;
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(f64::total_cmp);
    percentile(&out, 0.5)
}

/// The p50 of back-to-back PINGs: the loopback round trip of a busy connection.
pub async fn loopback_rtt_us(url: &str) -> f64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let mut samples = Vec::new();
    for i in 0..2000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
        if i >= 200 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples.sort_by(f64::total_cmp);
    percentile(&samples, 0.5)
}

async fn total_commands(url: &str) -> u64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs jobs in child processes of this binary, in parallel, and collects their reports.
async fn run_workers(jobs: &[Job]) -> Vec<Report> {
    let exe = std::env::current_exe().expect("own path");
    let mut children = Vec::new();
    for job in jobs {
        let spec = serde_json::to_string(job).expect("job");
        let child = tokio::process::Command::new(&exe)
            .arg("worker")
            .arg(spec)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn worker");
        children.push(child);
    }
    let mut reports = Vec::new();
    for child in children {
        let output = child.wait_with_output().await.expect("worker");
        assert!(output.status.success(), "worker failed: {}", output.status);
        let line = String::from_utf8_lossy(&output.stdout);
        reports.push(serde_json::from_str(line.trim()).expect("worker report"));
    }
    reports
}
