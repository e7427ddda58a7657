//! Counterexamples as traces a person can read: one line per step, saying what happened
//! and what it changed.

use std::fmt::Write;

use stateright::{Expectation, Model, Path};

use crate::canonical::canonical_msg;
use crate::client::{Phase, ReleaseStep};
use crate::config::{Kind, Lock, NAME, NAMES};
use crate::model::{Action, LockModel, State};
use crate::net::{Msg, Reply, Req, Slot, Stage, Tok, client_name};

/// The trace of `path`, ending with what is wrong in its last state.
pub fn render(model: &LockModel, path: &Path<State, Action>) -> String {
    let mut steps = replay(model, path);
    // Up to the first state that breaks a property (with several threads the checker
    // may report a path that goes on past it).
    let properties = model.properties();
    let broken = |s: &State| {
        properties
            .iter()
            .any(|p| p.expectation == Expectation::Always && !(p.condition)(model, s))
    };
    if let Some(first) = steps.iter().position(|(s, _)| broken(s)) {
        steps.truncate(first + 1);
        steps[first].1 = None;
    }
    let mut out = String::new();
    let mut time = None;
    // The state holds relative times; the trace counts the ticks to show absolute ones.
    let mut now: u32 = 0;
    for pair in steps.windows(2) {
        let (before, action) = (
            &pair[0].0,
            pair[0].1.expect("every step but the last has an action"),
        );
        let after = &pair[1].0;
        if action == Action::Tick {
            now += 1;
            let _ = writeln!(out, "        --- tick: t={now}");
            for line in expiries(model, before, after) {
                let _ = writeln!(out, "        {line}");
            }
            time = None;
            continue;
        }
        let stamp = if time == Some(now) {
            "      ".to_string()
        } else {
            time = Some(now);
            format!("t={now:<3} ")
        };
        let _ = writeln!(out, "  {stamp}{}", describe(model, before, action, after, now));
    }
    let last = &steps.last().expect("a path has a last state").0;
    let _ = writeln!(out, "  then: {}", summary(model, last, now));
    out
}

/// The states of `path` as the model reaches them without renumbering fencing tokens
/// (the checker's states are renumbered; see `canonical_fences`), so that a trace shows
/// the tokens Redis would issue.
fn replay(model: &LockModel, path: &Path<State, Action>) -> Vec<(State, Option<Action>)> {
    let raw_model = LockModel {
        canonical: false,
        ..model.clone()
    };
    let steps = path.clone().into_vec();
    let mut raw = steps[0].0.clone();
    let mut out = Vec::new();
    for (state, action) in steps {
        let Some(action) = action else {
            out.push((raw.clone(), None));
            break;
        };
        // The message an index names in the checker's state, found in the raw one.
        let translate = |i: usize| {
            let m = state.net[i];
            raw.net
                .iter()
                .position(|r| canonical_msg(&raw, r) == m)
                .unwrap_or_else(|| {
                    panic!(
                        "the same messages in flight: {m:?} not in {:?}\nraw {raw:?}\ncanonical {state:?}",
                        raw.net.iter().map(|r| canonical_msg(&raw, r)).collect::<Vec<_>>()
                    )
                })
        };
        let raw_action = match action {
            Action::Deliver(i) => Action::Deliver(translate(i)),
            Action::Lose(i) => Action::Lose(translate(i)),
            other => other,
        };
        let next = raw_model
            .next_state(&raw, raw_action)
            .expect("every action has a next state");
        out.push((raw, Some(raw_action)));
        raw = next;
    }
    out
}

/// Keys and leases that ran out in a tick.
fn expiries(model: &LockModel, before: &State, after: &State) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, (b, a)) in NAME
        .iter()
        .zip(before.server.names.iter().zip(&after.server.names))
    {
        if let (Some(k), None) = (b.lock, a.lock) {
            if model.kind == Kind::Multi {
                lines.push(format!("key {name} = {} expires on the server", k.token));
            } else {
                lines.push(format!("key {} expires on the server", k.token));
            }
        }
    }
    for (c, (b, a)) in before.clients.iter().zip(&after.clients).enumerate() {
        if let (Phase::Holding(hb), Phase::Holding(ha)) = (b.phase, a.phase)
            && hb.ended.is_none()
            && ha.ended.is_some()
        {
            lines.push(format!(
                "{}'s lease {} runs out (its clock reaches valid_until)",
                client_name(c as u8),
                ha.token,
            ));
        }
    }
    lines
}

