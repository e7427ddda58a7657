//! `acquire`, `release`, `extend` and `status`: managing a lock by hand, across
//! processes, with the token as the proof of ownership.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use redlease::{LeaseOptions, Mutex, MutexGuard};
use serde_json::json;

use crate::cli::{AcquireArgs, ExtendArgs, ReleaseArgs, StatusArgs, WaitArgs, signal_status};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{Global, connect};

/// Takes the lock as `wait` says; a signal to redlease cancels the wait.
///
/// Returns `Err(status)` when a signal interrupted the wait: the attempt's token is then
/// compare-and-deleted in the background (see `finish_background_work`), so nothing is
/// left behind.
pub async fn acquire_lock(
    mutex: &Mutex,
    wait: &WaitArgs,
    signals: &mut Signals,
    global: &Global,
) -> Result<MutexGuard, Failure> {
    let attempt = async {
        match (wait.no_wait, wait.wait) {
            (true, _) => mutex.try_lock().await,
            (false, Some(limit)) => mutex.lock_timeout(limit).await,
            (false, None) => mutex.lock().await,
        }
    };
    tokio::select! {
        result = attempt => result.map_err(|e| not_acquired(e, mutex, wait, global)),
        received = signals.recv() => Err(Failure::new(
            signal_status(received.signal as i32),
            format!("interrupted by {} while waiting for lock {:?}; nothing was left behind", received.signal, mutex.name()),
        )),
    }
}

fn not_acquired(err: redlease::Error, mutex: &Mutex, wait: &WaitArgs, global: &Global) -> Failure {
    match &err {
        redlease::Error::Contended { remaining, .. } => {
            let left = remaining.map_or(String::new(), |r| format!("; its lease ends in {}", human(r)));
            Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} is held by another owner{left}; not acquired {}",
                    mutex.name(),
                    wait.describe()
                ),
            )
            .hint("wait for it with --wait DUR, or leave out --no-wait to wait as long as it takes")
        }
        redlease::Error::Timeout { .. } => Failure::new(
            exit::NOT_ACQUIRED,
            format!("lock {:?} was not acquired {}", mutex.name(), wait.describe()),
        )
        .hint("wait longer with --wait DUR, or leave --wait out to wait as long as it takes"),
        _ => Failure::from_lock(err, &global.shown_url),
    }
}

pub async fn acquire(global: &Global, args: AcquireArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client
        .mutex_with(&args.name, LeaseOptions::new().ttl(args.ttl).auto_renew(false))
        .map_err(lock_err)?;
    let guard = acquire_lock(&mutex, &args.wait, &mut signals, global).await?;
    let fence = guard.fence().get();
    let ttl_ms = args.ttl.as_millis() as u64;
    let token = guard.forget();
    let text = if args.json {
        json!({
            "name": args.name,
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
    let mutex = client.mutex(&args.name).map_err(lock_err)?;
    mutex.release_token(&args.token).await.map_err(lock_err)?;
    Ok(ExitCode::SUCCESS)
}

pub async fn extend(global: &Global, args: ExtendArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client.mutex(&args.name).map_err(lock_err)?;
    mutex
        .extend_token(&args.token, args.ttl)
        .await
        .map_err(lock_err)?;
    Ok(ExitCode::SUCCESS)
}

pub async fn status(global: &Global, args: StatusArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let mutex = client.mutex(&args.name).map_err(lock_err)?;
    let status = mutex.status().await.map_err(lock_err)?;
    let millis = |d: Duration| d.as_millis() as u64;
    let since_ms = status
        .since
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(millis);
    let text = if args.json {
        json!({
            "name": args.name,
            "key": mutex.key(),
            "held": status.held,
            "owner": status.owner,
            "ttl_ms": status.remaining.map(millis),
            "fence": status.fence.map(|f| f.get()),
            "last_fence": status.last_fence.map(|f| f.get()),
            "since_ms": since_ms,
            "waiters": status.waiters,
        })
        .to_string()
    } else {
        let mut lines = vec![format!("lock:       {:?} (key {:?})", args.name, mutex.key())];
        if status.held {
            let owner = status
                .owner
                .as_deref()
                .unwrap_or("unknown (not a redlease client)");
            let ttl = status
                .remaining
                .map_or("no expiry".to_owned(), |d| format!("{} left", human(d)));
            lines.push("held:       yes".into());
            lines.push(format!("owner:      {owner}"));
            lines.push(format!("lease:      {ttl}"));
            if let Some(fence) = status.fence {
                lines.push(format!("fence:      {fence}"));
            }
            if let Some(since) = status.since {
                lines.push(format!(
                    "since:      {} (Redis time)",
                    humantime::format_rfc3339_millis(since)
                ));
            }
        } else {
            lines.push("held:       no".into());
        }
        if let Some(last) = status.last_fence {
            lines.push(format!("last fence: {last}"));
        }
        lines.push(format!("waiters:    {}", status.waiters));
        lines.join("\n")
    };
    emit(&(text + "\n")).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to stdout, reporting a closed pipe instead of panicking.
fn emit(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// A duration for people: `1.5s`, `250ms`, `2m 30s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}
