//! The model checked by stateright: the whole system's state, the steps that change it,
//! and the properties every reachable state must have.

use stateright::{Model, Property};

use crate::client::{Acquiring, Attempt, Client, Ended, Holding, Phase, ReleaseStep, margin};
use crate::config::{Bounds, Fence, Kind, Rules, Time, Timing, Variant};
use crate::net::{Msg, Reply, Req, Slot, Stage, Tok};
use crate::server::{Counter, Granted, Server};

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
    /// Renumber fencing tokens in every state (see [`canonical_fences`]); off only to
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

    fn margin(&self) -> Time {
        margin(&self.timing, self.rules.drift_margin)
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

/// The fenced resource: accepts a write whose fencing token is at least the highest it
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
    pub resource: Resource,
    /// An acquire was told the lock is busy while its own token held it.
    pub lied: bool,
    /// Rare outcomes reached (see [`Seen`]).
    pub seen: u8,
}

/// Rare outcomes, for the `sometimes` properties.
#[derive(Clone, Copy, Debug)]
pub struct Seen;

impl Seen {
    pub const GRANT_TAKEN: u8 = 1;
    pub const GRANT_CONFIRMED: u8 = 1 << 1;
    pub const GRANT_STALE: u8 = 1 << 2;
    pub const LOCAL_HANDOVER: u8 = 1 << 3;
    pub const OWN_TOKEN: u8 = 1 << 4;
    pub const WRITE_REFUSED: u8 = 1 << 5;
    pub const LEASE_LOST: u8 = 1 << 6;
}

