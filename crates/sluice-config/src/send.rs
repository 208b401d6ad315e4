//! The send path settings: `send_scheduler`, `[target.send]`,
//! `[target.coalescing]` and the same keys per `[[subsystem]]`, merged over
//! the target's values and validated with errors naming the key. The
//! values are `sluice_proto::send::SendConfig` (shared with the host).

use crate::{err, ConfigError};
use serde::{Deserialize, Serialize};
use sluice_proto::coalesce::CoalesceMode;
use sluice_proto::send::{SchedulerKind, SendConfig};
use std::time::Duration;

/// `[*.send]` as written (sizes: integers or strings with units).
#[derive(Debug, Deserialize, Serialize, Default, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawSend {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unified_size: Option<toml::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unified_degree: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unified_timer_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) latency_size: Option<toml::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) latency_degree: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) latency_timer_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data_size: Option<toml::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data_degree: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) data_timer_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight_r2t: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight_response: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) weight_data: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) flush_when_idle: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) responses_after_data: Option<bool>,
}

/// `coalescing.urgent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Urgent {
    /// Urgent completions bypass held ones.
    OutOfOrder,
    /// An urgent completion flushes everything held.
    FlushAll,
}

/// `[*.coalescing]` as written.
#[derive(Debug, Deserialize, Serialize, Default, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawCoalescing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) threshold: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout_us: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) correction: Option<f64>,
    /// "out-of-order" | "flush-all"
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) urgent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) hold_max_us: Option<i64>,
}

fn size(prefix: &str, name: &str, v: &toml::Value) -> Result<u32, ConfigError> {
    let key = format!("{prefix}.send.{name}");
    let n = match v {
        toml::Value::Integer(i) => {
            u64::try_from(*i).map_err(|_| err(key.clone(), format!("{i} is not a size")))?
        }
        toml::Value::String(s) => {
            crate::parse_size(s).map_err(|r| err(key.clone(), r.to_string()))?
        }
        other => return Err(err(key, format!("{other} is not a size"))),
    };
    u32::try_from(n).map_err(|_| err(key, format!("{n} is too large")))
}

fn int(prefix: &str, table: &str, name: &str, v: i64) -> Result<u32, ConfigError> {
    u32::try_from(v).map_err(|_| {
        err(
            format!("{prefix}.{table}.{name}"),
            format!("{v} is negative or too large"),
        )
    })
}

/// Applies `scheduler`, `send` and `coalescing` over `base`; `prefix` is
/// `target` or `subsystem[i]`.
pub fn resolve(
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
            .map_err(|r| err(format!("{prefix}.send_scheduler"), r))?;
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
        if let Some(v) = r.flush_when_idle {
            c.flush_when_idle = v;
        }
        if let Some(v) = r.responses_after_data {
            c.responses_after_data = v;
        }
    }
    if let Some(r) = co {
        if let Some(m) = &r.mode {
            c.coalescing.mode = m
                .parse::<CoalesceMode>()
                .map_err(|x| err(format!("{prefix}.coalescing.mode"), x))?;
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
            let u: Urgent =
                crate::parse_word(u).map_err(|r| err(format!("{prefix}.coalescing.urgent"), r))?;
            c.coalescing.urgent_out_of_order = u == Urgent::OutOfOrder;
        }
        if let Some(v) = r.hold_max_us {
            c.coalescing.hold_max =
                Duration::from_micros(int(prefix, "coalescing", "hold_max_us", v)? as u64);
        }
    }
    c.validate()
        .map_err(|(k, r)| err(format!("{prefix}.{k}"), r))?;
    Ok(c)
}

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Every key of `c`, as written in a file (`send_scheduler`, `send`,
/// `coalescing`); [`resolve`] reads them back to `c`.
pub fn to_raw(c: &SendConfig) -> (String, RawSend, RawCoalescing) {
    let size = |n: u32| Some(toml::Value::Integer(i64::from(n)));
    let send = RawSend {
        unified_size: size(c.unified.size_bytes),
        unified_degree: Some(i64::from(c.unified.degree)),
        unified_timer_us: Some(us(c.unified.timer)),
        latency_size: size(c.latency.size_bytes),
        latency_degree: Some(i64::from(c.latency.degree)),
        latency_timer_us: Some(us(c.latency.timer)),
        data_size: size(c.data.size_bytes),
        data_degree: Some(i64::from(c.data.degree)),
        data_timer_us: Some(us(c.data.timer)),
        weight_r2t: Some(i64::from(c.weights.r2t)),
        weight_response: Some(i64::from(c.weights.response)),
        weight_data: Some(i64::from(c.weights.data)),
        flush_when_idle: Some(c.flush_when_idle),
        responses_after_data: Some(c.responses_after_data),
    };
    let k = &c.coalescing;
    let co = RawCoalescing {
        mode: Some(k.mode.name().to_string()),
        threshold: Some(i64::from(k.threshold)),
        timeout_us: Some(us(k.timeout)),
        correction: Some(k.correction),
        urgent: Some(crate::word_of(&if k.urgent_out_of_order {
            Urgent::OutOfOrder
        } else {
            Urgent::FlushAll
        })),
        hold_max_us: Some(us(k.hold_max)),
    };
    (c.scheduler.name().to_string(), send, co)
}
