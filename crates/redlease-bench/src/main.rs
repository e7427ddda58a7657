//! `redlease-bench`: redlease against the Redis speed limit (raw commands) and a peer
//! (rslock), every contender in the same run, interleaved round by round.
//!
//! ```text
//! cargo run --release -p redlease-bench -- --quick --json bench-out/quick.json
//! ```

mod contenders;
mod measure;
mod plot;
mod scenarios;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use contenders::Contender;
use measure::RedisProbe;
use scenarios::{Bench, Outcome, Plan};

/// Benchmarks redlease against raw redis commands and rslock, interleaved in one run.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Redis to run against (default: start a throwaway redis-server on loopback). It
    /// must serve nothing but the bench during the run: Redis CPU is the server's
    /// total. Keys containing `bench:` are deleted between measured windows.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,

    /// Short run (under 3 minutes on 2 cores): fewer, shorter rounds.
    #[arg(long)]
    quick: bool,

    /// Write results as JSON to FILE; PNG plots are written next to it.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// Only these scenarios (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    scenarios: Vec<String>,

    /// Only these contenders (comma-separated: raw-redis, redlease, rslock, rslock-10ms).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    contenders: Vec<String>,

    #[command(subcommand)]
    worker: Option<Worker>,
}

#[derive(Subcommand, Debug)]
enum Worker {
    /// Internal: run one job in this process and print its report as JSON.
    #[command(hide = true)]
    Worker { spec: String },
}

const SCENARIOS: [&str; 9] = [
    "uncontended-sequential",
    "uncontended-parallel-64",
    "contended-1key-16",
    "contended-hold-1ms",
    "handoff-latency",
    "renewal-10k",
    "fair-vs-unfair",
    "semaphore",
    "semaphore-hold-1ms",
];

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Some(Worker::Worker { spec }) = args.worker {
        let job = serde_json::from_str(&spec).expect("job spec");
        let report = runtime.block_on(worker::run(job));
        println!("{}", serde_json::to_string(&report).expect("report"));
        return ExitCode::SUCCESS;
    }
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let contenders: Vec<Contender> = if args.contenders.is_empty() {
        Contender::ALL.to_vec()
    } else {
        args.contenders
            .iter()
            .map(|n| Contender::parse(n).ok_or_else(|| format!("unknown contender {n:?}")))
            .collect::<Result<_, _>>()?
    };
    for s in &args.scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s:?}; known: {}", SCENARIOS.join(", ")));
        }
    }
    let wanted = |s: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|x| x == s);
    let plan = if args.quick {
        Plan {
            rounds: 3,
            round: Duration::from_millis(1500),
            handoff_samples: 90,
            renewal_leases: 10_000,
            renewal_window: Duration::from_secs(6),
        }
    } else {
        Plan {
            rounds: 5,
            round: Duration::from_secs(4),
            handoff_samples: 500,
            renewal_leases: 10_000,
            renewal_window: Duration::from_secs(15),
        }
    };

    let server;
    let url = match &args.redis {
        Some(url) => url.clone(),
        None => {
            server = redlease_testkit::RedisServer::start().map_err(|e| e.to_string())?;
            server.url()
        }
    };
    let mut probe = RedisProbe::connect(&url).await?;
    if args.redis.is_some() {
        match probe.other_clients().await {
            Ok(0) => {}
            Ok(n) => eprintln!(
                "warning: {n} other client(s) connected to {url}: Redis CPU per op counts whatever they make the server do"
            ),
            Err(e) => eprintln!("warning: cannot list the server's clients: {e}"),
        }
    }
    // Keys of an earlier run must not expire inside this one's windows.
    probe.cleanup().await?;
    probe.calibrate().await?;
    let rtt = scenarios::loopback_rtt_us(&url).await?;
    eprintln!(
        "redis {url}; loopback round trip p50 {rtt:.0} µs; {} rounds of {:?}",
        plan.rounds, plan.round
    );
    eprintln!(
        "redis cpu: one INFO sample costs {:.1} µs (subtracted from every window); idle server {:.0} µs/s",
        probe.info_cost_us, probe.idle_us_per_s
    );
    let bench = Bench {
        url: url.clone(),
        plan,
        probe,
    };

    let mut outcomes: Vec<Outcome> = Vec::new();
    for name in SCENARIOS {
        if !wanted(name) {
            continue;
        }
        eprintln!("running {name} ...");
        let outcome = match name {
            "uncontended-sequential" => scenarios::uncontended_sequential(&bench, &contenders).await,
            "uncontended-parallel-64" => scenarios::uncontended_parallel(&bench, &contenders).await,
            "contended-1key-16" => scenarios::contended(&bench, &contenders).await,
            "contended-hold-1ms" => scenarios::contended_hold(&bench, &contenders).await,
            "handoff-latency" => scenarios::handoff(&bench, &contenders, rtt).await,
            "renewal-10k" => scenarios::renewal(&bench, &contenders).await,
            "fair-vs-unfair" => scenarios::fair_vs_unfair(&bench).await,
            "semaphore" => scenarios::semaphore(&bench, &contenders).await,
            "semaphore-hold-1ms" => scenarios::semaphore_hold(&bench, &contenders).await,
            _ => unreachable!(),
        };
        print_outcome(&outcome);
        outcomes.push(outcome);
    }

    if let Some(path) = &args.json {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        let doc = serde_json::json!({
            "loopback_rtt_us": rtt,
            "quick": args.quick,
            "rounds": plan.rounds,
            "round_secs": plan.round.as_secs_f64(),
            "redis_version": redis_version(&url).await,
            "redis_info_cost_us": bench.probe.info_cost_us,
            "redis_idle_cpu_us_per_s": bench.probe.idle_us_per_s,
            "scenarios": outcomes,
        });
        let text = serde_json::to_string_pretty(&doc).expect("json");
        std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
        match plot::write_all(path, &outcomes) {
            Ok(files) => {
                for f in files {
                    eprintln!("wrote {}", f.display());
                }
            }
            Err(e) => eprintln!("warning: no plots: {e}"),
        }
    }
    Ok(())
}

