//! `sluice target` and `sluice check-config`.

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_config::{Config, PollingPolicy, DEFAULT_SUBSYSTEM_NQN};
use sluice_target::Target;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// TOML configuration file; without it, the embedded default (one 1 GiB
    /// RAM namespace, loopback only, any host admitted). Re-read on SIGHUP
    /// or `POST /v1/reload` to the admin endpoint (which answers with what
    /// changed): subsystems added or removed whole, namespaces added to or
    /// removed from a subsystem, `file` namespaces grown (their file or
    /// device grown underneath, or a created file's `size` raised; hosts
    /// are told of namespace changes by an event), changed host lists, DH-HMAC-CHAP settings and `[[tenant]]` entries (a tenant no longer listed is
    /// deleted) apply without a restart; any other change is refused and
    /// logged.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// I/O listen address (overrides the file).
    #[arg(long)]
    pub listen: Option<String>,
    /// Discovery listen address; "" disables the discovery port.
    #[arg(long)]
    pub discovery_listen: Option<String>,
    /// Address to advertise in discovery log entries (NAT, port forwarding).
    #[arg(long)]
    pub advertise_addr: Option<String>,
    /// Port to advertise in discovery log entries.
    #[arg(long)]
    pub advertise_port: Option<u16>,
    /// Worker threads.
    #[arg(long)]
    pub workers: Option<usize>,
    /// interrupt | busy-poll | adaptive
    #[arg(long)]
    pub polling: Option<String>,
    /// Adaptive polling: spin this long after the last work before sleeping
    /// (4 times as long while idle spells average under that: a steady load).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub adaptive_spin_us: u32,
    /// Size of the default RAM namespace when no --config is given (e.g. 4GiB).
    #[arg(long)]
    pub ram_size: Option<String>,
    /// Restrict the default subsystem to these host NQNs (repeatable).
    #[arg(long = "allow-host")]
    pub allow_hosts: Vec<String>,
    /// Send scheduler of every queue: immediate | unified | isolated
    /// (overrides `send_scheduler` of the target and of every subsystem).
    #[arg(long)]
    pub send_scheduler: Option<String>,
    /// Completion coalescing of responses: off | static | adaptive |
    /// calibrated | calibrated-fixed (overrides `coalescing.mode` everywhere; other coalescing
    /// keys keep their configured values).
    #[arg(long)]
    pub coalescing: Option<String>,
    /// Report every namespace's I/O (from the target's own counters) to the
    /// shadow view of the control plane at HOST:PORT[,HOST:PORT...].
    #[arg(long)]
    pub view_control: Option<String>,
    /// File holding the control plane's bearer token, with --view-control.
    #[arg(long, requires = "view_control")]
    pub view_token_file: Option<PathBuf>,
    /// The port as the pool's drives name it (default: the listen address;
    /// an unspecified host matches any host with that port).
    #[arg(long, requires = "view_control")]
    pub view_port: Option<String>,
    /// Time between reports.
    #[arg(long, default_value_t = 100, requires = "view_control",
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub view_interval_ms: u64,
}

