//! The summary table on stdout and the `--json` document.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::coordinator::{Config, Row};
use crate::faults::Fault;

/// A must-be-safe algorithm that completes fewer critical sections than this in a phase
/// proves nothing there; the run fails as a harness error.
pub const MIN_PROGRESS: u64 = 10;

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

fn faults_label(faults: &[Fault]) -> String {
    if faults.len() == 1 {
        faults[0].name().to_owned()
    } else {
        format!("mixed({})", faults.len())
    }
}

/// The results table, one row per algorithm and phase, then totals per algorithm.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let header = format!(
        "{:<19} {:<19} {:>7} {:>5} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}",
        "algorithm",
        "faults",
        "CS",
        "viol",
        "max-in",
        "lost-sig",
        "fenced",
        "caught",
        "paused",
        "abandon",
        "acq-err",
        "stuck"
    );
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    for r in rows {
        let v = &r.verdict;
        let paused = if v.paused == 0 {
            "-".to_owned()
        } else {
            format!("{}/{}", v.paused_lost_first, v.paused - v.paused_excused)
        };
        let viol = if r.must_be_safe {
            v.violations.to_string()
        } else {
            format!("{}*", v.violations)
        };
        let _ = writeln!(
            out,
            "{:<19} {:<19} {:>7} {:>5} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}",
            r.algorithm,
            faults_label(&r.faults),
            v.critical_sections,
            viol,
            v.max_inside,
            match r.lost_unexplained {
                Some(n) if n > 0 => format!("{n}!"),
                _ => opt(v.lost_signals),
            },
            if r.fenced {
                v.fenced_rejections.to_string()
            } else {
                "-".into()
            },
            if r.fenced {
                v.overlaps_caught.to_string()
            } else {
                "-".into()
            },
            paused,
            v.abandoned,
            r.acquire_unavailable + r.acquire_other,
            if r.stuck_locks_broken > 0 {
                r.stuck_locks_broken.to_string()
            } else {
                "-".into()
            },
        );
    }
    let _ = writeln!(out, "{}", "-".repeat(header.len()));
    let _ = writeln!(
        out,
        "(* informative: a baseline, or a lock without fencing token under a fault that lets a holder outlive its lease)"
    );
    if rows.iter().any(|r| r.lost_unexplained.is_some_and(|n| n > 0)) {
        let _ = writeln!(
            out,
            "(! leases lost where no fault of the phase explains it: a defect, listed below)"
        );
    }
    for t in totals(rows) {
        let n = |k: &str| t[k].as_u64().map_or_else(|| "-".to_owned(), |n| n.to_string());
        let fenced = t["fenced"].as_bool() == Some(true);
        let paused = match (
            t["paused_holders_checked"].as_u64(),
            t["paused_lost_before_rejection_or_write"].as_u64(),
        ) {
            (Some(p), Some(f)) if p > 0 => format!("{f}/{p}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<19} {:<19} {:>7} {:>5} {:>6} {:>8} {:>7} {:>7} {:>7}",
            t["algorithm"].as_str().unwrap_or(""),
            "all",
            n("critical_sections"),
            n("violations"),
            n("max_inside"),
            n("lost_signals_fired"),
            if fenced {
                n("fenced_rejections")
            } else {
                "-".into()
            },
            if fenced {
                n("overlaps_caught_by_fencing")
            } else {
                "-".into()
            },
            paused,
        );
    }
    out
}

/// The `lost()` signals no fault explains (under `extend` and `cluster`), described;
/// empty when there were none.
pub fn unexplained_lost(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| r.lost_unexplained.is_some_and(|n| n > 0)) {
        let _ = writeln!(
            out,
            "{} under {}: {} leases lost with no fault to explain it (lost() fired, or a release found the lock gone){}",
            r.algorithm,
            r.phase,
            r.lost_unexplained.unwrap_or(0),
            if r.lost_details.len() < r.lost_unexplained.unwrap_or(0) as usize {
                format!(" (the first {}:)", r.lost_details.len())
            } else {
                ":".into()
            }
        );
        for d in &r.lost_details {
            let _ = writeln!(out, "  {d}");
        }
    }
    out
}

/// Per-algorithm totals over all phases, in first-seen order.
fn totals(rows: &[Row]) -> Vec<Value> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.algorithm.as_str()) {
            names.push(&r.algorithm);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.algorithm == name).collect();
            let faults: BTreeSet<Fault> = mine.iter().flat_map(|r| r.faults.iter().copied()).collect();
            let sum = |f: &dyn Fn(&Row) -> u64| mine.iter().map(|r| f(r)).sum::<u64>();
            let lost = mine
                .iter()
                .any(|r| r.verdict.lost_signals.is_some())
                .then(|| sum(&|r| r.verdict.lost_signals.unwrap_or(0)));
            json!({
                "algorithm": name,
                "must_be_safe": mine.iter().all(|r| r.must_be_safe),
                "baseline": mine[0].baseline,
                "violations_must_be_safe": mine
                    .iter()
                    .filter(|r| r.must_be_safe)
                    .map(|r| r.verdict.violations)
                    .sum::<u64>(),
                "max_inside": mine.iter().map(|r| r.verdict.max_inside).max().unwrap_or(0),
                "fenced": mine[0].fenced,
                "faults": faults.iter().map(|f| f.name()).collect::<Vec<_>>(),
                "critical_sections": sum(&|r| r.verdict.critical_sections),
                "violations": sum(&|r| r.verdict.violations),
                "lost_signals_fired": lost,
                "fenced_rejections": sum(&|r| r.verdict.fenced_rejections),
                "overlaps_caught_by_fencing": sum(&|r| r.verdict.overlaps_caught),
                "paused_holders_checked": sum(&|r| r.verdict.paused - r.verdict.paused_excused),
                "paused_lost_before_rejection_or_write": sum(&|r| r.verdict.paused_lost_first),
                "lost_unexplained": mine
                    .iter()
                    .any(|r| r.lost_unexplained.is_some())
                    .then(|| sum(&|r| r.lost_unexplained.unwrap_or(0))),
            })
        })
        .collect()
}

