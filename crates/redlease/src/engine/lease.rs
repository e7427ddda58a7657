//! Leases: how long a holder may act, and the signal that it may not any more.
//!
//! Every guard owns one lease. The lease knows the instant until which its holder may
//! rely on it (`valid_until`), computed from when the confirming request was *sent*
//! (not answered), minus a clock-drift margin, so it ends on the client before it can
//! end on the server.
//!
//! # Ordered lease state
//!
//! Renewals, extends and their retries may be in flight together, over different
//! connections, and their replies may be handled in any order. The lease stays right
//! whatever the order, because every request that moves a lease forward is monotone on
//! both sides:
//!
//! - on the server it never shortens the lease (`PEXPIRE … GT`, `ZADD … GT`, a legacy
//!   timestamp only ever pushed out): a stale renewal that lands after an extend
//!   changes nothing, so the server's expiry is at least `applied + ttl` of every
//!   request that was applied — and each was applied after it was sent;
//! - on the client a confirming reply only ever moves `valid_until` forward, to
//!   `sent + ttl − drift` of that request.
//!
//! So `valid_until` is never later than the server's expiry, whichever replies arrive
//! and in whatever order: the outcome is the same as if every request had been sent
//! one after the other. A reply saying the token no longer holds the lock ends the
//! lease for good: a token is never given a lock again once it lost it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::deadline::later;
use super::metrics::{self, Lost, Primitive};
use crate::script::ScriptCall;

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Redis says this holder's token no longer holds the lock: the key expired on the
    /// server, was deleted, was taken over, or the server lost it (a restart without
    /// persistence, a failover to a replica that never saw it).
    Gone,
    /// The lease could not be confirmed before it would have expired: Redis was
    /// unreachable or too slow. It may still exist on the server, but the holder can no
    /// longer rely on it.
    Expired,
    /// This process ended the lease itself: it released it, dropped its guard, or
    /// forgot it. Not a loss of safety.
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Gone => "the lock was lost on the server",
            LostReason::Expired => "the lease could not be renewed before it expired",
            LostReason::Released => "the lease was released",
        })
    }
}

/// The safety margin for clock drift between client and server over a lease of `ttl`:
/// 1% plus 2ms, as in the Redlock analysis.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The drift margin for relying on `remaining` of a lease of `ttl`: the lease's own
/// margin, but never more than a quarter of what is relied on — from a lease of about
/// 190 s up, 1% of it is a whole claim window of 2 s, and a lock handed over for that
/// window would be lost on arrival — nor less than the margin of the window itself.
pub(crate) fn drift_within(remaining: Duration, ttl: Duration) -> Duration {
    drift(ttl).min(remaining / 4).max(drift(remaining))
}

/// What a renewal (or an extend) found.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// The lease is held for `ttl` more from `sent`, when the request went out.
    Confirmed { sent: Instant },
    /// The token no longer holds the lock.
    Gone,
    /// No definite answer: Redis (or too many Redlock masters) could not be reached.
    Unreachable { error: Option<String> },
}

/// A lease renewed by something other than one script call on the client's own
/// connection: a Redlock lease, renewed by a round over all its masters.
pub(crate) trait RenewRound: Send + Sync + std::fmt::Debug + 'static {
    /// Renews the lease for `ttl` more.
    fn renew(&self, ttl: Duration) -> BoxFuture<'static, Renewal>;
}

/// How the renewal task renews a lease.
#[derive(Clone, Debug)]
pub(crate) enum Renew {
    /// One script call with the TTL appended, batched with the client's other renewals.
    Script(ScriptCall),
    /// A round of its own (Redlock).
    Round(Arc<dyn RenewRound>),
}

#[derive(Clone, Copy, Debug)]
struct State {
    /// The lease length renewals ask for.
    ttl: Duration,
    valid_until: Instant,
    /// When the latest confirming request was sent (minus what it found used up): the
    /// next renewal is due an interval after this.
    confirmed_at: Instant,
    ended: Option<LostReason>,
    /// The holder is releasing: the lease has ended for it (`Released`), but renewals
    /// go on until the release is answered, so that a slow release still tells a lease
    /// that was lost from one that was released.
    releasing: bool,
}

