//! The script layer: the Lua scripts, one file per state change, each with a header
//! listing its KEYS, ARGV and replies; the [`LuaScript`] value (its SHA1 computed
//! once) and [`ScriptCall`] (a script with its keys and arguments); running them with
//! EVALSHA, loading a script at most once more when the server answers NOSCRIPT (after
//! a restart or `SCRIPT FLUSH`), alone or in batches (`invoke`); and reading their
//! replies (`reply`).

use std::sync::{Arc, LazyLock};

use redis::Cmd;

mod invoke;
pub(crate) mod reply;

pub(crate) use invoke::{eval, eval_batch, eval_then, preload};

/// A Lua script with its SHA1, ready for EVALSHA.
pub(crate) struct LuaScript {
    pub name: &'static str,
    code: String,
    sha: String,
}

impl LuaScript {
    fn new(name: &'static str, parts: &[&str]) -> Self {
        let code = parts.concat();
        let sha = redis::Script::new(&code).get_hash().to_owned();
        LuaScript { name, code, sha }
    }

    /// `EVALSHA <sha> <numkeys> keys... args... [ttl_ms]`, sized up front so building
    /// it allocates once.
    pub fn evalsha<K: AsRef<str>, A: AsRef<str>>(&self, keys: &[K], args: &[A], ttl_ms: Option<u64>) -> Cmd {
        let bytes = self.sha.len()
            + keys.iter().map(|k| k.as_ref().len()).sum::<usize>()
            + args.iter().map(|a| a.as_ref().len()).sum::<usize>()
            + 32;
        let mut cmd = Cmd::with_capacity(4 + keys.len() + args.len(), bytes);
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys.len());
        for k in keys {
            cmd.arg(k.as_ref());
        }
        for a in args {
            cmd.arg(a.as_ref());
        }
        if let Some(ttl) = ttl_ms {
            cmd.arg(ttl);
        }
        cmd
    }

    /// The `EVAL` twin of an `EVALSHA` call built by [`evalsha`](Self::evalsha): same
    /// keys and arguments, the script's code instead of its SHA. Sent after NOSCRIPT, it
    /// runs the call and caches the script in one round trip — and, being routed by its
    /// first key like the EVALSHA, on a cluster it lands on the node that owns the slot.
    pub fn eval_from(&self, evalsha: &Cmd) -> Cmd {
        let mut cmd = Cmd::with_capacity(evalsha.args_iter().len(), self.code.len() + 64);
        cmd.arg("EVAL").arg(&self.code);
        for arg in evalsha.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }

    /// `SCRIPT LOAD <code>`
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.code);
        cmd
    }

    #[cfg(test)]
    pub fn code(&self) -> &str {
        &self.code
    }
}

/// A script call: the script, its keys and its leading arguments, shared cheaply
/// between a guard, its lease and the renewal task. Renewal and extend calls get the
/// TTL in milliseconds appended as their last argument.
#[derive(Clone)]
pub(crate) struct ScriptCall {
    pub script: &'static LuaScript,
    keys: Leading,
    args: Leading,
}

/// The first `len` strings of a shared list: a call whose keys and arguments begin
/// another call's (a mutex's renewal, of its release) shares that call's lists.
#[derive(Clone)]
struct Leading {
    all: Arc<[Arc<str>]>,
    len: usize,
}

impl Leading {
    fn all(all: Arc<[Arc<str>]>) -> Self {
        Leading { len: all.len(), all }
    }

    fn first(&self, len: usize) -> Self {
        assert!(len <= self.len, "a call takes no more than it has");
        Leading {
            all: self.all.clone(),
            len,
        }
    }

    fn get(&self) -> &[Arc<str>] {
        &self.all[..self.len]
    }
}

impl ScriptCall {
    pub fn new(script: &'static LuaScript, keys: Arc<[Arc<str>]>, args: Arc<[Arc<str>]>) -> Self {
        ScriptCall {
            script,
            keys: Leading::all(keys),
            args: Leading::all(args),
        }
    }

    /// A call of `script` with the first `keys` keys and `args` arguments of this
    /// call, sharing them.
    pub fn leading(&self, script: &'static LuaScript, keys: usize, args: usize) -> Self {
        ScriptCall {
            script,
            keys: self.keys.first(keys),
            args: self.args.first(args),
        }
    }

    /// The call as an EVALSHA command.
    pub fn cmd(&self) -> Cmd {
        self.script.evalsha(self.keys.get(), self.args.get(), None)
    }

    /// The call with `ttl_ms` appended as its last argument.
    pub fn cmd_with_ttl(&self, ttl_ms: u64) -> Cmd {
        self.script
            .evalsha(self.keys.get(), self.args.get(), Some(ttl_ms))
    }
}

