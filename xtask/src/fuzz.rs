//! `cargo xtask fuzz [--minutes N] [TARGET]`: runs the proptest fuzz targets (the `fuzz`
//! test of each crate that has one) with fresh random seeds, pass after pass, until the
//! time is up (split evenly between the targets), and fails on the first failure or hang.
//! Proptest keeps every failing case in the crate's `proptest-regressions/`, where every
//! later run (and `cargo test`) replays it first: commit those files as regression tests.
//! An ordinary `cargo test --workspace` (so CI) runs each target once, 256 cases.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, describe};

/// The fuzz targets: a short name, its package and its test binary.
const TARGETS: &[(&str, &str)] = &[
    ("session", "nerve-session"),
    ("brain", "nerve-brain"),
    ("executor", "nerve-executor"),
];

/// Cases per pass: long enough that building and starting the test binary is noise, short
/// enough that the time budget is kept within a pass.
const CASES_PER_PASS: &str = "2000";

/// A pass that takes longer than this is a hang (a pass takes seconds).
const HANG: Duration = Duration::from_secs(600);

pub(crate) fn fuzz(args: &[String]) -> Result<()> {
    let mut minutes = 1.0_f64;
    let mut only = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--minutes" => {
                let value = rest.next().context("--minutes needs a number")?;
                minutes = value
                    .parse()
                    .ok()
                    .filter(|m: &f64| m.is_finite() && *m > 0.0)
                    .with_context(|| format!("--minutes {value} is not a positive number"))?;
            }
            name => match TARGETS.iter().find(|(short, _)| *short == name) {
                Some(target) => only = Some(*target),
                None => bail!(
                    "unknown fuzz target `{name}` (targets: {})",
                    TARGETS
                        .iter()
                        .map(|(short, _)| *short)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        }
    }
    let targets: Vec<(&str, &str)> = only.map_or_else(|| TARGETS.to_vec(), |t| vec![t]);
    let budget = Duration::from_secs_f64(minutes * 60.0 / targets.len() as f64);
    for (short, package) in targets {
        // Built once, outside the time budget.
        crate::run(cargo().args(["test", "--package", package, "--test", "fuzz", "--no-run"]))?;
        let started = Instant::now();
        let mut passes = 0u32;
        while started.elapsed() < budget {
            pass(package)?;
            passes += 1;
        }
        eprintln!(
            "fuzz {short}: {passes} passes of {CASES_PER_PASS} cases per target in {:.0} s, no failure",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// One pass of a package's fuzz targets with a fresh seed.
fn pass(package: &str) -> Result<()> {
    let mut command = cargo();
    command
        .args(["test", "--quiet", "--package", package, "--test", "fuzz"])
        .env("PROPTEST_CASES", CASES_PER_PASS);
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", describe(&command)))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!(
                    "`{}` failed ({status}); the failing case is kept in the package's proptest-regressions/fuzz.txt",
                    describe(&command)
                );
            }
            return Ok(());
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            bail!(
                "`{}` hung: no result after {} s",
                describe(&command),
                HANG.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
