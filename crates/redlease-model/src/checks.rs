//! The checks: each a kind of lock within bounds that let the checker visit every
//! reachable state in seconds. Each check enables the faults its part of the protocol
//! is about; together they cover every rule. [`long`] widens them for a longer run.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::config::{Bounds, Kind, Variant};
use crate::model::{Action, LockModel, State, property};

/// A named configuration of the model.
#[derive(Clone, Debug)]
pub struct Check {
    pub name: &'static str,
    /// What it exercises.
    pub about: &'static str,
    pub kind: Kind,
    pub bounds: Bounds,
}

impl Check {
    /// The model of this check under `variant`.
    pub fn model(&self, variant: Variant) -> LockModel {
        LockModel::new(self.kind, variant, self.bounds.clone())
    }
}

/// The semaphore's limit in the checks: two permits among three clients.
pub const SEMAPHORE: Kind = Kind::Semaphore { limit: 2 };

/// The plain mutex under contention: two clients, three acquisitions, hand-overs
/// by release and local hand-overs, renewals, drops, clock drift, fenced writes.
pub fn mutex_contention() -> Check {
    Check {
        name: "mutex-contention",
        about: "three acquisitions by two clients: hand-overs, renewals, drops, drift, fenced writes",
        kind: Kind::Mutex,
        bounds: Bounds {
            writes: true,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// The plain mutex with an explicit extend racing the renewals.
pub fn mutex_extend() -> Check {
    Check {
        name: "mutex-extend",
        about: "three acquisitions by two clients, an extend racing the renewals",
        kind: Kind::Mutex,
        bounds: Bounds {
            extends: 1,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// The plain mutex with a lost message, a timed-out request (retried) and an
/// acquisition that gives up.
pub fn mutex_lost_messages() -> Check {
    Check {
        name: "mutex-lost-messages",
        about: "a lost request, reply or hand-over; a retried request; an acquire that gives up",
        kind: Kind::Mutex,
        bounds: Bounds {
            losses: 1,
            timeouts: 1,
            giveups: 1,
            ..Bounds::acquisitions(&[1, 1])
        },
    }
}

/// The plain mutex with a crashing client.
pub fn mutex_crash() -> Check {
    Check {
        name: "mutex-crash",
        about: "three acquisitions by two clients, one of which crashes",
        kind: Kind::Mutex,
        bounds: Bounds {
            crashes: 1,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// The plain mutex under contention with the fencing counter expiring (it lives 100
/// ms: it does between most acquisitions).
pub fn mutex_counter() -> Check {
    Check {
        name: "mutex-counter",
        about: "three acquisitions by two clients, the fencing counter key expiring",
        kind: Kind::Mutex,
        bounds: Bounds {
            counter_losses: 1,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// Leader election.
pub fn election() -> Check {
    Check {
        name: "election",
        about: "three campaigns by two candidates, a lost message, a retried request",
        kind: Kind::Election,
        bounds: Bounds {
            losses: 1,
            timeouts: 1,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// The semaphore: two permits, three clients.
pub fn semaphore() -> Check {
    Check {
        name: "semaphore",
        about: "two permits among three clients, drift, renewals, drops",
        kind: SEMAPHORE,
        bounds: Bounds::acquisitions(&[1, 1, 1]),
    }
}

/// The semaphore's local hand-over: one permit; client `A` acquires twice — its second
/// acquisition is the task of the same client that the first holder's permit is handed
/// to (`sem_handoff.lua`) — against client `B`; a request may time out and be retried.
pub fn semaphore_local() -> Check {
    Check {
        name: "semaphore-local",
        about: "one permit, a local hand-over racing another client, a retried request",
        kind: Kind::Semaphore { limit: 1 },
        bounds: Bounds {
            timeouts: 1,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// The multi-lock over `x` and `y` (client `A`, two attempts: each takes a fresh token)
/// beside a plain mutex of `x` (client `B`, one acquisition): the plain holder keeps the
/// multi-lock out and the other way round, a release hands `x` to a plain waiter or wakes
/// the multi-lock's, an acquisition that gives up, fenced writes to each name's
/// resource.
pub fn multi() -> Check {
    Check {
        name: "multi",
        about: "a multi-lock over x and y (two attempts) beside a plain mutex of x: hand-overs, wake-ups, a give-up, fenced writes",
        kind: Kind::Multi,
        bounds: Bounds {
            giveups: 1,
            writes: true,
            ..Bounds::acquisitions(&[2, 1])
        },
    }
}

/// Every check CI runs.
pub fn ci() -> Vec<Check> {
    vec![
        mutex_contention(),
        mutex_extend(),
        mutex_lost_messages(),
        mutex_crash(),
        mutex_counter(),
        election(),
        semaphore(),
        semaphore_local(),
        multi(),
    ]
}

/// The longer run: the checks with more at once. Minutes and gigabytes each (see
/// docs/model.md).
pub fn long() -> Vec<Check> {
    vec![
        Check {
            name: "mutex-every-fault",
            about: "two acquisitions, with every fault at once",
            kind: Kind::Mutex,
            bounds: Bounds {
                losses: 1,
                timeouts: 1,
                giveups: 1,
                crashes: 1,
                counter_losses: 1,
                extends: 1,
                ..Bounds::acquisitions(&[1, 1])
            },
        },
        Check {
            name: "mutex-contention-long",
            about: "three acquisitions by two clients, an extend, the counter expiring, fenced writes",
            kind: Kind::Mutex,
            bounds: Bounds {
                counter_losses: 1,
                extends: 1,
                ..mutex_contention().bounds
            },
        },
        Check {
            name: "mutex-lost-messages-long",
            about: "three acquisitions by two clients, a lost message, a retried request",
            kind: Kind::Mutex,
            bounds: Bounds {
                losses: 1,
                timeouts: 1,
                ..Bounds::acquisitions(&[2, 1])
            },
        },
        Check {
            name: "election-long",
            about: "three campaigns by two candidates, a lost message, a retried request, an extend",
            kind: Kind::Election,
            bounds: Bounds {
                extends: 1,
                ..election().bounds
            },
        },
        Check {
            name: "multi-contention-long",
            about: "a multi-lock (three attempts) beside a plain mutex of x (two acquisitions), fenced writes",
            kind: Kind::Multi,
            bounds: Bounds {
                writes: true,
                ..Bounds::acquisitions(&[3, 2])
            },
        },
        Check {
            name: "multi-lost-messages-long",
            about: "a multi-lock beside a plain mutex of x, a lost message, a retried request, a give-up",
            kind: Kind::Multi,
            bounds: Bounds {
                losses: 1,
                timeouts: 1,
                giveups: 1,
                ..Bounds::acquisitions(&[2, 1])
            },
        },
        Check {
            name: "semaphore-long",
            about: "two permits among three clients, a lost message and a retried request",
            kind: SEMAPHORE,
            bounds: Bounds {
                losses: 1,
                timeouts: 1,
                ..semaphore().bounds
            },
        },
    ]
}

/// The check a broken variant is run under — the same bounds in which the real
/// protocol passes — and the property it breaks.
pub fn for_variant(variant: Variant) -> (Check, &'static str) {
    match variant {
        Variant::Real => (mutex_contention(), property::MUTUAL_EXCLUSION),
        Variant::NoReplyOrdering => (mutex_extend(), property::MUTUAL_EXCLUSION),
        Variant::SetNxThenExpire => (mutex_crash(), property::NO_ORPHAN),
        Variant::GetThenDel => (mutex_contention(), property::MUTUAL_EXCLUSION),
        Variant::NoDriftMargin => (mutex_contention(), property::MUTUAL_EXCLUSION),
        Variant::NoIdempotentRetry => (mutex_lost_messages(), property::TRUTHFUL),
        Variant::NoStaleGrantCheck => (mutex_contention(), property::MUTUAL_EXCLUSION),
        Variant::UnstartedMark => (mutex_counter(), property::MUTUAL_EXCLUSION),
        Variant::ConfirmedGrantFence => (mutex_contention(), property::FENCING),
        Variant::MultiOneToken => (multi(), property::MUTUAL_EXCLUSION),
    }
}

/// What a run of the checker found.
pub struct Report {
    pub model: LockModel,
    /// States visited, and how many were distinct.
    pub states: usize,
    pub unique: usize,
    pub elapsed: Duration,
    /// Every property with a discovery: a counterexample to an `always` property, an
    /// example of a `sometimes` one.
    pub discoveries: Vec<(&'static str, Path<State, Action>)>,
}

impl Report {
    /// The counterexample to `property`, as a readable trace.
    pub fn trace(&self, property: &str) -> Option<String> {
        self.discoveries
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, path)| crate::trace::render(&self.model, path))
    }

    /// The properties that must hold and do not, and the `sometimes` properties never
    /// reached.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for p in self.model.properties() {
            let found = self.discoveries.iter().any(|(name, _)| *name == p.name);
            match p.expectation {
                Expectation::Sometimes if !found => {
                    failures.push(format!("never reached: {}", p.name));
                }
                Expectation::Sometimes => {}
                _ if found => failures.push(format!(
                    "{} does not hold:\n{}",
                    p.name,
                    self.trace(p.name).expect("found")
                )),
                _ => {}
            }
        }
        failures
    }

    /// One line: the model, its bounds, and what the run cost.
    pub fn summary(&self) -> String {
        format!(
            "{:?} / {}: {} states ({} distinct) in {:.1?}, bounds {:?}",
            self.model.kind, self.model.variant, self.states, self.unique, self.elapsed, self.model.bounds
        )
    }
}

/// The `sometimes` properties of `model`: outcomes a check must reach, so that it is
/// not vacuous.
pub fn examples(model: &LockModel) -> BTreeSet<&'static str> {
    model
        .properties()
        .iter()
        .filter(|p| p.expectation == Expectation::Sometimes)
        .map(|p| p.name)
        .collect()
}

/// Runs the checker on `check` noting rare outcomes, until it has reached each of its
/// `sometimes` properties (or visited every state).
pub fn reach(check: &Check) -> Report {
    let model = check.model(Variant::Real).tracking(true);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let wanted = examples(&model);
    let checker = model
        .clone()
        .checker()
        .threads(threads)
        .finish_when(HasDiscoveries::AllOf(wanted))
        .spawn_bfs()
        .join();
    let mut discoveries: Vec<_> = checker.discoveries().into_iter().collect();
    discoveries.sort_by_key(|(name, _)| *name);
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        elapsed: started.elapsed(),
        discoveries,
        model,
    }
}

/// Runs the checker over every state `model` can reach (breadth first, on every
/// core), or — `first_failure` — until a property that must hold does not.
pub fn run(model: LockModel, first_failure: bool) -> Report {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let mut builder = model.clone().checker().threads(threads);
    if first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let mut discoveries: Vec<_> = checker.discoveries().into_iter().collect();
    discoveries.sort_by_key(|(name, _)| *name);
    Report {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        elapsed: started.elapsed(),
        discoveries,
        model,
    }
}
