//! Exit statuses, and the error a command fails with.
//!
//! Scripts depend on these numbers; `--help` and the README list them.

use std::error::Error;
use std::fmt;

/// Generic failure; also `demo` finding a lost update.
pub const FAILED: u8 = 1;
/// `release` / `extend`: the token does not hold the lock.
pub const NOT_HELD: u8 = 1;
/// Usage error (clap uses 2 as well).
pub const USAGE: u8 = 2;
/// Redis unreachable or answering with an error (sysexits `EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// `man --dir`: the pages could not be written (sysexits `EX_CANTCREAT`).
pub const CANNOT_WRITE: u8 = 73;
/// The lock was not acquired within `--wait` (sysexits `EX_TEMPFAIL`: try again later).
pub const NOT_ACQUIRED: u8 = 75;
/// `run`: the lease was lost while CMD ran. Outside the sysexits range (64–78) so it
/// cannot be read as one of those, and below 126 so it cannot be read as a shell's.
pub const LEASE_LOST: u8 = 79;
/// `run`: CMD exists but could not be executed (as in shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// `run`: CMD was not found (as in shells).
pub const NOT_FOUND: u8 = 127;

/// Why a command failed: an exit status, the error with its causes, and perhaps a hint
/// naming the flag that fixes it.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    error: Box<dyn Error + Send + Sync + 'static>,
    hint: Option<String>,
}

impl Failure {
    /// A failure with a plain message.
    pub fn new(status: u8, message: impl Into<String>) -> Self {
        Failure {
            status,
            error: message.into().into(),
            hint: None,
        }
    }

    /// A failure caused by `error`.
    pub fn caused(status: u8, error: impl Error + Send + Sync + 'static) -> Self {
        Failure {
            status,
            error: Box::new(error),
            hint: None,
        }
    }

    /// Adds a hint, printed on its own line after the error.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn hint_text(&self) -> Option<&str> {
        self.hint.as_deref()
    }

    /// Maps a library error to its exit status and a hint naming the flag that fixes it.
    /// `redis` is the (redacted) address redlease talks to.
    pub fn from_lock(err: redlease::Error, redis: &str) -> Self {
        use redlease::Error as E;
        let (status, hint) = match &err {
            E::Contended { .. } | E::Timeout { .. } => (
                NOT_ACQUIRED,
                "wait longer with --wait DUR, or leave out --wait/--no-wait to wait as long as it takes".to_owned(),
            ),
            E::NotHeld { .. } => (
                NOT_HELD,
                "check --token; the lease may also have run out or been released (see `redlease status NAME`)"
                    .to_owned(),
            ),
            E::InvalidTtl { .. } => (USAGE, "pass another --ttl".to_owned()),
            E::InvalidName { .. } => (USAGE, "choose another NAME (or --prefix)".to_owned()),
            E::InvalidArgument {
                what: "replica timeout",
                ..
            } => (
                USAGE,
                "pass a --replica-timeout of at least 1ms, at most half the --ttl and shorter than --response-timeout"
                    .to_owned(),
            ),
            e if e.is_invalid_input() => (USAGE, "check the arguments (see --help)".to_owned()),
            // A set-up that cannot work: nothing was asked of Redis yet.
            E::Config { source: None, .. } => (USAGE, "check the options (see --help)".to_owned()),
            E::Config { reason, .. } if reason.starts_with("invalid ") && reason.contains(" url") => (
                USAGE,
                "check the URL: redis://[user:password@]host:port[/db], rediss:// for TLS".to_owned(),
            ),
            E::WrongType { .. } => (
                UNAVAILABLE,
                "another program uses that key; choose another NAME or --prefix".to_owned(),
            ),
            E::LimitMismatch { .. } => (
                USAGE,
                "every user of a semaphore must pass the same --permits; see `redlease semaphore status NAME`".to_owned(),
            ),
            E::NotReplicated { .. } => (
                UNAVAILABLE,
                "fewer replicas confirmed the lock than --wait-replicas asks (it was released); check INFO replication, or lower --wait-replicas / raise --replica-timeout".to_owned(),
            ),
            E::NoQuorum { .. } => (
                UNAVAILABLE,
                format!("a majority of the --redlock masters ({redis}) must answer; start the ones that are down"),
            ),
            E::Certificate { problem, .. } => (UNAVAILABLE, certificate_hint(*problem)),
            E::UnsupportedServer { needs, .. } => (
                UNAVAILABLE,
                format!(
                    "upgrade the server at {redis} to Redis {needs} or newer (Debian 12 and Ubuntu 24.04 ship 7.0; Valkey 7.2 and newer work too)"
                ),
            ),
            E::ReadOnly { .. } => (
                UNAVAILABLE,
                "the server is a read-only replica; point --redis at the primary".to_owned(),
            ),
            _ => (UNAVAILABLE, unavailable_hint(&err, redis)),
        };
        Failure::caused(status, err).hint(hint)
    }
}

