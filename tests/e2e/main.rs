//! End-to-end tests: the real `nerve` binary against real SQLite and a real Docker engine.
//! Docker-dependent tests skip with a printed reason when no engine answers, unless
//! `NERVE_REQUIRE_DOCKER=1` (set by `cargo xtask ci` and `test-sandbox`), where they fail.

// Test helpers may unwrap and print: a failure here is a test failure with its reason.
#![allow(clippy::unwrap_used, clippy::print_stderr)]

mod acp;
mod anthropic;
mod bad_input;
mod chat;
mod compaction;
mod contracts;
mod crash;
mod delegate;
mod demo;
mod faults;
mod fleet;
mod fork;
mod hooks;
mod inspect;
mod instructions;
mod interrupt;
mod invocation;
mod json;
mod killpoints;
mod loops;
mod mcp;
mod parked;
mod pg_tls;
mod phoenix;
mod proxy;
#[cfg(feature = "real-servers")]
mod real;
mod reaper;
mod resume;
mod rewind;
mod rules;
mod sandbox;
mod sandbox_env;
mod sandbox_python;
mod serve;
mod serve_browser;
mod serve_log;
mod serve_tls;
mod settings;
mod skills;
mod stream;
mod support;
mod traces;
mod transfer;
