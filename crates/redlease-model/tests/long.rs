//! The longer run: the checks with more acquisitions or every fault at once. Minutes
//! and gigabytes each, so not in CI:
//!
//! ```sh
//! cargo test -p redlease-model --release --test long -- --ignored --nocapture --test-threads 1
//! ```

use redlease_model::Variant;
use redlease_model::checks::{self, Check};

fn holds(check: Check) {
    let report = checks::run(check.model(Variant::Real), false);
    println!("{}: {}", check.name, report.summary());
    let failures: Vec<String> = report
        .failures()
        .into_iter()
        .filter(|f| !f.starts_with("never reached"))
        .collect();
    assert!(failures.is_empty(), "{}:\n{}", check.name, failures.join("\n"));
}

fn long(name: &str) -> Check {
    checks::long()
        .into_iter()
        .find(|c| c.name == name)
        .expect("a long check")
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn mutex_every_fault() {
    holds(long("mutex-every-fault"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn mutex_contention_long() {
    holds(long("mutex-contention-long"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn mutex_lost_messages_long() {
    holds(long("mutex-lost-messages-long"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn election_long() {
    holds(long("election-long"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn semaphore_long() {
    holds(long("semaphore-long"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn multi_contention_long() {
    holds(long("multi-contention-long"));
}

#[test]
#[ignore = "the longer run (minutes, gigabytes): cargo test --release -- --ignored"]
fn multi_lost_messages_long() {
    holds(long("multi-lost-messages-long"));
}
