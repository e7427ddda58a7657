//! The lease engine against real Redis, at the points where the rewritten engine
//! differs from the previous one: an extend racing an automatic renewal (the ordered
//! lease state), renewal batches during a cluster resharding (redirects followed per
//! command), and a call's deadline bounding a request already in flight.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use redlease::{Error, LeaseOptions, LostReason};
use redlease_testkit::RedisCluster;
use tokio::sync::watch;

// ---------------------------------------------------------------------------------
// 1. An extend racing a renewal
// ---------------------------------------------------------------------------------

/// Whether `cmd` is an `EVALSHA` whose last argument is `last`.
fn is_evalsha_ending_with(cmd: &Cmd, last: &[u8]) -> bool {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect();
    args.first()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"EVALSHA"))
        && args.last() == Some(&last)
}

/// What the holding connection reports to the test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    /// Requests caught and held back (not yet sent).
    caught: usize,
    /// Held requests sent once let go, whose reply came back.
    answered: usize,
}

/// A command connection over a `MultiplexedConnection` that holds back, before sending,
/// every `EVALSHA` whose last argument is `ttl_ms` — with a plain mutex of that TTL,
/// the automatic renewal and nothing else: an acquire ends with the metadata
/// retention, an extend with its own TTL — until the test lets it go.
#[derive(Clone)]
struct HoldingRenewals {
    inner: MultiplexedConnection,
    ttl_ms: Arc<[u8]>,
    held: Arc<watch::Sender<Held>>,
    let_go: Arc<watch::Sender<bool>>,
}

/// How long a caught request is held back at least, whenever the test lets it go.
const HOLD_AT_LEAST: Duration = Duration::from_millis(500);
/// How long a caught request is held back at most if the test never lets it go (a
/// failed test must not hang).
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

impl HoldingRenewals {
    fn new(inner: MultiplexedConnection, ttl: Duration) -> Self {
        HoldingRenewals {
            inner,
            ttl_ms: ttl.as_millis().to_string().into_bytes().into(),
            held: Arc::new(watch::channel(Held::default()).0),
            let_go: Arc::new(watch::channel(false).0),
        }
    }

    /// Whether a request carrying `cmds` is held back.
    fn catches<'c>(&self, mut cmds: impl Iterator<Item = &'c Cmd>) -> bool {
        cmds.any(|cmd| is_evalsha_ending_with(cmd, &self.ttl_ms))
    }

    /// Holds a caught request back until the test lets it go, and for at least
    /// [`HOLD_AT_LEAST`].
    async fn hold(&self) {
        let caught = tokio::time::Instant::now();
        self.held.send_modify(|h| h.caught += 1);
        let mut let_go = self.let_go.subscribe();
        let _ = tokio::time::timeout(HOLD_AT_MOST, let_go.wait_for(|go| *go)).await;
        tokio::time::sleep_until(caught + HOLD_AT_LEAST).await;
    }

    fn answered(&self) {
        self.held.send_modify(|h| h.answered += 1);
    }
}

impl redlease::CommandConnection for HoldingRenewals {
    fn send<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let held = self.catches(std::iter::once(cmd));
            if held {
                self.hold().await;
            }
            let reply = cmd.query_async(&mut self.inner.clone()).await;
            if held {
                self.answered();
            }
            reply
        })
    }

    fn send_pipeline<'a>(&'a self, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<RedisResult<Value>>> {
        Box::pin(async move {
            let held = self.catches(pipe.cmd_iter());
            if held {
                self.hold().await;
            }
            let reply = pipe.query_async(&mut self.inner.clone()).await;
            if held {
                self.answered();
            }
            reply
        })
    }
}

