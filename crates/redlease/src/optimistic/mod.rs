//! Optimistic concurrency without a lock: `WATCH` / `MULTI` / `EXEC` transactions with
//! bounded retry, and a server-side compare-and-set.
//!
//! # Transactions
//!
//! [`transaction`] (or [`Transaction`] for the settings) runs the optimistic-locking pattern of Redis transactions:
//!
//! 1. `WATCH` the keys;
//! 2. your closure reads through the [`Tx`] it is given and returns the commands to
//!    write, as a [`redis::Pipeline`];
//! 3. `MULTI`, the commands, `EXEC` — in one round trip.
//!
//! If a watched key changed between `WATCH` and `EXEC`, Redis runs nothing and answers
//! `EXEC` with nil; the closure then runs again on fresh values, after a jittered,
//! exponentially growing pause, until it commits, the attempt bound or the deadline is
//! reached ([`Error::TooMuchContention`]), or it fails.
//!
//! Two kinds of failure are told apart, because they leave different things behind:
//!
//! - [`Error::TransactionRejected`]: Redis refused a command while *queueing* it (wrong
//!   number of arguments, unknown command, out of memory) and aborted the whole
//!   transaction (`EXECABORT`). **Nothing** was written.
//! - [`Error::TransactionPartlyFailed`]: the commands were queued and ran, but some
//!   failed *when they ran* (`INCR` on a list, say). Redis does not roll back: **every
//!   other command took effect**.
//!
//! ## Why a connection of its own
//!
//! `WATCH` belongs to a connection, not to a task: on a connection shared by many tasks
//! (a `MultiplexedConnection`, a `ConnectionManager`, the connection of a
//! [`Client`](crate::Client)) another task's `EXEC`, `UNWATCH` or `MULTI` would cancel
//! or capture your `WATCH`, and their commands would land inside your `MULTI`. A
//! transaction therefore holds a connection nobody else uses from `WATCH` to `EXEC`:
//!
//! - from a [`ConnectionPool`]: connections opened from a `redis::Client` for this
//!   purpose only, handed to one transaction at a time, and kept for the next one when
//!   the transaction left them clean ([`Transaction::new`], [`transaction`]); or
//! - one you supply and promise not to use elsewhere while the transaction runs, such
//!   as a `MultiplexedConnection` you opened for it or a connection checked out of your
//!   own pool ([`Transaction::on_connection`]).
//!
//! # Compare-and-set
//!
//! [`compare_and_set`] changes one key only if it still holds the value you read — one
//! script, one round trip, on any connection (shared ones included: a script is atomic
//! without `WATCH`). On a mismatch it returns the current value, so a retry loop needs
//! no extra read.
//!
//! # Which one, and when a lock is better
//!
//! Sixteen tasks increment counters by read-modify-write, 16,000 increments per row;
//! median of five runs (range in brackets) against a local Redis 7.0, release build,
//! on a 2-core machine shared with other builds (load average 10–12, so absolute
//! figures are low and noisy; the ratios held in every run):
//!
//! ```text
//! cargo build --release -p redlease-testkit -p redlease --examples --bins
//! OPS=1000 target/release/with-redis target/release/examples/optimistic_bench
//! ```
//!
//! | 16 tasks on…   | method                         | increments/s             | wasted tries/s |
//! |----------------|--------------------------------|--------------------------|---------------:|
//! | one hot key    | `WATCH`/`MULTI`/`EXEC`          |  4,950 (2,650–5,750)     | 1,265 retries  |
//! | one hot key    | [`compare_and_set`], no pause   |  2,550 (2,050–4,650)     | 35,500 mismatches |
//! | one hot key    | [`compare_and_set`] + backoff   | 11,000 (7,900–22,200)    | 290 mismatches |
//! | one hot key    | [`Mutex`](crate::Mutex) + `GET`/`SET` |  2,900 (2,200–5,750) | —          |
//! | a key each     | `WATCH`/`MULTI`/`EXEC`          | 10,500 (8,200–21,900)    | 0              |
//! | a key each     | [`compare_and_set`]             | 53,400 (46,000–117,000)  | 0              |
//! | a key each     | [`Mutex`](crate::Mutex) + `GET`/`SET` |  5,300 (4,000–10,400) | —          |
//!
//! ("+ backoff" pauses after a mismatch exactly as a transaction pauses after a
//! conflict: a random fraction of 1 ms, doubling per conflict, capped at 50 ms.)
//!
//! - **One key whose new value follows from its old one: compare-and-set**, with a
//!   jittered pause after each mismatch. One round trip per try instead of a
//!   transaction's three (`WATCH`, the read, `MULTI`…`EXEC`), so it is about five
//!   times as fast without contention and twice as fast on a hot key. Without the
//!   pause it collapses on a hot key: every loser comes straight back, and fourteen
//!   tries are wasted per success.
//! - **Several keys, or reads that decide what to write: a transaction.** The only one
//!   of the three that makes a multi-key read-then-write atomic without a lock. It is
//!   cheap while conflicts are rare — and most updates touch different
//!   keys — and its backoff keeps it at about one retry per four commits on a hot key.
//! - **A lock when the work between read and write is long, expensive, has effects
//!   outside Redis, or must not be repeated.** On a hot key it is about as fast as
//!   the optimistic methods (waiters are woken, not retried), but it costs four round
//!   trips per update even without contention, so it is the slowest when keys are
//!   spread out.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, Value};
use tokio::time::Instant;

