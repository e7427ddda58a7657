//! The one error type of the crate.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Everything that can go wrong with a lock, a lease or the connection under it.
///
/// Messages are lower-case and name the lock they are about. Use the `is_*` helpers
/// rather than matching when you only need to know the broad kind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `try_lock` found the lock held by someone else.
    #[error("lock {} is held by another owner", Shown(.name))]
    Contended {
        /// The lock's name.
        name: String,
        /// The holder's remaining lease, when Redis reported one.
        remaining: Option<Duration>,
    },

    /// A waiting acquire reached its deadline without getting the lock.
    #[error("gave up waiting for lock {} after {waited:?}", Shown(.name))]
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },

    /// A release or extend found that the token no longer holds the lock: the lease
    /// expired, was released, or was taken over. Nothing was changed.
    #[error("lock {} is not held by this owner (the lease expired, was released or was taken over)", Shown(.name))]
    NotHeld {
        /// The lock's name.
        name: String,
    },

    /// The lock name (with the prefix) cannot be used as a Redis key.
    #[error("invalid lock name {}: {reason}", Shown(.name))]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A lease length is zero, too short to be useful, or absurdly long.
    #[error("invalid ttl {ttl:?} for lock {}: {reason}", Shown(.name))]
    InvalidTtl {
        /// The lock's name.
        name: String,
        /// The rejected TTL.
        ttl: Duration,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// Some other argument is out of range.
    #[error("invalid {what} for lock {}: {reason}", Shown(.name))]
    InvalidArgument {
        /// The lock's name.
        name: String,
        /// Which argument.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// Permits of the semaphore are held under a different limit than this handle's.
    /// Nothing was changed. The limit can change only while no permit is held.
    #[error("semaphore {} is in use with a limit of {existing} permits, not {limit}", Shown(.name))]
    LimitMismatch {
        /// The semaphore's name.
        name: String,
        /// This handle's limit.
        limit: u32,
        /// The limit the current holders use.
        existing: u32,
    },

    /// A key of the lock holds a value of another type: something else uses that key.
    #[error("key {} of lock {} holds a value of the wrong type; is another program using it?", Shown(.key), Shown(.name))]
    WrongType {
        /// The lock's name.
        name: String,
        /// The key Redis complained about (or the lock key when unknown).
        key: String,
    },

    /// Fewer replicas than the lock's [`ReplicaAck`](crate::ReplicaAck) policy requires
    /// acknowledged an acquire or extend in time, and the policy said to release: the
    /// lock was released (or will expire) and must not be relied on.
    #[error(
        "lock {} was acknowledged by {acked} of the {wanted} replicas required in time; it was released", Shown(.name)
    )]
    NotReplicated {
        /// The lock's name.
        name: String,
        /// How many replicas acknowledged.
        acked: u32,
        /// How many the policy requires.
        wanted: u32,
    },

    /// The server refused a write because it is a read-only replica.
    #[error("redis refused to write lock {}: the server is a read-only replica", Shown(.name))]
    ReadOnly {
        /// The lock's name.
        name: String,
    },

    /// Any other failure talking to Redis: unreachable, timed out, refused, or an error reply.
    #[error("redis failed during {op} of lock {}: {source}", Shown(.name))]
    Redis {
        /// The lock's name.
        name: String,
        /// The operation: "acquire", "release", "extend", "status", ...
        op: &'static str,
        /// What redis-rs reported.
        #[source]
        source: RedisError,
    },

    /// An optimistic transaction found a watched key changed on every attempt, up to
    /// its attempt bound or deadline. Nothing of it was written.
    #[error(
        "optimistic transaction on {keys:?} gave up after {attempts} attempts in {elapsed:?}: the watched keys kept changing"
    )]
    TooMuchContention {
        /// The watched keys.
        keys: Vec<String>,
        /// How many times the transaction ran (each ended in a null `EXEC`).
        attempts: u32,
        /// Time from the first attempt until giving up.
        elapsed: Duration,
    },

    /// Redis refused a command of an optimistic transaction while queueing it — wrong
    /// number of arguments, unknown command, out of memory — and aborted `EXEC`
    /// (`EXECABORT`). Nothing of the transaction was written.
    #[error(
        "redis refused command {index} ({}) of the transaction on {keys:?}, so nothing was written: {}",
        Escaped(.command), Escaped(.message)
    )]
    TransactionRejected {
        /// The watched keys.
        keys: Vec<String>,
        /// Position of the first refused command in the returned pipeline (from 0).
        index: usize,
        /// Its name, such as `SET`.
        command: String,
        /// Redis's error message.
        message: String,
    },

    /// An optimistic transaction ran, but some of its commands failed when `EXEC` ran
    /// them — `INCR` on a list, say. Redis does not roll back: every other command of the
    /// transaction took effect.
    #[error(
        "{} of {} commands of the transaction on {keys:?} failed when it ran, and the others took effect (redis does not roll back){}",
        .failed.len(), .replies.len(), first_failure(.failed)
    )]
    TransactionPartlyFailed {
        /// The watched keys.
        keys: Vec<String>,
        /// Position (from 0) and error message of each failed command; never empty.
        failed: Vec<(usize, String)>,
        /// Every reply of `EXEC`, one per queued command; failed ones are
        /// [`Value::ServerError`](redis::Value::ServerError).
        replies: Vec<redis::Value>,
    },

    /// A [`Redlock`](crate::Redlock) operation could not reach a majority of its
    /// masters: too many were down, too slow, or refused the request. After an
    /// acquire nothing is held (whatever was taken was released again); after an
    /// extend the lease is unchanged.
    #[error(
        "lock {} needs {quorum} of {nodes} redis masters for its {op}, but only {reachable} answered in time{}", Shown(.name),
        source.as_ref().map(|e| format!(" (first failure: {e})")).unwrap_or_default()
    )]
    NoQuorum {
        /// The lock's name.
        name: String,
        /// The operation: "acquire" or "extend".
        op: &'static str,
        /// How many masters the Redlock has.
        nodes: usize,
        /// How many must agree: a majority.
        quorum: usize,
        /// How many answered in time (an error reply counts as no answer).
        reachable: usize,
        /// The first failure, when one was reported.
        source: Option<RedisError>,
    },

    /// A TLS connection failed over a certificate — the server's or the client's — not
    /// because the server is down: fix the certificate, not the address.
    #[error("cannot set up redlease: TLS with redis at {addr} failed: {problem}")]
    Certificate {
        /// The server's address.
        addr: String,
        /// What is wrong.
        problem: CertificateProblem,
        /// What the TLS library reported.
        #[source]
        source: RedisError,
    },

    /// The Redis server is older than a command redlease needs: renewing any lease
    /// uses `PEXPIRE … GT` (Redis 7.0), Cluster wake-ups sharded pub/sub (7.0). Found
    /// when the client is built (it probes the server), or when a command fails with
    /// the error an older server gives.
    #[error(
        "{} is too old for redlease: it needs Redis {needs} or newer ({feature})",
        .version.as_deref().map_or_else(|| "this Redis server".to_owned(), |v| format!("redis {v}"))
    )]
    UnsupportedServer {
        /// The server's `redis_version`, when it could be read.
        version: Option<String>,
        /// The oldest Redis version that works.
        needs: &'static str,
        /// What needs it.
        feature: &'static str,
    },

    /// The client could not be set up.
    #[error("cannot set up redlease: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
        /// The underlying error, if any.
        #[source]
        source: Option<RedisError>,
    },
}

