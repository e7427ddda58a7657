//! Redis: the keys of one lock, with expiry on the server's clock, and the scripts that
//! change them — each one atomic step, with the effects of its `.lua` file.

use crate::config::{Fence, Kind, Rules, Time, Timing};
use crate::net::{Reply, Tok};

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

/// What the server holds for one lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Server {
    pub lock: Option<Key>,
    /// The fencing counter; it expires (see `Bounds::counter_losses`).
    pub counter: Counter,
    /// `mark.lua`'s floor: above every token the current start can lead to. Lives a day:
    /// never lost within a run.
    pub floor: Option<Fence>,
    /// `{<lock key>}:q` (a semaphore's `{<key>}:waiters`): the registered waiters, in
    /// the order `ZRANGE` gives: by deadline, which a new attempt moves to
    /// `register_life` from now, so by their last attempt. A registration lapses when
    /// its deadline passes without a new attempt; the model lets it lapse at any time
    /// (`Action::Lapse`), which covers every deadline.
    pub waiters: Vec<Tok>,
    /// `election_campaign.lua`'s term key: the highest term issued and its token.
    pub last_term: Option<(Fence, Tok)>,
    /// `sem_acquire.lua`'s permit set: `(token, ticks to its deadline)`.
    pub permits: Vec<(Tok, Time)>,
    /// Not in Redis: the token that took the lock (became the key's holder) last.
    pub last_taker: Option<Tok>,
    /// Not in Redis: the highest fencing token issued so far.
    pub issued: Option<Fence>,
    /// Not in Redis: the highest fencing token issued before the last taker took the
    /// lock — a token it holds with, believing it holds, must be above it.
    pub take_floor: Option<Fence>,
    /// Not in Redis: a fencing token was issued to a token other than the one that
    /// took the lock last — so tokens may not rise in the order holders took the lock.
    pub misissued: bool,
}

/// What `mark.lua`'s floor is set above a start value: more tokens than one counter can issue
/// in its life (in Redis, its second of life at one token per microsecond).
const FLOOR_GAP: Fence = 100;

/// What a script did besides its reply: a hand-over published to a waiter.
pub type Granted = Option<(Tok, Fence)>;

impl Server {
    /// A tick of the server's clock: keys and set members whose deadline comes are
    /// gone (Redis drops an expired key when it is next touched, and the scripts prune
    /// members whose deadline passed first: no script can tell the difference).
    pub fn tick(&mut self) {
        if let Some(key) = &mut self.lock
            && let Some(left) = &mut key.expires
        {
            *left -= 1;
            if *left == 0 {
                self.lock = None;
            }
        }
        for (_, left) in &mut self.permits {
            *left -= 1;
        }
        self.permits.retain(|&(_, left)| left > 0);
    }

    fn pttl(&self) -> Option<Time> {
        self.lock.and_then(|k| k.expires)
    }

    /// `mark.lua`, `take_fence`: INCR the counter; a counter that is missing or not
    /// started is started above the floor, and the floor moved above what the new counter
    /// can reach.
    fn take_fence(&mut self, to: Tok) -> Fence {
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
        self.issue(to, fence);
        fence
    }

