//! The model checked by stateright: the whole system's state, the steps that change it,
//! and the properties every reachable state must have.

use stateright::{Model, Property};

use crate::client::{Client, Phase, margin};
use crate::config::{Bounds, Fence, Kind, Lock, NAMES, Rules, Time, Timing, Variant};
use crate::net::{Msg, Req, Slot, Tok, Waiter};
use crate::server::{Counter, Server};

/// One lock, its clients, and the network between them.
#[derive(Clone, Debug)]
pub struct LockModel {
    pub kind: Kind,
    pub variant: Variant,
    pub rules: Rules,
    pub timing: Timing,
    pub bounds: Bounds,
    /// Note rare outcomes in the state, so that `sometimes` properties can show the
    /// checker reached them (costs states).
    pub track: bool,
    /// Renumber fencing tokens in every state (see [`crate::canonical::canonical_fences`]); off only to
    /// replay a trace with the numbers Redis would issue.
    pub canonical: bool,
    /// The two commands of a pipeline run back to back (they reach Redis in one read,
    /// which Redis executes before serving another client). Off: another client's
    /// commands — and the lock's expiry — may come between them.
    pub pipeline_back_to_back: bool,
}

impl LockModel {
    /// `kind` under `variant`, within `bounds`.
    pub fn new(kind: Kind, variant: Variant, bounds: Bounds) -> Self {
        LockModel {
            kind,
            variant,
            rules: variant.rules(),
            timing: Timing::standard(),
            bounds,
            track: false,
            canonical: true,
            pipeline_back_to_back: true,
        }
    }

    pub fn tracking(mut self, track: bool) -> Self {
        self.track = track;
        self
    }

    pub(crate) fn margin(&self) -> Time {
        margin(&self.timing, self.rules.drift_margin)
    }

    /// What client `c` locks.
    pub fn lock_of(&self, c: u8) -> Lock {
        self.kind.lock_of(c)
    }
}

/// What may still go wrong in the rest of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    pub losses: u8,
    pub timeouts: u8,
    pub giveups: u8,
    pub crashes: u8,
    pub counter_losses: u8,
    pub extends: u8,
}

/// A fenced resource (one per name): accepts a write whose fencing token is at least the highest it
/// has seen (README: "have it refuse lower numbers").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resource {
    pub highest: Option<Fence>,
    /// Whose write it accepted last.
    pub last: Option<Tok>,
    /// It accepted a write of one holder after another holder's write with the same
    /// fencing token: two holders' writes interleaved.
    pub interleaved: bool,
}

/// The whole system at one instant of real time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub server: Server,
    pub clients: Vec<Client>,
    /// Messages in flight, sorted.
    pub net: Vec<Msg>,
    pub budget: Budget,
    /// The fenced resource of each name.
    pub resources: [Resource; NAMES],
    /// An acquire was told the lock is busy while its own token held it.
    pub lied: bool,
    /// A client came to believe it holds with a fencing token below one issued before
    /// it took the lock: its writes would be refused in favour of an earlier holder's.
    pub fence_behind: bool,
    /// Rare outcomes reached (see [`Seen`]).
    pub seen: u16,
}

/// Rare outcomes, for the `sometimes` properties.
#[derive(Clone, Copy, Debug)]
pub struct Seen;

impl Seen {
    pub const GRANT_TAKEN: u16 = 1;
    pub const GRANT_RETRIED: u16 = 1 << 1;
    pub const GRANT_STALE: u16 = 1 << 2;
    pub const LOCAL_HANDOVER: u16 = 1 << 3;
    pub const OWN_TOKEN: u16 = 1 << 4;
    pub const WRITE_REFUSED: u16 = 1 << 5;
    pub const LEASE_LOST: u16 = 1 << 6;
    /// A multi-lock attempt took every name too late to leave a lease, and gave them
    /// back.
    pub const MULTI_TOO_LATE: u16 = 1 << 7;
    /// A release found a multi-lock waiter first among a name's waiters: it deleted the
    /// name and woke the waiters, handing it to nobody.
    pub const MULTI_WOKEN: u16 = 1 << 8;
    /// A multi-lock's release handed a name to a plain mutex's waiter.
    pub const MULTI_HANDED: u16 = 1 << 9;
    /// A multi-lock acquisition took every name on a later attempt (after one found a
    /// name busy, or took them too late).
    pub const MULTI_AFTER_BUSY: u16 = 1 << 10;
}

