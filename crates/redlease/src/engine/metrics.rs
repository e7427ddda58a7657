//! Metrics, through the [`metrics`] facade: their names and labels, and what records
//! them. Each is recorded in one place that every kind of lock goes through:
//!
//! - acquire calls, in [`LockBase::acquire`](super::guard::LockBase::acquire) — and
//!   in the acquire calls of the plain mutex, the semaphore, Redlock and the
//!   multi-lock, which do more than it;
//! - hold times and lost leases, where a lease ends (`LeaseState`), whoever ends it;
//! - renewal round trips and failures, in the renewal task;
//! - hand-overs: by grant in the acquire loop, local ones in the plain mutex's and the
//!   semaphore's hand-overs (the locks that have them);
//! - retries, where requests are retried.
//!
//! Every label value is a `&'static str` from a small fixed set — the kind of lock, an
//! outcome, a reason, an operation — and never a lock's name, whose cardinality is
//! unbounded. The keys of the metrics recorded on every acquisition and release are
//! built at compile time, so recording them allocates nothing; with no recorder
//! installed the facade answers every call with a no-op handle, so the cost is a
//! thread-local and an atomic read per call (and durations are not even measured:
//! the clock is read only when a histogram takes the value).

use metrics::{Key, Label, Level, Metadata, Unit};
use tokio::time::Instant;

use crate::error::{Error, Result};

/// Acquire calls, by `primitive` and `outcome`.
pub(crate) const ACQUISITIONS: &str = "redlease_acquisitions_total";
/// From the call to holding the lock, by `primitive`.
pub(crate) const ACQUIRE_WAIT: &str = "redlease_acquire_wait_seconds";
/// From acquisition to release, drop or loss, by `primitive`.
pub(crate) const HOLD: &str = "redlease_hold_seconds";
/// Round trips of the renewal task.
pub(crate) const RENEWAL_ROUND_TRIPS: &str = "redlease_renewal_round_trips_total";
/// Renewals of a lease that got no definite answer.
pub(crate) const RENEWAL_FAILURES: &str = "redlease_renewal_failures_total";
/// Leases lost, by `primitive` and `reason`.
pub(crate) const LEASES_LOST: &str = "redlease_leases_lost_total";
/// Locks handed from a holder straight to a waiter, by `primitive` and `kind`.
pub(crate) const HANDOVERS: &str = "redlease_handovers_total";
/// Requests sent again after a failure that may be temporary, by `op`.
pub(crate) const REQUEST_RETRIES: &str = "redlease_request_retries_total";

/// A key built at compile time: `key!(NAME, "label" => "value", ...)`.
macro_rules! key {
    ($name:expr $(, $label:literal => $value:expr)*) => {{
        static LABELS: [Label; [$($label),*].len()] = [$(Label::from_static_parts($label, $value)),*];
        Key::from_static_parts($name, &LABELS)
    }};
}

/// The keys of one kind of lock.
struct Keys {
    /// By [`Outcome`].
    acquisitions: [Key; 4],
    wait: Key,
    hold: Key,
    /// By [`Lost`].
    lost: [Key; 2],
    /// By [`Handover`].
    handovers: [Key; 2],
}

