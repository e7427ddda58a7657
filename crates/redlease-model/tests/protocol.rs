//! The real protocol, checked in every state each check can reach: mutual exclusion of
//! belief, fencing, no orphan lock, and truthful acquire answers all hold.
//!
//! These are exhaustive within their bounds (`redlease_model::checks`); each prints the
//! number of states it visited (`cargo test -p redlease-model -- --nocapture`).

use redlease_model::Variant;
use redlease_model::checks::{self, Check};

/// Visits every state `check` can reach under the real protocol and asserts that no
/// property fails.
fn holds(check: Check, at_least: usize) {
    let report = checks::run(check.model(Variant::Real), false);
    println!("{}: {}", check.name, report.summary());
    let failures: Vec<String> = report
        .failures()
        .into_iter()
        .filter(|f| !f.starts_with("never reached"))
        .collect();
    assert!(failures.is_empty(), "{}:\n{}", check.name, failures.join("\n"));
    // The check explored what it is sized for (a model change that cut the state
    // space down would make the check vacuous).
    assert!(
        report.unique >= at_least,
        "{}: only {} distinct states, expected at least {at_least}",
        check.name,
        report.unique
    );
}

#[test]
fn mutex_under_contention() {
    holds(checks::mutex_contention(), 1_000_000);
}

#[test]
fn mutex_with_an_extend_racing_the_renewals() {
    holds(checks::mutex_extend(), 1_000_000);
}

#[test]
fn mutex_with_lost_messages_and_retries() {
    holds(checks::mutex_lost_messages(), 1_000_000);
}

#[test]
fn mutex_with_a_crashing_client() {
    holds(checks::mutex_crash(), 500_000);
}

#[test]
fn mutex_with_the_fencing_counter_expiring() {
    holds(checks::mutex_counter(), 1_000_000);
}

#[test]
fn election() {
    holds(checks::election(), 500_000);
}

#[test]
fn semaphore() {
    holds(checks::semaphore(), 500_000);
}

#[test]
fn semaphore_with_a_local_hand_over() {
    holds(checks::semaphore_local(), 3_000_000);
}

#[test]
fn multi_lock_beside_a_plain_mutex_of_one_of_its_names() {
    holds(checks::multi(), 1_000_000);
}
