//! The renewal task: one per client, for all of its leases.
//!
//! Leases wait in a queue ordered by when their next renewal is due (a third of their
//! TTL after the last confirmation). The queue is shared by the task and the leases: a
//! lease enters it without waking the task (unless it is due before the task would
//! wake anyway) and leaves it the moment it ends, so a short holding costs an insert
//! and a removal, and nothing of it stays behind for the task to clean up. Each tick renews every lease that is due — and
//! those due soon, so that leases taken at slightly different times share ticks — in
//! one pipelined round trip (one per node on a cluster), instead of one timer task per
//! lock. A Redlock lease is renewed in the same tick by a round over its masters. A
//! renewal that finds the token gone ends the lease as `Gone`; one that fails (Redis
//! unreachable, slow) is retried until the lease's `valid_until`, where it ends as
//! `Expired`.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::deadline::later;
use super::lease::{LeaseState, LostReason, Place, Renew, Renewal, RenewalQueue};
use super::metrics;
use crate::script::eval_batch;
use crate::script::reply::int;
use crate::transport::{Batching, CommandConnection};

/// Leases due within this fraction of their interval are renewed in the same tick.
///
/// Half an interval makes the schedule converge: leases taken at different moments fall
/// into at most two groups after one interval, and those merge at the next, so a client
/// with many leases settles at one batch per interval. A lease is then renewed at most
/// half an interval early — at TTL/6 instead of TTL/3 after the previous renewal, which
/// still leaves it more than half of its lease.
const COALESCE_DIVISOR: u32 = 2;
/// Upper bound on how far ahead a tick looks for leases to coalesce.
const COALESCE_CAP: Duration = Duration::from_secs(5);
/// Upper bound on the delay before retrying a failed renewal.
const RETRY_CAP: Duration = Duration::from_millis(500);

struct Entry {
    lease: Arc<LeaseState>,
    epoch: u64,
}

/// A place in the queue: when the lease is due, and a sequence number that makes the
/// key unique.
type Key = Place;

/// Counters of one client's renewal work.
#[derive(Debug, Default)]
pub(crate) struct RenewalCounters {
    pub ticks: AtomicU64,
    pub round_trips: AtomicU64,
    pub renewed: AtomicU64,
    pub lost: AtomicU64,
}

/// The leases waiting for their next renewal, by due time.
#[derive(Default)]
struct Queue {
    entries: BTreeMap<Key, Entry>,
    seq: u64,
}

/// What the renewal task and the leases share.
struct Inbox {
    queue: std::sync::Mutex<Queue>,
    /// When the task will wake next, in nanoseconds after `base` (`u64::MAX`: never).
    /// A lease due later than this does not need to wake the task.
    wake_at: AtomicU64,
    base: Instant,
    notify: Notify,
    counters: RenewalCounters,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").finish_non_exhaustive()
    }
}

impl Inbox {
    /// Queues `lease` (scheduled as of `epoch`) to be renewed at `due`, in place of
    /// where it waited before.
    fn enqueue(self: &Arc<Self>, lease: &Arc<LeaseState>, due: Instant, epoch: u64) {
        let key = {
            let mut queue = self.queue.lock().expect("renewer lock");
            queue.seq += 1;
            let key = (due, queue.seq);
            queue.entries.insert(
                key,
                Entry {
                    lease: lease.clone(),
                    epoch,
                },
            );
            key
        };
        let queue: Weak<dyn RenewalQueue> = Arc::downgrade(self) as Weak<Inbox>;
        lease.slot.occupy(lease.epoch_counter(), queue, key, epoch);
    }
}

impl RenewalQueue for Inbox {
    fn remove(&self, place: Place) {
        let removed = self.queue.lock().expect("renewer lock").entries.remove(&place);
        // The lease (maybe its last reference) goes outside the lock.
        drop(removed);
    }

    fn ran_out(&self) {
        self.counters.lost.fetch_add(1, Ordering::Relaxed);
    }
}

/// Handle to the renewal task; the task stops when the last handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Renewer {
    inbox: Arc<Inbox>,
    _alive: Arc<mpsc::Sender<()>>,
}

impl Renewer {
    /// Starts the renewal task, sending each tick's renewals as `batching` says (one
    /// pipeline, or one per node on a cluster).
    pub fn spawn(conn: Arc<dyn CommandConnection>, batching: Batching) -> Self {
        let (alive, closed) = mpsc::channel(1);
        let inbox = Arc::new(Inbox {
            queue: std::sync::Mutex::new(Queue::default()),
            wake_at: AtomicU64::new(u64::MAX),
            base: Instant::now(),
            notify: Notify::new(),
            counters: RenewalCounters::default(),
        });
        tokio::spawn(run(conn, batching, inbox.clone(), closed));
        Renewer {
            inbox,
            _alive: Arc::new(alive),
        }
    }

    /// The renewal counters.
    pub fn counters(&self) -> &RenewalCounters {
        &self.inbox.counters
    }

