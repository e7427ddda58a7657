//! The faults a run injects, by name. Each phase of a run injects one of them over and
//! over (or all of them at random, in the `mixed` phase); `inject` in the coordinator
//! performs one event.

use std::fmt;

use redlease_testkit::Persistence;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The proxy holds Redis's replies past the clients' response timeout, then lets
    /// them through: requests land, their replies arrive late or never.
    ReplyDelay,
    /// The proxy cuts every client connection, usually with commands in flight.
    ConnReset,
    /// One lock holder stalls inside its critical section past its lease — its whole
    /// client (renewal task included) is blocked, as in a GC pause — then writes.
    ClientPause,
    /// A whole worker process is frozen with SIGSTOP past the lease, then SIGCONT.
    ProcessPause,
    /// The lock's redis-server is killed (SIGKILL) and restarted empty.
    ServerRestart,
    /// The same, with `appendonly yes` / `appendfsync always`: it comes back with every
    /// write it acknowledged.
    ServerRestartAof,
    /// The lock's redis-server is frozen with SIGSTOP, then SIGCONT.
    ServerPause,
    /// One worker process's wall clock jumps ahead or behind for a while. Only the
    /// legacy timestamp lock's algorithms run under it: old clients of that protocol
    /// compare stamps with their own clock; redlease reads Redis's.
    Clock,
    /// Holders call `extend` from inside their critical sections — several times, with
    /// TTLs longer and shorter than the current one, some left running while the
    /// section goes on — while automatic renewal runs; the proxy adds a few
    /// milliseconds of varying latency so that extends and renewals are in flight
    /// together. One section in eight then leans on its lease: its client frozen until
    /// just before the `valid_until` it was given, then it writes. Nothing is broken: no
    /// lease may be lost, no two holders may overlap.
    Extend,
    /// The lock server is a 3-master Redis Cluster, and the slots of the locks' keys
    /// keep migrating between masters (MIGRATING/IMPORTING, keys moved, `ASK`, then
    /// `SETSLOT NODE` and `MOVED`), pausing at each step while holders renew. No lease
    /// may be lost, no two holders may overlap.
    Cluster,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::ReplyDelay,
        Fault::ConnReset,
        Fault::ClientPause,
        Fault::ProcessPause,
        Fault::ServerRestart,
        Fault::ServerRestartAof,
        Fault::ServerPause,
        Fault::Clock,
        Fault::Extend,
        Fault::Cluster,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::ReplyDelay => "reply-delay",
            Fault::ConnReset => "conn-reset",
            Fault::ClientPause => "client-pause",
            Fault::ProcessPause => "process-pause",
            Fault::ServerRestart => "server-restart",
            Fault::ServerRestartAof => "server-restart-aof",
            Fault::ServerPause => "server-pause",
            Fault::Clock => "clock",
            Fault::Extend => "extend",
            Fault::Cluster => "cluster",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Fault::ReplyDelay => {
                "proxy holds replies 0.3-1.5 x TTL (past the response timeout), then releases them"
            }
            Fault::ConnReset => "proxy cuts every connection, commands in flight",
            Fault::ClientPause => {
                "a holder's thread (work, renewal, everything of its client) blocks 0.9-2.5 x TTL mid-section, then writes"
            }
            Fault::ProcessPause => "SIGSTOP a worker process 1.5-2.5 x TTL, then SIGCONT",
            Fault::ServerRestart => "SIGKILL redis-server, restart it empty",
            Fault::ServerRestartAof => "SIGKILL redis-server, restart it from its appendfsync-always AOF",
            Fault::ServerPause => "SIGSTOP redis-server 0.3-2 x TTL, then SIGCONT",
            Fault::Clock => {
                "a worker's wall clock runs 0.5-3 x TTL ahead or behind for 1-2 s (legacy timestamp locks only)"
            }
            Fault::Extend => {
                "holders extend(0.5-3 x TTL) 1-4 times per section, some racing renewal; 1 in 8 then leans on its lease; 0-15 ms proxy latency"
            }
            Fault::Cluster => {
                "3-master Redis Cluster; the locks' slots migrate between masters, pausing at each step (cluster-capable locks only)"
            }
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// How the lock server must persist for this fault.
    pub fn persistence(self) -> Persistence {
        match self {
            Fault::ServerRestartAof => Persistence::AofAlways,
            _ => Persistence::None,
        }
    }

    /// Whether an event of this fault can make Redis forget acknowledged writes (and
    /// so forget a held lock). Two holders are then possible; only fencing protects the
    /// resource, and the checker expects it to.
    pub fn loses_writes(self) -> bool {
        matches!(self, Fault::ServerRestart)
    }

    /// Whether an event of this fault can end a held lease (fire `lost()`): a holder
    /// stalled or frozen past it, Redis forgetting it or unreachable past it. Under
    /// `extend` and `cluster` nothing may: a `lost()` there is unexplained, a defect.
    pub fn explains_lost(self) -> bool {
        !matches!(self, Fault::Extend | Fault::Cluster)
    }

    /// Whether the `mixed` phase draws from it: not the faults that need a server of
    /// their own (`server-restart-aof`, `cluster`), apply to few algorithms (`clock`)
    /// or change what the clients do (`extend`).
    pub fn mixes(self) -> bool {
        self.persistence() == Persistence::None
            && !matches!(self, Fault::Clock | Fault::Extend | Fault::Cluster)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One injected event, on the run's shared clock.
#[derive(Clone, Debug)]
pub struct Event {
    pub fault: Fault,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The worker it targeted (client-pause, process-pause).
    pub worker: Option<usize>,
    /// What it did, where that is more than its fault (a migration: which slots, the
    /// times of its steps).
    pub note: String,
}
