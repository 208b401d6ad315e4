//! `sluice bench --dhchap-secret` against a Sluice target that requires
//! DH-HMAC-CHAP: a secret from a file and from the flag authenticates every
//! queue and the verified workload runs; a wrong secret is an error that
//! says "authentication" and never prints the secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use sluice_auth::{DhGroup, HashId, Secret};
use sluice_config::auth::HostAuthConfig;
use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_target::Target;

const NQN: &str = "nqn.2026-11.io.sluice:dhchap";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-00000000d4c1";

#[test]
fn bench_authenticates_with_a_secret_and_a_wrong_one_is_refused() {
    let host_secret = Secret::new(vec![0x5a; 32], Some(HashId::Sha256)).unwrap();
    let ctrl_secret = Secret::new(vec![0xc7; 48], None).unwrap();
    let cfg = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen("127.0.0.1:0".parse().unwrap())
                .with_discovery_listen(None)
                .with_polling(PollingPolicy::Interrupt),
        )
        .with_subsystem(
            SubsystemConfig::new(NQN)
                .with_host(HOST)
                .require_auth()
                .with_dhchap(
                    HostAuthConfig::new(HOST, host_secret.clone())
                        .with_ctrl_secret(ctrl_secret.clone())
                        .with_dhgroup(DhGroup::Ffdhe2048),
                )
                .with_namespace(NamespaceConfig::ram(1, 64 << 20)),
        )
        .validated()
        .unwrap();
    let t = Target::start(&cfg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("host.key");
    std::fs::write(&key_file, format!("{}\n", host_secret.to_dhhc())).unwrap();
    let bench = |secret: String, ctrl: Option<String>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.args([
            "bench",
            "--target",
            &t.local_addr().to_string(),
            "--nqn",
            NQN,
            "--hostnqn",
            HOST,
        ])
        .args([
            "--rw", "randrw", "--qd", "4", "--queues", "2", "--ios", "400", "--verify", "--json",
        ])
        .args(["--dhchap-secret", &secret])
        .env_remove("SLUICE_DHCHAP_SECRET")
        .env_remove("SLUICE_DHCHAP_CTRL_SECRET");
        if let Some(x) = ctrl {
            c.args(["--dhchap-ctrl-secret", &x]);
        }
        c.output().unwrap()
    };
    // From a file, one-way; inline, bidirectional.
    for (secret, ctrl) in [
        (format!("@{}", key_file.display()), None),
        (host_secret.to_dhhc(), Some(ctrl_secret.to_dhhc())),
    ] {
        let out = bench(secret, ctrl);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["total"]["ios"], 400);
        assert_eq!(v["total"]["errors"], 0);
        assert_eq!(v["total"]["verify_errors"], 0);
    }
    // A wrong secret, and a target that cannot prove the controller secret
    // the host expects.
    let wrong = Secret::new(vec![0x11; 32], Some(HashId::Sha256))
        .unwrap()
        .to_dhhc();
    let wrong_ctrl = Secret::new(vec![0x22; 48], None).unwrap().to_dhhc();
    for (secret, ctrl) in [
        (wrong.clone(), None),
        (host_secret.to_dhhc(), Some(wrong_ctrl.clone())),
    ] {
        let out = bench(secret, ctrl);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("authentication"), "{stderr}");
        for s in [&wrong, &wrong_ctrl, &host_secret.to_dhhc()] {
            assert!(
                !stderr.contains(&s[10..30]),
                "a secret in the output: {stderr}"
            );
        }
    }
    // A malformed secret names the flag.
    let out = bench("DHHC-1:00:bm90IGEga2V5:".into(), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--dhchap-secret"),
        "{stderr}"
    );
    t.shutdown();
}
