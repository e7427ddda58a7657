//! Runs checks by name and prints what the checker found.
//!
//! ```sh
//! cargo run -p redlease-model --release --example check                 # every CI check
//! cargo run -p redlease-model --release --example check -- long         # the longer run
//! cargo run -p redlease-model --release --example check -- mutex-extend no-reply-ordering
//! ```

use redlease_model::Variant;
use redlease_model::checks::{self, Check};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let variant = match args.get(1).map(String::as_str) {
        None | Some("real") => Variant::Real,
        Some("no-reply-ordering") => Variant::NoReplyOrdering,
        Some("set-nx-then-expire") => Variant::SetNxThenExpire,
        Some("get-then-del") => Variant::GetThenDel,
        Some("no-drift-margin") => Variant::NoDriftMargin,
        Some("no-idempotent-retry") => Variant::NoIdempotentRetry,
        Some("no-stale-grant-check") => Variant::NoStaleGrantCheck,
        Some("unstarted-mark") => Variant::UnstartedMark,
        Some("confirmed-grant-fence") => Variant::ConfirmedGrantFence,
        Some("multi-one-token") => Variant::MultiOneToken,
        Some(other) => {
            eprintln!("error: unknown variant {other}");
            std::process::exit(2);
        }
    };
    let selected: Vec<Check> = match args.first().map(String::as_str) {
        None | Some("ci") => checks::ci(),
        Some("long") => checks::long(),
        Some(name) => match checks::ci()
            .into_iter()
            .chain(checks::long())
            .find(|c| c.name == name)
        {
            Some(check) => vec![check],
            None => {
                eprintln!("error: unknown check {name}");
                std::process::exit(2);
            }
        },
    };
    let mut failed = false;
    for check in selected {
        println!("== {} ({})", check.name, check.about);
        let report = checks::run(check.model(variant), variant != Variant::Real);
        println!("{}", report.summary());
        for failure in report.failures() {
            failed = true;
            println!("{failure}");
        }
    }
    std::process::exit(i32::from(failed));
}
