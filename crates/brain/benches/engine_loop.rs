//! The ReAct loop's own CPU cost per turn: scripted provider, an in-memory sink and a
//! no-op tool, so what is measured is Nerve's bookkeeping (events, messages, guardrails,
//! stagnation fingerprints). Per-turn cost must stay flat from 10 to 1,000 turns.

use std::sync::Arc;

use divan::{Bencher, black_box};
use nerve_brain::{AgentEngine, EngineConfig, ScriptedProvider, Task};
use nerve_core::testing::{CannedTools, MemorySink};
use nerve_core::{ExecutionId, TaskId, TaskStatus};
use tokio_util::sync::CancellationToken;

fn main() {
    divan::main();
}

/// `turns` tool turns (each reading a different file, as the LangGraph anchor does), then
/// an answer. Usage is given, so no token estimate runs over the history.
fn cassette(turns: usize) -> String {
    let mut lines: Vec<String> = (0..turns)
        .map(|i| {
            format!(
                r#"{{"text":"step {i}","tool_calls":[{{"name":"read_file","arguments":{{"path":"f{i}.txt"}}}}],"usage":{{"input_tokens":100,"output_tokens":10}}}}"#
            )
        })
        .collect();
    lines.push(r#"{"text":"done","usage":{"input_tokens":100,"output_tokens":5}}"#.to_owned());
    lines.join("\n")
}

#[divan::bench(args = [10, 100, 1000], sample_count = 10)]
fn react_run(bencher: Bencher, turns: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|_| std::process::abort());
    let script = cassette(turns);
    bencher
        .counter(divan::counter::ItemsCount::new(turns))
        .with_inputs(|| {
            let provider =
                ScriptedProvider::parse("bench", &script).unwrap_or_else(|_| std::process::abort());
            let config = EngineConfig {
                max_turns: u32::try_from(turns + 1).unwrap_or(u32::MAX),
                ..EngineConfig::default()
            };
            AgentEngine::new(
                Arc::new(provider),
                Arc::new(CannedTools::one("read_file", "x".repeat(200))),
                Arc::new(MemorySink::default()),
                config,
            )
        })
        .bench_local_values(|engine| {
            let task = Task {
                id: TaskId::new(),
                description: "go".into(),
                metadata: serde_json::Value::Null,
                status: TaskStatus::Created,
                workspace: "/w".into(),
            };
            let result =
                runtime.block_on(engine.run(ExecutionId::new(), task, CancellationToken::new()));
            black_box(result.map(|r| r.context.turn_count()).unwrap_or(0))
        });
}
