//! Every held lock under a client's prefix, of every kind: [`Client::list`].
//!
//! The one place that knows the key layouts of all the primitives at once. Keys are
//! found with `SCAN` (on a cluster, on every master), turned into the names they
//! belong to, and each name is described by one read-only script (`list_lock.lua`)
//! that sees its keys at one instant and never returns a token. How a plain mutex's
//! token names its owner is read by the `owner.lua` prelude that `status` shares.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::keys::{AUX_KEY_SUFFIXES, LockKeys, hash_tag, is_fence_counter};
use crate::script::reply::{fence, ms};
use crate::script::{LIST_LOCK, eval};
use crate::token::FencingToken;
use crate::transport::value::{array, int, opt_string, text};

/// The kind of a lock [`Client::list`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// An exclusive lock at `<prefix><name>`: a plain [`Mutex`](crate::Mutex), or a
    /// lock some other library holds there ([`LockInfo::foreign`]). A
    /// [`FairMutex`](crate::FairMutex) that nobody queues for holds the same token as a
    /// plain mutex and is listed as this kind too; so is a [`RwLock`](crate::RwLock)'s
    /// writer that nobody reads beside or waits behind, with its fencing token (the
    /// mutexes record none).
    Mutex,
    /// A [`FairMutex`](crate::FairMutex) with waiters in its queue.
    FairMutex,
    /// A [`RwLock`](crate::RwLock) held by readers, or by a writer with readers or
    /// waiting writers beside it.
    RwLock,
    /// A [`Semaphore`](crate::Semaphore) with permits held.
    Semaphore,
    /// An [`Election`](crate::Election) with a leader.
    Election,
    /// A [`LegacyLock`](crate::LegacyLock) held by redlease.
    Legacy,
}

impl LockKind {
    /// `mutex`, `fair mutex`, `rwlock`, `semaphore`, `election` or `legacy`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::FairMutex => "fair mutex",
            LockKind::RwLock => "rwlock",
            LockKind::Semaphore => "semaphore",
            LockKind::Election => "election",
            LockKind::Legacy => "legacy",
        }
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One held lock, as [`Client::list`] reports it. Never contains a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// What kind of lock it is.
    pub kind: LockKind,
    /// The name (without the prefix).
    pub name: String,
    /// The Redis key, `<prefix><name>`.
    pub key: String,
    /// The holder's owner label (`host:pid` by default); `None` for readers, semaphore
    /// permits, a legacy lock, and holders that are not redlease clients.
    pub owner: Option<String>,
    /// The key holds a value in a format not redlease's: another library (redis-py,
    /// node-redlock, redsync, an old `SETNX` client) holds the lock.
    pub foreign: bool,
    /// The remaining lease; `None` when the key has no TTL.
    pub remaining: Option<Duration>,
    /// The holder's fencing token (an election's term, a read-write lock's writer's);
    /// `None` for the plain and the fair mutex (they record none), readers, permits,
    /// legacy and foreign locks.
    pub fence: Option<FencingToken>,
    /// How many wait: a plain mutex's registered waiters (clients), a fair mutex's
    /// queue, a read-write lock's waiting writers, a semaphore's waiting acquisitions;
    /// 0 where waiters leave no trace (elections).
    pub waiters: u64,
    /// How many hold it: readers of a read-write lock, permits of a semaphore; 1 for
    /// the exclusive kinds.
    pub holders: u64,
}

/// How many locks are described at once.
const CONCURRENCY: usize = 64;

