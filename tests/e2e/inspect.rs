//! The inspection commands as a person uses them: abbreviated ids, the transcript of
//! `show`, `events --full`, `list`'s header, help text, and no escape codes in pipes.

use std::path::Path;

use nerve_core::event::Started;
use nerve_core::{Event, ExecutionId, LoopType, Redactor, TaskId};
use nerve_session::Store;

use crate::support::{nerve, stderr, stdout};

/// A log holding one `started` event for each of `ids`.
fn log_with(db: &Path, ids: &[&str]) {
    let mut store = Store::open(db).unwrap();
    for id in ids {
        let id: ExecutionId = id.parse().unwrap();
        let started = Event::Started(Started {
            task_id: TaskId::new(),
            task: format!("task of {id}"),
            workspace: "/w".into(),
            loop_type: LoopType::React,
            provider: "script:x".into(),
            model: "scripted".into(),
            max_turns: 20,
            config: serde_json::Value::Null,
        });
        store.append(&id, &[started], &Redactor::new()).unwrap();
    }
}

const A: &str = "0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f";
const B: &str = "0192f0c4-7b1e-7c3a-9f00-000000000001";
const C: &str = "0192f0c5-0000-7000-8000-000000000000";

#[test]
fn a_unique_id_prefix_works_wherever_an_id_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    log_with(&db, &[A, B, C]);

    // A unique prefix, in any case, reaches the execution in every command that takes one.
    for args in [
        vec!["show", "0192f0c5", "--json"],
        vec!["replay", "0192F0C5", "--json"],
        vec!["events", "0192f0c5-0", "--json"],
    ] {
        let output = nerve(&db, &args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stdout(&output).contains(C), "{args:?}: {}", stdout(&output));
    }
    let verify = nerve(&db, &["verify", "0192f0c4-7b1e-7c3a-9f00-4"]);
    assert_eq!(verify.status.code(), Some(0), "{}", stderr(&verify));
    assert!(stdout(&verify).contains("1 events"), "{}", stdout(&verify));

    // Ambiguous: one line naming the candidates, exit 2, for every id-taking command.
    for command in ["show", "replay", "events", "verify", "resume", "approve"] {
        let output = nerve(&db, &[command, "0192f0c"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{command}: {}",
            stderr(&output)
        );
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
        assert!(err.contains("ambiguous"), "{command}: {err}");
        for id in [A, B, C] {
            assert!(err.contains(id), "{command}: {err}");
        }
    }

    // No match: one line, exit 2.
    for prefix in ["0193", "ffff-"] {
        let output = nerve(&db, &["show", prefix]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("no execution id starts with `{prefix}`")),
            "{err}"
        );
    }

    // Not an id at all: the parse error, one line, exit 2.
    let output = nerve(&db, &["show", "not-an-id"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("is not a valid execution id"),
        "{}",
        stderr(&output)
    );
    assert_eq!(stderr(&output).lines().count(), 1);
}
