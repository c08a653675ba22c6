//! `exec`: one shell command in its own process group, with a deadline and bounded output.
//!
//! A single thread multiplexes everything with `poll`: the two output pipes and a pidfd that
//! becomes readable when the shell exits. No reader threads are left behind when an orphan
//! keeps a pipe open, and no async runtime is needed.
//!
//! The life of a command:
//! 1. `sh -c command` is spawned as the leader of a new process group, stdin `/dev/null`.
//! 2. Output is streamed into [`HeadTail`] captures while we wait for the shell to exit or the
//!    deadline to pass. On the deadline the whole group gets SIGKILL. When the host's request
//!    channel becomes readable meanwhile (the host sent `interrupt`, or hung up), the group
//!    gets SIGINT, and SIGKILL [`INTERRUPT_GRACE`] later if it is still there.
//! 3. When the shell has exited it is observed with `WNOWAIT`, so it stays a zombie and its
//!    pid, which is the group id, cannot be reused; the rest of the group (background jobs,
//!    grandchildren) gets SIGKILL; only then is the shell reaped.
//! 4. Draining: pipes are read until every writer is gone. Group members re-parented to the
//!    executor (it is a child subreaper, see the binary) are reaped as they die, which is how we
//!    know the group is really empty. A process that left the group (`setsid`) may still hold
//!    a pipe: once the group is gone it gets [`ORPHAN_GRACE`] to flush, then we answer anyway.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::BorrowedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions, WaitOptions};

use crate::error::Error;
use crate::output::HeadTail;
use crate::protocol::{ExecOutput, ExecRequest};

/// After the shell exits, the longest we wait for the rest of its group to die and the pipes
/// to close. Only reached when something outlives SIGKILL or is not ours to reap.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Once the group is gone, how long pipes held by processes that left it may still be read.
const ORPHAN_GRACE: Duration = Duration::from_millis(50);

/// How long a shell that got SIGKILL may take to exit (it may be in uninterruptible sleep)
/// before we answer without its status.
const KILL_LIMIT: Duration = Duration::from_secs(5);

/// The polling interval when no descriptor can announce the event we wait for: a group
/// becoming empty, or the shell exiting when the kernel gave us no pidfd.
const TICK: Duration = Duration::from_millis(2);

/// How long an interrupted command has between SIGINT and SIGKILL unless its request says
/// otherwise: time to clean up, short enough that a person who asked to stop sees it stop.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Timeouts beyond a week are treated as a week, which keeps `Instant` arithmetic in range.
const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// One output pipe and what has been captured from it.
#[derive(Debug)]
struct Stream {
    pipe: Option<File>,
    capture: HeadTail,
}

impl Stream {
    fn new(pipe: Option<impl Into<std::os::fd::OwnedFd>>, cap: usize) -> Self {
        Self {
            pipe: pipe.map(|p| File::from(p.into())),
            capture: HeadTail::new(cap),
        }
    }

    /// Reads what is available; closes the pipe at end of file or on an error.
    fn read_some(&mut self, buffer: &mut [u8]) {
        let Some(pipe) = &mut self.pipe else { return };
        match pipe.read(buffer) {
            Ok(0) => self.pipe = None,
            Ok(n) => self.capture.push(&buffer[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::WouldBlock) => {}
            Err(_) => self.pipe = None,
        }
    }
}

/// Where a command is in its life.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Running,
    /// SIGINT was sent to the group because the host interrupted the command; SIGKILL
    /// follows at `kill_at`.
    Interrupted {
        kill_at: Instant,
    },
    /// SIGKILL was sent to the group at `at` because the deadline passed.
    Killed {
        at: Instant,
    },
    /// The shell has exited; output is drained until `until`.
    Draining {
        until: Instant,
    },
}

/// The host's request channel, watched while a command runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch<'a> {
    /// A line arriving on it interrupts the command (it is not read here; the request loop
    /// reads it next).
    pub(crate) channel: BorrowedFd<'a>,
    /// A request line is already waiting in the request loop's buffer: interrupt at once.
    pub(crate) pending: bool,
}

