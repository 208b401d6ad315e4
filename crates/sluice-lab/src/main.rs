//! `sluice-lab`: the papers' experiments, kept out of the shipped `sluice`
//! binary. Each subcommand starts Sluice targets in this process (the
//! library crates, not the `sluice` binary), drives them with
//! `sluice-bench` and writes a Markdown table and SVG plots under `--out`
//! (default `docs/experiments`).
//!
//! * tenants and CPU (docs/tenants.md): `fairness`, `noisy`, `cpu`,
//!   `ksplit`, and `all` for the four in turn;
//! * isolated data path (docs/isolation.md): `pinof-fig5`, `pinof-fig6`,
//!   `coalescing`, and `isolation` for the three in turn, on the fast path
//!   with repeats (`--runtime 10 --repeats 5` by default).
//!
//! Modules: one per experiment under `tenant/` and `datapath/` (each group's
//! harness in its `mod.rs`, the CPU experiments' victims and hog in
//! `tenant/cpu_setup.rs`), every target configuration in `configs.rs`, plots
//! in `plot.rs`, output and statistics in `report.rs`.

mod affinity;
mod configs;
mod datapath;
mod flint;
mod plot;
mod report;
mod stall;
mod tenant;
mod volumes;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "sluice-lab",
    version,
    about = "The papers' experiments against in-process Sluice targets: tables and plots under docs/experiments",
    long_about = "The papers' experiments against in-process Sluice targets: tables and plots under docs/experiments. These are long benchmarks: run them from a release build (`cargo run --release -p sluice-lab -- <experiment>`) on an otherwise idle machine."
)]
struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. `info`, `sluice_target=debug`.
    #[arg(long, global = true, default_value = "info", env = "SLUICE_LOG")]
    log: String,
    #[command(subcommand)]
    experiment: Experiment,
}

#[derive(Debug, Subcommand)]
enum Experiment {
    /// Bandwidth fairness (Flint W1-W5), weights 1:2:4 and limits on the
    /// scaled emulated SSD: fairness.md, fairness-{jain-bytes,jain-device,weights}.svg.
    Fairness(RunArgs),
    /// Noisy neighbour: a QD 1 reader next to a 128 KiB QD 32 reader, with
    /// and without isolation: noisy-neighbour.md, noisy-neighbour.svg.
    #[command(visible_alias = "noisy-neighbour")]
    Noisy(RunArgs),
    /// CPU isolation, i-NVMe Figs. 1, 4, 7 (root, cgroup v1 `cpu`):
    /// cpu-isolation.md, cpu-fig1-4-{df,iops}.svg, cpu-fig7.svg.
    Cpu(CpuArgs),
    /// k-split throttling, i-NVMe Fig. 3 (root, cgroup v1 `cpu`): ksplit.md,
    /// ksplit-{latency,iops,df}.svg.
    #[command(visible_alias = "k-split")]
    Ksplit(CpuArgs),
    /// fairness, noisy, cpu and ksplit in turn.
    All(AllArgs),
    /// PINoF Fig. 5: 4 KiB random I/O at QD 8, varying write ratio, per send
    /// scheduler: pinof-fig5.md, pinof-fig5-{ram,ssd}-{latency,p99,bandwidth}.svg.
    #[command(name = "pinof-fig5")]
    PinofFig5(DatapathArgs),
    /// PINoF Fig. 6: random writes at QD 8, 4 KiB to 128 KiB, priorities vs
    /// Nprio: pinof-fig6.md, pinof-fig6-{ram,ssd}-{iops,latency}.svg.
    #[command(name = "pinof-fig6")]
    PinofFig6(DatapathArgs),
    /// Latency-aware coalescing Figs. 6-8 (the target's response coalescing
    /// on the fast path; QD 1, QD 32, bursty and Barrier workloads):
    /// coalescing.md, coalescing-{iops,latency,notifications}.svg.
    Coalescing(DatapathArgs),
    /// pinof-fig5, pinof-fig6 and coalescing in turn.
    Isolation(DatapathArgs),
    /// Elastic volumes: extent map cost, extent faults with redb and etcd,
    /// Flint Fig. 7c (bandwidth over N drives) and Fig. 8 (replica write
    /// latency): volumes.md, volumes-fig7c.svg.
    Volumes(RunArgs),
    /// Rebuilding a failed drive's replicas under a foreground workload
    /// (goal: the foreground keeps >= 80 % of its bandwidth):
    /// volumes-rebuild.md.
    VolumeRebuild(RunArgs),
    /// Socket engines at the wire: epoll, blocking, busy polling and
    /// io_uring (waiting, spinning, zero-copy sends, multishot receive)
    /// serving the floor's batched loop: socket-engines.md.
    Sockets(RepeatArgs),
    /// Flint Fig. 10: a 4 KiB victim volume beside a 128 KiB streamer on one
    /// drive, eIO scheduler off and on: eio-fig10.md.
    Eio(EioArgs),
    /// Flint Fig. 9a: W1-W5, a stream on a small volume against one on a
    /// large volume over shared drives, the bandwidth auction off and on
    /// (Jain's index): auction-fig9a.md.
    Auction(RepeatArgs),
    /// Flint Figs. 9b/c: a victim volume's 32 KiB streams while another
    /// tenant congests one drive, placement with and without the shadow
    /// view's busy degree: congestion-fig9bc.md.
    Congestion(RepeatArgs),
    /// Flint §5.5: the victim placed before the drive congests, its
    /// extents remapped off it (sluice control --remap) or not:
    /// congestion-remap.md.
    Remap(RepeatArgs),
    /// Flint Table 1: view_query from the local copy, view_sync round trips
    /// against a TCP ping-pong, the agent's CPU per 100k IOPS:
    /// view-table1.md.
    View(RepeatArgs),
}

