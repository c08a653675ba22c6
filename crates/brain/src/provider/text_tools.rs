//! Tool calls written as text, for models whose native tool calling fails (goose calls its
//! version a tool shim; mini-swe-agent and Aider work only this way): the tool list and a
//! documented call format in the system prompt ([`render`]), and the calls read back from
//! an answer's text ([`parse`]). A call read from text is an ordinary [`ToolCall`] in the
//! conversation and the log, with an id starting `text_`, so it goes through the same
//! schema validation, approval, sandbox, logging and replay as a native one; a call that
//! cannot be read becomes a call of [`UNREADABLE`], whose result (an error) shows the
//! expected format.
//!
//! What counts as a call (docs/providers.md, "Tools as text"), and only in an answer
//! without native calls:
//! - the body of a `<tool_call>…</tool_call>` block (the closing tag may be missing at the
//!   end of the answer), which the documented format uses;
//! - a fenced code block (```` ``` ```` or ```` ```json ````) holding one JSON object;
//! - a bare JSON object that begins a line.
//!
//! The object must be `{"name": …, "arguments": {…}}` (`parameters` is taken for
//! `arguments`; arguments given as a JSON string are read from it). Read strictly (a
//! provider on `auto` that has not switched yet), only calls naming a known tool count, so
//! prose or an example never becomes a call; leniently (after the switch, or on `text`),
//! any `<tool_call>` block counts, and a fenced or bare object whose keys are a call's.
//!
//! A block that is not valid JSON is repaired when it can be ([`crate::provider::call_repair`]:
//! unescaped quotes and line breaks inside strings, a missing last brace) and the repair
//! is shaped as a call (a `name` and an `arguments` object); the call then carries what
//! was repaired ([`TextCall::repaired`]), which its `tool_call_started` event records.

use nerve_core::{Message, MessagePart, MessageRole, ToolCall, ToolCallId, ToolDefinition};
use serde::{Deserialize, Serialize};

/// How a provider carries tool calls: `tool_protocol` in its configuration section.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolProtocol {
    /// The API's tool calling only; text is text.
    Native,
    /// The tools in the system prompt and calls read from the answers; no tools are sent
    /// through the API.
    Text,
    /// Native first; switches to text for the rest of the run (an event) when an answer
    /// holds a call written as text naming a known tool and no native call.
    #[default]
    Auto,
}

/// The id prefix of calls read from text.
pub const TEXT_CALL_PREFIX: &str = "text_";

/// The name of a call that was written as text but could not be read. It never reaches a
/// tool: its result is an error showing the expected format.
pub const UNREADABLE: &str = "unreadable_tool_call";

/// One call found in an answer's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TextCall {
    /// The tool it names (`None`: the text names none that could be read).
    pub(crate) name: Option<String>,
    /// Its arguments, or why they could not be read.
    pub(crate) arguments: Result<serde_json::Value, String>,
    /// What was repaired to read it, in a line, when its text was not valid JSON.
    pub(crate) repaired: Option<String>,
}

impl TextCall {
    /// The call as the conversation holds it: the `n`th call read from turn `turn`'s answer.
    pub(crate) fn into_call(self, turn: u32, n: usize) -> ToolCall {
        let id = ToolCallId(format!("{TEXT_CALL_PREFIX}{turn}_{n}"));
        match (self.name, self.arguments) {
            (Some(name), Ok(arguments)) => ToolCall {
                id,
                name,
                arguments,
            },
            (name, Err(error)) => ToolCall {
                id,
                name: UNREADABLE.to_owned(),
                arguments: serde_json::json!({"name": name, "error": error}),
            },
            (None, Ok(_)) => ToolCall {
                id,
                name: UNREADABLE.to_owned(),
                arguments: serde_json::json!({"name": null, "error": "the call names no tool"}),
            },
        }
    }
}

