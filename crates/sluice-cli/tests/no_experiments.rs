//! The shipped `sluice` binary carries no experiments: they live in
//! `sluice-lab` (crates/sluice-lab).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn help_does_not_mention_experiments() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--help")
        .output()
        .expect("sluice runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(help.contains("target"), "{help}");
    assert!(!help.contains("experiment"), "`sluice --help`:\n{help}");
}

#[test]
fn experiment_is_not_a_subcommand() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["experiment", "fairness"])
        .output()
        .expect("sluice runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("experiment"), "{err}");
}
