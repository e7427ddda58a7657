//! The coordinator: runs the phases of a torture run.
//!
//! For each phase it starts a fresh lock server (through the test kit) behind a fault
//! proxy — or, for `cluster`, a 3-master Redis Cluster — resets the resource's
//! counters, starts the worker processes, injects the phase's faults until its time is
//! up, stops the workers, and hands the resource's log and the workers' reports to the
//! checker, one lock's counter at a time; under `extend` and `cluster` it also lists
//! every lease lost, which nothing there explains.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlease_testkit::{Persistence, Proxy, RedisCluster, RedisServer};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::algorithms::{Algorithm, PREFIX};
use crate::checker::{self, CsReport, Outcome, Tally, Verdict};
use crate::clock::mono_ns;
use crate::faults::{Event, Fault};
use crate::resource::Resource;
use crate::rng::Rng;
use crate::worker::{Spec, cs_client};

/// One phase: which faults, for how long.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub faults: Vec<Fault>,
    pub duration: Duration,
}

/// Everything a run needs.
pub struct Config {
    pub mode: String,
    pub phases: Vec<Phase>,
    pub algorithms: Vec<Arc<dyn Algorithm>>,
    pub workers: usize,
    pub groups: usize,
    pub tasks: usize,
    pub ttl: Duration,
    pub response_timeout: Duration,
    pub retry_window: Duration,
    pub acquire_timeout: Duration,
    pub work_max: Duration,
    /// How many critical sections in a thousand work 0.3-0.7 x TTL instead (renewal
    /// keeps their lease, unless a fault stops it).
    pub long_work_per_mille: u64,
    pub seed: u64,
}

impl Config {
    pub fn clients_per_algorithm(&self) -> usize {
        self.workers * self.groups * self.tasks
    }
}

/// One row of the results: one algorithm in one phase.
#[derive(Clone, Debug)]
pub struct Row {
    pub algorithm: String,
    /// Whether a violation in this row fails the run.
    pub must_be_safe: bool,
    /// A baseline: never must be safe, there to show that the checker bites.
    pub baseline: bool,
    pub fenced: bool,
    pub phase: String,
    pub faults: Vec<Fault>,
    pub seconds: f64,
    pub fault_events: usize,
    /// How many locks (each with its own counter) the algorithm ran on.
    pub locks: usize,
    /// Under faults that cannot end a lease (`extend`, `cluster`): the `lost()` signals,
    /// every one unexplained — a defect; `None` under other faults.
    pub lost_unexplained: Option<u64>,
    /// The first of them, described.
    pub lost_details: Vec<String>,
    /// Under `extend`: leases lost while their client was frozen leaning on another
    /// lease (explained: its renewals waited too).
    pub lost_leaning: u64,
    pub verdict: Verdict,
    pub acquire_timeouts: u64,
    pub acquire_unavailable: u64,
    pub acquire_other: u64,
    pub stuck_locks_broken: u64,
    /// A few messages of acquire errors other than timeouts and unavailability.
    pub acquire_error_samples: Vec<String>,
}

/// Runs every phase; returns the rows, and the harness error that cut the run short.
pub async fn run(config: &Config) -> (Vec<Row>, Option<String>) {
    let resource = match Resource::start().await {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(format!("cannot start the resource: {e}"))),
    };
    let mut rng = Rng::new(config.seed);
    let mut rows = Vec::new();
    for (i, phase) in config.phases.iter().enumerate() {
        eprintln!(
            "phase {}/{}: {} for {:.0}s ...",
            i + 1,
            config.phases.len(),
            phase.name,
            phase.duration.as_secs_f64()
        );
        match run_phase(config, phase, i, &resource, rng.fork(i as u64)).await {
            Ok(phase_rows) => {
                for row in &phase_rows {
                    eprintln!(
                        "  {:<20} {:>7} critical sections, {} violations{}",
                        row.algorithm,
                        row.verdict.critical_sections,
                        row.verdict.violations,
                        if row.verdict.harness_errors.is_empty() {
                            ""
                        } else {
                            " (harness errors)"
                        }
                    );
                }
                rows.extend(phase_rows);
            }
            Err(e) => return (rows, Some(format!("phase {}: {e}", phase.name))),
        }
        rng.next_u64();
    }
    (rows, None)
}

