//! Stagnation detection: an agent repeating the same tool calls is corrected once, then
//! stopped. Two signals from the seeds (repetition ratio and whole-turn cycles over a window
//! of tool-bearing turns), plus one of our own: the same call returning the same result
//! again and again is no progress, even when the turns around it differ.

use std::collections::{BTreeMap, HashMap};

use nerve_core::{ToolCall, ToolResult};
use ring::digest::{SHA256, digest};
use serde::{Deserialize, Serialize};

/// Tuning of the detector; the defaults are the seeds'.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StagnationConfig {
    pub enabled: bool,
    /// Recent tool-bearing turns analysed.
    pub window_size: usize,
    /// Tool-bearing turns needed before any check fires.
    pub min_tool_turns: usize,
    /// Repetition ratio, in percent, at or above which the window stagnates.
    pub repetition_threshold_percent: u32,
    pub cycle_detection: bool,
    /// Corrective messages before terminating (0: terminate at once).
    pub max_corrections: u32,
    /// The same call with the same result this many times in the window is no progress.
    pub same_result_limit: usize,
}

impl Default for StagnationConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window_size: 5,
            min_tool_turns: 2,
            repetition_threshold_percent: 60,
            cycle_detection: true,
            max_corrections: 1,
            same_result_limit: 3,
        }
    }
}

/// `name:sha256(canonical JSON args)[:16]`: keys sorted, whitespace in strings normalised.
pub fn fingerprint(call: &ToolCall) -> String {
    let canonical = canonical_arguments(&call.arguments);
    let hash = digest(&SHA256, canonical.as_bytes());
    let hex: String = hash
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}:{hex}", call.name)
}

/// The canonical JSON text of tool arguments: keys sorted, whitespace in strings
/// normalised. Fingerprints hash it; policy patterns match against it.
pub fn canonical_arguments(value: &serde_json::Value) -> String {
    fn normalise(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::String(text) => {
                serde_json::Value::String(text.split_whitespace().collect::<Vec<_>>().join(" "))
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(normalise).collect())
            }
            serde_json::Value::Object(map) => {
                // serde_json's map is ordered by key unless `preserve_order` is on; sort
                // explicitly so the fingerprint never depends on that feature.
                let sorted: BTreeMap<&String, serde_json::Value> =
                    map.iter().map(|(k, v)| (k, normalise(v))).collect();
                serde_json::Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {
                value.clone()
            }
        }
    }
    normalise(value).to_string()
}

/// What one tool-bearing turn did, as the detector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSignature {
    /// Sorted fingerprints of the turn's calls.
    pub calls: Vec<String>,
    /// `(fingerprint, hash of the result)` per call.
    pub outcomes: Vec<(String, String)>,
}

impl TurnSignature {
    pub fn new(calls: &[ToolCall], results: &[ToolResult]) -> Self {
        let mut fingerprints: Vec<String> = calls.iter().map(fingerprint).collect();
        let outcomes = calls
            .iter()
            .map(|call| {
                let result = results
                    .iter()
                    .find(|r| r.call_id == call.id)
                    .map_or("", |r| r.content.as_str());
                let hash = digest(&SHA256, result.as_bytes());
                let hex: String = hash
                    .as_ref()
                    .iter()
                    .take(8)
                    .map(|b| format!("{b:02x}"))
                    .collect();
                (fingerprint(call), hex)
            })
            .collect();
        fingerprints.sort();
        Self {
            calls: fingerprints,
            outcomes,
        }
    }
}

/// Why the window stagnates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagnationReport {
    /// Σ(count − 1) / total over the window's fingerprints.
    pub repetition_ratio: f64,
    /// Length of the repeating cycle of whole turns, when one was found.
    pub cycle_length: Option<usize>,
    /// Fingerprints that occurred more than once, most frequent first.
    pub repeated_calls: Vec<String>,
    /// A call that kept returning the same result, when that fired.
    pub no_progress_call: Option<String>,
}

/// What the loop should do after a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Continue,
    /// Inject one corrective user message.
    Correct(StagnationReport),
    /// Stop with `stagnation`.
    Terminate(StagnationReport),
}

/// The detector's state for one scope (a whole react loop, or one plan step).
#[derive(Debug, Clone)]
pub struct StagnationDetector {
    config: StagnationConfig,
    window: Vec<TurnSignature>,
    corrections: u32,
}

