//! Observing an election: its changes as a stream, delivered by notification.
//!
//! Every script that changes the election — an election, a proclamation, a
//! resignation — appends the change to the election's history (a capped stream) and
//! publishes on the observers' channel in the same atomic step. An observer waits for
//! that message, then reads the leader and the history after the last entry it saw,
//! in one round trip: so it reports every change in order even when several came
//! between two reads. What no script records — a lease that simply runs out — it
//! learns by reading again when the leader's lease would have ended, which also bounds
//! what a missed message costs.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures_util::Stream;
use futures_util::stream::BoxStream;
use tokio::time::Instant;

use super::{ChangeKind, Election, Leader, Snapshot};
use crate::engine::deadline::later;
use crate::engine::notify::Subscription;
#[allow(unused_imports)] // `Error` is named by the docs' links
use crate::error::{Error, Result};

/// How soon an observer reads again after a read failed (unless a change is announced
/// first).
const AFTER_ERROR: Duration = Duration::from_millis(500);

/// A change of an election, as an [`Observer`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// A leader took office, for a term strictly higher than that of every event the
    /// stream reported before. A stream that begins while someone leads begins with
    /// this event for that leader.
    Elected(Leader),
    /// The leader of the current term published a new value.
    Proclaimed(Leader),
    /// Nobody leads. `resigned` when the last leader resigned; otherwise its lease ran
    /// out (it crashed, hung or lost Redis), or nobody led when the stream began and the
    /// last leader within the history kept did not resign.
    Vacant {
        /// Whether the last leader resigned.
        resigned: bool,
    },
}

/// The changes of an [`Election`], as a [`Stream`]: made by [`Election::observe`].
///
/// The first item is the election as it is when the stream is first polled: the
/// current leader as [`LeaderEvent::Elected`], or [`LeaderEvent::Vacant`]. Then one
/// item per change: each new term with its leader's value, each value the leader
/// proclaims, each vacancy. Terms only rise: an event never reports a term lower than
/// one reported before.
///
/// # Delivery
///
/// Changes are announced through Redis pub/sub by the scripts that make them, and read
/// together with the election's history, so changes that came in a burst are all
/// reported, in order (up to the last 100). Besides the announcements, the stream reads
/// once when the leader's lease it last saw would end (at most once per lease length,
/// as renewals push that moment on): a leader that crashed leaves no message behind,
/// and that read reports the vacancy at most one lease after it. A missed message (a
/// broken pub/sub connection) costs the same at most — or, while nobody leads, the
/// lease length of this handle's election ([`Election::options`]).
///
/// # Errors
///
/// An item is an error when Redis could not be read (after retrying temporary failures
/// for the client's retry window). The stream goes on: the next poll reads again,
/// after a short pause unless a change is announced first. The stream never ends.
///
/// # Cancel safety
///
/// Dropping a `next()` future loses nothing: a read in progress continues at the next
/// poll. Dropping the stream unsubscribes.
///
/// # Examples
///
/// ```no_run
/// use futures_util::StreamExt;
/// use redlease::LeaderEvent;
///
/// # async fn demo(client: redlease::Client) -> Result<(), redlease::Error> {
/// let mut changes = client.election("scheduler")?.observe();
/// while let Some(change) = changes.next().await {
///     match change? {
///         LeaderEvent::Elected(leader) => println!("term {}: {} leads", leader.term, leader.value),
///         LeaderEvent::Proclaimed(leader) => println!("the leader now says {}", leader.value),
///         LeaderEvent::Vacant { .. } => println!("nobody leads"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Observer {
    inner: BoxStream<'static, Result<LeaderEvent>>,
}

impl Observer {
    pub(super) fn new(election: Election) -> Observer {
        let watch = Watch {
            election,
            sub: None,
            after: None,
            said: Said::Nothing,
            term: 0,
            pending: VecDeque::new(),
            generation: 0,
            recheck: Instant::now(),
        };
        let inner = futures_util::stream::unfold(watch, |mut watch| async move {
            let item = watch.next().await;
            Some((item, watch))
        });
        Observer {
            inner: Box::pin(inner),
        }
    }
}

