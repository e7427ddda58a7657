//! The metrics: exact counts after known sequences of calls against a real server,
//! read from a recorder of each test's own.

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use common::*;
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlease::{LeaseOptions, LostReason};

/// Runs `test` on a current-thread runtime under a recorder of its own. Every task the
/// library spawns (renewals, background releases) runs on this one thread, where the
/// recorder is installed, and tests running in parallel do not mix their counts.
fn with_recorder<F, Fut>(test: F)
where
    F: FnOnce(Metrics) -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let metrics = Metrics {
        snapshotter: recorder.snapshotter(),
        seen: RefCell::default(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(metrics)));
}

/// A metric: its name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

/// What a test's recorder recorded.
struct Metrics {
    snapshotter: Snapshotter,
    /// Everything read so far (a snapshot drains what it reads): every counter's sum,
    /// every histogram sample, and units.
    seen: RefCell<HashMap<Id, (Option<Unit>, Seen)>>,
}

#[derive(Clone, Debug, Default)]
enum Seen {
    #[default]
    None,
    Counter(u64),
    Samples(Vec<f64>),
}

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

impl Metrics {
    /// Reads what was recorded since the last call.
    fn read(&self) {
        let mut seen = self.seen.borrow_mut();
        for (key, unit, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let entry = seen.entry(id(key.name(), &labels)).or_default();
            entry.0 = entry.0.or(unit);
            match value {
                DebugValue::Counter(n) => {
                    let before = match entry.1 {
                        Seen::Counter(before) => before,
                        _ => 0,
                    };
                    entry.1 = Seen::Counter(before + n);
                }
                DebugValue::Histogram(samples) => {
                    let mut all = match std::mem::take(&mut entry.1) {
                        Seen::Samples(all) => all,
                        _ => Vec::new(),
                    };
                    all.extend(samples.into_iter().map(|s| s.into_inner()));
                    entry.1 = Seen::Samples(all);
                }
                DebugValue::Gauge(_) => panic!("redlease records no gauges: {key:?}"),
            }
        }
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.read();
        match self.seen.borrow().get(&id(name, labels)) {
            Some((_, Seen::Counter(n))) => *n,
            None => 0,
            Some(other) => panic!("{name} {labels:?} is not a counter: {other:?}"),
        }
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.read();
        match self.seen.borrow().get(&id(name, labels)) {
            Some((_, Seen::Samples(all))) => all.clone(),
            None => Vec::new(),
            Some(other) => panic!("{name} {labels:?} is not a histogram: {other:?}"),
        }
    }

    fn unit(&self, name: &str, labels: &[(&str, &str)]) -> Option<Unit> {
        self.read();
        self.seen
            .borrow()
            .get(&id(name, labels))
            .and_then(|(unit, _)| *unit)
    }

    /// `redlease_acquisitions_total` of `primitive` with `outcome`.
    fn acquisitions(&self, primitive: &str, outcome: &str) -> u64 {
        self.counter(
            "redlease_acquisitions_total",
            &[("primitive", primitive), ("outcome", outcome)],
        )
    }

    /// Every outcome of `primitive`'s acquisitions: acquired, contended, timeout, error.
    fn outcomes(&self, primitive: &str) -> [u64; 4] {
        ["acquired", "contended", "timeout", "error"].map(|o| self.acquisitions(primitive, o))
    }
}