/// What is wrong with a certificate (see [`Error::Certificate`]).
///
/// A certificate that works is an X.509 **v3** certificate — `openssl x509 -req`
/// makes v1 certificates unless given extensions with `-extfile` — naming the server
/// in its `subjectAltName`, signed by the CA the client trusts. See
/// [`TlsOptions`](crate::TlsOptions) for commands that make one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateProblem {
    /// The client certificate is an X.509 v1 certificate (made without extensions);
    /// only v3 certificates are accepted.
    ClientCertificateNotV3,
    /// The client certificate or key could not be used (not matching, not a supported
    /// key type, not a certificate).
    ClientCertificateUnusable,
    /// The server's certificate is an X.509 v1 certificate; only v3 certificates are
    /// accepted.
    ServerCertificateNotV3,
    /// The server's certificate is not signed by a CA the client trusts.
    UnknownIssuer,
    /// The server's certificate does not name the host or address connected to.
    WrongName,
    /// The server's certificate has expired or is not valid yet.
    Expired,
    /// The server refused the client's certificate, or requires one
    /// (`tls-auth-clients yes`) and none was given.
    ClientCertificateRefused,
    /// Another certificate failure; the error's source says which.
    Other,
}

impl std::fmt::Display for CertificateProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CertificateProblem::ClientCertificateNotV3 => {
                "the client certificate is an X.509 v1 certificate; only v3 certificates are accepted \
                 (sign it with v3 extensions: openssl x509 -req ... -extfile v3.ext)"
            }
            CertificateProblem::ClientCertificateUnusable => {
                "the client certificate or its key cannot be used (do they belong together, and is the key \
                 an RSA, ECDSA or Ed25519 key in PEM?)"
            }
            CertificateProblem::ServerCertificateNotV3 => {
                "the server's certificate is an X.509 v1 certificate; only v3 certificates are accepted \
                 (sign it with v3 extensions, including subjectAltName: openssl x509 -req ... -extfile v3.ext)"
            }
            CertificateProblem::UnknownIssuer => {
                "the server's certificate is not signed by a CA this client trusts (give the CA certificate that signed it)"
            }
            CertificateProblem::WrongName => {
                "the server's certificate does not name the host or address connected to (its subjectAltName must)"
            }
            CertificateProblem::Expired => "the server's certificate has expired or is not valid yet",
            CertificateProblem::ClientCertificateRefused => {
                "the server refused the client certificate, or requires one and none was given"
            }
            CertificateProblem::Other => "a certificate was refused",
        })
    }
}