impl Stream for Observer {
    type Item = Result<LeaderEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// What the stream last reported.
#[derive(Debug)]
enum Said {
    Nothing,
    Leader { value: String },
    Vacant,
}

/// The observer's state between items.
struct Watch {
    election: Election,
    /// The observers' channel, subscribed at the first poll.
    sub: Option<Subscription>,
    /// The last history entry read; `None` before the first read.
    after: Option<String>,
    said: Said,
    /// The highest term reported.
    term: u64,
    /// Changes read but not yet reported.
    pending: VecDeque<LeaderEvent>,
    /// The channel's message count when the last read that succeeded was sent.
    generation: u64,
    /// When to read again if no message comes.
    recheck: Instant,
}

impl Watch {
    async fn next(&mut self) -> Result<LeaderEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            self.wait().await;
            let generation = self.sub.as_ref().map_or(0, Subscription::generation);
            match self.election.read(self.after.as_deref()).await {
                Ok(snapshot) => {
                    self.generation = generation;
                    self.apply(snapshot);
                }
                Err(e) => {
                    self.recheck = later(Instant::now(), AFTER_ERROR);
                    return Err(e);
                }
            }
        }
    }

    /// Waits until a change is announced or it is time to read again. The first time,
    /// subscribes instead (and does not wait), so nothing after the first read is
    /// missed.
    async fn wait(&mut self) {
        let Some(sub) = &self.sub else {
            let e = &self.election;
            let sub = e.ctx().notifier.subscribe(&e.shared.watch);
            if !sub.ready(e.ctx().subscribe_timeout).await {
                tracing::debug!(election = %e.name(), "change subscription not confirmed; reading at each lease's end");
            }
            self.sub = Some(sub);
            return;
        };
        loop {
            // A message counted since the last read was sent: read again. (Wake permits
            // are shared by every observer of the channel in this client, so the count,
            // not the permit, says whether this observer has something new.)
            if sub.generation() != self.generation {
                return;
            }
            tokio::select! {
                _ = sub.woken() => {}
                _ = tokio::time::sleep_until(self.recheck) => return,
            }
        }
    }

    /// Turns what a read found into events.
    fn apply(&mut self, snapshot: Snapshot) {
        let Snapshot { leader, entries } = snapshot;
        let now = leader.as_ref().map(|l| (l.term, l.remaining));
        if self.after.is_none() {
            // Where the stream begins: the election as it is now.
            self.after = Some(entries.last().map_or_else(|| "0-0".to_owned(), |c| c.id.clone()));
            match leader.clone() {
                Some(l) => self.elected(l),
                None => {
                    let resigned = entries.last().is_some_and(|c| c.kind == ChangeKind::Resigned);
                    self.vacant(resigned);
                }
            }
        } else {
            for change in entries {
                self.after = Some(change.id);
                let mut l = change.leader;
                if let Some((term, remaining)) = now
                    && term == l.term
                {
                    l.remaining = remaining;
                }
                let term = l.term.get();
                match change.kind {
                    ChangeKind::Elected | ChangeKind::Proclaimed if term > self.term => self.elected(l),
                    ChangeKind::Proclaimed if term == self.term => self.proclaimed(l),
                    ChangeKind::Resigned | ChangeKind::Expired if term >= self.term => {
                        self.vacant(change.kind == ChangeKind::Resigned)
                    }
                    _ => {}
                }
            }
            // The history lacks what no script recorded (a lease that ran out, a key
            // deleted by hand) and what was trimmed: the leader as it is now has the
            // last word.
            match leader.clone() {
                Some(l) if l.term.get() > self.term => self.elected(l),
                Some(l) if l.term.get() == self.term => self.proclaimed(l),
                Some(_) => {}
                None => self.vacant(false),
            }
        }
        // Read again when the leader's lease would end: if it was not renewed, nobody
        // announces that. Without a leader, any change is announced; the lease length
        // bounds what a missed announcement costs.
        let ttl = self.election.options().ttl;
        let wait = leader.and_then(|l| l.remaining).unwrap_or(ttl);
        self.recheck = later(Instant::now(), wait + wait / 100 + Duration::from_millis(5));
    }

    fn elected(&mut self, leader: Leader) {
        self.term = leader.term.get();
        self.said = Said::Leader {
            value: leader.value.clone(),
        };
        self.pending.push_back(LeaderEvent::Elected(leader));
    }

    /// The leader of the reported term published `leader.value`, if it is new.
    fn proclaimed(&mut self, leader: Leader) {
        match &mut self.said {
            Said::Leader { value } if *value != leader.value => {
                value.clone_from(&leader.value);
                self.pending.push_back(LeaderEvent::Proclaimed(leader));
            }
            _ => {}
        }
    }

    fn vacant(&mut self, resigned: bool) {
        if !matches!(self.said, Said::Vacant) {
            self.said = Said::Vacant;
            self.pending.push_back(LeaderEvent::Vacant { resigned });
        }
    }
}
