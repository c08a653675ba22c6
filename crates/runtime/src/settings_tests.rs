//! The layers laid over each other, where each value came from, and what a project's file
//! may not do.

use std::path::Path;

use nerve_brain::guards::approval::ApprovalMode;

use super::*;

/// A user's directory and a workspace, with the files given (`None`: no such file).
struct Setup {
    _dir: tempfile::TempDir,
    sources: Sources,
}

fn setup(user: Option<&str>, project: Option<&str>, named: Option<&str>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &Path, text: Option<&str>| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        if let Some(text) = text {
            std::fs::write(path, text).unwrap();
        }
        path.to_path_buf()
    };
    let user = write(&dir.path().join("home/nerve/config.toml"), user);
    let workspace = dir.path().join("workspace");
    let project = write(&workspace.join(PROJECT_FILE), project);
    let named = named.map(|text| write(&dir.path().join("named.toml"), Some(text)));
    Setup {
        sources: Sources {
            user: Some(user),
            project: Some(project),
            named,
            env: Vec::new(),
            flags: Flags::default(),
        },
        _dir: dir,
    }
}

/// The effective value of `key` and the layer it came from, as `nerve config` prints them.
fn value_of(settings: &Settings, key: &str) -> (String, Layer) {
    let entry = settings
        .entries
        .iter()
        .find(|e| e.key == key)
        .unwrap_or_else(|| panic!("no {key} in {:?}", settings.entries));
    (
        entry
            .value
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
        entry.origin.layer,
    )
}

/// A path as an error message shows it.
fn shown(path: &Option<std::path::PathBuf>) -> String {
    path.as_ref().unwrap().display().to_string()
}

/// The one-line error `load` gives.
fn refusal(setup: &Setup) -> String {
    let error = load(&setup.sources).unwrap_err().to_string();
    assert!(!error.contains('\n'), "{error}");
    error
}

#[test]
fn each_layer_wins_over_the_ones_before_it() {
    let mut setup = setup(
        Some(
            "provider = \"anthropic\"\nmodel = \"user-model\"\napproval = \"ask\"\n[sandbox]\nmemory = \"1GiB\"\n",
        ),
        Some("model = \"project-model\"\ncontext_window = 1000\n[sandbox]\nmemory = \"512MiB\"\n"),
        Some("context_window = 2000\n"),
    );
    let settings = load(&setup.sources).unwrap();
    assert_eq!(settings.config.provider.as_deref(), Some("anthropic"));
    assert_eq!(settings.config.model.as_deref(), Some("project-model"));
    assert_eq!(settings.config.context_window, Some(2000));
    assert_eq!(settings.config.approval, Some(ApprovalMode::Ask));
    assert_eq!(
        value_of(&settings, "provider"),
        ("\"anthropic\"".into(), Layer::User)
    );
    assert_eq!(
        value_of(&settings, "model"),
        ("\"project-model\"".into(), Layer::Project)
    );
    assert_eq!(
        value_of(&settings, "context_window"),
        ("2000".into(), Layer::Config)
    );
    assert_eq!(
        value_of(&settings, "sandbox.memory"),
        ("\"512MiB\"".into(), Layer::Project)
    );

    setup.sources.env = vec![("NERVE_MODEL".into(), "env-model".into())];
    let settings = load(&setup.sources).unwrap();
    assert_eq!(
        value_of(&settings, "model"),
        ("\"env-model\"".into(), Layer::Env)
    );
    let entry = settings.entries.iter().find(|e| e.key == "model").unwrap();
    assert_eq!(entry.origin.detail.as_deref(), Some("NERVE_MODEL"));

    setup.sources.flags.model = Some("flag-model".into());
    setup.sources.flags.approval = Some(ApprovalMode::ReadOnly);
    let settings = load(&setup.sources).unwrap();
    assert_eq!(settings.config.model.as_deref(), Some("flag-model"));
    assert_eq!(settings.config.approval, Some(ApprovalMode::ReadOnly));
    assert_eq!(
        value_of(&settings, "approval"),
        ("\"read-only\"".into(), Layer::Flag)
    );
}

