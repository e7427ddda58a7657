//! The command line: every option, its help text and how its value is parsed.
//!
//! The doc comments below *are* the `--help` output, so they are written for the
//! person typing the command.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, ArgGroup, Args, Parser, Subcommand, ValueEnum};
use nix::sys::signal::Signal;

/// Where redlease looks for Redis when neither `--redis` nor `REDIS_URL` says otherwise.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

const EXIT_STATUS_HELP: &str = "\
Exit status:
    0        success (run, elect: CMD exited with 0)
    1..125   run, elect: CMD's own exit status
    128+N    run, elect: CMD died of signal N (redlease itself: interrupted by signal N while
             waiting, or ending `leader --watch`)
    1        release, extend: the token does not hold the lock (nothing was changed)
    2        usage error: unknown flag, bad duration, empty name, invalid URL
    69       Redis is unreachable or answered with an error
    73       man --dir: the pages could not be written
    75       the lock was not acquired (elect: the candidate was not elected) within --wait
             (or at once with --no-wait)
    79       run, elect: the lease was lost while CMD ran; CMD was sent --lost-signal
    126/127  run, elect: CMD could not be executed / was not found";

const RUN_HELP: &str = "\
CMD gets REDLEASE_NAME, REDLEASE_KEY and REDLEASE_FENCE (the fencing token: a number that \
rises with every acquisition of the lock; hand it to the resource you protect so it can \
refuse a stale holder). SIGINT, SIGTERM and SIGHUP sent to redlease are passed on to CMD \
(not twice when they come from the terminal, which signals CMD itself); the lock is \
released once CMD exits.

If the lease is lost while CMD runs (the key was deleted or taken over, or Redis could \
not be reached before the lease ran out), CMD gets --lost-signal, then SIGKILL after \
--grace, and redlease exits with status 79.

If redlease itself dies (SIGKILL, the OOM killer), CMD gets --lost-signal from the kernel \
at once (Linux only: elsewhere CMD keeps running); the lock lapses --ttl after the last \
renewal.

Exit status: CMD's own; 128+N if CMD died of signal N; 75 if the lock was not acquired; \
79 if the lease was lost while CMD ran; 69 if Redis is unreachable; 126/127 if CMD could \
not be run; 2 for usage errors.";

const ELECT_HELP: &str = "\
CMD gets REDLEASE_NAME, REDLEASE_KEY, and REDLEASE_TERM (also as REDLEASE_FENCE): the \
leader's term, a number that rises with every new leader. Hand it to the resources CMD \
changes so they can refuse a former leader. When CMD exits, redlease resigns and a \
waiting candidate leads within milliseconds; when a leader's redlease dies, another \
candidate leads once its lease (--ttl) runs out. SIGINT, SIGTERM and SIGHUP sent to \
redlease are passed on to CMD, as for `run`.

If leadership is lost while CMD runs (the lease could not be renewed, or the key was \
deleted), CMD gets --lost-signal, then SIGKILL after --grace, and redlease exits with \
status 79. If redlease itself dies (SIGKILL, the OOM killer), CMD gets --lost-signal \
from the kernel at once (Linux only: elsewhere CMD keeps running while another candidate \
takes over, and only the term can keep the two apart).

Exit status: CMD's own; 128+N if CMD died of signal N; 75 if this candidate was not \
elected within --wait; 79 if leadership was lost while CMD ran; 69 if Redis is \
unreachable; 126/127 if CMD could not be run; 2 for usage errors.";

/// Distributed locks on Redis: run a command under a lock or as the elected leader, or take,
/// inspect and release a lock.
///
/// Locks live at key <PREFIX><NAME> in the format redis-py, node-redlock and redsync use,
/// so those clients and redlease exclude each other. Every acquisition gets a fencing
/// token that rises strictly.
#[derive(Debug, Parser)]
#[command(name = "redlease", version, after_help = EXIT_STATUS_HELP)]
pub struct Cli {
    /// Redis to use: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss:// for TLS,
    /// redis+unix:///PATH for a socket. Give it several times with --cluster (nodes of the cluster)
    /// or --redlock (independent masters)
    #[arg(long, global = true, help_heading = "Global options", value_name = "URL", env = "REDIS_URL", hide_env_values = true, default_value = DEFAULT_URL, action = ArgAction::Append)]
    pub redis: Vec<String>,

