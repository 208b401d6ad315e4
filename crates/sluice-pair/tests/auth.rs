//! DH-HMAC-CHAP through the real target queue on the virtual clock: the
//! Connect asks for authentication (ATR), nothing but Fabrics commands runs
//! until the host has authenticated, right secrets get through one-way and
//! both ways, wrong ones are refused, logged and, after three tries, the
//! connection is closed; a subsystem that requires authentication refuses
//! hosts without a secret.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use sluice_auth::message::{reason, Message};
use sluice_auth::{DhGroup, HashId, HostAuth, HostAuthError, HostConfig, Secret};
use sluice_config::auth::HostAuthConfig;
use sluice_host::core::Payload;
use sluice_host::HostError;
use sluice_pair::*;
use sluice_proto::command::admin;
use sluice_proto::fabrics::{cc, prop, AuthCommand, CNTLID_DYNAMIC};
use sluice_proto::send::SendConfig;
use sluice_proto::{Sqe, Status};

const ATR: u32 = sluice_proto::fabrics::CONNECT_AUTHREQ_ATR;

fn secret(seed: u8) -> Secret {
    Secret::new((0..32).map(|i| seed ^ i).collect(), None).unwrap()
}

fn params(host: Secret, ctrl: Option<Secret>, group: DhGroup) -> Params {
    let mut a = HostAuthConfig::new(HOSTNQN, host)
        .with_hash(HashId::Sha384)
        .with_dhgroup(group);
    if let Some(c) = ctrl {
        a = a.with_ctrl_secret(c);
    }
    Params {
        dhchap: Some(a),
        ..Params::default()
    }
}

fn rng(seed: u64) -> impl FnMut(&mut [u8]) {
    let mut s = seed;
    move |b: &mut [u8]| {
        for x in b {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *x = (s >> 33) as u8;
        }
    }
}

fn send(pair: &mut Pair, link: usize, msg: Vec<u8>) -> Result<(), HostError> {
    let len = msg.len() as u32;
    pair.execute(
        link,
        AuthCommand { send: true, len }.to_sqe(0),
        Payload::Write(msg),
    )
    .map(|_| ())
}

fn receive(pair: &mut Pair, link: usize) -> Vec<u8> {
    pair.execute(
        link,
        AuthCommand {
            send: false,
            len: 4096,
        }
        .to_sqe(0),
        Payload::Read(4096),
    )
    .expect("AUTH_Receive completes")
    .data
}

/// One whole transaction on `link`, as the Linux host runs it.
fn authenticate(
    pair: &mut Pair,
    link: usize,
    host: Secret,
    ctrl: Option<Secret>,
    t_id: u16,
) -> Result<(), HostAuthError> {
    let mut h = HostAuth::new(
        HostConfig {
            hostnqn: HOSTNQN.into(),
            subnqn: SUBNQN.into(),
            secret: host,
            ctrl_secret: ctrl,
        },
        t_id,
    );
    let mut r = rng(u64::from(t_id));
    send(pair, link, h.negotiate()).unwrap();
    let challenge = receive(pair, link);
    assert_eq!(challenge.len(), 4096, "AUTH_Receive returns AL bytes");
    let reply = h.handle_challenge(&challenge, &mut r, 5)?;
    send(pair, link, reply).unwrap();
    let s1 = receive(pair, link);
    match h.handle_success1(&s1) {
        Ok(Some(s2)) => {
            send(pair, link, s2).unwrap();
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if let Some(x) = e.failure2_explanation() {
                send(pair, link, h.failure2(x)).unwrap();
            }
            Err(e)
        }
    }
}

fn identify_ctrl(pair: &mut Pair) -> Result<(), HostError> {
    let mut s = Sqe::new(admin::IDENTIFY, 0, 0);
    s.set_cdw(10, 1);
    pair.execute(ADMIN, s, Payload::Read(4096)).map(|_| ())
}

/// Admin Connect + CC.EN by hand (authentication comes between them).
fn connect_admin(pair: &mut Pair) -> u32 {
    let l = pair.open_link(0, 32, SendConfig::default());
    assert_eq!(l, ADMIN);
    let c = pair
        .connect(ADMIN, 0, 31, 0, CNTLID_DYNAMIC)
        .expect("admin Connect");
    pair.cntlid = (c.cqe.result & 0xffff) as u16;
    // Property Set runs before authentication (a Fabrics command).
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    pair.prop_set(prop::CC, u64::from(en))
        .expect("CC.EN before auth");
    c.cqe.result
}

