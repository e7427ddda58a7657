//! In-process queueing for the semaphore.
//!
//! While a task of this client waits in Redis for `n` permits under a limit (it found
//! too few free and registered there), the client's other tasks that want as many under
//! the same limit line up here instead of each registering. When a task of the client
//! gives back `n` permits of that limit while one waits here, they go to it in one
//! atomic script (`sem_handoff.lua`): the permits move to the waiter's own token, held
//! for the waiter's claim window (as permits handed to a waiter in Redis are; the
//! waiter renews them once it takes them up, and without automatic renewal they get
//! the waiter's whole lease) — one round trip instead of a release, a hand-out and a
//! message, and nobody can slip in between. The old token
//! holds nothing afterwards. A budget of consecutive hand-overs keeps other processes
//! from being starved: after it, the permits go back through Redis, to the earliest
//! registered waiter of any process.
//!
//! Tasks that want another number of permits, or under another limit, never queue
//! behind a task that waits in Redis for something else: they go to Redis themselves.
//!
//! A task queued here is bounded as a waiter in Redis is: when the last task of its
//! request that waits in Redis stops waiting there (it acquired, gave up or was
//! cancelled), the first task queued for that request goes to Redis in its place. And it
//! does not rely on that task alone: after the claim window of a hand-over (at most
//! 2 s) without a hand-over, a queued task leaves the queue and goes to Redis itself —
//! so a permit freed without anyone being told (freed under another limit, or handed to
//! a waiter whose task is not being polled, which lapses after that window) is found by
//! a queued task within the same window as by a waiter in Redis. A task already picked
//! for a hand-over waits for it — its token is being handed permits, and must not be
//! used in Redis meanwhile — for one more claim window; if the releasing task stalled
//! that long, it goes to Redis with a fresh token (what the hand-over may still move
//! onto the old one comes to nobody, and is released).
//!
//! Everything handed around is drop-safe: a [`Turn`] dropped unused passes itself on; a
//! queued task that gives up leaves the queue, and what was sent to it meanwhile is
//! passed on (a turn) or handed on or released (permits, see
//! [`HandedPermits`](super::HandedPermits)).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::oneshot;

use super::{HandedPermits, Semaphore};
use crate::engine::deadline::Deadline;
use crate::token::Token;

/// Consecutive local hand-overs before permits go back through Redis.
pub(crate) const HANDOFF_BUDGET: u32 = 16;

/// What an acquisition asks for: only acquisitions of the same request queue behind
/// one another, and a release hands over only to the same request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub permits: u32,
    pub limit: u32,
}

/// What a queued task is given.
pub(crate) enum Handed {
    /// Its permits, already moved to its token.
    Permits(HandedPermits),
    /// The turn to acquire through Redis.
    Turn(Turn),
}

/// A task waiting here.
pub(crate) struct Waiter {
    id: u64,
    request: Request,
    /// The waiter's token: a hand-over moves the permits to it, and with a turn the
    /// waiter acquires through Redis with it (so a hand-over whose reply was lost is
    /// recognised there).
    pub token: Token,
    /// The waiter's handle: its lease options and TTL.
    pub semaphore: Semaphore,
    tx: oneshot::Sender<Handed>,
}

impl Waiter {
    /// Delivers to the waiter; gives the value back if it has gone.
    pub fn send(self, handed: Handed) -> Result<(), Handed> {
        self.tx.send(handed)
    }

    pub fn request(&self) -> Request {
        self.request
    }
}

#[derive(Default)]
struct State {
    /// Per request, how many tasks of this client wait for it in Redis.
    in_redis: Vec<(Request, u32)>,
    queue: VecDeque<Waiter>,
    /// Hand-overs since permits last went back through Redis.
    streak: u32,
    next_id: u64,
}

impl State {
    fn in_redis(&mut self, request: Request) -> &mut u32 {
        let at = match self.in_redis.iter().position(|(r, _)| *r == request) {
            Some(at) => at,
            None => {
                self.in_redis.push((request, 0));
                self.in_redis.len() - 1
            }
        };
        &mut self.in_redis[at].1
    }

