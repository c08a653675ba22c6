//! `spawn` and `signal`: long-lived processes (MCP servers) whose stdio goes straight to the
//! host, beside the request loop rather than through it.
//!
//! The request loop answers one request at a time, so a process that talks for as long as it
//! lives cannot share it. For `spawn` the host binds a one-off socket in its control
//! directory and names it in the request with a nonce; the executor connects to it twice,
//! introduces each connection with a hello line carrying the nonce and the stream's role
//! (`stdio`, `stderr`), and hands the two connections to the child as its stdin and stdout and
//! as its stderr. From then on the bytes flow between the child and the host through the
//! kernel alone: no relay thread, no engine. The nonce travels only on the control
//! connection, so a command of the sandbox that connects to the one-off socket first cannot
//! pass for the server.
//!
//! The child runs in its own process group, in the workspace, with the executor's
//! environment plus the request's. The executor does not wait for it: it is reaped between
//! requests like any orphan, and `signal` ends its group.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use rustix::process::{Pid, Signal};

use crate::confine::Workspace;
use crate::error::Error;
use crate::protocol::{SignalOutput, SignalRequest, SpawnOutput, SpawnRequest, StreamHello};

/// Starts the request's program with its stdio on the host's one-off socket.
pub(crate) fn spawn(workspace: &Workspace, request: &SpawnRequest) -> Result<SpawnOutput, Error> {
    let Some(program) = request.argv.first() else {
        return Err(Error::Invalid("argv is empty".to_owned()));
    };
    if request.nonce.len() < 16 {
        return Err(Error::Invalid(
            "nonce must be at least 16 characters".to_owned(),
        ));
    }
    let cwd = workspace.workdir(request.workdir.as_deref().unwrap_or(""))?;
    let stdio = introduce(request, "stdio")?;
    let stderr = introduce(request, "stderr")?;
    let stdout = stdio
        .try_clone()
        .map_err(|e| Error::io("cannot duplicate the stdio connection", &request.socket, e))?;
    let child = Command::new(program)
        .args(&request.argv[1..])
        .current_dir(cwd)
        .envs(&request.env)
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(stdio)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(stdout)))
        .stderr(Stdio::from(std::os::fd::OwnedFd::from(stderr)))
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            shell: program.clone(),
            source,
        })?;
    // Our copies of the connections closed with the `Command`: the child holds the only
    // ones, so the host sees end of file when the child exits.
    Ok(SpawnOutput { pid: child.id() })
}

/// Connects to the host's one-off socket and says which stream this connection is.
fn introduce(request: &SpawnRequest, stream: &str) -> Result<UnixStream, Error> {
    let mut connection = crate::control::connect_control(std::path::Path::new(&request.socket))
        .map_err(|e| Error::io("cannot connect to", &request.socket, e))?;
    let hello = StreamHello {
        nonce: request.nonce.clone(),
        stream: stream.to_owned(),
    };
    let mut line = serde_json::to_string(&hello).unwrap_or_default();
    line.push('\n');
    connection
        .write_all(line.as_bytes())
        .map_err(|e| Error::io("cannot introduce the connection to", &request.socket, e))?;
    Ok(connection)
}

