//! Debian images built here, with `debootstrap` and an import into the local engine: no
//! registry is reachable on our machines, so an image with a real toolchain (Python, for the
//! tests and benchmarks that need one) is made from Debian's packages, which are.
//!
//! An image is named by a hash of its inputs (suite, mirror, variant, packages, the image
//! settings and this builder's version), so an unchanged definition is built once: the
//! root filesystem tarball is cached under `~/.cache/nerve/debian/` (it survives an engine
//! reset) and the imported image stays in the engine. Concurrent callers (several test
//! binaries, helpers sharing the machine) serialise on a lock file per hash.

use std::path::{Path, PathBuf};
use std::process::Command;

use bollard::Docker;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;

use crate::HandsError;
use crate::image::image_exists;

/// Bumped whenever how the root filesystem is made changes, so old tags are not reused.
const BUILDER_VERSION: &str = "1";

/// The `PATH` a Debian image carries (Debian's login default for root, which also covers
/// tools installed under `/usr/local`).
const DEBIAN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What a Debian image is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianImage {
    /// The image repository name; the tag is the inputs' hash.
    pub name: String,
    /// Debian suite (`bookworm`).
    pub suite: String,
    /// Package mirror URL; `None` takes `NERVE_DEBIAN_MIRROR`, else the host's apt sources.
    pub mirror: Option<String>,
    /// Packages installed on top of debootstrap's `minbase` variant.
    pub packages: Vec<String>,
}

impl DebianImage {
    /// Debian with Python 3, pip, venv and pytest: the image Nerve's Python-project tests,
    /// the sandbox benchmark and the MCP server image (built `FROM` it) use.
    pub fn python() -> Self {
        Self {
            name: "nerve-debian-python".to_owned(),
            suite: host_suite().unwrap_or_else(|| "bookworm".to_owned()),
            mirror: None,
            packages: ["python3", "python3-pip", "python3-venv", "python3-pytest"]
                .map(str::to_owned)
                .to_vec(),
        }
    }
}

/// An image [`ensure_debian_image`] made sure of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianBuild {
    /// `name:hash`, present in the engine.
    pub tag: String,
    /// The cached root filesystem tarball it was imported from.
    pub rootfs: PathBuf,
    /// What had to be done: nothing, an import of the cached tarball, or a debootstrap.
    pub work: BuildWork,
}

/// How much of a Debian image had to be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildWork {
    /// The image was in the engine already.
    Reused,
    /// The cached tarball was imported.
    Imported,
    /// debootstrap ran, then the import.
    Bootstrapped,
}

/// Where Nerve keeps slow-to-make artefacts: `$XDG_CACHE_HOME/nerve`, else `~/.cache/nerve`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("nerve");
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("nerve")
}

/// The image's tag for `spec` with `mirror` resolved: `name:` and 16 hex digits of the
/// SHA-256 of every input.
pub fn debian_tag(spec: &DebianImage, mirror: &str) -> String {
    let mut packages = spec.packages.clone();
    packages.sort();
    packages.dedup();
    let inputs = serde_json::json!({
        "builder": BUILDER_VERSION,
        "suite": spec.suite,
        "mirror": mirror,
        "variant": "minbase",
        "packages": packages,
        "changes": image_changes(),
    });
    let digest = ring::digest::digest(&ring::digest::SHA256, inputs.to_string().as_bytes());
    format!("{}:{}", spec.name, &hex::encode(digest.as_ref())[..16])
}

