//! Confinement of request paths to the workspace root.
//!
//! Every path is first normalised lexically: a leading `/workspace` (or the root's own absolute
//! path) is stripped, `.` dropped and `..` applied, and a path that climbs above the root or is
//! absolute elsewhere is refused before the kernel sees it. What remains is opened relative to
//! a file descriptor of the root that the executor holds for its whole life:
//!
//! - with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` when the kernel has it. The kernel
//!   then follows symlinks only while they stay beneath the root; an absolute symlink, or a
//!   relative one that climbs out, at any component, fails with `EXDEV`. This is race-free:
//!   there is no check-then-use window for a concurrent rename to exploit.
//! - otherwise (`ENOSYS`, or `EPERM` from a seccomp profile older than `openat2`) by walking
//!   one component at a time with `O_NOFOLLOW` and refusing every symlink, even harmless ones.
//!
//! Files are opened with `O_NONBLOCK` and checked with `fstat` before any I/O, so a FIFO, socket
//! or device is refused instead of blocking the executor. Creating a file first probes it with
//! `O_PATH`, which opens nothing, so an existing special file is refused without side effects.
//!
//! Hard links are outside this model: a hard link inside the workspace to a file elsewhere on
//! the same filesystem is, to the kernel, simply a file in the workspace. Bind-mounting the
//! workspace from its own directory means such links can only be made from the host.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::path::{Component, Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, RawMode, ResolveFlags};
use rustix::io::Errno;

use crate::error::Error;

/// The in-container mount point of the workspace, accepted as a prefix of request paths.
pub const CONTAINER_ROOT: &str = "/workspace";

/// How paths beneath the root are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// `openat2` with `RESOLVE_BENEATH`: in-workspace symlinks work, escaping ones fail.
    Openat2,
    /// Component by component with `O_NOFOLLOW`: every symlink fails.
    Walk,
}

/// How a file is opened by [`Workspace::open_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Read an existing regular file.
    Read,
    /// Read and rewrite an existing regular file in place.
    ReadWrite,
    /// Write a regular file, creating it and its parent directories when missing.
    Create,
}

/// A regular file opened beneath the root.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) file: File,
    pub(crate) size: u64,
    /// Only for [`Access::Create`]: nothing existed at the path before.
    pub(crate) created: bool,
}

/// What [`Workspace::open_any`] found.
#[derive(Debug)]
pub(crate) enum Node {
    File(Opened),
    Dir(OwnedFd),
}

/// The workspace root, held open, and the resolution strategy the kernel allows.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    root_fd: OwnedFd,
    strategy: Strategy,
}