#[test]
fn a_host_with_the_right_secret_authenticates_every_queue_then_does_io() {
    for (group, bidirectional) in [(DhGroup::Null, false), (DhGroup::Ffdhe2048, true)] {
        let ctrl = bidirectional.then(|| secret(2));
        let mut pair = Pair::unconnected(params(secret(1), ctrl.clone(), group));
        let result = connect_admin(&mut pair);
        assert_ne!(result & ATR, 0, "Connect asks for authentication");
        // Before authenticating: Fabrics commands work, others do not.
        pair.prop_get(prop::CAP).expect("Property Get before auth");
        assert_eq!(
            nvme_status(&identify_ctrl(&mut pair)),
            Some(Status::AUTH_REQUIRED)
        );
        authenticate(&mut pair, ADMIN, secret(1), ctrl.clone(), 1).expect("authenticates");
        identify_ctrl(&mut pair).expect("Identify after auth");

        // The I/O queue authenticates on its own.
        let l = pair.open_link(1, 32, SendConfig::default());
        assert_eq!(l, IO);
        let c = pair
            .connect(IO, 1, 31, 0, pair.cntlid)
            .expect("I/O Connect");
        assert_ne!(c.cqe.result & ATR, 0);
        let e = pair.write(0, &pattern(4096, 1));
        assert_eq!(nvme_status(&e), Some(Status::AUTH_REQUIRED));
        authenticate(&mut pair, IO, secret(1), ctrl, 2).expect("I/O queue authenticates");
        let data = pattern(8192, 3);
        pair.write(8, &data).expect("write");
        assert_eq!(pair.read(8, data.len()).expect("read"), data);
    }
}

#[test]
fn a_wrong_secret_is_refused_and_the_queue_stays_closed_to_commands() {
    let mut pair = Pair::unconnected(params(secret(1), None, DhGroup::Null));
    connect_admin(&mut pair);
    let e = authenticate(&mut pair, ADMIN, secret(9), None, 1).unwrap_err();
    assert_eq!(
        e,
        HostAuthError::Refused {
            explanation: reason::FAILED
        }
    );
    assert_eq!(
        nvme_status(&identify_ctrl(&mut pair)),
        Some(Status::AUTH_REQUIRED)
    );
    // Counted by reason, for the metrics (each pair has its own registry).
    assert_eq!(pair.reg.auth.failures()[usize::from(reason::FAILED)], 1);
    assert_eq!(pair.reg.auth.successes(), 0);
    // A second try with the right secret on the same queue works.
    authenticate(&mut pair, ADMIN, secret(1), None, 2).expect("second try");
    identify_ctrl(&mut pair).expect("Identify");
    assert_eq!(pair.reg.auth.successes(), 1);
    assert_eq!(pair.reg.auth.failures().iter().sum::<u64>(), 1);
}

#[test]
fn the_host_catches_a_target_without_the_controller_secret() {
    // The target knows controller secret 3; the host expects secret 2.
    let mut pair = Pair::unconnected(params(secret(1), Some(secret(3)), DhGroup::Null));
    connect_admin(&mut pair);
    let e = authenticate(&mut pair, ADMIN, secret(1), Some(secret(2)), 1).unwrap_err();
    assert_eq!(e, HostAuthError::ControllerNotAuthenticated);
    // The host's Failure2 leaves the queue unauthenticated.
    assert_eq!(
        nvme_status(&identify_ctrl(&mut pair)),
        Some(Status::AUTH_REQUIRED)
    );
}

#[test]
fn three_failed_attempts_close_the_connection() {
    let mut pair = Pair::unconnected(params(secret(1), None, DhGroup::Null));
    connect_admin(&mut pair);
    for t in 0..2 {
        assert!(authenticate(&mut pair, ADMIN, secret(9), None, t).is_err());
    }
    // The third failure closes the queue: the host sees the connection end.
    let mut h = HostAuth::new(
        HostConfig {
            hostnqn: HOSTNQN.into(),
            subnqn: SUBNQN.into(),
            secret: secret(9),
            ctrl_secret: None,
        },
        3,
    );
    send(&mut pair, ADMIN, h.negotiate()).unwrap();
    let ch = receive(&mut pair, ADMIN);
    let reply = h.handle_challenge(&ch, &mut rng(3), 0).unwrap();
    let _ = send(&mut pair, ADMIN, reply);
    pair.run();
    assert!(
        pair.link(ADMIN).closed().is_some(),
        "connection closed after three failures"
    );
}

