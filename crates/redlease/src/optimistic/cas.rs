//! Compare-and-set: a single-key optimistic update done by one script on the server.

use redis::RedisError;

use crate::error::{Error, Result};
use crate::script::CAS;
use crate::script::eval;
use crate::script::reply::{array, int, opt_string};
use crate::transport::CommandConnection;

/// What [`compare_and_set`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a compare-and-set may not have changed anything"]
pub enum CasOutcome {
    /// The key held the expected value and now holds the new one (or was deleted).
    Swapped,
    /// The key held something else and was left alone.
    Mismatch {
        /// What it holds (`None`: it does not exist).
        current: Option<String>,
    },
}

impl CasOutcome {
    /// Whether the key was changed.
    pub fn swapped(&self) -> bool {
        matches!(self, CasOutcome::Swapped)
    }
}

/// Sets `key` to `new` if it holds `expected`, atomically, on the server.
///
/// `expected: None` requires the key to be absent; `new: None` deletes it. The key's
/// TTL is kept. One script call (`EVALSHA`), so it is safe on a connection shared by
/// many tasks: no `WATCH`, no exclusive connection.
///
/// In a retry loop, pause after a mismatch (a random fraction of a delay that doubles
/// per mismatch): on a hot key, losers that retry at once waste most of Redis's time
/// on tries that fail — see the measurements in the [module docs](crate::optimistic).
///
/// This compares values, so it cannot tell "unchanged" from "changed and changed back"
/// (ABA). When that matters, keep a version in the value (e.g. `"<version>:<data>"`)
/// and bump it on every write.
///
/// # Cancel safety
///
/// Dropping the future may or may not apply the change. The request is not retried:
/// a retry of a change that landed would see the new value and report a mismatch — if
/// you retry yourself, a [`Mismatch`](CasOutcome::Mismatch) whose `current` equals your
/// `new` may be your own earlier write.
///
/// # Errors
///
/// [`Error::WrongType`] when the key is not a string; [`Error::InvalidArgument`] when it
/// holds bytes that are not UTF-8 text (which this compares: a value read lossily could
/// never be matched); [`Error::Redis`] when Redis cannot be used.
///
/// # Examples
///
/// ```no_run
/// use redlease::optimistic::{compare_and_set, CasOutcome};
///
/// # async fn demo(conn: redis::aio::MultiplexedConnection) -> Result<(), redlease::Error> {
/// // Start from a guess; a mismatch tells us the real value without another read.
/// let mut seen: Option<String> = None;
/// loop {
///     let next = seen.as_deref().map_or(0, |v| v.parse::<i64>().unwrap_or(0)) + 1;
///     match compare_and_set(&conn, "counter", seen.as_deref(), Some(&next.to_string())).await? {
///         CasOutcome::Swapped => break,
///         // Under contention, pause here before trying again (see above).
///         CasOutcome::Mismatch { current } => seen = current,
///     }
/// }
/// # Ok(()) }
/// ```
pub async fn compare_and_set<C: CommandConnection>(
    conn: &C,
    key: &str,
    expected: Option<&str>,
    new: Option<&str>,
) -> Result<CasOutcome> {
    let args = [
        if expected.is_some() { "v" } else { "n" },
        expected.unwrap_or(""),
        if new.is_some() { "v" } else { "d" },
        new.unwrap_or(""),
    ];
    let cmd = CAS.evalsha(&[key], &args, None);
    let reply = eval(conn, &CAS, &cmd)
        .await
        .map_err(|e| Error::from_redis(key, key, "compare-and-set", e))?;
    if int(&reply) == Some(1) {
        return Ok(CasOutcome::Swapped);
    }
    match array(&reply) {
        Some([flag, current]) if int(flag) == Some(0) => match current {
            redis::Value::BulkString(bytes) => match String::from_utf8(bytes.clone()) {
                Ok(text) => Ok(CasOutcome::Mismatch { current: Some(text) }),
                Err(_) => Err(Error::InvalidArgument {
                    name: key.to_owned(),
                    what: "value",
                    reason: "the key holds bytes that are not UTF-8 text, which compare_and_set compares"
                        .into(),
                }),
            },
            other => Ok(CasOutcome::Mismatch {
                current: opt_string(other),
            }),
        },
        // Lua drops a trailing nil from an array: {0, nil} arrives as {0}.
        Some([flag]) if int(flag) == Some(0) => Ok(CasOutcome::Mismatch { current: None }),
        _ => Err(Error::from_redis(key, key, "compare-and-set", bad_reply())),
    }
}

fn bad_reply() -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply"))
}
