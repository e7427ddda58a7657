//! The context every lock of one client shares: the command connection and how its
//! batches travel, the wake-up connection, the renewal task, and the client's settings.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::notify::Notifier;
use super::renewer::Renewer;
use crate::keys::FenceKeys;
use crate::transport::{Batching, CommandConnection, Topology};

/// What the locks of one client share.
#[derive(Debug)]
pub(crate) struct Context {
    pub conn: Arc<dyn CommandConnection>,
    /// How a batch of commands travels over `conn` (one pipeline, or one per node).
    pub batching: Batching,
    pub notifier: Notifier,
    pub renewer: Renewer,
    /// Per-lock state a primitive keeps for this client (the plain mutex's local
    /// queue), by lock key.
    pub locals: Locals,
    pub prefix: String,
    /// The keys that issue the plain mutex's fencing tokens.
    pub fence_keys: FenceKeys,
    /// The owner label stored beside each held lock.
    pub label: Arc<str>,
    /// A random public id of this client (16 hex digits): it names the client's own
    /// wake-up channels, where a release hands a lock to one of its waiters.
    pub id: Arc<str>,
    /// Metadata retention in milliseconds, as the script argument.
    pub retention_arg: Arc<str>,
    /// `PUBLISH` or `SPUBLISH`, as the script argument.
    pub publish: Arc<str>,
    /// How long a waiter waits for its subscription to be confirmed before polling.
    pub subscribe_timeout: Duration,
    /// For how long a request that failed in a way that may be temporary (timeout,
    /// broken connection) is retried before the error is returned.
    pub retry_window: Duration,
    /// Standalone, Sentinel or Cluster, and what that changes.
    pub topology: Topology,
    /// Durations in milliseconds as script arguments, made once for the lease lengths
    /// in use rather than for every lock handle.
    pub millis: MillisArgs,
    /// The plain mutex release's hand-over argument, `<publish> <claim_ms>`, made once
    /// per claim length in use.
    pub handover: MillisArgs,
}

/// Everything a [`Context`] is built from.
pub(crate) struct Settings {
    pub conn: Arc<dyn CommandConnection>,
    pub batching: Batching,
    pub notifier: Notifier,
    pub prefix: String,
    pub label: String,
    pub retention: Duration,
    pub retry_window: Duration,
    pub topology: Topology,
}

impl Context {
    /// Starts the renewal task and assembles the context.
    pub fn new(settings: Settings) -> Arc<Context> {
        let Settings {
            conn,
            batching,
            notifier,
            prefix,
            label,
            retention,
            retry_window,
            topology,
        } = settings;
        Arc::new(Context {
            renewer: Renewer::spawn(conn.clone(), batching.clone()),
            conn,
            batching,
            notifier,
            locals: Locals::default(),
            fence_keys: FenceKeys::new(&prefix, topology.is_cluster()),
            prefix,
            label: label.into(),
            id: crate::token::public_id().into(),
            retention_arg: retention.as_millis().to_string().into(),
            publish: topology.publish_command().into(),
            subscribe_timeout: Duration::from_secs(1),
            retry_window,
            handover: MillisArgs::after(&format!("{} ", topology.publish_command())),
            topology,
            millis: MillisArgs::default(),
        })
    }

    /// How many client connections listen on `channel` (each waiting process counts
    /// once): `PUBSUB NUMSUB`, or `SHARDNUMSUB` on the slot's master in a cluster.
    pub async fn listeners(&self, channel: &str) -> u64 {
        self.topology
            .subscribers(&*self.conn, channel)
            .await
            .unwrap_or(0)
            .max(0) as u64
    }
}

/// A few durations in milliseconds as shared decimal strings (script arguments),
/// each after a fixed prefix (none by default): a client usually uses one or two lease
/// lengths, and each lock handle would otherwise format its own. The first
/// [`MILLIS_KEPT`] durations asked for are kept, and read without taking a lock (every
/// lock handle asks; a lock shared by all threads would be a point of contention);
/// others are formatted each time.
#[derive(Debug, Default)]
pub(crate) struct MillisArgs {
    prefix: String,
    kept: [std::sync::OnceLock<(u64, Arc<str>)>; MILLIS_KEPT],
    /// Taken to fill a slot.
    filling: std::sync::Mutex<()>,
}

