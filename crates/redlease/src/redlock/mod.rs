//! Redlock: one lock over N independent Redis masters, held by a majority of them.
//!
//! The algorithm is antirez's, as published at <https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>:
//!
//! 1. Note the time, then ask every master at once to `SET <prefix><name> <token> NX PX
//!    <ttl>`, each with a timeout much shorter than the TTL, so a dead master costs
//!    little.
//! 2. The lock is held when a majority (N/2 + 1) said yes and the validity left,
//!    `ttl − elapsed − drift` with `drift = ttl/100 + 2 ms`, is positive.
//! 3. Otherwise release it on *all* masters (also those that did not answer: their
//!    `SET` may have landed) and retry after a random delay.
//!
//! Each master holds exactly the plain mutex's layout (`<prefix><name>` = token, PX), so
//! node-redlock's and redsync's Redlock over the same masters exclude ours. Renewal is
//! one round of compare-and-`PEXPIRE` on every master; a round that keeps fewer than a
//! majority ends the lease.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use redis::{Cmd, RedisError, Value};
use tokio::time::Instant;

use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait, later};
use crate::engine::guard::GuardCore;
use crate::engine::lease::{Lease, LeaseState, Renew, Renewal, drift};
use crate::engine::metrics::{AcquireCall, Primitive};
use crate::engine::notify::{Subscription, WakeDebt};
use crate::engine::request::{Claim, spawn_release};
use crate::error::{Error, Result, is_transient};
use crate::keys::{self, LockKeys};
use crate::options::LeaseOptions;
use crate::script::reply::{array, int};
use crate::script::{LuaScript, MUTEX_EXTEND, REDLOCK_ACQUIRE, REDLOCK_RELEASE, ScriptCall, eval};
use crate::token::Token;

mod guard;

pub use guard::RedlockGuard;
use guard::{Keeper, RenewRoundOf};

/// Default upper bound on how long one master may take to answer one request.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// First delay before retrying when too few masters answered.
const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest delay between such retries.
const RETRY_MAX: Duration = Duration::from_millis(500);

/// A quorum lock service over N independent Redis masters (antirez's Redlock).
///
/// Build it from one [`Client`](crate::Client) per master — masters that do *not* replicate each
/// other, ideally on separate machines — and take locks with [`mutex`](Redlock::mutex).
/// A lock is held while a majority of the masters hold its key, so it survives the
/// loss of a minority: with 3 masters, one may be down; with 5, two.
///
/// # Guarantees and assumptions
///
/// Mutual exclusion holds while the holder's lease is valid, *provided* that:
///
/// - **clocks drift boundedly**: every master's clock and the client's advance at
///   nearly the same rate (within the drift margin of 1% of the TTL plus 2 ms). A
///   master whose clock jumps forward expires keys early; the algorithm has no defence
///   against that.
/// - **a master that restarts keeps its keys**, or stays down for at least one TTL
///   before it rejoins (antirez's "delayed restarts"). A master that comes back empty
///   at once can hand a second client the majority that the first one still counts on.
/// - **the holder does not pause** past its `valid_until` (GC, swap, SIGSTOP), exactly
///   as for the single-node [`Mutex`](crate::Mutex).
///
/// # No fencing tokens
///
/// Unlike [`Mutex`](crate::Mutex), a Redlock guard has no fencing token, on purpose.
/// A fencing token must rise strictly from one holder to the next, and nothing in
/// Redlock orders holders: each master can count only its own acquisitions, the
/// majorities of two successive holders may share a single master, and which master
/// that is differs from pair to pair — so no combination of per-master counters (their
/// maximum, their sum) is guaranteed to rise, least of all after a master restarted
/// empty. Counters started from clocks would need exactly the clock synchronisation a
/// fencing token is meant to make unnecessary. This is Martin Kleppmann's argument in
/// "How to do distributed locking" (2016). If the protected resource can check a
/// token, use a single-node [`Mutex`](crate::Mutex) (with replica acknowledgement for
/// durability) or a consensus system instead.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let masters = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
///     .iter()
///     .map(|url| redis::Client::open(*url))
///     .collect::<Result<Vec<_>, _>>()
///     .expect("valid urls");
/// let redlock = redlease::Redlock::connect(masters).await?;
/// let guard = redlock.mutex("nightly-report")?.lock().await?;
/// tokio::select! {
///     _ = do_work() => {}
///     reason = guard.lost() => eprintln!("lost the quorum: {reason}"),
/// }
/// guard.release().await?;
/// # Ok(()) }
/// # async fn do_work() {}
/// ```
#[derive(Clone, Debug)]
pub struct Redlock {
    shared: Arc<RedlockShared>,
}

