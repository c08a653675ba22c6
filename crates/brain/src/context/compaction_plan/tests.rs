//! Unit tests of the compaction planning, the digests and the extractive summary.

use nerve_core::{ToolCall, ToolResult};

use super::digest::{ODD_LINES, RARE_LINES, SHAPE_LINES, rare_lines, template};
use super::*;

/// The byte-by-byte definition of [`line_shape`], which skips word runs faster: both
/// give the same hash for every line.
fn line_shape_by_byte(line: &str) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut last = 0_u8;
    for byte in line.bytes() {
        let class = if byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80 {
            b'w'
        } else {
            byte
        };
        if class == last && (class == b'w' || class == b' ') {
            continue;
        }
        hash = (hash ^ u64::from(class)).wrapping_mul(0x0000_0100_0000_01b3);
        last = class;
    }
    hash
}

/// [`rare_lines`] without its early exits: both keep the same lines.
fn rare_lines_whole_scan(content: &str) -> Vec<(usize, &str)> {
    let mut lines: Vec<(usize, &str, u64)> = Vec::new();
    let mut counts: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    let mut start = 0;
    while start < content.len() && lines.len() < SHAPE_LINES {
        let end = content[start..]
            .find('\n')
            .map_or(content.len(), |i| start + i);
        let line = content[start..end].trim();
        if !line.is_empty() {
            let shape = line_shape_by_byte(line);
            *counts.entry(shape).or_default() += 1;
            lines.push((start, line, shape));
        }
        start = end + 1;
    }
    let dominant = counts.values().copied().max().unwrap_or(0) as usize;
    if lines.len() < 8 || dominant * 2 < lines.len() {
        return Vec::new();
    }
    let rare: Vec<(usize, &str)> = lines
        .into_iter()
        .filter(|(_, _, shape)| counts[shape] == 1)
        .map(|(start, line, _)| (start, line))
        .collect();
    if rare.len() > RARE_LINES {
        Vec::new()
    } else {
        rare
    }
}

/// Cut to fit by length: each pass counted, the result returned with the count.
fn fit_by_length(earlier: Option<&str>, history: &str, room: usize) -> (Option<String>, u32) {
    let passes = std::cell::Cell::new(0_u32);
    let fitted = fitted_transcript(earlier, history, |text| {
        passes.set(passes.get() + 1);
        text.len() <= room
    });
    (fitted, passes.get())
}

#[test]
fn a_transcript_that_fits_is_sent_whole() {
    let history = "user: go on\n";
    let (fitted, passes) = fit_by_length(Some("## Goal\nx"), history, 1_000);
    let whole = transcript(&[&Message::user("go on")], Some("## Goal\nx"));
    assert_eq!(fitted.as_deref(), Some(whole.as_str()));
    assert_eq!(passes, 1);
}

#[test]
fn an_earlier_summary_larger_than_the_room_is_cut_too() {
    let earlier = "## Goal\nkeep the build green\n".repeat(400);
    let history = "tool result shell: ok\n".repeat(10);
    let (fitted, _) = fit_by_length(Some(&earlier), &history, 2_000);
    let fitted = fitted.unwrap();
    assert!(fitted.len() <= 2_000, "{}", fitted.len());
    assert!(fitted.starts_with("EARLIER SUMMARY:\n## Goal\nkeep the build green"));
    assert!(
        fitted.contains("characters left out to fit ...]"),
        "{fitted}"
    );
    // The newest history stays.
    assert!(fitted.ends_with("tool result shell: ok\n"), "{fitted}");
    // No room even for the least a transcript keeps: a failure, not a loop.
    assert_eq!(fit_by_length(Some(&earlier), &history, 100).0, None);
}

proptest::proptest! {
    /// Whatever the sizes and the room, the cut ends within a pass per halving of the
    /// input, and what it returns fits.
    #[test]
    fn a_transcript_cut_ends_and_fits(
        earlier in proptest::option::of(0_usize..40_000),
        history in 0_usize..40_000,
        room in 0_usize..50_000,
        wide in proptest::bool::ANY,
    ) {
        let unit = if wide { "é" } else { "a" };
        let earlier = earlier.map(|n| unit.repeat(n / unit.len()));
        let history = unit.repeat(history / unit.len());
        let (fitted, passes) = fit_by_length(earlier.as_deref(), &history, room);
        let total = earlier.as_ref().map_or(0, String::len) + history.len();
        let halvings = total.max(1).ilog2() + 2;
        proptest::prop_assert!(passes <= halvings, "{passes} passes for {total} bytes");
        if let Some(fitted) = fitted {
            proptest::prop_assert!(fitted.len() <= room);
        }
    }
}

