//! `redlease leader NAME [--json] [--watch]`: who leads an election, and (with
//! `--watch`) every change as it happens. Never a token.

use std::process::ExitCode;
use std::time::SystemTime;

use futures_util::StreamExt;
use redlease::{Leader, LeaderEvent};
use serde_json::{Value, json};

use crate::cli::{LeaderArgs, signal_status};
use crate::connect::{Global, connect};
use crate::exit::{self, Failure};
use crate::output::{emit, human, millis, note, unix_ms};
use crate::signals::Signals;

pub async fn leader(global: &Global, args: LeaderArgs) -> Result<ExitCode, Failure> {
    let mut signals = Signals::catch().map_err(|e| Failure::caused(exit::FAILED, e))?;
    let client = connect(global).await?;
    let lock_err = |e| Failure::from_lock(e, &global.shown_url);
    let election = client.election(args.name.get()).map_err(lock_err)?;
    let show = Show {
        name: args.name.get(),
        key: election.key(),
        json: args.json,
    };
    if !args.watch {
        let leader = election.leader().await.map_err(lock_err)?;
        return print(&show.now(leader.as_ref()));
    }
    let mut changes = election.observe();
    let mut first = true;
    loop {
        let change = tokio::select! {
            change = changes.next() => change,
            // Interrupting is how a watch ends: 128+N, without an error message.
            received = signals.recv() => return Ok(ExitCode::from(signal_status(received.signal as i32))),
        };
        match change {
            Some(Ok(event)) => {
                print(&show.change(&event, first))?;
            }
            // Nothing could be read at all: as `leader` without --watch.
            Some(Err(e)) if first => return Err(lock_err(e)),
            Some(Err(e)) => {
                note(format_args!(
                    "cannot read election {:?} ({e}); trying again",
                    args.name.get()
                ));
                continue;
            }
            None => return Ok(ExitCode::SUCCESS),
        }
        first = false;
    }
}

fn print(text: &str) -> Result<ExitCode, Failure> {
    emit(&(text.to_owned() + "\n")).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}

/// How `leader` prints.
struct Show<'a> {
    name: &'a str,
    key: &'a str,
    json: bool,
}

impl Show<'_> {
    /// The election as it is: one JSON object, or one line per field.
    fn now(&self, leader: Option<&Leader>) -> String {
        if self.json {
            return self.object(leader).to_string();
        }
        let mut lines = vec![format!("election:   {:?} (key {:?})", self.name, self.key)];
        let Some(l) = leader else {
            lines.push("leader:     none".into());
            return lines.join("\n");
        };
        lines.push(format!("leader:     {}", l.owner));
        lines.push(format!("value:      {:?}", l.value));
        lines.push(format!("term:       {}", l.term));
        if let Some(left) = l.remaining {
            lines.push(format!("lease:      {} left", human(left)));
        }
        if let Some(since) = l.since {
            lines.push(format!(
                "since:      {} (Redis time)",
                humantime::format_rfc3339_millis(since)
            ));
        }
        lines.join("\n")
    }

    /// One change, on one line.
    fn change(&self, event: &LeaderEvent, first: bool) -> String {
        let (what, leader, resigned) = match event {
            LeaderEvent::Elected(l) => ("elected", Some(l), None),
            LeaderEvent::Proclaimed(l) => ("proclaimed", Some(l), None),
            LeaderEvent::Vacant { resigned } => ("vacant", None, Some(*resigned)),
            _ => ("changed", None, None),
        };
        let at = SystemTime::now();
        if self.json {
            let mut object = self.object(leader);
            object["event"] = json!(what);
            object["at_ms"] = json!(unix_ms(at));
            if let Some(resigned) = resigned {
                object["resigned"] = json!(resigned);
            }
            return object.to_string();
        }
        let at = humantime::format_rfc3339_millis(at);
        match (leader, resigned) {
            (Some(l), _) => format!("{at} {what:<10} term {} {} value {:?}", l.term, l.owner, l.value),
            (None, Some(_)) if first => format!("{at} vacant     nobody leads"),
            (None, Some(true)) => format!("{at} vacant     the leader resigned"),
            (None, Some(false)) => format!("{at} vacant     the leader's lease ran out"),
            (None, None) => format!("{at} {what}"),
        }
    }

    /// The fields every JSON object has.
    fn object(&self, leader: Option<&Leader>) -> Value {
        json!({
            "name": self.name,
            "key": self.key,
            "leader": leader.is_some(),
            "value": leader.map(|l| l.value.as_str()),
            "term": leader.map(|l| l.term.get()),
            "owner": leader.map(|l| l.owner.as_str()),
            "ttl_ms": leader.and_then(|l| l.remaining).map(millis),
            "since_ms": leader.and_then(|l| l.since).and_then(unix_ms),
        })
    }
}
