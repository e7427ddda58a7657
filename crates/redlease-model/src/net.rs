//! Tokens, requests, replies and the network between the clients and Redis.
//!
//! The network is a bag: any message in flight may be delivered next, whatever was sent
//! before it (requests and replies are reordered across connections, and delayed for
//! any number of ticks), or lost while the run's loss budget lasts.

use std::fmt;

use crate::config::{Fence, NAMES, Time};

/// An acquisition's random token (`token.rs`): fresh for every acquisition, so it names
/// the client (`A`, `B`, ...) and the how-manieth acquisition of that client it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tok {
    pub client: u8,
    pub n: u8,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", client_name(self.client), self.n)
    }
}

/// `A`, `B`, `C`, ...
pub fn client_name(client: u8) -> char {
    char::from(b'A' + client)
}

/// A waiter registered on a name (`{<lock key>}:q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Waiter {
    /// `<id> <token>`: a plain mutex's (or a semaphore's) waiter, which a release may hand
    /// the lock to.
    Take(Tok),
    /// `<id>!`: a multi-lock's waiter, which a release only wakes (it needs every name at
    /// once). Its id is per acquisition, not per attempt; the model names it by the
    /// token of the acquisition's first attempt.
    Wake(Tok),
}

impl fmt::Display for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiter::Take(t) => write!(f, "{t}"),
            Waiter::Wake(t) => write!(f, "{t}!"),
        }
    }
}

/// A script call (or, in the broken variants, a plain command) sent to Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Req {
    /// The plain mutex's first attempt (`Mutex::acquire_free`): `SET key token NX PX
    /// ttl` and `INCR counter`, pipelined. Two commands that run in order, but not as
    /// one step: `Set` is the pipeline before its `SET` ran, `Incr` after (and whether
    /// the `SET` set).
    Pipeline { token: Tok, stage: Stage },
    /// `mutex_acquire.lua`, `sem_acquire.lua`, `election_campaign.lua`.
    Acquire { token: Tok },
    /// `mutex_extend.lua`, `sem_extend.lua`, `election_renew.lua`: renewals, explicit
    /// extends, and the confirmation of a hand-over.
    Extend { token: Tok, ttl: Time },
    /// `mutex_release.lua`, `sem_release.lua`, `election_resign.lua`. `leaving`: also
    /// leave this acquisition's waiter registration (the undo of a waiter that gives up).
    Release { token: Tok, leaving: bool },
    /// `mutex_handoff.lua` or `sem_handoff.lua`: from the local holder's token to a
    /// local waiter's.
    HandOff { old: Tok, new: Tok },
    /// `multi_acquire.lua` for an attempt's token, with the acquisition's registration
    /// `<id>!` (named by `reg`). (A multi-lock's extend and release are `Extend` and
    /// `Release`: `multi_extend.lua`, `multi_release.lua`.)
    MultiAcquire { token: Tok, reg: Tok },
    /// `multi_release.lua` with a fresh token that holds nothing, leaving registration
    /// `reg` on every name (`Registration::drop`, when an acquisition ends without
    /// every name).
    MultiLeave { reg: Tok },
    /// Broken variant, first step of a release: `GET`.
    Get { token: Tok },
    /// Broken variant, second step of a release: `mutex_release.lua` without its
    /// compare (the client compared with the `GET`).
    ReleaseUnchecked { token: Tok },
    /// Broken variant, second step of an acquire: `PEXPIRE key ttl`.
    Expire { token: Tok },
}

impl Req {
    /// The token whose request this is (a hand-over's: the old holder's).
    pub fn token(&self) -> Tok {
        match *self {
            Req::HandOff { old, .. } => old,
            Req::MultiAcquire { token, .. } => token,
            Req::MultiLeave { reg } => reg,
            Req::Pipeline { token, .. }
            | Req::Acquire { token, .. }
            | Req::Extend { token, .. }
            | Req::Release { token, .. }
            | Req::Get { token }
            | Req::ReleaseUnchecked { token }
            | Req::Expire { token } => token,
        }
    }