proptest::proptest! {
    #[test]
    fn rare_lines_exit_early_only_when_the_answer_is_known(
        lines in proptest::collection::vec(
            proptest::prop_oneof![
                4 => proptest::strategy::Just("pkg1==1.2.3".to_owned()),
                3 => "[a-z]{1,6}==[0-9]\\.[0-9]{1,2}\\.[0-9]",
                3 => "[a-z =:,.-]{0,12}",
            ],
            0..60,
        )
    ) {
        let content = lines.join("\n");
        proptest::prop_assert_eq!(rare_lines(&content), rare_lines_whole_scan(&content));
    }

    /// Odd lines are lines of the output, at most [`ODD_LINES`], most odd first, and
    /// only in an output with a template: the same one whatever the early exit.
    #[test]
    fn odd_lines_are_few_ranked_lines_of_a_templated_output(
        lines in proptest::collection::vec(
            proptest::prop_oneof![
                4 => "LISTEN 0 128 0\\.0\\.0\\.0:[0-9]{4} users:\\(\\([a-c]{1,2}\\)\\)",
                2 => "[a-z]{1,6}==[0-9]\\.[0-9]{1,2}\\.[0-9]",
                1 => "[a-z =:,.-]{0,12}",
            ],
            0..60,
        )
    ) {
        let content = lines.join("\n");
        let odd = odd_lines(&content);
        proptest::prop_assert!(odd.len() <= ODD_LINES);
        if template(&content).is_none() {
            proptest::prop_assert!(odd.is_empty());
        }
        for pair in odd.windows(2) {
            proptest::prop_assert!((pair[0].2, std::cmp::Reverse(pair[0].0)) >= (pair[1].2, std::cmp::Reverse(pair[1].0)));
        }
        for (start, line, score) in odd {
            proptest::prop_assert!(score > 0);
            proptest::prop_assert_eq!(content[start..].lines().next().map(str::trim), Some(line));
        }
    }

    #[test]
    fn line_shape_is_the_byte_by_byte_definition(line in "[a-zA-Z0-9_ \t:=.,/\\-\"{}()é]{0,80}") {
        proptest::prop_assert_eq!(line_shape(&line), line_shape_by_byte(&line));
    }
}

fn check_indicator(fill: u64, capacity: u64, blocks: usize, expected: &str) {
    assert_eq!(indicator(fill, capacity, blocks), expected);
}

#[test]
fn indicator_format() {
    check_indicator(
        12_450,
        16_000,
        0,
        "[Context: 12,450/16,000 tokens (77%) | 0 archived blocks]",
    );
    check_indicator(
        999,
        1_000_000,
        3,
        "[Context: 999/1,000,000 tokens (0%) | 3 archived blocks]",
    );
    let prompt = with_indicator(
        "You are Nerve.",
        "[Context: 1/2 tokens (50%) | 0 archived blocks]",
    );
    let again = with_indicator(&prompt, "[Context: 2/2 tokens (100%) | 1 archived blocks]");
    assert_eq!(
        again,
        "You are Nerve.\n\n[Context: 2/2 tokens (100%) | 1 archived blocks]"
    );
}

#[test]
fn thresholds_table() {
    let config = CompactionConfig::default();
    // Exactly at the threshold compacts; one token below does not.
    assert!(at_or_above(80, 100, 80));
    assert!(!at_or_above(79, 100, 80));
    // Unknown (zero) capacity never compacts.
    assert!(!at_or_above(1_000_000, 0, 80));
    assert_eq!(config.hard_threshold(0), 80);
    assert_eq!(
        config.hard_threshold(85),
        70,
        "tighter under budget pressure"
    );
    let agent = CompactionConfig {
        agent_controlled: true,
        ..config
    };
    assert_eq!(agent.hard_threshold(0), 95);
    assert_eq!(config.recent_turns(0), 3);
    assert_eq!(config.recent_turns(90), 2);
}

