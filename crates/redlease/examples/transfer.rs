//! Money moved between three accounts by 12 tasks on two clients, each transfer holding
//! both of its accounts at once — listed in either order, so a lock that held one
//! account while waiting for the other would deadlock. The total never changes, and each
//! account's balance is written with that account's own fencing token.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p redlease --example transfer
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlease::FencingToken;

const ACCOUNTS: [&str; 3] = ["examples:alice", "examples:bob", "examples:carol"];
const TASKS: usize = 12;
const TRANSFERS: usize = 20;

/// The protected resource: balances that refuse a write fenced by an older token than
/// the newest they saw, as a database with a fencing column would. (Its own mutex only
/// makes each single read or write atomic, as a database's would.)
#[derive(Default)]
struct Ledger {
    accounts: HashMap<&'static str, (i64, FencingToken)>,
}

impl Ledger {
    fn balance(&self, account: &str) -> i64 {
        self.accounts.get(account).map_or(100, |(balance, _)| *balance)
    }

    fn write(&mut self, account: &'static str, balance: i64, fence: FencingToken) {
        let (stored, newest) = self
            .accounts
            .entry(account)
            .or_insert((100, FencingToken::new(0)));
        assert!(fence >= *newest, "a stale holder of {account} was let through");
        *stored = balance;
        *newest = fence;
    }

    fn total(&self) -> i64 {
        ACCOUNTS.iter().map(|a| self.balance(a)).sum()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let clients = [
        redlease::Client::connect(&url).await?,
        redlease::Client::connect(&url).await?,
    ];
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        // From one account to the next, or back: every pair in both orders.
        let (from, to) = (ACCOUNTS[task % 3], ACCOUNTS[(task + 1 + task / 3 % 2) % 3]);
        let lock = clients[task % 2].multi_lock([from, to])?;
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..TRANSFERS {
                let both = lock.lock_timeout(Duration::from_secs(30)).await?;
                let &[from_fence, to_fence] = both.fences() else {
                    unreachable!("one fencing token per name")
                };
                // Read both balances, let other tasks run, write both back: without the
                // lock, transfers would overwrite each other and money would vanish.
                let (a, b) = {
                    let ledger = ledger.lock().expect("ledger");
                    (ledger.balance(from), ledger.balance(to))
                };
                tokio::task::yield_now().await;
                {
                    let mut ledger = ledger.lock().expect("ledger");
                    ledger.write(from, a - 1, from_fence);
                    ledger.write(to, b + 1, to_fence);
                }
                both.release().await?;
            }
            Ok::<_, redlease::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let ledger = ledger.lock().expect("ledger");
    for account in ACCOUNTS {
        let (balance, fence) = ledger.accounts[account];
        println!("{account}: {balance} (last fencing token {fence})");
    }
    println!("total {} after {} transfers", ledger.total(), TASKS * TRANSFERS);
    assert_eq!(ledger.total(), 300);
    Ok(())
}
