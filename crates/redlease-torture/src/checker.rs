//! The checker: audits one counter's access log against what the clients reported.
//!
//! What it counts as a **violation**:
//!
//! - **lost or duplicated increments**: `|final value − accepted writes|`. Each critical
//!   section writes back what it read plus one, so with mutual exclusion every accepted
//!   write adds exactly one. The number of accepted writes comes from the resource's own
//!   log, never from the clients, so a client that believes its write was refused (or
//!   applied) cannot skew it.
//! - **interleavings**: critical sections whose accepted accesses were split by an
//!   accepted access of another critical section (A, B, A) in the resource's log.
//! - For algorithms with leases, **paused holders whose `lost()` did not fire first**:
//!   a holder stalled well past its lease (`client-pause`, at least 1.2 × TTL) must have
//!   seen `lost()` fire before the resource answered its write — refused it or, when no
//!   newer holder had come yet, accepted it.
//! - For fenced algorithms, **unexpected overlaps**: the resource refused a holder A
//!   because a newer holder B had accessed it *while A's lease was still valid by A's
//!   own clock*. That means two holders at once. When Redis forgot the lock in between
//!   (a restart without persistence), this is the documented limit of a Redis lock, the
//!   fence refused A, and it is counted as an overlap *caught by fencing*, not a
//!   violation. Otherwise it is a violation.
//!
//! Disagreements between the clients' reports and the resource's log (a write a client
//! reports as done that the resource never accepted, or the reverse) are harness errors.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::faults::{Event, Fault};
use crate::resource::{CounterLog, Op};
use crate::worker::cs_worker;

/// How a critical section ended, as its client reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Its write was accepted.
    Ok,
    /// The resource refused its read or write (stale token).
    Fenced,
    /// It saw its lease lost before an access and stopped.
    Abandoned,
    /// The resource connection failed (a harness error).
    Io,
}

/// One critical section as its client reported it. Times are on the shared clock.
#[derive(Clone, Debug)]
pub struct CsReport {
    pub outcome: Outcome,
    /// When it started to acquire, and when it got the lock.
    pub start_ns: u64,
    pub acquired_ns: u64,
    /// When its release returned.
    pub released_ns: u64,
    /// Stall injected before its write (`client-pause`), and when it began.
    pub stall_ms: u64,
    pub stall_ns: u64,
    /// When the resource refused it.
    pub rejected_ns: Option<u64>,
    /// Its lease's `lost()`: the reason and when it fired (not set when released first).
    pub lost: Option<String>,
    pub lost_ns: Option<u64>,
    pub has_lease: bool,
    pub release: String,
    /// When it leaned on its lease (`extend`: its client frozen until just before
    /// `valid_until`), and for how long (µs).
    pub lean_ns: u64,
    pub lean_us: u64,
    /// Its extends (the `extend` fault): succeeded, failed "not held", failed otherwise.
    pub extends: (u64, u64, u64),
    /// The first extend failure's message.
    pub extend_error: Option<String>,
}

/// What the clients of one algorithm reported in one phase.
#[derive(Debug, Default)]
pub struct Tally {
    pub cs: HashMap<u64, CsReport>,
    pub acquire_timeouts: u64,
    pub acquire_unavailable: u64,
    pub acquire_other: u64,
    pub other_errors: Vec<String>,
}