/// The calls written in `text`, in order. `strict`: only calls naming one of `tools`.
pub(crate) fn parse(text: &str, tools: &[ToolDefinition], strict: bool) -> Vec<TextCall> {
    let known = |name: &str| tools.iter().any(|tool| tool.name == name);
    let keys = member_keys(tools);
    let mut calls = Vec::new();
    let blocks = blocks(text, &keys);
    let alone = matches!(blocks.as_slice(), [only] if is_whole_answer(text, only.body));
    for block in blocks {
        let call = read_block(block.body, &keys);
        let counts = match (&call.name, block.tagged) {
            (Some(name), _) if known(name) => true,
            // The whole answer is one well-formed call: meant as a call, whatever it names
            // (an unknown tool gets an error result that lists the tools).
            (Some(_), _) if alone && call.arguments.is_ok() => true,
            (_, true) => !strict,
            (Some(_), false) => !strict && call.arguments.is_ok(),
            (None, false) => false,
        };
        if counts {
            calls.push(call);
        }
    }
    calls
}

/// A candidate block of an answer: a `<tool_call>` body, a fenced block or a bare object.
struct Block<'a> {
    body: &'a str,
    /// Inside `<tool_call>` tags: meant as a call, whatever it holds.
    tagged: bool,
}

const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";
const FENCE: &str = "```";

/// The member names a call may hold: a call's own and the tools' arguments. A repair
/// that cannot tell whether a quote ends a string takes these for the next member.
fn member_keys(tools: &[ToolDefinition]) -> Vec<&str> {
    let mut keys = vec!["name", "arguments", "parameters"];
    for tool in tools {
        if let Some(properties) = tool.parameters["properties"].as_object() {
            keys.extend(properties.keys().map(String::as_str));
        }
    }
    keys
}

/// The candidate blocks of `text`, in order. `keys`: as [`member_keys`].
fn blocks<'a>(text: &'a str, keys: &[&str]) -> Vec<Block<'a>> {
    let mut found = Vec::new();
    let mut rest = text;
    // Ends: each step moves `rest` forward by at least one byte.
    while !rest.is_empty() {
        let tag = rest.find(OPEN_TAG);
        let fence = rest.find(FENCE);
        let bare = bare_object_start(rest);
        let first = [tag, fence, bare].into_iter().flatten().min();
        let Some(at) = first else { break };
        if Some(at) == tag {
            let inner = &rest[at + OPEN_TAG.len()..];
            let (body, after) = match inner.find(CLOSE_TAG) {
                Some(end) => (&inner[..end], &inner[end + CLOSE_TAG.len()..]),
                None => (inner, ""),
            };
            let body = unfenced(body.trim());
            match objects(body) {
                Some(objects) => {
                    found.extend(objects.into_iter().map(|body| Block { body, tagged: true }))
                }
                None => found.push(Block { body, tagged: true }),
            }
            rest = after;
        } else if Some(at) == fence {
            let inner = &rest[at + FENCE.len()..];
            // The info string (`json`, `tool_call`, ...) runs to the end of the line.
            let content = inner.find('\n').map_or("", |n| &inner[n + 1..]);
            let (body, after) = match content.find(FENCE) {
                Some(end) => (&content[..end], &content[end + FENCE.len()..]),
                None => (content, ""),
            };
            let body = body.trim();
            if body.starts_with('{') {
                match objects(body) {
                    Some(objects) => found.extend(objects.into_iter().map(|body| Block {
                        body,
                        tagged: false,
                    })),
                    None => found.push(Block {
                        body,
                        tagged: false,
                    }),
                }
            }
            rest = after;
        } else {
            let object = &rest[at..];
            // An object that is not JSON ends where its repair ends, else with the text.
            let end = json_object_end(object)
                .or_else(|| {
                    crate::provider::call_repair::repair(object, keys, false).map(|r| r.end)
                })
                .unwrap_or(object.len());
            found.push(Block {
                body: &object[..end],
                tagged: false,
            });
            rest = &object[end.max(1)..];
        }
    }
    found
}

