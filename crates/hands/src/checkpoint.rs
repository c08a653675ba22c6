//! Workspace checkpoints: snapshots of the workspace in a shadow git object store outside
//! it, the diff between two snapshots, what changed since one, and the restore of one.
//!
//! The store is a bare repository of its own (`GIT_DIR` in Nerve's data directory,
//! `GIT_WORK_TREE` the workspace), driven through the `git` command-line tool: its index
//! caches every file's `stat` data, so a snapshot hashes only the files that changed since
//! the last one (`git add -A`, then `git write-tree`), which is the cost the design asks
//! for; its ignore rules are the workspace's own `.gitignore` files, so an ignored build
//! directory is never walked into. The user's repository is never touched: git never adds
//! a path component named `.git`, the store has a `GIT_DIR` of its own, and the user's and
//! the system's git configuration are not read. Why the CLI and not the `gix` crate: `gix`
//! would add some hundred crates to a build on two shared cores, while the CLI's index is
//! the reference implementation of exactly the incremental `add` this needs; git is a
//! prerequisite of the machines Nerve runs on (docs/checkpoints.md).
//!
//! Files larger than [`CheckpointConfig::max_file_bytes`] are left out of snapshots (their
//! paths are listed in the store's `info/exclude`, so they are left alone by a restore too).
//!
//! Every function here blocks on a `git` process: call them from `spawn_blocking`.

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

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

