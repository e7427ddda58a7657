//! What is checked: which lock, with which rules of the protocol in force, and within
//! which bounds.
//!
//! Time is counted in ticks. One tick stands for a slice of real time in which any
//! number of requests, replies and client steps may happen; the lease, the claim window
//! of a hand-over and the clock-drift margin are whole numbers of ticks. The ratios
//! cannot be those of the defaults (a 30 s lease, a 2 s claim, a 0.3 s margin), but the
//! orderings the protocol relies on are kept: margin < claim < lease < extended lease.
//!
//! Time itself is not bounded: the state holds only relative times (what is left of a
//! TTL, how old a request is), so a run may last any number of ticks. What bounds the
//! state space is the number of acquisitions and the budget of each kind of fault.

use std::fmt;

/// A tick count: the server's clock, a client's clock, a deadline.
pub type Time = u8;

/// A fencing token (or an election's term).
pub type Fence = u16;

/// How many names the server has keys for: the multi-lock's `x` and `y` (a lock of one
/// name uses `x`).
pub const NAMES: usize = 2;

/// The names, as traces show them.
pub const NAME: [char; NAMES] = ['x', 'y'];

/// Which lock is modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The plain mutex (`mutex/`, `mutex_*.lua`): fencing tokens, waiters registered for
    /// a hand-over by the release, the local hand-over (`mutex_handoff.lua`).
    Mutex,
    /// The semaphore (`semaphore/`, `sem_*.lua`) with `limit` permits, one per holder;
    /// the local hand-over (`sem_handoff.lua`).
    Semaphore { limit: u8 },
    /// Leader election (`election/`, `election_*.lua`): the leader's term is its fencing
    /// token.
    Election,
    /// The multi-lock (`multi/`, `multi_*.lua`) over the names `x` and `y`, which share
    /// a hash slot (one script takes both), mixed with plain mutexes of those names: the
    /// first client (`A`) takes the multi-lock, the second (`B`) the plain mutex of `x`,
    /// a third (`C`) the plain mutex of `y`.
    Multi,
}

/// What one client locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lock {
    /// One name's lock (the only lock of the mutex, the semaphore, the election: `x`).
    Name(usize),
    /// Every name, as one multi-lock.
    Multi,
}

impl Lock {
    /// Whether a holding of this lock holds name `n`.
    pub fn covers(self, n: usize) -> bool {
        match self {
            Lock::Name(m) => m == n,
            Lock::Multi => true,
        }
    }
}

impl Kind {
    /// How many holders may believe they hold at once.
    /// (For the multi-lock: per name.)
    pub fn holders(self) -> usize {
        match self {
            Kind::Semaphore { limit } => usize::from(limit),
            Kind::Mutex | Kind::Election | Kind::Multi => 1,
        }
    }

    /// What client `c` locks.
    pub fn lock_of(self, c: u8) -> Lock {
        match (self, c) {
            (Kind::Multi, 0) => Lock::Multi,
            (Kind::Multi, 2) => Lock::Name(1),
            _ => Lock::Name(0),
        }
    }

    /// Whether client `c` takes plain mutexes (which try a free lock with the pipeline
    /// first, and take hand-overs).
    pub fn plain_mutex(self, c: u8) -> bool {
        match self {
            Kind::Mutex => true,
            Kind::Multi => self.lock_of(c) != Lock::Multi,
            Kind::Semaphore { .. } | Kind::Election => false,
        }
    }

    /// Whether acquisitions get a fencing token (a term for the election).
    pub fn fenced(self) -> bool {
        !matches!(self, Kind::Semaphore { .. })
    }
}

/// Lengths of time, in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Timing {
    /// The lease (`LeaseOptions::ttl`).
    pub ttl: Time,
    /// The lease an explicit `extend(ttl)` asks for: longer than `ttl`.
    pub extend_ttl: Time,
    /// Subtracted from every `valid_until` (`engine/lease.rs`, `drift()`).
    pub drift_margin: Time,
    /// How far a client's clock may fall behind real time (the server's clock) over
    /// one lease: clocks run at different rates, within this bound. The model takes
    /// the worst case: every lease is believed this much longer, in real time, than
    /// its client computed (see [`crate::client`]).
    pub max_drift: Time,
    /// How long a lock handed to a waiter by a release holds before the waiter extends
    /// it (`mutex/mod.rs`, `grant_claim()`).
    pub claim: Time,
    /// How much of the claim window must be left for a waiter to rely on a hand-over
    /// without confirming it (`engine/acquire.rs`, `GRANT_MARGIN`).
    pub grant_margin: Time,
}

