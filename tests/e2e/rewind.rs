//! Workspace checkpoints through the `nerve` binary, in the real sandbox
//! (docs/checkpoints.md): a ten-turn scripted run that creates, edits and deletes files (a
//! binary one in a new directory), `nerve diff` per turn, `nerve rewind --turn 3` giving
//! back the exact tree of an identical run stopped after turn 3, the refusal when a person
//! edited the workspace after the run (and `--force`), an ignored 200 MB `build/` that no
//! snapshot walks into, and `resume` telling the model what changed outside the execution.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::crash::{replay_json, verify};
use crate::support::{events_json, last_json, nerve, sandbox_available, stderr, stdout, tree};

fn write(path: &str, content: &str) -> Value {
    json!({"text": format!("Write {path}."), "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]})
}

fn shell(command: &str) -> Value {
    json!({"text": "Run a command.", "tool_calls": [{"name": "shell", "arguments": {"command": command}}]})
}

fn edit(path: &str, old: &str, new: &str) -> Value {
    json!({"text": format!("Edit {path}."), "tool_calls": [{"name": "edit_file", "arguments": {"path": path, "old_text": old, "new_text": new}}]})
}

/// The ten tool turns, each with the paths it adds, modifies and deletes.
pub(crate) fn turns() -> Vec<(Value, BTreeSet<&'static str>)> {
    let set = |paths: &[&'static str]| paths.iter().copied().collect::<BTreeSet<_>>();
    vec![
        (write("src/main.py", "print('a')\n"), set(&["src/main.py"])),
        (write("notes.txt", "one\n"), set(&["notes.txt"])),
        (
            shell("mkdir -p data/deep && printf '\\000\\001\\002\\377' > data/deep/blob.bin"),
            set(&["data/deep/blob.bin"]),
        ),
        (
            edit("src/main.py", "print('a')", "print('b')"),
            set(&["src/main.py"]),
        ),
        (shell("rm notes.txt"), set(&["notes.txt"])),
        (
            json!({"text": "Read it.", "tool_calls": [{"name": "read_file", "arguments": {"path": "src/main.py"}}]}),
            set(&[]),
        ),
        (write("README.md", "# demo\n"), set(&["README.md"])),
        (shell("rm -r data"), set(&["data/deep/blob.bin"])),
        (write("src/main.py", "print('c')\n"), set(&["src/main.py"])),
        (
            shell("cp keep.txt keep-copy.txt && echo more >> keep.txt"),
            set(&["keep.txt", "keep-copy.txt"]),
        ),
    ]
}

/// A workspace with a tracked file, a `.gitignore` and an ignored 200 MB `build/` whose
/// access time is set in the past (a directory listing would move it).
fn workspace(dir: &Path) -> PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(workspace.join("build/objects")).unwrap();
    std::fs::write(workspace.join("keep.txt"), "keep\n").unwrap();
    std::fs::create_dir(workspace.join("docs")).unwrap();
    std::fs::write(workspace.join("docs/guide.md"), "# guide\n").unwrap();
    std::fs::write(workspace.join(".gitignore"), "build/\n").unwrap();
    let big = vec![7u8; 1 << 20];
    let mut file = std::fs::File::create(workspace.join("build/big.bin")).unwrap();
    for _ in 0..200 {
        std::io::Write::write_all(&mut file, &big).unwrap();
    }
    for i in 0..200 {
        std::fs::write(workspace.join(format!("build/objects/{i}.o")), [i as u8]).unwrap();
    }
    workspace
}

fn set_old_atime(path: &Path) {
    let old = SystemTime::now() - Duration::from_secs(86_400 * 400);
    let file = std::fs::File::open(path).unwrap();
    file.set_times(std::fs::FileTimes::new().set_accessed(old))
        .unwrap();
}

fn atime(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().accessed().unwrap()
}

/// Runs `lines` as a scripted run on `workspace`; returns the execution id.
pub(crate) fn run(dir: &Path, db: &Path, workspace: &Path, lines: &[Value]) -> String {
    run_exiting(dir, db, workspace, lines, 0)
}

fn run_exiting(dir: &Path, db: &Path, workspace: &Path, lines: &[Value], code: i32) -> String {
    run_with(dir, db, workspace, lines, code, &[]).0
}

/// [`run_exiting`] with more environment variables; the execution id and the output.
fn run_with(
    dir: &Path,
    db: &Path,
    workspace: &Path,
    lines: &[Value],
    code: i32,
    env: &[(&str, &str)],
) -> (String, std::process::Output) {
    let script = dir.join(format!(
        "cassette-{}.jsonl",
        db.file_stem().unwrap().to_string_lossy()
    ));
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&script, text).unwrap();
    let output = crate::support::nerve_env(
        db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Shape the workspace.",
            "--provider",
            &format!("script:{}", script.display()),
            "--max-turns",
            &(lines.len() + 1).max(20).to_string(),
            "--json",
        ],
        env,
    );
    assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
    let summary = last_json(&output);
    (summary["execution_id"].as_str().unwrap().to_owned(), output)
}

