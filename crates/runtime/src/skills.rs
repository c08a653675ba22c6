//! Finding the skills an execution offers: folders with a `SKILL.md` in the workspace's
//! `.nerve/skills/` and `.claude/skills/`, then the user's `$XDG_CONFIG_HOME/nerve/skills/`
//! and `~/.claude/skills/` (the paths and format Claude Code, Codex and goose read). The
//! first skill of a name wins, in that order. A malformed skill is skipped with one
//! warning naming its file; a folder without `SKILL.md` is not a skill and says nothing.
//!
//! Workspace folders are the project's, possibly a stranger's checkout: nothing read there
//! may lead outside the workspace, so a symbolic link is never followed and every path is
//! checked to resolve below the workspace before it is read.

use std::io::Read;
use std::path::{Path, PathBuf};

use nerve_brain::run::skills::{MAX_BODY_BYTES, Skill, SkillFile};
use nerve_core::event::InstructionsSource;

/// The largest `SKILL.md` read; a larger one is skipped.
pub const MAX_SKILL_FILE_BYTES: u64 = 256 * 1024;
/// The most skills one execution offers (the system prompt lists them all).
pub const MAX_SKILLS: usize = 64;
/// The most files of one skill's folder listed (and read).
pub const MAX_FILES: usize = 32;
/// How deep below a skill's folder its files are looked for.
const MAX_DEPTH: usize = 3;

/// The skills found, and the ones skipped: (file, why).
#[derive(Debug, Default)]
pub struct Found {
    pub skills: Vec<Skill>,
    pub skipped: Vec<(PathBuf, String)>,
}

/// The skill folders looked in, in order: the workspace's, then the user's.
pub fn roots(workspace: &Path) -> Vec<(PathBuf, InstructionsSource)> {
    let mut roots = vec![
        (
            workspace.join(".nerve/skills"),
            InstructionsSource::Workspace,
        ),
        (
            workspace.join(".claude/skills"),
            InstructionsSource::Workspace,
        ),
    ];
    if let Some(dir) = crate::config::user_config_dir() {
        roots.push((dir.join("skills"), InstructionsSource::User));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        roots.push((
            PathBuf::from(home).join(".claude/skills"),
            InstructionsSource::User,
        ));
    }
    roots
}

/// The skills of `workspace` and of the user.
pub fn discover(workspace: &Path) -> Found {
    discover_in(workspace, &roots(workspace))
}

fn discover_in(workspace: &Path, roots: &[(PathBuf, InstructionsSource)]) -> Found {
    let mut found = Found::default();
    let base = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    for (root, source) in roots {
        let confine = (*source == InstructionsSource::Workspace).then_some(base.as_path());
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        dirs.sort();
        // Ends: `dirs` is a finite listing.
        for dir in dirs {
            let file = dir.join("SKILL.md");
            let readable = match confine {
                Some(base) => confined(base, &dir) && confined(base, &file),
                None => true,
            };
            if !readable || !file.is_file() {
                continue;
            }
            match read_skill(&file, &dir, *source, workspace) {
                Ok(skill) => {
                    if let Some(first) = found.skills.iter().find(|s| s.name == skill.name) {
                        let why =
                            format!("a skill named `{}` came first ({})", skill.name, first.path);
                        found.skipped.push((file, why));
                    } else if found.skills.len() >= MAX_SKILLS {
                        found
                            .skipped
                            .push((file, format!("more than {MAX_SKILLS} skills")));
                    } else {
                        found.skills.push(skill);
                    }
                }
                Err(why) => found.skipped.push((file, why)),
            }
        }
    }
    found
}

/// Whether `path` is no symbolic link and resolves below `base`.
fn confined(base: &Path, path: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    !meta.file_type().is_symlink()
        && std::fs::canonicalize(path).is_ok_and(|real| real.starts_with(base))
}

