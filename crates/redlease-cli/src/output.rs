//! What redlease prints: errors and notes on stderr, results on stdout, durations for
//! people. Nothing here panics on a closed stdout or stderr (`redlease status x | head`).

use std::fmt::Display;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::CommandFactory;

use crate::exit::Failure;

/// Prints `failure` on stderr (`error: …`, then `hint: …` when it has one) and returns
/// its exit status.
pub fn report(failure: &Failure) -> ExitCode {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "error: {failure:#}");
    if let Some(hint) = failure.hint_text() {
        let _ = writeln!(stderr, "hint: {hint}");
    }
    ExitCode::from(failure.status)
}

/// A line on stderr for the operator: `redlease: …`.
pub fn note(text: impl Display) {
    let _ = writeln!(std::io::stderr(), "redlease: {text}");
}

/// Writes `text` to stdout, reporting a closed pipe instead of panicking.
pub fn emit(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// A duration for people: `1.5s`, `250ms`, `2m 30s`.
pub fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// Whole milliseconds, for JSON (saturating).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, for JSON; `None` before it.
pub fn unix_ms(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(millis)
}

/// `redlease completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<ExitCode, Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut crate::cli::Cli::command(), "redlease", &mut script);
    emit(&String::from_utf8_lossy(&script)).map_err(|e| Failure::caused(crate::exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}