/// What to do when Redis could not be used, by what went wrong underneath.
fn unavailable_hint(err: &redlease::Error, redis: &str) -> String {
    let mut source: Option<&(dyn Error + 'static)> = err.source();
    let mut cause = None;
    while let Some(e) = source {
        if let Some(redis_err) = e.downcast_ref::<redis::RedisError>() {
            cause = Some(redis_err);
            break;
        }
        source = e.source();
    }
    let text = cause
        .map(|e| e.to_string().to_ascii_lowercase())
        .unwrap_or_default();
    let kind = cause.map(redis::RedisError::kind);
    if kind == Some(redis::ErrorKind::AuthenticationFailed)
        || [
            "wrongpass",
            "noauth",
            "invalid username-password",
            "authentication required",
        ]
        .iter()
        .any(|t| text.contains(t))
    {
        return format!(
            "{redis} refused the credentials: check the user and password in --redis URL (or REDIS_URL)"
        );
    }
    if text.contains("noperm") || text.contains("no permissions") || text.contains("can't run this command") {
        return format!(
            "the Redis user of {redis} lacks a permission for this command: see the README's ACL section for the rules redlease needs"
        );
    }
    if text.contains("db index is out of range") || text.contains("invalid db index") {
        return format!("{redis} has no such database: check the number after the last '/' of --redis URL");
    }
    if text.contains("cluster support disabled") {
        return format!("{redis} is not a Redis Cluster: leave out --cluster");
    }
    if text.contains("parse error") || kind == Some(redis::ErrorKind::Parse) {
        return format!(
            "what answers at {redis} does not speak the Redis protocol: check the host and port of --redis URL"
        );
    }
    if cause.is_some_and(|e| e.is_timeout()) {
        return format!(
            "{redis} did not answer in time: is it overloaded or unreachable? A slow server may need a longer --response-timeout"
        );
    }
    format!("is Redis running at {redis}? Point --redis URL (or REDIS_URL) at your server")
}

/// How to fix a refused certificate: never "is Redis running?" — it is, it answered the
/// handshake.
fn certificate_hint(problem: redlease::CertificateProblem) -> String {
    use redlease::CertificateProblem as P;
    match problem {
        P::ClientCertificateNotV3 | P::ServerCertificateNotV3 => format!(
            "`openssl x509 -req` makes X.509 v1 certificates unless given v3 extensions; sign again with -extfile:\n  \
             printf '{V3_EXTENSIONS}' > v3.ext\n  \
             openssl x509 -req -in CERT.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile v3.ext -out CERT.crt"
        ),
        P::ClientCertificateUnusable => {
            "check that --tls-cert and --tls-key belong together and are PEM files (an RSA, ECDSA or Ed25519 key)".into()
        }
        P::UnknownIssuer => "pass the CA certificate that signed the server's certificate with --tls-ca FILE".into(),
        P::WrongName => {
            "use in --redis the host name or address the certificate's subjectAltName names, or reissue the certificate for the one you use".into()
        }
        P::Expired => "renew the server's certificate (and check the clocks of both machines)".into(),
        P::ClientCertificateRefused => {
            "pass a client certificate signed by the CA the server trusts (its tls-ca-cert-file) with --tls-cert FILE --tls-key FILE".into()
        }
        _ => "check the certificates: --tls-ca, --tls-cert and --tls-key".into(),
    }
}

/// The extensions of a certificate rustls accepts, for a server on `redis.example` or
/// 127.0.0.1 that also serves as a client certificate (as `printf` text).
const V3_EXTENSIONS: &str = "subjectAltName=DNS:redis.example,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nkeyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=serverAuth,clientAuth\\n";

/// `{}` prints the error; `{:#}` adds its causes, `a: b: c`, skipping a cause whose
/// text the message already contains (many errors repeat their source). On one line:
/// line breaks in a cause's text (redis-rs has some) become spaces, and any other
/// control character is escaped.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = one_line(&self.error.to_string());
        if f.alternate() {
            let mut cause = self.error.source();
            while let Some(c) = cause {
                let c_text = one_line(&c.to_string());
                if !text.contains(&c_text) {
                    text.push_str(": ");
                    text.push_str(&c_text);
                }
                cause = c.source();
            }
        }
        f.write_str(&text)
    }
}