use crate::error::{Error, Result, is_transient};
use crate::transport::CommandConnection;

mod cas;
mod pool;

pub use cas::{CasOutcome, compare_and_set};
use pool::Held;
pub use pool::{ConnectionPool, PoolOptions};

/// Default bound on the attempts of one transaction.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 50;
/// Default first pause after a conflict; it doubles with every conflict, up to
/// [`DEFAULT_BACKOFF_MAX`], and each pause is a random fraction of it ("full jitter").
pub const DEFAULT_BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Default longest pause between attempts.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// Where a transaction gets its exclusive connection.
#[derive(Clone)]
enum Source {
    Pool(ConnectionPool),
    Caller(Arc<dyn CommandConnection>),
}

/// An optimistic transaction: the keys it watches, where its connection comes from and
/// how hard it tries. Run it with [`run`](Transaction::run).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redlease::optimistic::{ConnectionPool, Transaction};
///
/// # async fn demo() -> Result<(), redlease::Error> {
/// let pool = ConnectionPool::open("redis://127.0.0.1:6379")?;
/// // Move 10 from one balance to another, if there is enough.
/// let done = Transaction::new(&pool, &["balance:a", "balance:b"])
///     .max_attempts(20)
///     .timeout(Duration::from_secs(2))
///     .run(|tx| async move {
///         let a: i64 = tx.get::<Option<i64>>("balance:a").await?.unwrap_or(0);
///         let mut writes = redis::pipe();
///         if a >= 10 {
///             writes.decr("balance:a", 10).incr("balance:b", 10);
///         }
///         // An empty pipeline still checks that nothing changed since the read.
///         Ok(writes)
///     })
///     .await?;
/// println!("committed after {} attempts", done.attempts);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a transaction does nothing until `run` is awaited"]
pub struct Transaction {
    source: Source,
    keys: Arc<[String]>,
    max_attempts: u32,
    timeout: Option<Duration>,
    backoff_first: Duration,
    backoff_max: Duration,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("keys", &self.keys)
            .field("max_attempts", &self.max_attempts)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What a committed transaction returns.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Committed {
    /// The reply of each queued command, in order (`.ignore()` on the pipeline is not
    /// honoured: every command has its reply here).
    pub replies: Vec<Value>,
    /// How many attempts it took (1: no conflict). `attempts - 1` retries.
    pub attempts: u32,
}

/// Runs an optimistic transaction on `keys` with the default settings; see
/// [`Transaction::run`].
///
/// # Examples
///
/// ```no_run
/// use redlease::optimistic::{transaction, ConnectionPool};
///
/// # async fn demo() -> Result<(), redlease::Error> {
/// let pool = ConnectionPool::open("redis://127.0.0.1:6379")?;
/// transaction(&pool, &["counter"], |tx| async move {
///     let n: Option<i64> = tx.get("counter").await?;
///     let mut writes = redis::pipe();
///     writes.set("counter", n.unwrap_or(0) + 1);
///     Ok(writes)
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`Transaction::run`].
pub async fn transaction<K, F, Fut>(pool: &ConnectionPool, keys: &[K], f: F) -> Result<Committed>
where
    K: AsRef<str>,
    F: FnMut(Tx) -> Fut,
    Fut: Future<Output = Result<Pipeline>>,
{
    Transaction::new(pool, keys).run(f).await
}

impl Transaction {
    /// A transaction watching `keys`, on a connection of `pool`.
    pub fn new<K: AsRef<str>>(pool: &ConnectionPool, keys: &[K]) -> Self {
        Self::with_source(Source::Pool(pool.clone()), keys)
    }

