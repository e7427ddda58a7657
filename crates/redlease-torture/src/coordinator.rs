//! The coordinator: runs the phases of a torture run.
//!
//! For each phase it starts a fresh lock server (through the test kit) behind a fault
//! proxy, resets the resource's counters, starts the worker processes, injects the
//! phase's faults until its time is up, stops the workers, and hands the resource's
//! log and the workers' reports to the checker.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redlease_testkit::{Persistence, Proxy, RedisServer};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::algorithms::Algorithm;
use crate::checker::{self, CsReport, Outcome, Tally, Verdict};
use crate::clock::mono_ns;
use crate::faults::{Event, Fault};
use crate::resource::Resource;
use crate::rng::Rng;
use crate::worker::Spec;

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
    let persistence = phase
        .faults
        .iter()
        .map(|f| f.persistence())
        .find(|&p| p != Persistence::None)
        .unwrap_or(Persistence::None);
    let n_servers = algs.iter().map(|a| a.servers()).max().unwrap_or(1);
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
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
    resource.reset(&algs.iter().map(|a| a.fenced()).collect::<Vec<_>>());
    let names: Vec<String> = algs
        .iter()
        .map(|a| format!("{}-{}", a.name(), phase.name))
        .collect();

    let (line_tx, mut lines) = mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for w in 0..config.workers {
        let spec = Spec {
            worker: w,
            lock_urls: proxies.iter().map(Proxy::url).collect(),
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
            long_work_per_mille: config.long_work_per_mille,
            seed: config.seed ^ ((index as u64) << 32) ^ w as u64,
        };
        workers.push(WorkerProc::spawn(w, &spec, line_tx.clone())?);
    }
    drop(line_tx);

    // Collect every report from the start: workers that are ready early already run
    // critical sections while the others connect.
    let n_algs = algs.len();
    let (stall_tx, mut stalls) = mpsc::unbounded_channel();
    let (startup_tx, mut startup) = watch::channel(Startup::default());
    let collector = tokio::spawn(async move {
        let mut tallies: Vec<Tally> = (0..n_algs).map(|_| Tally::default()).collect();
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

    let (repair_stop, repair_rx) = watch::channel(false);
    let repair = tokio::spawn(repair_loop(
        algs.clone(),
        names.clone(),
        servers[0].lock().expect("server lock").url(),
        repair_rx,
    ));

    let mut targets = Targets {
        servers: &servers,
        proxies: &proxies,
        workers: &mut workers,
        stalls: &mut stalls,
        algorithms: n_algs,
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
    let stuck = repair.await.unwrap_or_default();
    let logs = resource.take();
    drop(proxies);
    drop(servers);

    let mut rows = Vec::new();
    for (i, alg) in algs.iter().enumerate() {
        let mut verdict = checker::check(&logs[i], &tallies[i], &events, config.ttl, alg.check());
        if !exited {
            verdict
                .harness_errors
                .push("a worker did not exit within 60s of being told to stop".into());
        }
        verdict.harness_errors.extend(fatal.iter().cloned());
        rows.push(Row {
            algorithm: alg.name().to_owned(),
            must_be_safe: alg.must_be_safe_under(&phase.faults),
            baseline: !alg.must_be_safe(),
            fenced: alg.fenced(),
            phase: phase.name.clone(),
            faults: phase.faults.clone(),
            seconds,
            fault_events: events.len(),
            verdict,
            acquire_timeouts: tallies[i].acquire_timeouts,
            acquire_unavailable: tallies[i].acquire_unavailable,
            acquire_other: tallies[i].acquire_other,
            stuck_locks_broken: stuck.get(i).copied().unwrap_or(0),
            acquire_error_samples: tallies[i].other_errors.iter().take(3).cloned().collect(),
        });
    }
    Ok(rows)
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
                stall_ms: v["stall"].as_u64().unwrap_or(0),
                stall_ns: v["stall_ns"].as_u64().unwrap_or(0),
                rejected_ns: v["rej"].as_u64(),
                lost: v["lost"].as_str().map(str::to_owned),
                lost_ns: v["lost_ns"].as_u64(),
                has_lease: v["l"].as_bool().unwrap_or(false),
                release: v["rel"].as_str().unwrap_or("").to_owned(),
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
    names: Vec<String>,
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
            counts[i] += alg.repair(c, &names[i]).await;
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
    }
    Ok(Some(Event {
        fault,
        start_ns,
        end_ns: mono_ns(),
        worker,
    }))
}