    /// (Re)schedules `lease` to be renewed at its next due time; an earlier schedule of
    /// the same lease is dropped.
    pub fn schedule(&self, lease: &Arc<LeaseState>) {
        let epoch = lease.bump_epoch();
        let due = lease.next_renewal();
        self.inbox.enqueue(lease, due, epoch);
        // Wake the task only if this lease is due before it would wake anyway. (The
        // task publishes when it will wake under the queue's lock, after looking at the
        // queue: either it saw this lease, or this load sees its new wake time.)
        if nanos_after(self.inbox.base, due) < self.inbox.wake_at.load(Ordering::SeqCst) {
            self.inbox.notify.notify_one();
        }
    }
}

fn nanos_after(base: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(base)
        .as_nanos()
        .min(u128::from(u64::MAX - 1)) as u64
}

async fn run(
    conn: Arc<dyn CommandConnection>,
    batching: Batching,
    inbox: Arc<Inbox>,
    mut closed: mpsc::Receiver<()>,
) {
    let far = later(Instant::now(), Duration::from_secs(365 * 24 * 3600));
    let sleep = tokio::time::sleep_until(far);
    tokio::pin!(sleep);
    loop {
        {
            let queue = inbox.queue.lock().expect("renewer lock");
            let next = queue.entries.first_key_value().map(|((due, _), _)| *due);
            inbox.wake_at.store(
                next.map_or(u64::MAX, |t| nanos_after(inbox.base, t)),
                Ordering::SeqCst,
            );
            let target = next.unwrap_or(far);
            if sleep.deadline() != target {
                sleep.as_mut().reset(target);
            }
        }
        tokio::select! {
            _ = inbox.notify.notified() => {}
            _ = closed.recv() => {
                // Leases still queued keep nothing of the task alive.
                let left = std::mem::take(&mut inbox.queue.lock().expect("renewer lock").entries);
                drop(left);
                return;
            }
            _ = &mut sleep => {
                sleep.as_mut().reset(far);
                let batch = take_due(&inbox);
                if batch.is_empty() {
                    continue;
                }
                for (lease, due, epoch) in renew(&*conn, &batching, batch, &inbox.counters).await {
                    // An extend() may have rescheduled the lease while it was renewed, or
                    // the lease ended.
                    if lease.epoch() == epoch {
                        inbox.enqueue(&lease, due, epoch);
                    }
                }
            }
        }
    }
}

/// Removes and returns the live leases that are due now or within their coalescing window.
fn take_due(inbox: &Inbox) -> Vec<(Arc<LeaseState>, u64)> {
    let now = Instant::now();
    let horizon = later(now, COALESCE_CAP);
    let taken: Vec<Entry> = {
        let mut queue = inbox.queue.lock().expect("renewer lock");
        let mut keys = Vec::new();
        for (&(due, seq), entry) in queue.entries.range(..(horizon, u64::MAX)) {
            let stale = entry.epoch != entry.lease.epoch();
            let window = (entry.lease.scheduled_interval() / COALESCE_DIVISOR).min(COALESCE_CAP);
            if stale || due <= later(now, window) {
                keys.push((due, seq));
            }
        }
        keys.into_iter()
            .map(|key| queue.entries.remove(&key).expect("key was just listed"))
            .collect()
    };
    // Outside the lock: looking at a lease ends it if it ran out, and a lease that
    // ends leaves the queue.
    taken
        .into_iter()
        .filter(|entry| entry.epoch == entry.lease.epoch() && entry.lease.renewable())
        .map(|entry| (entry.lease, entry.epoch))
        .collect()
}

/// Renews a batch: the script leases in one round trip (one per node on a cluster),
/// the others by their own rounds, all at once. Returns the leases to requeue with
/// their due times.
async fn renew(
    conn: &dyn CommandConnection,
    batching: &Batching,
    batch: Vec<(Arc<LeaseState>, u64)>,
    counters: &RenewalCounters,
) -> Vec<(Arc<LeaseState>, Instant, u64)> {
    // Leases without automatic renewal are only looked at (which ends one that ran
    // out); those still held are looked at again at their new `valid_until`.
    let (batch, watched): (Vec<_>, Vec<_>) = batch.into_iter().partition(|(l, _)| l.auto_renew);
    let mut requeue: Vec<(Arc<LeaseState>, Instant, u64)> = watched
        .into_iter()
        .filter(|(l, _)| l.renewable())
        .map(|(l, epoch)| {
            let due = l.next_renewal();
            (l, due, epoch)
        })
        .collect();
    if batch.is_empty() {
        return requeue;
    }
    // The TTL each request asks for, read once: an extend may change it meanwhile.
    let ttls: Vec<Duration> = batch.iter().map(|(l, _)| l.ttl()).collect();
    let mut calls = Vec::new();
    let mut rounds = Vec::new();
    for (i, (lease, _)) in batch.iter().enumerate() {
        match &lease.renew {
            Renew::Script(call) => calls.push((call.script, call.cmd_with_ttl(ttls[i].as_millis() as u64))),
            Renew::Round(round) => rounds.push(round.renew(ttls[i])),
        }
    }
    let sent = Instant::now();
    let ((results, round_trips), round_results) = tokio::join!(
        eval_batch(conn, batching, &calls),
        futures_util::future::join_all(rounds)
    );
    counters.ticks.fetch_add(1, Ordering::Relaxed);
    counters.round_trips.fetch_add(round_trips, Ordering::Relaxed);
    metrics::renewal_round_trips(round_trips);
    tracing::trace!(leases = batch.len(), elapsed = ?sent.elapsed(), "renewal tick");
    let mut scripts = results.into_iter().map(|result| match result {
        Ok(reply) if int(&reply) == Some(1) => Renewal::Confirmed { sent },
        Ok(_) => Renewal::Gone,
        Err(e) => Renewal::Unreachable {
            error: Some(e.to_string()),
        },
    });
    let mut rounds = round_results.into_iter();
    for ((lease, epoch), ttl) in batch.into_iter().zip(ttls) {
        let outcome = match lease.renew {
            Renew::Script(_) => scripts.next(),
            Renew::Round(_) => rounds.next(),
        };
        let outcome = outcome.unwrap_or(Renewal::Unreachable { error: None });
        if let Some(due) = settle(&lease, ttl, outcome, counters) {
            requeue.push((lease, due, epoch));
        }
    }
    requeue
}