/// Arguments carry tokens, so `Debug` shows only the script and its keys.
impl std::fmt::Debug for ScriptCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptCall")
            .field("script", &self.script.name)
            .field("keys", &self.keys.get())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LuaScript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LuaScript").field("name", &self.name).finish()
    }
}

const FENCE: &str = include_str!("fence.lua");
const MARK: &str = include_str!("mark.lua");
/// The plain mutex's token format: who holds a lock key (status, list).
const OWNER: &str = include_str!("owner.lua");
const LEGACY: &str = include_str!("legacy.lua");
/// Preludes of the lease-set scripts (fair mutex, read-write lock, semaphore).
const EXPIRY: &str = include_str!("expiry.lua");
const FAIR_QUEUE: &str = include_str!("fair_queue.lua");
const SEM_WAITERS: &str = include_str!("sem_waiters.lua");

/// The plain mutex's steps as local Lua functions taking that script's `KEYS` and
/// `ARGV`, for the scripts that apply a step to several names at once: each name then
/// gets exactly what a plain mutex of that name gets, whatever its scripts write.
macro_rules! step {
    ($file:literal) => {
        concat!(
            "local function ",
            $file,
            "(KEYS, ARGV)\n",
            include_str!(concat!($file, ".lua")),
            "\nend\n"
        )
    };
}
const MUTEX_ACQUIRE_STEP: &str = step!("mutex_acquire");
const MUTEX_EXTEND_STEP: &str = step!("mutex_extend");
const MUTEX_RELEASE_STEP: &str = step!("mutex_release");

macro_rules! script {
    ($static:ident, $file:literal) => {
        pub(crate) static $static: LazyLock<LuaScript> =
            LazyLock::new(|| LuaScript::new($file, &[include_str!(concat!($file, ".lua"))]));
    };
    // Scripts that use the metadata helpers of fence.lua get it prepended.
    ($static:ident, $file:literal, fenced) => {
        pub(crate) static $static: LazyLock<LuaScript> =
            LazyLock::new(|| LuaScript::new($file, &[FENCE, include_str!(concat!($file, ".lua"))]));
    };
    // A script whose common path must not pay for a prelude: the prelude goes where
    // the script marks its place (`--[[mark.lua]]`), after that path. (Each `local
    // function` of a prelude is a closure made anew on every call.)
    ($static:ident, $file:literal, $prelude:ident at $marker:literal) => {
        pub(crate) static $static: LazyLock<LuaScript> = LazyLock::new(|| {
            let code = include_str!(concat!($file, ".lua"));
            let (head, tail) = code
                .split_once($marker)
                .expect(concat!($file, ".lua marks where its prelude goes"));
            LuaScript::new($file, &[head, $prelude, tail])
        });
    };
    // Scripts that use other preludes list them, in order.
    ($static:ident, $file:literal, [$($prelude:ident),+]) => {
        pub(crate) static $static: LazyLock<LuaScript> = LazyLock::new(|| {
            LuaScript::new($file, &[$($prelude,)+ include_str!(concat!($file, ".lua"))])
        });
    };
}

script!(MUTEX_ACQUIRE, "mutex_acquire", [MARK]);
script!(MUTEX_EXTEND, "mutex_extend");
script!(MUTEX_RELEASE, "mutex_release", MARK at "--[[mark.lua]]");
script!(MUTEX_STATUS, "mutex_status", [MARK, OWNER]);
script!(MUTEX_HANDOFF, "mutex_handoff", [MARK]);
script!(LEASE_EXTEND, "lease_extend");
script!(CAS, "cas");
script!(LEGACY_ACQUIRE, "legacy_acquire", [LEGACY]);
script!(LEGACY_RENEW, "legacy_renew", [LEGACY]);
script!(LEGACY_RELEASE, "legacy_release", [LEGACY]);

script!(FAIR_ACQUIRE, "fair_acquire", [MARK, EXPIRY, FAIR_QUEUE]);
script!(FAIR_HEARTBEAT, "fair_heartbeat", [MARK, EXPIRY, FAIR_QUEUE]);
script!(FAIR_RELEASE, "fair_release", [MARK, EXPIRY, FAIR_QUEUE]);
script!(FAIR_STATUS, "fair_status", [MARK, EXPIRY]);

script!(RW_READ, "rw_read", [EXPIRY]);
script!(RW_READ_EXTEND, "rw_read_extend", [EXPIRY]);
script!(RW_READ_RELEASE, "rw_read_release", [EXPIRY]);
script!(RW_WRITE, "rw_write", [MARK, FENCE, EXPIRY]);
script!(RW_WRITER_HEARTBEAT, "rw_writer_heartbeat", [EXPIRY]);
script!(RW_WRITE_RELEASE, "rw_write_release", [EXPIRY]);
script!(RW_DOWNGRADE, "rw_downgrade", [EXPIRY]);
script!(RW_STATUS, "rw_status", [FENCE, EXPIRY]);

