//! `deploy/grafana/sluice.json` parses, has the `tenant` variable, and
//! queries only metric families Sluice exposes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

const KNOWN: &[&str] = &[
    "sluice_tenant_ios_total",
    "sluice_tenant_bytes_total",
    "sluice_tenant_errors_total",
    "sluice_tenant_latency_seconds_bucket",
    "sluice_tenant_latency_seconds_sum",
    "sluice_tenant_latency_seconds_count",
    "sluice_tenant_sched_wait_seconds_total",
    "sluice_tenant_cpu_seconds_total",
    "sluice_tenant_throttle_events_total",
    "sluice_tenant_throttle_seconds_total",
    "sluice_tenant_queue_depth",
    "sluice_tenant_weight",
    "sluice_target_unattributed_cpu_seconds_total",
    "sluice_namespace_ios_total",
    "sluice_namespace_slow_ios_total",
    "sluice_export_cpu_seconds_total",
];

#[test]
fn dashboard_json_is_valid() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/sluice.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON parses");
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars.iter().any(|v| v["name"] == "tenant"));
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    let mut ids = std::collections::HashSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate panel id");
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let used: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("sluice_"))
                .collect();
            assert!(!used.is_empty(), "{expr}");
            for m in used {
                assert!(KNOWN.contains(&m), "unknown metric {m} in {expr}");
            }
        }
    }
}