/// The `workspace_snapshot` events of a log: turn → tree.
pub(crate) fn snapshots(events: &[Value]) -> BTreeMap<u64, String> {
    events
        .iter()
        .filter(|e| e["kind"] == "workspace_snapshot")
        .map(|e| {
            (
                e["payload"]["turn"].as_u64().unwrap(),
                e["payload"]["tree"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The paths a unified diff touches (`diff --git a/P b/P`).
fn diffed_paths(diff: &str) -> BTreeSet<String> {
    diff.lines()
        .filter_map(|line| line.strip_prefix("diff --git a/"))
        .map(|rest| rest.split(" b/").next().unwrap().to_owned())
        .collect()
}

/// Every file the snapshots cover: all but `build/`.
pub(crate) fn covered(workspace: &Path) -> BTreeMap<String, Vec<u8>> {
    tree(workspace)
        .into_iter()
        .filter(|(path, _)| !path.starts_with("build"))
        .collect()
}

#[test]
fn ten_turns_are_diffed_per_turn_and_rewound_to_turn_three() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let done = json!({"text": "The workspace is shaped."});
    let turns = turns();
    let mut lines: Vec<Value> = turns.iter().map(|(line, _)| line.clone()).collect();
    lines.push(done.clone());

    // The reference: an identical run that stops after turn 3.
    let reference_dir = dir.path().join("reference");
    std::fs::create_dir(&reference_dir).unwrap();
    let reference_ws = workspace(&reference_dir);
    let reference_db = dir.path().join("reference.db");
    let mut three: Vec<Value> = lines[..3].to_vec();
    three.push(done);
    let reference = run(dir.path(), &reference_db, &reference_ws, &three);
    let reference_tree = covered(&reference_ws);
    let reference_snapshots = snapshots(&events_json(&reference_db, &reference));

    let ws = workspace(dir.path());
    let db = dir.path().join("nerve.db");
    set_old_atime(&ws.join("build"));
    set_old_atime(&ws.join("build/objects"));
    set_old_atime(&ws.join("docs"));
    let build_atime = (atime(&ws.join("build")), atime(&ws.join("build/objects")));
    let docs_atime = atime(&ws.join("docs"));
    let id = run(dir.path(), &db, &ws, &lines);
    // The check below can fail: a directory the snapshots do walk has its access time moved.
    assert_ne!(
        atime(&ws.join("docs")),
        docs_atime,
        "access times do not move here"
    );

    // A snapshot at the start and after every turn that changed something (not turn 6,
    // which only read, nor turn 11, the answer).
    let events = events_json(&db, &id);
    let trees = snapshots(&events);
    assert_eq!(
        trees.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5, 7, 8, 9, 10],
        "{trees:?}"
    );
    // The same tree after turn 3 as the identical run's.
    assert_eq!(trees[&3], reference_snapshots[&3]);
    // The ignored build directory was never listed (its access time did not move), and is
    // in no snapshot.
    assert_eq!(
        (atime(&ws.join("build")), atime(&ws.join("build/objects"))),
        build_atime,
        "a snapshot walked into the ignored build/"
    );
    let whole = nerve(&db, &["diff", &id]);
    assert_eq!(whole.status.code(), Some(0), "{}", stderr(&whole));
    assert_eq!(
        diffed_paths(&stdout(&whole)),
        ["README.md", "keep-copy.txt", "keep.txt", "src/main.py"]
            .map(str::to_owned)
            .into(),
        "{}",
        stdout(&whole)
    );
    assert!(!stdout(&whole).contains("build/"));

    // `nerve diff --turn N` is what turn N did.
    for (n, (_, paths)) in turns.iter().enumerate() {
        let turn = (n + 1).to_string();
        let diff = nerve(&db, &["diff", &id, "--turn", &turn]);
        assert_eq!(diff.status.code(), Some(0), "{}", stderr(&diff));
        let text = stdout(&diff);
        let expected: BTreeSet<String> = paths.iter().map(|p| (*p).to_owned()).collect();
        assert_eq!(diffed_paths(&text), expected, "turn {turn}:\n{text}");
        if paths.is_empty() {
            assert_eq!(
                text.trim(),
                format!("turn {turn} did not change the workspace")
            );
        }
    }
    let turn3 = stdout(&nerve(&db, &["diff", &id, "--turn", "3"]));
    assert!(
        turn3.contains("Binary files /dev/null and b/data/deep/blob.bin differ"),
        "{turn3}"
    );
    let turn4 = stdout(&nerve(&db, &["diff", &id, "--turn", "4"]));
    assert!(
        turn4.contains("-print('a')") && turn4.contains("+print('b')"),
        "{turn4}"
    );
    let turn5 = stdout(&nerve(&db, &["diff", &id, "--turn", "5"]));
    assert!(turn5.contains("deleted file mode"), "{turn5}");

    // A person edits the workspace after the run: the rewind refuses, nothing changes.
    std::fs::write(ws.join("keep.txt"), "edited by a person\n").unwrap();
    let before = tree(&ws);
    let refused = nerve(&db, &["rewind", &id, "--turn", "3"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let line = stderr(&refused);
    assert_eq!(line.trim().lines().count(), 1, "{line}");
    assert!(
        line.contains("changed outside execution")
            && line.contains("keep.txt")
            && line.contains("--force"),
        "{line}"
    );
    assert_eq!(tree(&ws), before, "a refused rewind changed the workspace");

    // With --force: the exact tree of the identical run after turn 3, build/ untouched.
    let forced = nerve(&db, &["rewind", &id, "--turn", "3", "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert!(
        stdout(&forced).contains("rewound the workspace of execution"),
        "{}",
        stdout(&forced)
    );
    // Each changed path is printed once: under the counts, not in them too.
    let printed = stdout(&forced);
    let listed: Vec<&str> = printed.lines().skip(1).collect();
    assert!(!listed.is_empty(), "{printed}");
    for line in &listed {
        let path = line.split_whitespace().last().unwrap();
        assert_eq!(
            printed.matches(path).count(),
            1,
            "{path} twice in:\n{printed}"
        );
    }
    assert_eq!(covered(&ws), reference_tree);
    assert_eq!(
        std::fs::metadata(ws.join("build/big.bin")).unwrap().len(),
        200 << 20
    );
    assert_eq!(std::fs::read(ws.join("build/objects/7.o")).unwrap(), [7u8]);

    // The log explains the workspace: the rewind is an event, after the finish, and the
    // log still verifies and replays complete.
    let events = events_json(&db, &id);
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "workspace_rewound", "{last}");
    assert_eq!(last["payload"]["turn"], 3);
    assert_eq!(last["payload"]["tree"], trees[&3].as_str());
    assert_eq!(last["payload"]["forced"], true);
    verify(&db, &id);
    let replay = replay_json(&db, &id);
    assert_eq!(replay["complete"], true, "{replay}");
    assert_eq!(replay["termination_reason"], "completed", "{replay}");

    // Rewinding again to where it is changes nothing; back to turn 10 gives the run's end.
    let again = nerve(&db, &["rewind", &id, "--turn", "3"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).contains("already as it was after turn 3"));
    let forward = nerve(&db, &["rewind", &id, "--turn", "10"]);
    assert_eq!(forward.status.code(), Some(0), "{}", stderr(&forward));
    assert_eq!(
        std::fs::read_to_string(ws.join("src/main.py")).unwrap(),
        "print('c')\n"
    );
    assert!(!ws.join("data").exists());
}

/// A directory of recorders for the programs a snapshot could start (`git`, and the shells
/// that could run it): each appends its name and arguments to `calls`, then runs the real
/// one. Returns the `PATH` that puts them first.
fn recorders(dir: &Path, calls: &Path) -> String {
    let bin = dir.join("recorders");
    std::fs::create_dir(&bin).unwrap();
    for program in ["git", "sh", "bash"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {program} on this machine"));
        let script = bin.join(program);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"{program} $*\" >> '{}'\nexec {} \"$@\"\n",
                calls.display(),
                real.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Snapshots start no process on the host (issue 30): twelve turns that only read, then
/// twelve that each write a file, under a `PATH` whose `git` and `sh` record every call;
/// the snapshots are in the log (the start's, then one per writing turn) and nothing was
/// called. The recorder is shown to work first.
#[test]
fn snapshots_start_no_process_on_the_host() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.txt");
    let path = recorders(dir.path(), &calls);
    let shown = std::process::Command::new("git")
        .arg("--version")
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(shown.status.success());
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "git --version\n",
        "the recorder records"
    );
    std::fs::remove_file(&calls).unwrap();

    let ws = dir.path().join("workspace");
    std::fs::create_dir(&ws).unwrap();
    for i in 0..12 {
        std::fs::write(ws.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let mut lines: Vec<Value> = (0..12)
        .map(|i| json!({"text": "Read.", "tool_calls": [{"name": "read_file", "arguments": {"path": format!("f{i}.txt")}}]}))
        .collect();
    lines.extend((0..12).map(|i| write(&format!("new/w{i}.txt"), "written\n")));
    lines.push(json!({"text": "Done."}));
    let db = dir.path().join("nerve.db");
    let (id, output) = run_with(dir.path(), &db, &ws, &lines, 0, &[("PATH", &path)]);
    let trees = snapshots(&events_json(&db, &id));
    let expected: Vec<u64> = std::iter::once(0).chain(13..=24).collect();
    assert_eq!(trees.keys().copied().collect::<Vec<_>>(), expected);
    assert!(
        !calls.exists(),
        "processes started: {}",
        std::fs::read_to_string(&calls).unwrap_or_default()
    );
    assert!(!stderr(&output).contains("snapshot"), "{}", stderr(&output));
}

#[test]
fn diff_and_rewind_explain_what_they_cannot_do_in_one_line() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("workspace");
    std::fs::create_dir(&ws).unwrap();
    let db = dir.path().join("nerve.db");
    let id = run(
        dir.path(),
        &db,
        &ws,
        &[write("a.txt", "a\n"), json!({"text": "Done."})],
    );
    // (arguments, what the error names, whether it is ours: one line; clap's usage
    // errors add a hint line)
    let cases: [(&[&str], &str, bool); 5] = [
        (
            &["diff", &id, "--turn", "9"],
            "has no turn 9 (it has 2)",
            true,
        ),
        (
            &["rewind", &id, "--turn", "9"],
            "has no turn 9 (it has 2)",
            true,
        ),
        (
            &["diff", "01234567-89ab-7def-8123-456789abcdef"],
            "01234567-89ab-7def-8123-456789abcdef",
            true,
        ),
        (&["diff", &id, "--turn", "0"], "--turn", false),
        (&["rewind", &id], "--turn", false),
    ];
    for (args, needle, ours) in cases {
        let output = nerve(&db, args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        let line = stderr(&output);
        assert!(line.contains(needle), "{args:?}: {line}");
        if ours {
            assert_eq!(line.trim().lines().count(), 1, "{args:?}: {line}");
        }
    }
    // The store removed: one line naming it.
    let store = dir.path().join("checkpoints").join(&id);
    assert!(
        store.join("HEAD").is_file(),
        "the store lives beside the log"
    );
    // NERVE_CHECKPOINTS names where stores are looked for (and made).
    let elsewhere = dir.path().join("elsewhere");
    let output = crate::support::nerve_env(
        &db,
        &["diff", &id],
        &[("NERVE_CHECKPOINTS", elsewhere.to_str().unwrap())],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&elsewhere.join(&id).display().to_string()),
        "{}",
        stderr(&output)
    );
    std::fs::rename(&store, dir.path().join("moved")).unwrap();
    let output = nerve(&db, &["diff", &id]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("snapshot store") && stderr(&output).contains("missing"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_resume_tells_the_model_what_changed_outside_the_execution() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("workspace");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("old.txt"), "old\n").unwrap();
    let db = dir.path().join("nerve.db");
    let lines = [
        write("one.txt", "one\n"),
        json!({"error": "auth"}),
        write("two.txt", "two\n"),
        json!({"text": "Done."}),
    ];
    let id = run_exiting(dir.path(), &db, &ws, &lines, 1);
    // A person's edits between the failure and the resume.
    std::fs::write(ws.join("one.txt"), "one, edited\n").unwrap();
    std::fs::remove_file(ws.join("old.txt")).unwrap();
    std::fs::write(ws.join("new.txt"), "new\n").unwrap();
    let resumed = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));

    let events = events_json(&db, &id);
    let outside: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "workspace_snapshot" && e["payload"]["outside"].is_array())
        .collect();
    assert_eq!(outside.len(), 1, "{events:?}");
    assert_eq!(
        outside[0]["payload"]["outside"],
        json!([
            {"change": "added", "path": "new.txt"},
            {"change": "deleted", "path": "old.txt"},
            {"change": "modified", "path": "one.txt"},
        ])
    );
    let told = events
        .iter()
        .filter(|e| e["kind"] == "message_appended")
        .filter_map(|e| e["payload"]["message"]["parts"][0]["text"].as_str())
        .find(|text| text.contains("The workspace changed since its last snapshot"))
        .expect("the model was told");
    assert!(
        told.contains("added new.txt; modified one.txt; deleted old.txt"),
        "{told}"
    );
    // Turn 2 (after the resume) changed two.txt only: the person's edits are not its own.
    let turn2 = stdout(&nerve(&db, &["diff", &id, "--turn", "2"]));
    assert_eq!(
        diffed_paths(&turn2),
        BTreeSet::from(["two.txt".to_owned()]),
        "{turn2}"
    );
    verify(&db, &id);
}

#[test]
fn chat_shows_the_diff_and_undoes_one_change_at_a_time() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("workspace");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("keep.txt"), "keep\n").unwrap();
    let db = dir.path().join("nerve.db");
    let script = dir.path().join("cassette.jsonl");
    let lines = [
        write("a.txt", "alpha\n"),
        write("b.txt", "beta\n"),
        json!({"text": "Written."}),
        json!({"text": "Noted."}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&script, text).unwrap();
    let provider = format!("script:{}", script.display());
    let chat = crate::support::chat_piped(
        &db,
        &["--workspace", ws.to_str().unwrap(), "--provider", &provider],
        &dir.path().join("state"),
        b"/diff\nWrite the notes.\n/diff\n/diff last\n/undo\n/undo\n/undo\nGo on.\n/exit\n",
    );
    assert_eq!(chat.status.code(), Some(0), "{}", stderr(&chat));
    let text = stdout(&chat);
    let after = |marker: &str| text.split(marker).nth(1).unwrap_or_default().to_owned();
    assert!(
        after("› /diff\n").starts_with("nothing yet"),
        "/diff before the first message: {text}"
    );
    // The whole execution, then the last turn that changed something.
    let whole = after("Written.");
    let whole = whole.split("› /diff last").next().unwrap();
    assert_eq!(
        diffed_paths(whole),
        BTreeSet::from(["a.txt".to_owned(), "b.txt".to_owned()]),
        "{text}"
    );
    let last = after("› /diff last");
    let last = last.split("› /undo").next().unwrap();
    assert_eq!(
        diffed_paths(last),
        BTreeSet::from(["b.txt".to_owned()]),
        "{text}"
    );
    // Each /undo takes one change back; then there is nothing left to undo.
    assert!(
        text.contains("to turn 1: 1 deleted\n  deleted  b.txt\n"),
        "{text}"
    );
    assert!(
        text.contains("to turn 0: 1 deleted\n  deleted  a.txt\n"),
        "{text}"
    );
    assert!(text.contains("nothing to undo"), "{text}");
    assert!(text.contains("Noted."), "{text}");
    assert_eq!(
        tree(&ws),
        BTreeMap::from([("keep.txt".to_owned(), b"keep\n".to_vec())])
    );

    // The next message was told what the undos changed, and the log says all of it.
    let id = {
        let list = nerve(&db, &["list", "--json"]);
        let list: Value = serde_json::from_str(stdout(&list).trim()).unwrap();
        list[0]["execution_id"].as_str().unwrap().to_owned()
    };
    let events = events_json(&db, &id);
    let rewinds: Vec<u64> = events
        .iter()
        .filter(|e| e["kind"] == "workspace_rewound")
        .map(|e| e["payload"]["turn"].as_u64().unwrap())
        .collect();
    assert_eq!(rewinds, [1, 0]);
    let outside = events
        .iter()
        .find(|e| e["kind"] == "workspace_snapshot" && e["payload"]["outside"].is_array())
        .expect("the follow-up found the workspace changed");
    assert_eq!(
        outside["payload"]["outside"],
        json!([
            {"change": "deleted", "path": "a.txt"},
            {"change": "deleted", "path": "b.txt"},
        ])
    );
    verify(&db, &id);
}

/// Issue 32, item 11: a rewind run by root on a workspace that belongs to someone else
/// (uid 4242, mode 0640) gives each file its owner and mode back; `diff` after the rewind
/// says what the execution did and where the rewind left the workspace; and `diff` still
/// works from the snapshots once the workspace directory is gone.
#[test]
fn a_rewind_by_root_restores_owners_and_modes_and_diff_tells_the_truth_after_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A file this process makes is owned by its effective uid.
    std::fs::write(dir.path().join("probe"), "").unwrap();
    if std::fs::metadata(dir.path().join("probe")).unwrap().uid() != 0 {
        eprintln!("skipping: restoring another user's ownership takes root");
        return;
    }
    let db = dir.path().join("nerve.db");
    let ws = dir.path().join("workspace");
    std::fs::create_dir_all(ws.join("dir")).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    std::fs::write(ws.join("dir/b.txt"), "bee\n").unwrap();
    for path in [ws.clone(), ws.join("dir")] {
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
    }
    for path in [ws.join("a.txt"), ws.join("dir/b.txt")] {
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    let id = run(
        dir.path(),
        &db,
        &ws,
        &[
            write("a.txt", "two\n"),
            shell("rm -r dir && echo new > c.txt"),
            json!({"text": "Done."}),
        ],
    );
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "two\n");

    let rewound = nerve(&db, &["rewind", &id, "--turn", "0"]);
    assert_eq!(rewound.status.code(), Some(0), "{}", stderr(&rewound));
    for (path, content) in [("a.txt", "one\n"), ("dir/b.txt", "bee\n")] {
        let full = ws.join(path);
        assert_eq!(std::fs::read_to_string(&full).unwrap(), content, "{path}");
        let meta = std::fs::metadata(&full).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (4242, 4242, 0o640),
            "{path}"
        );
    }
    let made = std::fs::metadata(ws.join("dir")).unwrap();
    assert_eq!(
        (made.uid(), made.gid()),
        (4242, 4242),
        "a directory made again"
    );
    assert!(!ws.join("c.txt").exists());

    // What the execution changed, and then where the rewind left the workspace.
    let diff = nerve(&db, &["diff", &id]);
    assert_eq!(diff.status.code(), Some(0), "{}", stderr(&diff));
    let text = stdout(&diff);
    assert!(text.contains("+two") && text.contains("-bee"), "{text}");
    assert!(
        !text.contains("left the workspace as it found it"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with(
            "(since then the workspace was rewound to turn 0: it is as the run found it)"
        ),
        "{text}"
    );

    // The workspace gone: the snapshots still tell what the execution changed.
    std::fs::remove_dir_all(&ws).unwrap();
    let gone = nerve(&db, &["diff", &id]);
    assert_eq!(gone.status.code(), Some(0), "{}", stderr(&gone));
    assert_eq!(stdout(&gone), text);
    let turn = nerve(&db, &["diff", &id, "--turn", "1"]);
    assert_eq!(turn.status.code(), Some(0), "{}", stderr(&turn));
    assert!(stdout(&turn).contains("+two"), "{}", stdout(&turn));
}
