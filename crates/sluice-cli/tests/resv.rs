//! `sluice resv` against a Sluice target: two host NQNs are two hosts;
//! register, acquire and report as one, a refused acquire as the other
//! (an error naming the status, exit 1), preempt and abort, clear; a key
//! that is not a number is refused naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use sluice_config::{Config, NamespaceConfig, PollingPolicy, SubsystemConfig, TargetSettings};
use sluice_target::{Target, TargetHandle};

const NQN: &str = "nqn.2026-11.io.sluice:resv";
const A: &str = "nqn.2026-11.io.sluice:host-a";
const B: &str = "nqn.2026-11.io.sluice:host-b";

/// A target on a loopback port serving `sub` with a 16 MiB RAM namespace.
fn start(sub: SubsystemConfig) -> TargetHandle {
    let cfg = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen("127.0.0.1:0".parse().unwrap())
                .with_discovery_listen(None)
                .with_polling(PollingPolicy::Interrupt),
        )
        .with_subsystem(sub.with_namespace(NamespaceConfig::ram(1, 16 << 20)))
        .validated()
        .unwrap();
    Target::start(&cfg).unwrap()
}

#[test]
fn two_hosts_register_acquire_preempt_and_clear() {
    let t = start(SubsystemConfig::new(NQN).allow_any_host());
    let addr = t.local_addr().to_string();
    let resv = |host: &str, args: &[&str]| -> Output {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("resv")
            .args(args)
            .args([
                "--target",
                &addr,
                "--nqn",
                NQN,
                "--hostnqn",
                host,
                "--log",
                "warn",
            ])
            .output()
            .unwrap()
    };
    let ok = |o: Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    ok(resv(A, &["register", "--nrkey", "0xa1"]));
    ok(resv(
        A,
        &["acquire", "--rtype", "write-exclusive", "--crkey", "0xa1"],
    ));
    let rep = ok(resv(B, &["report", "--json"]));
    assert!(rep.contains(r#""rtype":1,"#), "{rep}");
    assert!(rep.contains(r#""key":161,"holds":true"#), "{rep}");

    let refused = resv(
        B,
        &["acquire", "--rtype", "write-exclusive", "--crkey", "0xb1"],
    );
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("Reservation Conflict"), "{err}");
    assert!(
        err.contains("acquiring a reservation of namespace 1"),
        "{err}"
    );

    ok(resv(B, &["register", "--nrkey", "0xb1"]));
    ok(resv(
        B,
        &[
            "acquire",
            "--action",
            "preempt-abort",
            "--rtype",
            "exclusive-access",
            "--crkey",
            "0xb1",
            "--prkey",
            "0xa1",
        ],
    ));
    let text = ok(resv(A, &["report"]));
    assert!(text.contains("reservation: exclusive-access (2)"), "{text}");
    assert!(text.contains("registrants: 1"), "{text}");
    assert!(text.contains("key 0xb1  holds"), "{text}");

    ok(resv(
        B,
        &["release", "--action", "clear", "--crkey", "0xb1"],
    ));
    let rep = ok(resv(A, &["report", "--json"]));
    assert!(
        rep.contains(r#""rtype":0,"#) && rep.contains(r#""registrant_count":0,"#),
        "{rep}"
    );

    let bad = resv(A, &["register", "--nrkey", "0xzz"]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("`0xzz`"));
}

/// A subsystem that requires DH-HMAC-CHAP: `sluice resv` without a secret
/// is refused, naming authentication; with the host's secret it reports.
#[test]
fn a_subsystem_that_requires_authentication_needs_the_secret() {
    use sluice_auth::{HashId, Secret};
    use sluice_config::auth::HostAuthConfig;
    let secret = Secret::new(vec![0x3c; 32], Some(HashId::Sha256)).unwrap();
    let t = start(
        SubsystemConfig::new(NQN)
            .with_host(A)
            .require_auth()
            .with_dhchap(HostAuthConfig::new(A, secret.clone())),
    );
    let addr = t.local_addr().to_string();
    let report = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["resv", "report", "--target", &addr, "--nqn", NQN])
            .args(["--hostnqn", A, "--log", "warn"])
            .args(extra)
            .env_remove("SLUICE_DHCHAP_SECRET")
            .env_remove("SLUICE_DHCHAP_CTRL_SECRET")
            .output()
            .unwrap()
    };
    let without = report(&[]);
    assert_eq!(without.status.code(), Some(1));
    let err = String::from_utf8_lossy(&without.stderr);
    assert!(err.to_lowercase().contains("authentication"), "{err}");
    let key = secret.to_dhhc();
    let with = report(&["--dhchap-secret", &key]);
    let out = String::from_utf8_lossy(&with.stdout);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert!(out.contains("reservation: none (0)"), "{out}");
}