pub(crate) fn conversation(turns: usize, text: &str) -> Vec<Message> {
    let mut messages = vec![Message::system("sys"), Message::user("the task").pinned()];
    for i in 0..turns {
        let call = ToolCall {
            id: format!("c{i}").as_str().into(),
            name: "shell".into(),
            arguments: serde_json::json!({"command": i}),
        };
        messages.push(Message {
            role: MessageRole::Assistant,
            parts: vec![
                MessagePart::Text {
                    text: format!("{text} {i}"),
                },
                MessagePart::ToolCall(call.clone()),
            ],
            pinned: false,
        });
        messages.push(Message::tool_result(ToolResult {
            call_id: call.id,
            name: "shell".into(),
            content: format!("output {i}"),
            is_error: false,
        }));
    }
    messages
}

#[test]
fn summary_plan_keeps_head_pinned_recent_and_epistemic() {
    let mut messages = conversation(8, "step");
    messages[6] = Message {
        role: MessageRole::Assistant,
        parts: vec![MessagePart::Text {
            text: "Hmm, wait: perhaps I was wrong; let me verify.".into(),
        }],
        pinned: false,
    };
    let counts = [10; 32];
    let counts = &counts[..messages.len()];
    let policy = SummaryPolicy {
        recent_turns: 3,
        recent_percent: 0,
        complexity: Some(Complexity::Simple),
        protect_from: None,
        min_messages: 4,
    };
    let plan = plan_summary(&messages, counts, 10_000, policy).unwrap();
    assert_eq!(plan.from, 1);
    assert_eq!(plan.to, messages.len() - 6, "3 turn pairs kept");
    assert_eq!(
        plan.kept,
        [1, 6],
        "the pinned task and the epistemic message"
    );
    assert!(!plan.summarised.contains(&1));
    // Fewer than the minimum messages never compacts.
    assert_eq!(
        plan_summary(&messages[..3], &counts[..3], 10_000, policy),
        None
    );
    // The active step is protected.
    let protected = plan_summary(
        &messages,
        counts,
        10_000,
        SummaryPolicy {
            recent_turns: 1,
            protect_from: Some(5),
            ..policy
        },
    )
    .unwrap();
    assert_eq!(protected.to, 5);
}

#[test]
fn the_recent_window_never_starts_on_a_tool_result() {
    let messages = conversation(4, "x");
    let counts = [1; 10];
    let start = recent_start(&messages, &counts[..messages.len()], 1, 2);
    assert_ne!(messages[start].role, MessageRole::Tool);
}

#[test]
fn extractive_summary_keeps_paths_errors_and_numbers() {
    let messages = [
        Message::text(
            MessageRole::Assistant,
            "I decided to use sqlite because it is embedded.",
        ),
        Message::tool_result(ToolResult {
            call_id: "c".into(),
            name: "shell".into(),
            content: "src/db/schema.rs:42: error[E0308]: mismatched types".into(),
            is_error: true,
        }),
        Message::text(MessageRole::Assistant, "Which table holds the sessions?"),
    ];
    let refs: Vec<&Message> = messages.iter().collect();
    let summary = extractive_summary("fix the build", &refs, Some("## Goal\n- earlier"), 10_000);
    assert!(
        summary.contains("src/db/schema.rs:42: error[E0308]: mismatched types"),
        "{summary}"
    );
    assert!(summary.contains("I decided to use sqlite because it is embedded."));
    assert!(summary.contains("Which table holds the sessions?"));
    assert!(summary.starts_with("## Goal\n- fix the build"));
}

/// The extractive summary of `messages` (with `earlier`, within `max_chars`) holds every
/// line of `present` and none of `absent`.
fn check_extractive(
    messages: &[Message],
    earlier: Option<&str>,
    max_chars: usize,
    present: &[&str],
    absent: &[&str],
) -> String {
    let refs: Vec<&Message> = messages.iter().collect();
    let summary = extractive_summary("fix the build", &refs, earlier, max_chars);
    for line in present {
        assert!(summary.contains(line), "`{line}` missing from:\n{summary}");
    }
    for line in absent {
        assert!(
            !summary.contains(line),
            "`{line}` must not be in:\n{summary}"
        );
    }
    summary
}

fn tool(content: &str, is_error: bool) -> Message {
    Message::tool_result(ToolResult {
        call_id: "c".into(),
        name: "shell".into(),
        content: content.into(),
        is_error,
    })
}

