//! Several plain mutexes taken as one: every name, or none.
//!
//! Each name is the plain mutex's own lock — the same key and value, the same fencing
//! counter, the same waiters, written by the plain mutex's own script steps — so a
//! [`Mutex`](crate::Mutex) of one of the names, or another client's lock on its key,
//! excludes the whole set.
//!
//! The names are grouped by their Redis Cluster hash slot (on one server or under
//! Sentinel they form one group), and one script takes every name of a group, all or
//! none. The groups are taken one after the other in slot order, the same order for
//! every process. When a group is busy, what the attempt took is released before it
//! waits: nobody holds one name while waiting for another, so processes that take
//! overlapping sets, in whatever order they list them, cannot deadlock. A waiter
//! registers on the names that keep it out, as a waiter a release wakes but does not
//! hand the name to.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use redis::Value;
use tokio::time::Instant;

use crate::engine::acquire::{grant_claim, look_again, register_life};
use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait, later};
use crate::engine::guard::{GuardCore, Released};
use crate::engine::heartbeat::waiter_id;
use crate::engine::lease::{Lease, LeaseState, LostReason, Renew, Renewal, drift};
use crate::engine::metrics::{AcquireCall, Primitive};
use crate::engine::notify::{Subscription, WakeDebt};
use crate::engine::request::{Claim, Op, spawn_release};
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys, key_slot};
use crate::options::LeaseOptions;
use crate::script::reply::{array, int, ms};
use crate::script::{LuaScript, MULTI_ACQUIRE, MULTI_EXTEND, MULTI_RELEASE, ScriptCall, eval_batch};
use crate::token::{FencingToken, Token};

mod guard;

pub use guard::MultiLockGuard;
use guard::{Keeper, Renewing};

/// First pause after an attempt that took every name too late to leave a lease.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest such pause.
const RETRY_MAX: Duration = Duration::from_millis(500);
/// The first and the longest pause between the attempts of a waiter that polls a
/// foreign holder (the plain mutex's).
const POLL_FIRST: Duration = Duration::from_millis(4);
const POLL_MAX: Duration = Duration::from_millis(100);

/// Several names locked as one: a guard holds every name, or the lock is not taken.
///
/// Each name is exactly the plain [`Mutex`](crate::Mutex) of that name: the key
/// `<prefix><name>` holding the holder's token with a PX TTL, and the same fencing
/// sequence. So a `Mutex` of any of the names excludes a multi-lock
/// holding it and the other way round, and so do redis-py's `Lock`, node-redlock and
/// redsync on those keys; and each name's [`FencingToken`] continues the sequence of
/// that name, whoever took it before.
///
/// # Policy
///
/// All or nothing, and never holding while waiting. When all the keys share a Redis
/// Cluster hash slot — always on one server or under Sentinel; on a cluster, when the
/// names share a `{hash tag}` — one script takes every name or none. Otherwise the
/// names are taken slot by slot, in slot order (the same order in every process), and
/// when a slot's names are busy, those already taken are released before waiting. A
/// waiter registers on the names that kept it out, and is woken through Redis when any
/// of them is released; after it gave back a partial holding it first backs off for a
/// random moment, so that processes taking overlapping sets do not retry in lockstep.
/// A missed wake-up costs at most the remaining lease of the name that kept it out.
///
/// Not fair: processes that lock one of the names alone may go first again and again —
/// a release of a name hands it straight to a plain [`Mutex`](crate::Mutex) waiter
/// registered for it ahead of a multi-lock waiter, as a plain release does, while a
/// multi-lock waiter is only woken to try again (it needs every name at once, not one).
///
/// # Guarantees
///
/// As for the plain mutex, per name: at most one holder at a time *while leases are
/// valid and Redis keeps its writes*. The names share one lease — renewed together,
/// lost together: if any name is lost, [`lost`](MultiLockGuard::lost) fires and the
/// other names are released. Fence each resource with the token of its own name
/// ([`fences`](MultiLockGuard::fences)); no single number fences them all.
///
/// `MultiLock` is a cheap handle (clone it freely); it holds no lock by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(client: redlease::Client) -> Result<(), redlease::Error> {
/// let accounts = client.multi_lock(["account-17", "account-42"])?;
/// let guard = accounts.lock().await?;
/// let [from, to] = guard.fences() else { unreachable!() };
/// // Move money from account 17 (fenced by `from`) to account 42 (fenced by `to`).
/// # let _ = (from, to);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    ctx: Arc<Context>,
    /// The names, in the order given.
    names: Vec<Name>,
    /// The names grouped by hash slot, in slot order: the order they are taken in.
    groups: Vec<Group>,
    options: LeaseOptions,
    /// The TTL in milliseconds, as the script argument.
    ttl_arg: Arc<str>,
    /// The release's hand-over argument: `PUBLISH` or `SPUBLISH`, and how long a name
    /// a release hands to a plain mutex's registered waiter holds before that waiter
    /// extends it (the plain mutex's rule).
    handover_arg: Arc<str>,
    /// How long a waiter's registration on a busy name lives without a new attempt, as
    /// the script argument (the plain mutex's rule).
    register_arg: Arc<str>,
    /// The names joined with `+`: what the guard surface, logs and errors about all of
    /// them show.
    label: Arc<str>,
    /// The keys joined with `+`.
    key_label: Arc<str>,
}

