//! The command uid's account in the sandbox, made on the host and never written into the
//! image: a `passwd` and a `group` naming it (bind-mounted read-only over `/etc/passwd` and
//! `/etc/group`), and a home directory that lasts for the execution and its resumes.
//!
//! Everything lives in one host directory per execution: `<homes>/<execution id>` when the
//! sandbox names a homes directory ([`crate::SandboxConfig::homes`]; `nerve` puts it beside
//! the log's checkpoints, so that a reboot clearing `/tmp` under a resumable execution
//! leaves its home), else `$TMPDIR/nerve-env-<execution id>` (mode 0755; the home inside it
//! 0700, owned by the command uid). The same execution id finds the same directory, so a
//! resume finds the home it left. [`discard`] removes it once the execution is over for
//! good, and [`sweep`] (through `reap`) the homes of executions that ended or went unused.

use std::io::Write;
use std::path::{Path, PathBuf};

use nerve_core::ExecutionId;

use crate::HandsError;

/// Where the home directory is mounted in the container (`HOME`).
pub(crate) const CONTAINER_HOME: &str = "/home/nerve";
/// `TMPDIR` in the container: inside the home, on disk and exec-capable, unlike the small
/// `noexec` tmpfs at `/tmp`.
pub(crate) const CONTAINER_TMPDIR: &str = "/home/nerve/.tmp";
/// The account's name, for a uid other than 0.
const NAME: &str = "nerve";
const PREFIX: &str = "nerve-env-";

/// The host side of an execution's account.
#[derive(Debug, Clone)]
pub(crate) struct Account {
    dir: PathBuf,
}

impl Account {
    /// Creates (or finds, on a resume) the execution's directory, writes the passwd and group
    /// files for `uid:gid`, and hands the home to that uid.
    pub(crate) fn prepare(
        homes: Option<&Path>,
        execution_id: ExecutionId,
        (uid, gid): (u32, u32),
        name: Option<&str>,
    ) -> Result<Self, HandsError> {
        let dir = dir_of(homes, execution_id);
        let fail = |what: &str, path: &Path, e: std::io::Error| {
            HandsError::Workspace(format!(
                "cannot prepare the sandbox's {what} at {}: {e}",
                path.display()
            ))
        };
        std::fs::create_dir_all(&dir).map_err(|e| fail("account directory", &dir, e))?;
        // Another host user could have made it first: only ours is used.
        let ours = |path: &Path| -> std::io::Result<bool> {
            use std::os::unix::fs::MetadataExt;
            let me = std::fs::metadata("/proc/self")?.uid();
            let meta = std::fs::symlink_metadata(path)?;
            Ok(meta.is_dir() && meta.uid() == me)
        };
        if !ours(&dir).map_err(|e| fail("account directory", &dir, e))? {
            return Err(fail(
                "account directory",
                &dir,
                std::io::Error::other("it is not a directory of this user's"),
            ));
        }
        let home = dir.join("home");
        match std::fs::create_dir(&home) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail("home", &home, e)),
        }
        let tmp = home.join(".tmp");
        match std::fs::create_dir(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail("TMPDIR", &tmp, e)),
        }
        for path in [&home, &tmp] {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| fail("home", path, e))?;
        }
        set_mode(&home, 0o700).map_err(|e| fail("home", &home, e))?;
        set_mode(&tmp, 0o700).map_err(|e| fail("TMPDIR", &tmp, e))?;
        let name = name.filter(|n| valid_name(n)).unwrap_or(NAME);
        let (passwd, group) = entries(uid, gid, name);
        write_file(&dir.join("passwd"), &passwd).map_err(|e| fail("passwd", &dir, e))?;
        write_file(&dir.join("group"), &group).map_err(|e| fail("group", &dir, e))?;
        Ok(Self { dir })
    }

    /// The bind mounts: passwd and group read-only, the home read-write.
    pub(crate) fn binds(&self) -> Result<Vec<String>, HandsError> {
        let path = |name: &str| {
            let path = self.dir.join(name);
            path.to_str().map(str::to_owned).ok_or_else(|| {
                HandsError::Workspace(format!("{} is not valid UTF-8", path.display()))
            })
        };
        Ok(vec![
            format!("{}:/etc/passwd:ro", path("passwd")?),
            format!("{}:/etc/group:ro", path("group")?),
            format!("{}:{CONTAINER_HOME}:rw", path("home")?),
        ])
    }
}

