//! Credential guards: task metadata may not carry credentials, and the environment given to
//! a sandbox is stripped of anything that looks like one. Credentials reach upstream APIs
//! only through the host-side auth proxy.

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

use crate::redact::Redactor;

/// Key names that denote a credential in task metadata, matched case-insensitively anywhere
/// in the key (`githubToken`, `DB_PASSWORD`, `x-api-key`).
static CREDENTIAL_KEY: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // A constant pattern; covered by every test of this module.
    Regex::new(r"(?i)token|secret|api[_-]?key|password|bearer")
        .expect("valid credential-key pattern")
});

/// Task metadata holds keys that look like credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CredentialKeyError {
    /// Offending key paths, sorted, e.g. `a.b[0].api_key`.
    pub paths: Vec<String>,
}

impl fmt::Display for CredentialKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "task metadata has credential-like keys ({}): credentials must go through the auth proxy, never into the task",
            self.paths.join(", ")
        )
    }
}

/// Checks every key of `metadata`, at any depth (objects inside arrays too), against the
/// credential patterns. Only keys are checked: values are the redactor's job.
pub fn validate_metadata(metadata: &serde_json::Value) -> Result<(), CredentialKeyError> {
    let mut paths = Vec::new();
    let mut path = String::new();
    collect_credential_keys(metadata, &mut path, &mut paths);
    if paths.is_empty() {
        Ok(())
    } else {
        paths.sort();
        Err(CredentialKeyError { paths })
    }
}

fn collect_credential_keys(value: &serde_json::Value, path: &mut String, found: &mut Vec<String>) {
    let restore = path.len();
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                if CREDENTIAL_KEY.is_match(key) {
                    found.push(path.clone());
                }
                collect_credential_keys(child, path, found);
                path.truncate(restore);
            }
        }
        serde_json::Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                path.push_str(&format!("[{index}]"));
                collect_credential_keys(child, path, found);
                path.truncate(restore);
            }
        }
        serde_json::Value::Null
        | serde_json::Value::Bool(_)
        | serde_json::Value::Number(_)
        | serde_json::Value::String(_) => {}
    }
}

/// Substrings of an environment variable's name (compared upper-case) that mark it as a
/// credential. Deliberately broad: a sandbox loses little when `TOKENIZERS_PARALLELISM`,
/// `GIT_AUTHOR_NAME` or `OAUTHLIB_INSECURE_TRANSPORT` go missing, and a leaked token is
/// not recoverable. Documented in `docs/security.md`.
pub const CREDENTIAL_ENV_PATTERNS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "API_KEY",
    "APIKEY",
    "API-KEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
    "BEARER",
    "AUTH",
    "COOKIE",
    "SESSION",
];

/// Whether an environment variable of this name must not enter a sandbox.
pub fn is_credential_env_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CREDENTIAL_ENV_PATTERNS
        .iter()
        .any(|pattern| upper.contains(pattern))
}