/// A workspace's shadow store.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    config: CheckpointConfig,
}

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
        let checkpoints = Self { config };
        if !checkpoints.config.store.join("HEAD").is_file() {
            std::fs::create_dir_all(&checkpoints.config.store).map_err(|e| {
                HandsError::Checkpoint(format!(
                    "cannot create the snapshot store {}: {e}",
                    checkpoints.config.store.display()
                ))
            })?;
            checkpoints.git(&["init", "--quiet", "--bare", "--"])?;
            // Byte-exact snapshots whatever the platform's defaults.
            checkpoints.git(&["config", "core.autocrlf", "false"])?;
            checkpoints.git(&["config", "core.safecrlf", "false"])?;
            checkpoints.git(&["config", "core.symlinks", "true"])?;
            checkpoints.git(&["config", "gc.auto", "0"])?;
        }
        Ok(checkpoints)
    }

    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// Records the workspace as it is and returns its tree. Costs a `stat` of each file
    /// that is not ignored and a read of each that changed since the last snapshot.
    ///
    /// Two git processes, as `git add -A && git write-tree` (one walk of the workspace):
    /// the size cap is checked among the paths `git add` reports, so it costs nothing when
    /// no file crosses it. The first snapshot of a store lists the workspace's files first
    /// and leaves those over the cap out before anything is hashed; later, a file that
    /// appears or grows over the cap is hashed once (its blob stays in the store, in no
    /// tree), then taken out of the index and excluded.
    pub fn snapshot(&self) -> Result<TreeHash, HandsError> {
        if !self.config.store.join("index").is_file() {
            self.exclude_large_files()?;
        }
        let out = self.git(&["add", "--all", "--verbose", "."])?;
        let added = out
            .stdout
            .split(|&b| b == b'\n')
            .filter_map(|line| line.strip_prefix(b"add '")?.strip_suffix(b"'"))
            .map(|path| String::from_utf8_lossy(path).into_owned());
        let large: Vec<String> = added.filter(|path| self.over_cap(path)).collect();
        self.exclude(&large)?;
        let out = self.git(&["write-tree"])?;
        TreeHash::parse(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// Whether the workspace's `path` is a regular file larger than the cap.
    fn over_cap(&self, path: &str) -> bool {
        std::fs::symlink_metadata(self.config.workspace.join(path))
            .is_ok_and(|m| m.is_file() && m.len() > self.config.max_file_bytes)
    }

    /// The unified diff from `from` to `to` (binary files named, not shown), paths relative
    /// to the workspace.
    pub fn diff(&self, from: &TreeHash, to: &TreeHash) -> Result<String, HandsError> {
        let out = self.git(&[
            "diff-tree",
            "-r",
            "-p",
            "--no-color",
            "--no-ext-diff",
            "--find-renames",
            from.as_str(),
            to.as_str(),
        ])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The paths that differ from `from` to `to`.
    pub fn changes(&self, from: &TreeHash, to: &TreeHash) -> Result<Vec<Change>, HandsError> {
        let out = self.git(&[
            "diff-tree",
            "-r",
            "-z",
            "--no-renames",
            "--name-status",
            from.as_str(),
            to.as_str(),
        ])?;
        let mut fields = out.stdout.split(|&b| b == 0).filter(|f| !f.is_empty());
        let mut changes = Vec::new();
        while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
            let kind = match status.first() {
                Some(b'A') => ChangeKind::Added,
                Some(b'D') => ChangeKind::Deleted,
                _ => ChangeKind::Modified,
            };
            changes.push(Change {
                kind,
                path: String::from_utf8_lossy(path).into_owned(),
            });
        }
        Ok(changes)
    }

    /// What differs in the workspace now from `snapshot` (records the workspace first).
    pub fn changed_since(&self, snapshot: &TreeHash) -> Result<Vec<Change>, HandsError> {
        let now = self.snapshot()?;
        self.changes(snapshot, &now)
    }

    /// Makes the workspace `tree` again: files of the tree written back, files added since
    /// removed; ignored and over-cap files are left alone. The caller decides whether
    /// changes made outside the execution may be overwritten ([`Self::changed_since`]).
    pub fn restore(&self, tree: &TreeHash) -> Result<(), HandsError> {
        // The index must hold the workspace as it is, so that what the tree lacks is
        // removed from the workspace.
        self.snapshot()?;
        self.git(&["read-tree", "-u", "--reset", tree.as_str()])?;
        Ok(())
    }

    /// Before the first snapshot: lists files over the cap (among those git would add) in
    /// the store's exclude file, so that none of them is ever hashed.
    fn exclude_large_files(&self) -> Result<(), HandsError> {
        let out = self.git(&[
            "ls-files",
            "-z",
            "--others",
            "--modified",
            "--exclude-standard",
        ])?;
        let large: Vec<String> = out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|path| String::from_utf8_lossy(path).into_owned())
            .filter(|path| self.over_cap(path))
            .collect();
        self.exclude(&large)
    }

    /// Adds `large` to the store's exclude file (anchored, one path each) and takes them
    /// out of the index.
    fn exclude(&self, large: &[String]) -> Result<(), HandsError> {
        if large.is_empty() {
            return Ok(());
        }
        let exclude = self.config.store.join("info").join("exclude");
        let mut text = std::fs::read_to_string(&exclude).unwrap_or_default();
        for path in large {
            // Anchored, with the pattern characters escaped: this one path only.
            let mut pattern = String::from("/");
            for c in path.chars() {
                if matches!(c, '*' | '?' | '[' | '\\' | '!' | '#') {
                    pattern.push('\\');
                }
                pattern.push(c);
            }
            text.push_str(&pattern);
            text.push('\n');
            let _ = self.git(&["rm", "--cached", "--quiet", "--ignore-unmatch", "--", path]);
        }
        std::fs::create_dir_all(self.config.store.join("info"))
            .and_then(|()| std::fs::write(&exclude, text))
            .map_err(|e| HandsError::Checkpoint(format!("cannot write {}: {e}", exclude.display())))
    }

    /// Runs git on the store and the workspace, isolated from the user's configuration.
    fn git(&self, args: &[&str]) -> Result<Output, HandsError> {
        let mut command = Command::new("git");
        if args.first() == Some(&"init") {
            // `init` takes the store as its argument, and no work tree.
            command
                .args(args)
                .arg(&self.config.store)
                .env_remove("GIT_DIR")
                .env_remove("GIT_WORK_TREE");
        } else {
            command
                .args(args)
                .env("GIT_DIR", &self.config.store)
                .env("GIT_WORK_TREE", &self.config.workspace);
        }
        command
            .current_dir(&self.config.workspace)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            // `add --verbose` is parsed: untranslated. Paths are never patterns.
            .env("LC_ALL", "C")
            .env("GIT_LITERAL_PATHSPECS", "1")
            .env_remove("GIT_INDEX_FILE")
            .env_remove("GIT_OBJECT_DIRECTORY")
            .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
            .stdin(Stdio::null());
        let output = command.output().map_err(|e| {
            HandsError::Checkpoint(format!("cannot run git (is it installed?): {e}"))
        })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(HandsError::Checkpoint(format!(
                "git {} failed: {}",
                args.first().unwrap_or(&""),
                stderr.lines().next().unwrap_or("no message")
            )));
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Every file of the workspace that snapshots cover: not under `.git`, not ignored
    /// (`build/`), not the over-cap file.
    fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                if [".git", "build", "huge.bin"].contains(&relative.as_str()) {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else {
                    out.insert(relative, std::fs::read(&path).unwrap());
                }
            }
        }
        out
    }

    fn write(root: &Path, path: &str, bytes: &[u8]) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    use std::path::Path;

    /// Ten turns that edit, create and delete files (one binary, one in a new directory),
    /// a snapshot after each; each turn's changes are what it did; restoring turn 3 gives
    /// its exact tree back; the user's `.git`, an ignored 200 MB build directory and a file
    /// over the cap are never taken in nor touched.
    #[test]
    fn ten_turns_snapshot_diff_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        write(&root, ".git/HEAD", b"ref: refs/heads/main\n");
        write(&root, ".git/config", b"[core]\n\tbare = false\n");
        write(&root, ".gitignore", b"build/\n");
        write(&root, "src/main.rs", b"fn main() {}\n");
        std::fs::create_dir(root.join("build")).unwrap();
        let big = std::fs::File::create(root.join("build/artifact.o")).unwrap();
        big.set_len(200 << 20).unwrap();
        write(&root, "huge.bin", &vec![7u8; 4096]);
        let user_git = std::fs::read(root.join(".git/config")).unwrap();

        let mut config = CheckpointConfig::new(dir.path().join("store.git"), &root);
        config.max_file_bytes = 1024;
        let store = Checkpoints::open(config).unwrap();
        let start = store.snapshot().unwrap();

        let binary: Vec<u8> = (0..=255u8).collect();
        type Turn<'a> = (&'a dyn Fn(&Path), &'a [(ChangeKind, &'a str)]);
        let turns: [Turn<'_>; 10] = [
            (
                &|r| write(r, "a.txt", b"one\n"),
                &[(ChangeKind::Added, "a.txt")],
            ),
            (
                &|r| write(r, "a.txt", b"one\ntwo\n"),
                &[(ChangeKind::Modified, "a.txt")],
            ),
            (
                &|r| write(r, "docs/new/b.txt", b"nested\n"),
                &[(ChangeKind::Added, "docs/new/b.txt")],
            ),
            (
                &|r| write(r, "data.bin", &binary),
                &[(ChangeKind::Added, "data.bin")],
            ),
            (
                &|r| std::fs::remove_file(r.join("a.txt")).unwrap(),
                &[(ChangeKind::Deleted, "a.txt")],
            ),
            (
                &|r| write(r, "data.bin", &[0, 159, 146, 150, 0, 1]),
                &[(ChangeKind::Modified, "data.bin")],
            ),
            (
                &|r| write(r, "c.txt", b"c\n"),
                &[(ChangeKind::Added, "c.txt")],
            ),
            (
                &|r| std::fs::remove_dir_all(r.join("docs")).unwrap(),
                &[(ChangeKind::Deleted, "docs/new/b.txt")],
            ),
            (
                &|r| write(r, "src/main.rs", b"fn main() { println!(); }\n"),
                &[(ChangeKind::Modified, "src/main.rs")],
            ),
            (
                &|r| write(r, "c.txt", b"c\nd\n"),
                &[(ChangeKind::Modified, "c.txt")],
            ),
        ];
        let mut trees = vec![start];
        let mut states = vec![files(&root)];
        for (number, (act, expected)) in turns.iter().enumerate() {
            act(&root);
            let tree = store.snapshot().unwrap();
            let previous = trees.last().unwrap();
            let changes = store.changes(previous, &tree).unwrap();
            let expected: Vec<Change> = expected
                .iter()
                .map(|(kind, path)| Change {
                    kind: *kind,
                    path: (*path).to_owned(),
                })
                .collect();
            assert_eq!(changes, expected, "turn {}", number + 1);
            let diff = store.diff(previous, &tree).unwrap();
            assert!(
                diff.contains(&expected[0].path),
                "turn {}: {diff}",
                number + 1
            );
            trees.push(tree);
            states.push(files(&root));
        }
        assert!(
            store
                .diff(&trees[3], &trees[4])
                .unwrap()
                .contains("Binary files")
        );
        // Nothing changed: the same tree.
        assert_eq!(store.snapshot().unwrap(), trees[10]);

        // A change made outside the execution is seen.
        write(&root, "c.txt", b"edited by the user\n");
        assert_eq!(
            store.changed_since(&trees[10]).unwrap(),
            [Change {
                kind: ChangeKind::Modified,
                path: "c.txt".into()
            }]
        );

        store.restore(&trees[3]).unwrap();
        assert_eq!(
            store.snapshot().unwrap(),
            trees[3],
            "the exact tree of turn 3"
        );
        assert_eq!(files(&root), states[3]);
        // Never taken in, never touched.
        assert_eq!(std::fs::read(root.join(".git/config")).unwrap(), user_git);
        assert_eq!(
            std::fs::metadata(root.join("build/artifact.o"))
                .unwrap()
                .len(),
            200 << 20
        );
        assert_eq!(
            std::fs::read(root.join("huge.bin")).unwrap(),
            vec![7u8; 4096]
        );
        let listed = store
            .git(&["ls-tree", "-r", "--name-only", trees[10].as_str()])
            .unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout);
        assert!(
            !listed.contains(".git/") && !listed.contains("build/") && !listed.contains("huge.bin"),
            "{listed}"
        );

        // And forward again.
        store.restore(&trees[10]).unwrap();
        assert_eq!(files(&root), states[10]);
    }

    #[test]
    fn bad_input_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let inside = CheckpointConfig::new(dir.path().join("s"), dir.path());
        assert_eq!(
            Checkpoints::open(inside).unwrap_err().to_string(),
            format!(
                "workspace checkpoint: the snapshot store {} must be outside the workspace",
                dir.path().join("s").display()
            )
        );
        assert!(TreeHash::parse("nope").is_err());
        assert!(TreeHash::parse(&"a".repeat(40)).is_ok());
        let store = Checkpoints::open(CheckpointConfig::new(
            dir.path().join("s"),
            dir.path().join("ws-missing"),
        ));
        assert!(store.is_err());
    }

    /// A file that grows over the cap after the first snapshot, and one created over it,
    /// leave the snapshots (a path with pattern characters included) and stay as they are
    /// through a restore.
    #[test]
    fn files_that_cross_the_cap_later_leave_the_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        write(&root, "grows[1].log", b"small\n");
        write(&root, "kept.txt", b"kept\n");
        let mut config = CheckpointConfig::new(dir.path().join("store.git"), &root);
        config.max_file_bytes = 1024;
        let store = Checkpoints::open(config).unwrap();
        let first = store.snapshot().unwrap();

        write(&root, "grows[1].log", &vec![1u8; 4096]);
        write(&root, "new/big.bin", &vec![2u8; 4096]);
        write(&root, "kept.txt", b"kept, changed\n");
        let second = store.snapshot().unwrap();
        let listed = store
            .git(&["ls-tree", "-r", "--name-only", second.as_str()])
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&listed.stdout), "kept.txt\n");
        // Left out from now on: the next snapshot is the same tree.
        write(&root, "grows[1].log", &vec![3u8; 8192]);
        assert_eq!(store.snapshot().unwrap(), second);

        store.restore(&first).unwrap();
        assert_eq!(std::fs::read(root.join("kept.txt")).unwrap(), b"kept\n");
        assert_eq!(
            std::fs::read(root.join("new/big.bin")).unwrap(),
            vec![2u8; 4096]
        );
    }
}
