//! The fallback path when the persistent executor cannot run: each command in a fresh
//! `docker exec` under busybox `timeout -s KILL`. Slower (one exec per call) and weaker: the
//! timeout kills the shell, not the background jobs it started, which live until the
//! container is removed. File tools do not come here; they run on the host with the same
//! confinement code (`openat2` with `RESOLVE_BENEATH`), see `sandbox.rs`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures_util::StreamExt;
use nerve_executor::{ExecOutput, ExecRequest};

use crate::HandsError;

/// busybox `timeout -s KILL` exits with 128 + SIGKILL when it had to kill the command.
const KILLED_STATUS: i64 = 137;

/// The container and identity a per-call exec runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) docker: &'a Docker,
    pub(crate) container: &'a str,
    pub(crate) user: &'a str,
    pub(crate) env: &'a [String],
}

/// Runs `request` in a fresh exec. `Ok(Err(message))` is a refusal the model should see
/// (a working directory outside the workspace).
pub(crate) async fn exec(
    target: Target<'_>,
    request: &ExecRequest,
) -> Result<Result<ExecOutput, String>, HandsError> {
    let workdir = match confine(request.workdir.as_deref().unwrap_or(".")) {
        Ok(dir) => dir,
        Err(message) => return Ok(Err(message)),
    };
    let timeout = Duration::from_millis(request.timeout_ms.max(1));
    let seconds = timeout.as_secs().max(1).to_string();
    let cmd = vec![
        "/bin/timeout",
        "-s",
        "KILL",
        seconds.as_str(),
        "/bin/sh",
        "-c",
        request.command.as_str(),
    ];
    let env: Vec<String> = target
        .env
        .iter()
        .cloned()
        .chain(request.env.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    let started_at = Instant::now();
    let exec = target
        .docker
        .create_exec(
            target.container,
            CreateExecOptions {
                cmd: Some(cmd),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                attach_stdin: Some(false),
                user: Some(target.user),
                working_dir: Some(workdir.as_str()),
                env: Some(env.iter().map(String::as_str).collect()),
                ..Default::default()
            },
        )
        .await?;
    let started = target
        .docker
        .start_exec(&exec.id, Some(StartExecOptions::default()))
        .await?;
    let cap = usize::try_from(request.max_output_bytes).unwrap_or(usize::MAX);
    let mut stdout = HeadTail::new(cap);
    let mut stderr = HeadTail::new(cap);
    let mut hung = false;
    if let StartExecResults::Attached { mut output, .. } = started {
        // The in-container timeout kills the shell; this outer bound only guards against
        // output pipes held open by a background job that outlived it.
        let drain = async {
            while let Some(chunk) = output.next().await {
                match chunk? {
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        stdout.push(&message);
                    }
                    LogOutput::StdErr { message } => stderr.push(&message),
                    LogOutput::StdIn { .. } => {}
                }
            }
            Ok::<(), bollard::errors::Error>(())
        };
        match tokio::time::timeout(timeout + Duration::from_secs(2), drain).await {
            Ok(result) => result?,
            Err(_) => hung = true,
        }
    }
    let inspected = target.docker.inspect_exec(&exec.id).await?;
    let exit_code = if hung { None } else { inspected.exit_code };
    let timed_out = hung || exit_code == Some(KILLED_STATUS);
    let (stdout, stdout_omitted_bytes) = stdout.finish();
    let (stderr, stderr_omitted_bytes) = stderr.finish();
    Ok(Ok(ExecOutput {
        exit_code: if timed_out {
            None
        } else {
            exit_code.and_then(|code| i32::try_from(code).ok())
        },
        signal: timed_out.then_some(9),
        timed_out,
        interrupted: false,
        stdout,
        stderr,
        stdout_omitted_bytes,
        stderr_omitted_bytes,
        duration_ms: u64::try_from(started_at.elapsed().as_millis()).unwrap_or(u64::MAX),
    }))
}

/// Resolves a workspace-relative directory to its absolute path inside the container,
/// refusing anything that would leave `/workspace` lexically. A symlinked directory is not
/// checked here: the command runs inside the sandbox, which is the boundary.
pub(crate) fn confine(path: &str) -> Result<String, String> {
    let relative = match path.strip_prefix("/workspace") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        Some(_) | None => path,
    };
    if relative.starts_with('/') && relative.len() == path.len() {
        return Err(format!(
            "path escapes the workspace: {path} (paths are relative to the workspace root)"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!("path escapes the workspace: {path}"));
                }
            }
            other => parts.push(other),
        }
    }
    Ok(if parts.is_empty() {
        "/workspace".to_owned()
    } else {
        format!("/workspace/{}", parts.join("/"))
    })
}

/// Keeps the first and last `cap / 2` bytes of a stream, counting what falls between; the
/// same shape as the executor's output, so the model sees one format on both paths.
#[derive(Debug)]
struct HeadTail {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    omitted: u64,
}

impl HeadTail {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            omitted: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        let head_cap = self.cap / 2;
        let tail_cap = self.cap - head_cap;
        if self.head.len() < head_cap {
            let take = bytes.len().min(head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.tail.extend(bytes);
        if self.tail.len() > tail_cap {
            let excess = self.tail.len() - tail_cap;
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }

    fn finish(self) -> (String, u64) {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted > 0 {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("[... {} bytes omitted ...]\n", self.omitted));
        }
        let tail: Vec<u8> = self.tail.into_iter().collect();
        out.push_str(&String::from_utf8_lossy(&tail));
        (out, self.omitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_cap(cap: usize, chunks: &[&str], expected: &str) {
        let mut buffer = HeadTail::new(cap);
        for chunk in chunks {
            buffer.push(chunk.as_bytes());
        }
        assert_eq!(buffer.finish().0, expected);
    }

    #[test]
    fn head_tail_cap() {
        check_cap(10, &["hello"], "hello");
        check_cap(4, &["abcdefgh"], "ab\n[... 4 bytes omitted ...]\ngh");
        check_cap(
            4,
            &["a", "b", "c", "d", "e", "f"],
            "ab\n[... 2 bytes omitted ...]\nef",
        );
        check_cap(0, &["abc"], "[... 3 bytes omitted ...]\n");
    }

    fn check(input: &str, expected: Result<&str, ()>) {
        assert_eq!(
            confine(input).map_err(|_| ()),
            expected.map(str::to_owned),
            "{input}"
        );
    }

    #[test]
    fn workdir_confinement() {
        check(".", Ok("/workspace"));
        check("src/../lib", Ok("/workspace/lib"));
        check("/workspace/src", Ok("/workspace/src"));
        check("/workspace", Ok("/workspace"));
        check("..", Err(()));
        check("a/../../etc", Err(()));
        check("/etc", Err(()));
        check("/workspacefoo", Err(()));
    }
}
