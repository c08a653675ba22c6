//! The workspace's `.devcontainer/devcontainer.json`: which image it names or which
//! Dockerfile builds it, and the few other fields that make sense for a sandbox.
//!
//! The file is JSON with comments (`//`, `/* */`) and trailing commas, as the Dev Container
//! specification allows. They are blanked out (comments become spaces, newlines kept) before
//! `serde_json` parses it, so a syntax error is reported at its line and column in the file
//! as written.
//!
//! Honoured: `image`; `build.dockerfile`, `build.context`, `build.args`, `build.target`
//! (the legacy top-level `dockerFile` and `context` too); `containerEnv` (filtered by the
//! credential patterns like every variable that enters the sandbox); `remoteUser` or
//! `containerUser` as the account *name* of the command uid (the uid stays the workspace
//! owner's, so the files the agent writes keep their owner). Everything else
//! (`features`, `forwardPorts`, `mounts`, `runArgs`, `postCreateCommand` and the other
//! lifecycle hooks, `customizations`, `remoteEnv`, ...) is ignored: the sandbox's hardening,
//! mounts and network are Nerve's, and no hook runs outside a tool call.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where the file is looked for, relative to the workspace.
pub const DEVCONTAINER_PATHS: [&str; 2] = [".devcontainer/devcontainer.json", ".devcontainer.json"];

/// What a devcontainer.json asks for, paths resolved against the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevContainer {
    /// The file it was read from.
    pub path: PathBuf,
    pub image: DevImage,
    /// `containerEnv`.
    pub env: BTreeMap<String, String>,
    /// `remoteUser`, else `containerUser`.
    pub user_name: Option<String>,
    /// Top-level fields present that Nerve ignores, sorted.
    pub ignored: Vec<String>,
}

/// The image a devcontainer.json describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevImage {
    /// `image`: a local image by name.
    Named(String),
    /// `build`: a Dockerfile and its context.
    Build(crate::build::DockerfileBuild),
}

/// Why a devcontainer.json cannot be used. Its `Display` is one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct DevContainerError {
    pub path: PathBuf,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    image: Option<String>,
    build: Option<RawBuild>,
    /// The legacy spelling of `build.dockerfile`.
    docker_file: Option<String>,
    /// The legacy spelling of `build.context`.
    context: Option<String>,
    #[serde(default)]
    container_env: BTreeMap<String, String>,
    remote_user: Option<String>,
    container_user: Option<String>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBuild {
    dockerfile: Option<String>,
    context: Option<String>,
    #[serde(default)]
    args: BTreeMap<String, String>,
    target: Option<String>,
}

/// Finds and reads the workspace's devcontainer.json; `Ok(None)` when it has none.
pub fn find(workspace: &Path) -> Result<Option<DevContainer>, DevContainerError> {
    for relative in DEVCONTAINER_PATHS {
        let path = workspace.join(relative);
        match std::fs::read_to_string(&path) {
            Ok(text) => return parse(workspace, &path, &text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DevContainerError {
                    path,
                    message: format!("cannot read it: {e}"),
                });
            }
        }
    }
    Ok(None)
}