/// The script (or command) a request runs.
fn script(model: &LockModel, req: &Req) -> String {
    let kind = model.kind;
    let lock = model.lock_of(req.token().client);
    let name = |mutex: &str, sem: &str, election: &str| match (kind, lock) {
        (Kind::Multi, Lock::Multi) => mutex.replace("mutex_", "multi_"),
        (Kind::Multi, Lock::Name(n)) => format!("{} on {}", mutex, NAME[n]),
        (Kind::Mutex, _) => mutex.to_string(),
        (Kind::Semaphore { .. }, _) => sem.to_string(),
        (Kind::Election, _) => election.to_string(),
    };
    match *req {
        Req::MultiAcquire { token, reg } => format!("multi_acquire.lua({token}, registration {reg}!)"),
        Req::MultiLeave { reg } => format!("multi_release.lua(a fresh token, leaving registration {reg}!)"),
        Req::Pipeline {
            token,
            stage: Stage::Set,
        } => format!("the pipeline SET NX PX + INCR({token})"),
        Req::Pipeline {
            token,
            stage: Stage::Incr { .. },
        } => format!("the INCR of {token}'s pipeline"),
        Req::Acquire { token } => format!(
            "{}({token})",
            name("mutex_acquire.lua", "sem_acquire.lua", "election_campaign.lua")
        ),
        Req::Extend { token, ttl } => format!(
            "{}({token}, ttl {ttl})",
            name("mutex_extend.lua", "sem_extend.lua", "election_renew.lua")
        ),
        Req::Release { token, leaving } => format!(
            "{}({token}{})",
            name("mutex_release.lua", "sem_release.lua", "election_resign.lua"),
            if leaving { ", leaving its registration" } else { "" }
        ),
        Req::HandOff { old, new } => format!("the local hand-over script({old} -> {new})"),
        Req::Get { .. } => "GET key".to_string(),
        Req::ReleaseUnchecked { .. } => "the release's delete (no compare)".to_string(),
        Req::Expire { .. } => "PEXPIRE key".to_string(),
    }
}

fn reply_text(reply: &Reply) -> String {
    match *reply {
        Reply::Pipeline { taken: false, .. } => "SET: nil (held)".to_string(),
        Reply::Pipeline {
            taken: true,
            fence: Some(f),
        } => format!("SET: OK, INCR: fence {f}"),
        Reply::Pipeline {
            taken: true,
            fence: None,
        } => "SET: OK, INCR: a few units (the counter is not started yet)".to_string(),
        Reply::Acquired { fence, pttl: None } => match fence {
            Some(f) => format!("acquired, fence {f}"),
            None => "acquired".to_string(),
        },
        Reply::Acquired {
            fence,
            pttl: Some(pttl),
        } => {
            let left = pttl.map_or("no TTL".to_string(), |p| format!("{p} left"));
            match fence {
                Some(f) => format!("already ours, fresh fence {f}, {left}"),
                None => format!("already ours, {left}"),
            }
        }
        Reply::MultiAcquired { fences, left } => {
            let fences: Vec<String> = fences
                .iter()
                .enumerate()
                .map(|(n, f)| format!("{} fence {f}", NAME[n]))
                .collect();
            format!("acquired every name: {}, {left} left", fences.join(", "))
        }
        Reply::Busy { mark: Some(m), .. } => format!("busy (mark {m})"),
        Reply::Busy { mark: None, .. } => "busy".to_string(),
        Reply::Int(n) => format!("{n}"),
        Reply::Value(v) => v.map_or("nil".to_string(), |t| t.to_string()),
    }
}

/// The server's lock state.
fn key_text(model: &LockModel, s: &State, now: u32) -> String {
    let key = |n: usize, label: &str| match s.server.names[n].lock {
        Some(k) => match k.expires {
            Some(e) => format!("{label} = {} until t={}", k.token, now + u32::from(e)),
            None => format!("{label} = {} with NO TTL", k.token),
        },
        None => format!("{label} free"),
    };
    let mut text = if model.kind == Kind::Multi {
        let keys: Vec<String> = (0..NAMES).map(|n| key(n, &NAME[n].to_string())).collect();
        keys.join(", ")
    } else {
        key(0, "key")
    };
    if !s.server.permits.is_empty() {
        let permits: Vec<String> = s
            .server
            .permits
            .iter()
            .map(|(t, d)| format!("{t} until t={}", now + u32::from(*d)))
            .collect();
        text = format!("permits: {}", permits.join(", "));
    }
    text
}

