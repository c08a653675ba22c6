//! The layout of Nerve's crates, read from their sources: no crate's modules import each
//! other in a circle, and brain's folders sit on their floors (its parts below its loops
//! and its engine).
//!
//! A module is a source file (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`). Every
//! `crate::` and `super::` path in a file's library code (before its test module, outside
//! `//` comments) is an edge to the deepest module the path names. Left out:
//! - edges between a module and its ancestors: a folder's `mod.rs` (or `lib.rs`) declares
//!   and re-exports its children, and a child may use what its folder re-exports;
//! - test-only modules (`#[cfg(test)] mod name;` where a module declares its children),
//!   and each file's own test module: tests drive a crate from the top by design, and
//!   none of them is compiled into the library.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file: its module path (`a::b`, the crate root `""`) and its text.
struct Module {
    path: String,
    source: String,
}

/// The lines of `source` before its test module, without `//` comments.
fn library_code(source: &str) -> impl Iterator<Item = &str> {
    source
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
}

/// The module paths that a file's declarations mark test-only.
fn test_only_children(module: &Module) -> Vec<String> {
    let mut children = Vec::new();
    let mut after_cfg_test = false;
    for line in module.source.lines().map(str::trim) {
        if line == "#[cfg(test)]" {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test
            && let Some(name) = line
                .trim_start_matches("pub ")
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
        {
            children.push(join(&module.path, name));
        }
        after_cfg_test = false;
    }
    children
}

fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{parent}::{child}")
    }
}

fn parent(path: &str) -> &str {
    path.rsplit_once("::").map_or("", |(parent, _)| parent)
}

fn is_ancestor(ancestor: &str, of: &str) -> bool {
    ancestor.is_empty() || of.starts_with(&format!("{ancestor}::"))
}

/// The path segments after each `crate::` or `super::` in `line`, as absolute module
/// paths' candidates (`use crate::{a, b::C}` names several at once).
fn named_paths(line: &str, from: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = line;
    loop {
        let crate_at = rest.find("crate::");
        let super_at = rest.find("super::");
        let (at, mut base): (usize, Vec<String>) = match (crate_at, super_at) {
            (None, None) => return found,
            (Some(c), Some(s)) if s < c => (s, Vec::new()),
            (Some(c), _) => (c, Vec::new()),
            (None, Some(s)) => (s, Vec::new()),
        };
        let is_super = rest[at..].starts_with("super::");
        rest = &rest[at..];
        if is_super {
            // A chain of `super::super::` climbs once a link.
            let mut module = from;
            // Ends: each pass strips one `super::` from `rest`.
            while let Some(after) = rest.strip_prefix("super::") {
                module = parent(module);
                rest = after;
            }
            base = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
        } else {
            rest = &rest["crate::".len()..];
        }
        let items: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end].split(',').collect()
        } else {
            vec![rest]
        };
        for item in items {
            let mut path = base.clone();
            path.extend(
                item.trim()
                    .split("::")
                    .map(|segment| {
                        segment
                            .split(|c: char| !c.is_alphanumeric() && c != '_')
                            .next()
                            .unwrap_or("")
                    })
                    .take_while(|segment| !segment.is_empty())
                    .map(str::to_owned),
            );
            found.push(path);
        }
    }
}

/// The deepest module of `modules` that `path` names.
fn resolve(path: &[String], modules: &BTreeSet<String>) -> String {
    (0..=path.len())
        .rev()
        .map(|len| path[..len].join("::"))
        .find(|candidate| candidate.is_empty() || modules.contains(candidate))
        .unwrap_or_default()
}

fn graph(modules: &[Module]) -> Graph {
    let test_only: BTreeSet<String> = modules.iter().flat_map(test_only_children).collect();
    let library: Vec<&Module> = modules
        .iter()
        .filter(|m| {
            !test_only
                .iter()
                .any(|t| *t == m.path || is_ancestor(t, &m.path))
        })
        .collect();
    let names: BTreeSet<String> = library.iter().map(|m| m.path.clone()).collect();
    library
        .iter()
        .map(|module| {
            let edges = library_code(&module.source)
                .flat_map(|line| named_paths(line, &module.path))
                .map(|path| resolve(&path, &names))
                .filter(|target| {
                    *target != module.path
                        && !is_ancestor(target, &module.path)
                        && !is_ancestor(&module.path, target)
                })
                .collect();
            (module.path.clone(), edges)
        })
        .collect()
}

