//! Project instructions (the agents.md convention): the user's own file and the workspace
//! root's `AGENTS.md` (or `CLAUDE.md`) join the system prompt at the start; a directory's
//! own file joins the conversation when the agent first works under that directory (the
//! nearest file above what it touches wins), appended to that call's result. Every file the
//! model is given is recorded (`instructions_loaded`: path, size, SHA-256), and its text is in
//! the recorded message, so replay shows exactly what the model was told.
//!
//! Workspace files are read through the sandbox's view of the workspace
//! ([`ToolExecutor::read_text`]: confined like `read_file`), never from the host.

use std::collections::HashMap;

use nerve_core::event::{InstructionsFile, InstructionsSource};
use nerve_core::{Message, MessagePart, ToolCall, ToolExecutor};

/// The names looked for in a directory, in order: `AGENTS.md`, else `CLAUDE.md`.
pub const FILE_NAMES: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];

/// The most of one file the model is given, in bytes (Codex's default bound too); the rest
/// is cut, and the record says so.
pub const MAX_BYTES: usize = 32 * 1024;

/// What a directory's file's text is introduced by in a tool result; also how a resumed run
/// finds the files it was given already.
const NESTED_MARK: &str = "[Project instructions from ";

/// Whether and which project instructions an execution reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstructionsConfig {
    /// Read the workspace's files (`--no-project-instructions` turns this and `user` off).
    /// Off by default: a front end turns it on.
    pub workspace: bool,
    /// The user's own file, read by the front end on the host.
    pub user: Option<UserInstructions>,
}

/// The user's file of instructions, as the front end read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInstructions {
    /// Where it was read (shown and recorded).
    pub path: String,
    pub text: String,
}

/// One file's text as the model gets it, with its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub(crate) file: InstructionsFile,
    pub(crate) text: String,
}

/// `text` cut at the bound, with its record.
pub(crate) fn bounded(source: InstructionsSource, path: &str, text: &str) -> Loaded {
    let kept = nerve_core::text::clip(text, MAX_BYTES);
    let digest = ring::digest::digest(&ring::digest::SHA256, kept.as_bytes());
    Loaded {
        file: InstructionsFile {
            source,
            path: path.to_owned(),
            sha256: digest.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
            bytes: kept.len() as u64,
            truncated: kept.len() < text.len(),
        },
        text: kept.to_owned(),
    }
}

/// The workspace root's file (`AGENTS.md`, else `CLAUDE.md`), when it has one with text.
pub(crate) async fn root(tools: &dyn ToolExecutor) -> Option<Loaded> {
    read_dir_file(tools, "").await
}

/// The files of the start, as the section appended to the system prompt.
pub(crate) fn system_section(loaded: &[Loaded]) -> String {
    let mut out = String::from(
        "\n\n# Project instructions\n\nFollow these instructions from the user and the project. \
         A directory's own instructions, shown when you first work under it, take precedence \
         over these for the files under it.",
    );
    for one in loaded {
        let from = match one.file.source {
            InstructionsSource::User => format!("The user's instructions ({})", one.file.path),
            InstructionsSource::Workspace => format!("{} at the workspace root", one.file.path),
        };
        out.push_str(&format!("\n\n## {from}\n\n{}", one.text.trim_end()));
    }
    out
}

/// What follows a call's result when the call brought in a directory's file.
pub(crate) fn nested_note(loaded: &Loaded) -> String {
    let dir = loaded.file.path.rsplit_once('/').map_or("", |(dir, _)| dir);
    format!(
        "\n\n{NESTED_MARK}{}, for the files under {dir}/; they take precedence over the root's \
         there:]\n{}",
        loaded.file.path,
        loaded.text.trim_end()
    )
}

/// Which directories have been looked in, and what was found: each directory is read at
/// most once per attempt, and a file is given to the model once.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Directory (relative, `a/b`) → the file found there, if any.
    probed: HashMap<String, Option<String>>,
}