/// One client's state, briefly.
fn phase_text(s: &State, c: usize, now: u32) -> String {
    match s.clients[c].phase {
        Phase::Idle => "idle".to_string(),
        Phase::Crashed => "crashed".to_string(),
        Phase::Acquiring(a) => format!("acquiring {}", a.token),
        Phase::Holding(h) => {
            let held: Vec<(usize, u16)> = h
                .fences
                .iter()
                .enumerate()
                .filter_map(|(n, f)| Some((n, (*f)?)))
                .collect();
            let fence = match held[..] {
                [] => String::new(),
                [(_, f)] => format!(", fence {f}"),
                _ => {
                    let fences: Vec<String> = held.iter().map(|(n, f)| format!("{} {f}", NAME[*n])).collect();
                    format!(", fences {}", fences.join(", "))
                }
            };
            match h.ended {
                None if h.believes() => format!(
                    "HOLDS {}{fence}, believed until t={}",
                    h.token,
                    now + u32::from(h.valid_for)
                ),
                None => format!("holds {} past valid_until", h.token),
                Some(reason) => format!("guard of {} ({reason:?})", h.token),
            }
        }
        Phase::Releasing { token, .. } => format!("releasing {token}"),
        Phase::HandingOver { old, new, .. } => format!("handing {old} over to {new}"),
    }
}

