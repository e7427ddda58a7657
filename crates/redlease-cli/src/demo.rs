//! `redlease demo`: workers take turns on one lock that guards a shared counter.
//!
//! Each worker has its own redlease client and Redis connection, as a separate process
//! would. Under the lock it reads the counter and the last fencing token from Redis,
//! then writes the counter + 1 and its own token: a read-modify-write that loses
//! updates the moment two workers overlap, and a fencing check that fails the moment
//! tokens go backwards. At the end the counter must equal the number of locked
//! increments.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redlease::LeaseOptions;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::cli::{DEFAULT_URL, DemoArgs, signal_status};
use crate::connect::{Global, connect};
use crate::exit::{self, Failure};
use crate::output::human;
use crate::signals::Signals;
use crate::throwaway::Throwaway;
use crate::wait::{after, until};

/// Prints a line, ignoring a closed stdout (`redlease demo | head`): the demo must still
/// stop its workers and its server.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// As `say!`, without the newline.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// The lease of the demo lock: short enough that a crashed worker would not stall the
/// others for long, far longer than a turn.
const DEMO_TTL: Duration = Duration::from_secs(10);
/// Longest a worker waits for one turn before the demo calls it stuck.
const TURN_LIMIT: Duration = Duration::from_secs(10);

/// What the workers measured, updated while holding the lock.
#[derive(Default)]
struct Stats {
    acquisitions: u64,
    handoffs: u64,
    last_worker: Option<usize>,
    /// Time from asking for the lock to holding it, per acquisition, in microseconds.
    waits_us: Vec<u64>,
    fences_out_of_order: u64,
    /// Releases that found the lease already gone (never expected here).
    leases_lost: u64,
}

struct Shared {
    stop: AtomicBool,
    stats: std::sync::Mutex<Stats>,
}

impl Shared {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub async fn demo(global: &Global, args: DemoArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let (server, url, shown_url) = choose_server(global).await?;
    let target = Global {
        urls: vec![url.clone()],
        url: url.clone(),
        shown_url: shown_url.clone(),
        url_given: true,
        prefix: global.prefix.clone(),
        response_timeout: global.response_timeout,
        response_timeout_given: global.response_timeout_given,
        topology: Default::default(),
    };
    let lock_name = format!("demo-{}", std::process::id());
    // The counter lives in the lock key's hash slot, under the same prefix.
    let counter_key = format!("{{{}{lock_name}}}:counter", global.prefix);

    let mut conn = redis_conn(&target).await?;
    let _: () = redis::cmd("DEL")
        .arg(&counter_key)
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_failure(e, &target))?;

    say!(
        "redlease demo: {} workers, one lock ({lock_name:?}), {}",
        args.workers,
        human(args.duration)
    );
    say!("  each turn: take the lock, read a shared counter from Redis, write it back + 1, release");
    match &server {
        Some(s) => say!(
            "  redis: a throwaway redis-server on {} (stopped at the end)",
            s.addr()
        ),
        None => say!(
            "  redis: {shown_url} (keys of lock {}{lock_name}: the counter is deleted at the end, \
             the lock's metadata expires on its own)",
            global.prefix
        ),
    }
    say!();

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        stats: Default::default(),
    });
    let mut workers = Vec::new();
    for id in 0..usize::from(args.workers) {
        let (target, shared) = (target.clone(), shared.clone());
        let (lock_name, counter_key) = (lock_name.clone(), counter_key.clone());
        workers.push(tokio::spawn(async move {
            let result = worker(id, &target, &lock_name, &counter_key, &shared).await;
            if result.is_err() {
                shared.stop.store(true, Ordering::SeqCst);
            }
            result
        }));
    }

    // Live progress until the time is up, a worker fails, or a signal arrives.
    let started = Instant::now();
    // Never ends (until a signal) if the end cannot be represented.
    let end = after(started, args.duration);
    let tty = std::io::stdout().is_terminal();
    let tick = if tty {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };
    let mut next_tick = started + tick;
    let mut last = (started, 0u64);
    let mut interrupted = None;
    while !shared.stop.load(Ordering::SeqCst) {
        tokio::select! {
            () = until(end) => break,
            () = sleep_until(next_tick) => {
                next_tick += tick;
                let now = Instant::now();
                let (line, acquisitions) = progress(&shared, now - started, now - last.0, last.1);
                last = (now, acquisitions);
                if tty {
                    say_raw!("\r\x1b[2K{line}");
                    let _ = std::io::stdout().flush();
                } else {
                    say!("{line}");
                }
            }
            received = signals.recv() => {
                interrupted = Some(received.signal);
                break;
            }
        }
    }
    if tty {
        say!();
    }
    shared.stop.store(true, Ordering::SeqCst);
    let elapsed = started.elapsed();
    let mut failure = None;
    for handle in workers {
        match handle.await {
            Ok(Ok(())) => {}
            Ok(Err(f)) => failure = failure.or(Some(f)),
            Err(e) => {
                failure = failure.or(Some(Failure::new(
                    exit::FAILED,
                    format!("a worker panicked: {e}"),
                )))
            }
        }
    }

    let counter: Option<u64> = redis::cmd("HGET")
        .arg(&counter_key)
        .arg("count")
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_failure(e, &target))?;
    let _: Result<(), _> = redis::cmd("DEL").arg(&counter_key).query_async(&mut conn).await;
    drop(conn);

    let verdict = summary(&shared, elapsed, counter.unwrap_or(0));
    if let Some(s) = server {
        let addr = s.addr();
        drop(s);
        say!("stopped the throwaway redis-server on {addr}");
    }
    if let Some(f) = failure {
        return Err(f);
    }
    verdict?;
    Ok(match interrupted {
        Some(signal) => ExitCode::from(signal_status(signal as i32)),
        None => ExitCode::SUCCESS,
    })
}

