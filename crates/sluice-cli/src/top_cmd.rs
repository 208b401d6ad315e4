//! `sluice top`: live per-tenant view polled from a target's admin endpoint.

use anyhow::{bail, Context, Result};
use sluice_target::tenant::admin::http_request;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Admin endpoint of the target (`[tenants] admin_listen`).
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub admin: String,
    /// Seconds between samples.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many samples (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

/// Per-tenant values of one /metrics scrape.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    pub ios: f64,
    pub bytes: f64,
    pub cpu_s: f64,
    pub throttle_s: f64,
    pub throttle_events: f64,
    pub queue_depth: f64,
    pub weight: f64,
    /// Cumulative latency histogram (upper bound in s, count).
    pub lat: Vec<(f64, f64)>,
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=\"");
    let i = labels.find(&pat)? + pat.len();
    let j = labels[i..].find('"')? + i;
    Some(&labels[i..j])
}

/// Parses the Prometheus text of a Sluice target into per-tenant samples.
pub fn parse(text: &str) -> BTreeMap<String, Sample> {
    let mut m: BTreeMap<String, Sample> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = name_labels.split_once('{') else {
            continue;
        };
        let Some(t) = label(labels, "tenant") else {
            continue;
        };
        let s = m.entry(t.to_string()).or_default();
        match name {
            "sluice_tenant_ios_total" => s.ios += v,
            "sluice_tenant_bytes_total" => s.bytes += v,
            "sluice_tenant_cpu_seconds_total" => s.cpu_s = v,
            "sluice_tenant_throttle_seconds_total" => s.throttle_s = v,
            "sluice_tenant_throttle_events_total" => s.throttle_events = v,
            "sluice_tenant_queue_depth" => s.queue_depth = v,
            "sluice_tenant_weight" => s.weight = v,
            "sluice_tenant_latency_seconds_bucket" => {
                let le = label(labels, "le").unwrap_or("+Inf");
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                s.lat.push((le, v));
            }
            _ => {}
        }
    }
    m
}

/// Upper bound of quantile `q` of the latency recorded between two samples.
pub fn quantile(prev: &[(f64, f64)], cur: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = cur.last()?.1 - prev.last().map_or(0.0, |p| p.1);
    if total <= 0.0 {
        return None;
    }
    for (i, (le, c)) in cur.iter().enumerate() {
        let p = prev.get(i).map_or(0.0, |p| p.1);
        if c - p >= q * total {
            return Some(*le);
        }
    }
    None
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
    let scrape = || -> Result<BTreeMap<String, Sample>> {
        let (code, body) = http_request(&a.admin, "GET", "/metrics", "")
            .with_context(|| format!("cannot reach the admin endpoint {}", a.admin))?;
        if code != 200 {
            bail!("{} answered HTTP {code}", a.admin);
        }
        Ok(parse(&body))
    };
    let mut prev = scrape()?;
    let mut t_prev = Instant::now();
    let mut n = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs_f64(a.interval));
        let cur = scrape()?;
        let dt = t_prev.elapsed().as_secs_f64();
        t_prev = Instant::now();
        println!(
            "{:<20} {:>6} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9} {:>8} {:>6}",
            "TENANT",
            "WEIGHT",
            "IOPS",
            "MiB/s",
            "CPU%",
            "p50<=",
            "p99<=",
            "THROTTLE%",
            "THR/s",
            "QD"
        );
        for (name, c) in &cur {
            let p = prev.get(name).cloned().unwrap_or_default();
            println!(
                "{:<20} {:>6} {:>10.0} {:>10.1} {:>7.1} {:>8} {:>8} {:>9.1} {:>8.1} {:>6}",
                name,
                c.weight,
                (c.ios - p.ios) / dt,
                (c.bytes - p.bytes) / dt / 1048576.0,
                (c.cpu_s - p.cpu_s) / dt * 100.0,
                fmt_lat(quantile(&p.lat, &c.lat, 0.5)),
                fmt_lat(quantile(&p.lat, &c.lat, 0.99)),
                (c.throttle_s - p.throttle_s) / dt * 100.0,
                (c.throttle_events - p.throttle_events) / dt,
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
mod tests {
    use super::*;

    #[test]
    fn parses_target_metrics() {
        let text = "# TYPE x counter\nsluice_tenant_ios_total{tenant=\"a\",op=\"read\"} 10\nsluice_tenant_ios_total{tenant=\"a\",op=\"write\"} 5\nsluice_tenant_latency_seconds_bucket{tenant=\"a\",le=\"0.000128\"} 3\nsluice_tenant_latency_seconds_bucket{tenant=\"a\",le=\"+Inf\"} 15\nsluice_tenant_weight{tenant=\"a\"} 2\n";
        let m = parse(text);
        let a = &m["a"];
        assert_eq!(a.ios, 15.0);
        assert_eq!(a.weight, 2.0);
        assert_eq!(quantile(&[], &a.lat, 0.1), Some(0.000128));
        assert_eq!(quantile(&[], &a.lat, 0.99), Some(f64::INFINITY));
    }
}