/// A worker process and its stdin.
struct WorkerProc {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl WorkerProc {
    fn spawn(
        index: usize,
        spec: &Spec,
        lines: mpsc::UnboundedSender<(usize, Option<String>)>,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
        let mut child = Command::new(exe)
            .arg("worker")
            .arg(spec.to_json())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start worker {index}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines.send((index, Some(line))).is_err() {
                    return;
                }
            }
            let _ = lines.send((index, None));
        });
        Ok(WorkerProc {
            stdin: child.stdin.take(),
            child,
        })
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn send(&mut self, cmd: &Value) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{cmd}").and_then(|()| stdin.flush());
        }
    }

    fn signal(&self, signal: Signal) {
        let _ = kill(self.pid(), signal);
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Server = Arc<Mutex<RedisServer>>;

/// What the fault loop acts on.
struct Targets<'a> {
    servers: &'a [Server],
    proxies: &'a [Proxy],
    /// The Redis Cluster of the `cluster` phase, and the slots of its locks' keys.
    cluster: Option<&'a Arc<RedisCluster>>,
    slots: &'a [u16],
    workers: &'a mut [WorkerProc],
    /// Workers announcing that one of their holders has begun a stall.
    stalls: &'a mut mpsc::UnboundedReceiver<usize>,
    algorithms: usize,
    ttl: Duration,
}

async fn start_server(persistence: Persistence) -> Result<Server, String> {
    tokio::task::spawn_blocking(move || RedisServer::builder().persistence(persistence).start())
        .await
        .map_err(|e| e.to_string())?
        .map(|s| Arc::new(Mutex::new(s)))
        .map_err(|e| e.to_string())
}

/// Masters of the `cluster` phase's Redis Cluster.
pub const CLUSTER_MASTERS: usize = 3;

/// The names of an algorithm's locks in a phase: one (or the few a lock over several
/// names needs), or — under `extend` and `cluster` — `locks`, so that each client holds
/// several at once. On a cluster, every
/// lock of the algorithm starts on the same master (the `index`-th, round robin), so
/// that its clients' renewal ticks there carry several leases; the migrations then
/// move them apart and back.
fn lock_names(
    cluster: Option<&RedisCluster>,
    alg: &str,
    phase: &str,
    locks: usize,
    index: usize,
) -> Result<Vec<String>, String> {
    (0..locks)
        .map(|k| {
            let base = if locks == 1 {
                format!("{alg}-{phase}")
            } else {
                format!("{alg}-{phase}-{k}")
            };
            let Some(cluster) = cluster else {
                return Ok(base);
            };
            let master = index % cluster.masters().len();
            let key = cluster
                .key_on_master(master, |n| format!("{PREFIX}{base}-{n}"))
                .map_err(|e| format!("cannot place lock {base} on master {master}: {e}"))?;
            Ok(key[PREFIX.len()..].to_owned())
        })
        .collect()
}

/// The work profile of a phase's critical sections: how many in a thousand work long,
/// and how long (ms). Under `extend` and `cluster` many do, so that leases are renewed
/// (and extended, and carried through migrations) while held.
fn long_work(config: &Config, phase: &Phase) -> (u64, (u64, u64)) {
    let ttl = config.ttl.as_millis() as f64;
    let ms = |lo: f64, hi: f64| ((ttl * lo) as u64, (ttl * hi) as u64);
    if phase.faults.contains(&Fault::Extend) {
        (400, ms(0.2, 1.0))
    } else if phase.faults.contains(&Fault::Cluster) {
        (300, ms(0.3, 1.2))
    } else {
        (config.long_work_per_mille, ms(0.3, 0.7))
    }
}

