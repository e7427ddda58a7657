//! `redlease-torture`: many clients in several processes take a lock around a
//! read-increment-write of a protected counter while faults are injected into Redis and
//! the network; a checker audits the counter's access log for violations.
//!
//! # A map of the crate
//!
//! - `coordinator`: the phases of a run — lock server, fault proxy, workers, faults.
//! - `worker`: a worker process (this binary re-executed): client groups and tasks,
//!   the critical section, the `lost()` watchers.
//! - `resource`: the fenced counter the critical sections protect, and its access log.
//! - `checker`: what counts as a violation.
//! - `algorithms`: the locks under test behind one trait — redlease's mutex, fair
//!   mutex, leader election, read-write lock, semaphore, Redlock and legacy timestamp
//!   lock, and naive baselines: the broken locks common in the wild.
//! - `faults`, `report`, `clock`, `rng`: fault names, output, the shared clock, seeds.
//! - `log`: the library's own log in every worker (`REDLEASE_TORTURE_LOG=debug`).
//!
//! Exit status: 0 when every must-be-safe algorithm had zero violations (algorithms
//! without fencing tokens are must-be-safe only under the faults no holder can outlive
//! its lease in) and lost no lease under `extend` and `cluster`, 1 when one did not, 2
//! when the harness itself failed (or a phase made too little progress to prove
//! anything).

mod algorithms;
mod checker;
mod clock;
mod coordinator;
mod faults;
mod log;
mod report;
mod resource;
mod rng;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::coordinator::{Config, Phase};
use crate::faults::Fault;

/// Torture redlease: many clients and processes, real faults, a fencing checker, and
/// naive baselines that show the checker bites.
///
/// Without a mode flag it runs `--quick`.
#[derive(Parser, Debug)]
#[command(name = "redlease-torture", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Lists the algorithms and faults.
    List,
    /// Internal: runs one worker process of a phase.
    #[command(hide = true)]
    Worker { spec: String },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Every fault for 20 s, then all of them mixed for 40 s (about 4.5 minutes).
    #[arg(long, conflicts_with_all = ["ci", "duration"])]
    quick: bool,
    /// The CI variant: eight faults for 12 s each (under 2 minutes).
    #[arg(long, conflicts_with = "duration")]
    ci: bool,
    /// A soak run of this total length (e.g. 10m, 1h), shared among the phases.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Also writes the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Algorithms to run, comma-separated (default: all; see `list`).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    algorithms: Vec<String>,
    /// Phases to run, comma-separated fault names or `mixed` (default: per mode).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    faults: Vec<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Client groups (threads, each with one lock client) per algorithm per worker.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    /// Client tasks per group.
    #[arg(long, default_value_t = 3)]
    tasks: usize,
    /// Lease length.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ttl: Duration,
    /// Seed of the fault schedule (default: random; printed).
    #[arg(long)]
    seed: Option<u64>,
}

/// Parses `500ms`, `20s`, `10m`, `1h`, or sums of them (`1m30s`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(digits);
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("bad duration {s:?} (try 90s, 10m, 1h)"))?;
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" | "" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("bad unit {unit:?} in {s:?} (use ms, s, m or h)")),
        };
        total += Duration::from_secs_f64(secs);
        rest = tail;
    }
    Ok(total)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Worker { spec }) => worker::main(&spec),
        Some(Cmd::List) => {
            list();
            ExitCode::SUCCESS
        }
        None => match run(cli.run) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn list() {
    println!("algorithms:");
    for a in algorithms::all() {
        println!("  {:<20} {:<13} {}", a.name(), a.kind(), a.describe());
    }
    println!("faults:");
    for f in Fault::ALL {
        println!("  {:<20} {}", f.name(), f.describe());
    }
    println!(
        "  {:<20} all of the above but server-restart-aof, clock, extend and cluster, at random",
        "mixed"
    );
    println!("kinds: a violation of a must-be-safe algorithm fails the run; a conditional one's");
    println!("only under faults no holder can outlive its lease in (not client-pause, process-pause,");
    println!("server-restart, mixed): it has no fencing token; baselines never fail the run.");
    println!("under extend and cluster no lease may be lost: a lost() there fails the run too.");
}

