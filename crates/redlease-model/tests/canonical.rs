//! The checker's states are renumbered (fencing tokens replaced by their order): that
//! must change nothing. Along many pseudo-random paths, the model that renumbers and
//! the one that does not reach the same states, up to the renumbering.

use redlease_model::canonical::{canonical_fences, canonical_msg};
use redlease_model::checks;
use redlease_model::{Action, State, Variant};
use stateright::Model;

/// A small deterministic generator (no dependency, the same paths on every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }
}

fn renumbered(s: &State) -> State {
    let mut s = s.clone();
    canonical_fences(&mut s);
    s
}

#[test]
fn renumbering_fencing_tokens_changes_nothing() {
    let mut rng = Lcg(0x2545_f491_4f6c_dd1d);
    let mut steps = 0;
    for check in checks::ci() {
        for variant in std::iter::once(Variant::Real).chain(Variant::BROKEN) {
            let model = check.model(variant);
            let plain = redlease_model::LockModel {
                canonical: false,
                ..model.clone()
            };
            for _ in 0..40 {
                let mut state = model.init_states().remove(0);
                let mut raw = state.clone();
                for _ in 0..80 {
                    let mut actions = Vec::new();
                    model.actions(&state, &mut actions);
                    let action = actions[rng.below(actions.len())];
                    // The same step in the plain model: a message is named by its index.
                    let translate = |i: usize| {
                        let m = state.net[i];
                        raw.net
                            .iter()
                            .position(|r| canonical_msg(&raw, r) == m)
                            .unwrap_or_else(|| panic!("{m:?} not in flight in the plain model: {raw:?}"))
                    };
                    let raw_action = match action {
                        Action::Deliver(i) => Action::Deliver(translate(i)),
                        Action::Lose(i) => Action::Lose(translate(i)),
                        other => other,
                    };
                    state = model.next_state(&state, action).expect("a next state");
                    raw = plain.next_state(&raw, raw_action).expect("a next state");
                    assert_eq!(
                        renumbered(&raw),
                        state,
                        "{} / {variant}: after {action:?}",
                        check.name
                    );
                    steps += 1;
                }
            }
        }
    }
    assert!(steps > 10_000);
}