/// Sends a signal to a spawned process's group. A group that is already gone is no error:
/// the answer says nothing was delivered.
pub(crate) fn signal(request: &SignalRequest) -> Result<SignalOutput, Error> {
    let Some(pid) = i32::try_from(request.pid).ok().and_then(Pid::from_raw) else {
        return Err(Error::Invalid(format!(
            "pid {} is not a process",
            request.pid
        )));
    };
    // Only groups the executor made: a group led by the executor itself or by its own
    // group is refused, so the host cannot stop the executor this way.
    if pid == rustix::process::getpid() || pid.as_raw_nonzero().get() == 1 {
        return Err(Error::Invalid(format!(
            "pid {} is not a spawned process",
            request.pid
        )));
    }
    let signal = match request.signal.as_str() {
        "term" => Signal::TERM,
        "kill" => Signal::KILL,
        other => {
            return Err(Error::Invalid(format!(
                "signal `{other}` is not one of term, kill"
            )));
        }
    };
    // The process itself is reaped between requests, with the other orphans.
    let delivered = rustix::process::kill_process_group(pid, signal).is_ok();
    Ok(SignalOutput { delivered })
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::net::UnixListener;

    use super::*;

    fn request(socket: &std::path::Path, argv: &[&str]) -> SpawnRequest {
        SpawnRequest {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: [("GREETING".to_owned(), "hello".to_owned())].into(),
            workdir: None,
            socket: socket.display().to_string(),
            nonce: "0123456789abcdef".to_owned(),
        }
    }

    /// Accepts the two connections and reads their hello lines.
    fn accept_two(listener: &UnixListener) -> Vec<(String, BufReader<UnixStream>)> {
        (0..2)
            .map(|_| {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut hello = String::new();
                reader.read_line(&mut hello).unwrap();
                (hello, reader)
            })
            .collect()
    }

    #[test]
    fn the_child_talks_to_the_host_over_the_socket_and_stderr_apart() {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(tmp.path()).unwrap();
        let socket = tmp.path().join("one-off.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let script =
            r#"read line; echo "got $line $GREETING from $(basename "$PWD")"; echo oops >&2"#;
        let spawned = spawn(&workspace, &request(&socket, &["/bin/sh", "-c", script])).unwrap();
        assert!(spawned.pid > 1);
        let mut streams = accept_two(&listener);
        assert_eq!(
            streams[0].0,
            "{\"nonce\":\"0123456789abcdef\",\"stream\":\"stdio\"}\n"
        );
        assert_eq!(
            streams[1].0,
            "{\"nonce\":\"0123456789abcdef\",\"stream\":\"stderr\"}\n"
        );
        streams[0].1.get_mut().write_all(b"ping\n").unwrap();
        let mut out = String::new();
        streams[0].1.read_to_string(&mut out).unwrap();
        let dir = tmp
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(out, format!("got ping hello from {dir}\n"));
        let mut err = String::new();
        streams[1].1.read_to_string(&mut err).unwrap();
        assert_eq!(err, "oops\n");
    }

    #[test]
    fn signal_ends_the_group_and_a_gone_group_is_not_delivered() {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(tmp.path()).unwrap();
        let socket = tmp.path().join("one-off.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let spawned = spawn(
            &workspace,
            &request(&socket, &["/bin/sh", "-c", "exec sleep 600"]),
        )
        .unwrap();
        let mut streams = accept_two(&listener);
        let kill = SignalRequest {
            pid: spawned.pid,
            signal: "kill".to_owned(),
        };
        assert!(signal(&kill).unwrap().delivered);
        // The group is gone: the stdio reaches end of file.
        let mut out = String::new();
        streams[0].1.read_to_string(&mut out).unwrap();
        assert_eq!(out, "");
        let pid = Pid::from_raw(spawned.pid as i32).unwrap();
        let status = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
            .unwrap()
            .unwrap();
        assert_eq!(status.1.terminating_signal(), Some(9));
        assert!(!signal(&kill).unwrap().delivered);
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(tmp.path()).unwrap();
        let socket = tmp.path().join("absent.sock");
        let mut empty = request(&socket, &[]);
        assert_eq!(
            spawn(&workspace, &empty).unwrap_err().to_string(),
            "invalid request: argv is empty"
        );
        empty.argv = vec!["/bin/true".to_owned()];
        let error = spawn(&workspace, &empty).unwrap_err().to_string();
        assert!(error.starts_with("cannot connect to"), "{error}");
        empty.nonce = "short".to_owned();
        assert_eq!(
            spawn(&workspace, &empty).unwrap_err().to_string(),
            "invalid request: nonce must be at least 16 characters"
        );
        let bad = SignalRequest {
            pid: 1,
            signal: "kill".to_owned(),
        };
        assert!(signal(&bad).is_err());
        let odd = SignalRequest {
            pid: 999_999,
            signal: "hup".to_owned(),
        };
        assert_eq!(
            signal(&odd).unwrap_err().to_string(),
            "invalid request: signal `hup` is not one of term, kill"
        );
    }
}