/// The phases of a mode: which faults, for how long each.
fn plan(args: &RunArgs) -> Result<(String, Vec<Phase>), String> {
    const CI: [Fault; 8] = [
        Fault::ReplyDelay,
        Fault::ConnReset,
        Fault::ClientPause,
        Fault::ServerRestart,
        Fault::ServerPause,
        Fault::Clock,
        Fault::Extend,
        Fault::Cluster,
    ];
    // `None` is the mixed phase.
    let default: Vec<Option<Fault>> = if args.ci {
        CI.iter().copied().map(Some).collect()
    } else {
        Fault::ALL.iter().copied().map(Some).chain([None]).collect()
    };
    let chosen: Vec<Option<Fault>> = if args.faults.is_empty() {
        default
    } else {
        args.faults
            .iter()
            .map(|name| match name.as_str() {
                "mixed" => Ok(None),
                _ => Fault::parse(name)
                    .map(Some)
                    .ok_or_else(|| format!("unknown fault {name:?} (see `list`)")),
            })
            .collect::<Result<_, _>>()?
    };
    // A mixed phase gets two shares of the time, a single fault one.
    let shares: u32 = chosen.iter().map(|f| if f.is_some() { 1 } else { 2 }).sum();
    let (mode, share) = if args.ci {
        ("ci", Duration::from_secs(12))
    } else if let Some(total) = args.duration {
        let share = total / shares;
        if share < Duration::from_secs(5) {
            return Err(format!(
                "--duration is too short for {} phases: give at least {}s",
                chosen.len(),
                5 * shares
            ));
        }
        ("soak", share)
    } else {
        ("quick", Duration::from_secs(20))
    };
    // The clock fault applies to the legacy algorithms only, and cluster to the locks
    // that run on one: in the mixed phase they would leave the others out.
    let mixed: Vec<Fault> = Fault::ALL.iter().copied().filter(|f| f.mixes()).collect();
    let phases = chosen
        .into_iter()
        .map(|f| match f {
            Some(fault) => Phase {
                name: fault.name().to_owned(),
                faults: vec![fault],
                duration: share,
            },
            None => Phase {
                name: "mixed".to_owned(),
                faults: mixed.clone(),
                duration: share * 2,
            },
        })
        .collect();
    Ok((mode.to_owned(), phases))
}

