//! `sluice-lab` lists every experiment, and wrong flags give a clear error
//! naming the flag, a non-zero exit and never a panic. Nothing here runs an
//! experiment (they are long benchmarks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice-lab"))
        .args(args)
        .output()
        .expect("sluice-lab runs")
}

/// The bandwidth/latency experiments (`--out`, `--runtime`).
const RUN: [&str; 6] = [
    "fairness",
    "noisy",
    "pinof-fig5",
    "pinof-fig6",
    "coalescing",
    "isolation",
];
/// The CPU experiments (`--out`, `--cgroup-root`, `--repeat`).
const CPU: [&str; 2] = ["cpu", "ksplit"];

fn fails_naming(args: &[&str], needle: &str) {
    let out = lab(args);
    let err = String::from_utf8_lossy(&out.stderr);
    let cmd = format!("sluice-lab {}", args.join(" "));
    assert!(!out.status.success(), "`{cmd}` should fail");
    assert_eq!(
        out.status.code(),
        Some(2),
        "`{cmd}`: usage errors exit 2: {err}"
    );
    assert!(!err.contains("panicked"), "`{cmd}` panicked: {err}");
    assert!(
        err.contains(needle),
        "`{cmd}`: error should name `{needle}`: {err}"
    );
    assert!(out.stdout.is_empty(), "`{cmd}` wrote to stdout");
}

#[test]
fn help_lists_every_experiment() {
    let out = lab(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for name in RUN.iter().chain(&CPU).chain(&["all"]) {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{name} "))),
            "`sluice-lab --help` does not list `{name}`:\n{help}"
        );
    }
}

#[test]
fn every_experiment_has_help_with_its_flags() {
    for name in RUN {
        let out = lab(&[name, "--help"]);
        assert!(out.status.success(), "{name} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in ["--out", "--runtime", "docs/experiments"] {
            assert!(help.contains(flag), "{name} --help lacks {flag}:\n{help}");
        }
    }
    for name in CPU {
        let out = lab(&[name, "--help"]);
        assert!(out.status.success(), "{name} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in ["--out", "--cgroup-root", "--repeat", "/sys/fs/cgroup/cpu"] {
            assert!(help.contains(flag), "{name} --help lacks {flag}:\n{help}");
        }
    }
    let out = lab(&["all", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--out", "--runtime", "--cgroup-root", "--repeat"] {
        assert!(help.contains(flag), "all --help lacks {flag}:\n{help}");
    }
}

#[test]
fn no_or_unknown_experiment() {
    fails_naming(&[], "Usage");
    fails_naming(&["fairnes"], "fairnes");
    fails_naming(&["experiment", "fairness"], "experiment");
}

#[test]
fn bandwidth_experiments_bad_flags() {
    for name in RUN {
        fails_naming(&[name, "--runtime", "abc"], "--runtime");
        fails_naming(&[name, "--runtime", "0"], "--runtime");
        fails_naming(&[name, "--runtime", "-1"], "--runtime");
        fails_naming(&[name, "--runtime", "inf"], "--runtime");
        fails_naming(&[name, "--runtime"], "--runtime");
        fails_naming(&[name, "--out"], "--out");
        fails_naming(&[name, "--bogus"], "--bogus");
        // CPU-only flags are refused rather than silently ignored.
        fails_naming(&[name, "--repeat", "3"], "--repeat");
        fails_naming(&[name, "--cgroup-root", "/tmp"], "--cgroup-root");
    }
}

#[test]
fn cpu_experiments_bad_flags() {
    for name in CPU {
        fails_naming(&[name, "--repeat", "0"], "--repeat");
        fails_naming(&[name, "--repeat", "21"], "--repeat");
        fails_naming(&[name, "--repeat", "many"], "--repeat");
        fails_naming(&[name, "--repeat"], "--repeat");
        fails_naming(&[name, "--cgroup-root"], "--cgroup-root");
        fails_naming(&[name, "--out"], "--out");
        fails_naming(&[name, "--bogus"], "--bogus");
        fails_naming(&[name, "--runtime", "3"], "--runtime");
    }
}

#[test]
fn all_bad_flags() {
    fails_naming(&["all", "--runtime", "abc"], "--runtime");
    fails_naming(&["all", "--runtime", "0"], "--runtime");
    fails_naming(&["all", "--repeat", "0"], "--repeat");
    fails_naming(&["all", "--cgroup-root"], "--cgroup-root");
    fails_naming(&["all", "--bogus"], "--bogus");
}

#[test]
fn aliases_parse_like_their_experiment() {
    for (alias, name) in [("k-split", "ksplit"), ("noisy-neighbour", "noisy")] {
        let a = lab(&[alias, "--help"]);
        let n = lab(&[name, "--help"]);
        assert!(a.status.success(), "{alias} --help");
        assert_eq!(a.stdout, n.stdout, "{alias} and {name} differ");
    }
}
