//! `redlease`: run a command under a Redis lock, take, inspect and release locks, and
//! watch the lock at work (`redlease demo`).
//!
//! - `cli`: the command line (clap); its doc comments are the `--help` text.
//! - `exit`: the documented exit statuses and the error commands fail with.
//! - `run`, `manage` (acquire, release, extend, status), `demo`: the subcommands.
//! - `signals`: catching signals, and telling the terminal's apart from `kill`'s.

mod cli;
mod demo;
mod exit;
mod manage;
mod run;
mod signals;

use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};
use crate::exit::Failure;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {failure:#}");
            if let Some(hint) = failure.hint_text() {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(failure.status)
        }
    }
}

/// What every subcommand that talks to Redis needs.
#[derive(Clone)]
pub struct Global {
    pub url: String,
    /// `url` without its password, for messages.
    pub shown_url: String,
    /// `--redis` or `REDIS_URL` was given (not the default).
    pub url_given: bool,
    pub prefix: String,
    pub response_timeout: Duration,
}

fn run() -> Result<ExitCode, Failure> {
    // Parse by hand to learn whether --redis was given (clap exits 2 on usage errors).
    let matches = Cli::command().get_matches();
    let url_given = !matches!(matches.value_source("redis"), Some(ValueSource::DefaultValue));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let global = Global {
        shown_url: exit::redact_url(&cli.redis),
        url: cli.redis,
        url_given,
        prefix: cli.prefix,
        response_timeout: cli.response_timeout,
    };
    if let Command::Completions { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "redlease", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::caused(exit::FAILED, e))?;
    let result = runtime.block_on(async {
        let result = match cli.command {
            Command::Run(args) => run::run(&global, args).await,
            Command::Acquire(args) => manage::acquire(&global, args).await,
            Command::Release(args) => manage::release(&global, args).await,
            Command::Extend(args) => manage::extend(&global, args).await,
            Command::Status(args) => manage::status(&global, args).await,
            Command::Demo(args) => demo::demo(&global, args).await,
            Command::Completions { .. } => unreachable!("handled above"),
        };
        finish_background_work(global.response_timeout).await;
        result
    });
    // Do not wait for a worker thread stuck on a dead connection.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// Lets background work finish before the process exits: a release started by a
/// cancelled acquire (so no lock is left behind when redlease is interrupted while
/// waiting), and the clients' own shutdown. Every client must have been dropped;
/// bounded, so a dead server cannot hold redlease up.
async fn finish_background_work(response_timeout: Duration) {
    let deadline = tokio::time::Instant::now() + response_timeout + Duration::from_secs(1);
    let metrics = tokio::runtime::Handle::current().metrics();
    while metrics.num_alive_tasks() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Connects to Redis as `global` says.
pub async fn connect(global: &Global) -> Result<redlease::Client, Failure> {
    let redis = redis::Client::open(global.url.as_str()).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!("invalid --redis URL {:?}: {e}", global.shown_url),
        )
        .hint(format!(
            "pass --redis (or set REDIS_URL) to a URL such as {}",
            cli::DEFAULT_URL
        ))
    })?;
    redlease::Client::builder(redis)
        .prefix(global.prefix.clone())
        .response_timeout(Some(global.response_timeout))
        .build()
        .await
        .map_err(|e| Failure::from_lock(e, &global.shown_url))
}