/// Flags of the experiments that repeat each point.
#[derive(Debug, Clone, Args)]
pub(crate) struct RepeatArgs {
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    pub out: PathBuf,
    /// Seconds per run.
    #[arg(long, default_value_t = 10.0, value_parser = seconds, allow_negative_numbers = true)]
    pub runtime: f64,
    /// Repeats of every point (median and range reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeats: u32,
}

/// Flags of the data path experiments (PINoF, coalescing).
#[derive(Debug, Clone, Args)]
pub(crate) struct DatapathArgs {
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    pub out: PathBuf,
    /// Seconds per point.
    #[arg(long, default_value_t = 10.0, value_parser = seconds, allow_negative_numbers = true)]
    pub runtime: f64,
    /// Repeats of every point (median and range reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeats: u32,
    /// Namespaces to run on (the PINoF figures; coalescing runs on RAM):
    /// ram, ssd (the emulated SSD), or both.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "ram,ssd")]
    pub backends: Vec<Backend>,
}

/// A data path experiment's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Backend {
    Ram,
    Ssd,
}

impl DatapathArgs {
    /// The command line that reproduces this run of `experiment` (one
    /// that runs on RAM only: no `--backends`).
    pub(crate) fn command(&self, experiment: &str) -> String {
        format!(
            "sluice-lab {experiment} --runtime {} --repeats {}",
            self.runtime, self.repeats
        )
    }

    /// [`Self::command`] for an experiment that runs on `--backends`.
    pub(crate) fn command_on_backends(&self, experiment: &str) -> String {
        let names: Vec<String> = self
            .backends
            .iter()
            .filter_map(|b| clap::ValueEnum::to_possible_value(b).map(|v| v.get_name().to_string()))
            .collect();
        format!(
            "{} --backends {}",
            self.command(experiment),
            names.join(",")
        )
    }

    /// The chosen namespaces with their table names, each once, in the
    /// order given.
    pub(crate) fn backends(
        &self,
        ram: sluice_config::NamespaceConfig,
        ssd: sluice_config::NamespaceConfig,
    ) -> Vec<(&'static str, sluice_config::NamespaceConfig)> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for b in &self.backends {
            if seen.contains(b) {
                continue;
            }
            seen.push(*b);
            out.push(match b {
                Backend::Ram => ("RAM", ram.clone()),
                Backend::Ssd => ("emulated SSD", ssd.clone()),
            });
        }
        out
    }
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err("must be a positive number of seconds".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Flags of `eio`.
#[derive(Debug, Clone, Args)]
pub(crate) struct EioArgs {
    #[command(flatten)]
    pub repeat: RepeatArgs,
    /// Caps on the bytes in flight per drive to run with the scheduler on
    /// (KiB, comma-separated), each against the same run with it off.
    #[arg(long, value_delimiter = ',', default_value = "1024,512,384,256",
          value_parser = clap::value_parser!(u64).range(4..=65_536))]
    pub caps_kib: Vec<u64>,
    /// The drive target's polling (`interrupt`, `adaptive[:SPIN_US]`,
    /// `busy-poll`). Interrupt by default: target and client share this
    /// machine's CPUs, and a spinning target takes them from the client.
    #[arg(long, default_value = "interrupt")]
    pub target_polling: sluice_runtime::PollingPolicy,
}

/// Flags of the bandwidth and latency experiments.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    pub out: PathBuf,
    /// Seconds per bandwidth/latency run.
    #[arg(long, default_value_t = 3.0, value_parser = seconds, allow_negative_numbers = true)]
    pub runtime: f64,
}