impl Error {
    /// A TLS certificate was refused (see [`Error::Certificate`]).
    pub fn is_certificate_problem(&self) -> bool {
        matches!(self, Error::Certificate { .. })
    }

    /// The lock was held by someone else (`try_lock`).
    pub fn is_contended(&self) -> bool {
        matches!(self, Error::Contended { .. })
    }

    /// A waiting acquire gave up at its deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// An optimistic transaction gave up because its watched keys kept changing.
    pub fn is_too_much_contention(&self) -> bool {
        matches!(self, Error::TooMuchContention { .. })
    }

    /// The token no longer holds the lock.
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// Too few replicas acknowledged the lock in time (see [`Error::NotReplicated`]).
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, Error::NotReplicated { .. })
    }

    /// Bad input: a name, TTL or other argument was rejected before anything was sent.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidName { .. } | Error::InvalidTtl { .. } | Error::InvalidArgument { .. }
        )
    }

    /// Redis could not be reached, did not answer in time, or was busy (loading, failing
    /// over, running another client's long script) for longer than the retry window (for
    /// a Redlock: a majority of its masters); retrying later may work.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Redis { source, .. } => is_transient(source),
            Error::Config {
                source: Some(source), ..
            } => is_transient(source),
            Error::NoQuorum { .. } => true,
            _ => false,
        }
    }

    /// The lock's name, when the error is about one lock.
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            Error::Contended { name, .. }
            | Error::Timeout { name, .. }
            | Error::NotHeld { name }
            | Error::InvalidName { name, .. }
            | Error::InvalidTtl { name, .. }
            | Error::InvalidArgument { name, .. }
            | Error::LimitMismatch { name, .. }
            | Error::WrongType { name, .. }
            | Error::NotReplicated { name, .. }
            | Error::ReadOnly { name }
            | Error::Redis { name, .. }
            | Error::NoQuorum { name, .. } => Some(name),
            Error::Config { .. }
            | Error::Certificate { .. }
            | Error::UnsupportedServer { .. }
            | Error::TooMuchContention { .. }
            | Error::TransactionRejected { .. }
            | Error::TransactionPartlyFailed { .. } => None,
        }
    }

    /// Maps a redis-rs error of operation `op` on lock `name` to the matching variant.
    pub(crate) fn from_redis(name: &str, key: &str, op: &'static str, source: RedisError) -> Self {
        let detail = source.to_string();
        if let Some((needs, feature)) = too_old_for(&detail) {
            return Error::UnsupportedServer {
                version: None,
                needs,
                feature,
            };
        }
        if source.code() == Some("WRONGTYPE") || detail.contains("WRONGTYPE") {
            return Error::WrongType {
                name: name.to_owned(),
                key: key.to_owned(),
            };
        }
        if source.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            || source.code() == Some("READONLY")
            || detail.contains("READONLY")
        {
            return Error::ReadOnly {
                name: name.to_owned(),
            };
        }
        Error::Redis {
            name: name.to_owned(),
            op,
            source,
        }
    }
}

/// The Redis version and the feature an error reply says the server lacks: what a
/// server older than 7.0 answers to the commands redlease needs from 7.0 on.
pub(crate) fn too_old_for(detail: &str) -> Option<(&'static str, &'static str)> {
    let lower = detail.to_ascii_lowercase();
    if lower.contains("wrong number of arguments for 'pexpire'") {
        return Some(("7.0", "PEXPIRE … GT, which renews every lease"));
    }
    if lower.contains("unknown command")
        && ["spublish", "ssubscribe", "shardnumsub"]
            .iter()
            .any(|c| lower.contains(c))
    {
        return Some(("7.0", "sharded pub/sub, which wakes waiters on a cluster"));
    }
    if lower.contains("unknown command") && lower.contains("zmscore") {
        return Some(("6.2", "ZMSCORE"));
    }
    None
}