impl StagnationDetector {
    pub fn new(config: StagnationConfig) -> Self {
        Self {
            config,
            window: Vec::new(),
            corrections: 0,
        }
    }

    /// Forgets the window and the corrections: plan loops call this at each step.
    pub fn reset(&mut self) {
        self.window.clear();
        self.corrections = 0;
    }

    /// Records a turn and judges the window. Turns without tool calls are not recorded.
    pub fn observe(&mut self, turn: TurnSignature) -> Verdict {
        if !self.config.enabled || turn.calls.is_empty() {
            return Verdict::Continue;
        }
        self.window.push(turn);
        if self.window.len() > self.config.window_size {
            self.window.remove(0);
        }
        match self.analyse() {
            None => Verdict::Continue,
            Some(report) if self.corrections < self.config.max_corrections => {
                self.corrections += 1;
                Verdict::Correct(report)
            }
            Some(report) => Verdict::Terminate(report),
        }
    }

    fn analyse(&self) -> Option<StagnationReport> {
        if self.window.len() < self.config.min_tool_turns.max(1) {
            return None;
        }
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for fingerprint in self.window.iter().flat_map(|turn| &turn.calls) {
            *counts.entry(fingerprint).or_default() += 1;
        }
        let total: usize = counts.values().sum();
        let duplicates: usize = counts.values().map(|c| c - 1).sum();
        // Integer comparison: duplicates/total >= threshold/100.
        let repetitive = total > 0
            && duplicates * 100
                >= total
                    * usize::try_from(self.config.repetition_threshold_percent)
                        .unwrap_or(usize::MAX);
        let cycle_length = if self.config.cycle_detection {
            self.cycle()
        } else {
            None
        };
        let no_progress_call = self.no_progress();
        if !repetitive && cycle_length.is_none() && no_progress_call.is_none() {
            return None;
        }
        let mut repeated: Vec<(&str, usize)> = counts.into_iter().filter(|(_, c)| *c > 1).collect();
        repeated.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        #[allow(clippy::cast_precision_loss)] // Window counts are tiny.
        let repetition_ratio = if total == 0 {
            0.0
        } else {
            duplicates as f64 / total as f64
        };
        Some(StagnationReport {
            repetition_ratio,
            cycle_length,
            repeated_calls: repeated.into_iter().map(|(f, _)| f.to_owned()).collect(),
            no_progress_call,
        })
    }

    /// The shortest k ≥ 2 with `seq[-k:] == seq[-2k:-k]`.
    fn cycle(&self) -> Option<usize> {
        let seq: Vec<&Vec<String>> = self.window.iter().map(|turn| &turn.calls).collect();
        (2..=seq.len() / 2).find(|&k| seq[seq.len() - k..] == seq[seq.len() - 2 * k..seq.len() - k])
    }

    fn no_progress(&self) -> Option<String> {
        let mut counts: HashMap<&(String, String), usize> = HashMap::new();
        for outcome in self.window.iter().flat_map(|turn| &turn.outcomes) {
            *counts.entry(outcome).or_default() += 1;
        }
        let mut stuck: Vec<(&(String, String), usize)> = counts
            .into_iter()
            .filter(|(_, c)| *c >= self.config.same_result_limit.max(2))
            .collect();
        stuck.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        stuck
            .first()
            .map(|((fingerprint, _), _)| fingerprint.clone())
    }
}