impl State {
    /// How many clients believe they hold name `n` now.
    pub fn believers(&self, m: &LockModel, n: usize) -> usize {
        (0..self.clients.len())
            .filter(|&c| self.clients[c].believes() && m.lock_of(c as u8).covers(n))
            .count()
    }

    /// Whether more clients believe they hold some name than may.
    pub fn too_many_believe(&self, m: &LockModel) -> bool {
        (0..NAMES).any(|n| self.believers(m, n) > m.kind.holders())
    }

    /// Whether anyone may still send a request carrying `token`: its client, or a
    /// request already in flight.
    pub fn token_alive(&self, token: Tok) -> bool {
        self.clients[usize::from(token.client)].uses(token)
            || self.net.iter().any(|m| match m {
                Msg::Request { req, .. } => req.tokens().contains(&Some(token)),
                _ => false,
            })
    }

    /// Whether `token` holds the lock, or may come to hold it: an acquire for it is in
    /// flight or may still be sent, a release may hand it the lock, a local hand-over
    /// may move the lock to it.
    pub fn may_hold(&self, token: Tok) -> bool {
        let server = &self.server;
        server.names.iter().any(|name| {
            name.lock.is_some_and(|k| k.token == token) || name.waiters.contains(&Waiter::Take(token))
        }) || server.permits.iter().any(|(p, _)| *p == token)
            || match self.clients[usize::from(token.client)].phase {
                Phase::Acquiring(a) => a.token == token,
                Phase::HandingOver { new, .. } => new == token,
                _ => false,
            }
            || self.net.iter().any(|m| match m {
                Msg::Request {
                    req:
                        Req::Acquire { token: t, .. }
                        | Req::Pipeline { token: t, .. }
                        | Req::MultiAcquire { token: t, .. },
                    ..
                } => *t == token,
                Msg::Request {
                    req: Req::HandOff { new, .. },
                    ..
                } => *new == token,
                _ => false,
            })
    }
}

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A tick of real time: every clock advances.
    Tick,
    /// The registration of a waiter on name `n` lapses (its deadline passed without a
    /// new attempt).
    Lapse(u8, Waiter),
    /// Client `c` starts an acquisition (`Mutex::lock`, `MultiLock::lock`); the first
    /// attempt goes out.
    Begin(u8),
    /// Another acquire attempt (after a wake-up, a hand-over found stale, or the
    /// fallback timer: any time in the model). A multi-lock's takes a fresh token.
    Attempt(u8),
    /// The acquisition's deadline passes (`lock_timeout`): it ends, and an attempt that
    /// may have landed is undone in the background.
    GiveUp(u8),
    /// The message at this index in `net` arrives: a request runs on the server, a
    /// reply or a hand-over reaches its client.
    Deliver(usize),
    /// The message at this index in `net` is lost.
    Lose(usize),
    /// Client `c` stops waiting for the reply in `slot` (`request.rs`, `retrying`) and
    /// sends the request again — or gives it up.
    Timeout(u8, Slot),
    /// The renewal task renews client `c`'s lease.
    Renew(u8),
    /// Client `c` calls `extend(extend_ttl)`.
    Extend(u8),
    /// Client `c` calls `release()`.
    Release(u8),
    /// Client `c` drops its guard: released in the background.
    Drop(u8),
    /// Client `c` releases while another of its tasks waits: hand-over in one script.
    HandOver(u8),
    /// Broken variant: client `c` sends the `PEXPIRE` that follows its `SET NX`.
    SendExpire(u8),
    /// Client `c` writes to the fenced resource of each name it holds, with its guard's
    /// fencing token of that name — whether its lease is still valid or not: a holder
    /// that checked its lease, then paused (or whose write was slow on the network),
    /// writes after its lease ended.
    Write(u8),
    /// Client `c` crashes.
    Crash(u8),
    /// The fencing counter key expires.
    LoseCounter,
}