    /// Key prefix: lock NAME lives at key <P><NAME>. May be empty (--prefix ''); like a
    /// NAME, at most 1024 bytes and no control characters
    #[arg(long, global = true, help_heading = "Global options", value_name = "P", default_value = redlease::DEFAULT_PREFIX, value_parser = prefix, allow_hyphen_values = true)]
    pub prefix: String,

    /// How long to wait for each Redis reply, 1ms to 30 days (a request that times out is
    /// retried for a few seconds before redlease gives up with status 69). There is no
    /// "no timeout": 0 is refused; a long timeout such as 30days comes closest. With
    /// --redlock it bounds each master's request (default there 200ms, at most a tenth
    /// of --ttl and 2s)
    #[arg(long, global = true, help_heading = "Global options", value_name = "DUR", default_value = "2s", value_parser = response_timeout, allow_hyphen_values = true)]
    pub response_timeout: Duration,

    #[command(flatten)]
    pub topology: TopologyArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Where the locks live, beyond one plain Redis.
#[derive(Debug, Clone, Default, Args)]
pub struct TopologyArgs {
    /// The --redis URLs are nodes of a Redis Cluster (any of them; the rest are discovered)
    #[arg(long, global = true, help_heading = "Topology and security", conflicts_with_all = ["redlock", "sentinel"])]
    pub cluster: bool,

