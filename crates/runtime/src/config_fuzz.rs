//! Fuzz target for the configuration loader (`cargo xtask fuzz config`): whatever the file
//! holds (raw bytes with invalid UTF-8, TOML with every section and key of the format given
//! hostile values: numbers beyond `u64` and `i64`, negative, `nan` and `inf`, wrong types,
//! control characters, deep nesting), `Config::load` answers with a config or one line
//! naming the file, never a panic; and a loaded config's proxy rules build or are refused
//! in one line that never carries the secret the environment gave them.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;

use super::Config;

/// The secret every credential variable holds in these runs.
const SECRET: &str = "fuzz-secret-9d41c7";

/// Values of every type, with the edges a parser or a conversion may trip on.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("-9223372036854775808".to_owned()),
        Just("1e308".to_owned()),
        Just("-0.0".to_owned()),
        Just("nan".to_owned()),
        Just("inf".to_owned()),
        Just("true".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"1GiB\"".to_owned()),
        Just("\"99999999999999999999G\"".to_owned()),
        Just("\"*.example.com\"".to_owned()),
        Just("\"[::1]\"".to_owned()),
        Just("\"/repos/\"".to_owned()),
        Just("\"(unclosed\"".to_owned()),
        Just("\"FUZZ_TOKEN\"".to_owned()),
        Just("\"GET\"".to_owned()),
        Just("\"http\"".to_owned()),
        Just("\"allow\"".to_owned()),
        Just("\"ask\"".to_owned()),
        Just("1979-05-27T07:32:00Z".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "[a-zA-Z0-9 ./*:\\[\\]-]{0,12}".prop_map(|s| format!("{s:?}")),
        any::<String>().prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(4, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..3).prop_map(|kv| {
                let pairs: Vec<String> = kv.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", pairs.join(", "))
            }),
        ]
    })
}

/// The format's sections and their keys (and a few it does not have).
const SECTIONS: &[(&str, &[&str])] = &[
    ("", &["unknown"]),
    (
        "[sandbox]",
        &[
            "image",
            "busybox",
            "memory",
            "pids",
            "cpus",
            "tmp_size",
            "home_size",
            "fallback",
        ],
    ),
    (
        "[proxy]",
        &[
            "connect_timeout_secs",
            "timeout_secs",
            "max_request_bytes",
            "max_response_bytes",
        ],
    ),
    (
        "[[proxy.rules]]",
        &[
            "host",
            "methods",
            "paths",
            "upstream_scheme",
            "upstream_port",
            "allow_private",
        ],
    ),
    (
        "[proxy.rules.credential]",
        &["name", "header", "value", "env", "file"],
    ),
    (
        "[guardrails]",
        &[
            "max_tokens_recoveries",
            "premature_end_retries",
            "max_replans",
            "reserve_tokens",
            "reserve_cost_percent",
        ],
    ),
    (
        "[guardrails.stagnation]",
        &[
            "enabled",
            "window_size",
            "repetition_threshold_percent",
            "max_corrections",
        ],
    ),
    ("[policy]", &["default"]),
    ("[[policy.rules]]", &["tool", "pattern", "action"]),
    (
        "[compaction]",
        &[
            "enabled",
            "soft_percent",
            "hard_percent",
            "keep_recent_turns",
            "mask_digest_chars",
        ],
    ),
    (
        "[[models]]",
        &[
            "name",
            "context_window",
            "max_output_tokens",
            "input_usd_per_million",
            "output_usd_per_million",
        ],
    ),
    ("[providers.anthropic]", &["prompt_caching"]),
];

/// A document: sections in any order, each with some of its keys.
fn document() -> impl Strategy<Value = String> {
    let section = (0..SECTIONS.len()).prop_flat_map(|index| {
        let (header, keys) = SECTIONS[index];
        prop::collection::vec((prop::sample::select(keys), value()), 0..5).prop_map(move |pairs| {
            let mut text = format!("{header}\n");
            for (key, value) in pairs {
                text.push_str(&format!("{key} = {value}\n"));
            }
            text
        })
    });
    prop::collection::vec(section, 0..6).prop_map(|sections| sections.concat())
}

/// Whatever `load` says about `path`: a config, or one line naming the file.
fn load(path: &Path) -> Option<Config> {
    match Config::load(Some(path)) {
        Ok(config) => Some(config),
        Err(failure) => {
            assert_eq!(failure.kind(), crate::ErrorKind::Config, "{failure}");
            assert!(!failure.message().contains('\n'), "{}", failure.message());
            assert!(
                failure.message().contains(&path.display().to_string()),
                "{}",
                failure.message()
            );
            None
        }
    }
}

/// Builds a loaded config's proxy rules with every variable set to [`SECRET`].
fn build_proxy(config: &Config) {
    let lookup = |_: &str| Some(SECRET.to_owned());
    if let Err(failure) = config.proxy.build(&lookup) {
        assert!(!failure.message().contains('\n'), "{}", failure.message());
        assert!(!failure.message().contains(SECRET), "{}", failure.message());
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        ..ProptestConfig::default()
    }
}

fn file() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("nerve-config-fuzz")
            .tempdir()
            .unwrap()
    })
    .path()
}

/// Writes `bytes` to a file of this test thread's own and loads it.
fn load_bytes(bytes: &[u8]) -> Option<Config> {
    let path = file().join(format!("{:?}.toml", std::thread::current().id()));
    std::fs::write(&path, bytes).unwrap();
    load(&path)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_document_loads_or_is_one_line(text in document()) {
        if let Some(config) = load_bytes(text.as_bytes()) {
            build_proxy(&config);
        }
    }

    #[test]
    fn any_bytes_load_or_are_one_line(bytes in prop::collection::vec(any::<u8>(), 0..512), valid in document()) {
        // Raw bytes alone, and a valid document with them spliced in (invalid UTF-8 inside).
        load_bytes(&bytes);
        let mut spliced = valid.into_bytes();
        let at = spliced.len() / 2;
        spliced.splice(at..at, bytes);
        load_bytes(&spliced);
    }

    #[test]
    fn deep_nesting_is_refused_or_loaded(depth in 1usize..5_000, array in any::<bool>(), key in prop::sample::select(&["[sandbox]\nimage", "[proxy]\ntimeout_secs", "[[models]]\nname"][..])) {
        let (open, close) = if array { ("[", "]") } else { ("{ a = ", " }") };
        let text = format!("{key} = {}1{}\n", open.repeat(depth), close.repeat(depth));
        load_bytes(text.as_bytes());
    }
}