impl Tracker {
    /// The tracker of a conversation that may hold files given before (a resume, a
    /// follow-up): those are not given again.
    pub(crate) fn resumed(messages: &[Message]) -> Self {
        let mut tracker = Self::default();
        for message in messages {
            for part in &message.parts {
                let MessagePart::ToolResult(result) = part else {
                    continue;
                };
                // Ends: each mark found moves `rest` past it.
                let mut rest = result.content.as_str();
                while let Some(at) = rest.find(NESTED_MARK) {
                    rest = &rest[at + NESTED_MARK.len()..];
                    if let Some((path, _)) = rest.split_once(", for the files under ")
                        && let Some((dir, _)) = path.rsplit_once('/')
                    {
                        tracker.probed.insert(dir.to_owned(), Some(path.to_owned()));
                    }
                }
            }
        }
        tracker
    }

    /// The directory file `call` brings in, when it works under a directory (below the
    /// root) whose nearest file has not been given yet. Looks in each directory not looked
    /// in before, deepest first, and stops at the first file.
    pub(crate) async fn nested(
        &mut self,
        tools: &dyn ToolExecutor,
        call: &ToolCall,
    ) -> Option<Loaded> {
        let dirs = dirs_of(call)?;
        // Ends: `dirs` is finite (one per path component).
        for dir in dirs {
            match self.probed.get(&dir) {
                // The nearest file was found before, so it was given then.
                Some(Some(_)) => return None,
                Some(None) => continue,
                None => {}
            }
            let found = read_dir_file(tools, &dir).await;
            self.probed
                .insert(dir, found.as_ref().map(|l| l.file.path.clone()));
            if found.is_some() {
                return found;
            }
        }
        None
    }
}

/// The first of [`FILE_NAMES`] in `dir` (relative; `""` the root) with any text.
async fn read_dir_file(tools: &dyn ToolExecutor, dir: &str) -> Option<Loaded> {
    for name in FILE_NAMES {
        let path = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        if let Some(text) = tools.read_text(&path).await
            && !text.trim().is_empty()
        {
            return Some(bounded(InstructionsSource::Workspace, &path, &text));
        }
    }
    None
}

/// The directories below the root that `call` works under, deepest first: a file tool's
/// file's directories, a listing's or search's directory and those above it, a command's
/// `workdir`. `None` for a call that names no place, or one outside the workspace.
fn dirs_of(call: &ToolCall) -> Option<Vec<String>> {
    let arg = |key: &str| call.arguments.get(key).and_then(|v| v.as_str());
    let (path, is_file) = match call.name.as_str() {
        "read_file" | "write_file" | "edit_file" => (arg("path")?, true),
        "list_dir" | "grep" => (arg("path")?, false),
        "shell" => (arg("workdir")?, false),
        _ => return None,
    };
    let mut parts = normalise(path)?;
    if is_file {
        parts.pop();
    }
    let mut dirs = Vec::with_capacity(parts.len());
    // Ends: one fewer component each time.
    while !parts.is_empty() {
        dirs.push(parts.join("/"));
        parts.pop();
    }
    Some(dirs)
}