    /// Redlock: the --redis URLs (at least 3) are independent masters; a lock is held
    /// while a majority holds it (no fencing token; `run` only)
    #[arg(
        long,
        global = true,
        help_heading = "Topology and security",
        conflicts_with = "sentinel"
    )]
    pub redlock: bool,

    /// Find the master through these sentinels (give it once per sentinel; needs --master)
    #[arg(long, global = true, help_heading = "Topology and security", value_name = "URL", action = ArgAction::Append, requires = "master")]
    pub sentinel: Vec<String>,

    /// The name the sentinels know the master by
    #[arg(
        long,
        global = true,
        help_heading = "Topology and security",
        value_name = "NAME",
        requires = "sentinel"
    )]
    pub master: Option<String>,

    /// Trust this CA certificate (PEM) for rediss:// instead of the system's roots
    #[arg(
        long,
        global = true,
        help_heading = "Topology and security",
        value_name = "FILE"
    )]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for servers with tls-auth-clients (needs --tls-key)
    #[arg(
        long,
        global = true,
        help_heading = "Topology and security",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM)
    #[arg(
        long,
        global = true,
        help_heading = "Topology and security",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// After each acquire (and extend) of a plain lock, wait until K replicas have the
    /// write (Redis WAIT); if fewer confirm within --replica-timeout, release and fail
    /// with status 69
    #[arg(long, global = true, help_heading = "Topology and security", value_name = "K", value_parser = whole::<u32>(1, u32::MAX as u64))]
    pub wait_replicas: Option<u32>,

    /// How long --wait-replicas waits for the replicas: at least 1ms, at most half the
    /// --ttl and shorter than --response-timeout
    #[arg(long, global = true, help_heading = "Topology and security", value_name = "DUR", default_value = "500ms", value_parser = replica_timeout, requires = "wait_replicas", allow_hyphen_values = true)]
    pub replica_timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run CMD while holding a lock, renewing its lease until CMD exits (like flock(1))
    ///
    /// With several NAMEs, holds all of them at once: each is the plain lock of that
    /// name, and they are taken all or none — never holding some while waiting for the
    /// others, so commands that list the same names in different orders cannot
    /// deadlock. CMD then gets REDLEASE_FENCE_1, REDLEASE_FENCE_2, … (the fencing token
    /// of each NAME, in the order given), REDLEASE_NAME_1, … and REDLEASE_KEY_1, …;
    /// REDLEASE_NAME and REDLEASE_KEY list the names and keys joined with '+', and
    /// REDLEASE_FENCE is not set (no single token fences several resources).
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),

    /// Take a lock and leave it held, without renewal, for --ttl; print its token
    ///
    /// Prints REDLEASE_TOKEN=…, REDLEASE_FENCE=… and REDLEASE_TTL_MS=… lines, ready for a
    /// shell's `eval`, or one JSON object with --json. The token releases the lock: keep
    /// it secret. Exit status 75 when the lock was not acquired.
    Acquire(AcquireArgs),

    /// Release a lock taken with `acquire`
    ///
    /// Exit status 1, changing nothing, when the token does not hold the lock.
    Release(ReleaseArgs),

    /// Make the lease of a lock taken with `acquire` last at least --ttl from now
    ///
    /// The lease is never shortened: with more than --ttl left, it is left as it is.
    /// Exit status 1, changing nothing, when the token does not hold the lock.
    Extend(ExtendArgs),

    /// Show who holds a lock, for how long, its fencing token and waiters (never its token)
    ///
    /// Exit status 0 whether or not the lock is held (see `held` in --json).
    Status(StatusArgs),

    /// List every held lock under the prefix, of every kind, whose name matches PATTERN
    ///
    /// Mutexes, fair mutexes, read-write locks, semaphores, elections and legacy locks,
    /// and locks other libraries hold in keys under the prefix (owner "(another
    /// library)"). Found with SCAN (never KEYS), on a cluster on every master; never
    /// shows a token. Exit status 0 whether or not anything is held.
    List(ListArgs),

    /// Run CMD while this process is the elected leader of NAME: one leader at a time
    ///
    /// Waits until this candidate leads, then runs CMD with REDLEASE_TERM; resigns when
    /// CMD exits, so a waiting candidate takes over at once. Exit statuses as for
    /// `redlease run`.
    #[command(
        after_help = ELECT_HELP,
        mut_arg("ttl", |a| a.help("Lease length, 10ms to 30 days: renewed every third of it while CMD runs; if redlease dies, another candidate may lead this long after the last renewal")),
        mut_arg("wait", |a| a.help("Give up (exit status 75) if this candidate does not lead within DUR [default: wait as long as it takes]. 0s tries once, like --no-wait; a DUR too long to represent waits without limit")),
        mut_arg("no_wait", |a| a.help("Give up at once (exit status 75) if another candidate leads")),
        mut_arg("lost_signal", |a| a.help("Signal sent to CMD when leadership is lost, or (Linux) when redlease itself dies (name or number)")),
    )]
    Elect(ElectArgs),

    /// Show who leads election NAME: its value, term, owner and lease (never its token)
    ///
    /// Exit status 0 whether or not someone leads (see `leader` in --json). With --watch,
    /// one line per change until interrupted (status 130 for Ctrl-C).
    Leader(LeaderArgs),

    /// A semaphore: run CMD holding one of N permits, or show its permits
    #[command(subcommand)]
    Semaphore(SemaphoreCommand),

    /// A read-write lock: run CMD as a reader or the writer, or show its holders
    #[command(subcommand)]
    Rwlock(RwlockCommand),

    /// Watch the lock at work: workers contend on one lock guarding a shared counter
    ///
    /// Without --redis (and REDIS_URL), and with nothing answering at the default address,
    /// starts a throwaway redis-server on a free loopback port and stops it at the end.
    /// Ends with a summary: acquisitions, handoffs/s, wait p50/p99, lost updates (must be
    /// 0) and whether fencing tokens rose monotonically. Exit status 1 if an update was
    /// lost or a fencing token went backwards.
    Demo(DemoArgs),

    /// Print a shell completion script
    ///
    /// For example: redlease completions bash > ~/.local/share/bash-completion/completions/redlease
    Completions {
        /// The shell to complete for
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },

    /// Print the man page (roff), or write one page per command into a directory
    ///
    /// For example: redlease man > ~/.local/share/man/man1/redlease.1, or
    /// redlease man --dir ~/.local/share/man/man1 for redlease.1, redlease-run.1, ...
    Man {
        /// Write redlease.1 and a page for every subcommand (redlease-run.1, ...) here
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// The NAME a command acts on: a positional argument, or `--name NAME` for a name that
/// starts with `-` (which would otherwise be read as an option).
#[derive(Debug, Clone, Args)]
#[group(id = "lock_name", required = true, multiple = false)]
pub struct NameArg {
    /// The name; the key is <PREFIX><NAME>. At most 1024 bytes, no control characters;
    /// a key with a '}' needs a complete '{hash tag}'. A NAME that starts with '-' goes
    /// in --name
    #[arg(value_name = "NAME", value_parser = name)]
    positional: Option<String>,

    /// The name, as an option: for a NAME that starts with '-' (--name -dash or
    /// --name=-dash)
    #[arg(long = "name", value_name = "NAME", value_parser = name, allow_hyphen_values = true)]
    option: Option<String>,
}

impl NameArg {
    /// The name, however it was given.
    pub fn get(&self) -> &str {
        self.positional
            .as_deref()
            .or(self.option.as_deref())
            .unwrap_or_default()
    }
}

/// The NAMEs `run` holds: positional arguments, and `--name NAME` (repeatable) for names
/// that start with `-`.
#[derive(Debug, Clone, Args)]
#[group(id = "lock_names", required = true, multiple = true)]
pub struct NamesArg {
    /// The lock's name; the key is <PREFIX><NAME>. Give several to hold them all. At most
    /// 1024 bytes, no control characters; a key with a '}' needs a complete '{hash
    /// tag}'. A NAME that starts with '-' goes in --name
    #[arg(value_name = "NAME", value_parser = name, num_args = 1..)]
    positional: Vec<String>,

    /// A name, as an option: for a NAME that starts with '-' (--name -dash or
    /// --name=-dash); may be given several times
    #[arg(long = "name", value_name = "NAME", value_parser = name, allow_hyphen_values = true, action = ArgAction::Append)]
    option: Vec<String>,
}

impl NamesArg {
    /// Every name, positional ones first, in the order given.
    pub fn all(&self) -> Vec<String> {
        self.positional.iter().chain(&self.option).cloned().collect()
    }
}

/// How long to wait for a held lock.
#[derive(Debug, Clone, Copy, Args)]
pub struct WaitArgs {
    /// Give up (exit status 75) if the lock is not acquired within DUR [default: wait as
    /// long as it takes]. 0s tries once, like --no-wait; a DUR too long to represent
    /// (such as 1000000000000years) waits without limit, as if --wait were left out
    #[arg(long, value_name = "DUR", value_parser = wait_limit, conflicts_with = "no_wait", allow_hyphen_values = true)]
    pub wait: Option<Duration>,

    /// Give up at once (exit status 75) if the lock is held
    #[arg(long)]
    pub no_wait: bool,
}

/// What every `run` shares: the lease, the wait, and CMD's supervision.
#[derive(Debug, Args)]
pub struct ChildArgs {
    /// Lease length, 10ms to 30 days: renewed every third of it while CMD runs; if
    /// redlease dies, the lock frees itself this long after the last renewal
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = ttl, allow_hyphen_values = true)]
    pub ttl: Duration,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Signal sent to CMD when the lease is lost, or (Linux) when redlease itself dies
    /// (name or number)
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = signal)]
    pub lost_signal: Signal,

    /// How long CMD may take to exit after --lost-signal before it gets SIGKILL (at most
    /// 30 days)
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = grace, allow_hyphen_values = true)]
    pub grace: Duration,

    /// The command to run, and its arguments (after `--`)
    #[arg(value_name = "CMD", required = true, last = true)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub names: NamesArg,

    /// Take the lock in arrival order (a FIFO queue across all clients)
    #[arg(long, conflicts_with = "legacy")]
    pub fair: bool,

    /// Interop with old clients that lock with `SETNX key <unix time + timeout + 1>` and
    /// take over stale locks with GETSET. Weaker: no fencing token (REDLEASE_FENCE is
    /// not set), and old clients' clocks must agree. --ttl is the timeout written
    #[arg(long)]
    pub legacy: bool,

    /// The unit of the timestamp a --legacy lock stores
    #[arg(long, value_name = "UNIT", default_value = "s", requires = "legacy")]
    pub legacy_unit: LegacyUnit,

    #[command(flatten)]
    pub child: ChildArgs,
}

