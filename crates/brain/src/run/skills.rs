//! Skills: folders with a `SKILL.md` (front matter `name` and `description`, then a body)
//! and optional files beside it, in the format Claude Code, Codex and goose read. Only the
//! names and descriptions join the system prompt; the model loads a body (or one of its
//! files) with the `skill` tool when a task calls for it, and every load is recorded
//! (`skill_loaded`: what was given, where from, its SHA-256).
//!
//! The front end finds and reads the folders (the user's on the host, the workspace's
//! confined to it) and hands them over as [`Skill`]s; nothing here does I/O. The front
//! matter is read by [`parse`], a small strict reader of the YAML subset skills use (plain,
//! quoted and block scalars; other keys, nested or not, are passed over): the tree has no
//! YAML crate, and a whole YAML parser for two strings would be most of a dependency tree.

use nerve_core::event::{InstructionsSource, SkillLoaded};
use nerve_core::{ToolCall, ToolDefinition};
use schemars::JsonSchema;
use serde::Deserialize;

/// The tool's name.
pub const TOOL: &str = "skill";

/// The most of a body (or of one file) the model is given, in bytes; the rest is cut, and
/// the record says so.
pub const MAX_BODY_BYTES: usize = 32 * 1024;
/// The longest name, in characters (Claude Code's bound).
pub const MAX_NAME_CHARS: usize = 64;
/// The longest description, in characters (Claude Code's bound).
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// One skill as the front end read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// The user's folders or the workspace's.
    pub source: InstructionsSource,
    /// Its `SKILL.md`: relative to the workspace root for a workspace skill, the host path
    /// for the user's.
    pub path: String,
    /// The body after the front matter, whole (the tool cuts it at [`MAX_BODY_BYTES`]).
    pub body: String,
    /// The files beside `SKILL.md` (below its folder), in name order.
    pub files: Vec<SkillFile>,
}

/// A file in a skill's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFile {
    /// Relative to the skill's folder (`scripts/run.sh`).
    pub path: String,
    /// Its text, when it is text and was read; `None` for a binary or unreadable file.
    pub text: Option<String>,
}

/// `skill`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SkillArgs {
    /// The skill's name, as listed in the system prompt.
    pub(crate) name: String,
    /// A file of the skill's folder to read instead of its instructions (a path the
    /// instructions' list of files gives).
    #[serde(default)]
    pub(crate) file: Option<String>,
}

/// The tool's definition, offered when an execution has skills.
pub(crate) fn definition() -> ToolDefinition {
    ToolDefinition {
        name: TOOL.to_owned(),
        description: "Load a skill's instructions (and the list of its files) by name before \
                      doing a task its description matches; with file, read one of its files."
            .to_owned(),
        parameters: crate::run::builtin_tools::schema::<SkillArgs>(),
    }
}

/// The section of the system prompt that lists the skills: names and descriptions only.
pub(crate) fn system_section(skills: &[Skill]) -> String {
    let mut out = String::from(
        "\n\n# Skills\n\nSkills are instructions for particular kinds of task. When a task \
         matches a skill's description, call the `skill` tool with its name to read its \
         instructions before you start.\n",
    );
    for skill in skills {
        out.push_str(&format!("\n- {}: {}", skill.name, skill.description));
    }
    out
}

