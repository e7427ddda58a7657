//! `redlease run NAME [NAME…] -- CMD` (and `semaphore run`, `rwlock run`): run CMD
//! while holding a lock, or several names at once; `redlease elect NAME -- CMD`: run CMD
//! while leading an election.
//!
//! The lease is renewed by the library for as long as CMD runs. Three things can end
//! the run: CMD exits (release the lock, exit with CMD's status), the lease is lost
//! (signal CMD, then kill it after the grace period; exit `LEASE_LOST`), or redlease is
//! signalled (pass the signal on, keep holding the lock until CMD has exited). Every
//! kind of lock goes through the same supervision, in `supervise`.

use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpgid, getpgrp};
use redlease::{Guard, LeaseOptions, LegacyOptions, LostReason, TimestampUnit};
use tokio::process::Command;
use tokio::time::Instant;

use crate::cli::{ChildArgs, ElectArgs, LegacyUnit, RunArgs, RwlockRunArgs, SemaphoreRunArgs, signal_status};
use crate::connect::{Global, connect, connect_redlock, lease_options};
use crate::exit::{self, Failure};
use crate::output::{human, note};
use crate::signals::Signals;
use crate::wait::{Taker, Taking, after, until};

/// `redlease run NAME [--fair | --legacy] -- CMD`, on one server, a cluster, a
/// sentinel-managed master or (with `--redlock`) a quorum of masters.
pub async fn run(global: &Global, args: RunArgs) -> Result<ExitCode, Failure> {
    if args.names.all().len() > 1 {
        return several(global, args).await;
    }
    // Catch signals before anything is taken, so none can kill redlease mid-way.
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let names = args.names.all();
    let (c, name) = (&args.child, names[0].as_str());
    let taker = Taker {
        name,
        taking: Taking::Lock,
        wait: &c.wait,
        signals: &mut signals,
        global,
    };
    let guard: Box<dyn Guard> = if global.topology.redlock {
        let redlock = connect_redlock(global).await?;
        let m = redlock
            .mutex_with(name, LeaseOptions::new().ttl(c.ttl))
            .map_err(lock_err)?;
        Box::new(
            taker
                .take(|| m.try_lock(), |t| m.lock_timeout(t), || m.lock())
                .await?,
        )
    } else {
        let client = connect(global).await?;
        if args.legacy {
            let unit = match args.legacy_unit {
                LegacyUnit::S => TimestampUnit::Seconds,
                LegacyUnit::Ms => TimestampUnit::Milliseconds,
            };
            let l = client
                .legacy_lock(name, LegacyOptions::new().timeout(c.ttl).unit(unit))
                .map_err(lock_err)?;
            Box::new(
                taker
                    .take(|| l.try_lock(), |t| l.lock_timeout(t), || l.lock())
                    .await?,
            )
        } else if args.fair {
            let m = client
                .fair_mutex_with(name, LeaseOptions::new().ttl(c.ttl))
                .map_err(lock_err)?;
            Box::new(
                taker
                    .take(|| m.try_lock(), |t| m.lock_timeout(t), || m.lock())
                    .await?,
            )
        } else {
            let m = client
                .mutex_with(name, lease_options(global, c.ttl))
                .map_err(lock_err)?;
            let guard = taker
                .take(|| m.try_lock(), |t| m.lock_timeout(t), || m.lock())
                .await?;
            if let Some(acked) = guard.replicas_acked() {
                note(format_args!("lock {name:?} acknowledged by {acked} replica(s)"));
            }
            Box::new(guard)
        }
    };
    supervise(c, guard, Taking::Lock, Vec::new(), &mut signals).await
}