async fn run_phase(
    config: &Config,
    phase: &Phase,
    index: usize,
    resource: &Resource,
    mut rng: Rng,
) -> Result<Vec<Row>, String> {
    let algs: Vec<Arc<dyn Algorithm>> = config
        .algorithms
        .iter()
        .filter(|a| phase.faults.iter().all(|&f| a.supports(f)))
        .cloned()
        .collect();
    if algs.is_empty() {
        eprintln!("  (no selected algorithm supports {}; skipped)", phase.name);
        return Ok(Vec::new());
    }
    let on_cluster = phase.faults.contains(&Fault::Cluster);
    let several = on_cluster || phase.faults.contains(&Fault::Extend);
    let locks = if several { config.tasks } else { 1 };
    let persistence = phase
        .faults
        .iter()
        .map(|f| f.persistence())
        .find(|&p| p != Persistence::None)
        .unwrap_or(Persistence::None);
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    let mut cluster = None;
    if on_cluster {
        // Cluster clients discover the nodes' own addresses, so they connect directly:
        // the faults of this phase are the migrations.
        let started = tokio::task::spawn_blocking(|| RedisCluster::start(CLUSTER_MASTERS, 0))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the Redis Cluster: {e}"))?;
        cluster = Some(Arc::new(started));
    } else {
        let n_servers = algs.iter().map(|a| a.servers()).max().unwrap_or(1);
        for _ in 0..n_servers {
            let server = start_server(persistence).await?;
            let addr = server.lock().expect("server lock").addr();
            proxies.push(
                Proxy::start(addr)
                    .await
                    .map_err(|e| format!("cannot start the proxy: {e}"))?,
            );
            servers.push(server);
        }
    }
    let lock_urls: Vec<String> = match &cluster {
        Some(c) => c.urls(),
        None => proxies.iter().map(Proxy::url).collect(),
    };
    // Every lock's name, and on a cluster the slots of their keys.
    let (names, slots) = {
        let cluster = cluster.clone();
        let algs: Vec<(&'static str, usize)> = algs
            .iter()
            .map(|a| (a.name(), locks.max(a.min_locks())))
            .collect();
        let phase_name = phase.name.clone();
        tokio::task::spawn_blocking(move || -> Result<(Vec<Vec<String>>, Vec<u16>), String> {
            let names = algs
                .iter()
                .enumerate()
                .map(|(i, &(a, locks))| lock_names(cluster.as_deref(), a, &phase_name, locks, i))
                .collect::<Result<Vec<_>, _>>()?;
            let mut slots = Vec::new();
            if let Some(c) = &cluster {
                for name in names.iter().flatten() {
                    let slot = c.slot_of(&format!("{PREFIX}{name}")).map_err(|e| e.to_string())?;
                    if !slots.contains(&slot) {
                        slots.push(slot);
                    }
                }
            }
            Ok((names, slots))
        })
        .await
        .map_err(|e| e.to_string())??
    };
    // One counter per lock, in the order of `Spec::counter`.
    let counters: Vec<(usize, usize)> = names
        .iter()
        .enumerate()
        .flat_map(|(i, n)| (0..n.len()).map(move |k| (i, k)))
        .collect();
    resource.reset(
        &counters
            .iter()
            .map(|&(i, _)| algs[i].fenced())
            .collect::<Vec<_>>(),
    );

    let (long_per_mille, long_ms) = long_work(config, phase);
    let (line_tx, mut lines) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for w in 0..config.workers {
        let spec = Spec {
            worker: w,
            lock_urls: lock_urls.clone(),
            resource: resource.addr().to_string(),
            algorithms: algs
                .iter()
                .zip(&names)
                .map(|(a, n)| (a.name().to_owned(), n.clone()))
                .collect(),
            groups: config.groups,
            tasks: config.tasks,
            ttl_ms: config.ttl.as_millis() as u64,
            response_timeout_ms: config.response_timeout.as_millis() as u64,
            retry_window_ms: config.retry_window.as_millis() as u64,
            acquire_timeout_ms: config.acquire_timeout.as_millis() as u64,
            work_max_us: config.work_max.as_micros() as u64,
            long_work_per_mille: long_per_mille,
            long_work_ms: long_ms,
            cluster: on_cluster,
            extend: phase.faults.contains(&Fault::Extend),
            seed: config.seed ^ ((index as u64) << 32) ^ w as u64,
        };
        workers.push(WorkerProc::spawn(w, &spec, line_tx.clone())?);
    }
    drop(line_tx);

    // Collect every report from the start: workers that are ready early already run
    // critical sections while the others connect.
    let n_counters = counters.len();
    let (stall_tx, mut stalls) = mpsc::unbounded_channel();
    let (startup_tx, mut startup) = watch::channel(Startup::default());
    let collector = tokio::spawn(async move {
        let mut tallies: Vec<Tally> = (0..n_counters).map(|_| Tally::default()).collect();
        let mut fatal = Vec::new();
        while let Some((w, line)) = lines.recv().await {
            let Some(line) = line else {
                startup_tx.send_modify(|s| s.exited += 1);
                continue;
            };
            match record(&line, &mut tallies) {
                Ok(Notice::Stall) => {
                    let _ = stall_tx.send(w);
                }
                Ok(Notice::Ready) => startup_tx.send_modify(|s| s.ready += 1),
                Ok(Notice::None) => {}
                Err(e) => {
                    let e = format!("worker {w}: {e}");
                    startup_tx.send_modify(|s| {
                        s.fatal.get_or_insert_with(|| e.clone());
                    });
                    fatal.push(e);
                }
            }
        }
        (tallies, fatal)
    });

    // Wait until every worker's clients are connected.
    let n_workers = workers.len();
    let up = tokio::time::timeout(
        Duration::from_secs(60),
        startup.wait_for(|s| s.ready == n_workers || s.exited > 0 || s.fatal.is_some()),
    )
    .await;
    let state = match up {
        Ok(Ok(state)) => state.clone(),
        _ => return Err("workers did not get ready within 60s".into()),
    };
    if let Some(e) = state.fatal {
        return Err(format!("a worker failed during start-up: {e}"));
    }
    if state.exited > 0 {
        return Err("a worker exited during start-up".into());
    }
    let started = Instant::now();
    let started_ns = mono_ns();

    let (repair_stop, repair_rx) = watch::channel(false);
    let repair = servers.first().map(|server| {
        tokio::spawn(repair_loop(
            algs.clone(),
            names.clone(),
            server.lock().expect("server lock").url(),
            repair_rx,
        ))
    });

    let mut targets = Targets {
        servers: &servers,
        proxies: &proxies,
        cluster: cluster.as_ref(),
        slots: &slots,
        workers: &mut workers,
        stalls: &mut stalls,
        algorithms: algs.len(),
        ttl: config.ttl,
    };
    let deadline = Instant::now() + phase.duration;
    let events = fault_loop(&phase.faults, &mut targets, deadline, &mut rng).await;

    // Heal everything, let the clients finish their current critical sections, stop.
    for p in &proxies {
        p.set_delay(Duration::ZERO);
        p.release_replies();
        p.release_requests();
    }
    for s in &servers {
        s.lock().expect("server lock").resume();
    }
    let events = events?;
    for w in workers.iter_mut() {
        w.signal(Signal::SIGCONT);
        w.send(&json!({"cmd": "skew", "ms": 0}));
        w.send(&json!({"cmd": "stop"}));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut workers = workers;
    let exited = tokio::task::spawn_blocking(move || {
        let by = Instant::now() + Duration::from_secs(60);
        let mut all = true;
        for w in workers.iter_mut() {
            loop {
                match w.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < by => std::thread::sleep(Duration::from_millis(20)),
                    _ => {
                        all = false;
                        break;
                    }
                }
            }
        }
        all
    })
    .await
    .unwrap_or(false);
    let (tallies, fatal) = collector.await.map_err(|e| e.to_string())?;
    repair_stop.send_replace(true);
    let stuck = match repair {
        Some(task) => task.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let logs = resource.take();
    drop(proxies);
    drop(servers);
    if let Some(cluster) = cluster {
        // Stopping the nodes blocks (each is killed and reaped).
        let _ = tokio::task::spawn_blocking(move || drop(cluster)).await;
    }

    // Under faults that cannot end a lease, every lost() is unexplained.
    let unexplained = phase.faults.iter().all(|f| !f.explains_lost());
    let mut rows = Vec::new();
    for (i, alg) in algs.iter().enumerate() {
        let mut verdict = Verdict::default();
        let (mut timeouts, mut unavailable, mut other) = (0, 0, 0);
        let mut samples = Vec::new();
        let mut lost = Vec::new();
        let mut lost_leaning = 0;
        // Under `extend`, when each client (worker, group) was frozen leaning on a lease:
        // the leases of its other holders may run out meanwhile (its renewals wait too).
        let mut leaning: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (c, &(ai, _)) in counters.iter().enumerate() {
            if ai == i {
                for (&cs, r) in &tallies[c].cs {
                    if r.lean_us > 0 {
                        let until = r.lean_ns + r.lean_us * 1000 + config.ttl.as_nanos() as u64 / 2;
                        leaning.entry(cs_client(cs)).or_default().push((r.lean_ns, until));
                    }
                }
            }
        }
        for (c, &(ai, k)) in counters.iter().enumerate() {
            if ai != i {
                continue;
            }
            let tally = &tallies[c];
            verdict.merge(checker::check(&logs[c], tally, &events, config.ttl, alg.check()));
            timeouts += tally.acquire_timeouts;
            unavailable += tally.acquire_unavailable;
            other += tally.acquire_other;
            samples.extend(tally.other_errors.iter().cloned());
            if unexplained {
                for (at, cs, what) in lost_signals(tally, &names[i][k], &events, started_ns) {
                    let frozen = leaning
                        .get(&cs_client(cs))
                        .is_some_and(|w| w.iter().any(|&(from, until)| from <= at && at <= until));
                    if frozen {
                        lost_leaning += 1;
                    } else {
                        lost.push((at, what));
                    }
                }
            }
        }
        if !exited {
            verdict
                .harness_errors
                .push("a worker did not exit within 60s of being told to stop".into());
        }
        verdict.harness_errors.extend(fatal.iter().cloned());
        lost.sort();
        rows.push(Row {
            algorithm: alg.name().to_owned(),
            must_be_safe: alg.must_be_safe_under(&phase.faults),
            baseline: !alg.must_be_safe(),
            fenced: alg.fenced(),
            phase: phase.name.clone(),
            faults: phase.faults.clone(),
            seconds,
            fault_events: events.len(),
            locks: names[i].len(),
            lost_unexplained: (unexplained && verdict.lost_signals.is_some()).then_some(lost.len() as u64),
            lost_details: lost.into_iter().map(|(_, d)| d).take(10).collect(),
            lost_leaning,
            verdict,
            acquire_timeouts: timeouts,
            acquire_unavailable: unavailable,
            acquire_other: other,
            stuck_locks_broken: stuck.get(i).copied().unwrap_or(0),
            acquire_error_samples: samples.into_iter().take(3).collect(),
        });
    }
    Ok(rows)
}

/// The `lost()` signals of one lock's holders, each described (with its time, for
/// sorting): the critical section, the reason, when in the phase, and which fault
/// event — a migration — was under way or had just ended.
fn lost_signals(tally: &Tally, lock: &str, events: &[Event], started_ns: u64) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    for (cs, r) in &tally.cs {
        let secs = |t: u64| t.saturating_sub(started_ns) as f64 / 1e9;
        let head = format!(
            "lock {PREFIX}{lock}, critical section {cs:#x} ({:?}; acquire began at {:.2}s, returned at {:.2}s)",
            r.outcome,
            secs(r.start_ns),
            secs(r.acquired_ns),
        );
        let (at, mut what) = match (&r.lost, r.lost_ns) {
            (Some(reason), Some(at)) => (
                at,
                format!(
                    "{head}: lost() fired ({reason}) at {:.2}s (t={at}ns), {:.1}ms after the acquire returned",
                    secs(at),
                    at.saturating_sub(r.acquired_ns) as f64 / 1e6
                ),
            ),
            // The release says the lease was lost, the lease never said so.
            _ if r.release == "not-held" && r.has_lease => (
                r.released_ns,
                format!(
                    "{head}: release() returned NotHeld at {:.2}s (t={}ns), {:.1}ms after the acquire \
                     returned, but lost() never fired",
                    secs(r.released_ns),
                    r.released_ns,
                    r.released_ns.saturating_sub(r.acquired_ns) as f64 / 1e6
                ),
            ),
            _ => continue,
        };
        if let Some(e) = events.iter().find(|e| e.start_ns <= at && at <= e.end_ns) {
            what += &format!(
                ", during {} [{:.2}s-{:.2}s]",
                e.note,
                secs(e.start_ns),
                secs(e.end_ns)
            );
        } else if let Some(e) = events.iter().rev().find(|e| e.end_ns < at) {
            what += &format!(
                ", {:.0}ms after {} [{:.2}s-{:.2}s]",
                (at - e.end_ns) as f64 / 1e6,
                e.note,
                secs(e.start_ns),
                secs(e.end_ns)
            );
        }
        let (ok, not_held, failed) = r.extends;
        if ok + not_held + failed > 0 {
            what += &format!("; its extends: {ok} ok, {not_held} not held, {failed} failed");
            if let Some(m) = &r.extend_error {
                what += &format!(" ({m})");
            }
        }
        out.push((at, *cs, what));
    }
    out
}

/// How far the workers of a phase got in starting up.
#[derive(Clone, Debug, Default)]
struct Startup {
    ready: usize,
    exited: usize,
    fatal: Option<String>,
}

/// What a report line announces besides its data.
enum Notice {
    None,
    Ready,
    /// A holder began a stall.
    Stall,
}

/// Records one line of a worker's report.
fn record(line: &str, tallies: &mut [Tally]) -> Result<Notice, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("unreadable report {line:?}: {e}"))?;
    let alg = v["a"].as_u64().unwrap_or(0) as usize;
    match v["t"].as_str() {
        Some("cs") => {
            let tally = tallies.get_mut(alg).ok_or("report for an unknown algorithm")?;
            let outcome = match v["o"].as_str() {
                Some("ok") => Outcome::Ok,
                Some("fenced") => Outcome::Fenced,
                Some("abandoned") => Outcome::Abandoned,
                _ => Outcome::Io,
            };
            let cs = v["cs"].as_u64().ok_or("report without a critical section id")?;
            let report = CsReport {
                outcome,
                start_ns: v["start"].as_u64().unwrap_or(0),
                acquired_ns: v["got"].as_u64().unwrap_or(0),
                released_ns: v["rel_ns"].as_u64().unwrap_or(0),
                lean_ns: v["lean_ns"].as_u64().unwrap_or(0),
                lean_us: v["lean"].as_u64().unwrap_or(0),
                stall_ms: v["stall"].as_u64().unwrap_or(0),
                stall_ns: v["stall_ns"].as_u64().unwrap_or(0),
                rejected_ns: v["rej"].as_u64(),
                lost: v["lost"].as_str().map(str::to_owned),
                lost_ns: v["lost_ns"].as_u64(),
                has_lease: v["l"].as_bool().unwrap_or(false),
                release: v["rel"].as_str().unwrap_or("").to_owned(),
                extends: (
                    v["ext"].as_u64().unwrap_or(0),
                    v["ext_nh"].as_u64().unwrap_or(0),
                    v["ext_err"].as_u64().unwrap_or(0),
                ),
                extend_error: v["ext_m"].as_str().map(str::to_owned),
            };
            if tally.cs.insert(cs, report).is_some() {
                return Err(format!("critical section {cs:#x} reported twice"));
            }
        }
        Some("acq") => {
            let tally = tallies.get_mut(alg).ok_or("report for an unknown algorithm")?;
            match v["k"].as_str() {
                Some("timeout") => tally.acquire_timeouts += 1,
                Some("unavailable") => tally.acquire_unavailable += 1,
                _ => {
                    tally.acquire_other += 1;
                    if tally.other_errors.len() < 10 {
                        tally.other_errors.push(v["m"].as_str().unwrap_or("").to_owned());
                    }
                }
            }
        }
        Some("stall") => return Ok(Notice::Stall),
        Some("ready") => return Ok(Notice::Ready),
        Some("fatal") => return Err(v["m"].as_str().unwrap_or("fatal error").to_owned()),
        _ => {}
    }
    Ok(Notice::None)
}