/// The lease machinery shared by a guard, its [`Lease`] handles and the renewal task.
#[derive(Debug)]
pub(crate) struct LeaseState {
    pub name: Arc<str>,
    state: std::sync::Mutex<State>,
    /// Signalled on every change of `state`.
    changed: Notify,
    /// Bumped whenever the renewal schedule of this lease changes; queue entries with an
    /// older epoch are stale.
    epoch: AtomicU64,
    /// Where the lease waits in the renewal task's queue.
    pub(crate) slot: Slot,
    pub renew: Renew,
    pub auto_renew: bool,
    /// Replicas that acknowledged the last acquire/extend under a replica-ack policy;
    /// `NO_ACK` without one.
    replicas_acked: AtomicU32,
    /// Told once when the lease is lost (ends for any reason but `Released`).
    on_lost: std::sync::Mutex<Option<LostHook>>,
    /// The kind of lock held, for the metrics; `None` for what is no holding (a
    /// waiter's entry).
    primitive: Option<Primitive>,
    /// When the holding began.
    since: Instant,
}

/// Something told when a lease is lost (see [`LeaseState::on_lost`]).
pub(crate) trait OnLost: Send + Sync + 'static {
    /// The lease it was registered for with `tag` was lost.
    fn lost(self: Arc<Self>, tag: u64);
}

/// Whom a lost lease tells, if it is still there, and with what.
struct LostHook {
    listener: Weak<dyn OnLost>,
    tag: u64,
}

impl LostHook {
    fn call(self) {
        if let Some(listener) = self.listener.upgrade() {
            listener.lost(self.tag);
        }
    }
}

impl std::fmt::Debug for LostHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LostHook")
    }
}

const NO_ACK: u32 = u32::MAX;

impl LeaseState {
    /// A lease of `ttl` confirmed by a request sent at `sent` whose reply said it has
    /// `remaining` (at most `ttl`) left on the server; a holding of a `primitive`, whose
    /// end the metrics count, or not.
    pub fn new(
        name: Arc<str>,
        sent: Instant,
        ttl: Duration,
        remaining: Duration,
        renew: Renew,
        auto_renew: bool,
        primitive: Option<Primitive>,
    ) -> Arc<Self> {
        let remaining = remaining.min(ttl);
        // A lease with less than its full TTL left (a retried acquire, a lock handed over
        // for a claim window) is first renewed once a third of what is left has passed,
        // as a full lease is after a third of its TTL: two thirds are still left for the
        // renewal to come back. (It counts as confirmed that much earlier.) A short hold
        // of a handed-over lock thus costs no renewal at all.
        let started = sent.checked_sub((ttl - remaining) / 3).unwrap_or(sent);
        Arc::new(LeaseState {
            name,
            state: std::sync::Mutex::new(State {
                ttl,
                valid_until: later(sent, remaining.saturating_sub(drift_within(remaining, ttl))),
                confirmed_at: started,
                ended: None,
                releasing: false,
            }),
            changed: Notify::new(),
            epoch: AtomicU64::new(0),
            slot: Slot::default(),
            renew,
            auto_renew,
            replicas_acked: AtomicU32::new(NO_ACK),
            on_lost: std::sync::Mutex::new(None),
            primitive,
            since: Instant::now(),
        })
    }

    /// The state, after ending the lease as `Expired` if it ran past `valid_until`
    /// unconfirmed: whoever looks first — `is_held`, `lost()`, the renewal task, a
    /// reply that came too late — sees the same, and an expired lease stays ended.
    fn state(&self) -> State {
        let (state, expired) = {
            let mut state = self.state.lock().expect("lease lock");
            let expired = Self::expire_locked(&mut state);
            (*state, expired)
        };
        if expired {
            self.ended_now(LostReason::Expired);
        }
        state
    }