    /// A transaction watching `keys`, on a connection you supply.
    ///
    /// The connection must not be used by anything else until `run` returns — not by
    /// other tasks, not by a redlease [`Client`](crate::Client) — since `WATCH` and
    /// `MULTI` are state of the connection, not of a task. A `MultiplexedConnection`
    /// you opened for this, or one checked out of your own pool, will do; a
    /// `ConnectionManager` or connection shared with other tasks will not.
    ///
    /// Each attempt starts with `UNWATCH`, so a watch left behind by an earlier,
    /// cancelled transaction on the connection does no harm.
    pub fn on_connection<C, K>(conn: C, keys: &[K]) -> Self
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
        K: AsRef<str>,
    {
        Self::with_source(Source::Caller(Arc::new(conn)), keys)
    }

    fn with_source<K: AsRef<str>>(source: Source, keys: &[K]) -> Self {
        Transaction {
            source,
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout: None,
            backoff_first: DEFAULT_BACKOFF_FIRST,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }

    /// Gives up with [`Error::TooMuchContention`] after `n` attempts (at least 1;
    /// default [`DEFAULT_MAX_ATTEMPTS`]).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Gives up with [`Error::TooMuchContention`] when a new attempt could not start
    /// within `timeout` of the first one (default: no deadline, only the attempt bound).
    /// The deadline also bounds the wait for a pooled connection.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the pause after a conflict: a random fraction of `first × 2^(conflicts−1)`,
    /// capped at `max` (defaults [`DEFAULT_BACKOFF_FIRST`], [`DEFAULT_BACKOFF_MAX`]).
    /// Zero `first` retries at once.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff_first = first;
        self.backoff_max = max.max(first);
        self
    }

