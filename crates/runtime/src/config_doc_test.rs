//! The configuration example in docs/cli.md parses and means what it says: the docs stay true.

use crate::config::Config;

#[test]
fn the_documented_example_parses() {
    let doc = include_str!("../../../docs/cli.md");
    let start = doc
        .find("```toml\n")
        .map(|i| i + "```toml\n".len())
        .unwrap();
    let end = start + doc[start..].find("```").unwrap();
    let config: Config = toml::from_str(&doc[start..end]).unwrap();
    let engine = config.engine_config().unwrap();
    assert_eq!(engine.max_replans, 3);
    let push = nerve_core::ToolCall {
        id: "c".into(),
        name: "shell".into(),
        arguments: serde_json::json!({"command": "git push"}),
    };
    assert_eq!(
        engine.policy.evaluate(&push).0,
        nerve_brain::guards::approval::PolicyAction::Ask
    );
    assert_eq!(
        config.approval,
        Some(nerve_brain::guards::approval::ApprovalMode::Ask)
    );
    for (command, expected) in [
        (
            "git status",
            nerve_brain::guards::approval::PolicyAction::Allow,
        ),
        (
            "rm -rf x",
            nerve_brain::guards::approval::PolicyAction::Deny,
        ),
        (
            "git status; rm -rf /",
            nerve_brain::guards::approval::PolicyAction::Deny,
        ),
        ("ls", nerve_brain::guards::approval::PolicyAction::Ask),
    ] {
        let call = nerve_core::ToolCall {
            id: "c".into(),
            name: "shell".into(),
            arguments: serde_json::json!({ "command": command }),
        };
        assert_eq!(engine.policy.evaluate(&call).0, expected, "{command}");
    }
    assert!(
        config
            .model_table()
            .unwrap()
            .get("my-local-model")
            .is_some()
    );
    config.mcp.validate().unwrap();
    let runs: Vec<&str> = config.mcp.servers.iter().map(|s| s.runs()).collect();
    assert_eq!(runs, ["sandbox", "remote"]);
}

#[test]
fn a_typo_is_an_error_not_a_default() {
    let err = toml::from_str::<Config>("[guardrails]\nmax_replan = 3\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `max_replan`"), "{err}");
}

#[test]
fn the_mcp_recipes_parse_and_validate() {
    let doc = include_str!("../../../docs/mcp.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert_eq!(blocks.len(), 3, "docs/mcp.md's TOML examples");
    for block in blocks {
        let config: Config = toml::from_str(block).unwrap_or_else(|e| panic!("{e}\n{block}"));
        config
            .mcp
            .validate()
            .unwrap_or_else(|e| panic!("{e:?}\n{block}"));
        assert!(!config.mcp.servers.is_empty(), "{block}");
        // The rules too, with a stand-in for every secret they read.
        config
            .proxy
            .build(&|_| Some("stand-in-secret".to_owned()))
            .unwrap_or_else(|e| panic!("{e:?}\n{block}"));
    }
}

#[test]
fn the_top_level_keys_parse_and_a_bad_mode_is_named() {
    let config: Config = toml::from_str(
        "provider = \"anthropic\"\nmodel = \"m\"\ncontext_window = 1000\napproval = \"never\"\n",
    )
    .unwrap();
    assert_eq!(config.provider.as_deref(), Some("anthropic"));
    assert_eq!(config.model.as_deref(), Some("m"));
    assert_eq!(config.context_window, Some(1000));
    assert_eq!(
        config.approval,
        Some(nerve_brain::guards::approval::ApprovalMode::Never)
    );
    let err = toml::from_str::<Config>("approval = \"sometimes\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("read-only"), "{err}");
}
