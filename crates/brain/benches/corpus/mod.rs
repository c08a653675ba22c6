//! Text corpora for the provider benchmarks and the token estimate's calibration, split into
//! message-sized samples of four kinds: code, JSON, logs and prose.
//!
//! Code is this workspace's Rust source; prose is the Markdown of this workspace and the
//! READMEs of the crates in the local cargo registry (real English technical writing);
//! JSON and logs are generated from a fixed seed in the shapes agents meet in tool output
//! (API payloads, pretty and compact; tracing, access and build logs). Everything is read
//! in sorted order, so a given checkout and `Cargo.lock` give the same corpus.

#![allow(dead_code, unreachable_pub)] // Each bench or example uses part of this module.

use std::fs;
use std::path::{Path, PathBuf};

/// The kinds of text the estimate is calibrated on.
pub const KINDS: [&str; 4] = ["code", "json", "logs", "prose"];

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files(dir: &Path, keep: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            files(&path, keep, out);
        } else if keep(&path) {
            out.push(path);
        }
    }
}

/// Groups lines into samples of `min..max` bytes.
fn chunk_lines(text: &str, rng: &mut fastrand::Rng, min: usize, max: usize, out: &mut Vec<String>) {
    let mut target = rng.usize(min..max);
    let mut current = String::new();
    for line in text.lines() {
        current.push_str(line);
        current.push('\n');
        if current.len() >= target {
            out.push(std::mem::take(&mut current));
            target = rng.usize(min..max);
        }
    }
    if current.len() >= min / 4 {
        out.push(current);
    }
}

pub fn code() -> Vec<String> {
    let mut paths = Vec::new();
    files(
        &workspace().join("crates"),
        &|p| p.extension().is_some_and(|e| e == "rs"),
        &mut paths,
    );
    let mut rng = fastrand::Rng::with_seed(1);
    let mut out = Vec::new();
    for path in paths {
        if let Ok(text) = fs::read_to_string(&path) {
            chunk_lines(&text, &mut rng, 400, 6_000, &mut out);
        }
    }
    out
}

/// Markdown reduced to its prose: no code blocks, tables, headings, HTML or link lines.
fn prose_of(markdown: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced
            || trimmed.starts_with('|')
            || trimmed.starts_with('#')
            || trimmed.starts_with('<')
            || trimmed.starts_with('[')
            || trimmed.starts_with('!')
            || line.starts_with("    ")
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn registry_readmes() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let Ok(registries) = fs::read_dir(src) else {
        return out;
    };
    let mut registries: Vec<PathBuf> = registries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    registries.sort();
    for registry in registries {
        let Ok(crates) = fs::read_dir(&registry) else {
            continue;
        };
        let mut crates: Vec<PathBuf> = crates.filter_map(|e| e.ok().map(|e| e.path())).collect();
        crates.sort();
        out.extend(
            crates
                .into_iter()
                .map(|c| c.join("README.md"))
                .filter(|p| p.is_file()),
        );
    }
    out
}

pub fn prose() -> Vec<String> {
    let mut paths = Vec::new();
    files(
        &workspace(),
        &|p| p.extension().is_some_and(|e| e == "md"),
        &mut paths,
    );
    paths.extend(registry_readmes());
    let mut rng = fastrand::Rng::with_seed(2);
    let mut out = Vec::new();
    for path in paths {
        if let Ok(text) = fs::read_to_string(&path) {
            chunk_lines(&prose_of(&text), &mut rng, 300, 4_000, &mut out);
        }
    }
    out
}

/// Words to fill generated text with, taken from the prose.
fn vocabulary() -> Vec<String> {
    let mut words: Vec<String> = prose()
        .iter()
        .flat_map(|p| {
            p.split_whitespace()
                .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|w| (2..14).contains(&w.len()) && w.chars().all(|c| c.is_ascii_alphabetic()))
        .collect();
    words.sort();
    words.dedup();
    if words.is_empty() {
        words = ["agent", "tool", "call", "result", "error", "context"]
            .map(String::from)
            .to_vec();
    }
    words
}

fn pick<'a>(rng: &mut fastrand::Rng, items: &'a [String]) -> &'a str {
    &items[rng.usize(..items.len())]
}

fn sentence(rng: &mut fastrand::Rng, words: &[String], lengths: std::ops::Range<usize>) -> String {
    let n = rng.usize(lengths);
    (0..n)
        .map(|_| pick(rng, words))
        .collect::<Vec<_>>()
        .join(" ")
}

fn timestamp(rng: &mut fastrand::Rng) -> String {
    format!(
        "2025-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        rng.u32(1..13),
        rng.u32(1..29),
        rng.u32(0..24),
        rng.u32(0..60),
        rng.u32(0..60),
        rng.u32(0..1000)
    )
}

fn hex(rng: &mut fastrand::Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit(rng.u32(0..16), 16).unwrap_or('0'))
        .collect()
}

