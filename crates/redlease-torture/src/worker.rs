//! A worker process: the torture binary re-executed with `worker <spec>`.
//!
//! It runs the clients of every algorithm of the phase. Each *group* is one OS thread
//! with its own single-threaded tokio runtime and one lock client, shared by several
//! client tasks — one application instance, as it were. A `client-pause` blocks a
//! group's thread, which stalls everything of that client (its work, its lease renewal,
//! its wake-ups), as a GC pause stalls a whole process. The `lost()` signal of every
//! lease is watched on a separate *observer* runtime, as a supervisor thread would.
//!
//! The worker reads commands from stdin (`{"cmd":"pause","ms":N,"fresh":B}`,
//! `{"cmd":"skew","ms":N}` (the `clock` fault: the wall clock old-style clients read),
//! `{"cmd":"stop"}`; end of input also stops it) and reports every critical section on
//! stdout as one JSON line.

use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use redlease::LostReason;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::algorithms::{self, AcquireError, Algorithm, Held, LockClient, LockEnv, Role};
use crate::clock::{instant_ns, mono_ns, set_skew_ms};
use crate::resource::{Op, Reply, ResourceConn};
use crate::rng::Rng;

/// What the coordinator tells a worker to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub worker: usize,
    pub lock_urls: Vec<String>,
    pub resource: String,
    /// Algorithm names with the names of their locks. Each lock has its own resource
    /// counter, numbered in this order (see [`Spec::counter`]).
    pub algorithms: Vec<(String, Vec<String>)>,
    pub groups: usize,
    pub tasks: usize,
    pub ttl_ms: u64,
    pub response_timeout_ms: u64,
    pub retry_window_ms: u64,
    pub acquire_timeout_ms: u64,
    /// Each critical section "works" up to this long between its read and its write...
    pub work_max_us: u64,
    /// ... except this many in a thousand, which work this long (a range).
    pub long_work_per_mille: u64,
    pub long_work_ms: (u64, u64),
    /// The lock URLs are a Redis Cluster's masters.
    pub cluster: bool,
    /// Holders also extend their leases inside their critical sections (the `extend`
    /// fault).
    pub extend: bool,
    pub seed: u64,
}

impl Spec {
    pub fn to_json(&self) -> String {
        json!({
            "worker": self.worker,
            "lock_urls": self.lock_urls,
            "resource": self.resource,
            "algorithms": self.algorithms.iter().map(|(a, l)| json!([a, l])).collect::<Vec<_>>(),
            "long_work_ms": [self.long_work_ms.0, self.long_work_ms.1],
            "cluster": self.cluster,
            "extend": self.extend,
            "groups": self.groups,
            "tasks": self.tasks,
            "ttl_ms": self.ttl_ms,
            "response_timeout_ms": self.response_timeout_ms,
            "retry_window_ms": self.retry_window_ms,
            "acquire_timeout_ms": self.acquire_timeout_ms,
            "work_max_us": self.work_max_us,
            "long_work_per_mille": self.long_work_per_mille,
            "seed": self.seed,
        })
        .to_string()
    }