/// `"; first: command <i>: <message>"`, or nothing when the list is empty.
fn first_failure(failed: &[(usize, String)]) -> String {
    failed
        .first()
        .map(|(i, message)| format!("; first: command {i}: {}", Escaped(message)))
        .unwrap_or_default()
}

/// Whether a failed request may have been sent and may succeed if tried again: the
/// connection broke, the reply timed out, or the server is busy loading, failing over
/// or running another client's long script.
pub(crate) fn is_transient(err: &RedisError) -> bool {
    is_busy(err)
        || err.is_timeout()
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            )
        )
}

/// Whether the server refused the request (or a command of the pipeline) because it is
/// running a script past `busy-reply-threshold` (`BUSY`): it was not run, and the server
/// answers again once the script ends or is killed.
fn is_busy(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Extension | ErrorKind::Server(_))
        && err
            .clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "BUSY"))
}

/// A Redis URL as messages and logs may show it: the password replaced by `***`
/// (`redis://app:s3cret@host:6379/0` → `redis://app:***@host:6379/0`), also one given
/// as a `pass` or `password` query parameter (`redis+unix:///r.sock?pass=s3cret`).
/// Everything up to the last `@` counts as the user part, so a password with an
/// unencoded `/`, `?` or `#` is hidden too (a URL with an `@` elsewhere may lose more
/// than its password, never show it). URLs without a password come back unchanged.
///
/// ```
/// assert_eq!(redlease::redact_url("redis://:s3cret@host/0"), "redis://:***@host/0");
/// assert_eq!(redlease::redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let rest = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{user}:***{}", &rest[at..])
        }
        None => rest.to_owned(),
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{scheme}://{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("pass") || k.eq_ignore_ascii_case("password") => {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}://{path}?{}", query.join("&"))
}

/// The error of a URL redis-rs could not read, showing the URL without its password.
pub(crate) fn invalid_url(url: &str, source: RedisError) -> Error {
    Error::Config {
        reason: format!("invalid redis url {}", Shown(&redact_url(url))),
        source: Some(source),
    }
}

/// How a name or key appears in a message: quoted, control characters escaped (a name
/// with `\r` or an ANSI escape must not rewrite the reader's terminal), and cut after
/// [`SHOWN_CHARS`] characters with its length in bytes (`"xxx…"(10240 bytes)`), so a
/// rejected 10 KB name does not fill the screen.
pub(crate) struct Shown<'a>(pub &'a str);

/// How many characters of a name a message shows.
pub(crate) const SHOWN_CHARS: usize = 64;

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        f.write_char('"')?;
        for (i, c) in self.0.chars().enumerate() {
            if i == SHOWN_CHARS {
                return write!(f, "…\"({} bytes)", self.0.len());
            }
            match c {
                '"' | '\\' => write!(f, "\\{c}")?,
                c => write_escaped(f, c)?,
            }
        }
        f.write_char('"')
    }
}

/// Text from elsewhere — Redis's error messages, command names a caller queued — as a
/// message shows it: whole, unquoted, with the characters [`Shown`] escapes escaped.
pub(crate) struct Escaped<'a>(pub &'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.chars().try_for_each(|c| write_escaped(f, c))
    }
}

fn write_escaped(f: &mut std::fmt::Formatter<'_>, c: char) -> std::fmt::Result {
    use std::fmt::Write;
    if needs_escape(c) {
        write!(f, "{}", c.escape_default())
    } else {
        f.write_char(c)
    }
}