/// `path` as components below the workspace root (`/workspace/a/./b/../c` → `[a, c]`);
/// `None` when it leaves the root.
fn normalise(path: &str) -> Option<Vec<&str>> {
    let relative = match path.strip_prefix("/workspace") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ if path.starts_with('/') => return None,
        _ => path,
    };
    let mut parts = Vec::new();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use nerve_core::{ToolDefinition, ToolError, ToolOutput};
    use serde_json::json;

    /// A workspace of files, read as the sandbox would.
    struct Files(
        Vec<(&'static str, &'static str)>,
        std::sync::Mutex<Vec<String>>,
    );

    #[async_trait]
    impl ToolExecutor for Files {
        fn definitions(&self) -> Vec<ToolDefinition> {
            Vec::new()
        }
        async fn execute(&self, _call: &ToolCall) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::error("no tools"))
        }
        async fn read_text(&self, path: &str) -> Option<String> {
            self.1.lock().unwrap().push(path.to_owned());
            self.0
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, t)| (*t).to_owned())
        }
    }

    fn call(name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments,
        }
    }

    fn check_dirs(name: &str, arguments: serde_json::Value, expected: Option<&[&str]>) {
        let got = dirs_of(&call(name, arguments));
        let expected = expected.map(|e| e.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(got, expected);
    }

    #[test]
    fn the_directories_a_call_works_under() {
        check_dirs(
            "read_file",
            json!({"path": "a/b/c.rs"}),
            Some(&["a/b", "a"]),
        );
        check_dirs(
            "write_file",
            json!({"path": "/workspace/a/x"}),
            Some(&["a"]),
        );
        check_dirs("edit_file", json!({"path": "./a/../b/x"}), Some(&["b"]));
        check_dirs("list_dir", json!({"path": "a/b"}), Some(&["a/b", "a"]));
        check_dirs("read_file", json!({"path": "top.rs"}), Some(&[]));
        check_dirs("read_file", json!({"path": "../etc/passwd"}), None);
        check_dirs("read_file", json!({"path": "/etc/passwd"}), None);
        check_dirs("read_file", json!({"path": "/workspaces/x/y"}), None);
        check_dirs("shell", json!({"command": "ls"}), None);
        check_dirs(
            "shell",
            json!({"command": "ls", "workdir": "x"}),
            Some(&["x"]),
        );
        check_dirs("http_request", json!({"url": "a/b"}), None);
    }

    #[tokio::test]
    async fn the_nearest_file_wins_once_and_each_directory_is_read_once() {
        let files = Files(
            vec![
                ("AGENTS.md", "root"),
                ("a/AGENTS.md", "in a"),
                ("a/b/CLAUDE.md", "claude in a/b"),
            ],
            std::sync::Mutex::default(),
        );
        assert_eq!(root(&files).await.unwrap().text, "root");
        let mut tracker = Tracker::default();
        let deep = tracker
            .nested(&files, &call("read_file", json!({"path": "a/b/x.rs"})))
            .await
            .unwrap();
        assert_eq!(deep.file.path, "a/b/CLAUDE.md");
        // Under a/b again: given already.
        let again = tracker
            .nested(&files, &call("read_file", json!({"path": "a/b/y.rs"})))
            .await;
        assert_eq!(again, None);
        // a itself was never looked in (a/b's file was nearer); now it is.
        let a = tracker
            .nested(&files, &call("list_dir", json!({"path": "a"})))
            .await
            .unwrap();
        assert_eq!(a.file.path, "a/AGENTS.md");
        assert_eq!(a.file.bytes, 4);
        let reads = files.1.lock().unwrap().clone();
        assert_eq!(
            reads,
            ["AGENTS.md", "a/b/AGENTS.md", "a/b/CLAUDE.md", "a/AGENTS.md"]
        );
        // A resumed conversation that holds both notes gives neither again.
        let result = nerve_core::ToolResult {
            call_id: "c".into(),
            name: "read_file".into(),
            content: format!("x{}{}", nested_note(&deep), nested_note(&a)),
            is_error: false,
        };
        let mut resumed = Tracker::resumed(&[Message::tool_result(result)]);
        let none = resumed
            .nested(&files, &call("read_file", json!({"path": "a/b/z"})))
            .await;
        assert_eq!(none, None);
    }

    #[test]
    fn a_long_file_is_cut_at_the_bound_and_says_so() {
        let text = "é".repeat(MAX_BYTES);
        let loaded = bounded(InstructionsSource::Workspace, "AGENTS.md", &text);
        assert!(loaded.file.truncated);
        assert!(loaded.text.len() <= MAX_BYTES);
        let short = bounded(InstructionsSource::User, "u", "test");
        assert!(!short.file.truncated);
        assert_eq!(
            short.file.sha256,
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