/// Flags of the CPU experiments.
#[derive(Debug, Clone, Args)]
pub(crate) struct CpuArgs {
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    pub out: PathBuf,
    /// Parent cgroup (v1 `cpu`) for the CPU experiments.
    #[arg(long, default_value = "/sys/fs/cgroup/cpu")]
    pub cgroup_root: PathBuf,
    /// Measure every point this many times and report the median (and the
    /// range).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

/// Flags of `all`: those of every experiment it runs.
#[derive(Debug, Clone, Args)]
struct AllArgs {
    /// Directory for tables and plots.
    #[arg(long, default_value = "docs/experiments")]
    out: PathBuf,
    /// Seconds per bandwidth/latency run.
    #[arg(long, default_value_t = 3.0, value_parser = seconds, allow_negative_numbers = true)]
    runtime: f64,
    /// Parent cgroup (v1 `cpu`) for the CPU experiments.
    #[arg(long, default_value = "/sys/fs/cgroup/cpu")]
    cgroup_root: PathBuf,
    /// CPU experiments: measure every point this many times and report the
    /// median (and the range).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    repeat: u32,
}

fn run(e: Experiment) -> anyhow::Result<()> {
    match e {
        Experiment::Fairness(a) => tenant::fairness::run(&a),
        Experiment::Noisy(a) => tenant::noisy::run(&a),
        Experiment::Cpu(a) => tenant::cpu::run(&a),
        Experiment::Ksplit(a) => tenant::ksplit::run(&a),
        Experiment::All(a) => {
            let r = RunArgs {
                out: a.out.clone(),
                runtime: a.runtime,
            };
            let c = CpuArgs {
                out: a.out,
                cgroup_root: a.cgroup_root,
                repeat: a.repeat,
            };
            tenant::fairness::run(&r)?;
            tenant::noisy::run(&r)?;
            tenant::cpu::run(&c)?;
            tenant::ksplit::run(&c)
        }
        Experiment::PinofFig5(a) => datapath::pinof_fig5::run(&a),
        Experiment::PinofFig6(a) => datapath::pinof_fig6::run(&a),
        Experiment::Coalescing(a) => datapath::coalescing::run(&a),
        Experiment::Volumes(a) => volumes::run(&a.out, a.runtime),
        Experiment::VolumeRebuild(a) => volumes::run_rebuild(&a.out, a.runtime),
        Experiment::Eio(a) => flint::run_eio(&a),
        Experiment::Sockets(a) => datapath::sockets::run(&a.out, a.runtime, a.repeats),
        Experiment::View(a) => flint::run_view(&a.out, a.repeats),
        Experiment::Auction(a) => flint::run_auction(&a.out, a.runtime, a.repeats),
        Experiment::Congestion(a) => {
            flint::run_congestion(&a.out, a.runtime, a.repeats, flint::Avoid::Placement)
        }
        Experiment::Remap(a) => {
            flint::run_congestion(&a.out, a.runtime, a.repeats, flint::Avoid::Remap)
        }
        Experiment::Isolation(a) => {
            datapath::pinof_fig5::run(&a)?;
            datapath::pinof_fig6::run(&a)?;
            datapath::coalescing::run(&a)
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(cli.experiment) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn datapath_runs_name_their_command_line() {
        let cli = Cli::try_parse_from([
            "sluice-lab",
            "pinof-fig5",
            "--runtime",
            "2",
            "--backends",
            "ssd,ram,ssd",
        ])
        .expect("parse");
        let Experiment::PinofFig5(a) = cli.experiment else {
            panic!("pinof-fig5 parsed as something else");
        };
        assert_eq!(a.repeats, 5);
        assert_eq!(
            a.command_on_backends("pinof-fig5"),
            "sluice-lab pinof-fig5 --runtime 2 --repeats 5 --backends ssd,ram,ssd"
        );
        assert_eq!(
            a.command("coalescing"),
            "sluice-lab coalescing --runtime 2 --repeats 5"
        );
        let names: Vec<&str> = a
            .backends(configs::ram(), configs::ssd())
            .iter()
            .map(|b| b.0)
            .collect();
        assert_eq!(
            names,
            ["emulated SSD", "RAM"],
            "each once, in the order given"
        );
        assert!(Cli::try_parse_from(["sluice-lab", "pinof-fig6", "--backends", "nvme"]).is_err());
        assert!(Cli::try_parse_from(["sluice-lab", "coalescing", "--repeats", "0"]).is_err());
    }

    #[test]
    fn eio_takes_caps_and_the_targets_polling_and_refuses_bad_ones() {
        let cli = Cli::try_parse_from(["sluice-lab", "eio"]).expect("parse");
        let Experiment::Eio(a) = cli.experiment else {
            panic!("eio parsed as something else");
        };
        assert_eq!(a.caps_kib, [1024, 512, 384, 256]);
        assert_eq!(a.target_polling, sluice_runtime::PollingPolicy::Interrupt);
        let cli = Cli::try_parse_from([
            "sluice-lab",
            "eio",
            "--caps-kib",
            "256,128",
            "--target-polling",
            "busy-poll",
        ])
        .expect("parse");
        let Experiment::Eio(a) = cli.experiment else {
            panic!("eio parsed as something else");
        };
        assert_eq!(a.caps_kib, [256, 128]);
        assert_eq!(a.target_polling, sluice_runtime::PollingPolicy::BusyPoll);
        for bad in [
            ["--caps-kib", "0"],
            ["--caps-kib", "256,x"],
            ["--target-polling", "sometimes"],
        ] {
            let e = Cli::try_parse_from(["sluice-lab", "eio", bad[0], bad[1]])
                .expect_err("refused")
                .to_string();
            assert!(e.contains(bad[0]), "{bad:?}: {e}");
        }
    }
}