/// A renewal for the old TTL is on its way when `extend(60 s)` goes out and lands after
/// it. Two holders of one lease's state, and no signal between them: the renewal must
/// neither shorten the lease on the server nor move `valid_until` past the server's
/// expiry.
async fn extend_racing_a_renewal(lock: &str) {
    let server = server();
    let ttl = Duration::from_secs(3);
    let conn = HoldingRenewals::new(raw(&server).await, ttl);
    let client = redlease::Client::builder(server.client())
        .connection(conn.clone())
        .build()
        .await
        .expect("client");
    let key = format!("redlease:{lock}");
    let mut inspect = raw(&server).await;
    let guard = client
        .mutex_with(lock, LeaseOptions::new().ttl(ttl))
        .unwrap()
        .lock()
        .await
        .unwrap();

    // The first automatic renewal (due a second after the acquire) is caught.
    let mut held = conn.held.subscribe();
    within(10.0, "the first renewal is sent and held back", async {
        held.wait_for(|h| h.caught >= 1).await.unwrap();
    })
    .await;
    let renewed_before = client.stats().leases_renewed;

    // Meanwhile the holder extends, straight through.
    within(10.0, "extend", guard.extend(Duration::from_secs(60)))
        .await
        .expect("extend while a renewal is on its way");
    let extended_pttl = pttl(&mut inspect, &key).await;
    assert!(
        extended_pttl > 55_000,
        "the extend reached the server first: PTTL {extended_pttl} ms"
    );

    // Now the stale renewal lands, and its reply is handled.
    conn.let_go.send_replace(true);
    within(10.0, "the held renewal is answered", async {
        held.wait_for(|h| h.answered >= 1).await.unwrap();
    })
    .await;
    eventually(10.0, "the renewal's reply is handled", || {
        let done = client.stats().leases_renewed > renewed_before;
        async move { done }
    })
    .await;

    let remaining = pttl(&mut inspect, &key).await;
    let asked = Instant::now();
    assert!(
        remaining > 50_000,
        "the stale renewal shortened the extended lease on the server: PTTL {remaining} ms"
    );
    let server_expiry = asked + Duration::from_millis(remaining as u64);
    assert!(
        guard.valid_until() <= server_expiry + Duration::from_millis(5),
        "valid_until is {:?} past the server's expiry (PTTL {remaining} ms)",
        guard.valid_until().saturating_duration_since(server_expiry)
    );

    // Past the renewal's 3 s, the lock is still held on the server.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let other = common::client(&server.url()).await;
    match other.mutex(lock).unwrap().try_lock().await {
        Err(Error::Contended { .. }) => {}
        Err(e) => panic!("another client's try_lock failed with {e}, not as contended"),
        Ok(_) => panic!("another client took the lock 4 s after the stale 3 s renewal"),
    }
    assert_eq!(guard.lease().lost_reason(), None);
    assert!(guard.is_held());
    assert_eq!(
        conn.held.borrow().caught,
        1,
        "only the one renewal used the old TTL"
    );
    guard.release().await.expect("release");
    assert!(!exists(&mut inspect, &key).await);
}