/// Redis's count of EVALSHA calls so far.
async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Three acquisitions, a contended `try_lock`, a timed-out `lock_timeout` and an error
/// are counted as such, with one wait and one hold time per acquisition; the other kinds
/// of lock are counted under their own label through the same engine.
#[test]
fn acquire_calls_are_counted_by_kind_and_outcome() {
    with_recorder(|m| async move {
        redlease::describe_metrics();
        let server = server();
        let (a, b) = (client(&server.url()).await, client(&server.url()).await);
        let mut conn = raw(&server).await;
        let mutex = a.mutex("counted").unwrap();
        let other = b.mutex("counted").unwrap();

        for _ in 0..2 {
            mutex.lock().await.unwrap().release().await.unwrap();
        }
        let held = mutex.lock().await.unwrap();
        let held_at = Instant::now();
        let e = other.try_lock().await.unwrap_err();
        assert!(e.is_contended(), "{e}");
        let e = within(
            10.0,
            "lock_timeout gives up",
            other.lock_timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
        assert!(e.is_timeout(), "{e}");
        let held_for = held_at.elapsed();
        held.release().await.unwrap();

        // A key of another type: the acquire fails with an error.
        let _: () = redis::cmd("HSET")
            .arg("redlease:wrong")
            .arg("f")
            .arg("v")
            .query_async(&mut conn)
            .await
            .unwrap();
        let e = a.mutex("wrong").unwrap().try_lock().await.unwrap_err();
        assert!(!e.is_contended() && !e.is_timeout(), "{e}");

        assert_eq!(
            m.outcomes("mutex"),
            [3, 1, 1, 1],
            "acquired, contended, timeout, error"
        );
        let waits = m.samples("redlease_acquire_wait_seconds", &[("primitive", "mutex")]);
        assert_eq!(waits.len(), 3, "one wait per acquisition: {waits:?}");
        assert!(waits.iter().all(|&w| (0.0..5.0).contains(&w)), "{waits:?}");
        let holds = m.samples("redlease_hold_seconds", &[("primitive", "mutex")]);
        assert_eq!(holds.len(), 3, "one hold time per acquisition: {holds:?}");
        let longest = holds.iter().cloned().fold(0.0, f64::max);
        assert!(
            longest >= held_for.as_secs_f64() && longest < held_for.as_secs_f64() + 5.0,
            "the third holding lasted through the timeout ({held_for:?}): {holds:?}"
        );

        // The other kinds, through the same engine.
        a.fair_mutex("fair")
            .unwrap()
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        a.semaphore("sem", 2)
            .unwrap()
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let rw = a.rwlock("rw").unwrap();
        rw.read().await.unwrap().release().await.unwrap();
        rw.write().await.unwrap().release().await.unwrap();
        let election = a.election("elect").unwrap();
        election.campaign("me").await.unwrap().release().await.unwrap();
        let multi = a.multi_lock(["one", "two", "three"]).unwrap();
        multi.lock().await.unwrap().release().await.unwrap();
        assert_eq!(m.outcomes("fair_mutex"), [1, 0, 0, 0]);
        assert_eq!(m.outcomes("semaphore"), [1, 0, 0, 0]);
        assert_eq!(m.outcomes("rwlock"), [2, 0, 0, 0]);
        assert_eq!(m.outcomes("election"), [1, 0, 0, 0]);
        assert_eq!(m.outcomes("multi"), [1, 0, 0, 0], "once for its three names");
        for (kind, n) in [
            ("fair_mutex", 1),
            ("semaphore", 1),
            ("rwlock", 2),
            ("election", 1),
            ("multi", 1),
        ] {
            let labels = [("primitive", kind)];
            assert_eq!(
                m.samples("redlease_acquire_wait_seconds", &labels).len(),
                n,
                "{kind}"
            );
            assert_eq!(m.samples("redlease_hold_seconds", &labels).len(), n, "{kind}");
        }
        assert_eq!(m.outcomes("mutex"), [3, 1, 1, 1], "unchanged by the other kinds");

        // Described with their units.
        assert_eq!(
            m.unit("redlease_hold_seconds", &[("primitive", "mutex")]),
            Some(Unit::Seconds)
        );
        assert_eq!(
            m.unit(
                "redlease_acquisitions_total",
                &[("primitive", "mutex"), ("outcome", "acquired")]
            ),
            Some(Unit::Count)
        );
    });
}

/// A release that hands the lock to a task of the same client, and one that hands it
/// to a registered waiter of another client, are each counted once, by kind.
#[test]
fn hand_overs_are_counted() {
    with_recorder(|m| async move {
        let server = server();
        let (a, b) = (client(&server.url()).await, client(&server.url()).await);
        let mut conn = raw(&server).await;

        // Local: the second task queues behind the first in this client.
        let mutex = a.mutex("local").unwrap();
        let first = mutex.lock().await.unwrap();
        let mut second = pin!(mutex.lock());
        let pending = std::future::poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "the second task waits behind the first");
        first.release().await.unwrap();
        let second = within(10.0, "handed over locally", second).await.unwrap();
        assert_eq!(
            m.counter(
                "redlease_handovers_total",
                &[("primitive", "mutex"), ("kind", "local")]
            ),
            1
        );
        second.release().await.unwrap();

        // Grant: a waiter of client `a` registered behind the holder of client `b`.
        let holder = b.mutex("granted").unwrap().lock().await.unwrap();
        let before = evalsha_calls(&mut conn).await;
        let waiter = a.mutex("granted").unwrap();
        let waiting = tokio::spawn(async move { waiter.lock().await });
        // Its first attempt registered it; the second, once it listens for wake-ups,
        // found the lock still busy. Now only the release can give it the lock.
        eventually(10.0, "the waiter tried twice", || {
            let mut conn = conn.clone();
            async move { evalsha_calls(&mut conn).await >= before + 2 }
        })
        .await;
        let holder_fence = holder.fence();
        holder.release().await.unwrap();
        let granted = within(10.0, "handed over by the release", waiting)
            .await
            .unwrap()
            .unwrap();
        assert!(granted.fence() > holder_fence);
        assert_eq!(
            m.counter(
                "redlease_handovers_total",
                &[("primitive", "mutex"), ("kind", "grant")]
            ),
            1
        );
        assert_eq!(
            m.counter(
                "redlease_handovers_total",
                &[("primitive", "mutex"), ("kind", "local")]
            ),
            1
        );
        granted.release().await.unwrap();
        assert_eq!(m.outcomes("mutex"), [4, 0, 0, 0]);
        assert_eq!(
            m.samples("redlease_hold_seconds", &[("primitive", "mutex")])
                .len(),
            4
        );
    });
}

