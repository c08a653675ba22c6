//! The wire protocol between the host (`nerve-hands`) and the executor: one JSON object per line.
//!
//! A request is `{"id": <u64>, "op": "<name>", ...fields}`. The executor answers every request
//! with exactly one line, in order: `{"id": <u64>, "ok": true, ...fields}` on success or
//! `{"id": <u64 or null>, "ok": false, "error": "<one line>"}` on failure. The host knows which op
//! it sent for an id, so success lines carry no op tag; [`decode_response`] reads one with the
//! output type the host expects.
//!
//! A command that exits non-zero or times out is a success at this level (`ok: true` with the
//! exit status as data): `ok: false` means the executor could not do what was asked.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};

/// The executor's version, answered to `ping` so the host can refuse a stale binary.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the host and echoed in the response.
    pub id: u64,
    /// What to do; serialised flat, with the variant name in `op`.
    #[serde(flatten)]
    pub op: Op,
}

/// The operations the executor understands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Run a shell command; answered with [`ExecOutput`].
    Exec(ExecRequest),
    /// Read lines of a file; answered with [`ReadFileOutput`].
    ReadFile(ReadFileRequest),
    /// Create or replace a file; answered with [`WriteFileOutput`].
    WriteFile(WriteFileRequest),
    /// Replace text in a file; answered with [`EditFileOutput`].
    EditFile(EditFileRequest),
    /// List a directory; answered with [`ListDirOutput`].
    ListDir(ListDirRequest),
    /// Search file contents with a regex; answered with [`GrepOutput`].
    Grep(GrepRequest),
    /// Readiness check; answered with [`Pong`].
    Ping,
    /// Start a long-lived process whose stdio goes to a one-off host socket; answered with
    /// [`SpawnOutput`].
    Spawn(SpawnRequest),
    /// Signal a spawned process's group; answered with [`SignalOutput`].
    Signal(SignalRequest),
    /// Interrupt the command that is running, if any; answered with [`InterruptOutput`].
    /// The executor does not wait for this line to be read: any request line that arrives
    /// while an `exec` runs interrupts that command (its group gets SIGINT, and SIGKILL
    /// after the grace period), which then answers with `interrupted: true`. The host sends
    /// this op to say so explicitly; when read, nothing is left to interrupt.
    Interrupt,
}

/// `spawn`: start `argv` in its own process group, in the workspace, with its stdin and
/// stdout on one connection to `socket` and its stderr on another. Each connection first
/// carries a [`StreamHello`] line. The executor does not wait for the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The program and its arguments; the program is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Added to (or overriding) the executor's own environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the workspace; the workspace root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The host's one-off unix socket, as a path inside the container.
    pub socket: String,
    /// Echoed in each connection's hello line, so the host can tell the executor's
    /// connections from anyone else's. At least 16 characters.
    pub nonce: String,
}

/// The first line on each connection a `spawn` makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHello {
    /// The request's nonce.
    pub nonce: String,
    /// `stdio` (the process's stdin and stdout) or `stderr`.
    pub stream: String,
}

/// `signal`: send `term` or `kill` to a spawned process's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// The pid `spawn` answered (the group's id).
    pub pid: u32,
    /// `term` or `kill`.
    pub signal: String,
}

/// The answer to `spawn`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnOutput {
    /// The process's pid inside the container, also its process group's id.
    pub pid: u32,
}

/// The answer to `interrupt`: it says nothing, the interrupted command's answer does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptOutput {}

/// The answer to `signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOutput {
    /// Some member of the group was still there to receive it.
    pub delivered: bool,
}

/// `exec`: run `/bin/sh -c command` in its own process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Shell source passed to `sh -c`.
    pub command: String,
    /// Working directory inside the workspace; the workspace root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Wall-clock limit; the whole process group is killed when it passes. Must be positive.
    pub timeout_ms: u64,
    /// Per stream: at most this many bytes of stdout (and of stderr) are kept, half from the
    /// start and half from the end.
    pub max_output_bytes: u64,
    /// Added to (or overriding) the executor's own environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// When interrupted: how long the command has between SIGINT and SIGKILL; the
    /// executor's default (`INTERRUPT_GRACE`, 2 s) when absent. At most `timeout_ms` still
    /// applies: the deadline kills the group whatever the grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt_grace_ms: Option<u64>,
}

/// `read_file`: a window of lines from a regular file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileRequest {
    /// Workspace-relative path (a leading `/workspace/` is accepted).
    pub path: String,
    /// Lines to skip first (0-based); 0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Lines to return at most; the executor's default (2,000) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `write_file`: create or truncate a regular file, creating parent directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileRequest {
    /// Workspace-relative path.
    pub path: String,
    /// The complete new content.
    pub content: String,
}

