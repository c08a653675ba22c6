//! The store's objects in git's own format, so that any git reads a store, and a store the
//! git command line wrote (before Nerve wrote its stores itself) reads here: loose objects,
//! each the zlib-deflated bytes `KIND LEN\0BODY` in `objects/xx/yyyy…`, named by the SHA-1
//! of the inflated bytes; trees as `MODE NAME\0<20-byte id>` entries in git's order. Nerve
//! never packs a store (`gc.auto` is off in its configuration), so only loose objects are
//! read.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;

use crate::HandsError;

/// An object's name: the SHA-1 of its inflated bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Oid(pub(crate) [u8; 20]);

impl Oid {
    /// The id of an object of `kind` holding `body`.
    pub(crate) fn of(kind: Kind, body: &[u8]) -> Self {
        let mut context = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        context.update(kind.name().as_bytes());
        context.update(format!(" {}\0", body.len()).as_bytes());
        context.update(body);
        let mut id = [0u8; 20];
        id.copy_from_slice(context.finish().as_ref());
        Self(id)
    }

    /// 40 hex digits, or `None` (a SHA-256 name is not one of this store's).
    pub(crate) fn from_hex(text: &str) -> Option<Self> {
        hex::decode(text).ok()?.try_into().ok().map(Self)
    }

    pub(crate) fn hex(self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Oid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// The kinds of object a snapshot is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Blob,
    Tree,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Blob => "blob",
            Self::Tree => "tree",
        }
    }
}

/// What a tree entry is, as git writes its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    File,
    Executable,
    /// The blob holds the link's target.
    Symlink,
    Tree,
    /// A nested repository's commit (stores written by `git add` may hold them; Nerve's
    /// snapshots leave nested repositories out).
    Gitlink,
}

impl Mode {
    pub(crate) fn octal(self) -> &'static str {
        match self {
            Self::File => "100644",
            Self::Executable => "100755",
            Self::Symlink => "120000",
            Self::Tree => "40000",
            Self::Gitlink => "160000",
        }
    }

    /// A mode as a tree holds it (git normalises file permissions to 644 and 755).
    fn parse(octal: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(octal).ok()?;
        let mode = u32::from_str_radix(text, 8).ok()?;
        match mode & 0o170_000 {
            0o040_000 => Some(Self::Tree),
            0o120_000 => Some(Self::Symlink),
            0o160_000 => Some(Self::Gitlink),
            0o100_000 if mode & 0o100 != 0 => Some(Self::Executable),
            0o100_000 => Some(Self::File),
            _ => None,
        }
    }
}

/// One entry of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TreeEntry {
    pub(crate) name: Vec<u8>,
    pub(crate) mode: Mode,
    pub(crate) oid: Oid,
}

impl TreeEntry {
    /// Git's order of a tree's entries: by name, a tree's name as if it ended in `/`.
    pub(crate) fn git_cmp(&self, other: &Self) -> std::cmp::Ordering {
        git_order(
            &self.name,
            self.mode == Mode::Tree,
            &other.name,
            other.mode == Mode::Tree,
        )
    }
}

/// Git's order of two names in one tree: byte order, a directory's name followed by `/`.
pub(crate) fn git_order(a: &[u8], a_dir: bool, b: &[u8], b_dir: bool) -> std::cmp::Ordering {
    let a_end: &[u8] = if a_dir { b"/" } else { b"" };
    let b_end: &[u8] = if b_dir { b"/" } else { b"" };
    a.iter().chain(a_end).cmp(b.iter().chain(b_end))
}

/// A tree's body from entries already in git's order.
pub(crate) fn encode_tree(entries: &[TreeEntry]) -> Vec<u8> {
    let mut body = Vec::with_capacity(entries.len() * 48);
    for entry in entries {
        body.extend_from_slice(entry.mode.octal().as_bytes());
        body.push(b' ');
        body.extend_from_slice(&entry.name);
        body.push(0);
        body.extend_from_slice(&entry.oid.0);
    }
    body
}

/// A tree's entries, or what is wrong with its body.
pub(crate) fn decode_tree(mut body: &[u8]) -> Result<Vec<TreeEntry>, String> {
    let mut entries = Vec::new();
    // Each pass takes at least 22 bytes off `body`, so the loop ends.
    while !body.is_empty() {
        let space = body
            .iter()
            .position(|&b| b == b' ')
            .ok_or("an entry without a mode")?;
        let mode = Mode::parse(&body[..space])
            .ok_or_else(|| format!("bad mode {}", String::from_utf8_lossy(&body[..space])))?;
        let rest = &body[space + 1..];
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or("an entry without a name")?;
        let id = rest.get(nul + 1..nul + 21).ok_or("a truncated entry")?;
        let mut oid = [0u8; 20];
        oid.copy_from_slice(id);
        entries.push(TreeEntry {
            name: rest[..nul].to_vec(),
            mode,
            oid: Oid(oid),
        });
        body = &rest[nul + 21..];
    }
    Ok(entries)
}