    /// The plain mutex's pipelined `INCR` (`Mutex::acquire_free`): a fencing token when
    /// the counter is started, else `None` (it reads a few units: the script must start
    /// it).
    fn pipelined_incr(&mut self, to: Tok, taken: bool) -> Option<Fence> {
        match self.counter {
            Counter::Started(c) => {
                // A fencing token only if the pipeline's SET took the lock (else the
                // client does not use it).
                if taken {
                    self.issue(to, c + 1);
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

    /// `token` took the lock. (A token that takes it again, with nobody in between —
    /// a late copy of its own retried request — keeps the floor of its first take.)
    fn took(&mut self, token: Tok) {
        if self.last_taker != Some(token) {
            self.take_floor = self.issued;
        }
        self.last_taker = Some(token);
    }

    /// Fencing token `fence` is issued to `to`.
    fn issue(&mut self, to: Tok, fence: Fence) {
        if self.last_taker != Some(to) {
            self.misissued = true;
        }
        self.issued = self.issued.max(Some(fence));
    }

    /// Whether a holding of `token` with fencing token `fence` has a token below one
    /// issued before `token` last took the lock (a token of an earlier holding).
    pub fn fence_behind(&self, token: Tok, fence: Fence) -> bool {
        self.last_taker == Some(token) && self.take_floor.is_some_and(|floor| fence <= floor)
    }

    /// Runs an acquire script for `token`; `leave`: wait mode '2' (leave the
    /// registration of an earlier attempt when acquired), else '1'. With the reply, a
    /// hand-over it published (a semaphore's acquire hands on lapsed permits).
    pub fn acquire(
        &mut self,
        kind: Kind,
        rules: &Rules,
        t: &Timing,
        token: Tok,
        leave: bool,
    ) -> (Reply, Granted) {
        match kind {
            Kind::Mutex => (self.mutex_acquire(rules, t, token, leave), None),
            Kind::Semaphore { limit } => self.sem_acquire(rules, t, token, limit, leave),
            Kind::Election => (self.election_campaign(t, token), None),
        }
    }

    /// `mutex_acquire.lua`, for a waiter (wait mode '1', or '2' once registered).
    fn mutex_acquire(&mut self, rules: &Rules, t: &Timing, token: Tok, leave: bool) -> Reply {
        // SET NX PX (the SET NX variant: SET NX, and the client's PEXPIRE follows).
        if self.set_nx(rules, t, token) {
            let fence = self.take_fence(token);
            // wait '2': leave the registration of an earlier attempt.
            if leave {
                self.waiters.retain(|&w| w != token);
            }
            return Reply::Acquired {
                fence: Some(fence),
                pttl: None,
            };
        }
        let current = self.lock.expect("checked").token;
        let pttl = self.pttl();
        if current == token && rules.idempotent_retry {
            // Ours already: a retry after a lost reply, or a lock handed to us.
            let fence = self.take_fence(token);
            return Reply::Acquired {
                fence: Some(fence),
                pttl: Some(pttl),
            };
        }
        // Register (ZADD: a new attempt moves the deadline on, behind the others').
        self.waiters.retain(|&w| w != token);
        self.waiters.push(token);
        Reply::Busy {
            mark: self.fence_mark(rules),
            own: current == token,
        }
    }

    /// `SET key token NX PX ttl` (the SET NX variant: without `PX`): whether it set.
    fn set_nx(&mut self, rules: &Rules, t: &Timing, token: Tok) -> bool {
        if self.lock.is_some() {
            return false;
        }
        let expires = rules.atomic_acquire.then_some(t.ttl);
        self.lock = Some(Key {
            token,
            expires,
            term: 0,
        });
        self.took(token);
        true
    }

    /// The plain mutex's pipeline for a free lock (`Mutex::acquire_free`): its `SET NX
    /// PX`. Whether it set.
    pub fn pipeline_set(&mut self, rules: &Rules, t: &Timing, token: Tok) -> bool {
        self.set_nx(rules, t, token)
    }

    /// The pipeline's `INCR`, after its `SET` (which `taken` the lock, or not), for
    /// `token`.
    pub fn pipeline_incr(&mut self, token: Tok, taken: bool) -> Option<Fence> {
        self.pipelined_incr(token, taken)
    }

    /// `sem_acquire.lua` for one permit of `limit`: taken if there is room, else the
    /// waiter registers (and learns the slot's fencing mark).
    fn sem_acquire(
        &mut self,
        rules: &Rules,
        t: &Timing,
        token: Tok,
        limit: u8,
        leave: bool,
    ) -> (Reply, Granted) {
        let used = self.permits.len();
        if used + 1 > usize::from(limit) {
            if let Some(&(_, deadline)) = self.permits.iter().find(|(p, _)| *p == token) {
                return (
                    Reply::Acquired {
                        fence: None,
                        pttl: Some(Some(deadline)),
                    },
                    None,
                );
            }
            // Register (ZADD: a new attempt moves the deadline on, behind the others').
            self.waiters.retain(|&w| w != token);
            self.waiters.push(token);
            // Lapsed permits the script pruned go to registered waiters; the model's
            // clock prunes them (`tick`), so it may hand out whenever there is room.
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
        if leave {
            self.waiters.retain(|&w| w != token);
        }
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
            return None;
        }
        let &waiter = self.waiters.first()?;
        // The mark is drawn for a permit, which is not exclusive: no taker to check it
        // against (`issue`).
        self.took(waiter);
        let mark = self.take_fence(waiter);
        self.waiters.remove(0);
        self.permits.retain(|(p, _)| *p != waiter);
        self.permits.push((waiter, t.claim));
        self.permits.sort();
        Some((waiter, mark))
    }

    /// `election_campaign.lua`: the term comes from `next_fence` (`fence.lua`), above
    /// the term key's.
    fn election_campaign(&mut self, t: &Timing, token: Tok) -> Reply {
        if let Some(leader) = self.lock {
            if leader.token == token {
                return Reply::Acquired {
                    fence: Some(leader.term),
                    pttl: Some(self.pttl()),
                };
            }
            return Reply::Busy {
                mark: None,
                own: false,
            };
        }
        let term = self.last_term.map_or(1, |(term, _)| term + 1);
        self.lock = Some(Key {
            token,
            expires: Some(t.ttl),
            term,
        });
        self.took(token);
        self.issue(token, term);
        self.last_term = Some((term, token));
        Reply::Acquired {
            fence: Some(term),
            pttl: None,
        }
    }

    /// Runs an extend (renew) script: `1` if `token` holds, else `0`.
    pub fn extend(&mut self, kind: Kind, rules: &Rules, token: Tok, ttl: Time) -> Reply {
        let until = ttl;
        // PEXPIRE … GT / ZADD XX GT never shorten; the variant sets the TTL outright.
        let push = |current: Time| {
            if rules.ordered_lease {
                current.max(until)
            } else {
                until
            }
        };
        match kind {
            // `mutex_extend.lua`, `election_renew.lua`
            Kind::Mutex | Kind::Election => match &mut self.lock {
                Some(key) if key.token == token => {
                    // PEXPIRE GT on a key without a TTL changes nothing.
                    key.expires = key.expires.map(push);
                    Reply::Int(1)
                }
                _ => Reply::Int(0),
            },
            // `sem_extend.lua`
            Kind::Semaphore { .. } => match self.permits.iter_mut().find(|(p, _)| *p == token) {
                Some((_, deadline)) => {
                    *deadline = push(*deadline);
                    Reply::Int(1)
                }
                None => Reply::Int(0),
            },
        }
    }

    /// Runs a release script for `token`; `leaving`: also leave its registration.
    pub fn release(&mut self, kind: Kind, t: &Timing, token: Tok, leaving: bool) -> (Reply, Granted) {
        match kind {
            Kind::Mutex => self.mutex_release(t, token, leaving),
            // `sem_release.lua`: the room made goes to a registered waiter.
            Kind::Semaphore { limit } => {
                if leaving {
                    self.waiters.retain(|&w| w != token);
                }
                let before = self.permits.len();
                self.permits.retain(|(p, _)| *p != token);
                let released = self.permits.len() < before;
                (Reply::Int(i8::from(released)), self.sem_hand_out(t, limit))
            }
            // `election_resign.lua`
            Kind::Election => match self.lock {
                Some(leader) if leader.token == token => {
                    self.lock = None;
                    (Reply::Int(1), None)
                }
                Some(_) => (Reply::Int(0), None),
                None if self.last_term.is_some_and(|(_, last)| last == token) => (Reply::Int(-1), None),
                None => (Reply::Int(0), None),
            },
        }
    }

    /// `mutex_release.lua`.
    fn mutex_release(&mut self, t: &Timing, token: Tok, leaving: bool) -> (Reply, Granted) {
        if leaving {
            self.waiters.retain(|&w| w != token);
        }
        match self.lock {
            Some(key) if key.token == token => (Reply::Int(1), self.free_or_hand_over(t)),
            Some(_) => (Reply::Int(0), None),
            None => (Reply::Int(-1), None),
        }
    }

    /// The part of `mutex_release.lua` after the compare: no registered waiter → UNLINK;
    /// else the first live one gets the lock with its own token for the claim window and
    /// a fresh fencing token, told by `g <id> <fence>`.
    fn free_or_hand_over(&mut self, t: &Timing) -> Granted {
        // Lapsed registrations are gone already (ZREMRANGEBYSCORE -inf now).
        let Some(&waiter) = self.waiters.first() else {
            self.lock = None;
            return None;
        };
        // (One step: the fence is taken before the SET, for the waiter that takes it.)
        self.took(waiter);
        let fence = self.take_fence(waiter);
        self.waiters.remove(0);
        self.lock = Some(Key {
            token: waiter,
            expires: Some(t.claim),
            term: 0,
        });
        Some((waiter, fence))
    }

    /// Broken variant, second step of a release: `mutex_release.lua` without the
    /// compare, which the client made with a `GET` before.
    pub fn release_unchecked(&mut self, t: &Timing) -> (Reply, Granted) {
        if self.lock.is_none() {
            return (Reply::Int(-1), None);
        }
        (Reply::Int(1), self.free_or_hand_over(t))
    }

    /// Broken variant: `GET key`.
    pub fn get(&self) -> Reply {
        Reply::Value(self.lock.map(|k| k.token))
    }

    /// Broken variant: `PEXPIRE key ttl` after `SET NX`.
    pub fn expire_key(&mut self, t: &Timing) {
        if let Some(key) = &mut self.lock {
            key.expires = Some(t.ttl);
        }
    }

    /// `mutex_handoff.lua`: from `old` to `new` in one step, with a fresh fencing token.
    pub fn handoff(&mut self, t: &Timing, old: Tok, new: Tok) -> Reply {
        let current = self.lock.map(|k| k.token);
        if current == Some(new) {
            let fence = self.take_fence(new);
            return Reply::Acquired {
                fence: Some(fence),
                pttl: Some(self.pttl()),
            };
        }
        if current != Some(old) {
            return Reply::Int(0);
        }
        self.took(new);
        let fence = self.take_fence(new);
        self.lock = Some(Key {
            token: new,
            expires: Some(t.ttl),
            term: 0,
        });
        Reply::Acquired {
            fence: Some(fence),
            pttl: None,
        }
    }

    /// The fencing counter key expires.
    pub fn lose_counter(&mut self) {
        self.counter = Counter::Missing;
    }
}