/// Makes sure the image for `spec` is in the engine, building it when needed, and returns
/// its tag. `cache` defaults to [`cache_dir`]. Blocks other callers for the same image
/// until it is there.
pub async fn ensure_debian_image(
    docker: &Docker,
    spec: &DebianImage,
    cache: Option<&Path>,
) -> Result<DebianBuild, HandsError> {
    let mirror = match &spec.mirror {
        Some(mirror) => mirror.clone(),
        None => resolve_mirror()?,
    };
    let tag = debian_tag(spec, &mirror);
    let dir = cache.map_or_else(|| cache_dir().join("debian"), |c| c.join("debian"));
    std::fs::create_dir_all(&dir).map_err(|e| build_error(&dir, "cannot create", &e))?;
    let hash = tag
        .rsplit_once(':')
        .map_or(tag.as_str(), |(_, h)| h)
        .to_owned();
    let rootfs = dir.join(format!("{}-{hash}.tar", spec.name));
    if image_exists(docker, &tag).await? {
        return Ok(DebianBuild {
            tag,
            rootfs,
            work: BuildWork::Reused,
        });
    }
    let lock_path = dir.join(format!("{}-{hash}.lock", spec.name));
    let lock = tokio::task::spawn_blocking(move || lock_file(&lock_path))
        .await
        .map_err(|e| HandsError::ImageBuild(format!("lock task failed: {e}")))??;
    // Another caller may have finished while this one waited for the lock.
    if image_exists(docker, &tag).await? {
        drop(lock);
        return Ok(DebianBuild {
            tag,
            rootfs,
            work: BuildWork::Reused,
        });
    }
    let mut work = BuildWork::Imported;
    if !rootfs.is_file() {
        let spec = spec.clone();
        let (target, mirror) = (rootfs.clone(), mirror.clone());
        tokio::task::spawn_blocking(move || bootstrap(&spec, &mirror, &target))
            .await
            .map_err(|e| HandsError::ImageBuild(format!("debootstrap task failed: {e}")))??;
        work = BuildWork::Bootstrapped;
    }
    import(docker, &rootfs, &tag).await?;
    drop(lock);
    Ok(DebianBuild { tag, rootfs, work })
}

/// The `docker import` changes every Debian image gets.
fn image_changes() -> Vec<String> {
    vec![
        format!("ENV PATH={DEBIAN_PATH}"),
        "ENV LANG=C.UTF-8".to_owned(),
        "WORKDIR /workspace".to_owned(),
        "CMD [\"/bin/sh\"]".to_owned(),
        "LABEL org.nerve.image=debian".to_owned(),
    ]
}

