//! The connection to the host's control socket, on which the executor serves and a spawned
//! process's stdio travels.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Connects to the host's control socket at `path` (close-on-exec, as every socket the
/// standard library opens), with an error naming it.
pub fn connect_control(path: &Path) -> io::Result<UnixStream> {
    UnixStream::connect(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot connect to the control socket {}: {e}",
                path.display()
            ),
        )
    })
}
