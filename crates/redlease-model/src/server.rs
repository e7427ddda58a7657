//! Redis: the keys of one lock — or, for the multi-lock, of several plain mutexes in one
//! hash slot — with expiry on the server's clock, and the scripts that change them, each
//! one atomic step with the effects of its `.lua` file.

use crate::config::{Fence, Kind, Lock, NAMES, Rules, Time, Timing};
use crate::net::{Reply, Tok, Waiter};

/// The lock key (`<prefix><name>`) of the mutex, or the leader key of an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub token: Tok,
    /// Ticks of the server's clock until it expires (`PTTL`); `None`: no TTL (only the
    /// SET NX variant writes such a key).
    pub expires: Option<Time>,
    /// The election's term, stored in the leader hash (0 for the mutex).
    pub term: Fence,
}

/// `mark.lua`'s fencing counter of the lock's hash slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Expired (it lives `COUNTER_MS` from when it was started), or never made.
    #[default]
    Missing,
    /// Made by the plain mutex's pipelined `INCR` after it expired, not started yet: it
    /// reads a few units, below every token ever issued (and below the threshold `mark.lua` checks).
    Unstarted,
    /// Started, at this value.
    Started(Fence),
}

/// A fencing mark below every token ever issued: what a counter not started yet reads.
pub const SMALL: Fence = 0;

/// The keys of one name: the lock key and its registered waiters (for the semaphore and
/// the election, their one lock uses the first name's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Name {
    pub lock: Option<Key>,
    /// `{<lock key>}:q` (a semaphore's `{<key>}:waiters`): the registered waiters, in
    /// the order `ZRANGE` gives: by deadline, which a new attempt moves to
    /// `register_life` from now, so by their last attempt. A registration lapses when
    /// its deadline passes without a new attempt; the model lets it lapse at any time
    /// (`Action::Lapse`), which covers every deadline.
    pub waiters: Vec<Waiter>,
    /// Not in Redis: the token that took the lock (became the key's holder) last.
    pub last_taker: Option<Tok>,
    /// Not in Redis: the highest fencing token issued before the last taker took the
    /// lock — a token it holds with, believing it holds, must be above it.
    pub take_floor: Option<Fence>,
    /// Not in Redis: a fencing token was issued to a token other than the one that
    /// took the lock last — so tokens may not rise in the order holders took the lock.
    pub misissued: bool,
}

/// What the server holds for one lock, or for the names of a multi-lock (which share a
/// hash slot, so a fencing counter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Server {
    /// The names' keys: `x` and `y`. A lock of one name uses `x` only.
    pub names: [Name; NAMES],
    /// The fencing counter of the slot; it expires (see `Bounds::counter_losses`).
    pub counter: Counter,
    /// `mark.lua`'s floor: above every token the current start can lead to. Lives a day:
    /// never lost within a run.
    pub floor: Option<Fence>,
    /// `election_campaign.lua`'s term key: the highest term issued and its token.
    pub last_term: Option<(Fence, Tok)>,
    /// `sem_acquire.lua`'s permit set: `(token, ticks to its deadline)`.
    pub permits: Vec<(Tok, Time)>,
    /// Not in Redis: the highest fencing token issued so far.
    pub issued: Option<Fence>,
}

/// What `mark.lua`'s floor is set above a start value: more tokens than one counter can issue
/// in its life (in Redis, its second of life at one token per microsecond).
const FLOOR_GAP: Fence = 100;

/// What a script did besides its reply: the hand-overs it published to waiters (a
/// multi-lock's release hands each name over on its own).
pub type Granted = Vec<(Tok, Fence)>;

impl Server {
    /// A tick of the server's clock: keys and set members whose deadline comes are
    /// gone (Redis drops an expired key when it is next touched, and the scripts prune
    /// members whose deadline passed first: no script can tell the difference).
    pub fn tick(&mut self) {
        for name in &mut self.names {
            if let Some(key) = &mut name.lock
                && let Some(left) = &mut key.expires
            {
                *left -= 1;
                if *left == 0 {
                    name.lock = None;
                }
            }
        }
        for (_, left) in &mut self.permits {
            *left -= 1;
        }
        self.permits.retain(|&(_, left)| left > 0);
    }

    /// The first name's lock key: the one lock of the mutex, the semaphore (unused) and
    /// the election.
    pub fn lock(&self) -> Option<Key> {
        self.names[0].lock
    }