#[test]
fn extractive_summary_folds_an_earlier_summary_instead_of_nesting_it() {
    let earlier = "[Nerve: 12 earlier messages, compacted; recall returns the originals (block ids below).]\n\
        ## Goal\n- fix the build\n## Done\n- shell cargo build\n\
        ## Findings (exact paths, errors, numbers)\n- src/db/schema.rs:42: error[E0308]: mismatched types\n\
        ## Decisions\n- Use sqlite because it is embedded.\n## Open questions\n## Next steps\n- read schema.rs\n\
        Archived blocks: 0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f";
    let summary = check_extractive(
        &[Message::text(
            MessageRole::Assistant,
            "The pool size is 48 in config/db.toml. Next I will check the migration.",
        )],
        Some(earlier),
        10_000,
        &[
            "- src/db/schema.rs:42: error[E0308]: mismatched types",
            "- Use sqlite because it is embedded.",
            "- shell cargo build",
            "- The pool size is 48 in config/db.toml.",
        ],
        &[
            "[Nerve: ",
            "Archived blocks",
            "## Earlier",
            "- read schema.rs",
        ],
    );
    assert_eq!(summary.matches("## Goal").count(), 1, "{summary}");
    // Folding a fold changes nothing more: the items are merged, never wrapped again.
    let again = check_extractive(&[], Some(&summary), 10_000, &[], &["## Earlier"]);
    assert_eq!(again.matches("error[E0308]").count(), 1, "{again}");
}

#[test]
fn extractive_summary_keeps_errors_with_their_location_and_skips_placeholders() {
    check_extractive(
        &[
            tool(
                "   Compiling serde v1.0.1\nerror[E0382]: borrow of moved value: `row`\n  --> src/ledger.rs:88:9\n   |\n    Finished in 3.2s",
                true,
            ),
            tool(
                "[masked: the output of shell (900 tokens) was archived as block b; call recall with this block_id to see it]",
                false,
            ),
            tool(
                "Money is stored in cents.\nNever edit applied migrations.",
                false,
            ),
        ],
        None,
        10_000,
        &[
            "- failed: error[E0382]: borrow of moved value: `row`",
            "- --> src/ledger.rs:88:9",
            "- Never edit applied migrations.",
        ],
        &["masked", "Compiling serde", "Money is stored"],
    );
}

#[test]
fn a_tight_extractive_summary_keeps_decisions_and_the_newest_errors() {
    let mut messages = vec![Message::text(
        MessageRole::Assistant,
        "Decision: use RowStreamer instead of a Vec, because exports are large.",
    )];
    for i in 0..200 {
        messages.push(Message {
            role: MessageRole::Assistant,
            parts: vec![MessagePart::ToolCall(ToolCall {
                id: format!("c{i}").as_str().into(),
                name: "shell".into(),
                arguments: serde_json::json!({"command": format!("cargo test part_{i}")}),
            })],
            pinned: false,
        });
        messages.push(tool(
            &format!("test part_{i} ... FAILED at src/part_{i}.rs:{i}"),
            true,
        ));
    }
    let summary = check_extractive(
        &messages,
        None,
        1_500,
        &[
            "use RowStreamer instead of a Vec",
            "src/part_199.rs:199",
            "## Next steps",
            "more lines left out",
        ],
        &["src/part_0.rs:0"],
    );
    assert!(summary.len() <= 1_500, "{} characters", summary.len());
}

/// The digest of `content` within `max_chars` is exactly `expected` (its lines).
fn check_digest(content: &str, max_chars: usize, expected: &[&str]) {
    let got = digest(content, max_chars);
    assert_eq!(got.lines().collect::<Vec<_>>(), expected, "{got}");
    assert!(got.len() <= max_chars, "{} > {max_chars}", got.len());
    assert_eq!(got, digest(content, max_chars), "deterministic");
}