/// The loose objects of one store.
#[derive(Debug, Clone)]
pub(crate) struct Objects {
    dir: PathBuf,
}

impl Objects {
    pub(crate) fn new(store: &Path) -> Self {
        Self {
            dir: store.join("objects"),
        }
    }

    fn path(&self, oid: Oid) -> PathBuf {
        let hex = oid.hex();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    pub(crate) fn contains(&self, oid: Oid) -> bool {
        std::fs::symlink_metadata(self.path(oid)).is_ok()
    }

    /// Stores an object (unless the store has it) and returns its id. Written to a
    /// temporary file and renamed into place, so that an object is whole or absent; not
    /// flushed to disk, as git does not flush loose objects either.
    pub(crate) fn write(&self, kind: Kind, body: &[u8]) -> Result<Oid, HandsError> {
        let oid = Oid::of(kind, body);
        if self.contains(oid) {
            return Ok(oid);
        }
        let path = self.path(oid);
        let fail = |e: std::io::Error| {
            HandsError::Checkpoint(format!("cannot write the object {}: {e}", path.display()))
        };
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir).map_err(fail)?;
        let staged = tempfile::Builder::new()
            .prefix("tmp_obj_")
            .tempfile_in(dir)
            .map_err(fail)?;
        let mut encoder = ZlibEncoder::new(staged, Compression::fast());
        encoder
            .write_all(format!("{} {}\0", kind.name(), body.len()).as_bytes())
            .and_then(|()| encoder.write_all(body))
            .map_err(fail)?;
        let staged = encoder.finish().map_err(fail)?;
        // Read-only, as git leaves its objects.
        std::fs::set_permissions(staged.path(), std::fs::Permissions::from_mode(0o444))
            .map_err(fail)?;
        staged.persist(&path).map_err(|e| fail(e.error))?;
        Ok(oid)
    }

    /// The body of object `oid`, which must be of `kind`.
    pub(crate) fn read(&self, oid: Oid, kind: Kind) -> Result<Vec<u8>, HandsError> {
        let path = self.path(oid);
        let fail = |why: String| {
            HandsError::Checkpoint(format!("cannot read the {} {oid:?}: {why}", kind.name()))
        };
        let file = std::fs::File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                fail("the store does not have it".to_owned())
            } else {
                fail(e.to_string())
            }
        })?;
        let mut inflated = Vec::new();
        ZlibDecoder::new(file)
            .read_to_end(&mut inflated)
            .map_err(|e| fail(e.to_string()))?;
        let nul = inflated
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| fail("no header".to_owned()))?;
        let header = String::from_utf8_lossy(&inflated[..nul]).into_owned();
        let expected = format!("{} {}", kind.name(), inflated.len() - nul - 1);
        if header != expected {
            return Err(fail(format!("its header is `{header}`")));
        }
        inflated.drain(..=nul);
        Ok(inflated)
    }

    /// The entries of tree `oid`.
    pub(crate) fn tree(&self, oid: Oid) -> Result<Vec<TreeEntry>, HandsError> {
        let body = self.read(oid, Kind::Tree)?;
        decode_tree(&body)
            .map_err(|why| HandsError::Checkpoint(format!("the tree {oid:?} is damaged: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_gits() {
        // `git hash-object -t blob --stdin <<< ''` and git's empty tree.
        assert_eq!(
            Oid::of(Kind::Blob, b"\n").hex(),
            "8b137891791fe96927ad78e64b0aad7bded08bdc"
        );
        assert_eq!(
            Oid::of(Kind::Tree, b"").hex(),
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        );
    }

    #[test]
    fn trees_round_trip_and_sort_as_git_does() {
        let oid = Oid::of(Kind::Blob, b"x");
        let mut entries: Vec<TreeEntry> = [
            ("a", Mode::Tree),
            ("a.b", Mode::File),
            ("a-b", Mode::Executable),
            ("b", Mode::Symlink),
        ]
        .iter()
        .map(|(name, mode)| TreeEntry {
            name: name.as_bytes().to_vec(),
            mode: *mode,
            oid,
        })
        .collect();
        entries.sort_by(TreeEntry::git_cmp);
        let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
        assert_eq!(names, [&b"a-b"[..], b"a.b", b"a", b"b"]);
        assert_eq!(decode_tree(&encode_tree(&entries)).unwrap(), entries);
        assert!(decode_tree(b"100644 name").is_err());
        assert!(decode_tree(b"999999 x\0aaaaaaaaaaaaaaaaaaaa").is_err());
    }
}