script!(SEM_ACQUIRE, "sem_acquire", [MARK, EXPIRY, SEM_WAITERS]);
script!(SEM_EXTEND, "sem_extend", [EXPIRY]);
script!(SEM_RELEASE, "sem_release", [MARK, EXPIRY, SEM_WAITERS]);
script!(SEM_STATUS, "sem_status", [EXPIRY]);
script!(SEM_HANDOFF, "sem_handoff", [MARK, EXPIRY, SEM_WAITERS]);

script!(LIST_LOCK, "list_lock", [OWNER]);

script!(REDLOCK_ACQUIRE, "redlock_acquire");
script!(REDLOCK_RELEASE, "redlock_release");

script!(ELECTION_CAMPAIGN, "election_campaign", fenced);
script!(ELECTION_RENEW, "election_renew");
script!(ELECTION_RESIGN, "election_resign", [EXPIRY]);
script!(ELECTION_PROCLAIM, "election_proclaim", [EXPIRY]);
script!(ELECTION_STATUS, "election_status");

script!(MULTI_ACQUIRE, "multi_acquire", [MARK, MUTEX_ACQUIRE_STEP]);
script!(MULTI_EXTEND, "multi_extend", [MUTEX_EXTEND_STEP]);
script!(MULTI_RELEASE, "multi_release", [MARK, MUTEX_RELEASE_STEP]);

/// Every script, for preloading.
pub(crate) fn all() -> Vec<&'static LuaScript> {
    vec![
        &MUTEX_ACQUIRE,
        &MUTEX_EXTEND,
        &MUTEX_RELEASE,
        &MUTEX_STATUS,
        &MUTEX_HANDOFF,
        &LEASE_EXTEND,
        &CAS,
        &LEGACY_ACQUIRE,
        &LEGACY_RENEW,
        &LEGACY_RELEASE,
        &FAIR_ACQUIRE,
        &FAIR_HEARTBEAT,
        &FAIR_RELEASE,
        &FAIR_STATUS,
        &RW_READ,
        &RW_READ_EXTEND,
        &RW_READ_RELEASE,
        &RW_WRITE,
        &RW_WRITER_HEARTBEAT,
        &RW_WRITE_RELEASE,
        &RW_DOWNGRADE,
        &RW_STATUS,
        &SEM_ACQUIRE,
        &SEM_EXTEND,
        &SEM_RELEASE,
        &SEM_STATUS,
        &SEM_HANDOFF,
        &LIST_LOCK,
        &REDLOCK_ACQUIRE,
        &REDLOCK_RELEASE,
        &ELECTION_CAMPAIGN,
        &ELECTION_RENEW,
        &ELECTION_RESIGN,
        &ELECTION_PROCLAIM,
        &ELECTION_STATUS,
        &MULTI_ACQUIRE,
        &MULTI_EXTEND,
        &MULTI_RELEASE,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_from_keeps_keys_and_arguments() {
        let evalsha = MUTEX_EXTEND.evalsha(&["k", "{k}:meta"], &["tok", "60000"], Some(1500));
        let eval = MUTEX_EXTEND.eval_from(&evalsha);
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(args[0], b"EVAL");
        assert_eq!(args[1], MUTEX_EXTEND.code().as_bytes());
        let rest: Vec<&[u8]> = args[2..].iter().map(Vec::as_slice).collect();
        assert_eq!(rest, [&b"2"[..], b"k", b"{k}:meta", b"tok", b"60000", b"1500"]);
    }

    #[test]
    fn every_script_documents_its_interface() {
        for script in all() {
            let code = script.code();
            let body = code.split("local function next_fence").last().unwrap_or(code);
            assert!(
                code.contains(&format!("-- {}.lua:", script.name)),
                "{} header",
                script.name
            );
            assert!(code.contains("-- KEYS[1]"), "{} lists KEYS", script.name);
            assert!(code.contains("-- Reply:"), "{} lists replies", script.name);
            assert_eq!(script.sha.len(), 40);
            assert!(!body.is_empty());
        }
        assert!(
            MUTEX_ACQUIRE.code().starts_with("-- mark.lua")
                && FAIR_STATUS.code().starts_with("-- mark.lua")
                && RW_STATUS.code().starts_with("-- fence.lua"),
            "fencing scripts carry their prelude"
        );
        for script in [&*LEGACY_ACQUIRE, &*LEGACY_RENEW, &*LEGACY_RELEASE] {
            assert!(
                script.code().starts_with("-- legacy.lua"),
                "{} carries its prelude",
                script.name
            );
        }
    }
}
