//! Lock tokens (secret, random) and fencing tokens (public, rising).

use crate::error::needs_escape;
use std::fmt;
use std::sync::Arc;

/// The secret that proves ownership of one acquisition: 128 bits from the operating
/// system's CSPRNG, fresh for every acquisition, stored as the lock key's value.
///
/// Whoever knows the token can release or extend the lock, so it is redacted in
/// `Debug`, has no `Display`, and is never logged. Use [`expose`](Token::expose) to
/// hand it to another process deliberately (the CLI's `acquire` prints it).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// A fresh random token (32 lowercase hex digits).
    ///
    /// # Panics
    ///
    /// Never in practice: only if the operating system has no usable random source,
    /// in which case no secure token can exist.
    pub(crate) fn generate() -> Self {
        let mut hex = [0u8; 32];
        random_hex(&mut hex);
        Token(std::str::from_utf8(&hex).expect("hex digits").into())
    }

    /// A fresh random token that names its owner: `<32 hex digits>@<label>`, so that
    /// the lock key itself tells who holds it (`status`, `list`). Control characters
    /// and invisible marks in the label become `?`, and it is cut to 128 bytes.
    pub(crate) fn for_owner(label: &str) -> Self {
        // Built on the stack: the token costs one allocation, its shared string.
        let mut buf = [0u8; 33 + MAX_LABEL];
        random_hex((&mut buf[..32]).try_into().expect("32 bytes"));
        buf[32] = b'@';
        let mut len = 33;
        // Most labels (`host:pid`) are short and printable ASCII: copied as they are.
        let plain = label.len() <= MAX_LABEL && label.bytes().all(|b| (0x20..0x7f).contains(&b));
        let chars = if plain {
            buf[len..len + label.len()].copy_from_slice(label.as_bytes());
            len += label.len();
            ""
        } else {
            label
        };
        for c in chars.chars() {
            let c = if needs_escape(c) { '?' } else { c };
            if len + c.len_utf8() > buf.len() {
                break;
            }
            len += c.encode_utf8(&mut buf[len..]).len();
        }
        Token(
            std::str::from_utf8(&buf[..len])
                .expect("hex digits and a label")
                .into(),
        )
    }

    /// Wraps a token received from elsewhere (for example from `redlease acquire`).
    ///
    /// Returns `None` for an empty string or one longer than 512 bytes.
    pub fn from_secret(secret: impl Into<String>) -> Option<Self> {
        let s = secret.into();
        (!s.is_empty() && s.len() <= 512).then(|| Token(s.into()))
    }

    /// The secret itself. Handle with care: it releases the lock.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret as a shared string, for script arguments.
    pub(crate) fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// A random public id — of a waiter, of a client — as 16 hex digits. Not a secret: it
/// names a channel, or tells a waiter its message.
pub(crate) fn public_id() -> String {
    let r = getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
    });
    format!("{r:016x}")
}

/// 16 bytes from the operating system's CSPRNG. They are read 1 KiB at a time per
/// thread and each byte is handed out once, which spares a system call per token.
/// 32 random lowercase hex digits into `out`.
fn random_hex(out: &mut [u8; 32]) {
    for (i, b) in random_16().into_iter().enumerate() {
        out[2 * i] = b"0123456789abcdef"[usize::from(b >> 4)];
        out[2 * i + 1] = b"0123456789abcdef"[usize::from(b & 15)];
    }
}

fn random_16() -> [u8; 16] {
    use std::cell::RefCell;
    const CHUNK: usize = 1024;
    thread_local! {
        static POOL: RefCell<([u8; CHUNK], usize)> = const { RefCell::new(([0; CHUNK], CHUNK)) };
    }
    POOL.with(|pool| {
        let (buf, used) = &mut *pool.borrow_mut();
        if *used + 16 > CHUNK {
            getrandom::fill(buf).expect("the operating system's random source failed");
            *used = 0;
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&buf[*used..*used + 16]);
        // Never handed out twice.
        buf[*used..*used + 16].fill(0);
        *used += 16;
        out
    })
}

/// The longest owner label kept in a token, in bytes.
const MAX_LABEL: usize = 128;

/// An owner label as every lock stores it: control characters and the invisible marks
/// a message would escape become `?`, and it is cut to 128 bytes (at a character).
pub(crate) fn clean_label(label: &str) -> String {
    let mut out = String::with_capacity(label.len().min(MAX_LABEL));
    for c in label.chars() {
        let c = if needs_escape(c) { '?' } else { c };
        if out.len() + c.len_utf8() > MAX_LABEL {
            break;
        }
        out.push(c);
    }
    out
}

/// A number that rises strictly with every acquisition of the same lock.
///
/// Pass it to the resource the lock protects, and have the resource reject any request
/// carrying a lower token than the highest it has seen. That turns a lock that was
/// lost without its holder noticing (a long GC pause, a slow network) into a refused
/// write instead of a corrupted one.
///
/// Tokens come from a counter per key prefix (per hash slot on a Redis Cluster) that
/// starts from Redis's clock in microseconds, never below a floor kept for a day: they
/// keep rising when the counter expires or is deleted, when Redis's clock steps back
/// (within that day), and across a failover that takes longer than 200 ms. The mutex,
/// the fair mutex and the read-write lock's writer of one name share the sequence. They
/// are not consecutive. Compare them; do not interpret them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value (for resources that store them).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> u64 {
        token.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex_and_redacted() {
        let a = Token::generate();
        let b = Token::generate();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 32);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
        assert!(!format!("{a:?}").contains(a.expose()));
    }

    #[test]
    fn tokens_do_not_repeat_across_pool_refills() {
        let tokens: std::collections::HashSet<String> =
            (0..5000).map(|_| Token::generate().expose().to_owned()).collect();
        assert_eq!(tokens.len(), 5000);
    }

    #[test]
    fn owner_tokens_name_their_owner_safely() {
        let t = Token::for_owner("host:42");
        assert_eq!(t.expose().len(), 32 + 1 + 7);
        let (random, label) = t.expose().split_at(32);
        assert!(random.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(label, "@host:42");
        assert_ne!(t, Token::for_owner("host:42"));
        let t = Token::for_owner("evil\r\x1b[31mred");
        assert_eq!(&t.expose()[32..], "@evil??[31mred");
        let t = Token::for_owner(&"é".repeat(100));
        assert_eq!(&t.expose()[33..], "é".repeat(64));
        assert_eq!(&Token::for_owner("a\u{202e}b\u{2028}").expose()[33..], "a?b?");
    }

    #[test]
    fn owner_labels_are_cleaned_as_tokens_clean_them() {
        for label in [
            "host:42",
            "evil\r\x1b[2J\r\nx",
            "a\u{202e}b\u{2028}c",
            &"é".repeat(100),
            &"x".repeat(1 << 20),
        ] {
            let clean = clean_label(label);
            assert_eq!(
                format!("@{clean}"),
                Token::for_owner(label).expose()[32..],
                "{label:?}"
            );
            assert!(
                clean.len() <= MAX_LABEL && !clean.chars().any(needs_escape),
                "{clean:?}"
            );
        }
    }

    #[test]
    fn foreign_tokens_are_checked() {
        assert!(Token::from_secret("").is_none());
        assert!(Token::from_secret("x".repeat(513)).is_none());
        assert_eq!(Token::from_secret("abc").unwrap().expose(), "abc");
    }
}