    fn pttl(&self, n: usize) -> Option<Time> {
        self.names[n].lock.and_then(|k| k.expires)
    }

    /// `mark.lua`, `take_fence`: INCR the counter; a counter that is missing or not
    /// started is started above the floor, and the floor moved above what the new counter
    /// can reach. The token goes to `to`, for name `n`.
    fn take_fence(&mut self, n: usize, to: Tok) -> Fence {
        let fence = match self.counter {
            Counter::Started(c) => c + 1,
            Counter::Missing | Counter::Unstarted => {
                // max(server time in µs, floor + 1): the time part only matters when
                // the floor is gone too, which a run never sees.
                let start = self.floor.map_or(1, |f| f + 1);
                self.floor = Some(start + FLOOR_GAP);
                start
            }
        };
        self.counter = Counter::Started(fence);
        self.issue(n, to, fence);
        fence
    }

    /// The plain mutex's pipelined `INCR` (`Mutex::acquire_free`): a fencing token when
    /// the counter is started, else `None` (it reads a few units: the script must start
    /// it).
    fn pipelined_incr(&mut self, n: usize, to: Tok, taken: bool) -> Option<Fence> {
        match self.counter {
            Counter::Started(c) => {
                // A fencing token only if the pipeline's SET took the lock (else the
                // client does not use it).
                if taken {
                    self.issue(n, to, c + 1);
                }
                self.counter = Counter::Started(c + 1);
                Some(c + 1)
            }
            Counter::Missing | Counter::Unstarted => {
                self.counter = Counter::Unstarted;
                None
            }
        }
    }

    /// `mark.lua`, `fence_mark`: the counter once started, else the floor. (The
    /// variant before 8d1a808 takes a counter's few units for the mark before it was started.)
    fn fence_mark(&self, rules: &Rules) -> Option<Fence> {
        match self.counter {
            Counter::Started(c) => Some(c),
            Counter::Unstarted if !rules.started_mark => Some(SMALL),
            Counter::Missing | Counter::Unstarted => self.floor,
        }
    }

    /// `token` took name `n`. (A token that takes it again, with nobody in between —
    /// a late copy of its own retried request — keeps the floor of its first take.)
    fn took(&mut self, n: usize, token: Tok) {
        let issued = self.issued;
        let name = &mut self.names[n];
        if name.last_taker != Some(token) {
            name.take_floor = issued;
        }
        name.last_taker = Some(token);
    }

    /// Fencing token `fence` is issued to `to`, for name `n`.
    fn issue(&mut self, n: usize, to: Tok, fence: Fence) {
        let name = &mut self.names[n];
        if name.last_taker != Some(to) {
            name.misissued = true;
        }
        self.issued = self.issued.max(Some(fence));
    }

    /// Whether a holding of name `n` by `token` with fencing token `fence` has a token
    /// below one issued before `token` last took the name (a token of an earlier
    /// holding).
    pub fn fence_behind(&self, n: usize, token: Tok, fence: Fence) -> bool {
        let name = &self.names[n];
        name.last_taker == Some(token) && name.take_floor.is_some_and(|floor| fence <= floor)
    }

    /// Runs an acquire script for `token`, which locks `lock`, for a waiter (wait mode
    /// '1'). With the reply, the hand-overs it published (a semaphore's acquire hands on
    /// lapsed permits).
    pub fn acquire(
        &mut self,
        kind: Kind,
        lock: Lock,
        rules: &Rules,
        t: &Timing,
        token: Tok,
    ) -> (Reply, Granted) {
        match (kind, lock) {
            (Kind::Semaphore { limit }, _) => self.sem_acquire(rules, t, token, limit),
            (Kind::Election, _) => (self.election_campaign(t, token), Vec::new()),
            (_, Lock::Name(n)) => (self.mutex_acquire(n, rules, t, token), Vec::new()),
            (_, Lock::Multi) => unreachable!("a multi-lock acquires with multi_acquire.lua"),
        }
    }