/// The unit of a legacy lock's timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LegacyUnit {
    /// Unix seconds (what `SETNX lock.foo <unix time + timeout + 1>` clients store)
    S,
    /// Unix milliseconds
    Ms,
}

#[derive(Debug, Subcommand)]
pub enum SemaphoreCommand {
    /// Run CMD while holding permits of semaphore NAME (at most --permits holders at once)
    ///
    /// CMD gets REDLEASE_NAME, REDLEASE_KEY and REDLEASE_PERMITS (how many it holds); a
    /// semaphore has no fencing token. Exit statuses as for `redlease run`.
    #[command(after_help = RUN_HELP)]
    Run(SemaphoreRunArgs),

    /// Show the permits of semaphore NAME: the limit, how many are in use, waiters
    Status(SemaphoreStatusArgs),
}

#[derive(Debug, Args)]
pub struct SemaphoreRunArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// How many permits the semaphore has; every user of NAME must pass the same number
    #[arg(long, value_name = "N", value_parser = whole::<u32>(1, redlease::MAX_PERMITS as u64))]
    pub permits: u32,

    /// How many permits this command takes (all at once or none)
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = whole::<u32>(1, redlease::MAX_PERMITS_PER_ACQUIRE as u64))]
    pub count: u32,

    #[command(flatten)]
    pub child: ChildArgs,
}

