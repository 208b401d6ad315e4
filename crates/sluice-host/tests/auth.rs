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

/// A run-to-completion queue authenticates like a threaded one when its
/// Connect asks (one-way and bidirectional), and carries I/O after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_queue_authenticates_and_io_flows_on_it() {
    let t = target();
    for ctrl in [None, Some(secret(2))] {
        let o = ConnectOptions {
            direct_queues: 1,
            ..opts(Some(secret(1)), ctrl)
        };
        let c = Controller::connect(t.addr(), &t.subnqn, o)
            .await
            .expect("connect with the right secret");
        let ns = c.namespace(1).unwrap();
        let rw = ns.rw_builder();
        let mut q = c
            .connect_direct_queue()
            .await
            .expect("the direct queue authenticates");
        let data: Vec<u8> = (0..8192u32)
            .map(|i| u8::try_from(i % 241).unwrap())
            .collect();
        let d2 = data.clone();
        let got = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            q.submit_write(&rw, 32, d2, IoFlags::default(), 1).unwrap();
            while out.is_empty() {
                q.poll(&mut out, Some(Duration::from_millis(10))).unwrap();
            }
            assert!(out.remove(0).1.is_ok(), "the write completes");
            q.submit_read(&rw, 32, 8192, IoFlags::default(), 2).unwrap();
            while out.is_empty() {
                q.poll(&mut out, Some(Duration::from_millis(10))).unwrap();
            }
            out.remove(0).1.unwrap().data
        })
        .await
        .unwrap();
        assert_eq!(got, data);
        // What the direct queue wrote, the threaded queues read.
        assert_eq!(
            ns.read(32, data.len(), IoFlags::default()).await.unwrap(),
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

/// A proxy in front of the target that closes the connection as soon as the
/// host sends its DH-HMAC-CHAP reply (the second AUTH_Send on a queue), as
/// nvmet does when its close overtakes the Failure1 it answers a wrong
/// response with.
async fn proxy_closing_after_reply(target: std::net::SocketAddr) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((host, _)) = listener.accept().await {
            tokio::spawn(async move {
                let ctrl = tokio::net::TcpStream::connect(target).await.unwrap();
                let (mut host_rx, mut host_tx) = host.into_split();
                let (mut ctrl_rx, mut ctrl_tx) = ctrl.into_split();
                let back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut ctrl_rx, &mut host_tx).await;
                    host_tx
                });
                let mut auth_sends = 0;
                loop {
                    let mut ch = [0u8; 8];
                    if host_rx.read_exact(&mut ch).await.is_err() {
                        break;
                    }
                    let plen = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]) as usize;
                    let mut pdu = ch.to_vec();
                    pdu.resize(plen.max(8), 0);
                    if host_rx.read_exact(&mut pdu[8..]).await.is_err() {
                        break;
                    }
                    // CapsuleCmd carrying Fabrics (0x7F) Authentication Send (0x05).
                    if pdu[0] == 0x04 && pdu.len() > 12 && pdu[8] == 0x7F && pdu[12] == 0x05 {
                        auth_sends += 1;
                        if auth_sends == 2 {
                            back.abort();
                            return; // both halves dropped: the connection closes
                        }
                    }
                    if ctrl_tx.write_all(&pdu).await.is_err() {
                        break;
                    }
                }
                back.abort();
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_after_the_reply_is_an_authentication_error() {
    let t = target();
    let proxy = proxy_closing_after_reply(t.addr()).await;
    let e = Controller::connect(proxy, &t.subnqn, opts(Some(secret(9)), None))
        .await
        .expect_err("refused");
    match &e {
        HostError::Authentication(m) => {
            assert!(
                m.contains("closed the connection after our DH-HMAC-CHAP reply"),
                "{m}"
            )
        }
        other => panic!("expected an authentication error, got {other:?}"),
    }
}
