//! In-process queueing for the plain mutex.
//!
//! Tasks of one client that want the same lock line up here, in arrival order, instead
//! of all competing in Redis: one of them at a time — the *representative* — acquires
//! through Redis (and waits for wake-ups there); the others wait for their turn. When
//! the local holder releases and a local task is waiting, the lock is handed to that
//! task in one atomic script (token swap and a fresh fencing token): one round trip
//! instead of a release, a wake-up and an acquire, and nobody can slip in between. A
//! budget of consecutive hand-overs keeps other processes from being starved: after it,
//! the lock is released through Redis and the local head competes like everyone else.
//!
//! A local waiter is bounded exactly as a waiter in another process is: by the holder's
//! lease. When the local holder's lease is lost — it ran out, or the lock was found
//! gone — its turn is revoked and passed on at once (the lease calls back; the renewal
//! task looks at every lease by its `valid_until`), so the next task goes to Redis
//! instead of waiting for a guard that may live on long after its lease. A lock handed
//! to a task that does not take it up (its future is not polled) has no lease yet: the
//! hand-over's own expiry in Redis stands for it — the waiter's claim window, as for a
//! lock a release hands to a waiter in Redis — and once it has passed, the next task
//! that enters, or a queued task looking every claim window, revokes the turn. A turn
//! passed to a task that does not take it up within a claim window is revoked the same
//! way. A task picked for a hand-over that does not come within a claim window (the
//! releasing task stalled) takes the turn over and goes to Redis with a fresh token.
//!
//! A hand-over gives the waiter the lock for the claim window of its own handle
//! (several handles of one lock, with different leases, share the queue), which the
//! waiter's renewal extends to its full lease within a third of that (a waiter that
//! does not renew automatically is handed its whole lease); a waiter whose handle has a
//! replica policy is never handed the lock (a hand-over skips the acknowledgement): it
//! gets the turn.
//!
//! Everything handed around here is drop-safe. A [`Turn`] that is dropped passes the
//! turn on (unless it was revoked); a hand-over that reaches a waiter that has gone is
//! released (or handed on) by the code that made it.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

use crate::engine::deadline::later;
use crate::engine::lease::{Lease, OnLost};
use crate::token::Token;

/// Consecutive local hand-overs before the lock goes back through Redis.
pub(crate) const HANDOFF_BUDGET: u32 = 16;

/// What a waiting task is given.
pub(crate) enum Handed<L> {
    /// The lock itself, already moved to the waiter's token.
    Lock(L),
    /// The right to acquire through Redis.
    Turn(Turn),
}

/// A task waiting for the lock behind the local holder.
pub(crate) struct Waiter<L, H> {
    pub id: u64,
    /// The waiter's token: a hand-over moves the lock to it, and as representative the
    /// waiter acquires with it (so a hand-over whose reply was lost is recognised).
    pub token: Token,
    /// The handle the waiter acquires through: the lease it asked for.
    pub handle: H,
    /// How long the waiter has to take up a turn it is given.
    grace: std::time::Duration,
    tx: oneshot::Sender<Handed<L>>,
}

impl<L, H> Waiter<L, H> {
    /// Delivers to the waiter; gives the value back if it has gone.
    pub fn send(self, handed: Handed<L>) -> Result<(), Handed<L>> {
        self.tx.send(handed)
    }

    /// Whether the waiter is still there.
    pub fn is_waiting(&self) -> bool {
        !self.tx.is_closed()
    }
}

struct State<L, H> {
    /// A local task holds the lock, or is acquiring it as representative.
    busy: bool,
    /// The current turn; a [`Turn`] of another number was revoked.
    turn: u64,
    /// The lease of the local holder, while one holds the lock.
    holder: Option<Lease>,
    /// The lock was handed over to a waiter that has not taken it up yet: it holds in
    /// Redis until then, and not after (the turn is revoked if it is not taken up).
    handed_until: Option<tokio::time::Instant>,
    /// The turn was passed to a waiter that has not taken it up yet (its task may not be
    /// polled): revoked if it has not by then.
    turn_until: Option<tokio::time::Instant>,
    queue: VecDeque<Waiter<L, H>>,
    /// Hand-overs since the lock last came through Redis.
    streak: u32,
    /// The waiter picked for a hand-over under way (its script not answered yet).
    handing: Option<u64>,
    next_id: u64,
}

/// The local queue of one lock in one client; `H` is the handle a waiter acquires
/// through.
pub(crate) struct LocalLock<L, H> {
    state: std::sync::Mutex<State<L, H>>,
}

impl<L, H> Default for LocalLock<L, H> {
    fn default() -> Self {
        LocalLock {
            state: std::sync::Mutex::new(State {
                busy: false,
                turn: 0,
                holder: None,
                handed_until: None,
                turn_until: None,
                queue: VecDeque::new(),
                streak: 0,
                handing: None,
                next_id: 0,
            }),
        }
    }
}

