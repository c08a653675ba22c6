//! Workspace checkpoints: snapshots of the workspace in a shadow object store outside it,
//! the diff between two snapshots, what changed since one, and the restore of one.
//!
//! The store is a bare git repository of its own, one per execution, read and written
//! in-process in git's formats ([`objects`]): no process is started, on a turn boundary or
//! anywhere else, and any git can read a store (`git --git-dir STORE diff-tree -p A B`),
//! while the stores that earlier versions wrote through the `git` command line read here.
//! A snapshot walks the workspace as `git add -A` would ([`walk`]: the workspace's
//! `.gitignore` rules, never a `.git`), `lstat`s each file and compares it with the stat
//! cache ([`index`]: size, times, inode, device, as git's index): only files whose data
//! moved are read, hashed and stored, and when none did the snapshot is the last tree, at
//! once. The user's repository is never touched.
//!
//! Why not the `gix` crate: it has no `git add` (the incremental, stat-cached snapshot this
//! needs is the part it would not provide), and it would add some hundred crates to a build
//! on two shared cores. Git's loose-object and tree formats are small and stable: SHA-1
//! through *ring*, zlib through `flate2`, ignore rules through `ignore` (ripgrep's).
//!
//! Files larger than [`CheckpointConfig::max_file_bytes`] are left out of snapshots (their
//! size says so, so they are never read), and so are paths the store's `info/exclude`
//! lists (stores written by earlier versions list the files that crossed the cap there).
//!
//! Every function here blocks on the file system: call them from `spawn_blocking`.

mod index;
mod objects;
mod owners;
mod patch;
mod walk;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use index::{Entry, Index, Stat};
use objects::{Kind, Mode, Objects, Oid, TreeEntry};

use crate::HandsError;

/// Where a workspace's snapshots are kept, and what they leave out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The shadow store (a bare git repository, created when missing): one per execution,
    /// outside the workspace.
    pub store: PathBuf,
    pub workspace: PathBuf,
    /// Files larger than this are not snapshotted.
    pub max_file_bytes: u64,
}

impl CheckpointConfig {
    /// A store for `workspace` at `store`, with a 10 MiB cap on files.
    pub fn new(store: impl Into<PathBuf>, workspace: impl Into<PathBuf>) -> Self {
        Self {
            store: store.into(),
            workspace: workspace.into(),
            max_file_bytes: 10 << 20,
        }
    }
}

/// A snapshot: the hash of the workspace's tree in the shadow store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeHash(String);