/// Removes an execution's account directory and its home (in `homes`, or `$TMPDIR` as
/// [`crate::SandboxConfig::homes`] says), when the execution is over for good (a resume
/// would start with an empty home). Missing is fine.
pub fn discard(homes: Option<&Path>, execution_id: ExecutionId) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir_of(homes, execution_id)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Why [`sweep`] removed a home.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeRemoval {
    /// Its execution can never run again (completed, or cancelled).
    Ended,
    /// Nothing started it for the retention period.
    Unused,
}

/// Which homes [`crate::reap_with`] removes besides its containers.
#[derive(Debug, Clone)]
pub struct HomeSweep {
    /// The homes directory `nerve` uses (`<homes>/<execution id>`); the legacy
    /// `$TMPDIR/nerve-env-<id>` ones are swept too.
    pub dir: Option<PathBuf>,
    /// Executions over for good: their homes go whatever their age.
    pub ended: std::collections::HashSet<String>,
    /// Homes untouched this long go too.
    pub retention: std::time::Duration,
}

impl Default for HomeSweep {
    fn default() -> Self {
        Self {
            dir: None,
            ended: std::collections::HashSet::new(),
            retention: HOME_RETENTION,
        }
    }
}

impl HomeSweep {
    /// Removes the homes this sweep selects among those in `$TMPDIR` and `dir`, leaving
    /// executions `in_use` (a container of theirs exists); returns what it removed and why.
    pub(crate) fn run(
        &self,
        in_use: &std::collections::HashSet<String>,
    ) -> Vec<(String, HomeRemoval)> {
        let mut removed = sweep(&std::env::temp_dir(), PREFIX, self, in_use);
        if let Some(dir) = &self.dir {
            removed.extend(sweep(dir, "", self, in_use));
        }
        removed
    }
}

/// How long an execution's account directory is kept after its last start when no
/// container of it exists any more: long enough for any resume a person would make.
pub(crate) const HOME_RETENTION: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// Removes the account directories in `dir` named `prefix<execution id>` (this user's)
/// whose execution is in `homes.ended`, or untouched for `homes.retention`, unless
/// `in_use`; returns the execution ids removed and why. A directory's modification time is
/// its last start (passwd and group are rewritten into it at every start). Without a
/// prefix (a homes directory of its own) only names that are execution ids count.
fn sweep(
    dir: &Path,
    prefix: &str,
    homes: &HomeSweep,
    in_use: &std::collections::HashSet<String>,
) -> Vec<(String, HomeRemoval)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(me) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(execution) = name.strip_prefix(prefix) else {
            continue;
        };
        if in_use.contains(execution)
            || (prefix.is_empty() && execution.parse::<ExecutionId>().is_err())
        {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let why = if homes.ended.contains(execution) {
            HomeRemoval::Ended
        } else if meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= homes.retention)
        {
            HomeRemoval::Unused
        } else {
            continue;
        };
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed.push((execution.to_owned(), why));
        }
    }
    removed
}

fn dir_of(homes: Option<&Path>, execution_id: ExecutionId) -> PathBuf {
    match homes {
        Some(homes) => homes.join(execution_id.to_string()),
        None => std::env::temp_dir().join(format!("{PREFIX}{execution_id}")),
    }
}