#[derive(Debug, Args)]
pub struct SemaphoreStatusArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// The limit to report when no permit is held (while permits are held, the stored
    /// limit is shown)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = whole::<u32>(1, redlease::MAX_PERMITS as u64))]
    pub permits: u32,

    /// Print one JSON object: name, key, limit, in_use, available, next_lapse_ms, waiters
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum RwlockCommand {
    /// Run CMD as a reader (shared) or the writer (exclusive) of read-write lock NAME
    ///
    /// Writer-preferring: a waiting writer keeps new readers out. The writer's CMD gets
    /// REDLEASE_FENCE; readers get none. Exit statuses as for `redlease run`.
    #[command(after_help = RUN_HELP)]
    Run(RwlockRunArgs),

    /// Show the readers, the writer and the waiting writers of read-write lock NAME
    Status(RwlockStatusArgs),
}

#[derive(Debug, Args)]
pub struct RwlockStatusArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// Print one JSON object: name, key, write_held, writer, ttl_ms, fence, last_fence,
    /// since_ms, readers, waiting_writers
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["read", "write"])))]
pub struct RwlockRunArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// Take a read (shared) share
    #[arg(long)]
    pub read: bool,

    /// Take the write (exclusive) lock
    #[arg(long)]
    pub write: bool,

    #[command(flatten)]
    pub child: ChildArgs,
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// Lease length, 10ms to 30 days: the lock frees itself this long after it was
    /// taken (or extended)
    #[arg(long, value_name = "DUR", value_parser = ttl, allow_hyphen_values = true)]
    pub ttl: Duration,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Print one JSON object: name, key, token, fence, ttl_ms, owner
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// The token `acquire` printed
    #[arg(long, value_name = "T", env = "REDLEASE_TOKEN", hide_env_values = true, value_parser = token)]
    pub token: redlease::Token,
}

#[derive(Debug, Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// The token `acquire` printed
    #[arg(long, value_name = "T", env = "REDLEASE_TOKEN", hide_env_values = true, value_parser = token)]
    pub token: redlease::Token,

    /// The lease lasts at least this long from now (10ms to 30 days); it is never
    /// shortened
    #[arg(long, value_name = "DUR", value_parser = ttl, allow_hyphen_values = true)]
    pub ttl: Duration,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// The value this candidate publishes while it leads, such as its address (shown by
    /// `redlease leader NAME`; at most 64 KiB) [default: empty]
    #[arg(long, value_name = "V", default_value = "", hide_default_value = true)]
    pub value: String,

    #[command(flatten)]
    pub child: ChildArgs,
}

#[derive(Debug, Args)]
pub struct LeaderArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// Print one JSON object: name, key, leader (whether someone leads), value, term,
    /// owner, ttl_ms, since_ms. With --watch, one per line, with event (elected,
    /// proclaimed or vacant), resigned (for a vacancy) and at_ms
    #[arg(long)]
    pub json: bool,

    /// Print the leader, then one line per change — each new term, each new value,
    /// each vacancy — until interrupted
    #[arg(long)]
    pub watch: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only locks whose NAME matches this glob: * any characters, ? one, [abc] one of,
    /// [^a] not, \ escapes (quote it from the shell: 'job-*')
    #[arg(value_name = "PATTERN", default_value = "*")]
    pub pattern: String,

    /// Print one JSON array of objects: kind (mutex, fair mutex, rwlock, semaphore,
    /// election, legacy), name, key, held, owner (null when unknown), foreign (another
    /// library holds it), ttl_ms, fence (null where none), waiters, holders
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub name: NameArg,

    /// Print one JSON object: name, key, held, owner, ttl_ms, fence, last_fence,
    /// since_ms, waiters (with --fair: waiters is the queue length, and queue lists the
    /// waiters' owner labels in serving order), and held_as when another kind of lock
    /// (rwlock, fair mutex, ...) uses the name
    #[arg(long)]
    pub json: bool,

    /// A lock taken with `run --fair`: also show its queue, in serving order
    #[arg(long)]
    pub fair: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many workers contend for the lock (each with its own connections, like a
    /// separate process)
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = whole::<u16>(1, 256))]
    pub workers: u16,

    /// How long the workers run (at most 30 days)
    #[arg(long, value_name = "DUR", default_value = "8s", value_parser = demo_duration, allow_hyphen_values = true)]
    pub duration: Duration,
}