/// `text` on one line: each run of line breaks (and the spaces around it) one space,
/// other control characters escaped.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text
        .split(['\n', '\r'])
        .filter(|l| !l.trim().is_empty())
        .enumerate()
    {
        if i > 0 {
            out.push(' ');
        }
        let line = if i > 0 { line.trim_start() } else { line };
        for c in line.trim_end().chars() {
            if redlease::needs_escape(c) {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "outer failed")
        }
    }
    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn messages_are_one_line_without_raw_control_characters() {
        assert_eq!(
            one_line("Parse error at 1\nUnexpected `33`\nUnexpected `60`\n"),
            "Parse error at 1 Unexpected `33` Unexpected `60`"
        );
        assert_eq!(one_line("a\r\n  b\x1b[2J\tc"), r"a b\u{1b}[2J\tc");
        assert_eq!(one_line("plain"), "plain");
        let f = Failure::caused(FAILED, Outer(std::io::Error::other("line 1\nline 2\n")));
        assert_eq!(format!("{f:#}"), "outer failed: line 1 line 2");
    }

    #[test]
    fn alternate_display_prints_the_cause_chain_once() {
        let f = Failure::caused(FAILED, Outer(std::io::Error::other("inner broke")));
        assert_eq!(format!("{f}"), "outer failed");
        assert_eq!(format!("{f:#}"), "outer failed: inner broke");
        let lock = redlease::Error::Config {
            reason: "cannot connect".into(),
            source: Some(redis::RedisError::from(std::io::Error::other("refused"))),
        };
        let f = Failure::from_lock(lock, "127.0.0.1:1");
        assert_eq!(f.status, UNAVAILABLE);
        assert_eq!(format!("{f:#}").matches("refused").count(), 1, "{f:#}");
        assert!(f.hint_text().unwrap().contains("--redis"));
    }

    #[test]
    fn lock_errors_map_to_documented_statuses() {
        let name = || "x".to_owned();
        let cases = [
            (
                redlease::Error::Contended {
                    name: name(),
                    remaining: None,
                },
                NOT_ACQUIRED,
            ),
            (
                redlease::Error::Timeout {
                    name: name(),
                    waited: std::time::Duration::from_secs(1),
                },
                NOT_ACQUIRED,
            ),
            (redlease::Error::NotHeld { name: name() }, NOT_HELD),
            (
                redlease::Error::InvalidName {
                    name: name(),
                    reason: "bad",
                },
                USAGE,
            ),
            (
                redlease::Error::WrongType {
                    name: name(),
                    key: name(),
                },
                UNAVAILABLE,
            ),
            (redlease::Error::ReadOnly { name: name() }, UNAVAILABLE),
        ];
        for (err, status) in cases {
            let text = err.to_string();
            assert_eq!(Failure::from_lock(err, "h:1").status, status, "{text}");
        }
    }
}
