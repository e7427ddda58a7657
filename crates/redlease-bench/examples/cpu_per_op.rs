//! Client CPU and heap allocations per uncontended lock+unlock (a new name each time),
//! for each contender, on one thread (a current-thread runtime: the connection's driver
//! task runs on it too). Deterministic enough to compare changes under callgrind, where
//! the bench's wall-clock figures drown in a noisy machine's load:
//!
//! ```text
//! cargo run --release -p redlease-bench --example cpu_per_op -- redis://127.0.0.1:6379 [ops] [raw,rslock,redlease]
//! valgrind --tool=callgrind target/release/examples/cpu_per_op URL 3000 redlease   # minus a run of 1000
//! ```
//!
//! `FUTURE_SIZES=1` also prints the size of redlease's `lock()` and `release()` futures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn cpu() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

async fn measure<F, Fut>(what: &str, ops: u64, mut op: F)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..200 {
        op(u64::MAX - i).await;
    }
    let (a0, b0, c0, t0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
        cpu(),
        Instant::now(),
    );
    for i in 0..ops {
        op(i).await;
    }
    let (a1, b1, c1, t1) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
        cpu(),
        Instant::now(),
    );
    let n = ops as f64;
    println!(
        "{what:10} {:7.2} µs cpu/op  {:7.2} µs wall/op  {:6.1} allocs/op  {:7.0} bytes/op",
        (c1 - c0).as_secs_f64() * 1e6 / n,
        (t1 - t0).as_secs_f64() * 1e6 / n,
        (a1 - a0) as f64 / n,
        (b1 - b0) as f64 / n,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let ops: u64 = args.next().map(|s| s.parse().unwrap()).unwrap_or(20_000);
    let only = args.next();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let want = |c: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == c));
        let ttl = Duration::from_secs(30);
        if want("raw") {
            let client = redis::Client::open(url.as_str()).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            let unlock = redis::Script::new(UNLOCK);
            measure("raw-redis", ops, |i| {
                let mut conn = conn.clone();
                let unlock = &unlock;
                async move {
                    let name = format!("cpu:raw:{i}");
                    let mut b = [0u8; 16];
                    getrandom::fill(&mut b).unwrap();
                    let token = format!("{:032x}", u128::from_le_bytes(b));
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(&name)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    assert!(ok.is_some());
                    let n: i64 = unlock.key(name).arg(token).invoke_async(&mut conn).await.unwrap();
                    assert_eq!(n, 1);
                }
            })
            .await;
        }
        if want("rslock") {
            let mgr = rslock::LockManager::new(vec![url.clone()]);
            measure("rslock", ops, |i| {
                let mgr = &mgr;
                async move {
                    let name = format!("cpu:rslock:{i}");
                    let lock = mgr.acquire_no_guard(name.as_bytes(), ttl).await.unwrap();
                    mgr.unlock(&lock).await;
                }
            })
            .await;
        }
        if want("redlease") {
            let client = redis::Client::open(url.as_str()).unwrap();
            let redlease = redlease::Client::builder(client).build().await.unwrap();
            if std::env::var_os("FUTURE_SIZES").is_some() {
                let m = redlease.mutex("size").unwrap();
                let lock = m.lock();
                eprintln!("lock() future: {} bytes", std::mem::size_of_val(&lock));
                drop(lock);
                let g = m.lock().await.unwrap();
                let rel = g.release();
                eprintln!("release() future: {} bytes", std::mem::size_of_val(&rel));
                rel.await.unwrap();
            }
            measure("redlease", ops, |i| {
                let redlease = &redlease;
                async move {
                    let name = format!("cpu:redlease:{i}");
                    let mutex = redlease
                        .mutex_with(&name, redlease::LeaseOptions::new().ttl(ttl))
                        .unwrap();
                    let guard = mutex.lock().await.unwrap();
                    guard.release().await.unwrap();
                }
            })
            .await;
        }
    });
}
