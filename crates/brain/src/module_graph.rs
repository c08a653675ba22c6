//! A check that brain's modules import each other without a circle, and that the parts of
//! a running execution sit below the loops and the engine that wires them. The graph is
//! read from the sources: every `crate::<module>` path outside comments and outside the
//! file's test module is an edge. Test-only helper modules (`#[cfg(test)] mod ...;` in
//! `lib.rs`: `loop_tests`, `testing`, ...) and each file's own `mod tests` are left out:
//! tests drive the engine from the top by design, and none of them is compiled into
//! the library.

use std::collections::{BTreeMap, BTreeSet};

/// Module name to the modules it names, from `(module, source)` pairs.
fn graph(sources: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&str> = sources.iter().map(|(name, _)| name.as_str()).collect();
    sources
        .iter()
        .map(|(name, source)| {
            let mut edges = BTreeSet::new();
            for line in library_code(source) {
                let mut rest = line.as_str();
                while let Some(at) = rest.find("crate::") {
                    rest = &rest[at + "crate::".len()..];
                    // `use crate::{a, b::C}` names several modules at once.
                    let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                        let end = group.find('}').unwrap_or(group.len());
                        group[..end]
                            .split(',')
                            .map(|item| item.trim().split("::").next().unwrap_or(""))
                            .collect()
                    } else {
                        vec![
                            rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                                .next()
                                .unwrap_or(""),
                        ]
                    };
                    for target in names {
                        if target != name && modules.contains(target) {
                            edges.insert(target.to_owned());
                        }
                    }
                }
            }
            (name.clone(), edges)
        })
        .collect()
}

/// The lines of `source` before its test module, without `//` comments.
fn library_code(source: &str) -> Vec<String> {
    source
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .map(|line| match line.find("//") {
            Some(at) => line[..at].to_owned(),
            None => line.to_owned(),
        })
        .collect()
}

/// The first circle found, as the path that closes it (`a -> b -> a`).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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
fn reachable(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(node) = stack.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

/// brain's library modules and their sources, test-only modules left out.
fn brain_sources() -> Vec<(String, String)> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut test_only = BTreeSet::new();
    let mut after_cfg_test = false;
    for line in lib.lines().map(str::trim) {
        if line == "#[cfg(test)]" {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test
            && let Some(name) = line
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
        {
            test_only.insert(name.to_owned());
        }
        after_cfg_test = false;
    }
    let mut sources: Vec<(String, String)> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_stem()?.to_str()?.to_owned();
            (path.extension()? == "rs" && name != "lib" && !test_only.contains(&name))
                .then(|| (name, std::fs::read_to_string(&path).unwrap()))
        })
        .collect();
    sources.sort();
    sources
}

#[test]
fn brains_modules_import_each_other_without_a_circle() {
    let sources = brain_sources();
    let graph = graph(&sources);
    assert!(graph.len() > 20, "{} modules read", graph.len());
    // The edges the restructuring rests on are seen at all.
    assert!(graph["engine"].contains("react"), "{:?}", graph["engine"]);
    assert!(
        graph["runner"].contains("compactor"),
        "{:?}",
        graph["runner"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import circle among brain's modules: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_parts_and_the_config_sit_below_the_loops_and_the_engine() {
    let graph = graph(&brain_sources());
    for part in [
        "config",
        "journal",
        "window",
        "caller",
        "compactor",
        "turn",
        "runner",
    ] {
        let above: Vec<String> = reachable(&graph, part)
            .into_iter()
            .filter(|m| ["engine", "react", "plan"].contains(&m.as_str()))
            .collect();
        assert!(above.is_empty(), "{part} reaches {above:?}");
    }
}

/// The check fails on a back edge, named as the circle it closes.
#[test]
fn a_back_edge_is_reported_as_the_circle_it_closes() {
    let sources = |runner: &str| {
        vec![
            ("config".to_owned(), "use nerve_core::LoopType;".to_owned()),
            (
                "engine".to_owned(),
                "use crate::{config::EngineConfig, react};\nuse crate::runner::Run;".to_owned(),
            ),
            ("react".to_owned(), "use crate::runner::Run;".to_owned()),
            ("runner".to_owned(), runner.to_owned()),
        ]
    };
    let clean = graph(&sources(
        "// crate::engine is mentioned in a comment only\nuse crate::config::EngineConfig;\n\
         #[cfg(test)]\nmod tests { use crate::engine::AgentEngine; }",
    ));
    assert_eq!(find_cycle(&clean), None, "{clean:?}");
    let circular = graph(&sources(
        "use crate::config::EngineConfig;\nfn f() { let _ = crate::engine::AgentEngine::new; }",
    ));
    assert_eq!(
        find_cycle(&circular).unwrap(),
        ["engine", "react", "runner", "engine"]
    );
}