/// The checker's findings for one algorithm in one phase.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Critical sections completed: writes (or, for tokenless holders, ends) the
    /// resource accepted.
    pub critical_sections: u64,
    /// ... of which writes.
    pub writes: u64,
    /// The most critical sections inside at once, by the resource's log.
    pub max_inside: u64,
    /// Read-write lock: a reader and a writer inside at once, both leases valid, with
    /// no loss of Redis's writes to explain it (violations).
    pub rw_overlaps: u64,
    /// ... explained by a restart that lost the lock (no token protects a reader).
    pub rw_overlaps_lost_writes: u64,
    /// ... with one of the two past its lease (a holder stalled past its lease).
    pub rw_overlaps_stale: u64,
    /// Semaphore: holders entering while `limit` others were inside (violations).
    pub over_limit: u64,
    /// ... of which more than `limit` of those inside still had valid leases.
    pub over_limit_valid: u64,
    /// Critical sections entered (the lock was acquired).
    pub entered: u64,
    pub final_value: u64,
    pub lost_increments: u64,
    /// Accepted writes that did not add one to the value they replaced (each loses the
    /// increments since its read; `lost_increments` counts those).
    pub stale_writes: u64,
    pub interleavings: u64,
    /// Accesses the resource refused for a stale token.
    pub fenced_rejections: u64,
    pub overlaps_caught: u64,
    pub overlaps_unexpected: u64,
    /// Holders stalled past their lease, and how many of those checked were refused.
    pub paused: u64,
    pub paused_rejected: u64,
    /// ... whose `lost()` fired before the resource refused (or accepted) their write.
    pub paused_lost_first: u64,
    pub paused_lost_missing: u64,
    pub paused_lost_late: u64,
    /// Paused holders whose whole process was also frozen (no ordering is checked).
    pub paused_excused: u64,
    /// Holders stalled for less than 1.2 × TTL (around server restarts, or around the
    /// lease's end): their lease may legitimately outlive the stall, or `lost()` fire a
    /// moment after the refusal, so no `lost()` ordering is required of them.
    pub short_stalls: u64,
    /// Leases whose `lost()` fired (gone or expired); `None` without leases.
    pub lost_signals: Option<u64>,
    pub abandoned: u64,
    pub release_not_held: u64,
    /// Extends (the `extend` fault) that succeeded, failed "not held", failed otherwise.
    pub extends_ok: u64,
    pub extends_not_held: u64,
    pub extends_failed: u64,
    /// Holders that leaned on their lease (`extend`).
    pub leaned: u64,
    pub harness_errors: Vec<String>,
    pub violations: u64,
    /// The first few violations, described, for whoever has to investigate.
    pub details: Vec<String>,
}

impl Verdict {
    fn detail(&mut self, what: String) {
        if self.details.len() < 5 {
            self.details.push(what);
        }
    }

    /// Adds the verdict of another lock of the same algorithm in the same phase (each
    /// lock has its own counter, checked on its own).
    pub fn merge(&mut self, o: Verdict) {
        self.critical_sections += o.critical_sections;
        self.writes += o.writes;
        self.max_inside = self.max_inside.max(o.max_inside);
        self.rw_overlaps += o.rw_overlaps;
        self.rw_overlaps_lost_writes += o.rw_overlaps_lost_writes;
        self.rw_overlaps_stale += o.rw_overlaps_stale;
        self.over_limit += o.over_limit;
        self.over_limit_valid += o.over_limit_valid;
        self.entered += o.entered;
        self.final_value += o.final_value;
        self.lost_increments += o.lost_increments;
        self.stale_writes += o.stale_writes;
        self.interleavings += o.interleavings;
        self.fenced_rejections += o.fenced_rejections;
        self.overlaps_caught += o.overlaps_caught;
        self.overlaps_unexpected += o.overlaps_unexpected;
        self.paused += o.paused;
        self.paused_rejected += o.paused_rejected;
        self.paused_lost_first += o.paused_lost_first;
        self.paused_lost_missing += o.paused_lost_missing;
        self.paused_lost_late += o.paused_lost_late;
        self.paused_excused += o.paused_excused;
        self.short_stalls += o.short_stalls;
        self.lost_signals = match (self.lost_signals, o.lost_signals) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.abandoned += o.abandoned;
        self.release_not_held += o.release_not_held;
        self.extends_ok += o.extends_ok;
        self.extends_not_held += o.extends_not_held;
        self.extends_failed += o.extends_failed;
        self.leaned += o.leaned;
        self.harness_errors.extend(o.harness_errors);
        self.violations += o.violations;
        for d in o.details {
            self.detail(d);
        }
    }
}