    pub fn from_json(s: &str) -> Result<Spec, String> {
        let v: Value = serde_json::from_str(s).map_err(|e| format!("bad worker spec: {e}"))?;
        let n = |k: &str| v[k].as_u64().ok_or_else(|| format!("worker spec lacks {k}"));
        let s = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("worker spec lacks {k}"))
        };
        let urls = v["lock_urls"]
            .as_array()
            .ok_or("worker spec lacks lock_urls")?
            .iter()
            .filter_map(|u| u.as_str().map(str::to_owned))
            .collect();
        let algorithms = v["algorithms"]
            .as_array()
            .ok_or("worker spec lacks algorithms")?
            .iter()
            .filter_map(|p| {
                let names = p[1]
                    .as_array()?
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned));
                Some((p[0].as_str()?.to_owned(), names.collect()))
            })
            .collect();
        Ok(Spec {
            worker: n("worker")? as usize,
            lock_urls: urls,
            resource: s("resource")?,
            algorithms,
            groups: n("groups")? as usize,
            tasks: n("tasks")? as usize,
            ttl_ms: n("ttl_ms")?,
            response_timeout_ms: n("response_timeout_ms")?,
            retry_window_ms: n("retry_window_ms")?,
            acquire_timeout_ms: n("acquire_timeout_ms")?,
            work_max_us: n("work_max_us")?,
            long_work_per_mille: n("long_work_per_mille")?,
            long_work_ms: (
                v["long_work_ms"][0]
                    .as_u64()
                    .ok_or("worker spec lacks long_work_ms")?,
                v["long_work_ms"][1]
                    .as_u64()
                    .ok_or("worker spec lacks long_work_ms")?,
            ),
            cluster: v["cluster"].as_bool().unwrap_or(false),
            extend: v["extend"].as_bool().unwrap_or(false),
            seed: n("seed")?,
        })
    }

    /// The resource counter of lock `lock` of algorithm `alg`.
    pub fn counter(&self, alg: usize, lock: usize) -> usize {
        self.algorithms[..alg].iter().map(|(_, l)| l.len()).sum::<usize>() + lock
    }
}

/// A critical section's id: worker, algorithm, group, task and sequence number.
pub fn cs_id(worker: usize, alg: usize, group: usize, task: usize, seq: u32) -> u64 {
    ((worker as u64 & 0xff) << 56)
        | ((alg as u64 & 0xff) << 48)
        | ((group as u64 & 0xff) << 40)
        | ((task as u64 & 0xff) << 32)
        | u64::from(seq)
}

/// The worker a critical section ran in.
pub fn cs_worker(cs: u64) -> usize {
    (cs >> 56) as usize
}

/// The worker, algorithm and group — the client — a critical section ran in.
pub fn cs_client(cs: u64) -> u64 {
    cs >> 40
}

/// Under `extend`, one critical section in this many leans on its lease (see
/// [`client_task`]).
const LEAN_ONE_IN: u64 = 8;
/// ... stopping this long before the lease's `valid_until` (to absorb a late wake-up).
const LEAN_MARGIN: Duration = Duration::from_millis(50);

type Out = mpsc::Sender<String>;

/// Marks a pending stall that only a freshly acquired holder may take.
const FRESH: u64 = 1 << 63;

/// Shared by every client of the worker.
struct Shared {
    spec: Spec,
    out: Out,
    stop: watch::Sender<bool>,
    /// Per algorithm: a pending stall (ms) for the next holder that reaches its write;
    /// with [`FRESH`] set, only for a holder that acquired less than 0.2 × TTL ago, so
    /// that the stall ends well within even an unrenewed lease.
    pauses: Vec<AtomicU64>,
    observer: tokio::runtime::Handle,
}

