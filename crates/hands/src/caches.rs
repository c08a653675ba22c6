//! Package caches that last between runs (`[sandbox.caches]`), opt-in per tool: a named
//! Docker volume per tool and workspace, mounted at the tool's default cache path in the
//! sandbox's home. A volume is shared between workspaces only when the configuration gives
//! them the same name.
//!
//! Each volume is the local driver bound to a host directory under
//! `~/.cache/nerve/volumes/` that Nerve creates and hands to the command uid: a plain named
//! volume would be created root-owned, and the sandbox (every capability dropped) could not
//! write to it.

use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::models::VolumeCreateRequest;

use crate::HandsError;
use crate::account::CONTAINER_HOME;

/// Label on cache volumes: the tool's name.
const LABEL_CACHE: &str = "org.nerve.cache";

/// A tool whose download cache can be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheTool {
    /// `~/.cache/pip`.
    Pip,
    /// `~/.npm`.
    Npm,
    /// `~/.cargo/registry` (the crate index and downloaded crates).
    Cargo,
}

impl CacheTool {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pip => "pip",
            Self::Npm => "npm",
            Self::Cargo => "cargo",
        }
    }

    /// Where the tool keeps its cache when `HOME` is the sandbox's home.
    pub fn container_path(self) -> String {
        let relative = match self {
            Self::Pip => ".cache/pip",
            Self::Npm => ".npm",
            Self::Cargo => ".cargo/registry",
        };
        format!("{CONTAINER_HOME}/{relative}")
    }
}

/// One cache to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheVolume {
    pub tool: CacheTool,
    /// `ws-<hash of the workspace path>`, or a configured name.
    pub key: String,
}

impl CacheVolume {
    /// The workspace's own cache for `tool`.
    pub fn for_workspace(tool: CacheTool, workspace: &Path) -> Self {
        let path = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
        let digest =
            ring::digest::digest(&ring::digest::SHA256, path.as_os_str().as_encoded_bytes());
        Self {
            tool,
            key: format!("ws-{}", &hex::encode(digest.as_ref())[..12]),
        }
    }

    /// A cache shared by every workspace configured with `name`; `None` when the name is
    /// not made of `[A-Za-z0-9_.-]` (1 to 64 characters).
    pub fn shared(tool: CacheTool, name: &str) -> Option<Self> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        valid.then(|| Self {
            tool,
            key: format!("shared-{name}"),
        })
    }

    /// The Docker volume's name.
    pub fn volume_name(&self) -> String {
        format!("nerve-cache-{}-{}", self.tool.as_str(), self.key)
    }
}

/// Creates (or finds) each volume, owned by `uid:gid`, and returns the binds.
pub(crate) async fn prepare(
    docker: &Docker,
    caches: &[CacheVolume],
    (uid, gid): (u32, u32),
) -> Result<Vec<String>, HandsError> {
    let mut binds = Vec::new();
    for cache in caches {
        let name = cache.volume_name();
        let dir = host_dir(&name);
        let fail = |e: std::io::Error| {
            HandsError::Workspace(format!(
                "cannot prepare the {} cache at {}: {e}",
                cache.tool.as_str(),
                dir.display()
            ))
        };
        std::fs::create_dir_all(&dir).map_err(fail)?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(fail)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
        }
        let exists = match docker.inspect_volume(&name).await {
            Ok(_) => true,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => false,
            Err(other) => return Err(other.into()),
        };
        if !exists {
            let device = dir.to_str().ok_or_else(|| {
                HandsError::Workspace(format!("{} is not valid UTF-8", dir.display()))
            })?;
            let request = VolumeCreateRequest {
                name: Some(name.clone()),
                driver: Some("local".to_owned()),
                driver_opts: Some(
                    [("type", "none"), ("o", "bind"), ("device", device)]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                ),
                labels: Some(
                    [(LABEL_CACHE.to_owned(), cache.tool.as_str().to_owned())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            };
            docker.create_volume(request).await?;
        }
        binds.push(format!("{name}:{}:rw", cache.tool.container_path()));
    }
    Ok(binds)
}

/// The host directory behind a cache volume.
fn host_dir(volume: &str) -> PathBuf {
    crate::debian::cache_dir().join("volumes").join(volume)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_are_per_workspace_unless_named() {
        let a = CacheVolume::for_workspace(CacheTool::Pip, Path::new("/w/a"));
        let b = CacheVolume::for_workspace(CacheTool::Pip, Path::new("/w/b"));
        assert_ne!(a.volume_name(), b.volume_name());
        assert!(a.volume_name().starts_with("nerve-cache-pip-ws-"));
        let shared = CacheVolume::shared(CacheTool::Npm, "team").unwrap();
        assert_eq!(shared.volume_name(), "nerve-cache-npm-shared-team");
        assert_eq!(CacheVolume::shared(CacheTool::Npm, "../x"), None);
        assert_eq!(CacheVolume::shared(CacheTool::Npm, ""), None);
        assert_eq!(
            CacheTool::Cargo.container_path(),
            "/home/nerve/.cargo/registry"
        );
    }
}
