//! Traces end to end: a scripted `nerve run` with tool calls and compactions exports its
//! spans over OTLP to a real Arize Phoenix; the test reads them back from Phoenix's REST
//! API and checks the tree (execution → turns → model calls, tool calls and compactions),
//! the GenAI attributes, and that neither a registered secret nor, by default, any message
//! text reaches the backend.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::phoenix::{Phoenix, attribute, phoenix_available};
use crate::support::{
    copy_example, docker_available, events_json, last_json, nerve_env, stderr, stdout,
};

/// Registered with the redactor as a provider key (`OPENAI_API_KEY` is read even for a
/// scripted run); the cassette puts it in the model's text and in a tool's arguments.
const SECRET: &str = "sk-canary-4f1e9b2d7c3a8e6f0d5b";
const TASK: &str = "Find out why the build fails; the deploy token is in the notes.";
/// Text that only the model's messages and a tool's output carry.
const MODEL_TEXT: &str = "First the build log.";
const TOOL_TEXT: &str = "FATAL: missing symbol nerve_frobnicate";

/// The compaction example's cassette with the secret in the first answer and its command.
fn cassette(dir: &Path) -> std::path::PathBuf {
    let lines = [
        serde_json::json!({"text": format!("{MODEL_TEXT} Using key {SECRET}."), "tool_calls": [{"name": "shell", "arguments": {"command": format!("i=0; while [ $i -lt 2000 ]; do echo \"build step $i ok\"; i=$((i+1)); done; echo '{TOOL_TEXT} in src/link.c'; echo {SECRET} > /dev/null")}}]}),
        serde_json::json!({"text": "Now the sources.", "tool_calls": [{"name": "shell", "arguments": {"command": "ls -l"}}]}),
        serde_json::json!({"text": "Let me read the test.", "tool_calls": [{"name": "read_file", "arguments": {"path": "test.sh"}}]}),
        serde_json::json!({"text": "And the script.", "tool_calls": [{"name": "read_file", "arguments": {"path": "greet.sh"}}]}),
        serde_json::json!({"text": "More of the build.", "tool_calls": [{"name": "shell", "arguments": {"command": "i=0; while [ $i -lt 300 ]; do echo \"warning $i: unused variable in module $i\"; i=$((i+1)); done"}}]}),
        serde_json::json!({"text": "Listing again.", "tool_calls": [{"name": "list_dir", "arguments": {}}]}),
        serde_json::json!({"text": "Which symbol was missing?", "tool_calls": [{"name": "recall", "arguments": {"query": "missing symbol"}}]}),
        serde_json::json!({"text": "The build failed on the missing symbol nerve_frobnicate."}),
    ];
    // Summaries answer from their own lines; more than the run needs.
    let summaries = (0..6).map(|_| serde_json::json!({"call": "summary", "text": "Goal: find why the build fails. Done: read the build log and the scripts."}));
    let lines: Vec<Value> = lines.into_iter().chain(summaries).collect();
    let path = dir.join("cassette.jsonl");
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&path, text.join("\n")).unwrap();
    path
}

/// Runs the cassette with traces going to `phoenix`'s project `project`; returns the
/// `--json` result and the log's events.
fn traced_run(phoenix: &Phoenix, project: &str, capture_content: bool) -> (Value, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let script = format!("script:{}", cassette(dir.path()).display());
    let endpoint = phoenix.otlp_endpoint();
    let resource = format!("openinference.project.name={project}");
    let capture = if capture_content { "true" } else { "false" };
    let output = nerve_env(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            TASK,
            "--provider",
            &script,
            "--context-window",
            "4000",
            "--json",
        ],
        &[
            ("OPENAI_API_KEY", SECRET),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_RESOURCE_ATTRIBUTES", &resource),
            (
                "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
                capture,
            ),
        ],
    );
    assert!(
        output.status.success(),
        "nerve run failed:\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    let events = events_json(&db, result["execution_id"].as_str().unwrap());
    (result, events)
}

fn str_attr<'a>(span: &'a Value, key: &str) -> &'a str {
    attribute(span, key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("span {} has no string {key}: {span}", span["name"]))
}

fn int_attr(span: &Value, key: &str) -> u64 {
    attribute(span, key)
        .and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or_else(|| panic!("span {} has no integer {key}: {span}", span["name"]))
}

fn span_id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap()
}

fn op(span: &Value) -> Option<&str> {
    attribute(span, "gen_ai.operation.name").and_then(Value::as_str)
}

/// One Phoenix for both runs: it takes a minute to start.
#[test]
fn traces_reach_phoenix_as_a_readable_tree_without_secrets() {
    if !docker_available() || !phoenix_available() {
        return;
    }
    let phoenix = Phoenix::start();
    a_run_shows_its_tree_and_genai_attributes(&phoenix);
    opted_in_content_arrives_redacted(&phoenix);
}

