//! The target's admin endpoint through sluice-admin: token, metrics
//! families (tenants, namespaces), JSON stats, updates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_admin::client::request;
use sluice_admin::metrics::parse_text;
use sluice_admin::schema::{Status, TenantStatsReport};
use sluice_config::tenants::{TenantSpec, TenantsConfig, TenantsSettings};
use sluice_config::{Config, NamespaceConfig, SsdConfig, SubsystemConfig, TargetSettings};
use sluice_target::Target;

/// One worker on an ephemeral port, no discovery port, subsystem `nqn`
/// (any host, one 1 MiB RAM namespace), `tenants` with the admin endpoint
/// on an ephemeral port.
fn admin_config(nqn: &str, mut tenants: TenantsConfig) -> Config {
    tenants.settings.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    Config::default()
        .with_target(
            TargetSettings::default()
                .with_workers(1)
                .with_listen("127.0.0.1:0".parse().unwrap())
                .with_discovery_listen(None),
        )
        .with_tenants(tenants)
        .with_subsystem(
            SubsystemConfig::new(nqn)
                .allow_any_host()
                .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
        )
        .validated()
        .unwrap()
}

#[test]
fn admin_endpoint_with_token() {
    let dir = std::env::temp_dir().join(format!("sluice-admin-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, "tok-123\n").unwrap();
    let cfg = admin_config(
        "nqn.2026-11.io.sluice:admin",
        TenantsConfig::fair()
            .with_settings(TenantsSettings::default().with_admin_token_file(&token_file))
            .with_tenant(
                TenantSpec::new("gold")
                    .with_host("nqn.2014-08.org.nvmexpress:uuid:gold")
                    .with_weight(4),
            ),
    );
    let t = Target::start(&cfg).unwrap();
    let admin = t.admin_addr().unwrap().to_string();
    let tok = Some("tok-123");
    assert_eq!(
        request(&admin, "GET", "/metrics", "", None).unwrap().status,
        401
    );
    assert_eq!(
        request(&admin, "GET", "/metrics", "", Some("tok-12"))
            .unwrap()
            .status,
        401
    );
    let m = request(&admin, "GET", "/metrics", "", tok).unwrap();
    assert_eq!(m.status, 200);
    let s = parse_text(&m.body);
    for fam in [
        "sluice_tenant_ios_total",
        "sluice_tenant_bytes_total",
        "sluice_tenant_latency_seconds_bucket",
        "sluice_tenant_cpu_seconds_total",
        "sluice_tenant_throttle_events_total",
        "sluice_tenant_throttle_seconds_total",
        "sluice_tenant_queue_depth",
        "sluice_tenant_weight",
        "sluice_target_unattributed_cpu_seconds_total",
        "sluice_tenant_table_generation",
        "sluice_namespace_ios_total",
        "sluice_namespace_size_bytes",
        "sluice_namespace_stale_epoch_writes_total",
        "sluice_namespace_stale_epoch_reads_total",
        "sluice_namespace_slow_ios_total",
        "sluice_namespace_reservation_type",
        "sluice_namespace_reservation_registrants",
        "sluice_namespace_reservation_conflicts_total",
        "sluice_ram_huge_chunks_total",
        "sluice_ram_huge_collapses_total",
        "sluice_ram_huge_collapses_pending",
        "sluice_ram_reads_in_place_total",
        "sluice_ram_chunks_copied_for_reads_total",
        "sluice_target_window_capped_writes_total",
        "sluice_target_received_bytes_total",
        "sluice_target_received_in_place_bytes_total",
        "sluice_target_responses_after_data_total",
        "sluice_target_config_reloads_total",
    ] {
        assert!(s.iter().any(|x| x.0 == fam), "missing {fam} in\n{}", m.body);
    }
    assert!(
        m.body.contains(
            "sluice_namespace_stale_epoch_writes_total{subsystem=\"nqn.2026-11.io.sluice:admin\",nsid=\"1\"} 0"
        ),
        "{}",
        m.body
    );
    assert!(
        m.body.contains(
            "sluice_namespace_reservation_type{subsystem=\"nqn.2026-11.io.sluice:admin\",nsid=\"1\"} 0"
        ),
        "{}",
        m.body
    );
    assert!(
        m.body.contains(
            "sluice_namespace_size_bytes{subsystem=\"nqn.2026-11.io.sluice:admin\",nsid=\"1\"} 1048576"
        ),
        "{}",
        m.body
    );
    assert!(
        m.body.contains("sluice_tenant_weight{tenant=\"gold\"} 4"),
        "{}",
        m.body
    );
    let st: Status =
        serde_json::from_str(&request(&admin, "GET", "/v1/status", "", tok).unwrap().body).unwrap();
    assert_eq!(st.service, "sluice-target");
    let r = request(&admin, "PUT", "/v1/tenants/gold", r#"{"weight": 0}"#, tok).unwrap();
    assert_eq!(r.status, 400);
    assert!(r.body.contains("tenant[gold].weight"), "{}", r.body);
    let r = request(&admin, "PUT", "/tenants/gold", r#"{"weight": 6}"#, tok).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let stats: TenantStatsReport =
        serde_json::from_str(&request(&admin, "GET", "/v1/stats", "", tok).unwrap().body).unwrap();
    let gold = stats.tenants.iter().find(|t| t.name == "gold").unwrap();
    assert_eq!(gold.weight, 6);
    assert_eq!(stats.generation, 2);
    // Deleting: the default tenant cannot go; gold can, once.
    let r = request(&admin, "DELETE", "/v1/tenants/default", "", tok).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("tenant[default]"), "{}", r.body);
    let r = request(&admin, "DELETE", "/v1/tenants/gold", "", tok).unwrap();
    assert_eq!(r.status, 204, "{}", r.body);
    for (method, path) in [("GET", "/v1/tenants/gold"), ("DELETE", "/tenants/gold")] {
        let r = request(&admin, method, path, "", tok).unwrap();
        assert_eq!(r.status, 404, "{method} {path}: {}", r.body);
    }
    let m = request(&admin, "GET", "/metrics", "", tok).unwrap();
    assert!(!m.body.contains("tenant=\"gold\""), "{}", m.body);
    assert!(
        t.tenants()
            .table()
            .tenant_of(Some("nqn.2014-08.org.nvmexpress:uuid:gold"))
            == t.tenants().table().id("default").unwrap()
    );
    t.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_token_file_fails_the_start() {
    let cfg = admin_config(
        "nqn.2026-11.io.sluice:admin2",
        TenantsConfig::fair().with_settings(
            TenantsSettings::default().with_admin_token_file("/nonexistent/sluice-token"),
        ),
    );
    let Err(e) = Target::start(&cfg) else {
        panic!("a missing token file must fail the start")
    };
    assert!(e.to_string().contains("sluice-token"), "{e}");
}

/// Backend I/Os of `target.slow_io_ms` or longer are counted per
/// namespace: an emulated SSD that takes 20 ms per read against a 10 ms
/// threshold counts every read; a RAM namespace beside it none.
#[test]
fn slow_backend_ios_are_counted_per_namespace() {
    let nqn = "nqn.2026-11.io.sluice:slow";
    let mut cfg = admin_config(nqn, TenantsConfig::default());
    cfg.target = cfg.target.clone().with_slow_io_ms(10);
    cfg.subsystems[0]
        .namespaces
        .push(NamespaceConfig::emulated_ssd(
            2,
            1 << 20,
            SsdConfig::default().with_base_read_latency_us(20_000),
        ));
    let cfg = cfg.validated().unwrap();
    let t = Target::start(&cfg).unwrap();
    let admin = t.admin_addr().unwrap().to_string();
    let mut ios = [0u64; 2];
    for (i, nsid) in [1u32, 2].into_iter().enumerate() {
        let mut a = sluice_bench::BenchArgs::new(t.local_addr().to_string(), nqn).with_nsid(nsid);
        a.ios = Some(20);
        a.qd = 1;
        a.bs = sluice_bench::BlockSizes::fixed(4096);
        let r = sluice_bench::run(a).unwrap();
        assert_eq!(r.total.errors, 0, "{:?}", r.total.error_samples);
        ios[i] = r.total.ios;
    }
    let m = request(&admin, "GET", "/metrics", "", None).unwrap();
    let count = |nsid: u32| {
        let key =
            format!("sluice_namespace_slow_ios_total{{subsystem=\"{nqn}\",nsid=\"{nsid}\"}} ");
        m.body
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {key} in\n{}", m.body))
    };
    assert_eq!(count(1), 0.0, "RAM reads are not slow");
    // Every read of the SSD; its connect-time I/O (none here) aside.
    assert!(
        count(2) >= 20.0 && count(2) <= ios[1] as f64,
        "{} slow of {} reads",
        count(2),
        ios[1]
    );
    t.shutdown();
}

/// `POST /v1/reload`: 409 until the owner of the file installs the action;
/// then the action's report (here a subsystem added) with 200, or its
/// refusal with 409, and the registry changed accordingly.
#[test]
fn reload_over_the_admin_endpoint_answers_with_what_changed() {
    const ADDED: &str = "nqn.2026-12.io.sluice:added-by-api";
    let cfg = admin_config("nqn.2026-11.io.sluice:admin-reload", TenantsConfig::fair());
    let t = Target::start(&cfg).unwrap();
    let admin = t.admin_addr().unwrap().to_string();
    let r = request(&admin, "POST", "/v1/reload", "", None).unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("no configuration file"), "{}", r.body);

    let mut more = cfg.clone();
    more.subsystems.push(
        SubsystemConfig::new(ADDED)
            .allow_any_host()
            .with_namespace(NamespaceConfig::ram(1, 1 << 20)),
    );
    let (reg, tenants) = (t.registry().clone(), t.tenants().clone());
    let files = std::sync::Mutex::new(vec![cfg.clone(), more]);
    t.set_reload_action(Box::new(move || {
        let next = files.lock().unwrap().pop().ok_or("no file left")?;
        sluice_target::reload::reload(&reg, &tenants, &next)
            .map(|r| r.to_json())
            .map_err(|e| e.to_string())
    }));
    let r = request(&admin, "POST", "/v1/reload", "", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["subsystems_added"], serde_json::json!([ADDED]));
    assert!(
        t.registry().subsystem(ADDED).is_some(),
        "added when the answer came"
    );
    let r = request(&admin, "POST", "/v1/reload", "", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["subsystems_removed"][0]["nqn"], ADDED);
    let r = request(&admin, "POST", "/v1/reload", "", None).unwrap();
    assert_eq!(
        (r.status, r.body.contains("no file left")),
        (409, true),
        "{}",
        r.body
    );
}