/// The Redis to use: the one `--redis`/`REDIS_URL` names; else whatever answers at the
/// default address; else a throwaway server started here.
async fn choose_server(global: &Global) -> Result<(Option<Throwaway>, String, String), Failure> {
    if global.url_given {
        return Ok((None, global.url.clone(), global.shown_url.clone()));
    }
    let addr: SocketAddr = ([127, 0, 0, 1], 6379).into();
    let answers = tokio::task::spawn_blocking(move || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    })
    .await
    .unwrap_or(false);
    if answers {
        return Ok((None, global.url.clone(), global.shown_url.clone()));
    }
    say!("nothing answers at {DEFAULT_URL}; starting a throwaway redis-server...");
    let server = tokio::task::spawn_blocking(Throwaway::start)
        .await
        .map_err(|e| Failure::new(exit::FAILED, format!("starting redis-server failed: {e}")))?
        .map_err(|e| {
            Failure::caused(exit::UNAVAILABLE, e)
                .hint("or point --redis URL (or REDIS_URL) at a running Redis")
        })?;
    let url = server.url();
    Ok((Some(server), url.clone(), url))
}

async fn redis_conn(g: &Global) -> Result<redis::aio::MultiplexedConnection, Failure> {
    let client = redis::Client::open(g.url.as_str()).map_err(|e| Failure::caused(exit::USAGE, e))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| redis_failure(e, g))
}

fn redis_failure(e: redis::RedisError, g: &Global) -> Failure {
    Failure::caused(exit::UNAVAILABLE, e).hint(format!(
        "the demo lost its connection to {}; point --redis URL at a running Redis",
        g.shown_url
    ))
}

/// One worker: its own client and connection, taking turns until told to stop.
async fn worker(
    id: usize,
    g: &Global,
    lock_name: &str,
    counter_key: &str,
    shared: &Shared,
) -> Result<(), Failure> {
    let lock_err = |e| Failure::from_lock(e, &g.shown_url);
    let client = connect(g).await?;
    let mutex = client
        .mutex_with(lock_name, LeaseOptions::new().ttl(DEMO_TTL))
        .map_err(lock_err)?;
    let mut conn = redis_conn(g).await?;
    while !shared.stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let guard = match timeout(TURN_LIMIT, mutex.lock()).await {
            Ok(guard) => guard.map_err(lock_err)?,
            Err(_) => {
                return Err(Failure::new(
                    exit::FAILED,
                    format!("worker {id} waited more than {} for one turn", human(TURN_LIMIT)),
                ));
            }
        };
        let waited = asked.elapsed();
        if shared.stop.load(Ordering::SeqCst) {
            guard.release().await.map_err(lock_err)?;
            break;
        }
        let fence = guard.fence().get();
        let (count, last_fence): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(counter_key)
            .arg("count")
            .arg("fence")
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_failure(e, g))?;
        let _: () = redis::cmd("HSET")
            .arg(counter_key)
            .arg("count")
            .arg(count.unwrap_or(0) + 1)
            .arg("fence")
            .arg(fence)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_failure(e, g))?;
        {
            let mut stats = shared.stats();
            stats.acquisitions += 1;
            if stats.last_worker.is_some_and(|w| w != id) {
                stats.handoffs += 1;
            }
            stats.last_worker = Some(id);
            stats.waits_us.push(waited.as_micros() as u64);
            if last_fence.is_some_and(|last| fence <= last) {
                stats.fences_out_of_order += 1;
            }
        }
        match guard.release().await {
            Ok(()) => {}
            Err(e) if e.is_not_held() => shared.stats().leases_lost += 1,
            Err(e) => return Err(lock_err(e)),
        }
        // A moment of work outside the lock, as real workers have: it lets a waiter in
        // instead of the releaser taking the lock straight back.
        sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// One progress line.