impl TreeHash {
    /// A hash as a `workspace_snapshot` event or a user names it: 40 or 64 hex digits.
    pub fn parse(text: &str) -> Result<Self, HandsError> {
        let valid = matches!(text.len(), 40 | 64)
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(HandsError::Checkpoint(format!(
                "`{}` is not a tree hash",
                text.chars().take(80).collect::<String>()
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn oid(&self) -> Result<Oid, HandsError> {
        Oid::from_hex(&self.0).ok_or_else(|| {
            HandsError::Checkpoint(format!(
                "{} is not a tree of this store (its trees are SHA-1)",
                self.0
            ))
        })
    }
}

impl fmt::Display for TreeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a path differs between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One path that differs, relative to the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub path: String,
}

/// A workspace's shadow store. Clones share the stat cache.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    config: CheckpointConfig,
    objects: Objects,
    rules: walk::Rules,
    state: Arc<Mutex<State>>,
}

/// What a store's handle keeps between snapshots.
#[derive(Debug, Default)]
struct State {
    /// The last snapshot, read from the store at the first one.
    index: Option<Index>,
    /// Trees this handle knows the store holds (no `stat` to find out).
    trees: HashSet<Oid>,
    /// Files the last snapshot read (the tests' window on the stat cache).
    last_read: usize,
}

/// One path that differs between two trees, with its mode and object on each side.
#[derive(Debug, Clone)]
struct Delta {
    path: Vec<u8>,
    old: Option<(Mode, Oid)>,
    new: Option<(Mode, Oid)>,
}

impl Delta {
    fn kind(&self) -> ChangeKind {
        match (self.old, self.new) {
            (None, _) => ChangeKind::Added,
            (_, None) => ChangeKind::Deleted,
            (Some(_), Some(_)) => ChangeKind::Modified,
        }
    }
}

/// The store's git configuration: byte-exact snapshots whatever a git's defaults, and never
/// a `gc` that would pack the objects.
const STORE_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n\tautocrlf = false\n\tsafecrlf = false\n\tsymlinks = true\n[gc]\n\tauto = 0\n";

impl Checkpoints {
    /// Opens the store, creating it when missing.
    pub fn open(config: CheckpointConfig) -> Result<Self, HandsError> {
        if !config.workspace.is_dir() {
            return Err(HandsError::Workspace(format!(
                "{} is not a directory",
                config.workspace.display()
            )));
        }
        if config.store.starts_with(&config.workspace) {
            return Err(HandsError::Checkpoint(format!(
                "the snapshot store {} must be outside the workspace",
                config.store.display()
            )));
        }
        if !config.store.join("HEAD").is_file() {
            init_store(&config.store)?;
        }
        Ok(Self::on_store(config))
    }

    /// The checkpoints of a store that exists.
    fn on_store(config: CheckpointConfig) -> Self {
        let rules = walk::Rules::new(
            &config.workspace,
            &config.store.join("info").join("exclude"),
            config.max_file_bytes,
        );
        Self {
            objects: Objects::new(&config.store),
            rules,
            config,
            state: Arc::default(),
        }
    }

    /// Opens an existing store to read its snapshots (a diff), whether the workspace is
    /// still there or not: nothing is created, and nothing here reads the workspace.
    pub fn open_existing(config: CheckpointConfig) -> Result<Self, HandsError> {
        if !config.store.join("HEAD").is_file() {
            return Err(HandsError::Checkpoint(format!(
                "{} is not a snapshot store",
                config.store.display()
            )));
        }
        Ok(Self::on_store(config))
    }

    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another snapshot leaves nothing half-done that matters: the cache is
        // replaced whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the workspace as it is and returns its tree. Costs a listing of each
    /// directory and an `lstat` of each file that is not ignored, and a read of each file
    /// whose `lstat` data moved since the last snapshot; when none did, the last tree.
    pub fn snapshot(&self) -> Result<TreeHash, HandsError> {
        let mut state = self.lock();
        let start = index::coarse_now();
        let found = walk::walk(&self.config.workspace, &self.rules)?;
        let previous = state
            .index
            .take()
            .unwrap_or_else(|| Index::load(&self.config.store));
        let mut old = previous.entries.iter().peekable();
        let mut entries = Vec::with_capacity(found.len());
        let mut owned = Vec::with_capacity(found.len());
        // Whether the tree differs from the last one; whether the cache does.
        let mut changed = previous.tree.is_none();
        let mut dirty = false;
        let mut read = 0;
        for file in found {
            // Files of the last snapshot sorting before this one are gone. Ends: each pass
            // takes an entry off `old`.
            while old.next_if(|e| e.path < file.path).is_some() {
                changed = true;
            }
            let before = old.next_if(|e| e.path == file.path);
            let stat = Stat::of(&file.meta);
            let mode = mode_of(&file.meta);
            let cached = before
                .filter(|e| !e.racy && e.stat == stat && e.mode == mode)
                .map(|e| e.oid);
            let oid = match cached {
                Some(oid) => oid,
                None => {
                    read += 1;
                    match self.store_file(&file.path, &file.meta)? {
                        Some(oid) => oid,
                        None => {
                            // Gone, or over the cap, since the walk.
                            changed |= before.is_some();
                            continue;
                        }
                    }
                }
            };
            let racy = stat.racy(start);
            match before {
                Some(e) if e.mode == mode && e.oid == oid => {
                    dirty |= e.stat != stat || e.racy != racy;
                }
                _ => changed = true,
            }
            owned.push((file.path.clone(), owners::Owner::of(&file.meta)));
            entries.push(Entry {
                path: file.path,
                mode,
                oid,
                stat,
                racy,
            });
        }
        changed |= old.next().is_some();
        state.last_read = read;
        let tree = match previous.tree {
            Some(tree) if !changed => tree,
            _ => self.write_tree(&entries, 0, &mut state.trees)?,
        };
        // An owner or mode that changed moved the file's change time, so the stat cache
        // saw it (`dirty`): an unchanged workspace costs no read of the owners.
        let hex = tree.hex();
        if (changed || dirty || !owners::recorded(&self.config.store, &hex))
            && let Err(error) = owners::record(&self.config.store, &hex, &owned)
        {
            // A rewind of this tree then restores files as the restoring process owns them.
            tracing::warn!(%error, "the snapshot's owners are not recorded");
        }
        if changed || dirty {
            let index = Index {
                entries,
                tree: Some(tree),
            };
            if let Err(error) = index.save(&self.config.store) {
                // Only the next process's first snapshot pays: it reads every file.
                tracing::warn!(%error, "the snapshot stat cache is not saved");
            }
            state.index = Some(index);
        } else {
            state.index = Some(previous);
        }
        Ok(TreeHash(tree.hex()))
    }

    /// Stores the workspace's file `path` as a blob; `None` when it is gone, became a
    /// directory, or grew over the cap since the walk.
    fn store_file(&self, path: &[u8], meta: &std::fs::Metadata) -> Result<Option<Oid>, HandsError> {
        let full = self.config.workspace.join(OsStr::from_bytes(path));
        let fail = |e: std::io::Error| {
            HandsError::Checkpoint(format!("cannot read {}: {e}", full.display()))
        };
        let gone = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::IsADirectory
                    | std::io::ErrorKind::NotADirectory
            ) || e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
        };
        let bytes = if meta.is_symlink() {
            match std::fs::read_link(&full) {
                Ok(target) => target.into_os_string().into_vec(),
                Err(e) if gone(&e) || e.kind() == std::io::ErrorKind::InvalidInput => {
                    return Ok(None);
                }
                Err(e) => return Err(fail(e)),
            }
        } else {
            // Never through a symlink that replaced the file since the walk.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                .open(&full);
            let file = match file {
                Ok(file) => file,
                Err(e) if gone(&e) => return Ok(None),
                Err(e) => return Err(fail(e)),
            };
            let cap = self.config.max_file_bytes;
            let mut bytes = Vec::with_capacity(usize::try_from(meta.len().min(cap)).unwrap_or(0));
            file.take(cap.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(fail)?;
            if bytes.len() as u64 > cap {
                return Ok(None);
            }
            bytes
        };
        self.objects.write(Kind::Blob, &bytes).map(Some)
    }

    /// Writes the trees of `entries` (all under one directory whose path is
    /// `entries[..].path[..prefix]`) and returns the top one's id.
    fn write_tree(
        &self,
        entries: &[Entry],
        prefix: usize,
        known: &mut HashSet<Oid>,
    ) -> Result<Oid, HandsError> {
        let mut tree = Vec::new();
        let mut i = 0;
        // Ends: each pass moves `i` forward by at least one entry.
        while let Some(entry) = entries.get(i) {
            let rest = &entry.path[prefix..];
            match rest.iter().position(|&b| b == b'/') {
                None => {
                    tree.push(TreeEntry {
                        name: rest.to_vec(),
                        mode: entry.mode,
                        oid: entry.oid,
                    });
                    i += 1;
                }
                Some(slash) => {
                    // In byte order, a directory's files are consecutive.
                    let dir = &entry.path[..prefix + slash + 1];
                    let len = entries[i..]
                        .iter()
                        .take_while(|e| e.path.starts_with(dir))
                        .count();
                    let oid = self.write_tree(&entries[i..i + len], dir.len(), known)?;
                    tree.push(TreeEntry {
                        name: rest[..slash].to_vec(),
                        mode: Mode::Tree,
                        oid,
                    });
                    i += len;
                }
            }
        }
        let body = objects::encode_tree(&tree);
        let oid = Oid::of(Kind::Tree, &body);
        if !known.contains(&oid) {
            self.objects.write(Kind::Tree, &body)?;
            known.insert(oid);
        }
        Ok(oid)
    }

    /// Every file of `tree` (blobs and nested repositories' commits), in git's order.
    fn flatten(
        &self,
        tree: Oid,
        prefix: &mut Vec<u8>,
        out: &mut Vec<(Vec<u8>, Mode, Oid)>,
    ) -> Result<(), HandsError> {
        let base = prefix.len();
        for entry in self.objects.tree(tree)? {
            prefix.truncate(base);
            prefix.extend_from_slice(&entry.name);
            if entry.mode == Mode::Tree {
                prefix.push(b'/');
                // Ends: a tree cannot contain itself (its id is the hash of its entries).
                self.flatten(entry.oid, prefix, out)?;
            } else {
                out.push((prefix.clone(), entry.mode, entry.oid));
            }
        }
        prefix.truncate(base);
        Ok(())
    }

    /// The paths of `tree`, relative to the workspace.
    pub fn paths(&self, tree: &TreeHash) -> Result<Vec<String>, HandsError> {
        let mut files = Vec::new();
        self.flatten(tree.oid()?, &mut Vec::new(), &mut files)?;
        Ok(files.iter().map(|(path, _, _)| lossy(path)).collect())
    }

    /// What differs from tree `from` to tree `to` under `prefix`, in git's order.
    fn deltas(
        &self,
        from: Oid,
        to: Oid,
        prefix: &mut Vec<u8>,
        out: &mut Vec<Delta>,
    ) -> Result<(), HandsError> {
        if from == to {
            return Ok(());
        }
        let (old, new) = (self.objects.tree(from)?, self.objects.tree(to)?);
        let (mut i, mut j) = (0, 0);
        let base = prefix.len();
        // Ends: each pass moves `i`, `j` or both forward.
        loop {
            prefix.truncate(base);
            let order = match (old.get(i), new.get(j)) {
                (Some(a), Some(b)) => a.git_cmp(b),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => break,
            };
            match order {
                std::cmp::Ordering::Less => {
                    self.one_side(&old[i], prefix, out, true)?;
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    self.one_side(&new[j], prefix, out, false)?;
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    let (a, b) = (&old[i], &new[j]);
                    prefix.extend_from_slice(&a.name);
                    if a.mode == Mode::Tree {
                        prefix.push(b'/');
                        self.deltas(a.oid, b.oid, prefix, out)?;
                    } else if (a.mode, a.oid) != (b.mode, b.oid) {
                        out.push(Delta {
                            path: prefix.clone(),
                            old: Some((a.mode, a.oid)),
                            new: Some((b.mode, b.oid)),
                        });
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        prefix.truncate(base);
        Ok(())
    }

    /// An entry on one side only: every file under it deleted (`removed`) or added.
    fn one_side(
        &self,
        entry: &TreeEntry,
        prefix: &mut Vec<u8>,
        out: &mut Vec<Delta>,
        removed: bool,
    ) -> Result<(), HandsError> {
        let base = prefix.len();
        prefix.extend_from_slice(&entry.name);
        let mut files = Vec::new();
        if entry.mode == Mode::Tree {
            prefix.push(b'/');
            self.flatten(entry.oid, prefix, &mut files)?;
        } else {
            files.push((prefix.clone(), entry.mode, entry.oid));
        }
        prefix.truncate(base);
        out.extend(files.into_iter().map(|(path, mode, oid)| Delta {
            path,
            old: removed.then_some((mode, oid)),
            new: (!removed).then_some((mode, oid)),
        }));
        Ok(())
    }

    fn all_deltas(&self, from: &TreeHash, to: &TreeHash) -> Result<Vec<Delta>, HandsError> {
        let mut out = Vec::new();
        self.deltas(from.oid()?, to.oid()?, &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    /// The unified diff from `from` to `to` (binary files named, not shown; a file moved
    /// unchanged shown as a rename), paths relative to the workspace.
    pub fn diff(&self, from: &TreeHash, to: &TreeHash) -> Result<String, HandsError> {
        let deltas = self.all_deltas(from, to)?;
        // Exact renames: a deleted file whose bytes an added one has (not empty ones).
        let empty = Oid::of(Kind::Blob, b"");
        let mut deleted: HashMap<Oid, Vec<usize>> = HashMap::new();
        for (at, delta) in deltas.iter().enumerate() {
            if let (Some((mode, oid)), None) = (delta.old, delta.new)
                && mode != Mode::Gitlink
                && oid != empty
            {
                deleted.entry(oid).or_default().push(at);
            }
        }
        let mut renamed_from: HashMap<usize, usize> = HashMap::new();
        for (at, delta) in deltas.iter().enumerate() {
            if let (None, Some((mode, oid))) = (delta.old, delta.new)
                && mode != Mode::Gitlink
                && let Some(from) = deleted.get_mut(&oid).and_then(Vec::pop)
            {
                renamed_from.insert(at, from);
            }
        }
        let moved: HashSet<usize> = renamed_from.values().copied().collect();
        let mut out = String::new();
        for (at, delta) in deltas.iter().enumerate() {
            if moved.contains(&at) {
                continue;
            }
            let old_delta = renamed_from.get(&at).map_or(delta, |&from| &deltas[from]);
            let old = self.side(&old_delta.path, old_delta.old)?;
            let new = self.side(&delta.path, delta.new)?;
            patch::file(
                &mut out,
                old.as_ref().map(Loaded::side),
                new.as_ref().map(Loaded::side),
            );
        }
        Ok(out)
    }

    /// One side of a file's change, its bytes read.
    fn side(&self, path: &[u8], side: Option<(Mode, Oid)>) -> Result<Option<Loaded>, HandsError> {
        let Some((mode, oid)) = side else {
            return Ok(None);
        };
        let bytes = match mode {
            // As git shows a submodule.
            Mode::Gitlink => format!("Subproject commit {}\n", oid.hex()).into_bytes(),
            Mode::File | Mode::Executable | Mode::Symlink | Mode::Tree => {
                self.objects.read(oid, Kind::Blob)?
            }
        };
        Ok(Some(Loaded {
            path: lossy(path),
            mode,
            oid,
            bytes,
        }))
    }

    /// The paths that differ from `from` to `to`.
    pub fn changes(&self, from: &TreeHash, to: &TreeHash) -> Result<Vec<Change>, HandsError> {
        Ok(self
            .all_deltas(from, to)?
            .iter()
            .map(|delta| Change {
                kind: delta.kind(),
                path: lossy(&delta.path),
            })
            .collect())
    }

    /// What differs in the workspace now from `snapshot` (records the workspace first).
    pub fn changed_since(&self, snapshot: &TreeHash) -> Result<Vec<Change>, HandsError> {
        let now = self.snapshot()?;
        self.changes(snapshot, &now)
    }

    /// Makes the workspace `tree` again: files of the tree written back, files added since
    /// removed (and directories they leave empty); ignored and over-cap files are left
    /// alone. Never writes through a symlink: a directory of the tree that is a symlink in
    /// the workspace (and not a file of the snapshot, which the restore replaces) is an
    /// error. The caller decides whether changes made outside the execution may be
    /// overwritten ([`Self::changed_since`]).
    pub fn restore(&self, tree: &TreeHash) -> Result<(), HandsError> {
        let target_oid = tree.oid()?;
        // The cache must hold the workspace as it is: what the tree lacks is removed.
        self.snapshot()?;
        let current: HashMap<Vec<u8>, (Mode, Oid)> = self
            .lock()
            .index
            .as_ref()
            .map(|index| {
                index
                    .entries
                    .iter()
                    .map(|e| (e.path.clone(), (e.mode, e.oid)))
                    .collect()
            })
            .unwrap_or_default();
        let mut target = Vec::new();
        self.flatten(target_oid, &mut Vec::new(), &mut target)?;
        // Nested repositories are not the snapshots' to restore.
        target.retain(|(_, mode, _)| *mode != Mode::Gitlink);
        let wanted: HashSet<&[u8]> = target.iter().map(|(path, _, _)| path.as_slice()).collect();
        let mut emptied = BTreeSet::new();
        for path in current
            .keys()
            .filter(|path| !wanted.contains(path.as_slice()))
        {
            let full = self.workspace_path(path);
            match std::fs::remove_file(&full) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(restore_error(&full, &e)),
            }
            emptied.extend(
                Path::new(OsStr::from_bytes(path))
                    .ancestors()
                    .skip(1)
                    .filter(|dir| !dir.as_os_str().is_empty())
                    .map(Path::to_path_buf),
            );
        }
        // Deepest first (a directory sorts before what it holds); a directory still
        // holding anything stays.
        for dir in emptied.iter().rev() {
            let _ = std::fs::remove_dir(self.config.workspace.join(dir));
        }
        for (path, mode, oid) in &target {
            if current.get(path) != Some(&(*mode, *oid)) {
                self.write_file(path, *mode, *oid)?;
            }
        }
        // Each file's owner and mode as the snapshot found them (also a file whose contents
        // were right but whose owner or mode the execution changed).
        let owned = owners::load(&self.config.store, tree.as_str());
        for (path, _, _) in &target {
            if let Some(owner) = owned.get(path) {
                owners::apply(&self.workspace_path(path), *owner)?;
            }
        }
        Ok(())
    }

    fn workspace_path(&self, path: &[u8]) -> PathBuf {
        self.config.workspace.join(OsStr::from_bytes(path))
    }

    /// Writes one file of a tree into the workspace, replacing what is at its path.
    fn write_file(&self, path: &[u8], mode: Mode, oid: Oid) -> Result<(), HandsError> {
        let relative = Path::new(OsStr::from_bytes(path));
        // Every directory on the way must be a real one, made when missing.
        let mut dir = self.config.workspace.clone();
        for component in relative.parent().into_iter().flat_map(Path::components) {
            dir.push(component);
            match std::fs::symlink_metadata(&dir) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(HandsError::Checkpoint(format!(
                        "cannot restore {}: {} is not a directory the snapshots cover",
                        lossy(path),
                        dir.display()
                    )));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir(&dir).map_err(|e| restore_error(&dir, &e))?;
                    // Owned as the directory it is made in (snapshots record files only):
                    // root's rewind does not leave a root-owned directory in a user's
                    // workspace. Without root the process's own, as any mkdir.
                    if let Some(parent) = dir.parent().and_then(|p| std::fs::metadata(p).ok()) {
                        use std::os::unix::fs::MetadataExt;
                        let _ =
                            std::os::unix::fs::lchown(&dir, Some(parent.uid()), Some(parent.gid()));
                    }
                }
                Err(e) => return Err(restore_error(&dir, &e)),
            }
        }
        let full = self.workspace_path(path);
        match std::fs::symlink_metadata(&full) {
            Ok(meta) if meta.is_dir() => {
                std::fs::remove_dir(&full).map_err(|e| restore_error(&full, &e))?;
            }
            Ok(_) => std::fs::remove_file(&full).map_err(|e| restore_error(&full, &e))?,
            Err(_) => {}
        }
        let bytes = self.objects.read(oid, Kind::Blob)?;
        let written = match mode {
            Mode::Symlink => std::os::unix::fs::symlink(OsStr::from_bytes(&bytes), &full),
            Mode::File | Mode::Executable | Mode::Tree | Mode::Gitlink => {
                let permissions = if mode == Mode::Executable {
                    0o755
                } else {
                    0o644
                };
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(permissions)
                    .open(&full)
                    .and_then(|mut file| file.write_all(&bytes))
            }
        };
        written.map_err(|e| restore_error(&full, &e))
    }
}

/// A side of a change with its bytes, for the patch text.
struct Loaded {
    path: String,
    mode: Mode,
    oid: Oid,
    bytes: Vec<u8>,
}

impl Loaded {
    fn side(&self) -> patch::Side<'_> {
        patch::Side {
            path: &self.path,
            mode: self.mode,
            oid: self.oid,
            bytes: &self.bytes,
        }
    }
}

fn restore_error(path: &Path, e: &std::io::Error) -> HandsError {
    HandsError::Checkpoint(format!("cannot restore {}: {e}", path.display()))
}

/// How git records a file: a symlink, or a regular file executable by its owner or not.
fn mode_of(meta: &std::fs::Metadata) -> Mode {
    if meta.is_symlink() {
        Mode::Symlink
    } else if meta.permissions().mode() & 0o100 != 0 {
        Mode::Executable
    } else {
        Mode::File
    }
}

fn lossy(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// Lays out an empty bare repository at `store`, `HEAD` last: a store without one is made
/// again from the start.
fn init_store(store: &Path) -> Result<(), HandsError> {
    let fail = |e: std::io::Error| {
        HandsError::Checkpoint(format!(
            "cannot create the snapshot store {}: {e}",
            store.display()
        ))
    };
    for dir in [
        "objects/info",
        "objects/pack",
        "refs/heads",
        "refs/tags",
        "info",
    ] {
        std::fs::create_dir_all(store.join(dir)).map_err(fail)?;
    }
    std::fs::write(store.join("config"), STORE_CONFIG).map_err(fail)?;
    std::fs::write(store.join("HEAD"), "ref: refs/heads/main\n").map_err(fail)?;
    Ok(())
}

#[cfg(test)]
mod tests;