fn run(args: RunArgs) -> Result<ExitCode, String> {
    let (mode, phases) = plan(&args)?;
    let algorithms = if args.algorithms.is_empty() {
        algorithms::all()
    } else {
        args.algorithms
            .iter()
            .map(|n| algorithms::by_name(n).ok_or_else(|| format!("unknown algorithm {n:?} (see `list`)")))
            .collect::<Result<_, _>>()?
    };
    if args.workers == 0 || args.groups == 0 || args.tasks == 0 {
        return Err("--workers, --groups and --tasks must be at least 1".into());
    }
    if args.workers > 200 || args.groups > 200 || args.tasks > 200 {
        return Err("--workers, --groups and --tasks must be at most 200".into());
    }
    if args.ttl < Duration::from_millis(200) {
        return Err("--ttl must be at least 200ms (the faults are scaled to it)".into());
    }
    let config = Config {
        mode,
        phases,
        algorithms,
        workers: args.workers,
        groups: args.groups,
        tasks: args.tasks,
        ttl: args.ttl,
        response_timeout: args.ttl / 4,
        retry_window: args.ttl * 3 / 2,
        acquire_timeout: args.ttl * 10,
        work_max: Duration::from_millis(2),
        long_work_per_mille: 10,
        seed: args
            .seed
            .unwrap_or_else(|| rng::Rng::from_entropy().next_u64() >> 12),
    };
    redlease_testkit::redis_server_bin().map_err(|e| e.to_string())?;
    let total: Duration = config.phases.iter().map(|p| p.duration).sum();
    eprintln!(
        "redlease-torture --{}: {} phases, ~{:.0}s of faults; {} clients per algorithm in {} processes; \
         ttl {:?}; seed {}",
        config.mode,
        config.phases.len(),
        total.as_secs_f64(),
        config.clients_per_algorithm(),
        config.workers,
        config.ttl,
        config.seed
    );

    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let (rows, error) = runtime.block_on(coordinator::run(&config));
    let seconds = started.elapsed().as_secs_f64();

    println!();
    print!("{}", report::table(&rows));
    let lost = report::unexplained_lost(&rows);
    if !lost.is_empty() {
        println!();
        print!("{lost}");
    }
    let (violations, mut harness) = report::failures(&rows);
    if let Some(e) = &error {
        harness.push(e.clone());
    }
    let passed = violations.is_empty() && harness.is_empty();
    if let Some(path) = &args.json {
        let doc = report::json(&config, &rows, seconds, passed, error.as_deref());
        let text = serde_json::to_string_pretty(&doc).expect("json");
        std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    println!();
    summary(&rows, seconds);
    runtime.shutdown_timeout(Duration::from_secs(2));
    if !violations.is_empty() {
        for v in &violations {
            eprintln!("VIOLATION: {v}");
        }
        for h in &harness {
            eprintln!("harness error: {h}");
        }
        return Ok(ExitCode::from(1));
    }
    if !harness.is_empty() {
        for h in &harness {
            eprintln!("harness error: {h}");
        }
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// The verdict in words.
fn summary(rows: &[coordinator::Row], seconds: f64) {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.algorithm.as_str()) {
            names.push(&r.algorithm);
        }
    }
    for name in names {
        let mine: Vec<_> = rows.iter().filter(|r| r.algorithm == name).collect();
        let cs: u64 = mine.iter().map(|r| r.verdict.critical_sections).sum();
        let violations: u64 = mine.iter().map(|r| r.verdict.violations).sum();
        let bad: Vec<&str> = mine
            .iter()
            .filter(|r| r.verdict.violations > 0)
            .map(|r| r.phase.as_str())
            .collect();
        let informative: Vec<&str> = mine
            .iter()
            .filter(|r| !r.must_be_safe)
            .map(|r| r.phase.as_str())
            .collect();
        if mine[0].baseline {
            print!(
                "{name} (baseline): {violations} violations in {cs} critical sections over {} phases",
                mine.len()
            );
        } else if !informative.is_empty() {
            let counted: u64 = mine
                .iter()
                .filter(|r| r.must_be_safe)
                .map(|r| r.verdict.violations)
                .sum();
            print!(
                "{name}: {counted} violations where it must be safe, {} more where it cannot be (no token; \
                 informative under {}), in {cs} critical sections over {} phases",
                violations - counted,
                informative.join(", "),
                mine.len()
            );
        } else {
            print!(
                "{name}: {violations} violations in {cs} critical sections over {} phases",
                mine.len()
            );
        }
        if !bad.is_empty() {
            print!(" — under {}", bad.join(", "));
        }
        println!();
        let paused: u64 = mine
            .iter()
            .map(|r| r.verdict.paused - r.verdict.paused_excused)
            .sum();
        let unexplained: Vec<String> = mine
            .iter()
            .filter_map(|r| r.lost_unexplained.map(|n| format!("{n} under {}", r.phase)))
            .collect();
        if !unexplained.is_empty() {
            println!(
                "  leases lost with no fault to explain it: {}",
                unexplained.join(", ")
            );
        }
        let extends: Vec<_> = mine
            .iter()
            .filter(|r| r.faults.contains(&Fault::Extend))
            .collect();
        if !extends.is_empty() {
            let sum = |f: &dyn Fn(&coordinator::Row) -> u64| extends.iter().map(|r| f(r)).sum::<u64>();
            println!(
                "  extends: {} ok, {} not held, {} failed; {} holders leaned on their lease \
                 ({} leases of their clients ran out meanwhile)",
                sum(&|r| r.verdict.extends_ok),
                sum(&|r| r.verdict.extends_not_held),
                sum(&|r| r.verdict.extends_failed),
                sum(&|r| r.verdict.leaned),
                sum(&|r| r.lost_leaning)
            );
        }
        if mine[0].verdict.lost_signals.is_some() && paused > 0 {
            let first: u64 = mine.iter().map(|r| r.verdict.paused_lost_first).sum();
            let refused: u64 = mine.iter().map(|r| r.verdict.paused_rejected).sum();
            println!(
                "  paused holders: {first}/{paused} saw lost() fire before the resource answered their \
                 write ({refused} refused, {} accepted)",
                paused - refused
            );
        }
    }
    // Baselines are expected to fail only under faults that let a holder outlive its
    // lease (the others cost them liveness only).
    let baselines: Vec<_> = rows
        .iter()
        .filter(|r| r.baseline && r.faults.iter().any(|&f| algorithms::outlives_lease(f)))
        .collect();
    if !baselines.is_empty() && baselines.iter().all(|r| r.verdict.violations == 0) {
        println!("warning: no baseline showed a violation in this run: the faults did not bite");
    }
    println!("finished in {seconds:.0}s");
}