#[test]
fn without_files_the_defaults_say_where_they_come_from() {
    let setup = setup(None, None, None);
    let settings = load(&setup.sources).unwrap();
    assert_eq!(
        value_of(&settings, "provider"),
        ("\"openai\"".into(), Layer::Default)
    );
    assert_eq!(
        value_of(&settings, "approval"),
        ("\"auto\"".into(), Layer::Default)
    );
    assert_eq!(value_of(&settings, "model"), ("-".into(), Layer::Default));
    let exists: Vec<(Layer, bool)> = settings.files.iter().map(|f| (f.layer, f.exists)).collect();
    assert_eq!(exists, [(Layer::User, false), (Layer::Project, false)]);
}

#[test]
fn the_users_rules_come_first_and_models_of_a_later_layer_override() {
    let setup = setup(
        Some(
            "[[rules]]\ntool = \"shell\"\ncommand = \"rm *\"\ndecision = \"deny\"\n[[models]]\nname = \"m\"\ncontext_window = 1000\n",
        ),
        Some(
            "[[rules]]\ntool = \"write_file\"\ndecision = \"ask\"\n[[models]]\nname = \"m\"\ncontext_window = 2000\n",
        ),
        Some("[[rules]]\ntool = \"grep\"\ndecision = \"deny\"\n"),
    );
    let settings = load(&setup.sources).unwrap();
    let tools: Vec<&str> = settings
        .config
        .rules
        .iter()
        .map(|r| r.tool.as_str())
        .collect();
    assert_eq!(tools, ["grep", "shell", "write_file"]);
    let keys: Vec<(&str, Layer)> = settings
        .entries
        .iter()
        .filter(|e| e.key.starts_with("rules"))
        .map(|e| (e.key.as_str(), e.origin.layer))
        .collect();
    assert_eq!(
        keys,
        [
            ("rules[0]", Layer::Config),
            ("rules[1]", Layer::User),
            ("rules[2]", Layer::Project)
        ]
    );
    let table = settings.config.model_table().unwrap();
    assert_eq!(table.get("m").unwrap().context_window, 2000);
}

#[test]
fn a_projects_hooks_run_only_when_the_user_trusts_them() {
    let hook = "[[hooks.stop]]\ncommand = [\"true\"]\n";
    let untrusted = setup(Some(hook), Some(hook), None);
    let settings = load(&untrusted.sources).unwrap();
    assert_eq!(settings.config.hooks.stop.len(), 1);
    assert_eq!(settings.ignored.len(), 1);
    assert_eq!(settings.ignored[0].0.key, "hooks.stop");
    assert_eq!(settings.ignored[0].0.origin.layer, Layer::Project);

    let trusted = setup(
        Some(&format!("trust_project_hooks = true\n{hook}")),
        Some(hook),
        None,
    );
    let settings = load(&trusted.sources).unwrap();
    assert_eq!(settings.config.hooks.stop.len(), 2);
    assert!(settings.ignored.is_empty());

    let project_trusts_itself = setup(
        None,
        Some(&format!("trust_project_hooks = true\n{hook}")),
        None,
    );
    let error = refusal(&project_trusts_itself);
    assert!(error.contains("trust_project_hooks"), "{error}");
}