    /// The lease length a reply to this request can confirm: its age no longer matters
    /// past it (0: its age never matters).
    pub fn ttl(&self, t: &crate::config::Timing) -> Time {
        match *self {
            Req::Pipeline { .. } | Req::Acquire { .. } | Req::HandOff { .. } | Req::MultiAcquire { .. } => {
                t.ttl
            }
            Req::MultiLeave { .. } => 0,
            Req::Extend { ttl, .. } => ttl,
            Req::Release { .. } | Req::Get { .. } | Req::ReleaseUnchecked { .. } | Req::Expire { .. } => 0,
        }
    }

    /// The tokens this request carries: a key holding one of them may still be renewed
    /// or released by it.
    pub fn tokens(&self) -> [Option<Tok>; 2] {
        match *self {
            Req::HandOff { old, new } => [Some(old), Some(new)],
            Req::MultiLeave { .. } => [None, None],
            Req::MultiAcquire { token, .. }
            | Req::Pipeline { token, .. }
            | Req::Acquire { token, .. }
            | Req::Extend { token, .. }
            | Req::Release { token, .. }
            | Req::Get { token }
            | Req::ReleaseUnchecked { token }
            | Req::Expire { token } => [Some(token), None],
        }
    }
}

/// How far a pipeline got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Set,
    Incr { taken: bool },
}

/// What a script answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// The pipeline's replies: whether the `SET` set, and the `INCR`'s fencing token
    /// (`None`: the counter was not started yet — a few units).
    Pipeline { taken: bool, fence: Option<Fence> },
    /// Acquired (or handed over): `fence` / `1` for a lease of the full TTL, or
    /// `{1, fence, pttl}` — already ours, with `pttl` left (`None`: the key has no TTL).
    Acquired {
        fence: Option<Fence>,
        pttl: Option<Option<Time>>,
    },
    /// `multi_acquire.lua`'s `{1, fence_x, pttl_x, fence_y, pttl_y}`: every name is the
    /// token's, with these fencing tokens; `left`, the least of what is left of them
    /// (the full TTL for a name taken now).
    MultiAcquired { fences: [Fence; NAMES], left: Time },
    /// `{0, pttl, mark}`: held by someone else; `mark` is the slot's fencing mark (the
    /// mutex). `own` is not part of the reply: the checker notes that the lock was in
    /// fact held by the caller's own token. (`multi_acquire.lua`'s `{0, i, pttl_i, …}`:
    /// no mark.)
    Busy { mark: Option<Fence>, own: bool },
    /// An integer reply: extend `1`/`0`; release `1`/`0`/`-1`; a hand-over's `0`.
    Int(i8),
    /// Broken variant: the reply of `GET`.
    Value(Option<Tok>),
}

/// Which of a client's outstanding requests a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// An acquire attempt.
    Attempt,
    /// Broken variant (before 8da374b): the extend that confirms a hand-over.
    Confirm,
    /// The renewal task's renewal.
    Renew,
    /// An explicit `extend`.
    Extend,
    /// An explicit `release`.
    Release,
    /// A local hand-over.
    HandOff,
    /// Sent and not waited for: Drop's background release, the undo of an acquire
    /// given up, the second step of the SET NX variant.
    Background,
}

/// A message in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// From client `from`, sent `age` ticks ago by its clock (a request nobody waits
    /// for any more counts as old as can matter).
    Request {
        from: u8,
        slot: Slot,
        age: Time,
        req: Req,
    },
    /// To client `to`, answering its request for `token` sent `age` ticks ago.
    Reply {
        to: u8,
        slot: Slot,
        age: Time,
        token: Tok,
        reply: Reply,
    },
    /// `g <id> <fence> <claim>` published by a release that handed the lock to waiter
    /// `to` (one lease length in the model: the claim is the waiter's own).
    Grant { to: Tok, fence: Fence },
}
