//! Key layout and input validation.
//!
//! A plain mutex lives at exactly `<prefix><name>`, so redis-py's `Lock`,
//! node-redlock and redsync contend on the same key. Every auxiliary key and the
//! wake-up channel are named `{<lock key>}:<suffix>`: the braces make Redis Cluster
//! hash only the lock key, so everything of one lock sits in the lock key's slot.
//! When the lock key already carries a hash tag, the suffix is appended instead, which
//! keeps that tag (the first `{...}` decides the slot).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};

/// Longest accepted lock name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Shortest accepted lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Longest accepted lease.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The Redis names used by one lock.
#[derive(Clone, Debug)]
pub(crate) struct LockKeys {
    /// The lock key itself, `<prefix><name>` (shared: every lock handle keeps it).
    pub key: Arc<str>,
    /// Whether the key has a hash tag: auxiliary names are then `key:<suffix>`, else
    /// `{key}:<suffix>`.
    tagged: bool,
}

impl LockKeys {
    /// Validates `name` and derives the keys of the lock `<prefix><name>`.
    pub fn new(prefix: &str, name: &str) -> Result<Self> {
        let invalid = |reason| Error::InvalidName {
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(invalid("the name is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid("the name is longer than 1024 bytes"));
        }
        if has_control(name) {
            return Err(invalid("the name contains control characters"));
        }
        let key = shared_concat(&[prefix, name]);
        let tagged = hash_tag(&key).is_some();
        if !tagged && key.contains('}') {
            // `{key}` would end its tag at this brace and land in another slot.
            return Err(invalid(if prefix.contains('}') {
                "the prefix contains '}', so only a name with a {hash tag} of its own makes a key whose auxiliary keys can share its cluster slot"
            } else {
                "the key contains '}' without a complete {hash tag}, so its auxiliary keys could not share its cluster slot"
            }));
        }
        if is_fence_counter(prefix, &key) {
            return Err(invalid("the key is where redlease keeps its fencing tokens"));
        }
        Ok(LockKeys { key, tagged })
    }

    /// The parts of an auxiliary name, in order.
    fn aux_parts<'a>(&'a self, suffix: &'a str) -> [&'a str; 4] {
        if self.tagged {
            ["", &self.key, ":", suffix]
        } else {
            ["{", &self.key, "}:", suffix]
        }
    }

    /// An auxiliary key or channel in the lock key's slot: `{key}:<suffix>`.
    pub fn aux(&self, suffix: &str) -> String {
        self.aux_parts(suffix).concat()
    }

    /// [`aux`](Self::aux) as a shared string, made in one allocation.
    pub fn aux_shared(&self, suffix: &str) -> Arc<str> {
        shared_concat(&self.aux_parts(suffix))
    }
}

/// The suffixes of the auxiliary *keys* of every kind of lock (`{<key>}:<suffix>`, or
/// `<key>:<suffix>` when the key has a hash tag); wake-up channels are another
/// namespace. `readers` stands for a read-write lock held by readers only, which has no
/// lock key.
pub(crate) const AUX_KEY_SUFFIXES: [&str; 13] = [
    "alive", "fence", "floor", "history", "legacy", "limit", "meta", "q", "queue", "readers", "term",
    "waiters", "writers",
];

/// `parts` concatenated into a shared string, in one allocation when short (a `String`
/// turned into an `Arc<str>` costs two).
pub(crate) fn shared_concat(parts: &[&str]) -> Arc<str> {
    const SHORT: usize = 256;
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > SHORT {
        return parts.concat().into();
    }
    let mut buf = [0u8; SHORT];
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part.as_bytes());
        at += part.len();
    }
    std::str::from_utf8(&buf[..len])
        .expect("strings concatenated are a string")
        .into()
}

/// Whether `s` has a control character (the ASCII ones, DEL, and Unicode's).
fn has_control(s: &str) -> bool {
    s.bytes().any(|b| b < 0x20 || b == 0x7f) || (!s.is_ascii() && s.chars().any(char::is_control))
}

/// Checks a key prefix: the rules of a name, except that it may be empty.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    let reason = if prefix.len() > MAX_NAME_LEN {
        "is longer than 1024 bytes"
    } else if has_control(prefix) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(Error::Config {
        reason: format!("the key prefix {} {reason}", crate::error::Shown(prefix)),
        source: None,
    })
}

