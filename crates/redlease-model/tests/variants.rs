//! The model bites: with one rule of the protocol removed, the same checker, within the
//! same bounds in which the real protocol passes, finds a counterexample — printed as a
//! trace (`cargo test -p redlease-model --test variants -- --nocapture`).

use redlease_model::checks;
use redlease_model::{Variant, property};

/// Runs `variant` in its check until a property fails; returns the trace of the
/// counterexample to the property the removed rule protects.
fn counterexample(variant: Variant) -> String {
    let (check, expected) = checks::for_variant(variant);
    let report = checks::run(check.model(variant), true);
    let failed: Vec<&str> = report.discoveries.iter().map(|(name, _)| *name).collect();
    let trace = report.trace(expected).unwrap_or_else(|| {
        panic!(
            "{variant}: no counterexample to \"{expected}\" in {} ({}); failed: {failed:?}",
            check.name,
            report.summary()
        )
    });
    println!(
        "== {variant}\n   check {}: {}\n{trace}",
        check.name,
        report.summary()
    );
    trace
}

#[test]
fn without_the_reply_ordering_rule_a_renewal_cuts_an_extended_lease_short() {
    let trace = counterexample(Variant::NoReplyOrdering);
    assert!(
        trace.contains("mutex_extend.lua(A1, ttl 5)") || trace.contains("ttl 5)"),
        "{trace}"
    );
    assert!(trace.contains("2 believe they hold at once"), "{trace}");
}

#[test]
fn set_nx_then_expire_leaves_a_lock_that_never_expires() {
    let trace = counterexample(Variant::SetNxThenExpire);
    assert!(trace.contains("CRASHES"), "{trace}");
    assert!(
        trace.contains("with NO TTL, and no one will ever release or renew"),
        "{trace}"
    );
}

#[test]
fn get_then_del_deletes_the_next_holders_lock() {
    let trace = counterexample(Variant::GetThenDel);
    assert!(trace.contains("GET key"), "{trace}");
    assert!(trace.contains("the release's delete (no compare)"), "{trace}");
    assert!(trace.contains("2 believe they hold at once"), "{trace}");
}

#[test]
fn without_the_drift_margin_a_slow_clock_outlives_the_key() {
    let trace = counterexample(Variant::NoDriftMargin);
    assert!(trace.contains("expires on the server"), "{trace}");
    assert!(trace.contains("2 believe they hold at once"), "{trace}");
}

#[test]
fn without_idempotent_retries_a_lost_reply_lies() {
    let trace = counterexample(Variant::NoIdempotentRetry);
    assert!(
        trace.contains("an acquire was told \"busy\" while its own token held the lock"),
        "{trace}"
    );
}

#[test]
fn without_the_stale_grant_check_a_stalled_waiter_takes_an_old_hand_over() {
    let trace = counterexample(Variant::NoStaleGrantCheck);
    assert!(trace.contains("reads hand-over"), "{trace}");
    assert!(trace.contains("2 believe they hold at once"), "{trace}");
}

#[test]
fn with_a_counter_not_started_for_the_mark_a_stalled_waiter_takes_an_old_hand_over() {
    let trace = counterexample(Variant::UnstartedMark);
    assert!(trace.contains("the counter is not started yet"), "{trace}");
    assert!(trace.contains("reads hand-over"), "{trace}");
    assert!(trace.contains("2 believe they hold at once"), "{trace}");
}

#[test]
fn confirming_an_unreliable_hand_over_keeps_a_fencing_token_below_the_holder_before() {
    let trace = counterexample(Variant::ConfirmedGrantFence);
    assert!(trace.contains("reads hand-over"), "{trace}");
    assert!(
        trace.contains("reply to its hand-over confirmation arrives: 1"),
        "{trace}"
    );
    assert!(
        trace.contains("believes it holds with a fencing token below one issued before it took the lock"),
        "{trace}"
    );
}

#[test]
fn a_multi_lock_with_one_token_for_all_its_attempts_frees_its_own_names_with_a_late_give_back() {
    let trace = counterexample(Variant::MultiOneToken);
    assert!(trace.contains("too late for a lease"), "{trace}");
    assert!(trace.contains("multi_release.lua(A1)"), "{trace}");
    assert!(trace.contains("2 believe they hold x at once"), "{trace}");
}

#[test]
fn every_broken_variant_has_a_test() {
    // The tests above, one per variant: a new variant needs one.
    assert_eq!(Variant::BROKEN.len(), 9);
    for variant in Variant::BROKEN {
        let (_, expected) = checks::for_variant(variant);
        let properties = [
            property::MUTUAL_EXCLUSION,
            property::FENCING,
            property::NO_ORPHAN,
            property::TRUTHFUL,
        ];
        assert!(properties.contains(&expected), "{variant}");
    }
}
