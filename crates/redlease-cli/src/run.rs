//! `redlease run NAME -- CMD`: run CMD while holding the lock.
//!
//! The lease is renewed by the library for as long as CMD runs. Three things can end
//! the run: CMD exits (release the lock, exit with CMD's status), the lease is lost
//! (signal CMD, then kill it after the grace period; exit `LEASE_LOST`), or redlease is
//! signalled (pass the signal on, keep holding the lock until CMD has exited).

use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpgid, getpgrp};
use redlease::{LeaseOptions, LostReason};
use tokio::process::Command;
use tokio::time::{Instant, sleep_until};

use crate::cli::{RunArgs, signal_status};
use crate::exit::{self, Failure};
use crate::manage::{acquire_lock, human};
use crate::signals::Signals;
use crate::{Global, connect};

pub async fn run(global: &Global, args: RunArgs) -> Result<ExitCode, Failure> {
    // Catch signals before anything is taken, so none can kill redlease mid-way.
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client
        .mutex_with(&args.name, LeaseOptions::new().ttl(args.ttl))
        .map_err(lock_err)?;
    let guard = acquire_lock(&mutex, &args.wait, &mut signals, global).await?;
    let fence = guard.fence();

    let (program, rest) = args.command.split_first().expect("clap requires CMD");
    let spawned = Command::new(program)
        .args(rest)
        .env("REDLEASE_NAME", &args.name)
        .env("REDLEASE_KEY", mutex.key())
        .env("REDLEASE_FENCE", fence.to_string())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            let status = if e.kind() == ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return Err(Failure::new(status, format!("cannot run {program:?}: {e}"))
                .hint("check CMD after `--`; the lock was released"));
        }
    };

    let lease = guard.lease().clone();
    let lost = lease.lost();
    tokio::pin!(lost);
    let mut lost_reason: Option<LostReason> = None;
    let mut kill_at: Option<Instant> = None;
    let status: ExitStatus = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(|e| Failure::caused(exit::FAILED, e))?,
            reason = &mut lost, if lost_reason.is_none() => {
                lost_reason = Some(reason);
                eprintln!(
                    "redlease: lost lock {:?} while CMD ran ({reason}); sending {} to CMD, SIGKILL in {}",
                    args.name,
                    args.lost_signal,
                    human(args.grace),
                );
                send(&child, args.lost_signal);
                kill_at = Some(Instant::now() + args.grace);
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                eprintln!("redlease: CMD did not exit within --grace {}; sending SIGKILL", human(args.grace));
                let _ = child.start_kill();
                kill_at = None;
            }
            received = signals.recv() => {
                // The terminal signals its whole foreground process group: if CMD is in
                // ours, it has the signal already.
                if received.sent_by_process || !in_our_process_group(&child) {
                    send(&child, received.signal);
                }
            }
        }
    };
    let cmd_status = exit_status(status);

    if let Some(reason) = lost_reason {
        // If Redis was merely unreachable the key may still be ours: give it back.
        let _ = guard.release().await;
        return Err(lease_lost(&args.name, reason, status));
    }
    match guard.release().await {
        Ok(()) => Ok(ExitCode::from(cmd_status)),
        Err(e) if e.is_not_held() => Err(lease_lost(&args.name, LostReason::Gone, status)),
        Err(e) => {
            // CMD ran under the lock; only giving it back failed. It frees itself
            // after --ttl, so CMD's status is still the honest answer.
            eprintln!(
                "redlease: warning: could not release lock {:?} ({e}); it frees itself within {}",
                args.name,
                human(args.ttl)
            );
            Ok(ExitCode::from(cmd_status))
        }
    }
}

/// Sends `signal` to CMD unless it has already been reaped (then its pid may be reused).
fn send(child: &tokio::process::Child, signal: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

/// Whether CMD is in redlease's process group (it is, unless it moved itself out).
fn in_our_process_group(child: &tokio::process::Child) -> bool {
    child
        .id()
        .and_then(|pid| getpgid(Some(Pid::from_raw(pid as i32))).ok())
        == Some(getpgrp())
}

/// CMD's exit status as redlease reports it: its code, or 128+N for signal N.
fn exit_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => signal_status(signal),
        (None, None) => exit::FAILED,
    }
}

fn lease_lost(name: &str, reason: LostReason, status: ExitStatus) -> Failure {
    Failure::new(
        exit::LEASE_LOST,
        format!(
            "the lease on lock {name:?} was lost while CMD ran ({reason}); CMD {}",
            describe(status)
        ),
    )
    .hint("another holder may have overlapped with CMD; pass REDLEASE_FENCE to the resource so it can refuse stale writes, and consider a longer --ttl")
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(s) => format!("was killed by {s}"),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, None) => "ended".into(),
    }
}