/// The first circle found, as the path that closes it (`a -> b -> a`).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        // Ends: a node is entered once (`done`) or closes a circle on the path.
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Every module `from` reaches.
fn reachable(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    // Ends: a module is pushed at most once (`seen`).
    while let Some(node) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// A crate's source files as modules.
fn crate_modules(src: &Path) -> Vec<Module> {
    let mut modules = Vec::new();
    let mut folders = vec![src.to_owned()];
    // Ends: the source tree is finite and has no links back up.
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut segments: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(segments.last().map(String::as_str), Some("mod"))
                || (segments.len() == 1 && matches!(segments[0].as_str(), "lib" | "main"))
            {
                segments.pop();
            }
            modules.push(Module {
                path: segments.join("::"),
                source: std::fs::read_to_string(&path).unwrap(),
            });
        }
    }
    modules.sort_by(|a, b| a.path.cmp(&b.path));
    modules
}

/// Every crate of the workspace with its own modules: `crates/*` and `xtask`.
fn crates() -> Vec<(String, Vec<Module>)> {
    let root = workspace();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    dirs.push(root.join("xtask"));
    dirs.sort();
    dirs.into_iter()
        .filter(|dir| dir.join("src").is_dir())
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            (name, crate_modules(&dir.join("src")))
        })
        .collect()
}