fn a_run_shows_its_tree_and_genai_attributes(phoenix: &Phoenix) {
    let project = "nerve-e2e-tracing";
    let (result, events) = traced_run(phoenix, project, false);
    let execution_id = result["execution_id"].as_str().unwrap();
    let turns = result["total_turns"].as_u64().unwrap();
    let tool_calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .map(|e| &e["payload"]["call"])
        .collect();
    assert!(!tool_calls.is_empty());

    // Exported at exit; Phoenix ingests in the background: wait for the whole tree.
    let spans = phoenix.wait_for_spans(project, Duration::from_secs(60), |spans| {
        let count = |name: &str| {
            spans
                .iter()
                .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(name)))
                .count()
        };
        count("invoke_agent") == 1
            && count("turn ") == usize::try_from(turns).unwrap()
            && count("execute_tool ") == tool_calls.len()
    });
    let by_id: BTreeMap<&str, &Value> = spans.iter().map(|s| (span_id(s), s)).collect();
    let parent = |span: &Value| -> Option<&Value> {
        span["parent_id"]
            .as_str()
            .and_then(|id| by_id.get(id).copied())
    };
    let parent_name = |span: &Value| {
        parent(span)
            .and_then(|p| p["name"].as_str())
            .unwrap_or("<none>")
            .to_owned()
    };

    // One trace: every span is the execution's, with its conversation id.
    let traces: BTreeSet<&str> = spans
        .iter()
        .map(|s| s["context"]["trace_id"].as_str().unwrap())
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
    for span in &spans {
        assert_eq!(
            str_attr(span, "gen_ai.conversation.id"),
            execution_id,
            "{span}"
        );
    }

    // The root: the execution.
    let root: Vec<&Value> = spans.iter().filter(|s| s["parent_id"].is_null()).collect();
    assert_eq!(root.len(), 1, "one root span: {root:?}");
    let root = root[0];
    assert_eq!(root["name"], "invoke_agent nerve");
    assert_eq!(op(root), Some("invoke_agent"));
    assert_eq!(str_attr(root, "gen_ai.provider.name"), "nerve.scripted");
    assert_eq!(str_attr(root, "gen_ai.request.model"), "scripted");
    assert_eq!(str_attr(root, "nerve.termination_reason"), "completed");
    assert_eq!(int_attr(root, "nerve.turns"), turns);
    assert_eq!(
        int_attr(root, "gen_ai.usage.input_tokens"),
        result["input_tokens"].as_u64().unwrap()
    );
    assert_eq!(
        int_attr(root, "gen_ai.usage.output_tokens"),
        result["output_tokens"].as_u64().unwrap()
    );
    assert_eq!(root["status_code"], "OK", "{root}");

    // Turns hang off the execution, numbered 1..=turns.
    let turn_spans: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"].as_str().unwrap().starts_with("turn "))
        .collect();
    let mut numbers: Vec<u64> = turn_spans
        .iter()
        .map(|s| int_attr(s, "nerve.turn"))
        .collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=turns).collect::<Vec<_>>());
    for turn in &turn_spans {
        assert_eq!(parent(turn).map(span_id), Some(span_id(root)), "{turn}");
        assert!(int_attr(turn, "nerve.context.fill_tokens") > 0);
        assert_eq!(int_attr(turn, "nerve.context.capacity_tokens"), 4000);
    }

    // Model calls: one per turn under its turn, summaries under their compaction.
    let chats: Vec<&Value> = spans.iter().filter(|s| op(s) == Some("chat")).collect();
    let mut input_tokens = 0;
    let mut agent_calls = 0;
    for chat in &chats {
        assert_eq!(chat["name"], "chat scripted");
        assert_eq!(str_attr(chat, "gen_ai.provider.name"), "nerve.scripted");
        assert_eq!(str_attr(chat, "gen_ai.request.model"), "scripted");
        assert_eq!(str_attr(chat, "gen_ai.response.model"), "scripted");
        assert!(
            ["tool_calls", "stop"].contains(&str_attr(chat, "gen_ai.response.finish_reasons")),
            "{chat}"
        );
        assert!(int_attr(chat, "gen_ai.usage.output_tokens") > 0, "{chat}");
        input_tokens += int_attr(chat, "gen_ai.usage.input_tokens");
        match str_attr(chat, "nerve.call.purpose") {
            "agent" => {
                agent_calls += 1;
                assert!(parent_name(chat).starts_with("turn "), "{chat}");
                assert_eq!(
                    int_attr(chat, "nerve.turn"),
                    int_attr(parent(chat).unwrap(), "nerve.turn")
                );
            }
            "summary" => assert_eq!(parent_name(chat), "compaction", "{chat}"),
            other => panic!("unexpected purpose {other}"),
        }
    }
    assert_eq!(agent_calls, turns);
    assert_eq!(
        input_tokens,
        result["input_tokens"].as_u64().unwrap(),
        "every call's usage is in a span"
    );

    // Tool calls: one span per call the log shows, under the turn that made it.
    let tools: Vec<&Value> = spans
        .iter()
        .filter(|s| op(s) == Some("execute_tool"))
        .collect();
    let logged: BTreeSet<(String, String)> = tool_calls
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let traced: BTreeSet<(String, String)> = tools
        .iter()
        .map(|s| {
            (
                str_attr(s, "gen_ai.tool.call.id").to_owned(),
                str_attr(s, "gen_ai.tool.name").to_owned(),
            )
        })
        .collect();
    assert_eq!(traced, logged);
    for tool in &tools {
        assert_eq!(
            tool["name"],
            format!("execute_tool {}", str_attr(tool, "gen_ai.tool.name"))
        );
        assert!(parent_name(tool).starts_with("turn "), "{tool}");
        assert_eq!(str_attr(tool, "gen_ai.tool.type"), "function");
    }

    // Compactions: every recorded one has a span with its layer; the offload is under the
    // tool call whose output it archived, the others under a turn.
    let compactions: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "compaction" && attribute(s, "nerve.compaction.layer").is_some())
        .collect();
    assert_eq!(
        compactions.len() as u64,
        result["compactions"].as_u64().unwrap(),
        "{compactions:?}"
    );
    let layers: BTreeSet<&str> = compactions
        .iter()
        .map(|s| str_attr(s, "nerve.compaction.layer"))
        .collect();
    // With budgets that scale with the window (issue 18), this run's compactions are the
    // offloads of its large outputs; each one's span is checked below.
    assert!(layers.contains("offload"), "{layers:?}");
    for compaction in &compactions {
        let expected = if str_attr(compaction, "nerve.compaction.layer") == "offload" {
            "execute_tool "
        } else {
            "turn "
        };
        assert!(
            parent_name(compaction).starts_with(expected),
            "{compaction}"
        );
        assert!(
            int_attr(compaction, "nerve.compaction.tokens_after")
                < int_attr(compaction, "nerve.compaction.tokens_before")
        );
    }

    // Nothing but these, and nothing that leaks.
    for span in &spans {
        let name = span["name"].as_str().unwrap();
        assert!(
            [
                "invoke_agent",
                "turn ",
                "chat ",
                "execute_tool ",
                "compaction"
            ]
            .iter()
            .any(|p| name.starts_with(p)),
            "unexpected span {name}"
        );
    }
    let everything = serde_json::to_string(&spans).unwrap();
    for (what, text) in [
        ("the secret", SECRET),
        ("the task", TASK),
        ("the model's text", MODEL_TEXT),
        ("a tool's output", TOOL_TEXT),
    ] {
        assert!(
            !everything.contains(text),
            "{what} is in the exported spans"
        );
    }
    for span in &spans {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert!(
                attribute(span, key).is_none(),
                "{key} without the opt-in: {span}"
            );
        }
    }
}