/// Answers a `skill` call: (content, is_error, the record of what was given).
pub(crate) fn answer(
    skills: &[Skill],
    call: &ToolCall,
    turn: u32,
) -> (String, bool, Option<SkillLoaded>) {
    let args: SkillArgs = match serde_json::from_value(call.arguments.clone()) {
        Ok(args) => args,
        Err(e) => return (format!("invalid arguments for `skill`: {e}"), true, None),
    };
    let Some(skill) = skills.iter().find(|s| s.name == args.name) else {
        let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
        return (
            format!(
                "no skill named `{}`; the skills are: {}",
                args.name,
                names.join(", ")
            ),
            true,
            None,
        );
    };
    let (text, file, content) = match args.file.as_deref() {
        None => {
            let kept = nerve_core::text::clip(&skill.body, MAX_BODY_BYTES);
            let mut content = format!("[Skill {} ({})]\n{}", skill.name, skill.path, kept);
            if kept.len() < skill.body.len() {
                content.push_str("\n[… cut: the instructions are longer than the bound]");
            }
            if !skill.files.is_empty() {
                content.push_str("\n\n[Files of this skill; read one with skill {name, file}:]");
                for one in &skill.files {
                    content.push_str(&format!("\n- {}", one.path));
                }
            }
            (skill.body.as_str(), None, content)
        }
        Some(wanted) => {
            let wanted = wanted.trim_start_matches("./");
            let Some(one) = skill.files.iter().find(|f| f.path == wanted) else {
                return (
                    format!("skill `{}` has no file `{wanted}`", skill.name),
                    true,
                    None,
                );
            };
            let Some(text) = &one.text else {
                return (
                    format!(
                        "`{wanted}` of skill `{}` is not a text file Nerve read",
                        skill.name
                    ),
                    true,
                    None,
                );
            };
            let kept = nerve_core::text::clip(text, MAX_BODY_BYTES);
            let mut content = kept.to_owned();
            if kept.len() < text.len() {
                content.push_str("\n[… cut: the file is longer than the bound]");
            }
            (text.as_str(), Some(one.path.clone()), content)
        }
    };
    let kept = nerve_core::text::clip(text, MAX_BODY_BYTES);
    let digest = ring::digest::digest(&ring::digest::SHA256, kept.as_bytes());
    let loaded = SkillLoaded {
        turn,
        call_id: call.id.clone(),
        name: skill.name.clone(),
        source: skill.source,
        path: skill.path.clone(),
        file,
        sha256: digest.as_ref().iter().map(|b| format!("{b:02x}")).collect(),
        bytes: kept.len() as u64,
        truncated: kept.len() < text.len(),
    };
    (content, false, Some(loaded))
}

/// A `SKILL.md`'s front matter and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub name: String,
    pub description: String,
    pub body: String,
}

/// Reads a `SKILL.md`: a first line `---`, `key: value` lines up to a line `---`, then the
/// body. `name` and `description` are required, once each; other keys (and their nested
/// lines) are passed over. The error says what is wrong, in a phrase.
pub fn parse(text: &str) -> Result<Parsed, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err("it does not start with front matter (a line `---`)".into());
    }
    let mut header: Vec<&str> = Vec::new();
    let mut consumed = first.len();
    let mut closed = false;
    // Ends: `lines` is finite.
    for line in lines.by_ref() {
        consumed += line.len();
        let bare = line.trim_end();
        if bare == "---" || bare == "..." {
            closed = true;
            break;
        }
        header.push(line.trim_end_matches(['\n', '\r']));
    }
    if !closed {
        return Err("its front matter has no closing line `---`".into());
    }
    let mut name = None;
    let mut description = None;
    let mut at = 0;
    // Ends: every pass moves `at` past one key and its continuation lines.
    while at < header.len() {
        let line = header[at];
        let number = at + 2;
        at += 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            return Err(format!(
                "line {number} is indented where a key was expected"
            ));
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!("line {number} is not `key: value`"));
        };
        let key = key.trim_end();
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("line {number} has no valid key"));
        }
        if !(value.is_empty() || value.starts_with([' ', '\t'])) {
            return Err(format!("line {number} is not `key: value`"));
        }
        let start = at;
        // Ends: `at` only grows, up to the header's length.
        while at < header.len()
            && (header[at].trim().is_empty() || header[at].starts_with([' ', '\t']))
        {
            at += 1;
        }
        let slot = match key {
            "name" => &mut name,
            "description" => &mut description,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("`{key}` is given twice"));
        }
        let read = scalar(value.trim(), &header[start..at])
            .map_err(|why| format!("`{key}` (line {number}) {why}"))?;
        *slot = Some(read);
    }
    let name = name.ok_or("its front matter has no `name`")?;
    let description = description.ok_or("its front matter has no `description`")?;
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(format!("`name` must have 1 to {MAX_NAME_CHARS} characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "`name` `{name}` may hold only letters, digits, `-` and `_`"
        ));
    }
    let description = description.trim().to_owned();
    if description.is_empty() {
        return Err("`description` is empty".into());
    }
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "`description` is longer than {MAX_DESCRIPTION_CHARS} characters"
        ));
    }
    Ok(Parsed {
        name,
        description,
        body: text[consumed..].trim_start_matches(['\n', '\r']).to_owned(),
    })
}