    fn expire_locked(state: &mut State) -> bool {
        if state.ended.is_none() && Instant::now() >= state.valid_until {
            state.ended = Some(LostReason::Expired);
            return true;
        }
        false
    }

    /// What follows the end of the lease: waking `lost()`, dropping the renewal
    /// schedule, a log line.
    fn ended_now(&self, reason: LostReason) {
        self.measure_end(reason);
        self.changed.notify_waiters();
        let queue = self.unschedule();
        // A lease the renewal task was keeping ran out before a renewal could confirm
        // it, whoever noticed first: the task counts it.
        if reason == LostReason::Expired
            && self.auto_renew
            && let Some(queue) = queue.and_then(|q| q.upgrade())
        {
            queue.ran_out();
        }
        match reason {
            LostReason::Released => tracing::debug!(lock = %self.name, "lease ended"),
            _ => {
                tracing::warn!(lock = %self.name, %reason, "lease lost");
                let hook = self.on_lost.lock().expect("lease lock").take();
                if let Some(hook) = hook {
                    hook.call();
                }
            }
        }
    }

    /// Records the end of the holding in the metrics: called once, by whoever ended
    /// the lease.
    fn measure_end(&self, reason: LostReason) {
        if let Some(primitive) = self.primitive {
            let lost = match reason {
                LostReason::Gone => Some(Lost::Gone),
                LostReason::Expired => Some(Lost::Expired),
                LostReason::Released => None,
            };
            metrics::hold_ended(primitive, self.since, lost);
        }
    }

    /// Tells `listener` (if it is still there) once, with `tag`, if the lease is lost —
    /// when it ends for any reason but `Released`, whoever notices first (the renewal
    /// task, `lost()`, `is_held()`); at once if it already was. The renewal task looks
    /// at every lease by its `valid_until`, so a lease that simply runs out is noticed
    /// without anyone asking. (A listener and a tag rather than a closure: registering
    /// allocates nothing.)
    pub fn on_lost(&self, listener: Weak<dyn OnLost>, tag: u64) {
        let hook = LostHook { listener, tag };
        let lost = |ended: Option<LostReason>| matches!(ended, Some(r) if r != LostReason::Released);
        if lost(self.ended()) {
            hook.call();
            return;
        }
        *self.on_lost.lock().expect("lease lock") = Some(hook);
        // Someone may have ended it meanwhile, before the hook was in place. (A lease
        // that only ran out since is ended by whoever looks next, who finds the hook.)
        let ended = self.state.lock().expect("lease lock").ended;
        if lost(ended)
            && let Some(hook) = self.on_lost.lock().expect("lease lock").take()
        {
            hook.call();
        }
    }

    /// The lease length renewals ask for.
    pub fn ttl(&self) -> Duration {
        self.state().ttl
    }

    /// How often auto-renewal runs: a third of the TTL.
    pub fn interval(&self) -> Duration {
        self.ttl() / 3
    }

    /// [`interval`](Self::interval) without looking at whether the lease ran out
    /// (which would end it): for the renewal task, under its queue's lock.
    pub fn scheduled_interval(&self) -> Duration {
        self.state.lock().expect("lease lock").ttl / 3
    }

    pub fn valid_until(&self) -> Instant {
        self.state().valid_until
    }

    pub fn ended(&self) -> Option<LostReason> {
        self.state().ended
    }

    /// Whether the lease has neither ended nor run past `valid_until`.
    pub fn is_held(&self) -> bool {
        self.state().ended.is_none()
    }

