//! Leader election: one leader among any number of candidates, a term that fences a
//! stale leader, a value the leader publishes, and a stream of changes for observers
//! (`observe`).
//!
//! The leader is a lease like any lock's, kept by the engine; what is the election's
//! own is its keys (the leader's hash, the term mark, a short history of changes),
//! its scripts, and telling observers what changed.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use redis::Value;

use crate::engine::acquire::{Acquire, Reply};
use crate::engine::context::Context;
use crate::engine::deadline::{Deadline, Wait};
use crate::engine::guard::{GuardCore, LockBase, guard_surface};
use crate::engine::lease::LostReason;
use crate::engine::metrics::Primitive;
#[allow(unused_imports)] // `Error` is named by the docs' links
use crate::error::{Error, Result};
use crate::keys::{self, LockKeys};
use crate::options::LeaseOptions;
use crate::script::reply::{array, int, ms, opt_string, text};
use crate::script::{
    ELECTION_CAMPAIGN, ELECTION_PROCLAIM, ELECTION_RENEW, ELECTION_RESIGN, ELECTION_STATUS, ScriptCall,
};
use crate::token::{FencingToken, Token};

mod observe;

pub use observe::{LeaderEvent, Observer};

/// The longest value a leader may publish, in bytes.
pub const MAX_LEADER_VALUE_LEN: usize = 64 * 1024;

/// A leader election: at most one candidate leads at a time, for a term.
///
/// Candidates [`campaign`](Election::campaign); the one that finds the election without
/// a leader becomes leader and gets a [`Leadership`] guard — a lease renewed in the
/// background like any lock's, with its [`term`](Leadership::term), a
/// [`lost`](Leadership::lost) signal and [`resign`](Leadership::resign). The others
/// wait. Anyone can read the current [`leader`](Election::leader) (its published value,
/// term, owner and remaining lease) or [`observe`](Election::observe) every change. This
/// is the recipe of etcd's `Election` (campaign, proclaim, resign, leader, observe) on
/// Redis.
///
/// # Terms
///
/// Every leadership gets a term, a [`FencingToken`] strictly greater than every term
/// of the election before it — also after a vacancy, and after its bookkeeping expired
/// (the next term is then taken from Redis's clock). The term is what makes an election
/// safe to act on: a leader that hands its term to the resources it changes (a store
/// that refuses writes with a lower term than the highest it saw) cannot do harm after
/// it stopped being leader without knowing it.
///
/// # Policy
///
/// Not fair: when the leader resigns (or its lease runs out), the waiting candidates
/// are woken through Redis pub/sub — one per waiting process — and the first to try
/// leads. Nobody polls: a resignation reaches the candidates in about one round trip,
/// and a missed wake-up costs at most the leader's remaining lease.
///
/// # What an election guarantees
///
/// At most one leader at a time *while leases are valid and Redis keeps its writes*,
/// exactly as for a [`Mutex`](crate::Mutex). A leader that pauses past its lease (GC,
/// swap, a stopped VM) still believes it leads when it wakes, while another candidate
/// has been elected; a Sentinel or Cluster failover may promote a replica that never
/// saw the leader, and a second candidate is elected while the first still acts. So
/// **without fencing, two leaders can overlap.** The leader learns it at its next
/// renewal ([`lost`](Leadership::lost)), but by then it may have acted. Kubernetes'
/// leader election (client-go) has this property and says so: it gives no fencing.
/// etcd's election gives the leader key's revision, which a resource can check; here
/// the term plays that part. Pass it to everything the leader changes.
///
/// # Keys
///
/// The leader is a hash at `<prefix><name>` (`token`, `term`, `value`, `owner`,
/// `since`) whose TTL is the lease. Beside it, in the same cluster slot: the term mark
/// `{<key>}:term` and a history of the last 100 changes `{<key>}:history` (both kept
/// for the lease plus the client's metadata retention), and the channels
/// `{<key>}:wake` (candidates) and `{<key>}:watch` (observers). Every key expires on
/// its own; nothing is left behind when an election is abandoned.
///
/// `Election` is a cheap handle (clone it freely); it holds no leadership by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let client = redlease::Client::connect("redis://127.0.0.1:6379").await?;
/// let election = client.election("scheduler")?;
///
/// let leadership = election.campaign("10.0.0.7:8080").await?;
/// let term = leadership.term();
/// tokio::select! {
///     // Lead, handing `term` to every resource the scheduler changes.
///     _ = schedule(term) => {}
///     // The lease could not be kept: another candidate may lead already.
///     reason = leadership.lost() => eprintln!("no longer the leader: {reason}"),
/// }
/// leadership.resign().await?;
/// # Ok(()) }
/// # async fn schedule(_: redlease::FencingToken) {}
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    shared: Arc<ElectionShared>,
}