/// One name, with the plain mutex's keys and channel of that name.
#[derive(Debug)]
struct Name {
    name: Arc<str>,
    key: Arc<str>,
    /// The fencing counter of the name's hash slot (shared with the other names of the
    /// prefix on one server, of the slot on a cluster) and its floor.
    counter: Arc<str>,
    floor: Arc<str>,
    /// The waiters registered for the name: plain mutex waiters, which a release may
    /// hand it to, and multi-lock waiters, which it wakes.
    waiters: Arc<str>,
    channel: Arc<str>,
}

/// Names in one hash slot: one script call takes, renews or releases all of them.
#[derive(Debug)]
struct Group {
    /// Indices into `Shared::names`.
    members: Vec<usize>,
    /// `[lock key, fencing counter, its floor, waiters]` of every member, in member
    /// order: the plain mutex's acquire and release.
    keys: Arc<[Arc<str>]>,
    /// The lock key of every member: extend. (A renewal names only keys that exist
    /// while the names are held, which a slot migration does not refuse.)
    lock_keys: Arc<[Arc<str>]>,
    /// The members' names and keys joined with `+`, for errors.
    label: Arc<str>,
    key_label: Arc<str>,
}

/// What one attempt over every group found.
enum Attempt {
    Acquired(Box<MultiLockGuard>),
    /// Some names are held by others (in the order given, with their remaining
    /// leases when known). `gave_back`: the attempt had taken other names, and
    /// released them.
    Busy {
        busy: Vec<Busy>,
        gave_back: bool,
    },
    /// Every name was taken, but so slowly that no lease was left: given back.
    TooLate,
}

#[derive(Clone, Copy, Debug)]
struct Busy {
    /// Index into `Shared::names`.
    name: usize,
    remaining: Option<Duration>,
    /// Held by another library's lock (or a key without a TTL), whose release
    /// announces nothing.
    foreign: bool,
}

/// A group an attempt holds.
struct Taken {
    group: usize,
    /// Releases the group if the attempt does not end in a guard.
    claim: Claim,
    /// When the request that took it was sent.
    sent: Instant,
    /// Per member: its fencing token and what its lease has left.
    held: Vec<(u64, Duration)>,
}

/// A waiter's registration on the names that keep it out (see `multi_acquire.lua`):
/// an entry `<id>!` in each one's waiters, of the kind a release wakes but never hands
/// the name to — a multi-lock needs every name at once. Without it a release of a name
/// would not announce itself (a release announces only to registered waiters), and the
/// waiter would sleep until the holder's lease ran out.
///
/// Each attempt renews the registrations on the names it finds busy and leaves those on
/// the names it takes. When the acquire ends without every name — it gave up, failed
/// or was dropped — the groups that may still hold one leave it in the background;
/// left alone, a registration would expire by itself after its life.
struct Registration<'a> {
    lock: &'a MultiLock,
    /// `<id>!`: 16 hex digits and the kind.
    member: Arc<str>,
    /// Per group: an attempt may have left the registration on some of its names.
    groups: Vec<AtomicBool>,
}

