//! `grep`: a regex over the regular files beneath a workspace path.
//!
//! The walk goes through directory descriptors opened with `O_NOFOLLOW` relative to their
//! parent, never through path strings, so a symlink (or a directory swapped for one mid-walk)
//! is skipped rather than followed out of the workspace. `.git` and friends, binary files
//! (a NUL byte in the first 8 KiB) and files over the size cap are skipped silently; the
//! directory order is sorted so results are stable.

use std::fs::File;
use std::io::Read;

use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use crate::confine::{Node, Workspace};
use crate::error::Error;
use crate::files::BINARY_PROBE_BYTES;
use crate::glob::Glob;
use crate::limits::Limits;
use crate::protocol::{GrepOutput, GrepRequest};

/// Directories that hold version-control data, not sources.
const SKIPPED_DIRS: [&[u8]; 3] = [b".git", b".hg", b".svn"];

/// Deeper trees are not searched (and cannot exhaust descriptors).
const MAX_DEPTH: usize = 64;

pub(crate) fn grep(
    workspace: &Workspace,
    limits: &Limits,
    request: &GrepRequest,
) -> Result<GrepOutput, Error> {
    let regex = regex::bytes::RegexBuilder::new(&request.pattern)
        .build()
        .map_err(|e| Error::Pattern {
            what: "regex",
            message: one_line(&e.to_string()),
        })?;
    let glob = request
        .glob
        .as_deref()
        .map(Glob::new)
        .transpose()
        .map_err(|message| Error::Pattern {
            what: "glob",
            message,
        })?;
    let path = request
        .path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or(".");
    let (relative, node) = workspace.open_any(path)?;
    let mut search = Search {
        regex,
        glob,
        limits,
        matches: Vec::new(),
        files: 0,
        truncated: false,
    };
    let shown = relative.to_string_lossy();
    match node {
        // A file named explicitly is searched whatever the glob says, as ripgrep does.
        Node::File(opened) => search.file(opened.file, opened.size, &shown),
        Node::Dir(fd) => search.dir(fd, &shown, 0),
    }
    Ok(GrepOutput {
        matches: search.matches,
        truncated: search.truncated,
    })
}

/// Collapses a multi-line compiler message (the regex crate draws a caret diagram).
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[derive(Debug)]
struct Search<'a> {
    regex: regex::bytes::Regex,
    glob: Option<Glob>,
    limits: &'a Limits,
    matches: Vec<String>,
    files: u64,
    truncated: bool,
}

impl Search<'_> {
    /// Searches the directory `fd`, whose workspace-relative path is `prefix` (empty for the
    /// root). Unreadable entries are skipped: a partial answer beats none.
    fn dir(&mut self, fd: OwnedFd, prefix: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let Ok(mut dir) = Dir::new(fd) else { return };
        let mut entries = Vec::new();
        for entry in dir.by_ref() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                entries.push((entry.file_name().to_owned(), entry.file_type()));
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let Ok(dir_fd) = dir.fd() else { return };
        for (name, file_type) in entries {
            if self.truncated {
                return;
            }
            let file_type = match file_type {
                FileType::Unknown => {
                    rustix::fs::statat(dir_fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_or(FileType::Unknown, |stat| {
                            FileType::from_raw_mode(stat.st_mode)
                        })
                }
                FileType::RegularFile
                | FileType::Directory
                | FileType::Symlink
                | FileType::Fifo
                | FileType::Socket
                | FileType::CharacterDevice
                | FileType::BlockDevice => file_type,
            };
            let display = String::from_utf8_lossy(name.to_bytes());
            let relative = if prefix.is_empty() {
                display.to_string()
            } else {
                format!("{prefix}/{display}")
            };
            let flags = OFlags::RDONLY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::NOCTTY
                | OFlags::CLOEXEC;
            match file_type {
                FileType::Directory => {
                    if SKIPPED_DIRS.contains(&name.to_bytes()) {
                        continue;
                    }
                    if let Ok(sub) = rustix::fs::openat(
                        dir_fd,
                        name.as_c_str(),
                        flags | OFlags::DIRECTORY,
                        Mode::empty(),
                    ) {
                        self.dir(sub, &relative, depth + 1);
                    }
                }
                FileType::RegularFile => {
                    if self
                        .glob
                        .as_ref()
                        .is_some_and(|glob| !glob.matches(&relative, &display))
                    {
                        continue;
                    }
                    self.files += 1;
                    if self.files > self.limits.max_grep_files {
                        self.truncated = true;
                        return;
                    }
                    let Ok(fd) = rustix::fs::openat(dir_fd, name.as_c_str(), flags, Mode::empty())
                    else {
                        continue;
                    };
                    // The entry may have been replaced since it was listed: check again.
                    let Ok(stat) = rustix::fs::fstat(&fd) else {
                        continue;
                    };
                    if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile {
                        self.file(
                            File::from(fd),
                            u64::try_from(stat.st_size).unwrap_or(0),
                            &relative,
                        );
                    }
                }
                // Symlinks are never followed and special files never opened.
                FileType::Symlink
                | FileType::Fifo
                | FileType::Socket
                | FileType::CharacterDevice
                | FileType::BlockDevice
                | FileType::Unknown => {}
            }
        }
    }

    fn file(&mut self, file: File, size: u64, relative: &str) {
        let limit = self.limits.max_grep_file_bytes;
        if size > limit {
            return;
        }
        let mut bytes = Vec::new();
        if file.take(limit + 1).read_to_end(&mut bytes).is_err() || bytes.len() as u64 > limit {
            return;
        }
        if bytes.iter().take(BINARY_PROBE_BYTES).any(|&b| b == 0) {
            return;
        }
        if bytes.is_empty() {
            return;
        }
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        for (index, line) in body.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !self.regex.is_match(line) {
                continue;
            }
            if self.matches.len() >= self.limits.max_grep_matches {
                self.truncated = true;
                return;
            }
            let text = String::from_utf8_lossy(line);
            let text = cut(&text, self.limits.max_grep_line_bytes);
            self.matches
                .push(format!("{relative}:{}:{text}", index + 1));
        }
    }
}