impl Timing {
    /// The timing every check uses: a lease of 4 ticks (5 when extended), a claim
    /// window of 3, a drift margin of 1 against a drift of up to 1.
    pub const fn standard() -> Self {
        Timing {
            ttl: 4,
            extend_ttl: 5,
            drift_margin: 1,
            max_drift: 1,
            claim: 3,
            grant_margin: 0,
        }
    }

    /// The longest lease any request asks for.
    pub fn max_ttl(&self) -> Time {
        self.ttl.max(self.extend_ttl)
    }

    /// The age past which the age of a request asking for a lease of `ttl` no longer
    /// matters: a lease confirmed by a request that old has run out.
    pub fn age(&self, age: Time, ttl: Time) -> Time {
        (age + 1).min(ttl)
    }

    /// The age past which a busy answer can no longer vouch for a hand-over: its claim
    /// window (and the drift) has passed.
    pub fn busy_cap(&self) -> Time {
        self.claim + self.max_drift
    }

    /// The age past which a lease's last confirmation no longer matters: its renewal is
    /// due (for a lease of either length).
    pub fn confirm_cap(&self) -> Time {
        let due = |ttl: Time| {
            let interval = ttl / 3;
            interval.max(1) - interval / 2
        };
        due(self.ttl).max(due(self.extend_ttl))
    }
}

/// How far the checker explores. Time is unbounded; the state space is finite because
/// each client makes a bounded number of acquisitions and every kind of fault has a
/// budget for the whole run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Acquisitions each client may start (a local hand-over counts as one; for a
    /// multi-lock client, each attempt, which takes a fresh token): the length of this
    /// list is the number of clients.
    pub acquisitions: Vec<u8>,
    /// Requests, replies or hand-over messages the network may lose.
    pub losses: u8,
    /// Requests a client may give up waiting for (it then retries, or gives up).
    pub timeouts: u8,
    /// Acquisitions that may give up waiting (`lock_timeout`).
    pub giveups: u8,
    /// Clients that may crash (stop for good; what they sent may still land).
    pub crashes: u8,
    /// Times the fencing counter key may expire (`mark.lua`: it lives one second).
    pub counter_losses: u8,
    /// Explicit `extend(extend_ttl)` calls over the run.
    pub extends: u8,
    /// Holders write to the fenced resource (once per holding, at any time while they
    /// have the guard). Without writes, fencing is still checked where tokens are
    /// issued.
    pub writes: bool,
}

impl Bounds {
    /// `acquisitions` per client, and no faults.
    pub fn acquisitions(acquisitions: &[u8]) -> Self {
        Bounds {
            acquisitions: acquisitions.to_vec(),
            losses: 0,
            timeouts: 0,
            giveups: 0,
            crashes: 0,
            counter_losses: 0,
            extends: 0,
            writes: false,
        }
    }
}

/// The rules of the protocol that a broken variant removes, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rules {
    /// Renewals and extends never shorten a lease on the server (`PEXPIRE … GT` in
    /// `mutex_extend.lua`), and a confirming reply only moves `valid_until` forward
    /// (`engine/lease.rs`, `LeaseState::confirm`). Without it: plain `PEXPIRE`, and the
    /// reply handled last wins — the extend-vs-renewal race.
    pub ordered_lease: bool,
    /// The lock is taken with its expiry in one step (`SET NX PX` in
    /// `mutex_acquire.lua`). Without it: `SET NX`, then `PEXPIRE` in a second request.
    pub atomic_acquire: bool,
    /// The release compares and deletes in one script (`mutex_release.lua`). Without it:
    /// `GET`, then the release in a second request if the value was ours.
    pub atomic_release: bool,
    /// `valid_until` is `sent + ttl - drift margin`. Without it: `sent + ttl`.
    pub drift_margin: bool,
    /// An acquire that finds the lock held by its own token says so (`mutex_acquire.lua`:
    /// "Ours already: a retry of a request whose reply was lost"). Without it: the
    /// attempt is told the lock is busy.
    pub idempotent_retry: bool,
    /// A hand-over is relied on without a round trip only if its fence is above the
    /// fencing mark of the waiter's last busy attempt (`engine/acquire.rs`, commit
    /// 353cd23). Without it: only the claim window's timing is checked.
    pub stale_grant_check: bool,
    /// A hand-over the waiter cannot rely on makes it try again at once, and the
    /// acquire script gives it a fresh fencing token (`engine/acquire.rs`, `on_grant`,
    /// commit 8da374b). Without it: the hand-over is confirmed by an extend, and the
    /// waiter holds with the hand-over's own token.
    pub retry_unreliable_grant: bool,
    /// The fencing mark is the counter only once a script started it (`mark.lua`,
    /// `fence_mark`, commit 8d1a808). Without it: a counter that the pipelined `INCR`
    /// made after it expired, reading a few units, is taken for the mark.
    pub started_mark: bool,
    /// Each attempt of a multi-lock acquisition has a fresh token (`multi/mod.rs`,
    /// `attempt`), so that a late give-back of one attempt never frees a later
    /// attempt's names. Without it: one token for every attempt of an acquisition.
    pub fresh_multi_token: bool,
}