/// The Redis Cluster slot of `key`: CRC16/XMODEM of its hash tag (or of the whole key),
/// modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(close) if close > 0 => &key[open + 1..open + 1 + close],
            _ => key,
        },
        None => key,
    };
    crc16(0, hashed) % SLOTS as u16
}

/// How many hash slots Redis Cluster has.
const SLOTS: usize = 16384;

/// CRC16/XMODEM of `bytes`, continuing from `crc`.
fn crc16(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The keys that issue the plain mutex's fencing tokens (see `mark.lua`): a counter and
/// its floor, shared by every lock of the prefix — on a Redis Cluster, by every lock of
/// the prefix in one hash slot, as a script can only touch keys of one slot.
///
/// On a single server (or one Sentinel master) they are `{<prefix>fence}` and
/// `{<prefix>fence}:floor`. On a Cluster the counter of slot `s` is
/// `{<prefix>fence:<n>}` with the smallest `n` whose key lands in `s`, and its floor
/// `{<prefix>fence:<n>}:floor`: at most two keys per slot, however many locks come and
/// go. (A prefix with braces of its own would take the counters' hash tags apart, so
/// under such a prefix each lock of a Cluster has its own pair, `{<lock key>}:fence`
/// and `{<lock key>}:floor`, as its other auxiliary keys.)
///
/// Every client of a lock must agree on these keys, so all of them must be configured
/// alike: all for a Cluster, or none.
#[derive(Debug)]
pub(crate) struct FenceKeys {
    prefix: String,
    /// The counters are per hash slot (a Cluster).
    per_slot: bool,
    /// The one pair when they are not.
    single: OnceLock<[Arc<str>; 2]>,
    /// For each slot the `n` of its counter (`u32::MAX`: none found), computed at first
    /// use.
    table: OnceLock<Box<[u32]>>,
}

/// How many counter names are tried to cover every slot (about 180 000 are needed).
const MAX_COUNTERS: u32 = 4_000_000;

impl FenceKeys {
    pub fn new(prefix: &str, per_slot: bool) -> Self {
        FenceKeys {
            prefix: prefix.to_owned(),
            per_slot,
            single: OnceLock::new(),
            table: OnceLock::new(),
        }
    }

    /// The counter and floor keys of the lock `keys` (in the lock key's slot).
    pub fn of(&self, keys: &LockKeys) -> [Arc<str>; 2] {
        if !self.per_slot {
            let [counter, floor] = self.single.get_or_init(|| {
                let counter = format!("{{{}fence}}", self.prefix);
                let floor = format!("{counter}:floor");
                [counter.into(), floor.into()]
            });
            return [counter.clone(), floor.clone()];
        }
        let shared = !self.prefix.contains(['{', '}']);
        let n = if shared {
            self.table()[usize::from(key_slot(keys.key.as_bytes()))]
        } else {
            u32::MAX
        };
        if n == u32::MAX {
            return [keys.aux("fence").into(), keys.aux("floor").into()];
        }
        let counter = format!("{{{}fence:{n}}}", self.prefix);
        let floor = format!("{counter}:floor");
        [counter.into(), floor.into()]
    }

    fn table(&self) -> &[u32] {
        self.table.get_or_init(|| {
            let mut table = vec![u32::MAX; SLOTS].into_boxed_slice();
            let start = crc16(crc16(0, self.prefix.as_bytes()), b"fence:");
            let mut left = SLOTS;
            let mut digits = Digits([0; 10]);
            for n in 0..MAX_COUNTERS {
                let slot = usize::from(crc16(start, digits.format(n)) % SLOTS as u16);
                if table[slot] == u32::MAX {
                    table[slot] = n;
                    left -= 1;
                    if left == 0 {
                        break;
                    }
                }
            }
            table
        })
    }
}

/// Whether `key` is one of the shared fencing counters of `prefix` or its floor —
/// `{<prefix>fence}` on one server, `{<prefix>fence:<n>}` on a Cluster, each with its
/// `:floor` (see [`FenceKeys`]) — and so not a lock. (Under a prefix with braces a
/// Cluster's counters are auxiliary keys of each lock, `<lock key>:fence` and
/// `<lock key>:floor`.)
pub(crate) fn is_fence_counter(prefix: &str, key: &str) -> bool {
    let Some(rest) = key
        .strip_prefix('{')
        .and_then(|k| k.strip_prefix(prefix))
        .and_then(|k| k.strip_prefix("fence"))
    else {
        return false;
    };
    let rest = rest.strip_suffix(":floor").unwrap_or(rest);
    match rest.strip_suffix('}') {
        Some("") => true,
        Some(n) => n
            .strip_prefix(':')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// Decimal digits of a `u32` without allocating.
struct Digits([u8; 10]);

impl Digits {
    fn format(&mut self, mut n: u32) -> &[u8] {
        let mut i = self.0.len();
        loop {
            i -= 1;
            self.0[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &self.0[i..];
            }
        }
    }
}

/// The hash tag Redis Cluster would use for `key`, if any.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// Checks a lease length and returns it in whole milliseconds.
pub(crate) fn ttl_ms(name: &str, ttl: Duration) -> Result<u64> {
    let invalid = |reason| Error::InvalidTtl {
        name: name.to_owned(),
        ttl,
        reason,
    };
    if ttl.is_zero() {
        return Err(invalid("a lease must last longer than zero"));
    }
    if ttl < MIN_TTL {
        return Err(invalid("a lease must last at least 10ms"));
    }
    if ttl > MAX_TTL {
        return Err(invalid("a lease may last at most 30 days"));
    }
    Ok(ttl.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(key: &str) -> u16 {
        key_slot(key.as_bytes())
    }

    #[test]
    fn the_wake_channel_is_the_waiters_key_with_wake_for_q() {
        // mutex_release.lua and Mutex::channel derive one from the other.
        for name in ["deploy", "{tag}deploy", "a{b}c"] {
            let keys = LockKeys::new("redlease:", name).unwrap();
            let waiters = keys.aux("q");
            assert_eq!(format!("{}wake", &waiters[..waiters.len() - 1]), keys.aux("wake"));
        }
    }

    #[test]
    fn slots_match_redis() {
        // The examples of Redis's CLUSTER KEYSLOT documentation.
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // And redis-rs's own routing, for a spread of keys.
        for i in 0..1000 {
            let key = format!("redlease:lock-{i}");
            let theirs = format!("{:?}", redis::cluster_routing::Slot::for_key(&key));
            assert_eq!(theirs, format!("Slot({})", key_slot(key.as_bytes())));
        }
        // An empty tag hashes the whole key.
        assert_ne!(key_slot(b"a{}b"), key_slot(b""));
    }

    #[test]
    fn every_slot_has_a_fencing_counter_in_it() {
        for prefix in ["redlease:", "", "app:locks/"] {
            let fence = FenceKeys::new(prefix, true);
            let table = fence.table();
            assert!(
                table.iter().all(|&n| n < MAX_COUNTERS),
                "{prefix}: a slot without a counter"
            );
            for slot in [0usize, 1, 777, 16383] {
                let key = format!("{{{prefix}fence:{}}}", table[slot]);
                assert_eq!(usize::from(key_slot(key.as_bytes())), slot, "{key}");
            }
        }
    }

    #[test]
    fn fencing_counters_share_the_lock_slot() {
        for (prefix, name) in [
            ("redlease:", "deploy"),
            ("", "lock.foo"),
            ("app:", "{user42}.lock"),
            ("{tenant}:", "x"),
            ("p{", "b}"),
            ("", "ü-ñ-名前"),
        ] {
            let keys = LockKeys::new(prefix, name).unwrap();
            let [counter, floor] = FenceKeys::new(prefix, true).of(&keys);
            assert_eq!(slot(&counter), slot(&keys.key), "{prefix}{name}: {counter}");
            assert_eq!(slot(&floor), slot(&keys.key), "{prefix}{name}: {floor}");
            assert_ne!(&*counter, &*keys.key);
        }
        let keys = LockKeys::new("redlease:", "deploy").unwrap();
        let [counter, floor] = FenceKeys::new("redlease:", true).of(&keys);
        assert!(
            counter.starts_with("{redlease:fence:") && counter.ends_with('}'),
            "{counter}"
        );
        assert_eq!(&*floor, format!("{counter}:floor"));
        let keys = LockKeys::new("{tenant}:", "x").unwrap();
        assert_eq!(
            FenceKeys::new("{tenant}:", true).of(&keys),
            [Arc::from("{tenant}:x:fence"), Arc::from("{tenant}:x:floor")]
        );
        // On a single server, one pair for the prefix.
        for name in ["deploy", "other"] {
            let keys = LockKeys::new("redlease:", name).unwrap();
            assert_eq!(
                FenceKeys::new("redlease:", false).of(&keys),
                [Arc::from("{redlease:fence}"), Arc::from("{redlease:fence}:floor")]
            );
        }
    }

    #[test]
    fn lock_key_is_exactly_prefix_and_name() {
        let keys = LockKeys::new("redlease:", "deploy").unwrap();
        assert_eq!(&*keys.key, "redlease:deploy");
        assert_eq!(keys.aux("meta"), "{redlease:deploy}:meta");
        let keys = LockKeys::new("", "lock.foo").unwrap();
        assert_eq!(&*keys.key, "lock.foo");
    }

    #[test]
    fn auxiliary_keys_share_the_lock_slot() {
        for (prefix, name) in [
            ("redlease:", "deploy"),
            ("", "lock.foo"),
            ("app:", "{user42}.lock"),
            ("{tenant}:", "x"),
            ("p:", "a{b"),
            ("", "ü-ñ-名前"),
        ] {
            let keys = LockKeys::new(prefix, name).unwrap();
            for suffix in ["meta", "wake", "queue"] {
                assert_eq!(
                    slot(&keys.aux(suffix)),
                    slot(&keys.key),
                    "{prefix}{name} / {suffix}"
                );
            }
        }
    }

    #[test]
    fn bad_names_are_rejected() {
        for name in ["", "a}b", "a{}b", "line\nbreak"] {
            let err = LockKeys::new("p:", name).unwrap_err();
            assert!(err.is_invalid_input(), "{name:?}: {err}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(LockKeys::new("", &long).is_err());
        assert!(LockKeys::new("", &"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn prefixes_follow_the_rules_of_names_but_may_be_empty() {
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("redlease:").is_ok());
        assert!(check_prefix(&"p".repeat(MAX_NAME_LEN)).is_ok());
        let err = check_prefix("a\rb").unwrap_err().to_string();
        assert!(err.contains(r#""a\rb" contains control characters"#), "{err}");
        let err = check_prefix(&"p".repeat(MAX_NAME_LEN + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("longer than 1024 bytes") && err.len() < 200, "{err}");
        assert!(check_prefix("{app}:").is_ok() && check_prefix("{app").is_ok());
        // A '}' in the prefix leaves names with a hash tag of their own; the others are
        // refused, and the message blames the prefix.
        assert!(check_prefix("app}").is_ok());
        assert!(LockKeys::new("app}", "{t}x").is_ok());
        let err = LockKeys::new("app}", "orders").unwrap_err().to_string();
        assert!(err.contains("the prefix contains '}'"), "{err}");
    }

    #[test]
    fn names_that_are_the_fencing_keys_are_refused() {
        let refused =
            |prefix: &str, name: &str| matches!(LockKeys::new(prefix, name), Err(Error::InvalidName { .. }));
        // The fencing counters and their floors (an empty prefix is redis-py's layout).
        for name in ["{fence}", "{fence}:floor", "{fence:12}", "{fence:12}:floor"] {
            assert!(refused("", name), "{name}");
        }
        for name in [
            "{fence}",
            "fence",
            "{fence}x",
            "{fence:}",
            "{orders}:q",
            "{t}job:meta",
        ] {
            assert!(!refused("redlease:", name), "{name}");
        }
        assert!(!refused("", "fence") && !refused("", "{fence}x"));
    }

    #[test]
    fn fence_counters_are_recognised() {
        let keys = LockKeys::new("redlease:", "deploy").unwrap();
        for per_slot in [false, true] {
            for key in FenceKeys::new("redlease:", per_slot).of(&keys) {
                assert!(is_fence_counter("redlease:", &key), "{key}");
            }
        }
        assert!(is_fence_counter("", "{fence:12}:floor"));
        for not in [
            "redlease:fence:12",
            "{redlease:fence:}",
            "{redlease:fence:1x}",
            "{redlease:deploy}:q",
            "{other:fence:1}",
        ] {
            assert!(!is_fence_counter("redlease:", not), "{not}");
        }
    }

    #[test]
    fn ttls_are_checked() {
        assert!(ttl_ms("n", Duration::ZERO).is_err());
        assert!(ttl_ms("n", Duration::from_micros(500)).is_err());
        assert!(ttl_ms("n", Duration::from_millis(9)).is_err());
        assert_eq!(ttl_ms("n", Duration::from_millis(10)).unwrap(), 10);
        assert_eq!(ttl_ms("n", Duration::from_secs(30)).unwrap(), 30_000);
        assert!(ttl_ms("n", Duration::from_secs(31 * 24 * 3600)).is_err());
        assert!(ttl_ms("n", Duration::MAX).is_err());
    }
}