impl Workspace {
    /// Opens `root` (which must be a directory) and probes whether `openat2` is usable.
    pub fn open(root: &Path) -> io::Result<Self> {
        let root = std::fs::canonicalize(root)?;
        let root_fd = rustix::fs::open(
            &root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let probe = rustix::fs::openat2(
            &root_fd,
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        );
        let strategy = match probe {
            Err(Errno::NOSYS | Errno::PERM) => Strategy::Walk,
            Ok(_) | Err(_) => Strategy::Openat2,
        };
        Ok(Self {
            root,
            root_fd,
            strategy,
        })
    }

    #[cfg(test)]
    pub(crate) fn with_strategy(root: &Path, strategy: Strategy) -> io::Result<Self> {
        Ok(Self {
            strategy,
            ..Self::open(root)?
        })
    }

    /// The message a symlink leaving the workspace gets under this session's strategy.
    #[cfg(test)]
    pub(crate) fn symlink_escape_message(&self, path: &str) -> String {
        let path = path.to_owned();
        match self.strategy {
            Strategy::Openat2 => Error::Escapes { path },
            Strategy::Walk => Error::Symlink { path },
        }
        .to_string()
    }

    /// The canonical absolute path of the root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether symlinks inside the workspace are followed (`openat2` is available).
    pub fn follows_symlinks(&self) -> bool {
        self.strategy == Strategy::Openat2
    }

    /// The workspace-relative form of `path`, with no `.`, `..` or root component left; empty
    /// for the root itself.
    pub(crate) fn normalize(&self, path: &str) -> Result<PathBuf, Error> {
        let escapes = || Error::Escapes {
            path: path.to_owned(),
        };
        let given = Path::new(path);
        let relative = if given.is_absolute() {
            given
                .strip_prefix(CONTAINER_ROOT)
                .or_else(|_| given.strip_prefix(&self.root))
                .map_err(|_| escapes())?
        } else {
            given
        };
        let mut normal = PathBuf::new();
        for component in relative.components() {
            match component {
                Component::CurDir => {}
                Component::Normal(name) => normal.push(name),
                Component::ParentDir => {
                    if !normal.pop() {
                        return Err(escapes());
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(escapes()),
            }
        }
        Ok(normal)
    }

    /// The absolute directory for `exec`'s `workdir`, checked to be a directory beneath the root.
    ///
    /// The command gets a path, not the descriptor, so this is a convenience check rather than
    /// a boundary: the command runs in the sandbox and may `cd` anywhere the sandbox allows.
    pub(crate) fn workdir(&self, path: &str) -> Result<PathBuf, Error> {
        let relative = self.normalize(path)?;
        self.open_beneath(&relative, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| map_errno(e, path, "cannot open directory"))?;
        Ok(self.root.join(relative))
    }

    /// Opens a regular file; anything else is refused without blocking.
    pub(crate) fn open_file(&self, path: &str, access: Access) -> Result<Opened, Error> {
        let relative = self.normalize(path)?;
        let nonblocking = OFlags::NONBLOCK | OFlags::NOCTTY;
        let (flags, created) = match access {
            Access::Read => (OFlags::RDONLY | nonblocking, false),
            Access::ReadWrite => (OFlags::RDWR | nonblocking, false),
            Access::Create => {
                if let Some(parent) = relative.parent() {
                    self.create_dirs(parent, path)?;
                }
                let created = match self.open_beneath(&relative, OFlags::PATH, Mode::empty()) {
                    Ok(fd) => {
                        check_regular(stat_mode(&fd, path)?, path)?;
                        false
                    }
                    Err(Errno::NOENT) => true,
                    Err(e) => return Err(map_errno(e, path, "cannot open")),
                };
                (OFlags::WRONLY | OFlags::CREATE | nonblocking, created)
            }
        };
        // openat2 rejects a mode without O_CREAT.
        let mode = if access == Access::Create {
            Mode::from_raw_mode(0o644)
        } else {
            Mode::empty()
        };
        let fd = self
            .open_beneath(&relative, flags, mode)
            .map_err(|e| map_errno(e, path, "cannot open"))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| Error::io("cannot stat", path, e))?;
        check_regular(stat.st_mode, path)?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        Ok(Opened {
            file: File::from(fd),
            size,
            created,
        })
    }

    /// Opens a directory for listing.
    pub(crate) fn open_dir(&self, path: &str) -> Result<OwnedFd, Error> {
        let relative = self.normalize(path)?;
        self.open_beneath(
            &relative,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| map_errno(e, path, "cannot open directory"))
    }

    /// Opens a regular file or a directory; anything else is refused without blocking.
    pub(crate) fn open_any(&self, path: &str) -> Result<(PathBuf, Node), Error> {
        let relative = self.normalize(path)?;
        let fd = self
            .open_beneath(
                &relative,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
                Mode::empty(),
            )
            .map_err(|e| map_errno(e, path, "cannot open"))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| Error::io("cannot stat", path, e))?;
        let node = if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            Node::Dir(fd)
        } else {
            check_regular(stat.st_mode, path)?;
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            Node::File(Opened {
                file: File::from(fd),
                size,
                created: false,
            })
        };
        Ok((relative, node))
    }

