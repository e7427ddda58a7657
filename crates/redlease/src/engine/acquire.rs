//! The acquire machinery every primitive shares: the attempt loop that waits for
//! wake-ups in between, and the acquisition of one lease through Redis with its
//! cleanup when the caller goes away after a request may have landed.

use std::future::Future;
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;

use super::context::Context;
use super::deadline::{Deadline, Wait, later};
use super::guard::{GuardCore, Held, LockBase};
use super::lease::drift_within;
use super::metrics::{self, AcquireCall, Handover, Primitive};
use super::notify::{GrantSlot, Subscription, WakeDebt};
use super::request::Acked;
use crate::error::{Error, Result};
use crate::script::reply::{array, int, ms};
use crate::script::{LuaScript, ScriptCall};
use crate::token::Token;

/// What one acquire attempt found.
pub(crate) enum Attempt<T> {
    /// Got it.
    Acquired(T),
    /// Someone else has it.
    Busy(Busy),
}

/// A busy answer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Busy {
    /// The wait should not outlast this (the holder's remaining lease), when known.
    pub remaining: Option<Duration>,
    /// Busy for this waiter, but what was freed could serve another local waiter (a
    /// semaphore waiter that needs more permits than are free): a wake-up this waiter
    /// consumed is passed on, at most once per message, instead of being swallowed.
    pub pass_on: bool,
    /// The highest fencing token issued for the lock when the attempt ran, when the
    /// primitive reports it: a hand-over with a fence not above it was made before
    /// the attempt, and is stale (the attempt would have found the lock ours).
    pub mark: Option<u64>,
    /// The holder is not a client whose release wakes waiters (another library's lock,
    /// or a key without a TTL): the waiter polls, backing off from a few milliseconds
    /// to [`POLL_MAX`], instead of waiting for a wake-up that will not come.
    pub foreign: bool,
}

/// The longest a waiter with a lease of `ttl` sleeps between attempts when nothing
/// wakes it: its own lease, but at least a second (besides half its registration's life
/// and the holder's remaining lease, which bound it too).
pub(crate) fn look_again(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(1))
}

/// The first and the longest pause between the attempts of a waiter that polls a
/// foreign holder.
const POLL_FIRST: Duration = Duration::from_millis(4);
const POLL_MAX: Duration = Duration::from_millis(100);

/// How an acquire waits.
pub(crate) struct Waiting<'a> {
    pub ctx: &'a Context,
    /// The kind of lock, for the metrics.
    pub primitive: Primitive,
    pub name: &'a str,
    pub channel: &'a str,
    pub wait: Wait,
    /// Fallback wait when the holder's remaining lease is unknown.
    pub fallback: Duration,
    /// The waiter's public id, when a release may hand it the lock directly (a message
    /// `g <id> <details>` on `channel`).
    pub grant: Option<&'a str>,
}

