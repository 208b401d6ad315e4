//! `sluice top`: live per-tenant view polled from a target's admin endpoint,
//! or, with `--control`, the shadow view of a control plane: every drive,
//! target port and client with its throughput, latency and queueing delay,
//! the congested ones, and the victim sessions of the last analysis.

use anyhow::{bail, Context, Result};
use sluice_admin::schema::{interval_quantile, TenantStats, TenantStatsReport};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Admin endpoint of the target (`[tenants] admin_listen`).
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub admin: String,
    /// Bearer token of the admin endpoint (`[tenants] admin_token_file`).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Seconds between samples.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many samples (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// Show the shadow view of the control plane at HOST:PORT instead of a
    /// target's tenants.
    #[arg(long)]
    pub control: Option<String>,
    /// File holding the control plane's bearer token, with --control.
    #[arg(long, env = "SLUICE_TOKEN_FILE", requires = "control")]
    pub token_file: Option<std::path::PathBuf>,
}

fn kind_name(e: Option<&sluice_control::pb::ViewEntity>) -> String {
    use sluice_control::pb::view_entity::Kind;
    match e.and_then(|e| e.kind.as_ref()) {
        Some(Kind::Drive(d)) => format!("drive d{d}"),
        Some(Kind::IoPipe(p)) => format!("port {p}"),
        Some(Kind::NetPipe(c)) => format!("client {c}"),
        None => "?".into(),
    }
}

/// Renders one view snapshot as a table; `names` maps volume ids to names
/// (an id missing from it is shown as `v<id>`).
pub fn render_view(s: &sluice_control::pb::ViewSnapshot, names: &BTreeMap<u64, String>) -> String {
    let mut out = format!(
        "{:<34} {:>10} {:>9} {:>10} {:>10} {:>6} {:>5} {:>11} {:>11} {:>9}\n",
        "ENTITY",
        "MB/s",
        "IOPS",
        "LAT us",
        "QDELAY us",
        "BUSY",
        "CONG",
        "TGT MB/s",
        "TGT LAT us",
        "PATH us"
    );
    for v in &s.entities {
        let w = v.stats.unwrap_or_default();
        // Drives whose target reports: what the target itself sees.
        let (tgt_mb, tgt_lat) = v.target.map_or((String::new(), String::new()), |t| {
            (
                format!("{:.1}", t.bytes_per_sec / 1e6),
                format!("{:.0}", t.latency_us_mean),
            )
        });
        let path = v
            .path_delay_us
            .map(|p| format!("{p:.0}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<34} {:>10.1} {:>9.0} {:>10.0} {:>10.0} {:>6.2} {:>5} {:>11} {:>11} {:>9}\n",
            kind_name(v.entity.as_ref()),
            w.bytes_per_sec / 1e6,
            w.iops,
            w.latency_us_mean,
            w.queue_delay_us_mean,
            v.busy_degree,
            if v.congested { "yes" } else { "" },
            tgt_mb,
            tgt_lat,
            path
        ));
        // A drive's heaviest volumes, with their share of its bytes.
        for l in &v.volumes {
            let w = l.stats.unwrap_or_default();
            let name = names.get(&l.volume).map_or_else(
                || format!("v{}", l.volume),
                |n| format!("{n} (v{})", l.volume),
            );
            out.push_str(&format!(
                "{:<34} {:>10.1} {:>9.0} {:>10.0} {:>10.0} {:>5.0}%\n",
                format!("  volume {name}"),
                w.bytes_per_sec / 1e6,
                w.iops,
                w.latency_us_mean,
                w.queue_delay_us_mean,
                l.share * 100.0
            ));
        }
        // Samples past the drive's limits: someone is missing above.
        if v.untracked_volume_samples > 0 || v.untracked_session_samples > 0 {
            out.push_str(&format!(
                "  untracked samples: {} past the volume limit, {} past the session limit\n",
                v.untracked_volume_samples, v.untracked_session_samples
            ));
        }
    }
    let r = s.report.clone().unwrap_or_default();
    out.push_str(&format!("epoch {}: ", r.epoch));
    if r.victims.is_empty() {
        out.push_str("no congestion\n");
    } else {
        let v: Vec<String> = r
            .victims
            .iter()
            .map(|v| {
                format!(
                    "{}->d{} (by {})",
                    v.client,
                    v.drive,
                    kind_name(v.bound.as_ref())
                )
            })
            .collect();
        out.push_str(&format!("victims {}\n", v.join(", ")));
    }
    out
}