/// The longest `--grace`, `--duration` and `--response-timeout`: the longest lease.
pub const LONGEST: Duration = redlease::MAX_TTL;

/// The shortest `--response-timeout`.
pub const SHORTEST_RESPONSE_TIMEOUT: Duration = Duration::from_millis(1);

/// The shortest `--replica-timeout` (Redis's `WAIT 0` would block forever).
pub const SHORTEST_REPLICA_TIMEOUT: Duration = Duration::from_millis(1);

/// How far beyond a `--wait` deadline instants must still be representable: timers
/// round deadlines up (tokio by up to a millisecond).
const DEADLINE_HEADROOM: Duration = Duration::from_secs(24 * 3600);

/// Why `s` is not a human duration (`500ms`, `30s`, `2m`, `1h 30m`).
fn explain(e: &humantime::DurationError) -> String {
    format!("{e} (write durations like 500ms, 30s, 2m or 1h30m)")
}

/// Refuses what starts with `-`: a negative duration, or an option taken for the value
/// (duration options accept values that start with `-` so that they can say so).
fn not_negative(s: &str) -> Result<(), String> {
    match s.trim_start().strip_prefix('-') {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') => {
            Err("durations cannot be negative".into())
        }
        Some(_) => Err("expected a duration such as 30s, not an option (give this option a value)".into()),
        None => Ok(()),
    }
}

/// A duration between `min` and `max`; anything else is refused with the range.
fn bounded(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    not_negative(s)?;
    let range = format!("the allowed range is {} to {}", show(min), show(max));
    let d = match humantime::parse_duration(s.trim()) {
        Err(humantime::DurationError::NumberOverflow) if too_long(s) => {
            return Err(format!("too long to represent; {range}"));
        }
        parsed => parsed.map_err(|e| explain(&e))?,
    };
    if d < min {
        return Err(format!("must be at least {}; {range}", show(min)));
    }
    if d > max {
        return Err(format!("must be at most {}; {range}", show(max)));
    }
    Ok(d)
}

/// Whether `s`, which humantime refused as too large or too precise, is too large: it
/// still is without its fractions (`0.5ns` is only too precise).
fn too_long(s: &str) -> bool {
    let mut whole = String::with_capacity(s.len());
    let mut in_fraction = false;
    for c in s.trim().chars() {
        match c {
            '.' => in_fraction = true,
            '0'..='9' if in_fraction => {} // a digit of the fraction: dropped
            _ => {
                in_fraction = false;
                whole.push(c);
            }
        }
    }
    matches!(
        humantime::parse_duration(&whole),
        Err(humantime::DurationError::NumberOverflow)
    )
}

/// A bound for messages: `0s`, `10ms`, `30 days`.
fn show(d: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    if d.subsec_nanos() == 0 && d.as_secs() >= DAY && d.as_secs() % DAY == 0 {
        format!("{} days", d.as_secs() / DAY)
    } else if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// `--ttl`: a lease length the library accepts.
fn ttl(s: &str) -> Result<Duration, String> {
    bounded(s, redlease::MIN_TTL, redlease::MAX_TTL)
}

/// `--wait`: a human duration; one too long to represent is `Duration::MAX`, which
/// waits without limit (see [`WaitArgs::how`]).
fn wait_limit(s: &str) -> Result<Duration, String> {
    not_negative(s)?;
    match humantime::parse_duration(s.trim()) {
        Err(humantime::DurationError::NumberOverflow) if too_long(s) => Ok(Duration::MAX),
        parsed => parsed.map_err(|e| explain(&e)),
    }
}

fn grace(s: &str) -> Result<Duration, String> {
    bounded(s, Duration::ZERO, LONGEST)
}

fn demo_duration(s: &str) -> Result<Duration, String> {
    bounded(s, Duration::ZERO, LONGEST)
}

/// A whole number from `lo` to `hi`, refused in words ("a whole number from 1 to 256")
/// rather than as a Rust range.
fn whole<T>(lo: u64, hi: u64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64>,
{
    move |s| {
        s.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| {
                if hi == u64::from(u32::MAX) {
                    format!("must be a whole number, at least {lo}")
                } else {
                    format!("must be a whole number from {lo} to {hi}")
                }
            })
    }
}

/// `--response-timeout`: at least 1ms — a zero timeout would fail every request.
fn response_timeout(s: &str) -> Result<Duration, String> {
    bounded(s, SHORTEST_RESPONSE_TIMEOUT, LONGEST)
}

/// `--replica-timeout`: at most half the longest lease (the library also checks it
/// against the lease and the reply timeout in use).
fn replica_timeout(s: &str) -> Result<Duration, String> {
    bounded(s, SHORTEST_REPLICA_TIMEOUT, redlease::MAX_TTL / 2)
}

/// A lock name: not empty, not too long, no control characters. (Names whose key
/// would break its cluster slot are refused later, by the library, with status 2.)
fn name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the lock name must not be empty".into());
    }
    key_part(s, "the lock name")
}