#[derive(Debug)]
struct ElectionShared {
    base: LockBase,
    /// `[leader, term, history]`: campaign, renew, resign and status.
    keys: Arc<[Arc<str>]>,
    /// `[leader, history]`: proclaim.
    proclaim_keys: Arc<[Arc<str>]>,
    /// The candidates' channel, `{<key>}:wake`.
    wake: Arc<str>,
    /// The observers' channel, `{<key>}:watch`.
    watch: Arc<str>,
    ttl_arg: Arc<str>,
}

/// The leader of an election, as [`Election::leader`] and [`Election::observe`] report
/// it. Never contains a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The value the leader published: given to [`Election::campaign`], changed by
    /// [`Leadership::proclaim`].
    pub value: String,
    /// Its term: the fencing token of its leadership.
    pub term: FencingToken,
    /// Its owner label (`host:pid` unless the client was given another, see
    /// [`ClientBuilder::owner_label`](crate::ClientBuilder::owner_label)).
    pub owner: String,
    /// When it was elected (Redis server time), when known.
    pub since: Option<SystemTime>,
    /// What was left of its lease when this was read; `None` when its term had already
    /// ended by then (a change [`observe`](Election::observe) read from the history).
    pub remaining: Option<Duration>,
}

impl Election {
    pub(crate) fn new(ctx: Arc<Context>, name: &str, options: LeaseOptions) -> Result<Self> {
        let keys = LockKeys::new(&ctx.prefix, name)?;
        let base = LockBase::new(ctx, Primitive::Election, name, &keys.key, options)?;
        let ttl_ms = keys::ttl_ms(name, options.ttl)?;
        let leader = base.key.clone();
        let history: Arc<str> = keys.aux("history").into();
        Ok(Election {
            shared: Arc::new(ElectionShared {
                keys: Arc::new([leader.clone(), keys.aux("term").into(), history.clone()]),
                proclaim_keys: Arc::new([leader, history]),
                wake: keys.aux("wake").into(),
                watch: keys.aux("watch").into(),
                base,
                ttl_arg: ttl_ms.to_string().into(),
            }),
        })
    }

    /// The election's name (without the prefix).
    pub fn name(&self) -> &str {
        &self.shared.base.name
    }

    /// The Redis key of the leader: `<prefix><name>`.
    pub fn key(&self) -> &str {
        &self.shared.base.key
    }

    /// The lease options of a leadership of this election.
    pub fn options(&self) -> LeaseOptions {
        self.shared.base.options
    }