/// `redlease run NAME NAME… -- CMD`: every name held at once, each as its plain lock,
/// taken all or none — on one server, a cluster or a sentinel-managed master. CMD gets
/// `REDLEASE_NAME_<i>`, `REDLEASE_KEY_<i>` and `REDLEASE_FENCE_<i>` for the i-th name
/// (from 1, in the order given); `REDLEASE_NAME` and `REDLEASE_KEY` join them with `+`.
async fn several(global: &Global, args: RunArgs) -> Result<ExitCode, Failure> {
    let names = args.names.all();
    let one_name_only = [
        (args.fair, "--fair"),
        (args.legacy, "--legacy"),
        (global.topology.redlock, "--redlock"),
        (global.topology.wait_replicas.is_some(), "--wait-replicas"),
    ];
    if let Some((_, flag)) = one_name_only.into_iter().find(|(given, _)| *given) {
        return Err(Failure::new(
            exit::USAGE,
            format!("{flag} takes one NAME, and {} were given", names.len()),
        )
        .hint(format!("leave out {flag} to hold several NAMEs as plain locks")));
    }
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let c = &args.child;
    let client = connect(global).await?;
    let lock = client
        .multi_lock_with(&names, LeaseOptions::new().ttl(c.ttl))
        .map_err(lock_err)?;
    let label = names.join("+");
    let taker = Taker {
        name: &label,
        taking: Taking::Lock,
        wait: &c.wait,
        signals: &mut signals,
        global,
    };
    let guard = taker
        .take(|| lock.try_lock(), |t| lock.lock_timeout(t), || lock.lock())
        .await?;
    let mut env = Vec::new();
    for (i, ((name, key), fence)) in lock.names().zip(lock.keys()).zip(guard.fences()).enumerate() {
        let n = i + 1;
        env.push((format!("REDLEASE_NAME_{n}"), name.to_owned()));
        env.push((format!("REDLEASE_KEY_{n}"), key.to_owned()));
        env.push((format!("REDLEASE_FENCE_{n}"), fence.to_string()));
    }
    supervise_with(c, Box::new(guard), Taking::Lock, env, &mut signals).await
}

/// `redlease semaphore run NAME --permits N [--count K] -- CMD`.
pub async fn semaphore(global: &Global, args: SemaphoreRunArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let c = &args.child;
    let sem = client
        .semaphore_with(args.name.get(), args.permits, LeaseOptions::new().ttl(c.ttl))
        .map_err(lock_err)?;
    let n = args.count;
    let taker = Taker {
        name: args.name.get(),
        taking: Taking::Lock,
        wait: &c.wait,
        signals: &mut signals,
        global,
    };
    let permit = taker
        .take(
            || sem.try_acquire_many(n),
            |t| sem.acquire_many_timeout(n, t),
            || sem.acquire_many(n),
        )
        .await?;
    let permits = vec![("REDLEASE_PERMITS", n.to_string())];
    supervise(c, Box::new(permit), Taking::Lock, permits, &mut signals).await
}

/// `redlease rwlock run NAME --read|--write -- CMD`.
pub async fn rwlock(global: &Global, args: RwlockRunArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let c = &args.child;
    let lock = client
        .rwlock_with(args.name.get(), LeaseOptions::new().ttl(c.ttl))
        .map_err(lock_err)?;
    let taker = Taker {
        name: args.name.get(),
        taking: Taking::Lock,
        wait: &c.wait,
        signals: &mut signals,
        global,
    };
    let guard: Box<dyn Guard> = if args.write {
        Box::new(
            taker
                .take(|| lock.try_write(), |t| lock.write_timeout(t), || lock.write())
                .await?,
        )
    } else {
        Box::new(
            taker
                .take(|| lock.try_read(), |t| lock.read_timeout(t), || lock.read())
                .await?,
        )
    };
    supervise(c, guard, Taking::Lock, Vec::new(), &mut signals).await
}

/// `redlease elect NAME [--value V] -- CMD`: CMD runs while this candidate leads; the
/// term is its fencing token.
pub async fn elect(global: &Global, args: ElectArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let c = &args.child;
    let election = client
        .election_with(args.name.get(), LeaseOptions::new().ttl(c.ttl))
        .map_err(lock_err)?;
    let taker = Taker {
        name: args.name.get(),
        taking: Taking::Leadership,
        wait: &c.wait,
        signals: &mut signals,
        global,
    };
    let value = args.value.as_str();
    let leadership = taker
        .take(
            || election.try_campaign(value),
            |t| election.campaign_timeout(value, t),
            || election.campaign(value),
        )
        .await?;
    let term = vec![("REDLEASE_TERM", leadership.term().to_string())];
    supervise(c, Box::new(leadership), Taking::Leadership, term, &mut signals).await
}