/// Runs `request`, interrupted by a request on the `watch`ed channel.
pub(crate) fn exec(
    request: &ExecRequest,
    cwd: &Path,
    shell: &Path,
    max_output: u64,
    watch: Option<Watch<'_>>,
) -> Result<ExecOutput, Error> {
    let interrupt = watch.map(|w| w.channel);
    let mut pending = watch.is_some_and(|w| w.pending);
    if request.timeout_ms == 0 {
        return Err(Error::Invalid("timeout_ms must be positive".to_owned()));
    }
    let cap = usize::try_from(request.max_output_bytes.min(max_output)).unwrap_or(usize::MAX);
    let start = Instant::now();
    let deadline = start + Duration::from_millis(request.timeout_ms).min(MAX_TIMEOUT);
    // Bounded by MAX_TIMEOUT like the deadline, so `Instant` arithmetic stays in range.
    let grace = request
        .interrupt_grace_ms
        .map_or(INTERRUPT_GRACE, Duration::from_millis)
        .min(MAX_TIMEOUT);
    let mut child = Command::new(shell)
        .arg("-c")
        .arg(&request.command)
        .current_dir(cwd)
        .envs(&request.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            shell: shell.display().to_string(),
            source,
        })?;
    let pid = Pid::from_child(&child);
    let mut streams = [
        Stream::new(child.stdout.take(), cap),
        Stream::new(child.stderr.take(), cap),
    ];
    // Without a pidfd (an old kernel or seccomp profile) the exit is found by polling.
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok();
    let mut buffer = vec![0; 64 * 1024];
    let mut phase = Phase::Running;
    let mut timed_out = false;
    let mut interrupted = false;
    // Whether the request channel is still watched (not after it hung up).
    let mut watching = true;
    let mut status: Option<ExitStatus> = None;

    // Ends: deadline-driven phases: Running until the command exits or its timeout (then
    // Killed, the whole group sent SIGKILL) or an interrupt (then Interrupted for at most
    // INTERRUPT_GRACE, then Killed), then Draining for at most DRAIN_LIMIT; the host's
    // hang-up kills everything too (server.rs).
    loop {
        let now = Instant::now();
        let wake = match phase {
            Phase::Running | Phase::Interrupted { .. } | Phase::Killed { .. }
                if has_exited(pid) =>
            {
                kill_group(pid);
                status = child.wait().ok();
                reap_group(pid);
                phase = Phase::Draining {
                    until: now + DRAIN_LIMIT,
                };
                continue;
            }
            Phase::Running if now >= deadline => {
                timed_out = true;
                kill_group(pid);
                phase = Phase::Killed { at: now };
                continue;
            }
            Phase::Running => tick_unless(pidfd.is_some(), deadline, now),
            Phase::Interrupted { kill_at } if now >= kill_at.min(deadline) => {
                kill_group(pid);
                phase = Phase::Killed { at: now };
                continue;
            }
            Phase::Interrupted { kill_at } => {
                tick_unless(pidfd.is_some(), kill_at.min(deadline), now)
            }
            Phase::Killed { at } if now >= at + KILL_LIMIT => break,
            Phase::Killed { at } => tick_unless(pidfd.is_some(), at + KILL_LIMIT, now),
            Phase::Draining { until } => {
                reap_group(pid);
                let group_alive = rustix::process::test_kill_process_group(pid).is_ok();
                let pipes_open = streams.iter().any(|s| s.pipe.is_some());
                if (!pipes_open && !group_alive) || now >= until {
                    break;
                }
                if group_alive {
                    until.min(now + TICK)
                } else {
                    // Only processes outside the group hold the pipes now: give them a moment
                    // to flush, once, then answer.
                    let grace = until.min(now + ORPHAN_GRACE);
                    phase = Phase::Draining { until: grace };
                    grace
                }
            }
        };

        let mut ready = [false; 2];
        // A request that came with this one interrupts at the first pass.
        let mut interrupt_now = std::mem::take(&mut pending) && matches!(phase, Phase::Running);
        {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(4);
            let mut owners = Vec::with_capacity(2);
            for (index, stream) in streams.iter().enumerate() {
                if let Some(pipe) = &stream.pipe {
                    fds.push(PollFd::new(pipe, PollFlags::IN));
                    owners.push(index);
                }
            }
            let watched = fds.len();
            if let (Some(channel), Phase::Running, true) = (&interrupt, phase, watching) {
                fds.push(PollFd::new(channel, PollFlags::IN | PollFlags::RDHUP));
            }
            if let (
                Some(pidfd),
                Phase::Running | Phase::Interrupted { .. } | Phase::Killed { .. },
            ) = (&pidfd, phase)
            {
                fds.push(PollFd::new(pidfd, PollFlags::IN));
            }
            let timeout = timespec(wake.saturating_duration_since(now));
            // EINTR and friends just mean "look again"; the loop re-derives everything.
            if rustix::event::poll(&mut fds, Some(&timeout)).is_ok() {
                for (fd, &index) in fds.iter().zip(&owners) {
                    ready[index] = !fd.revents().is_empty();
                }
                if matches!(phase, Phase::Running) && interrupt.is_some() && watching {
                    let seen = fds.get(watched).map_or(PollFlags::empty(), PollFd::revents);
                    // A hang-up is not an interrupt: the host is gone (the binary's watcher
                    // kills everything), or it closed its side after its last request.
                    let hangup =
                        PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
                    if seen.intersects(hangup) {
                        watching = false;
                    } else if seen.contains(PollFlags::IN) {
                        interrupt_now = true;
                    }
                }
            }
        }
        if interrupt_now {
            interrupted = true;
            // ESRCH (nobody left) is the expected way for this to fail.
            let _ = rustix::process::kill_process_group(pid, Signal::INT);
            phase = Phase::Interrupted {
                kill_at: Instant::now() + grace,
            };
        }
        for (stream, ready) in streams.iter_mut().zip(ready) {
            if ready {
                stream.read_some(&mut buffer);
            }
        }
    }

    let [stdout, stderr] = streams;
    let (stdout, stdout_omitted_bytes) = stdout.capture.finish();
    let (stderr, stderr_omitted_bytes) = stderr.capture.finish();
    Ok(ExecOutput {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        interrupted,
        stdout,
        stderr,
        stdout_omitted_bytes,
        stderr_omitted_bytes,
        duration_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// `target`, or a short tick when nothing will wake `poll` for the event we wait for.
fn tick_unless(announced: bool, target: Instant, now: Instant) -> Instant {
    if announced {
        target
    } else {
        target.min(now + TICK)
    }
}

fn timespec(duration: Duration) -> Timespec {
    Timespec::try_from(duration).unwrap_or(Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    })
}

/// Whether the shell has exited, leaving it unreaped (`WNOWAIT`) so its pid stays reserved.
fn has_exited(pid: Pid) -> bool {
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    // An error (ECHILD) means there is nothing left to wait for.
    !matches!(rustix::process::waitid(WaitId::Pid(pid), options), Ok(None))
}

fn kill_group(pgid: Pid) {
    // ESRCH (nobody left) is the expected way for this to fail.
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
}

/// Reaps the group's members that are our children, without blocking.
fn reap_group(pgid: Pid) {
    while let Ok(Some(_)) = rustix::process::waitpgid(pgid, WaitOptions::NOHANG) {}
}

/// Reaps every exited child, without blocking. Only safe while no command is running, since it
/// would also collect the status of a shell `exec` is still waiting for.
pub fn reap_children() {
    while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
}

/// Kills and reaps every child of this process, including processes that escaped their
/// command's group (`setsid`) and were re-parented to the executor. Meant for shutdown.
pub fn kill_remaining_children() {
    let me = rustix::process::getpid();
    for _ in 0..100 {
        reap_children();
        let children = children_of(me);
        if children.is_empty() {
            return;
        }
        for child in children {
            let _ = rustix::process::kill_process(child, Signal::KILL);
            if rustix::process::getpgid(Some(child)).ok() == Some(child) {
                kill_group(child);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The children of `parent`, from `/proc/*/stat` (empty when `/proc` is not mounted).
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid = Pid::from_raw(entry.file_name().to_str()?.parse().ok()?)?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The command name in parentheses may contain anything, so parse after the last ')'.
            let fields = &stat[stat.rfind(')')? + 1..];
            let ppid: i32 = fields.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent.as_raw_nonzero().get()).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn run(command: &str, timeout_ms: u64, max_output_bytes: u64) -> ExecOutput {
        let request = ExecRequest {
            command: command.into(),
            workdir: None,
            timeout_ms,
            max_output_bytes,
            env: BTreeMap::from([("GREETING".into(), "hi".into())]),
            interrupt_grace_ms: None,
        };
        exec(
            &request,
            Path::new("/"),
            Path::new("/bin/sh"),
            u64::MAX,
            None,
        )
        .unwrap()
    }

    /// Runs `command` and compares everything but the duration.
    fn check(
        command: &str,
        max_output_bytes: u64,
        expected: (Option<i32>, Option<i32>, &str, &str, u64),
    ) {
        let mut got = run(command, 60_000, max_output_bytes);
        got.duration_ms = 0;
        let (exit_code, signal, stdout, stderr, stdout_omitted_bytes) = expected;
        let expected = ExecOutput {
            exit_code,
            signal,
            timed_out: false,
            interrupted: false,
            stdout: stdout.into(),
            stderr: stderr.into(),
            stdout_omitted_bytes,
            stderr_omitted_bytes: 0,
            duration_ms: 0,
        };
        assert_eq!(got, expected, "{command}");
    }

    #[test]
    fn runs_commands() {
        check("echo hello", 100, (Some(0), None, "hello\n", "", 0));
        check(
            "echo oops >&2; exit 3",
            100,
            (Some(3), None, "", "oops\n", 0),
        );
        check(
            "echo $GREETING; pwd",
            100,
            (Some(0), None, "hi\n/\n", "", 0),
        );
        check(
            "read x || echo \"no stdin [$x]\"",
            100,
            (Some(0), None, "no stdin []\n", "", 0),
        );
        check("kill -TERM $$", 100, (None, Some(15), "", "", 0));
        check(
            "printf '\\377ok'",
            100,
            (Some(0), None, "\u{fffd}ok", "", 0),
        );
        check(
            "printf 0123456789",
            4,
            (Some(0), None, "01\n[... 6 bytes omitted ...]\n89", "", 6),
        );
    }

    #[test]
    fn refuses_a_zero_timeout_and_a_missing_shell() {
        let request = ExecRequest {
            command: "true".into(),
            workdir: None,
            timeout_ms: 0,
            max_output_bytes: 10,
            env: BTreeMap::new(),
            interrupt_grace_ms: None,
        };
        let error = exec(&request, Path::new("/"), Path::new("/bin/sh"), 10, None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid request: timeout_ms must be positive"
        );
        let request = ExecRequest {
            timeout_ms: 10,
            ..request
        };
        let error = exec(
            &request,
            Path::new("/"),
            Path::new("/nonexistent/sh"),
            10,
            None,
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot start /nonexistent/sh: "),
            "{error}"
        );
    }

    /// Runs `command` and writes a line to its request channel after `after`.
    fn interrupted(command: &str, after: Duration, grace: Option<Duration>) -> ExecOutput {
        // An ignored SIGINT is inherited by the command, which then outlives its interrupt:
        // say so rather than fail on the signal it died of.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let ignored = status
            .lines()
            .find_map(|line| line.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        assert_eq!(
            ignored & (1 << (rustix::process::Signal::INT.as_raw() - 1)),
            0,
            "SIGINT is ignored in this test process (started in the background by a shell \
             without job control?): run it with `env --default-signal=INT`"
        );
        let (host, executor) = std::os::unix::net::UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(after);
            let mut host = host;
            std::io::Write::write_all(&mut host, b"{\"id\":2,\"op\":\"interrupt\"}\n").unwrap();
            host
        });
        let request = ExecRequest {
            command: command.into(),
            workdir: None,
            timeout_ms: 60_000,
            max_output_bytes: 100,
            env: BTreeMap::new(),
            interrupt_grace_ms: grace.map(|g| u64::try_from(g.as_millis()).unwrap()),
        };
        let watch = Watch {
            channel: std::os::fd::AsFd::as_fd(&executor),
            pending: false,
        };
        let got = exec(
            &request,
            Path::new("/"),
            Path::new("/bin/sh"),
            100,
            Some(watch),
        )
        .unwrap();
        drop(writer.join().unwrap());
        got
    }

    #[test]
    fn an_interrupt_sends_sigint_then_sigkill_after_the_grace() {
        let got = interrupted(
            "echo started; exec sleep 30",
            Duration::from_millis(200),
            None,
        );
        assert_eq!(
            (
                got.interrupted,
                got.timed_out,
                got.signal,
                got.stdout.as_str()
            ),
            (true, false, Some(2), "started\n")
        );
        assert!(got.duration_ms < 5_000, "{}", got.duration_ms);
        // A command that ignores SIGINT gets SIGKILL after the grace.
        let got = interrupted(
            "trap '' INT; echo started; sleep 30",
            Duration::from_millis(200),
            None,
        );
        assert_eq!(
            (got.interrupted, got.signal, got.stdout.as_str()),
            (true, Some(9), "started\n")
        );
        let grace = u64::try_from(INTERRUPT_GRACE.as_millis()).unwrap();
        assert!(got.duration_ms >= 200 + grace, "{}", got.duration_ms);
        assert!(got.duration_ms < 200 + grace + 5_000, "{}", got.duration_ms);
    }

    #[test]
    fn the_request_sets_the_grace_between_sigint_and_sigkill() {
        // Longer than the default: the default would kill it about a second earlier.
        let grace = INTERRUPT_GRACE + Duration::from_secs(1);
        let got = interrupted(
            "trap '' INT; echo started; sleep 30",
            Duration::from_millis(200),
            Some(grace),
        );
        assert_eq!((got.interrupted, got.signal), (true, Some(9)));
        let grace = u64::try_from(grace.as_millis()).unwrap();
        assert!(got.duration_ms >= 200 + grace, "{}", got.duration_ms);
        // A command that stops on SIGINT does not wait for the grace.
        let got = interrupted(
            "echo started; exec sleep 30",
            Duration::from_millis(200),
            Some(Duration::from_secs(600)),
        );
        assert_eq!((got.interrupted, got.signal), (true, Some(2)));
        assert!(got.duration_ms < 60_000, "{}", got.duration_ms);
    }

    #[test]
    fn times_out() {
        let got = run("echo started; exec sleep 30", 200, 100);
        assert!(got.timed_out);
        assert_eq!(
            (got.exit_code, got.signal, got.stdout.as_str()),
            (None, Some(9), "started\n")
        );
        assert!(got.duration_ms >= 200);
    }
}