    /// Becomes the leader if the election has none, publishing `value`, without
    /// waiting. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no leadership behind: an attempt that may have reached
    /// Redis is resigned in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Contended`] when another candidate leads (with its remaining lease);
    /// [`Error::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE_LEN`];
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn try_campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_with(value, Wait::Try).await
    }

    /// Waits until this candidate leads, publishing `value`, as long as it takes.
    ///
    /// One round trip when nobody leads. Otherwise the candidate waits for the
    /// leader to resign or for its lease to run out: a resignation wakes it through
    /// Redis pub/sub, and it tries again at the latest when the leader's lease would
    /// end, so a missed wake-up costs at most that. Among several waiting candidates the
    /// first to try after a vacancy leads.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves no leadership behind (an attempt that
    /// may have reached Redis is resigned in the background), and a wake-up it consumed
    /// is passed on to another candidate of this client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE_LEN`];
    /// [`Error::WrongType`], [`Error::ReadOnly`] or [`Error::Redis`] when Redis cannot
    /// be used (after retrying temporary failures for the client's retry window).
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_with(value, Wait::FOREVER).await
    }

    /// As [`campaign`](Election::campaign), giving up after `timeout`.
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Election::campaign).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when this candidate did not come to lead in time, and the
    /// errors of [`campaign`](Election::campaign).
    pub async fn campaign_timeout(&self, value: &str, timeout: Duration) -> Result<Leadership> {
        self.campaign_with(value, Wait::timeout(timeout)).await
    }

    async fn campaign_with(&self, value: &str, wait: Wait) -> Result<Leadership> {
        self.check_value(value)?;
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        let token = Token::generate();
        let cmd = ELECTION_CAMPAIGN.evalsha(
            &s.keys,
            &[
                token.expose(),
                value,
                &ctx.label,
                &s.ttl_arg,
                &ctx.retention_arg,
                &ctx.publish,
                &s.watch,
            ],
            None,
        );
        let resign = self.resign_call(&token);
        let spec = Acquire {
            script: &ELECTION_CAMPAIGN,
            cmd: &cmd,
            channel: &s.wake,
            wait,
            // An attempt that may have made us leader, for a caller that went away.
            undo: resign.clone(),
            renew: ScriptCall::new(
                &ELECTION_RENEW,
                s.keys.clone(),
                Arc::new([token.shared(), ctx.retention_arg.clone()]),
            ),
            release: resign,
            token,
            // A resignation wakes the waiting candidates and the first to try leads
            // (about two round trips); nothing is handed to one in particular.
            grant: None,
        };
        let ttl = s.base.options.ttl;
        let core = s
            .base
            .acquire(spec, |reply, _| parse_campaign(reply, ttl, &s.base))
            .await?;
        Ok(Leadership {
            term: core.fence().unwrap_or(FencingToken::new(0)),
            core,
            value: StdMutex::new(value.to_owned()),
            election: self.clone(),
        })
    }

    fn resign_call(&self, token: &Token) -> ScriptCall {
        let s = &*self.shared;
        let ctx = &s.base.ctx;
        ScriptCall::new(
            &ELECTION_RESIGN,
            s.keys.clone(),
            Arc::new([
                token.shared(),
                ctx.retention_arg.clone(),
                ctx.publish.clone(),
                s.wake.clone(),
                s.watch.clone(),
            ]),
        )
    }

    fn check_value(&self, value: &str) -> Result<()> {
        if value.len() > MAX_LEADER_VALUE_LEN {
            return Err(Error::InvalidArgument {
                name: self.name().to_owned(),
                what: "leader value",
                reason: format!(
                    "{} bytes is longer than the {MAX_LEADER_VALUE_LEN} bytes a leader may publish",
                    value.len()
                ),
            });
        }
        Ok(())
    }

    /// The current leader, or `None` when nobody leads.
    ///
    /// Reads only; never reveals a token. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when a key of the election holds something else, and Redis
    /// errors.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.read(None).await?.leader)
    }

    /// A stream of the election's changes: each new term with its leader's value, each
    /// value the leader proclaims, and each vacancy. See [`Observer`].
    ///
    /// Lazy: nothing is sent until the stream is first polled.
    pub fn observe(&self) -> Observer {
        Observer::new(self.clone())
    }

    /// Reads the leader and, given a history position, the changes after it (else the
    /// last change only).
    async fn read(&self, after: Option<&str>) -> Result<Snapshot> {
        let s = &*self.shared;
        let cmd = ELECTION_STATUS.evalsha(&s.keys, &[after.unwrap_or("")], None);
        let (items, _) = s.base.status(&ELECTION_STATUS, &cmd, None).await?;
        Snapshot::parse(&items).ok_or_else(|| s.base.op("status").bad_reply())
    }

    fn ctx(&self) -> &Context {
        &self.shared.base.ctx
    }
}

/// Reads the reply of `election_campaign.lua`.
fn parse_campaign(reply: &Value, ttl: Duration, base: &LockBase) -> Result<Reply> {
    if let Some(elected) = Reply::acquired(reply, ttl, true) {
        return Ok(elected);
    }
    match array(reply).unwrap_or_default() {
        [flag, pttl] if int(flag) == Some(0) => Ok(Reply::busy(ms(int(pttl)))),
        _ => Err(base.op("campaign").bad_reply()),
    }
}

/// What `election_status.lua` read: the leader, and changes from the history.
#[derive(Debug)]
struct Snapshot {
    leader: Option<Leader>,
    entries: Vec<Change>,
}

