//! The sandbox's environment on a real engine, with images built here from the default one
//! (no registry): the image's `PATH` and variables, the command uid's passwd entry, the
//! home directory.
//!
//! Without an engine these tests skip with a printed reason, unless `NERVE_REQUIRE_DOCKER=1`
//! (CI) makes that a failure. Time bounds are liveness bounds only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{BuildImageOptionsBuilder, RemoveImageOptionsBuilder};
use futures_util::StreamExt;
use nerve_core::{ExecutionId, ToolCall, ToolCallId, ToolExecutor, ToolOutput};
use nerve_hands::{Sandbox, SandboxConfig, SandboxTools};
use serde_json::json;

const LIVENESS: Duration = Duration::from_secs(300);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The engine, when the sandbox tests can run here (engine, default image, executor).
async fn engine() -> Option<Docker> {
    let required = std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1");
    let reason = match nerve_hands::connect_docker().await {
        Ok(docker) => {
            let image = nerve_hands::image_exists(&docker, nerve_hands::DEFAULT_IMAGE).await;
            match image {
                Ok(true) if nerve_hands::locate_executor().is_some() => return Some(docker),
                Ok(true) => "no nerve-executor binary: build it with `cargo xtask image`".into(),
                Ok(false) => "no default image: build it with `cargo xtask image`".into(),
                Err(e) => e.to_string(),
            }
        }
        Err(e) => e.to_string(),
    };
    assert!(
        !required,
        "Docker is required (NERVE_REQUIRE_DOCKER=1): {reason}"
    );
    eprintln!("skipping: {reason}");
    None
}

/// An image built here on top of the default one; removed on drop.
struct TestImage {
    docker: Docker,
    tag: String,
}

impl TestImage {
    /// Builds `dockerfile` with `files` (path, content, mode) as its context.
    async fn build(docker: &Docker, dockerfile: &str, files: &[(&str, &str, u32)]) -> Self {
        let tag = format!("nerve-test-env:{}", ExecutionId::new());
        let mut context = tar::Builder::new(Vec::new());
        let mut append = |path: &str, content: &str, mode: u32| {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(mode);
            header.set_cksum();
            context
                .append_data(&mut header, path, content.as_bytes())
                .unwrap();
        };
        append("Dockerfile", dockerfile, 0o644);
        for (path, content, mode) in files {
            append(path, content, *mode);
        }
        let context = context.into_inner().unwrap();
        let options = BuildImageOptionsBuilder::default().t(&tag).rm(true).build();
        let mut stream =
            docker.build_image(options, None, Some(bollard::body_full(context.into())));
        while let Some(step) = stream.next().await {
            let step = step.unwrap_or_else(|e| panic!("building the test image: {e}"));
            assert!(
                step.error_detail.is_none(),
                "building the test image: {step:?}"
            );
        }
        Self {
            docker: docker.clone(),
            tag,
        }
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let docker = self.docker.clone();
        let tag = self.tag.clone();
        // Drop runs inside the test's runtime: remove the image from a thread of its own.
        std::thread::spawn(move || {
            runtime().block_on(async {
                let options = RemoveImageOptionsBuilder::default().force(true).build();
                let _ = docker.remove_image(&tag, Some(options), None).await;
            });
        })
        .join()
        .unwrap();
    }
}

struct Running {
    sandbox: Arc<Sandbox>,
    tools: SandboxTools,
}

impl Running {
    async fn start(docker: &Docker, config: &SandboxConfig) -> Self {
        let sandbox = Arc::new(Sandbox::start(docker.clone(), config).await.unwrap());
        let tools = SandboxTools::new(Arc::clone(&sandbox));
        Self { sandbox, tools }
    }

    async fn shell(&self, command: &str) -> ToolOutput {
        let call = ToolCall {
            id: ToolCallId("call".to_owned()),
            name: "shell".to_owned(),
            arguments: json!({ "command": command }),
        };
        tokio::time::timeout(LIVENESS, self.tools.execute(&call))
            .await
            .unwrap_or_else(|_| panic!("`{command}` hung"))
            .unwrap_or_else(|e| panic!("`{command}`: the sandbox failed: {e}"))
    }

    /// Runs `command` and returns its output, failing the test when it fails.
    async fn ok(&self, command: &str) -> String {
        let output = self.shell(command).await;
        assert!(!output.is_error, "`{command}` failed: {}", output.content);
        output.content
    }
}

fn workspace_owned_by(dir: &Path, uid: u32, gid: u32) -> std::path::PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    std::os::unix::fs::chown(&workspace, Some(uid), Some(gid)).unwrap();
    assert_eq!(std::fs::metadata(&workspace).unwrap().uid(), uid);
    workspace
}

