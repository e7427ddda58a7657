//! Key layout and input validation.
//!
//! A plain mutex lives at exactly `<prefix><name>`, so redis-py's `Lock`,
//! node-redlock and redsync contend on the same key. Every auxiliary key and the
//! wake-up channel are named `{<lock key>}:<suffix>`: the braces make Redis Cluster
//! hash only the lock key, so everything of one lock sits in the lock key's slot.
//! When the lock key already carries a hash tag, the suffix is appended instead, which
//! keeps that tag (the first `{...}` decides the slot).

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
    /// The lock key itself, `<prefix><name>`.
    pub key: String,
    /// What auxiliary names are built from: `{key}` or `key` if it has a hash tag.
    base: String,
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
        let mut key = String::with_capacity(prefix.len() + name.len());
        key.push_str(prefix);
        key.push_str(name);
        let base = if hash_tag(&key).is_some() {
            key.clone()
        } else if key.contains('}') {
            // `{key}` would end its tag at this brace and land in another slot.
            return Err(invalid(
                "the key contains '}' without a complete {hash tag}, so its auxiliary keys could not share its cluster slot",
            ));
        } else {
            let mut base = String::with_capacity(key.len() + 2);
            base.push('{');
            base.push_str(&key);
            base.push('}');
            base
        };
        Ok(LockKeys { key, base })
    }

    /// An auxiliary key or channel in the lock key's slot: `{key}:<suffix>`.
    pub fn aux(&self, suffix: &str) -> String {
        let mut aux = String::with_capacity(self.base.len() + 1 + suffix.len());
        aux.push_str(&self.base);
        aux.push(':');
        aux.push_str(suffix);
        aux
    }
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
        crate::transport::key_slot(key.as_bytes())
    }

    #[test]
    fn lock_key_is_exactly_prefix_and_name() {
        let keys = LockKeys::new("redlease:", "deploy").unwrap();
        assert_eq!(keys.key, "redlease:deploy");
        assert_eq!(keys.aux("meta"), "{redlease:deploy}:meta");
        let keys = LockKeys::new("", "lock.foo").unwrap();
        assert_eq!(keys.key, "lock.foo");
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