impl Rules {
    /// The protocol as the code runs it.
    pub const REAL: Rules = Rules {
        ordered_lease: true,
        atomic_acquire: true,
        atomic_release: true,
        drift_margin: true,
        idempotent_retry: true,
        stale_grant_check: true,
        retry_unreliable_grant: true,
        started_mark: true,
        fresh_multi_token: true,
    };
}

/// The protocol as the code runs it, or with one rule removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    Real,
    /// Renewals and extends set the TTL outright and the client takes whichever reply
    /// it handles last: the extend-vs-renewal race.
    NoReplyOrdering,
    /// `SET NX`, then `PEXPIRE` as a second request.
    SetNxThenExpire,
    /// `GET`, then delete as a second request.
    GetThenDel,
    /// `valid_until` without the clock-drift margin.
    NoDriftMargin,
    /// A retried acquire that finds its own token is told the lock is busy.
    NoIdempotentRetry,
    /// A hand-over is taken on the claim window's timing alone (before commit 353cd23).
    NoStaleGrantCheck,
    /// A counter not started yet is taken for the fencing mark (before commit 8d1a808).
    UnstartedMark,
    /// A hand-over the waiter cannot rely on is confirmed by an extend and kept with its
    /// own fencing token (before commit 8da374b).
    ConfirmedGrantFence,
    /// A multi-lock acquisition uses one token for all its attempts.
    MultiOneToken,
}

impl Variant {
    /// Every broken variant.
    pub const BROKEN: [Variant; 9] = [
        Variant::NoReplyOrdering,
        Variant::SetNxThenExpire,
        Variant::GetThenDel,
        Variant::NoDriftMargin,
        Variant::NoIdempotentRetry,
        Variant::NoStaleGrantCheck,
        Variant::UnstartedMark,
        Variant::ConfirmedGrantFence,
        Variant::MultiOneToken,
    ];

    pub fn rules(self) -> Rules {
        let real = Rules::REAL;
        match self {
            Variant::Real => real,
            Variant::NoReplyOrdering => Rules {
                ordered_lease: false,
                ..real
            },
            Variant::SetNxThenExpire => Rules {
                atomic_acquire: false,
                ..real
            },
            Variant::GetThenDel => Rules {
                atomic_release: false,
                ..real
            },
            Variant::NoDriftMargin => Rules {
                drift_margin: false,
                ..real
            },
            Variant::NoIdempotentRetry => Rules {
                idempotent_retry: false,
                ..real
            },
            Variant::NoStaleGrantCheck => Rules {
                stale_grant_check: false,
                ..real
            },
            Variant::UnstartedMark => Rules {
                started_mark: false,
                ..real
            },
            Variant::ConfirmedGrantFence => Rules {
                retry_unreliable_grant: false,
                ..real
            },
            Variant::MultiOneToken => Rules {
                fresh_multi_token: false,
                ..real
            },
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Real => "the real protocol",
            Variant::NoReplyOrdering => {
                "renewals and extends without the ordering rule (the extend-vs-renewal race)"
            }
            Variant::SetNxThenExpire => "SET NX, then PEXPIRE as a second request",
            Variant::GetThenDel => "GET, then delete as a second request",
            Variant::NoDriftMargin => "valid_until without the clock-drift margin",
            Variant::NoIdempotentRetry => {
                "a retried acquire that finds its own token is told the lock is busy"
            }
            Variant::NoStaleGrantCheck => {
                "a hand-over taken on the claim window's timing alone (before 353cd23)"
            }
            Variant::UnstartedMark => "a fencing counter not started yet taken for the mark (before 8d1a808)",
            Variant::ConfirmedGrantFence => {
                "an unreliable hand-over confirmed by an extend, with its own fencing token (before 8da374b)"
            }
            Variant::MultiOneToken => "a multi-lock acquisition with one token for all its attempts",
        })
    }
}
