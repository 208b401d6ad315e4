//! `sluice target --config F` re-reads F on SIGHUP: a host added to a
//! subsystem's list connects without a restart; a subsystem added serves
//! its host and one removed drops its host, while the other subsystem's
//! connection carries on; a file that changes
//! anything else is refused with a logged error, and the target keeps
//! running with the access it had; a tenant removed from the file is
//! deleted, and a live connection of its host carries on in the default
//! tenant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_config::tenants::TenantSpec;
use sluice_config::{Config, NamespaceConfig, SubsystemConfig, TargetSettings};
use sluice_host::{ConnectOptions, Controller, IoFlags, ReconnectPolicy};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-12.io.sluice:reload";
const FIRST: &str = "nqn.2014-08.org.nvmexpress:uuid:0e1d0000-0000-4000-8000-000000000001";
const LATER: &str = "nqn.2014-08.org.nvmexpress:uuid:0e1d0000-0000-4000-8000-000000000002";

/// The target's file: `hosts` admitted, its admin endpoint (for the reload
/// counters) on `admin_port`.
fn config(port: u16, admin_port: u16, hosts: &[&str]) -> String {
    config_with_tenants(port, admin_port, hosts, &[])
}

/// [`config`] with a second subsystem, `SECOND`, for host `LATER`.
fn config_with_second(port: u16, admin_port: u16) -> String {
    let mut c = Config::from_toml(&config(port, admin_port, &[FIRST])).unwrap();
    c.subsystems.push(
        SubsystemConfig::new(SECOND)
            .with_host(LATER)
            .with_namespace(NamespaceConfig::ram(1, 8 << 20)),
    );
    c.validated().unwrap().to_toml().unwrap()
}

const SECOND: &str = "nqn.2026-12.io.sluice:second";

/// [`config`] with `[[tenant]]` entries: (name, its one host).
fn config_with_tenants(
    port: u16,
    admin_port: u16,
    hosts: &[&str],
    tenant_entries: &[(&str, &str)],
) -> String {
    let mut sc = SubsystemConfig::new(NQN).with_namespace(NamespaceConfig::ram(1, 16 << 20));
    for h in hosts {
        sc = sc.with_host(*h);
    }
    let mut tenants = sluice_config::TenantsConfig::fair();
    for (name, host) in tenant_entries {
        tenants = tenants.with_tenant(TenantSpec::new(*name).with_host(*host));
    }
    tenants.settings.admin_listen = Some(format!("127.0.0.1:{admin_port}").parse().unwrap());
    Config {
        tenants,
        ..Config::default()
    }
    .with_target(
        TargetSettings::default()
            .with_listen(format!("127.0.0.1:{port}").parse().unwrap())
            .with_discovery_listen(None),
    )
    .with_subsystem(sc)
    .validated()
    .unwrap()
    .to_toml()
    .unwrap()
}