    /// Creates the missing directories of `relative` (a normalised path), each one beneath the
    /// root: every prefix is resolved again after `mkdirat`, so a symlink planted in between is
    /// caught like any other.
    fn create_dirs(&self, relative: &Path, path: &str) -> Result<(), Error> {
        let mut prefix = PathBuf::new();
        let mut parent: Option<OwnedFd> = None;
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        for name in relative.iter() {
            prefix.push(name);
            let fd = match self.open_beneath(&prefix, dir_flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    let base = parent.as_ref().map_or(self.root_fd.as_fd(), AsFd::as_fd);
                    match rustix::fs::mkdirat(base, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(map_errno(e, path, "cannot create directory for")),
                    }
                    self.open_beneath(&prefix, dir_flags, Mode::empty())
                        .map_err(|e| map_errno(e, path, "cannot open directory for"))?
                }
                Err(e) => return Err(map_errno(e, path, "cannot open directory for")),
            };
            parent = Some(fd);
        }
        Ok(())
    }

    /// Opens a normalised relative path beneath the root with the session's strategy.
    fn open_beneath(&self, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlags::CLOEXEC;
        match self.strategy {
            Strategy::Openat2 => {
                let target = if relative.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    relative
                };
                let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
                // EAGAIN means a concurrent rename raced the lookup; the kernel asks us to retry.
                let mut result = Err(Errno::AGAIN);
                for _ in 0..16 {
                    result = rustix::fs::openat2(&self.root_fd, target, flags, mode, resolve);
                    if !matches!(result, Err(Errno::AGAIN)) {
                        break;
                    }
                }
                result
            }
            Strategy::Walk => self.walk(relative, flags, mode),
        }
    }

    /// The fallback resolution: every intermediate component must be a real directory and the
    /// last one must not be a symlink (`O_PATH | O_NOFOLLOW` would otherwise open the link).
    fn walk(&self, relative: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let names: Vec<&OsStr> = relative.iter().collect();
        let Some((last, parents)) = names.split_last() else {
            return rustix::fs::openat(&self.root_fd, ".", flags, mode);
        };
        let mut dir: Option<OwnedFd> = None;
        fn base<'a>(root: &'a OwnedFd, dir: &'a Option<OwnedFd>) -> BorrowedFd<'a> {
            dir.as_ref().map_or(root.as_fd(), AsFd::as_fd)
        }
        let probe_flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for name in parents {
            let fd =
                rustix::fs::openat(base(&self.root_fd, &dir), *name, probe_flags, Mode::empty())?;
            match FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) {
                FileType::Directory => dir = Some(fd),
                FileType::Symlink => return Err(Errno::LOOP),
                FileType::RegularFile
                | FileType::Fifo
                | FileType::Socket
                | FileType::CharacterDevice
                | FileType::BlockDevice
                | FileType::Unknown => return Err(Errno::NOTDIR),
            }
        }
        match rustix::fs::openat(base(&self.root_fd, &dir), *last, probe_flags, Mode::empty()) {
            Ok(fd) => {
                if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) == FileType::Symlink {
                    return Err(Errno::LOOP);
                }
            }
            Err(Errno::NOENT) if flags.contains(OFlags::CREATE) => {}
            Err(e) => return Err(e),
        }
        rustix::fs::openat(
            base(&self.root_fd, &dir),
            *last,
            flags | OFlags::NOFOLLOW,
            mode,
        )
    }
}

fn stat_mode(fd: &OwnedFd, path: &str) -> Result<RawMode, Error> {
    Ok(rustix::fs::fstat(fd)
        .map_err(|e| Error::io("cannot stat", path, e))?
        .st_mode)
}

/// Refuses anything but a regular file, naming what it is.
pub(crate) fn check_regular(mode: RawMode, path: &str) -> Result<(), Error> {
    let kind = match FileType::from_raw_mode(mode) {
        FileType::RegularFile => return Ok(()),
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "unknown file type",
    };
    Err(Error::NotRegular {
        path: path.to_owned(),
        kind,
    })
}