#[tokio::test]
async fn extend_racing_a_renewal_keeps_the_longer_lease_current_thread() {
    extend_racing_a_renewal("race-current-thread").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_racing_a_renewal_keeps_the_longer_lease_multi_thread() {
    extend_racing_a_renewal("race-multi-thread").await;
}

// ---------------------------------------------------------------------------------
// 2. Renewal batches during a resharding
// ---------------------------------------------------------------------------------

/// `(expiry as now + PTTL, PTTL)` of every key in `slot` on `node`, asked with `ASKING`
/// (the slot may be IMPORTING there).
async fn slot_expiries(conn: &mut MultiplexedConnection, slot: u16) -> Vec<(String, Instant, i64)> {
    let mut keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query_async(conn)
        .await
        .unwrap();
    keys.sort();
    let mut out = Vec::new();
    // The lock keys: the slot's fencing counter and floor are not renewed.
    for key in keys.into_iter().filter(|k| !k.starts_with("{redlease:fence")) {
        let (remaining,): (i64,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("PTTL")
            .arg(&key)
            .query_async(conn)
            .await
            .unwrap();
        let at = Instant::now() + Duration::from_millis(remaining.max(0) as u64);
        out.push((key, at, remaining));
    }
    out
}

/// Polls the client's renewal counters until `renewals` more leases were renewed than
/// in `from`; fails early, with the leases' state, when a lease is lost first.
async fn await_renewals(
    client: &redlease::Client,
    from: redlease::ClientStats,
    renewals: u64,
    guards: &[redlease::MutexGuard],
    what: &str,
) -> redlease::ClientStats {
    let started = Instant::now();
    loop {
        let now = client.stats();
        if now.leases_renewed >= from.leases_renewed + renewals {
            return now;
        }
        let lost: Vec<Option<LostReason>> = guards.iter().map(|g| g.lease().lost_reason()).collect();
        assert!(
            lost.iter().all(Option::is_none) && started.elapsed() < Duration::from_secs(20),
            "{what}: {} of {renewals} renewals in {:?}; leases lost: {lost:?}; stats {now:?}",
            now.leases_renewed - from.leases_renewed,
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three leases in one slot, renewed together in one pipeline per tick, while their
/// slot moves to another master: renewals answered `ASK` (keys already moved) and then
/// `MOVED` (slot reassigned) are followed per command, and no lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_renewals_follow_a_resharding() {
    let cluster = RedisCluster::start(3, 0).unwrap_or_else(|e| panic!("{e}"));
    let names = ["{mig}a", "{mig}b", "{mig}c"];
    let slot = cluster.slot_of("redlease:{mig}a").unwrap();
    for name in names {
        assert_eq!(cluster.slot_of(&format!("redlease:{name}")).unwrap(), slot);
    }
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let client = redlease::Client::cluster(cluster.urls())
        .await
        .expect("cluster client");
    // Renewed every 500 ms; taken back to back, so their renewals share every tick.
    let ttl = Duration::from_millis(1500);
    let mut guards = Vec::new();
    for name in names {
        let mutex = client.mutex_with(name, LeaseOptions::new().ttl(ttl)).unwrap();
        guards.push(within(10.0, "lock", mutex.lock()).await.unwrap());
    }
    let n = guards.len() as u64;

    // Two rounds to settle into one schedule (leases taken at slightly different
    // moments share ticks after at most two intervals), then two more in which each
    // tick carries all three leases.
    let warm_up = await_renewals(&client, client.stats(), 2 * n, &guards, "first renewals").await;
    let start = warm_up;
    let before = await_renewals(&client, start, 2 * n, &guards, "renewals before the migration").await;
    let (ticks, renewed) = (
        before.renewal_ticks - start.renewal_ticks,
        before.leases_renewed - start.leases_renewed,
    );
    eprintln!("before the migration: {before:?}");
    assert!(
        renewed >= n * ticks.saturating_sub(1) && ticks >= 1,
        "the renewals of the three leases share ticks: {renewed} renewals in {ticks} ticks"
    );

    // Move the keys: from now on the old owner answers ASK for every one of them.
    let migration = cluster.begin_migration(slot, to).unwrap();
    let moved = cluster.migrate_keys(&migration).unwrap();
    assert!(
        (names.len() + 1..=names.len() + 2).contains(&moved),
        "each lock key, and the slot's fencing floor and counter (unless its 100 ms ran out): {moved}"
    );
    let mut importing = raw(cluster.master(to)).await;
    let at_move = slot_expiries(&mut importing, slot).await;
    assert_eq!(
        at_move.len(),
        names.len(),
        "the lock keys are on the importing node: {at_move:?}"
    );
    let moved_at = client.stats();
    let asked = await_renewals(
        &client,
        moved_at,
        3 * n,
        &guards,
        "renewals through ASK while the slot is importing",
    )
    .await;
    eprintln!("while importing: {asked:?}");
    let (ticks, trips) = (
        asked.renewal_ticks - moved_at.renewal_ticks,
        asked.renewal_round_trips - moved_at.renewal_round_trips,
    );
    assert!(
        trips >= ticks + 2,
        "ticks went to the old owner and then, behind ASKING, to the new one: {trips} round trips in {ticks} ticks"
    );
    let refreshed = slot_expiries(&mut importing, slot).await;
    assert_eq!(refreshed.len(), at_move.len(), "{refreshed:?}");
    for ((key, then, _), (key2, now, remaining)) in at_move.iter().zip(&refreshed) {
        assert_eq!(key, key2);
        assert!(
            *remaining > 0 && *now > *then + Duration::from_millis(250),
            "renewals moved the expiry of {key} on the importing node forward: \
             PTTL now {remaining} ms, moved by {:?}",
            now.saturating_duration_since(*then)
        );
    }

    // The slot changes owner: renewals are answered MOVED, then go to the new owner.
    cluster.finish_migration(&migration).unwrap();
    let finished = client.stats();
    let after = await_renewals(&client, finished, 2 * n, &guards, "renewals after the move").await;
    eprintln!("after the move: {after:?}");
    assert_eq!(after.leases_lost_by_renewal, 0);
    let mut owner = raw(cluster.master(to)).await;
    for guard in guards {
        assert!(guard.is_held(), "{} is held", guard.name());
        assert_eq!(guard.lease().lost_reason(), None, "{}", guard.name());
        let key = guard.key().to_owned();
        assert!(pttl(&mut owner, &key).await > 0, "{key} lives on the new owner");
        within(10.0, "release", guard.release())
            .await
            .unwrap_or_else(|e| panic!("release of {key}: {e}"));
        assert!(!exists(&mut owner, &key).await, "{key} released");
    }
}

// ---------------------------------------------------------------------------------
// 3. A call's deadline bounds the request in flight
// ---------------------------------------------------------------------------------

/// `lock_timeout(300 ms)` on a server whose replies are held back: the call ends at its
/// deadline, not at the connection's reply timeout (or never, without one), with an
/// "unavailable" error — the lock was not refused, Redis did not answer — and the
/// acquisition that did land on the server is compare-and-deleted in the background.
async fn a_stalled_server_fails_lock_timeout_at_its_deadline(lock: &str, reply_timeout: bool) {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = if reply_timeout {
        // The default reply timeout (2 s) and retry window (3 s).
        common::client(&proxy.url()).await
    } else {
        redlease::Client::builder(redis::Client::open(proxy.url()).unwrap())
            .response_timeout(None)
            .build()
            .await
            .expect("client")
    };
    let mutex = client.mutex(lock).unwrap();
    let key = format!("redlease:{lock}");
    let mut inspect = raw(&server).await;

    proxy.hold_replies();
    let started = Instant::now();
    let outcome = within(
        10.0,
        "lock_timeout(300 ms) returns while the server looks stalled",
        mutex.lock_timeout(Duration::from_millis(300)),
    )
    .await;
    let took = started.elapsed();
    let err = match outcome {
        Ok(_) => panic!("acquired although no reply came back"),
        Err(e) => e,
    };
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1500),
        "lock_timeout(300 ms) returned after {took:?} (reply timeout: {reply_timeout}): {err}"
    );
    assert!(err.is_unavailable(), "Redis did not answer: {err}");
    assert!(!err.is_timeout(), "the lock was never found busy: {err}");
    assert!(
        err.to_string()
            .contains("no reply from redis before the call's deadline"),
        "{err}"
    );

    // The acquire landed (requests still went through): it took a fencing token, which
    // left the fencing counter behind (the lock itself may already be released again by
    // the cleanup, whose request goes through too).
    let keys = all_keys(&mut inspect).await;
    assert!(
        keys.iter().any(|(k, _)| k.starts_with("{redlease:fence")),
        "the acquire whose reply was held back landed: {keys:?}"
    );
    // Once Redis is heard again nothing of it is left.
    proxy.release_replies();
    eventually(10.0, "the acquisition that landed is removed", || {
        let mut conn = inspect.clone();
        let key = key.clone();
        async move { !exists(&mut conn, &key).await }
    })
    .await;
    // Above any fencing token the attempt that landed may have been given. (It took
    // the lock with a pipelined INCR of a counter that had not been started yet, so it
    // got no usable token: the slot may have no mark at all.)
    let landed = mutex.status().await.unwrap().last_fence;
    let guard = within(
        10.0,
        "lock after recovery",
        mutex.lock_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("the lock is free again");
    assert!(
        Some(guard.fence()) > landed,
        "fence {} follows the {landed:?} of the attempt that landed",
        guard.fence()
    );
    guard.release().await.unwrap();
    assert!(!exists(&mut inspect, &key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_bounds_a_request_in_flight() {
    a_stalled_server_fails_lock_timeout_at_its_deadline("stalled-default", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_bounds_a_request_in_flight_without_a_reply_timeout() {
    a_stalled_server_fails_lock_timeout_at_its_deadline("stalled-no-timeout", false).await;
}

/// The contrast: Redis answers, the lock is held by another client — the same call
/// ends at its deadline with a timeout, not an "unavailable" error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_fails_lock_timeout_as_a_timeout() {
    let server = server();
    let holder = client(&server.url()).await;
    let waiter = client(&server.url()).await;
    let guard = holder.mutex("busy").unwrap().lock().await.unwrap();
    let started = Instant::now();
    let outcome = within(
        10.0,
        "lock_timeout(300 ms) on a held lock",
        waiter
            .mutex("busy")
            .unwrap()
            .lock_timeout(Duration::from_millis(300)),
    )
    .await;
    let took = started.elapsed();
    let err = match outcome {
        Ok(_) => panic!("acquired a lock held by another client"),
        Err(e) => e,
    };
    assert!(err.is_timeout(), "the lock stayed busy: {err}");
    assert!(!err.is_unavailable(), "Redis answered: {err}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "waited {took:?}"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------------
// 4. A lease confirmed by a retried request runs from the retry
// ---------------------------------------------------------------------------------

/// An acquire whose requests go unanswered for longer than the lease, then succeed on
/// a retry, must hand back a lease that runs from that retry — not a guard that is
/// dead on arrival (as the torture run found during slot migrations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_answered_after_retries_runs_its_lease_from_the_retry() {
    let server = server();
    let proxy = Proxy::start(server.addr()).await.unwrap();
    let client = impatient_client(&proxy.url(), Duration::from_millis(250), Duration::from_secs(3)).await;
    let ttl = Duration::from_secs(1);
    let mutex = client
        .mutex_with("retried", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let mut inspect = raw(&server).await;

    proxy.hold_requests();
    let acquire = tokio::spawn(async move { mutex.lock().await });
    // Longer than the lease: the first attempts time out and are retried.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.release_requests();
    let guard = within(10.0, "the retried acquire", acquire)
        .await
        .unwrap()
        .expect("acquired");
    let returned = Instant::now();
    assert!(
        guard.is_held(),
        "a guard just handed back is held (valid_until {:?} from now)",
        guard.valid_until().checked_duration_since(returned)
    );
    assert_eq!(guard.lease().lost_reason(), None);
    let left = pttl(&mut inspect, "redlease:retried").await;
    let believed = guard
        .valid_until()
        .checked_duration_since(Instant::now())
        .unwrap_or_default();
    assert!(
        believed <= Duration::from_millis(left.max(0) as u64 + 5),
        "the client believes {believed:?}, the server keeps {left} ms"
    );
    // And it stays held: the renewal keeps it, nothing fires.
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held());
    assert_eq!(guard.lease().lost_reason(), None);
    guard.release().await.unwrap();
}

// ---------------------------------------------------------------------------------
// 5. A release held up past the lease still tells released from lost
// ---------------------------------------------------------------------------------

/// While a slot migrates, a read share's release (which names two keys) is refused
/// with TRYAGAIN until the migration ends, but its renewal (one key) follows ASK. The
/// lease must be renewed while the release waits, so that the release — landing after
/// the share's original lease would have run out — still finds the share and succeeds,
/// instead of reporting a loss that never happened (as the torture run's cluster phase
/// found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_held_up_by_a_migration_still_succeeds() {
    let cluster = RedisCluster::start(3, 0).unwrap_or_else(|e| panic!("{e}"));
    let slot = cluster.slot_of("redlease:{held-up}").unwrap();
    let from = cluster.master_of_slot(slot).unwrap();
    let to = (from + 1) % 3;
    let client = redlease::Client::cluster(cluster.urls())
        .await
        .expect("cluster client");
    let ttl = Duration::from_millis(1000);
    let rwlock = client
        .rwlock_with("{held-up}", LeaseOptions::new().ttl(ttl))
        .unwrap();
    let reader = within(10.0, "read", rwlock.read()).await.unwrap();

    let migration = cluster.begin_migration(slot, to).unwrap();
    assert!(cluster.migrate_keys(&migration).unwrap() >= 1, "the share moved");
    let started = Instant::now();
    let release = tokio::spawn(async move { reader.release().await });
    // Longer than the share's lease: only renewals keep it meanwhile.
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert!(
        !release.is_finished(),
        "the release waits for the migration (TRYAGAIN)"
    );
    cluster.finish_migration(&migration).unwrap();
    let outcome = within(10.0, "the release after the migration", release)
        .await
        .unwrap();
    assert!(
        outcome.is_ok(),
        "released after {:?}, though held up: {outcome:?}",
        started.elapsed()
    );
    let status = within(10.0, "status", rwlock.status()).await.unwrap();
    assert_eq!(status.readers, 0, "the share is gone: {status:?}");
}
