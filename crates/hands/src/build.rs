//! Images built from a Dockerfile through the engine's build API (bollard, no `docker`
//! CLI), tagged by a hash of everything that goes into the build, so an unchanged
//! definition is built once and reused after.
//!
//! The build context is sent as a tarball made here: entries sorted, timestamps and owners
//! zeroed, `.dockerignore` applied. That tarball is deterministic, so its SHA-256 (with the
//! Dockerfile's path, the build arguments and the target) is the tag: touching a file
//! rebuilds nothing, changing one byte rebuilds. Before anything is sent, the `FROM` lines
//! are checked: a base image that is not in the local engine is refused with a clear error,
//! since no registry is reachable and Nerve never pulls.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::BuildImageOptionsBuilder;
use futures_util::StreamExt;

use crate::HandsError;
use crate::image::image_exists;

/// The repository name of every image built from a Dockerfile; the tag is the hash.
pub const BUILT_IMAGE_REPO: &str = "nerve-env";
/// How many of the build's last output lines a [`BuildOutcome`] keeps.
const OUTPUT_TAIL: usize = 40;
/// The name the Dockerfile gets in the context when it lives outside it.
const OUTSIDE_DOCKERFILE: &str = ".nerve.Dockerfile";

/// A Dockerfile and its build context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerfileBuild {
    pub dockerfile: PathBuf,
    pub context: PathBuf,
    /// `--build-arg`s.
    pub args: BTreeMap<String, String>,
    /// The stage to build (`--target`).
    pub target: Option<String>,
}

/// An image made sure of by [`build_dockerfile`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOutcome {
    /// `nerve-env:<hash>`.
    pub tag: String,
    /// `false` when the image was there already.
    pub built: bool,
    pub duration: Duration,
    /// The last lines of the build's output (empty when reused).
    pub output: Vec<String>,
}