/// Runs `attempt` until it acquires, waiting for wake-ups in between; every attempt
/// is given the call's deadline, which also bounds a request in flight.
///
/// The first attempt goes out at once (one round trip when uncontended). After a busy
/// answer the waiter subscribes to the lock's channel, waits for the subscription to
/// be confirmed, and tries again — a release between the two attempts is thus never
/// missed. (When another local waiter already listens on the channel, the waiter
/// joins that subscription before its first attempt instead, and needs no second.)
/// From then on it sleeps until a wake-up, the holder's remaining lease (plus jitter),
/// or its deadline, whichever comes first.
///
/// With a grant id, the waiter also takes a lock handed to it by a release: `on_grant`
/// turns the grant's details into the acquisition, or `None` when the grant turned out
/// stale (then the waiter tries again).
pub(crate) async fn acquire_loop<T, F, Fut, G, GFut>(
    spec: Waiting<'_>,
    mut attempt: F,
    mut on_grant: G,
) -> Result<T>
where
    F: FnMut(Deadline) -> Fut,
    Fut: Future<Output = Result<Attempt<T>>>,
    G: FnMut(String) -> GFut,
    GFut: Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    let deadline = spec.wait.deadline();
    let mut sub: Option<Subscription> = None;
    let mut grant: Option<GrantSlot> = None;
    let mut debt: Option<WakeDebt> = None;
    // The wake-up generation seen by the previous attempt: a pass-on does not bump it,
    // so a wake-up is passed on only by waiters that had not yet tried since it came.
    let mut previous = None;
    // The next pause when polling a foreign holder.
    let mut poll = POLL_FIRST;
    if spec.wait.waits()
        && let Some(s) = spec.ctx.notifier.join_live(spec.channel)
    {
        grant = spec.grant.map(|id| s.expect_grant(id));
        sub = Some(s);
    }
    loop {
        let seen = sub.as_ref().map(Subscription::generation);
        let outcome = attempt(deadline).await;
        let pass_on = matches!(&outcome, Ok(Attempt::Busy(b)) if b.pass_on) && seen != previous;
        previous = seen;
        if let Some(d) = debt.take() {
            if pass_on {
                drop(d); // an unsettled debt wakes another local waiter
            } else {
                d.settle();
            }
        }
        let (remaining, foreign) = match outcome? {
            Attempt::Acquired(value) => {
                tracing::debug!(lock = %spec.name, waited = ?started.elapsed(), "acquired");
                return Ok(value);
            }
            Attempt::Busy(busy) => (busy.remaining, busy.foreign),
        };
        if !spec.wait.waits() {
            return Err(Error::Contended {
                name: spec.name.to_owned(),
                remaining,
            });
        }
        let now = Instant::now();
        if deadline.passed() {
            return Err(timeout(spec.name, started));
        }
        let Some(s) = sub.as_ref() else {
            tracing::debug!(lock = %spec.name, "busy; waiting for a release");
            let s = spec.ctx.notifier.subscribe(spec.channel);
            grant = spec.grant.map(|id| s.expect_grant(id));
            let wait_for = deadline.remaining().map_or(spec.ctx.subscribe_timeout, |left| {
                left.min(spec.ctx.subscribe_timeout)
            });
            if !s.ready(wait_for).await {
                tracing::debug!(lock = %spec.name, "wake-up subscription not confirmed; polling");
            }
            sub = Some(s);
            continue;
        };
        // Look again when the holder's lease would run out (it may have died), and at
        // least once per own lease (at least a second): a lock freed without a word —
        // a hand-over to a waiter that never took it up, which lapses after its claim
        // window — is found within about that long.
        let fallback = remaining
            .unwrap_or(spec.fallback)
            .min(look_again(spec.fallback))
            .max(Duration::from_millis(1));
        let fallback = if foreign {
            // Nobody will announce this holder's release: look again soon.
            let pause = poll.min(fallback);
            poll = (poll * 2).min(POLL_MAX);
            pause
        } else {
            poll = POLL_FIRST;
            fallback
        };
        let wake_at = Deadline::At(later(now, fallback.saturating_add(jitter(fallback)))).min(deadline);
        let granted = async {
            match grant.as_mut() {
                Some(slot) => slot.granted().await,
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            _ = s.woken() => true,
            details = granted => {
                if let Some(value) = on_grant(details).await? {
                    metrics::handed_over(spec.primitive, Handover::Grant);
                    tracing::debug!(lock = %spec.name, waited = ?started.elapsed(), "handed the lock by a release");
                    return Ok(value);
                }
                // A stale grant: try again (no wake-up was taken from anyone).
                if let Some(slot) = grant.as_mut() {
                    slot.clear();
                }
                false
            }
            _ = wake_at.sleep() => false,
        };
        if deadline.passed() {
            if woken {
                // Do not swallow a wake-up another local waiter could use.
                s.pass_on();
            }
            return Err(timeout(spec.name, started));
        }
        if woken {
            debt = Some(s.debt());
        }
    }
}