/// How many distinct values [`MillisArgs`] keeps.
const MILLIS_KEPT: usize = 8;

impl MillisArgs {
    /// Durations as decimal strings after `prefix`.
    pub fn after(prefix: &str) -> Self {
        MillisArgs {
            prefix: prefix.to_owned(),
            ..Default::default()
        }
    }

    /// `ms` as a decimal string (after the prefix).
    pub fn arg(&self, ms: u64) -> Arc<str> {
        if let Some(arg) = self.kept_arg(ms) {
            return arg;
        }
        let _filling = self.filling.lock().expect("millis lock");
        if let Some(arg) = self.kept_arg(ms) {
            return arg;
        }
        let arg: Arc<str> = format!("{}{ms}", self.prefix).into();
        if let Some(free) = self.kept.iter().find(|slot| slot.get().is_none()) {
            let _ = free.set((ms, arg.clone()));
        }
        arg
    }

    /// `ms`'s string if it is kept.
    fn kept_arg(&self, ms: u64) -> Option<Arc<str>> {
        for slot in &self.kept {
            match slot.get() {
                Some((m, arg)) if *m == ms => return Some(arg.clone()),
                Some(_) => {}
                // Slots fill in order: the rest are free.
                None => return None,
            }
        }
        None
    }
}

/// Per-lock state of one client, by lock key, of whatever type the primitive keeps;
/// an entry goes when nothing uses it any more.
#[derive(Default)]
pub(crate) struct Locals {
    entries: std::sync::Mutex<HashMap<Arc<str>, Weak<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for Locals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Locals")
    }
}

impl Locals {
    /// The state of type `T` for `key`, shared by every handle of that lock in this
    /// client; made with `T::default()` when there is none yet.
    pub fn get<T: Default + Send + Sync + 'static>(&self, key: &Arc<str>) -> Arc<T> {
        let mut entries = self.entries.lock().expect("locals lock");
        // About to grow past a power of two: drop the entries nothing uses any more.
        if entries.len() > 64 && entries.len().is_power_of_two() && !entries.contains_key(key) {
            entries.retain(|_, w| w.strong_count() > 0);
        }
        // One lookup (one hash of the key) for both the hit and the miss.
        let entry = entries.entry(key.clone()).or_insert_with(|| Weak::<()>::new());
        if let Some(existing) = entry.upgrade().and_then(|any| any.downcast::<T>().ok()) {
            return existing;
        }
        let fresh = Arc::new(T::default());
        let erased: Arc<dyn Any + Send + Sync> = fresh.clone();
        *entry = Arc::downgrade(&erased);
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_args_are_kept_and_shared() {
        let args = MillisArgs::after("PUBLISH ");
        let a = args.arg(5000);
        assert_eq!(&*a, "PUBLISH 5000");
        assert!(Arc::ptr_eq(&a, &args.arg(5000)), "kept");
        for ms in 0..MILLIS_KEPT as u64 * 2 {
            assert_eq!(&*args.arg(ms), format!("PUBLISH {ms}"));
        }
        assert!(Arc::ptr_eq(&a, &args.arg(5000)), "still kept");
        assert_eq!(&*MillisArgs::default().arg(30000), "30000");
    }

    #[test]
    fn locals_are_shared_per_key_and_forgotten_when_unused() {
        let locals = Locals::default();
        let key: Arc<str> = "k".into();
        let a: Arc<std::sync::Mutex<u32>> = locals.get(&key);
        *a.lock().unwrap() = 7;
        let b: Arc<std::sync::Mutex<u32>> = locals.get(&key);
        assert_eq!(*b.lock().unwrap(), 7, "the same state for the same key");
        drop((a, b));
        let c: Arc<std::sync::Mutex<u32>> = locals.get(&key);
        assert_eq!(*c.lock().unwrap(), 0, "fresh once nothing used it");
    }
}
