//! A client process: the lease engine of `engine/` for one lock, as a state machine.
//!
//! A client runs one acquisition at a time (a local hand-over moves the holding from
//! one task's token to the next task's in one step, so at most one task of a client
//! holds at a time).
//!
//! Times are relative, so that states that differ only by when they happen are one
//! state: a lease's `valid_for` counts the ticks of real time left until the client's
//! clock reaches `valid_until`, and an age the ticks since something happened. An age
//! stops counting once it no longer makes a difference ([`Timing::age`]). The age of a
//! request in flight is kept on the request (see [`crate::net::Msg`]).
//!
//! Clock drift: a client computes `valid_until = sent + ttl - margin` on its own clock,
//! which may run slow by up to `max_drift` ticks over a lease. The model takes the worst
//! case for every lease: the client believes `max_drift` ticks longer, in real time,
//! than `ttl - margin` after sending. (A client whose clock is accurate believes less
//! long; every behaviour of it is one of the model's, or safer.) For the same reason a
//! hand-over's claim window counts as `max_drift` ticks longer when the waiter decides
//! whether to rely on it.

use crate::config::{Fence, NAMES, Time, Timing};
use crate::net::{Slot, Tok};

/// A fencing token per name (`None`: not held, or not fenced).
pub type Fences = [Option<Fence>; NAMES];

/// Fencing token `fence` for name `n` only.
pub fn fence_of(n: usize, fence: Option<Fence>) -> Fences {
    let mut fences = [None; NAMES];
    fences[n] = fence;
    fences
}

/// Why a lease ended (`engine/lease.rs`, `LostReason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ended {
    /// A renewal or extend found the token no longer holds the lock.
    Gone,
    /// `valid_until` passed unconfirmed.
    Expired,
    /// The holder released it, dropped its guard, or handed it over.
    Released,
}

/// Which kind of attempt is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// The plain mutex's pipeline for a free lock (`Mutex::acquire_free`).
    Pipeline,
    /// The acquire script (`LockBase::acquire`).
    Script,
}

/// An acquisition under way (`mutex/mod.rs`, `acquire_through_redis`;
/// `engine/acquire.rs`, `LockBase::acquire` and `acquire_loop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Acquiring {
    /// The token of the attempts (a multi-lock's: of the current attempt; each attempt
    /// has a fresh one).
    pub token: Tok,
    /// The acquisition's waiter id (`waiter_id()`): the token of its first attempt.
    pub id: Tok,
    /// The attempt in flight.
    pub attempt: Option<Attempt>,
    /// A multi-lock's attempt was sent since the last one that took every name, so
    /// some name may hold the registration (`Registration::groups`).
    pub registered: bool,
    /// Some attempt was sent: giving up arms the undo (`request.rs`, `Claim`).
    pub tried: bool,
    /// How long ago the last attempt that found the lock busy was sent, and the fencing mark it saw (`last_busy`). Also: the waiter has
    /// subscribed, so it hears hand-overs.
    pub last_busy: Option<(Time, Option<Fence>)>,
    /// Broken variant (before 8da374b): a hand-over with this fence is being confirmed
    /// by an extend.
    pub confirm: Option<Fence>,
}

impl Acquiring {
    pub fn new(token: Tok) -> Self {
        Acquiring {
            token,
            id: token,
            attempt: None,
            registered: false,
            tried: false,
            last_busy: None,
            confirm: None,
        }
    }
}

/// A held lease (`engine/lease.rs`, `LeaseState`, and the guard around it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holding {
    pub token: Tok,
    /// The fencing token of each name held (a lock of one name: at its index).
    pub fences: Fences,
    /// Ticks of real time until the client's clock reaches `valid_until` (0 once
    /// ended).
    pub valid_for: Time,
    /// Age of the latest confirming request: renewals are due after it.
    pub confirmed_age: Time,
    /// The lease length renewals ask for (an extend changes it).
    pub ttl: Time,
    pub ended: Option<Ended>,
    /// A renewal is in flight, for this lease length.
    pub renew: Option<Time>,
    /// An explicit extend is in flight, for this lease length.
    pub extend: Option<Time>,
    /// Broken variant: the `PEXPIRE` after `SET NX` is still to be sent.
    pub expire_pending: bool,
    /// This holding wrote to the fenced resource.
    pub wrote: bool,
}

impl Holding {
    /// `LeaseState::new`: a lease confirmed by a request sent `age` ticks ago whose
    /// reply said it has `remaining` left on the server: valid until `sent + remaining
    /// - margin` by the client's clock (plus the drift, in real time).
    pub fn new(
        token: Tok,
        fences: Fences,
        age: Time,
        remaining: Time,
        ttl: Time,
        t: &Timing,
        margin: Time,
    ) -> Self {
        let remaining = remaining.min(ttl);
        let mut h = Holding {
            token,
            fences,
            valid_for: (remaining + t.max_drift)
                .saturating_sub(margin)
                .saturating_sub(age),
            // A lease with less than its full TTL left is first renewed once a third of
            // what is left has passed: it counts as confirmed a third of the shortfall
            // earlier.
            confirmed_age: (age + (ttl - remaining) / 3).min(t.confirm_cap()),
            ttl,
            ended: None,
            renew: None,
            extend: None,
            expire_pending: false,
            wrote: false,
        };
        h.expire();
        h
    }

    /// Whether the holder may rely on the lease now (`Lease::is_held`).
    pub fn believes(&self) -> bool {
        self.ended.is_none() && self.valid_for > 0
    }

    /// Ends the lease; the first reason wins (`LeaseState::end`).
    pub fn end(&mut self, reason: Ended) {
        if self.ended.is_none() {
            self.ended = Some(reason);
        }
        // An ended lease stays ended and no reply changes it: forget what it was.
        self.valid_for = 0;
        self.confirmed_age = 0;
        self.renew = None;
        self.extend = None;
    }

