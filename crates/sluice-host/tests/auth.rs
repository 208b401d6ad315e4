//! The host library authenticates with DH-HMAC-CHAP against Sluice's real
//! target over loopback: every queue, one-way and bidirectional; a wrong
//! secret, a missing secret and a target that cannot prove its secret are
//! each a clear `HostError::Authentication`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::RealTarget;
use sluice_auth::{DhGroup, HashId, Secret};
use sluice_config::auth::HostAuthConfig;
use sluice_host::{ConnectOptions, Controller, HostError, IoFlags};

const HOST: &str = "nqn.2024-01.io.sluice:host-auth";

fn secret(seed: u8) -> Secret {
    Secret::new((0..48).map(|i| seed ^ i).collect(), Some(HashId::Sha384)).unwrap()
}

fn target() -> RealTarget {
    RealTarget::start_sub(
        &[HOST],
        |t| t,
        |s| {
            s.require_auth().with_dhchap(
                HostAuthConfig::new(HOST, secret(1))
                    .with_ctrl_secret(secret(2))
                    .with_dhgroup(DhGroup::Ffdhe2048),
            )
        },
    )
}

fn opts(host: Option<Secret>, ctrl: Option<Secret>) -> ConnectOptions {
    ConnectOptions {
        hostnqn: HOST.into(),
        io_queues: 2,
        queue_depth: 16,
        command_timeout: Duration::from_secs(5),
        dhchap_secret: host,
        dhchap_ctrl_secret: ctrl,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_authenticates_and_io_flows() {
    let t = target();
    for ctrl in [None, Some(secret(2))] {
        let c = Controller::connect(t.addr(), &t.subnqn, opts(Some(secret(1)), ctrl))
            .await
            .expect("connect with the right secret");
        assert_eq!(c.io_queue_count(), 2);
        let ns = c.namespace(1).unwrap();
        let data: Vec<u8> = (0..8192u32)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        ns.write(16, &data, IoFlags::default()).await.unwrap();
        assert_eq!(
            ns.read(16, data.len(), IoFlags::default()).await.unwrap(),
            data
        );
        c.disconnect(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_missing_or_unproven_secrets_are_authentication_errors() {
    let t = target();
    let cases = [
        (Some(secret(9)), None, "refused the host"),
        (None, None, "--dhchap-secret"),
        (
            Some(secret(1)),
            Some(secret(7)),
            "does not know the controller secret",
        ),
    ];
    for (host, ctrl, says) in cases {
        let e = Controller::connect(t.addr(), &t.subnqn, opts(host, ctrl))
            .await
            .expect_err("refused");
        match &e {
            HostError::Authentication(m) => assert!(m.contains(says), "{m}"),
            other => panic!("expected an authentication error, got {other:?}"),
        }
    }
}
