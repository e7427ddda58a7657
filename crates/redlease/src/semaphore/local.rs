//! In-process queueing for the semaphore.
//!
//! When a task of this client already waits for permits in Redis (it registered), the
//! client's other tasks that want permits of the same semaphore line up here instead
//! of each registering: a permit released by a task of this client goes straight to the
//! first of them — the same permit, lease and token, renewed by the same client, with
//! no request at all. A budget of consecutive hand-overs keeps other processes from
//! being starved: after it, the permit is released through Redis, where it goes to the
//! earliest registered waiter of any process.
//!
//! At least one task of the client stays in Redis while tasks queue here: when the last
//! one that waits there stops waiting (it acquired, gave up or was cancelled), the first
//! queued task takes its turn to go to Redis. A local waiter is thus bounded exactly as
//! a waiter in Redis is.
//!
//! Everything handed around here is drop-safe: a [`Turn`] that is dropped passes the
//! turn on; a permit handed to a waiter that has gone is handed on or released by the
//! [`Permit`](super::Permit) it is wrapped in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::engine::deadline::Deadline;
use crate::engine::guard::GuardCore;

/// Consecutive local hand-overs before a permit goes back through Redis.
pub(crate) const HANDOFF_BUDGET: u32 = 16;

/// What a queued task is given.
pub(crate) enum Handed {
    /// Permits, held: the lease of the task that released them.
    Permits(Box<GuardCore>),
    /// The turn to acquire through Redis.
    Turn(Turn),
}

struct Waiter {
    id: u64,
    /// Permits wanted, the limit they are wanted under, and the lease length.
    permits: u32,
    limit: u32,
    ttl: Duration,
    tx: oneshot::Sender<Handed>,
}

#[derive(Default)]
struct State {
    /// Tasks of this client whose last attempt in Redis found too few permits (they
    /// registered there).
    busy_in_redis: u32,
    queue: VecDeque<Waiter>,
    /// Hand-overs since a permit last went back through Redis.
    streak: u32,
    next_id: u64,
}

/// The local queue of one semaphore in one client.
#[derive(Default)]
pub(crate) struct LocalSemaphore {
    state: std::sync::Mutex<State>,
}

impl std::fmt::Debug for LocalSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock().expect("local semaphore");
        f.debug_struct("LocalSemaphore")
            .field("busy_in_redis", &st.busy_in_redis)
            .field("waiting", &st.queue.len())
            .finish()
    }
}

/// How a task that will wait enters.
pub(crate) enum Entry {
    /// Nobody of this client waits in Redis: go there now.
    Redis(InRedis),
    /// A task of this client waits in Redis: wait here.
    Queued(Queued),
}

/// A place in the local queue.
pub(crate) struct Queued {
    id: u64,
    rx: oneshot::Receiver<Handed>,
}

impl LocalSemaphore {
    /// Goes to Redis when no task of this client waits there, else joins the queue for
    /// `permits` permits under `limit`, with leases of `ttl`.
    pub fn enter(self: &Arc<Self>, permits: u32, limit: u32, ttl: Duration) -> Entry {
        let mut st = self.state.lock().expect("local semaphore");
        if st.busy_in_redis == 0 {
            return Entry::Redis(InRedis::new(self.clone()));
        }
        let (tx, rx) = oneshot::channel();
        st.next_id += 1;
        let id = st.next_id;
        st.queue.push_back(Waiter {
            id,
            permits,
            limit,
            ttl,
            tx,
        });
        Entry::Queued(Queued { id, rx })
    }

    /// Waits in the queue until permits or the turn arrive, or until `deadline` (then
    /// `None`, and the place is given up; what was sent meanwhile is dropped, which
    /// passes it on).
    pub async fn wait(self: &Arc<Self>, queued: Queued, deadline: Deadline) -> Option<Handed> {
        let Queued { id, mut rx } = queued;
        match deadline.bound(&mut rx).await {
            Some(Ok(handed)) => Some(handed),
            // (Not expected: a queued waiter is only ever taken out to be sent
            // something.) Go to Redis.
            Some(Err(_)) => Some(Handed::Turn(Turn {
                local: Some(self.clone()),
            })),
            None => {
                let mut st = self.state.lock().expect("local semaphore");
                st.queue.retain(|w| w.id != id);
                drop(st);
                // A hand-over or a turn that came in the meantime is dropped here and
                // passed on.
                rx.close();
                let _ = rx.try_recv();
                None
            }
        }
    }