fn load(args: &TargetArgs) -> Result<Config> {
    let mut c = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading config file {}", p.display()))?;
            Config::from_toml(&text)
                .with_context(|| format!("validating config file {}", p.display()))?
        }
        None => Config::embedded_default(),
    };
    let t = &mut c.target;
    if let Some(l) = &args.listen {
        t.listen = l
            .parse()
            .with_context(|| format!("parsing --listen `{l}` as address:port"))?;
    }
    if let Some(l) = &args.discovery_listen {
        t.discovery_listen = if l.is_empty() {
            None
        } else {
            Some(
                l.parse()
                    .with_context(|| format!("parsing --discovery-listen `{l}`"))?,
            )
        };
    }
    if let Some(a) = &args.advertise_addr {
        t.advertise_addr = Some(a.clone());
    }
    if let Some(p) = args.advertise_port {
        t.advertise_port = Some(p);
    }
    if let Some(w) = args.workers {
        if w == 0 || w > sluice_config::WORKERS_MAX {
            bail!(
                "--workers {w} is outside 1..={}",
                sluice_config::WORKERS_MAX
            );
        }
        t.workers = w;
    }
    if let Some(p) = &args.polling {
        t.polling = PollingPolicy::parse(p, args.adaptive_spin_us)
            .map_err(|e| anyhow::anyhow!("--polling: {e}"))?;
    } else if let PollingPolicy::Adaptive { .. } = t.polling {
        if args.config.is_none() {
            t.polling = PollingPolicy::Adaptive {
                spin_us: args.adaptive_spin_us,
            };
        }
    }
    apply_send_overrides(&mut c, args)?;
    if args.config.is_none() {
        let sub = &mut c.subsystems[0];
        if let Some(s) = &args.ram_size {
            let bytes =
                sluice_config::parse_size(s).map_err(|e| anyhow::anyhow!("--ram-size: {e}"))?;
            if bytes == 0 || bytes % 512 != 0 {
                bail!("--ram-size must be a non-zero multiple of 512 bytes");
            }
            sub.namespaces[0].size_bytes = Some(bytes);
        }
        if !args.allow_hosts.is_empty() {
            for (i, h) in args.allow_hosts.iter().enumerate() {
                sluice_config::validate_nqn(&format!("--allow-host[{i}]"), h)?;
            }
            sub.allow_any_host = false;
            sub.hosts = args.allow_hosts.clone();
        }
    } else if args.ram_size.is_some() || !args.allow_hosts.is_empty() {
        bail!("--ram-size and --allow-host apply to the embedded default only; set them in the config file");
    }
    Ok(c)
}

/// `--send-scheduler` and `--coalescing`: applied to the target's send
/// settings and to every per-subsystem override, then validated again.
fn apply_send_overrides(c: &mut Config, args: &TargetArgs) -> Result<()> {
    use sluice_proto::coalesce::CoalesceMode;
    use sluice_proto::send::SchedulerKind;
    let kind = match &args.send_scheduler {
        Some(s) => Some(
            s.parse::<SchedulerKind>()
                .map_err(|e| anyhow::anyhow!("--send-scheduler: {e}"))?,
        ),
        None => None,
    };
    let mode = match &args.coalescing {
        Some(s) => Some(
            s.parse::<CoalesceMode>()
                .map_err(|e| anyhow::anyhow!("--coalescing: {e}"))?,
        ),
        None => None,
    };
    let t = &mut c.target;
    for (name, sc) in std::iter::once(("target".to_string(), &mut t.send)).chain(
        t.subsystem_send
            .iter_mut()
            .map(|(n, sc)| (format!("subsystem {n}"), sc)),
    ) {
        if let Some(k) = kind {
            sc.scheduler = k;
        }
        if let Some(m) = mode {
            sc.coalescing.mode = m;
        }
        if let Err((key, why)) = sc.validate() {
            bail!("{name}: {key}: {why} (after --send-scheduler/--coalescing)");
        }
    }
    Ok(())
}

pub fn check(path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let c = Config::from_toml(&text)
        .with_context(|| format!("validating config file {}", path.display()))?;
    println!(
        "configuration OK: listen {}, {} subsystem(s)",
        c.target.listen,
        c.subsystems.len()
    );
    for s in &c.subsystems {
        let access = if s.allow_any_host {
            "ANY host".to_string()
        } else {
            format!("{} listed host(s)", s.hosts.len())
        };
        println!(
            "  {} ({} namespace(s), admits {access})",
            s.nqn,
            s.namespaces.len()
        );
    }
    Ok(())
}