#[derive(Clone, Debug)]
struct RedlockShared {
    nodes: Vec<Arc<Context>>,
    quorum: usize,
    node_timeout: Duration,
}

impl Redlock {
    /// A Redlock over the masters behind `nodes`, one context per master (see
    /// [`Redlock::new`], which checks the list).
    pub(crate) fn from_contexts(nodes: Vec<Arc<Context>>) -> Result<Redlock> {
        let Some(first) = nodes.first() else {
            return Err(config(
                "a Redlock needs at least one redis master (an odd number, three or more, to survive failures)",
            ));
        };
        if nodes.iter().any(|n| n.prefix != first.prefix) {
            return Err(config("every master of a Redlock must use the same key prefix"));
        }
        for (i, a) in nodes.iter().enumerate() {
            if nodes[..i].iter().any(|b| Arc::ptr_eq(a, b)) {
                return Err(config(
                    "the same client was given twice; a Redlock needs one client per master",
                ));
            }
        }
        Ok(Redlock {
            shared: Arc::new(RedlockShared {
                quorum: nodes.len() / 2 + 1,
                nodes,
                node_timeout: DEFAULT_NODE_TIMEOUT,
            }),
        })
    }

    /// Sets the longest one master may take to answer one request (default 200 ms, and
    /// never more than a tenth of a lock's TTL). A master that takes longer counts as
    /// down for that round. Keep it well below the TTL: the time spent acquiring is
    /// subtracted from the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.shared).node_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many masters there are.
    pub fn nodes(&self) -> usize {
        self.shared.nodes.len()
    }

    /// How many masters must agree: a majority, `nodes / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// A quorum mutex at key `<prefix><name>` on every master, with default options
    /// (30 s lease, auto-renew).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a name that breaks the [name rules](crate::Client#names).
    pub fn mutex(&self, name: &str) -> Result<RedlockMutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A quorum mutex with the given lease options. Names follow the [name rules](crate::Client#names).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidTtl`]; [`Error::InvalidArgument`] for a
    /// [`ReplicaAck`](crate::ReplicaAck) policy, which a Redlock does not support (its
    /// durability is the majority of masters).
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<RedlockMutex> {
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        if options.replica_ack.is_some() {
            return Err(Error::InvalidArgument {
                name: name.to_owned(),
                what: "replica acknowledgement",
                reason: "a Redlock does not wait for replicas: its durability is the majority of independent masters; leave the policy off".into(),
            });
        }
        let keys = LockKeys::new(&self.shared.nodes[0].prefix, name)?;
        Ok(RedlockMutex {
            shared: Arc::new(MutexShared {
                redlock: self.shared.clone(),
                name: name.into(),
                channel: keys.aux("wake").into(),
                keys: Arc::new([keys.key.clone()]),
                options,
                ttl_arg: ttl_ms.to_string().into(),
            }),
        })
    }
}

fn config(reason: &str) -> Error {
    Error::Config {
        reason: reason.to_owned(),
        source: None,
    }
}

/// A mutual-exclusion lock held by a majority of a [`Redlock`]'s masters.
///
/// # Policy
///
/// Not fair. Waiters are woken through each master's pub/sub when the holder releases
/// (a release on any master wakes them), with a fallback bounded by the holder's
/// remaining lease. Competing clients that split the masters between them all back
/// off for a random moment and retry, as the algorithm prescribes.
///
/// # Guarantees
///
/// See [`Redlock`]: exclusion while the lease is valid, under bounded clock drift and
/// delayed restarts; no fencing token.
///
/// A cheap handle (clone it freely); it holds no lock by itself.
#[derive(Clone, Debug)]
pub struct RedlockMutex {
    shared: Arc<MutexShared>,
}

#[derive(Debug)]
struct MutexShared {
    redlock: Arc<RedlockShared>,
    name: Arc<str>,
    /// `[lock key]`, the same on every master.
    keys: Arc<[Arc<str>]>,
    channel: Arc<str>,
    options: LeaseOptions,
    ttl_arg: Arc<str>,
}

/// What one master said to one request.
enum Reply {
    /// Acquired (or already ours), with this much left on the master.
    Acquired(Duration),
    /// Held by someone else for this much longer (when known).
    Busy(Option<Duration>),
    /// No usable answer. `maybe_landed`: the request may have been executed.
    Failed { error: RedisError, maybe_landed: bool },
}

/// One acquisition round over all masters, with a token of its own: a claim of an
/// earlier round that is cleaned up late can never delete a later round's key.
struct Round {
    /// When the requests went out.
    start: Instant,
    token: Token,
    /// One per master; dropping the last handle of a claim that may hold the token
    /// releases it in the background.
    claims: Vec<Arc<Claim>>,
    /// One per master; `None`: still on its way when the outcome was decided.
    replies: Vec<Option<Reply>>,
}

impl Round {
    fn replies(&self) -> impl Iterator<Item = &Reply> + '_ {
        self.replies.iter().flatten()
    }