impl Client {
    /// Every held lock under this client's prefix, of every kind, whose name matches
    /// the glob `pattern` (`*` any run of characters, `?` one, `[abc]`, `[a-z]`, `[^a]`,
    /// `\` escapes; `*` for all), sorted by name. Never reveals a token.
    ///
    /// Keys are found with `SCAN` — never `KEYS`, which would block the server — on a
    /// cluster on every master, so a large keyspace costs many round trips but never
    /// stalls Redis; locks taken or released during the scan may or may not be
    /// listed. Each lock is then read in one step, so what is reported of one lock is
    /// consistent. A key under the prefix that holds a string in a format not
    /// redlease's is listed as a [`LockKind::Mutex`] held by another library
    /// ([`LockInfo::foreign`]); other keys that are not locks are left out.
    ///
    /// Needs the `SCAN`, `TYPE`, `ZCOUNT`, `ZRANGE`, `HMGET`, `GET`, `PTTL`, `EXISTS`
    /// and `TIME` commands (`CLUSTER SLOTS` on a cluster) in the ACL, beyond what
    /// [`acl_rules`](crate::acl_rules) grants for taking locks.
    ///
    /// # Cancel safety
    ///
    /// Read-only: dropping the future leaves nothing behind.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be reached or refuses a command.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>> {
        let prefix = self.ctx.prefix.as_str();
        let failed = |source| Error::Redis {
            name: pattern.to_owned(),
            op: "list",
            source,
        };
        let conn = &*self.ctx.conn;
        let mut scanned = self
            .ctx
            .topology
            .scan(conn, &format!("{}*", glob_escape(prefix)))
            .await
            .map_err(failed)?;
        // Auxiliary keys in their own hash tag: `{<prefix><name>}:<suffix>`.
        if !prefix.starts_with('{') && !prefix.is_empty() {
            let wrapped = format!("{{{}*", glob_escape(prefix));
            scanned.extend(self.ctx.topology.scan(conn, &wrapped).await.map_err(failed)?);
        }
        let names: Vec<(String, bool)> = names_of(prefix, &scanned)
            .into_iter()
            .filter(|(name, _)| glob_match(pattern.as_bytes(), name.as_bytes()))
            .collect();
        let mut found = Vec::new();
        for chunk in names.chunks(CONCURRENCY) {
            let described =
                futures_util::future::join_all(chunk.iter().map(|(name, _)| self.describe(name))).await;
            for ((_, maybe_aux), info) in chunk.iter().zip(described) {
                match info.map_err(failed)? {
                    // An auxiliary key holds no lock of redlease's, whatever it holds.
                    Some(info) if *maybe_aux && info.foreign => {}
                    Some(info) => found.push(info),
                    None => {}
                }
            }
        }
        Ok(found)
    }

    /// What holds the lock `name`, of whatever kind — as [`list`](Self::list) would
    /// report it, but for one name, in one read-only step and without `SCAN`. `None`
    /// when nothing holds it. Useful when a name may be used by another kind of lock
    /// than the handle at hand (a [`Mutex`](crate::Mutex)'s `status` reports a name
    /// held by readers of a [`RwLock`](crate::RwLock) as free, and a semaphore's keys
    /// as [`Error::WrongType`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::Redis`] when Redis cannot be reached or refuses
    /// a command.
    pub async fn lock_info(&self, name: &str) -> Result<Option<LockInfo>> {
        LockKeys::new(&self.ctx.prefix, name)?;
        self.describe(name).await.map_err(|source| Error::Redis {
            name: name.to_owned(),
            op: "lock info",
            source,
        })
    }

    /// What holds the lock `name`, if anything.
    async fn describe(&self, name: &str) -> redis::RedisResult<Option<LockInfo>> {
        let Ok(keys) = LockKeys::new(&self.ctx.prefix, name) else {
            return Ok(None);
        };
        let mut all = vec![keys.key.to_string()];
        all.extend(
            [
                "meta", "q", "queue", "alive", "readers", "writers", "limit", "legacy", "waiters",
            ]
            .iter()
            .map(|s| keys.aux(s)),
        );
        let cmd = LIST_LOCK.evalsha(&all, &[] as &[&str], None);
        let reply = eval(&*self.ctx.conn, &LIST_LOCK, &cmd).await?;
        Ok(parse(name, keys.key.to_string(), &reply))
    }
}

/// Reads `list_lock.lua`'s reply.
fn parse(name: &str, key: String, reply: &Value) -> Option<LockInfo> {
    let [kind, owner, pttl, held_fence, waiters, holders] = array(reply)? else {
        return None;
    };
    let (kind, foreign) = match text(kind)? {
        "mutex" | "exclusive" => (LockKind::Mutex, false),
        "foreign" => (LockKind::Mutex, true),
        "fair" => (LockKind::FairMutex, false),
        "rwlock" => (LockKind::RwLock, false),
        "semaphore" => (LockKind::Semaphore, false),
        "election" => (LockKind::Election, false),
        "legacy" => (LockKind::Legacy, false),
        _ => return None,
    };
    Some(LockInfo {
        kind,
        name: name.to_owned(),
        key,
        owner: opt_string(owner),
        foreign,
        remaining: ms(int(pttl)),
        fence: fence(held_fence),
        waiters: int(waiters).unwrap_or(0).max(0) as u64,
        holders: int(holders).unwrap_or(1).max(0) as u64,
    })
}