fn print_outcome(o: &Outcome) {
    let redlease = o.results.get("redlease").copied();
    println!(
        "\n{} ({}{})",
        o.name,
        o.unit,
        if o.higher_is_better {
            ", higher is better"
        } else {
            ", lower is better"
        }
    );
    println!(
        "  {:<14} {:>14} {:>22}   rounds",
        "contender", "median", "redlease vs this"
    );
    for (name, value) in &o.results {
        let ratio = match redlease {
            Some(r) if name != "redlease" && *value > 0.0 && r > 0.0 => {
                let x = if o.higher_is_better { r / value } else { value / r };
                format!("{x:.2}x")
            }
            _ => String::new(),
        };
        let rounds: Vec<String> = o.rounds[name].iter().map(|v| format!("{v:.0}")).collect();
        println!("  {name:<14} {value:>14.1} {ratio:>22}   [{}]", rounds.join(", "));
    }
    for (metric, values) in &o.metrics {
        if SPECIAL_METRICS.contains(&metric.as_str()) {
            continue;
        }
        let parts: Vec<String> = values.iter().map(|(c, v)| format!("{c} {v:.2}")).collect();
        println!("  {metric}: {}", parts.join(", "));
    }
    let cpu_line = |metric: &str, label: &str| {
        let Some(values) = o.metrics.get(metric) else {
            return;
        };
        let raw = values.get("raw-redis").copied().filter(|r| *r > 0.0);
        let parts: Vec<String> = values
            .iter()
            .map(|(c, v)| match raw {
                Some(r) if c != "raw-redis" => format!("{c} {} ({:.2}x raw)", cpu(*v), v / r),
                _ => format!("{c} {}", cpu(*v)),
            })
            .collect();
        println!("  {label}: {}", parts.join(", "));
    };
    cpu_line("redis_cpu_us_per_op", &format!("redis cpu µs/op ({})", o.op));
    if let (Some(idle), Some(total)) = (
        o.metrics.get("redis_idle_cpu_us_per_op"),
        o.metrics.get("redis_cpu_us_per_op"),
    ) {
        // Worth a line only where the idle server is a visible part of the figure.
        if idle
            .iter()
            .any(|(c, v)| total.get(c).is_some_and(|t| *v > 0.05 * t))
        {
            let parts: Vec<String> = idle.iter().map(|(c, v)| format!("{c} {}", cpu(*v))).collect();
            println!("    of which the idle server's own: {}", parts.join(", "));
        }
    }
    cpu_line("client_cpu_us_per_op", "client cpu µs/op");
    let failed: Vec<String> = o
        .metrics
        .get("failures")
        .into_iter()
        .flatten()
        .filter(|(_, n)| **n > 0.0)
        .map(|(c, n)| match o.failure_examples.get(c) {
            Some(e) => format!("{c} {n:.0} (first: {e})"),
            None => format!("{c} {n:.0}"),
        })
        .collect();
    if failed.is_empty() {
        println!("  failures: none");
    } else {
        println!("  failures: {}", failed.join("; "));
    }
}

/// Metrics printed in a form of their own, not in the generic list.
const SPECIAL_METRICS: [&str; 4] = [
    "redis_cpu_us_per_op",
    "redis_idle_cpu_us_per_op",
    "client_cpu_us_per_op",
    "failures",
];

/// A CPU figure in µs with about three significant digits.
fn cpu(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

async fn redis_version(url: &str) -> String {
    let Ok(client) = redis::Client::open(url) else {
        return String::new();
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return String::new();
    };
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}