    /// The watched keys.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Runs the transaction: `WATCH` the keys, call `f` to read through the given
    /// [`Tx`] and build the writes, then `MULTI`, the writes, `EXEC` in one round trip;
    /// retry from `WATCH` when a watched key changed in between.
    ///
    /// `f` may run several times — once per attempt — so it must not have side effects
    /// outside Redis that cannot be repeated. Commands sent through the `Tx` run at
    /// once, outside the transaction: use them to read. The returned pipeline's commands
    /// are the transaction; return an empty pipeline to only check that what you read
    /// was a consistent snapshot.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before `EXEC` was sent writes nothing. Dropped after, the
    /// transaction may or may not have been applied, entirely or not at all. A pooled
    /// connection is closed rather than reused after a cancelled run; a supplied one
    /// may still carry a `WATCH` (harmless to the next transaction, which starts with
    /// `UNWATCH`).
    ///
    /// # Errors
    ///
    /// - [`Error::TooMuchContention`] after [`max_attempts`](Self::max_attempts)
    ///   conflicts, or when the [`timeout`](Self::timeout) passes; nothing was written.
    /// - [`Error::TransactionRejected`]: Redis refused a command while queueing it
    ///   (`EXECABORT`); nothing was written.
    /// - [`Error::TransactionPartlyFailed`]: some commands failed when they ran; the
    ///   others took effect.
    /// - Whatever `f` returns as an error (the transaction is abandoned with `UNWATCH`),
    ///   and [`Error::InvalidArgument`] when `f` sends transaction-control commands
    ///   through the `Tx`, or when the transaction watches no key (nothing is sent).
    /// - [`Error::Redis`] when Redis cannot be reached. If that happens while `EXEC` is
    ///   on its way, the transaction may or may not have been applied; it is not
    ///   retried.
    pub async fn run<F, Fut>(self, mut f: F) -> Result<Committed>
    where
        F: FnMut(Tx) -> Fut,
        Fut: Future<Output = Result<Pipeline>>,
    {
        if self.keys.is_empty() {
            return Err(Error::InvalidArgument {
                name: String::new(),
                what: "keys",
                reason: "an optimistic transaction watches at least one key".into(),
            });
        }
        let started = Instant::now();
        // A timeout too long to add to the clock is no deadline at all.
        let deadline = self.timeout.and_then(|t| started.checked_add(t));
        let label: Arc<str> = self.keys.join(" ").into();
        let mut held = self.checkout(deadline, &label, started).await?;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            held = self.watch(held, &label).await?;
            let live = Arc::new(AtomicBool::new(true));
            let tx = Tx {
                conn: held.conn.clone(),
                live: live.clone(),
                keys: self.keys.clone(),
                label: label.clone(),
                attempt,
            };
            let writes = f(tx).await;
            live.store(false, Ordering::Release);
            let writes = match writes {
                Ok(writes) => writes,
                Err(e) => {
                    let unwatched = held.conn.send(&redis::cmd("UNWATCH")).await;
                    held.clean = unwatched.is_ok();
                    return Err(e);
                }
            };
            match self.commit(&mut held, &label, &writes).await? {
                Some(replies) => {
                    tracing::debug!(keys = %label, attempt, "transaction committed");
                    return Ok(Committed {
                        replies,
                        attempts: attempt,
                    });
                }
                None => {
                    tracing::debug!(keys = %label, attempt, "watched key changed; retrying");
                    let pause = self.pause(attempt);
                    let next = Instant::now() + pause;
                    if attempt >= self.max_attempts || deadline.is_some_and(|d| next >= d) {
                        return Err(self.contention(attempt, started));
                    }
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }

    /// Gets an exclusive connection, waiting for a pool slot until `deadline`.
    async fn checkout(&self, deadline: Option<Instant>, label: &str, started: Instant) -> Result<Held> {
        let pool = match &self.source {
            Source::Caller(conn) => {
                return Ok(Held {
                    conn: conn.clone(),
                    pooled: None,
                    reused: false,
                    clean: false,
                });
            }
            Source::Pool(pool) => pool,
        };
        let permit = pool.inner.permits.clone().acquire_owned();
        let permit = match deadline {
            None => permit.await,
            Some(d) => match tokio::time::timeout_at(d, permit).await {
                Ok(p) => p,
                Err(_) => return Err(self.contention(0, started)),
            },
        }
        .expect("the pool never closes its semaphore");
        let (conn, reused) = match pool.pop_idle() {
            Some(conn) => (conn, true),
            None => (
                pool.connect()
                    .await
                    .map_err(|e| self.redis_error(label, "transaction connect", e))?,
                false,
            ),
        };
        Ok(Held {
            conn: Arc::new(conn.clone()),
            pooled: Some((pool.clone(), conn, permit)),
            reused,
            clean: false,
        })
    }

    /// Sends `WATCH` (after `UNWATCH` on a supplied connection). A pooled connection
    /// that turns out dead is replaced once.
    async fn watch(&self, mut held: Held, label: &str) -> Result<Held> {
        let mut watch = redis::cmd("WATCH");
        for key in self.keys.iter() {
            watch.arg(key.as_str());
        }
        held.clean = false;
        let result = if held.pooled.is_some() {
            held.conn.send(&watch).await.map(drop)
        } else {
            let mut pipe = redis::pipe();
            pipe.cmd("UNWATCH").add_command(watch.clone());
            held.conn.send_pipeline(&pipe).await.map(drop)
        };
        match result {
            Ok(()) => Ok(held),
            Err(e) if held.reused && is_transient(&e) => {
                tracing::debug!(keys = %label, error = %e, "pooled connection is dead; opening another");
                let Some((pool, _, permit)) = held.pooled.take() else {
                    unreachable!("reused connections come from the pool")
                };
                let conn = pool
                    .connect()
                    .await
                    .map_err(|e| self.redis_error(label, "transaction connect", e))?;
                let fresh = Held {
                    conn: Arc::new(conn.clone()),
                    pooled: Some((pool, conn, permit)),
                    reused: false,
                    clean: false,
                };
                fresh
                    .conn
                    .send(&watch)
                    .await
                    .map_err(|e| self.redis_error(label, "watch", e))?;
                Ok(fresh)
            }
            Err(e) => Err(self.redis_error(label, "watch", e)),
        }
    }

    /// Sends `MULTI`, the writes and `EXEC` in one round trip. `Ok(None)`: a watched
    /// key changed (null `EXEC`).
    async fn commit(&self, held: &mut Held, label: &str, writes: &Pipeline) -> Result<Option<Vec<Value>>> {
        let queued: Vec<&Cmd> = writes.cmd_iter().collect();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("MULTI");
        for cmd in &queued {
            pipe.add_command((*cmd).clone());
        }
        pipe.cmd("EXEC");
        let mut results = held
            .conn
            .send_pipeline(&pipe)
            .await
            .map_err(|e| self.redis_error(label, "exec", e))?;
        if results.len() != queued.len() + 2 {
            return Err(self.redis_error(label, "exec", bad_reply("reply count mismatch")));
        }
        let exec = results.pop().expect("length checked");
        if let Err(e) = &results[0] {
            // MULTI itself was refused (the connection was already inside one).
            return Err(self.redis_error(label, "multi", e.clone()));
        }
        // After EXEC (even a refused or null one) the connection has no WATCH left and
        // is out of MULTI.
        held.clean = true;
        // Queue-time errors: a command answered with an error instead of QUEUED.
        if let Some((index, err)) = results[1..]
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.as_ref().err().map(|e| (i, e)))
        {
            return Err(Error::TransactionRejected {
                keys: self.keys.to_vec(),
                index,
                command: command_name(queued[index]),
                message: err.to_string(),
            });
        }
        match exec {
            Ok(Value::Nil) => Ok(None),
            Ok(Value::Array(replies)) => {
                let failed: Vec<(usize, String)> = replies
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| match v {
                        Value::ServerError(e) => Some((i, e.to_string())),
                        _ => None,
                    })
                    .collect();
                if failed.is_empty() {
                    Ok(Some(replies))
                } else {
                    Err(Error::TransactionPartlyFailed {
                        keys: self.keys.to_vec(),
                        failed,
                        replies,
                    })
                }
            }
            Ok(_) => Err(self.redis_error(label, "exec", bad_reply("EXEC replied neither nil nor an array"))),
            Err(e) => Err(self.redis_error(label, "exec", e)),
        }
    }