fn run_view(a: &TopArgs, control: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let token = a
        .token_file
        .as_deref()
        .map(sluice_admin::BearerToken::from_file)
        .transpose()?;
    let client = {
        let _g = rt.enter();
        sluice_control::ControlClient::new(control, token.as_ref())?
    };
    let mut n = 0u64;
    loop {
        let snap = rt
            .block_on(client.view_query(sluice_control::pb::ViewQueryRequest {
                entities: vec![],
                all: true,
            }))
            .with_context(|| format!("querying the view of the control plane at {control}"))?;
        // Names for the volumes the drives list; without them (an older
        // control plane, a failed call) the ids alone are shown.
        let names: BTreeMap<u64, String> = rt
            .block_on(client.list_volumes())
            .map(|vs| vs.into_iter().map(|v| (v.id, v.name)).collect())
            .unwrap_or_default();
        println!("{}", render_view(&snap, &names));
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(a.interval));
    }
}

/// Decodes `GET /v1/stats` into per-tenant samples.
pub fn parse(json: &str) -> Result<BTreeMap<String, TenantStats>> {
    let r: TenantStatsReport =
        serde_json::from_str(json).context("the admin endpoint sent bad /v1/stats JSON")?;
    Ok(r.tenants.into_iter().map(|t| (t.name.clone(), t)).collect())
}

/// One /v1/stats sample from `addr`.
pub fn scrape(addr: &str, token: Option<&str>) -> Result<BTreeMap<String, TenantStats>> {
    let r = sluice_admin::client::request(addr, "GET", "/v1/stats", "", token)
        .with_context(|| format!("cannot reach the admin endpoint {addr}"))?;
    match r.status {
        200 => parse(&r.body),
        401 => bail!("{addr} answered HTTP 401: give --admin-token or SLUICE_ADMIN_TOKEN"),
        c => bail!("{addr} answered HTTP {c}: {}", r.body.trim()),
    }
}

fn fmt_lat(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(x) if x.is_infinite() => "inf".into(),
        Some(x) if x < 1e-3 => format!("{:.0}us", x * 1e6),
        Some(x) => format!("{:.1}ms", x * 1e3),
    }
}

