//! TOML shapes of the send path settings (`send_scheduler`, `[target.send]`,
//! `[target.coalescing]`, and the same keys per `[[subsystem]]`), merged over
//! the target's values and validated with errors naming the key.

use crate::config::ConfigError;
use crate::send::{SchedulerKind, SendConfig};
use serde::Deserialize;
use sluice_proto::coalesce::CoalesceMode;
use std::time::Duration;

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSend {
    unified_size: Option<toml::Value>,
    unified_degree: Option<i64>,
    unified_timer_us: Option<i64>,
    latency_size: Option<toml::Value>,
    latency_degree: Option<i64>,
    latency_timer_us: Option<i64>,
    data_size: Option<toml::Value>,
    data_degree: Option<i64>,
    data_timer_us: Option<i64>,
    weight_r2t: Option<i64>,
    weight_response: Option<i64>,
    weight_data: Option<i64>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCoalescing {
    mode: Option<String>,
    threshold: Option<i64>,
    timeout_us: Option<i64>,
    correction: Option<f64>,
    /// "out-of-order" | "flush-all"
    urgent: Option<String>,
    hold_max_us: Option<i64>,
}

fn e(key: String, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key,
        reason: reason.into(),
    }
}

fn size(prefix: &str, name: &str, v: &toml::Value) -> Result<u32, ConfigError> {
    let key = format!("{prefix}.send.{name}");
    let n = match v {
        toml::Value::Integer(i) if *i >= 0 => *i as u64,
        toml::Value::String(s) => crate::config::parse_size(s).map_err(|r| e(key.clone(), r))?,
        other => return Err(e(key, format!("{other} is not a size"))),
    };
    u32::try_from(n).map_err(|_| e(key, format!("{n} is too large")))
}

fn int(prefix: &str, table: &str, name: &str, v: i64) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| {
        e(
            format!("{prefix}.{table}.{name}"),
            format!("{v} is negative or too large"),
        )
    })
}

/// Applies `scheduler`, `send` and `coalescing` over `base`; `prefix` is
/// `target` or `subsystem[i]`.
pub(crate) fn resolve(
    base: &SendConfig,
    prefix: &str,
    scheduler: Option<&str>,
    send: Option<&RawSend>,
    co: Option<&RawCoalescing>,
) -> Result<SendConfig, ConfigError> {
    let mut c = *base;
    if let Some(s) = scheduler {
        c.scheduler = s
            .parse::<SchedulerKind>()
            .map_err(|r| e(format!("{prefix}.send_scheduler"), r))?;
    }
    if let Some(r) = send {
        let us = |v: i64, n: &str| -> Result<Duration, ConfigError> {
            Ok(Duration::from_micros(int(prefix, "send", n, v)? as u64))
        };
        if let Some(v) = &r.unified_size {
            c.unified.size_bytes = size(prefix, "unified_size", v)?;
        }
        if let Some(v) = r.unified_degree {
            c.unified.degree = int(prefix, "send", "unified_degree", v)?;
        }
        if let Some(v) = r.unified_timer_us {
            c.unified.timer = us(v, "unified_timer_us")?;
        }
        if let Some(v) = &r.latency_size {
            c.latency.size_bytes = size(prefix, "latency_size", v)?;
        }
        if let Some(v) = r.latency_degree {
            c.latency.degree = int(prefix, "send", "latency_degree", v)?;
        }
        if let Some(v) = r.latency_timer_us {
            c.latency.timer = us(v, "latency_timer_us")?;
        }
        if let Some(v) = &r.data_size {
            c.data.size_bytes = size(prefix, "data_size", v)?;
        }
        if let Some(v) = r.data_degree {
            c.data.degree = int(prefix, "send", "data_degree", v)?;
        }
        if let Some(v) = r.data_timer_us {
            c.data.timer = us(v, "data_timer_us")?;
        }
        if let Some(v) = r.weight_r2t {
            c.weights.r2t = int(prefix, "send", "weight_r2t", v)?;
        }
        if let Some(v) = r.weight_response {
            c.weights.response = int(prefix, "send", "weight_response", v)?;
        }
        if let Some(v) = r.weight_data {
            c.weights.data = int(prefix, "send", "weight_data", v)?;
        }
    }
    if let Some(r) = co {
        if let Some(m) = &r.mode {
            c.coalescing.mode = m
                .parse::<CoalesceMode>()
                .map_err(|x| e(format!("{prefix}.coalescing.mode"), x))?;
        }
        if let Some(v) = r.threshold {
            c.coalescing.threshold = int(prefix, "coalescing", "threshold", v)?;
        }
        if let Some(v) = r.timeout_us {
            c.coalescing.timeout =
                Duration::from_micros(int(prefix, "coalescing", "timeout_us", v)? as u64);
        }
        if let Some(v) = r.correction {
            c.coalescing.correction = v;
        }
        if let Some(u) = &r.urgent {
            c.coalescing.urgent_out_of_order = match u.as_str() {
                "out-of-order" => true,
                "flush-all" => false,
                o => {
                    return Err(e(
                        format!("{prefix}.coalescing.urgent"),
                        format!("`{o}` is not one of out-of-order, flush-all"),
                    ))
                }
            };
        }
        if let Some(v) = r.hold_max_us {
            c.coalescing.hold_max =
                Duration::from_micros(int(prefix, "coalescing", "hold_max_us", v)? as u64);
        }
    }
    c.validate()
        .map_err(|(k, r)| e(format!("{prefix}.{k}"), r))?;
    Ok(c)
}
