//! The renewal task: one per client, for all of its leases.
//!
//! Leases wait in a queue ordered by when their next renewal is due (a third of their
//! TTL after the last confirmation). Each tick renews every lease that is due — and
//! those due soon, so that leases taken at slightly different times share ticks — in
//! one pipelined round trip (one per node on a cluster), instead of one timer task per
//! lock. A Redlock lease is renewed in the same tick by a round over its masters. A
//! renewal that finds the token gone ends the lease as `Gone`; one that fails (Redis
//! unreachable, slow) is retried until the lease's `valid_until`, where it ends as
//! `Expired`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::deadline::later;
use super::lease::{LeaseState, LostReason, Renew, Renewal};
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

type Scheduled = (Arc<LeaseState>, Instant, u64);

/// Counters of one client's renewal work.
#[derive(Debug, Default)]
pub(crate) struct RenewalCounters {
    pub ticks: AtomicU64,
    pub round_trips: AtomicU64,
    pub renewed: AtomicU64,
    pub lost: AtomicU64,
}

/// What leases hand to the renewal task.
#[derive(Debug)]
struct Inbox {
    /// Newly scheduled leases, drained by the task when it wakes.
    pending: std::sync::Mutex<Vec<Scheduled>>,
    /// When the task will wake next, in nanoseconds after `base` (`u64::MAX`: never).
    /// A lease due later than this does not need to wake the task.
    wake_at: AtomicU64,
    base: Instant,
    notify: Notify,
    counters: RenewalCounters,
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
            pending: std::sync::Mutex::new(Vec::new()),
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
        self.inbox
            .pending
            .lock()
            .expect("renewer lock")
            .push((lease.clone(), due, epoch));
        // Wake the task only if this lease is due before it would wake anyway.
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
    let mut queue: BTreeMap<(Instant, u64), Entry> = BTreeMap::new();
    let mut seq: u64 = 0;
    let mut push = |queue: &mut BTreeMap<(Instant, u64), Entry>, (lease, due, epoch): Scheduled| {
        seq += 1;
        queue.insert((due, seq), Entry { lease, epoch });
    };
    let far = later(Instant::now(), Duration::from_secs(365 * 24 * 3600));
    let sleep = tokio::time::sleep_until(far);
    tokio::pin!(sleep);
    loop {
        // Drain new leases; publish when we will wake; drain again in case a lease was
        // added before the new wake time was visible to it.
        loop {
            let drained = std::mem::take(&mut *inbox.pending.lock().expect("renewer lock"));
            let was_empty = drained.is_empty();
            for scheduled in drained {
                push(&mut queue, scheduled);
            }
            let next = queue.first_key_value().map(|((due, _), _)| *due);
            inbox.wake_at.store(
                next.map_or(u64::MAX, |t| nanos_after(inbox.base, t)),
                Ordering::SeqCst,
            );
            if was_empty && inbox.pending.lock().expect("renewer lock").is_empty() {
                let target = next.unwrap_or(far);
                if sleep.deadline() != target {
                    sleep.as_mut().reset(target);
                }
                break;
            }
        }
        tokio::select! {
            _ = inbox.notify.notified() => {}
            _ = closed.recv() => return,
            _ = &mut sleep => {
                sleep.as_mut().reset(far);
                let batch = take_due(&mut queue);
                if batch.is_empty() {
                    continue;
                }
                for (lease, due, epoch) in renew(&*conn, &batching, batch, &inbox.counters).await {
                    // An extend() may have rescheduled the lease while it was renewed.
                    if lease.epoch() == epoch {
                        push(&mut queue, (lease, due, epoch));
                    }
                }
            }
        }
    }
}

/// Removes and returns the live leases that are due now or within their coalescing window.
fn take_due(queue: &mut BTreeMap<(Instant, u64), Entry>) -> Vec<(Arc<LeaseState>, u64)> {
    let now = Instant::now();
    let horizon = later(now, COALESCE_CAP);
    let mut keys = Vec::new();
    for (&(due, seq), entry) in queue.range(..(horizon, u64::MAX)) {
        let stale = entry.epoch != entry.lease.epoch() || !entry.lease.renewable();
        let window = (entry.lease.interval() / COALESCE_DIVISOR).min(COALESCE_CAP);
        if stale || due <= later(now, window) {
            keys.push((due, seq));
        }
    }
    let mut batch = Vec::with_capacity(keys.len());
    for key in keys {
        let entry = queue.remove(&key).expect("key was just listed");
        if entry.epoch == entry.lease.epoch() && entry.lease.renewable() {
            batch.push((entry.lease, entry.epoch));
        }
    }
    batch
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
            lease.confirm(sent, ttl);
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
                if lease.end(LostReason::Expired) {
                    counters.lost.fetch_add(1, Ordering::Relaxed);
                }
                None
            } else {
                tracing::debug!(lock = %lease.name, error = ?error, "renewal failed; retrying");
                let retry = (lease.interval() / 10).clamp(Duration::from_millis(20), RETRY_CAP);
                Some(later(now, retry).min(valid_until))
            }
        }
    }
}