impl State {
    /// How many clients believe they hold the lock now.
    pub fn believers(&self) -> usize {
        self.clients.iter().filter(|c| c.believes()).count()
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
        server.lock.is_some_and(|k| k.token == token)
            || server.permits.iter().any(|(p, _)| *p == token)
            || server.waiters.contains(&token)
            || match self.clients[usize::from(token.client)].phase {
                Phase::Acquiring(a) => a.token == token,
                Phase::HandingOver { new, .. } => new == token,
                _ => false,
            }
            || self.net.iter().any(|m| match m {
                Msg::Request {
                    req: Req::Acquire { token: t, .. } | Req::Pipeline { token: t, .. },
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
    /// The registration of waiter `token` lapses (its deadline passed without a new
    /// attempt).
    Lapse(Tok),
    /// Client `c` starts an acquisition (`Mutex::lock`); the first attempt goes out.
    Begin(u8),
    /// Another acquire attempt (after a wake-up, a hand-over found stale, or the
    /// fallback timer: any time in the model).
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
    /// Client `c` writes to the fenced resource with its guard's fencing token —
    /// whether its lease is still valid or not: a holder that checked its lease, then
    /// paused (or whose write was slow on the network), writes after its lease ended.
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
            resource: Resource::default(),
            lied: false,
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
                    if a.attempt.is_none() && a.confirm.is_none() {
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
                    if self.kind == Kind::Mutex && client.left > 0 {
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
        for &token in &s.server.waiters {
            actions.push(Action::Lapse(token));
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
                s.believers() <= m.kind.holders()
            }),
            Property::always(property::FENCING, |_, s: &State| {
                !s.resource.interleaved && !s.server.misissued
            }),
            Property::always(property::NO_ORPHAN, |m: &LockModel, s: &State| no_orphan(m, s)),
            Property::always(property::TRUTHFUL, |_, s: &State| !s.lied),
        ];
        if self.track {
            let seen = |name, bit: u8| -> Property<Self> {
                // Property conditions are plain functions: one per bit.
                let f: fn(&LockModel, &State) -> bool = match bit {
                    Seen::GRANT_TAKEN => |_, s| s.seen & Seen::GRANT_TAKEN != 0,
                    Seen::GRANT_CONFIRMED => |_, s| s.seen & Seen::GRANT_CONFIRMED != 0,
                    Seen::GRANT_STALE => |_, s| s.seen & Seen::GRANT_STALE != 0,
                    Seen::LOCAL_HANDOVER => |_, s| s.seen & Seen::LOCAL_HANDOVER != 0,
                    Seen::OWN_TOKEN => |_, s| s.seen & Seen::OWN_TOKEN != 0,
                    Seen::WRITE_REFUSED => |_, s| s.seen & Seen::WRITE_REFUSED != 0,
                    _ => |_, s| s.seen & Seen::LEASE_LOST != 0,
                };
                Property::sometimes(name, f)
            };
            // A semaphore finds its own token only when a reply was lost.
            if self.kind == Kind::Mutex || self.bounds.timeouts > 0 {
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
                ps.push(seen(
                    "a hand-over is confirmed by an extend",
                    Seen::GRANT_CONFIRMED,
                ));
                ps.push(seen("a stale hand-over is refused", Seen::GRANT_STALE));
                ps.push(seen("a local hand-over", Seen::LOCAL_HANDOVER));
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
    match s.server.lock {
        Some(key) if !s.token_alive(key.token) => key.expires.is_some_and(|e| e <= m.timing.max_ttl()),
        _ => true,
    }
}

impl LockModel {
    /// Canonical form, so that states that behave the same are one state: requests
    /// nobody waits for any more are sent-and-forgotten, and dropped once they can
    /// change nothing; replies nobody waits for and hand-overs nobody can take are
    /// dropped; the network is sorted.
    fn normalize(&self, s: &mut State) {
        for i in 0..s.net.len() {
            if let Msg::Request { from, slot, req, .. } = s.net[i]
                && slot != Slot::Background
                && !s.clients[usize::from(from)].awaits(slot, req.token())
            {
                s.net[i] = Msg::Request {
                    from,
                    slot: Slot::Background,
                    age: 0,
                    req,
                };
            }
        }
        // A request that acts only on a lock its token holds (an extend, a release, a
        // hand-over) and whose reply nobody reads changes nothing once its tokens can
        // never hold the lock again. Acquires, and the unconditional commands of the
        // broken variants, always stay.
        let inert: Vec<bool> = s
            .net
            .iter()
            .map(|m| match *m {
                Msg::Request {
                    slot: Slot::Background,
                    req,
                    ..
                } => match req {
                    Req::Get { .. } => true,
                    Req::Extend { token, .. } | Req::Release { token, .. } => !s.may_hold(token),
                    Req::HandOff { old, new } => !s.may_hold(old) && !s.may_hold(new),
                    Req::Pipeline { .. }
                    | Req::Acquire { .. }
                    | Req::ReleaseUnchecked { .. }
                    | Req::Expire { .. } => false,
                },
                _ => false,
            })
            .collect();
        let mut inert = inert.into_iter();
        s.net.retain(|_| !inert.next().expect("one per message"));
        let clients = &s.clients;
        s.net.retain(|m| match *m {
            Msg::Reply { to, slot, token, .. } => clients[usize::from(to)].awaits(slot, token),
            Msg::Grant { to, .. } => {
                matches!(clients[usize::from(to.client)].phase, Phase::Acquiring(a) if a.token == to)
            }
            Msg::Request { .. } => true,
        });
        s.net.sort();
        if self.canonical {
            canonical_fences(s);
        }
    }

    fn apply(&self, s: &mut State, action: Action) {
        let t = self.timing;
        match action {
            Action::Tick => self.tick(s),
            Action::Lapse(token) => s.server.waiters.retain(|&w| w != token),
            Action::Begin(c) => {
                let ci = usize::from(c);
                let token = s.clients[ci].fresh_token(c);
                s.clients[ci].phase = Phase::Acquiring(Acquiring::new(token));
                // The plain mutex tries a free lock without a script first.
                let first = if self.kind == Kind::Mutex {
                    Attempt::Pipeline
                } else {
                    Attempt::Script
                };
                self.send_attempt(s, ci, first);
            }
            Action::Attempt(c) => self.send_attempt(s, usize::from(c), Attempt::Script),
            Action::GiveUp(c) => {
                s.budget.giveups -= 1;
                let ci = usize::from(c);
                if let Phase::Acquiring(a) = s.clients[ci].phase
                    && a.tried
                {
                    // The claim's undo: give back a lock an attempt may have taken (or
                    // been handed), and leave the registration.
                    let req = Req::Release {
                        token: a.token,
                        leaving: true,
                    };
                    send(s, ci, Slot::Background, req);
                }
                s.clients[ci].phase = Phase::Idle;
            }
            Action::Deliver(i) => match s.net.remove(i) {
                Msg::Request { from, slot, age, req } => self.run(s, from, slot, age, req),
                Msg::Reply {
                    to, slot, age, reply, ..
                } => self.on_reply(s, usize::from(to), slot, age, reply),
                Msg::Grant { to, fence } => self.on_grant(s, to, fence),
            },
            Action::Lose(i) => {
                s.net.remove(i);
                s.budget.losses -= 1;
            }
            Action::Timeout(c, slot) => {
                s.budget.timeouts -= 1;
                // The call stops waiting: the request may still land, but its reply is
                // not read (nor one already on its way).
                for m in &mut s.net {
                    match *m {
                        Msg::Request {
                            from, slot: sl, req, ..
                        } if from == c && sl == slot => {
                            *m = Msg::Request {
                                from,
                                slot: Slot::Background,
                                age: 0,
                                req,
                            };
                        }
                        _ => {}
                    }
                }
                s.net
                    .retain(|m| !matches!(*m, Msg::Reply { to, slot: sl, .. } if to == c && sl == slot));
                self.timeout(s, usize::from(c), slot);
            }
            Action::Renew(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = &mut s.clients[ci].phase {
                    h.renew = Some(h.ttl);
                    let req = Req::Extend {
                        token: h.token,
                        ttl: h.ttl,
                    };
                    send(s, ci, Slot::Renew, req);
                }
            }
            Action::Extend(c) => {
                let ci = usize::from(c);
                s.budget.extends -= 1;
                if let Phase::Holding(h) = &mut s.clients[ci].phase {
                    h.extend = Some(t.extend_ttl);
                    let req = Req::Extend {
                        token: h.token,
                        ttl: t.extend_ttl,
                    };
                    send(s, ci, Slot::Extend, req);
                }
            }
            Action::Release(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = s.clients[ci].phase {
                    // `begin_release`: the lease ends for the holder now.
                    let (step, req) = if self.rules.atomic_release {
                        let req = Req::Release {
                            token: h.token,
                            leaving: false,
                        };
                        (ReleaseStep::Script, req)
                    } else {
                        (ReleaseStep::Get, Req::Get { token: h.token })
                    };
                    s.clients[ci].phase = Phase::Releasing { token: h.token, step };
                    send(s, ci, Slot::Release, req);
                }
            }
            Action::Drop(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = s.clients[ci].phase {
                    // `Drop for MutexGuard`: the lease ends, the release runs in the
                    // background, and the task is free at once.
                    s.clients[ci].phase = Phase::Idle;
                    let req = Req::Release {
                        token: h.token,
                        leaving: false,
                    };
                    send(s, ci, Slot::Background, req);
                }
            }
            Action::HandOver(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = s.clients[ci].phase {
                    // `Mutex::finish` → `hand_over`: the old task's lease ends (`take`),
                    // the waiting task's token gets the lock in one script.
                    let new = s.clients[ci].fresh_token(c);
                    s.clients[ci].phase = Phase::HandingOver { old: h.token, new };
                    send(s, ci, Slot::HandOff, Req::HandOff { old: h.token, new });
                }
            }
            Action::SendExpire(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = &mut s.clients[ci].phase {
                    h.expire_pending = false;
                    let req = Req::Expire { token: h.token };
                    send(s, ci, Slot::Background, req);
                }
            }
            Action::Write(c) => {
                let ci = usize::from(c);
                if let Phase::Holding(h) = &mut s.clients[ci].phase {
                    h.wrote = true;
                    let (fence, token) = (h.fence.expect("fenced"), h.token);
                    let r = &mut s.resource;
                    if r.highest.is_none_or(|h| fence >= h) {
                        if r.highest == Some(fence) && r.last != Some(token) {
                            r.interleaved = true;
                        }
                        r.highest = Some(fence);
                        r.last = Some(token);
                    } else {
                        self.note(s, Seen::WRITE_REFUSED);
                    }
                }
            }
            Action::Crash(c) => {
                s.budget.crashes -= 1;
                s.clients[usize::from(c)].phase = Phase::Crashed;
            }
            Action::LoseCounter => {
                s.budget.counter_losses -= 1;
                s.server.lose_counter();
            }
        }
    }

    /// A tick of real time: the server's clock and every client's advance.
    fn tick(&self, s: &mut State) {
        let t = self.timing;
        s.server.tick();
        for client in &mut s.clients {
            client.tick(&t);
        }
        // Requests and replies age by their client's clock, as far as it matters.
        let clients = &s.clients;
        for m in &mut s.net {
            match m {
                Msg::Request { slot, age, req, .. } if *slot != Slot::Background => {
                    *age = t.age(*age, req.ttl(&t));
                }
                Msg::Reply {
                    to, slot, age, reply, ..
                } => {
                    let cap = match reply {
                        // A busy answer vouches for a hand-over within the claim window.
                        Reply::Busy { .. } => t.busy_cap(),
                        Reply::Int(0) | Reply::Value(_) => 0,
                        _ if *slot == Slot::Release => 0,
                        _ => clients[usize::from(*to)].pending_ttl(*slot, &t),
                    };
                    *age = t.age(*age, cap);
                }
                _ => {}
            }
        }
    }

    fn note(&self, s: &mut State, bit: u8) {
        if self.track {
            s.seen |= bit;
        }
    }

    /// An acquire attempt of client `c`'s acquisition.
    fn send_attempt(&self, s: &mut State, c: usize, attempt: Attempt) {
        if let Phase::Acquiring(a) = &mut s.clients[c].phase {
            a.attempt = Some(attempt);
            a.tried = true;
            let req = match attempt {
                Attempt::Pipeline => Req::Pipeline {
                    token: a.token,
                    stage: Stage::Set,
                },
                Attempt::Script => Req::Acquire {
                    token: a.token,
                    leave: a.registered,
                },
            };
            send(s, c, Slot::Attempt, req);
        }
    }

    /// Runs `req` on `server`, in one atomic step: the script's reply, and a
    /// hand-over it published.
    pub fn execute(&self, server: &mut Server, req: Req) -> (Reply, Granted) {
        let (t, kind, rules) = (&self.timing, self.kind, &self.rules);
        match req {
            Req::Pipeline { token, stage } => {
                let taken = match stage {
                    Stage::Set => server.pipeline_set(rules, t, token),
                    Stage::Incr { taken } => taken,
                };
                let fence = server.pipeline_incr(token, taken);
                (Reply::Pipeline { taken, fence }, None)
            }
            Req::Acquire { token, leave } => (server.acquire(kind, rules, t, token, leave), None),
            Req::Extend { token, ttl } => (server.extend(kind, rules, token, ttl), None),
            Req::Release { token, leaving } => server.release(kind, t, token, leaving),
            Req::HandOff { old, new } => (server.handoff(t, old, new), None),
            Req::Get { .. } => (server.get(), None),
            Req::ReleaseUnchecked { .. } => server.release_unchecked(t),
            Req::Expire { .. } => {
                server.expire_key(t);
                (Reply::Int(1), None)
            }
        }
    }

    /// A request arrives at the server.
    fn run(&self, s: &mut State, from: u8, slot: Slot, age: Time, req: Req) {
        if let Req::Pipeline {
            token,
            stage: Stage::Set,
        } = req
            && !self.pipeline_back_to_back
        {
            // The SET runs now; the INCR stays on its way, behind it.
            let taken = s.server.pipeline_set(&self.rules, &self.timing, token);
            let stage = Stage::Incr { taken };
            let req = Req::Pipeline { token, stage };
            s.net.push(Msg::Request { from, slot, age, req });
            return;
        }
        let (reply, granted) = self.execute(&mut s.server, req);
        // PUBLISH reaches the waiter only if it listens (it subscribed after its first
        // busy attempt, and its acquisition is still under way).
        if let Some((waiter, fence)) = granted
            && matches!(
                s.clients[usize::from(waiter.client)].phase,
                Phase::Acquiring(a) if a.token == waiter && a.last_busy.is_some()
            )
        {
            s.net.push(Msg::Grant { to: waiter, fence });
        }
        // A release's verdict (released, or not held) is not modelled: the client only
        // learns that it was answered.
        let reply = match req {
            Req::Release { .. } | Req::ReleaseUnchecked { .. } => Reply::Int(1),
            _ => reply,
        };
        let token = req.token();
        if slot != Slot::Background && s.clients[usize::from(from)].awaits(slot, token) {
            s.net.push(Msg::Reply {
                to: from,
                slot,
                age,
                token,
                reply,
            });
        }
    }

    /// Client `c` handles the reply to its request sent `age` ticks ago.
    fn on_reply(&self, s: &mut State, c: usize, slot: Slot, age: Time, reply: Reply) {
        let t = self.timing;
        let m = self.margin();
        match (slot, s.clients[c].phase) {
            // `LockBase::acquire`: the reply to an attempt, read by `parse_acquire`.
            (Slot::Attempt, Phase::Acquiring(mut a)) => match reply {
                // `Mutex::acquire_free`.
                Reply::Pipeline {
                    taken: true,
                    fence: Some(fence),
                } => {
                    let h = Holding::new(a.token, Some(fence), age, t.ttl, t.ttl, &t, m);
                    self.hold(s, c, h);
                }
                Reply::Pipeline { .. } => {
                    // Held by someone else (or by us: a retried SET after a lost reply),
                    // or ours with a counter to seed: the acquire script answers.
                    a.attempt = None;
                    s.clients[c].phase = Phase::Acquiring(a);
                    self.send_attempt(s, c, Attempt::Script);
                }
                Reply::Acquired { fence, pttl } => {
                    if pttl.is_some() {
                        self.note(s, Seen::OWN_TOKEN);
                    }
                    // `{1, fence, pttl}` runs for what is left (`ms(pttl)`, the full
                    // TTL when the key has none); a bare fence for the full TTL.
                    let remaining = pttl.flatten().unwrap_or(t.ttl);
                    let mut h = Holding::new(a.token, fence, age, remaining, t.ttl, &t, m);
                    h.expire_pending = !self.rules.atomic_acquire;
                    self.hold(s, c, h);
                }
                Reply::Busy { mark, own } => {
                    s.lied |= own;
                    a.attempt = None;
                    a.registered |= self.kind == Kind::Mutex;
                    a.last_busy = Some((age.min(t.busy_cap()), mark));
                    s.clients[c].phase = Phase::Acquiring(a);
                }
                _ => unreachable!("acquire replies"),
            },
            // The extend that confirms a hand-over (`on_grant`).
            (Slot::Confirm, Phase::Acquiring(mut a)) => {
                let fence = a.confirm.expect("awaited");
                if reply == Reply::Int(1) {
                    self.note(s, Seen::GRANT_CONFIRMED);
                    let h = Holding::new(a.token, Some(fence), age, t.ttl, t.ttl, &t, m);
                    self.hold(s, c, h);
                } else {
                    // A stale grant: try again.
                    self.note(s, Seen::GRANT_STALE);
                    a.confirm = None;
                    s.clients[c].phase = Phase::Acquiring(a);
                }
            }
            // `renewer.rs`, `settle`.
            (Slot::Renew, Phase::Holding(mut h)) => {
                let ttl = h.renew.take().expect("awaited");
                if reply == Reply::Int(1) {
                    h.confirm(age, ttl, m, self.rules.ordered_lease, &t);
                } else {
                    h.end(Ended::Gone);
                }
                self.hold(s, c, h);
            }
            // `GuardCore::extend`.
            (Slot::Extend, Phase::Holding(mut h)) => {
                let ttl = h.extend.take().expect("awaited");
                if reply == Reply::Int(1) {
                    h.ttl = ttl;
                    h.confirm(age, ttl, m, self.rules.ordered_lease, &t);
                } else {
                    h.end(Ended::Gone);
                }
                self.hold(s, c, h);
            }
            // `LockBase::release`.
            (Slot::Release, Phase::Releasing { token, step }) => match step {
                ReleaseStep::Get if reply == Reply::Value(Some(token)) => {
                    s.clients[c].phase = Phase::Releasing {
                        token,
                        step: ReleaseStep::Del,
                    };
                    send(s, c, Slot::Release, Req::ReleaseUnchecked { token });
                }
                _ => s.clients[c].phase = Phase::Idle,
            },
            // `Mutex::hand_over`.
            (Slot::HandOff, Phase::HandingOver { new, .. }) => match reply {
                Reply::Acquired { fence, pttl } => {
                    self.note(s, Seen::LOCAL_HANDOVER);
                    let remaining = pttl.flatten().unwrap_or(t.ttl);
                    let h = Holding::new(new, fence, age, remaining, t.ttl, &t, m);
                    self.hold(s, c, h);
                }
                _ => {
                    // Our lease was already gone: the waiter gets the turn and
                    // competes in Redis with its own token.
                    s.clients[c].phase = Phase::Acquiring(Acquiring::new(new));
                    self.send_attempt(s, c, Attempt::Pipeline);
                }
            },
            _ => unreachable!("only awaited replies are in flight"),
        }
    }

    /// Client `c` holds `h` (ended already if it came too late to be relied on).
    fn hold(&self, s: &mut State, c: usize, h: Holding) {
        if matches!(h.ended, Some(Ended::Gone | Ended::Expired)) {
            self.note(s, Seen::LEASE_LOST);
        }
        s.clients[c].phase = Phase::Holding(h);
    }

    /// `engine/acquire.rs`, the `on_grant` of `LockBase::acquire`: a release handed the
    /// lock to this waiter with fencing token `fence`.
    fn on_grant(&self, s: &mut State, to: Tok, fence: Fence) {
        let t = self.timing;
        let m = self.margin();
        let c = usize::from(to.client);
        let Phase::Acquiring(mut a) = s.clients[c].phase else {
            unreachable!("consumable grants only");
        };
        let (busy, mark) = a.last_busy.expect("subscribed");
        // Made after the last busy attempt ran (its fence is above that attempt's
        // mark) — the variant before 353cd23 does not ask — and enough of the claim
        // window left to rely on it without a round trip.
        let after_busy = !self.rules.stale_grant_check || mark.is_some_and(|mark| fence > mark);
        let in_window = (t.claim + t.max_drift).saturating_sub(m) > busy + t.grant_margin;
        if after_busy && in_window {
            self.note(s, Seen::GRANT_TAKEN);
            // Held from no later than when that attempt was sent, for the claim window.
            let h = Holding::new(to, Some(fence), busy, t.claim, t.ttl, &t, m);
            self.hold(s, c, h);
            return;
        }
        // Confirm by extending, which fails unless the lock is ours now.
        a.confirm = Some(fence);
        s.clients[c].phase = Phase::Acquiring(a);
        send(
            s,
            c,
            Slot::Confirm,
            Req::Extend {
                token: to,
                ttl: t.ttl,
            },
        );
    }

    /// Client `c` stopped waiting for its request in `slot`: it sends it again, or
    /// gives it up.
    fn timeout(&self, s: &mut State, c: usize, slot: Slot) {
        match (slot, s.clients[c].phase) {
            // Retried with the same token: the retry is the same request.
            (Slot::Attempt, Phase::Acquiring(a)) => {
                self.send_attempt(s, c, a.attempt.expect("pending"));
            }
            (Slot::Confirm, Phase::Acquiring(a)) => {
                let req = Req::Extend {
                    token: a.token,
                    ttl: self.timing.ttl,
                };
                send(s, c, Slot::Confirm, req);
            }
            // The renewal task counts the renewal as unreachable and tries again.
            (Slot::Renew, Phase::Holding(mut h)) => {
                h.renew = None;
                s.clients[c].phase = Phase::Holding(h);
            }
            (Slot::Extend, Phase::Holding(h)) => {
                let ttl = h.extend.expect("pending");
                send(s, c, Slot::Extend, Req::Extend { token: h.token, ttl });
            }
            (Slot::Release, Phase::Releasing { token, step }) => {
                let req = match step {
                    ReleaseStep::Script => Req::Release {
                        token,
                        leaving: false,
                    },
                    ReleaseStep::Get => Req::Get { token },
                    ReleaseStep::Del => Req::ReleaseUnchecked { token },
                };
                send(s, c, Slot::Release, req);
            }
            // The hand-over failed (`Popped` dropped): our own token is released in
            // the background — a no-op if the hand-over landed — and the waiter gets
            // the turn, acquiring with its own token (which recognises a hand-over
            // that did land).
            (Slot::HandOff, Phase::HandingOver { old, new }) => {
                send(
                    s,
                    c,
                    Slot::Background,
                    Req::Release {
                        token: old,
                        leaving: false,
                    },
                );
                s.clients[c].phase = Phase::Acquiring(Acquiring::new(new));
                self.send_attempt(s, c, Attempt::Pipeline);
            }
            _ => unreachable!("only pending slots time out"),
        }
    }
}

/// Renumbers the fencing tokens in `s` to the smallest numbers in the same order, two
/// apart: every script only compares them, or issues one more than the counter (which
/// then lands between the counter and the next value above it, as it does in Redis,
/// where the floor is far above the counter). Runs that differ only by how many tokens
/// were issued on the way become one.
pub fn canonical_fences(s: &mut State) {
    let mut values = Vec::new();
    visit_fences(s, &mut |f| values.push(*f));
    values.sort_unstable();
    values.dedup();
    visit_fences(s, &mut |f| *f = canonical_fence(&values, *f));
}

/// What `fence` becomes when the state's fencing tokens are `values` (sorted).
fn canonical_fence(values: &[Fence], fence: Fence) -> Fence {
    let rank = values.binary_search(&fence).expect("a fence of the state") as Fence;
    2 * (rank + 1)
}

/// The message `m` of state `s` as it reads once `s` is renumbered.
pub fn canonical_msg(s: &State, m: &Msg) -> Msg {
    let mut copy = s.clone();
    let mut values = Vec::new();
    visit_fences(&mut copy, &mut |f| values.push(*f));
    values.sort_unstable();
    values.dedup();
    let mut m = *m;
    match &mut m {
        Msg::Grant { fence, .. } => *fence = canonical_fence(&values, *fence),
        Msg::Reply { reply, .. } => match reply {
            Reply::Acquired {
                fence: Some(fence), ..
            }
            | Reply::Pipeline {
                fence: Some(fence), ..
            } => *fence = canonical_fence(&values, *fence),
            Reply::Busy { mark: Some(mark), .. } => *mark = canonical_fence(&values, *mark),
            _ => {}
        },
        Msg::Request { .. } => {}
    }
    m
}

/// Calls `f` on every fencing token in the state.
fn visit_fences(s: &mut State, f: &mut impl FnMut(&mut Fence)) {
    let server = &mut s.server;
    if let Counter::Seeded(c) = &mut server.counter {
        f(c);
    }
    for v in [&mut server.floor, &mut s.resource.highest].into_iter().flatten() {
        f(v);
    }
    if let Some(key) = &mut server.lock
        && key.term > 0
    {
        f(&mut key.term);
    }
    if let Some((term, _)) = &mut server.last_term {
        f(term);
    }
    for client in &mut s.clients {
        match &mut client.phase {
            Phase::Acquiring(a) => {
                if let Some((_, Some(mark))) = &mut a.last_busy {
                    f(mark);
                }
                if let Some(fence) = &mut a.confirm {
                    f(fence);
                }
            }
            Phase::Holding(h) => {
                if let Some(fence) = &mut h.fence {
                    f(fence);
                }
            }
            _ => {}
        }
    }
    for m in &mut s.net {
        match m {
            Msg::Grant { fence, .. } => f(fence),
            Msg::Reply { reply, .. } => match reply {
                Reply::Acquired {
                    fence: Some(fence), ..
                }
                | Reply::Pipeline {
                    fence: Some(fence), ..
                } => f(fence),
                Reply::Busy { mark: Some(mark), .. } => f(mark),
                _ => {}
            },
            Msg::Request { .. } => {}
        }
    }
}

/// Client `c` sends `req` (its age counts from now).
fn send(s: &mut State, c: usize, slot: Slot, req: Req) {
    s.net.push(Msg::Request {
        from: c as u8,
        slot,
        age: 0,
        req,
    });
}
