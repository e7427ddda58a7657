//! The model mirrors the Lua scripts; when one changes, the model must be reviewed.

use redlease_model::scripts::{MIRRORED, fnv1a};

#[test]
fn scripts_match_the_model() {
    let changed: Vec<String> = MIRRORED
        .iter()
        .filter_map(|m| {
            let hash = fnv1a(m.contents.as_bytes());
            (hash != m.reviewed).then(|| {
                format!(
                    "  {} changed: review the model step that mirrors it ({}), then set its hash in \
                     crates/redlease-model/src/scripts.rs to {hash:#018x}",
                    m.file, m.step
                )
            })
        })
        .collect();
    assert!(
        changed.is_empty(),
        "scripts changed since the model was reviewed against them:\n{}",
        changed.join("\n")
    );
}