/// Builds `build` unless an image with its inputs' hash exists; `progress` sees each line
/// of build output as it comes. A failed build is [`HandsError::ImageBuild`] with the
/// engine's one-line reason, and leaves no tagged image.
pub async fn build_dockerfile(
    docker: &Docker,
    build: &DockerfileBuild,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<BuildOutcome, HandsError> {
    let started = Instant::now();
    let dockerfile_text = std::fs::read_to_string(&build.dockerfile).map_err(|e| {
        HandsError::ImageBuild(format!("cannot read {}: {e}", build.dockerfile.display()))
    })?;
    check_bases(docker, build, &dockerfile_text).await?;
    let spec = build.clone();
    let context = tokio::task::spawn_blocking(move || context_tarball(&spec))
        .await
        .map_err(|e| HandsError::ImageBuild(format!("context task failed: {e}")))??;
    let tag = format!("{BUILT_IMAGE_REPO}:{}", context.hash(build));
    if image_exists(docker, &tag).await? {
        return Ok(BuildOutcome {
            tag,
            built: false,
            duration: started.elapsed(),
            output: Vec::new(),
        });
    }
    let args: HashMap<String, String> = build.args.clone().into_iter().collect();
    let mut options = BuildImageOptionsBuilder::default()
        .dockerfile(&context.dockerfile)
        .t(&tag)
        .rm(true)
        .forcerm(true)
        .buildargs(&args)
        .labels(&HashMap::from([("org.nerve.image", "built")]));
    if let Some(target) = &build.target {
        options = options.target(target);
    }
    let mut stream = docker.build_image(
        options.build(),
        None,
        Some(bollard::body_full(context.tar.into())),
    );
    let mut output: Vec<String> = Vec::new();
    let mut partial = String::new();
    while let Some(step) = stream.next().await {
        let step = step.map_err(|e| {
            if let bollard::errors::Error::DockerResponseServerError { message, .. } = &e {
                HandsError::ImageBuild(format!(
                    "building {} failed: {}",
                    build.dockerfile.display(),
                    one_line(message)
                ))
            } else {
                e.into()
            }
        })?;
        if let Some(error) = step
            .error_detail
            .and_then(|d| d.message)
            .filter(|m| !m.is_empty())
        {
            return Err(HandsError::ImageBuild(format!(
                "building {} failed: {}",
                build.dockerfile.display(),
                one_line(&error)
            )));
        }
        if let Some(text) = step.stream.or(step.status) {
            partial.push_str(&text);
            while let Some(end) = partial.find('\n') {
                let line: String = partial.drain(..=end).collect();
                let line = line.trim_end();
                if !line.is_empty() {
                    progress(line);
                    output.push(line.to_owned());
                    if output.len() > OUTPUT_TAIL {
                        output.remove(0);
                    }
                }
            }
        }
    }
    if !partial.trim().is_empty() {
        progress(partial.trim_end());
        output.push(partial.trim_end().to_owned());
    }
    if !image_exists(docker, &tag).await? {
        return Err(HandsError::ImageBuild(format!(
            "building {} ended without an image: {}",
            build.dockerfile.display(),
            output.last().map_or("no output", String::as_str)
        )));
    }
    Ok(BuildOutcome {
        tag,
        built: true,
        duration: started.elapsed(),
        output,
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Refuses a build whose base images are not in the local engine.
async fn check_bases(
    docker: &Docker,
    build: &DockerfileBuild,
    dockerfile: &str,
) -> Result<(), HandsError> {
    for base in base_images(dockerfile, &build.args) {
        if !image_exists(docker, &base).await? {
            return Err(HandsError::ImageBuild(format!(
                "base image `{base}` (FROM in {}) is not in the local Docker engine, and Nerve never pulls: build or load it there first (`docker load`, `docker import`)",
                build.dockerfile.display()
            )));
        }
    }
    Ok(())
}

/// The images a Dockerfile's `FROM` lines name, with `ARG`s before the first `FROM`
/// substituted (build arguments override their defaults); `scratch` and earlier stages are
/// left out.
pub fn base_images(dockerfile: &str, args: &BTreeMap<String, String>) -> Vec<String> {
    let mut globals: BTreeMap<String, String> = BTreeMap::new();
    let mut stages: Vec<String> = Vec::new();
    let mut bases = Vec::new();
    let mut seen_from = false;
    for line in logical_lines(dockerfile) {
        let mut words = line.split_whitespace();
        let Some(instruction) = words.next() else {
            continue;
        };
        if instruction.eq_ignore_ascii_case("ARG") && !seen_from {
            for word in words {
                let (name, default) = word.split_once('=').unwrap_or((word, ""));
                let value = args
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| default.trim_matches('"').to_owned());
                globals.insert(name.to_owned(), value);
            }
        } else if instruction.eq_ignore_ascii_case("FROM") {
            seen_from = true;
            let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
            let Some(image) = rest.first() else { continue };
            let image = substitute(image, &globals);
            let earlier = stages.contains(&image.to_ascii_lowercase());
            if !image.eq_ignore_ascii_case("scratch") && !earlier && !bases.contains(&image) {
                bases.push(image);
            }
            if let [_, as_word, name] = rest.as_slice()
                && as_word.eq_ignore_ascii_case("as")
            {
                stages.push(name.to_ascii_lowercase());
            }
        }
    }
    bases
}

/// Dockerfile lines with comments dropped and `\` continuations joined.
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            lines.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// `$NAME` and `${NAME}` (and `${NAME:-default}`) from `vars`.
fn substitute(word: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        let (name, default, after) = if let Some(inner) = rest.strip_prefix('{') {
            let end = inner.find('}').unwrap_or(inner.len());
            let body = &inner[..end];
            let (name, default) = match body.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (body, None),
            };
            (name, default, inner.get(end + 1..).unwrap_or(""))
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (&rest[..end], None, &rest[end..])
        };
        match vars.get(name).filter(|v| !v.is_empty()) {
            Some(value) => out.push_str(value),
            None => out.push_str(default.unwrap_or("")),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The build context as sent.
struct Context {
    tar: Vec<u8>,
    /// The Dockerfile's path inside the context.
    dockerfile: String,
}

impl Context {
    /// 16 hex digits of the SHA-256 of the tarball, the Dockerfile's path, the arguments
    /// and the target.
    fn hash(&self, build: &DockerfileBuild) -> String {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        digest.update(&self.tar);
        let extra = serde_json::json!({
            "dockerfile": self.dockerfile,
            "args": build.args,
            "target": build.target,
        });
        digest.update(extra.to_string().as_bytes());
        hex::encode(digest.finish().as_ref())[..16].to_owned()
    }
}

/// A deterministic tarball of the context, `.dockerignore` applied (the Dockerfile itself
/// is always sent).
fn context_tarball(build: &DockerfileBuild) -> Result<Context, HandsError> {
    let fail = |path: &Path, e: std::io::Error| {
        HandsError::ImageBuild(format!(
            "cannot read the build context at {}: {e}",
            path.display()
        ))
    };
    let root = std::fs::canonicalize(&build.context).map_err(|e| fail(&build.context, e))?;
    if !root.is_dir() {
        return Err(HandsError::ImageBuild(format!(
            "the build context {} is not a directory",
            root.display()
        )));
    }
    let dockerfile_abs =
        std::fs::canonicalize(&build.dockerfile).map_err(|e| fail(&build.dockerfile, e))?;
    let inside = dockerfile_abs
        .strip_prefix(&root)
        .ok()
        .and_then(|p| p.to_str())
        .map(str::to_owned);
    let ignore = std::fs::read_to_string(root.join(".dockerignore"))
        .map(|text| Ignore::parse(&text))
        .unwrap_or_default();
    let mut files = Vec::new();
    walk(&root, Path::new(""), &ignore, &mut files).map_err(|e| fail(&root, e))?;
    let mut builder = tar::Builder::new(Vec::new());
    let io =
        |e: std::io::Error| HandsError::ImageBuild(format!("cannot make the build context: {e}"));
    for relative in &files {
        append(&mut builder, &root, relative).map_err(io)?;
    }
    let dockerfile = match inside {
        Some(path) => {
            if !files.iter().any(|f| f.to_str() == Some(path.as_str())) {
                append(&mut builder, &root, Path::new(&path)).map_err(io)?;
            }
            path
        }
        None => {
            let data = std::fs::read(&dockerfile_abs).map_err(|e| fail(&dockerfile_abs, e))?;
            let mut header = header(tar::EntryType::Regular, 0o644, data.len() as u64);
            builder
                .append_data(&mut header, OUTSIDE_DOCKERFILE, data.as_slice())
                .map_err(io)?;
            OUTSIDE_DOCKERFILE.to_owned()
        }
    };
    let tar = builder.into_inner().map_err(io)?;
    Ok(Context { tar, dockerfile })
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(size);
    header
}

fn append(
    builder: &mut tar::Builder<Vec<u8>>,
    root: &Path,
    relative: &Path,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = root.join(relative);
    let meta = std::fs::symlink_metadata(&path)?;
    let mode = meta.permissions().mode() & 0o7777;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&path)?;
        let mut header = header(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut header, relative, target)
    } else if meta.is_dir() {
        let mut header = header(tar::EntryType::Directory, mode, 0);
        builder.append_data(&mut header, relative, std::io::empty())
    } else if meta.is_file() {
        let file = std::fs::File::open(&path)?;
        let mut header = header(tar::EntryType::Regular, mode, meta.len());
        builder.append_data(&mut header, relative, file)
    } else {
        // Sockets, FIFOs and devices have no place in a build context.
        Ok(())
    }
}

/// Every entry under `dir` not ignored, sorted by path; a directory before its contents.
fn walk(root: &Path, dir: &Path, ignore: &Ignore, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<(String, bool)> = std::fs::read_dir(root.join(dir))?
        .map(|entry| {
            let entry = entry?;
            let is_dir = entry.file_type()?.is_dir();
            Ok((entry.file_name().to_string_lossy().into_owned(), is_dir))
        })
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for (name, is_dir) in entries {
        let relative = dir.join(&name);
        let text = relative.to_string_lossy();
        if ignore.excludes(&text) {
            // An exception below an ignored directory (`!dir/keep`) still needs the walk.
            if !(is_dir && ignore.has_exception_under(&text)) {
                continue;
            }
        } else {
            out.push(relative.clone());
        }
        if is_dir {
            walk(root, &relative, ignore, out)?;
        }
    }
    Ok(())
}

/// `.dockerignore` rules: glob patterns (`*`, `?`, `**`) on slash-separated paths relative
/// to the context; a pattern matching a directory excludes what is under it; `!` re-includes;
/// the last matching rule wins.
#[derive(Debug, Default)]
struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    fn parse(text: &str) -> Self {
        let rules = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                let (include, pattern) = match line.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, line),
                };
                let segments = pattern
                    .trim_start_matches("./")
                    .trim_matches('/')
                    .split('/')
                    .filter(|s| !s.is_empty() && *s != ".")
                    .map(str::to_owned)
                    .collect();
                (include, segments)
            })
            .collect();
        Self { rules }
    }

    fn excludes(&self, path: &str) -> bool {
        let segments: Vec<&str> = path.split('/').collect();
        let mut excluded = false;
        for (include, pattern) in &self.rules {
            // A rule matches the path or one of its parent directories.
            let hit = (1..=segments.len()).any(|n| glob_segments(pattern, &segments[..n]));
            if hit {
                excluded = !include;
            }
        }
        excluded
    }

    fn has_exception_under(&self, dir: &str) -> bool {
        self.rules
            .iter()
            .any(|(include, pattern)| *include && pattern.join("/").starts_with(&format!("{dir}/")))
    }
}

