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
//! rebuilt, and another once its subscription is confirmed again (a release in between
//! reached nobody) — as does a waiter that stopped waiting for its subscription to be
//! confirmed and went on. And every wait is bounded by the holder's remaining TTL, so a
//! wake-up that never comes costs at most that.
//!
//! Two backends feed the same waiters. On a single Redis (or a Sentinel-managed
//! master) releases `PUBLISH`, and the connection speaks RESP3: a message arrives as a
//! push message, which redis-rs hands to a callback in the task that reads the socket,
//! and the callback wakes the waiter there — no task in between, which is a thread
//! wake-up less on the hand-over's path. A server that refuses RESP3 (a proxy, a server
//! with `HELLO` renamed away) gets a RESP2 pub/sub connection, read by the notifier's
//! task. On a Redis Cluster, a `PUBLISH` would be broadcast over the cluster bus to
//! every node, so releases `SPUBLISH` instead and the notifier `SSUBSCRIBE`s through a
//! RESP3 cluster connection, which routes each subscription to the node owning the
//! channel's slot (the lock's slot) and delivers messages as push messages, handed to
//! the waiters by its callback as well (in the cluster connection's task). When a slot
//! migrates, its old owner drops the subscriptions (`sunsubscribe`): the notifier wakes
//! the channel's waiters and subscribes again, reaching the new owner.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::transport::value::text;

/// How long a subscribe or ping may take before the connection is considered broken.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle subscribed connection is pinged to detect a dead peer.
const PING_EVERY: Duration = Duration::from_secs(5);
/// How soon a sharded subscription that failed (its node down) is tried again.
const RESUBSCRIBE_EVERY: Duration = Duration::from_millis(250);

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
    /// A message may have been missed while the subscription was not confirmed (its
    /// connection was lost, or a waiter stopped waiting for the confirmation and went
    /// on): every waiter is woken once it is confirmed again.
    missed: AtomicBool,
    /// Waiters that may be handed the lock by a release, by their public id: a message
    /// `g <id> <details>` is a grant for that waiter alone.
    grants: std::sync::Mutex<HashMap<String, watch::Sender<Option<String>>>>,
}