/// Where the first line of `text` that begins (after spaces) with `{"` starts.
fn bare_object_start(text: &str) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("{\"") || trimmed.starts_with("{ \"") {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// The length of the JSON object that `text` starts with, when it is one.
fn json_object_end(text: &str) -> Option<usize> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(serde_json::Value::Object(_))) => Some(values.byte_offset()),
        Some(Ok(_) | Err(_)) | None => None,
    }
}

/// The JSON objects `body` holds one after another (separated by white space or a comma),
/// when it holds two or more and nothing else: Qwen2.5-Coder-1.5B writes a whole plan as
/// one fenced block of three calls. `None` otherwise (one object, or anything that is not
/// such a sequence: the body is then read whole, as before).
fn objects(body: &str) -> Option<Vec<&str>> {
    let mut found = Vec::new();
    let mut rest = body.trim_start();
    // Ends: each pass consumes one whole object (at least the two bytes `{}`) or returns.
    while !rest.is_empty() {
        let end = json_object_end(rest)?;
        found.push(&rest[..end]);
        rest = rest[end..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    (found.len() > 1).then_some(found)
}

/// Whether `body` is all of `text`: nothing around it but white space, its `<tool_call>`
/// tags and a code fence.
fn is_whole_answer(text: &str, body: &str) -> bool {
    let mut whole = text.trim();
    if let Some(inner) = whole.strip_prefix(OPEN_TAG) {
        let inner = inner.trim();
        whole = inner.strip_suffix(CLOSE_TAG).unwrap_or(inner).trim();
    }
    unfenced(whole) == body.trim()
}

/// `body` without a code fence around it (a model may fence the JSON inside the tags).
fn unfenced(body: &str) -> &str {
    let Some(inner) = body.strip_prefix(FENCE) else {
        return body;
    };
    let inner = inner.find('\n').map_or("", |n| &inner[n + 1..]);
    inner.strip_suffix(FENCE).unwrap_or(inner).trim()
}

/// How an unreadable call's error begins when its text is not JSON.
const NOT_JSON: &str = "the call is not valid JSON";

/// Reads one block as a call; one that is not JSON, repaired when the repair is shaped as
/// a call. `keys`: as [`member_keys`].
fn read_block(body: &str, keys: &[&str]) -> TextCall {
    let (value, repaired) = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(value) => (value, None),
        Err(error) => match crate::provider::call_repair::repair(body, keys, true)
            .filter(|repaired| is_call(&repaired.value))
        {
            Some(repaired) => (repaired.value, Some(repaired.what)),
            None => {
                return TextCall {
                    name: named_in(body),
                    arguments: Err(format!("{NOT_JSON} ({error})")),
                    repaired: None,
                };
            }
        },
    };
    let Some(object) = value.as_object() else {
        return TextCall {
            name: None,
            arguments: Err("the call is not a JSON object".into()),
            repaired,
        };
    };
    let name = object
        .get("name")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let arguments = match object.get("arguments").or_else(|| object.get("parameters")) {
        Some(serde_json::Value::String(raw)) => serde_json::from_str(raw)
            .map_err(|error| format!("its `arguments` string is not a JSON object ({error})")),
        Some(arguments @ serde_json::Value::Object(_)) => Ok(arguments.clone()),
        None if name.is_some() && object.len() == 1 => Ok(serde_json::json!({})),
        Some(_) | None => Err("it has no `arguments` object".into()),
    };
    TextCall {
        name,
        arguments,
        repaired,
    }
}

/// Whether `value` is shaped as a call: a `name` string and an `arguments` (or
/// `parameters`) object.
fn is_call(value: &serde_json::Value) -> bool {
    value["name"].is_string()
        && value
            .get("arguments")
            .or_else(|| value.get("parameters"))
            .is_some_and(serde_json::Value::is_object)
}

/// The tool named in text that is not valid JSON: what follows `"name"` and a colon.
fn named_in(body: &str) -> Option<String> {
    let after = &body[body.find("\"name\"")? + "\"name\"".len()..];
    let after = after.trim_start().strip_prefix(':')?.trim_start();
    let name = after.strip_prefix('"')?;
    Some(name[..name.find('"')?].to_owned())
}

/// The documented call format, with an example call of `tools`' first tool.
fn format_example(tools: &[ToolDefinition]) -> String {
    let example = tools.iter().find(|t| t.name == "read_file").map_or_else(
        || {
            let name = tools.first().map_or("TOOL_NAME", |t| t.name.as_str());
            format!("{{\"name\": \"{name}\", \"arguments\": {{}}}}")
        },
        |_| r#"{"name": "read_file", "arguments": {"path": "README.md"}}"#.to_owned(),
    );
    format!("{OPEN_TAG}\n{example}\n{CLOSE_TAG}")
}

/// The system prompt's section on the tools: each tool's signature and description, and
/// the call format.
pub(crate) fn instructions(tools: &[ToolDefinition]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou can use these tools. Each line gives a tool's name, its arguments as a \
         JSON object (`?` marks an optional argument) and what it does:\n",
    );
    for tool in tools {
        text.push_str(&format!(
            "- {}: {}\n",
            tool.signature(),
            tool.description.replace('\n', " ")
        ));
    }
    text.push_str(&format!(
        "\nTo call a tool, write the call like this, with the arguments as a JSON object, and \
         stop writing; the result comes back in the next message:\n{}\n\
         You may write several calls one after another. When the task is done, answer in \
         plain text without a call.",
        format_example(tools)
    ));
    text
}