macro_rules! primitives {
    ($($(#[$doc:meta])* $kind:ident => $label:literal,)*) => {
        /// The kind of lock, as the `primitive` label of the metrics says it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Primitive {
            $($(#[$doc])* $kind,)*
        }

        impl Primitive {
            /// Every kind, in declaration order.
            #[cfg(test)]
            const ALL: &[Primitive] = &[$(Primitive::$kind),*];

            /// The value of the `primitive` label.
            #[cfg(test)]
            fn label(self) -> &'static str {
                match self {
                    $(Primitive::$kind => $label,)*
                }
            }
        }

        /// The keys of each kind of lock, in declaration order.
        static KEYS: [Keys; [$($label),*].len()] = [$(Keys {
            acquisitions: [
                key!(ACQUISITIONS, "primitive" => $label, "outcome" => "acquired"),
                key!(ACQUISITIONS, "primitive" => $label, "outcome" => "contended"),
                key!(ACQUISITIONS, "primitive" => $label, "outcome" => "timeout"),
                key!(ACQUISITIONS, "primitive" => $label, "outcome" => "error"),
            ],
            wait: key!(ACQUIRE_WAIT, "primitive" => $label),
            hold: key!(HOLD, "primitive" => $label),
            lost: [
                key!(LEASES_LOST, "primitive" => $label, "reason" => "gone"),
                key!(LEASES_LOST, "primitive" => $label, "reason" => "expired"),
            ],
            handovers: [
                key!(HANDOVERS, "primitive" => $label, "kind" => "local"),
                key!(HANDOVERS, "primitive" => $label, "kind" => "grant"),
            ],
        },)*];
    };
}

primitives! {
    /// [`Mutex`](crate::Mutex).
    Mutex => "mutex",
    /// [`FairMutex`](crate::FairMutex).
    FairMutex => "fair_mutex",
    /// [`RwLock`](crate::RwLock), readers and writers.
    RwLock => "rwlock",
    /// [`Semaphore`](crate::Semaphore).
    Semaphore => "semaphore",
    /// [`LegacyLock`](crate::LegacyLock).
    Legacy => "legacy",
    /// [`RedlockMutex`](crate::RedlockMutex).
    Redlock => "redlock",
    /// [`Election`](crate::Election).
    Election => "election",
    /// [`MultiLock`](crate::MultiLock): several names taken as one.
    Multi => "multi",
}

impl Primitive {
    fn keys(self) -> &'static Keys {
        &KEYS[self as usize]
    }
}

/// How a lock was handed from its holder straight to a waiter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Handover {
    /// To a task of the same client, in one script (the plain mutex's and the
    /// semaphore's local queues).
    Local,
    /// By a release, to a waiter of another client that had registered for it.
    Grant,
}

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));
static RENEWAL_ROUND_TRIPS_KEY: Key = Key::from_static_name(RENEWAL_ROUND_TRIPS);
static RENEWAL_FAILURES_KEY: Key = Key::from_static_name(RENEWAL_FAILURES);

fn count(key: &Key, n: u64) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(n));
}

/// Records the time since `start`, reading the clock only if a recorder takes it.
fn observe_since(key: &Key, start: Instant) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(SecondsSince(start)));
}

/// The seconds elapsed since an instant, as a histogram value: the clock is read when
/// the value is taken, and a histogram with no recorder behind it never takes it.
struct SecondsSince(Instant);