#[test]
fn bad_auth_commands_get_the_statuses_nvmet_gives() {
    let mut pair = Pair::unconnected(params(secret(1), None, DhGroup::Null));
    connect_admin(&mut pair);
    // Wrong SECP.
    let mut s = AuthCommand { send: true, len: 8 }.to_sqe(0);
    s.0[43] = 0xea;
    let e = pair.execute(ADMIN, s, Payload::Write(vec![0; 8]));
    assert_eq!(nvme_status(&e), Some(Status::INVALID_FIELD));
    // TL that is not the SGL's length (8 announced, 16 sent).
    let s = AuthCommand { send: true, len: 8 }.to_sqe(0);
    let e = pair.execute(ADMIN, s, Payload::Write(vec![0; 16]));
    assert_eq!(nvme_status(&e), Some(Status::DATA_SGL_LENGTH_INVALID));
    // AL beyond what any message needs.
    let s = AuthCommand {
        send: false,
        len: 1 << 20,
    }
    .to_sqe(0);
    let e = pair.execute(ADMIN, s, Payload::Read(1 << 20));
    assert_eq!(nvme_status(&e), Some(Status::DATA_SGL_LENGTH_INVALID));
    // TL 0.
    let s = AuthCommand {
        send: false,
        len: 0,
    }
    .to_sqe(0);
    let e = pair.execute(ADMIN, s, Payload::None);
    assert_eq!(nvme_status(&e), Some(Status::INVALID_FIELD));
    // Garbage is answered with Failure1 (incorrect payload) on the next
    // AUTH_Receive; the command itself succeeds, as in nvmet.
    send(&mut pair, ADMIN, vec![0xff; 12]).unwrap();
    let f = Message::decode(&receive(&mut pair, ADMIN)).unwrap();
    assert!(
        matches!(
            f,
            Message::Failure {
                first: true,
                explanation: reason::INCORRECT_MESSAGE,
                ..
            }
        ),
        "{f:?}"
    );
}

#[test]
fn a_subsystem_that_requires_authentication_refuses_hosts_without_a_secret() {
    // The secret is for another host: ours has none.
    let mut p = params(secret(1), None, DhGroup::Null);
    p.open_subsystem = true;
    p.require_auth = true;
    p.dhchap = Some(HostAuthConfig::new(
        "nqn.2014-08.org.nvmexpress:uuid:someone-else",
        secret(1),
    ));
    let mut pair = Pair::unconnected(p);
    pair.open_link(0, 32, SendConfig::default());
    let e = pair.connect(ADMIN, 0, 31, 0, CNTLID_DYNAMIC);
    assert_eq!(nvme_status(&e), Some(Status::CONNECT_INVALID_HOST));
}

#[test]
fn hosts_without_a_secret_on_an_ordinary_subsystem_connect_as_before() {
    let mut pair = Pair::new(Params::default());
    let data = pattern(4096, 9);
    pair.write(0, &data).expect("write");
    assert_eq!(pair.read(0, 4096).expect("read"), data);
    assert_eq!(pair.link(ADMIN).target.hostnqn(), Some(HOSTNQN));
}

#[test]
fn a_queue_that_never_authenticates_is_closed_after_the_grace() {
    let mut pair = Pair::unconnected(params(secret(1), None, DhGroup::Null));
    connect_admin(&mut pair);
    // No keep alive here (KATO 0): only the authentication deadline can
    // close the queue. Handshake timeout 10 s + 60 s of grace.
    pair.advance(std::time::Duration::from_secs(65));
    assert!(pair.link(ADMIN).closed().is_none(), "closed too early");
    pair.advance(std::time::Duration::from_secs(10));
    assert!(
        pair.link(ADMIN).closed().is_some(),
        "still open 75 s after connecting without authenticating"
    );
    // An authenticated queue is not touched by that deadline.
    let mut pair = Pair::unconnected(params(secret(1), None, DhGroup::Null));
    connect_admin(&mut pair);
    authenticate(&mut pair, ADMIN, secret(1), None, 1).unwrap();
    pair.advance(std::time::Duration::from_secs(120));
    assert!(pair.link(ADMIN).closed().is_none());
    identify_ctrl(&mut pair).expect("Identify long after authenticating");
}