/// Parses the text of `path`, a devcontainer.json of `workspace`.
pub fn parse(workspace: &Path, path: &Path, text: &str) -> Result<DevContainer, DevContainerError> {
    let fail = |message: String| DevContainerError {
        path: path.to_path_buf(),
        message,
    };
    let json = strip_jsonc(text);
    let raw: Raw = serde_json::from_str(&json).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "unexpected content",
            serde_json::error::Category::Io
            | serde_json::error::Category::Syntax
            | serde_json::error::Category::Eof => "syntax error",
        };
        // serde_json's message ends with its own "at line L column C".
        fail(format!("{what}: {e}"))
    })?;
    let dir = path.parent().unwrap_or(workspace);
    let inside = |field: &str, value: &str, base: &Path| -> Result<PathBuf, DevContainerError> {
        let joined = normalize(&base.join(value));
        if joined.starts_with(normalize(workspace)) {
            Ok(joined)
        } else {
            Err(fail(format!(
                "`{field}` = `{value}` points outside the workspace"
            )))
        }
    };
    let (dockerfile, context, args, target) = match (&raw.build, &raw.docker_file) {
        (Some(build), _) if build.dockerfile.is_some() => (
            build.dockerfile.clone(),
            build.context.clone(),
            build.args.clone(),
            build.target.clone(),
        ),
        (build, Some(legacy)) => (
            Some(legacy.clone()),
            raw.context.clone(),
            build.as_ref().map(|b| b.args.clone()).unwrap_or_default(),
            build.as_ref().and_then(|b| b.target.clone()),
        ),
        _ => (None, None, BTreeMap::new(), None),
    };
    let image = match (raw.image, dockerfile) {
        (Some(_), Some(_)) => {
            return Err(fail(
                "both `image` and `build.dockerfile` are set; keep one".to_owned(),
            ));
        }
        (Some(image), None) if !image.trim().is_empty() => DevImage::Named(image),
        (Some(_), None) => return Err(fail("`image` is empty".to_owned())),
        (None, Some(dockerfile)) => {
            let context = context.unwrap_or_else(|| ".".to_owned());
            DevImage::Build(crate::build::DockerfileBuild {
                dockerfile: inside("build.dockerfile", &dockerfile, dir)?,
                context: inside("build.context", &context, dir)?,
                args,
                target,
            })
        }
        (None, None) => {
            return Err(fail(
                "names no `image` and no `build.dockerfile` (Docker Compose configurations are not supported)".to_owned(),
            ));
        }
    };
    let mut ignored: Vec<String> = raw
        .rest
        .keys()
        .filter(|key| !matches!(key.as_str(), "name" | "$schema"))
        .cloned()
        .collect();
    ignored.sort();
    Ok(DevContainer {
        path: path.to_path_buf(),
        image,
        env: raw.container_env,
        user_name: raw.remote_user.or(raw.container_user),
        ignored,
    })
}

/// Lexically resolves `.` and `..` (the files need not exist yet to be refused).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other @ (std::path::Component::Prefix(_)
            | std::path::Component::RootDir
            | std::path::Component::Normal(_)) => out.push(other),
        }
    }
    out
}