#[test]
fn digest_table() {
    let build = "   Compiling serde v1.0.1\nwarning: unused variable: `row`\n  --> src/ledger.rs:12:5\n   |\n\
        error[E0308]: mismatched types\n  --> src/x.rs:41:9\n   |\n41 |     let n: u32 = row.get(\"n\")?;\n   |\n\
        error: could not compile `billing` (lib) due to 1 previous error\n[exit code: 101]";
    // The error with its location (not the quoted source line), the summary line, the
    // status; not the warning's location.
    check_digest(
        build,
        300,
        &[
            "error[E0308]: mismatched types",
            "--> src/x.rs:41:9",
            "error: could not compile `billing` (lib) due to 1 previous error",
            "[exit code: 101]",
        ],
    );
    // A tight budget keeps the first error and its location.
    check_digest(
        build,
        60,
        &["error[E0308]: mismatched types", "--> src/x.rs:41:9"],
    );
    // Non-ASCII text around (the patterns' word boundaries are ASCII ones) changes
    // nothing.
    check_digest(
        "✓ café loaded → ok\nerror: the café is closed (ünïcode)\n→ done",
        300,
        &["error: the café is closed (ünïcode)"],
    );
    // A Python traceback gives the location before the error; a Java exception names
    // its class before the colon and its cause on a `Caused by:` line.
    check_digest(
        "DEBUG loaded 40 rows\nTraceback (most recent call last):\n  File \"/usr/lib/python3.12/x/y.py\", line 12, in run\n    return fn()\n  File \"app/billing/invoice.py\", line 214, in render_total\n    total = rows[0].amount / count\nZeroDivisionError: division by zero",
        300,
        &[
            "Traceback (most recent call last):",
            "File \"/usr/lib/python3.12/x/y.py\", line 12, in run",
            "File \"app/billing/invoice.py\", line 214, in render_total",
            "total = rows[0].amount / count",
            "ZeroDivisionError: division by zero",
        ],
    );
    check_digest(
        "2026-11-04 10:00:01 INFO  [main] started\njava.lang.RuntimeException: posting failed\n\tat com.acme.ledger.Posting.apply(Posting.java:118)\nCaused by: java.lang.IllegalStateException: period 2024 is closed\n\t... 12 more",
        300,
        &[
            "java.lang.RuntimeException: posting failed",
            "at com.acme.ledger.Posting.apply(Posting.java:118)",
            "Caused by: java.lang.IllegalStateException: period 2024 is closed",
            "... 12 more",
        ],
    );
    // A failing assertion: where it panicked and the values.
    check_digest(
        "running 2 tests\ntest ledger::tests::sums ... ok\ntest ledger::tests::exact ... FAILED\n\n\
         ---- ledger::tests::exact stdout ----\nthread 'ledger::tests::exact' panicked at src/ledger.rs:88:5:\n\
         assertion `left == right` failed\n  left: 1250\n right: 1251\n\n\
         test result: FAILED. 1 passed; 1 failed; 0 ignored",
        300,
        &[
            "test ledger::tests::exact ... FAILED",
            "thread 'ledger::tests::exact' panicked at src/ledger.rs:88:5:",
            "assertion `left == right` failed",
            "left: 1250",
            "right: 1251",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
        ],
    );
    // Settings, each key once; a rule that names something before one in general words.
    check_digest(
        "[pool]\nsize = 48\nidle_ms = 30000\n[replica]\nsize = 8\n\
         Secrets are never written to logs.\nNever edit migrations/0036_fx.sql; add a new one.",
        300,
        &[
            "size = 48",
            "idle_ms = 30000",
            "Secrets are never written to logs.",
            "Never edit migrations/0036_fx.sql; add a new one.",
        ],
    );
    check_digest(
        "size = 48\nSecrets are never written to logs.\nNever edit migrations/0036_fx.sql; add a new one.",
        60,
        &["Never edit migrations/0036_fx.sql; add a new one."],
    );
    // Search hits: each file once, with its first line number.
    check_digest(
        "src/a.rs:10:fn apply_fx() {\nsrc/a.rs:42:    apply_fx();\ncrates/b/src/c.rs:7:use a::apply_fx;\nREADME.md",
        300,
        &["src/a.rs:10", "crates/b/src/c.rs:7"],
    );
    // Nothing notable: a source file, a passing test run, a success status.
    for quiet in [
        "pub fn load(&self, id: &Id) -> Result<Row, Error> {\n    let row = self.rows.get(id).ok_or(Error::Missing)?;\n    Ok(row)\n}",
        "running 3 tests\ntest a ... ok\n\ntest result: ok. 3 passed; 0 failed; 0 ignored\n[exit code: 0]",
        "",
    ] {
        check_digest(quiet, 300, &[]);
    }
    // No budget, no digest.
    check_digest(build, 0, &[]);
}