    /// `mutex_acquire.lua` on name `n`, for a waiter (wait mode '1').
    fn mutex_acquire(&mut self, n: usize, rules: &Rules, t: &Timing, token: Tok) -> Reply {
        // SET NX PX (the SET NX variant: SET NX, and the client's PEXPIRE follows).
        if self.set_nx(n, rules, t, token) {
            let fence = self.take_fence(n, token);
            // A waiter leaves its registration: an earlier attempt's, or this request's
            // own when it is a retry whose first try registered.
            self.names[n].waiters.retain(|&w| w != Waiter::Take(token));
            return Reply::Acquired {
                fence: Some(fence),
                pttl: None,
            };
        }
        let current = self.names[n].lock.expect("checked").token;
        let pttl = self.pttl(n);
        if current == token && rules.idempotent_retry {
            // Ours already: a retry after a lost reply, or a lock handed to us — with a
            // fresh token, and PEXPIRE … GT to the full lease.
            let fence = self.take_fence(n, token);
            let pttl = pttl.map(|p| p.max(t.ttl));
            if let Some(key) = &mut self.names[n].lock {
                key.expires = pttl;
            }
            return Reply::Acquired {
                fence: Some(fence),
                pttl: Some(pttl),
            };
        }
        // Register (ZADD: a new attempt moves the deadline on, behind the others').
        register(&mut self.names[n].waiters, Waiter::Take(token));
        Reply::Busy {
            mark: self.fence_mark(rules),
            own: current == token,
        }
    }

    /// `SET key token NX PX ttl` on name `n` (the SET NX variant: without `PX`): whether
    /// it set.
    fn set_nx(&mut self, n: usize, rules: &Rules, t: &Timing, token: Tok) -> bool {
        if self.names[n].lock.is_some() {
            return false;
        }
        let expires = rules.atomic_acquire.then_some(t.ttl);
        self.names[n].lock = Some(Key {
            token,
            expires,
            term: 0,
        });
        self.took(n, token);
        true
    }

    /// The plain mutex's pipeline for a free lock (`Mutex::acquire_free`) on name `n`:
    /// its `SET NX PX`. Whether it set.
    pub fn pipeline_set(&mut self, n: usize, rules: &Rules, t: &Timing, token: Tok) -> bool {
        self.set_nx(n, rules, t, token)
    }

    /// The pipeline's `INCR`, after its `SET` (which `taken` name `n`, or not), for
    /// `token`.
    pub fn pipeline_incr(&mut self, n: usize, token: Tok, taken: bool) -> Option<Fence> {
        self.pipelined_incr(n, token, taken)
    }

    /// `multi_acquire.lua`: every name, or none. Every lock key is read first; if one is
    /// held by another token, nothing is taken, and the waiter's registration `reg` is
    /// left on exactly the names that keep it out. Otherwise the registration leaves
    /// every name, and each is taken by the plain mutex's own acquire step
    /// (`mutex_acquire.lua` in wait mode '0': no registration of its own) — `SET NX PX`
    /// and a fresh fencing token, or "already ours" (a retry after a lost reply) with a
    /// fresh fencing token and what is left.
    pub fn multi_acquire(&mut self, rules: &Rules, t: &Timing, token: Tok, reg: Tok) -> Reply {
        let busy: Vec<bool> = self
            .names
            .iter()
            .map(|name| name.lock.is_some_and(|k| k.token != token))
            .collect();
        if busy.contains(&true) {
            for (name, &busy) in self.names.iter_mut().zip(&busy) {
                if busy {
                    register(&mut name.waiters, Waiter::Wake(reg));
                } else {
                    name.waiters.retain(|&w| w != Waiter::Wake(reg));
                }
            }
            return Reply::Busy {
                mark: None,
                own: false,
            };
        }
        for name in &mut self.names {
            name.waiters.retain(|&w| w != Waiter::Wake(reg));
        }
        let mut left = t.ttl;
        let fences = std::array::from_fn(|n| {
            // mutex_acquire(…, {token, ttl, '', '0', …}): free, or ours already.
            if !self.set_nx(n, rules, t, token) {
                // `ms(pttl)`: what is left, the full TTL for a key without one.
                left = left.min(self.pttl(n).unwrap_or(t.ttl));
            }
            self.take_fence(n, token)
        });
        Reply::MultiAcquired { fences, left }
    }