#[test]
fn a_project_cannot_loosen_what_the_user_forbids() {
    let check = |user: Option<&str>, project: &str, expected: &str| {
        let setup = setup(user, Some(project), None);
        let error = refusal(&setup);
        let (project_path, user_path) = (shown(&setup.sources.project), shown(&setup.sources.user));
        assert!(error.contains(&project_path), "{error}");
        assert!(error.contains(&user_path), "{error}");
        assert!(error.contains(expected), "{project}: {error}");
    };
    check(None, "approval = \"never\"", "approval = \"never\"");
    check(
        Some("approval = \"ask\""),
        "approval = \"auto\"",
        "(approval \"ask\")",
    );
    check(
        Some("[policy]\ndefault = \"ask\""),
        "approval = \"auto\"",
        "approval = \"auto\"",
    );
    check(
        Some("approval = \"ask\""),
        "[[rules]]\ntool = \"shell\"\ncommand = \"git status\"\ndecision = \"allow\"",
        "rules[0] (allow)",
    );
    check(
        Some("[[rules]]\ntool = \"shell\"\ncommand = \"rm *\"\ndecision = \"deny\""),
        "[[rules]]\ntool = \"*\"\ndecision = \"allow\"",
        "rules[0] (allow)",
    );
    check(
        None,
        "[sandbox]\nfallback = \"per-call\"",
        "sandbox.fallback",
    );
    check(
        Some("[sandbox]\nmemory = \"512MiB\""),
        "[sandbox]\nmemory = \"1GiB\"",
        "sandbox.memory",
    );
    check(None, "[[proxy.rules]]\nhost = \"evil.test\"", "[proxy]");
    check(
        None,
        "[[mcp.servers]]\nname = \"x\"\ncommand = \"x\"\ntrust = \"host\"",
        "MCP server `x`",
    );
    check(
        None,
        "[[mcp.servers]]\nname = \"y\"\ncommand = \"y\"\nenv = [\"DATABASE_URL\"]",
        "MCP server `y` with env",
    );
    check(
        None,
        "[sandbox]\nbusybox = \"/root/.ssh/id_rsa\"",
        "sandbox.busybox",
    );
    check(
        None,
        "[sandbox.caches]\ncargo = \"team-cargo\"",
        "shared [sandbox.caches]",
    );
}

#[test]
fn a_project_may_tighten_and_decide_what_the_user_leaves_open() {
    for (user, project) in [
        (
            None,
            "approval = \"ask\"\n[[rules]]\ntool = \"shell\"\ncommand = \"git status\"\ndecision = \"allow\"",
        ),
        (Some("approval = \"never\""), "approval = \"never\""),
        (Some("approval = \"auto\""), "approval = \"read-only\""),
        (
            Some("[sandbox]\nmemory = \"1GiB\""),
            "[sandbox]\nmemory = \"512MiB\"\nimage = \"mine\"",
        ),
        (
            Some("approval = \"ask\""),
            "[[rules]]\ntool = \"shell\"\ncommand = \"rm *\"\ndecision = \"deny\"",
        ),
        (None, "[sandbox.caches]\npip = true"),
    ] {
        let setup = setup(user, Some(project), None);
        load(&setup.sources).unwrap_or_else(|e| panic!("{project}: {e}"));
    }
}

#[test]
fn mistakes_name_the_file_and_the_line_or_the_variable() {
    let setup_bad = setup(None, Some("model = \"m\"\n\nmodle = \"x\"\n"), None);
    let error = refusal(&setup_bad);
    let project_path = shown(&setup_bad.sources.project);
    assert!(error.contains(&project_path), "{error}");
    assert!(error.contains("line 3"), "{error}");
    assert!(error.contains("unknown field `modle`"), "{error}");

    let mut bad_env = setup(None, None, None);
    bad_env.sources.env = vec![("NERVE_APPROVAL".into(), "sometimes".into())];
    let error = refusal(&bad_env);
    assert!(
        error.starts_with("NERVE_APPROVAL=\"sometimes\": "),
        "{error}"
    );
    bad_env.sources.env = vec![("NERVE_CONTEXT_WINDOW".into(), "lots".into())];
    assert!(refusal(&bad_env).contains("not a number of tokens"));

    let missing = Sources {
        named: Some("/nonexistent/nerve.toml".into()),
        ..Sources::default()
    };
    let error = load(&missing).unwrap_err().to_string();
    assert!(error.contains("/nonexistent/nerve.toml"), "{error}");
}