/// The corrective message injected on the first detection.
pub fn corrective_message(report: &StagnationReport) -> String {
    let mut text = String::from(
        "You appear to be repeating yourself without making progress. Stop and reconsider: \
         what did the last results tell you, and what different action would move the task forward?",
    );
    if let Some(k) = report.cycle_length {
        text.push_str(&format!(
            " Your last {k} turns repeat the {k} turns before them."
        ));
    }
    if let Some(call) = &report.no_progress_call {
        text.push_str(&format!(
            " The call {call} keeps returning the same result."
        ));
    }
    if !report.repeated_calls.is_empty() {
        text.push_str(&format!(
            " Repeated calls: {}.",
            report.repeated_calls.join(", ")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use nerve_core::ToolCallId;
    use serde_json::json;

    use super::*;

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall {
            id: ToolCallId(format!("{name}-{args}")),
            name: name.into(),
            arguments: args,
        }
    }

    fn turn(calls: &[ToolCall], result: &str) -> TurnSignature {
        let results: Vec<ToolResult> = calls
            .iter()
            .map(|c| ToolResult {
                call_id: c.id.clone(),
                name: c.name.clone(),
                content: result.into(),
                is_error: false,
            })
            .collect();
        TurnSignature::new(calls, &results)
    }

    /// Feeds one single-call turn per element (each with a distinct result) and returns the
    /// verdict after each.
    fn check(turns: &[&ToolCall]) -> Vec<&'static str> {
        let mut detector = StagnationDetector::new(StagnationConfig::default());
        turns
            .iter()
            .enumerate()
            .map(|(i, call)| {
                match detector.observe(turn(std::slice::from_ref(*call), &format!("result {i}"))) {
                    Verdict::Continue => "-",
                    Verdict::Correct(_) => "correct",
                    Verdict::Terminate(_) => "terminate",
                }
            })
            .collect()
    }

    #[test]
    fn verdict_table() {
        let a = call("shell", json!({"command": "ls"}));
        let b = call("read_file", json!({"path": "x"}));
        let a2 = call("shell", json!({"command": "ls -la"}));
        let c = call("shell", json!({"command": "cat y"}));
        // A,A: ratio 0.5 and no cycle of length 1.
        assert_eq!(check(&[&a, &a]), ["-", "-"]);
        // A,A,A: repetition.
        assert_eq!(check(&[&a, &a, &a]), ["-", "-", "correct"]);
        // Five identical calls: exactly one correction, then termination.
        assert_eq!(
            check(&[&a, &a, &a, &a, &a]),
            ["-", "-", "correct", "terminate", "terminate"]
        );
        // A,B,A,B: a cycle of length 2 (ratio is only 0.5).
        assert_eq!(check(&[&a, &b, &a, &b]), ["-", "-", "-", "correct"]);
        // The same tool with different arguments: nothing.
        assert_eq!(check(&[&a, &a2, &c, &b]), ["-", "-", "-", "-"]);
    }

    #[test]
    fn the_same_result_again_and_again_is_no_progress() {
        let a = call("shell", json!({"command": "make test"}));
        let x = call("read_file", json!({"path": "x"}));
        let y = call("read_file", json!({"path": "y"}));
        let z = call("read_file", json!({"path": "z"}));
        // Ratio 3/6 and no whole-turn cycle, but `make test` keeps failing the same way.
        let mut detector = StagnationDetector::new(StagnationConfig::default());
        let verdicts: Vec<Verdict> = [[a.clone(), x], [a.clone(), y], [a.clone(), z]]
            .iter()
            .map(|calls| detector.observe(turn(calls, "FAIL: 1 test")))
            .collect();
        match &verdicts[2] {
            Verdict::Correct(report) => {
                assert_eq!(
                    report.no_progress_call.as_deref(),
                    Some(fingerprint(&a).as_str())
                );
                assert_eq!(report.cycle_length, None);
                assert!(corrective_message(report).contains("keeps returning the same result"));
            }
            other @ (Verdict::Continue | Verdict::Terminate(_)) => {
                panic!("expected a correction, got {other:?}")
            }
        }
    }

    #[test]
    fn reset_scopes_the_window_to_a_step() {
        let a = call("shell", json!({"command": "ls"}));
        let mut detector = StagnationDetector::new(StagnationConfig::default());
        let one = std::slice::from_ref(&a);
        detector.observe(turn(one, "1"));
        detector.observe(turn(one, "2"));
        detector.reset();
        assert_eq!(detector.observe(turn(one, "3")), Verdict::Continue);
        assert_eq!(detector.observe(turn(one, "4")), Verdict::Continue);
    }

    #[test]
    fn fingerprints_ignore_key_order_and_whitespace() {
        let one = call(
            "edit_file",
            json!({"path": "a", "old_text": "x  y\n", "new_text": "z"}),
        );
        let two = call(
            "edit_file",
            json!({"new_text": "z", "old_text": "x y", "path": "a"}),
        );
        assert_eq!(fingerprint(&one), fingerprint(&two));
        assert_ne!(
            fingerprint(&one),
            fingerprint(&call("edit_file", json!({"path": "b"})))
        );
        let print = fingerprint(&one);
        assert!(
            print.starts_with("edit_file:") && print.len() == "edit_file:".len() + 16,
            "{print}"
        );
    }
}