pub fn json() -> Vec<String> {
    let words = vocabulary();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut out = Vec::new();
    for i in 0..400 {
        let items: Vec<serde_json::Value> = (0..rng.usize(2..25))
            .map(|_| {
                let name = format!("{}-{}", pick(&mut rng, &words), pick(&mut rng, &words)).to_lowercase();
                serde_json::json!({
                    "id": rng.u64(1..10_000_000),
                    "node_id": format!("R_kgDO{}", hex(&mut rng, 8)),
                    "name": name,
                    "full_name": format!("{}/{}", pick(&mut rng, &words).to_lowercase(), name),
                    "private": rng.bool(),
                    "description": sentence(&mut rng, &words, 3..16),
                    "html_url": format!("https://github.com/{}/{}", pick(&mut rng, &words).to_lowercase(), name),
                    "created_at": timestamp(&mut rng),
                    "size": rng.u64(0..500_000),
                    "stargazers_count": rng.u64(0..90_000),
                    "score": f64::from(rng.u32(0..100_000)) / 1000.0,
                    "topics": (0..rng.usize(0..5)).map(|_| pick(&mut rng, &words).to_lowercase()).collect::<Vec<_>>(),
                    "license": if rng.bool() { serde_json::json!({"key": "apache-2.0", "spdx_id": "Apache-2.0"}) } else { serde_json::Value::Null },
                    "sha": hex(&mut rng, 40),
                })
            })
            .collect();
        let value = serde_json::json!({"total_count": items.len(), "incomplete_results": false, "items": items});
        let text = if i % 2 == 0 {
            serde_json::to_string_pretty(&value)
        } else {
            serde_json::to_string(&value)
        };
        out.push(text.unwrap_or_default());
    }
    let mut snaps = Vec::new();
    files(
        &workspace().join("crates"),
        &|p| p.extension().is_some_and(|e| e == "snap"),
        &mut snaps,
    );
    for path in snaps {
        if let Ok(text) = fs::read_to_string(&path) {
            let body = text.splitn(3, "---").nth(2).unwrap_or(&text);
            chunk_lines(body, &mut rng, 300, 5_000, &mut out);
        }
    }
    out
}

pub fn logs() -> Vec<String> {
    let words = vocabulary();
    let mut rng = fastrand::Rng::with_seed(4);
    let levels = ["TRACE", "DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"];
    let modules = [
        "nerve_brain::engine",
        "nerve_hands::sandbox",
        "hyper::proto::h1",
        "nerve_session::writer",
        "tower_http::trace",
    ];
    let methods = ["GET", "POST", "PUT", "DELETE"];
    let mut out = Vec::new();
    for _ in 0..300 {
        let mut text = String::new();
        let style = rng.u32(0..4);
        for _ in 0..rng.usize(8..60) {
            let line = match style {
                0 => format!(
                    "{} {:>5} {}: {} turn={} tokens={} elapsed={}ms",
                    timestamp(&mut rng),
                    levels[rng.usize(..levels.len())],
                    modules[rng.usize(..modules.len())],
                    sentence(&mut rng, &words, 3..10),
                    rng.u32(1..200),
                    rng.u32(0..200_000),
                    rng.u32(0..30_000)
                ),
                1 => format!(
                    "{}.{}.{}.{} - - [21/Oct/2025:{:02}:{:02}:{:02} +0000] \"{} /api/v1/{}/{}?page={} HTTP/1.1\" {} {} \"-\" \"curl/8.{}.0\"",
                    rng.u8(1..255),
                    rng.u8(0..255),
                    rng.u8(0..255),
                    rng.u8(1..255),
                    rng.u32(0..24),
                    rng.u32(0..60),
                    rng.u32(0..60),
                    methods[rng.usize(..methods.len())],
                    pick(&mut rng, &words).to_lowercase(),
                    rng.u32(1..99_999),
                    rng.u32(1..50),
                    [200, 200, 201, 304, 404, 500][rng.usize(..6)],
                    rng.u32(0..90_000),
                    rng.u32(0..12)
                ),
                2 => format!(
                    "   Compiling {}-{} v{}.{}.{} (/work/{}/crates/{})",
                    pick(&mut rng, &words).to_lowercase(),
                    pick(&mut rng, &words).to_lowercase(),
                    rng.u32(0..3),
                    rng.u32(0..40),
                    rng.u32(0..20),
                    pick(&mut rng, &words).to_lowercase(),
                    pick(&mut rng, &words).to_lowercase()
                ),
                _ => format!(
                    "[{}] {} request_id={} user={} path=/workspace/src/{}.rs line={} msg=\"{}\"",
                    timestamp(&mut rng),
                    levels[rng.usize(..levels.len())].to_lowercase(),
                    hex(&mut rng, 32),
                    pick(&mut rng, &words).to_lowercase(),
                    pick(&mut rng, &words).to_lowercase(),
                    rng.u32(1..2_000),
                    sentence(&mut rng, &words, 2..8)
                ),
            };
            text.push_str(&line);
            text.push('\n');
        }
        out.push(text);
    }
    out
}

pub fn samples(kind: &str) -> Vec<String> {
    match kind {
        "code" => code(),
        "json" => json(),
        "logs" => logs(),
        _ => prose(),
    }
}