/// `--prefix`: the rules of a name, except that it may be empty.
fn prefix(s: &str) -> Result<String, String> {
    key_part(s, "the prefix")
}

/// What names and the prefix share: at most `MAX_NAME_LEN` bytes, no control characters.
fn key_part(s: &str, what: &str) -> Result<String, String> {
    if s.len() > redlease::MAX_NAME_LEN {
        return Err(format!(
            "{what} is {} bytes long; at most {} are allowed",
            s.len(),
            redlease::MAX_NAME_LEN
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(format!("{what} contains control characters"));
    }
    Ok(s.to_owned())
}

fn token(s: &str) -> Result<redlease::Token, String> {
    redlease::Token::from_secret(s)
        .ok_or_else(|| "a token is 1 to 512 bytes long; pass the one `acquire` printed".into())
}

/// A signal by name (`TERM`, `SIGTERM`, `term`) or number (`15`).
fn signal(s: &str) -> Result<Signal, String> {
    let bad = || format!("unknown signal {s:?} (use a name such as TERM, INT, HUP, USR1, or a number)");
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = s.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    full.parse::<Signal>().map_err(|_| bad())
}

/// How an acquire waits, from `--wait` / `--no-wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Now,
    Within(Duration),
    Forever,
}

impl WaitArgs {
    /// How to wait: `--wait 0s` is one attempt, as `--no-wait` (a zero deadline would
    /// cut off the attempt's request); a `--wait` whose deadline is too far ahead to be
    /// represented (with some headroom) waits without limit.
    pub fn how(&self) -> How {
        match (self.no_wait, self.wait) {
            (true, _) => How::Now,
            (false, Some(limit)) if limit.is_zero() => How::Now,
            (false, Some(limit)) if representable(limit) => How::Within(limit),
            (false, _) => How::Forever,
        }
    }

    /// A description of the wait, for messages.
    pub fn describe(&self) -> String {
        match (self.no_wait, self.wait) {
            (true, _) => "at once (--no-wait)".into(),
            (false, Some(d)) if representable(d) => {
                format!("within {} (--wait)", humantime::format_duration(d))
            }
            (false, _) => "while waiting".into(),
        }
    }
}

/// Whether a deadline `d` from now, and a day beyond it, are representable instants.
fn representable(d: Duration) -> bool {
    std::time::Instant::now()
        .checked_add(d)
        .and_then(|t| t.checked_add(DEADLINE_HEADROOM))
        .is_some()
}

/// The exit status documented for a signal death: 128 + N.
pub fn signal_status(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::exit;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_are_human() {
        assert_eq!(grace("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(grace("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(grace("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(grace("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(grace("30").unwrap_err().contains("30s"));
        assert!(grace("soon").is_err());
        assert!(ttl("5ms").unwrap_err().contains("10ms"));
        assert!(ttl("31days").unwrap_err().contains("30 days"));
        assert_eq!(ttl("10ms").unwrap(), Duration::from_millis(10));
    }

    #[test]
    fn counts_are_refused_in_words() {
        let workers = whole::<u16>(1, 256);
        assert_eq!(workers("8"), Ok(8));
        assert_eq!(workers("0").unwrap_err(), "must be a whole number from 1 to 256");
        assert_eq!(
            workers("257").unwrap_err(),
            "must be a whole number from 1 to 256"
        );
        assert_eq!(workers("-1").unwrap_err(), "must be a whole number from 1 to 256");
        let replicas = whole::<u32>(1, u32::MAX as u64);
        assert_eq!(replicas("0").unwrap_err(), "must be a whole number, at least 1");
        assert_eq!(replicas("4294967295"), Ok(u32::MAX));
    }

    #[test]
    fn absurd_durations_are_refused_with_the_range() {
        for huge in [
            "300000000000years",
            "584942417355years",
            "99999999999999999999999s",
        ] {
            for parse in [ttl, grace, demo_duration, response_timeout] {
                let e = parse(huge).unwrap_err();
                assert!(e.contains("to 30 days"), "{huge}: {e}");
            }
            assert!(replica_timeout(huge).unwrap_err().contains("1ms to 15 days"));
        }
        assert!(replica_timeout("0s").unwrap_err().contains("at least 1ms"));
        assert!(grace("31days").unwrap_err().contains("at most 30 days"));
        assert_eq!(grace("0s").unwrap(), Duration::ZERO);
        assert_eq!(response_timeout("30days").unwrap(), LONGEST);
        assert!(
            grace("0.5ns").unwrap_err().contains("500ms"),
            "too precise, not too long"
        );
        assert!(grace("soon").unwrap_err().contains("30s"));
    }

    #[test]
    fn a_wait_too_long_to_represent_waits_without_limit() {
        let how = |limit: &str| {
            WaitArgs {
                wait: Some(wait_limit(limit).unwrap()),
                no_wait: false,
            }
            .how()
        };
        assert_eq!(how("10s"), How::Within(Duration::from_secs(10)));
        assert_eq!(how("0s"), How::Now, "one attempt, not a deadline already passed");
        assert_eq!(
            how("300years"),
            How::Within(Duration::from_secs(300 * 31_557_600))
        );
        for huge in [
            "300000000000years",
            "584942417355years",
            "99999999999999999999999s",
        ] {
            assert_eq!(how(huge), How::Forever, "{huge}");
        }
        assert_eq!(wait_limit("584942417355.5years").unwrap(), Duration::MAX);
        assert!(wait_limit("0.5ns").is_err(), "too precise is not too long");
        assert!(wait_limit("soon").is_err());
        let forever = WaitArgs {
            wait: Some(Duration::MAX),
            no_wait: false,
        };
        assert_eq!(forever.describe(), "while waiting");
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(signal("sigint").unwrap(), Signal::SIGINT);
        assert_eq!(signal("hup").unwrap(), Signal::SIGHUP);
        assert_eq!(signal("9").unwrap(), Signal::SIGKILL);
        assert!(signal("NOPE").is_err());
        assert!(signal("0").is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(name("").is_err());
        assert!(name("a\nb").is_err());
        assert!(name(&"x".repeat(redlease::MAX_NAME_LEN + 1)).is_err());
        assert_eq!(name("deploy").unwrap(), "deploy");
    }

    #[test]
    fn run_needs_the_double_dash() {
        let ok = Cli::try_parse_from(["redlease", "run", "x", "--", "echo", "-n", "hi"]).unwrap();
        let Command::Run(run) = ok.command else {
            panic!("not run")
        };
        assert_eq!(run.child.command, ["echo", "-n", "hi"]);
        assert_eq!(run.child.ttl, Duration::from_secs(30));
        assert!(Cli::try_parse_from(["redlease", "run", "x", "echo"]).is_err());
        assert!(Cli::try_parse_from(["redlease", "run", "x", "--"]).is_err());
        assert!(
            Cli::try_parse_from(["redlease", "run", "x", "--wait", "1s", "--no-wait", "--", "true"]).is_err()
        );
    }

    #[test]
    fn help_lists_every_exit_status() {
        for status in [
            exit::NOT_HELD,
            exit::USAGE,
            exit::UNAVAILABLE,
            exit::NOT_ACQUIRED,
            exit::LEASE_LOST,
        ] {
            assert!(
                EXIT_STATUS_HELP.contains(&format!("\n    {status} ")),
                "status {status} missing from the exit status help"
            );
        }
        assert!(RUN_HELP.contains(&format!("status {}", exit::LEASE_LOST)));
        assert!(ELECT_HELP.contains(&format!("status {}", exit::LEASE_LOST)));
    }

    #[test]
    fn global_options_go_before_or_after_the_subcommand() {
        for args in [
            &["redlease", "--redis", "redis://h:1", "demo"][..],
            &["redlease", "demo", "--redis", "redis://h:1"],
        ] {
            let matches = Cli::command().try_get_matches_from(args).unwrap();
            assert_eq!(
                matches.value_source("redis"),
                Some(clap::parser::ValueSource::CommandLine),
                "{args:?}"
            );
            let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
            assert_eq!(cli.redis, ["redis://h:1"]);
        }
    }

    #[test]
    fn empty_prefix_is_allowed() {
        let cli = Cli::try_parse_from(["redlease", "--prefix", "", "status", "x"]).unwrap();
        assert_eq!(cli.prefix, "");
    }
}