/// Kills the target when the test ends, passed or not (a failed
/// assertion would otherwise leave it running).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice target --config file` (log at info into `log`) and
/// waits until it listens on `port`.
fn start_target(file: &std::path::Path, log: &std::path::Path, port: u16) -> Running {
    let child = Running(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["target", "--config"])
            .arg(file)
            .args(["--log", "info"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "target did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// One I/O queue as `host`, no reconnection.
fn options(host: &str) -> ConnectOptions {
    ConnectOptions {
        hostnqn: host.into(),
        io_queues: 1,
        command_timeout: Duration::from_secs(5),
        reconnect: ReconnectPolicy {
            attempts_max: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Waits (10 s at most) until the target's log holds `text`.
fn wait_logged(log: &std::path::Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log).unwrap().contains(text) {
        assert!(Instant::now() < deadline, "`{text}` never logged");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A target started from a file of its own directory.
struct Launched {
    _dir: tempfile::TempDir,
    file: std::path::PathBuf,
    log: std::path::PathBuf,
    port: u16,
    admin_port: u16,
    addr: std::net::SocketAddr,
    child: Running,
}

impl Launched {
    /// Starts `sluice target` on the file `first(port, admin_port)` gives.
    fn new(first: impl FnOnce(u16, u16) -> String) -> Launched {
        let dir = tempfile::tempdir().unwrap();
        let port = sluice_meta::testing::free_loopback_port().expect("a free loopback port");
        let admin_port = sluice_meta::testing::free_loopback_port().expect("a free loopback port");
        let file = dir.path().join("target.toml");
        let log = dir.path().join("target.log");
        std::fs::write(&file, first(port, admin_port)).unwrap();
        let child = start_target(&file, &log, port);
        Launched {
            _dir: dir,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            file,
            log,
            port,
            admin_port,
            child,
        }
    }

    /// Rewrites the file and sends SIGHUP.
    fn reload(&self, text: &str) {
        std::fs::write(&self.file, text).unwrap();
        hup(self.child.0.id());
    }
}

fn hup(pid: u32) {
    let st = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sighup_admits_a_host_added_to_the_file_and_refuses_other_changes() {
    let mut t = Launched::new(|port, admin_port| config(port, admin_port, &[FIRST]));
    let (port, admin_port, addr) = (t.port, t.admin_port, t.addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |host: &str| rt.block_on(Controller::connect(addr, NQN, options(host)));
    assert!(connect(LATER).is_err(), "not listed yet");

    t.reload(&config(port, admin_port, &[FIRST, LATER]));
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        if let Ok(c) = connect(LATER) {
            break c;
        }
        assert!(Instant::now() < deadline, "SIGHUP did not admit the host");
        std::thread::sleep(Duration::from_millis(50));
    };
    let ns = c.namespace(1).unwrap();
    let data = vec![0x5e; 4096];
    rt.block_on(ns.write(64, &data, IoFlags::default()))
        .unwrap();
    assert_eq!(
        rt.block_on(ns.read(64, 4096, IoFlags::default())).unwrap(),
        data
    );
    rt.block_on(c.disconnect(Duration::from_secs(2)));

    // A new listen address needs a restart: refused whole, even the host
    // list that came with it.
    t.reload(&config(port + 1, admin_port, &[FIRST]));
    wait_logged(&t.log, "SIGHUP: reload of");
    let text = std::fs::read_to_string(&t.log).unwrap();
    assert!(text.contains("`[target]` differs"), "{text}");
    let c = connect(LATER).expect("access unchanged by the refused file");
    rt.block_on(c.disconnect(Duration::from_secs(2)));

    // A file that does not parse: refused too, and both counted.
    t.reload("[target\n");
    let admin = format!("127.0.0.1:{admin_port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = sluice_admin::client::request(&admin, "GET", "/metrics", "", None).unwrap();
        if m.body
            .contains("sluice_target_config_reloads_total{result=\"refused\"} 2")
        {
            assert!(
                m.body
                    .contains("sluice_target_config_reloads_total{result=\"applied\"} 1"),
                "{}",
                m.body
            );
            break;
        }
        assert!(Instant::now() < deadline, "{}", m.body);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(t.child.0.try_wait().unwrap().is_none(), "still running");
}

#[test]
fn sighup_adds_and_removes_a_subsystem_while_the_other_serves_on() {
    let t = Launched::new(|port, admin_port| config(port, admin_port, &[FIRST]));
    let (port, admin_port, addr) = (t.port, t.admin_port, t.addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let first = rt
        .block_on(Controller::connect(addr, NQN, options(FIRST)))
        .unwrap();
    let kept = first.namespace(1).unwrap();
    let data = vec![0x3c; 4096];
    rt.block_on(kept.write(8, &data, IoFlags::default()))
        .unwrap();
    let connect_second = || rt.block_on(Controller::connect(addr, SECOND, options(LATER)));
    assert!(connect_second().is_err(), "not exported yet");

    t.reload(&config_with_second(port, admin_port));
    wait_logged(&t.log, "reload: subsystem added");
    let second = connect_second().expect("the added subsystem admits its host");
    let ns = second.namespace(1).unwrap();
    let other = vec![0xa7; 8192];
    rt.block_on(ns.write(0, &other, IoFlags::default()))
        .unwrap();
    assert_eq!(
        rt.block_on(ns.read(0, 8192, IoFlags::default())).unwrap(),
        other
    );

    t.reload(&config(port, admin_port, &[FIRST]));
    wait_logged(&t.log, "reload: subsystem removed");
    // Its controller is failed: the queue closes at the next check, so the
    // host's commands fail from then on, and it cannot connect again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(ns.read(0, 4096, IoFlags::default())).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the removed subsystem still serves"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(connect_second().is_err(), "removed");
    // The same connection to the kept subsystem, untouched.
    assert_eq!(
        rt.block_on(kept.read(8, 4096, IoFlags::default())).unwrap(),
        data
    );
    rt.block_on(first.disconnect(Duration::from_secs(2)));
}

/// `POST /v1/reload` re-reads the file as SIGHUP does and answers with
/// what changed (200) or why nothing did (409), so a caller knows the
/// export is there when the answer comes; both count as reloads.
#[test]
fn the_admin_api_reloads_the_file_and_answers_with_what_changed() {
    let t = Launched::new(|port, admin_port| config(port, admin_port, &[FIRST]));
    let admin = format!("127.0.0.1:{}", t.admin_port);
    let post = || sluice_admin::client::request(&admin, "POST", "/v1/reload", "", None).unwrap();
    let r = post();
    assert_eq!(r.status, 200, "nothing changed: {}", r.body);

    std::fs::write(&t.file, config_with_second(t.port, t.admin_port)).unwrap();
    let r = post();
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["subsystems_added"], serde_json::json!([SECOND]));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt
        .block_on(Controller::connect(t.addr, SECOND, options(LATER)))
        .expect("exported when the answer came");
    rt.block_on(c.disconnect(Duration::from_secs(2)));

    std::fs::write(&t.file, config(t.port + 1, t.admin_port, &[FIRST])).unwrap();
    let r = post();
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("`[target]` differs"), "{}", r.body);
    std::fs::write(&t.file, "[target\n").unwrap();
    let r = post();
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("validating config file"), "{}", r.body);
    assert!(
        rt.block_on(Controller::connect(t.addr, SECOND, options(LATER)))
            .is_ok(),
        "the refused files changed nothing"
    );
    let m = sluice_admin::client::request(&admin, "GET", "/metrics", "", None).unwrap();
    for line in [
        "sluice_target_config_reloads_total{result=\"applied\"} 2",
        "sluice_target_config_reloads_total{result=\"refused\"} 2",
    ] {
        assert!(m.body.contains(line), "{line}: {}", m.body);
    }
    wait_logged(&t.log, "admin API: reload of");
}

/// Completed writes per tenant, from the admin endpoint's metrics.
fn tenant_writes(admin: &str) -> Vec<(String, f64)> {
    let m = sluice_admin::client::request(admin, "GET", "/metrics", "", None).unwrap();
    sluice_admin::metrics::parse_text(&m.body)
        .into_iter()
        .filter(|(name, labels, _)| {
            name == "sluice_tenant_ios_total"
                && labels.iter().any(|(k, v)| k == "op" && v == "write")
        })
        .filter_map(|(_, labels, v)| {
            labels
                .into_iter()
                .find(|(k, _)| k == "tenant")
                .map(|(_, t)| (t, v))
        })
        .collect()
}

#[test]
fn sighup_deletes_a_removed_tenant_and_its_live_connection_carries_on_in_the_default() {
    let t = Launched::new(|port, admin_port| {
        config_with_tenants(port, admin_port, &[FIRST], &[("gold", FIRST)])
    });
    let (port, admin_port, addr) = (t.port, t.admin_port, t.addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt
        .block_on(Controller::connect(addr, NQN, options(FIRST)))
        .unwrap();
    let ns = c.namespace(1).unwrap();
    let data = vec![0x6d; 4096];
    rt.block_on(ns.write(8, &data, IoFlags::default())).unwrap();
    let admin = format!("127.0.0.1:{admin_port}");
    let writes = tenant_writes(&admin);
    assert!(writes.contains(&("gold".into(), 1.0)), "{writes:?}");

    t.reload(&config(port, admin_port, &[FIRST]));
    wait_logged(&t.log, "tenants_removed=[\"gold\"]");
    // The same connection, not reconnected: its next commands are the
    // default tenant's, and gold is gone from the metrics.
    for lba in [16, 24] {
        rt.block_on(ns.write(lba, &data, IoFlags::default()))
            .unwrap();
    }
    assert_eq!(
        rt.block_on(ns.read(8, 4096, IoFlags::default())).unwrap(),
        data
    );
    let writes = tenant_writes(&admin);
    assert!(writes.iter().all(|(t, _)| t != "gold"), "{writes:?}");
    assert!(writes.contains(&("default".into(), 2.0)), "{writes:?}");
    rt.block_on(c.disconnect(Duration::from_secs(2)));
}
