//! The request loop: read a line, handle it, write one response line, in order, forever.
//!
//! Requests are handled one at a time (the host serialises them), so a slow command delays the
//! next request rather than racing it; the host bounds that with `timeout_ms`. While a command
//! runs, the request channel is watched (not read): a line arriving on it interrupts the
//! command (SIGINT, then SIGKILL after [`crate::exec::INTERRUPT_GRACE`]), which is how the
//! host stops a command when its user asks to stop; the line is then read and answered as
//! usual. No line can stop
//! the loop: malformed input gets an error response with whatever id could be salvaged. Only
//! end of input or a failed write (the host went away) ends it.
//!
//! The requests come either on stdin and stdout or, with a control socket
//! ([`Config::control_socket`]), on one unix stream connected to the host: the same lines,
//! without the engine between the two ends.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::confine::{CONTAINER_ROOT, Workspace};
use crate::control::connect_control;
use crate::error::Error;
use crate::exec::Watch;
use crate::limits::Limits;
use crate::protocol::{ExecOutput, ExecRequest, Op, Pong, Reply, Request, Response, VERSION};
use crate::{exec, files, grep, spawn};

/// Everything the executor needs to know before it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The workspace root: file ops are confined to it and commands start in it.
    pub root: PathBuf,
    /// The shell that runs commands as `shell -c command`.
    pub shell: PathBuf,
    /// Size and count caps.
    pub limits: Limits,
    /// Reap every exited child between requests. Right for the executor process, which is a
    /// subreaper and adopts its commands' orphans; wrong inside a test process, where it would
    /// steal the exit status of children that other threads wait for.
    pub reap_orphans: bool,
    /// The relay to the auth proxy, started by the binary before it serves; `None` when
    /// the sandbox has no proxy.
    pub relay: Option<crate::relay::RelayConfig>,
    /// The host's unix socket to serve on instead of stdin and stdout; `None` serves on
    /// those.
    pub control_socket: Option<PathBuf>,
}

impl Config {
    /// The defaults for the sandbox: root `/workspace`, shell `/bin/sh`, default limits.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            shell: PathBuf::from("/bin/sh"),
            limits: Limits::default(),
            reap_orphans: true,
            relay: None,
            control_socket: None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::new(CONTAINER_ROOT)
    }
}

/// A configured executor with its workspace root held open.
#[derive(Debug)]
pub struct Executor {
    config: Config,
    workspace: Workspace,
}

impl Executor {
    /// Opens the workspace root; fails if it is not a directory.
    pub fn new(config: Config) -> io::Result<Self> {
        let workspace = Workspace::open(&config.root)?;
        Ok(Self { config, workspace })
    }

    /// What it was configured with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The confined view of the root that file ops go through.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Serves requests from `input` until it ends. Returns the error of a failed read or write;
    /// a broken pipe on `output` means the host has gone.
    pub fn serve(&self, input: impl BufRead, output: impl Write) -> io::Result<()> {
        self.serve_with(input, output, |_| None)
    }

