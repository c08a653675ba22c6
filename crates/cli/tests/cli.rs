//! The `nerve` binary's own surface: every command of the contract is there, and usage
//! errors exit 2. (Its presence also makes `cargo test --workspace` build the binary that
//! the end-to-end tests in `tests/` drive.)

#![allow(clippy::unwrap_used)] // A test helper: a failure to spawn is a test failure.

use std::process::Command;

fn nerve(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nerve"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_command_of_the_contract_is_there() {
    let help = String::from_utf8(nerve(&["--help"]).stdout).unwrap();
    for command in [
        "run", "replay", "resume", "list", "show", "events", "verify", "approve",
    ] {
        assert!(help.contains(command), "`{command}` missing from:\n{help}");
    }
    let run = String::from_utf8(nerve(&["run", "--help"]).stdout).unwrap();
    for flag in [
        "--workspace",
        "--task",
        "--task-file",
        "--provider",
        "--model",
        "--loop",
        "--complexity",
        "--max-turns",
        "--timeout",
        "--budget-usd",
        "--budget-tokens",
        "--context-window",
        "--image",
        "--json",
    ] {
        assert!(run.contains(flag), "`{flag}` missing from:\n{run}");
    }
    assert!(
        run.contains("plan_execute"),
        "loop values are spelled as the contract says:\n{run}"
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["run", "--workspace", "."][..],
        &[
            "run",
            "--workspace",
            ".",
            "--task",
            "x",
            "--loop",
            "plan-execute",
        ][..],
        &["run", "--workspace", ".", "--task", "x", "--max-turns", "0"][..],
    ] {
        let output = nerve(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