fn timeout(name: &str, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    }
}

/// A random extra delay of up to a tenth of `base` plus 5 ms, so fallback wakers spread out.
fn jitter(base: Duration) -> Duration {
    let max = (base / 10 + Duration::from_millis(5)).as_micros() as u64;
    let r = getrandom::u64().unwrap_or(0);
    Duration::from_micros(r % max.max(1))
}

/// One acquisition through Redis, as a primitive describes it: what the attempts
/// send, how a reply reads, and the calls of the lease they may start.
pub(crate) struct Acquire<'a> {
    /// The acquire request (an EVALSHA of `script`), idempotent under a retry.
    pub script: &'static LuaScript,
    pub cmd: &'a Cmd,
    /// Where releases are announced.
    pub channel: &'a str,
    pub wait: Wait,
    /// The acquisition's token.
    pub token: Token,
    /// Undoes whatever an attempt may have left behind — the lock itself, and a queue
    /// entry of a waiter (whose TTL is never longer than the lease) — if the caller does
    /// not get to use it.
    pub undo: ScriptCall,
    /// Renews the lease (the TTL is appended).
    pub renew: ScriptCall,
    /// Releases the lease.
    pub release: ScriptCall,
    /// Releases may hand the lock straight to this waiter (see [`Granted`]).
    pub grant: Option<Granted<'a>>,
}

/// A waiter a release may hand the lock to: the release sets the lock to the waiter's
/// token for a short claim window, issues its fencing token, and tells it on the
/// lock's channel (`g <id> <fence>`). The waiter then holds the lock without a round
/// trip of its own — from no later than its last attempt that found the lock busy
/// (the release came after it), for the claim window — and the renewal task extends it
/// to the full lease once a third of that window has passed. A grant it cannot rely on
/// that way (made before its last busy attempt, or with too little of the claim left,
/// or any grant under a replica policy, which must be acknowledged like an acquire)
/// makes it try again at once: the acquire script then finds the lock ours, with a fresh
/// fencing token, or busy. A waiter that died after registering holds up the lock for at
/// most the claim window.
pub(crate) struct Granted<'a> {
    /// The waiter's public id.
    pub id: &'a str,
    /// How long a grant holds the lock before its waiter extends it.
    pub claim: Duration,
}

/// How long a lock (or permit) a release hands to a registered waiter holds before the
/// waiter extends it: the longest a waiter that died after registering can hold it up.
pub(crate) fn grant_claim(ttl: Duration) -> Duration {
    ttl.min(Duration::from_secs(2))
}

/// How long a waiter's registration lives without a new attempt (it tries again within
/// half of that). The same for every handle, whatever its lease: a release serves the
/// registration with the earliest deadline, so with lives that grew with the lease, a
/// waiter with a long lease would come after every waiter with a shorter one that
/// registered later — a process of long leases could wait forever behind a busy one of
/// short leases.
pub(crate) fn register_life(_ttl: Duration) -> Duration {
    REGISTER_LIFE
}

/// See [`register_life`].
const REGISTER_LIFE: Duration = Duration::from_secs(20);

/// How much of a grant's claim window must be left for the waiter to rely on it without
/// confirming it first: enough for the renewal that extends it to come back.
const GRANT_MARGIN: Duration = Duration::from_millis(100);

/// Whether a lock (or permits) handed over by a request sent at `sent`, which left
/// `remaining` of a lease of `ttl` on the server, can still be relied on without a
/// round trip: what is left by the slowest allowed clock outlasts the margin a renewal
/// needs to come back. A waiter that took up a hand-over too late (its task was not
/// polled meanwhile) must ask Redis instead.
pub(crate) fn still_reliable(sent: Instant, remaining: Duration, ttl: Duration) -> bool {
    // The lease's `valid_until` takes the same margin (see `drift_within`).
    let remaining = remaining.min(ttl);
    later(sent, remaining.saturating_sub(drift_within(remaining, ttl))) > later(Instant::now(), GRANT_MARGIN)
}