/// `edit_file`: replace `old_text` with `new_text` in a UTF-8 file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditFileRequest {
    /// Workspace-relative path.
    pub path: String,
    /// Exact text to find; must match exactly once unless `replace_all`.
    pub old_text: String,
    /// Replacement text.
    pub new_text: String,
    /// Replace every occurrence instead of requiring a unique one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace_all: bool,
}

/// `list_dir`: the entries of one directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDirRequest {
    /// Workspace-relative path; the workspace root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `grep`: a regex over the regular files beneath a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepRequest {
    /// Rust `regex` syntax, matched against each line.
    pub pattern: String,
    /// A file or directory; the workspace root when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only files whose name (or, if the glob contains `/`, whose workspace-relative path)
    /// matches, e.g. `*.rs`, `*.{rs,toml}`, `src/**/*.rs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
}

/// The answer to `exec`. A non-zero exit, a signal or a timeout is data, not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    /// The shell's exit code, absent when it was killed by a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed the shell (9 after a timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The deadline passed and the process group was killed.
    pub timed_out: bool,
    /// The host interrupted the command (a request arrived while it ran): its group got
    /// SIGINT, then SIGKILL if it was still there after the grace period.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Captured stdout, lossily decoded. When bytes were omitted, the head and the tail are
    /// joined by a line `[... N bytes omitted ...]`.
    pub stdout: String,
    /// Captured stderr, like `stdout`.
    pub stderr: String,
    /// Bytes of stdout that were dropped from the middle.
    pub stdout_omitted_bytes: u64,
    /// Bytes of stderr that were dropped from the middle.
    pub stderr_omitted_bytes: u64,
    /// Wall-clock time from spawn to the response.
    pub duration_ms: u64,
}

/// The answer to `read_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileOutput {
    /// The lines, with their line endings, lossily decoded.
    pub content: String,
    /// How many lines `content` holds.
    pub lines: u64,
    /// The file's size in bytes.
    pub size: u64,
    /// Present when more lines follow: the `offset` that continues the read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// Why the window is shorter than asked, when it is (a size cap, a cut line, past EOF).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The answer to `write_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteFileOutput {
    /// Bytes written.
    pub bytes: u64,
    /// The file did not exist before.
    pub created: bool,
}

/// The answer to `edit_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditFileOutput {
    /// How many occurrences were replaced.
    pub replacements: u64,
}

/// The answer to `list_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDirOutput {
    /// Entries sorted by name, at most the executor's cap (1,000).
    pub entries: Vec<DirEntry>,
    /// How many entries the directory has; more than `entries.len()` when capped.
    pub total: u64,
}

/// One directory entry. Symlinks are reported, never followed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name (lossily decoded).
    pub name: String,
    /// What kind of file it is.
    pub kind: EntryKind,
    /// Size in bytes, for regular files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// The type marker of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// A FIFO, socket or device.
    Special,
}

/// The answer to `grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepOutput {
    /// `path:line:text`, path workspace-relative, line 1-based, files in sorted order.
    pub matches: Vec<String>,
    /// The match cap or the file cap was reached; there may be more.
    pub truncated: bool,
}

/// The answer to `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// [`VERSION`] of the executor that answered.
    pub version: String,
}

/// What a successful request produced; serialised as the output's fields only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// From `exec`.
    Exec(ExecOutput),
    /// From `read_file`.
    ReadFile(ReadFileOutput),
    /// From `write_file`.
    WriteFile(WriteFileOutput),
    /// From `edit_file`.
    EditFile(EditFileOutput),
    /// From `list_dir`.
    ListDir(ListDirOutput),
    /// From `grep`.
    Grep(GrepOutput),
    /// From `ping`.
    Pong(Pong),
    /// From `spawn`.
    Spawned(SpawnOutput),
    /// From `signal`.
    Signalled(SignalOutput),
    /// From `interrupt`.
    Interrupted(InterruptOutput),
}

/// One response line as the executor writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The request's id; `None` when the request line was too malformed to carry one.
    pub id: Option<u64>,
    /// The output, or a one-line error message naming the path and the problem.
    pub result: Result<Reply, String>,
}

impl Response {
    /// The response as one JSON line, without the trailing newline.
    pub fn to_line(&self) -> String {
        // Serialising these types cannot fail: every map key is a string and no value is a
        // float, so the fallback is unreachable in practice but keeps the executor alive.
        serde_json::to_string(self).unwrap_or_else(|e| {
            let error = format!("cannot encode response: {e}");
            serde_json::json!({"id": self.id, "ok": false, "error": error}).to_string()
        })
    }
}

