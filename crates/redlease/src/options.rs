//! The options of a lock: its lease (length, automatic renewal) and an opt-in
//! durability policy, replica acknowledgement.
//!
//! # Replica acknowledgement
//!
//! Redis replicates asynchronously. A master answers an acquire before any replica has
//! the lock, so a failover in the next moments can promote a replica that never saw it,
//! and a second client then acquires the "same" lock (Jepsen's finding on Redis
//! Sentinel). With a [`ReplicaAck`] policy every acquire and every explicit extend is
//! followed, in the same pipeline and therefore on the same connection and node, by
//! `WAIT <replicas> <timeout>`: Redis answers once that many replicas confirmed every
//! write the connection made so far, or when the timeout passes, with the number that
//! did. The guard reports that number; [`OnShortfall`] says what happens when it is
//! too small.
//!
//! `WAIT` blocks the connection it runs on: while it waits, the client's other requests
//! on that connection (other locks, renewals) queue behind it. With replicas healthy
//! it returns within a replication round trip; when they are not, for up to the
//! timeout. Keep the timeout short next to the leases of the client's locks, or give
//! durable locks a client of their own.
//!
//! `WAIT` narrows the window, it does not close it: a replica that acknowledged may
//! still not be the one promoted, Sentinel or Cluster may promote a replica that lags,
//! and acknowledged writes live in the replica's memory, not on disk. Automatic
//! renewals are not waited for: a lost renewal only moves the lock's expiry on the
//! promoted replica back to the previous renewal's, at most `ttl / 3` earlier than
//! [`valid_until`](crate::Lease::valid_until). Fencing tokens remain the way to make a
//! protected resource safe against all of these.

use std::time::Duration;

use redis::Cmd;

use crate::error::{Error, Result};

/// Default lease length.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "redlease:";
/// Default time a lock's metadata (fencing mark, owner, release record) outlives the lease.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(60);
/// Default time a request that may have failed temporarily is retried.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(3);
/// Default per-command reply timeout of the connection redlease opens itself.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time a waiter's place in a queue (a fair-mutex waiter, a waiting writer of
/// a read-write lock) survives without a heartbeat; capped at the lease TTL.
pub const DEFAULT_WAITER_TTL: Duration = Duration::from_secs(5);

/// Options for one lock: how long its leases last and whether they renew themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// Lease length (default 30 s). The lock frees itself this long after its holder
    /// stops renewing it.
    pub ttl: Duration,
    /// Renew the lease every `ttl / 3` until it is released (default `true`).
    pub auto_renew: bool,
    /// Wait for replicas to acknowledge each acquire and extend (default: off, no
    /// `WAIT` is sent). See [`ReplicaAck`].
    pub replica_ack: Option<ReplicaAck>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            ttl: DEFAULT_TTL,
            auto_renew: true,
            replica_ack: None,
        }
    }
}

impl LeaseOptions {
    /// The defaults: 30 s leases with auto-renewal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease length (at least 10 ms, at most 30 days; checked when the lock is made).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Turns auto-renewal on or off. Without it the lease ends `ttl` after it was
    /// acquired (or last extended) unless the holder calls `extend`.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// After each acquire and extend, waits for replicas as `policy` says (checked when
    /// the lock is made). See [`ReplicaAck`] for what this does and does not protect.
    pub fn replica_ack(mut self, policy: ReplicaAck) -> Self {
        self.replica_ack = Some(policy);
        self
    }

    /// Shorthand for `replica_ack(ReplicaAck::new(replicas))`: `replicas` replicas must
    /// acknowledge each acquire and extend within 500 ms, or the lock is released and
    /// the call fails with [`Error::NotReplicated`]. (The CLI's `--wait-replicas K`.)
    pub fn wait_replicas(self, replicas: u32) -> Self {
        self.replica_ack(ReplicaAck::new(replicas))
    }
}

/// What happens when fewer replicas than required acknowledged an acquire or extend
/// before the timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnShortfall {
    /// Release the lock and fail with [`Error::NotReplicated`] (the default): a holder
    /// never works under a lock that a failover could silently lose.
    #[default]
    Release,
    /// Keep the lock and report the count through
    /// [`Lease::replicas_acked`](crate::Lease::replicas_acked): for callers that prefer
    /// availability and only want to know.
    Proceed,
}

/// A durability policy: after each acquire and extend, wait until `replicas` replicas
/// acknowledged the write, for at most `timeout`.
///
/// Set it per lock with [`LeaseOptions::replica_ack`](crate::LeaseOptions::replica_ack)
/// or [`LeaseOptions::wait_replicas`](crate::LeaseOptions::wait_replicas). Without it no
/// `WAIT` is sent at all.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use redlease::{LeaseOptions, OnShortfall, ReplicaAck};
///
/// // Two replicas within 200 ms, or the lock is released and the acquire fails.
/// let strict = LeaseOptions::new().replica_ack(ReplicaAck::new(2).timeout(Duration::from_millis(200)));
/// // One replica if it can be had within the default 500 ms; keep the lock either way.
/// let lenient = LeaseOptions::new().replica_ack(ReplicaAck::new(1).on_shortfall(OnShortfall::Proceed));
/// # let _ = (strict, lenient);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ReplicaAck {
    /// How many replicas must acknowledge (at least 1).
    pub replicas: u32,
    /// How long the acquire or extend waits for them: at least 1 ms, at most half the
    /// lock's lease, and shorter than the command connection's reply timeout.
    pub timeout: Duration,
    /// What happens when fewer acknowledge in time.
    pub on_shortfall: OnShortfall,
}

impl ReplicaAck {
    /// The default acknowledgement timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);

    /// Waits for `replicas` replicas for up to 500 ms; releases and fails on a shortfall.
    pub fn new(replicas: u32) -> Self {
        ReplicaAck {
            replicas,
            timeout: Self::DEFAULT_TIMEOUT,
            on_shortfall: OnShortfall::Release,
        }
    }

    /// Sets how long to wait for the acknowledgements.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets what happens when too few replicas acknowledge.
    pub fn on_shortfall(mut self, policy: OnShortfall) -> Self {
        self.on_shortfall = policy;
        self
    }

    /// Checks the policy for lock `name` with lease `ttl` against the reply timeout of
    /// the client's connection (when redlease opened it and so knows it).
    pub(crate) fn validate(
        &self,
        name: &str,
        ttl: Duration,
        response_timeout: Option<Duration>,
    ) -> Result<()> {
        let invalid = |what: &'static str, reason: String| Error::InvalidArgument {
            name: name.to_owned(),
            what,
            reason,
        };
        if self.replicas == 0 {
            return Err(invalid(
                "replica count",
                "at least one replica must acknowledge; leave the policy off to wait for none".into(),
            ));
        }
        if self.timeout < Duration::from_millis(1) {
            // WAIT with a zero timeout blocks forever.
            return Err(invalid(
                "replica timeout",
                "must be at least 1 ms (WAIT 0 would block forever)".into(),
            ));
        }
        if self.timeout > ttl / 2 {
            // The lease runs from when the acquire was sent: a long wait eats it up.
            return Err(invalid(
                "replica timeout",
                format!("{:?} must be at most half the lease ({ttl:?})", self.timeout),
            ));
        }
        if let Some(limit) = response_timeout
            && self.timeout >= limit
        {
            return Err(invalid(
                "replica timeout",
                format!(
                    "{:?} must be shorter than the connection's reply timeout ({limit:?})",
                    self.timeout
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn wait_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(self.timeout.as_millis() as u64);
        cmd
    }
}