/// Characters redlease's messages never show as they are — control characters, line
/// and paragraph separators, and the invisible marks that reorder or hide what a
/// terminal displays (bidirectional marks, embeddings, overrides and isolates,
/// zero-width characters, the byte order mark) — but escaped (`\u{1b}`). For tools
/// that print names or values the way redlease does.
///
/// ```
/// assert!(redlease::needs_escape('\x1b') && redlease::needs_escape('\u{202e}'));
/// assert!(!redlease::needs_escape('é'));
/// ```
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
        )
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact_url("redis://:s3cret@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(redact_url("rediss://app:p@ss@host/1"), "rediss://app:***@host/1");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock"), "redis+unix:///tmp/r.sock");
        assert_eq!(redact_url("redis://u:pw@host?db=1"), "redis://u:***@host?db=1");
        assert_eq!(redact_url("not a url"), "not a url");
        // Unencoded '#', '?' or '/' in the password.
        for url in [
            "redis://:se#cret@127.0.0.1:6379",
            "redis://app:pa?ss@h/0",
            "redis://:a/b@h",
        ] {
            let shown = redact_url(url);
            assert!(
                !shown.contains("cret") && !shown.contains("ss@") && !shown.contains("a/b"),
                "{shown}"
            );
            assert!(shown.contains(":***@"), "{shown}");
        }
        assert_eq!(
            redact_url("redis+unix:///tmp/r.sock?db=1&pass=topsecret&user=u"),
            "redis+unix:///tmp/r.sock?db=1&pass=***&user=u"
        );
        assert_eq!(redact_url("redis://h/0?password=x"), "redis://h/0?password=***");
        let err = invalid_url(
            "redis://user:hunter2@127.0.0.1:notaport",
            RedisError::from((ErrorKind::InvalidClientConfig, "bad")),
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn an_old_servers_errors_name_the_version_needed() {
        let pexpire = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "wrong number of arguments for 'pexpire' command".to_owned(),
        ));
        let err = Error::from_redis("x", "redlease:x", "extend", pexpire);
        assert!(
            matches!(
                err,
                Error::UnsupportedServer {
                    version: None,
                    needs: "7.0",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "this Redis server is too old for redlease: it needs Redis 7.0 or newer (PEXPIRE … GT, which renews every lease)"
        );
        assert!(too_old_for("ERR unknown command `SPUBLISH`, with args beginning with").is_some());
        assert!(too_old_for("ERR syntax error").is_none());
        let known = Error::UnsupportedServer {
            version: Some("6.2.14".into()),
            needs: "7.0",
            feature: "PEXPIRE … GT",
        };
        assert!(
            known
                .to_string()
                .starts_with("redis 6.2.14 is too old for redlease")
        );
    }

    #[test]
    fn names_in_messages_are_escaped_and_shortened() {
        assert_eq!(Shown("deploy").to_string(), r#""deploy""#);
        assert_eq!(Shown("ü-ñ-名前").to_string(), r#""ü-ñ-名前""#);
        assert_eq!(Shown("a\rb\x1b[31mc\n").to_string(), r#""a\rb\u{1b}[31mc\n""#);
        assert_eq!(Shown("q\"b\\").to_string(), r#""q\"b\\""#);
        let long = "x".repeat(10 * 1024);
        let shown = Shown(&long).to_string();
        assert_eq!(shown, format!("\"{}…\"(10240 bytes)", "x".repeat(64)));
        assert_eq!(
            Shown(&"y".repeat(64)).to_string().len(),
            66,
            "64 characters are shown whole"
        );
        let err = Error::InvalidName {
            name: format!("\x1b[31m{long}"),
            reason: "the name contains control characters",
        };
        let text = err.to_string();
        assert!(!text.contains('\x1b') && text.len() < 200, "{text}");
        assert!(text.contains("(10245 bytes)"), "{text}");
    }

    #[test]
    fn invisible_and_line_breaking_characters_are_escaped() {
        for c in [
            '\u{2028}', '\u{2029}', '\u{200e}', '\u{200f}', '\u{061c}', '\u{202e}', '\u{2066}', '\u{200b}',
            '\u{feff}',
        ] {
            let name = format!("a{c}b");
            let shown = Shown(&name).to_string();
            assert!(!shown.contains(c), "{c:?} shown raw: {shown}");
            assert_eq!(shown, format!("\"a{}b\"", c.escape_default()));
        }
    }

    #[test]
    fn redis_messages_in_transaction_errors_are_escaped_whole() {
        let long = format!("ERR unknown command 'SE\x1b[31mT' {}", "z".repeat(100));
        let err = Error::TransactionRejected {
            keys: vec!["k".into()],
            index: 0,
            command: "SE\x1b[31mT".into(),
            message: long.clone(),
        };
        let text = err.to_string();
        assert!(!text.contains('\x1b'), "{text}");
        assert!(
            text.contains(r"(SE\u{1b}[31mT)") && text.ends_with(&"z".repeat(100)),
            "{text}"
        );
        let err = Error::TransactionPartlyFailed {
            keys: vec!["k".into()],
            failed: vec![(1, "ERR bad \u{202e} thing\r\n".into())],
            replies: vec![],
        };
        let text = err.to_string();
        assert!(
            text.ends_with(r"first: command 1: ERR bad \u{202e} thing\r\n"),
            "{text}"
        );
    }
}
