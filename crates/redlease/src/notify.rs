//! Wake-ups: how a release reaches the processes waiting for the lock.
//!
//! A release script publishes on the lock's channel (`{key}:wake`) in the same atomic
//! step that frees the lock. Each client keeps one pub/sub connection for all of its
//! waiters and subscribes to a channel while at least one local task waits on it; many
//! waiters on one name share one subscription. A message carries how many waiters it
//! may let in (`1`, a number, or `*` for all); that many local waiters are woken.
//!
//! Wake-ups are counted, not broadcast: a message that frees `n` places hands out `n`
//! wake permits, capped at the number of local waiters, and each permit lets exactly one
//! waiter try again. A permit that arrives while every waiter is busy with an attempt is
//! kept for the next one to park, so none is lost — and waiters that were not woken do
//! not retry, so contention does not turn into polling. If the pub/sub connection drops,
//! every waiter gets a permit (a message may have been missed) while the connection is
//! rebuilt. And every wait is bounded by the holder's remaining TTL, so a wake-up that
//! never comes costs at most that.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Semaphore, mpsc, watch};

/// How long a subscribe or ping may take before the connection is considered broken.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle subscribed connection is pinged to detect a dead peer.
const PING_EVERY: Duration = Duration::from_secs(5);

/// One channel's local waiters.
#[derive(Debug)]
pub(crate) struct Channel {
    /// Wake permits: each lets one waiter try again.
    permits: Semaphore,
    /// Wake-up messages received (not pass-ons), so a waiter can tell whether a wake-up
    /// it could not use is new to it.
    generation: AtomicU64,
    /// Local waiters subscribed; changed only under the registry lock.
    waiters: AtomicUsize,
    subscribed: watch::Sender<bool>,
}

impl Channel {
    fn new() -> Self {
        Channel {
            permits: Semaphore::new(0),
            generation: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            subscribed: watch::channel(false).0,
        }
    }

    /// Hands out up to `count` wake permits, never more than there are local waiters.
    fn wake(&self, count: usize) {
        let waiters = self.waiters.load(Ordering::Relaxed);
        let deficit = waiters.saturating_sub(self.permits.available_permits());
        let n = count.max(1).min(deficit);
        if n > 0 {
            self.permits.add_permits(n);
        }
    }

    /// A wake-up message arrived: counts it, then wakes `count` waiters.
    fn message(&self, count: usize) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.wake(count);
    }
}

#[derive(Debug)]
enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

#[derive(Debug, Default)]
struct Registry {
    channels: HashMap<String, Arc<Channel>>,
}

/// How the notifier opens its pub/sub connection.
pub(crate) type PubSubConnector = Arc<
    dyn Fn() -> futures_util::future::BoxFuture<'static, redis::RedisResult<redis::aio::PubSub>>
        + Send
        + Sync,
>;

/// The per-client wake-up service.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    registry: Arc<std::sync::Mutex<Registry>>,
    tx: mpsc::UnboundedSender<Command>,
}

impl Notifier {
    /// Starts the connection task; it connects lazily, on the first subscription.
    pub fn spawn(connect: PubSubConnector) -> Self {
        let registry = Arc::new(std::sync::Mutex::new(Registry::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(connect, registry.clone(), rx));
        Notifier { registry, tx }
    }

    /// Registers a local waiter on `channel`, subscribing if it is the first.
    pub fn subscribe(&self, channel: &str) -> Subscription {
        let mut reg = self.registry.lock().expect("notifier lock");
        let state = reg
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| {
                let _ = self.tx.send(Command::Subscribe(channel.to_owned()));
                Arc::new(Channel::new())
            })
            .clone();
        state.waiters.fetch_add(1, Ordering::Relaxed);
        Subscription {
            notifier: self.clone(),
            channel: channel.to_owned(),
            state,
        }
    }
}

/// A local waiter's registration on a channel; unsubscribes when the last one drops.
#[derive(Debug)]
pub(crate) struct Subscription {
    notifier: Notifier,
    channel: String,
    state: Arc<Channel>,
}

impl Subscription {
    /// Waits until the server confirmed the subscription, up to `timeout`. Returns
    /// whether it is active; when not, the waiter falls back to bounded polling.
    pub async fn ready(&self, timeout: Duration) -> bool {
        let mut rx = self.state.subscribed.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|s| *s)).await,
            Ok(Ok(_))
        )
    }

    /// The number of wake-up messages received so far on this channel.
    pub fn generation(&self) -> u64 {
        self.state.generation.load(Ordering::Acquire)
    }

    /// Waits for a wake permit, and consumes it.
    ///
    /// Cancel safe: a permit is only consumed when this completes.
    pub async fn woken(&self) {
        if let Ok(permit) = self.state.permits.acquire().await {
            permit.forget();
        }
    }

    /// Passes a consumed wake-up on to another local waiter (used by a waiter that was
    /// woken but gives up without trying).
    pub fn pass_on(&self) {
        self.state.wake(1);
    }

    /// A wake-up this waiter consumed and still owes an attempt for: if it is dropped
    /// unsettled (the waiter was cancelled before trying), it is passed on.
    pub fn debt(&self) -> WakeDebt {
        WakeDebt(Some(self.state.clone()))
    }
}