impl<'a> Registration<'a> {
    fn new(lock: &'a MultiLock) -> Self {
        Registration {
            lock,
            member: format!("{}!", waiter_id()).into(),
            groups: lock
                .shared
                .groups
                .iter()
                .map(|_| AtomicBool::new(false))
                .collect(),
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let s = &*self.lock.shared;
        for (g, registered) in self.groups.iter().enumerate() {
            if registered.load(Ordering::Relaxed) {
                // A release with a token that holds nothing only leaves the
                // registration.
                let call = self
                    .lock
                    .release_call_leaving(g, &Token::generate(), self.member.clone());
                spawn_release(s.ctx.clone(), s.groups[g].label.clone(), call, s.options.ttl);
            }
        }
    }
}

/// What the renewal rounds and the release of one holding tell each other.
///
/// A release sends one request per group, and a slot migration can hold one of them up
/// (`TRYAGAIN`) for longer than the lease while the others are answered. Meanwhile the
/// renewal task goes on renewing the groups whose release has not been answered, so the
/// lease stays a lower bound of their expiry and nobody else can take them before the
/// release lands. And a release attempt whose reply was lost may have landed: the
/// renewals that follow find its names gone. A renewal answered during the release
/// that finds a group gone while the lease is valid found it gone before it could have
/// expired on the server: as long as Redis kept its writes, an attempt of this release
/// removed it. A group found gone after the lease ran out stops the renewals: the
/// lease then no longer moves, and its end bounds every group's expiry.
#[derive(Debug)]
pub(super) struct Holding {
    /// The lease (set once it exists).
    lease: OnceLock<Weak<LeaseState>>,
    /// The holder is releasing.
    releasing: AtomicBool,
    groups: Vec<GroupState>,
}

#[derive(Debug, Default)]
struct GroupState {
    /// The release of the group was answered: nothing more to renew.
    released: AtomicBool,
    /// A renewal during the release found the group's names gone while the lease was
    /// valid.
    gone_while_valid: AtomicBool,
}

impl Holding {
    fn new(groups: usize) -> Self {
        Holding {
            lease: OnceLock::new(),
            releasing: Default::default(),
            groups: (0..groups).map(|_| GroupState::default()).collect(),
        }
    }

    fn valid_until(&self) -> Option<Instant> {
        Some(self.lease.get()?.upgrade()?.valid_until())
    }
}

impl MultiLock {
    pub(crate) fn new(ctx: Arc<Context>, names_given: Vec<String>, options: LeaseOptions) -> Result<Self> {
        let label = names_given.join("+");
        if names_given.is_empty() {
            return Err(Error::InvalidArgument {
                name: label,
                what: "names",
                reason: "a multi-lock needs at least one name".into(),
            });
        }
        let ttl_ms = keys::ttl_ms(&label, options.ttl)?;
        if options.replica_ack.is_some() {
            return Err(Error::InvalidArgument {
                name: label,
                what: "replica acknowledgement",
                reason: "a lock over several names does not wait for replicas; leave the policy off".into(),
            });
        }
        let mut seen = HashSet::new();
        let mut names = Vec::with_capacity(names_given.len());
        for name in &names_given {
            if !seen.insert(name.as_str()) {
                return Err(Error::InvalidArgument {
                    name: name.clone(),
                    what: "names",
                    reason: "the name is given twice; a multi-lock holds each name once".into(),
                });
            }
            let keys = LockKeys::new(&ctx.prefix, name)?;
            let [counter, floor] = ctx.fence_keys.of(&keys);
            names.push(Name {
                name: name.as_str().into(),
                counter,
                floor,
                waiters: keys.aux("q").into(),
                channel: keys.aux("wake").into(),
                key: keys.key,
            });
        }
        // On a cluster each script may touch one slot only; elsewhere one script takes all.
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, n) in names.iter().enumerate() {
            let slot = if ctx.topology.is_cluster() {
                key_slot(n.key.as_bytes())
            } else {
                0
            };
            by_slot.entry(slot).or_default().push(i);
        }
        let groups = by_slot
            .into_values()
            .map(|members| {
                let of = |i: &usize| &names[*i];
                let join =
                    |f: fn(&Name) -> &str| members.iter().map(|i| f(of(i))).collect::<Vec<_>>().join("+");
                Group {
                    keys: members
                        .iter()
                        .flat_map(|i| {
                            let n = of(i);
                            [
                                n.key.clone(),
                                n.counter.clone(),
                                n.floor.clone(),
                                n.waiters.clone(),
                            ]
                        })
                        .collect(),
                    lock_keys: members.iter().map(|i| of(i).key.clone()).collect(),
                    label: join(|n| &n.name).into(),
                    key_label: join(|n| &n.key).into(),
                    members,
                }
            })
            .collect();
        let key_label = names.iter().map(|n| &*n.key).collect::<Vec<_>>().join("+");
        let handover_arg = ctx.handover.arg(grant_claim(options.ttl).as_millis() as u64);
        Ok(MultiLock {
            shared: Arc::new(Shared {
                ctx,
                names,
                groups,
                options,
                ttl_arg: ttl_ms.to_string().into(),
                handover_arg,
                register_arg: register_life(options.ttl).as_millis().to_string().into(),
                label: label.into(),
                key_label: key_label.into(),
            }),
        })
    }

