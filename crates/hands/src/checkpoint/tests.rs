//! The checkpoint store against real files, and against git itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

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

/// Waits until the kernel's coarse clock is past `path`'s modification and change times,
/// so that a snapshot begun from now on does not find the file racy. Without it a test
/// that expects an unchanged workspace to read nothing fails on a fast, idle machine (every
/// step inside one clock tick: the file is racy again at each snapshot) and passes on a
/// loaded one.
fn wait_past_times_of(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap();
    let stamp = |secs: i64, nanos: i64| (secs, u32::try_from(nanos).unwrap());
    let latest = stamp(meta.mtime(), meta.mtime_nsec()).max(stamp(meta.ctime(), meta.ctime_nsec()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Ends: the coarse clock ticks every few milliseconds; the deadline bounds the wait.
    while index::coarse_now() <= latest {
        assert!(
            std::time::Instant::now() < deadline,
            "the coarse clock stood still"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

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
    let listed = store.paths(&trees[10]).unwrap().join("\n");
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
    assert_eq!(store.paths(&second).unwrap(), ["kept.txt"]);
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

/// Runs git with `GIT_DIR` and `GIT_WORK_TREE`, isolated from the user's configuration,
/// as the stores of earlier versions were written; its stdout.
fn git(store: &Path, workspace: &Path, args: &[&str]) -> String {
    let mut command = Command::new("git");
    if args.first() == Some(&"init") {
        command.args(args).arg(store);
    } else {
        command
            .args(args)
            .env("GIT_DIR", store)
            .env("GIT_WORK_TREE", workspace);
    }
    let output = command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .current_dir(workspace)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A workspace with what makes git's trees hard to get right: names that sort differently
/// as directories (`a`, `a.b`, `a-b`, `a0`), an executable, a symlink, an empty file, a
/// binary file, nested `.gitignore` files with a re-included path, a user's `.git`.
fn tricky_workspace(root: &Path) {
    write(root, "a/inner.txt", b"inner\n");
    write(root, "a.b", b"dot\n");
    write(root, "a-b/x", b"dash\n");
    write(root, "a0", b"zero\n");
    write(root, "empty", b"");
    write(root, "bin.dat", &[0, 1, 2, 255]);
    write(root, "run.sh", b"#!/bin/sh\necho hi\n");
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("a/inner.txt", root.join("link")).unwrap();
    write(root, ".gitignore", b"*.log\nout/\n!keep.log\n");
    write(root, "debug.log", b"ignored\n");
    write(root, "keep.log", b"kept\n");
    write(root, "out/artifact", b"ignored\n");
    write(root, "deep/er/.gitignore", b"secret*\n!secret.pub\n");
    write(root, "deep/er/secret.key", b"ignored\n");
    write(root, "deep/er/secret.pub", b"kept\n");
    write(root, "deep/er/plain.log", b"ignored by the root's rule\n");
    write(root, ".git/config", b"[core]\n");
}

/// Byte for byte the trees git writes: `git add -A && git write-tree` on the same
/// workspace gives the same tree hash, and git reads every object of ours.
#[test]
fn trees_are_gits_own() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    tricky_workspace(&root);
    let store = Checkpoints::open(CheckpointConfig::new(dir.path().join("ours"), &root)).unwrap();
    let ours = store.snapshot().unwrap();

    let theirs = dir.path().join("theirs");
    git(&theirs, &root, &["init", "--quiet", "--bare"]);
    git(&theirs, &root, &["add", "--all", "."]);
    assert_eq!(git(&theirs, &root, &["write-tree"]).trim(), ours.as_str());
    assert_eq!(
        store.paths(&ours).unwrap(),
        [
            ".gitignore",
            "a-b/x",
            "a.b",
            "a/inner.txt",
            "a0",
            "bin.dat",
            "deep/er/.gitignore",
            "deep/er/secret.pub",
            "empty",
            "keep.log",
            "link",
            "run.sh",
        ]
    );
    // Git reads our store: every object is sound.
    let ours_dir = dir.path().join("ours");
    git(&ours_dir, &root, &["fsck", "--strict", "--no-dangling"]);
    assert_eq!(
        git(&ours_dir, &root, &["ls-tree", "-r", ours.as_str()]),
        git(&theirs, &root, &["ls-tree", "-r", ours.as_str()])
    );
}

/// A store the git command line wrote (as every earlier version did) reads here: its
/// trees diff and restore, and its first snapshot here is the same tree.
#[test]
fn stores_written_by_git_read_here() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    tricky_workspace(&root);
    let old = dir.path().join("old.git");
    git(&old, &root, &["init", "--quiet", "--bare"]);
    git(&old, &root, &["add", "--all", "."]);
    let before = TreeHash::parse(git(&old, &root, &["write-tree"]).trim()).unwrap();
    write(&root, "a/inner.txt", b"changed\n");
    std::fs::remove_file(root.join("a0")).unwrap();
    write(&root, "new.txt", b"new\n");
    git(&old, &root, &["add", "--all", "."]);
    let after = TreeHash::parse(git(&old, &root, &["write-tree"]).trim()).unwrap();

    let store = Checkpoints::open(CheckpointConfig::new(&old, &root)).unwrap();
    assert_eq!(store.snapshot().unwrap(), after);
    assert_eq!(
        store.changes(&before, &after).unwrap(),
        [
            Change {
                kind: ChangeKind::Modified,
                path: "a/inner.txt".into()
            },
            Change {
                kind: ChangeKind::Deleted,
                path: "a0".into()
            },
            Change {
                kind: ChangeKind::Added,
                path: "new.txt".into()
            },
        ]
    );
    let expected = git(
        &old,
        &root,
        &[
            "diff-tree",
            "-r",
            "-p",
            "--no-color",
            before.as_str(),
            after.as_str(),
        ],
    );
    assert_eq!(store.diff(&before, &after).unwrap(), expected);
    store.restore(&before).unwrap();
    assert_eq!(std::fs::read(root.join("a/inner.txt")).unwrap(), b"inner\n");
    assert_eq!(std::fs::read(root.join("a0")).unwrap(), b"zero\n");
    assert!(!root.join("new.txt").exists());
    assert_eq!(store.snapshot().unwrap(), before);
}

/// The stat cache: a snapshot of an unchanged workspace reads no file and is the last
/// tree; one changed file is the one file read; a file rewritten in place with the same
/// size right after a snapshot (same clock tick: its times may not move) is still seen.
#[test]
fn only_changed_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    for i in 0..50 {
        write(&root, &format!("d{}/f{i}.txt", i % 5), b"content\n");
    }
    let store = Checkpoints::open(CheckpointConfig::new(dir.path().join("s"), &root)).unwrap();
    let first = store.snapshot().unwrap();
    let read = || store.lock().last_read;
    assert_eq!(read(), 50);
    // Written a moment ago, the files may be racy: the next snapshot reads them again,
    // at most once, once the clock has moved past them.
    for i in 0..50 {
        wait_past_times_of(&root.join(format!("d{}/f{i}.txt", i % 5)));
    }
    store.snapshot().unwrap();
    let unchanged = store.snapshot().unwrap();
    assert_eq!((unchanged.clone(), read()), (first.clone(), 0));

    write(&root, "d3/f13.txt", b"changed\n");
    let second = store.snapshot().unwrap();
    assert_eq!(read(), 1);
    assert_ne!(second, first);

    // A reopened store (a new process) reads its cache from the store (the changed file
    // again first if it was racy, once the clock is past it).
    wait_past_times_of(&root.join("d3/f13.txt"));
    let reopened = Checkpoints::open(CheckpointConfig::new(dir.path().join("s"), &root)).unwrap();
    reopened.snapshot().unwrap();
    assert_eq!(reopened.snapshot().unwrap(), second);
    assert_eq!(reopened.lock().last_read, 0);

    // Same size, same inode, within the tick of the snapshot before.
    let mut trees = Vec::new();
    for round in 0..20u8 {
        std::fs::write(root.join("d0/f0.txt"), [b'a' + round; 8]).unwrap();
        let tree = store.snapshot().unwrap();
        assert!(
            !trees.contains(&tree),
            "round {round}: a rewrite was missed"
        );
        trees.push(tree);
    }
}

/// Ten-file workspaces under random edits: the incremental snapshot is always the tree a
/// fresh store (no cache) makes of the same files, and the changes between two snapshots
/// are the paths the edits touched.
mod incremental {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Edit {
        Write(usize, Vec<u8>),
        Remove(usize),
        Executable(usize),
        Link(usize, usize),
    }

    const PATHS: [&str; 6] = ["a", "a.b", "d/x", "d/y/z", "e-f", "d.x"];

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0..PATHS.len(), proptest::collection::vec(any::<u8>(), 0..4))
                .prop_map(|(i, bytes)| Edit::Write(i, bytes)),
            (0..PATHS.len()).prop_map(Edit::Remove),
            (0..PATHS.len()).prop_map(Edit::Executable),
            (0..PATHS.len(), 0..PATHS.len()).prop_map(|(i, j)| Edit::Link(i, j)),
        ]
    }

    /// Applies `edit`; the path it changed, if it did.
    fn apply(root: &Path, edit: &Edit) -> Option<&'static str> {
        let path = |i: usize| root.join(PATHS[i]);
        match edit {
            Edit::Write(i, bytes) => {
                let _ = std::fs::remove_file(path(*i));
                std::fs::create_dir_all(path(*i).parent().unwrap()).unwrap();
                std::fs::write(path(*i), bytes).unwrap();
                Some(PATHS[*i])
            }
            Edit::Remove(i) => std::fs::remove_file(path(*i)).ok().map(|()| PATHS[*i]),
            Edit::Executable(i) => {
                let meta = std::fs::symlink_metadata(path(*i)).ok()?;
                if !meta.is_file() {
                    return None;
                }
                let mode = meta.permissions().mode() ^ 0o100;
                std::fs::set_permissions(path(*i), std::fs::Permissions::from_mode(mode)).unwrap();
                Some(PATHS[*i])
            }
            Edit::Link(i, j) => {
                let _ = std::fs::remove_file(path(*i));
                std::fs::create_dir_all(path(*i).parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(PATHS[*j], path(*i)).unwrap();
                Some(PATHS[*i])
            }
        }
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(48),
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_c4ec),
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn incremental_snapshots_are_fresh_ones(edits in proptest::collection::vec(edit(), 1..24)) {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("ws");
            std::fs::create_dir(&root).unwrap();
            let store = Checkpoints::open(CheckpointConfig::new(dir.path().join("s"), &root)).unwrap();
            let mut last = store.snapshot().unwrap();
            for (n, edit) in edits.iter().enumerate() {
                let touched: BTreeSet<String> = apply(&root, edit).map(str::to_owned).into_iter().collect();
                let tree = store.snapshot().unwrap();
                let fresh = Checkpoints::open(CheckpointConfig::new(dir.path().join(format!("fresh{n}")), &root))
                    .unwrap()
                    .snapshot()
                    .unwrap();
                prop_assert_eq!(&tree, &fresh, "after {:?}", edit);
                let changed: BTreeSet<String> = store
                    .changes(&last, &tree)
                    .unwrap()
                    .into_iter()
                    .map(|c| c.path)
                    .collect();
                // An edit may leave the bytes as they were (the same content written).
                prop_assert!(changed.is_subset(&touched), "{:?}: {:?} not in {:?}", edit, changed, touched);
                last = tree;
            }
        }
    }
}

