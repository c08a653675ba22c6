//! Settings in layers, from outside: `nerve config` says where each value came from; a
//! project's `.nerve/config.toml` cannot loosen the user's file (one line naming both,
//! exit 2); a project's hook does not run unless the user's file trusts the project's hooks.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::{docker_available, events_json, last_json, nerve_env, stderr, stdout};

/// A user's configuration directory and a workspace under `dir`, with these files.
fn layout(dir: &Path, user: Option<&str>, project: Option<&str>) -> (PathBuf, PathBuf) {
    let config_home = dir.join("config");
    std::fs::create_dir_all(config_home.join("nerve")).unwrap();
    if let Some(text) = user {
        std::fs::write(config_home.join("nerve/config.toml"), text).unwrap();
    }
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(workspace.join(".nerve")).unwrap();
    if let Some(text) = project {
        std::fs::write(workspace.join(".nerve/config.toml"), text).unwrap();
    }
    (config_home, workspace)
}

#[test]
fn nerve_config_says_where_each_value_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let (config_home, workspace) = layout(
        dir.path(),
        Some(
            "provider = \"anthropic\"\nmodel = \"user-model\"\n\n[[rules]]\ntool = \"shell\"\ncommand = \"rm *\"\ndecision = \"deny\"\n",
        ),
        Some(
            "model = \"project-model\"\n\n[sandbox]\nmemory = \"256MiB\"\n\n[[hooks.stop]]\ncommand = [\"true\"]\n",
        ),
    );
    let named = dir.path().join("named.toml");
    std::fs::write(&named, "context_window = 4096\n").unwrap();
    let output = nerve_env(
        &dir.path().join("nerve.db"),
        &[
            "--config",
            named.to_str().unwrap(),
            "config",
            "--workspace",
            workspace.to_str().unwrap(),
            "--approval",
            "ask",
            "--json",
        ],
        &[
            ("XDG_CONFIG_HOME", config_home.to_str().unwrap()),
            ("NERVE_PROVIDER", "openai"),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output).replace(dir.path().to_str().unwrap(), "[DIR]");
    let value: Value = serde_json::from_str(text.trim()).unwrap();
    insta::assert_json_snapshot!("config_json", value);

    // The text form: one line per value, its source last.
    let output = nerve_env(
        &dir.path().join("nerve.db"),
        &["config", "--workspace", workspace.to_str().unwrap()],
        &[("XDG_CONFIG_HOME", config_home.to_str().unwrap())],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no {key} in\n{text}"))
            .to_owned()
    };
    assert!(line("model").contains("\"project-model\""), "{text}");
    assert!(
        line("model").ends_with("workspace/.nerve/config.toml"),
        "{text}"
    );
    assert!(line("provider").contains("user "), "{text}");
    assert!(line("approval").trim_end().ends_with("default"), "{text}");
    assert!(text.contains("ignored:"), "{text}");
}

#[test]
fn a_project_file_that_loosens_the_users_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (config_home, workspace) = layout(
        dir.path(),
        Some("approval = \"ask\"\n"),
        Some("approval = \"never\"\n"),
    );
    let output = nerve_env(
        &dir.path().join("nerve.db"),
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--provider",
            "script:/nonexistent",
            "x",
        ],
        &[("XDG_CONFIG_HOME", config_home.to_str().unwrap())],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "project settings {}",
            workspace.join(".nerve/config.toml").display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&config_home.join("nerve/config.toml").display().to_string()),
        "{err}"
    );
    assert!(err.contains("approval = \"never\""), "{err}");
    // A mistake in the user's file is named with its file and line, by every command.
    std::fs::write(
        config_home.join("nerve/config.toml"),
        "model = \"m\"\nmodle = 1\n",
    )
    .unwrap();
    let output = nerve_env(
        &dir.path().join("nerve.db"),
        &["list"],
        &[("XDG_CONFIG_HOME", config_home.to_str().unwrap())],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("config.toml"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("unknown field `modle`"), "{err}");
}

#[test]
fn a_project_files_hook_runs_only_when_the_user_trusts_the_projects_hooks() {
    if !docker_available() {
        return;
    }
    for trusted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("hook-ran");
        let hook = format!(
            "[[hooks.session_start]]\ncommand = [\"sh\", \"-c\", \"touch {}\"]\ntimeout_secs = 10\n",
            marker.display()
        );
        let user = if trusted {
            "trust_project_hooks = true\n"
        } else {
            ""
        };
        let (config_home, workspace) = layout(dir.path(), Some(user), Some(&hook));
        let cassette = dir.path().join("cassette.jsonl");
        std::fs::write(&cassette, json!({"text": "done"}).to_string()).unwrap();
        let db = dir.path().join("nerve.db");
        let output = nerve_env(
            &db,
            &[
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--provider",
                &format!("script:{}", cassette.display()),
                "--json",
                "work",
            ],
            &[("XDG_CONFIG_HOME", config_home.to_str().unwrap())],
        );
        let summary = last_json(&output);
        assert_eq!(
            summary["termination_reason"],
            "completed",
            "{summary}\n{}",
            stderr(&output)
        );
        let events = events_json(&db, summary["execution_id"].as_str().unwrap());
        let runs = events.iter().filter(|e| e["kind"] == "hook_ran").count();
        assert_eq!(
            (runs, marker.exists()),
            if trusted { (1, true) } else { (0, false) },
            "trusted: {trusted}"
        );
        let warned = stderr(&output).contains("hooks.session_start of");
        assert_eq!(warned, !trusted, "{}", stderr(&output));
    }
}