async fn import(docker: &Docker, rootfs: &Path, tag: &str) -> Result<(), HandsError> {
    let (repo, version) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(version)
        .changes(image_changes())
        .build();
    let file = tokio::fs::File::open(rootfs)
        .await
        .map_err(|e| build_error(rootfs, "cannot open", &e))?;
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buffer = vec![0u8; 1 << 20];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((Ok(bytes::Bytes::from(buffer)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    let mut progress =
        docker.create_image(Some(options), Some(bollard::body_try_stream(chunks)), None);
    while let Some(step) = progress.next().await {
        let step = step?;
        if let Some(error) = step.error_detail.and_then(|detail| detail.message) {
            return Err(HandsError::ImageBuild(format!(
                "importing {}: {error}",
                rootfs.display()
            )));
        }
    }
    Ok(())
}

/// Runs debootstrap into a scratch directory next to `target`, trims it, and writes the
/// tarball to `target` (renamed into place, so a crash never leaves a partial cache entry).
fn bootstrap(spec: &DebianImage, mirror: &str, target: &Path) -> Result<(), HandsError> {
    let which = Command::new("sh")
        .args([
            "-c",
            "command -v debootstrap || test -x /usr/sbin/debootstrap",
        ])
        .output();
    if !which.is_ok_and(|o| o.status.success()) {
        return Err(HandsError::ImageBuild(
            "debootstrap is not installed; install it with `apt-get install debootstrap` (it needs root)".to_owned(),
        ));
    }
    let parent = target.parent().unwrap_or(Path::new("."));
    let scratch = tempfile::Builder::new()
        .prefix(".debootstrap-")
        .tempdir_in(parent)
        .map_err(|e| build_error(parent, "cannot create a scratch directory in", &e))?;
    let root = scratch.path().join("root");
    let log = scratch.path().join("debootstrap.log");
    let log_file =
        std::fs::File::create(&log).map_err(|e| build_error(&log, "cannot create", &e))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| build_error(&log, "cannot open", &e))?;
    let status = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", spec.packages.join(",")))
        .arg(&spec.suite)
        .arg(&root)
        .arg(mirror)
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdout(log_file)
        .stderr(log_err)
        .status()
        .map_err(|e| HandsError::ImageBuild(format!("cannot run debootstrap: {e}")))?;
    if !status.success() {
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(5).collect();
        return Err(HandsError::ImageBuild(format!(
            "debootstrap of {} from {mirror} failed ({status}): {}",
            spec.suite,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    trim_rootfs(&root)?;
    let staged = scratch.path().join("rootfs.tar");
    // GNU tar keeps device nodes, hard links, xattrs-free ownership by number: what an
    // import expects. The tar crate would need all of that by hand.
    let status = Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(&root)
        .arg("-cf")
        .arg(&staged)
        .arg(".")
        .status()
        .map_err(|e| HandsError::ImageBuild(format!("cannot run tar: {e}")))?;
    if !status.success() {
        return Err(HandsError::ImageBuild(format!(
            "tar of the debootstrapped root failed ({status})"
        )));
    }
    std::fs::rename(&staged, target).map_err(|e| build_error(target, "cannot write", &e))?;
    Ok(())
}

/// Drops what an image does not need (downloaded packages, package lists) and adds the
/// mount point for the workspace.
fn trim_rootfs(root: &Path) -> Result<(), HandsError> {
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        let dir = root.join(dir);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_file() {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
    let workspace = root.join("workspace");
    std::fs::create_dir_all(&workspace).map_err(|e| build_error(&workspace, "cannot create", &e))
}

fn lock_file(path: &Path) -> Result<std::fs::File, HandsError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| build_error(path, "cannot open", &e))?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| build_error(path, "cannot lock", &e.into()))?;
    Ok(file)
}

fn build_error(path: &Path, what: &str, error: &std::io::Error) -> HandsError {
    HandsError::ImageBuild(format!("{what} {}: {error}", path.display()))
}

/// The mirror to bootstrap from: `NERVE_DEBIAN_MIRROR`, else the first Debian archive in the
/// host's apt sources (deb822 `.sources` files or one-line `sources.list`).
fn resolve_mirror() -> Result<String, HandsError> {
    if let Some(mirror) = std::env::var("NERVE_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
    {
        return Ok(mirror);
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    files
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .find_map(|text| mirror_in_sources(&text))
        .ok_or_else(|| {
            HandsError::ImageBuild(
                "no Debian mirror found in /etc/apt/sources.list{,.d}; set NERVE_DEBIAN_MIRROR to one".to_owned(),
            )
        })
}

/// The first archive URL (not a security or updates archive) in apt sources text.
fn mirror_in_sources(text: &str) -> Option<String> {
    let is_main_archive = |url: &str| {
        (url.starts_with("http://") || url.starts_with("https://"))
            && url.trim_end_matches('/').ends_with("/debian")
    };
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let urls: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // `deb [options] URL suite components`: the options may hold spaces.
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(options) => options.split_once(']').map_or("", |(_, after)| after),
                    None => rest,
                };
                rest.split_whitespace().take(1).collect()
            } else {
                Vec::new()
            };
            urls.into_iter()
                .find(|url| is_main_archive(url))
                .map(|url| url.trim_end_matches('/').to_owned())
        })
}

/// The host's Debian codename (`VERSION_CODENAME` in /etc/os-release).
fn host_suite() -> Option<String> {
    std::fs::read_to_string("/etc/os-release")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_are_found_in_both_source_formats() {
        let deb822 = "Types: deb\n# http://old/debian\nURIs: http://mirror.example/debian\nSuites: bookworm\n\nURIs: http://mirror.example/debian-security\n";
        assert_eq!(
            mirror_in_sources(deb822).as_deref(),
            Some("http://mirror.example/debian")
        );
        let security_first =
            "URIs: http://m.example/debian-security\nURIs: http://m.example/debian/\n";
        assert_eq!(
            mirror_in_sources(security_first).as_deref(),
            Some("http://m.example/debian")
        );
        let one_line = "# deb http://x/debian\ndeb [arch=amd64 signed-by=/k] http://m.example/debian bookworm main\n";
        assert_eq!(
            mirror_in_sources(one_line).as_deref(),
            Some("http://m.example/debian")
        );
        assert_eq!(
            mirror_in_sources("deb http://m.example/ubuntu jammy main"),
            None
        );
    }

    #[test]
    fn the_tag_is_a_hash_of_every_input_but_not_of_package_order() {
        let spec = DebianImage::python();
        let tag = debian_tag(&spec, "http://m/debian");
        assert!(tag.starts_with("nerve-debian-python:"), "{tag}");
        assert_eq!(tag.len(), "nerve-debian-python:".len() + 16);
        let mut reordered = spec.clone();
        reordered.packages.reverse();
        assert_eq!(debian_tag(&reordered, "http://m/debian"), tag);
        let mut more = spec.clone();
        more.packages.push("git".to_owned());
        assert_ne!(debian_tag(&more, "http://m/debian"), tag);
        assert_ne!(debian_tag(&spec, "http://other/debian"), tag);
        let mut suite = spec;
        suite.suite = "trixie".to_owned();
        assert_ne!(debian_tag(&suite, "http://m/debian"), tag);
    }
}