fn glob_segments(pattern: &[String], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(p), _) if p == "**" => {
            (0..=path.len()).any(|skip| glob_segments(&pattern[1..], &path[skip..]))
        }
        (Some(p), Some(s)) => {
            glob(p.as_bytes(), s.as_bytes()) && glob_segments(&pattern[1..], &path[1..])
        }
        _ => false,
    }
}

/// `*` and `?` within one path segment.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], text) || (!text.is_empty() && glob(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) if p == t => glob(&pattern[1..], &text[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_bases(dockerfile: &str, args: &[(&str, &str)], expected: &[&str]) {
        let args = args
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(base_images(dockerfile, &args), expected, "{dockerfile}");
    }

    #[test]
    fn base_images_follow_args_and_skip_stages_and_scratch() {
        check_bases("FROM python:3.12\nRUN true\n", &[], &["python:3.12"]);
        check_bases(
            "ARG BASE=debian:12\n# FROM commented:1\nFROM --platform=linux/amd64 ${BASE} AS build\nFROM build\nFROM scratch\nCOPY --from=build / /\n",
            &[],
            &["debian:12"],
        );
        check_bases(
            "ARG BASE=debian:12\nFROM $BASE\n",
            &[("BASE", "mine:2")],
            &["mine:2"],
        );
        check_bases("ARG V\nFROM img:${V:-1}\n", &[], &["img:1"]);
        check_bases("FROM \\\n  a:1 AS x\nFROM x AS y\nFROM y\n", &[], &["a:1"]);
    }

    #[test]
    fn dockerignore_patterns() {
        let ignore = Ignore::parse("# c\n.git\n*.pyc\nbuild/\n**/node_modules\n!build/keep\n");
        for (path, excluded) in [
            (".git", true),
            (".git/config", true),
            ("a.pyc", true),
            ("src/a.pyc", false),
            ("build/out.o", true),
            ("build/keep", false),
            ("x/y/node_modules/z", true),
            ("src/main.py", false),
        ] {
            assert_eq!(ignore.excludes(path), excluded, "{path}");
        }
        assert!(ignore.has_exception_under("build"));
        assert!(!ignore.has_exception_under(".git"));
    }

    #[test]
    fn the_context_is_deterministic_and_its_hash_follows_content_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(root.join("src/a.py"), "print(1)\n").unwrap();
        std::fs::write(root.join("junk.pyc"), "x").unwrap();
        std::fs::write(root.join(".dockerignore"), "*.pyc\n").unwrap();
        let build = DockerfileBuild {
            dockerfile: root.join("Dockerfile"),
            context: root.to_path_buf(),
            args: BTreeMap::new(),
            target: None,
        };
        let first = context_tarball(&build).unwrap();
        assert_eq!(first.dockerfile, "Dockerfile");
        let names: Vec<String> = tar::Archive::new(first.tar.as_slice())
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [".dockerignore", "Dockerfile", "src", "src/a.py"]);
        // A touch changes nothing; an ignored file changes nothing; content does.
        let file = std::fs::File::options()
            .write(true)
            .open(root.join("src/a.py"))
            .unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(99))
            .unwrap();
        std::fs::write(root.join("junk.pyc"), "yy").unwrap();
        assert_eq!(
            context_tarball(&build).unwrap().hash(&build),
            first.hash(&build)
        );
        std::fs::write(root.join("src/a.py"), "print(2)\n").unwrap();
        assert_ne!(
            context_tarball(&build).unwrap().hash(&build),
            first.hash(&build)
        );
        let mut with_arg = build.clone();
        with_arg.args.insert("A".into(), "1".into());
        let now = context_tarball(&build).unwrap();
        assert_ne!(now.hash(&with_arg), now.hash(&build));
    }

    #[test]
    fn a_dockerfile_outside_the_context_is_sent_under_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ctx")).unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        let build = DockerfileBuild {
            dockerfile: dir.path().join("Dockerfile"),
            context: dir.path().join("ctx"),
            args: BTreeMap::new(),
            target: None,
        };
        assert_eq!(
            context_tarball(&build).unwrap().dockerfile,
            OUTSIDE_DOCKERFILE
        );
    }
}