#[test]
fn no_crates_modules_import_each_other_in_a_circle() {
    let crates = crates();
    let names: Vec<&str> = crates.iter().map(|(name, _)| name.as_str()).collect();
    for expected in [
        "brain", "cli", "core", "executor", "hands", "runtime", "session",
    ] {
        assert!(names.contains(&expected), "{expected} not read: {names:?}");
    }
    let mut circles = Vec::new();
    for (name, modules) in &crates {
        if let Some(cycle) = find_cycle(&graph(modules)) {
            circles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The modules of `graph` that `from` reaches and `allowed` does not admit.
fn reached_outside(graph: &Graph, from: &str, allowed: impl Fn(&str) -> bool) -> Vec<String> {
    reachable(graph, from)
        .into_iter()
        .filter(|m| !allowed(m))
        .collect()
}

fn in_folder(folder: &str, module: &str) -> bool {
    module.starts_with(&format!("{folder}::"))
}

/// Brain's floors, by folder (ARCHITECTURE.md): `provider` reaches nothing outside it;
/// `guards` only `provider`; the parts of a run (`context`, `run`) and `config`, `stop`,
/// `telemetry` reach no loop and not the engine; `context` and the run's own parts reach
/// neither the running execution (`run::execution`) nor the turn's tool side.
#[test]
fn brains_folders_sit_on_their_floors() {
    let brain = workspace().join("crates/brain/src");
    let graph = graph(&crate_modules(&brain));
    assert!(graph.len() > 40, "{} modules read", graph.len());
    for folder in ["provider", "guards", "context", "run", "loops"] {
        assert!(
            graph.keys().any(|m| in_folder(folder, m)),
            "no module in {folder}/"
        );
    }
    // The edges the floors rest on are seen at all.
    for (from, to) in [
        ("engine", "loops::react"),
        ("loops::react", "run::tool_calls"),
        ("run::execution", "context::compactor"),
        ("context::compactor", "run::model_caller"),
        ("run::model_caller", "provider::port"),
        ("guards::runaway", "provider::stream"),
    ] {
        assert!(graph[from].contains(to), "{from}: {:?}", graph[from]);
    }
    let mut breaches = Vec::new();
    for module in graph.keys() {
        let outside = if in_folder("provider", module) {
            reached_outside(&graph, module, |m| in_folder("provider", m))
        } else if in_folder("guards", module) {
            reached_outside(&graph, module, |m| {
                in_folder("guards", m) || in_folder("provider", m)
            })
        } else if in_folder("loops", module) || module == "engine" || module.is_empty() {
            Vec::new()
        } else {
            reached_outside(&graph, module, |m| {
                !(m == "engine" || m == "loops::react" || m == "loops::plan_execute")
            })
        };
        if !outside.is_empty() {
            breaches.push(format!("{module} reaches {outside:?}"));
        }
    }
    for part in graph.keys().filter(|m| {
        in_folder("context", m)
            || [
                "run::journal",
                "run::model_caller",
                "run::workspace_tracker",
                "config",
            ]
            .contains(&m.as_str())
    }) {
        let above = reached_outside(&graph, part, |m| {
            m != "run::execution" && m != "run::tool_calls"
        });
        if !above.is_empty() {
            breaches.push(format!("{part} reaches {above:?}"));
        }
    }
    assert!(breaches.is_empty(), "{}", breaches.join("\n"));
}

/// Brain's folders (`mod.rs`) only declare their files, and no library code imports from
/// the crate root's re-exports, so every edge the graph reads is one the code has: an
/// import through a folder's or the root's `pub use` would hide the module it comes from.
#[test]
fn brains_imports_name_the_module_that_defines_what_they_import() {
    let brain = workspace().join("crates/brain/src");
    let modules = crate_modules(&brain);
    let names: BTreeSet<String> = modules.iter().map(|m| m.path.clone()).collect();
    let folders: BTreeSet<&str> = names
        .iter()
        .filter(|m| !m.is_empty() && names.iter().any(|c| is_ancestor(m, c) && c != *m))
        .map(String::as_str)
        .collect();
    let test_only: BTreeSet<String> = modules.iter().flat_map(test_only_children).collect();
    let mut found = Vec::new();
    for module in &modules {
        if test_only
            .iter()
            .any(|t| *t == module.path || is_ancestor(t, &module.path))
        {
            continue;
        }
        // A top folder's `mod.rs`; a file with a folder of its own beside it (`a.rs` and
        // `a/`) is a module with code and children, which import from it by `super::`.
        if folders.contains(module.path.as_str()) && !module.path.contains("::") {
            let extra: Vec<&str> = library_code(&module.source)
                .map(str::trim)
                .filter(|line| {
                    !(line.is_empty()
                        || line.starts_with("//!")
                        || line.starts_with("pub mod ")
                        || line.starts_with("pub(crate) mod "))
                })
                .collect();
            if !extra.is_empty() {
                found.push(format!(
                    "{}/mod.rs holds more than declarations: {extra:?}",
                    module.path
                ));
            }
        }
        for path in library_code(&module.source).flat_map(|line| named_paths(line, &module.path)) {
            if !path.is_empty() && resolve(&path, &names).is_empty() {
                found.push(format!(
                    "{} imports crate::{}",
                    module.path,
                    path.join("::")
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

fn module(path: &str, source: &str) -> Module {
    Module {
        path: path.to_owned(),
        source: source.to_owned(),
    }
}

/// The check fails on a back edge, named as the circle it closes, across folders and
/// through `super::` too; comments, test modules and a folder's own re-exports are no edges.
#[test]
fn a_back_edge_is_reported_as_the_circle_it_closes() {
    let modules = |runner: &str| {
        vec![
            module("", "mod loops;\nmod runner;\n#[cfg(test)]\nmod loop_tests;"),
            module(
                "loop_tests",
                "use crate::runner::Run;\nuse crate::loops::react;",
            ),
            module("config", "use nerve_core::LoopType;"),
            module(
                "loops",
                "pub mod react;\npub use react::turn;\nuse crate::{config::EngineConfig, runner::Run};",
            ),
            module(
                "loops::react",
                "use super::super::runner::Run;\nuse super::Loop;",
            ),
            module("runner", runner),
        ]
    };
    let clean = graph(&modules(
        "// crate::loops is mentioned in a comment only\nuse crate::config::EngineConfig;\n\
         #[cfg(test)]\nmod tests { use crate::loops::react::turn; }",
    ));
    assert_eq!(find_cycle(&clean), None, "{clean:?}");
    assert!(!clean.contains_key("loop_tests"), "{clean:?}");
    assert!(clean["loops::react"].contains("runner"), "{clean:?}");
    let circular = graph(&modules(
        "use crate::config::EngineConfig;\nfn f() { let _ = crate::loops::react::turn; }",
    ));
    assert_eq!(
        find_cycle(&circular).unwrap(),
        ["runner", "loops::react", "runner"]
    );
}
