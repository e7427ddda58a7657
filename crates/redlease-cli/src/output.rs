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

/// How many characters of a value an error message shows.
pub const SHOWN_CHARS: usize = 64;

/// A value typed by the user as an error message echoes it: control characters escaped
/// (`\r`, `\u{1b}`: a name rejected *for* its control characters must not rewrite
/// the terminal), and cut after [`SHOWN_CHARS`] characters with its length in bytes
/// (`xxx…(10240 bytes)`).
pub fn shown(s: &str) -> String {
    shown_up_to(s, SHOWN_CHARS)
}

/// As [`shown`], for text that quotes a value among words of its own (a tip): cut only
/// after four times as many characters.
pub fn shown_long(s: &str) -> String {
    shown_up_to(s, 4 * SHOWN_CHARS)
}

fn shown_up_to(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(4 * max));
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push_str(&format!("…({} bytes)", s.len()));
            break;
        }
        if redlease::needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
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

/// `redlease man [--dir DIR]`: the man page on stdout, or every command's page in `dir`.
pub fn man(dir: Option<&std::path::Path>) -> Result<ExitCode, Failure> {
    let failed = |e: std::io::Error| Failure::caused(crate::exit::FAILED, e);
    let cmd = crate::cli::Cli::command();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(cmd, dir))
                .map_err(|e| {
                    Failure::caused(crate::exit::CANNOT_WRITE, e).hint(format!(
                        "--dir {} must be a directory redlease can create or write to",
                        shown(&dir.display().to_string())
                    ))
                })?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page).map_err(failed)?;
            emit(&String::from_utf8_lossy(&page)).map_err(failed)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_shown_escaped_and_shortened() {
        assert_eq!(shown("deploy"), "deploy");
        assert_eq!(shown("a\rb\x1b[31m\n"), "a\\rb\\u{1b}[31m\\n");
        assert_eq!(shown("\u{202e}evil"), "\\u{202e}evil");
        let long = "é".repeat(5000);
        assert_eq!(shown(&long), format!("{}…(10000 bytes)", "é".repeat(64)));
        assert_eq!(shown(&"x".repeat(64)), "x".repeat(64));
    }
}