fn row_json(r: &Row) -> Value {
    let v = &r.verdict;
    let mut doc = json!({
        "algorithm": r.algorithm,
        "phase": r.phase,
        "faults": r.faults.iter().map(|f| f.name()).collect::<Vec<_>>(),
        "critical_sections": v.critical_sections,
        "violations": v.violations,
        "lost_signals_fired": v.lost_signals,
        "must_be_safe": r.must_be_safe,
        "baseline": r.baseline,
        "fenced": r.fenced,

        "seconds": (r.seconds * 10.0).round() / 10.0,
        "fault_events": r.fault_events,
        "entered": v.entered,
        "final_value": v.final_value,
        "lost_increments": v.lost_increments,
        "stale_writes": v.stale_writes,
        "interleavings": v.interleavings,
        "fenced_rejections": v.fenced_rejections,
        "overlaps_caught_by_fencing": v.overlaps_caught,
        "unexpected_overlaps": v.overlaps_unexpected,
        "paused_holders": v.paused,
        "paused_holders_refused": v.paused_rejected,
        "paused_lost_before_rejection_or_write": v.paused_lost_first,
        "paused_lost_missing": v.paused_lost_missing,
        "paused_lost_after_rejection": v.paused_lost_late,
        "paused_in_frozen_process": v.paused_excused,
        "short_stalls": v.short_stalls,
        "abandoned_after_lost": v.abandoned,
        "release_not_held": v.release_not_held,
        "acquire_timeouts": r.acquire_timeouts,
        "acquire_unavailable": r.acquire_unavailable,
        "acquire_other_errors": r.acquire_other,
        "stuck_locks_broken": r.stuck_locks_broken,
        "acquire_error_samples": r.acquire_error_samples,
        "harness_errors": v.harness_errors,
        "violation_details": v.details,
    });
    // Beside the mutex's fields (a second `json!` keeps the macro within its limits).
    let more = json!({
        "writes": v.writes,
        "max_inside": v.max_inside,
        "rw_overlaps": v.rw_overlaps,
        "rw_overlaps_after_lost_writes": v.rw_overlaps_lost_writes,
        "rw_overlaps_past_lease": v.rw_overlaps_stale,
        "over_limit": v.over_limit,
        "over_limit_with_valid_leases": v.over_limit_valid,
        "locks": r.locks,
        "lost_unexplained": r.lost_unexplained,
        "lost_unexplained_details": r.lost_details,
        "lost_while_client_leaned": r.lost_leaning,
        "leaned_on_lease": v.leaned,
        "extends_ok": v.extends_ok,
        "extends_not_held": v.extends_not_held,
        "extends_failed": v.extends_failed,
    });
    if let (Some(doc), Value::Object(more)) = (doc.as_object_mut(), more) {
        doc.extend(more);
    }
    doc
}

/// The `--json` document.
pub fn json(config: &Config, rows: &[Row], seconds: f64, passed: bool, error: Option<&str>) -> Value {
    json!({
        "tool": "redlease-torture",
        "mode": config.mode,
        "seed": config.seed,
        "processes": config.workers,
        "clients_per_algorithm": config.clients_per_algorithm(),
        "ttl_ms": config.ttl.as_millis() as u64,
        "response_timeout_ms": config.response_timeout.as_millis() as u64,
        "seconds": seconds.round(),
        "passed": passed,
        "error": error,
        "runs": rows.iter().map(row_json).collect::<Vec<_>>(),
        "totals": totals(rows),
    })
}

/// Why the run failed, if it did: violations of must-be-safe algorithms, and their
/// leases lost where no fault explains it (exit 1); harness problems (exit 2).
pub fn failures(rows: &[Row]) -> (Vec<String>, Vec<String>) {
    let mut violations = Vec::new();
    let mut harness = Vec::new();
    for r in rows {
        let v = &r.verdict;
        if r.must_be_safe && v.violations > 0 {
            violations.push(format!(
                "{} under {}: {} violations (lost increments {}, interleavings {}, unexpected overlaps {}, \
                 reader/writer overlaps {}, over the permit limit {}, \
                 paused holders without lost() {}, lost() after the refusal {})",
                r.algorithm,
                r.phase,
                v.violations,
                v.lost_increments,
                v.interleavings,
                v.overlaps_unexpected,
                v.rw_overlaps,
                v.over_limit,
                v.paused_lost_missing,
                v.paused_lost_late
            ));
            violations.extend(v.details.iter().map(|d| format!("  {d}")));
        }
        if let Some(n) = r.lost_unexplained.filter(|&n| n > 0 && r.must_be_safe) {
            violations.push(format!(
                "{} under {}: {n} leases lost with no fault to explain it (lost() fired, or a release found the lock gone)",
                r.algorithm, r.phase
            ));
            violations.extend(r.lost_details.iter().map(|d| format!("  {d}")));
        }
        for e in &v.harness_errors {
            harness.push(format!("{} under {}: {e}", r.algorithm, r.phase));
        }
        if r.must_be_safe && v.critical_sections < MIN_PROGRESS {
            harness.push(format!(
                "{} under {}: only {} critical sections completed; the phase proves nothing",
                r.algorithm, r.phase, v.critical_sections
            ));
        }
    }
    (violations, harness)
}