/// One scalar value: `first` is what follows the colon, `more` the indented lines after it.
fn scalar(first: &str, more: &[&str]) -> Result<String, String> {
    let block = |folded: bool| {
        let lines: Vec<&str> = more.iter().map(|l| l.trim()).collect();
        let text = if folded {
            lines
                .split(|l| l.is_empty())
                .map(|para| para.join(" "))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            lines.join("\n")
        };
        text.trim().to_owned()
    };
    match first.chars().next() {
        None => Ok(block(true)),
        Some('|') | Some('>')
            if first.len() <= 2 && first[1..].chars().all(|c| "-+".contains(c)) =>
        {
            Ok(block(first.starts_with('>')))
        }
        Some('"') => {
            only_blank(more)?;
            double_quoted(first)
        }
        Some('\'') => {
            only_blank(more)?;
            let inner = first
                .strip_prefix('\'')
                .and_then(|rest| rest.strip_suffix('\''))
                .filter(|inner| !inner.replace("''", "").contains('\''))
                .ok_or("has an unclosed or stray single quote")?;
            Ok(inner.replace("''", "'"))
        }
        Some('[' | '{' | '&' | '*' | '!' | '|' | '>' | '@' | '`') => {
            Err("is not a plain, quoted or block string".into())
        }
        Some(_) => {
            let plain = first
                .split_once(" #")
                .map_or(first, |(value, _)| value)
                .trim();
            let mut text = plain.to_owned();
            for line in more {
                let line = line.trim();
                if !line.is_empty() {
                    text.push(' ');
                    text.push_str(line);
                }
            }
            Ok(text)
        }
    }
}

fn only_blank(more: &[&str]) -> Result<(), String> {
    if more.iter().all(|l| l.trim().is_empty()) {
        Ok(())
    } else {
        Err("is a quoted string followed by indented lines".into())
    }
}

