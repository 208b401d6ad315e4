//! The metrics registry and helpers for collectors.
//!
//! One [`prometheus_client::registry::Registry`] per process, served on
//! `GET /metrics` (OpenMetrics text, which Prometheus scrapes natively).
//! Counters that already exist as atomics on the I/O path are exported by a
//! [`prometheus_client::collector::Collector`] that reads them at scrape
//! time (nothing is added to the I/O path); the helpers here write one
//! family per call.
//!
//! Naming (prometheus-client's rules): a counter family `x` is exposed as
//! samples `x_total`; a unit `u` is appended as `x_u` (so
//! `sluice_tenant_cpu` + seconds + counter = `sluice_tenant_cpu_seconds_total`).

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeLabelValue,
    LabelValueEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::fmt::{self, Write as _};

/// Content type of `GET /metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label value escaped for the text format (`\`, `"`, newline);
/// prometheus-client writes label values as they are.
#[derive(Debug, Clone, Copy)]
pub struct Esc<'a>(pub &'a str);

impl EncodeLabelValue for Esc<'_> {
    fn encode(&self, enc: &mut LabelValueEncoder) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => enc.write_str("\\\\")?,
                '"' => enc.write_str("\\\"")?,
                '\n' => enc.write_str("\\n")?,
                c => enc.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Encodes a registry as OpenMetrics text.
pub fn encode(reg: &Registry) -> Result<String, fmt::Error> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, reg)?;
    Ok(s)
}

/// One counter family: `name` (without `_total`), its samples.
pub fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (l, v) in samples {
        m.encode_family(&l)?
            .encode_counter::<NoLabelSet, V, f64>(&v, None)?;
    }
    Ok(())
}

/// One counter without labels.
pub fn counter<V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: V,
) -> fmt::Result {
    enc.encode_descriptor(name, help, unit, MetricType::Counter)?
        .encode_counter::<NoLabelSet, V, f64>(&v, None)
}

/// One gauge without labels.
pub fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: V,
) -> fmt::Result {
    enc.encode_descriptor(name, help, unit, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// One gauge family.
pub fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (l, v) in samples {
        m.encode_family(&l)?.encode_gauge(&v)?;
    }
    Ok(())
}

/// One histogram sample set: `buckets` are (upper bound, count in that
/// bucket, not cumulative); a last bound of `f64::MAX` is `+Inf` (added
/// when missing).
#[derive(Debug, Clone, Default)]
pub struct HistogramSample {
    pub sum: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

/// One histogram family.
pub fn histograms<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (L, HistogramSample)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Histogram)?;
    for (l, mut h) in samples {
        let in_buckets: u64 = h.buckets.iter().map(|b| b.1).sum();
        if h.buckets.last().is_none_or(|b| b.0 != f64::MAX) {
            h.buckets
                .push((f64::MAX, h.count.saturating_sub(in_buckets)));
        }
        m.encode_family(&l)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
    }
    Ok(())
}

/// One parsed sample: name, labels, value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// A minimal parser of the text exposition for tests and tools: every
/// sample as (name, labels, value). `# ` lines are skipped.
pub fn parse_text(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.strip_suffix('}').unwrap_or(rest))),
            None => (head, Vec::new()),
        };
        out.push((name.to_string(), labels, value));
    }
    out
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let mut v = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => v.push('\n'),
                    Some((_, c)) => v.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => v.push(c),
            }
        }
        out.push((k.trim_start_matches(',').trim().to_string(), v));
        rest = &after[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;

    #[derive(Debug)]
    struct Demo;

    impl Collector for Demo {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            counters(
                &mut enc,
                "demo_ios",
                "I/Os.",
                None,
                [([("tenant", Esc("a\"b"))], 3u64)],
            )?;
            counters(
                &mut enc,
                "demo_cpu",
                "CPU.",
                Some(&Unit::Seconds),
                [([("tenant", Esc("a"))], 0.5f64)],
            )?;
            histograms(
                &mut enc,
                "demo_latency",
                "Latency.",
                Some(&Unit::Seconds),
                [(
                    [("tenant", Esc("a"))],
                    HistogramSample {
                        sum: 1.0,
                        count: 5,
                        buckets: vec![(0.001, 2), (0.01, 2)],
                    },
                )],
            )
        }
    }

    #[test]
    fn families_and_escaping() {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Demo));
        let text = encode(&reg).expect("encodes");
        let s = parse_text(&text);
        let find = |n: &str| s.iter().find(|x| x.0 == n).map(|x| x.2);
        assert_eq!(find("demo_ios_total"), Some(3.0), "{text}");
        assert_eq!(find("demo_cpu_seconds_total"), Some(0.5), "{text}");
        assert_eq!(find("demo_latency_seconds_count"), Some(5.0), "{text}");
        let inf = s
            .iter()
            .find(|x| x.0 == "demo_latency_seconds_bucket" && x.1.iter().any(|l| l.1 == "+Inf"))
            .map(|x| x.2);
        assert_eq!(inf, Some(5.0), "{text}");
        let ios = s.iter().find(|x| x.0 == "demo_ios_total").map(|x| &x.1);
        assert_eq!(
            ios,
            Some(&vec![("tenant".to_string(), "a\"b".to_string())]),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
