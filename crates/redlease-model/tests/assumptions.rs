//! What the model assumes of its environment, and what breaks without it.
//!
//! The plain mutex takes a free lock with `SET NX PX` and `INCR` pipelined
//! (`Mutex::acquire_free`). The model runs the two commands as one step: they reach
//! Redis together, and Redis executes the commands of one read before it serves
//! another client. Redis does not promise that a pipeline runs as one step, though: if
//! the `INCR` arrived after the lock's TTL had run out and another client had taken the
//! lock meanwhile, the fencing token would go to the stale holder, above the new
//! holder's. This test shows the checker finds exactly that once the assumption is
//! dropped.

use redlease_model::checks;
use redlease_model::{Variant, property};

#[test]
fn a_pipeline_split_past_the_lease_issues_a_fencing_token_out_of_order() {
    let check = checks::mutex_contention();
    let mut model = check.model(Variant::Real);
    model.pipeline_back_to_back = false;
    let report = checks::run(model, true);
    let trace = report
        .trace(property::FENCING)
        .unwrap_or_else(|| panic!("no counterexample: {}", report.summary()));
    println!("== the real protocol, a pipeline's INCR delayed past the lease\n{trace}");
    assert!(trace.contains("the INCR of"), "{trace}");
    assert!(trace.contains("expires on the server"), "{trace}");
    assert!(
        trace.contains("a fencing token went to a client other than the one that took the lock last"),
        "{trace}"
    );
}
