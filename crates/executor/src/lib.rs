//! Nerve's in-sandbox executor: the protocol types (shared with the host in `nerve-hands`) and
//! the request handlers behind the `nerve-executor` binary.
//!
//! The binary runs inside the container as its main process and speaks JSON Lines with the
//! host, on a connection to the host's control socket (`--control-socket`, see
//! [`Executor::serve_socket`]) or on stdin and stdout: one [`Request`] per line in, one
//! [`Response`] per line out, in order. It runs shell commands in their own process groups with deadlines and bounded
//! output ([`ExecRequest`]), and file operations confined to the workspace root, refusing `..`,
//! absolute paths elsewhere and symlinks that leave it ([`Workspace`]). End of input ends it.
//! `spawn` starts a long-lived process (an MCP server) whose stdio goes to a one-off host
//! socket instead of through the request loop ([`SpawnRequest`]).
//! With `--proxy-socket` it also relays TCP connections on the container's loopback to the
//! host's auth proxy ([`spawn_relay`]), the sandbox's only way to the network.
//!
//! Architecture invariants: no async runtime and no `unsafe` (system calls go through `rustix`);
//! the binary is static (`+crt-static`) so it runs in a `FROM scratch` image; nothing here
//! knows about Docker or the host, which only sees the protocol module.

mod args;
mod closest;
mod confine;
mod control;
mod error;
mod exec;
mod files;
mod glob;
mod grep;
mod limits;
mod output;
mod protocol;
mod relay;
mod server;
mod spawn;

pub use args::{Invocation, ROOT_ENV, USAGE, parse_args};
pub use confine::{CONTAINER_ROOT, Workspace};
pub use control::connect_control;
pub use error::Error;
pub use exec::{INTERRUPT_GRACE, kill_remaining_children, reap_children};
pub use limits::Limits;
pub use protocol::{
    Decoded, DirEntry, EditFileOutput, EditFileRequest, EntryKind, ExecOutput, ExecRequest,
    GrepOutput, GrepRequest, InterruptOutput, ListDirOutput, ListDirRequest, Op, Pong,
    ReadFileOutput, ReadFileRequest, Reply, Request, Response, SignalOutput, SignalRequest,
    SpawnOutput, SpawnRequest, StreamHello, VERSION, WriteFileOutput, WriteFileRequest,
    decode_response,
};
pub use relay::{DEFAULT_RELAY_LISTEN, Relay, RelayConfig, spawn_relay};
pub use server::{Config, Executor, wait_for_hangup};
