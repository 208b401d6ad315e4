//! The tenant experiments of docs/tenants.md. Each starts targets in this
//! process, drives them with `sluice-bench` jobs (one host NQN per tenant)
//! and writes a Markdown table and SVG plots under `--out`. Every figure is
//! from one run; nothing is tuned to a goal.

pub mod cpu;
mod cpu_setup;
pub mod fairness;
pub mod ksplit;
pub mod noisy;

use crate::configs::{self, TENANT_SUBNQN};
use anyhow::Result;
use sluice_bench::{BenchArgs, BenchReport, JobReport};
use sluice_target::{Target, TargetHandle};

/// Starts a one-worker target with `tenants` sections and `backend`.
fn target(tenants: &str, backend: &str) -> Result<TargetHandle> {
    target_workers(tenants, backend, 1)
}

fn target_workers(tenants: &str, backend: &str, workers: u32) -> Result<TargetHandle> {
    let c = configs::tenant_target(tenants, backend, workers)?;
    Ok(Target::start(&c)?)
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