fn read_skill(
    file: &Path,
    dir: &Path,
    source: InstructionsSource,
    workspace: &Path,
) -> Result<Skill, String> {
    let bytes =
        read_bounded(file, MAX_SKILL_FILE_BYTES + 1).map_err(|e| crate::error::describe_io(&e))?;
    if bytes.len() as u64 > MAX_SKILL_FILE_BYTES {
        return Err(format!(
            "it is larger than {} KiB",
            MAX_SKILL_FILE_BYTES / 1024
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_owned())?;
    let parsed = nerve_brain::run::skills::parse(&text)?;
    let path = match source {
        InstructionsSource::Workspace => file
            .strip_prefix(workspace)
            .unwrap_or(file)
            .display()
            .to_string(),
        InstructionsSource::User => file.display().to_string(),
    };
    let mut files = Vec::new();
    walk(dir, dir, 0, &mut files);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Skill {
        name: parsed.name,
        description: parsed.description,
        source,
        path,
        body: parsed.body,
        files,
    })
}

/// The files below `dir` (never through a symbolic link), up to [`MAX_FILES`] and
/// [`MAX_DEPTH`] levels, each read up to the body bound when it is text.
fn walk(top: &Path, dir: &Path, depth: usize, out: &mut Vec<SkillFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    // Ends: a finite listing; the recursion by MAX_DEPTH.
    for path in paths {
        if out.len() >= MAX_FILES {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let relative = path
            .strip_prefix(top)
            .unwrap_or(&path)
            .display()
            .to_string();
        if meta.is_dir() && depth + 1 < MAX_DEPTH {
            walk(top, &path, depth + 1, out);
        } else if meta.is_file() && relative != "SKILL.md" {
            let text = read_bounded(&path, MAX_BODY_BYTES as u64 + 4)
                .ok()
                .filter(|bytes| !bytes.contains(&0))
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            out.push(SkillFile {
                path: relative,
                text,
            });
        }
    }
}

fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn skill_md(name: &str, description: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\nDo the {name} thing.\n")
    }

    #[test]
    fn workspace_and_user_skills_with_files_and_one_warning_per_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        let user = dir.path().join("user");
        write(
            &workspace.join(".nerve/skills/deploy/SKILL.md"),
            &skill_md("deploy", "Ship it."),
        );
        write(
            &workspace.join(".nerve/skills/deploy/scripts/run.sh"),
            "echo hi\n",
        );
        write(&workspace.join(".nerve/skills/deploy/bin"), "a\0b");
        write(
            &workspace.join(".claude/skills/broken/SKILL.md"),
            "no front matter",
        );
        write(
            &workspace.join(".claude/skills/again/SKILL.md"),
            &skill_md("deploy", "A second deploy."),
        );
        // Not a skill: no SKILL.md.
        std::fs::create_dir_all(workspace.join(".claude/skills/empty")).unwrap();
        // A link out of the workspace is never followed.
        write(
            &user.join("secret/SKILL.md"),
            &skill_md("secret", "Outside."),
        );
        std::os::unix::fs::symlink(user.join("secret"), workspace.join(".nerve/skills/secret"))
            .unwrap();
        write(&user.join("pdf/SKILL.md"), &skill_md("pdf", "PDF files."));
        let roots = [
            (
                workspace.join(".nerve/skills"),
                InstructionsSource::Workspace,
            ),
            (
                workspace.join(".claude/skills"),
                InstructionsSource::Workspace,
            ),
            (user.join("pdf/.."), InstructionsSource::User),
        ];
        // The user's root holds `secret` too (a user's own folder may hold anything).
        let found = discover_in(&workspace, &roots);
        let names: Vec<(&str, &str)> = found
            .skills
            .iter()
            .map(|s| (s.name.as_str(), s.path.as_str()))
            .collect();
        assert_eq!(names[0], ("deploy", ".nerve/skills/deploy/SKILL.md"));
        assert_eq!(names[1].0, "pdf");
        assert_eq!(names[2].0, "secret");
        assert_eq!(found.skills.len(), 3);
        let deploy = &found.skills[0];
        assert_eq!(deploy.body, "Do the deploy thing.\n");
        assert_eq!(deploy.source, InstructionsSource::Workspace);
        assert_eq!(
            deploy.files,
            vec![
                SkillFile {
                    path: "bin".into(),
                    text: None
                },
                SkillFile {
                    path: "scripts/run.sh".into(),
                    text: Some("echo hi\n".into())
                },
            ]
        );
        assert_eq!(found.skills[1].source, InstructionsSource::User);
        let skipped: Vec<(String, &str)> = found
            .skipped
            .iter()
            .map(|(p, why)| {
                (
                    p.strip_prefix(&workspace).unwrap().display().to_string(),
                    why.as_str(),
                )
            })
            .collect();
        assert_eq!(
            skipped,
            vec![
                (
                    ".claude/skills/again/SKILL.md".to_owned(),
                    "a skill named `deploy` came first (.nerve/skills/deploy/SKILL.md)"
                ),
                (
                    ".claude/skills/broken/SKILL.md".to_owned(),
                    "it does not start with front matter (a line `---`)"
                ),
            ]
        );
    }

    #[test]
    fn an_oversized_skill_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("skills");
        let mut text = skill_md("big", "Big.");
        text.push_str(&"x".repeat(MAX_SKILL_FILE_BYTES as usize));
        write(&root.join("big/SKILL.md"), &text);
        let found = discover_in(dir.path(), &[(root, InstructionsSource::User)]);
        assert!(found.skills.is_empty());
        assert_eq!(found.skipped[0].1, "it is larger than 256 KiB");
    }
}