fn describe(model: &LockModel, before: &State, action: Action, after: &State, now: u32) -> String {
    let who = |c: u8| client_name(c);
    let kind = model.kind;
    match action {
        Action::Tick => unreachable!("handled by render"),
        Action::Lapse(n, waiter) => {
            let on = if kind == Kind::Multi {
                format!(" on {}", NAME[usize::from(n)])
            } else {
                String::new()
            };
            format!("{waiter}'s waiter registration{on} lapses (no new attempt before its deadline)")
        }
        Action::Begin(c) | Action::Attempt(c) => {
            let what = if matches!(action, Action::Begin(_)) {
                "starts acquiring"
            } else {
                "tries again"
            };
            format!(
                "{}: {what}; sends {}",
                who(c),
                last_request(model, before, after, c)
            )
        }
        Action::GiveUp(c) => format!(
            "{}: gives up acquiring (deadline); {}",
            who(c),
            background(model, before, after, c)
        ),
        Action::Deliver(i) => match before.net[i] {
            Msg::Request {
                from,
                req:
                    Req::Pipeline {
                        token,
                        stage: Stage::Set,
                    },
                ..
            } if !model.pipeline_back_to_back => {
                let n = match model.lock_of(from) {
                    Lock::Name(n) => n,
                    Lock::Multi => 0,
                };
                let taken = after.server.names[n].lock.is_some_and(|k| k.token == token)
                    && before.server.names[n].lock.is_none_or(|k| k.token != token);
                format!(
                    "server runs the SET NX PX of {token}'s pipeline from {} → {} (its INCR follows); {}",
                    who(from),
                    if taken { "OK" } else { "nil (held)" },
                    key_text(model, after, now)
                )
            }
            Msg::Request { from, slot, req, .. } => {
                let new = added(before, after);
                let (reply, _) = model.execute(&mut before.server.clone(), req);
                let text = match (req, reply) {
                    (
                        Req::Pipeline {
                            stage: Stage::Incr { .. },
                            ..
                        },
                        Reply::Pipeline { taken: false, .. },
                    ) => "not used (its SET did not set)".to_string(),
                    (
                        Req::Pipeline {
                            stage: Stage::Incr { .. },
                            ..
                        },
                        Reply::Pipeline { fence: Some(f), .. },
                    ) => format!("fence {f}"),
                    _ => reply_text(&reply),
                };
                let answer = if slot != Slot::Background {
                    format!(" → {text}")
                } else {
                    format!(" → {text} (nobody reads it)")
                };
                let grant = new
                    .iter()
                    .find_map(|m| match m {
                        Msg::Grant { to, fence } => Some(format!("; publishes \"g {to} {fence}\"")),
                        _ => None,
                    })
                    .unwrap_or_default();
                format!(
                    "server runs {} from {}{answer}{grant}; {}",
                    script(model, &req),
                    who(from),
                    key_text(model, after, now)
                )
            }
            Msg::Reply { to, slot, reply, .. } => {
                let too_late = matches!(reply, Reply::MultiAcquired { .. })
                    && matches!(after.clients[usize::from(to)].phase, Phase::Acquiring(_));
                format!(
                    "{}: reply to its {} arrives: {} → {}{}{}",
                    who(to),
                    slot_name(slot),
                    reply_text(&reply),
                    if too_late {
                        "too late for a lease, gives every name back: "
                    } else {
                        ""
                    },
                    phase_text(after, usize::from(to), now),
                    follow_up(model, before, after, to)
                )
            }
            Msg::Grant { to, fence } => format!(
                "{}: reads hand-over \"g {to} {fence}\" → {}{}",
                who(to.client),
                phase_text(after, usize::from(to.client), now),
                follow_up(model, before, after, to.client)
            ),
        },
        Action::Lose(i) => match before.net[i] {
            Msg::Request { from, req, .. } => {
                format!("network loses {}'s request {}", who(from), script(model, &req))
            }
            Msg::Reply { to, slot, reply, .. } => format!(
                "network loses the reply to {}'s {} ({})",
                who(to),
                slot_name(slot),
                reply_text(&reply)
            ),
            Msg::Grant { to, fence } => format!("network loses hand-over \"g {to} {fence}\""),
        },
        Action::Timeout(c, slot) => format!(
            "{}: no reply to its {} in time; {}",
            who(c),
            slot_name(slot),
            match (slot, after.clients[usize::from(c)].phase) {
                (Slot::Renew, _) => "the renewal counts as failed".to_string(),
                (Slot::HandOff, _) => format!(
                    "the waiting task gets the turn and sends {}",
                    last_request(model, before, after, c)
                ),
                _ => format!("retries: sends {}", last_request(model, before, after, c)),
            }
        ),
        Action::Renew(c) | Action::Extend(c) => format!(
            "{}: {} sends {}",
            who(c),
            if matches!(action, Action::Renew(_)) {
                "renewal task"
            } else {
                "extend()"
            },
            last_request(model, before, after, c)
        ),
        Action::Release(c) => {
            let step = match after.clients[usize::from(c)].phase {
                Phase::Releasing {
                    step: ReleaseStep::Get,
                    ..
                } => " (first step)",
                _ => "",
            };
            format!(
                "{}: release(): its lease ends for it; sends {}{step}",
                who(c),
                last_request(model, before, after, c)
            )
        }
        Action::Drop(c) => format!(
            "{}: drops its guard; {}",
            who(c),
            background(model, before, after, c)
        ),
        Action::HandOver(c) => format!(
            "{}: releases while another of its tasks waits; sends {}",
            who(c),
            last_request(model, before, after, c)
        ),
        Action::SendExpire(c) => format!("{}: sends PEXPIRE key (second step of its acquire)", who(c)),
        Action::Write(c) => {
            let Phase::Holding(h) = before.clients[usize::from(c)].phase else {
                unreachable!("writes come from guards");
            };
            let lease = if h.believes() {
                "its lease valid"
            } else {
                "its lease no longer valid (a pause, or a slow write)"
            };
            let writes: Vec<String> = (0..NAMES)
                .filter_map(|n| {
                    let fence = h.fences[n]?;
                    let (b, a) = (&before.resources[n], &after.resources[n]);
                    let verdict = if a.interleaved && !b.interleaved {
                        "ACCEPTED, interleaved with another holder's writes with the same token"
                    } else if a.last == Some(h.token) && a.highest == Some(fence) {
                        "accepted"
                    } else {
                        "refused (a higher fence was seen)"
                    };
                    let resource = if kind == Kind::Multi {
                        format!("{}'s resource", NAME[n])
                    } else {
                        "the resource".to_string()
                    };
                    Some(format!("to {resource} with fence {fence}: {verdict}"))
                })
                .collect();
            format!("{}: writes, {lease}: {}", who(c), writes.join("; "))
        }
        Action::Crash(c) => format!("{}: CRASHES", who(c)),
        Action::LoseCounter => "the fencing counter key expires (the floor remains)".to_string(),
    }
}

/// The request a step sent for client `c`, as text.
fn last_request(model: &LockModel, before: &State, after: &State, c: u8) -> String {
    added(before, after)
        .iter()
        .find_map(|m| match m {
            Msg::Request { from, req, .. } if *from == c => Some(script(model, req)),
            _ => None,
        })
        .unwrap_or_else(|| "nothing".to_string())
}

fn background(model: &LockModel, before: &State, after: &State, c: u8) -> String {
    let new: Vec<String> = added(before, after)
        .iter()
        .filter_map(|m| match m {
            Msg::Request {
                from,
                slot: Slot::Background,
                req,
                ..
            } if *from == c => Some(script(model, req)),
            _ => None,
        })
        .collect();
    if new.is_empty() {
        "nothing to undo".to_string()
    } else {
        format!("sends {} in the background", new.join(", "))
    }
}