    /// The pause before attempt `attempt + 1`: full jitter over an exponential cap.
    fn pause(&self, attempt: u32) -> Duration {
        if self.backoff_first.is_zero() {
            return Duration::ZERO;
        }
        let cap = self
            .backoff_first
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.backoff_max);
        let micros = u64::try_from(cap.as_micros()).unwrap_or(u64::MAX).max(1);
        Duration::from_micros(getrandom::u64().unwrap_or(0) % micros.saturating_add(1))
    }

    fn contention(&self, attempts: u32, started: Instant) -> Error {
        Error::TooMuchContention {
            keys: self.keys.to_vec(),
            attempts,
            elapsed: started.elapsed(),
        }
    }

    fn redis_error(&self, label: &str, op: &'static str, e: RedisError) -> Error {
        let key = self.keys.first().map_or("", String::as_str);
        Error::from_redis(label, key, op, e)
    }
}

fn bad_reply(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, what))
}

/// The command's name (its first argument), upper-cased.
fn command_name(cmd: &Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_ascii_uppercase(),
        _ => String::from("?"),
    }
}

/// Commands that would break the transaction if sent through a [`Tx`].
const CONTROL: [&str; 5] = ["WATCH", "UNWATCH", "MULTI", "EXEC", "DISCARD"];

/// The watched connection, handed to a transaction's closure for its reads.
///
/// Commands sent through it run at once, on the transaction's exclusive connection,
/// after `WATCH`: the `val = GET mykey` of the classic `WATCH`/`MULTI`/`EXEC` example. They are not part of
/// the transaction — return writes in the pipeline instead. A `Tx` is valid for one
/// attempt only; using it (or a clone) afterwards fails.
#[derive(Clone)]
pub struct Tx {
    conn: Arc<dyn CommandConnection>,
    live: Arc<AtomicBool>,
    keys: Arc<[String]>,
    label: Arc<str>,
    attempt: u32,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx")
            .field("keys", &self.keys)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Tx {
    /// Which attempt this is, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The watched keys.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Sends `cmd` now and converts its reply.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the attempt this `Tx` belongs to is over, or
    /// `cmd` is `WATCH`, `UNWATCH`, `MULTI`, `EXEC` or `DISCARD`; [`Error::WrongType`]
    /// and [`Error::Redis`] for Redis errors and replies that do not convert to `T`.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let invalid = |reason: &str| Error::InvalidArgument {
            name: self.label.to_string(),
            what: "transaction read",
            reason: reason.to_owned(),
        };
        if !self.live.load(Ordering::Acquire) {
            return Err(invalid("the transaction attempt this handle belongs to is over"));
        }
        let name = command_name(cmd);
        if CONTROL.contains(&name.as_str()) {
            return Err(invalid(&format!(
                "{name} would break the transaction; return writes in the pipeline instead"
            )));
        }
        let key = self.keys.first().map_or("", String::as_str);
        let value = self
            .conn
            .send(cmd)
            .await
            .map_err(|e| Error::from_redis(&self.label, key, "transaction read", e))?;
        redis::from_redis_value(value)
            .map_err(|e| Error::from_redis(&self.label, key, "transaction read", e.into()))
    }

    /// `GET key`, converted.
    ///
    /// # Errors
    ///
    /// As [`query`](Tx::query).
    pub async fn get<T: FromRedisValue>(&self, key: &str) -> Result<T> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        self.query(&cmd).await
    }
}