    fn waiting_in_redis(&self, request: Request) -> bool {
        self.in_redis.iter().any(|(r, n)| *r == request && *n > 0)
    }
}

/// The local queue of one semaphore in one client (shared by every handle of it).
#[derive(Default)]
pub(crate) struct LocalSemaphore {
    state: std::sync::Mutex<State>,
}

impl std::fmt::Debug for LocalSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock().expect("local semaphore");
        f.debug_struct("LocalSemaphore")
            .field("in_redis", &st.in_redis)
            .field("waiting", &st.queue.len())
            .finish()
    }
}

/// How a task that will wait enters.
pub(crate) enum Entry {
    /// No task of this client waits in Redis for this request: go there now.
    Redis(InRedis),
    /// One does: wait here.
    Queued(Queued),
}

impl LocalSemaphore {
    /// Goes to Redis unless a task of this client waits there for the same `request`;
    /// then joins the queue, to be handed permits onto `token`.
    pub fn enter(self: &Arc<Self>, request: Request, token: &Token, semaphore: &Semaphore) -> Entry {
        let mut st = self.state.lock().expect("local semaphore");
        if !st.waiting_in_redis(request) {
            return Entry::Redis(InRedis::new(self.clone(), request));
        }
        let (tx, rx) = oneshot::channel();
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            request,
            token: token.clone(),
            semaphore: semaphore.clone(),
            tx,
        });
        Entry::Queued(Queued {
            id,
            rx,
            local: self.clone(),
        })
    }

    /// The presence in Redis of a task that goes there for `request` without a turn.
    pub fn to_redis(self: &Arc<Self>, request: Request) -> InRedis {
        InRedis::new(self.clone(), request)
    }

    /// How many tasks of this client wait here.
    pub fn queued(&self) -> usize {
        self.state.lock().expect("local semaphore").queue.len()
    }

    /// The first task queued for `request`, to hand permits of that request to — within
    /// the hand-over budget (`None` once it is spent, which starts it again: those
    /// permits go back through Redis).
    pub fn next_for_handoff(&self, request: Request) -> Option<Waiter> {
        let mut st = self.state.lock().expect("local semaphore");
        if st.queue.is_empty() {
            st.streak = 0;
            return None;
        }
        if st.streak >= HANDOFF_BUDGET {
            st.streak = 0;
            return None;
        }
        let at = st
            .queue
            .iter()
            .position(|w| w.request == request && !w.tx.is_closed())?;
        st.streak += 1;
        st.queue.remove(at)
    }

    /// Gives the turn to go to Redis to the first task queued for `request` that is
    /// still there.
    fn pass_turn(self: &Arc<Self>, st: &mut State, request: Request) {
        while let Some(at) = st.queue.iter().position(|w| w.request == request) {
            let waiter = st.queue.remove(at).expect("a waiter at its position");
            match waiter.send(Handed::Turn(Turn::new(self.clone(), request))) {
                Ok(()) => return,
                // Gone: the turn came back; it must not pass itself on from inside
                // this lock.
                Err(Handed::Turn(mut turn)) => turn.local = None,
                Err(Handed::Permits(_)) => unreachable!("a turn was sent"),
            }
        }
    }

    /// Passes the turn of `request` on when no task of this client waits for it in
    /// Redis (the queue behind it would otherwise wait for nobody).
    fn pass_turn_if_idle(self: &Arc<Self>, request: Request) {
        let mut st = self.state.lock().expect("local semaphore");
        if !st.waiting_in_redis(request) {
            self.pass_turn(&mut st, request);
        }
    }
}

/// A place in the local queue. Dropped, it leaves the queue, and what was sent to it
/// meanwhile is dropped too — which passes it on.
pub(crate) struct Queued {
    id: u64,
    rx: oneshot::Receiver<Handed>,
    local: Arc<LocalSemaphore>,
}