/// See [`Subscription::debt`].
#[derive(Debug)]
pub(crate) struct WakeDebt(Option<Arc<Channel>>);

impl WakeDebt {
    /// The waiter made its attempt; nothing is owed.
    pub fn settle(mut self) {
        self.0 = None;
    }
}

impl Drop for WakeDebt {
    fn drop(&mut self) {
        if let Some(ch) = self.0.take() {
            ch.wake(1);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut reg = self.notifier.registry.lock().expect("notifier lock");
        if self.state.waiters.fetch_sub(1, Ordering::Relaxed) == 1 {
            reg.channels.remove(&self.channel);
            let _ = self
                .notifier
                .tx
                .send(Command::Unsubscribe(std::mem::take(&mut self.channel)));
        }
    }
}

fn channels(registry: &std::sync::Mutex<Registry>) -> Vec<(String, Arc<Channel>)> {
    let reg = registry.lock().expect("notifier lock");
    reg.channels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn lookup(registry: &std::sync::Mutex<Registry>, channel: &str) -> Option<Arc<Channel>> {
    registry
        .lock()
        .expect("notifier lock")
        .channels
        .get(channel)
        .cloned()
}

async fn run(
    connect: PubSubConnector,
    registry: Arc<std::sync::Mutex<Registry>>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut connected_before = false;
    loop {
        // Nothing to listen to: wait for the first subscription (or shutdown).
        if registry.lock().expect("notifier lock").channels.is_empty() {
            match rx.recv().await {
                Some(_) => {}
                None => return,
            }
            if registry.lock().expect("notifier lock").channels.is_empty() {
                continue;
            }
        }
        let pubsub = match tokio::time::timeout(COMMAND_TIMEOUT, connect()).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "wake-up connection failed; waiters poll until it is back");
                if sleep_or_shutdown(&mut rx, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
            Err(_) => {
                tracing::debug!("wake-up connection timed out; waiters poll until it is back");
                if sleep_or_shutdown(&mut rx, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let (mut sink, mut stream) = pubsub.split();
        let current = channels(&registry);
        if !current.is_empty() {
            let names: Vec<&str> = current.iter().map(|(k, _)| k.as_str()).collect();
            match tokio::time::timeout(COMMAND_TIMEOUT, sink.subscribe(&names)).await {
                Ok(Ok(())) => {}
                _ => continue,
            }
        }
        for (_, ch) in &current {
            ch.subscribed.send_replace(true);
            if connected_before {
                // Releases published while we were away were missed: let everyone retry.
                ch.message(usize::MAX);
            }
        }
        connected_before = true;
        let shutdown = serve(&registry, &mut rx, &mut sink, &mut stream).await;
        for (_, ch) in channels(&registry) {
            ch.subscribed.send_replace(false);
            ch.message(usize::MAX);
        }
        if shutdown {
            return;
        }
    }
}

/// Serves one connection until it breaks (returns false) or the client is gone (true).
async fn serve(
    registry: &std::sync::Mutex<Registry>,
    rx: &mut mpsc::UnboundedReceiver<Command>,
    sink: &mut redis::aio::PubSubSink,
    stream: &mut redis::aio::PubSubStream,
) -> bool {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return true,
                Some(Command::Subscribe(name)) => {
                    let Some(ch) = lookup(registry, &name) else { continue };
                    match tokio::time::timeout(COMMAND_TIMEOUT, sink.subscribe(&name)).await {
                        Ok(Ok(())) => {
                            ch.subscribed.send_replace(true);
                        }
                        _ => return false,
                    }
                }
                Some(Command::Unsubscribe(name)) => {
                    if lookup(registry, &name).is_some() {
                        continue;
                    }
                    if !matches!(tokio::time::timeout(COMMAND_TIMEOUT, sink.unsubscribe(&name)).await, Ok(Ok(()))) {
                        return false;
                    }
                }
            },
            msg = stream.next() => {
                let Some(msg) = msg else {
                    tracing::debug!("wake-up connection closed; reconnecting");
                    return false;
                };
                let Some(ch) = lookup(registry, msg.get_channel_name()) else { continue };
                let payload = msg.get_payload_bytes();
                if payload == b"*" {
                    ch.message(usize::MAX);
                } else {
                    let n = std::str::from_utf8(payload).ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
                    ch.message(n);
                }
            }
            _ = ping.tick() => {
                if registry.lock().expect("notifier lock").channels.is_empty() {
                    continue;
                }
                let pong: Result<redis::RedisResult<redis::Value>, _> =
                    tokio::time::timeout(COMMAND_TIMEOUT, sink.ping()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    tracing::debug!("wake-up connection did not answer a ping; reconnecting");
                    return false;
                }
            }
        }
    }
}

/// Sleeps for `delay` while still draining commands; returns true on shutdown.
async fn sleep_or_shutdown(rx: &mut mpsc::UnboundedReceiver<Command>, delay: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + delay;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return false,
            cmd = rx.recv() => if cmd.is_none() { return true },
        }
    }
}
