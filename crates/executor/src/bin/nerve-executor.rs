//! `nerve-executor`: serves the executor protocol inside the sandbox, on stdin/stdout or on the
//! host's control socket (`--control-socket`).
//!
//! Exit codes: 0 when the input ended or the host closed the output (a broken pipe is how the
//! host says goodbye), 1 when the workspace root cannot be opened, the control socket cannot
//! be reached or I/O fails, 2 for a bad command line. Diagnostics go to stderr as one line.

use std::io::{self, Write};
use std::process::ExitCode;

use nerve_executor::{Executor, Invocation, ROOT_ENV, USAGE, VERSION};

fn main() -> ExitCode {
    let config =
        match nerve_executor::parse_args(std::env::args_os().skip(1), std::env::var_os(ROOT_ENV)) {
            Ok(Invocation::Serve(config)) => *config,
            Ok(Invocation::Help) => return say(&mut io::stdout(), USAGE, ExitCode::SUCCESS),
            Ok(Invocation::Version) => {
                return say(
                    &mut io::stdout(),
                    &format!("nerve-executor {VERSION}"),
                    ExitCode::SUCCESS,
                );
            }
            Err(message) => {
                return say(
                    &mut io::stderr(),
                    &format!("nerve-executor: {message}"),
                    ExitCode::from(2),
                );
            }
        };
    // Become the subreaper of everything we start: a command's orphans are re-parented to us
    // instead of to the container's init, so we can reap them and know when a process group is
    // really empty, whether or not the container runs an init.
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        let _ = writeln!(
            io::stderr(),
            "nerve-executor: warning: cannot become a child subreaper: {e}"
        );
    }
    // Not dumpable: the commands we run share our uid, and without this they could open our
    // descriptors through /proc/<pid>/fd, take them with pidfd_getfd or ptrace us, and so
    // answer the host in our name. Commands become dumpable again when they exec.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        let _ = writeln!(
            io::stderr(),
            "nerve-executor: warning: cannot make the executor non-dumpable: {e}"
        );
    }
    // The relay first: a command may use the network from its first request on. A relay
    // that cannot start costs the network, not the tools.
    if let Some(relay) = config.relay.clone()
        && let Err(e) = nerve_executor::spawn_relay(relay.clone())
    {
        let _ = writeln!(
            io::stderr(),
            "nerve-executor: warning: cannot relay {} to the proxy: {e}",
            relay.listen
        );
    }
    let root = config.root.clone();
    let executor = match Executor::new(config) {
        Ok(executor) => executor,
        Err(e) => {
            let message = format!(
                "nerve-executor: cannot open the workspace root {}: {e}",
                root.display()
            );
            return say(&mut io::stderr(), &message, ExitCode::FAILURE);
        }
    };
    let control = executor.config().control_socket.clone();
    let result = match control {
        Some(path) => match nerve_executor::connect_control(&path) {
            Ok(stream) => {
                if let Ok(watched) = stream.try_clone() {
                    die_with_host(watched);
                }
                let channel = std::os::fd::AsFd::as_fd(&stream);
                executor.serve_watching(io::BufReader::new(&stream), &stream, channel)
            }
            Err(e) => Err(e),
        },
        None => {
            if let Ok(stdin) = std::os::fd::AsFd::as_fd(&io::stdin()).try_clone_to_owned() {
                die_with_host(stdin);
            }
            // Read through a buffer of our own, not stdin's, so that the request loop can
            // tell whether a request is already waiting in it (server.rs).
            match std::os::fd::AsFd::as_fd(&io::stdin()).try_clone_to_owned() {
                Ok(stdin) => {
                    let stdin = std::fs::File::from(stdin);
                    let channel = std::os::fd::AsFd::as_fd(&stdin);
                    executor.serve_watching(
                        io::BufReader::new(&stdin),
                        io::stdout().lock(),
                        channel,
                    )
                }
                Err(_) => executor.serve(io::stdin().lock(), io::stdout().lock()),
            }
        }
    };
    nerve_executor::kill_remaining_children();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => say(
            &mut io::stderr(),
            &format!("nerve-executor: {e}"),
            ExitCode::FAILURE,
        ),
    }
}

fn say(out: &mut impl Write, text: &str, code: ExitCode) -> ExitCode {
    let _ = writeln!(out, "{text}");
    code
}

/// The executor dies with its host: the moment the host's end of the channel closes (it
/// finished, or it was killed), even in the middle of a command, everything the executor
/// started is killed and it exits, which stops the container. The request loop alone would
/// notice only after the current command returned.
fn die_with_host(channel: impl std::os::fd::AsFd + Send + 'static) {
    let spawned = std::thread::Builder::new()
        .name("hangup".to_owned())
        .spawn(move || {
            nerve_executor::wait_for_hangup(channel.as_fd());
            nerve_executor::kill_remaining_children();
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        let _ = writeln!(
            io::stderr(),
            "nerve-executor: warning: cannot watch the host's channel: {e}"
        );
    }
}