    /// Serves like [`Executor::serve`]; `channel` is the descriptor `input` reads from,
    /// watched while a command runs so that a request arriving meanwhile interrupts it. A
    /// request already in `input`'s buffer when a command starts (the host wrote two lines
    /// at once) interrupts it at once.
    pub fn serve_watching<'c, R: Read>(
        &self,
        input: BufReader<R>,
        output: impl Write,
        channel: BorrowedFd<'c>,
    ) -> io::Result<()> {
        self.serve_with(input, output, move |input: &BufReader<R>| {
            Some(Watch {
                channel,
                pending: !input.buffer().is_empty(),
            })
        })
    }

    /// The request loop; `watch` says, after each line read, how a command it starts is
    /// watched for an interrupt.
    fn serve_with<'c, I: BufRead>(
        &self,
        mut input: I,
        mut output: impl Write,
        watch: impl Fn(&I) -> Option<Watch<'c>>,
    ) -> io::Result<()> {
        let cap = self.config.limits.max_request_bytes;
        // Ends: one request per pass until the input ends (the host closed it or died);
        // each request is bounded by its own limits (timeouts, sizes).
        loop {
            let Some(line) = files::read_line(&mut input, cap.saturating_add(1))? else {
                return Ok(());
            };
            let response = if line.total > cap as u64 {
                let message = format!(
                    "the request line is {} bytes; the limit is {cap}",
                    line.total
                );
                Response {
                    id: None,
                    result: Err(Error::Malformed(message).to_string()),
                }
            } else if line.kept.trim_ascii().is_empty() {
                continue;
            } else {
                self.handle_line_watching(&line.kept, watch(&input))
            };
            let mut text = response.to_line();
            text.push('\n');
            output.write_all(text.as_bytes())?;
            output.flush()?;
        }
    }

    /// Connects to the host's socket at `path` and serves on that stream until the host closes
    /// it. The descriptor is close-on-exec (the standard library opens every socket so), so
    /// no command the executor starts holds the host's end of the channel.
    pub fn serve_socket(&self, path: &Path) -> io::Result<()> {
        let stream = connect_control(path)?;
        self.serve_watching(BufReader::new(&stream), &stream, stream.as_fd())
    }

    /// Handles one request line (without or with its newline).
    pub fn handle_line(&self, line: &[u8]) -> Response {
        self.handle_line_watching(line, None)
    }

    fn handle_line_watching(&self, line: &[u8], watch: Option<Watch<'_>>) -> Response {
        match serde_json::from_slice::<Request>(line) {
            Ok(request) => self.handle_watching(&request, watch),
            Err(e) => {
                // Salvage the id if the line is JSON with a numeric id, so the host can match
                // the error to its request.
                let id = serde_json::from_slice::<serde_json::Value>(line)
                    .ok()
                    .and_then(|value| value.get("id")?.as_u64());
                Response {
                    id,
                    result: Err(Error::Malformed(e.to_string()).to_string()),
                }
            }
        }
    }

    /// Handles one parsed request.
    pub fn handle(&self, request: &Request) -> Response {
        self.handle_watching(request, None)
    }

    fn handle_watching(&self, request: &Request, watch: Option<Watch<'_>>) -> Response {
        if self.config.reap_orphans {
            exec::reap_children();
        }
        let (workspace, limits) = (&self.workspace, &self.config.limits);
        let result = match &request.op {
            Op::Exec(r) => self.exec(r, watch).map(Reply::Exec),
            Op::ReadFile(r) => files::read_file(workspace, limits, r).map(Reply::ReadFile),
            Op::WriteFile(r) => files::write_file(workspace, limits, r).map(Reply::WriteFile),
            Op::EditFile(r) => files::edit_file(workspace, limits, r).map(Reply::EditFile),
            Op::ListDir(r) => files::list_dir(workspace, limits, r).map(Reply::ListDir),
            Op::Grep(r) => grep::grep(workspace, limits, r).map(Reply::Grep),
            Op::Ping => Ok(Reply::Pong(Pong {
                version: VERSION.to_owned(),
            })),
            Op::Spawn(r) => spawn::spawn(workspace, r).map(Reply::Spawned),
            Op::Signal(r) => spawn::signal(r).map(Reply::Signalled),
            // What it would have interrupted already answered (see the module's comment).
            Op::Interrupt => Ok(Reply::Interrupted(crate::protocol::InterruptOutput {})),
        };
        Response {
            id: Some(request.id),
            result: result.map_err(|e| e.to_string()),
        }
    }

    fn exec(&self, request: &ExecRequest, watch: Option<Watch<'_>>) -> Result<ExecOutput, Error> {
        let cwd = self
            .workspace
            .workdir(request.workdir.as_deref().unwrap_or(""))?;
        exec::exec(
            request,
            &cwd,
            &self.config.shell,
            self.config.limits.max_output_bytes,
            watch,
        )
    }
}