/// Applies what a renewal found to its lease; returns when to renew it next, if ever.
fn settle(
    lease: &LeaseState,
    ttl: Duration,
    outcome: Renewal,
    counters: &RenewalCounters,
) -> Option<Instant> {
    match outcome {
        Renewal::Confirmed { sent } => {
            // A lease that ended meanwhile (or ran out before the answer) is dropped
            // from the schedule by its end; the requeue below then finds it stale.
            let _ = lease.confirm(sent, ttl);
            counters.renewed.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(lock = %lease.name, "renewed");
            Some(lease.next_renewal())
        }
        Renewal::Gone => {
            if lease.end(LostReason::Gone) {
                counters.lost.fetch_add(1, Ordering::Relaxed);
            }
            None
        }
        Renewal::Unreachable { error } => {
            metrics::renewal_failed();
            let now = Instant::now();
            let valid_until = lease.valid_until();
            if now >= valid_until {
                tracing::warn!(lock = %lease.name, error = ?error, "renewal failed and the lease ran out");
                // Counted by the queue as the lease ends (`valid_until` may have ended
                // it already, as the holder's looking may have).
                lease.end(LostReason::Expired);
                None
            } else {
                tracing::debug!(lock = %lease.name, error = ?error, "renewal failed; retrying");
                let retry = (lease.interval() / 10).clamp(Duration::from_millis(20), RETRY_CAP);
                Some(later(now, retry).min(valid_until))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lease::Releasing;
    use crate::script::{MUTEX_EXTEND, ScriptCall};

    /// A connection that is never reached: these leases are not due for a minute.
    struct Unused;

    impl CommandConnection for Unused {
        fn send<'a>(&'a self, _: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
            unreachable!("no lease is due")
        }

        fn send_pipeline<'a>(
            &'a self,
            _: &'a redis::Pipeline,
        ) -> redis::RedisFuture<'a, Vec<redis::RedisResult<redis::Value>>> {
            unreachable!("no lease is due")
        }
    }

    fn lease() -> Arc<LeaseState> {
        let call = ScriptCall::new(&MUTEX_EXTEND, Arc::new([]), Arc::new([]));
        let ttl = Duration::from_secs(180);
        LeaseState::new(
            "l".into(),
            Instant::now(),
            ttl,
            ttl,
            Renew::Script(call),
            true,
            None,
        )
    }

    fn queued(renewer: &Renewer) -> usize {
        renewer.inbox.queue.lock().unwrap().entries.len()
    }

    #[tokio::test]
    async fn a_lease_waits_in_one_place_and_leaves_when_it_ends() {
        let renewer = Renewer::spawn(Arc::new(Unused), Batching::OnePipeline);
        let leases: Vec<_> = (0..100).map(|_| lease()).collect();
        for lease in &leases {
            renewer.schedule(lease);
        }
        // Rescheduling (an extend) moves a lease; it does not add a place.
        renewer.schedule(&leases[0]);
        renewer.schedule(&leases[0]);
        assert_eq!(queued(&renewer), 100);
        // Ended leases leave at once, nothing of them kept alive by the queue.
        for lease in &leases[..50] {
            lease.end(LostReason::Released);
        }
        assert_eq!(queued(&renewer), 50);
        assert!(leases[..50].iter().all(|l| Arc::strong_count(l) == 1));
        // A lease being released is renewed until its release is answered.
        let (held, releasing): (bool, Releasing) = leases[50].begin_release();
        assert!(held);
        assert_eq!(queued(&renewer), 50, "still renewed while releasing");
        drop(releasing);
        assert_eq!(queued(&renewer), 49, "gone once the release is answered");
    }
}