/// A name fit for passwd: a POSIX portable user name, not one of the fixed entries.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !matches!(name, "root" | "nobody" | "nogroup")
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The passwd and group files: root, the command uid (named `name` unless it is root, its
/// home at [`CONTAINER_HOME`]), and nobody.
fn entries(uid: u32, gid: u32, name: &str) -> (String, String) {
    let mut passwd = String::new();
    let mut group = String::from("root:x:0:\n");
    if uid == 0 {
        passwd.push_str(&format!("root:x:0:{gid}:root:{CONTAINER_HOME}:/bin/sh\n"));
    } else {
        passwd.push_str("root:x:0:0:root:/root:/bin/sh\n");
        passwd.push_str(&format!(
            "{name}:x:{uid}:{gid}:{name}:{CONTAINER_HOME}:/bin/sh\n"
        ));
    }
    if gid != 0 && gid != 65534 {
        group.push_str(&format!("{name}:x:{gid}:\n"));
    }
    if uid != 65534 {
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n");
    }
    if gid != 65534 {
        group.push_str("nogroup:x:65534:\n");
    }
    (passwd, group)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Writes `content` to `path` through a temporary file renamed into place, world-readable
/// (every uid in the container reads passwd).
fn write_file(path: &Path, content: &str) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(parent)?;
    file.write_all(content.as_bytes())?;
    set_mode(file.path(), 0o644)?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_homes_are_swept_unless_in_use_or_recent() {
        let temp = tempfile::tempdir().unwrap();
        for name in [
            "nerve-env-old",
            "nerve-env-used",
            "nerve-env-new",
            "other-old",
        ] {
            std::fs::create_dir(temp.path().join(name)).unwrap();
            std::fs::write(temp.path().join(name).join("passwd"), "x").unwrap();
        }
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for name in ["nerve-env-old", "nerve-env-used", "other-old"] {
            std::fs::File::open(temp.path().join(name))
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        let in_use = std::collections::HashSet::from(["used".to_owned()]);
        let homes = HomeSweep {
            dir: None,
            ended: std::collections::HashSet::new(),
            retention: std::time::Duration::from_secs(60),
        };
        let removed = sweep(temp.path(), PREFIX, &homes, &in_use);
        assert_eq!(removed, [("old".to_owned(), HomeRemoval::Unused)]);
        for (name, kept) in [
            ("nerve-env-old", false),
            ("nerve-env-used", true),
            ("nerve-env-new", true),
            ("other-old", true),
        ] {
            assert_eq!(temp.path().join(name).exists(), kept, "{name}");
        }
    }

    /// In a homes directory: an ended execution's home goes at once, a recent one of a
    /// resumable execution stays, and what is not an execution's home is never touched.
    #[test]
    fn ended_executions_homes_are_swept_at_once() {
        let homes_dir = tempfile::tempdir().unwrap();
        let (ended, resumable, used) = (ExecutionId::new(), ExecutionId::new(), ExecutionId::new());
        for name in [
            ended.to_string(),
            resumable.to_string(),
            used.to_string(),
            "notes".to_owned(),
        ] {
            std::fs::create_dir_all(homes_dir.path().join(name).join("home")).unwrap();
        }
        let homes = HomeSweep {
            dir: Some(homes_dir.path().to_path_buf()),
            ended: [ended.to_string(), used.to_string()].into(),
            retention: std::time::Duration::from_secs(3600),
        };
        let in_use = [used.to_string()].into();
        let removed = sweep(homes_dir.path(), "", &homes, &in_use);
        assert_eq!(removed, [(ended.to_string(), HomeRemoval::Ended)]);
        for (name, kept) in [
            (ended.to_string(), false),
            (resumable.to_string(), true),
            (used.to_string(), true),
            ("notes".to_owned(), true),
        ] {
            assert_eq!(homes_dir.path().join(&name).exists(), kept, "{name}");
        }
        // A homes directory puts the account there.
        let account = Account::prepare(
            Some(homes_dir.path()),
            resumable,
            (nix_uid(), nix_gid()),
            None,
        )
        .unwrap();
        assert_eq!(account.dir, homes_dir.path().join(resumable.to_string()));
        assert!(account.dir.join("passwd").exists());
        discard(Some(homes_dir.path()), resumable).unwrap();
        assert!(!homes_dir.path().join(resumable.to_string()).exists());
    }

    fn nix_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    }

    fn nix_gid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().gid()
    }

    #[test]
    fn the_uid_gets_a_named_entry_with_the_home() {
        let (passwd, group) = entries(1000, 1000, NAME);
        assert!(passwd.contains("nerve:x:1000:1000:nerve:/home/nerve:/bin/sh\n"));
        assert!(passwd.starts_with("root:x:0:0:root:/root:"));
        assert!(group.contains("nerve:x:1000:\n"));
        let (passwd, group) = entries(0, 0, NAME);
        assert!(passwd.starts_with("root:x:0:0:root:/home/nerve:/bin/sh\n"));
        assert!(!passwd.contains("nerve:x"));
        assert_eq!(group, "root:x:0:\nnogroup:x:65534:\n");
        let (passwd, group) = entries(1000, 1000, "dev");
        assert!(passwd.contains("dev:x:1000:1000:dev:/home/nerve:/bin/sh\n"));
        assert!(group.contains("dev:x:1000:\n"));
        assert!(
            valid_name("vscode")
                && !valid_name("root")
                && !valid_name("a:b")
                && !valid_name("x\ny")
        );
    }
}