/// Gives each algorithm's `repair` a chance twice a second; returns how often each
/// intervened.
async fn repair_loop(
    algs: Vec<Arc<dyn Algorithm>>,
    names: Vec<Vec<String>>,
    url: String,
    mut stop: watch::Receiver<bool>,
) -> Vec<u64> {
    let mut counts = vec![0; algs.len()];
    let Ok(client) = redis::Client::open(url) else {
        return counts;
    };
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(300)))
        .set_response_timeout(Some(Duration::from_millis(300)));
    let mut conn = None;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return counts,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if conn.is_none() {
            conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        if redis::cmd("PING").query_async::<()>(c).await.is_err() {
            conn = None;
            continue;
        }
        for (i, alg) in algs.iter().enumerate() {
            for name in &names[i] {
                counts[i] += alg.repair(c, name).await;
            }
        }
    }
}

/// Injects faults until `deadline`; returns the events.
async fn fault_loop(
    faults: &[Fault],
    targets: &mut Targets<'_>,
    deadline: Instant,
    rng: &mut Rng,
) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    // Let the clients get going first.
    tokio::time::sleep(Duration::from_millis(800)).await;
    while Instant::now() < deadline {
        let fault = *rng.pick(faults);
        if let Some(event) = inject(fault, targets, rng).await? {
            events.push(event);
        }
        let gap = match fault {
            Fault::ConnReset => rng.between(Duration::from_millis(200), Duration::from_millis(800)),
            Fault::ServerRestart | Fault::ServerRestartAof => {
                rng.between(Duration::from_millis(1500), Duration::from_millis(3000))
            }
            Fault::ServerPause => rng.between(Duration::from_millis(1000), Duration::from_millis(2000)),
            // The latency of `extend` stays on between events; only its size changes.
            Fault::Extend => Duration::ZERO,
            Fault::Cluster => rng.between(Duration::from_millis(200), Duration::from_millis(600)),
            _ => rng.between(Duration::from_millis(500), Duration::from_millis(1500)),
        };
        let now = Instant::now();
        if now + gap >= deadline {
            tokio::time::sleep(deadline.saturating_duration_since(now)).await;
            break;
        }
        tokio::time::sleep(gap).await;
    }
    Ok(events)
}

