//! `redlease list [PATTERN] [--json]`: every held lock under the prefix, of every kind.

use std::process::ExitCode;

use serde_json::json;

use crate::cli::ListArgs;
use crate::connect::{Global, connect};
use crate::exit::{self, Failure};
use crate::output::{emit, human, millis, shown};

pub async fn list(global: &Global, args: ListArgs) -> Result<ExitCode, Failure> {
    let client = connect(global).await?;
    let locks = client
        .list(&args.pattern)
        .await
        .map_err(|e| Failure::from_lock(e, &global.shown_url))?;
    drop(client);
    let text = if args.json {
        let items: Vec<_> = locks
            .iter()
            .map(|l| {
                json!({
                    "kind": l.kind.as_str(),
                    "name": l.name,
                    "key": l.key,
                    "held": true,
                    "owner": l.owner,
                    "foreign": l.foreign,
                    "ttl_ms": l.remaining.map(millis),
                    "fence": l.fence.map(|f| f.get()),
                    "waiters": l.waiters,
                    "holders": l.holders,
                })
            })
            .collect();
        serde_json::Value::Array(items).to_string() + "\n"
    } else {
        table(&locks)
    };
    emit(&text).map_err(|e| Failure::caused(exit::FAILED, e))?;
    Ok(ExitCode::SUCCESS)
}

/// One line per lock under a header, columns aligned; `(none)` when nothing is held.
fn table(locks: &[redlease::LockInfo]) -> String {
    if locks.is_empty() {
        return "(no lock held)\n".into();
    }
    let header = ["KIND", "NAME", "OWNER", "TTL", "FENCE", "HOLDERS", "WAITERS"].map(String::from);
    let mut rows = vec![header];
    for l in locks {
        let owner = match (&l.owner, l.foreign) {
            (_, true) => "(another library)".to_owned(),
            (Some(owner), false) => shown(owner),
            (None, false) => "-".to_owned(),
        };
        rows.push([
            l.kind.to_string(),
            shown(&l.name),
            owner,
            l.remaining.map_or("no expiry".to_owned(), human),
            l.fence.map_or("-".to_owned(), |f| f.to_string()),
            l.holders.to_string(),
            l.waiters.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