    /// The names, in the order given.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.shared.names.iter().map(|n| &*n.name)
    }

    /// The Redis key of each name, `<prefix><name>`, in the order of [`names`](Self::names).
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.shared.names.iter().map(|n| &*n.key)
    }

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
    }

    /// Takes every name if all are free, without waiting. One round trip per hash
    /// slot the names span (one in all on a single server).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no name behind: whatever the attempt may have taken
    /// is compare-and-deleted in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when some name is held by someone else (the error names the
    /// first such name, in the order given, and its remaining lease);
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn try_lock(&self) -> Result<MultiLockGuard> {
        self.acquire(Wait::Try).await
    }

    /// Takes every name, waiting as long as it takes.
    ///
    /// Never holds a name while it waits: when some names are busy, it gives back
    /// those it took and waits for a release of a name that kept it out, announced
    /// through Redis; a missed announcement costs at most that name's remaining lease.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no name behind (whatever
    /// may have been taken is compare-and-deleted in the background), and a wake-up it
    /// consumed is passed on to another waiter.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn lock(&self) -> Result<MultiLockGuard> {
        self.acquire(Wait::FOREVER).await
    }

    /// Takes every name, waiting at most `timeout` — which bounds the whole call, a
    /// request already in flight included (each request is still given at least 250 ms
    /// to answer, so a zero timeout takes free names). A timeout of a century or more
    /// waits as long as it takes.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](MultiLock::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when some name was still held by someone else at the
    /// deadline (the error names it); [`Error::Redis`] (with
    /// [`is_unavailable`](Error::is_unavailable)) when Redis had not answered by then;
    /// and the errors of [`lock`](MultiLock::lock).
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MultiLockGuard> {
        self.acquire(Wait::timeout(timeout)).await
    }

    /// Runs attempts until one takes every name, waiting in between for a release of
    /// a name that kept the last attempt out.
    async fn acquire(&self, wait: Wait) -> Result<MultiLockGuard> {
        let call = AcquireCall::start(Primitive::Multi);
        call.finish(self.acquire_uncounted(wait).await)
    }

    async fn acquire_uncounted(&self, wait: Wait) -> Result<MultiLockGuard> {
        let s = &*self.shared;
        let started = Instant::now();
        let deadline = wait.deadline();
        // One subscription per name that was ever busy, kept until the end: a name
        // busy again is then watched from before the attempt that finds it busy.
        let mut subs: Vec<Option<Subscription>> = s.names.iter().map(|_| None).collect();
        // A wake-up consumed (for the name at this index) and not yet tried for.
        let mut woken: Option<(usize, WakeDebt)> = None;
        // The last wake-up message passed on: each is passed on once per waiter.
        let mut passed: Option<(usize, u64)> = None;
        let mut too_late: Option<(Instant, Duration)> = None;
        // The next pause when polling a foreign holder.
        let mut poll = POLL_FIRST;
        // A waiter registers on the names that keep it out, so that their releases
        // wake it; the registrations are left when it gets every name or gives up.
        let registration = wait.waits().then(|| Registration::new(self));
        loop {
            let round = Instant::now();
            let generation = woken
                .as_ref()
                .and_then(|(i, _)| Some((*i, subs[*i].as_ref()?.generation())));
            let outcome = self.attempt(deadline, registration.as_ref()).await;
            if let Some((i, debt)) = woken.take() {
                // Woken for a name that did not keep this attempt out: another local
                // waiter of that name can use the wake-up.
                let useless =
                    matches!(&outcome, Ok(Attempt::Busy { busy, .. }) if !busy.iter().any(|b| b.name == i));
                if useless && generation != passed {
                    passed = generation;
                    drop(debt);
                } else {
                    debt.settle();
                }
            }
            let (busy, gave_back) = match outcome? {
                Attempt::Acquired(guard) => {
                    tracing::debug!(lock = %s.label, waited = ?started.elapsed(), "acquired every name");
                    return Ok(*guard);
                }
                Attempt::Busy { busy, gave_back } => (busy, gave_back),
                Attempt::TooLate => {
                    let (since, pause) = too_late.get_or_insert((round, RETRY_FIRST));
                    let next = later(Instant::now(), *pause);
                    if Deadline::from(*since, s.ctx.retry_window).before(next) || deadline.before(next) {
                        return Err(self.op(0, "acquire").error(too_slow()));
                    }
                    tracing::debug!(lock = %s.label, "took every name too late to leave a lease; retrying");
                    tokio::time::sleep(*pause).await;
                    *pause = (*pause * 2).min(RETRY_MAX);
                    continue;
                }
            };
            too_late = None;
            let first = busy[0];
            let blocker = &s.names[first.name].name;
            if !wait.waits() {
                return Err(Error::Contended {
                    name: blocker.to_string(),
                    remaining: first.remaining,
                });
            }
            if deadline.passed() {
                return Err(timeout(blocker, started));
            }
            // A name newly found busy: subscribe, and once the subscription is
            // confirmed try again, so a release in between is not missed.
            let fresh: Vec<usize> = busy
                .iter()
                .map(|b| b.name)
                .filter(|&i| subs[i].is_none())
                .collect();
            if !fresh.is_empty() {
                tracing::debug!(lock = %s.label, busy = %blocker, "busy; waiting for a release");
                for &i in &fresh {
                    subs[i] = Some(s.ctx.notifier.subscribe(&s.names[i].channel));
                }
                let wait_for = deadline
                    .remaining()
                    .map_or(s.ctx.subscribe_timeout, |left| left.min(s.ctx.subscribe_timeout));
                let ready = fresh
                    .iter()
                    .filter_map(|&i| subs[i].as_ref())
                    .map(|sub| sub.ready(wait_for));
                join_all(ready).await;
                continue;
            }
            if gave_back {
                // Competitors hold the rest of what this attempt took part of: a
                // random pause of a few round trips keeps overlapping takers out of
                // lockstep.
                let pause = random_up_to(round.elapsed() * 4 + Duration::from_millis(5));
                Deadline::after(pause).min(deadline).sleep().await;
            }
            // Woken by a release of a name that kept this attempt out, or else tried
            // again when the first of their leases runs out — and within half the life
            // of the registrations, which each attempt renews.
            let fallback = busy
                .iter()
                .filter_map(|b| b.remaining)
                .min()
                .unwrap_or(s.options.ttl)
                .min(register_life(s.options.ttl) / 2)
                .min(look_again(s.options.ttl))
                .max(Duration::from_millis(1));
            let fallback = if busy.iter().any(|b| b.foreign) {
                // Nobody will announce that holder's release: look again soon.
                let pause = poll.min(fallback);
                poll = (poll * 2).min(POLL_MAX);
                pause
            } else {
                poll = POLL_FIRST;
                fallback
            };
            let wake_at = Deadline::At(later(
                Instant::now(),
                fallback.saturating_add(random_up_to(fallback / 10 + Duration::from_millis(5))),
            ))
            .min(deadline);
            // Only a release of a name that kept this attempt out can let the next one
            // in. A wake-up that came while the attempt was on its way is a permit
            // already waiting, so this returns at once for it.
            let watched: Vec<(usize, &Subscription)> = busy
                .iter()
                .filter_map(|b| Some((b.name, subs[b.name].as_ref()?)))
                .collect();
            let woke = if watched.is_empty() {
                wake_at.sleep().await;
                None
            } else {
                let wakes = watched.iter().map(|(_, sub)| Box::pin(sub.woken()));
                tokio::select! {
                    (_, k, _) = select_all(wakes) => Some(watched[k].0),
                    _ = wake_at.sleep() => None,
                }
            };
            if deadline.passed() {
                if let Some(sub) = woke.and_then(|i| subs[i].as_ref()) {
                    sub.pass_on();
                }
                return Err(timeout(blocker, started));
            }
            woken = woke.and_then(|i| Some((i, subs[i].as_ref()?.debt())));
        }
    }

    /// One attempt: takes the groups in slot order with a fresh token, and gives back
    /// what it took when a group is busy. A fresh token per attempt keeps a late
    /// background release of one attempt from ever freeing a later attempt's names.
    ///
    /// With a `registration` (a waiter), a group found busy registers it on the names
    /// that keep it out, and a group taken leaves its registration.
    async fn attempt(&self, deadline: Deadline, registration: Option<&Registration<'_>>) -> Result<Attempt> {
        let s = &*self.shared;
        let token = Token::for_owner(&s.ctx.label);
        let member = registration.map_or("", |r| &*r.member);
        let mut taken: Vec<Taken> = Vec::with_capacity(s.groups.len());
        for (g, group) in s.groups.iter().enumerate() {
            let claim = self.claim(g, &token);
            claim.arm();
            if let Some(r) = registration {
                // From now on the group may hold the registration.
                r.groups[g].store(true, Ordering::Relaxed);
            }
            let cmd = MULTI_ACQUIRE.evalsha(
                &group.keys,
                &[token.expose(), &s.ttl_arg, member, &s.register_arg],
                None,
            );
            let op = self.op(g, "acquire");
            // On an error, `claim` and `taken` release in the background.
            let (reply, sent) = op
                .eval_sent(&MULTI_ACQUIRE, &cmd, deadline, Some(&claim))
                .await
                .inspect_err(|e| {
                    if !e.is_unavailable() {
                        // A definite error reply: the script failed before any write.
                        claim.answered_no();
                    }
                })?;
            let granted = parse_acquire(&reply, group.members.len(), s.options.ttl);
            if let (Some(Granted::All(_)), Some(r)) = (&granted, registration) {
                // The script left the registration on every name of the group.
                r.groups[g].store(false, Ordering::Relaxed);
            }
            match granted {
                Some(Granted::All(held)) => taken.push(Taken {
                    group: g,
                    claim,
                    sent,
                    held,
                }),
                Some(Granted::Busy(busy)) => {
                    claim.answered_no();
                    let gave_back = !taken.is_empty();
                    self.give_back(&token, taken).await;
                    let mut busy: Vec<Busy> = busy
                        .into_iter()
                        .map(|(k, remaining, foreign)| Busy {
                            name: group.members[k],
                            remaining,
                            foreign,
                        })
                        .collect();
                    busy.sort_by_key(|b| b.name);
                    return Ok(Attempt::Busy { busy, gave_back });
                }
                None => return Err(op.bad_reply()),
            }
        }
        // Every name is ours. Each lease runs from the request that took it; the
        // first was sent first.
        let ttl = s.options.ttl;
        let sent = taken.first().map_or_else(Instant::now, |t| t.sent);
        let remaining = taken
            .iter()
            .flat_map(|t| t.held.iter().map(|&(_, left)| left))
            .min()
            .unwrap_or(ttl);
        if later(sent, remaining.saturating_sub(drift(ttl))) <= Instant::now() {
            self.give_back(&token, taken).await;
            return Ok(Attempt::TooLate);
        }
        Ok(Attempt::Acquired(Box::new(
            self.guard(token, taken, sent, remaining),
        )))
    }

    /// Releases the groups an attempt took, all at once; a release that gets no
    /// definite answer is finished in the background by its claim.
    async fn give_back(&self, token: &Token, taken: Vec<Taken>) {
        let releases = taken.into_iter().map(|t| async move {
            let call = self.release_call(t.group, token);
            if self
                .op(t.group, "release")
                .call(&call, Deadline::Never, Some(&t.claim))
                .await
                .is_ok()
            {
                t.claim.disarm();
            }
        });
        join_all(releases).await;
    }

    /// The guard of an attempt that took every group; its lease runs from `sent` with
    /// `remaining` left.
    fn guard(&self, token: Token, taken: Vec<Taken>, sent: Instant, remaining: Duration) -> MultiLockGuard {
        let s = &*self.shared;
        let mut fences = vec![FencingToken::new(0); s.names.len()];
        for t in &taken {
            for (&i, &(fence, _)) in s.groups[t.group].members.iter().zip(&t.held) {
                fences[i] = FencingToken::new(fence);
            }
        }
        let holding = Arc::new(Holding::new(s.groups.len()));
        let round = Arc::new(Renewing {
            lock: Arc::downgrade(&self.shared),
            token: token.clone(),
            holding: holding.clone(),
        });
        let state = LeaseState::new(
            s.label.clone(),
            sent,
            s.options.ttl,
            remaining,
            Renew::Round(round),
            s.options.auto_renew,
            Some(Primitive::Multi),
        );
        let _ = holding.lease.set(Arc::downgrade(&state));
        // Renewed, or watched for running out.
        s.ctx.renewer.schedule(&state);
        let keeper = Arc::new(Keeper {
            lock: self.clone(),
            token: token.clone(),
            lease: state.clone(),
            holding,
        });
        for t in taken {
            t.claim.disarm();
        }
        tracing::debug!(lock = %s.label, ?fences, "acquired");
        MultiLockGuard {
            core: GuardCore::custom(keeper, s.key_label.clone(), token, Lease::new(state)),
            lock: self.clone(),
            fences,
        }
    }

    /// An operation on group `g`: its requests, and errors named after its names.
    fn op(&self, g: usize, what: &'static str) -> Op<'_> {
        let (s, group) = (&*self.shared, &self.shared.groups[g]);
        Op::new(&s.ctx, &group.label, &group.key_label, what)
    }

    /// Undoes whatever an attempt with `token` may have left in group `g`.
    fn claim(&self, g: usize, token: &Token) -> Claim {
        let s = &*self.shared;
        Claim::new(
            s.ctx.clone(),
            &s.groups[g].label,
            self.release_call(g, token),
            s.options.ttl,
        )
    }

    fn release_call(&self, g: usize, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        let args = Arc::new([token.shared(), s.handover_arg.clone()]);
        ScriptCall::new(&MULTI_RELEASE, s.groups[g].keys.clone(), args)
    }

    /// The release call that also leaves a waiter's `registration` on every name of
    /// group `g`.
    fn release_call_leaving(&self, g: usize, token: &Token, registration: Arc<str>) -> ScriptCall {
        let s = &*self.shared;
        let args = Arc::new([token.shared(), s.handover_arg.clone(), registration]);
        ScriptCall::new(&MULTI_RELEASE, s.groups[g].keys.clone(), args)
    }

    fn extend_call(&self, g: usize, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &MULTI_EXTEND,
            s.groups[g].lock_keys.clone(),
            Arc::new([token.shared()]),
        )
    }

    /// One renewal of every name for `ttl` more: one script call per group, batched
    /// into one round trip per node. During a release, only the groups whose release
    /// has not been answered yet (see [`Holding`]).
    async fn renew_round(&self, token: &Token, ttl: Duration, holding: &Holding) -> Renewal {
        let s = &*self.shared;
        let ttl_ms = ttl.as_millis() as u64;
        let groups: Vec<usize> = (0..s.groups.len())
            .filter(|&g| !holding.groups[g].released.load(Ordering::Acquire))
            .collect();
        if groups.is_empty() {
            // Every group's release was answered: nothing is left to renew.
            return Renewal::Gone;
        }
        let calls: Vec<(&'static LuaScript, redis::Cmd)> = groups
            .iter()
            .map(|&g| {
                let call = self.extend_call(g, token);
                (call.script, call.cmd_with_ttl(ttl_ms))
            })
            .collect();
        let sent = Instant::now();
        let (results, round_trips) = eval_batch(&*s.ctx.conn, &s.ctx.batching, &calls).await;
        s.ctx
            .renewer
            .counters()
            .round_trips
            .fetch_add(round_trips, Ordering::Relaxed);
        // Read after the answers: a release that began while this round was on its way
        // may be what removed a group this round found gone.
        let releasing = holding.releasing.load(Ordering::Acquire);
        let valid = holding.valid_until().is_some_and(|until| Instant::now() < until);
        let (mut error, mut lapsed, mut held) = (None, false, false);
        for (&g, result) in groups.iter().zip(results) {
            match result {
                Ok(reply) if int(&reply) == Some(1) => held = true,
                // Gone while the lease was valid, during the release: its keys could not
                // have expired, so (as long as Redis kept its writes) the release removed
                // them, and the release is told so.
                Ok(_) if releasing && valid => {
                    holding.groups[g].gone_while_valid.store(true, Ordering::Release);
                }
                // Gone otherwise: the lease over all of them is over.
                Ok(_) => lapsed = true,
                Err(e) => {
                    error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        if lapsed {
            if !releasing {
                // Free the names still held.
                self.release_in_background(token, ttl);
            }
            // Releasing: the lease stops moving, so that what it is valid until stays a
            // bound of every group's expiry for the release's answers.
            return Renewal::Gone;
        }
        if let Some(error) = error {
            return Renewal::Unreachable { error: Some(error) };
        }
        if !held {
            // Releasing, and every group left was found released.
            return Renewal::Gone;
        }
        // The groups still held (and any found released) are covered for `ttl` more.
        Renewal::Confirmed { sent }
    }

    /// Makes every name's lease last at least `ttl` from now (see
    /// [`MultiLockGuard::extend`]).
    async fn extend(&self, token: &Token, lease: &Arc<LeaseState>, ttl: Duration) -> Result<()> {
        let s = &*self.shared;
        let ttl_ms = keys::ttl_ms(&s.label, ttl)?;
        let not_held = || Error::NotHeld {
            name: s.label.to_string(),
        };
        if let Some(reason) = lease.ended() {
            tracing::debug!(lock = %s.label, %reason, "extend after the lease ended");
            return Err(not_held());
        }
        let extends = (0..s.groups.len()).map(|g| async move {
            let call = self.extend_call(g, token);
            self.op(g, "extend")
                .eval_sent(call.script, &call.cmd_with_ttl(ttl_ms), Deadline::Never, None)
                .await
        });
        // The lease runs from the earliest of the answered requests.
        let mut sent: Option<Instant> = None;
        let mut held = true;
        for answer in join_all(extends).await {
            let (reply, at) = answer?;
            held &= int(&reply) == Some(1);
            sent = Some(sent.map_or(at, |t| t.min(at)));
        }
        if !held {
            if lease.end(LostReason::Gone) {
                self.release_in_background(token, lease.ttl());
            }
            return Err(not_held());
        }
        lease.set_ttl(ttl);
        // Answered after the lease ran out: it stays ended.
        if !lease.confirm(sent.unwrap_or_else(Instant::now), ttl) {
            return Err(not_held());
        }
        s.ctx.renewer.schedule(lease);
        Ok(())
    }

    /// Releases every name (see [`MultiLockGuard::release`]); the lease is still
    /// renewed until the answers are in.
    async fn release(&self, token: &Token, lease: &LeaseState, holding: &Holding) -> Result<()> {
        let s = &*self.shared;
        holding.releasing.store(true, Ordering::Release);
        let releases = (0..s.groups.len()).map(|g| self.release_group(g, token, lease, holding));
        let mut not_held = None;
        for answer in join_all(releases).await {
            not_held = not_held.or(answer?);
        }
        match not_held {
            Some(i) => Err(Error::NotHeld {
                name: s.names[i].name.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Releases group `g`; returns the first of its names the token turned out not to
    /// hold, if any. Reads each name's answer as the plain mutex's release does,
    /// including when an earlier attempt of the request may have landed.
    async fn release_group(
        &self,
        g: usize,
        token: &Token,
        lease: &LeaseState,
        holding: &Holding,
    ) -> Result<Option<usize>> {
        let s = &*self.shared;
        let op = self.op(g, "release");
        let call = self.release_call(g, token);
        let claim = Claim::new(s.ctx.clone(), &s.groups[g].label, call.clone(), lease.ttl());
        claim.arm();
        let sent = Instant::now();
        let valid_until = lease.valid_until();
        let reply = op.call(&call, Deadline::Never, Some(&claim)).await?;
        let answered = Instant::now();
        let doubted = claim.doubted();
        claim.disarm();
        let state = &holding.groups[g];
        state.released.store(true, Ordering::Release);
        let members = &s.groups[g].members;
        let answers = array(&reply)
            .filter(|a| a.len() == members.len())
            .ok_or_else(|| op.bad_reply())?;
        // An earlier attempt that landed made the renewals find the names gone (see
        // `Holding`): it released them.
        let landed = doubted && state.gone_while_valid.load(Ordering::Acquire);
        for (&i, answer) in members.iter().zip(answers) {
            let released = match Released::of(answer) {
                Released::Now => true,
                Released::FreeAfterUs => (doubted && sent < valid_until) || landed,
                Released::NotOurs => (doubted && answered < lease.valid_until()) || landed,
            };
            if !released {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Releases every name held by `token` in the background.
    fn release_in_background(&self, token: &Token, ttl: Duration) {
        let s = &*self.shared;
        for (g, group) in s.groups.iter().enumerate() {
            spawn_release(
                s.ctx.clone(),
                group.label.clone(),
                self.release_call(g, token),
                ttl,
            );
        }
    }
}

/// What `multi_acquire.lua` answered.
enum Granted {
    /// Per member: its fencing token and what is left of its lease.
    All(Vec<(u64, Duration)>),
    /// Members (indices into the group) held by others, with their remaining leases
    /// and whether the holder is foreign.
    Busy(Vec<(usize, Option<Duration>, bool)>),
}

fn parse_acquire(reply: &Value, members: usize, ttl: Duration) -> Option<Granted> {
    let (flag, rest) = array(reply)?.split_first()?;
    match int(flag)? {
        1 if rest.len() == 2 * members => rest
            .chunks(2)
            .map(|pair| {
                let fence = u64::try_from(int(&pair[0])?).ok().filter(|&f| f > 0)?;
                Some((fence, ms(int(&pair[1])).unwrap_or(ttl).min(ttl)))
            })
            .collect::<Option<Vec<_>>>()
            .map(Granted::All),
        0 if !rest.is_empty() && rest.len() % 3 == 0 => rest
            .chunks(3)
            .map(|busy| {
                let k = usize::try_from(int(&busy[0])?)
                    .ok()?
                    .checked_sub(1)
                    .filter(|&k| k < members)?;
                let foreign = match int(&busy[2])? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                Some((k, ms(int(&busy[1])), foreign))
            })
            .collect::<Option<Vec<_>>>()
            .map(Granted::Busy),
        _ => None,
    }
}

fn timeout(name: &str, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    }
}

fn too_slow() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "taking every name took longer than the lease, again and again",
    ))
}

/// A uniformly random duration in `[0, max)`.
fn random_up_to(max: Duration) -> Duration {
    let max = max.as_micros().max(1) as u64;
    Duration::from_micros(getrandom::u64().unwrap_or(0) % max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    #[test]
    fn acquire_replies_are_read_strictly() {
        let ttl = Duration::from_secs(30);
        match parse_acquire(&ints(&[1, 7, 30_000, 9, 1_200]), 2, ttl) {
            Some(Granted::All(held)) => assert_eq!(
                held,
                [(7, ttl), (9, Duration::from_millis(1_200))],
                "fences and what is left, per member"
            ),
            _ => panic!("two names granted"),
        }
        match parse_acquire(&ints(&[0, 2, 800, 0, 1, -1, 1]), 2, ttl) {
            Some(Granted::Busy(busy)) => assert_eq!(
                busy,
                [(1, Some(Duration::from_millis(800)), false), (0, None, true)]
            ),
            _ => panic!("two names busy"),
        }
        for bad in [
            ints(&[1, 7, 30_000]),
            ints(&[0]),
            ints(&[0, 3, 5, 0]),
            ints(&[0, 1, 5]),
            ints(&[0, 1, 5, 2]),
            ints(&[1, 0, 5, 9, 5]),
            ints(&[2, 1, 1, 1, 1]),
            Value::Int(1),
        ] {
            assert!(parse_acquire(&bad, 2, ttl).is_none(), "{bad:?}");
        }
    }
}