/// One entry of the history.
#[derive(Debug)]
struct Change {
    id: String,
    kind: ChangeKind,
    leader: Leader,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeKind {
    Elected,
    Proclaimed,
    Resigned,
    Expired,
}

impl Snapshot {
    fn parse(items: &[Value]) -> Option<Snapshot> {
        let [leads, pttl, term, value, owner, since, _last_term, entries] = items else {
            return None;
        };
        let leader = match int(leads) {
            Some(1) => Some(Leader {
                value: opt_string(value).unwrap_or_default(),
                term: FencingToken::new(number(term)?),
                owner: opt_string(owner).unwrap_or_default(),
                since: time(since),
                remaining: ms(int(pttl)),
            }),
            _ => None,
        };
        let entries = array(entries)?.iter().filter_map(Change::parse).collect();
        Some(Snapshot { leader, entries })
    }
}

impl Change {
    /// An XRANGE entry, `{id, {field, value, ...}}`; `None` for one we cannot read.
    fn parse(entry: &Value) -> Option<Change> {
        let [id, fields] = array(entry)? else {
            return None;
        };
        let mut kind = None;
        let mut leader = Leader {
            value: String::new(),
            term: FencingToken::new(0),
            owner: String::new(),
            since: None,
            remaining: None,
        };
        for pair in array(fields)?.chunks(2) {
            let [field, value] = pair else { continue };
            match text(field)? {
                "kind" => {
                    kind = Some(match text(value)? {
                        "elected" => ChangeKind::Elected,
                        "proclaimed" => ChangeKind::Proclaimed,
                        "resigned" => ChangeKind::Resigned,
                        "expired" => ChangeKind::Expired,
                        _ => return None,
                    })
                }
                "term" => leader.term = FencingToken::new(number(value)?),
                "value" => leader.value = opt_string(value).unwrap_or_default(),
                "owner" => leader.owner = opt_string(value).unwrap_or_default(),
                "since" => leader.since = time(value),
                _ => {}
            }
        }
        Some(Change {
            id: opt_string(id)?,
            kind: kind?,
            leader,
        })
    }
}

/// A non-negative number stored as a string (or an integer reply).
fn number(v: &Value) -> Option<u64> {
    opt_string(v)?.parse().ok()
}

/// Milliseconds of Redis server time as a time; `None` for zero or garbage.
fn time(v: &Value) -> Option<SystemTime> {
    number(v)
        .filter(|&ms| ms > 0)
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

/// Proof of leading an [`Election`], for one term.
///
/// While the guard lives its lease is renewed automatically (unless the election was
/// made with `auto_renew(false)`). Check [`is_held`](Leadership::is_held) or await
/// [`lost`](Leadership::lost) to learn when this candidate can no longer rely on
/// leading, and pass [`term`](Leadership::term) to everything the leader changes, so
/// that a leader that lost its lease without noticing (a long pause, a failover)
/// is refused. It is on the common guard surface ([`Guard`](crate::Guard)), with the
/// term as its fencing token.
///
/// # Drop
///
/// Dropping the guard without [`resign`](Leadership::resign) stops renewal and resigns
/// in the background (waking the waiting candidates) when a tokio runtime is running;
/// otherwise the lease simply runs out, and the next candidate leads when its fallback
/// timer (the leader's remaining lease) fires.
#[must_use = "dropping the leadership resigns it"]
#[derive(Debug)]
pub struct Leadership {
    core: GuardCore,
    term: FencingToken,
    /// The value this leader last published.
    value: StdMutex<String>,
    election: Election,
}

guard_surface!(Leadership, "this leadership", fence: |g| Some(g.term));

impl Leadership {
    fn core(&self) -> &GuardCore {
        &self.core
    }

    /// The election this candidate leads.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// The term of this leadership: strictly greater than the term of every leader of
    /// the election before it. The fencing token to hand every resource the leader
    /// changes.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The term, under the name every guard uses for its fencing token.
    pub fn fence(&self) -> FencingToken {
        self.term
    }

    /// The value this leader published last ([`Election::campaign`]'s, or the last
    /// [`proclaim`](Leadership::proclaim)ed).
    pub fn value(&self) -> String {
        self.value.lock().expect("value lock").clone()
    }

    /// Publishes a new value for this leadership: [`Election::leader`] reports it, and
    /// observers get [`LeaderEvent::Proclaimed`]. The term does not change. Publishing
    /// the value already published changes nothing and tells nobody. One round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not publish the value; calling again is safe.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when this candidate no longer leads (the lease was lost, or it
    /// ran out before a renewal could confirm it; the lease then reports why), and
    /// nothing is published; [`Error::InvalidArgument`] for a value longer than
    /// [`MAX_LEADER_VALUE_LEN`]; Redis errors.
    pub async fn proclaim(&self, value: &str) -> Result<()> {
        let e = &self.election;
        e.check_value(value)?;
        let s = &*e.shared;
        let op = s.base.op("proclaim");
        let state = self.core.state();
        if state.ended().is_some() {
            return Err(op.not_held());
        }
        let ctx = e.ctx();
        let cmd = ELECTION_PROCLAIM.evalsha(
            &s.proclaim_keys,
            &[
                self.core.token().expose(),
                value,
                &ctx.retention_arg,
                &ctx.publish,
                &s.watch,
            ],
            None,
        );
        let reply = op.eval(&ELECTION_PROCLAIM, &cmd, Deadline::Never, None).await?;
        if int(&reply) != Some(1) {
            state.end(LostReason::Gone);
            return Err(op.not_held());
        }
        *self.value.lock().expect("value lock") = value.to_owned();
        Ok(())
    }

    /// Steps down: the leadership ends, the waiting candidates are woken (the first to
    /// try leads next, in about one round trip) and observers see the vacancy.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the resignation finishes in the
    /// background.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the lease had already been lost — another candidate may
    /// have led alongside this one; Redis errors (the resignation is then retried in
    /// the background until the lease would have run out).
    pub async fn resign(self) -> Result<()> {
        self.core.release().await
    }

    /// The same as [`resign`](Leadership::resign), under the name every guard uses.
    ///
    /// # Cancel safety
    ///
    /// As [`resign`](Leadership::resign).
    ///
    /// # Errors
    ///
    /// As [`resign`](Leadership::resign).
    pub async fn release(self) -> Result<()> {
        self.resign().await
    }
}
