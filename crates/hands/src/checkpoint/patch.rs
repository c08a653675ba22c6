//! The text of a diff between two snapshots, in the format of `git diff` (its headers,
//! `index` lines, `Binary files … differ` for a file with a NUL byte in its first 8,000
//! bytes as git decides, unified hunks with three lines of context), so that tools and
//! people reading git's output read it.

use std::fmt::Write as _;
use std::time::Duration;

use super::objects::{Mode, Oid};

/// How long the line diff of one file may search for the smallest diff before it settles
/// for a larger one (a 10 MiB file rewritten whole).
const DIFF_DEADLINE: Duration = Duration::from_secs(2);

/// Bytes git looks at to call a file binary.
const BINARY_PROBE: usize = 8000;

/// One side of a file's change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side<'a> {
    pub(crate) path: &'a str,
    pub(crate) mode: Mode,
    pub(crate) oid: Oid,
    pub(crate) bytes: &'a [u8],
}

/// Appends the patch of one file to `out`: `old` absent for an added file, `new` absent for
/// a deleted one, different paths for a rename.
pub(crate) fn file(out: &mut String, old: Option<Side<'_>>, new: Option<Side<'_>>) {
    let (Some(first), Some(last)) = (old.or(new), new.or(old)) else {
        return;
    };
    let _ = writeln!(out, "diff --git a/{} b/{}", first.path, last.path);
    match (old, new) {
        (None, Some(new)) => {
            let _ = writeln!(out, "new file mode {}", new.mode.octal());
        }
        (Some(old), None) => {
            let _ = writeln!(out, "deleted file mode {}", old.mode.octal());
        }
        (Some(old), Some(new)) => {
            if old.mode != new.mode {
                let _ = writeln!(out, "old mode {}", old.mode.octal());
                let _ = writeln!(out, "new mode {}", new.mode.octal());
            }
            // Only exact renames are paired (the caller's): the same blob.
            if old.path != new.path {
                let _ = writeln!(out, "similarity index 100%");
                let _ = writeln!(out, "rename from {}", old.path);
                let _ = writeln!(out, "rename to {}", new.path);
            }
        }
        (None, None) => {}
    }
    let short = |side: Option<Side<'_>>| {
        side.map_or_else(|| "0".repeat(7), |s| s.oid.hex()[..7].to_owned())
    };
    if old.map(|s| s.oid) == new.map(|s| s.oid) {
        return;
    }
    let _ = write!(out, "index {}..{}", short(old), short(new));
    match (old, new) {
        (Some(old), Some(new)) if old.mode == new.mode => {
            let _ = writeln!(out, " {}", old.mode.octal());
        }
        _ => out.push('\n'),
    }
    let name = |side: Option<Side<'_>>, prefix: &str| {
        side.map_or_else(
            || "/dev/null".to_owned(),
            |s| format!("{prefix}/{}", s.path),
        )
    };
    let (a, b) = (name(old, "a"), name(new, "b"));
    let (before, after) = (
        old.map_or(&[][..], |s| s.bytes),
        new.map_or(&[][..], |s| s.bytes),
    );
    if is_binary(before) || is_binary(after) {
        let _ = writeln!(out, "Binary files {a} and {b} differ");
        return;
    }
    let (before, after) = (
        String::from_utf8_lossy(before),
        String::from_utf8_lossy(after),
    );
    let diff = similar::TextDiff::configure()
        .timeout(DIFF_DEADLINE)
        .diff_lines(before.as_ref(), after.as_ref());
    let _ = write!(
        out,
        "{}",
        diff.unified_diff().context_radius(3).header(&a, &b)
    );
}

fn is_binary(bytes: &[u8]) -> bool {
    bytes[..bytes.len().min(BINARY_PROBE)].contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::objects::Kind;

    fn side<'a>(path: &'a str, mode: Mode, bytes: &'a [u8]) -> Side<'a> {
        Side {
            path,
            mode,
            oid: Oid::of(Kind::Blob, bytes),
            bytes,
        }
    }

    fn check(old: Option<Side<'_>>, new: Option<Side<'_>>, expected: &str) {
        let mut out = String::new();
        file(&mut out, old, new);
        assert_eq!(out, expected);
    }

    /// The expectations are what `git diff` prints for the same change.
    #[test]
    fn patches_read_as_gits() {
        check(
            None,
            Some(side("a.txt", Mode::File, b"one\n")),
            "diff --git a/a.txt b/a.txt\nnew file mode 100644\nindex 0000000..5626abf\n--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+one\n",
        );
        check(
            Some(side("a.txt", Mode::File, b"one\n")),
            Some(side("a.txt", Mode::File, b"one\ntwo")),
            "diff --git a/a.txt b/a.txt\nindex 5626abf..9ed40b4 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n one\n+two\n\\ No newline at end of file\n",
        );
        check(
            Some(side("run.sh", Mode::File, b"x\n")),
            Some(side("run.sh", Mode::Executable, b"x\n")),
            "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n",
        );
        check(
            Some(side("d/b.bin", Mode::File, &[0, 1, 2])),
            None,
            "diff --git a/d/b.bin b/d/b.bin\ndeleted file mode 100644\nindex 8352675..0000000\nBinary files a/d/b.bin and /dev/null differ\n",
        );
        check(
            Some(side("old", Mode::File, b"same\n")),
            Some(side("new", Mode::File, b"same\n")),
            "diff --git a/old b/new\nsimilarity index 100%\nrename from old\nrename to new\n",
        );
        check(
            None,
            Some(side("empty", Mode::File, b"")),
            "diff --git a/empty b/empty\nnew file mode 100644\nindex 0000000..e69de29\n",
        );
    }
}