/// Each line of `content` that [`notable_lines`] picks, with "error" or "rule".
fn check_notable(content: &str, expected: &[(&str, &str)]) {
    let got: Vec<(&str, &str)> = notable_lines(content, 0, 1)
        .into_values()
        .map(|(rank, line)| (if rank == 0 { "error" } else { "rule" }, line))
        .collect();
    assert_eq!(got, expected, "{content}");
}

/// The odd lines of `content` are exactly `expected`, most odd first.
fn check_odd(content: &str, expected: &[&str]) {
    let got: Vec<&str> = odd_lines(content).into_iter().map(|(_, l, _)| l).collect();
    assert_eq!(got, expected, "{content}");
}

#[test]
fn odd_lines_table() {
    // The odd value of a column that holds few: a loopback address and a backlog among
    // the same ones (the header's shape is rare too).
    let mut ss = String::from("State Recv-Q Send-Q Local Peer\n");
    for i in 0..30 {
        let _ = writeln!(
            ss,
            "LISTEN 0 128 0.0.0.0:{} 0.0.0.0:* users:((\"w{i}\",pid={}))",
            20_000 + i * 7,
            900 + i
        );
    }
    ss.push_str("LISTEN 0 511 127.0.0.1:6379 0.0.0.0:* users:((\"cache\",pid=77))\n");
    // (The header's shape is rare and its words are its own: it comes first.)
    check_odd(
        &ss,
        &[
            "State Recv-Q Send-Q Local Peer",
            "LISTEN 0 511 127.0.0.1:6379 0.0.0.0:* users:((\"cache\",pid=77))",
        ],
    );
    // A key whose words no other key uses, among keys drawn from a few words.
    let words = ["ledger", "refund", "tenant", "quota", "audit"];
    let mut config = String::new();
    for i in 0..40 {
        let _ = writeln!(
            config,
            "\"{}_{}\": {},",
            words[i % 5],
            words[(i / 5) % 5],
            i * 13
        );
    }
    config.push_str("\"retry_budget_ms\": 2750,\n");
    check_odd(&config, &["\"retry_budget_ms\": 2750,"]);
    // A stack's frames after a log: the application's frame differs from the
    // framework's in several columns.
    let mut log = String::new();
    for i in 0..20 {
        let _ = writeln!(
            log,
            "10:00:{i:02} INFO [main] c.a.Worker - handled in {i} ms"
        );
    }
    log.push_str("java.lang.RuntimeException: posting failed\n");
    for (pkg, class) in [("web", "Filter"), ("tx", "Proxy"), ("aop", "Chain")] {
        let _ = writeln!(
            log,
            "\tat org.springframework.{pkg}.{class}.invoke({class}.java:42)"
        );
    }
    log.push_str("\tat com.acme.ledger.Posting.apply(Posting.java:118)\n");
    log.push_str("Caused by: java.lang.IllegalStateException: period 2031 is closed\n");
    let odd = odd_lines(&log);
    assert_eq!(
        odd.first().map(|(_, l, _)| *l),
        Some("at com.acme.ledger.Posting.apply(Posting.java:118)"),
        "{odd:?}"
    );
    // Source code has no template; a listing whose every line has its own name and
    // nothing else odd has no odd line.
    check_odd(
        "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\n",
        &[],
    );
    let freeze: String = (0..50)
        .map(|i| {
            format!(
                "pkg{}=={}.{}.{}\n",
                ["alpha", "beta", "gamma", "delta", "omega"][i % 5].repeat(1 + i / 5),
                i % 7,
                i,
                i * 37 % 211
            )
        })
        .collect();
    check_odd(&freeze, &[]);
}