/// What an algorithm's counter is checked for, beyond what every counter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// One holder at a time: every critical section reads, increments and writes back.
    Mutex,
    /// Writers read-increment-write with their token; readers only begin and end. No
    /// reader may be inside while a writer is (both with valid leases), and readers
    /// overlapping each other is expected.
    RwLock,
    /// Permit holders only begin and end; at most `limit` may be inside at once.
    Semaphore { limit: u32 },
}

/// One critical section's accepted accesses in the log.
struct Span {
    cs: u64,
    first: usize,
    last: usize,
    /// It read-increment-wrote (a writer), rather than only began and ended.
    writer: bool,
    /// The latest `valid_until` it reported (0: no lease). Leases never get back once
    /// past it, so the holder's lease was valid at `t` exactly when `t` is before this.
    valid_until_ns: u64,
}

impl Span {
    fn valid_at(&self, t: u64) -> bool {
        self.valid_until_ns == 0 || t < self.valid_until_ns
    }
}

/// Audits `log` (one algorithm's counter) against `tally` (its clients' reports);
/// `events` are the faults injected meanwhile, `ttl` the lease length.
pub fn check(log: &CounterLog, tally: &Tally, events: &[Event], ttl: Duration, kind: Check) -> Verdict {
    let mut v = Verdict {
        final_value: log.value,
        entered: tally.cs.len() as u64,
        ..Verdict::default()
    };
    let losses: Vec<u64> = events
        .iter()
        .filter(|e| e.fault.loses_writes())
        .map(|e| e.start_ns)
        .collect();

    // Completed critical sections, and lost or duplicated increments, from the
    // resource's side only.
    let mut written: HashMap<u64, u64> = HashMap::new();
    for a in log.accesses.iter().filter(|a| a.accepted && a.op.completes()) {
        v.critical_sections += 1;
        if a.op == Op::Write {
            v.writes += 1;
        }
        if written.insert(a.cs, a.at_ns).is_some() {
            v.harness_errors
                .push(format!("critical section {:#x} completed twice", a.cs));
        }
        if a.op == Op::Write && a.value != a.before + 1 {
            v.stale_writes += 1;
            v.detail(format!(
                "t={}ns: critical section {:#x} (token {}) wrote {} over {}",
                a.at_ns, a.cs, a.token, a.value, a.before
            ));
        }
    }
    v.lost_increments = v.writes.abs_diff(log.value);

    // Interleavings: A, B, A among accepted read-increment-write accesses.
    let mut seen: HashSet<u64> = HashSet::new();
    let mut interleaved: HashSet<u64> = HashSet::new();
    let mut last = None;
    for a in log.accesses.iter().filter(|a| a.accepted && a.op.fenced()) {
        if last != Some(a.cs) && !seen.insert(a.cs) && interleaved.insert(a.cs) {
            v.detail(format!(
                "t={}ns: critical section {:#x} (token {}) accessed again after {:#x}",
                a.at_ns,
                a.cs,
                a.token,
                last.unwrap_or(0)
            ));
        }
        last = Some(a.cs);
    }
    v.interleavings = interleaved.len() as u64;

    inside(log, tally, &losses, kind, &mut v);

    // The clients' view must match the log.
    let mut mismatches = 0u64;
    for (cs, r) in &tally.cs {
        let applied = written.contains_key(cs);
        if applied != (r.outcome == Outcome::Ok) {
            mismatches += 1;
            if mismatches <= 3 {
                v.harness_errors.push(format!(
                    "critical section {cs:#x}: client reports {:?}, resource {} it",
                    r.outcome,
                    if applied { "completed" } else { "never completed" }
                ));
            }
        }
        if r.outcome == Outcome::Io {
            v.harness_errors
                .push(format!("critical section {cs:#x}: resource i/o error"));
        }
    }
    for cs in written.keys() {
        if !tally.cs.contains_key(cs) {
            mismatches += 1;
            if mismatches <= 3 {
                v.harness_errors
                    .push(format!("critical section {cs:#x}: completed but never reported"));
            }
        }
    }
    if mismatches > 3 {
        v.harness_errors
            .push(format!("{mismatches} report/log mismatches in all"));
    }

    // Refused accesses: did a newer holder act while the refused one's lease was valid?
    for a in log.accesses.iter().filter(|a| !a.accepted) {
        v.fenced_rejections += 1;
        if a.valid_until_ns == 0 {
            continue;
        }
        let i = log.raises.partition_point(|&(_, max)| max <= a.token);
        let Some(&(newer_at, _)) = log.raises.get(i) else {
            v.harness_errors.push(format!(
                "critical section {:#x} refused without a newer token",
                a.cs
            ));
            continue;
        };
        if newer_at >= a.valid_until_ns {
            continue;
        }
        let since = tally.cs.get(&a.cs).map_or(0, |r| r.start_ns);
        if losses.iter().any(|&t| since <= t && t <= newer_at) {
            v.overlaps_caught += 1;
        } else {
            v.overlaps_unexpected += 1;
            v.detail(format!(
                "t={}ns: a newer token accessed while critical section {:#x} (token {}) held a lease \
                 valid until t={}ns; refused at t={}ns",
                newer_at, a.cs, a.token, a.valid_until_ns, a.at_ns
            ));
        }
    }

    // Paused holders, lost() signals, and the rest of the clients' story.
    let has_lease = tally.cs.values().any(|r| r.has_lease);
    let mut lost_signals = 0;
    for (cs, r) in &tally.cs {
        if r.lost.is_some() {
            lost_signals += 1;
        }
        match r.outcome {
            Outcome::Abandoned => v.abandoned += 1,
            Outcome::Ok | Outcome::Fenced | Outcome::Io => {}
        }
        if r.release == "not-held" {
            v.release_not_held += 1;
        }
        v.extends_ok += r.extends.0;
        v.extends_not_held += r.extends.1;
        v.extends_failed += r.extends.2;
        if r.lean_us > 0 {
            v.leaned += 1;
        }
        if r.stall_ms == 0 || !r.has_lease {
            continue;
        }
        if (r.stall_ms as f64) < ttl.as_millis() as f64 * 1.2 {
            v.short_stalls += 1;
            continue;
        }
        v.paused += 1;
        // A frozen process freezes its lost() watcher too: nothing to order then.
        let until = r.rejected_ns.unwrap_or(r.stall_ns + r.stall_ms * 1_000_000) + 1_000_000_000;
        let frozen = events.iter().any(|e| {
            e.fault == Fault::ProcessPause
                && e.worker == Some(cs_worker(*cs))
                && e.start_ns < until
                && e.end_ns > r.stall_ns
        });
        if frozen {
            v.paused_excused += 1;
            continue;
        }
        if r.rejected_ns.is_some() {
            v.paused_rejected += 1;
        }
        // lost() must precede the resource's answer to the stalled write: its refusal, or
        // (no newer holder had come yet) its acceptance.
        let answered = r.rejected_ns.or_else(|| written.get(cs).copied());
        match (r.lost_ns, answered) {
            (None, _) => {
                v.paused_lost_missing += 1;
                v.detail(format!(
                    "critical section {cs:#x} stalled {}ms from t={}ns and lost() never fired",
                    r.stall_ms, r.stall_ns
                ));
            }
            (Some(lost), Some(answered)) if lost >= answered => {
                v.paused_lost_late += 1;
                v.detail(format!(
                    "critical section {cs:#x} stalled {}ms from t={}ns: the resource answered its write \
                     at t={answered}ns, lost() only fired at t={lost}ns",
                    r.stall_ms, r.stall_ns
                ));
            }
            (Some(_), _) => v.paused_lost_first += 1,
        }
    }
    v.lost_signals = has_lease.then_some(lost_signals);

    // Under `extend` a holder now and then freezes its client until just before its own
    // lease ends; the client's other holders' leases may run out meanwhile, and a
    // permit holder past its lease (no token stops it) is still inside when the next
    // one enters. Only entries beside more valid leases than permits count then.
    let leaning = events.iter().any(|e| e.fault == Fault::Extend);
    v.violations = v.lost_increments
        + v.interleavings
        + v.overlaps_unexpected
        + v.rw_overlaps
        + if leaning { v.over_limit_valid } else { v.over_limit }
        + v.paused_lost_missing
        + v.paused_lost_late;
    v
}

