//! `acquire`, `release`, `extend` and `status`: managing a lock by hand, across
//! processes, with the token as the proof of ownership.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use redlease::LockKind;
use serde_json::json;

use crate::cli::{AcquireArgs, ExtendArgs, ReleaseArgs, RwlockStatusArgs, SemaphoreStatusArgs, StatusArgs};
use crate::connect::{Global, connect, lease_options};
use crate::exit::{self, Failure};
use crate::output::{self, emit, human, millis, unix_ms};
use crate::signals::Signals;
use crate::wait::{Taker, Taking};

pub async fn acquire(global: &Global, args: AcquireArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client
        .mutex_with(args.name.get(), lease_options(global, args.ttl).auto_renew(false))
        .map_err(lock_err)?;
    let taker = Taker {
        name: args.name.get(),
        taking: Taking::Lock,
        wait: &args.wait,
        signals: &mut signals,
        global,
    };
    let guard = taker
        .take(|| mutex.try_lock(), |t| mutex.lock_timeout(t), || mutex.lock())
        .await?;
    let fence = guard.fence().get();
    let ttl_ms = millis(args.ttl);
    let token = guard.forget();
    let text = if args.json {
        json!({
            "name": args.name.get(),
            "key": mutex.key(),
            "token": token.expose(),
            "fence": fence,
            "ttl_ms": ttl_ms,
            "owner": client.owner_label(),
        })
        .to_string()
            + "\n"
    } else {
        // Tokens are hex and the rest are numbers: safe for `eval`.
        format!(
            "REDLEASE_TOKEN={}\nREDLEASE_FENCE={fence}\nREDLEASE_TTL_MS={ttl_ms}\n",
            token.expose()
        )
    };
    if let Err(e) = emit(&text) {
        // Nobody learned the token: give the lock back rather than strand it for --ttl.
        let _ = mutex.release_token(&token).await;
        return Err(Failure::caused(exit::FAILED, e).hint("the lock was released again"));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn release(global: &Global, args: ReleaseArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client.mutex(args.name.get()).map_err(lock_err)?;
    mutex.release_token(&args.token).await.map_err(lock_err)?;
    Ok(ExitCode::SUCCESS)
}

pub async fn extend(global: &Global, args: ExtendArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client.mutex(args.name.get()).map_err(lock_err)?;
    mutex
        .extend_token(&args.token, args.ttl)
        .await
        .map_err(lock_err)?;
    Ok(ExitCode::SUCCESS)
}

pub async fn status(global: &Global, args: StatusArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let name = args.name.get();
    // Another kind of lock may use the name: a plain status cannot tell readers of a
    // read-write lock from nobody, nor read a semaphore's or an election's keys.
    // Best effort: the look needs `TYPE`, which a least-privilege ACL user may lack.
    let other_kind = async || {
        let info = client.lock_info(name).await.ok().flatten();
        info.map(|i| i.kind)
            .filter(|k| !matches!((k, args.fair), (LockKind::Mutex, _) | (LockKind::FairMutex, true)))
    };
    // A status that failed because another kind of lock's keys are there says so.
    let explain = async |e: redlease::Error| match &e {
        redlease::Error::WrongType { .. } => match other_kind().await {
            Some(kind) => Failure::new(
                exit::USAGE,
                format!(
                    "{} is held as {} {kind}, not as a {}",
                    output::shown(name),
                    if kind == LockKind::Election { "an" } else { "a" },
                    if args.fair { "fair mutex" } else { "plain lock" }
                ),
            )
            .hint(format!("see `redlease {}`", status_command(kind, name))),
            None => lock_err(e),
        },
        _ => lock_err(e),
    };
    let (key, st, queue) = if args.fair {
        let mutex = client.fair_mutex(name).map_err(lock_err)?;
        let st = match mutex.status().await {
            Ok(st) => st,
            Err(e) => return Err(explain(e).await),
        };
        let common = Common {
            held: st.held,
            owner: st.owner,
            remaining: st.remaining,
            fence: st.fence.map(|f| f.get()),
            last_fence: st.last_fence.map(|f| f.get()),
            since: st.since,
            waiters: st.queue_len,
        };
        (mutex.key().to_owned(), common, Some(st.queue))
    } else {
        let mutex = client.mutex(name).map_err(lock_err)?;
        let st = match mutex.status().await {
            Ok(st) => st,
            Err(e) => return Err(explain(e).await),
        };
        let common = Common {
            held: st.held,
            owner: st.owner,
            remaining: st.remaining,
            fence: st.fence.map(|f| f.get()),
            last_fence: st.last_fence.map(|f| f.get()),
            since: st.since,
            waiters: st.waiters,
        };
        (mutex.key().to_owned(), common, None)
    };
    let held_as = other_kind().await;
    let text = if args.json {
        let mut object = json!({
            "name": args.name.get(),
            "key": key,
            "held": st.held,
            "owner": st.owner,
            "ttl_ms": st.remaining.map(millis),
            "fence": st.fence,
            "last_fence": st.last_fence,
            "since_ms": st.since.and_then(unix_ms),
            "waiters": st.waiters,
        });
        if let Some(queue) = &queue {
            object["queue"] = json!(queue);
        }
        if let Some(kind) = held_as {
            object["held_as"] = json!(kind.as_str());
        }
        object.to_string()
    } else {
        let mut lines = vec![format!("lock:       {:?} (key {:?})", args.name.get(), key)];
        holder_lines(
            &mut lines,
            st.held,
            st.owner.as_deref(),
            st.remaining,
            st.fence,
            st.since,
        );
        if let Some(last) = st.last_fence {
            lines.push(format!("last fence: {last}"));
        }
        match &queue {
            Some(queue) => {
                lines.push(format!("queue:      {} waiting", st.waiters));
                for (i, label) in queue.iter().enumerate() {
                    lines.push(format!("  {:>3}. {label}", i + 1));
                }
            }
            None => lines.push(format!("waiters:    {}", st.waiters)),
        }
        if let Some(kind) = held_as {
            lines.push(format!(
                "held as:    {kind} (see `redlease {}`)",
                status_command(kind, name)
            ));
        }
        lines.join("\n")
    };
    emit(&(text + "\n")).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}

/// The command that shows a lock of `kind` named `name`.
fn status_command(kind: LockKind, name: &str) -> String {
    let glob_escaped = |n: &str| {
        n.chars()
            .flat_map(|c| {
                matches!(c, '*' | '?' | '[' | ']' | '\\')
                    .then_some('\\')
                    .into_iter()
                    .chain([c])
            })
            .collect::<String>()
    };
    if kind == LockKind::Legacy {
        return format!("list {}", output::shown(&glob_escaped(name)));
    }
    let name = output::shown(name);
    match kind {
        LockKind::RwLock => format!("rwlock status {name}"),
        LockKind::Semaphore => format!("semaphore status {name} --permits N"),
        LockKind::Election => format!("leader {name}"),
        LockKind::FairMutex => format!("status {name} --fair"),
        _ => format!("status {name}"),
    }
}

/// The holder's side of a mutex status, whichever kind.
struct Common {
    held: bool,
    owner: Option<String>,
    remaining: Option<Duration>,
    fence: Option<u64>,
    last_fence: Option<u64>,
    since: Option<SystemTime>,
    waiters: u64,
}

/// The `held:`, `owner:`, `lease:`, `fence:` and `since:` lines of a status.
fn holder_lines(
    lines: &mut Vec<String>,
    held: bool,
    owner: Option<&str>,
    remaining: Option<Duration>,
    fence: Option<u64>,
    since: Option<SystemTime>,
) {
    if !held {
        lines.push("held:       no".into());
        return;
    }
    let ttl = remaining.map_or("no expiry".to_owned(), |d| format!("{} left", human(d)));
    lines.push("held:       yes".into());
    lines.push(format!(
        "owner:      {}",
        owner.unwrap_or("unknown (not a redlease client)")
    ));
    lines.push(format!("lease:      {ttl}"));
    if let Some(fence) = fence {
        lines.push(format!("fence:      {fence}"));
    }
    if let Some(since) = since {
        lines.push(format!(
            "since:      {} (Redis time)",
            humantime::format_rfc3339_millis(since)
        ));
    }
}

/// `redlease rwlock status NAME`.
pub async fn rwlock_status(global: &Global, args: RwlockStatusArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let lock = client.rwlock(args.name.get()).map_err(lock_err)?;
    let st = lock.status().await.map_err(lock_err)?;
    let text = if args.json {
        json!({
            "name": args.name.get(),
            "key": lock.key(),
            "write_held": st.write_held,
            "writer": st.writer,
            "ttl_ms": st.remaining.map(millis),
            "fence": st.fence.map(|f| f.get()),
            "last_fence": st.last_fence.map(|f| f.get()),
            "since_ms": st.since.and_then(unix_ms),
            "readers": st.readers,
            "waiting_writers": st.waiting_writers,
        })
        .to_string()
    } else {
        let mut lines = vec![format!(
            "rwlock:     {:?} (key {:?})",
            args.name.get(),
            lock.key()
        )];
        lines.push(format!("readers:    {}", st.readers));
        let mut writer = Vec::new();
        holder_lines(
            &mut writer,
            st.write_held,
            st.writer.as_deref(),
            st.remaining,
            st.fence.map(|f| f.get()),
            st.since,
        );
        lines.extend(
            writer
                .into_iter()
                .map(|l| l.replacen("held:       ", "writer:     ", 1)),
        );
        if let Some(last) = st.last_fence {
            lines.push(format!("last fence: {last}"));
        }
        lines.push(format!("waiting writers: {}", st.waiting_writers));
        lines.join("\n")
    };
    emit(&(text + "\n")).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}

/// `redlease semaphore status NAME`.
pub async fn semaphore_status(global: &Global, args: SemaphoreStatusArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let sem = client
        .semaphore(args.name.get(), args.permits)
        .map_err(lock_err)?;
    let st = sem.status().await.map_err(lock_err)?;
    let text = if args.json {
        json!({
            "name": args.name.get(),
            "key": sem.key(),
            "limit": st.limit,
            "in_use": st.in_use,
            "available": st.available,
            "next_lapse_ms": st.next_lapse.map(millis),
            "waiters": st.waiters,
        })
        .to_string()
    } else {
        let mut lines = vec![format!("semaphore:  {:?} (key {:?})", args.name.get(), sem.key())];
        lines.push(format!(
            "permits:    {} of {} in use, {} free",
            st.in_use, st.limit, st.available
        ));
        if let Some(lapse) = st.next_lapse {
            lines.push(format!("next lapse: in {} unless renewed", human(lapse)));
        }
        lines.push(format!("waiters:    {}", st.waiters));
        lines.join("\n")
    };
    emit(&(text + "\n")).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}