/// How many of the lock servers (from the first) a proxy or pause event hits: the
/// first, which every algorithm uses, or — one event in three, when there are several
/// (Redlock's masters) — all of them.
fn targets(servers: usize, rng: &mut Rng) -> usize {
    if servers > 1 && rng.below(3) == 0 {
        servers
    } else {
        1
    }
}

/// Performs one fault event.
async fn inject(fault: Fault, t: &mut Targets<'_>, rng: &mut Rng) -> Result<Option<Event>, String> {
    let mut start_ns = mono_ns();
    let mut worker = None;
    let mut note = fault.name().to_owned();
    match fault {
        Fault::ReplyDelay => {
            let proxies = &t.proxies[..targets(t.proxies.len(), rng)];
            proxies.iter().for_each(Proxy::hold_replies);
            tokio::time::sleep(rng.scaled(t.ttl, 0.3, 1.5)).await;
            proxies.iter().for_each(Proxy::release_replies);
        }
        Fault::ConnReset => {
            let proxies = &t.proxies[..targets(t.proxies.len(), rng)];
            // A little latency makes sure commands are in flight when the cut comes.
            proxies.iter().for_each(|p| p.set_delay(Duration::from_millis(2)));
            tokio::time::sleep(rng.between(Duration::from_millis(1), Duration::from_millis(15))).await;
            for p in proxies {
                p.cut();
                p.set_delay(Duration::ZERO);
            }
        }
        Fault::ClientPause => {
            let w = rng.below(t.workers.len() as u64) as usize;
            // Mostly well past the lease; one in four around its end, where the lease's
            // drift margin is all that separates the two holders.
            let stall = if rng.below(4) == 0 {
                rng.scaled(t.ttl, 0.9, 1.2)
            } else {
                rng.scaled(t.ttl, 1.5, 2.5)
            };
            while t.stalls.try_recv().is_ok() {}
            t.workers[w].send(&json!({"cmd": "pause", "ms": stall.as_millis() as u64}));
            worker = Some(w);
            tokio::time::sleep(stall).await;
        }
        Fault::ProcessPause => {
            let w = rng.below(t.workers.len() as u64) as usize;
            t.workers[w].signal(Signal::SIGSTOP);
            worker = Some(w);
            tokio::time::sleep(rng.scaled(t.ttl, 1.5, 2.5)).await;
            t.workers[w].signal(Signal::SIGCONT);
        }
        Fault::ServerRestart | Fault::ServerRestartAof => {
            // The first server: the only one of the single-server algorithms, one of
            // Redlock's three.
            let server = t.servers[0].clone();
            let mut down = rng.between(Duration::ZERO, Duration::from_millis(300));
            if rng.below(2) == 0 {
                // Half the restarts hit while holders stall well *within* their leases
                // (renewal keeps at least 2/3 of the TTL ahead of them): a restart that
                // forgets the lock then lets a second holder in while the first still
                // holds a valid lease — the case only fencing protects against — and a
                // restart from the AOF must not.
                while t.stalls.try_recv().is_ok() {}
                let w = rng.below(t.workers.len() as u64) as usize;
                let stall = rng.scaled(t.ttl, 0.4, 0.6);
                let ms = stall.as_millis() as u64;
                t.workers[w].send(&json!({"cmd": "pause", "ms": ms, "fresh": true}));
                worker = Some(w);
                let by = tokio::time::Instant::now() + Duration::from_millis(300);
                for _ in 0..t.algorithms {
                    if tokio::time::timeout_at(by, t.stalls.recv()).await.is_err() {
                        break;
                    }
                }
                down = rng.between(Duration::ZERO, Duration::from_millis(50));
            }
            start_ns = tokio::task::spawn_blocking(move || {
                let mut s = server.lock().expect("server lock");
                let killed = mono_ns();
                s.stop();
                std::thread::sleep(down);
                s.restart().map(|()| killed)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("redis-server did not come back: {e}"))?;
        }
        Fault::ServerPause => {
            let servers = &t.servers[..targets(t.servers.len(), rng)];
            servers
                .iter()
                .for_each(|s| s.lock().expect("server lock").pause());
            tokio::time::sleep(rng.scaled(t.ttl, 0.3, 2.0)).await;
            servers
                .iter()
                .for_each(|s| s.lock().expect("server lock").resume());
        }
        Fault::Clock => {
            // One worker's wall clock jumps 0.5-3 x TTL ahead or behind for a while.
            let w = rng.below(t.workers.len() as u64) as usize;
            let ms = rng.scaled(t.ttl, 0.5, 3.0).as_millis() as i64;
            let ms = if rng.below(2) == 0 { ms } else { -ms };
            t.workers[w].send(&json!({"cmd": "skew", "ms": ms}));
            worker = Some(w);
            tokio::time::sleep(rng.between(Duration::from_millis(1000), Duration::from_millis(2000))).await;
            t.workers[w].send(&json!({"cmd": "skew", "ms": 0}));
        }
        Fault::Extend => {
            // The holders extend by themselves; the proxy's latency, changed every
            // 0.3-1 s, keeps extends and renewals in flight together.
            let delay = rng.between(Duration::ZERO, Duration::from_millis(15));
            t.proxies.iter().for_each(|p| p.set_delay(delay));
            note = format!("{}ms of proxy latency", delay.as_millis());
            tokio::time::sleep(rng.between(Duration::from_millis(300), Duration::from_millis(1000))).await;
        }
        Fault::Cluster => {
            let cluster = t.cluster.ok_or("the cluster phase has no cluster")?.clone();
            note = migrate(cluster, t.slots, t.ttl, rng).await?;
        }
    }
    Ok(Some(Event {
        fault,
        start_ns,
        end_ns: mono_ns(),
        worker,
        note,
    }))
}

/// One `cluster` event: moves the slots of one to three of the locks (picked at random)
/// each to another master, one step at a time for all of them, the way `redis-cli
/// --cluster reshard` does — `SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` of the keys,
/// `SETSLOT NODE` — pausing 0.4-0.8 × TTL after each step, so that held leases are
/// renewed (and released, and taken) in every state: keys still on the old master,
/// keys moved (`ASK`), slot moved (`MOVED`). Returns what it did, with the steps' times.
async fn migrate(
    cluster: Arc<RedisCluster>,
    slots: &[u16],
    ttl: Duration,
    rng: &mut Rng,
) -> Result<String, String> {
    let n = (1 + rng.below(3) as usize).min(slots.len());
    let mut picked: Vec<(u16, u64)> = Vec::new();
    while picked.len() < n {
        let slot = *rng.pick(slots);
        if !picked.iter().any(|&(s, _)| s == slot) {
            picked.push((slot, rng.next_u64()));
        }
    }
    let pauses: Vec<Duration> = (0..3).map(|_| rng.scaled(ttl, 0.4, 0.8)).collect();
    tokio::task::spawn_blocking(move || -> Result<String, String> {
        let began = Instant::now();
        let fail = |what: &str, e: redlease_testkit::KitError| format!("migration: {what}: {e}");
        let mut moves = Vec::new();
        for (slot, r) in picked {
            let from = cluster
                .master_of_slot(slot)
                .map_err(|e| fail("master_of_slot", e))?;
            let to = (from + 1 + r as usize % (CLUSTER_MASTERS - 1)) % CLUSTER_MASTERS;
            moves.push(cluster.begin_migration(slot, to).map_err(|e| fail("begin", e))?);
        }
        std::thread::sleep(pauses[0]);
        let keys_at = began.elapsed();
        let mut keys = 0;
        for m in &moves {
            keys += cluster.migrate_keys(m).map_err(|e| fail("migrate_keys", e))?;
        }
        std::thread::sleep(pauses[1]);
        let node_at = began.elapsed();
        for m in &moves {
            cluster.finish_migration(m).map_err(|e| fail("finish", e))?;
        }
        std::thread::sleep(pauses[2]);
        let what: Vec<String> = moves
            .iter()
            .map(|m| format!("slot {} master {}->{}", m.slot, m.from, m.to))
            .collect();
        Ok(format!(
            "migration of {} ({keys} keys moved at +{:.2}s, SETSLOT NODE at +{:.2}s)",
            what.join(", "),
            keys_at.as_secs_f64(),
            node_at.as_secs_f64()
        ))
    })
    .await
    .map_err(|e| e.to_string())?
}
