//! Unit tests of the protocol-facing pieces: names, filters, schemas, results.

use serde_json::json;

use super::*;

fn config(name: &str) -> McpServerConfig {
    McpServerConfig {
        name: name.to_owned(),
        command: Some("server".to_owned()),
        args: Vec::new(),
        url: None,
        env: Vec::new(),
        tools: ToolFilter::default(),
        timeout_secs: None,
        trust: Trust::Sandbox,
    }
}

#[test]
fn names_are_namespaced_and_sanitised() {
    assert_eq!(
        exposed_name("time", "get_current_time"),
        "time__get_current_time"
    );
    assert_eq!(exposed_name("git", "git.log/all"), "git__git_log_all");
    assert_eq!(exposed_name("s", &"x".repeat(100)).len(), 64);
}

#[test]
fn filters_allow_then_deny() {
    let filter = ToolFilter {
        allow: vec!["git_*".to_owned()],
        deny: vec!["git_push".to_owned(), "*_reset*".to_owned()],
    };
    assert!(filter.admits("git_status"));
    assert!(!filter.admits("git_push"));
    assert!(!filter.admits("git_reset_hard"));
    assert!(!filter.admits("fetch"));
    assert!(ToolFilter::default().admits("anything"));
    assert!(glob_match("a*b*c", "aXbYc"));
    assert!(!glob_match("a*b*c", "aXbY"));
    assert!(glob_match("*", ""));
}

#[test]
fn server_entries_are_validated_with_one_line_errors() {
    assert_eq!(config("time").validate(), Ok(()));
    let cases = [
        (
            McpServerConfig {
                name: "a b".into(),
                ..config("x")
            },
            "MCP server name `a b` must be non-empty letters, digits, `-` or single `_`",
        ),
        (
            McpServerConfig {
                name: "a__b".into(),
                ..config("x")
            },
            "MCP server name `a__b` must be non-empty letters, digits, `-` or single `_`",
        ),
        (
            McpServerConfig {
                command: None,
                ..config("x")
            },
            "MCP server `x`: give `command` (stdio) or `url` (HTTP)",
        ),
        (
            McpServerConfig {
                url: Some("http://h/mcp".into()),
                ..config("x")
            },
            "MCP server `x`: give either `command` (stdio) or `url` (HTTP), not both",
        ),
        (
            McpServerConfig {
                timeout_secs: Some(0),
                ..config("x")
            },
            "MCP server `x`: `timeout_secs` must be at least 1",
        ),
        (
            McpServerConfig {
                env: vec!["A=b".into()],
                ..config("x")
            },
            "MCP server `x`: `env` lists variable names; `A=b` is not one",
        ),
    ];
    for (entry, expected) in cases {
        assert_eq!(entry.validate().unwrap_err(), expected);
    }
}

fn remote(url: &str) -> McpServerConfig {
    McpServerConfig {
        command: None,
        url: Some(url.to_owned()),
        ..config("web")
    }
}

#[test]
fn url_servers_are_checked_and_run_remote() {
    for good in [
        "http://127.0.0.1:8080/mcp",
        "https://mcp.example.org/mcp",
        "http://[::1]:9/",
    ] {
        assert_eq!(remote(good).validate(), Ok(()), "{good}");
        assert_eq!(remote(good).runs(), "remote");
    }
    assert_eq!(config("time").runs(), "sandbox");
    let cases = [
        (
            remote("ftp://h/mcp"),
            "MCP server `web`: `url` `ftp://h/mcp` must start with http:// or https://",
        ),
        (
            remote("/mcp"),
            "MCP server `web`: `url` `/mcp` must start with http:// or https://",
        ),
        (
            remote("http://user:pw@h/mcp"),
            "MCP server `web`: `url` `http://user:pw@h/mcp` carries a user name; give credentials through a proxy rule",
        ),
        (
            remote("http://h /mcp"),
            "MCP server `web`: `url` `http://h /mcp` is not a URL: invalid uri character",
        ),
        (
            McpServerConfig {
                args: vec!["--x".into()],
                ..remote("http://h/mcp")
            },
            "MCP server `web`: `args` is for stdio servers; a `url` server is reached through the auth proxy",
        ),
        (
            McpServerConfig {
                env: vec!["A".into()],
                ..remote("http://h/mcp")
            },
            "MCP server `web`: `env` is for stdio servers; a `url` server is reached through the auth proxy",
        ),
        (
            McpServerConfig {
                trust: Trust::Host,
                ..remote("http://h/mcp")
            },
            "MCP server `web`: `trust = \"host\"` is for stdio servers; a `url` server is reached through the auth proxy",
        ),
    ];
    for (entry, expected) in cases {
        assert_eq!(entry.validate().unwrap_err(), expected);
    }
}

