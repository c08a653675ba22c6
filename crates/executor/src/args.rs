//! Command-line parsing for the `nerve-executor` binary, into a [`Config`] before anything runs.
//!
//! Hand-written rather than with clap: a handful of flags do not justify the size in a static binary
//! that is copied into every sandbox image.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::relay::{DEFAULT_RELAY_LISTEN, RelayConfig};
use crate::server::Config;

/// The environment variable that sets the workspace root when `--root` is absent.
pub const ROOT_ENV: &str = "NERVE_EXECUTOR_ROOT";

/// The usage text printed by `--help`.
pub const USAGE: &str = "\
nerve-executor: serves Nerve's executor protocol (JSON lines) on stdin and stdout, or on a
unix socket the host listens on.

Usage: nerve-executor [--root DIR] [--shell PATH] [--max-file-bytes N] [--max-output-bytes N]
                      [--control-socket PATH] [--proxy-socket PATH [--proxy-listen ADDR]]

  --root DIR              workspace root (default: $NERVE_EXECUTOR_ROOT, else /workspace)
  --shell PATH            shell that runs commands as `PATH -c command` (default: /bin/sh)
  --max-file-bytes N      largest file write_file/edit_file accept (default: 16 MiB)
  --max-output-bytes N    cap on exec's max_output_bytes per stream (default: 16 MiB)
  --control-socket PATH   serve on a connection to this unix socket instead of stdin/stdout
  --proxy-socket PATH     relay TCP connections on the loopback to the auth proxy's unix socket
  --proxy-listen ADDR     where the relay listens (default: 127.0.0.1:3128)
  --version, --help";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Serve with this configuration (boxed: it is most of the enum's size).
    Serve(Box<Config>),
    /// Print [`USAGE`] and exit.
    Help,
    /// Print the version and exit.
    Version,
}

/// Parses the arguments (without the program name); `env_root` is [`ROOT_ENV`]'s value.
/// The error is one line for the user.
pub fn parse_args(
    args: impl IntoIterator<Item = OsString>,
    env_root: Option<OsString>,
) -> Result<Invocation, String> {
    let mut config = Config::default();
    if let Some(root) = env_root.filter(|r| !r.is_empty()) {
        config.root = PathBuf::from(root);
    }
    let mut proxy_socket: Option<PathBuf> = None;
    let mut proxy_listen: Option<String> = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("unknown argument: {}", a.to_string_lossy()))?;
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(OsString::from(value)))
            }
            Some(_) | None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--help" | "-h" => return Ok(Invocation::Help),
            "--version" | "-V" => return Ok(Invocation::Version),
            "--root" => config.root = PathBuf::from(value()?),
            "--shell" => config.shell = PathBuf::from(value()?),
            "--max-file-bytes" => config.limits.max_file_bytes = number(&flag, value()?)?,
            "--max-output-bytes" => config.limits.max_output_bytes = number(&flag, value()?)?,
            "--control-socket" => config.control_socket = Some(PathBuf::from(value()?)),
            "--proxy-socket" => proxy_socket = Some(PathBuf::from(value()?)),
            "--proxy-listen" => proxy_listen = Some(value()?.to_string_lossy().into_owned()),
            _ => return Err(format!("unknown argument: {arg} (try --help)")),
        }
    }
    config.relay = match (proxy_socket, proxy_listen) {
        (Some(socket), listen) => {
            let listen = listen.as_deref().unwrap_or(DEFAULT_RELAY_LISTEN);
            let address = listen.parse().map_err(|_| {
                format!("--proxy-listen needs an IP address and port, not {listen:?}")
            })?;
            Some(RelayConfig::new(socket, address))
        }
        (None, Some(_)) => return Err("--proxy-listen needs --proxy-socket".to_owned()),
        (None, None) => None,
    };
    Ok(Invocation::Serve(Box::new(config)))
}

fn number(flag: &str, value: OsString) -> Result<u64, String> {
    let text = value.to_string_lossy();
    text.parse()
        .map_err(|_| format!("{flag} needs a number of bytes, not {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limits;

    fn check(args: &[&str], env_root: Option<&str>, expected: Result<Invocation, &str>) {
        let got = parse_args(
            args.iter().map(OsString::from),
            env_root.map(OsString::from),
        );
        assert_eq!(got, expected.map_err(str::to_owned), "{args:?}");
    }

    fn serve(root: &str, shell: &str, limits: Limits) -> Invocation {
        Invocation::Serve(Box::new(Config {
            root: root.into(),
            shell: shell.into(),
            limits,
            ..Config::default()
        }))
    }

    #[test]
    fn parses() {
        let defaults = Limits::default();
        check(
            &[],
            None,
            Ok(serve("/workspace", "/bin/sh", defaults.clone())),
        );
        check(
            &[],
            Some("/from/env"),
            Ok(serve("/from/env", "/bin/sh", defaults.clone())),
        );
        check(
            &[],
            Some(""),
            Ok(serve("/workspace", "/bin/sh", defaults.clone())),
        );
        check(
            &["--root", "/r"],
            Some("/from/env"),
            Ok(serve("/r", "/bin/sh", defaults.clone())),
        );
        check(
            &["--root=/r", "--shell", "/bin/bash"],
            None,
            Ok(serve("/r", "/bin/bash", defaults.clone())),
        );
        check(
            &["--max-file-bytes", "10", "--max-output-bytes=20"],
            None,
            Ok(serve(
                "/workspace",
                "/bin/sh",
                Limits {
                    max_file_bytes: 10,
                    max_output_bytes: 20,
                    ..defaults
                },
            )),
        );
        check(
            &["--proxy-socket", "/run/nerve/proxy.sock"],
            None,
            Ok(Invocation::Serve(Box::new(Config {
                relay: Some(RelayConfig::new(
                    "/run/nerve/proxy.sock",
                    "127.0.0.1:3128".parse().unwrap(),
                )),
                ..Config::default()
            }))),
        );
        check(
            &["--proxy-socket=/s", "--proxy-listen", "127.0.0.1:9"],
            None,
            Ok(Invocation::Serve(Box::new(Config {
                relay: Some(RelayConfig::new("/s", "127.0.0.1:9".parse().unwrap())),
                ..Config::default()
            }))),
        );
        check(
            &["--proxy-listen", "127.0.0.1:9"],
            None,
            Err("--proxy-listen needs --proxy-socket"),
        );
        check(
            &["--proxy-socket", "/s", "--proxy-listen", "localhost:9"],
            None,
            Err("--proxy-listen needs an IP address and port, not \"localhost:9\""),
        );
        check(
            &["--control-socket", "/run/nerve-control/executor.sock"],
            None,
            Ok(Invocation::Serve(Box::new(Config {
                control_socket: Some("/run/nerve-control/executor.sock".into()),
                ..Config::default()
            }))),
        );
        check(
            &["--control-socket"],
            None,
            Err("--control-socket needs a value"),
        );
        check(&["--root", "/r", "--help"], None, Ok(Invocation::Help));
        check(&["-V"], None, Ok(Invocation::Version));
        check(&["--root"], None, Err("--root needs a value"));
        check(
            &["--max-file-bytes", "ten"],
            None,
            Err("--max-file-bytes needs a number of bytes, not \"ten\""),
        );
        check(
            &["--frobnicate"],
            None,
            Err("unknown argument: --frobnicate (try --help)"),
        );
        check(
            &["/workspace"],
            None,
            Err("unknown argument: /workspace (try --help)"),
        );
    }
}