/// The names of the locks that `keys` (found under `prefix`) may belong to, each with
/// whether it may also be an auxiliary key of another lock.
///
/// A lock key `<prefix><name>` stands for `name`; an auxiliary key stands for nothing,
/// except a read-write lock's readers, which stand for their lock (it has no lock key
/// while only readers hold it). The shared fencing counters are not locks. When a lock
/// key has a hash tag its auxiliary keys are `<lock key>:<suffix>`, which is also the
/// key of a lock named `<name>:<suffix>`: such a name is described too, and kept only
/// if it holds one of redlease's locks (an auxiliary key never looks like one).
fn names_of(prefix: &str, keys: &[String]) -> BTreeMap<String, bool> {
    let mut names = BTreeMap::new();
    let aux_of = |key: &str, name: &str, suffix: &str| {
        LockKeys::new(prefix, name).is_ok_and(|keys| keys.aux(suffix) == key)
    };
    for key in keys {
        if is_fence_counter(prefix, key) {
            continue;
        }
        // `{<prefix><name>}:<suffix>`
        if let Some((inner, suffix)) = key.strip_prefix('{').and_then(|k| k.rsplit_once("}:"))
            && let Some(name) = inner.strip_prefix(prefix)
            && AUX_KEY_SUFFIXES.contains(&suffix)
            && aux_of(key, name, suffix)
        {
            if suffix == "readers" {
                names.insert(name.to_owned(), false);
            }
            continue;
        }
        let Some(name) = key.strip_prefix(prefix) else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        // `<prefix><name>:<suffix>` when the lock key has a hash tag.
        let maybe_aux = hash_tag(key).is_some()
            && name.rsplit_once(':').is_some_and(|(lock, suffix)| {
                let is_aux = AUX_KEY_SUFFIXES.contains(&suffix) && aux_of(key, lock, suffix);
                if is_aux && suffix == "readers" {
                    names.insert(lock.to_owned(), false);
                }
                is_aux
            });
        let entry = names.entry(name.to_owned()).or_insert(maybe_aux);
        *entry &= maybe_aux;
    }
    names
}

/// `s` with Redis's glob characters escaped, to match itself.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `text` matches the glob `pattern`, as Redis's `SCAN ... MATCH` and `KEYS`
/// read one: `*`, `?`, `[set]` (with `^` negation and `a-z` ranges) and `\` escapes.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: the pattern after it, and the text position.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, text[t])
                        && matched
                    {
                        p = next;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() && pattern[p + 1] == text[t] => {
                    p += 2;
                    t += 1;
                    continue;
                }
                b'\\' if p + 1 < pattern.len() => {}
                c if c == text[t] => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
        }
        // Mismatch: let the last `*` swallow one more character, or fail.
        match star {
            Some((after, from)) => {
                p = after;
                t = from + 1;
                star = Some((after, from + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[open] == b'['`: whether it
/// matched, and where the pattern goes on. `None` for a class that is not closed.
fn class(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    loop {
        match *pattern.get(i)? {
            b']' => return Some((matched != negate, i + 1)),
            b'\\' => {
                matched |= *pattern.get(i + 1)? == c;
                i += 2;
            }
            lo if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&h| h != b']') => {
                let hi = pattern[i + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                matched |= (lo..=hi).contains(&c);
                i += 3;
            }
            x => {
                matched |= x == c;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_does() {
        let cases: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "deploy", true),
            ("dep*", "deploy", true),
            ("dep*", "adeploy", false),
            ("*loy", "deploy", true),
            ("d?ploy", "deploy", true),
            ("d?ploy", "dploy", false),
            ("job-[0-9]", "job-7", true),
            ("job-[0-9]", "job-x", false),
            ("job-[^0-9]", "job-x", true),
            ("job-[abc]*", "job-b2", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b*", "xxbxxaxx", false),
            ("[", "[", false),
            ("report", "report", true),
            ("report", "reports", false),
        ];
        for (pattern, text, want) in cases {
            assert_eq!(
                glob_match(pattern.as_bytes(), text.as_bytes()),
                *want,
                "{pattern} ~ {text}"
            );
        }
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert!(glob_match(glob_escape("a*[b]").as_bytes(), b"a*[b]"));
    }

    #[test]
    fn scanned_keys_become_names() {
        let keys: Vec<String> = [
            "redlease:deploy",
            "{redlease:deploy}:q",
            "{redlease:deploy}:meta",
            "{redlease:fence}",
            "{redlease:fence:17}",
            "{redlease:fence:17}:floor",
            "{redlease:fence}:floor",
            "{redlease:readonly}:readers",
            "{redlease:readonly}:writers",
            "redlease:{user42}.lock",
            "redlease:{user42}.lock:meta",
            "redlease:{user42}.shared:readers",
            "redlease:job:meta",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let names: Vec<(String, bool)> = names_of("redlease:", &keys).into_iter().collect();
        let names: Vec<(&str, bool)> = names.iter().map(|(n, aux)| (n.as_str(), *aux)).collect();
        assert_eq!(
            names,
            [
                ("deploy", false),
                // A lock named job:meta is a lock: its auxiliary keys are in braces.
                ("job:meta", false),
                ("readonly", false),
                ("{user42}.lock", false),
                // The key of a lock of this name, or {user42}.lock's metadata.
                ("{user42}.lock:meta", true),
                ("{user42}.shared", false),
                ("{user42}.shared:readers", true),
            ]
        );
    }
}
