//! Which image a run's sandbox uses, built when the workspace describes one: `--image`,
//! then `[sandbox] image`, then the workspace's `.devcontainer/devcontainer.json`, then the
//! Dockerfile `[sandbox] dockerfile` names, then the default image (built when missing).
//! Everything here happens before the log is opened: a bad definition or a failed build is
//! one line and exit 2, with nothing written.

use std::path::Path;

use nerve_hands::build::{BuildOutcome, DockerfileBuild, build_dockerfile};
use nerve_hands::devcontainer::{self, DevImage};
use nerve_hands::{DEFAULT_IMAGE, ImageSource};

use crate::RuntimeError;
use crate::config::Config;
use crate::observer::{Notice, Observer};

/// The image a run uses and what came with its definition.
#[derive(Debug)]
pub(crate) struct Environment {
    pub(crate) image: String,
    /// `containerEnv` of a devcontainer.json (filtered like every sandbox variable later).
    pub(crate) env: Vec<(String, String)>,
    /// The account name for the command uid (`remoteUser`).
    pub(crate) user_name: Option<String>,
    /// What the `started` event records under `config.sandbox_image`.
    pub(crate) record: serde_json::Value,
}

/// Where the image came from (the `origin` recorded).
#[derive(Debug, Clone, Copy)]
enum Origin {
    Flag,
    Config,
    Devcontainer,
    Dockerfile,
    Default,
}

impl Origin {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Flag => "flag",
            Self::Config => "config",
            Self::Devcontainer => "devcontainer",
            Self::Dockerfile => "dockerfile",
            Self::Default => "default",
        }
    }
}

/// Resolves (and builds, when needed) the run's image; a build's progress goes to
/// `observer`.
pub(crate) async fn resolve(
    docker: &bollard::Docker,
    flag: Option<&str>,
    config: &Config,
    workspace: &Path,
    observer: &dyn Observer,
) -> Result<Environment, RuntimeError> {
    let named = |image: &str, origin: Origin| Environment {
        image: image.to_owned(),
        env: Vec::new(),
        user_name: None,
        record: serde_json::json!({"image": image, "origin": origin.as_str()}),
    };
    if let Some(image) = flag {
        return Ok(named(image, Origin::Flag));
    }
    if let Some(image) = &config.sandbox.image {
        return Ok(named(image, Origin::Config));
    }
    if let Some(dev) = devcontainer::find(workspace).map_err(RuntimeError::config)? {
        let definition = relative(workspace, &dev.path);
        if !dev.ignored.is_empty() {
            tracing::info!(ignored = ?dev.ignored, "devcontainer.json fields Nerve ignores");
        }
        let mut environment = match &dev.image {
            DevImage::Named(image) => named(image, Origin::Devcontainer),
            DevImage::Build(build) => {
                let outcome = build_image(docker, build, observer).await?;
                built(outcome, Origin::Devcontainer, workspace, build)
            }
        };
        environment.env = dev.env.into_iter().collect();
        environment.user_name = dev.user_name;
        if let Some(record) = environment.record.as_object_mut() {
            record.insert("definition".into(), definition.into());
            record.insert("ignored_fields".into(), dev.ignored.into());
        }
        return Ok(environment);
    }
    if let Some(dockerfile) = &config.sandbox.dockerfile {
        let path = workspace.join(dockerfile);
        let build = DockerfileBuild {
            context: path
                .parent()
                .map_or_else(|| workspace.to_path_buf(), Path::to_path_buf),
            dockerfile: path,
            args: Default::default(),
            target: None,
        };
        let outcome = build_image(docker, &build, observer).await?;
        let mut environment = built(outcome, Origin::Dockerfile, workspace, &build);
        if let Some(record) = environment.record.as_object_mut() {
            record.insert(
                "definition".into(),
                relative(workspace, &build.dockerfile).into(),
            );
        }
        return Ok(environment);
    }
    if !nerve_hands::image_exists(docker, DEFAULT_IMAGE)
        .await
        .map_err(RuntimeError::sandbox)?
    {
        observer.notice(Notice::BuildingDefaultImage {
            image: DEFAULT_IMAGE.to_owned(),
        });
        let source = config
            .sandbox
            .busybox
            .clone()
            .map_or_else(ImageSource::default, |busybox| ImageSource { busybox });
        nerve_hands::build_default_image(docker, &source, DEFAULT_IMAGE)
            .await
            .map_err(RuntimeError::sandbox)?;
    }
    Ok(named(DEFAULT_IMAGE, Origin::Default))
}

async fn build_image(
    docker: &bollard::Docker,
    build: &DockerfileBuild,
    observer: &dyn Observer,
) -> Result<BuildOutcome, RuntimeError> {
    let mut announced = false;
    let mut progress = |line: &str| {
        // Said only when something is built: a reused image says nothing.
        if !announced {
            announced = true;
            observer.notice(Notice::BuildingImage {
                dockerfile: build.dockerfile.clone(),
            });
        }
        observer.notice(Notice::BuildOutput(line.to_owned()));
    };
    build_dockerfile(docker, build, &mut progress)
        .await
        .map_err(RuntimeError::sandbox)
}

fn built(
    outcome: BuildOutcome,
    origin: Origin,
    workspace: &Path,
    build: &DockerfileBuild,
) -> Environment {
    let record = serde_json::json!({
        "image": outcome.tag,
        "origin": origin.as_str(),
        "dockerfile": relative(workspace, &build.dockerfile),
        "context": relative(workspace, &build.context),
        "built": outcome.built,
        "build_ms": u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
        "output": outcome.output,
    });
    Environment {
        image: outcome.tag,
        env: Vec::new(),
        user_name: None,
        record,
    }
}

/// `path` relative to the workspace when inside it, for the record.
fn relative(workspace: &Path, path: &Path) -> String {
    let workspace = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&workspace)
        .map(|p| {
            if p.as_os_str().is_empty() {
                ".".to_owned()
            } else {
                p.display().to_string()
            }
        })
        .unwrap_or_else(|_| path.display().to_string())
}

/// `path` made absolute, when it is a directory.
pub fn validate_workspace(path: &Path) -> Result<std::path::PathBuf, RuntimeError> {
    let resolved = std::fs::canonicalize(path).map_err(|e| {
        RuntimeError::usage(format!(
            "workspace {}: {}",
            path.display(),
            crate::error::describe_io(&e)
        ))
    })?;
    if !resolved.is_dir() {
        return Err(RuntimeError::usage(format!(
            "workspace {} is not a directory",
            path.display()
        )));
    }
    Ok(resolved)
}