/// A lease whose key was deleted is counted as lost because it was gone, one that ran
/// out without renewal as expired; each holding is timed once, however it ended.
#[test]
fn lost_leases_are_counted_by_reason() {
    with_recorder(|m| async move {
        let server = server();
        let a = client(&server.url()).await;
        let mut conn = raw(&server).await;

        let short = LeaseOptions::new().ttl(Duration::from_millis(600));
        let gone = a.mutex_with("gone", short).unwrap().lock().await.unwrap();
        let _: () = redis::cmd("DEL")
            .arg("redlease:gone")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            within(5.0, "a renewal finds the lock gone", gone.lost()).await,
            LostReason::Gone
        );

        let unrenewed = LeaseOptions::new()
            .ttl(Duration::from_millis(300))
            .auto_renew(false);
        let expired = a.mutex_with("expired", unrenewed).unwrap().lock().await.unwrap();
        assert_eq!(
            within(5.0, "the lease runs out", expired.lost()).await,
            LostReason::Expired
        );

        let lost = |reason| {
            m.counter(
                "redlease_leases_lost_total",
                &[("primitive", "mutex"), ("reason", reason)],
            )
        };
        assert_eq!((lost("gone"), lost("expired")), (1, 1));
        // The same round trips the client's own statistics count.
        let trips = m.counter("redlease_renewal_round_trips_total", &[]);
        assert!(trips >= 1);
        assert_eq!(trips, a.stats().renewal_round_trips);
        assert_eq!(m.counter("redlease_renewal_failures_total", &[]), 0);

        // Dropping the guards of lost leases ends no second holding; dropping the guard
        // of a held lease ends its holding, not as a loss.
        drop((gone, expired));
        let holds = m.samples("redlease_hold_seconds", &[("primitive", "mutex")]);
        assert_eq!(holds.len(), 2, "{holds:?}");
        drop(a.mutex("dropped").unwrap().lock().await.unwrap());
        let holds = m.samples("redlease_hold_seconds", &[("primitive", "mutex")]);
        assert_eq!(holds.len(), 3, "{holds:?}");
        assert_eq!((lost("gone"), lost("expired")), (1, 1));
    });
}

/// Renewals that get no answer from a stalled server, and requests sent again, are
/// counted.
#[test]
fn renewal_failures_and_retries_are_counted() {
    with_recorder(|m| async move {
        let server = server();
        let a = impatient_client(&server.url(), Duration::from_millis(100), Duration::from_secs(10)).await;
        let renewed = a
            .mutex_with("renewed", LeaseOptions::new().ttl(Duration::from_millis(900)))
            .unwrap()
            .lock()
            .await
            .unwrap();
        server.pause();
        let m = &m;
        eventually(5.0, "a renewal fails", || async move {
            m.counter("redlease_renewal_failures_total", &[]) >= 1
        })
        .await;
        let retried = a.mutex("retried").unwrap();
        let acquiring = tokio::spawn(async move { retried.lock().await });
        eventually(5.0, "the acquire is retried", || async move {
            m.counter("redlease_request_retries_total", &[("op", "acquire")]) >= 1
        })
        .await;
        server.resume();
        let guard = within(15.0, "acquired once the server answers", acquiring)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.acquisitions("mutex", "acquired"), 2);
        assert_eq!(m.acquisitions("mutex", "error"), 0);
        guard.release().await.unwrap();
        // The stalled lease may or may not have outlived the pause: either way it ends once.
        let _ = renewed.release().await;
        assert_eq!(
            m.samples("redlease_hold_seconds", &[("primitive", "mutex")])
                .len(),
            2
        );
    });
}