pub fn main(spec: &str) -> ExitCode {
    let spec = match Spec::from_json(spec) {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    crate::log::init(spec.worker);
    let (out, lines) = mpsc::channel::<String>();
    let writer = std::thread::spawn(move || write_lines(lines));
    let observer = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("observer")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let shared = Arc::new(Shared {
        pauses: spec.algorithms.iter().map(|_| AtomicU64::new(0)).collect(),
        stop: watch::channel(false).0,
        observer: observer.handle().clone(),
        out: out.clone(),
        spec,
    });

    // Commands from the coordinator; the end of stdin (the coordinator died) stops us.
    {
        let shared = shared.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let cmd: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                match cmd["cmd"].as_str() {
                    Some("pause") => {
                        let mut ms = cmd["ms"].as_u64().unwrap_or(0) & !FRESH;
                        if cmd["fresh"].as_bool() == Some(true) {
                            ms |= FRESH;
                        }
                        for p in &shared.pauses {
                            p.store(ms, Ordering::Release);
                        }
                    }
                    Some("skew") => set_skew_ms(cmd["ms"].as_i64().unwrap_or(0)),
                    Some("stop") => break,
                    _ => {}
                }
            }
            shared.stop.send_replace(true);
        });
    }

    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let mut threads = Vec::new();
    for (ai, (name, _)) in shared.spec.algorithms.iter().enumerate() {
        let Some(alg) = algorithms::by_name(name) else {
            let _ = out.send(json!({"t": "fatal", "m": format!("unknown algorithm {name}")}).to_string());
            continue;
        };
        for group in 0..shared.spec.groups {
            let (shared, alg, ready) = (shared.clone(), alg.clone(), ready_tx.clone());
            let thread = std::thread::Builder::new()
                .name(format!("{}-g{group}", alg.name()))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a current-thread runtime");
                    rt.block_on(group_main(shared, alg, ai, group, ready));
                });
            match thread {
                Ok(t) => threads.push(t),
                Err(e) => {
                    let _ = out
                        .send(json!({"t": "fatal", "m": format!("cannot start a thread: {e}")}).to_string());
                }
            }
        }
    }
    drop(ready_tx);
    let mut failed = false;
    for _ in 0..threads.len() {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed = true;
                let _ = out.send(json!({"t": "fatal", "m": e}).to_string());
            }
            Err(_) => break,
        }
    }
    if failed {
        shared.stop.send_replace(true);
    } else {
        let _ = out.send(json!({"t": "ready"}).to_string());
    }
    for t in threads {
        let _ = t.join();
    }
    let _ = out.send(json!({"t": "done"}).to_string());
    drop(out);
    drop(shared);
    let _ = writer.join();
    observer.shutdown_background();
    ExitCode::SUCCESS
}

fn write_lines(lines: mpsc::Receiver<String>) {
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    while let Ok(line) = lines.recv() {
        let _ = writeln!(w, "{line}");
        while let Ok(line) = lines.try_recv() {
            let _ = writeln!(w, "{line}");
        }
        let _ = w.flush();
    }
}