/// Runs CMD while `guard` holds the lock, whatever its kind: passes signals on, reacts
/// to a lost lease, releases when CMD has exited, and turns the outcome into redlease's
/// exit status. CMD's environment has the lock's name, key and fencing token (when the
/// kind has one), and `extra`.
async fn supervise(
    args: &ChildArgs,
    guard: Box<dyn Guard>,
    taking: Taking,
    extra: Vec<(&'static str, String)>,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    let extra = extra.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    supervise_with(args, guard, taking, extra, signals).await
}

/// [`supervise`], with variables of CMD's environment whose names are made at run time
/// (those of each name of a lock over several).
async fn supervise_with(
    args: &ChildArgs,
    guard: Box<dyn Guard>,
    taking: Taking,
    extra: Vec<(String, String)>,
    signals: &mut Signals,
) -> Result<ExitCode, Failure> {
    // The guard is consumed by its release, and the name is needed after.
    let name = guard.name().to_owned();
    let name = name.as_str();
    let Some((program, rest)) = args.command.split_first() else {
        // clap requires CMD; this is only for safety.
        let _ = guard.release().await;
        return Err(Failure::new(exit::USAGE, "no CMD after `--`"));
    };
    let mut command = Command::new(program);
    // The per-name variables of a lock over several names, inherited from an outer
    // `redlease run`, would not describe this lock.
    for (var, _) in std::env::vars_os() {
        if is_per_name_variable(&var) {
            command.env_remove(var);
        }
    }
    die_with_redlease(&mut command, args.lost_signal);
    let spawned = command
        .args(rest)
        .env("REDLEASE_NAME", name)
        .env("REDLEASE_KEY", guard.key())
        // Kinds without a fencing token must not pass on one inherited from outside.
        .env_remove("REDLEASE_FENCE")
        .env_remove("REDLEASE_PERMITS")
        .env_remove("REDLEASE_TERM")
        .envs(guard.fence().map(|fence| ("REDLEASE_FENCE", fence.to_string())))
        .envs(extra)
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
                if args.lost_signal == nix::sys::signal::Signal::SIGKILL {
                    note(format_args!(
                        "lost {} while CMD ran ({reason}); sending SIGKILL to CMD",
                        taking.what(name),
                    ));
                } else {
                    note(format_args!(
                        "lost {} while CMD ran ({reason}); sending {} to CMD, SIGKILL in {}",
                        taking.what(name),
                        args.lost_signal,
                        human(args.grace),
                    ));
                    kill_at = after(Instant::now(), args.grace);
                }
                send(&child, args.lost_signal);
            }
            () = until(kill_at), if kill_at.is_some() => {
                note(format_args!("CMD did not exit within --grace {}; sending SIGKILL", human(args.grace)));
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
        return Err(lease_lost(name, taking, reason, status));
    }
    match guard.release().await {
        Ok(()) => Ok(ExitCode::from(cmd_status)),
        Err(e) if e.is_not_held() => Err(lease_lost(name, taking, LostReason::Gone, status)),
        Err(e) => {
            // CMD ran under the lock; only giving it back failed. It frees itself
            // after --ttl, so CMD's status is still the honest answer.
            note(format_args!(
                "warning: could not give up {} ({e}); it frees itself within {}",
                taking.what(name),
                human(args.ttl)
            ));
            Ok(ExitCode::from(cmd_status))
        }
    }
}

/// Makes CMD get `signal` when redlease dies — SIGKILL, the OOM killer, a crash — so
/// that it does not go on running after the lease it ran under has lapsed (Linux: a
/// parent-death signal, set in the child between fork and exec).
///
/// The kernel sends it when the *thread* that forked CMD ends. redlease runs on a
/// current-thread runtime, and `tokio::process::Command::spawn` forks on the calling
/// thread — the main thread, which lives as long as redlease does. If redlease died
/// before the child set the signal, the child's parent is no longer redlease: the
/// child then refuses to run CMD at all.
#[cfg(target_os = "linux")]
fn die_with_redlease(command: &mut Command, signal: Signal) {
    let parent = std::process::id() as libc::pid_t;
    let signal = signal as libc::c_ulong;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: CMD outlives a redlease that is killed
/// (the README says so).
#[cfg(not(target_os = "linux"))]
fn die_with_redlease(_command: &mut Command, _signal: Signal) {}

/// Whether `var` is `REDLEASE_NAME_<i>`, `REDLEASE_KEY_<i>` or `REDLEASE_FENCE_<i>`.
fn is_per_name_variable(var: &std::ffi::OsStr) -> bool {
    let Some(var) = var.to_str() else {
        return false;
    };
    ["REDLEASE_NAME_", "REDLEASE_KEY_", "REDLEASE_FENCE_"]
        .iter()
        .any(|prefix| {
            var.strip_prefix(prefix)
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
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

fn lease_lost(name: &str, taking: Taking, reason: LostReason, status: ExitStatus) -> Failure {
    let (lost, hint) = match taking {
        Taking::Lock => (
            format!("the lease on lock {name:?}"),
            "another holder may have overlapped with CMD; pass REDLEASE_FENCE to the resource so it can refuse stale writes, and consider a longer --ttl",
        ),
        Taking::Leadership => (
            format!("the leadership of election {name:?}"),
            "another candidate may have led alongside CMD; pass REDLEASE_TERM to the resources CMD changes so they can refuse a former leader, and consider a longer --ttl",
        ),
    };
    Failure::new(
        exit::LEASE_LOST,
        format!(
            "{lost} was lost while CMD ran ({reason}); CMD {}",
            describe(status)
        ),
    )
    .hint(hint)
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
