//! The stat cache of a store: every file of the last snapshot with the `lstat` data it had
//! then (size, modification and change times, inode and device, as git's index keeps
//! them) and its blob, so that the next snapshot reads only the files whose data moved,
//! and names the last tree at once when none did.
//!
//! A file changed in the same clock tick as the snapshot that recorded it could keep its
//! data unchanged (git's "racily clean" entries): an entry whose modification or change
//! time is not older than the coarse clock at the start of its snapshot is marked racy,
//! and the next snapshot reads it again.
//!
//! The cache lives in the store as `nerve-index` (not git's `index`: stores the git command
//! line wrote keep theirs, unread, and their first snapshot here reads every file once). It
//! is written to a temporary file and renamed, not flushed: after a crash it is whole, or
//! fails its checksum and is dropped, which costs one full read of the workspace.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::objects::{Mode, Oid};
use crate::HandsError;

/// The cache's file name in the store.
pub(crate) const FILE: &str = "nerve-index";

const MAGIC: &[u8; 8] = b"NRVSTAT1";

/// A time as the kernel stamps files: seconds and nanoseconds.
pub(crate) type Stamp = (i64, u32);

/// What `lstat` said about a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) size: u64,
    pub(crate) mtime: Stamp,
    pub(crate) ctime: Stamp,
    pub(crate) ino: u64,
    pub(crate) dev: u64,
}

impl Stat {
    pub(crate) fn of(meta: &std::fs::Metadata) -> Self {
        // Nanoseconds are below 10^9 whatever the platform's integer type.
        let nanos = |n: i64| u32::try_from(n).unwrap_or(0);
        Self {
            size: meta.size(),
            mtime: (meta.mtime(), nanos(meta.mtime_nsec())),
            ctime: (meta.ctime(), nanos(meta.ctime_nsec())),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }

    /// Whether the file may change again without these data moving: it changed at or
    /// after `start`, the coarse clock when the snapshot began.
    pub(crate) fn racy(&self, start: Stamp) -> bool {
        self.mtime >= start || self.ctime >= start
    }
}

/// The kernel's coarse real-time clock, the one file times are taken from (a file time can
/// be finer, never earlier).
pub(crate) fn coarse_now() -> Stamp {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    (now.tv_sec, u32::try_from(now.tv_nsec).unwrap_or(0))
}

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Relative to the workspace, `/`-separated.
    pub(crate) path: Vec<u8>,
    pub(crate) mode: Mode,
    pub(crate) oid: Oid,
    pub(crate) stat: Stat,
    /// Read again at the next snapshot, whatever its `lstat` says.
    pub(crate) racy: bool,
}

/// The last snapshot: its files in git's index order (byte order of the paths) and its tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Index {
    pub(crate) entries: Vec<Entry>,
    /// `None` before the first snapshot.
    pub(crate) tree: Option<Oid>,
}

impl Index {
    /// The cache in `store`, or an empty one when it is missing or not intact.
    pub(crate) fn load(store: &Path) -> Self {
        match std::fs::read(store.join(FILE)) {
            Ok(bytes) => decode(&bytes).unwrap_or_else(|| {
                tracing::warn!(store = %store.display(), "the snapshot stat cache is damaged; every file is read again");
                Self::default()
            }),
            Err(_) => Self::default(),
        }
    }

    pub(crate) fn save(&self, store: &Path) -> Result<(), HandsError> {
        let path = store.join(FILE);
        let fail = |e: std::io::Error| {
            HandsError::Checkpoint(format!("cannot write {}: {e}", path.display()))
        };
        let staged = tempfile::Builder::new()
            .prefix(".nerve-index")
            .tempfile_in(store)
            .map_err(fail)?;
        std::fs::write(staged.path(), self.encode()).map_err(fail)?;
        staged.persist(&path).map_err(|e| fail(e.error))?;
        Ok(())
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.entries.len() * 96);
        out.extend_from_slice(MAGIC);
        match self.tree {
            Some(tree) => {
                out.push(1);
                out.extend_from_slice(&tree.0);
            }
            None => out.extend_from_slice(&[0; 21]),
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for entry in &self.entries {
            out.extend_from_slice(&(entry.path.len() as u32).to_le_bytes());
            out.extend_from_slice(&entry.path);
            out.push(mode_byte(entry.mode));
            out.extend_from_slice(&entry.oid.0);
            let stat = &entry.stat;
            out.extend_from_slice(&stat.size.to_le_bytes());
            out.extend_from_slice(&stat.mtime.0.to_le_bytes());
            out.extend_from_slice(&stat.mtime.1.to_le_bytes());
            out.extend_from_slice(&stat.ctime.0.to_le_bytes());
            out.extend_from_slice(&stat.ctime.1.to_le_bytes());
            out.extend_from_slice(&stat.ino.to_le_bytes());
            out.extend_from_slice(&stat.dev.to_le_bytes());
            out.push(u8::from(entry.racy));
        }
        let mut crc = flate2::Crc::new();
        crc.update(&out);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out
    }
}