#[test]
fn the_images_path_and_environment_reach_commands_but_its_credentials_do_not() {
    runtime().block_on(async {
        let Some(docker) = engine().await else { return };
        let image = TestImage::build(
            &docker,
            &format!(
                "FROM {}\n\
                 COPY tool /opt/tool/bin/tool\n\
                 COPY local /usr/local/bin/local-tool\n\
                 ENV PATH=/opt/tool/bin:/usr/local/bin:/bin:/usr/bin LANG=C.UTF-8 \
                 API_TOKEN=sekrit-from-the-image\n",
                nerve_hands::DEFAULT_IMAGE
            ),
            &[
                ("tool", "#!/bin/sh\necho tool from /opt/tool/bin\n", 0o755),
                ("local", "#!/bin/sh\necho tool from /usr/local/bin\n", 0o755),
            ],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let workspace = workspace_owned_by(dir.path(), 0, 0);
        let execution_id = ExecutionId::new();
        let config = SandboxConfig::new(&image.tag, &workspace, execution_id);
        let running = Running::start(&docker, &config).await;
        let out = running
            .ok("tool; local-tool; echo \"lang=$LANG token=[$API_TOKEN]\"")
            .await;
        assert!(out.contains("tool from /opt/tool/bin"), "{out}");
        assert!(out.contains("tool from /usr/local/bin"), "{out}");
        assert!(out.contains("lang=C.UTF-8 token=[]"), "{out}");
        assert!(!out.contains("sekrit"), "{out}");
        running.sandbox.remove().await.unwrap();
        nerve_hands::discard_sandbox_home(None, execution_id).unwrap();
    });
}

#[test]
fn the_command_uid_has_a_name_and_a_home_that_outlives_the_container() {
    runtime().block_on(async {
        let Some(docker) = engine().await else { return };
        let dir = tempfile::tempdir().unwrap();
        let workspace = workspace_owned_by(dir.path(), 1000, 1000);
        let execution_id = ExecutionId::new();
        let config = SandboxConfig::new(nerve_hands::DEFAULT_IMAGE, &workspace, execution_id);
        let running = Running::start(&docker, &config).await;
        let out = running
            .ok("whoami; id -un; id -gn; echo \"home=$HOME tmpdir=$TMPDIR\"")
            .await;
        assert!(out.starts_with("nerve\nnerve\nnerve\n"), "{out}");
        assert!(
            out.contains("home=/home/nerve tmpdir=/home/nerve/.tmp"),
            "{out}"
        );
        // The home is writable and exec-capable; so is TMPDIR.
        let out = running
            .ok("printf '#!/bin/sh\\necho ran from home\\n' > ~/bin.sh && chmod +x ~/bin.sh && ~/bin.sh \
                 && cp ~/bin.sh \"$TMPDIR/t.sh\" && \"$TMPDIR/t.sh\" && echo kept > ~/state")
            .await;
        assert_eq!(out.matches("ran from home").count(), 2, "{out}");
        running.ok("touch /workspace/made-here").await;
        assert_eq!(
            std::fs::metadata(workspace.join("made-here")).unwrap().uid(),
            1000
        );
        running.sandbox.remove().await.unwrap();

        // A resume (same execution, new container) finds the home as it was left.
        let running = Running::start(&docker, &config).await;
        let out = running.ok("cat ~/state").await;
        assert!(out.starts_with("kept\n"), "{out}");
        running.sandbox.remove().await.unwrap();

        // Once the execution is over for good, the home goes.
        nerve_hands::discard_sandbox_home(None, execution_id).unwrap();
        let running = Running::start(&docker, &config).await;
        let output = running.shell("cat ~/state").await;
        assert!(output.is_error, "{output:?}");
        running.sandbox.remove().await.unwrap();
        nerve_hands::discard_sandbox_home(None, execution_id).unwrap();
    });
}

#[test]
fn a_command_killed_by_a_limit_is_told_which_one() {
    runtime().block_on(async {
        let Some(docker) = engine().await else { return };
        let dir = tempfile::tempdir().unwrap();
        let workspace = workspace_owned_by(dir.path(), 1000, 1000);
        let execution_id = ExecutionId::new();
        let config = SandboxConfig {
            pids_limit: 24,
            max_file_bytes: 1 << 20,
            ..SandboxConfig::new(nerve_hands::DEFAULT_IMAGE, &workspace, execution_id)
        };
        let running = Running::start(&docker, &config).await;

        // A plain failure names no limit.
        let output = running.shell("exit 3").await;
        assert!(output.is_error);
        assert!(!output.content.contains("limit"), "{output:?}");

        // 700 MiB against the default 512 MiB.
        let output = running
            .shell("dd if=/dev/zero of=/dev/null bs=700M count=1")
            .await;
        assert!(output.is_error, "{output:?}");
        assert!(
            output
                .content
                .contains("[killed: memory limit (512 MiB) reached]"),
            "{output:?}"
        );

        let output = running
            .shell("dd if=/dev/zero of=/workspace/big bs=64k count=64")
            .await;
        assert!(
            output
                .content
                .contains("[killed: file size limit (1 MiB) reached]"),
            "{output:?}"
        );

        let output = running
            .shell("for i in $(seq 60); do sleep 2 & done 2>/dev/null; wait; exit 1")
            .await;
        assert!(
            output
                .content
                .contains("[pids limit (24) reached: a process could not be started]"),
            "{output:?}"
        );

        // The sandbox still works, and a later plain failure names no limit again.
        let output = running.shell("exit 4").await;
        assert!(!output.content.contains("limit"), "{output:?}");
        running.sandbox.remove().await.unwrap();
        nerve_hands::discard_sandbox_home(None, execution_id).unwrap();
    });
}

#[test]
fn an_image_without_a_shell_is_refused_at_start_and_leaves_no_container() {
    runtime().block_on(async {
        let Some(docker) = engine().await else { return };
        let image = TestImage::build(
            &docker,
            "FROM scratch\nCOPY marker /marker\n",
            &[("marker", "x\n", 0o644)],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let workspace = workspace_owned_by(dir.path(), 0, 0);
        let execution_id = ExecutionId::new();
        let config = SandboxConfig::new(&image.tag, &workspace, execution_id);
        let error = Sandbox::start(docker.clone(), &config)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("has no /bin/sh, so the shell tool cannot run in it"),
            "{error}"
        );
        let filters = std::collections::HashMap::from([(
            "label".to_owned(),
            vec![format!("org.nerve.execution={execution_id}")],
        )]);
        let options = bollard::query_parameters::ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let left = docker.list_containers(Some(options)).await.unwrap();
        assert!(left.is_empty(), "{left:?}");
        nerve_hands::discard_sandbox_home(None, execution_id).unwrap();
    });
}