/// Waits on `fd` until the host hangs up (`POLLRDHUP` for the socket, `POLLHUP` for a pipe,
/// or an error), without reading from it. Returns at once if it cannot poll.
pub fn wait_for_hangup(fd: std::os::fd::BorrowedFd<'_>) {
    use rustix::event::{PollFd, PollFlags, poll};
    let hangup = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
    // Ends: when the host hangs up (the executor's lifetime is the host's); an interrupted
    // poll retries, any other error returns.
    loop {
        let mut fds = [PollFd::new(&fd, PollFlags::RDHUP)];
        match poll(&mut fds, None) {
            Ok(_) if fds[0].revents().intersects(hangup) => return,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` to a fresh executor on an empty temp root and compares the output lines,
    /// with `duration_ms` zeroed.
    fn check(input: &str, expected: &[&str]) {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            reap_orphans: false,
            limits: Limits {
                max_request_bytes: 200,
                ..Limits::default()
            },
            ..Config::new(tmp.path())
        };
        let executor = Executor::new(config).unwrap();
        let mut output = Vec::new();
        executor.serve(input.as_bytes(), &mut output).unwrap();
        let duration = regex::Regex::new(r#""duration_ms":\d+"#).unwrap();
        let output = String::from_utf8(output).unwrap();
        let got: Vec<String> = output
            .lines()
            .map(|l| duration.replace(l, r#""duration_ms":0"#).into_owned())
            .collect();
        assert_eq!(got, expected, "{input}");
        assert!(output.is_empty() || output.ends_with('\n'));
    }

    #[test]
    fn answers_every_line_in_order() {
        check("", &[]);
        check("\n  \n", &[]);
        check(
            concat!(
                r#"{"id":1,"op":"ping"}"#,
                "\n",
                r#"{"id":2,"op":"write_file","path":"a/b.txt","content":"one\ntwo\n"}"#,
                "\n",
                r#"{"id":3,"op":"exec","command":"cat a/b.txt; exit 4","timeout_ms":10000,"max_output_bytes":100}"#,
                "\n",
                r#"{"id":4,"op":"exec","command":"basename \"$PWD\"","workdir":"/workspace/a","timeout_ms":10000,"max_output_bytes":100}"#,
                "\n",
                r#"{"id":5,"op":"exec","command":"pwd","workdir":"../","timeout_ms":10000,"max_output_bytes":0}"#,
                "\n",
                r#"{"id":6,"op":"read_file","path":"a/b.txt","offset":1}"#,
                "\n",
            ),
            &[
                &format!(r#"{{"id":1,"ok":true,"version":"{VERSION}"}}"#),
                r#"{"id":2,"ok":true,"bytes":8,"created":true}"#,
                r#"{"id":3,"ok":true,"exit_code":4,"timed_out":false,"stdout":"one\ntwo\n","stderr":"","stdout_omitted_bytes":0,"stderr_omitted_bytes":0,"duration_ms":0}"#,
                r#"{"id":4,"ok":true,"exit_code":0,"timed_out":false,"stdout":"a\n","stderr":"","stdout_omitted_bytes":0,"stderr_omitted_bytes":0,"duration_ms":0}"#,
                r#"{"id":5,"ok":false,"error":"path escapes the workspace: ../"}"#,
                r#"{"id":6,"ok":true,"content":"two\n","lines":1,"size":8}"#,
            ],
        );
    }

    #[test]
    fn a_hangup_is_seen_without_reading_and_data_is_not_one() {
        use std::os::fd::AsFd;
        let (ours, host) = std::os::unix::net::UnixStream::pair().unwrap();
        (&host).write_all(b"pending request\n").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let watcher = std::thread::spawn(move || {
            wait_for_hangup(ours.as_fd());
            tx.send(()).unwrap();
            ours
        });
        // Data waiting to be read is no hangup.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        );
        drop(host);
        rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
        let ours = watcher.join().unwrap();
        // Nothing was consumed.
        let mut line = String::new();
        BufReader::new(&ours).read_line(&mut line).unwrap();
        assert_eq!(line, "pending request\n");
    }

    #[test]
    fn serves_a_control_socket_and_commands_do_not_inherit_it() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let config = Config {
            reap_orphans: false,
            ..Config::new(tmp.path())
        };
        let executor = Executor::new(config).unwrap();
        let server = std::thread::spawn(move || executor.serve_socket(&socket));
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .write_all(
                concat!(
                    r#"{"id":1,"op":"ping"}"#,
                    "\n",
                    r#"{"id":2,"op":"exec","command":"ls -l /proc/self/fd/","timeout_ms":10000,"max_output_bytes":10000}"#,
                    "\n",
                )
                .as_bytes(),
            )
            .unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answers = String::new();
        stream.read_to_string(&mut answers).unwrap();
        server.join().unwrap().unwrap();
        let lines: Vec<&str> = answers.lines().collect();
        assert_eq!(
            lines[0],
            format!(r#"{{"id":1,"ok":true,"version":"{VERSION}"}}"#)
        );
        let listing: ExecOutput = crate::decode_response(lines[1]).unwrap().result.unwrap();
        assert_eq!(listing.exit_code, Some(0), "{listing:?}");
        assert!(listing.stdout.contains("pipe:"), "{}", listing.stdout);
        assert!(!listing.stdout.contains("socket:"), "{}", listing.stdout);
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn a_request_written_with_an_exec_interrupts_it_at_once() {
        use std::io::Read;
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            reap_orphans: false,
            ..Config::new(tmp.path())
        };
        let executor = Executor::new(config).unwrap();
        let (mut host, ours) = std::os::unix::net::UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            executor.serve_watching(BufReader::new(&ours), &ours, ours.as_fd())
        });
        // Both lines in one write: the loop's buffer holds the interrupt when the exec starts.
        host.write_all(
            concat!(
                r#"{"id":1,"op":"exec","command":"sleep 30","timeout_ms":60000,"max_output_bytes":100}"#,
                "\n",
                r#"{"id":2,"op":"interrupt"}"#,
                "\n",
            )
            .as_bytes(),
        )
        .unwrap();
        host.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answers = String::new();
        host.read_to_string(&mut answers).unwrap();
        server.join().unwrap().unwrap();
        let lines: Vec<&str> = answers.lines().collect();
        let exec: ExecOutput = crate::decode_response(lines[0]).unwrap().result.unwrap();
        assert!(exec.interrupted, "{exec:?}");
        assert!(exec.duration_ms < 5_000, "{exec:?}");
        assert_eq!(lines[1], r#"{"id":2,"ok":true}"#);
    }

    #[test]
    fn a_missing_control_socket_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let executor = Executor::new(Config::new(tmp.path())).unwrap();
        let error = executor
            .serve_socket(&tmp.path().join("absent.sock"))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot connect to the control socket"),
            "{error}"
        );
    }

    #[test]
    fn malformed_lines_get_errors_and_serving_goes_on() {
        check(
            concat!(
                "not json\n",
                r#"{"id":5,"op":"launch"}"#,
                "\n",
                r#"{"id":6,"op":"exec"}"#,
                "\n",
                r#"{"id":"seven","op":"ping"}"#,
                "\n",
                "\u{1}\u{2}\n",
                r#"{"id":8,"op":"ping","padding":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#,
                "\n",
                r#"{"id":9,"op":"ping"}"#,
            ),
            &[
                r#"{"id":null,"ok":false,"error":"malformed request: expected ident at line 1 column 2"}"#,
                r#"{"id":5,"ok":false,"error":"malformed request: unknown variant `launch`, expected one of `exec`, `read_file`, `write_file`, `edit_file`, `list_dir`, `grep`, `ping`, `spawn`, `signal`, `interrupt` at line 1 column 22"}"#,
                r#"{"id":6,"ok":false,"error":"malformed request: missing field `command` at line 1 column 20"}"#,
                r#"{"id":null,"ok":false,"error":"malformed request: invalid type: string \"seven\", expected u64 at line 1 column 13"}"#,
                r#"{"id":null,"ok":false,"error":"malformed request: expected value at line 1 column 1"}"#,
                r#"{"id":null,"ok":false,"error":"malformed request: the request line is 229 bytes; the limit is 200"}"#,
                &format!(r#"{{"id":9,"ok":true,"version":"{VERSION}"}}"#),
            ],
        );
    }
}
