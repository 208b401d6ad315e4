//! The tenant experiments of docs/tenants.md. Each starts targets in this
//! process, drives them with `sluice-bench` jobs (one host NQN per tenant)
//! and writes a Markdown table and SVG plots under `--out`. Every figure is
//! from one run; nothing is tuned to a goal.

pub mod cpu;
mod cpu_setup;
pub mod fairness;
pub mod ksplit;
pub mod noisy;

use crate::configs::TENANT_SUBNQN;
use anyhow::Result;
use sluice_bench::{BenchArgs, BenchReport, JobReport};
use sluice_config::Config;
use sluice_target::{Target, TargetHandle};

/// Starts a target with `config` (one of `crate::configs`' targets).
fn target(config: &Config) -> Result<TargetHandle> {
    Ok(Target::start(config)?)
}

/// Runs `jobs` (bench job specs) against `t` for `runtime` seconds.
fn bench(t: &TargetHandle, jobs: &[String], runtime: f64) -> Result<BenchReport> {
    let mut a = BenchArgs::new(t.local_addr().to_string(), TENANT_SUBNQN);
    a.runtime = Some(runtime);
    a.jobs = jobs.to_vec();
    a.span = Some("256m".into());
    sluice_bench::run(a)
}

/// The job called `name`, or the total if there is none.
fn job<'a>(r: &'a BenchReport, name: &str) -> &'a JobReport {
    r.jobs.iter().find(|j| j.name == name).unwrap_or(&r.total)
}
