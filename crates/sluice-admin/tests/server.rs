//! The admin server on loopback: concurrency, limits, authentication,
//! metrics text, JSON documents, tenant updates, shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::{Registry, Unit};
use sluice_admin::client::{parse_response, request};
use sluice_admin::metrics::{counters, gauges, histograms, parse_text, Esc, HistogramSample};
use sluice_admin::routes::{self, TenantApi, TenantUpdateError};
use sluice_admin::schema::{Latency, TenantStats, TenantStatsReport};
use sluice_admin::{compose, AdminConfig, AdminServer, BearerToken, Router};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tenant table of name → weight.
#[derive(Debug, Default)]
struct Table(Mutex<Vec<(String, u32)>>);

impl TenantApi for Table {
    fn list(&self) -> serde_json::Value {
        let t = self.0.lock().unwrap();
        serde_json::json!(t
            .iter()
            .map(|(n, w)| serde_json::json!({"name": n, "weight": w}))
            .collect::<Vec<_>>())
    }
    fn get(&self, name: &str) -> Option<serde_json::Value> {
        let t = self.0.lock().unwrap();
        t.iter()
            .find(|x| x.0 == name)
            .map(|(n, w)| serde_json::json!({"name": n, "weight": w}))
    }
    fn update(
        &self,
        name: &str,
        body: &str,
        create: bool,
    ) -> Result<serde_json::Value, TenantUpdateError> {
        let v: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| TenantUpdateError::Invalid(format!("bad tenant JSON: {e}")))?;
        let w = v["weight"].as_i64().unwrap_or(1);
        if !(1..=10_000).contains(&w) {
            return Err(TenantUpdateError::Invalid(format!(
                "config key `tenant[{name}].weight`: {w} must be from 1 to 10000"
            )));
        }
        let mut t = self.0.lock().unwrap();
        match t.iter_mut().find(|x| x.0 == name) {
            Some(x) => x.1 = w as u32,
            None if create => t.push((name.into(), w as u32)),
            None => return Err(TenantUpdateError::Unknown(name.into())),
        }
        Ok(serde_json::json!({"name": name, "weight": w}))
    }
    fn delete(&self, name: &str) -> Result<(), TenantUpdateError> {
        if name == "default" {
            return Err(TenantUpdateError::Invalid(
                "the default tenant cannot be deleted".into(),
            ));
        }
        let mut t = self.0.lock().unwrap();
        let before = t.len();
        t.retain(|x| x.0 != name);
        if t.len() == before {
            return Err(TenantUpdateError::Unknown(name.into()));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Demo;

impl Collector for Demo {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        counters(
            &mut enc,
            "sluice_tenant_ios",
            "I/O commands completed.",
            None,
            [
                ([("tenant", Esc("a")), ("op", Esc("read"))], 7u64),
                ([("tenant", Esc("a")), ("op", Esc("write"))], 3u64),
            ],
        )?;
        gauges(
            &mut enc,
            "sluice_tenant_queue_depth",
            "Queued plus outstanding.",
            None,
            [([("tenant", Esc("a"))], 2i64)],
        )?;
        histograms(
            &mut enc,
            "sluice_tenant_latency",
            "Latency.",
            Some(&Unit::Seconds),
            [(
                [("tenant", Esc("a"))],
                HistogramSample {
                    sum: 0.01,
                    count: 10,
                    buckets: vec![(0.0001, 4), (0.001, 6)],
                },
            )],
        )
    }
}

fn report() -> TenantStatsReport {
    TenantStatsReport {
        generation: 3,
        unattributed_cpu_seconds: 0.25,
        tenants: vec![TenantStats {
            name: "a".into(),
            weight: 2,
            read_ios: 7,
            write_ios: 3,
            read_bytes: 7 * 4096,
            cpu_seconds: 0.125,
            queue_depth: 2,
            latency: Latency {
                count: 10,
                sum_seconds: 0.01,
                p50_seconds: Some(0.0005),
                buckets: vec![
                    sluice_admin::schema::Bucket {
                        le_seconds: 0.0001,
                        count: 4,
                    },
                    sluice_admin::schema::Bucket {
                        le_seconds: 0.001,
                        count: 10,
                    },
                ],
                ..Default::default()
            },
            ..Default::default()
        }],
    }
}

fn start(token: Option<&str>) -> (AdminServer, String, Arc<Table>) {
    let mut cfg = AdminConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.token = token.map(|t| BearerToken::new(t).unwrap());
    cfg.request_timeout = Duration::from_millis(500);
    cfg.header_timeout = Duration::from_secs(3);
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Demo));
    let table = Arc::new(Table::default());
    // A part like a future control plane would mount: its own routes.
    let slow = Router::new().route(
        "/v1/slow",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "late"
        }),
    );
    let app = compose(
        &cfg,
        [
            routes::metrics(Arc::new(reg)),
            routes::get_json("/v1/stats", report),
            routes::tenants(table.clone()),
            slow,
        ],
    );
    let s = AdminServer::start(cfg, app).unwrap();
    let addr = s.local_addr().to_string();
    (s, addr, table)
}