pub fn run(args: TargetArgs) -> Result<()> {
    let config = load(&args)?;
    let handle = Target::start_with(&config, &VolumeClient).context("starting the target")?;
    let addr = handle.local_addr();
    let disc = handle.discovery_addr();
    let first = config
        .subsystems
        .first()
        .map(|s| s.nqn.clone())
        .unwrap_or_else(|| DEFAULT_SUBSYSTEM_NQN.into());
    println!(
        "sluice target listening on {addr}{}",
        disc.map(|d| format!(", discovery on {d}"))
            .unwrap_or_default()
    );
    for s in &config.subsystems {
        let access = if s.allow_any_host {
            "admits ANY host".to_string()
        } else {
            format!("admits {} listed host(s)", s.hosts.len())
        };
        println!(
            "  subsystem {} : {} namespace(s), {access}",
            s.nqn,
            s.namespaces.len()
        );
    }
    println!();
    println!("Connect with nvme-cli (on a Linux host with nvme-tcp):");
    if let Some(d) = disc {
        println!("  nvme discover -t tcp -a {} -s {}", d.ip(), d.port());
    }
    println!(
        "  nvme connect -t tcp -a {} -s {} -n {first}",
        addr.ip(),
        addr.port()
    );
    println!("Connect with sluice:");
    if let Some(d) = disc {
        println!("  sluice discover -a {d}");
    }
    println!("  sluice bench --target {addr} --nqn {first} --rw randrw --bs 4k --qd 32 --runtime 10 --verify");
    println!("  sluice nbd --target {addr} --nqn {first} --unix /tmp/sluice.sock   # serves it to NBD clients (fio, qemu-img)");
    println!("Press Ctrl-C to stop (in-flight commands are drained, backends flushed).");
    if let Some(p) = &args.config {
        println!(
            "Send SIGHUP (kill -HUP {}), or POST /v1/reload to the admin endpoint, to apply subsystems and namespaces added or removed, file namespaces grown, host lists and tenants changed in {} without a restart.",
            std::process::id(),
            p.display()
        );
    }

    if args.config.is_some() {
        let (a, reg, tenants) = (
            args.clone(),
            handle.registry().clone(),
            handle.tenants().clone(),
        );
        handle.set_reload_action(Box::new(move || {
            reload_file(&a, &reg, &tenants, "admin API").map(|r| r.to_json())
        }));
    }
    let handle = Arc::new(handle);
    let _agent = match &args.view_control {
        None => None,
        Some(control) => Some(start_view_agent(&args, control, &handle)?),
    };

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing the signal handler")?;
    }
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())
        .context("installing the SIGHUP handler")?;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if reload.swap(false, Ordering::Relaxed) {
            if args.config.is_some() {
                let _ = reload_file(&args, handle.registry(), handle.tenants(), "SIGHUP");
            } else {
                tracing::warn!(
                    "SIGHUP: no --config file to reload (started on the embedded default)"
                );
            }
        }
    }
    let uptime = handle.uptime();
    tracing::info!("shutting down");
    drop(_agent);
    let handle = Arc::try_unwrap(handle)
        .map_err(|_| anyhow::anyhow!("the view agent still holds the target"))?;
    let report = handle.shutdown();
    let worker_cpu: Duration = report.workers.iter().map(|w| w.cpu).sum();
    println!(
        "target stopped after {:.1}s: worker CPU {:.3}s ({:.1}% of one core), process CPU {:.3}s",
        uptime.as_secs_f64(),
        worker_cpu.as_secs_f64(),
        100.0 * worker_cpu.as_secs_f64() / uptime.as_secs_f64().max(1e-9),
        report.process_cpu.as_secs_f64()
    );
    for w in &report.workers {
        println!(
            "  worker {}: cpu {:.3}s, {} loop iterations, {} connections",
            w.worker,
            w.cpu.as_secs_f64(),
            w.loops,
            w.connections
        );
    }
    println!(
        "{}",
        sluice_target::metrics::send_summary(&report.send, report.io_commands)
    );
    Ok(())
}

/// Re-reads the configuration file (with the same command-line overrides)
/// and applies its subsystems (added, removed, their access) and its
/// tenants, on SIGHUP or `POST /v1/reload` (`via`, for the log); anything
/// else changed, or a file that does not parse, is refused and logged, and
/// the running configuration stays. The error says why.
fn reload_file(
    args: &TargetArgs,
    reg: &sluice_target::registry::Registry,
    tenants: &sluice_target::tenant::TenantRuntime,
    via: &str,
) -> std::result::Result<sluice_target::reload::ReloadReport, String> {
    let path = args.config.as_deref().unwrap_or(std::path::Path::new("-"));
    let refused = |why: String| {
        tracing::error!(
            "{via}: reload of {} refused, the running configuration stays: {why}",
            path.display()
        );
        why
    };
    let config = match load(args) {
        Ok(c) => c,
        Err(e) => {
            reg.reloads.record(false);
            return Err(refused(format!("{e:#}")));
        }
    };
    match sluice_target::reload::reload_with(reg, tenants, &config, &VolumeClient) {
        Ok(report) if report.is_empty() => {
            tracing::info!("{via}: {} reloaded, nothing changed", path.display());
            Ok(report)
        }
        Ok(report) => {
            tracing::info!(
                subsystems_added = ?report.subsystems_added,
                subsystems_removed = ?report.subsystems_removed.iter().map(|r| &r.nqn).collect::<Vec<_>>(),
                namespaces_added = ?report.namespaces_added,
                namespaces_removed = ?report.namespaces_removed,
                namespaces_grown = ?report.namespaces_grown.iter().map(|g| (&g.nqn, g.nsid, g.size_bytes)).collect::<Vec<_>>(),
                access_changed = report.access.len(),
                tenants = ?report.tenants,
                tenants_removed = ?report.tenants_removed,
                "{via}: {} reloaded",
                path.display()
            );
            Ok(report)
        }
        Err(e) => Err(refused(e.to_string())),
    }
}