impl<L, H> std::fmt::Debug for LocalLock<L, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock().expect("local lock");
        f.debug_struct("LocalLock")
            .field("busy", &st.busy)
            .field("waiting", &st.queue.len())
            .finish()
    }
}

/// How a task enters the queue.
pub(crate) enum Entry<L> {
    /// Nobody local had it: acquire through Redis now.
    Representative(Turn),
    /// Somebody local has it: wait on this (see [`LocalLock::wait`]).
    Queued(Queued<L>),
    /// Somebody local has it or is acquiring it, and the task only tries.
    Busy,
}

/// A place in the local queue.
pub(crate) struct Queued<L> {
    pub id: u64,
    rx: oneshot::Receiver<Handed<L>>,
}

impl<L: Send + 'static, H: Send + 'static> LocalLock<L, H> {
    /// Becomes the representative if nobody local has the lock — or the local holder's
    /// lease ended without a release, which revokes its turn; else, unless `try_only`,
    /// joins the queue (through `handle`).
    pub fn enter(
        self: &Arc<Self>,
        token: &Token,
        try_only: bool,
        grace: std::time::Duration,
        handle: impl FnOnce() -> H,
    ) -> Entry<L> {
        // Looking at the holder's lease ends it if it ran out, which revokes its turn
        // through the lease's hook (see `hold`): look before taking the state, which
        // the hook takes too.
        let holder = self.state.lock().expect("local lock").holder.clone();
        if let Some(lease) = holder {
            let _ = lease.is_held();
        }
        let mut st = self.state.lock().expect("local lock");
        self.revoke_if_not_taken_up(&mut st);
        if !st.busy {
            st.busy = true;
            return Entry::Representative(Turn::new(self.clone(), st.turn));
        }
        if try_only {
            return Entry::Busy;
        }
        let (tx, rx) = oneshot::channel();
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            token: token.clone(),
            handle: handle(),
            grace,
            tx,
        });
        Entry::Queued(Queued { id, rx })
    }

    /// Whether waiter `id` is still in the queue (not picked for a hand-over or a turn).
    pub fn is_queued(&self, id: u64) -> bool {
        self.state
            .lock()
            .expect("local lock")
            .queue
            .iter()
            .any(|w| w.id == id)
    }

    /// Leaves the queue (a waiter that gives up). False if it was already picked.
    pub fn leave(&self, id: u64) -> bool {
        let mut st = self.state.lock().expect("local lock");
        let before = st.queue.len();
        st.queue.retain(|w| w.id != id);
        st.queue.len() != before
    }

    /// The holder of `turn` holds the lock under `lease`. If the lease is lost — it
    /// runs out, or the lock is found gone — the turn is revoked and passed on at once:
    /// the next task goes to Redis instead of waiting for a guard that may live on long
    /// after its lease.
    pub fn hold(self: &Arc<Self>, turn: &Turn, lease: &Lease) {
        let mut st = self.state.lock().expect("local lock");
        if st.turn != turn.number || turn.local.is_none() {
            return;
        }
        st.holder = Some(lease.clone());
        st.handed_until = None;
        st.turn_until = None;
        st.handing = None;
        drop(st);
        let local: Weak<dyn OnLost> = Arc::downgrade(self) as Weak<Self>;
        lease.state.on_lost(local, turn.number);
    }

    /// Waits in the queue until a hand-over or the turn arrives, or until `deadline`
    /// (then `None`). Nothing but those wakes a waiter: a hand-over costs one task
    /// wake-up, however long the queue. (A holder whose lease is lost has its turn
    /// revoked by the lease itself, see [`hold`](Self::hold).)
    pub async fn wait(
        &self,
        queued: &mut Queued<L>,
        deadline: crate::engine::deadline::Deadline,
    ) -> Option<Handed<L>> {
        match deadline.bound(&mut queued.rx).await {
            Some(got) => got.ok(),
            None => None,
        }
    }

    /// Revokes turn `number` (its holder's lease ended without a release) and passes
    /// the turn on.
    fn revoke(self: &Arc<Self>, number: u64) {
        let mut st = self.state.lock().expect("local lock");
        if st.turn == number && st.busy {
            self.revoke_locked(&mut st);
        }
    }

    fn revoke_locked(self: &Arc<Self>, st: &mut State<L, H>) {
        // The next waiter gets a fresh turn; the revoked one's drop does nothing.
        st.turn += 1;
        st.streak = 0;
        let number = st.turn;
        self.give_turn(st, number);
    }

    /// Sends turn `number` to the first waiter still waiting, who has until its grace
    /// runs out to take it up (see `revoke_if_not_taken_up`); with nobody waiting the
    /// lock is no longer busy.
    fn give_turn(self: &Arc<Self>, st: &mut State<L, H>, number: u64) {
        st.holder = None;
        st.handed_until = None;
        st.turn_until = None;
        st.handing = None;
        while let Some(waiter) = st.queue.pop_front() {
            let until = later(tokio::time::Instant::now(), waiter.grace);
            match waiter.send(Handed::Turn(Turn::new(self.clone(), number))) {
                Ok(()) => {
                    st.turn_until = Some(until);
                    return;
                }
                // Gone: disarm the turn we got back (we hold the state) and go on.
                Err(Handed::Turn(mut turn)) => turn.local = None,
                Err(Handed::Lock(_)) => unreachable!("a turn was sent"),
            }
        }
        st.busy = false;
        st.streak = 0;
    }

    /// The next waiter to hand the lock to, within the hand-over budget — only for the
    /// current turn, and only if it `accepts` a hand-over (else the lock goes through
    /// Redis, and the turn to that waiter).
    pub fn next_for_handoff(&self, turn: &Turn, accepts: impl Fn(&H) -> bool) -> Option<Waiter<L, H>> {
        let mut st = self.state.lock().expect("local lock");
        if st.turn != turn.number || st.streak >= HANDOFF_BUDGET {
            return None;
        }
        while let Some(w) = st.queue.pop_front() {
            if w.is_waiting() && !accepts(&w.handle) {
                st.queue.push_front(w);
                return None;
            }
            if w.is_waiting() {
                st.streak += 1;
                st.holder = None;
                st.handing = Some(w.id);
                return Some(w);
            }
        }
        None
    }

    /// The lock was handed over under `turn` to a waiter, in Redis until `until`: if the
    /// waiter has not taken it up by then (its task is not being polled), the turn is
    /// revoked — by the next task that enters or looks (see [`look`](Self::look)) — so
    /// that the queue does not wait for it.
    pub fn handed_over(&self, turn: &Turn, until: tokio::time::Instant) {
        let mut st = self.state.lock().expect("local lock");
        if st.turn == turn.number {
            st.handed_until = Some(until);
            st.handing = None;
        }
    }

    /// Waiter `id` was picked for a hand-over that has not come (the releasing task
    /// stalled): the turn that hand-over carries is revoked, and the waiter takes a
    /// fresh one — it is still the next in line, and the tasks behind it wait for it
    /// rather than for the stalled release. `None` if the hand-over is no longer under
    /// way (it came, failed or was revoked meanwhile).
    pub fn take_over(self: &Arc<Self>, id: u64) -> Option<Turn> {
        let mut st = self.state.lock().expect("local lock");
        if st.handing != Some(id) || !st.busy {
            return None;
        }
        st.turn += 1;
        st.holder = None;
        st.handed_until = None;
        st.turn_until = None;
        st.handing = None;
        st.streak = 0;
        Some(Turn::new(self.clone(), st.turn))
    }

    /// The waiter that was passed `turn` (or a hand-over it cannot rely on, which
    /// carries it) has taken it up: its task runs, and acquires through Redis.
    pub fn taken_up(&self, turn: &Turn) {
        let mut st = self.state.lock().expect("local lock");
        if st.turn == turn.number {
            st.turn_until = None;
            st.handed_until = None;
        }
    }

    /// A queued task looks whether the lock was handed to a waiter that has not taken
    /// it up in time; if so the turn is revoked and passed on.
    pub fn look(self: &Arc<Self>) {
        let mut st = self.state.lock().expect("local lock");
        self.revoke_if_not_taken_up(&mut st);
    }

    fn revoke_if_not_taken_up(self: &Arc<Self>, st: &mut State<L, H>) {
        // The clock is read only when something was handed over or passed on.
        let lapsed = |until: Option<tokio::time::Instant>| {
            until.is_some_and(|until| tokio::time::Instant::now() >= until)
        };
        if (lapsed(st.handed_until) || lapsed(st.turn_until)) && st.busy {
            tracing::debug!("a local hand-over or turn was not taken up in time; the turn passes on");
            self.revoke_locked(st);
        }
    }

    /// The lock came through Redis: the hand-over budget starts again.
    pub fn acquired_through_redis(&self) {
        self.state.lock().expect("local lock").streak = 0;
    }

    /// Gives turn `number` to the next waiter, or marks the lock as not busy.
    fn pass_turn(self: &Arc<Self>, number: u64) {
        let mut st = self.state.lock().expect("local lock");
        if st.turn != number {
            return; // revoked: already passed on
        }
        self.give_turn(&mut st, number);
    }
}