    fn acquired(&self) -> usize {
        self.replies().filter(|r| matches!(r, Reply::Acquired(_))).count()
    }

    fn busy(&self) -> impl Iterator<Item = usize> + '_ {
        self.replies
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Some(Reply::Busy(_))))
            .map(|(i, _)| i)
    }

    /// Masters that answered in time.
    fn reachable(&self) -> usize {
        self.replies()
            .filter(|r| !matches!(r, Reply::Failed { .. }))
            .count()
    }

    /// The shortest lease left on the masters we hold.
    fn held_remaining(&self) -> Option<Duration> {
        self.replies()
            .filter_map(|r| match r {
                Reply::Acquired(d) => Some(*d),
                _ => None,
            })
            .min()
    }

    /// The shortest lease left on the masters someone else holds.
    fn busy_remaining(&self) -> Option<Duration> {
        self.replies()
            .filter_map(|r| match r {
                Reply::Busy(d) => *d,
                _ => None,
            })
            .min()
    }

    fn first_error(&self) -> Option<&RedisError> {
        self.replies().find_map(|r| match r {
            Reply::Failed { error, .. } => Some(error),
            _ => None,
        })
    }

    fn any_transient(&self) -> bool {
        self.replies()
            .any(|r| matches!(r, Reply::Failed { error, .. } if is_transient(error)))
    }
}