fn mode_byte(mode: Mode) -> u8 {
    match mode {
        Mode::File => 0,
        Mode::Executable => 1,
        Mode::Symlink => 2,
        Mode::Tree => 3,
        Mode::Gitlink => 4,
    }
}

fn byte_mode(byte: u8) -> Option<Mode> {
    [
        Mode::File,
        Mode::Executable,
        Mode::Symlink,
        Mode::Tree,
        Mode::Gitlink,
    ]
    .get(usize::from(byte))
    .copied()
}

/// Reads fields off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
}

fn decode(bytes: &[u8]) -> Option<Index> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    let mut crc = flate2::Crc::new();
    crc.update(body);
    if crc.sum().to_le_bytes() != sum {
        return None;
    }
    let mut reader = Reader(body);
    if reader.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let has_tree = reader.u8()? == 1;
    let tree = Oid(reader.array()?);
    let count = reader.u64()?;
    let mut entries = Vec::new();
    // At most `count` passes, and each takes bytes off the reader or stops it.
    for _ in 0..count {
        let len = usize::try_from(reader.u32()?).ok()?;
        let path = reader.take(len)?.to_vec();
        let mode = byte_mode(reader.u8()?)?;
        let oid = Oid(reader.array()?);
        let stat = Stat {
            size: reader.u64()?,
            mtime: (reader.i64()?, reader.u32()?),
            ctime: (reader.i64()?, reader.u32()?),
            ino: reader.u64()?,
            dev: reader.u64()?,
        };
        let racy = reader.u8()? != 0;
        entries.push(Entry {
            path,
            mode,
            oid,
            stat,
            racy,
        });
    }
    if !reader.0.is_empty() || !entries.is_sorted_by(|a, b| a.path < b.path) {
        return None;
    }
    Some(Index {
        entries,
        tree: has_tree.then_some(tree),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::objects::Kind;

    #[test]
    fn round_trips_and_refuses_damage() {
        let stat = Stat {
            size: 7,
            mtime: (1_700_000_000, 5),
            ctime: (-3, 999_999_999),
            ino: u64::MAX,
            dev: 2049,
        };
        let index = Index {
            entries: vec![
                Entry {
                    path: b"a/b.txt".to_vec(),
                    mode: Mode::Executable,
                    oid: Oid::of(Kind::Blob, b"x"),
                    stat,
                    racy: true,
                },
                Entry {
                    path: b"b".to_vec(),
                    mode: Mode::Symlink,
                    oid: Oid::of(Kind::Blob, b"a"),
                    stat,
                    racy: false,
                },
            ],
            tree: Some(Oid::of(Kind::Tree, b"")),
        };
        let bytes = index.encode();
        assert_eq!(decode(&bytes), Some(index.clone()));
        for cut in [0, 1, 8, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert_eq!(decode(&flipped), None);
        let empty = Index::default();
        assert_eq!(decode(&empty.encode()), Some(empty));

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Index::load(dir.path()), Index::default());
        index.save(dir.path()).unwrap();
        assert_eq!(Index::load(dir.path()), index);
    }

    #[test]
    fn the_coarse_clock_is_not_ahead_of_file_times() {
        let dir = tempfile::tempdir().unwrap();
        let start = coarse_now();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let stat = Stat::of(&std::fs::symlink_metadata(&path).unwrap());
        assert!(stat.racy(start), "{stat:?} written after {start:?}");
    }
}