#[test]
fn an_exception_chain_keeps_the_first_frame_the_application_frame_and_the_cause() {
    let mut log = String::new();
    for i in 0..20 {
        let _ = writeln!(
            log,
            "10:00:{i:02} INFO [main] c.a.Worker - handled in {i} ms"
        );
    }
    log.push_str("java.lang.RuntimeException: posting failed\n");
    for (pkg, class) in [
        ("web", "Filter"),
        ("tx", "Proxy"),
        ("aop", "Chain"),
        ("orm", "Session"),
    ] {
        let _ = writeln!(
            log,
            "\tat org.springframework.{pkg}.{class}.invoke({class}.java:42)"
        );
    }
    log.push_str("\tat com.acme.ledger.Posting.apply(Posting.java:118)\n");
    log.push_str(
        "Caused by: java.lang.IllegalStateException: period 2031 is closed\n\t... 12 more\n",
    );
    check_digest(
        &log,
        300,
        &[
            "java.lang.RuntimeException: posting failed",
            "at org.springframework.web.Filter.invoke(Filter.java:42)",
            "at com.acme.ledger.Posting.apply(Posting.java:118)",
            "Caused by: java.lang.IllegalStateException: period 2031 is closed",
            "... 12 more",
        ],
    );
}

#[test]
fn the_summary_puts_repeated_lines_last_and_keeps_few_questions_open() {
    let mut messages = Vec::new();
    for i in 0..30 {
        messages.push(Message::text(
            MessageRole::Assistant,
            format!("Step {i}: Next I look at what the tool shows."),
        ));
    }
    for i in 0..8 {
        messages.push(Message::text(
            MessageRole::Assistant,
            format!("Which port does daemon_{i} use?"),
        ));
    }
    messages.push(tool(
        "[masked: the output of shell (900 tokens) was archived as block b; call recall with this block_id to see it; its notable lines:]\nLISTEN 0 511 127.0.0.1:6379",
        false,
    ));
    messages.push(Message::user(
        "[Nerve] Archived lines that mention what was just said (`x`), from block b:\nsrc/a.rs:1",
    ));
    // The odd line and the five newest questions come first; older questions and the
    // thirty steps alike go when room runs out, and Nerve's note never comes in.
    check_extractive(
        &messages,
        None,
        430,
        &["LISTEN 0 511 127.0.0.1:6379", "daemon_7", "daemon_3"],
        &["daemon_0", "Step ", "[Nerve]", "src/a.rs:1"],
    );
}

#[test]
fn failure_words_count_only_where_tools_print_labels() {
    // Labels as tools print them: at the start of a line, after a timestamp or a
    // program's `name: `, after a diagnostic's `path:line:col:`, in `thread '…'
    // panicked at`, and verdicts in capitals.
    for line in [
        "error[E0308]: mismatched types",
        "  error: could not compile `billing`",
        "src/db/schema.rs:42: error[E0308]: mismatched types",
        "src/x.c:4:2: fatal error: x.h: No such file or directory",
        "thread 'main' panicked at src/main.rs:3:5",
        "test ledger::tests::exact ... FAILED",
        "FAILED tests/test_rows.py::test_load - AssertionError",
        "test result: FAILED. 1 passed; 1 failed; 0 ignored",
        "2026-05-01T12:00:00Z ERROR api: request failed",
        "[ERROR] Failed to execute goal",
        "ValueError: bad row",
        "panic: runtime error: index out of range",
        "ls: cannot access 'x': No such file or directory",
        "Traceback (most recent call last):",
    ] {
        check_notable(line, &[("error", line.trim())]);
    }
    // The same words in code, in a file read or in a search hit, and a search hit's
    // rule: nothing (the search hits are paths found, see `found`).
    for line in [
        "        return Err(\"failed to load row\".into());",
        "    panic!(\"corrupt page {id}\");",
        "        failed += 1;",
        "    if self.failed.len() > 3 {",
        "    if level == ERROR {",
        "    except ValueError:",
        "    // failed requests are retried once",
        "src/db/load.rs:41:        return Err(\"failed to load row\".into());",
        "src/db/page.rs:88:    panic!(\"corrupt page\");",
        "crates/api/src/rate.rs:7:    // the rate must never be negative",
        "README.md:3:Builds that failed are never retried.",
        "   |             ^^^^ not found in this scope",
        "test result: ok. 40 passed; 0 failed; 0 ignored",
    ] {
        check_notable(line, &[]);
    }
    // A rule outside a search hit stays one.
    check_notable(
        "Never edit migrations/0036_fx.sql; add a new one.",
        &[("rule", "Never edit migrations/0036_fx.sql; add a new one.")],
    );
}