/// `text` shortened to at most `max` bytes on a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [...]", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        files: &[(&str, &str)],
        limits: &Limits,
        pattern: &str,
        path: Option<&str>,
        glob: Option<&str>,
        expected: Result<(&[&str], bool), &str>,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = tmp.path().join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            if let Some(target) = content.strip_prefix("-> ") {
                std::os::unix::fs::symlink(target, full).unwrap();
            } else {
                std::fs::write(full, content).unwrap();
            }
        }
        let workspace = Workspace::open(tmp.path()).unwrap();
        let request = GrepRequest {
            pattern: pattern.into(),
            path: path.map(str::to_owned),
            glob: glob.map(str::to_owned),
        };
        let got = grep(&workspace, limits, &request).map_err(|e| e.to_string());
        let expected = expected
            .map(|(matches, truncated)| GrepOutput {
                matches: matches.iter().map(|m| (*m).to_owned()).collect(),
                truncated,
            })
            .map_err(str::to_owned);
        assert_eq!(got, expected, "{pattern} {path:?} {glob:?}");
    }

    const TREE: &[(&str, &str)] = &[
        ("src/main.rs", "fn main() {\n    helper();\n}\n"),
        ("src/lib.rs", "pub fn helper() {}\r\n"),
        ("src/deep/mod.rs", "// fn in a comment"),
        ("README.md", "call helper() from main\n"),
        (".git/config", "fn in git\n"),
        ("bin.dat", "fn\0binary"),
        ("escape", "-> /etc"),
        ("linked.rs", "-> src/main.rs"),
    ];

    #[test]
    fn searches_sorted_and_skips_what_it_should() {
        let limits = Limits::default();
        check(
            TREE,
            &limits,
            r"\bfn\b",
            None,
            None,
            Ok((
                &[
                    "src/deep/mod.rs:1:// fn in a comment",
                    "src/lib.rs:1:pub fn helper() {}",
                    "src/main.rs:1:fn main() {",
                ],
                false,
            )),
        );
        check(
            TREE,
            &limits,
            "helper",
            None,
            Some("*.md"),
            Ok((&["README.md:1:call helper() from main"], false)),
        );
        check(
            TREE,
            &limits,
            "helper",
            Some("src"),
            Some("src/*.rs"),
            Ok((
                &[
                    "src/lib.rs:1:pub fn helper() {}",
                    "src/main.rs:2:    helper();",
                ],
                false,
            )),
        );
        check(
            TREE,
            &limits,
            "}$",
            Some("src/lib.rs"),
            Some("*.md"),
            Ok((&["src/lib.rs:1:pub fn helper() {}"], false)),
        );
        check(TREE, &limits, "^$", None, None, Ok((&[], false)));
        check(
            TREE,
            &limits,
            "x",
            Some("../"),
            None,
            Err("path escapes the workspace: ../"),
        );
        check(
            TREE,
            &limits,
            "(",
            None,
            None,
            Err("invalid regex: regex parse error: ( ^ error: unclosed group"),
        );
        check(
            TREE,
            &limits,
            "x",
            None,
            Some("[x"),
            Err("invalid glob: unclosed '[' in [x"),
        );
        // The model's 60 KB `{a}{a}...` once overflowed the executor's stack.
        check(
            TREE,
            &limits,
            "x",
            None,
            Some(&"{a}".repeat(20_480)),
            Err("invalid glob: the glob is 61440 characters long; the limit is 4096"),
        );
    }

    #[test]
    fn refuses_a_symlink_out() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("escape")).unwrap();
        let workspace = Workspace::open(tmp.path()).unwrap();
        let request = GrepRequest {
            pattern: "root".into(),
            path: Some("escape".into()),
            glob: None,
        };
        let error = grep(&workspace, &Limits::default(), &request).unwrap_err();
        assert_eq!(
            error.to_string(),
            workspace.symlink_escape_message("escape")
        );
    }

    #[test]
    fn caps_matches_files_and_lines() {
        let two = Limits {
            max_grep_matches: 2,
            ..Limits::default()
        };
        check(
            &[("a", "x\nx\nx\n")],
            &two,
            "x",
            None,
            None,
            Ok((&["a:1:x", "a:2:x"], true)),
        );
        check(
            &[("a", "x\nx\n")],
            &two,
            "x",
            None,
            None,
            Ok((&["a:1:x", "a:2:x"], false)),
        );
        let one_file = Limits {
            max_grep_files: 1,
            ..Limits::default()
        };
        check(
            &[("a", "x"), ("b", "x")],
            &one_file,
            "x",
            None,
            None,
            Ok((&["a:1:x"], true)),
        );
        let short = Limits {
            max_grep_line_bytes: 5,
            ..Limits::default()
        };
        check(
            &[("a", "éééé")],
            &short,
            "é",
            None,
            None,
            Ok((&["a:1:éé [...]"], false)),
        );
        let small = Limits {
            max_grep_file_bytes: 3,
            ..Limits::default()
        };
        check(
            &[("big", "xxxx"), ("ok", "xxx")],
            &small,
            "x",
            None,
            None,
            Ok((&["ok:1:xxx"], false)),
        );
    }
}