impl Queued {
    /// Waits until permits or the turn arrive, or until `deadline` (then `None`).
    pub async fn wait(&mut self, deadline: Deadline) -> Option<Handed> {
        match deadline.bound(&mut self.rx).await {
            Some(Ok(handed)) => Some(handed),
            // (Not expected: a queued task is only taken out of the queue to be sent
            // something.) Go to Redis.
            Some(Err(_)) => Some(Handed::Turn(Turn {
                local: None,
                request: None,
            })),
            None => None,
        }
    }
}

impl Queued {
    /// Leaves the queue, unless the task was picked already: then a hand-over onto its
    /// token is under way (or a turn on its way), and it must wait for what is sent —
    /// never use its token in Redis meanwhile (false).
    pub fn leave(&mut self) -> bool {
        let mut st = self.local.state.lock().expect("local semaphore");
        let before = st.queue.len();
        st.queue.retain(|w| w.id != self.id);
        st.queue.len() != before
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.leave();
        // Anything sent before we left is passed on as it is dropped (outside the lock).
        self.rx.close();
        drop(self.rx.try_recv());
    }
}

/// A task's presence in Redis for a request: counted as waiting there from its first
/// busy answer (it registered) until it is dropped.
pub(crate) struct InRedis {
    local: Arc<LocalSemaphore>,
    request: Request,
    busy: AtomicBool,
}

impl InRedis {
    fn new(local: Arc<LocalSemaphore>, request: Request) -> Self {
        InRedis {
            local,
            request,
            busy: AtomicBool::new(false),
        }
    }

    /// The task's attempt found too few permits and registered.
    pub fn found_busy(&self) {
        if !self.busy.swap(true, Ordering::AcqRel) {
            let mut st = self.local.state.lock().expect("local semaphore");
            *st.in_redis(self.request) += 1;
        }
    }
}

impl Drop for InRedis {
    fn drop(&mut self) {
        let mut st = self.local.state.lock().expect("local semaphore");
        if *self.busy.get_mut() {
            let n = st.in_redis(self.request);
            *n -= 1;
            if *n == 0 {
                st.in_redis.retain(|(_, n)| *n > 0);
            }
        }
        // The last task of the request in Redis stopped waiting there — or this one
        // never did, and tasks queued behind another that has stopped since: the first
        // of them goes to Redis.
        if !st.waiting_in_redis(self.request) {
            self.local.pass_turn(&mut st, self.request);
        }
    }
}

/// The turn to go to Redis, passed on if dropped unused.
pub(crate) struct Turn {
    local: Option<Arc<LocalSemaphore>>,
    request: Option<Request>,
}

impl Turn {
    fn new(local: Arc<LocalSemaphore>, request: Request) -> Self {
        Turn {
            local: Some(local),
            request: Some(request),
        }
    }

    /// A turn for a waiter whose hand-over did not complete.
    pub fn for_waiter(local: &Arc<LocalSemaphore>, waiter: &Waiter) -> Self {
        Turn::new(local.clone(), waiter.request)
    }

    /// Goes to Redis with this turn, for `request` (a turn from a sender that went
    /// away carries none).
    pub fn into_redis(mut self, local: &Arc<LocalSemaphore>, request: Request) -> InRedis {
        self.local = None;
        InRedis::new(local.clone(), request)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let (Some(local), Some(request)) = (self.local.take(), self.request) {
            local.pass_turn_if_idle(request);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(permits: u32) -> Request {
        Request { permits, limit: 3 }
    }

    fn state(local: &LocalSemaphore) -> std::sync::MutexGuard<'_, State> {
        local.state.lock().unwrap()
    }

    #[test]
    fn a_request_counts_in_redis_from_its_busy_answer_until_dropped() {
        let local = Arc::new(LocalSemaphore::default());
        let in_redis = InRedis::new(local.clone(), request(1));
        assert!(!state(&local).waiting_in_redis(request(1)));
        in_redis.found_busy();
        in_redis.found_busy();
        assert_eq!(state(&local).in_redis, vec![(request(1), 1)]);
        assert!(!state(&local).waiting_in_redis(request(2)), "per request");
        drop(in_redis);
        assert!(state(&local).in_redis.is_empty());
    }
}