/// JSON with comments and trailing commas to JSON of the same length and line structure:
/// comments become spaces (their newlines stay), a comma followed only by whitespace or
/// comments before `}` or `]` becomes a space. Strings are left alone. Unterminated
/// comments and strings are left for the JSON parser to report.
pub fn strip_jsonc(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, at: usize| {
        if out[at] != b'\n' && out[at] != b'\r' {
            out[at] = b' ';
        }
    };
    let mut i = 0;
    let mut in_string = false;
    // Where the last comma outside strings is, while only whitespace and comments follow it.
    let mut pending_comma: Option<usize> = None;
    while i < bytes.len() {
        let c = bytes[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match (c, bytes.get(i + 1)) {
            (b'/', Some(b'/')) => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    blank(&mut out, i);
                    i += 1;
                }
                continue;
            }
            (b'/', Some(b'*')) => {
                let Some(end) = text[i + 2..].find("*/").map(|e| i + 2 + e + 2) else {
                    // Unterminated: leave it for the parser to refuse.
                    break;
                };
                for at in i..end {
                    blank(&mut out, at);
                }
                i = end;
                continue;
            }
            (b'"', _) => {
                in_string = true;
                pending_comma = None;
            }
            (b',', _) => pending_comma = Some(i),
            (b'}' | b']', _) => {
                if let Some(comma) = pending_comma.take() {
                    out[comma] = b' ';
                }
            }
            (b' ' | b'\t' | b'\n' | b'\r', _) => {}
            _ => pending_comma = None,
        }
        i += 1;
    }
    // Only ASCII bytes were replaced by ASCII bytes: the text is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: &str) {
        let stripped = strip_jsonc(text);
        assert_eq!(stripped.len(), text.len());
        assert_eq!(stripped.lines().count(), text.lines().count());
        let value: serde_json::Value = serde_json::from_str(&stripped).unwrap();
        let expected: serde_json::Value = serde_json::from_str(expected).unwrap();
        assert_eq!(value, expected, "{stripped}");
    }

    #[test]
    fn comments_and_trailing_commas_are_blanked() {
        check(
            "{\n  // the image\n  \"image\": \"a//b\", /* inline */\n  \"x\": [1, 2,],\n}\n",
            r#"{"image": "a//b", "x": [1, 2]}"#,
        );
        check(
            "{\"s\": \"quote \\\" // not a comment\", // c\n \"t\": \"/* no */\",\n /* last */ }",
            r#"{"s": "quote \" // not a comment", "t": "/* no */"}"#,
        );
        check("[1, // one\n 2, /* two */\n]", "[1, 2]");
    }

    #[test]
    fn a_comma_between_values_stays() {
        // A comma followed by a value is no trailing comma, even after a comment.
        check("[1, /* c */ 2]", "[1, 2]");
        assert!(serde_json::from_str::<serde_json::Value>(&strip_jsonc("[1,, ]")).is_err());
    }

    fn parsed(text: &str) -> Result<DevContainer, DevContainerError> {
        let workspace = Path::new("/w");
        parse(
            workspace,
            &workspace.join(".devcontainer/devcontainer.json"),
            text,
        )
    }

    #[test]
    fn a_dockerfile_build_resolves_against_the_devcontainer_directory() {
        let dev = parsed(
            r#"{
              "name": "py",
              "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"V": "1"}},
              "containerEnv": {"APP_MODE": "test"},
              "remoteUser": "dev",
              "forwardPorts": [8000],
              "postCreateCommand": "pip install -e .",
            }"#,
        )
        .unwrap();
        let DevImage::Build(build) = &dev.image else {
            panic!("{dev:?}")
        };
        assert_eq!(build.dockerfile, Path::new("/w/.devcontainer/Dockerfile"));
        assert_eq!(build.context, Path::new("/w"));
        assert_eq!(build.args.get("V").map(String::as_str), Some("1"));
        assert_eq!(dev.env.get("APP_MODE").map(String::as_str), Some("test"));
        assert_eq!(dev.user_name.as_deref(), Some("dev"));
        assert_eq!(dev.ignored, ["forwardPorts", "postCreateCommand"]);
        let legacy = parsed(r#"{"dockerFile": "../Dockerfile"}"#).unwrap();
        let DevImage::Build(build) = legacy.image else {
            panic!()
        };
        assert_eq!(build.dockerfile, Path::new("/w/Dockerfile"));
        assert_eq!(build.context, Path::new("/w/.devcontainer"));
    }

    #[test]
    fn bad_files_are_one_line_naming_the_file_and_the_place() {
        let error = parsed("{\n  \"image\": \"x\"\n  \"build\": {}\n}").unwrap_err();
        let line = error.to_string();
        assert!(
            line.starts_with("/w/.devcontainer/devcontainer.json: syntax error: ")
                && line.contains("line 3 column 3"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        for (text, expected) in [
            (
                r#"{"image": "a", "build": {"dockerfile": "D"}}"#,
                "both `image`",
            ),
            (r#"{"name": "x"}"#, "names no `image`"),
            (
                r#"{"build": {"dockerfile": "../../D"}}"#,
                "points outside the workspace",
            ),
            (r#"{"image": 3}"#, "unexpected content"),
        ] {
            let line = parsed(text).unwrap_err().to_string();
            assert!(line.contains(expected), "{text}: {line}");
        }
    }

    proptest::proptest! {
        #[test]
        fn stripping_keeps_length_and_lines(text in "[{}\\[\\],:\"/*a\\\\ \n]{0,64}") {
            let stripped = strip_jsonc(&text);
            proptest::prop_assert_eq!(stripped.len(), text.len());
            proptest::prop_assert_eq!(stripped.matches('\n').count(), text.matches('\n').count());
        }
    }
}