impl RedlockMutex {
    /// The lock's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the lock on every master: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.keys[0]
    }

    /// The lease options of this lock.
    pub fn options(&self) -> LeaseOptions {
        self.shared.options
    }

    /// Takes the lock if a majority of masters grant it now, without waiting for a
    /// holder. One round to every master in parallel when uncontended.
    ///
    /// When too few masters answer, the attempt is repeated for the retry window of the
    /// first master's client (default 3 s) before giving up.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no lock behind: whatever it may have taken is
    /// released on every master in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when someone else holds (part of) the lock so that no
    /// majority is possible now; [`Error::NoQuorum`] when too few masters answer.
    pub async fn try_lock(&self) -> Result<RedlockGuard> {
        self.acquire(Wait::Try).await
    }

    /// Takes the lock, waiting for the holder as long as it takes.
    ///
    /// A majority of masters that cannot be reached is not waited for: that fails
    /// after the retry window (default 3 s) with [`Error::NoQuorum`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves no lock behind.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when too few masters answer.
    pub async fn lock(&self) -> Result<RedlockGuard> {
        self.acquire(Wait::FOREVER).await
    }

    /// Takes the lock, waiting at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](RedlockMutex::lock).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the lock was not acquired in time, and
    /// [`Error::NoQuorum`] when too few masters answer.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<RedlockGuard> {
        self.acquire(Wait::timeout(timeout)).await
    }

    fn nodes(&self) -> &[Arc<Context>] {
        &self.shared.redlock.nodes
    }

    fn quorum(&self) -> usize {
        self.shared.redlock.quorum
    }

    /// The per-master timeout for a lease of `ttl`: at most a tenth of it.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.shared
            .redlock
            .node_timeout
            .min(ttl / 10)
            .max(Duration::from_millis(1))
    }

    /// The release on one master: compare-and-delete, and a wake-up.
    fn release_call(&self, node: &Context, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        ScriptCall::new(
            &REDLOCK_RELEASE,
            s.keys.clone(),
            Arc::new([token.shared(), s.channel.clone(), node.publish.clone()]),
        )
    }

    /// The renewal on one master: the plain mutex's extend.
    fn extend_call(&self, _node: &Context, token: &Token) -> ScriptCall {
        ScriptCall::new(
            &MUTEX_EXTEND,
            self.shared.keys.clone(),
            Arc::new([token.shared()]),
        )
    }

    fn no_quorum(&self, op: &'static str, reachable: usize, source: Option<RedisError>) -> Error {
        Error::NoQuorum {
            name: self.shared.name.to_string(),
            op,
            nodes: self.nodes().len(),
            quorum: self.quorum(),
            reachable,
            source,
        }
    }

    async fn acquire(&self, wait: Wait) -> Result<RedlockGuard> {
        let call = AcquireCall::start(Primitive::Redlock);
        call.finish(self.acquire_uncounted(wait).await)
    }

    async fn acquire_uncounted(&self, wait: Wait) -> Result<RedlockGuard> {
        let s = &*self.shared;
        let nodes = self.nodes();
        let quorum = self.quorum();
        let ttl = s.options.ttl;
        let retry_window = nodes[0].retry_window;
        let started = Instant::now();
        let deadline = wait.deadline();
        let mut subs: Vec<Subscription> = Vec::new();
        let mut debt: Option<WakeDebt> = None;
        let mut unreachable_since: Option<Instant> = None;
        let mut backoff = RETRY_FIRST;
        loop {
            let round = self.round(deadline).await;
            if let Some(d) = debt.take() {
                d.settle();
            }
            let acquired = round.acquired();
            let validity = (round.start + round.held_remaining().unwrap_or_default())
                .checked_duration_since(Instant::now() + drift(ttl));
            if acquired >= quorum
                && let Some(validity) = validity.filter(|v| !v.is_zero())
            {
                let remaining = round.held_remaining().unwrap_or(ttl);
                // The keys are the guard's now, also on masters still to answer (its
                // release and renewal cover every master).
                for claim in &round.claims {
                    claim.answered_no();
                }
                tracing::debug!(
                    lock = %s.name, acquired, nodes = nodes.len(), ?validity,
                    waited = ?started.elapsed(), "quorum lock acquired"
                );
                return Ok(self.guard(round.token, round.start, remaining, acquired));
            }
            // Missed: give back what this round took; masters that did not answer are
            // released in the background once they do.
            self.rollback(&round).await;
            let now = Instant::now();
            // A majority that answered too late to leave any validity (a stalled
            // client) counts as unreachable, like one that did not answer.
            let too_late = acquired >= quorum;
            if round.reachable() < quorum || too_late {
                // No majority is possible whoever holds the lock: retry for the retry
                // window, unless every failure was a definite refusal.
                let since = *unreachable_since.get_or_insert(round.start);
                let next = later(now, backoff);
                let give_up = !(round.any_transient() || too_late)
                    || Deadline::from(since, retry_window).before(next)
                    || deadline.before(next);
                let reachable = if too_late { 0 } else { round.reachable() };
                if give_up {
                    let source = round.first_error().cloned().or_else(|| {
                        too_late.then(|| late("the masters answered after the lease's validity"))
                    });
                    tracing::warn!(lock = %s.name, reachable, quorum, "no quorum of redis masters");
                    return Err(self.no_quorum("acquire", reachable, source));
                }
                tracing::debug!(lock = %s.name, reachable, quorum, "too few masters answered; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
                continue;
            }
            unreachable_since = None;
            backoff = RETRY_FIRST;
            let remaining = round.busy_remaining();
            if !wait.waits() {
                return Err(Error::Contended {
                    name: s.name.to_string(),
                    remaining,
                });
            }
            if deadline.passed() {
                return Err(timeout(&s.name, started));
            }
            if acquired > 0 {
                // A split vote: competitors took the other masters. Everyone released;
                // retrying at once would collide again, so back off for a random
                // moment of a few round trips, as the algorithm prescribes.
                let pause = random_up_to(round_trip(round.start) * 4 + Duration::from_millis(5));
                sleep_bounded(pause, deadline).await;
            }
            if subs.is_empty() {
                tracing::debug!(lock = %s.name, "busy; waiting for a release on any master");
                subs = nodes.iter().map(|n| n.notifier.subscribe(&s.channel)).collect();
                let wait_for = deadline.remaining().map_or(nodes[0].subscribe_timeout, |left| {
                    left.min(nodes[0].subscribe_timeout)
                });
                join_all(round.busy().map(|i| subs[i].ready(wait_for))).await;
                continue;
            }
            // Only a release on a master that was busy can make a majority possible. A
            // wake-up on a master we took and gave back is our own rollback: ignoring it
            // keeps a waiter that can never win from spinning.
            let watched: Vec<usize> = round.busy().collect();
            let fallback = remaining.unwrap_or(ttl).max(Duration::from_millis(1));
            let wake_at = Deadline::At(later(
                now,
                fallback.saturating_add(random_up_to(fallback / 10 + Duration::from_millis(5))),
            ))
            .min(deadline);
            // A wake-up that arrived while the round was on its way is a permit already
            // waiting, so this returns at once for it.
            let woken = if watched.is_empty() {
                wake_at.sleep().await;
                None
            } else {
                let wakes: Vec<_> = watched.iter().map(|&i| Box::pin(subs[i].woken())).collect();
                tokio::select! {
                    (_, index, _) = select_all(wakes) => Some(watched[index]),
                    _ = wake_at.sleep() => None,
                }
            };
            if deadline.passed() {
                if let Some(i) = woken {
                    subs[i].pass_on();
                }
                return Err(timeout(&s.name, started));
            }
            if let Some(i) = woken {
                debt = Some(subs[i].debt());
            }
        }
    }

    /// Sends the acquire to every master at once, each bounded by the node timeout,
    /// and returns as soon as the outcome is decided: a majority acquired, or so many
    /// masters are held by others that no majority is possible. A master still to
    /// answer then finishes in the background, and its claim is released if it took
    /// the key. A round that is missing answers is not decided before they come (or
    /// time out), so its rollback and its error report are complete.
    async fn round(&self, deadline: Deadline) -> Round {
        let s = &*self.shared;
        let nodes = self.nodes();
        let ttl = s.options.ttl;
        let quorum = self.quorum();
        let mut limit = self.node_timeout(ttl);
        if let Some(left) = deadline.remaining() {
            limit = limit.min(left.max(Duration::from_millis(1)));
        }
        let token = Token::generate();
        let cmd = Arc::new(REDLOCK_ACQUIRE.evalsha(&s.keys, &[token.expose(), &s.ttl_arg], None));
        let claims: Vec<Arc<Claim>> = nodes
            .iter()
            .map(|n| Arc::new(Claim::new(n.clone(), &s.name, self.release_call(n, &token), ttl)))
            .collect();
        let start = Instant::now();
        let requests = nodes.iter().zip(&claims).map(|(node, claim)| {
            let (node, claim, cmd) = (node.clone(), claim.clone(), cmd.clone());
            claim.arm();
            async move {
                let reply = match call(&node, &REDLOCK_ACQUIRE, &cmd, limit).await {
                    Ok(value) => parse_acquire(&value, ttl),
                    Err((error, maybe_landed)) => Reply::Failed { error, maybe_landed },
                };
                if let Reply::Busy(_)
                | Reply::Failed {
                    maybe_landed: false, ..
                } = reply
                {
                    claim.answered_no();
                }
                reply
            }
        });
        let n = nodes.len();
        let replies = fan_out(requests, |replies: &[Option<Reply>]| {
            let count = |f: fn(&Reply) -> bool| replies.iter().flatten().filter(|r| f(r)).count();
            // Won, or lost to other holders. Unanswered masters are waited for (up to
            // the node timeout) only when they might still decide the round.
            count(|r| matches!(r, Reply::Acquired(_))) >= quorum
                || count(|r| matches!(r, Reply::Busy(_))) > n - quorum
        })
        .await;
        Round {
            start,
            token,
            claims,
            replies,
        }
    }

    /// Releases the masters a missed round acquired, at once and in parallel.
    async fn rollback(&self, round: &Round) {
        let limit = self.node_timeout(self.shared.options.ttl);
        let requests = self
            .nodes()
            .iter()
            .zip(&round.claims)
            .zip(&round.replies)
            .filter(|(_, reply)| matches!(reply, Some(Reply::Acquired(_))))
            .map(|((node, claim), _)| {
                let (node, claim) = (node.clone(), claim.clone());
                let release = self.release_call(&node, &round.token);
                async move {
                    if call(&node, release.script, &release.cmd(), limit).await.is_ok() {
                        claim.answered_no();
                    }
                }
            });
        fan_out(requests, |_: &[Option<()>]| false).await;
    }

    fn guard(&self, token: Token, start: Instant, remaining: Duration, acquired: usize) -> RedlockGuard {
        let s = &*self.shared;
        let round = Arc::new(RenewRoundOf {
            mutex: self.clone(),
            token: token.clone(),
        });
        let state = LeaseState::new(
            s.name.clone(),
            start,
            s.options.ttl,
            remaining,
            Renew::Round(round),
            s.options.auto_renew,
            Some(Primitive::Redlock),
        );
        // Renewed, or watched for running out.
        self.nodes()[0].renewer.schedule(&state);
        let keeper = Arc::new(Keeper {
            mutex: self.clone(),
            token: token.clone(),
        });
        RedlockGuard {
            core: GuardCore::custom(keeper, s.keys[0].clone(), token, Lease::new(state)),
            mutex: self.clone(),
            acquired,
        }
    }

    /// One compare-and-`PEXPIRE` round over every master, decided as soon as a
    /// majority confirmed, or so many masters lost the token that no majority can.
    async fn renew_round(&self, token: &Token, ttl: Duration) -> Renewal {
        match self.renew_round_counted(token, ttl).await {
            (Renewal::Unreachable { error }, reachable, _) => {
                tracing::debug!(lock = %self.shared.name, reachable, ?error, "quorum renewal failed");
                Renewal::Unreachable { error }
            }
            (outcome, ..) => outcome,
        }
    }

    /// A renewal round, how many masters answered, and the first failure.
    async fn renew_round_counted(
        &self,
        token: &Token,
        ttl: Duration,
    ) -> (Renewal, usize, Option<RedisError>) {
        let nodes = self.nodes();
        let quorum = self.quorum();
        let limit = self.node_timeout(ttl);
        let ttl_ms = ttl.as_millis() as u64;
        let sent = Instant::now();
        let requests = nodes.iter().map(|n| {
            let node = n.clone();
            let c = self.extend_call(n, token);
            async move { call(&node, c.script, &c.cmd_with_ttl(ttl_ms), limit).await }
        });
        let held = |r: &Option<std::result::Result<Value, (RedisError, bool)>>| matches!(r, Some(Ok(v)) if int(v) == Some(1));
        let n = nodes.len();
        let results = fan_out(requests, |results: &[Option<_>]| {
            let confirmed = results.iter().filter(|r| held(r)).count();
            let gone = results
                .iter()
                .filter(|r| matches!(r, Some(Ok(_))) && !held(r))
                .count();
            confirmed >= quorum || gone > n - quorum
        })
        .await;
        let confirmed = results.iter().filter(|r| held(r)).count();
        let failed = results.iter().filter(|r| !matches!(r, Some(Ok(_)))).count();
        let reachable = nodes.len() - failed;
        let first = results
            .into_iter()
            .flatten()
            .find_map(|r| r.err().map(|(e, _)| e));
        if confirmed >= quorum && Instant::now() < later(sent, ttl.saturating_sub(drift(ttl))) {
            return (Renewal::Confirmed { sent }, reachable, first);
        }
        if confirmed + failed < quorum {
            return (Renewal::Gone, reachable, first);
        }
        let error = first.as_ref().map(ToString::to_string);
        (Renewal::Unreachable { error }, reachable, first)
    }

    /// Releases `token` on every master in the background.
    fn release_everywhere(&self, token: &Token, ttl: Duration) {
        for node in self.nodes() {
            spawn_release(
                node.clone(),
                self.shared.name.clone(),
                self.release_call(node, token),
                ttl,
            );
        }
    }
}