/// What the reply to one attempt says.
pub(crate) enum Reply {
    /// Acquired (now, or by an earlier attempt whose reply was lost), with this much
    /// of the lease left and this fencing token.
    Acquired { fence: Option<u64>, remaining: Duration },
    /// Busy. `queued`: the attempt left a waiter entry behind (`undo` removes it).
    Busy { busy: Busy, queued: bool },
}

impl Reply {
    /// Reads the replies every acquire script gives when it acquired: with a fencing
    /// token, `fence` (now, for the full `ttl`) or `{1, fence, pttl}` (already ours: a
    /// retry after a lost reply, with what is left); without, `1` or `{1, pttl}`.
    /// `None` for any other reply (busy, or a shape of the primitive's own).
    pub fn acquired(reply: &Value, ttl: Duration, fenced: bool) -> Option<Reply> {
        match (int(reply), array(reply).unwrap_or_default()) {
            (Some(fence), _) if fenced && fence > 0 => Some(Reply::Acquired {
                fence: Some(fence as u64),
                remaining: ttl,
            }),
            (Some(1), _) if !fenced => Some(Reply::Acquired {
                fence: None,
                remaining: ttl,
            }),
            (_, [flag, fence, pttl]) if fenced && int(flag) == Some(1) => Some(Reply::Acquired {
                fence: Some(u64::try_from(int(fence)?).ok()?),
                remaining: ms(int(pttl)).unwrap_or(ttl),
            }),
            (_, [flag, pttl]) if !fenced && int(flag) == Some(1) => Some(Reply::Acquired {
                fence: None,
                remaining: ms(int(pttl)).unwrap_or(ttl),
            }),
            _ => None,
        }
    }

    /// Busy, for at most `remaining` (the holder's lease, when known), with nothing
    /// left behind.
    pub fn busy(remaining: Option<Duration>) -> Reply {
        Reply::Busy {
            busy: Busy {
                remaining,
                pass_on: false,
                mark: None,
                foreign: false,
            },
            queued: false,
        }
    }
}

impl LockBase {
    /// Acquires through Redis as `spec` says, reading each reply with `parse` (given the
    /// reply and when its request was sent), and starts the lease. The call is counted
    /// in the metrics, with its outcome and, when it acquired, how long it took.
    ///
    /// Waits for replicas after the acquire under the lock's policy: on a shortfall
    /// under [`OnShortfall::Release`](crate::OnShortfall::Release) the lock is released
    /// again and the call fails with [`Error::NotReplicated`] (it does not wait for
    /// replicas to come back).
    pub async fn acquire(
        &self,
        spec: Acquire<'_>,
        parse: impl Fn(&Value, Instant) -> Result<Reply>,
    ) -> Result<GuardCore> {
        let call = AcquireCall::start(self.primitive);
        call.finish(self.acquire_step(spec, parse).await)
    }