/// Writes `req` and reads the answer until EOF or an error (the server may
/// reset a connection whose request it did not read to the end).
fn raw(addr: &str, req: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(req);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn status_of(raw: &[u8]) -> u16 {
    parse_response(raw).map(|r| r.status).unwrap_or(0)
}

#[test]
fn slow_and_idle_clients_do_not_block_others() {
    let (_s, addr, _) = start(None);
    // One connection that sent half a request head, one that sent nothing.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let _idle = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let r = request(&addr, "GET", "/v1/stats", "", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // Many clients at once.
    let hs: Vec<_> = (0..16)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || request(&addr, "GET", "/metrics", "", None).unwrap().status)
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), 200);
    }
    // The half request still completes when it is finished.
    half.write_all(b"Connection: close\r\n\r\n").unwrap();
    let mut out = Vec::new();
    half.read_to_end(&mut out).unwrap();
    assert_eq!(status_of(&out), 200);
}

#[test]
fn request_head_that_stalls_is_dropped() {
    let mut cfg = AdminConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.header_timeout = Duration::from_millis(300);
    let s = AdminServer::start(cfg.clone(), compose(&cfg, [])).unwrap();
    let mut c = TcpStream::connect(s.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let t0 = Instant::now();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn slow_handler_times_out_with_408() {
    let (_s, addr, _) = start(None);
    let r = request(&addr, "GET", "/v1/slow", "", None).unwrap();
    assert_eq!(r.status, 408, "{}", r.body);
}

#[test]
fn oversized_head_and_body_are_refused() {
    let (_s, addr, _) = start(None);
    // A 20 KiB header: 431.
    let big = "x".repeat(20 * 1024);
    let out = raw(
        &addr,
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status_of(&out), 431, "{}", String::from_utf8_lossy(&out));
    // Too many headers: 431.
    let many: String = (0..100).map(|i| format!("X-H{i}: v\r\n")).collect();
    let out = raw(
        &addr,
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    );
    assert_eq!(status_of(&out), 431, "{}", String::from_utf8_lossy(&out));
    // A body over 64 KiB: 413 (refused on its Content-Length, unread).
    let out = raw(
        &addr,
        b"PUT /v1/tenants/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
    );
    let r = parse_response(&out).unwrap();
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.body.contains("too large"), "{}", r.body);
    // Also when the body is sent (chunked, no length announced).
    let chunk = "a".repeat(70 * 1024);
    let out = raw(
        &addr,
        format!(
            "PUT /v1/tenants/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len()
        )
        .as_bytes(),
    );
    assert_eq!(status_of(&out), 413, "{}", String::from_utf8_lossy(&out));
}

#[test]
fn bearer_token_is_required_when_configured() {
    let (_s, addr, _) = start(Some("s3cret-token"));
    for path in ["/metrics", "/v1/stats", "/v1/tenants", "/nowhere"] {
        let r = request(&addr, "GET", path, "", None).unwrap();
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let r = request(&addr, "GET", path, "", Some("s3cret-tokeN")).unwrap();
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let r = request(&addr, "GET", path, "", Some("s3cret")).unwrap();
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    let r = request(&addr, "GET", "/metrics", "", Some("s3cret-token")).unwrap();
    assert_eq!(r.status, 200);
    let r = request(&addr, "PUT", "/v1/tenants/a", "{}", None).unwrap();
    assert_eq!(r.status, 401);
    let r = request(&addr, "PUT", "/v1/tenants/a", "{}", Some("s3cret-token")).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // The scheme is case-insensitive.
    let out = raw(
        &addr,
        b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret-token\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&out), 200);
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let (_s, addr, _) = start(None);
    let r = request(&addr, "GET", "/metrics", "", None).unwrap();
    assert_eq!(r.status, 200);
    let samples = parse_text(&r.body);
    let has = |name: &str, labels: &[(&str, &str)]| {
        samples.iter().any(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
    };
    assert!(
        has(
            "sluice_tenant_ios_total",
            &[("tenant", "a"), ("op", "read")]
        ),
        "{}",
        r.body
    );
    assert!(
        has("sluice_tenant_queue_depth", &[("tenant", "a")]),
        "{}",
        r.body
    );
    assert!(
        has("sluice_tenant_latency_seconds_bucket", &[("le", "+Inf")]),
        "{}",
        r.body
    );
    assert!(
        has("sluice_tenant_latency_seconds_count", &[]),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("# TYPE sluice_tenant_ios counter"),
        "{}",
        r.body
    );
    assert!(r.body.ends_with("# EOF\n"));
}

#[test]
fn json_documents_round_trip() {
    let (_s, addr, _) = start(None);
    let r = request(&addr, "GET", "/v1/stats", "", None).unwrap();
    assert_eq!(r.status, 200);
    let got: TenantStatsReport = serde_json::from_str(&r.body).unwrap();
    assert_eq!(got, report());
    let r = request(&addr, "GET", "/nowhere", "", None).unwrap();
    assert_eq!(r.status, 404);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert!(v["error"].as_str().unwrap().contains("not found"));
}

#[test]
fn tenant_updates_keep_their_semantics() {
    let (_s, addr, table) = start(None);
    let r = request(&addr, "PUT", "/tenants/gold", r#"{"weight": 4}"#, None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(&addr, "PUT", "/v1/tenants/gold", r#"{"weight": 0}"#, None).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("tenant[gold].weight"), "{}", r.body);
    assert_eq!(
        table.0.lock().unwrap().clone(),
        vec![("gold".to_string(), 4)]
    );
    let r = request(&addr, "POST", "/v1/tenants/nope", r#"{"weight": 2}"#, None).unwrap();
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("unknown tenant `nope`"), "{}", r.body);
    let r = request(&addr, "POST", "/tenants/gold", r#"{"weight": 5}"#, None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request(&addr, "PUT", "/tenants/gold", "not json", None).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("bad tenant JSON"), "{}", r.body);
    let r = request(&addr, "GET", "/tenants", "", None).unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v, serde_json::json!([{"name": "gold", "weight": 5}]));
    let r = request(&addr, "GET", "/v1/tenants/gold", "", None).unwrap();
    assert_eq!(r.status, 200);
    let r = request(&addr, "GET", "/v1/tenants/none", "", None).unwrap();
    assert_eq!(r.status, 404);
    let r = request(&addr, "PATCH", "/v1/tenants/gold", "", None).unwrap();
    assert_eq!(r.status, 405);
    let r = request(&addr, "DELETE", "/v1/tenants/default", "", None).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("cannot be deleted"), "{}", r.body);
    let r = request(&addr, "DELETE", "/v1/tenants/gold", "", None).unwrap();
    assert_eq!((r.status, r.body.as_str()), (204, ""));
    assert!(table.0.lock().unwrap().is_empty());
    let r = request(&addr, "DELETE", "/tenants/gold", "", None).unwrap();
    assert_eq!(r.status, 404, "{}", r.body);
}

#[test]
fn shutdown_stops_the_server() {
    let (s, addr, _) = start(None);
    let h = s.shutdown_handle();
    assert_eq!(
        request(&addr, "GET", "/v1/stats", "", None).unwrap().status,
        200
    );
    h.shutdown();
    h.shutdown();
    s.stop();
    assert!(request(&addr, "GET", "/v1/stats", "", None).is_err());
}
