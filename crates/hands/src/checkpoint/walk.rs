//! One walk of the workspace for a snapshot: every regular file and symlink that `git add
//! -A` would take in, in git's index order (byte order of the paths), with its `lstat`
//! data.
//!
//! What is left out, as git leaves it out: any path component named `.git`; whatever the
//! workspace's `.gitignore` files ignore (a deeper file's rules win over a shallower one's,
//! the last matching line of a file wins, an ignored directory is not even listed) and the
//! store's own `info/exclude`; sockets, fifos and devices. Unlike git: a nested repository
//! (a directory holding a `.git`) is left out whole, where git would record its commit;
//! files larger than the cap are left out (their `lstat` says so, so they are never read);
//! the user's global excludes file is not read (a snapshot must not depend on who runs it).
//!
//! Each directory costs one listing and each file one `lstat` relative to it; a
//! `.gitignore` is read only where a listing shows one.

use std::ffi::OsString;
use std::fs::{DirEntry, FileType, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::objects::git_order;
use crate::HandsError;

/// Directories deeper than this are not walked (no file system path gets near it).
const MAX_DEPTH: usize = 2048;

/// A file or symlink the snapshot covers.
#[derive(Debug)]
pub(crate) struct Found {
    /// Relative to the workspace, `/`-separated.
    pub(crate) path: Vec<u8>,
    pub(crate) meta: Metadata,
}

/// What a walk leaves out besides `.gitignore` rules.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// The store's `info/exclude`, rooted at the workspace: the lowest precedence.
    exclude: Option<Gitignore>,
    max_file_bytes: u64,
}

impl Rules {
    /// The rules for `workspace` with the store's exclude file (missing: none).
    pub(crate) fn new(workspace: &Path, exclude_file: &Path, max_file_bytes: u64) -> Self {
        let exclude = exclude_file.is_file().then(|| {
            let mut builder = GitignoreBuilder::new(workspace);
            if let Some(error) = builder.add(exclude_file) {
                tracing::warn!(%error, "a line of the snapshot store's exclude file is not used");
            }
            builder.build().unwrap_or_else(|error| {
                tracing::warn!(%error, "the snapshot store's exclude file is not used");
                Gitignore::empty()
            })
        });
        Self {
            exclude,
            max_file_bytes,
        }
    }
}

/// Every file the snapshot covers, in git's index order.
pub(crate) fn walk(root: &Path, rules: &Rules) -> Result<Vec<Found>, HandsError> {
    let mut walk = Walk {
        rules,
        found: Vec::new(),
        ignores: Vec::new(),
    };
    walk.dir(root, &mut Vec::new(), 0)?;
    Ok(walk.found)
}

struct Walk<'a> {
    rules: &'a Rules,
    found: Vec<Found>,
    /// The `.gitignore` matchers of the directories being walked, shallowest first.
    ignores: Vec<Gitignore>,
}

impl Walk<'_> {
    /// Walks directory `dir`, whose path relative to the root is `prefix` (empty, or
    /// ending in `/`). Terminates: symlinks are never followed, so each call goes one level
    /// down a finite tree, and [`MAX_DEPTH`] bounds the depth.
    fn dir(&mut self, dir: &Path, prefix: &mut Vec<u8>, depth: usize) -> Result<(), HandsError> {
        if depth > MAX_DEPTH {
            return Err(HandsError::Checkpoint(format!(
                "{} is nested more than {MAX_DEPTH} directories deep",
                dir.display()
            )));
        }
        let listing = std::fs::read_dir(dir)
            .map_err(|e| HandsError::Checkpoint(format!("cannot list {}: {e}", dir.display())))?;
        let mut children: Vec<(OsString, FileType, DirEntry)> = Vec::new();
        let mut gitignore = false;
        for entry in listing {
            let entry = entry.map_err(|e| {
                HandsError::Checkpoint(format!("cannot list {}: {e}", dir.display()))
            })?;
            let name = entry.file_name();
            let kind = entry.file_type().map_err(|e| {
                HandsError::Checkpoint(format!("cannot stat {}: {e}", entry.path().display()))
            })?;
            match name.as_bytes() {
                b".git" if depth > 0 => return Ok(()),
                b".git" => continue,
                // As git: a `.gitignore` that is a symlink is not followed.
                b".gitignore" => gitignore |= kind.is_file(),
                _ => {}
            }
            children.push((name, kind, entry));
        }
        children.sort_by(|(a, a_kind, _), (b, b_kind, _)| {
            git_order(a.as_bytes(), a_kind.is_dir(), b.as_bytes(), b_kind.is_dir())
        });
        let pushed = gitignore && self.push_gitignore(&dir.join(".gitignore"));
        let result = self.children(dir, prefix, depth, children);
        if pushed {
            self.ignores.pop();
        }
        result
    }

    fn children(
        &mut self,
        dir: &Path,
        prefix: &mut Vec<u8>,
        depth: usize,
        children: Vec<(OsString, FileType, DirEntry)>,
    ) -> Result<(), HandsError> {
        let base = prefix.len();
        for (name, kind, entry) in children {
            let path = dir.join(&name);
            if self.ignored(&path, kind.is_dir()) {
                continue;
            }
            prefix.truncate(base);
            prefix.extend_from_slice(name.as_bytes());
            if kind.is_dir() {
                prefix.push(b'/');
                self.dir(&path, prefix, depth + 1)?;
            } else if kind.is_file() || kind.is_symlink() {
                let meta = match entry.metadata() {
                    Ok(meta) => meta,
                    // Gone since the listing: not in this snapshot.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(HandsError::Checkpoint(format!(
                            "cannot stat {}: {e}",
                            path.display()
                        )));
                    }
                };
                if meta.is_file() && meta.len() > self.rules.max_file_bytes {
                    continue;
                }
                self.found.push(Found {
                    path: prefix.clone(),
                    meta,
                });
            }
        }
        prefix.truncate(base);
        Ok(())
    }

    /// Reads a directory's `.gitignore`; false (and a warning) when it cannot be used.
    fn push_gitignore(&mut self, file: &PathBuf) -> bool {
        let (matcher, error) = Gitignore::new(file);
        if let Some(error) = error {
            tracing::warn!(%error, "a .gitignore line is not used by workspace snapshots");
        }
        if matcher.is_empty() {
            return false;
        }
        self.ignores.push(matcher);
        true
    }

    /// Whether `path` is ignored: the deepest `.gitignore` with a say decides, then the
    /// store's exclude file.
    fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        let decided = self
            .ignores
            .iter()
            .rev()
            .chain(&self.rules.exclude)
            .map(|matcher| matcher.matched(path, is_dir))
            .find(|m| !m.is_none());
        matches!(decided, Some(Match::Ignore(_)))
    }
}