impl metrics::IntoF64 for SecondsSince {
    fn into_f64(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// One acquire call, timed from its start: [`finish`](AcquireCall::finish) counts its
/// outcome and, when it acquired, how long it took.
#[derive(Debug)]
pub(crate) struct AcquireCall {
    primitive: Primitive,
    started: Instant,
}

impl AcquireCall {
    pub fn start(primitive: Primitive) -> Self {
        AcquireCall {
            primitive,
            started: Instant::now(),
        }
    }

    /// When the call started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Counts the call's `result` and passes it on.
    pub fn finish<T>(self, result: Result<T>) -> Result<T> {
        let keys = self.primitive.keys();
        let outcome = match &result {
            Ok(_) => 0,
            Err(Error::Contended { .. }) => 1,
            Err(Error::Timeout { .. }) => 2,
            Err(_) => 3,
        };
        count(&keys.acquisitions[outcome], 1);
        if result.is_ok() {
            observe_since(&keys.wait, self.started);
        }
        result
    }
}

/// Why a lease was lost, as the `reason` label says it (the lease's `LostReason`s
/// other than `Released`; this module sits below the lease).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lost {
    Gone,
    Expired,
}

/// A holding of a `primitive` that started at `since` ended, `lost` or not.
pub(crate) fn hold_ended(primitive: Primitive, since: Instant, lost: Option<Lost>) {
    let keys = primitive.keys();
    observe_since(&keys.hold, since);
    if let Some(lost) = lost {
        count(&keys.lost[lost as usize], 1);
    }
}

/// A holder of a `primitive` handed its lock straight to a waiter.
pub(crate) fn handed_over(primitive: Primitive, how: Handover) {
    count(&primitive.keys().handovers[how as usize], 1);
}

/// The renewal task made `n` round trips.
pub(crate) fn renewal_round_trips(n: u64) {
    count(&RENEWAL_ROUND_TRIPS_KEY, n);
}

/// A lease's renewal got no definite answer (it is retried until the lease runs out).
pub(crate) fn renewal_failed() {
    count(&RENEWAL_FAILURES_KEY, 1);
}

/// A request of operation `op` is sent again. (Off the hot path: the key, whose label
/// is the operation, is built for the call.)
pub(crate) fn request_retried(op: &'static str) {
    let key = Key::from_parts(REQUEST_RETRIES, vec![Label::from_static_parts("op", op)]);
    count(&key, 1);
}

/// Describes redlease's metrics — unit and help text — to the recorder installed now,
/// for exporters that show them (Prometheus's `# HELP` lines). Call it once, after
/// installing the recorder; the metrics are recorded whether or not it is called.
///
/// redlease records its metrics through the [`metrics`](https://docs.rs/metrics)
/// facade, into whatever recorder the application installs. Without one, each record
/// is a no-op call; acquisitions and releases record without allocating.
///
/// | metric | type | labels |
/// |---|---|---|
/// | `redlease_acquisitions_total` | counter | `primitive`, `outcome` |
/// | `redlease_acquire_wait_seconds` | histogram (seconds) | `primitive` |
/// | `redlease_hold_seconds` | histogram (seconds) | `primitive` |
/// | `redlease_renewal_round_trips_total` | counter | |
/// | `redlease_renewal_failures_total` | counter | |
/// | `redlease_leases_lost_total` | counter | `primitive`, `reason` |
/// | `redlease_handovers_total` | counter | `primitive`, `kind` |
/// | `redlease_request_retries_total` | counter | `op` |
///
/// - `primitive`: `mutex`, `fair_mutex`, `rwlock`, `semaphore`, `legacy`, `redlock`,
///   `election`, `multi` (a [`MultiLock`](crate::MultiLock), counted once for all its
///   names).
/// - `outcome`: `acquired`, `contended` (a `try_` call found the lock taken),
///   `timeout`, `error`. A cancelled call is not counted. The wait is recorded for
///   acquired calls only.
/// - The hold time runs from acquisition to release, drop, `forget`, or loss of the
///   lease (a read-write lock's downgrade ends the write holding and starts a read one).
/// - `reason`: `gone` or `expired`, as [`LostReason`](crate::LostReason).
/// - `kind`: `local` (the plain mutex's release handed the lock to a task of the same
///   client) or `grant` (a release handed it to a registered waiter of another client).
/// - `op`: the operation whose request was sent again: `acquire`, `release`,
///   `extend`, ….
/// - Renewal round trips are those of [`Client::stats`](crate::Client::stats); a
///   renewal failure is one lease's renewal that got no definite answer (it is retried
///   until the lease runs out).
///
/// No metric is labelled by lock name: names are unbounded, and a label per name would
/// grow the exporter's memory and the monitoring system's series without limit.
///
/// # Examples
///
/// With `metrics-exporter-prometheus`:
///
/// ```no_run
/// let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
/// redlease::describe_metrics();
/// // Take locks; serve `handle.render()` on `/metrics`.
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        ACQUISITIONS,
        Unit::Count,
        "Acquire calls (lock, try_lock, lock_timeout, acquire, campaign, ...) by kind of lock and outcome: acquired, contended, timeout, error."
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "Time from an acquire call to holding the lock, waiting included (acquired calls only)."
    );
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "Time from acquiring a lock to releasing it, dropping its guard, or losing its lease."
    );
    describe_counter!(
        RENEWAL_ROUND_TRIPS,
        Unit::Count,
        "Round trips to Redis made by the lease renewal task (one per tick, one per node on a cluster)."
    );
    describe_counter!(
        RENEWAL_FAILURES,
        Unit::Count,
        "Lease renewals that got no definite answer (Redis unreachable, slow, or an error); each is retried until the lease runs out."
    );
    describe_counter!(
        LEASES_LOST,
        Unit::Count,
        "Leases lost by kind of lock and reason: gone (the lock was no longer this holder's on the server), expired (it could not be renewed in time)."
    );
    describe_counter!(
        HANDOVERS,
        Unit::Count,
        "Locks handed from a holder straight to a waiter: local (to a task of the same client), grant (by a release, to a registered waiter of another client)."
    );
    describe_counter!(
        REQUEST_RETRIES,
        Unit::Count,
        "Requests sent again after a failure that may be temporary (timeout, broken connection, failover), by operation."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_table_follows_the_kinds() {
        let label = |k: &Key, name: &str| k.labels().find(|l| l.key() == name).map(|l| l.value().to_owned());
        for &p in Primitive::ALL {
            let keys = p.keys();
            for key in keys
                .acquisitions
                .iter()
                .chain([&keys.wait, &keys.hold])
                .chain(&keys.lost)
                .chain(&keys.handovers)
            {
                assert_eq!(label(key, "primitive").as_deref(), Some(p.label()), "{key:?}");
            }
            // Indexed as the enums say.
            for (how, value) in [(Lost::Gone, "gone"), (Lost::Expired, "expired")] {
                let key = &keys.lost[how as usize];
                assert_eq!(label(key, "reason").as_deref(), Some(value));
            }
            for (how, value) in [(Handover::Local, "local"), (Handover::Grant, "grant")] {
                let key = &keys.handovers[how as usize];
                assert_eq!(label(key, "kind").as_deref(), Some(value));
            }
        }
    }
}