/// The messages a step put in flight. (A request that was there before and only
/// stopped being waited for is not new.)
fn added(before: &State, after: &State) -> Vec<Msg> {
    let key = |m: &Msg| match *m {
        Msg::Request { from, req, .. } => Msg::Request {
            from,
            slot: Slot::Background,
            age: 0,
            req,
        },
        other => other,
    };
    let mut old: Vec<Msg> = before.net.iter().map(key).collect();
    let mut new = Vec::new();
    for m in &after.net {
        match old.iter().position(|o| *o == key(m)) {
            Some(i) => {
                old.remove(i);
            }
            None => new.push(*m),
        }
    }
    new
}

/// A request a reply led to (the second step of a release, a confirmation).
fn follow_up(model: &LockModel, before: &State, after: &State, c: u8) -> String {
    let sent: Vec<String> = added(before, after)
        .iter()
        .filter_map(|m| match m {
            Msg::Request { from, req, .. } if *from == c => Some(script(model, req)),
            _ => None,
        })
        .collect();
    if sent.is_empty() {
        String::new()
    } else {
        format!("; sends {}", sent.join(", "))
    }
}

fn slot_name(slot: Slot) -> &'static str {
    match slot {
        Slot::Attempt => "acquire attempt",
        Slot::Confirm => "hand-over confirmation",
        Slot::Renew => "renewal",
        Slot::Extend => "extend",
        Slot::Release => "release",
        Slot::HandOff => "hand-over",
        Slot::Background => "background request",
    }
}

/// What is wrong (or right) in the last state of a trace.
pub fn summary(model: &LockModel, s: &State, now: u32) -> String {
    let mut parts = Vec::new();
    for (n, name) in NAME.iter().enumerate() {
        let believers: Vec<String> = (0..s.clients.len())
            .filter(|&c| s.clients[c].believes() && model.lock_of(c as u8).covers(n))
            .map(|c| format!("{} {}", client_name(c as u8), phase_text(s, c, now)))
            .collect();
        if believers.len() > model.kind.holders() {
            let of = if model.kind == Kind::Multi {
                format!(" {name}")
            } else {
                String::new()
            };
            parts.push(format!(
                "{} believe they hold{of} at once: {}",
                believers.len(),
                believers.join("; ")
            ));
        }
    }
    if s.resources.iter().any(|r| r.interleaved) {
        parts.push("the resource accepted two holders' writes with the same fencing token".to_string());
    }
    if s.fence_behind {
        let who = (0..s.clients.len())
            .find_map(|c| match s.clients[c].phase {
                Phase::Holding(h) if s.server.names.iter().any(|n| n.last_taker == Some(h.token)) => {
                    Some(h.token)
                }
                _ => None,
            })
            .map_or(String::new(), |t| format!("{t} "));
        parts.push(format!(
            "{who}believes it holds with a fencing token below one issued before it took the lock: the \
             resource would refuse its writes and accept an earlier holder's"
        ));
    }
    if let Some(name) = s.server.names.iter().find(|n| n.misissued) {
        let to = name.last_taker.map_or(String::new(), |t| format!(" (it is {t})"));
        parts.push(format!(
            "a fencing token went to a client other than the one that took the lock last{to}: \
             a stale holder's token is above a newer holder's"
        ));
    }
    if let Some(k) = s.server.names.iter().find_map(|n| n.lock)
        && !s.token_alive(k.token)
        && k.expires.is_none_or(|e| e > model.timing.max_ttl())
    {
        parts.push(format!(
            "{}, and no one will ever release or renew {}: an orphan",
            key_text(model, s, now),
            k.token
        ));
    }
    if s.lied {
        let told = (0..s.clients.len())
            .find_map(|c| match s.clients[c].phase {
                Phase::Acquiring(a)
                    if s.server
                        .names
                        .iter()
                        .any(|n| n.lock.is_some_and(|k| k.token == a.token)) =>
                {
                    Some(a.token)
                }
                _ => None,
            })
            .map_or(String::new(), |t: Tok| format!(" ({} holds the lock)", t));
        parts.push(format!(
            "an acquire was told \"busy\" while its own token held the lock{told}"
        ));
    }
    if parts.is_empty() {
        parts.push(key_text(model, s, now));
    }
    parts.join("; ")
}