fn progress(
    shared: &Shared,
    elapsed: Duration,
    since_last: Duration,
    last_acquisitions: u64,
) -> (String, u64) {
    let stats = shared.stats();
    let rate = (stats.acquisitions - last_acquisitions) as f64 / since_last.as_secs_f64().max(1e-3);
    let mut waits = stats.waits_us.clone();
    waits.sort_unstable();
    let line = format!(
        "{:>5.1}s  acquisitions {:>7}  ({:>5.0}/s)  handoffs {:>7}  wait p50 {:>6}  p99 {:>6}",
        elapsed.as_secs_f64(),
        stats.acquisitions,
        rate,
        stats.handoffs,
        micros(percentile(&waits, 50.0)),
        micros(percentile(&waits, 99.0)),
    );
    (line, stats.acquisitions)
}

/// Prints the summary; fails if an update was lost or a fencing token went backwards.
fn summary(shared: &Shared, elapsed: Duration, counter: u64) -> Result<(), Failure> {
    let stats = shared.stats();
    let mut waits = stats.waits_us.clone();
    waits.sort_unstable();
    let secs = elapsed.as_secs_f64().max(1e-3);
    let lost = stats.acquisitions as i64 - counter as i64;
    say!();
    say!(
        "  acquisitions     {:>8}   ({:.0}/s)",
        stats.acquisitions,
        stats.acquisitions as f64 / secs
    );
    say!(
        "  handoffs         {:>8}   ({:.0}/s; the lock passed from one worker to another)",
        stats.handoffs,
        stats.handoffs as f64 / secs
    );
    say!(
        "  wait for lock    p50 {}   p99 {}   max {}   (not FIFO: an unlucky waiter can lose several rounds)",
        micros(percentile(&waits, 50.0)),
        micros(percentile(&waits, 99.0)),
        micros(waits.last().copied().unwrap_or(0)),
    );
    say!(
        "  lost updates     {:>8}   (counter {counter} after {} locked increments)",
        lost,
        stats.acquisitions
    );
    if stats.acquisitions == 0 {
        say!("  fencing tokens   none issued");
    } else if stats.fences_out_of_order == 0 {
        say!(
            "  fencing tokens   monotonic: each of {} was greater than the one before",
            stats.acquisitions
        );
    } else {
        say!(
            "  fencing tokens   NOT monotonic: {} of {} were not greater than the one before",
            stats.fences_out_of_order,
            stats.acquisitions
        );
    }
    if stats.leases_lost > 0 {
        say!("  leases lost      {:>8}", stats.leases_lost);
    }
    say!();
    if lost != 0 || stats.fences_out_of_order != 0 || stats.leases_lost != 0 {
        return Err(Failure::new(
            exit::FAILED,
            "mutual exclusion broke: see the summary above",
        ));
    }
    if stats.acquisitions == 0 {
        say!("nothing to check: no worker took the lock within --duration.");
    } else {
        say!("all good: no update lost, fencing tokens in order.");
    }
    Ok(())
}

/// The p-th percentile (nearest rank) of sorted values; 0 when empty.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(us: u64) -> String {
    if us < 10_000 {
        format!("{:.1}ms", us as f64 / 1000.0)
    } else {
        human(Duration::from_micros(us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
