//! The steps: what each action does to the state — the scripts run on the server, the
//! clients' lease engine handles replies, time passes.

use crate::client::{Acquiring, Attempt, Ended, Holding, Phase, ReleaseStep, fence_of};
use crate::config::{Fence, Kind, Lock, Time};
use crate::model::{Action, LockModel, Seen, State};
use crate::net::{Msg, Reply, Req, Slot, Stage, Tok, Waiter};
use crate::server::{Granted, Server};

impl LockModel {
    pub(crate) fn apply(&self, s: &mut State, action: Action) {
        let t = self.timing;
        match action {
            Action::Tick => self.tick(s),
            Action::Lapse(n, waiter) => s.server.names[usize::from(n)].waiters.retain(|&w| w != waiter),
            Action::Begin(c) => {
                let ci = usize::from(c);
                let token = s.clients[ci].fresh_token(c);
                s.clients[ci].phase = Phase::Acquiring(Acquiring::new(token));
                self.send_attempt(s, ci, self.first_attempt(c));
            }
            Action::Attempt(c) => {
                let ci = usize::from(c);
                if self.lock_of(c) == Lock::Multi && self.rules.fresh_multi_token {
                    // `MultiLock::attempt`: a fresh token per attempt.
                    let token = s.clients[ci].fresh_token(c);
                    if let Phase::Acquiring(a) = &mut s.clients[ci].phase {
                        a.token = token;
                    }
                }
                self.send_attempt(s, ci, Attempt::Script);
            }
            Action::GiveUp(c) => {
                s.budget.giveups -= 1;
                let ci = usize::from(c);
                if let Phase::Acquiring(a) = s.clients[ci].phase
                    && self.lock_of(c) == Lock::Multi
                {
                    // The attempt's claim gives back what an attempt in flight may
                    // take; `Registration::drop` leaves the registration, with a fresh
                    // token.
                    if a.attempt.is_some() {
                        let req = Req::Release {
                            token: a.token,
                            leaving: false,
                        };
                        send(s, ci, Slot::Background, req);
                    }
                    if a.registered {
                        send(s, ci, Slot::Background, Req::MultiLeave { reg: a.id });
                    }
                } else if let Phase::Acquiring(a) = s.clients[ci].phase
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
                    let (fences, token) = (h.fences, h.token);
                    // The resource of each name held, with that name's fencing token.
                    for (r, fence) in s.resources.iter_mut().zip(fences) {
                        let Some(fence) = fence else { continue };
                        if r.highest.is_none_or(|h| fence >= h) {
                            if r.highest == Some(fence) && r.last != Some(token) {
                                r.interleaved = true;
                            }
                            r.highest = Some(fence);
                            r.last = Some(token);
                        } else if self.track {
                            s.seen |= Seen::WRITE_REFUSED;
                        }
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

    fn note(&self, s: &mut State, bit: u16) {
        if self.track {
            s.seen |= bit;
        }
    }

    /// An acquire attempt of client `c`'s acquisition.
    /// The first attempt of an acquisition: the plain mutex tries a free lock without a
    /// script first.
    fn first_attempt(&self, c: u8) -> Attempt {
        if self.kind.plain_mutex(c) {
            Attempt::Pipeline
        } else {
            Attempt::Script
        }
    }

    fn send_attempt(&self, s: &mut State, c: usize, attempt: Attempt) {
        if let Phase::Acquiring(a) = &mut s.clients[c].phase {
            a.attempt = Some(attempt);
            a.tried = true;
            let multi = self.lock_of(c as u8) == Lock::Multi;
            let req = match attempt {
                Attempt::Pipeline => Req::Pipeline {
                    token: a.token,
                    stage: Stage::Set,
                },
                // From now on a name may hold the registration.
                Attempt::Script if multi => {
                    a.registered = true;
                    Req::MultiAcquire {
                        token: a.token,
                        reg: a.id,
                    }
                }
                Attempt::Script => Req::Acquire { token: a.token },
            };
            send(s, c, Slot::Attempt, req);
        }
    }

    /// Runs `req` on `server`, in one atomic step: the script's reply, and a
    /// hand-over it published.
    pub fn execute(&self, server: &mut Server, req: Req) -> (Reply, Granted) {
        let (t, kind, rules) = (&self.timing, self.kind, &self.rules);
        // The script a call runs depends on the lock its client takes.
        let lock = self.lock_of(req.token().client);
        let name = match lock {
            Lock::Name(n) => n,
            Lock::Multi => 0,
        };
        match req {
            Req::Pipeline { token, stage } => {
                let taken = match stage {
                    Stage::Set => server.pipeline_set(name, rules, t, token),
                    Stage::Incr { taken } => taken,
                };
                let fence = server.pipeline_incr(name, token, taken);
                (Reply::Pipeline { taken, fence }, Vec::new())
            }
            Req::Acquire { token } => server.acquire(kind, lock, rules, t, token),
            Req::MultiAcquire { token, reg } => (server.multi_acquire(rules, t, token, reg), Vec::new()),
            Req::Extend { token, ttl } => (server.extend(kind, lock, rules, token, ttl), Vec::new()),
            Req::Release { token, leaving } => server.release(kind, lock, t, token, leaving),
            Req::MultiLeave { reg } => {
                // A fresh token: holds nothing, so only the registration goes.
                let fresh = Tok {
                    client: reg.client,
                    n: 0,
                };
                server.multi_release(t, fresh, Some(reg))
            }
            Req::HandOff { old, new } => (server.handoff(kind, t, old, new), Vec::new()),
            Req::Get { .. } => (server.get(), Vec::new()),
            Req::ReleaseUnchecked { .. } => server.release_unchecked(t),
            Req::Expire { .. } => {
                server.expire_key(t);
                (Reply::Int(1), Vec::new())
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
            let Lock::Name(n) = self.lock_of(from) else {
                unreachable!("only a plain mutex sends the pipeline")
            };
            let taken = s.server.pipeline_set(n, &self.rules, &self.timing, token);
            let stage = Stage::Incr { taken };
            let req = Req::Pipeline { token, stage };
            s.net.push(Msg::Request { from, slot, age, req });
            return;
        }
        if self.track
            && let Req::Release { token, .. } = req
        {
            // A release of a name whose first waiter a release may only wake.
            let woken = s.server.names.iter().any(|name| {
                name.lock.is_some_and(|k| k.token == token)
                    && matches!(name.waiters.first(), Some(Waiter::Wake(_)))
            });
            if woken {
                s.seen |= Seen::MULTI_WOKEN;
            }
        }
        let (reply, granted) = self.execute(&mut s.server, req);
        if self.track && !granted.is_empty() && self.lock_of(from) == Lock::Multi {
            s.seen |= Seen::MULTI_HANDED;
        }
        // PUBLISH reaches the waiter only if it listens (it subscribed after its first
        // busy attempt, and its acquisition is still under way).
        for (waiter, fence) in granted {
            if matches!(
                s.clients[usize::from(waiter.client)].phase,
                Phase::Acquiring(a) if a.token == waiter && a.last_busy.is_some()
            ) {
                s.net.push(Msg::Grant { to: waiter, fence });
            }
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
        let n = match self.lock_of(c as u8) {
            Lock::Name(n) => n,
            Lock::Multi => 0,
        };
        match (slot, s.clients[c].phase) {
            // `MultiLock::attempt`: every name taken.
            (Slot::Attempt, Phase::Acquiring(mut a)) if matches!(reply, Reply::MultiAcquired { .. }) => {
                let Reply::MultiAcquired { fences, left } = reply else {
                    unreachable!()
                };
                let h = Holding::new(a.token, fences.map(Some), age, left, t.ttl, &t, m);
                if h.believes() {
                    if a.token != a.id {
                        self.note(s, Seen::MULTI_AFTER_BUSY);
                    }
                    self.hold(s, c, h);
                } else {
                    // Too late to leave a lease (`Attempt::TooLate`): give every name
                    // back, and try again.
                    self.note(s, Seen::MULTI_TOO_LATE);
                    let req = Req::Release {
                        token: a.token,
                        leaving: false,
                    };
                    send(s, c, Slot::Background, req);
                    a.attempt = None;
                    // The script left the registration on every name.
                    a.registered = false;
                    s.clients[c].phase = Phase::Acquiring(a);
                }
            }
            // `LockBase::acquire`: the reply to an attempt, read by `parse_acquire`.
            (Slot::Attempt, Phase::Acquiring(mut a)) => match reply {
                // `Mutex::acquire_free`.
                Reply::Pipeline {
                    taken: true,
                    fence: Some(fence),
                } => {
                    let h = Holding::new(a.token, fence_of(n, Some(fence)), age, t.ttl, t.ttl, &t, m);
                    self.hold(s, c, h);
                }
                Reply::Pipeline { .. } => {
                    // Held by someone else (or by us: a retried SET after a lost reply),
                    // or ours with a counter to start: the acquire script answers.
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
                    let mut h = Holding::new(a.token, fence_of(n, fence), age, remaining, t.ttl, &t, m);
                    h.expire_pending = !self.rules.atomic_acquire;
                    self.hold(s, c, h);
                }
                Reply::Busy { mark, own } => {
                    s.lied |= own;
                    a.attempt = None;
                    // A multi-lock waiter is never handed a name: it does not wait for
                    // hand-overs (its registration stays as the script left it).
                    if self.lock_of(c as u8) != Lock::Multi {
                        a.registered |=
                            self.kind.plain_mutex(c as u8) || matches!(self.kind, Kind::Semaphore { .. });
                        a.last_busy = Some((age.min(t.busy_cap()), mark));
                    }
                    s.clients[c].phase = Phase::Acquiring(a);
                }
                _ => unreachable!("acquire replies"),
            },
            // The extend that confirms a hand-over (`on_grant`).
            (Slot::Confirm, Phase::Acquiring(mut a)) => {
                let fence = a.confirm.expect("awaited");
                if reply == Reply::Int(1) {
                    let fence = self.kind.fenced().then_some(fence);
                    let h = Holding::new(a.token, fence_of(n, fence), age, t.ttl, t.ttl, &t, m);
                    self.hold(s, c, h);
                } else {
                    // A stale grant: try again.
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
                    self.gone(s, c, &mut h);
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
                    self.gone(s, c, &mut h);
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
                    // Handed for the waiter's claim window (`Popped::lease`).
                    let remaining = pttl.flatten().unwrap_or(t.claim);
                    let h = Holding::new(new, fence_of(n, fence), age, remaining, t.ttl, &t, m);
                    self.hold(s, c, h);
                }
                _ => {
                    // Our lease was already gone: the waiter gets the turn and
                    // competes in Redis with its own token.
                    s.clients[c].phase = Phase::Acquiring(Acquiring::new(new));
                    self.send_attempt(s, c, self.first_attempt(c as u8));
                }
            },
            _ => unreachable!("only awaited replies are in flight"),
        }
    }

    /// A renewal or an extend of client `c`'s lease `h` found its token no longer
    /// holds: the lease ends (`lost()`). A multi-lock then releases the names it may
    /// still hold in the background (`MultiLock::renew_round`, `extend`).
    fn gone(&self, s: &mut State, c: usize, h: &mut Holding) {
        h.end(Ended::Gone);
        if self.lock_of(c as u8) == Lock::Multi {
            let req = Req::Release {
                token: h.token,
                leaving: false,
            };
            send(s, c, Slot::Background, req);
        }
    }

    /// Client `c` holds `h` (ended already if it came too late to be relied on).
    fn hold(&self, s: &mut State, c: usize, h: Holding) {
        if matches!(h.ended, Some(Ended::Gone | Ended::Expired)) {
            self.note(s, Seen::LEASE_LOST);
        }
        // A holder that believes it holds with a token below an earlier holder's would
        // see its writes refused and the earlier holder's accepted. (A guard whose lease
        // already ran out is refused rightly.)
        if h.believes() {
            for (n, fence) in h.fences.iter().enumerate() {
                if let Some(fence) = *fence
                    && s.server.fence_behind(n, h.token, fence)
                {
                    s.fence_behind = true;
                }
            }
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
            // (A semaphore's grant carries a mark, not a fencing token for the guard.)
            let fence = self.kind.fenced().then_some(fence);
            let n = match self.lock_of(to.client) {
                Lock::Name(n) => n,
                Lock::Multi => unreachable!("a multi-lock is never handed a name"),
            };
            let h = Holding::new(to, fence_of(n, fence), busy, t.claim, t.ttl, &t, m);
            self.hold(s, c, h);
            return;
        }
        if after_busy {
            self.note(s, Seen::GRANT_RETRIED);
        } else {
            self.note(s, Seen::GRANT_STALE);
        }
        if self.rules.retry_unreliable_grant {
            // Try again at once: if the lock is ours (this hand-over, or a later one to
            // our registration), the acquire script says so with a fresh fencing token.
            self.send_attempt(s, c, Attempt::Script);
            return;
        }
        // The variant before 8da374b: confirm by extending (which fails unless the lock
        // is ours now), and hold with this hand-over's token.
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
                self.send_attempt(s, c, self.first_attempt(c as u8));
            }
            _ => unreachable!("only pending slots time out"),
        }
    }
}

/// Client `c` sends `req` (its age counts from now).
pub(crate) fn send(s: &mut State, c: usize, slot: Slot, req: Req) {
    s.net.push(Msg::Request {
        from: c as u8,
        slot,
        age: 0,
        req,
    });
}
