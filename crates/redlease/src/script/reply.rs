//! Reading script replies: the value readers of the transport, and the shapes every
//! lock's scripts share (millisecond counts, fencing tokens).

use std::time::Duration;

pub(crate) use crate::transport::value::{array, int, opt_string, text};

use crate::error::Error;
use crate::token::FencingToken;

/// A non-negative millisecond count as a duration (`-1`, `-2`: none).
pub(crate) fn ms(v: Option<i64>) -> Option<Duration> {
    v.and_then(|x| u64::try_from(x).ok()).map(Duration::from_millis)
}

/// A fencing token stored as a decimal string or returned as an integer.
pub(crate) fn fence(v: &redis::Value) -> Option<FencingToken> {
    opt_string(v).and_then(|x| x.parse().ok()).map(FencingToken::new)
}

/// The error for a script reply of an unexpected shape.
pub(crate) fn bad_reply(name: &str, op: &'static str) -> Error {
    Error::Redis {
        name: name.to_owned(),
        op,
        source: redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply")),
    }
}

/// What the status scripts of the plain mutex, the fair mutex and the read-write lock
/// report about the holder of the lock key: their first six reply elements, `{held,
/// pttl, label, fence, since_ms, last_fence}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub held: bool,
    pub owner: Option<String>,
    pub remaining: Option<Duration>,
    pub fence: Option<FencingToken>,
    pub last_fence: Option<FencingToken>,
    pub since: Option<std::time::SystemTime>,
}

/// Reads a [`Holder`] out of the first six elements of a status reply.
pub(crate) fn holder(items: &[redis::Value]) -> Option<Holder> {
    let [held, pttl, label, fence_v, since, last, ..] = items else {
        return None;
    };
    Some(Holder {
        held: int(held) == Some(1),
        owner: opt_string(label),
        remaining: ms(int(pttl)),
        fence: fence(fence_v),
        last_fence: fence(last),
        since: opt_string(since)
            .and_then(|x| x.parse::<u64>().ok())
            .map(|ms| std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
    })
}