async fn group_main(
    shared: Arc<Shared>,
    alg: Arc<dyn Algorithm>,
    ai: usize,
    group: usize,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let spec = &shared.spec;
    let names = spec.algorithms[ai].1.clone();
    let env = LockEnv {
        urls: spec.lock_urls.clone(),
        names: names.clone(),
        ttl: Duration::from_millis(spec.ttl_ms),
        response_timeout: Duration::from_millis(spec.response_timeout_ms),
        retry_window: Duration::from_millis(spec.retry_window_ms),
        acquire_timeout: Duration::from_millis(spec.acquire_timeout_ms),
        label: format!("torture-w{}-{}-g{group}", spec.worker, alg.name()),
        cluster: spec.cluster,
    };
    let mut client = Err(String::new());
    for _ in 0..10 {
        client = alg.connect(&env).await;
        if client.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let client = match client {
        Ok(c) => {
            let _ = ready.send(Ok(()));
            c
        }
        Err(e) => {
            let _ = ready.send(Err(format!("{} cannot connect: {e}", alg.name())));
            return;
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    let rng = Rng::new(spec.seed).fork(((ai as u64) << 16) | group as u64);
    for task in 0..spec.tasks {
        // With several locks, the tasks of a group hold different ones at once: one
        // client, several leases in each renewal tick.
        let lock = (group * spec.tasks + task) % names.len().max(1);
        tasks.spawn(client_task(
            shared.clone(),
            client.clone(),
            Slot {
                ai,
                lock,
                group,
                task,
            },
            rng.fork(task as u64),
        ));
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            let _ = shared
                .out
                .send(json!({"t": "fatal", "m": format!("client task failed: {e}")}).to_string());
        }
    }
}

/// Where a client task sits: its algorithm, the lock it takes, its group and number.
#[derive(Clone, Copy, Debug)]
struct Slot {
    ai: usize,
    lock: usize,
    group: usize,
    task: usize,
}

/// Whether the holder may still act, by what the lock told it.
fn still_held(held: &Held) -> bool {
    held.lease().is_none_or(|l| l.is_held())
}

/// Until when the holder's lease is valid, on the shared clock (0: no lease).
fn valid_until_ns(held: &Held) -> u64 {
    held.lease().map_or(0, |l| instant_ns(l.valid_until()))
}

fn reason_name(reason: LostReason) -> Option<&'static str> {
    match reason {
        LostReason::Released => None,
        LostReason::Gone => Some("gone"),
        LostReason::Expired => Some("expired"),
        _ => Some("other"),
    }
}

/// An extend of the `extend` fault that is running while the critical section goes on.
type Extending<'a> = FuturesUnordered<BoxFuture<'a, redlease::Result<()>>>;

/// What the extends of one critical section came to.
#[derive(Debug, Default)]
struct Extends {
    ok: u64,
    /// Failed with "not held" (the lease was lost; it then reports `Gone`).
    not_held: u64,
    /// Failed otherwise (Redis unreachable or too slow), or did not finish in time.
    failed: u64,
    /// The first failure, for the report.
    error: Option<String>,
}

impl Extends {
    fn record(&mut self, result: redlease::Result<()>) {
        match result {
            Ok(()) => self.ok += 1,
            Err(e) => {
                if e.is_not_held() {
                    self.not_held += 1;
                } else {
                    self.failed += 1;
                }
                self.error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Runs `fut` while the extends left running make progress (and are counted as they
/// finish): the critical section goes on beside them.
async fn beside<T>(running: &mut Extending<'_>, extends: &mut Extends, fut: impl Future<Output = T>) -> T {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            out = &mut fut => return out,
            Some(result) = running.next(), if !running.is_empty() => extends.record(result),
        }
    }
}

/// One extend of the `extend` fault: when into the work it starts, for how long, and
/// whether the section waits for it or goes on beside it.
struct ExtendPlan {
    at: Duration,
    ttl: Duration,
    background: bool,
}

/// 1-4 extends spread over `work`, each for 0.5-3 x TTL (longer or shorter than the
/// lease's current TTL, which the previous extend set), half of them left running.
fn plan_extends(rng: &mut Rng, work: Duration, ttl: Duration) -> Vec<ExtendPlan> {
    let n = 1 + rng.below(4);
    let mut plan: Vec<ExtendPlan> = (0..n)
        .map(|_| ExtendPlan {
            at: rng.between(Duration::ZERO, work),
            ttl: rng.scaled(ttl, 0.5, 3.0),
            background: rng.below(2) == 0,
        })
        .collect();
    plan.sort_by_key(|p| p.at);
    plan
}

/// The work between a critical section's first and second access: sleeps `work`,
/// stopping at once if the lease is lost (as an application selecting on `lost()`
/// would); under the `extend` fault it extends the lease on the way, as planned.
async fn work<'g>(
    held: &'g Held,
    work: Duration,
    plan: Vec<ExtendPlan>,
    running: &mut Extending<'g>,
    extends: &mut Extends,
) {
    let lease = held.lease();
    let lost = async {
        match lease {
            Some(lease) => {
                lease.lost().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(lost);
    let start = tokio::time::Instant::now();
    for step in plan {
        let until = start + step.at;
        let lost_now = beside(running, extends, async {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => false,
                _ = &mut lost => true,
            }
        })
        .await;
        if lost_now {
            return;
        }
        let Some(guard) = held.redlease() else { break };
        let extend = guard.extend(step.ttl);
        if step.background {
            running.push(extend);
        } else {
            let result = beside(running, extends, extend).await;
            extends.record(result);
        }
    }
    beside(running, extends, async {
        tokio::select! {
            _ = tokio::time::sleep_until(start + work) => {}
            _ = &mut lost => {}
        }
    })
    .await;
}

/// Where the resource is, and the connections to the counters of the locks a client
/// task has held so far (one per counter, opened on first use).
struct Counters {
    addr: String,
    conns: HashMap<usize, ResourceConn>,
}

impl Counters {
    async fn of(&mut self, counter: usize) -> std::io::Result<&mut ResourceConn> {
        if !self.conns.contains_key(&counter) {
            let conn = ResourceConn::connect(&self.addr, counter).await?;
            self.conns.insert(counter, conn);
        }
        Ok(self.conns.get_mut(&counter).expect("just inserted"))
    }
}

async fn client_task(shared: Arc<Shared>, lock: Arc<dyn LockClient>, slot: Slot, mut rng: Rng) {
    let spec = &shared.spec;
    let Slot { ai, group, task, .. } = slot;
    let counter = spec.counter(ai, slot.lock);
    let ttl = Duration::from_millis(spec.ttl_ms);
    let fatal = |m: String| {
        let _ = shared.out.send(json!({"t": "fatal", "m": m}).to_string());
        shared.stop.send_replace(true);
    };
    let mut counters = Counters {
        addr: spec.resource.clone(),
        conns: HashMap::new(),
    };
    if let Err(e) = counters.of(counter).await {
        return fatal(format!("cannot reach the resource: {e}"));
    }
    let mut stop = shared.stop.subscribe();
    let mut seq: u32 = 0;
    while !*stop.borrow() {
        seq += 1;
        let cs = cs_id(spec.worker, ai, group, task, seq);
        let start_ns = mono_ns();
        let acquired = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            r = lock.acquire(slot.lock) => r,
        };
        let held = match acquired {
            Ok(held) => held,
            Err(e) => {
                let (kind, msg) = match e {
                    AcquireError::Timeout => ("timeout", None),
                    AcquireError::Unavailable(m) => ("unavailable", Some(m)),
                    AcquireError::Other(m) => ("other", Some(m)),
                };
                let _ = shared
                    .out
                    .send(json!({"t": "acq", "a": counter, "k": kind, "m": msg}).to_string());
                if kind != "timeout" {
                    tokio::time::sleep(rng.between(Duration::from_millis(20), Duration::from_millis(100)))
                        .await;
                }
                continue;
            }
        };
        let acquired_ns = mono_ns();
        // The counters this holding writes, each with its own fencing token: one, or
        // one per name of a lock over several. Each is a critical section of its own
        // in the resource's eyes (and the checker's), over the same holding.
        let parts: Vec<(usize, u64)> = held
            .parts(slot.lock)
            .into_iter()
            .map(|(lock, fence)| (spec.counter(ai, lock), fence))
            .collect();
        let held_lease = held.lease().is_some();
        let watcher = held.lease().cloned().map(|lease| {
            shared.observer.spawn(async move {
                let reason = lease.lost().await;
                (reason, mono_ns())
            })
        });

        // The work between the read and the write; now and then a long one, that needs
        // its lease renewed. Under the `extend` fault the holder also extends its lease
        // on the way, some extends left running beside the rest of the section.
        let work_for = if rng.below(1000) < spec.long_work_per_mille {
            rng.between(
                Duration::from_millis(spec.long_work_ms.0),
                Duration::from_millis(spec.long_work_ms.1),
            )
        } else {
            Duration::from_micros(rng.below(spec.work_max_us + 1))
        };
        let plan = if spec.extend && held.redlease().is_some() {
            plan_extends(&mut rng, work_for, ttl)
        } else {
            Vec::new()
        };
        let mut extends = Extends::default();
        let mut running: Extending<'_> = FuturesUnordered::new();

        // What every part's report says, and each part's own outcome and refusal.
        let mut report = Map::new();
        let mut outcomes: Vec<Option<&'static str>> = vec![None; parts.len()];
        let mut rejected: Vec<Option<u64>> = vec![None; parts.len()];
        let role = held.role();
        'cs: {
            let pending = |outcomes: &[Option<&'static str>]| -> Vec<usize> {
                (0..outcomes.len()).filter(|&k| outcomes[k].is_none()).collect()
            };
            if !still_held(&held) {
                outcomes.fill(Some("abandoned"));
                break 'cs;
            }
            let mut values = vec![0; parts.len()];
            for (k, &(counter, fence)) in parts.iter().enumerate() {
                let res = match counters.of(counter).await {
                    Ok(res) => res,
                    Err(e) => {
                        fatal(format!("cannot reach the resource: {e}"));
                        outcomes.fill(Some("io"));
                        break 'cs;
                    }
                };
                let first = match role {
                    Role::Writer => res.read(cs, fence, valid_until_ns(&held)).await,
                    Role::Occupant => res.mark(Op::Begin, cs, valid_until_ns(&held)).await,
                };
                match first {
                    Ok(Reply::Accepted { value }) => values[k] = value,
                    Ok(Reply::Stale { at_ns }) => {
                        rejected[k] = Some(at_ns);
                        outcomes[k] = Some("fenced");
                    }
                    Err(e) => {
                        fatal(format!("resource read failed: {e}"));
                        outcomes.fill(Some("io"));
                        break 'cs;
                    }
                }
            }
            if pending(&outcomes).is_empty() {
                break 'cs;
            }
            work(&held, work_for, plan, &mut running, &mut extends).await;
            if !still_held(&held) {
                // Tokenless holders are inside since their first access: one that learns
                // its lease is lost leaves at once (not a completed critical section).
                for k in pending(&outcomes) {
                    if role == Role::Occupant {
                        let left = match counters.of(parts[k].0).await {
                            Ok(res) => res.mark(Op::Leave, cs, valid_until_ns(&held)).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = left {
                            fatal(format!("resource access failed: {e}"));
                            outcomes.fill(Some("io"));
                            break 'cs;
                        }
                    }
                    outcomes[k] = Some("abandoned");
                }
                break 'cs;
            }
            // client-pause: the holder checked its lease a moment ago and now stalls, its
            // whole client frozen, before the write — Kleppmann's scenario.
            let fresh = mono_ns() - acquired_ns < spec.ttl_ms * 200_000;
            let pending_stall = shared.pauses[ai].load(Ordering::Acquire);
            let stall = if pending_stall != 0 && (fresh || pending_stall & FRESH == 0) {
                shared.pauses[ai]
                    .compare_exchange(pending_stall, 0, Ordering::AcqRel, Ordering::Acquire)
                    .map_or(0, |p| p & !FRESH)
            } else {
                0
            };
            if stall > 0 {
                report.insert("stall".into(), stall.into());
                report.insert("stall_ns".into(), mono_ns().into());
                // Tell the coordinator, which may be waiting to restart Redis meanwhile.
                let _ = shared.out.send(json!({"t": "stall", "a": ai}).to_string());
                std::thread::sleep(Duration::from_millis(stall));
            }
            // extend: now and then the holder leans on the lease it was told it has —
            // its whole client frozen (renewals too) until just before `valid_until` —
            // then writes. If the server's lease were shorter than the one the extends
            // and renewals confirmed, another holder would get in meanwhile and this
            // write, still within the holder's lease, would be refused: a violation.
            if spec.extend
                && rng.below(LEAN_ONE_IN) == 0
                && let Some(lease) = held.lease()
            {
                let left = lease
                    .valid_until()
                    .saturating_duration_since(std::time::Instant::now());
                let lean = left.saturating_sub(LEAN_MARGIN).min(ttl * 3);
                if lean >= LEAN_MARGIN {
                    report.insert("lean".into(), (lean.as_micros() as u64).into());
                    report.insert("lean_ns".into(), mono_ns().into());
                    std::thread::sleep(lean);
                }
            }
            for k in pending(&outcomes) {
                let (counter, fence) = parts[k];
                let res = match counters.of(counter).await {
                    Ok(res) => res,
                    Err(e) => {
                        fatal(format!("cannot reach the resource: {e}"));
                        outcomes.fill(Some("io"));
                        break 'cs;
                    }
                };
                let second = match role {
                    Role::Writer => {
                        let write = res.write(cs, fence, values[k] + 1, valid_until_ns(&held));
                        beside(&mut running, &mut extends, write).await
                    }
                    Role::Occupant => {
                        let end = res.mark(Op::End, cs, valid_until_ns(&held));
                        beside(&mut running, &mut extends, end).await
                    }
                };
                outcomes[k] = Some(match second {
                    Ok(Reply::Accepted { .. }) => "ok",
                    Ok(Reply::Stale { at_ns }) => {
                        rejected[k] = Some(at_ns);
                        "fenced"
                    }
                    Err(e) => {
                        fatal(format!("resource write failed: {e}"));
                        "io"
                    }
                });
            }
        }
        // Extends still running finish before the release (one that does not within 10 s
        // counts as failed).
        let by = tokio::time::Instant::now() + Duration::from_secs(10);
        while !running.is_empty() {
            match tokio::time::timeout_at(by, running.next()).await {
                Ok(Some(result)) => extends.record(result),
                Ok(None) => break,
                Err(_) => {
                    extends.failed += running.len() as u64;
                    extends
                        .error
                        .get_or_insert_with(|| "extend did not finish within 10 s".into());
                    break;
                }
            }
        }
        drop(running);
        // A lease that ran past `valid_until` unconfirmed is lost, whether or not its
        // `lost()` has fired yet: make it say so before the release would end it as
        // released (and its loss went unrecorded).
        if let Some(lease) = held.lease()
            && !lease.is_held()
        {
            lease.lost().await;
        }
        let release = held.release().await;
        let released_ns = mono_ns();
        if let Some(watcher) = watcher
            && let Ok(Ok((reason, at))) = tokio::time::timeout(Duration::from_secs(10), watcher).await
            && let Some(name) = reason_name(reason)
        {
            report.insert("lost".into(), name.into());
            report.insert("lost_ns".into(), at.into());
        }
        if held_lease {
            report.insert("l".into(), true.into());
        }
        report.insert("t".into(), "cs".into());
        report.insert("cs".into(), cs.into());
        report.insert("start".into(), start_ns.into());
        report.insert("got".into(), acquired_ns.into());
        report.insert("rel".into(), release.name().into());
        report.insert("rel_ns".into(), released_ns.into());
        let mut io = false;
        for (k, &(counter, _)) in parts.iter().enumerate() {
            let mut report = report.clone();
            // The extends of the holding, counted once.
            if k == 0 && extends.ok + extends.not_held + extends.failed > 0 {
                report.insert("ext".into(), extends.ok.into());
                report.insert("ext_nh".into(), extends.not_held.into());
                report.insert("ext_err".into(), extends.failed.into());
                if let Some(e) = &extends.error {
                    report.insert("ext_m".into(), e.clone().into());
                }
            }
            if let Some(at_ns) = rejected[k] {
                report.insert("rej".into(), at_ns.into());
            }
            let outcome = outcomes[k].unwrap_or("io");
            io |= outcome == "io";
            report.insert("a".into(), counter.into());
            report.insert("o".into(), outcome.into());
            let _ = shared.out.send(Value::Object(report).to_string());
        }
        if io {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_its_json_and_numbers_every_lock() {
        let spec = Spec {
            worker: 1,
            lock_urls: vec!["redis://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()],
            resource: "127.0.0.1:3".into(),
            algorithms: vec![
                ("redlease".into(), vec!["a-0".into(), "a-1".into()]),
                ("redlease-fair".into(), vec!["b-0".into(), "b-1".into()]),
            ],
            groups: 2,
            tasks: 3,
            ttl_ms: 1000,
            response_timeout_ms: 250,
            retry_window_ms: 1500,
            acquire_timeout_ms: 10_000,
            work_max_us: 2000,
            long_work_per_mille: 300,
            long_work_ms: (300, 1200),
            cluster: true,
            extend: false,
            seed: 7,
        };
        let back = Spec::from_json(&spec.to_json()).expect("valid spec");
        assert_eq!(back.algorithms, spec.algorithms);
        assert_eq!(back.long_work_ms, (300, 1200));
        assert!(back.cluster && !back.extend);
        assert_eq!(
            [
                back.counter(0, 0),
                back.counter(0, 1),
                back.counter(1, 0),
                back.counter(1, 1)
            ],
            [0, 1, 2, 3]
        );
    }
}