/// Runs one script call on one master within `limit`. On failure, also says whether
/// the request may have been executed.
async fn call(
    node: &Context,
    script: &LuaScript,
    cmd: &Cmd,
    limit: Duration,
) -> std::result::Result<Value, (RedisError, bool)> {
    match tokio::time::timeout(limit, eval(&*node.conn, script, cmd)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            // A refused connection never carried the request; an error reply is a
            // definite answer (the scripts fail before writing).
            let maybe = is_transient(&e) && !e.is_connection_refusal();
            Err((e, maybe))
        }
        Err(_) => Err((
            late("no reply from the redis master within the node timeout"),
            true,
        )),
    }
}

/// Runs one request per master, each in a task of its own, and collects the results
/// in master order until `decided` says the outcome is known (or all answered).
/// Requests still running then finish in the background; each is bounded by its own
/// timeout and cleans up after itself.
async fn fan_out<T, F>(
    requests: impl Iterator<Item = F>,
    decided: impl Fn(&[Option<T>]) -> bool,
) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut count = 0;
    for (i, request) in requests.enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let _ = tx.send((i, request.await));
        });
        count += 1;
    }
    drop(tx);
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    while let Some((i, result)) = rx.recv().await {
        results[i] = Some(result);
        if decided(&results) {
            break;
        }
    }
    results
}

fn late(what: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, what))
}

fn parse_acquire(value: &Value, ttl: Duration) -> Reply {
    let ms = |v: &Value| {
        int(v)
            .filter(|&x| x >= 0)
            .map(|x| Duration::from_millis(x as u64))
    };
    if int(value).is_some() {
        return Reply::Acquired(ttl);
    }
    match array(value).unwrap_or_default() {
        [flag, pttl] if int(flag) == Some(1) => Reply::Acquired(ms(pttl).unwrap_or(ttl).min(ttl)),
        [flag, pttl] if int(flag) == Some(0) => Reply::Busy(ms(pttl)),
        _ => Reply::Failed {
            error: RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply")),
            maybe_landed: true,
        },
    }
}

fn timeout(name: &str, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    }
}

fn round_trip(start: Instant) -> Duration {
    start.elapsed()
}

/// A uniformly random duration in `[0, max)`.
fn random_up_to(max: Duration) -> Duration {
    let max = max.as_micros().max(1) as u64;
    Duration::from_micros(getrandom::u64().unwrap_or(0) % max)
}

async fn sleep_bounded(pause: Duration, deadline: Deadline) {
    Deadline::after(pause).min(deadline).sleep().await;
}