    /// As [`acquire`](LockBase::acquire), without counting the call: for a primitive
    /// whose acquire call does more than this (the plain mutex: its local queue and its
    /// scriptless fast path), and counts the whole call itself.
    pub async fn acquire_step(
        &self,
        spec: Acquire<'_>,
        parse: impl Fn(&Value, Instant) -> Result<Reply>,
    ) -> Result<GuardCore> {
        let Acquire {
            script,
            cmd,
            channel,
            wait,
            token,
            undo,
            renew,
            release,
            grant,
        } = spec;
        let claim = self.claim(undo);
        let op = self.op("acquire");
        let ack = self.options.replica_ack.as_ref();
        let waiting = Waiting {
            ctx: &self.ctx,
            primitive: self.primitive,
            name: &self.name,
            channel,
            wait,
            fallback: self.options.ttl,
            grant: None,
        };
        // When the last attempt that found the lock busy was sent, and the fencing mark it
        // saw: a grant with a higher fence was made after that attempt ran.
        let last_busy: std::sync::Mutex<Option<(Instant, Option<u64>)>> = std::sync::Mutex::new(None);
        let (claim_ref, parse_ref, last_busy_ref) = (&claim, &parse, &last_busy);
        let ttl = self.options.ttl;
        let auto_renew = self.options.auto_renew;
        let claim_window = grant.as_ref().map(|g| g.claim);
        let (fence, remaining, sent, acked) = acquire_loop(
            Waiting {
                grant: grant.as_ref().map(|g| g.id),
                ..waiting
            },
            move |deadline| async move {
                claim_ref.arm();
                let Acked { reply, acked, sent } = op
                    .eval_acked(script, cmd, ack, deadline, Some(claim_ref))
                    .await
                    .inspect_err(|e| {
                        if !e.is_unavailable() {
                            // A definite error reply: the scripts fail before any write.
                            claim_ref.answered_no();
                        }
                    })?;
                // The lease runs from when the answered attempt was sent, after retries.
                match parse_ref(&reply, sent)? {
                    Reply::Acquired { fence, remaining } => {
                        Ok(Attempt::Acquired((fence, remaining, sent, acked)))
                    }
                    Reply::Busy { busy, queued } => {
                        // An attempt that left a registration is undone by the claim
                        // (which leaves it) when the caller gives up.
                        if !queued {
                            claim_ref.answered_no();
                        }
                        *last_busy_ref.lock().expect("last busy") = Some((sent, busy.mark));
                        Ok(Attempt::Busy(busy))
                    }
                }
            },
            move |details: String| async move {
                // "<fence> <claim_ms>": the claim window is the releaser's, which may
                // be shorter than ours (its handle's lease is). A message without one
                // (from an older redlease) is not relied on: the attempt below confirms
                // it in one round trip.
                let mut fields = details.split(' ');
                let (Some(fence), Some(claim_ms)) = (
                    fields.next().and_then(|f| f.parse::<u64>().ok()),
                    fields.next().and_then(|c| c.parse::<u64>().ok()),
                ) else {
                    return Ok(None);
                };
                let claim = claim_window
                    .unwrap_or_default()
                    .min(Duration::from_millis(claim_ms));
                let busy = *last_busy_ref.lock().expect("last busy");
                // Relied on without a round trip only when the grant is known to have been
                // made after the last attempt that found the lock busy: then the lock was
                // ours from no later than when that attempt was sent. A grant made before
                // it is stale — the lock was ours then but no longer when the attempt ran
                // (its claim ran out while this client stalled, and another took it).
                // Under a replica policy the hand-over must be acknowledged like an acquire:
                // the attempt below is (it waits for the replicas). And a handle that does
                // not renew automatically would keep only the claim window, which nobody
                // extends: the attempt below gives it its whole lease.
                if let Some((busy, Some(mark))) = busy
                    && ack.is_none()
                    && auto_renew
                    && fence > mark
                    && still_reliable(busy, claim, ttl)
                {
                    return Ok(Some((Some(fence), claim, busy, None)));
                }
                // Not known to be current, waited too long to rely on the claim window, or
                // waiting for replicas: try again at once. If the lock is ours (this grant, or a later one made
                // to our registration meanwhile) the acquire script says so with a fresh
                // fencing token — never this grant's, which may be older than another
                // holder's that came in between (a stale grant, then a new one).
                Ok(None)
            },
        )
        .await?;
        let core = self.hold(Held {
            token,
            fence,
            sent,
            remaining,
            renew,
            release: release.clone(),
        });
        claim.disarm();
        if let Err(e) = self.check_replicas(acked, Some(core.state()), &release).await {
            // Released by the check; nothing is left to release.
            let _ = core.forget();
            return Err(e);
        }
        tracing::debug!(lock = %self.name, ?fence, "acquired");
        Ok(core)
    }
}