#[test]
fn schemas_are_checked() {
    let check = |schema: Value, expected: Result<(), &str>| {
        assert_eq!(
            check_schema(&schema),
            expected.map_err(str::to_owned),
            "{schema}"
        );
    };
    check(json!({"type": "object"}), Ok(()));
    check(
        json!({"type": "object", "properties": {"a": {"type": "string"}, "b": true}, "required": ["a"]}),
        Ok(()),
    );
    check(json!("object"), Err("it is not a JSON object"));
    check(
        json!({"type": "string"}),
        Err("its `type` is not \"object\""),
    );
    check(
        json!({"type": "object", "properties": []}),
        Err("`properties` is not an object"),
    );
    check(
        json!({"type": "object", "properties": {"a": 3}}),
        Err("property `a` is not a schema"),
    );
    check(
        json!({"type": "object", "required": [1]}),
        Err("`required` is not a list of names"),
    );
}

#[test]
fn invalid_tools_are_skipped_and_reported() {
    let mut config = config("srv");
    config.tools.deny = vec!["hidden".to_owned()];
    let listed = vec![
        json!({"name": "good", "description": "Does it.", "inputSchema": {"type": "object"}}),
        json!({"name": "bad", "inputSchema": {"type": "array"}}),
        json!({"name": "hidden", "inputSchema": {"type": "object"}}),
        json!({"description": "nameless"}),
    ];
    let set = expose(&config, &listed);
    let names: Vec<_> = set
        .tools
        .iter()
        .map(|t| t.definition.name.as_str())
        .collect();
    assert_eq!(names, ["srv__good"]);
    assert_eq!(set.tools[0].remote, "good");
    assert_eq!(
        set.tools[0].definition.description,
        "[MCP server `srv`] Does it."
    );
    assert_eq!(
        set.skipped,
        [
            "bad: invalid input schema: its `type` is not \"object\"",
            "a tool without a name was skipped"
        ]
    );
}

#[test]
fn results_become_tool_outputs() {
    let check = |result: Value, content: &str, is_error: bool| {
        let output = to_output(&result);
        assert_eq!(output.content, content, "{result}");
        assert_eq!(output.is_error, is_error, "{result}");
    };
    check(
        json!({"content": [{"type": "text", "text": "hi"}]}),
        "hi",
        false,
    );
    check(
        json!({"content": [{"type": "text", "text": "boom"}], "isError": true}),
        "boom",
        true,
    );
    check(
        json!({"content": [], "structuredContent": {"a": 1}}),
        r#"{"a":1}"#,
        false,
    );
    check(
        json!({"content": [{"type": "image", "mimeType": "image/png", "data": "AAAA"}, {"type": "text", "text": "t"}]}),
        "[image content: image/png, 3 bytes, not shown]\nt",
        false,
    );
    check(
        json!({"content": [{"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}]}),
        "[resource file:///a]\nbody",
        false,
    );
    check(
        json!({"content": [{"type": "resource", "resource": {"uri": "file:///b", "mimeType": "application/zip", "blob": "AAAAAA=="}}]}),
        "[resource file:///b: application/zip, 4 bytes, not shown]",
        false,
    );
    check(json!({}), "(the tool returned no content)", false);
    let long = "x".repeat(MAX_RESULT_BYTES + 10);
    let output = to_output(&json!({"content": [{"type": "text", "text": long}]}));
    assert!(output.content.ends_with("\n[... 10 bytes cut ...]"));
}