    /// `sem_acquire.lua` for one permit of `limit`: taken if there is room, else the
    /// waiter registers (and learns the slot's fencing mark).
    fn sem_acquire(&mut self, rules: &Rules, t: &Timing, token: Tok, limit: u8) -> (Reply, Granted) {
        let used = self.permits.len();
        if used + 1 > usize::from(limit) {
            // Already ours: extended to the full lease (`ZADD XX GT`), the registration
            // left first, then the lapsed room (if any) handed to the waiters that fit.
            if let Some((_, deadline)) = self.permits.iter_mut().find(|(p, _)| *p == token) {
                *deadline = (*deadline).max(t.ttl);
                let left = *deadline;
                self.names[0].waiters.retain(|&w| w != Waiter::Take(token));
                let granted = self.sem_hand_out(t, limit);
                return (
                    Reply::Acquired {
                        fence: None,
                        pttl: Some(Some(left)),
                    },
                    granted,
                );
            }
            // Register (ZADD: a new attempt moves the deadline on, behind the others').
            register(&mut self.names[0].waiters, Waiter::Take(token));
            // Lapsed permits the script pruned go to registered waiters; the model's
            // clock prunes them (`tick`), so it may hand out whenever there is room.
            // (The script hands out before it writes anything of the caller's — a
            // fencing counter of another type, not modelled, then fails the call with
            // nothing of its taken — and only what the caller leaves: the same room.)
            let granted = self.sem_hand_out(t, limit);
            let reply = Reply::Busy {
                mark: self.fence_mark(rules),
                own: false,
            };
            return (reply, granted);
        }
        // ZADD: a retry that finds room sets its deadline again.
        self.permits.retain(|(p, _)| *p != token);
        self.permits.push((token, t.ttl));
        self.permits.sort();
        // A waiter leaves its registration — a retry whose first try registered (its
        // reply lost) must not leave one behind for a release to serve — before the
        // room it leaves is handed out, so that its own registration is not handed any.
        self.names[0].waiters.retain(|&w| w != Waiter::Take(token));
        let granted = self.sem_hand_out(t, limit);
        (
            Reply::Acquired {
                fence: None,
                pttl: None,
            },
            granted,
        )
    }

    /// `sem_waiters.lua`, `hand_out`: the first registered waiter gets a permit for the
    /// claim window when there is room, with a mark from the fencing counter, told by
    /// `g <id> <mark>`. (One per step: a release frees one permit in the model.)
    fn sem_hand_out(&mut self, t: &Timing, limit: u8) -> Granted {
        if self.permits.len() >= usize::from(limit) {
            return Vec::new();
        }
        let Some(&Waiter::Take(waiter)) = self.names[0].waiters.first() else {
            return Vec::new();
        };
        // The mark is drawn for a permit, which is not exclusive: no taker to check it
        // against (`issue`).
        self.took(0, waiter);
        let mark = self.take_fence(0, waiter);
        self.names[0].waiters.remove(0);
        // ZADD GT: a permit the waiter already holds keeps a later deadline.
        let held = self.permits.iter().find(|(p, _)| *p == waiter).map(|&(_, d)| d);
        self.permits.retain(|(p, _)| *p != waiter);
        self.permits
            .push((waiter, held.map_or(t.claim, |d| d.max(t.claim))));
        self.permits.sort();
        vec![(waiter, mark)]
    }

    /// `election_campaign.lua`: the term comes from `next_fence` (`fence.lua`), above
    /// the term key's.
    fn election_campaign(&mut self, t: &Timing, token: Tok) -> Reply {
        if let Some(leader) = self.lock() {
            if leader.token == token {
                return Reply::Acquired {
                    fence: Some(leader.term),
                    pttl: Some(self.pttl(0)),
                };
            }
            return Reply::Busy {
                mark: None,
                own: false,
            };
        }
        let term = self.last_term.map_or(1, |(term, _)| term + 1);
        self.names[0].lock = Some(Key {
            token,
            expires: Some(t.ttl),
            term,
        });
        self.took(0, token);
        self.issue(0, token, term);
        self.last_term = Some((term, token));
        Reply::Acquired {
            fence: Some(term),
            pttl: None,
        }
    }

