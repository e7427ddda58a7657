//! Replica acknowledgement: an opt-in durability policy per lock.
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

use redis::{Cmd, RedisResult, Value};
use tokio::time::Instant;

use crate::client::ClientInner;
use crate::conn::{CommandConnection, is_noscript};
use crate::error::{Error, Result};
use crate::scripts::{LuaScript, int};
use crate::wait::{Pending, retrying};

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

    fn wait_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(self.timeout.as_millis() as u64);
        cmd
    }
}

/// Runs a script call followed by `WAIT` in one pipeline, retrying temporary failures
/// like [`eval_retrying`](crate::wait::eval_retrying); returns the script's reply and
/// how many replicas acknowledged.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn eval_acked(
    client: &ClientInner,
    name: &str,
    key: &str,
    op: &'static str,
    script: &LuaScript,
    cmd: &Cmd,
    ack: &ReplicaAck,
    deadline: Option<Instant>,
    pending: Option<&Pending>,
) -> Result<(Value, u32)> {
    let wait = ack.wait_cmd();
    let (reply, acked) = retrying(client, name, key, op, deadline, pending, || {
        eval_then_wait(&*client.conn, script, cmd, &wait)
    })
    .await?;
    tracing::debug!(lock = %name, op, acked, wanted = ack.replicas, "replicas acknowledged");
    Ok((reply, acked))
}

async fn eval_then_wait(
    conn: &dyn CommandConnection,
    script: &LuaScript,
    cmd: &Cmd,
    wait: &Cmd,
) -> RedisResult<(Value, u32)> {
    let (mut reply, mut acked) = pipeline(conn, cmd.clone(), wait).await?;
    if matches!(&reply, Err(e) if is_noscript(e)) {
        (reply, acked) = pipeline(conn, script.eval_from(cmd), wait).await?;
    }
    let reply = reply?;
    let acked = acked?;
    let acked = int(&acked).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "WAIT did not return a count",
        ))
    })?;
    Ok((reply, acked.clamp(0, i64::from(u32::MAX)) as u32))
}

async fn pipeline(
    conn: &dyn CommandConnection,
    cmd: Cmd,
    wait: &Cmd,
) -> RedisResult<(RedisResult<Value>, RedisResult<Value>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(cmd).add_command(wait.clone());
    let mut results = conn.send_pipeline(&pipe).await?.into_iter();
    match (results.next(), results.next()) {
        (Some(reply), Some(acked)) => Ok((reply, acked)),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "pipeline reply count mismatch",
        ))),
    }
}
