//! End-to-end tests: the real `nerve` binary against real SQLite and a real Docker engine.
//! Docker-dependent tests skip with a printed reason when no engine answers, unless
//! `NERVE_REQUIRE_DOCKER=1` (set by `cargo xtask ci` and `test-sandbox`), where they fail.

// Test helpers may unwrap and print: a failure here is a test failure with its reason.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod anthropic;
mod bad_input;
mod compaction;
mod contracts;
mod crash;
mod demo;
mod faults;
mod inspect;
mod interrupt;
mod json;
mod killpoints;
mod loops;
mod parked;
mod phoenix;
mod proxy;
mod real;
mod reaper;
mod resume;
mod sandbox;
mod sandbox_env;
mod stream;
mod support;
mod traces;
mod transfer;