/// The properties, by name.
pub mod property {
    pub const MUTUAL_EXCLUSION: &str = "mutual exclusion of belief";
    pub const FENCING: &str = "fencing tokens rise with the holdings";
    pub const NO_ORPHAN: &str = "no orphan lock";
    pub const TRUTHFUL: &str = "a lost reply does not lie";
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        vec![State {
            server: Server::default(),
            clients: b.acquisitions.iter().map(|&n| Client::new(n)).collect(),
            net: Vec::new(),
            budget: Budget {
                losses: b.losses,
                timeouts: b.timeouts,
                giveups: b.giveups,
                crashes: b.crashes,
                counter_losses: b.counter_losses,
                extends: b.extends,
            },
            resources: Default::default(),
            lied: false,
            fence_behind: false,
            seen: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        for (i, client) in s.clients.iter().enumerate() {
            let c = i as u8;
            match client.phase {
                Phase::Idle => {
                    if client.left > 0 {
                        actions.push(Action::Begin(c));
                    }
                }
                Phase::Acquiring(a) => {
                    // A multi-lock's attempt takes a fresh token, within the client's
                    // bound (`Bounds::acquisitions`).
                    let fresh =
                        self.lock_of(c) != Lock::Multi || !self.rules.fresh_multi_token || client.left > 0;
                    if a.attempt.is_none() && a.confirm.is_none() && fresh {
                        actions.push(Action::Attempt(c));
                    }
                    if s.budget.giveups > 0 {
                        actions.push(Action::GiveUp(c));
                    }
                }
                Phase::Holding(h) => {
                    if h.ended.is_none() && h.renew.is_none() && h.renewal_due() {
                        actions.push(Action::Renew(c));
                    }
                    if h.ended.is_none() && h.extend.is_none() && s.budget.extends > 0 {
                        actions.push(Action::Extend(c));
                    }
                    if h.expire_pending {
                        actions.push(Action::SendExpire(c));
                    }
                    if self.bounds.writes && self.kind.fenced() && !h.wrote {
                        actions.push(Action::Write(c));
                    }
                    actions.push(Action::Release(c));
                    actions.push(Action::Drop(c));
                    if matches!(self.kind, Kind::Mutex | Kind::Semaphore { .. }) && client.left > 0 {
                        actions.push(Action::HandOver(c));
                    }
                }
                Phase::Releasing { .. } | Phase::HandingOver { .. } | Phase::Crashed => {}
            }
            if s.budget.timeouts > 0 {
                for slot in pending_slots(&client.phase) {
                    actions.push(Action::Timeout(c, slot));
                }
            }
            if s.budget.crashes > 0 && !matches!(client.phase, Phase::Idle | Phase::Crashed) {
                actions.push(Action::Crash(c));
            }
        }
        for (i, m) in s.net.iter().enumerate() {
            let deliverable = match *m {
                Msg::Grant { to, .. } => grant_consumable(s, to),
                _ => true,
            };
            if deliverable {
                actions.push(Action::Deliver(i));
            }
            if s.budget.losses > 0 {
                actions.push(Action::Lose(i));
            }
        }
        if s.budget.counter_losses > 0 && s.server.counter != Counter::Missing {
            actions.push(Action::LoseCounter);
        }
        for (n, name) in s.server.names.iter().enumerate() {
            for &waiter in &name.waiters {
                actions.push(Action::Lapse(n as u8, waiter));
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        self.apply(&mut s, action);
        self.normalize(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut ps = vec![
            Property::always(property::MUTUAL_EXCLUSION, |m: &LockModel, s: &State| {
                !s.too_many_believe(m)
            }),
            Property::always(property::FENCING, |_, s: &State| {
                !s.resources.iter().any(|r| r.interleaved)
                    && !s.server.names.iter().any(|n| n.misissued)
                    && !s.fence_behind
            }),
            Property::always(property::NO_ORPHAN, |m: &LockModel, s: &State| no_orphan(m, s)),
            Property::always(property::TRUTHFUL, |_, s: &State| !s.lied),
        ];
        if self.track {
            let seen = |name, bit: u16| -> Property<Self> {
                // Property conditions are plain functions: one per bit.
                let f: fn(&LockModel, &State) -> bool = match bit {
                    Seen::GRANT_TAKEN => |_, s| s.seen & Seen::GRANT_TAKEN != 0,
                    Seen::GRANT_RETRIED => |_, s| s.seen & Seen::GRANT_RETRIED != 0,
                    Seen::GRANT_STALE => |_, s| s.seen & Seen::GRANT_STALE != 0,
                    Seen::LOCAL_HANDOVER => |_, s| s.seen & Seen::LOCAL_HANDOVER != 0,
                    Seen::OWN_TOKEN => |_, s| s.seen & Seen::OWN_TOKEN != 0,
                    Seen::WRITE_REFUSED => |_, s| s.seen & Seen::WRITE_REFUSED != 0,
                    Seen::MULTI_TOO_LATE => |_, s| s.seen & Seen::MULTI_TOO_LATE != 0,
                    Seen::MULTI_WOKEN => |_, s| s.seen & Seen::MULTI_WOKEN != 0,
                    Seen::MULTI_HANDED => |_, s| s.seen & Seen::MULTI_HANDED != 0,
                    Seen::MULTI_AFTER_BUSY => |_, s| s.seen & Seen::MULTI_AFTER_BUSY != 0,
                    _ => |_, s| s.seen & Seen::LEASE_LOST != 0,
                };
                Property::sometimes(name, f)
            };
            // A semaphore finds its own token only when a reply was lost.
            if matches!(self.kind, Kind::Mutex | Kind::Multi) || self.bounds.timeouts > 0 {
                ps.push(seen("an acquire finds its own token", Seen::OWN_TOKEN));
            }
            ps.push(seen("a lease is lost", Seen::LEASE_LOST));
            if self.kind.fenced() && self.bounds.writes {
                ps.push(seen("a stale holder's write is refused", Seen::WRITE_REFUSED));
            }
            if self.kind == Kind::Mutex {
                ps.push(seen(
                    "a hand-over is taken without a round trip",
                    Seen::GRANT_TAKEN,
                ));
            }
            if self.kind == Kind::Mutex {
                ps.push(seen(
                    "a hand-over too late in its claim window is not relied on",
                    Seen::GRANT_RETRIED,
                ));
                ps.push(seen("a stale hand-over is not relied on", Seen::GRANT_STALE));
            }
            // The semaphore hands freed permits to registered waiters too. In its check
            // the first hand-over draws the first mark, so none is known before it: the
            // waiter tries again.
            if matches!(self.kind, Kind::Semaphore { .. }) {
                ps.push(seen(
                    "a hand-over not known to be current is not relied on",
                    Seen::GRANT_STALE,
                ));
            }
            // A local hand-over needs a client with a second acquisition.
            if matches!(self.kind, Kind::Mutex | Kind::Semaphore { .. })
                && self.bounds.acquisitions.iter().any(|&n| n > 1)
            {
                ps.push(seen("a local hand-over", Seen::LOCAL_HANDOVER));
            }
            if self.kind == Kind::Multi {
                ps.push(seen(
                    "a multi-lock acquisition takes every name on a later attempt",
                    Seen::MULTI_AFTER_BUSY,
                ));
                ps.push(seen(
                    "a release wakes a multi-lock waiter and hands the name to nobody",
                    Seen::MULTI_WOKEN,
                ));
                ps.push(seen(
                    "a multi-lock's release hands a name to a plain waiter",
                    Seen::MULTI_HANDED,
                ));
                ps.push(seen(
                    "a multi-lock attempt that took every name too late gives them back",
                    Seen::MULTI_TOO_LATE,
                ));
                ps.push(seen(
                    "a hand-over is taken without a round trip",
                    Seen::GRANT_TAKEN,
                ));
            }
        }
        ps
    }
}

/// The request slots with a request in flight that the client waits for.
fn pending_slots(phase: &Phase) -> Vec<Slot> {
    let mut slots = Vec::new();
    match phase {
        Phase::Acquiring(a) => {
            if a.attempt.is_some() {
                slots.push(Slot::Attempt);
            }
            if a.confirm.is_some() {
                slots.push(Slot::Confirm);
            }
        }
        Phase::Holding(h) => {
            if h.renew.is_some() {
                slots.push(Slot::Renew);
            }
            if h.extend.is_some() {
                slots.push(Slot::Extend);
            }
        }
        Phase::Releasing { .. } => slots.push(Slot::Release),
        Phase::HandingOver { .. } => slots.push(Slot::HandOff),
        Phase::Idle | Phase::Crashed => {}
    }
    slots
}

/// Whether a hand-over to `to` can be taken now: its acquisition is under way, has
/// subscribed (after its first busy attempt), and is between attempts (`acquire_loop`
/// looks at grants only while it waits).
fn grant_consumable(s: &State, to: Tok) -> bool {
    matches!(
        s.clients[usize::from(to.client)].phase,
        Phase::Acquiring(a) if a.token == to && a.attempt.is_none() && a.confirm.is_none() && a.last_busy.is_some()
    )
}

/// A key whose token nobody may still renew or release lives at most one (longest)
/// TTL: it has an expiry, no further than that from now. (Nothing can move the expiry
/// of such a key, so this holds for the rest of its life.)
fn no_orphan(m: &LockModel, s: &State) -> bool {
    s.server.names.iter().all(|name| match name.lock {
        Some(key) if !s.token_alive(key.token) => key.expires.is_some_and(|e| e <= m.timing.max_ttl()),
        _ => true,
    })
}