impl Channel {
    fn new() -> Self {
        Channel {
            permits: Semaphore::new(0),
            generation: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            subscribed: watch::channel(false).0,
            missed: AtomicBool::new(false),
            grants: std::sync::Mutex::new(HashMap::new()),
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

    /// Wakes as many waiters as a message's payload says: `*` all, `<n>` that many (at
    /// most as many as wait here), anything else one — or, for `g <id> <details>`, hands
    /// the grant to the waiter `id` if it is one of ours, and wakes nobody else.
    fn deliver(&self, payload: &[u8]) {
        if let Some(grant) = payload.strip_prefix(b"g ") {
            let text = String::from_utf8_lossy(grant);
            let (id, details) = text.split_once(' ').unwrap_or((&text, ""));
            if let Some(slot) = self.grants.lock().expect("grants lock").get(id) {
                slot.send_replace(Some(details.to_owned()));
            }
            return;
        }
        if payload == b"*" {
            self.message(usize::MAX);
        } else {
            let n = std::str::from_utf8(payload)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(1);
            self.message(n);
        }
    }

    /// Everyone may have missed a message (a reconnect, a moved slot): wake them all.
    fn wake_all(&self) {
        self.message(usize::MAX);
    }

    /// The server confirmed the subscription: from now on every release reaches the
    /// waiters. Those that may have missed one while it was not confirmed are woken to
    /// look again.
    fn confirmed(&self) {
        self.subscribed.send_replace(true);
        if self.missed.swap(false, Ordering::AcqRel) {
            self.wake_all();
        }
    }

    /// The subscription is gone (its connection broke, its node dropped it, a node did
    /// not answer): every waiter is woken now, and again once it is confirmed, since a
    /// release in between reaches nobody.
    fn lost(&self) {
        self.subscribed.send_replace(false);
        self.missed.store(true, Ordering::Release);
        self.wake_all();
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

/// The server the notifier connects to now (a Sentinel-managed master may have moved
/// since the last connection).
pub(crate) type ServerLookup =
    Arc<dyn Fn() -> BoxFuture<'static, redis::RedisResult<redis::Client>> + Send + Sync>;

/// The per-client wake-up service.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    registry: Arc<std::sync::Mutex<Registry>>,
    tx: mpsc::UnboundedSender<Command>,
}

impl Notifier {
    /// Starts the connection task; it connects lazily, on the first subscription.
    pub fn spawn(connect: ServerLookup) -> Self {
        let registry = Arc::new(std::sync::Mutex::new(Registry::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(connect, registry.clone(), rx));
        Notifier { registry, tx }
    }

    /// Opens the wake-up connection of a cluster client (RESP3; also the client's way to
    /// ask a slot's master how many wait) and starts its sharded pub/sub task. Sharded
    /// messages are delivered to the waiters by the connection's push callback; every
    /// other push message goes to the task.
    pub async fn spawn_sharded(
        nodes: &[redis::ConnectionInfo],
    ) -> redis::RedisResult<(Self, redis::cluster_async::ClusterConnection)> {
        let registry = Arc::new(std::sync::Mutex::new(Registry::default()));
        let (push_tx, pushes) = mpsc::unbounded_channel();
        let on_push = {
            let registry = registry.clone();
            move |push: redis::PushInfo| -> Result<(), ()> {
                if push.kind == redis::PushKind::SMessage {
                    deliver_push(&registry, &push.data);
                    Ok(())
                } else {
                    push_tx.send(push).map_err(drop)
                }
            }
        };
        let conn = crate::transport::cluster::wake_connection(nodes, on_push).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_sharded(conn.clone(), pushes, registry.clone(), rx));
        Ok((Notifier { registry, tx }, conn))
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

impl Notifier {
    /// Registers a local waiter on `channel` only if this client already listens to it
    /// — another local waiter subscribed, and the server confirmed — so that every
    /// message published from now on reaches it (or, if the connection breaks, the
    /// waiter is woken as every other one is). `None` otherwise: then the waiter
    /// subscribes after its first attempt, and tries once more once confirmed.
    pub fn join_live(&self, channel: &str) -> Option<Subscription> {
        let reg = self.registry.lock().expect("notifier lock");
        let state = reg.channels.get(channel)?;
        if !*state.subscribed.borrow() {
            return None;
        }
        state.waiters.fetch_add(1, Ordering::Relaxed);
        Some(Subscription {
            notifier: self.clone(),
            channel: channel.to_owned(),
            state: state.clone(),
        })
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
    /// whether it is active; when not, the waiter falls back to bounded polling, and is
    /// woken when the confirmation comes (a release before it reached nobody).
    pub async fn ready(&self, timeout: Duration) -> bool {
        let mut rx = self.state.subscribed.subscribe();
        if matches!(
            tokio::time::timeout(timeout, rx.wait_for(|s| *s)).await,
            Ok(Ok(_))
        ) {
            return true;
        }
        self.state.missed.store(true, Ordering::Release);
        // Confirmed meanwhile: nothing the waiter does from now on can be missed. The
        // flag stays set: only `confirmed` clears it, and wakes the waiters when it does.
        // (Clearing it here could erase another waiter's, or a lost subscription's, between
        // a confirmation's two steps — or a loss right after this look — and that wake-up
        // would never come. Left set, it costs at most one extra wake-up at the next
        // confirmation, which mostly follows a loss that sets it anyway.)
        *self.state.subscribed.borrow()
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

    /// Lets a release hand the lock to the waiter `id` through this channel (a message
    /// `g <id> <details>`); the grant's details arrive on the returned slot.
    pub fn expect_grant(&self, id: &str) -> GrantSlot {
        let (tx, rx) = watch::channel(None);
        self.state
            .grants
            .lock()
            .expect("grants lock")
            .insert(id.to_owned(), tx);
        GrantSlot {
            channel: self.state.clone(),
            id: id.to_owned(),
            rx,
        }
    }
}

/// Where a grant for one waiter arrives (see [`Subscription::expect_grant`]); stops
/// expecting it when dropped.
#[derive(Debug)]
pub(crate) struct GrantSlot {
    channel: Arc<Channel>,
    id: String,
    rx: watch::Receiver<Option<String>>,
}

impl GrantSlot {
    /// Waits for a grant and returns its details. Cancel safe.
    pub async fn granted(&mut self) -> String {
        loop {
            if let Some(details) = self.rx.borrow_and_update().clone() {
                return details;
            }
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Forgets a grant received so far (it was found stale).
    pub fn clear(&mut self) {
        if let Some(tx) = self.channel.grants.lock().expect("grants lock").get(&self.id) {
            tx.send_replace(None);
        }
    }
}

impl Drop for GrantSlot {
    fn drop(&mut self) {
        self.channel.grants.lock().expect("grants lock").remove(&self.id);
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

/// One wake-up connection of a single Redis (or Sentinel-managed master).
enum Wake {
    /// RESP3: messages are delivered by the connection's push callback, in redis-rs's
    /// task reading the socket, straight to the waiters; `closed` ends when the
    /// connection does.
    Push {
        conn: redis::aio::MultiplexedConnection,
        closed: mpsc::UnboundedReceiver<()>,
    },
    /// RESP2 pub/sub: messages are read and delivered by the notifier's task.
    Stream {
        sink: redis::aio::PubSubSink,
        stream: redis::aio::PubSubStream,
    },
}

impl Wake {
    /// Connects to `client`'s server: RESP3 unless `resp2` (set here when the server
    /// refused RESP3 and took RESP2).
    async fn open(
        client: redis::Client,
        registry: &Arc<std::sync::Mutex<Registry>>,
        resp2: &mut bool,
    ) -> redis::RedisResult<Wake> {
        if !*resp2 {
            let info = client.get_connection_info().clone();
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            let resp3 = redis::Client::open(info.set_redis_settings(settings))?;
            let (closed_tx, closed) = mpsc::unbounded_channel::<()>();
            let registry = registry.clone();
            // Runs in the connection's own task: delivers without blocking. Dropped (and
            // with it `closed_tx`) when the connection ends.
            let on_push = move |push: redis::PushInfo| -> Result<(), ()> {
                match push.kind {
                    redis::PushKind::Message => deliver_push(&registry, &push.data),
                    redis::PushKind::Disconnection => {
                        let _ = closed_tx.send(());
                    }
                    _ => {}
                }
                Ok(())
            };
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(COMMAND_TIMEOUT))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                .set_push_sender(on_push);
            match bounded(resp3.get_multiplexed_async_connection_with_config(&config)).await {
                Ok(conn) => return Ok(Wake::Push { conn, closed }),
                // Not reached, or not answering: RESP2 would fare no better.
                Err(err) if unreachable(&err) => return Err(err),
                Err(err) => {
                    tracing::debug!(error = %err, "the server refused a RESP3 wake-up connection; trying RESP2");
                }
            }
        }
        let pubsub = bounded(client.get_async_pubsub()).await?;
        if !*resp2 {
            tracing::debug!("wake-ups use a RESP2 pub/sub connection from now on");
            *resp2 = true;
        }
        let (sink, stream) = pubsub.split();
        Ok(Wake::Stream { sink, stream })
    }

    async fn subscribe(&mut self, names: &[&str]) -> redis::RedisResult<()> {
        match self {
            Wake::Push { conn, .. } => conn.subscribe(names).await,
            Wake::Stream { sink, .. } => sink.subscribe(names).await,
        }
    }

    async fn unsubscribe(&mut self, name: &str) -> redis::RedisResult<()> {
        match self {
            Wake::Push { conn, .. } => conn.unsubscribe(name).await,
            Wake::Stream { sink, .. } => sink.unsubscribe(name).await,
        }
    }

    async fn ping(&mut self) -> redis::RedisResult<()> {
        match self {
            Wake::Push { conn, .. } => redis::cmd("PING").exec_async(conn).await,
            Wake::Stream { sink, .. } => sink.ping::<redis::Value>().await.map(drop),
        }
    }

    /// Waits until the connection ends, delivering the messages it reads meanwhile
    /// (RESP2; on RESP3 the connection's callback delivers them). Cancel safe.
    async fn closed(&mut self, registry: &std::sync::Mutex<Registry>) {
        match self {
            Wake::Push { closed, .. } => {
                closed.recv().await;
            }
            Wake::Stream { stream, .. } => {
                while let Some(msg) = stream.next().await {
                    if let Some(ch) = lookup(registry, msg.get_channel_name()) {
                        ch.deliver(msg.get_payload_bytes());
                    }
                }
            }
        }
    }
}

/// Runs one step of opening the wake-up connection (or subscribing on it) for at most
/// [`COMMAND_TIMEOUT`]; a step that takes longer fails as an I/O time-out (a server that
/// does not answer).
async fn bounded<T>(step: impl std::future::Future<Output = redis::RedisResult<T>>) -> redis::RedisResult<T> {
    match tokio::time::timeout(COMMAND_TIMEOUT, step).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
    }
}

/// Whether connecting failed for want of a server that answers (rather than a server
/// that refused something).
fn unreachable(err: &redis::RedisError) -> bool {
    err.is_io_error() || err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal()
}

/// Delivers a pushed message (`[channel, payload]`) to the channel's waiters.
fn deliver_push(registry: &std::sync::Mutex<Registry>, data: &[redis::Value]) {
    if let [channel, payload, ..] = data
        && let Some(ch) = text(channel).and_then(|c| lookup(registry, c))
    {
        let payload = match payload {
            redis::Value::BulkString(b) => b.as_slice(),
            redis::Value::SimpleString(s) => s.as_bytes(),
            _ => b"1",
        };
        ch.deliver(payload);
    }
}

async fn run(
    connect: ServerLookup,
    registry: Arc<std::sync::Mutex<Registry>>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut resp2 = false;
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
        // The lookup, each connection attempt and the subscriptions get a budget of
        // their own: a server that refuses RESP3 costs a refused attempt and then a RESP2
        // connection, and the two must not share what one connection may take.
        let connected = async {
            let client = bounded(connect()).await?;
            let mut wake = Wake::open(client, &registry, &mut resp2).await?;
            let current = channels(&registry);
            if !current.is_empty() {
                let names: Vec<&str> = current.iter().map(|(k, _)| k.as_str()).collect();
                bounded(wake.subscribe(&names)).await?;
            }
            Ok::<_, redis::RedisError>((wake, current))
        }
        .await;
        let (mut wake, current) = match connected {
            Ok(connected) => connected,
            Err(err) => {
                tracing::debug!(error = %err, "wake-up connection failed; waiters poll until it is back");
                if sleep_or_shutdown(&mut rx, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        for (_, ch) in &current {
            // After a reconnect, releases published while we were away were missed:
            // everyone looks again.
            ch.confirmed();
        }
        let shutdown = serve(&registry, &mut rx, &mut wake).await;
        for (_, ch) in channels(&registry) {
            ch.lost();
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
    wake: &mut Wake,
) -> bool {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        let cmd = tokio::select! {
            cmd = rx.recv() => cmd,
            () = wake.closed(registry) => {
                tracing::debug!("wake-up connection closed; reconnecting");
                return false;
            }
            _ = ping.tick() => {
                if registry.lock().expect("notifier lock").channels.is_empty() {
                    continue;
                }
                if !matches!(tokio::time::timeout(COMMAND_TIMEOUT, wake.ping()).await, Ok(Ok(()))) {
                    tracing::debug!("wake-up connection did not answer a ping; reconnecting");
                    return false;
                }
                continue;
            }
        };
        match cmd {
            None => return true,
            Some(Command::Subscribe(name)) => {
                let Some(ch) = lookup(registry, &name) else {
                    continue;
                };
                match tokio::time::timeout(COMMAND_TIMEOUT, wake.subscribe(&[&name])).await {
                    Ok(Ok(())) => {
                        ch.confirmed();
                    }
                    _ => return false,
                }
            }
            Some(Command::Unsubscribe(name)) => {
                if lookup(registry, &name).is_some() {
                    continue;
                }
                if !matches!(
                    tokio::time::timeout(COMMAND_TIMEOUT, wake.unsubscribe(&name)).await,
                    Ok(Ok(()))
                ) {
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

/// What a sharded (un)subscription or ping found.
enum Done {
    Subscribed(String, bool),
    Unsubscribed,
    Pinged(bool),
}

fn ssubscribe(mut conn: redis::cluster_async::ClusterConnection, name: String) -> BoxFuture<'static, Done> {
    Box::pin(async move {
        let ok = matches!(
            tokio::time::timeout(COMMAND_TIMEOUT, conn.ssubscribe(&name)).await,
            Ok(Ok(()))
        );
        if !ok {
            tracing::debug!(channel = %name, "sharded subscription failed; retrying");
        }
        Done::Subscribed(name, ok)
    })
}

fn sunsubscribe(mut conn: redis::cluster_async::ClusterConnection, name: String) -> BoxFuture<'static, Done> {
    Box::pin(async move {
        // A failure leaves a subscription nobody listens to; its messages are ignored.
        let _ = tokio::time::timeout(COMMAND_TIMEOUT, conn.sunsubscribe(&name)).await;
        Done::Unsubscribed
    })
}

fn ping(mut conn: redis::cluster_async::ClusterConnection) -> BoxFuture<'static, Done> {
    Box::pin(async move {
        // PING goes to every master.
        let pong: Result<redis::RedisResult<redis::Value>, _> =
            tokio::time::timeout(COMMAND_TIMEOUT, redis::cmd("PING").query_async(&mut conn)).await;
        Done::Pinged(matches!(pong, Ok(Ok(_))))
    })
}

/// The sharded pub/sub task of a cluster client.
///
/// redis-rs keeps the node connections up and, after a reconnect or a topology change,
/// subscribes them again to the channels their slots hold. On top of that this task
/// subscribes and unsubscribes as waiters come and go (concurrently, so one slow node
/// does not delay the others' messages), subscribes again to channels whose node
/// dropped them or whose subscription failed, and wakes every waiter of a channel
/// whose messages may have been missed.
async fn run_sharded(
    conn: redis::cluster_async::ClusterConnection,
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    registry: Arc<std::sync::Mutex<Registry>>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    use redis::PushKind;

    let mut inflight: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
    let mut retry: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut ping_every = tokio::time::interval(PING_EVERY);
    ping_every.tick().await;
    let mut retry_every = tokio::time::interval(RESUBSCRIBE_EVERY);
    retry_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pinging = false;
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Command::Subscribe(name)) => {
                    if lookup(&registry, &name).is_some() {
                        inflight.push(ssubscribe(conn.clone(), name));
                    }
                }
                Some(Command::Unsubscribe(name)) => {
                    if lookup(&registry, &name).is_none() {
                        retry.remove(&name);
                        inflight.push(sunsubscribe(conn.clone(), name));
                    }
                }
            },
            Some(done) = inflight.next(), if !inflight.is_empty() => match done {
                Done::Subscribed(name, ok) => match lookup(&registry, &name) {
                    Some(ch) if ok => {
                        ch.confirmed();
                    }
                    // Waiters poll (bounded by the holder's TTL) until a retry works.
                    Some(_) => {
                        retry.insert(name);
                    }
                    None => {}
                },
                Done::Unsubscribed => {}
                Done::Pinged(ok) => {
                    pinging = false;
                    if !ok {
                        tracing::debug!("a cluster node did not answer a ping; waking every waiter");
                        for (name, ch) in channels(&registry) {
                            ch.lost();
                            retry.insert(name);
                        }
                    }
                }
            },
            push = pushes.recv() => {
                // The connection's task owns the sender; it ends only with the connection.
                let Some(push) = push else { return };
                match push.kind {
                    PushKind::SSubscribe => {
                        // Also sent when redis-rs resubscribes after a reconnect.
                        if let Some(ch) = push.data.first().and_then(text).and_then(|c| lookup(&registry, c)) {
                            ch.confirmed();
                        }
                    }
                    PushKind::SUnsubscribe => {
                        // Either our own unsubscribe, or the node dropped the channel
                        // because its slot moved away: then subscribe again (reaching the
                        // new owner) and let the waiters retry, a release may be missed.
                        if let Some(name) = push.data.first().and_then(text)
                            && let Some(ch) = lookup(&registry, name)
                        {
                            tracing::debug!(channel = %name, "node dropped a sharded subscription; subscribing again");
                            ch.lost();
                            inflight.push(ssubscribe(conn.clone(), name.to_owned()));
                        }
                    }
                    PushKind::Disconnection => {
                        tracing::debug!("a cluster node connection dropped; waking every waiter");
                        for (name, ch) in channels(&registry) {
                            ch.lost();
                            retry.insert(name);
                        }
                    }
                    _ => {}
                }
            }
            _ = retry_every.tick(), if !retry.is_empty() => {
                for name in retry.drain() {
                    if lookup(&registry, &name).is_some() {
                        inflight.push(ssubscribe(conn.clone(), name));
                    }
                }
            }
            _ = ping_every.tick() => {
                if !pinging && !registry.lock().expect("notifier lock").channels.is_empty() {
                    pinging = true;
                    inflight.push(ping(conn.clone()));
                }
            }
        }
    }
}