/// A local holder's lease was lost: its turn (`number`) is revoked and passed on.
impl<L: Send + 'static, H: Send + 'static> OnLost for LocalLock<L, H> {
    fn lost(self: Arc<Self>, number: u64) {
        tracing::debug!("the local holder's lease was lost; its turn passes on");
        self.revoke(number);
    }
}

/// The right to be this client's holder (or representative) of a lock. Dropping it
/// passes the turn on, unless it was revoked meanwhile.
pub(crate) struct Turn {
    local: Option<Arc<dyn PassTurn>>,
    number: u64,
}

/// Object-safe access to `pass_turn` (a turn does not care what is handed over).
trait PassTurn: Send + Sync {
    fn pass(self: Arc<Self>, number: u64);
}

impl<L: Send + 'static, H: Send + 'static> PassTurn for LocalLock<L, H> {
    fn pass(self: Arc<Self>, number: u64) {
        self.pass_turn(number);
    }
}

impl Turn {
    fn new<L: Send + 'static, H: Send + 'static>(local: Arc<LocalLock<L, H>>, number: u64) -> Self {
        Turn {
            local: Some(local),
            number,
        }
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Turn({})", self.number)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            local.pass(self.number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::from_secret("t").unwrap()
    }

    fn local() -> Arc<LocalLock<(), ()>> {
        Arc::new(LocalLock::default())
    }