/// A double-quoted string on one line, with YAML's common escapes.
fn double_quoted(value: &str) -> Result<String, String> {
    let mut chars = value.chars();
    chars.next();
    let mut out = String::new();
    // Ends: `chars` is finite.
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let rest: String = chars.collect();
                let rest = rest.trim();
                if rest.is_empty() || rest.starts_with('#') {
                    return Ok(out);
                }
                return Err("has text after its closing quote".into());
            }
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some('/') => out.push('/'),
                Some(other) => return Err(format!("has an unknown escape `\\{other}`")),
                None => break,
            },
            other => out.push(other),
        }
    }
    Err("has an unclosed double quote".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(text: &str, expected: Result<(&str, &str, &str), &str>) {
        let got = parse(text);
        let got = got
            .as_ref()
            .map(|p| (p.name.as_str(), p.description.as_str(), p.body.as_str()))
            .map_err(String::as_str);
        assert_eq!(got, expected, "{text}");
    }

    #[test]
    fn front_matter_as_skills_write_it() {
        check(
            "---\nname: pdf\ndescription: Work with PDF files.\n---\n# PDF\nUse it.\n",
            Ok(("pdf", "Work with PDF files.", "# PDF\nUse it.\n")),
        );
        // Other keys, nested or not, are passed over; comments and quotes are read.
        check(
            "---\r\nname: \"a-b\"\r\nlicense: MIT\r\nmetadata:\r\n  version: 1\r\n  x: [1]\r\n# c\r\nallowed-tools: Read, Grep\r\ndescription: 'it''s here' \r\n---\r\n\r\nbody",
            Ok(("a-b", "it's here", "body")),
        );
        check(
            "---\nname: x # comment\ndescription: >-\n  folded\n  lines\n\n  para\n---\n",
            Ok(("x", "folded lines\npara", "")),
        );
        check(
            "---\nname: x\ndescription: |\n  one\n  two\n---\nb",
            Ok(("x", "one\ntwo", "b")),
        );
        check(
            "---\nname: x\ndescription: plain\n  continued\n---\n",
            Ok(("x", "plain continued", "")),
        );
        check(
            "\u{feff}---\nname: x\ndescription: \"say \\\"hi\\\"\\n\"\n...\nb",
            Ok(("x", "say \"hi\"", "b")),
        );
    }

    #[test]
    fn malformed_front_matter_says_what_is_wrong() {
        check(
            "# just markdown",
            Err("it does not start with front matter (a line `---`)"),
        );
        check(
            "---\nname: x\n",
            Err("its front matter has no closing line `---`"),
        );
        check(
            "---\nname: x\n---\n",
            Err("its front matter has no `description`"),
        );
        check(
            "---\ndescription: d\n---\n",
            Err("its front matter has no `name`"),
        );
        check(
            "---\nname: x\nname: y\ndescription: d\n---\n",
            Err("`name` is given twice"),
        );
        check(
            "---\nname: x\njust words\ndescription: d\n---\n",
            Err("line 3 is not `key: value`"),
        );
        check(
            "---\nname: x\ndescription: \"open\n---\n",
            Err("`description` (line 3) has an unclosed double quote"),
        );
        check(
            "---\nname: has space\ndescription: d\n---\n",
            Err("`name` `has space` may hold only letters, digits, `-` and `_`"),
        );
        check(
            "---\nname: x\ndescription: [a, b]\n---\n",
            Err("`description` (line 3) is not a plain, quoted or block string"),
        );
        check(
            "---\nname: x\ndescription: \"\"\n---\n",
            Err("`description` is empty"),
        );
        check(
            "---\n  name: x\n---\n",
            Err("line 2 is indented where a key was expected"),
        );
        let long = format!("---\nname: x\ndescription: {}\n---\n", "d".repeat(1025));
        check(&long, Err("`description` is longer than 1024 characters"));
    }

    fn skill(files: Vec<SkillFile>) -> Skill {
        Skill {
            name: "pdf".into(),
            description: "PDFs".into(),
            source: InstructionsSource::Workspace,
            path: ".nerve/skills/pdf/SKILL.md".into(),
            body: "Use pdftotext.".into(),
            files,
        }
    }

    fn call(arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: TOOL.into(),
            arguments,
        }
    }

    #[test]
    fn the_tool_gives_a_body_with_its_files_or_one_file() {
        let skills = [skill(vec![
            SkillFile {
                path: "ref.md".into(),
                text: Some("reference".into()),
            },
            SkillFile {
                path: "logo.png".into(),
                text: None,
            },
        ])];
        let (content, is_error, loaded) =
            answer(&skills, &call(serde_json::json!({"name": "pdf"})), 3);
        assert!(!is_error);
        assert_eq!(
            content,
            "[Skill pdf (.nerve/skills/pdf/SKILL.md)]\nUse pdftotext.\n\n[Files of this skill; read one with skill {name, file}:]\n- ref.md\n- logo.png"
        );
        let loaded = loaded.unwrap();
        assert_eq!((loaded.turn, loaded.bytes, loaded.file), (3, 14, None));
        let (content, _, loaded) = answer(
            &skills,
            &call(serde_json::json!({"name": "pdf", "file": "./ref.md"})),
            4,
        );
        assert_eq!(content, "reference");
        assert_eq!(loaded.unwrap().file.as_deref(), Some("ref.md"));
        let (content, is_error, loaded) = answer(
            &skills,
            &call(serde_json::json!({"name": "pdf", "file": "logo.png"})),
            4,
        );
        assert!(is_error && loaded.is_none(), "{content}");
        let (content, is_error, _) = answer(&skills, &call(serde_json::json!({"name": "nope"})), 1);
        assert!(is_error);
        assert_eq!(content, "no skill named `nope`; the skills are: pdf");
        let (_, is_error, _) = answer(&skills, &call(serde_json::json!({"nam": "pdf"})), 1);
        assert!(is_error);
    }

    #[test]
    fn a_long_body_is_cut_and_the_record_says_so() {
        let mut long = skill(Vec::new());
        long.body = "é".repeat(MAX_BODY_BYTES);
        let (content, _, loaded) = answer(&[long], &call(serde_json::json!({"name": "pdf"})), 1);
        let loaded = loaded.unwrap();
        assert!(loaded.truncated);
        assert!(loaded.bytes <= MAX_BODY_BYTES as u64);
        assert!(content.ends_with("longer than the bound]"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any text reads as a skill or as an error, never a panic.
        #[test]
        fn fuzz(text in "(---\n)?([a-z:\"'|> #\\-\n\t]{0,12}){0,12}(---\n)?.{0,20}") {
            let _ = parse(&text);
        }

        /// A name and any one-line description written double-quoted read back as written.
        #[test]
        fn quoted_descriptions_round_trip(
            name in "[a-z0-9][a-z0-9-]{0,20}",
            description in "[^\n\r]{1,80}",
        ) {
            prop_assume!(!description.trim().is_empty());
            let quoted = description.replace('\\', "\\\\").replace('"', "\\\"");
            let text = format!("---\nname: {name}\ndescription: \"{quoted}\"\n---\nbody\n");
            let parsed = parse(&text).unwrap();
            prop_assert_eq!(parsed.name, name);
            prop_assert_eq!(parsed.description, description.trim());
            prop_assert_eq!(parsed.body, "body\n");
        }
    }
}