/// What the model is told about a call it wrote that could not be read.
pub(crate) fn unreadable_result(call: &ToolCall, tools: &[ToolDefinition]) -> String {
    let error = call.arguments["error"]
        .as_str()
        .unwrap_or("it could not be read");
    let named = call.arguments["name"]
        .as_str()
        .and_then(|name| tools.iter().find(|t| t.name == name));
    let expected = named.map_or_else(String::new, |tool| {
        format!(" The arguments of `{}`: {}.", tool.name, tool.signature())
    });
    // Seen with Qwen2.5-Coder-1.5B: a file's text put in a JSON string as it is, its
    // docstring quotes and line breaks unescaped.
    let escaping = if error.starts_with(NOT_JSON) {
        " Inside a JSON string, write a double quote as \\\" and a line break as \\n."
    } else {
        ""
    };
    format!(
        "[Nerve] Your tool call was not run: {error}. Write each call exactly in this form, \
         with valid JSON:\n{}{expected}{escaping}",
        format_example(tools)
    )
}

/// The conversation as a model without native tools is shown it: the tools and the call
/// format after the first system message; native calls (made before a switch) written
/// out in the documented format after the answer's text, calls read from text left in
/// the text they came from; tool results as user messages in `<tool_response>` tags
/// (consecutive results in one message). The same conversation always renders the same,
/// so the prompt prefix stays put between turns.
pub(crate) fn render(messages: &[Message], tools: &[ToolDefinition]) -> Vec<Message> {
    let mut rendered: Vec<Message> = Vec::with_capacity(messages.len());
    let mut instructed = false;
    for message in messages {
        match message.role {
            MessageRole::System if !instructed => {
                instructed = true;
                let mut system = message.clone();
                // Text parts are joined with a line break: this one follows a blank line.
                system.parts.push(MessagePart::Text {
                    text: format!("\n{}", instructions(tools)),
                });
                rendered.push(system);
            }
            MessageRole::System | MessageRole::User => rendered.push(message.clone()),
            MessageRole::Assistant => rendered.push(assistant(message)),
            MessageRole::Tool => {
                let results = tool_responses(message);
                match rendered.last_mut() {
                    Some(last) if last.role == MessageRole::User && is_responses(last) => {
                        last.parts.push(MessagePart::Text { text: results });
                    }
                    Some(_) | None => rendered.push(Message {
                        role: MessageRole::User,
                        parts: vec![MessagePart::Text { text: results }],
                        pinned: false,
                    }),
                }
            }
        }
    }
    rendered
}