/// Splits `vars` into what may enter a sandbox and the names that were dropped: names that
/// look like credentials, and values that contain a registered secret or a well-known token.
pub fn filter_sandbox_env<I>(vars: I, redactor: &Redactor) -> (Vec<(String, String)>, Vec<String>)
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for (name, value) in vars {
        if is_credential_env_name(&name) || redactor.contains_secret(&value) {
            dropped.push(name);
        } else {
            kept.push((name, value));
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn check(metadata: serde_json::Value, expected: &[&str]) {
        let found = validate_metadata(&metadata)
            .err()
            .map(|e| e.paths)
            .unwrap_or_default();
        assert_eq!(found, expected, "metadata: {metadata}");
    }

    #[test]
    fn validator_table() {
        check(json!({"api_key": "x"}), &["api_key"]);
        check(json!({"a": {"b": [{"API-KEY": 1}]}}), &["a.b[0].API-KEY"]);
        check(json!({"description": "my password is hunter2"}), &[]);
        check(
            json!([{"x": {"githubToken": null}}]),
            &["[0].x.githubToken"],
        );
        check(
            json!({"z_secret": 1, "apikey": 2, "nested": {"Bearer": 3, "Password": {"token": 4}}}),
            &[
                "apikey",
                "nested.Bearer",
                "nested.Password",
                "nested.Password.token",
                "z_secret",
            ],
        );
        check(json!({"name": "deploy", "tags": ["token", "secret"]}), &[]);
        check(json!(null), &[]);
    }

    #[test]
    fn the_error_says_where_credentials_go() {
        let err = validate_metadata(&json!({"b": {"secret": 1}, "a": {"token": 2}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "task metadata has credential-like keys (a.token, b.secret): credentials must go through the auth proxy, never into the task"
        );
    }

    #[test]
    fn env_filter_strips_names_and_values() {
        let redactor = Redactor::new();
        let vars = [
            ("PATH", "/usr/bin"),
            ("GITHUB_TOKEN", "x"),
            ("aws_secret_access_key", "y"),
            ("LANG", "C.UTF-8"),
            ("INNOCENT", "ghp_abcdefghijklmnopqrstuvwxyz0123456789AB"),
            ("OPENAI_API_KEY", "z"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let (kept, dropped) = filter_sandbox_env(vars, &redactor);
        let kept: Vec<_> = kept.into_iter().map(|(k, _)| k).collect();
        assert_eq!(kept, ["PATH", "LANG"]);
        assert_eq!(
            dropped,
            [
                "GITHUB_TOKEN",
                "aws_secret_access_key",
                "INNOCENT",
                "OPENAI_API_KEY"
            ]
        );
    }

    /// Keys drawn from an alphabet that cannot spell any credential pattern.
    fn safe_key() -> impl Strategy<Value = String> {
        "[a-j0-9_]{1,8}"
    }

    fn credential_key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("token"),
            Just("TOKEN"),
            Just("secret"),
            Just("Secret"),
            Just("api_key"),
            Just("api-key"),
            Just("ApiKey"),
            Just("password"),
            Just("PASSWORD"),
            Just("bearer"),
        ]
        .prop_flat_map(|core| (safe_key(), Just(core), safe_key()))
        .prop_map(|(pre, core, post)| format!("{pre}{core}{post}"))
    }

    #[derive(Clone, Debug)]
    enum Step {
        Key(String),
        Index(usize),
    }

    fn safe_doc() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<i64>().prop_map(serde_json::Value::from),
            // Values may say anything, credentials included: only keys are checked.
            prop_oneof![
                Just("password: hunter2".to_owned()),
                "[a-z ]{0,12}".prop_map(String::from)
            ]
            .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(safe_key(), inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Places `{key: 1}` at the end of `path` inside `doc`, building containers as needed,
    /// and returns the expected reported path.
    fn plant(doc: serde_json::Value, path: &[Step], key: &str) -> (serde_json::Value, String) {
        fn go(
            node: serde_json::Value,
            path: &[Step],
            key: &str,
            shown: &mut String,
        ) -> serde_json::Value {
            match path.split_first() {
                None => {
                    let mut map = match node {
                        serde_json::Value::Object(map) => map,
                        serde_json::Value::Null
                        | serde_json::Value::Bool(_)
                        | serde_json::Value::Number(_)
                        | serde_json::Value::String(_)
                        | serde_json::Value::Array(_) => serde_json::Map::new(),
                    };
                    map.insert(key.to_owned(), json!(1));
                    if !shown.is_empty() {
                        shown.push('.');
                    }
                    shown.push_str(key);
                    serde_json::Value::Object(map)
                }
                Some((Step::Key(k), rest)) => {
                    let mut map = match node {
                        serde_json::Value::Object(map) => map,
                        serde_json::Value::Null
                        | serde_json::Value::Bool(_)
                        | serde_json::Value::Number(_)
                        | serde_json::Value::String(_)
                        | serde_json::Value::Array(_) => serde_json::Map::new(),
                    };
                    if !shown.is_empty() {
                        shown.push('.');
                    }
                    shown.push_str(k);
                    let child = map.remove(k).unwrap_or(serde_json::Value::Null);
                    let child = go(child, rest, key, shown);
                    map.insert(k.clone(), child);
                    serde_json::Value::Object(map)
                }
                Some((Step::Index(i), rest)) => {
                    let mut items = match node {
                        serde_json::Value::Array(items) => items,
                        serde_json::Value::Null
                        | serde_json::Value::Bool(_)
                        | serde_json::Value::Number(_)
                        | serde_json::Value::String(_)
                        | serde_json::Value::Object(_) => Vec::new(),
                    };
                    let index = (*i).min(items.len());
                    if index == items.len() {
                        items.push(serde_json::Value::Null);
                    }
                    shown.push_str(&format!("[{index}]"));
                    let child = std::mem::take(&mut items[index]);
                    items[index] = go(child, rest, key, shown);
                    serde_json::Value::Array(items)
                }
            }
        }
        let mut shown = String::new();
        let doc = go(doc, path, key, &mut shown);
        (doc, shown)
    }

    proptest! {
        #[test]
        fn never_flags_a_document_without_credential_keys(doc in safe_doc()) {
            prop_assert!(validate_metadata(&doc).is_ok());
        }

        #[test]
        fn finds_a_credential_key_at_any_depth(
            doc in safe_doc(),
            path in prop::collection::vec(
                prop_oneof![safe_key().prop_map(Step::Key), (0usize..3).prop_map(Step::Index)],
                0..5,
            ),
            key in credential_key(),
        ) {
            let (doc, expected) = plant(doc, &path, &key);
            let err = validate_metadata(&doc).unwrap_err();
            prop_assert_eq!(err.paths, vec![expected]);
        }
    }
}