pub fn run(a: TopArgs) -> Result<()> {
    if a.interval.is_nan() || a.interval <= 0.0 {
        bail!("--interval must be positive");
    }
    if let Some(c) = a.control.clone() {
        return run_view(&a, &c);
    }
    let token = a.admin_token.as_deref().filter(|t| !t.is_empty());
    let scrape = || scrape(&a.admin, token);
    let mut prev = scrape()?;
    let mut t_prev = Instant::now();
    let mut n = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs_f64(a.interval));
        let cur = scrape()?;
        let dt = t_prev.elapsed().as_secs_f64();
        t_prev = Instant::now();
        println!(
            "{:<20} {:>6} {:>10} {:>10} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>6}",
            "TENANT",
            "WEIGHT",
            "IOPS",
            "MiB/s",
            "CPU%",
            "p50<=",
            "p99<=",
            "p99.9<=",
            "THROTTLE%",
            "THR/s",
            "QD"
        );
        for (name, c) in &cur {
            let p = prev.get(name).cloned().unwrap_or_default();
            let d = |c: u64, p: u64| c.saturating_sub(p) as f64;
            println!(
                "{:<20} {:>6} {:>10.0} {:>10.1} {:>7.1} {:>8} {:>8} {:>8} {:>9.1} {:>8.1} {:>6}",
                name,
                c.weight,
                d(c.ios(), p.ios()) / dt,
                d(c.bytes(), p.bytes()) / dt / 1048576.0,
                (c.cpu_seconds - p.cpu_seconds) / dt * 100.0,
                fmt_lat(interval_quantile(&p.latency, &c.latency, 0.5)),
                fmt_lat(interval_quantile(&p.latency, &c.latency, 0.99)),
                fmt_lat(interval_quantile(&p.latency, &c.latency, 0.999)),
                (c.throttle_seconds - p.throttle_seconds) / dt * 100.0,
                d(c.throttle_events, p.throttle_events) / dt,
                c.queue_depth,
            );
        }
        println!();
        prev = cur;
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sluice_admin::schema::{Bucket, Latency};

    #[test]
    fn the_view_lists_each_drives_heaviest_volumes_under_it() {
        use sluice_control::pb;
        let window = |mb: f64| pb::ViewWindow {
            bytes_per_sec: mb * 1e6,
            iops: 100.0,
            ..pb::ViewWindow::default()
        };
        let snap = pb::ViewSnapshot {
            epoch: 3,
            entities: vec![pb::EntityView {
                entity: Some(pb::ViewEntity {
                    kind: Some(pb::view_entity::Kind::Drive(2)),
                }),
                stats: Some(window(40.0)),
                volumes: vec![
                    pb::ViewVolumeLoad {
                        volume: 5,
                        stats: Some(window(30.0)),
                        share: 0.75,
                    },
                    pb::ViewVolumeLoad {
                        volume: 0,
                        stats: Some(window(10.0)),
                        share: 0.25,
                    },
                ],
                untracked_volume_samples: 12,
                ..pb::EntityView::default()
            }],
            report: None,
        };
        let names = BTreeMap::from([(5, "db".to_owned())]);
        let out = render_view(&snap, &names);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].starts_with("drive d2"), "{out}");
        assert!(
            lines[2].starts_with("  volume db (v5)") && lines[2].ends_with("75%"),
            "{out}"
        );
        assert!(lines[2].contains(" 30.0 "), "{out}");
        // A volume the listing did not name shows its id.
        assert!(
            lines[3].starts_with("  volume v0 ") && lines[3].ends_with("25%"),
            "{out}"
        );
        // Samples past the drive's limits are said under it.
        assert_eq!(
            lines[4], "  untracked samples: 12 past the volume limit, 0 past the session limit",
            "{out}"
        );
    }

    #[test]
    fn decodes_target_stats() {
        let json = r#"{"generation": 2, "unattributed_cpu_seconds": 0.5, "tenants": [
          {"name": "a", "weight": 2, "read_ios": 10, "write_ios": 5, "other_ios": 0,
           "read_bytes": 40960, "write_bytes": 20480, "errors": 0, "cpu_seconds": 0.25,
           "throttle_events": 3, "throttle_seconds": 0.1, "sched_wait_seconds": 0.0,
           "queue_depth": 4, "latency": {"count": 15, "sum_seconds": 0.003,
           "buckets": [{"le_seconds": 0.000128, "count": 3}, {"le_seconds": 0.001, "count": 14}]}}]}"#;
        let m = parse(json).unwrap();
        let a = &m["a"];
        assert_eq!(
            (a.ios(), a.bytes(), a.weight, a.queue_depth),
            (15, 61440, 2, 4)
        );
        let none = Latency::default();
        assert_eq!(interval_quantile(&none, &a.latency, 0.1), Some(0.000128));
        assert_eq!(interval_quantile(&none, &a.latency, 0.5), Some(0.001));
        assert_eq!(
            interval_quantile(&none, &a.latency, 0.99),
            Some(f64::INFINITY)
        );
        // Between two samples only the new I/Os count.
        let later = Latency {
            count: 25,
            sum_seconds: 0.004,
            buckets: vec![
                Bucket {
                    le_seconds: 0.000128,
                    count: 13,
                },
                Bucket {
                    le_seconds: 0.001,
                    count: 24,
                },
            ],
            ..Default::default()
        };
        assert_eq!(interval_quantile(&a.latency, &later, 0.99), Some(0.000128));
        assert!(parse("{}").is_err());
    }
}
