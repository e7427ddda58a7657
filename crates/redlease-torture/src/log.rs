//! The library's own log, for investigating a finding: with `REDLEASE_TORTURE_LOG` set
//! to `warn`, `info`, `debug` or `trace`, every worker prints redlease's log events of
//! that level and above to stderr, each stamped with the run's shared clock (the
//! nanoseconds the checker's details and the unexplained-`lost()` list use) and its
//! worker. Off by default: a minimal subscriber, so the run needs no logging stack.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::clock::mono_ns;

/// The variable that turns the log on.
pub const VAR: &str = "REDLEASE_TORTURE_LOG";

/// Installs the subscriber if [`VAR`] names a level.
pub fn init(worker: usize) {
    let level = match std::env::var(VAR)
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Ok("error") => Level::ERROR,
        Ok("warn") => Level::WARN,
        Ok("info") => Level::INFO,
        Ok("debug") => Level::DEBUG,
        Ok("trace") => Level::TRACE,
        _ => return,
    };
    let _ = tracing::subscriber::set_global_default(Stderr { level, worker });
}

struct Stderr {
    level: Level,
    worker: usize,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.level && metadata.target().starts_with("redlease")
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let thread = std::thread::current();
        // One write per line: the workers share the coordinator's stderr.
        let line = format!(
            "[t={} w{} {} {} {}]{}\n",
            mono_ns(),
            self.worker,
            thread.name().unwrap_or("-"),
            event.metadata().level(),
            event.metadata().target(),
            fields.0
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