    /// Marks the lease expired once `valid_until` is reached (`LeaseState::state`).
    fn expire(&mut self) {
        if self.valid_for == 0 {
            self.end(Ended::Expired);
        }
    }

    /// `LeaseState::confirm`: a request sent `age` ticks ago confirmed the lease for
    /// `ttl` more. `ordered`: only ever moves the lease forward (the variant without the
    /// ordering rule takes the reply handled last).
    pub fn confirm(&mut self, age: Time, ttl: Time, margin: Time, ordered: bool, t: &Timing) {
        if self.ended.is_some() {
            // A late confirmation does not revive an ended lease.
            return;
        }
        let until = (ttl + t.max_drift).saturating_sub(margin).saturating_sub(age);
        let age = age.min(t.confirm_cap());
        if ordered {
            self.valid_for = self.valid_for.max(until);
            self.confirmed_age = self.confirmed_age.min(age);
        } else {
            self.valid_for = until;
            self.confirmed_age = age;
        }
        self.expire();
    }

    /// Whether the renewal task would renew now (`renewer.rs`: due a third of the TTL
    /// after the last confirmation, renewed up to half an interval early to share a
    /// tick; at least one tick after it).
    pub fn renewal_due(&self) -> bool {
        let interval = self.ttl / 3;
        self.confirmed_age + interval / 2 >= interval.max(1)
    }

    /// A tick of the client's clock.
    fn tick(&mut self, t: &Timing) {
        self.valid_for = self.valid_for.saturating_sub(1);
        self.confirmed_age = (self.confirmed_age + 1).min(t.confirm_cap());
        self.expire();
    }
}

/// What a client is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Idle,
    Acquiring(Acquiring),
    Holding(Holding),
    /// An explicit `release()` awaiting its answer (`LockBase::release`); in the GET
    /// variant, `step` says which of its two requests is in flight.
    Releasing {
        token: Tok,
        step: ReleaseStep,
    },
    /// A local hand-over awaiting its answer (`Mutex::hand_over`): the old task's lease
    /// has ended; the new task holds once the script answers.
    HandingOver {
        old: Tok,
        new: Tok,
    },
    /// Stopped for good.
    Crashed,
}

/// Which request of a release is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseStep {
    /// `mutex_release.lua` (and the other primitives' release scripts).
    Script,
    /// Broken variant: the `GET`.
    Get,
    /// Broken variant: the delete after the `GET`.
    Del,
}

/// One client process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub phase: Phase,
    /// Acquisitions it may still start.
    pub left: u8,
    /// Tokens it has used (the next one is numbered `used + 1`).
    pub used: u8,
}

impl Client {
    pub fn new(acquisitions: u8) -> Self {
        Client {
            phase: Phase::Idle,
            left: acquisitions,
            used: 0,
        }
    }

    /// A fresh token for a new acquisition of client `me`.
    pub fn fresh_token(&mut self, me: u8) -> Tok {
        self.left -= 1;
        self.used += 1;
        Tok {
            client: me,
            n: self.used,
        }
    }

    /// Whether it believes it holds now.
    pub fn believes(&self) -> bool {
        matches!(self.phase, Phase::Holding(h) if h.believes())
    }

    /// Whether it waits for the reply to a request in `slot` for `token`.
    pub fn awaits(&self, slot: Slot, token: Tok) -> bool {
        match (slot, self.phase) {
            (Slot::Attempt, Phase::Acquiring(a)) => a.token == token && a.attempt.is_some(),
            (Slot::Confirm, Phase::Acquiring(a)) => a.token == token && a.confirm.is_some(),
            (Slot::Renew, Phase::Holding(h)) => h.token == token && h.renew.is_some(),
            (Slot::Extend, Phase::Holding(h)) => h.token == token && h.extend.is_some(),
            (Slot::Release, Phase::Releasing { token: t, .. }) => t == token,
            (Slot::HandOff, Phase::HandingOver { old, .. }) => old == token,
            _ => false,
        }
    }

    /// The lease length a reply to its request in `slot` confirms, while it waits for
    /// one (0 when there is none).
    pub fn pending_ttl(&self, slot: Slot, t: &Timing) -> Time {
        match (slot, self.phase) {
            (Slot::Renew, Phase::Holding(h)) => h.renew.unwrap_or(0),
            (Slot::Extend, Phase::Holding(h)) => h.extend.unwrap_or(0),
            (Slot::Attempt | Slot::Confirm | Slot::HandOff, _) => t.ttl,
            _ => 0,
        }
    }

    /// Whether it may still send a request carrying `token` (renew, release, retry).
    pub fn uses(&self, token: Tok) -> bool {
        match self.phase {
            Phase::Idle | Phase::Crashed => false,
            Phase::Acquiring(a) => a.token == token,
            Phase::Holding(h) => h.token == token,
            Phase::Releasing { token: t, .. } => t == token,
            Phase::HandingOver { old, new } => old == token || new == token,
        }
    }

    /// A tick of this client's clock.
    pub fn tick(&mut self, t: &Timing) {
        match &mut self.phase {
            Phase::Acquiring(a) => {
                if let Some((age, _)) = &mut a.last_busy {
                    *age = t.age(*age, t.busy_cap());
                }
            }
            Phase::Holding(h) => h.tick(t),
            Phase::Idle | Phase::Crashed | Phase::Releasing { .. } | Phase::HandingOver { .. } => {}
        }
    }
}

/// The drift margin in force.
pub fn margin(t: &Timing, with_margin: bool) -> Time {
    if with_margin { t.drift_margin } else { 0 }
}
