//! What the guards of the fair mutex, the read-write lock and the semaphore share: a
//! lease renewed by the client's renewal task, an `extend`, a release that survives
//! cancellation and lost replies, a background release on drop — and the heartbeat
//! that keeps a waiter's place while it waits.
//!
//! The plain mutex predates this module and keeps its own copy of the guard logic.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::ClientInner;
use crate::error::{Error, Result};
use crate::keys;
use crate::lease::{Lease, LeaseShared, LostReason, ScriptCall};
use crate::scripts::int;
use crate::token::Token;
use crate::wait::{Pending, eval_retrying, spawn_release};

/// Starts a lease confirmed by a request sent at `sent` that left `remaining` of `ttl`
/// on the server, and schedules its renewal.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_lease(
    client: &ClientInner,
    name: &Arc<str>,
    sent: Instant,
    ttl: Duration,
    remaining: Duration,
    renew: ScriptCall,
    release: ScriptCall,
    auto_renew: bool,
) -> Lease {
    let shared = LeaseShared::new(name.clone(), sent, ttl, remaining, renew, release, auto_renew);
    if auto_renew {
        client.renewer.schedule(&shared);
    }
    Lease { shared }
}

/// One held acquisition: its token and lease. Dropping it while it still owns the
/// token stops renewal and releases in the background.
#[derive(Debug)]
pub(crate) struct Held {
    client: Arc<ClientInner>,
    name: Arc<str>,
    /// The key Redis errors are reported against.
    key: Arc<str>,
    token: Option<Token>,
    lease: Lease,
}

impl Held {
    pub fn new(client: Arc<ClientInner>, name: Arc<str>, key: Arc<str>, token: Token, lease: Lease) -> Self {
        Held {
            client,
            name,
            key,
            token: Some(token),
            lease,
        }
    }

    pub fn token(&self) -> &Token {
        self.token
            .as_ref()
            .expect("token present until the guard is consumed")
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Sets the remaining lease to `ttl` through the lease's renewal script.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let ttl_ms = keys::ttl_ms(&self.name, ttl)?;
        if let Some(reason) = self.lease.lost_reason() {
            tracing::debug!(lock = %self.name, %reason, "extend after the lease ended");
            return Err(self.not_held());
        }
        let shared = &self.lease.shared;
        let cmd = shared.renew.cmd_with_ttl(ttl_ms);
        let sent = Instant::now();
        let reply = eval_retrying(
            &self.client,
            &self.name,
            &self.key,
            "extend",
            shared.renew.script,
            &cmd,
            None,
            None,
        )
        .await?;
        if int(&reply) != Some(1) {
            shared.end(LostReason::Gone);
            return Err(self.not_held());
        }
        shared.set_ttl(ttl);
        shared.confirm(sent, ttl);
        if shared.auto_renew {
            self.client.renewer.schedule(shared);
        }
        Ok(())
    }

    /// Runs the lease's release script. A release whose request may have landed but
    /// whose reply was lost finishes in the background if this future is dropped.
    pub async fn release(mut self) -> Result<()> {
        self.token
            .take()
            .expect("token present until the guard is consumed");
        let shared = self.lease.shared.clone();
        let valid_until = shared.valid_until();
        shared.end(LostReason::Released);
        let call = shared.release.clone();
        let pending = Pending::new(self.client.clone(), &self.name, call.clone(), shared.ttl());
        pending.arm();
        let sent = Instant::now();
        let reply = eval_retrying(
            &self.client,
            &self.name,
            &self.key,
            "release",
            call.script,
            &call.cmd(),
            None,
            Some(&pending),
        )
        .await?;
        let doubted = pending.doubted();
        pending.disarm();
        // Not held any more: if an earlier attempt of this release may have landed
        // while the lease was still valid, that attempt released it.
        if int(&reply) == Some(1) || (doubted && sent < valid_until) {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    /// Stops renewing and hands back the token without releasing.
    pub fn forget(mut self) -> Token {
        self.lease.shared.end(LostReason::Released);
        self.token
            .take()
            .expect("token present until the guard is consumed")
    }

    /// Ends the lease without releasing: what it held was handed over (a downgrade).
    pub fn disown(mut self) {
        self.lease.shared.end(LostReason::Released);
        self.token = None;
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.name.to_string(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.token.take().is_some() {
            let lease = &self.lease.shared;
            lease.end(LostReason::Released);
            spawn_release(
                self.client.clone(),
                self.name.clone(),
                lease.release.clone(),
                lease.ttl(),
            );
        }
    }
}

/// Keeps a waiter's queue entry (a fair-mutex place, a waiting writer's registration)
/// alive while it waits, through the client's renewal task like any lease. Stops when
/// dropped, so an abandoned wait stops heartbeating at once.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    client: Arc<ClientInner>,
    name: Arc<str>,
    ttl: Duration,
    renew: ScriptCall,
    leave: ScriptCall,
    lease: std::sync::Mutex<Option<Arc<LeaseShared>>>,
}

impl Heartbeat {
    pub fn new(
        client: Arc<ClientInner>,
        name: &str,
        ttl: Duration,
        renew: ScriptCall,
        leave: ScriptCall,
    ) -> Self {
        Heartbeat {
            client,
            name: format!("{name} (waiting)").into(),
            ttl,
            renew,
            leave,
            lease: std::sync::Mutex::new(None),
        }
    }

    /// A request sent at `sent` found or wrote the entry (`fresh`: created it): keep it
    /// alive from now on. A running heartbeat is kept unless the entry is fresh — then
    /// the old one may be about to learn that the previous entry was gone, and a new
    /// one takes over.
    pub fn joined(&self, sent: Instant, fresh: bool) {
        let mut lease = self.lease.lock().expect("heartbeat lock");
        if let Some(old) = lease.as_ref() {
            if !fresh && old.ended().is_none() {
                return;
            }
            old.end(LostReason::Released);
        }
        let shared = LeaseShared::new(
            self.name.clone(),
            sent,
            self.ttl,
            self.ttl,
            self.renew.clone(),
            self.leave.clone(),
            true,
        );
        self.client.renewer.schedule(&shared);
        *lease = Some(shared);
    }

    /// Stops heartbeating.
    pub fn stop(&self) {
        if let Some(lease) = self.lease.lock().expect("heartbeat lock").take() {
            lease.end(LostReason::Released);
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A random public id for a waiter: 16 hex digits. Not a secret (it names a channel).
pub(crate) fn waiter_id() -> String {
    let r = getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()) << 32
    });
    format!("{r:016x}")
}

/// A non-negative millisecond count as a duration.
pub(crate) fn ms(v: Option<i64>) -> Option<Duration> {
    v.filter(|&x| x >= 0).map(|x| Duration::from_millis(x as u64))
}

/// The error for a script reply of an unexpected shape.
pub(crate) fn bad_reply(name: &str, op: &'static str) -> Error {
    Error::Redis {
        name: name.to_owned(),
        op,
        source: redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply")),
    }
}

/// How many client connections listen on `channel` (each waiting process counts once):
/// `PUBSUB NUMSUB`, or `SHARDNUMSUB` on the slot's master in a cluster.
pub(crate) async fn listeners(client: &ClientInner, channel: &str) -> u64 {
    client
        .topology
        .subscribers(&*client.conn, channel)
        .await
        .unwrap_or(0)
        .max(0) as u64
}