/// Who was inside at once: the most critical sections in progress together, and, for a
/// read-write lock, readers inside while a writer was (a violation when both leases were
/// valid at the time and Redis had not lost writes meanwhile), or, for a semaphore,
/// more holders inside than permits.
///
/// A critical section is *inside* from its first accepted access to its last, in the
/// log's order. Refused accesses do not count: they touched nothing.
fn inside(log: &CounterLog, tally: &Tally, losses: &[u64], kind: Check, v: &mut Verdict) {
    let mut spans: HashMap<u64, Span> = HashMap::new();
    for (i, a) in log.accesses.iter().enumerate() {
        let span = spans.entry(a.cs).or_insert(Span {
            cs: a.cs,
            first: usize::MAX,
            last: 0,
            writer: false,
            valid_until_ns: 0,
        });
        span.valid_until_ns = span.valid_until_ns.max(a.valid_until_ns);
        if a.accepted {
            span.first = span.first.min(i);
            span.last = i;
            span.writer |= a.op.fenced();
        }
    }
    spans.retain(|_, s| s.first != usize::MAX);
    let mut ends: HashMap<usize, Vec<u64>> = HashMap::new();
    for s in spans.values() {
        ends.entry(s.last).or_default().push(s.cs);
    }
    let since = |cs: u64| tally.cs.get(&cs).map_or(0, |r| r.start_ns);
    let mut now: Vec<u64> = Vec::new();
    let mut pairs: HashSet<(u64, u64)> = HashSet::new();
    for (i, a) in log.accesses.iter().enumerate() {
        let Some(me) = spans.get(&a.cs) else { continue };
        if !a.accepted {
            continue;
        }
        if me.first == i {
            now.push(a.cs);
            v.max_inside = v.max_inside.max(now.len() as u64);
            if let Check::Semaphore { limit } = kind
                && now.len() > limit as usize
            {
                let valid = now.iter().filter(|cs| spans[*cs].valid_at(a.at_ns)).count();
                if valid > limit as usize {
                    v.over_limit_valid += 1;
                }
                v.over_limit += 1;
                v.detail(format!(
                    "t={}ns: critical section {:#x} entered with {} inside ({} with valid leases), {limit} permits",
                    a.at_ns,
                    a.cs,
                    now.len(),
                    valid
                ));
            }
        }
        if kind == Check::RwLock {
            // A reader and a writer inside at once: this access, against everyone in.
            for &other in &now {
                let them = &spans[&other];
                if other == a.cs || me.writer == them.writer {
                    continue;
                }
                let key = (a.cs.min(other), a.cs.max(other));
                if !pairs.insert(key) {
                    continue;
                }
                let t = a.at_ns;
                if !(me.valid_at(t) && them.valid_at(t)) {
                    v.rw_overlaps_stale += 1;
                } else if losses
                    .iter()
                    .any(|&l| since(a.cs).min(since(other)) <= l && l <= t)
                {
                    v.rw_overlaps_lost_writes += 1;
                } else {
                    v.rw_overlaps += 1;
                    v.detail(format!(
                        "t={t}ns: {} {:#x} accessed while {} {:#x} was inside, both leases valid",
                        if me.writer { "writer" } else { "reader" },
                        a.cs,
                        if them.writer { "writer" } else { "reader" },
                        other
                    ));
                }
            }
        }
        if let Some(done) = ends.get(&i) {
            now.retain(|cs| !done.contains(cs));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Access;

    fn access(cs: u64, token: u64, write: bool, value: u64, accepted: bool, at_ns: u64) -> Access {
        Access {
            cs,
            token,
            op: if write { Op::Write } else { Op::Read },
            value,
            before: 0,
            accepted,
            at_ns,
            valid_until_ns: 0,
        }
    }

    fn write(cs: u64, token: u64, before: u64, value: u64, at_ns: u64) -> Access {
        Access {
            before,
            ..access(cs, token, true, value, true, at_ns)
        }
    }

    fn report(outcome: Outcome) -> CsReport {
        CsReport {
            outcome,
            start_ns: 0,
            acquired_ns: 0,
            released_ns: 0,
            lean_ns: 0,
            lean_us: 0,
            stall_ms: 0,
            stall_ns: 0,
            rejected_ns: None,
            lost: None,
            lost_ns: None,
            has_lease: false,
            release: "released".into(),
            extends: (0, 0, 0),
            extend_error: None,
        }
    }

    #[test]
    fn a_lost_update_is_an_interleaving_and_a_lost_increment() {
        // A reads 0, B reads 0, A writes 1, B writes 1.
        let log = CounterLog {
            fenced: false,
            value: 1,
            accesses: vec![
                access(1, 0, false, 0, true, 1),
                access(2, 0, false, 0, true, 2),
                write(1, 0, 0, 1, 3),
                write(2, 0, 1, 1, 4),
            ],
            ..CounterLog::default()
        };
        let mut tally = Tally::default();
        tally.cs.insert(1, report(Outcome::Ok));
        tally.cs.insert(2, report(Outcome::Ok));
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
        assert_eq!(v.critical_sections, 2);
        assert_eq!(v.lost_increments, 1);
        assert_eq!(v.stale_writes, 1, "B wrote 1 over 1");
        assert_eq!(
            v.interleavings, 2,
            "A's write came after B's read, B's after A's write"
        );
        assert_eq!(v.violations, 3);
        assert!(v.harness_errors.is_empty());
    }

    #[test]
    fn the_resource_log_decides_not_the_client() {
        // The client believes its write was refused; the resource applied it.
        let log = CounterLog {
            value: 1,
            accesses: vec![access(1, 0, false, 0, true, 1), write(1, 0, 0, 1, 2)],
            ..CounterLog::default()
        };
        let mut tally = Tally::default();
        tally.cs.insert(1, report(Outcome::Fenced));
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
        assert_eq!(v.critical_sections, 1);
        assert_eq!(v.violations, 0);
        assert_eq!(v.harness_errors.len(), 1, "{:?}", v.harness_errors);
    }

    #[test]
    fn a_refusal_inside_the_older_lease_is_an_overlap_unless_redis_lost_the_lock() {
        let mut stale = access(1, 10, true, 1, false, 50);
        stale.valid_until_ns = 40;
        let log = CounterLog {
            fenced: true,
            value: 1,
            max_token: 11,
            accesses: vec![
                access(1, 10, false, 0, true, 10),
                access(2, 11, false, 0, true, 30),
                write(2, 11, 0, 1, 31),
                stale,
            ],
            raises: vec![(10, 10), (30, 11)],
        };
        let mut tally = Tally::default();
        tally.cs.insert(1, report(Outcome::Fenced));
        tally.cs.insert(2, report(Outcome::Ok));
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
        assert_eq!((v.fenced_rejections, v.overlaps_unexpected), (1, 1));
        assert_eq!(v.violations, 1);
        let restart = Event {
            fault: Fault::ServerRestart,
            start_ns: 20,
            end_ns: 25,
            worker: None,
            note: String::new(),
        };
        let v = check(&log, &tally, &[restart], Duration::from_secs(1), Check::Mutex);
        assert_eq!(
            (v.overlaps_caught, v.overlaps_unexpected, v.violations),
            (1, 0, 0)
        );
    }

    #[test]
    fn a_paused_holder_must_see_lost_before_the_refusal() {
        let log = CounterLog {
            fenced: true,
            ..CounterLog::default()
        };
        let mut tally = Tally::default();
        let mut r = report(Outcome::Fenced);
        r.has_lease = true;
        r.stall_ms = 1500;
        r.stall_ns = 100;
        r.rejected_ns = Some(2_000);
        r.lost = Some("expired".into());
        r.lost_ns = Some(2_500);
        tally.cs.insert(1, r);
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
        assert_eq!(v.paused_lost_late, 1);
        assert_eq!(v.violations, 1);
    }

    #[test]
    fn a_paused_holder_whose_write_is_accepted_must_see_lost_before_it() {
        let log = CounterLog {
            fenced: true,
            value: 1,
            accesses: vec![access(1, 10, false, 0, true, 50), write(1, 10, 0, 1, 2_000)],
            ..CounterLog::default()
        };
        let mut r = report(Outcome::Ok);
        r.has_lease = true;
        r.stall_ms = 1500;
        r.stall_ns = 100;
        r.lost = Some("expired".into());
        for (lost_ns, first, late) in [(1_500, 1, 0), (2_500, 0, 1)] {
            let mut tally = Tally::default();
            tally.cs.insert(
                1,
                CsReport {
                    lost_ns: Some(lost_ns),
                    ..r.clone()
                },
            );
            let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
            assert_eq!(
                (v.paused_lost_first, v.paused_lost_late),
                (first, late),
                "lost at {lost_ns}"
            );
        }
        // A stall shorter than 1.2 x TTL is not held to it.
        let mut tally = Tally::default();
        tally.cs.insert(
            1,
            CsReport {
                stall_ms: 1100,
                lost_ns: None,
                ..r.clone()
            },
        );
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::Mutex);
        assert_eq!((v.paused, v.short_stalls, v.violations), (0, 1, 0));
    }

    fn mark(cs: u64, op: Op, at_ns: u64, valid_until_ns: u64) -> Access {
        Access {
            cs,
            token: 0,
            op,
            value: 0,
            before: 0,
            accepted: true,
            at_ns,
            valid_until_ns,
        }
    }

    fn tally_ok(cs: &[u64]) -> Tally {
        let mut tally = Tally::default();
        for &c in cs {
            tally.cs.insert(c, report(Outcome::Ok));
        }
        tally
    }

    /// Reader 1 begins, writer 2 read-increment-writes, reader 1 ends: the writer was
    /// inside the reader's critical section.
    fn reader_around_writer(reader_valid_until: u64) -> CounterLog {
        let mut r = access(2, 5, false, 0, true, 20);
        r.valid_until_ns = 100;
        let mut w = write(2, 5, 0, 1, 21);
        w.valid_until_ns = 100;
        CounterLog {
            fenced: true,
            value: 1,
            max_token: 5,
            accesses: vec![
                mark(1, Op::Begin, 10, reader_valid_until),
                r,
                w,
                mark(1, Op::End, 30, reader_valid_until),
            ],
            raises: vec![(20, 5)],
        }
    }

    #[test]
    fn a_writer_inside_a_readers_section_is_a_violation_while_both_leases_are_valid() {
        let tally = tally_ok(&[1, 2]);
        let ttl = Duration::from_secs(1);
        let v = check(&reader_around_writer(100), &tally, &[], ttl, Check::RwLock);
        assert_eq!((v.critical_sections, v.writes), (2, 1));
        assert_eq!((v.rw_overlaps, v.rw_overlaps_stale), (1, 0));
        assert_eq!(v.violations, 1);
        assert_eq!(v.max_inside, 2);
        assert!(v.harness_errors.is_empty(), "{:?}", v.harness_errors);

        // The reader's lease had run out before the writer came: a stale reader.
        let v = check(&reader_around_writer(15), &tally, &[], ttl, Check::RwLock);
        assert_eq!((v.rw_overlaps, v.rw_overlaps_stale, v.violations), (0, 1, 0));

        // Redis lost the lock in between: the documented limit, not a violation.
        let restart = Event {
            fault: Fault::ServerRestart,
            start_ns: 12,
            end_ns: 13,
            worker: None,
            note: String::new(),
        };
        let v = check(&reader_around_writer(100), &tally, &[restart], ttl, Check::RwLock);
        assert_eq!(
            (v.rw_overlaps, v.rw_overlaps_lost_writes, v.violations),
            (0, 1, 0)
        );

        // The same log for a mutex-style check has no reader rule.
        let v = check(&reader_around_writer(100), &tally, &[], ttl, Check::Mutex);
        assert_eq!(v.violations, 0);
    }

    #[test]
    fn readers_inside_together_are_no_violation() {
        let log = CounterLog {
            fenced: true,
            accesses: vec![
                mark(1, Op::Begin, 10, 100),
                mark(2, Op::Begin, 11, 100),
                mark(3, Op::Begin, 12, 100),
                mark(2, Op::End, 13, 100),
                mark(1, Op::End, 14, 100),
                mark(3, Op::Leave, 15, 100),
            ],
            ..CounterLog::default()
        };
        let mut tally = tally_ok(&[1, 2]);
        tally.cs.insert(3, report(Outcome::Abandoned));
        let v = check(&log, &tally, &[], Duration::from_secs(1), Check::RwLock);
        assert_eq!((v.critical_sections, v.max_inside, v.violations), (2, 3, 0));
        assert!(v.harness_errors.is_empty(), "{:?}", v.harness_errors);
    }

    #[test]
    fn a_semaphore_counts_entries_past_its_limit() {
        // Two permits; 1 and 2 inside, 3 enters while 1 (stalled past its lease at 15)
        // is still inside; then 4 enters after 1 left.
        let log = CounterLog {
            accesses: vec![
                mark(1, Op::Begin, 10, 15),
                mark(2, Op::Begin, 11, 100),
                mark(3, Op::Begin, 20, 100),
                mark(1, Op::End, 30, 15),
                mark(2, Op::End, 31, 100),
                mark(4, Op::Begin, 32, 100),
                mark(4, Op::End, 33, 100),
                mark(3, Op::End, 34, 100),
            ],
            ..CounterLog::default()
        };
        let tally = tally_ok(&[1, 2, 3, 4]);
        let v = check(
            &log,
            &tally,
            &[],
            Duration::from_secs(1),
            Check::Semaphore { limit: 2 },
        );
        assert_eq!(v.critical_sections, 4);
        assert_eq!(v.max_inside, 3);
        assert_eq!(
            (v.over_limit, v.over_limit_valid),
            (1, 0),
            "3 entered past the limit, but only 2 of those inside held valid leases"
        );
        assert_eq!(v.violations, 1);
        let v = check(
            &log,
            &tally,
            &[],
            Duration::from_secs(1),
            Check::Semaphore { limit: 3 },
        );
        assert_eq!(v.violations, 0);
    }

    #[test]
    fn verdicts_of_several_locks_add_up() {
        let mut a = Verdict {
            critical_sections: 3,
            max_inside: 1,
            lost_signals: Some(1),
            violations: 1,
            details: vec!["a".into()],
            ..Verdict::default()
        };
        let b = Verdict {
            critical_sections: 4,
            max_inside: 2,
            lost_signals: None,
            extends_ok: 5,
            violations: 2,
            details: vec!["b".into()],
            ..Verdict::default()
        };
        a.merge(b);
        assert_eq!((a.critical_sections, a.max_inside, a.violations), (7, 2, 3));
        assert_eq!((a.lost_signals, a.extends_ok), (Some(1), 5));
        assert_eq!(a.details, ["a", "b"]);
        let mut none = Verdict::default();
        none.merge(Verdict::default());
        assert_eq!(none.lost_signals, None, "no lease on either lock");
    }
}
