//! Least privilege: the ACL rules of a Redis user that can do everything redlease does
//! and nothing else.

/// Every command redlease sends, directly or from inside its scripts. Redis checks a
/// script's `redis.call`s against the calling user's ACL too, so both count.
const COMMANDS: &[&str] = &[
    // Sent directly: scripts run by SHA, are preloaded when a client starts, and are
    // sent in full (EVAL) after a NOSCRIPT; the wake-up connection subscribes and pings;
    // `status` counts waiters. EVAL grants no more than the rest of this list: the
    // commands a script calls are checked against the same rules.
    "evalsha",
    "eval",
    "script|load",
    "subscribe",
    "unsubscribe",
    "ping",
    "pubsub|numsub",
    // Called by the scripts (a test checks every script against this list).
    "get",
    "set",
    "del",
    "unlink",
    "exists",
    "incr",
    "pttl",
    "pexpire",
    "publish",
    "time",
    // The sorted sets of the fair mutex's queue, the read-write lock's readers and
    // waiting writers, and the semaphore's permits.
    "zadd",
    "zrem",
    "zcard",
    "zcount",
    "zscore",
    "zmscore",
    "zrank",
    "zpopmin",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    // An election's leader (a hash) and its history of changes (a stream).
    "hset",
    "hget",
    "hmget",
    "xadd",
    "xlen",
    "xrange",
    "xrevrange",
];

/// The ACL rules for a Redis user that runs redlease with key prefix `prefix`: access
/// to the lock keys (`<prefix>*`), their auxiliary keys and wake-up channels
/// (`{<prefix>*`, which start with the hash-tag brace), and exactly the commands
/// redlease sends — no other keys, channels or commands.
///
/// Each element is one argument of `ACL SETUSER` (the prefix may contain spaces);
/// joined with spaces they form the line for `redis-cli` or an ACL file. Glob
/// characters in the prefix are escaped. The rules start with `resetkeys
/// resetchannels -@all`, so applying them to an existing user replaces its
/// permissions (but not its password or on/off state).
///
/// On Redis 7.2 or newer, redis-rs's `CLIENT SETINFO` at connect time is refused under
/// these rules; redis-rs ignores that, but the refusal shows in `ACL LOG`. Add
/// `+client|setinfo` to keep the log quiet. A URL that selects a database other than
/// 0 also needs `+select`.
///
/// [`Client::list`](crate::Client::list) is not covered: it also needs `+scan +type
/// +zcount +zrange +hmget` (and `+cluster|slots` on a cluster), and `SCAN` returns key
/// names beyond the user's key patterns — grant it to an operator's user, not to
/// every locker's.
///
/// # Examples
///
/// ```
/// let rules = redlease::acl_rules("redlease:").join(" ");
/// assert!(rules.starts_with("resetkeys resetchannels -@all ~redlease:* ~{redlease:* &redlease:* &{redlease:*"));
/// // redis-cli ACL SETUSER locker on '>secret' <rules>
/// ```
pub fn acl_rules(prefix: &str) -> Vec<String> {
    let prefix = escape_glob(prefix);
    let mut rules: Vec<String> = vec!["resetkeys".into(), "resetchannels".into(), "-@all".into()];
    rules.push(format!("~{prefix}*"));
    rules.push(format!("~{{{prefix}*"));
    rules.push(format!("&{prefix}*"));
    rules.push(format!("&{{{prefix}*"));
    rules.extend(COMMANDS.iter().map(|c| format!("+{c}")));
    rules
}

/// Escapes the characters Redis's glob matcher treats specially.
fn escape_glob(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_line() {
        assert_eq!(
            acl_rules("redlease:").join(" "),
            "resetkeys resetchannels -@all ~redlease:* ~{redlease:* &redlease:* &{redlease:* \
             +evalsha +eval +script|load +subscribe +unsubscribe +ping +pubsub|numsub \
             +get +set +del +unlink +exists +incr +pttl +pexpire +publish +time \
             +zadd +zrem +zcard +zcount +zscore +zmscore +zrank +zpopmin +zrange +zrangebyscore +zremrangebyscore \
             +hset +hget +hmget +xadd +xlen +xrange +xrevrange"
        );
    }

    /// Every command any script calls by name must be granted; publishing goes through
    /// an argument (PUBLISH or SPUBLISH) and is granted above. `list`'s script is the
    /// exception: listing is an operator's task, and its `SCAN` sees every key name
    /// whatever the key patterns, so its commands are documented apart, not granted.
    #[test]
    fn every_command_the_scripts_call_is_granted() {
        let mut called = std::collections::BTreeSet::new();
        for script in crate::script::all().into_iter().filter(|s| s.name != "list_lock") {
            let code = script.code();
            for (i, _) in code.match_indices("call('") {
                let rest = &code[i + "call('".len()..];
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
                called.insert(name.to_ascii_lowercase());
            }
        }
        assert!(called.len() > 10, "scanned too little: {called:?}");
        for command in &called {
            assert!(
                COMMANDS.contains(&command.as_str()),
                "scripts call {command} but the ACL rules do not grant it"
            );
        }
    }

    #[test]
    fn glob_characters_are_escaped() {
        let rules = acl_rules("a*b?[c]\\:");
        assert_eq!(rules[3], "~a\\*b\\?\\[c\\]\\\\:*");
        assert_eq!(acl_rules("")[3..7], ["~*", "~{*", "&*", "&{*"]);
    }
}
