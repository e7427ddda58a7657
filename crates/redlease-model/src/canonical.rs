//! Canonical form: states that behave the same are made one state, so that the checker
//! visits each only once (see docs/model.md, "Abstractions").

use crate::client::Phase;
use crate::config::{Fence, NAMES};
use crate::model::{LockModel, State};
use crate::net::{Msg, Reply, Req, Slot, Waiter};
use crate::server::{Counter, SMALL};

impl LockModel {
    /// Canonical form, so that states that behave the same are one state: requests
    /// nobody waits for any more are sent-and-forgotten, and dropped once they can
    /// change nothing; replies nobody waits for and hand-overs nobody can take are
    /// dropped; the network is sorted.
    pub(crate) fn normalize(&self, s: &mut State) {
        for i in 0..s.net.len() {
            if let Msg::Request { from, slot, req, .. } = s.net[i]
                && slot != Slot::Background
                && !s.clients[usize::from(from)].awaits(slot, req.token())
            {
                s.net[i] = Msg::Request {
                    from,
                    slot: Slot::Background,
                    age: 0,
                    req,
                };
            }
        }
        // A request that acts only on a lock its token holds (an extend, a release, a
        // hand-over) and whose reply nobody reads changes nothing once its tokens can
        // never hold the lock again. Acquires, and the unconditional commands of the
        // broken variants, always stay.
        let inert: Vec<bool> = s
            .net
            .iter()
            .map(|m| match *m {
                Msg::Request {
                    slot: Slot::Background,
                    req,
                    ..
                } => match req {
                    Req::Get { .. } => true,
                    Req::Extend { token, .. } | Req::Release { token, .. } => !s.may_hold(token),
                    Req::HandOff { old, new } => !s.may_hold(old) && !s.may_hold(new),
                    // Leaves a registration: nothing to do once none is left or
                    // can be made.
                    Req::MultiLeave { reg } => {
                        !s.server.names.iter().any(|name| name.waiters.contains(&Waiter::Wake(reg)))
                            && !s.net.iter().any(|m| {
                                matches!(m, Msg::Request { req: Req::MultiAcquire { reg: r, .. }, .. } if *r == reg)
                            })
                    }
                    Req::Pipeline { .. }
                    | Req::MultiAcquire { .. }
                    | Req::Acquire { .. }
                    | Req::ReleaseUnchecked { .. }
                    | Req::Expire { .. } => false,
                },
                _ => false,
            })
            .collect();
        let mut inert = inert.into_iter();
        s.net.retain(|_| !inert.next().expect("one per message"));
        let clients = &s.clients;
        s.net.retain(|m| match *m {
            Msg::Reply { to, slot, token, .. } => clients[usize::from(to)].awaits(slot, token),
            Msg::Grant { to, .. } => {
                matches!(clients[usize::from(to.client)].phase, Phase::Acquiring(a) if a.token == to)
            }
            Msg::Request { .. } => true,
        });
        s.net.sort();
        if self.canonical {
            canonical_fences(s);
        }
    }
}

/// Renumbers the fencing tokens in `s` to the smallest numbers in the same order,
/// [`NAMES`]` + 1` apart: every script only compares them, or issues one more than the
/// counter — a multi-lock's acquire one per name — which then land between the counter
/// and the next value above it, as they do in Redis, where the floor is far above the
/// counter. Runs that differ only by how many tokens were issued on the way become one.
///
/// [`SMALL`] (a counter not started yet, read as a mark) stays as it is: the scripts produce it
/// as a constant, so it must mean the same in every state.
pub fn canonical_fences(s: &mut State) {
    let values = fence_values(s);
    visit_fences(s, &mut |f| *f = canonical_fence(&values, *f));
}

/// The distinct fencing tokens of `s` but [`SMALL`], sorted.
fn fence_values(s: &mut State) -> Vec<Fence> {
    let mut values = Vec::new();
    visit_fences(s, &mut |f| {
        if *f != SMALL {
            values.push(*f);
        }
    });
    values.sort_unstable();
    values.dedup();
    values
}

/// What `fence` becomes when the state's fencing tokens are `values` (sorted).
fn canonical_fence(values: &[Fence], fence: Fence) -> Fence {
    if fence == SMALL {
        return SMALL;
    }
    let rank = values.binary_search(&fence).expect("a fence of the state") as Fence;
    (NAMES as Fence + 1) * (rank + 1)
}

/// The message `m` of state `s` as it reads once `s` is renumbered.
pub fn canonical_msg(s: &State, m: &Msg) -> Msg {
    let values = fence_values(&mut s.clone());
    let mut m = *m;
    match &mut m {
        Msg::Grant { fence, .. } => *fence = canonical_fence(&values, *fence),
        Msg::Reply { reply, .. } => match reply {
            Reply::Acquired {
                fence: Some(fence), ..
            }
            | Reply::Pipeline {
                fence: Some(fence), ..
            } => *fence = canonical_fence(&values, *fence),
            Reply::Busy { mark: Some(mark), .. } => *mark = canonical_fence(&values, *mark),
            Reply::MultiAcquired { fences, .. } => {
                for fence in fences {
                    *fence = canonical_fence(&values, *fence);
                }
            }
            _ => {}
        },
        Msg::Request { .. } => {}
    }
    m
}

/// Calls `f` on every fencing token in the state.
fn visit_fences(s: &mut State, f: &mut impl FnMut(&mut Fence)) {
    let server = &mut s.server;
    if let Counter::Started(c) = &mut server.counter {
        f(c);
    }
    for v in [&mut server.floor, &mut server.issued].into_iter().flatten() {
        f(v);
    }
    for r in &mut s.resources {
        if let Some(v) = &mut r.highest {
            f(v);
        }
    }
    for name in &mut server.names {
        if let Some(v) = &mut name.take_floor {
            f(v);
        }
        if let Some(key) = &mut name.lock
            && key.term > 0
        {
            f(&mut key.term);
        }
    }
    if let Some((term, _)) = &mut server.last_term {
        f(term);
    }
    for client in &mut s.clients {
        match &mut client.phase {
            Phase::Acquiring(a) => {
                if let Some((_, Some(mark))) = &mut a.last_busy {
                    f(mark);
                }
                if let Some(fence) = &mut a.confirm {
                    f(fence);
                }
            }
            Phase::Holding(h) => {
                for fence in h.fences.iter_mut().flatten() {
                    f(fence);
                }
            }
            _ => {}
        }
    }
    for m in &mut s.net {
        match m {
            Msg::Grant { fence, .. } => f(fence),
            Msg::Reply { reply, .. } => match reply {
                Reply::Acquired {
                    fence: Some(fence), ..
                }
                | Reply::Pipeline {
                    fence: Some(fence), ..
                } => f(fence),
                Reply::Busy { mark: Some(mark), .. } => f(mark),
                Reply::MultiAcquired { fences, .. } => fences.iter_mut().for_each(&mut *f),
                _ => {}
            },
            Msg::Request { .. } => {}
        }
    }
}