    /// Runs an extend (renew) script for `token`, which locks `lock`: `1` if `token`
    /// holds (for the multi-lock: every name), else `0`.
    pub fn extend(&mut self, kind: Kind, lock: Lock, rules: &Rules, token: Tok, ttl: Time) -> Reply {
        let until = ttl;
        // PEXPIRE … GT / ZADD XX GT never shorten; the variant sets the TTL outright.
        let push = |current: Time| {
            if rules.ordered_lease {
                current.max(until)
            } else {
                until
            }
        };
        // `mutex_extend.lua`, `election_renew.lua`: compare, then PEXPIRE … GT.
        let extend_name = |name: &mut Name| match &mut name.lock {
            Some(key) if key.token == token => {
                // PEXPIRE GT on a key without a TTL changes nothing.
                key.expires = key.expires.map(push);
                true
            }
            _ => false,
        };
        match (kind, lock) {
            // `sem_extend.lua`
            (Kind::Semaphore { .. }, _) => match self.permits.iter_mut().find(|(p, _)| *p == token) {
                Some((_, deadline)) => {
                    *deadline = push(*deadline);
                    Reply::Int(1)
                }
                None => Reply::Int(0),
            },
            (_, Lock::Name(n)) => Reply::Int(i8::from(extend_name(&mut self.names[n]))),
            // `multi_extend.lua`: every name through mutex_extend, also past one not held.
            (_, Lock::Multi) => {
                let mut held = true;
                for name in &mut self.names {
                    held &= extend_name(name);
                }
                Reply::Int(i8::from(held))
            }
        }
    }

    /// Runs a release script for `token`, which locks `lock`; `leaving`: also leave its
    /// registration.
    pub fn release(
        &mut self,
        kind: Kind,
        lock: Lock,
        t: &Timing,
        token: Tok,
        leaving: bool,
    ) -> (Reply, Granted) {
        match (kind, lock) {
            // `sem_release.lua`: the room made goes to a registered waiter.
            (Kind::Semaphore { limit }, _) => {
                if leaving {
                    self.names[0].waiters.retain(|&w| w != Waiter::Take(token));
                }
                let before = self.permits.len();
                self.permits.retain(|(p, _)| *p != token);
                let released = self.permits.len() < before;
                (Reply::Int(i8::from(released)), self.sem_hand_out(t, limit))
            }
            // `election_resign.lua`
            (Kind::Election, _) => match self.lock() {
                Some(leader) if leader.token == token => {
                    self.names[0].lock = None;
                    (Reply::Int(1), Vec::new())
                }
                Some(_) => (Reply::Int(0), Vec::new()),
                None if self.last_term.is_some_and(|(_, last)| last == token) => (Reply::Int(-1), Vec::new()),
                None => (Reply::Int(0), Vec::new()),
            },
            (_, Lock::Name(n)) => {
                let leave = leaving.then_some(Waiter::Take(token));
                let (reply, granted) = self.mutex_release(n, t, token, leave);
                (Reply::Int(reply), granted.into_iter().collect())
            }
            // `multi_release.lua`: every name through mutex_release, each handed to its
            // own first waiter (or woken, or deleted).
            (_, Lock::Multi) => self.multi_release(t, token, None),
        }
    }

    /// `multi_release.lua` with `token`; `leave`: the registration of a multi-lock
    /// waiter that gives up, to leave on every name. (The registration is left with a
    /// fresh token, which holds nothing: `Registration::drop`.) The reply is the first
    /// name's answer (a release's verdict is not modelled).
    pub fn multi_release(&mut self, t: &Timing, token: Tok, leave: Option<Tok>) -> (Reply, Granted) {
        let mut granted = Vec::new();
        let mut first = None;
        for n in 0..NAMES {
            let (reply, grant) = self.mutex_release(n, t, token, leave.map(Waiter::Wake));
            first.get_or_insert(reply);
            granted.extend(grant);
        }
        (Reply::Int(first.unwrap_or(0)), granted)
    }

    /// `mutex_release.lua` on name `n`: `1` released (or handed over), `0` held by
    /// another token, `-1` free; `leave`: a registration to leave. (The script's first
    /// path — the token holds the lock and no waiters' set exists — deletes the key
    /// without leaving the registration: there is none to leave then, as here.)
    fn mutex_release(
        &mut self,
        n: usize,
        t: &Timing,
        token: Tok,
        leave: Option<Waiter>,
    ) -> (i8, Option<(Tok, Fence)>) {
        if let Some(leave) = leave {
            self.names[n].waiters.retain(|&w| w != leave);
        }
        match self.names[n].lock {
            Some(key) if key.token == token => (1, self.free_or_hand_over(n, t)),
            Some(_) => (0, None),
            None => (-1, None),
        }
    }