fn opted_in_content_arrives_redacted(phoenix: &Phoenix) {
    let project = "nerve-e2e-tracing-content";
    let (result, _) = traced_run(phoenix, project, true);
    let turns = usize::try_from(result["total_turns"].as_u64().unwrap()).unwrap();
    let spans = phoenix.wait_for_spans(project, Duration::from_secs(60), |spans| {
        spans.iter().any(|s| s["parent_id"].is_null())
            && spans
                .iter()
                .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with("turn ")))
                .count()
                == turns
    });
    let everything = serde_json::to_string(&spans).unwrap();
    assert!(
        !everything.contains(SECRET),
        "the secret is in the exported spans"
    );
    let first_chat = spans
        .iter()
        .find(|s| {
            op(s) == Some("chat")
                && int_attr(s, "nerve.turn") == 1
                && str_attr(s, "nerve.call.purpose") == "agent"
        })
        .unwrap();
    let input: Value = serde_json::from_str(str_attr(first_chat, "gen_ai.input.messages")).unwrap();
    assert_eq!(input[1]["role"], "user");
    assert_eq!(input[1]["parts"][0]["content"], TASK);
    let output = str_attr(first_chat, "gen_ai.output.messages");
    assert!(output.contains(MODEL_TEXT), "{output}");
    assert!(output.contains("[REDACTED:OPENAI_API_KEY]"), "{output}");
    let shell = spans
        .iter()
        .find(|s| op(s) == Some("execute_tool") && int_attr(s, "nerve.turn") == 1)
        .unwrap();
    assert!(str_attr(shell, "gen_ai.tool.call.arguments").contains("[REDACTED:OPENAI_API_KEY]"));
    assert!(str_attr(shell, "gen_ai.tool.call.result").contains(TOOL_TEXT));
}