/// Modes git's trees do not keep come back with a restore: a file the snapshot found 0640
/// and a run made 0644 (and rewrote), a setuid one, and one only chmodded; the owners
/// recorded are the files' own (changing them back takes root: the e2e test runs as root).
#[test]
fn a_restore_gives_back_the_modes_and_owners_the_snapshot_found() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("w");
    write(&workspace, "secret.txt", b"one\n");
    write(&workspace, "tool", b"#!/bin/sh\n");
    write(&workspace, "same.txt", b"same\n");
    let chmod = |path: &str, mode: u32| {
        std::fs::set_permissions(workspace.join(path), std::fs::Permissions::from_mode(mode))
            .unwrap();
    };
    chmod("secret.txt", 0o640);
    chmod("tool", 0o4750);
    chmod("same.txt", 0o600);
    let checkpoints =
        Checkpoints::open(CheckpointConfig::new(dir.path().join("store"), &workspace)).unwrap();
    let before = checkpoints.snapshot().unwrap();
    let mode = |path: &str| std::fs::metadata(workspace.join(path)).unwrap().mode() & 0o7777;

    std::fs::remove_file(workspace.join("secret.txt")).unwrap();
    write(&workspace, "secret.txt", b"two\n");
    chmod("secret.txt", 0o644);
    chmod("tool", 0o755);
    chmod("same.txt", 0o644);
    checkpoints.snapshot().unwrap();
    assert_eq!(mode("secret.txt"), 0o644);

    checkpoints.restore(&before).unwrap();
    assert_eq!(
        std::fs::read(workspace.join("secret.txt")).unwrap(),
        b"one\n"
    );
    assert_eq!(
        (mode("secret.txt"), mode("tool"), mode("same.txt")),
        (0o640, 0o4750, 0o600)
    );
    let owners = owners::load(&dir.path().join("store"), before.as_str());
    let me = std::fs::metadata(&workspace).unwrap().uid();
    assert_eq!(owners.len(), 3);
    assert!(owners.values().all(|o| o.uid == me), "{owners:?}");
}