/// Turns the errno of an open beneath the root into the message the model sees.
pub(crate) fn map_errno(errno: Errno, path: &str, action: &'static str) -> Error {
    let path = path.to_owned();
    match errno {
        Errno::XDEV => Error::Escapes { path },
        Errno::LOOP => Error::Symlink { path },
        Errno::NOENT => Error::NotFound { path },
        Errno::NOTDIR => Error::NotADirectory { path },
        Errno::ISDIR => Error::NotRegular {
            path,
            kind: "directory",
        },
        // Opening a socket, or a FIFO for writing without a reader (thanks to O_NONBLOCK).
        Errno::NXIO => Error::NotRegular {
            path,
            kind: "fifo or socket",
        },
        errno => Error::Io {
            action,
            path,
            source: errno.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::symlink;

    use super::*;

    /// A workspace `ws` next to a directory `outside` holding `secret.txt`, with symlinks that
    /// stay inside and symlinks that leave.
    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(ws.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "TOPSECRET\n").unwrap();
        std::fs::write(ws.join("sub/real.txt"), "real\n").unwrap();
        symlink("/etc", ws.join("etc_link")).unwrap();
        symlink("../outside", ws.join("out_dir")).unwrap();
        symlink("../../outside/secret.txt", ws.join("sub/up")).unwrap();
        symlink(outside.join("secret.txt"), ws.join("abs_file")).unwrap();
        symlink("sub/real.txt", ws.join("ok_link")).unwrap();
        symlink("../../sub", ws.join("sub/deeper/back")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            ws.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        (tmp, ws)
    }

    fn check_normalize(path: &str, expected: Result<&str, &str>) {
        let (_tmp, ws) = fixture();
        let workspace = Workspace::open(&ws).unwrap();
        let got = workspace.normalize(path).map_err(|e| e.to_string());
        let expected = expected.map(PathBuf::from).map_err(str::to_owned);
        assert_eq!(got, expected, "{path}");
    }

    #[test]
    fn normalizes_lexically() {
        check_normalize("a/b.txt", Ok("a/b.txt"));
        check_normalize("./a//b/", Ok("a/b"));
        check_normalize("", Ok(""));
        check_normalize(".", Ok(""));
        check_normalize("/workspace", Ok(""));
        check_normalize("/workspace/src/main.rs", Ok("src/main.rs"));
        check_normalize("a/../b", Ok("b"));
        check_normalize("a/..", Ok(""));
        check_normalize(
            "../etc/passwd",
            Err("path escapes the workspace: ../etc/passwd"),
        );
        check_normalize("a/../../x", Err("path escapes the workspace: a/../../x"));
        check_normalize(
            "/etc/passwd",
            Err("path escapes the workspace: /etc/passwd"),
        );
        check_normalize(
            "/workspacex/a",
            Err("path escapes the workspace: /workspacex/a"),
        );
        check_normalize(
            "/workspace/../etc",
            Err("path escapes the workspace: /workspace/../etc"),
        );
    }

    #[test]
    fn the_roots_own_absolute_path_is_accepted() {
        let (_tmp, ws) = fixture();
        let workspace = Workspace::open(&ws).unwrap();
        let absolute = workspace.root().join("sub/real.txt");
        assert_eq!(
            workspace.normalize(absolute.to_str().unwrap()).unwrap(),
            PathBuf::from("sub/real.txt")
        );
    }

    /// Reads `path` with each strategy and compares the content or the error message.
    fn check_read(strategy: Strategy, path: &str, expected: Result<&str, &str>) {
        let (_tmp, ws) = fixture();
        let workspace = Workspace::with_strategy(&ws, strategy).unwrap();
        let got = workspace.open_file(path, Access::Read).map(|mut opened| {
            let mut text = String::new();
            opened.file.read_to_string(&mut text).unwrap();
            text
        });
        let got = got.map_err(|e| e.to_string());
        let expected = expected.map(str::to_owned).map_err(str::to_owned);
        assert_eq!(got, expected, "{strategy:?} {path}");
    }

    /// Whether this kernel (and seccomp profile) offers `openat2`. Where the sandbox tests
    /// must run (`NERVE_REQUIRE_DOCKER=1`: CI, `cargo xtask test-sandbox`) its absence is a
    /// failure, since the sandbox relies on it there; elsewhere the tests of that strategy
    /// skip with a reason on stderr.
    fn openat2_available() -> bool {
        let tmp = tempfile::tempdir().unwrap();
        let available = Workspace::open(tmp.path()).unwrap().follows_symlinks();
        if !available {
            let reason = "openat2 is not available here; only the walk fallback is tested";
            assert!(
                !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
                "NERVE_REQUIRE_DOCKER=1 but {reason}"
            );
            eprintln!("skipping: {reason}");
        }
        available
    }

    #[test]
    fn openat2_follows_inner_symlinks_and_refuses_escapes() {
        use Strategy::Openat2;
        if !openat2_available() {
            return;
        }
        check_read(Openat2, "sub/real.txt", Ok("real\n"));
        check_read(Openat2, "ok_link", Ok("real\n"));
        check_read(Openat2, "sub/deeper/back/real.txt", Ok("real\n"));
        check_read(
            Openat2,
            "../outside/secret.txt",
            Err("path escapes the workspace: ../outside/secret.txt"),
        );
        check_read(
            Openat2,
            "/etc/passwd",
            Err("path escapes the workspace: /etc/passwd"),
        );
        check_read(
            Openat2,
            "etc_link/passwd",
            Err("path escapes the workspace: etc_link/passwd"),
        );
        check_read(
            Openat2,
            "out_dir/secret.txt",
            Err("path escapes the workspace: out_dir/secret.txt"),
        );
        check_read(Openat2, "sub/up", Err("path escapes the workspace: sub/up"));
        check_read(
            Openat2,
            "abs_file",
            Err("path escapes the workspace: abs_file"),
        );
        check_read(Openat2, "fifo", Err("not a regular file (fifo): fifo"));
        check_read(Openat2, "sub", Err("not a regular file (directory): sub"));
        check_read(
            Openat2,
            "missing",
            Err("no such file or directory: missing"),
        );
        check_read(
            Openat2,
            "sub/real.txt/x",
            Err("not a directory: sub/real.txt/x"),
        );
    }

    #[test]
    fn the_walk_refuses_every_symlink() {
        use Strategy::Walk;
        check_read(Walk, "sub/real.txt", Ok("real\n"));
        check_read(
            Walk,
            "ok_link",
            Err("cannot follow symlink in path: ok_link"),
        );
        check_read(
            Walk,
            "sub/deeper/back/real.txt",
            Err("cannot follow symlink in path: sub/deeper/back/real.txt"),
        );
        check_read(
            Walk,
            "../outside/secret.txt",
            Err("path escapes the workspace: ../outside/secret.txt"),
        );
        check_read(
            Walk,
            "/etc/passwd",
            Err("path escapes the workspace: /etc/passwd"),
        );
        check_read(
            Walk,
            "etc_link/passwd",
            Err("cannot follow symlink in path: etc_link/passwd"),
        );
        check_read(
            Walk,
            "out_dir/secret.txt",
            Err("cannot follow symlink in path: out_dir/secret.txt"),
        );
        check_read(Walk, "sub/up", Err("cannot follow symlink in path: sub/up"));
        check_read(
            Walk,
            "abs_file",
            Err("cannot follow symlink in path: abs_file"),
        );
        check_read(Walk, "fifo", Err("not a regular file (fifo): fifo"));
        check_read(Walk, "sub", Err("not a regular file (directory): sub"));
        check_read(Walk, "missing", Err("no such file or directory: missing"));
        check_read(
            Walk,
            "sub/real.txt/x",
            Err("not a directory: sub/real.txt/x"),
        );
    }

    /// Creates `path` with each strategy; on success checks where the file landed.
    fn check_create(strategy: Strategy, path: &str, expected: Result<(&str, bool), &str>) {
        let (tmp, ws) = fixture();
        let workspace = Workspace::with_strategy(&ws, strategy).unwrap();
        let got = workspace
            .open_file(path, Access::Create)
            .map(|opened| opened.created);
        match (got, expected) {
            (Ok(created), Ok((landed, expected_created))) => {
                assert_eq!(created, expected_created, "{strategy:?} {path}");
                assert!(
                    ws.join(landed).is_file(),
                    "{strategy:?} {path} should be at {landed}"
                );
            }
            (got, expected) => assert_eq!(
                got.map_err(|e| e.to_string()),
                expected.map(|(_, c)| c).map_err(str::to_owned)
            ),
        }
        // Nothing was created or truncated outside the workspace.
        let outside: Vec<_> = std::fs::read_dir(tmp.path().join("outside"))
            .unwrap()
            .collect();
        assert_eq!(outside.len(), 1, "{strategy:?} {path}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("outside/secret.txt")).unwrap(),
            "TOPSECRET\n"
        );
    }

    /// Where a created file lands and whether it is new, or the error message.
    type Expected = Result<(&'static str, bool), String>;

    #[test]
    fn creating_files_stays_inside() {
        let escape = |path: &str| format!("path escapes the workspace: {path}");
        let symlink = |path: &str| format!("cannot follow symlink in path: {path}");
        // (path, with openat2, with the walk): Ok((where the file lands, created)) or an error.
        let cases: &[(&str, Expected, Expected)] = &[
            ("new.txt", Ok(("new.txt", true)), Ok(("new.txt", true))),
            (
                "a/b/c/new.txt",
                Ok(("a/b/c/new.txt", true)),
                Ok(("a/b/c/new.txt", true)),
            ),
            (
                "sub/real.txt",
                Ok(("sub/real.txt", false)),
                Ok(("sub/real.txt", false)),
            ),
            (
                "ok_link",
                Ok(("sub/real.txt", false)),
                Err(symlink("ok_link")),
            ),
            (
                "out_dir/new.txt",
                Err(escape("out_dir/new.txt")),
                Err(symlink("out_dir/new.txt")),
            ),
            (
                "out_dir/x/new.txt",
                Err(escape("out_dir/x/new.txt")),
                Err(symlink("out_dir/x/new.txt")),
            ),
            ("sub/up", Err(escape("sub/up")), Err(symlink("sub/up"))),
            (
                "abs_file",
                Err(escape("abs_file")),
                Err(symlink("abs_file")),
            ),
            ("../x", Err(escape("../x")), Err(escape("../x"))),
            (
                "fifo",
                Err("not a regular file (fifo): fifo".into()),
                Err("not a regular file (fifo): fifo".into()),
            ),
            (
                "sub",
                Err("not a regular file (directory): sub".into()),
                Err("not a regular file (directory): sub".into()),
            ),
            (
                "sub/real.txt/x",
                Err("not a directory: sub/real.txt/x".into()),
                Err("not a directory: sub/real.txt/x".into()),
            ),
        ];
        let openat2 = openat2_available();
        for (path, with_openat2, with_walk) in cases {
            if openat2 {
                check_create(
                    Strategy::Openat2,
                    path,
                    with_openat2.as_ref().map(|&ok| ok).map_err(String::as_str),
                );
            }
            check_create(
                Strategy::Walk,
                path,
                with_walk.as_ref().map(|&ok| ok).map_err(String::as_str),
            );
        }
    }
}