/// An assistant message with its calls as text.
fn assistant(message: &Message) -> Message {
    let mut parts = Vec::with_capacity(message.parts.len());
    let mut written = Vec::new();
    for part in &message.parts {
        match part {
            MessagePart::ToolCall(call) if call.id.0.starts_with(TEXT_CALL_PREFIX) => {}
            MessagePart::ToolCall(call) => written.push(format!(
                "{OPEN_TAG}\n{{\"name\": {}, \"arguments\": {}}}\n{CLOSE_TAG}",
                serde_json::Value::from(call.name.as_str()),
                call.arguments
            )),
            MessagePart::Text { .. }
            | MessagePart::Thinking { .. }
            | MessagePart::ToolResult(_)
            | MessagePart::CompactionSummary { .. } => parts.push(part.clone()),
        }
    }
    if !written.is_empty() {
        parts.push(MessagePart::Text {
            text: written.join("\n"),
        });
    }
    Message {
        role: MessageRole::Assistant,
        parts,
        pinned: message.pinned,
    }
}

const RESPONSE_OPEN: &str = "<tool_response>";

/// A tool message's results in `<tool_response>` tags.
fn tool_responses(message: &Message) -> String {
    let mut text = Vec::new();
    for part in &message.parts {
        match part {
            MessagePart::ToolResult(result) => {
                text.push(format!(
                    "{RESPONSE_OPEN}\n{}\n</tool_response>",
                    result.content
                ));
            }
            MessagePart::Text { text: note } => text.push(note.clone()),
            MessagePart::ToolCall(_)
            | MessagePart::Thinking { .. }
            | MessagePart::CompactionSummary { .. } => {}
        }
    }
    text.join("\n")
}

/// Whether `message` is one [`render`] made of tool results.
fn is_responses(message: &Message) -> bool {
    matches!(message.parts.first(), Some(MessagePart::Text { text }) if text.starts_with(RESPONSE_OPEN))
}