impl Serialize for Response {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct OkLine<'a> {
            id: Option<u64>,
            ok: bool,
            #[serde(flatten)]
            reply: &'a Reply,
        }
        #[derive(Serialize)]
        struct ErrLine<'a> {
            id: Option<u64>,
            ok: bool,
            error: &'a str,
        }
        match &self.result {
            Ok(reply) => OkLine {
                id: self.id,
                ok: true,
                reply,
            }
            .serialize(serializer),
            Err(error) => ErrLine {
                id: self.id,
                ok: false,
                error,
            }
            .serialize(serializer),
        }
    }
}

/// A response line decoded by the host into the output type it expects for that id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<T> {
    /// The echoed id (`None` for an unparseable request).
    pub id: Option<u64>,
    /// The output, or the executor's error message.
    pub result: Result<T, String>,
}

/// Decodes one response line as `T` (e.g. [`ExecOutput`] for an `exec` request).
///
/// Fails only when the line is not a response at all or an `ok: true` line lacks `T`'s fields.
pub fn decode_response<T: DeserializeOwned>(line: &str) -> Result<Decoded<T>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Head {
        id: Option<u64>,
        ok: bool,
        #[serde(default)]
        error: Option<String>,
    }
    let value: serde_json::Value = serde_json::from_str(line)?;
    let head = Head::deserialize(&value)?;
    let result = if head.ok {
        Ok(T::deserialize(&value)?)
    } else {
        Err(head
            .error
            .unwrap_or_else(|| "error without a message".to_owned()))
    };
    Ok(Decoded {
        id: head.id,
        result,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `line` as a request and checks that it round-trips to the same JSON.
    fn check_request(line: &str, expected: Request) {
        let parsed: Request = serde_json::from_str(line).unwrap();
        assert_eq!(parsed, expected, "{line}");
        let again: Request =
            serde_json::from_str(&serde_json::to_string(&parsed).unwrap()).unwrap();
        assert_eq!(again, expected, "round trip of {line}");
    }

    #[test]
    fn requests_parse() {
        check_request(
            r#"{"id":7,"op":"ping"}"#,
            Request {
                id: 7,
                op: Op::Ping,
            },
        );
        check_request(
            r#"{"id":1,"op":"exec","command":"ls","timeout_ms":500,"max_output_bytes":100}"#,
            Request {
                id: 1,
                op: Op::Exec(ExecRequest {
                    command: "ls".into(),
                    workdir: None,
                    timeout_ms: 500,
                    max_output_bytes: 100,
                    env: BTreeMap::new(),
                    interrupt_grace_ms: None,
                }),
            },
        );
        check_request(
            r#"{"op":"exec","id":2,"command":"env","workdir":"src","timeout_ms":1,"max_output_bytes":0,"env":{"A":"b"},"interrupt_grace_ms":5000}"#,
            Request {
                id: 2,
                op: Op::Exec(ExecRequest {
                    command: "env".into(),
                    workdir: Some("src".into()),
                    timeout_ms: 1,
                    max_output_bytes: 0,
                    env: BTreeMap::from([("A".into(), "b".into())]),
                    interrupt_grace_ms: Some(5000),
                }),
            },
        );
        check_request(
            r#"{"id":3,"op":"read_file","path":"a.txt","offset":10,"limit":5}"#,
            Request {
                id: 3,
                op: Op::ReadFile(ReadFileRequest {
                    path: "a.txt".into(),
                    offset: Some(10),
                    limit: Some(5),
                }),
            },
        );
        check_request(
            r#"{"id":4,"op":"write_file","path":"a.txt","content":"x\n"}"#,
            Request {
                id: 4,
                op: Op::WriteFile(WriteFileRequest {
                    path: "a.txt".into(),
                    content: "x\n".into(),
                }),
            },
        );
        check_request(
            r#"{"id":5,"op":"edit_file","path":"a","old_text":"x","new_text":"y","replace_all":true}"#,
            Request {
                id: 5,
                op: Op::EditFile(EditFileRequest {
                    path: "a".into(),
                    old_text: "x".into(),
                    new_text: "y".into(),
                    replace_all: true,
                }),
            },
        );
        check_request(
            r#"{"id":6,"op":"list_dir"}"#,
            Request {
                id: 6,
                op: Op::ListDir(ListDirRequest { path: None }),
            },
        );
        check_request(
            r#"{"id":8,"op":"grep","pattern":"fn \\w+","glob":"*.rs"}"#,
            Request {
                id: 8,
                op: Op::Grep(GrepRequest {
                    pattern: r"fn \w+".into(),
                    path: None,
                    glob: Some("*.rs".into()),
                }),
            },
        );
    }

    #[test]
    fn bad_requests_are_refused() {
        for line in [
            r#"{"op":"ping"}"#,
            r#"{"id":1}"#,
            r#"{"id":1,"op":"launch"}"#,
            r#"{"id":1,"op":"exec","command":"ls"}"#,
            r#"{"id":-1,"op":"ping"}"#,
            "not json",
        ] {
            assert!(serde_json::from_str::<Request>(line).is_err(), "{line}");
        }
    }

    #[test]
    fn response_lines() {
        let exec = Response {
            id: Some(1),
            result: Ok(Reply::Exec(ExecOutput {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                interrupted: false,
                stdout: "hi\n".into(),
                stderr: String::new(),
                stdout_omitted_bytes: 0,
                stderr_omitted_bytes: 0,
                duration_ms: 3,
            })),
        };
        insta::assert_snapshot!(exec.to_line(), @r#"{"id":1,"ok":true,"exit_code":0,"timed_out":false,"stdout":"hi\n","stderr":"","stdout_omitted_bytes":0,"stderr_omitted_bytes":0,"duration_ms":3}"#);
        let killed = Response {
            id: Some(2),
            result: Ok(Reply::Exec(ExecOutput {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                interrupted: false,
                stdout: String::new(),
                stderr: String::new(),
                stdout_omitted_bytes: 0,
                stderr_omitted_bytes: 0,
                duration_ms: 300,
            })),
        };
        insta::assert_snapshot!(killed.to_line(), @r#"{"id":2,"ok":true,"signal":9,"timed_out":true,"stdout":"","stderr":"","stdout_omitted_bytes":0,"stderr_omitted_bytes":0,"duration_ms":300}"#);
        let read = Response {
            id: Some(3),
            result: Ok(Reply::ReadFile(ReadFileOutput {
                content: "a\n".into(),
                lines: 1,
                size: 4,
                next_offset: Some(1),
                note: None,
            })),
        };
        insta::assert_snapshot!(read.to_line(), @r#"{"id":3,"ok":true,"content":"a\n","lines":1,"size":4,"next_offset":1}"#);
        let write = Response {
            id: Some(4),
            result: Ok(Reply::WriteFile(WriteFileOutput {
                bytes: 2,
                created: true,
            })),
        };
        insta::assert_snapshot!(write.to_line(), @r#"{"id":4,"ok":true,"bytes":2,"created":true}"#);
        let edit = Response {
            id: Some(5),
            result: Ok(Reply::EditFile(EditFileOutput { replacements: 1 })),
        };
        insta::assert_snapshot!(edit.to_line(), @r#"{"id":5,"ok":true,"replacements":1}"#);
        let list = Response {
            id: Some(6),
            result: Ok(Reply::ListDir(ListDirOutput {
                entries: vec![
                    DirEntry {
                        name: "a.txt".into(),
                        kind: EntryKind::File,
                        size: Some(3),
                    },
                    DirEntry {
                        name: "src".into(),
                        kind: EntryKind::Dir,
                        size: None,
                    },
                ],
                total: 2,
            })),
        };
        insta::assert_snapshot!(list.to_line(), @r#"{"id":6,"ok":true,"entries":[{"name":"a.txt","kind":"file","size":3},{"name":"src","kind":"dir"}],"total":2}"#);
        let grep = Response {
            id: Some(7),
            result: Ok(Reply::Grep(GrepOutput {
                matches: vec!["src/a.rs:1:fn main() {}".into()],
                truncated: false,
            })),
        };
        insta::assert_snapshot!(grep.to_line(), @r#"{"id":7,"ok":true,"matches":["src/a.rs:1:fn main() {}"],"truncated":false}"#);
        let pong = Response {
            id: Some(8),
            result: Ok(Reply::Pong(Pong {
                version: "0.1.0".into(),
            })),
        };
        insta::assert_snapshot!(pong.to_line(), @r#"{"id":8,"ok":true,"version":"0.1.0"}"#);
        let error = Response {
            id: None,
            result: Err("malformed request: EOF".into()),
        };
        insta::assert_snapshot!(error.to_line(), @r#"{"id":null,"ok":false,"error":"malformed request: EOF"}"#);
    }

    #[test]
    fn host_decodes_what_the_executor_writes() {
        let line = Response {
            id: Some(9),
            result: Ok(Reply::EditFile(EditFileOutput { replacements: 2 })),
        }
        .to_line();
        let decoded: Decoded<EditFileOutput> = decode_response(&line).unwrap();
        assert_eq!(
            decoded,
            Decoded {
                id: Some(9),
                result: Ok(EditFileOutput { replacements: 2 })
            }
        );

        let line = Response {
            id: Some(10),
            result: Err("no such file or directory: x".into()),
        }
        .to_line();
        let decoded: Decoded<ExecOutput> = decode_response(&line).unwrap();
        assert_eq!(
            decoded,
            Decoded {
                id: Some(10),
                result: Err("no such file or directory: x".into())
            }
        );

        assert!(decode_response::<ExecOutput>(r#"{"id":1,"ok":true,"version":"1"}"#).is_err());
        assert!(decode_response::<Pong>("[]").is_err());
    }
}
