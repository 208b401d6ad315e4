//! `sluice target --config F` re-reads F on SIGHUP: a host added to a
//! subsystem's list connects without a restart; a file that changes
//! anything else is refused with a logged error, and the target keeps
//! running with the access it had.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    let mut sc = SubsystemConfig::new(NQN).with_namespace(NamespaceConfig::ram(1, 16 << 20));
    for h in hosts {
        sc = sc.with_host(*h);
    }
    let mut tenants = sluice_config::TenantsConfig::fair();
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

fn hup(pid: u32) {
    let st = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sighup_admits_a_host_added_to_the_file_and_refuses_other_changes() {
    let dir = tempfile::tempdir().unwrap();
    let port = sluice_meta::testing::free_loopback_port().expect("a free loopback port");
    let admin_port = sluice_meta::testing::free_loopback_port().expect("a free loopback port");
    let file = dir.path().join("target.toml");
    let log = dir.path().join("target.log");
    std::fs::write(&file, config(port, admin_port, &[FIRST])).unwrap();
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["target", "--config"])
            .arg(&file)
            .args(["--log", "info"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "target did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |host: &str| {
        let opts = ConnectOptions {
            hostnqn: host.into(),
            io_queues: 1,
            command_timeout: Duration::from_secs(5),
            reconnect: ReconnectPolicy {
                attempts_max: 0,
                ..Default::default()
            },
            ..Default::default()
        };
        rt.block_on(Controller::connect(addr, NQN, opts))
    };
    assert!(connect(LATER).is_err(), "not listed yet");

    std::fs::write(&file, config(port, admin_port, &[FIRST, LATER])).unwrap();
    hup(child.0.id());
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
    std::fs::write(&file, config(port + 1, admin_port, &[FIRST])).unwrap();
    hup(child.0.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("SIGHUP: reload of")
    {
        assert!(Instant::now() < deadline, "no refusal logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("`[target]` differs"), "{text}");
    let c = connect(LATER).expect("access unchanged by the refused file");
    rt.block_on(c.disconnect(Duration::from_secs(2)));

    // A file that does not parse: refused too, and both counted.
    std::fs::write(&file, "[target\n").unwrap();
    hup(child.0.id());
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
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
}