/// Whether the conversation holds a call read from text: a resumed run on `auto` goes on
/// reading calls from text.
pub(crate) fn used(messages: &[Message]) -> bool {
    messages
        .iter()
        .flat_map(Message::tool_calls)
        .any(|call| call.id.0.starts_with(TEXT_CALL_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolDefinition> {
        ["shell", "read_file", "edit_file"]
            .map(|name| ToolDefinition {
                name: name.into(),
                description: format!("the {name} tool"),
                parameters: serde_json::json!({"type": "object", "required": ["path"],
                    "properties": {"path": {"type": "string"}}}),
            })
            .to_vec()
    }

    /// What `text` yields, read strictly and leniently, as `name(arguments)` or `!name: error`.
    fn check(text: &str, strict: &[&str], lenient: &[&str]) {
        let show = |calls: Vec<TextCall>| -> Vec<String> {
            calls
                .into_iter()
                .map(|call| match call.arguments {
                    Ok(arguments) => format!("{}({arguments})", call.name.unwrap_or_default()),
                    Err(error) => format!("!{}: {error}", call.name.unwrap_or_default()),
                })
                .collect()
        };
        assert_eq!(show(parse(text, &tools(), true)), strict, "strict: {text}");
        assert_eq!(
            show(parse(text, &tools(), false)),
            lenient,
            "lenient: {text}"
        );
    }

    #[test]
    fn tagged_fenced_and_bare_calls_are_read() {
        check(
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
            &[r#"shell({"command":"ls"})"#],
            &[r#"shell({"command":"ls"})"#],
        );
        check(
            "I will read it.\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n```",
            &[r#"read_file({"path":"a.py"})"#],
            &[r#"read_file({"path":"a.py"})"#],
        );
        check(
            "{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"b\\\"}\"}\nthen more",
            &[r#"read_file({"path":"b"})"#],
            &[r#"read_file({"path":"b"})"#],
        );
        // Two calls, the second without its closing tag at the end of the answer.
        check(
            "<tool_call>{\"name\": \"shell\", \"arguments\": {}}</tool_call>\n<tool_call>\n```json\n{\"name\": \"read_file\", \"parameters\": {\"path\": \"x\"}}\n```",
            &["shell({})", r#"read_file({"path":"x"})"#],
            &["shell({})", r#"read_file({"path":"x"})"#],
        );
    }

    #[test]
    fn a_block_of_several_objects_is_several_calls() {
        // Qwen2.5-Coder-1.5B's answer, byte for byte (through llama-server, not streamed,
        // second run of tests/e2e/real.rs's work run): three calls in one fenced block.
        let answer = "```json\n{\n  \"name\": \"read_file\",\n  \"arguments\": {\n    \"path\": \"notes.txt\"\n  }\n}\n{\n  \"name\": \"edit_file\",\n  \"arguments\": {\n    \"path\": \"notes.txt\",\n    \"old_text\": \"pears\",\n    \"new_text\": \"plums\"\n  }\n}\n{\n  \"name\": \"shell\",\n  \"arguments\": {\n    \"command\": \"cat notes.txt\"\n  }\n}\n```";
        let calls = [
            r#"read_file({"path":"notes.txt"})"#,
            r#"edit_file({"path":"notes.txt","old_text":"pears","new_text":"plums"})"#,
            r#"shell({"command":"cat notes.txt"})"#,
        ];
        check(answer, &calls, &calls);
        // Inside tags, and separated by commas.
        check(
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": {}},\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>",
            &["shell({})", r#"read_file({"path":"a"})"#],
            &["shell({})", r#"read_file({"path":"a"})"#],
        );
        // Not a clean sequence (text after the first object): read whole, as before.
        check(
            "```json\n{\"name\": \"shell\", \"arguments\": {}}\nand then\n```",
            &["!shell: the call is not valid JSON (trailing characters at line 2 column 1)"],
            &["!shell: the call is not valid JSON (trailing characters at line 2 column 1)"],
        );
    }

    #[test]
    fn prose_examples_and_unknown_tools_count_only_as_they_should() {
        // JSON in prose, mid-line, and JSON that is not a call: never a call.
        check(
            "Use {\"name\": \"shell\", \"arguments\": {}} to run things.\n```json\n{\"version\": 2}\n```\n{\"a\": 1}",
            &[],
            &[],
        );
        // A call of a tool that does not exist (it gets "unknown tool"): only leniently,
        // unless it is the whole answer and well formed.
        check(
            "Run it like this:\n```json\n{\"name\": \"run_tests\", \"arguments\": {}}\n```",
            &[],
            &["run_tests({})"],
        );
        check(
            "<tool_call>\n{\"name\": \"run_tests\"}\n</tool_call> and then read it",
            &[],
            &["run_tests({})"],
        );
        // Qwen2.5-Coder-1.5B's whole first answer on eval task 09: `python3` is no tool.
        let alone = "```json\n{\n  \"name\": \"python3\",\n  \"arguments\": {\n    \"command\": \"python3 -m pytest -q\",\n    \"timeout_secs\": 60,\n    \"workdir\": null\n  }\n}\n```";
        let read =
            r#"python3({"command":"python3 -m pytest -q","timeout_secs":60,"workdir":null})"#;
        check(alone, &[read], &[read]);
        check(
            "<tool_call>\n{\"name\": \"run_tests\", \"arguments\": {}}\n</tool_call>",
            &["run_tests({})"],
            &["run_tests({})"],
        );
        check(
            "  {\"name\": \"run_tests\", \"arguments\": {}}\n",
            &["run_tests({})"],
            &["run_tests({})"],
        );
        // Alone but not a well-formed call: not a call of an unknown tool.
        check(
            "```json\n{\"name\": \"run_tests\", \"arguments\": [1]}\n```",
            &[],
            &[],
        );
    }

    #[test]
    fn unreadable_calls_are_reported_with_the_tool_they_name() {
        // The embedded Qwen2.5 template's bug: doubled braces.
        check(
            "<tool_call>\n{{\"name\": \"shell\", \"arguments\": {\"command\": \"ls\"}}}\n</tool_call>",
            &["!shell: the call is not valid JSON (key must be a string at line 1 column 2)"],
            &["!shell: the call is not valid JSON (key must be a string at line 1 column 2)"],
        );
        check(
            "<tool_call>\nshell ls\n</tool_call>",
            &[],
            &["!: the call is not valid JSON (expected value at line 1 column 1)"],
        );
        check(
            "```json\n{\"name\": \"shell\", \"arguments\": [\"ls\"]}\n```",
            &["!shell: it has no `arguments` object"],
            &["!shell: it has no `arguments` object"],
        );
    }

    /// The one call `text` yields read `strict`ly: its name, arguments and repair.
    fn one(text: &str, strict: bool) -> (String, serde_json::Value, Option<String>) {
        let mut calls = parse(text, &tools(), strict);
        assert_eq!(calls.len(), 1, "{text}: {calls:?}");
        let call = calls.remove(0);
        (
            call.name.unwrap_or_default(),
            call.arguments.unwrap(),
            call.repaired,
        )
    }

    #[test]
    fn broken_calls_are_repaired_when_the_repair_is_a_call() {
        // As Qwen2.5-Coder-1.5B writes a file: the docstring's quotes unescaped, the line
        // breaks raw.
        let fenced = "I will fix the import.\n```json\n{\n  \"name\": \"edit_file\",\n  \"arguments\": {\n    \"path\": \"geometry.py\",\n    \"old_text\": \"def distance(a, b):\",\n    \"new_text\": \"import math\n\ndef distance(a, b):\n    \"\"\"The distance.\"\"\"\"\n  }\n}\n```";
        for strict in [true, false] {
            let (name, arguments, repaired) = one(fenced, strict);
            assert_eq!(name, "edit_file");
            assert_eq!(
                arguments["new_text"],
                "import math\n\ndef distance(a, b):\n    \"\"\"The distance.\"\"\""
            );
            assert_eq!(arguments["old_text"], "def distance(a, b):");
            assert_eq!(
                repaired.as_deref(),
                Some(
                    "escaped 6 double quotes and 3 control characters (line breaks or tabs) inside strings"
                )
            );
        }
        // A raw line break in a tagged call.
        let (name, arguments, repaired) = one(
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"cd src\nls\"}}\n</tool_call>",
            true,
        );
        assert_eq!(
            (name.as_str(), &arguments["command"]),
            ("shell", &"cd src\nls".into())
        );
        assert!(repaired.is_some());
        // A bare call missing its last brace at the end of the answer.
        let (name, arguments, repaired) = one(
            "Let me look.\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}",
            true,
        );
        assert_eq!(
            (name.as_str(), arguments),
            ("read_file", serde_json::json!({"path": "a.py"}))
        );
        assert_eq!(
            repaired.as_deref(),
            Some("added 1 closing bracket at the end")
        );
        // A bare broken call followed by prose and a second call: both are read.
        let calls = parse(
            "{\"name\": \"shell\", \"arguments\": {\"command\": \"echo \"hi\"\"}}\nand then\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"b\"}}",
            &tools(),
            true,
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(
            calls[0].arguments,
            Ok(serde_json::json!({"command": "echo \"hi\""}))
        );
        assert_eq!(calls[1].repaired, None);
        // Valid calls are not repaired.
        assert_eq!(
            one(
                "```json\n{\"name\": \"shell\", \"arguments\": {}}\n```",
                true
            )
            .2,
            None
        );
    }

    #[test]
    fn prose_examples_and_what_cannot_be_repaired_stay_as_they_were() {
        // Prose with braces and a broken call mid-sentence: never a call.
        check(
            "Write {\"name\": \"shell\", \"arguments\": {\"command\": \"ls\n\"} like this; a set is {1, 2}.",
            &[],
            &[],
        );
        // An example naming a tool that does not exist, broken: not when reading strictly.
        check(
            "For example:\n```json\n{\"name\": \"run_tests\", \"arguments\": {\"filter\": \"a\"b\"}}\n```",
            &[],
            &[r#"run_tests({"filter":"a\"b"})"#],
        );
        // Repaired into something that is not a call: unreadable as before.
        check(
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": \"ls\n\"}\n</tool_call>",
            &[
                "!shell: the call is not valid JSON (control character (\\u0000-\\u001F) found while parsing a string at line 2 column 0)",
            ],
            &[
                "!shell: the call is not valid JSON (control character (\\u0000-\\u001F) found while parsing a string at line 2 column 0)",
            ],
        );
        // Cut off inside a string: unreadable as before.
        check(
            "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"ls",
            &[
                "!shell: the call is not valid JSON (EOF while parsing a string at line 1 column 46)",
            ],
            &[
                "!shell: the call is not valid JSON (EOF while parsing a string at line 1 column 46)",
            ],
        );
    }

    #[test]
    fn calls_become_tool_calls_with_text_ids() {
        let calls: Vec<ToolCall> = parse(
            "<tool_call>{\"name\": \"shell\", \"arguments\": {\"command\": \"ls\"}}</tool_call><tool_call>{{</tool_call>",
            &tools(),
            false,
        )
        .into_iter()
        .enumerate()
        .map(|(n, call)| call.into_call(4, n))
        .collect();
        assert_eq!(calls[0].id.0, "text_4_0");
        assert_eq!(calls[0].name, "shell");
        assert_eq!(calls[1].name, UNREADABLE);
        assert!(used(&[Message {
            role: MessageRole::Assistant,
            parts: calls.into_iter().map(MessagePart::ToolCall).collect(),
            pinned: false,
        }]));
        let told = unreadable_result(
            &ToolCall {
                id: ToolCallId("text_1_0".into()),
                name: UNREADABLE.into(),
                arguments: serde_json::json!({"name": "read_file", "error": "the call is not valid JSON (x)"}),
            },
            &tools(),
        );
        assert_eq!(
            told,
            "[Nerve] Your tool call was not run: the call is not valid JSON (x). Write each call exactly in this form, with valid JSON:\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"README.md\"}}\n</tool_call> The arguments of `read_file`: read_file {path: string}. Inside a JSON string, write a double quote as \\\" and a line break as \\n."
        );
    }

    #[test]
    fn the_conversation_renders_calls_and_results_as_text() {
        let native = ToolCall {
            id: ToolCallId("call_1".into()),
            name: "shell".into(),
            arguments: serde_json::json!({"command": "ls"}),
        };
        let from_text = ToolCall {
            id: ToolCallId("text_2_0".into()),
            name: "read_file".into(),
            arguments: serde_json::json!({"path": "a"}),
        };
        let result = |id: &str, content: &str| {
            Message::tool_result(nerve_core::ToolResult {
                call_id: ToolCallId(id.into()),
                name: "x".into(),
                content: content.into(),
                is_error: false,
            })
        };
        let messages = vec![
            Message::system("You are Nerve."),
            Message::user("fix it"),
            Message {
                role: MessageRole::Assistant,
                parts: vec![MessagePart::ToolCall(native)],
                pinned: false,
            },
            result("call_1", "a.py"),
            Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Text {
                        text: "<tool_call>{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}</tool_call>".into(),
                    },
                    MessagePart::ToolCall(from_text),
                ],
                pinned: false,
            },
            result("text_2_0", "print(1)"),
            result("text_2_1", "second"),
        ];
        let rendered = render(&messages, &tools());
        let shown: Vec<(MessageRole, String)> = rendered
            .iter()
            .map(|m| (m.role, m.text_content()))
            .collect();
        insta::assert_debug_snapshot!(shown);
        assert!(rendered.iter().all(|m| m.tool_calls().next().is_none()));
        assert_eq!(render(&messages, &tools()), rendered, "the same every time");
    }
}
