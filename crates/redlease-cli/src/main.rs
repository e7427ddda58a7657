//! `redlease`: run a command under a Redis lock or as the elected leader, take, inspect
//! and release locks, and watch the lock at work (`redlease demo`). This file only
//! dispatches.
//!
//! - `cli`: the command line (clap); its doc comments are the `--help` text.
//! - `connect`: the global options, the checks of their combinations, and connecting
//!   (one server, cluster, sentinel, Redlock, TLS).
//! - `exit`: the documented exit statuses and the error commands fail with.
//! - `output`: errors and notes on stderr, results on stdout, durations for people.
//! - `wait`: taking any kind of lock as `--wait` / `--no-wait` say.
//! - The subcommands: `run` (run, semaphore run, rwlock run, elect: CMD under any kind
//!   of lock or as the leader, one supervision over `Box<dyn redlease::Guard>`),
//!   `manage` (acquire, release, extend, status, semaphore status, rwlock status),
//!   `leader` (who leads an election, and its changes), `list` (every held lock), `demo` (with `throwaway`: the
//!   redis-server it starts when none is given).
//! - `signals`: catching signals, and telling the terminal's apart from `kill`'s.

mod cli;
mod connect;
mod demo;
mod exit;
mod leader;
mod list;
mod manage;
mod output;
mod run;
mod signals;
mod throwaway;
mod wait;

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{Command, RwlockCommand, SemaphoreCommand};
use crate::connect::Global;
use crate::exit::Failure;

fn main() -> ExitCode {
    let (command, global) = connect::parse();
    dispatch(command, &global).unwrap_or_else(|failure| output::report(&failure))
}

fn dispatch(command: Command, global: &Global) -> Result<ExitCode, Failure> {
    connect::check_topology(global, &command)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::caused(exit::FAILED, e))?;
    let result = runtime.block_on(async {
        let result = match command {
            Command::Run(args) => run::run(global, args).await,
            Command::Semaphore(SemaphoreCommand::Run(args)) => run::semaphore(global, args).await,
            Command::Rwlock(RwlockCommand::Run(args)) => run::rwlock(global, args).await,
            Command::Elect(args) => run::elect(global, args).await,
            Command::Leader(args) => leader::leader(global, args).await,
            Command::List(args) => list::list(global, args).await,
            Command::Acquire(args) => manage::acquire(global, args).await,
            Command::Release(args) => manage::release(global, args).await,
            Command::Extend(args) => manage::extend(global, args).await,
            Command::Status(args) => manage::status(global, args).await,
            Command::Semaphore(SemaphoreCommand::Status(args)) => {
                manage::semaphore_status(global, args).await
            }
            Command::Rwlock(RwlockCommand::Status(args)) => manage::rwlock_status(global, args).await,
            Command::Demo(args) => demo::demo(global, args).await,
            Command::Completions { shell } => output::completions(shell),
            Command::Man { dir } => output::man(dir.as_deref()),
        };
        connect::finish_background_work(global.response_timeout).await;
        result
    });
    // Do not wait for a worker thread stuck on a dead connection.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}