    #[test]
    fn turns_pass_in_arrival_order_and_skip_the_departed() {
        let local = local();
        let Entry::Representative(first) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!("the first task represents")
        };
        assert!(
            matches!(
                local.enter(&token(), true, std::time::Duration::from_secs(1), || ()),
                Entry::Busy
            ),
            "try_only does not queue"
        );
        let mut queued = Vec::new();
        for _ in 0..3 {
            match local.enter(&token(), false, std::time::Duration::from_secs(1), || ()) {
                Entry::Queued(q) => queued.push((q.id, q.rx)),
                _ => panic!("busy: queued"),
            }
        }
        // The second waiter gives up; the turn skips it.
        let (gone_id, gone_rx) = queued.remove(1);
        drop(gone_rx);
        drop(first);
        let (_, mut rx0) = queued.remove(0);
        let Ok(Handed::Turn(turn)) = rx0.try_recv() else {
            panic!("head gets the turn")
        };
        drop(turn);
        assert!(
            !local.leave(gone_id),
            "the departed waiter was taken out of the queue"
        );
        let (_, mut rx2) = queued.remove(0);
        let Ok(Handed::Turn(last)) = rx2.try_recv() else {
            panic!("the third gets the turn")
        };
        assert!(local.state.lock().unwrap().busy);
        drop(last);
        assert!(!local.state.lock().unwrap().busy, "the last turn frees the lock");
    }

    #[test]
    fn the_last_turn_frees_the_lock() {
        let local = local();
        let Entry::Representative(turn) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!()
        };
        drop(turn);
        assert!(!local.state.lock().unwrap().busy);
        assert!(matches!(
            local.enter(&token(), true, std::time::Duration::from_secs(1), || ()),
            Entry::Representative(_)
        ));
    }

    #[test]
    fn hand_overs_stop_at_the_budget() {
        let local = local();
        let Entry::Representative(rep) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!()
        };
        let mut rxs = Vec::new();
        for _ in 0..HANDOFF_BUDGET + 2 {
            if let Entry::Queued(q) = local.enter(&token(), false, std::time::Duration::from_secs(1), || ()) {
                let rx = q.rx;
                rxs.push(rx);
            }
        }
        for _ in 0..HANDOFF_BUDGET {
            assert!(local.next_for_handoff(&rep, |_| true).is_some());
        }
        assert!(local.next_for_handoff(&rep, |_| true).is_none(), "budget spent");
        local.acquired_through_redis();
        assert!(
            local.next_for_handoff(&rep, |_| true).is_some(),
            "budget restored"
        );
    }

    #[test]
    fn a_revoked_turn_neither_hands_over_nor_passes_again() {
        let local = local();
        let Entry::Representative(old) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!()
        };
        let Entry::Queued(Queued { rx: mut rx1, .. }) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!()
        };
        let Entry::Queued(Queued { rx: mut rx2, .. }) =
            local.enter(&token(), false, std::time::Duration::from_secs(1), || ())
        else {
            panic!()
        };
        local.revoke(old.number);
        let Ok(Handed::Turn(new)) = rx1.try_recv() else {
            panic!("the head gets a fresh turn")
        };
        assert!(
            local.next_for_handoff(&old, |_| true).is_none(),
            "the revoked turn hands nothing over"
        );
        drop(old);
        assert!(
            rx2.try_recv().is_err(),
            "dropping the revoked turn passed nothing on"
        );
        drop(new);
        assert!(
            matches!(rx2.try_recv(), Ok(Handed::Turn(_))),
            "the fresh turn passes on"
        );
    }
}
