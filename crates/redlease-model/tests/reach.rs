//! The checks are not vacuous: each reaches the rare outcomes it is about — a
//! hand-over taken without a round trip, one tried again because it came too late or
//! is not known to be current, a local hand-over, an acquire that finds its own token, a lost lease, a
//! stale holder's write refused by the fenced resource.

use redlease_model::checks::{self, Check};

fn reaches(check: Check, expected: &[&str]) {
    let report = checks::reach(&check);
    println!("{}: {}", check.name, report.summary());
    let wanted = checks::examples(&report.model);
    let listed: std::collections::BTreeSet<&str> = expected.iter().copied().collect();
    assert_eq!(wanted, listed, "{}: the outcomes it must reach", check.name);
    let reached: Vec<&str> = report.discoveries.iter().map(|(name, _)| *name).collect();
    for name in expected {
        assert!(reached.contains(name), "{}: never reached: {name}", check.name);
    }
}

#[test]
fn mutex_under_contention_reaches_every_kind_of_hand_over() {
    reaches(
        checks::mutex_contention(),
        &[
            "a hand-over is taken without a round trip",
            "a hand-over too late in its claim window is not relied on",
            "a lease is lost",
            "a local hand-over",
            "a stale hand-over is not relied on",
            "a stale holder's write is refused",
            "an acquire finds its own token",
        ],
    );
}

#[test]
fn election_reaches_a_retry_that_finds_its_own_token() {
    reaches(
        checks::election(),
        &["a lease is lost", "an acquire finds its own token"],
    );
}

#[test]
fn semaphore_reaches_a_lost_lease_and_a_hand_over_tried_again() {
    reaches(
        checks::semaphore(),
        &[
            "a hand-over not known to be current is not relied on",
            "a lease is lost",
        ],
    );
}

#[test]
fn semaphore_with_a_local_hand_over_reaches_it_a_stale_grant_and_its_own_token() {
    reaches(
        checks::semaphore_local(),
        &[
            "a hand-over not known to be current is not relied on",
            "a lease is lost",
            "a local hand-over",
            "an acquire finds its own token",
        ],
    );
}

#[test]
fn multi_lock_reaches_hand_overs_wake_ups_and_a_give_back() {
    reaches(
        checks::multi(),
        &[
            "a hand-over is taken without a round trip",
            "a lease is lost",
            "a multi-lock acquisition takes every name on a later attempt",
            "a multi-lock attempt that took every name too late gives them back",
            "a multi-lock's release hands a name to a plain waiter",
            "a release wakes a multi-lock waiter and hands the name to nobody",
            "a stale holder's write is refused",
            "an acquire finds its own token",
        ],
    );
}