    /// When the renewal task looks at the lease next: a third of the TTL after it was
    /// last confirmed to renew it, or — without automatic renewal — at `valid_until`,
    /// to notice that it ran out. (It does not look at whether the lease ran out: the
    /// renewal task does, when it comes to the lease, at the latest at `valid_until`.)
    pub fn next_renewal(&self) -> Instant {
        let s = *self.state.lock().expect("lease lock");
        if self.auto_renew {
            later(s.confirmed_at, s.ttl / 3)
        } else {
            s.valid_until
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The counter behind [`epoch`](Self::epoch), for the lease's [`Slot`].
    pub fn epoch_counter(&self) -> &AtomicU64 {
        &self.epoch
    }

    pub fn bump_epoch(&self) -> u64 {
        self.epoch.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Drops the renewal schedule: the lease leaves the renewal task's queue at once.
    /// Returns the queue it was scheduled in, if any.
    fn unschedule(&self) -> Option<Weak<dyn RenewalQueue>> {
        self.bump_epoch();
        self.slot.leave()
    }

    /// Records how many replicas acknowledged the last acquire or extend.
    pub fn set_replicas_acked(&self, n: u32) {
        self.replicas_acked.store(n.min(NO_ACK - 1), Ordering::Relaxed);
    }

    pub fn replicas_acked(&self) -> Option<u32> {
        Some(self.replicas_acked.load(Ordering::Relaxed)).filter(|&n| n != NO_ACK)
    }

    /// Records that a request sent at `sent` confirmed the lease for `ttl` more. Only
    /// ever moves the lease forward (see the module docs): a reply that proves less
    /// than an earlier one changes nothing.
    ///
    /// A reply that arrives after `valid_until` passed does not revive the lease: the
    /// holder may already have been told it was lost, and must not be told otherwise.
    /// Returns whether the lease is still held: an explicit extend answered too late
    /// (or after the lease ended otherwise) must not report success either.
    pub fn confirm(&self, sent: Instant, ttl: Duration) -> bool {
        {
            let mut state = self.state.lock().expect("lease lock");
            if Self::expire_locked(&mut state) {
                drop(state);
                self.ended_now(LostReason::Expired);
                return false;
            }
            if state.ended.is_some() && !state.releasing {
                return false;
            }
            let until = later(sent, ttl.saturating_sub(drift(ttl)));
            if until > state.valid_until {
                state.valid_until = until;
            }
            if sent > state.confirmed_at {
                state.confirmed_at = sent;
            }
        }
        self.changed.notify_waiters();
        true
    }

    /// Sets the lease length later renewals ask for (an extend succeeded).
    pub fn set_ttl(&self, ttl: Duration) {
        self.state.lock().expect("lease lock").ttl = ttl;
    }

    /// Whether the renewal task should still renew the lease: it has not ended, or its
    /// holder is releasing it.
    pub fn renewable(&self) -> bool {
        let s = self.state();
        s.ended.is_none() || s.releasing
    }

    /// The holder starts releasing: the lease ends for it (`Released`), but renewals
    /// go on until [`Releasing`] is dropped. Returns whether the lease was still held.
    pub fn begin_release(self: &Arc<Self>) -> (bool, Releasing) {
        let held = {
            let mut state = self.state.lock().expect("lease lock");
            let expired = Self::expire_locked(&mut state);
            let held = state.ended.is_none();
            if held {
                state.ended = Some(LostReason::Released);
                state.releasing = true;
            }
            (held, expired)
        };
        match held {
            (true, _) => {
                self.measure_end(LostReason::Released);
                self.changed.notify_waiters();
                tracing::debug!(lock = %self.name, "lease released");
            }
            (false, true) => self.ended_now(LostReason::Expired),
            (false, false) => {}
        }
        (held.0, Releasing(self.clone()))
    }

    /// Ends the lease; the first reason wins. Returns whether this call ended it.
    pub fn end(&self, reason: LostReason) -> bool {
        let ended = {
            let mut state = self.state.lock().expect("lease lock");
            let first = state.ended.is_none();
            if first {
                state.ended = Some(reason);
            }
            first
        };
        if ended {
            self.ended_now(reason);
        }
        ended
    }
}

/// A place in a renewal queue: when the lease is due, and a sequence number that makes
/// it unique.
pub(crate) type Place = (Instant, u64);

/// The renewal task's queue, as a lease sees it: something it can leave.
pub(crate) trait RenewalQueue: Send + Sync {
    /// Takes the lease at `place` out of the queue (nothing if it is not there).
    fn remove(&self, place: Place);

    /// A lease of this queue, renewed automatically, ran out before a renewal could
    /// confirm it.
    fn ran_out(&self);
}

/// Where a lease waits in the renewal task's queue, so that it leaves at once when it
/// ends.
#[derive(Default)]
pub(crate) struct Slot(std::sync::Mutex<Option<(Weak<dyn RenewalQueue>, Place)>>);

impl Slot {
    /// Records the lease's new `place` in `queue`, taken for the schedule of `epoch`,
    /// and takes the lease's old place out of its queue — or this new place, if the
    /// lease was rescheduled or ended since `epoch` (its epoch moves before its place
    /// does, so whoever moved it takes, or has taken, its own place).
    pub fn occupy(&self, current: &AtomicU64, queue: Weak<dyn RenewalQueue>, place: Place, epoch: u64) {
        let stale = {
            let mut slot = self.0.lock().expect("slot lock");
            if current.load(Ordering::Acquire) != epoch {
                Some((queue, place))
            } else {
                slot.replace((queue, place))
            }
        };
        if let Some((queue, place)) = stale {
            leave(&queue, place);
        }
    }

    /// Leaves the queue (the lease ended, or its holder finished releasing it); returns
    /// the queue it was in.
    pub fn leave(&self) -> Option<Weak<dyn RenewalQueue>> {
        let place = self.0.lock().expect("slot lock").take();
        let (queue, place) = place?;
        leave(&queue, place);
        Some(queue)
    }
}

fn leave(queue: &Weak<dyn RenewalQueue>, place: Place) {
    if let Some(queue) = queue.upgrade() {
        queue.remove(place);
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

/// A release in progress: the lease is renewed until it is dropped.
#[derive(Debug)]
pub(crate) struct Releasing(Arc<LeaseState>);

impl Drop for Releasing {
    fn drop(&mut self) {
        let lease = &self.0;
        let was = std::mem::replace(&mut lease.state.lock().expect("lease lock").releasing, false);
        if was {
            lease.unschedule();
        }
    }
}

/// A handle on a held lease: until when it is safe to act, and a signal when it is lost.
///
/// Cheap to clone; clones observe the same lease, so one can be moved into a task that
/// watches [`lost`](Lease::lost) while the guard stays with the code doing the work.
#[derive(Clone, Debug)]
pub struct Lease {
    pub(crate) state: Arc<LeaseState>,
}

impl Lease {
    pub(crate) fn new(state: Arc<LeaseState>) -> Self {
        Lease { state }
    }

    /// The lock this lease belongs to.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The current lease length (renewals extend the lease by this much).
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// The instant until which the holder may rely on the lease: when the confirming
    /// request was sent, plus the TTL, minus a drift margin (1% + 2ms). It only ever
    /// moves forward.
    pub fn valid_until(&self) -> std::time::Instant {
        self.state.valid_until().into_std()
    }

    /// Whether the lease has neither ended nor run past [`valid_until`](Lease::valid_until).
    /// Once `valid_until` has passed unconfirmed the lease has ended
    /// ([`LostReason::Expired`]) for good: a renewal reply that comes later does not
    /// revive it.
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }

    /// How many replicas acknowledged the last acquire or explicit extend, when the lock
    /// has a [`ReplicaAck`](crate::ReplicaAck) policy; `None` without one. Automatic
    /// renewals do not wait for replicas and leave this unchanged.
    pub fn replicas_acked(&self) -> Option<u32> {
        self.state.replicas_acked()
    }

    /// Why the lease ended, or `None` while it has not.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state.ended()
    }

    /// Completes when the lease ends, with the reason.
    ///
    /// Fires with [`LostReason::Gone`] when a renewal finds the token no longer holds
    /// the lock, and with [`LostReason::Expired`] once `valid_until` passes without a
    /// confirming renewal — even if the renewal task itself is stuck. Fires with
    /// [`LostReason::Released`] when this process releases the lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future changes nothing.
    pub async fn lost(&self) -> LostReason {
        let state = &self.state;
        loop {
            let changed = state.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = state.state();
            if let Some(reason) = now.ended {
                return reason;
            }
            tokio::select! {
                _ = changed => {}
                // Looking at the state again ends the lease if it ran out.
                _ = tokio::time::sleep_until(now.valid_until) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::MUTEX_EXTEND;

    fn lease(ttl: Duration) -> Arc<LeaseState> {
        let call = ScriptCall::new(&MUTEX_EXTEND, Arc::new([]), Arc::new([]));
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

    #[tokio::test]
    async fn replies_in_any_order_only_move_the_lease_forward() {
        let l = lease(Duration::from_secs(3));
        let t0 = Instant::now();
        // An extend to 60 s sent after a renewal for 3 s: whichever reply comes last,
        // the lease is the extend's.
        l.confirm(t0 + Duration::from_millis(10), Duration::from_secs(60));
        l.confirm(t0, Duration::from_secs(3));
        let extended = l.valid_until();
        assert!(extended > t0 + Duration::from_secs(59));
        assert_eq!(
            l.next_renewal(),
            later(t0 + Duration::from_millis(10), Duration::from_secs(1))
        );
        l.set_ttl(Duration::from_secs(60));
        assert_eq!(
            l.next_renewal(),
            t0 + Duration::from_millis(10) + Duration::from_secs(20)
        );
        l.confirm(t0 + Duration::from_millis(20), Duration::from_secs(3));
        assert_eq!(
            l.valid_until(),
            extended,
            "a later but shorter renewal proves less"
        );
    }

    #[tokio::test]
    async fn a_short_lease_is_first_renewed_after_a_third_of_what_is_left() {
        let call = ScriptCall::new(&MUTEX_EXTEND, Arc::new([]), Arc::new([]));
        let sent = Instant::now();
        let ttl = Duration::from_secs(30);
        // A lock handed over for a 3 s claim window: renewed after 1 s, with 2 s left.
        let handed = LeaseState::new(
            "l".into(),
            sent,
            ttl,
            Duration::from_secs(3),
            Renew::Script(call.clone()),
            true,
            None,
        );
        assert_eq!(handed.next_renewal(), later(sent, Duration::from_secs(1)));
        assert_eq!(
            handed.valid_until(),
            later(sent, Duration::from_secs(3) - drift(ttl))
        );
        // A full lease: after a third of its TTL.
        let full = LeaseState::new("l".into(), sent, ttl, ttl, Renew::Script(call), true, None);
        assert_eq!(full.next_renewal(), later(sent, Duration::from_secs(10)));
    }

    #[tokio::test]
    async fn an_ended_lease_stays_ended() {
        let l = lease(Duration::from_secs(3));
        let before = l.valid_until();
        assert!(l.end(LostReason::Gone));
        assert!(!l.end(LostReason::Released), "the first reason wins");
        assert!(!l.confirm(Instant::now(), Duration::from_secs(60)));
        assert_eq!(l.valid_until(), before);
        assert_eq!(l.ended(), Some(LostReason::Gone));
        assert!(!l.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_confirmation_does_not_revive_an_expired_lease() {
        let l = lease(Duration::from_millis(300));
        let sent = Instant::now();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            !l.confirm(sent, Duration::from_secs(60)),
            "the confirmation says the lease is not held"
        );
        assert_eq!(l.ended(), Some(LostReason::Expired));
        assert!(!l.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_valid_until_without_any_renewal() {
        let l = lease(Duration::from_millis(300));
        let lease = Lease::new(l.clone());
        let started = Instant::now();
        assert_eq!(lease.lost().await, LostReason::Expired);
        assert!(started.elapsed() >= Duration::from_millis(290));
        assert!(!lease.is_held());
    }
}