#[test]
fn error_digests_keep_locations_not_source_snippets() {
    // Two rustc errors: each header with its location; the quoted source lines and
    // their markers are left out, so both fit where one fitted with its snippet.
    let build = "error[E0308]: mismatched types\n  --> src/x.rs:41:9\n   |\n\
        41 |     let n: u32 = row.get(\"n\")?;\n   |                  ^^^^^^^^^^^^ expected `u32`, found `i64`\n\n\
        error[E0425]: cannot find value `rate` in this scope\n  --> src/fx.rs:7:13\n   |\n\
        7  |     let r = rate * 2;\n   |             ^^^^ not found in this scope\n";
    check_digest(
        build,
        300,
        &[
            "error[E0308]: mismatched types",
            "--> src/x.rs:41:9",
            "error[E0425]: cannot find value `rate` in this scope",
            "--> src/fx.rs:7:13",
        ],
    );
    // A failing test: where it panicked, the message after the header's colon, the
    // values.
    check_digest(
        "thread 'fx::tests::rounds' panicked at src/fx.rs:120:9:\ncalled `Option::unwrap()` on a `None` value\n",
        300,
        &[
            "thread 'fx::tests::rounds' panicked at src/fx.rs:120:9:",
            "called `Option::unwrap()` on a `None` value",
        ],
    );
    // Search hits whose source lines hold failure words and rules are the paths found,
    // each file once.
    check_digest(
        "src/db/load.rs:41:        return Err(\"failed to load row\".into());\n\
         src/db/load.rs:88:    panic!(\"corrupt page\");\n\
         crates/api/src/rate.rs:7:    // the rate must never be negative\n\
         tests/load.rs:12:fn load_fails() {",
        300,
        &[
            "src/db/load.rs:41",
            "crates/api/src/rate.rs:7",
            "tests/load.rs:12",
        ],
    );
}

#[test]
fn a_masked_placeholder_keeps_the_block_id_and_never_outgrows_the_output() {
    let block = BlockId::new();
    let result = |content: &str| {
        Message::tool_result(ToolResult {
            call_id: "c".into(),
            name: "shell".into(),
            content: content.into(),
            is_error: true,
        })
    };
    let content = |m: &Message| {
        let MessagePart::ToolResult(r) = &m.parts[0] else {
            panic!("{m:?}")
        };
        r.content.clone()
    };
    let log = format!(
        "{}error[E0308]: mismatched types\n  --> src/x.rs:41:9\n{}",
        "   Compiling serde v1.0.1\n".repeat(40),
        "   Compiling tokio\n".repeat(40)
    );
    let with = content(&masked(&result(&log), 500, block, 300));
    assert!(with.starts_with(MASKED) && with.contains(&block.to_string()));
    assert!(
        with.ends_with("lines:]\nerror[E0308]: mismatched types\n--> src/x.rs:41:9"),
        "{with}"
    );
    let bare = content(&masked(&result(&log), 500, block, 0));
    assert_eq!(
        bare,
        format!(
            "[masked: the output of shell (500 tokens) was archived as block {block}; call recall with this block_id to see it]"
        )
    );
    // A short output gets no more digest than fits in three fifths of it.
    for repeat in [1, 2, 3, 4, 6, 10] {
        let short = "error: x failed at src/a.rs:1\n".repeat(repeat);
        let placeholder = content(&masked(&result(&short), 9, block, 300));
        assert!(
            placeholder.len() <= bare.len().max(short.len() * 3 / 5),
            "{repeat}: {placeholder}"
        );
    }
}

#[test]
fn previews_keep_both_ends() {
    let content = format!("BEGIN{}END", "x".repeat(10_000));
    let block = BlockId::new();
    let text = preview(&content, 300, block, 300);
    assert!(text.contains("BEGIN") && text.ends_with("END") && text.contains(&block.to_string()));
    assert!(text.len() < 600);
    assert_eq!(text, preview(&content, 300, block, 0), "nothing notable");
    // The middle's error, left out of head and tail, is kept in the digest.
    let log = format!(
        "{}error[E0382]: borrow of moved value: `row`\n  --> src/ledger.rs:88:9\n{}",
        "   Compiling serde\n".repeat(200),
        "   Compiling tokio\n".repeat(200)
    );
    let text = preview(&log, 300, block, 300);
    assert!(
        text.contains("left out:]\nerror[E0382]: borrow of moved value: `row`\n--> src/ledger.rs:88:9\n[...]\n"),
        "{text}"
    );
    assert!(!preview(&log, 300, block, 0).contains("E0382"));
}