    /// The part of `mutex_release.lua` after the compare, on name `n`: no registered
    /// waiter → UNLINK; a first live waiter that takes hand-overs (kind ' ') gets the
    /// lock with its own token for the claim window and a fresh fencing token, told by
    /// `g <id> <fence>`; a first waiter that may only be woken (kind '!', a multi-lock's)
    /// → UNLINK, and the waiters are woken.
    fn free_or_hand_over(&mut self, n: usize, t: &Timing) -> Option<(Tok, Fence)> {
        // Lapsed registrations are gone already (ZREMRANGEBYSCORE -inf now).
        let Some(&Waiter::Take(waiter)) = self.names[n].waiters.first() else {
            self.names[n].lock = None;
            return None;
        };
        // (One step: the fence is taken before the SET, for the waiter that takes it.)
        self.took(n, waiter);
        let fence = self.take_fence(n, waiter);
        let name = &mut self.names[n];
        name.waiters.remove(0);
        name.lock = Some(Key {
            token: waiter,
            expires: Some(t.claim),
            term: 0,
        });
        Some((waiter, fence))
    }

    /// Broken variant, second step of a release: `mutex_release.lua` without the
    /// compare, which the client made with a `GET` before.
    pub fn release_unchecked(&mut self, t: &Timing) -> (Reply, Granted) {
        if self.lock().is_none() {
            return (Reply::Int(-1), Vec::new());
        }
        (Reply::Int(1), self.free_or_hand_over(0, t).into_iter().collect())
    }

    /// Broken variant: `GET key`.
    pub fn get(&self) -> Reply {
        Reply::Value(self.lock().map(|k| k.token))
    }

    /// Broken variant: `PEXPIRE key ttl` after `SET NX`.
    pub fn expire_key(&mut self, t: &Timing) {
        if let Some(key) = &mut self.names[0].lock {
            key.expires = Some(t.ttl);
        }
    }

    /// The local hand-over, from `old` to `new` in one step: `mutex_handoff.lua` with a
    /// fresh fencing token, `sem_handoff.lua` with a fresh lease — for the waiter's
    /// claim window, as a hand-over by a release (the waiter renews it within a third
    /// of that; the model's clients renew automatically).
    pub fn handoff(&mut self, kind: Kind, t: &Timing, old: Tok, new: Tok) -> Reply {
        if let Kind::Semaphore { .. } = kind {
            return self.sem_handoff(t, old, new);
        }
        let current = self.lock().map(|k| k.token);
        if current == Some(new) {
            let fence = self.take_fence(0, new);
            return Reply::Acquired {
                fence: Some(fence),
                pttl: Some(self.pttl(0)),
            };
        }
        if current != Some(old) {
            return Reply::Int(0);
        }
        self.took(0, new);
        let fence = self.take_fence(0, new);
        self.names[0].lock = Some(Key {
            token: new,
            expires: Some(t.claim),
            term: 0,
        });
        Reply::Acquired {
            fence: Some(fence),
            pttl: None,
        }
    }

    /// `sem_handoff.lua`: `old`'s permit becomes `new`'s, with a lease of the claim
    /// window from now; "already handed" (a retry) with what is left; `0` when `old` holds none
    /// (released, or lapsed and pruned).
    fn sem_handoff(&mut self, t: &Timing, old: Tok, new: Tok) -> Reply {
        if let Some(&(_, deadline)) = self.permits.iter().find(|(p, _)| *p == new) {
            return Reply::Acquired {
                fence: None,
                pttl: Some(Some(deadline)),
            };
        }
        if !self.permits.iter().any(|(p, _)| *p == old) {
            return Reply::Int(0);
        }
        self.permits.retain(|(p, _)| *p != old);
        self.permits.push((new, t.claim));
        self.permits.sort();
        Reply::Acquired {
            fence: None,
            pttl: None,
        }
    }

    /// The fencing counter key expires.
    pub fn lose_counter(&mut self) {
        self.counter = Counter::Missing;
    }
}

/// `ZADD` of a registration: a new attempt moves its deadline on, behind the others'.
fn register(waiters: &mut Vec<Waiter>, waiter: Waiter) {
    waiters.retain(|&w| w != waiter);
    waiters.push(waiter);
}