    /// Hands `core` (`permits` permits under `limit`, a lease of `ttl`) to the first
    /// queued task, if it wants exactly that, the lease still holds and the budget
    /// allows (`None`); else gives it back, to be released through Redis.
    pub fn hand_over(
        self: &Arc<Self>,
        core: GuardCore,
        permits: u32,
        limit: u32,
        ttl: Duration,
    ) -> Option<GuardCore> {
        let mut st = self.state.lock().expect("local semaphore");
        if st.queue.is_empty() {
            return Some(core);
        }
        if st.streak >= HANDOFF_BUDGET || !core.lease().is_held() {
            st.streak = 0;
            return Some(core);
        }
        let mut core = Box::new(core);
        while let Some(head) = st.queue.front() {
            if head.permits != permits || head.limit != limit || head.ttl != ttl {
                break;
            }
            let waiter = st.queue.pop_front().expect("a head");
            match waiter.tx.send(Handed::Permits(core)) {
                Ok(()) => {
                    st.streak += 1;
                    return None;
                }
                Err(Handed::Permits(back)) => core = back,
                Err(Handed::Turn(_)) => unreachable!("sent permits"),
            }
        }
        Some(*core)
    }

    /// A task of this client found too few permits in Redis and registered there.
    fn busy(&self) {
        self.state.lock().expect("local semaphore").busy_in_redis += 1;
    }

    /// A task that waited in Redis stopped waiting there: when it was the last, the
    /// first queued task goes to Redis.
    fn not_busy(self: &Arc<Self>) {
        let mut st = self.state.lock().expect("local semaphore");
        st.busy_in_redis -= 1;
        if st.busy_in_redis == 0 {
            self.pass_turn(&mut st);
        }
    }

    /// Gives the turn to go to Redis to the first queued task that is still there.
    fn pass_turn(self: &Arc<Self>, st: &mut State) {
        while let Some(waiter) = st.queue.pop_front() {
            let turn = Turn {
                local: Some(self.clone()),
            };
            match waiter.tx.send(Handed::Turn(turn)) {
                Ok(()) => return,
                // Gone: the turn came back; it must not pass itself on from inside this
                // lock.
                Err(Handed::Turn(mut turn)) => turn.local = None,
                Err(Handed::Permits(_)) => unreachable!("sent a turn"),
            }
        }
    }
}

/// A task's presence in Redis: counted as waiting there once its attempt found too few
/// permits, until it is dropped.
pub(crate) struct InRedis {
    local: Arc<LocalSemaphore>,
    busy: std::sync::atomic::AtomicBool,
}

impl InRedis {
    fn new(local: Arc<LocalSemaphore>) -> Self {
        InRedis {
            local,
            busy: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The task's attempt found too few permits and registered.
    pub fn found_busy(&self) {
        if !self.busy.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.local.busy();
        }
    }
}

impl Drop for InRedis {
    fn drop(&mut self) {
        if *self.busy.get_mut() {
            self.local.not_busy();
        } else {
            // It never waited there, but tasks may have queued behind another that
            // has stopped since: make sure one of them goes to Redis.
            let mut st = self.local.state.lock().expect("local semaphore");
            if st.busy_in_redis == 0 {
                self.local.pass_turn(&mut st);
            }
        }
    }
}

/// The turn to go to Redis, passed on if dropped unused.
pub(crate) struct Turn {
    local: Option<Arc<LocalSemaphore>>,
}

impl Turn {
    /// Goes to Redis with this turn.
    pub fn into_redis(mut self) -> InRedis {
        InRedis::new(self.local.take().expect("an unused turn"))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            let mut st = local.state.lock().expect("local semaphore");
            if st.busy_in_redis == 0 {
                local.pass_turn(&mut st);
            }
        }
    }
}
