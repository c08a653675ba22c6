//! Who owns each file of a snapshot, and its permission bits. Git's trees keep only
//! whether a file is executable, so a rewind run by root would leave every file it writes
//! owned by root with mode 0644, in a workspace that belongs to someone else. Each tree's
//! owners are kept in the store as `nerve-owners/<tree>`: one line per file, `uid gid mode
//! path` with the mode in octal and the path's bytes in hex (a path may hold any byte but
//! `/` and NUL). A tree that comes back with other owners (the same contents, chmodded)
//! keeps the owners of its latest snapshot.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::HandsError;

/// The directory of the owner files in a store.
const DIR: &str = "nerve-owners";

/// A file's owner and permission bits (set-id and sticky bits included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mode: u32,
}

impl Owner {
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
        }
    }
}

fn file(store: &Path, tree: &str) -> PathBuf {
    store.join(DIR).join(tree)
}

/// Whether the owners of `tree` are in the store.
pub(crate) fn recorded(store: &Path, tree: &str) -> bool {
    file(store, tree).is_file()
}

/// Records the owners of `tree`'s files (in the tree's order), unless the store holds
/// exactly these already.
pub(crate) fn record(
    store: &Path,
    tree: &str,
    files: &[(Vec<u8>, Owner)],
) -> Result<(), HandsError> {
    let mut text = String::with_capacity(files.len() * 48);
    for (path, owner) in files {
        let _ = write!(text, "{} {} {:o} ", owner.uid, owner.gid, owner.mode);
        for byte in path {
            let _ = write!(text, "{byte:02x}");
        }
        text.push('\n');
    }
    let target = file(store, tree);
    if std::fs::read(&target).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(());
    }
    let fail = |e: std::io::Error| {
        HandsError::Checkpoint(format!("cannot record the owners of snapshot {tree}: {e}"))
    };
    std::fs::create_dir_all(store.join(DIR)).map_err(fail)?;
    // Written whole, then renamed: a reader never sees half of it.
    let partial = target.with_extension("partial");
    std::fs::write(&partial, text).map_err(fail)?;
    std::fs::rename(&partial, &target).map_err(fail)
}

/// The owners recorded for `tree`: empty for a tree recorded before owners were (it is
/// restored as before, with the restoring process's owner and git's modes).
pub(crate) fn load(store: &Path, tree: &str) -> HashMap<Vec<u8>, Owner> {
    let Ok(text) = std::fs::read_to_string(file(store, tree)) else {
        return HashMap::new();
    };
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<(Vec<u8>, Owner)> {
    let mut fields = line.split(' ');
    let uid = fields.next()?.parse().ok()?;
    let gid = fields.next()?.parse().ok()?;
    let mode = u32::from_str_radix(fields.next()?, 8).ok()?;
    let hex = fields.next()?;
    if hex.len() % 2 != 0 || fields.next().is_some() {
        return None;
    }
    let path = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((path, Owner { uid, gid, mode }))
}

/// Gives the file at `full` its recorded owner and mode where they differ. Changing the
/// owner takes root (or the owner already being right): without it the file keeps the
/// restoring process's, as any copy would. A symlink's own owner is set, never its
/// target's, and a symlink has no mode of its own.
pub(crate) fn apply(full: &Path, owner: Owner) -> Result<(), HandsError> {
    let Ok(meta) = std::fs::symlink_metadata(full) else {
        return Ok(());
    };
    if (meta.uid(), meta.gid()) != (owner.uid, owner.gid) {
        match std::os::unix::fs::lchown(full, Some(owner.uid), Some(owner.gid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => {
                return Err(HandsError::Checkpoint(format!(
                    "cannot give {} its owner back: {e}",
                    full.display()
                )));
            }
        }
    }
    if !meta.is_symlink() && meta.mode() & 0o7777 != owner.mode {
        std::fs::set_permissions(full, std::fs::Permissions::from_mode(owner.mode)).map_err(
            |e| {
                HandsError::Checkpoint(format!("cannot give {} its mode back: {e}", full.display()))
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_round_trip_through_the_store_with_any_path_bytes() {
        let store = tempfile::tempdir().unwrap();
        let files = vec![
            (
                b"a.txt".to_vec(),
                Owner {
                    uid: 4242,
                    gid: 4243,
                    mode: 0o640,
                },
            ),
            (
                b"dir/odd \xff name".to_vec(),
                Owner {
                    uid: 0,
                    gid: 0,
                    mode: 0o4755,
                },
            ),
        ];
        record(store.path(), "abc", &files).unwrap();
        let loaded = load(store.path(), "abc");
        assert_eq!(loaded.len(), 2);
        for (path, owner) in &files {
            assert_eq!(loaded.get(path), Some(owner));
        }
        assert!(load(store.path(), "other").is_empty());
        assert_eq!(parse_line("1 2 644 6"), None);
        assert_eq!(parse_line("1 2 9 61"), None);
    }
}
