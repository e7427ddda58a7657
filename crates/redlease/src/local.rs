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
//! Everything handed around here is drop-safe. A [`Turn`] that is dropped passes the
//! turn on; a hand-over that reaches a waiter that has gone is released (or handed on)
//! by the code that made it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

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
pub(crate) struct Waiter<L> {
    pub id: u64,
    /// The waiter's token: a hand-over moves the lock to it, and as representative the
    /// waiter acquires with it (so a hand-over whose reply was lost is recognised).
    pub token: Token,
    tx: oneshot::Sender<Handed<L>>,
}

impl<L> Waiter<L> {
    /// Delivers to the waiter; gives the value back if it has gone.
    pub fn send(self, handed: Handed<L>) -> Result<(), Handed<L>> {
        self.tx.send(handed)
    }

    /// Whether the waiter is still there.
    pub fn is_waiting(&self) -> bool {
        !self.tx.is_closed()
    }
}

struct State<L> {
    /// A local task holds the lock, or is acquiring it as representative.
    busy: bool,
    queue: VecDeque<Waiter<L>>,
    /// Hand-overs since the lock last came through Redis.
    streak: u32,
    next_id: u64,
}

/// The local queue of one lock in one client.
pub(crate) struct LocalLock<L> {
    state: std::sync::Mutex<State<L>>,
}

impl<L> std::fmt::Debug for LocalLock<L> {
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
    /// Somebody local has it: wait on this.
    Queued(u64, oneshot::Receiver<Handed<L>>),
}

impl<L: Send + 'static> LocalLock<L> {
    fn new() -> Self {
        LocalLock {
            state: std::sync::Mutex::new(State {
                busy: false,
                queue: VecDeque::new(),
                streak: 0,
                next_id: 0,
            }),
        }
    }

    /// Becomes the representative if nobody local has the lock; else, unless
    /// `try_only`, joins the queue. `None`: busy and `try_only`.
    pub fn enter(self: &Arc<Self>, token: &Token, try_only: bool) -> Option<Entry<L>> {
        let mut st = self.state.lock().expect("local lock");
        if !st.busy {
            st.busy = true;
            return Some(Entry::Representative(Turn::new(self.clone())));
        }
        if try_only {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            token: token.clone(),
            tx,
        });
        Some(Entry::Queued(id, rx))
    }

    /// Leaves the queue (a waiter that gives up). False if it was already picked.
    pub fn leave(&self, id: u64) -> bool {
        let mut st = self.state.lock().expect("local lock");
        let before = st.queue.len();
        st.queue.retain(|w| w.id != id);
        st.queue.len() != before
    }

    /// The next waiter to hand the lock to, within the hand-over budget.
    pub fn next_for_handoff(&self) -> Option<Waiter<L>> {
        let mut st = self.state.lock().expect("local lock");
        if st.streak >= HANDOFF_BUDGET {
            return None;
        }
        while let Some(w) = st.queue.pop_front() {
            if w.is_waiting() {
                st.streak += 1;
                return Some(w);
            }
        }
        None
    }

    /// The lock came through Redis: the hand-over budget starts again.
    pub fn acquired_through_redis(&self) {
        self.state.lock().expect("local lock").streak = 0;
    }

    /// Gives the turn to the next waiter, or marks the lock as not busy.
    fn pass_turn(self: &Arc<Self>) {
        loop {
            let waiter = {
                let mut st = self.state.lock().expect("local lock");
                match st.queue.pop_front() {
                    Some(w) => w,
                    None => {
                        st.busy = false;
                        st.streak = 0;
                        return;
                    }
                }
            };
            match waiter.send(Handed::Turn(Turn::new(self.clone()))) {
                Ok(()) => return,
                // Gone: disarm the turn we got back and try the next one.
                Err(Handed::Turn(mut turn)) => turn.local = None,
                Err(Handed::Lock(_)) => unreachable!("a turn was sent"),
            }
        }
    }
}

/// The right to be this client's holder (or representative) of a lock. Dropping it
/// passes the turn on.
pub(crate) struct Turn {
    local: Option<Arc<dyn PassTurn>>,
}

/// Object-safe access to `pass_turn` (a turn does not care what is handed over).
trait PassTurn: Send + Sync {
    fn pass(self: Arc<Self>);
}

impl<L: Send + 'static> PassTurn for LocalLock<L> {
    fn pass(self: Arc<Self>) {
        self.pass_turn();
    }
}

impl Turn {
    fn new<L: Send + 'static>(local: Arc<LocalLock<L>>) -> Self {
        Turn { local: Some(local) }
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Turn")
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            local.pass();
        }
    }
}

/// The local queues of one client, by lock key; entries go when no handle uses them.
pub(crate) struct Registry<L> {
    locks: std::sync::Mutex<HashMap<Arc<str>, Weak<LocalLock<L>>>>,
}

impl<L> Default for Registry<L> {
    fn default() -> Self {
        Registry {
            locks: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

impl<L> std::fmt::Debug for Registry<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

impl<L: Send + 'static> Registry<L> {
    /// The queue of `key`, shared by every handle of that lock in this client.
    pub fn get(&self, key: &Arc<str>) -> Arc<LocalLock<L>> {
        let mut locks = self.locks.lock().expect("registry lock");
        if let Some(existing) = locks.get(key).and_then(Weak::upgrade) {
            return existing;
        }
        if locks.len() > 64 && locks.len().is_power_of_two() {
            locks.retain(|_, w| w.strong_count() > 0);
        }
        let fresh = Arc::new(LocalLock::new());
        locks.insert(key.clone(), Arc::downgrade(&fresh));
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::from_secret("t").unwrap()
    }

    #[test]
    fn turns_pass_in_arrival_order_and_skip_the_departed() {
        let local: Arc<LocalLock<()>> = Arc::new(LocalLock::new());
        let Some(Entry::Representative(first)) = local.enter(&token(), false) else {
            panic!("the first task represents")
        };
        assert!(local.enter(&token(), true).is_none(), "try_only does not queue");
        let mut queued = Vec::new();
        for _ in 0..3 {
            match local.enter(&token(), false) {
                Some(Entry::Queued(id, rx)) => queued.push((id, rx)),
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
        // The departed waiter is skipped: the third one gets the turn.
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
        let local: Arc<LocalLock<()>> = Arc::new(LocalLock::new());
        let Some(Entry::Representative(turn)) = local.enter(&token(), false) else {
            panic!()
        };
        drop(turn);
        assert!(!local.state.lock().unwrap().busy);
        assert!(matches!(
            local.enter(&token(), true),
            Some(Entry::Representative(_))
        ));
    }

    #[test]
    fn hand_overs_stop_at_the_budget() {
        let local: Arc<LocalLock<()>> = Arc::new(LocalLock::new());
        let _rep = local.enter(&token(), false);
        let mut rxs = Vec::new();
        for _ in 0..HANDOFF_BUDGET + 2 {
            if let Some(Entry::Queued(_, rx)) = local.enter(&token(), false) {
                rxs.push(rx);
            }
        }
        for _ in 0..HANDOFF_BUDGET {
            assert!(local.next_for_handoff().is_some());
        }
        assert!(local.next_for_handoff().is_none(), "budget spent");
        local.acquired_through_redis();
        assert!(local.next_for_handoff().is_some(), "budget restored");
    }
}