/// The view agent's runtime thread; dropping it stops the agent.
struct ViewAgent {
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for ViewAgent {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Starts the target's view agent: `--view-control`'s shadow view gets
/// every namespace's I/O from this target's counters.
fn start_view_agent(
    args: &TargetArgs,
    control: &str,
    handle: &Arc<sluice_target::TargetHandle>,
) -> Result<ViewAgent> {
    let token = args
        .view_token_file
        .as_deref()
        .map(|p| {
            sluice_admin::BearerToken::from_file(p)
                .with_context(|| format!("reading --view-token-file {}", p.display()))
        })
        .transpose()?;
    let port = match &args.view_port {
        Some(p) => {
            if p.rsplit_once(':')
                .is_none_or(|(h, n)| h.is_empty() || n.parse::<u16>().is_err())
            {
                bail!("--view-port {p:?} is not HOST:PORT");
            }
            p.clone()
        }
        None => handle.local_addr().to_string(),
    };
    // Its own runtime thread: the target's workers never wait on it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("view-agent")
        .enable_all()
        .build()
        .context("starting the view agent's runtime")?;
    let client = {
        let _g = rt.enter();
        sluice_control::ControlClient::new(control, token.as_ref())
            .map_err(|e| anyhow::anyhow!("--view-control {control}: {e}"))?
    };
    let h = handle.clone();
    let counters = move || {
        h.namespace_counters()
            .into_iter()
            .map(|c| sluice_flint::TargetCounters {
                nqn: c.nqn,
                nsid: c.nsid,
                ios: c.ios,
                write_ios: c.write_ios,
                bytes: c.bytes,
                latency_us_sum: c.latency_us_sum,
            })
            .collect()
    };
    println!("reporting to the shadow view of {control} as {port}");
    rt.spawn(sluice_control::isolation::target_agent(
        client,
        port,
        Duration::from_millis(args.view_interval_ms),
        counters,
    ));
    Ok(ViewAgent { rt: Some(rt) })
}

/// Opens `backend = "volume"` namespaces with `sluice-control`'s client.
/// The drive connections use the host NQN
/// `nqn.2026-11.io.sluice:target-volumes`, which the drives must admit.
struct VolumeClient;

/// Host NQN of a target's connections to the drives of its volumes.
pub const VOLUME_HOSTNQN: &str = "nqn.2026-11.io.sluice:target-volumes";

impl sluice_target::VolumeOpener for VolumeClient {
    fn open_volume(
        &self,
        name: &str,
        control: &str,
        token_file: Option<&std::path::Path>,
    ) -> std::result::Result<std::sync::Arc<dyn sluice_backend::Backend>, String> {
        let opts = sluice_host::ConnectOptions {
            hostnqn: VOLUME_HOSTNQN.into(),
            io_queues: 2,
            ..sluice_host::ConnectOptions::default()
        };
        let b = sluice_control::backend::VolumeBackend::open(name, control, token_file, opts)
            .map_err(|e| {
                format!("opening volume {name:?} through the control plane at {control}: {e}")
            })?;
        tracing::info!(volume = name, %control, geometry = ?sluice_backend::Backend::geometry(&b), "volume namespace opened");
        Ok(std::sync::Arc::new(b))
    }
}
