//! A host and a controller run whole DH-HMAC-CHAP transactions against
//! each other: every hash and DH group, one-way and bidirectional, wrong
//! secrets on either side, replays, and messages out of order.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::sync::Arc;

use sluice_auth::message::{reason, Message};
use sluice_auth::{
    ControllerAuth, ControllerConfig, DhGroup, HashId, HostAuth, HostAuthError, HostConfig,
    Outcome, Secret,
};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:host-a";
const SUB: &str = "nqn.2026-11.io.sluice:auth";

fn secret(seed: u8, transform: Option<HashId>) -> Secret {
    let n = transform.map_or(32, HashId::len_bytes);
    Secret::new(
        (0..n).map(|i| seed.wrapping_add(i as u8)).collect(),
        transform,
    )
    .unwrap()
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

fn controller(hash: HashId, group: DhGroup, host: Secret, ctrl: Option<Secret>) -> ControllerAuth {
    ControllerAuth::new(
        Arc::new(ControllerConfig {
            hostnqn: HOST.into(),
            subnqn: SUB.into(),
            host_secret: host,
            ctrl_secret: ctrl,
            hash,
            dhgroup: group,
        }),
        41,
    )
}

fn host(secret: Secret, ctrl: Option<Secret>, t_id: u16) -> HostAuth {
    HostAuth::new(
        HostConfig {
            hostnqn: HOST.into(),
            subnqn: SUB.into(),
            secret,
            ctrl_secret: ctrl,
        },
        t_id,
    )
}

/// Runs one transaction; returns the host's result and the controller's
/// outcome.
fn run(c: &mut ControllerAuth, h: &mut HostAuth, seed: u64) -> Result<(), HostAuthError> {
    let mut r = rng(seed);
    c.handle_send(&h.negotiate());
    let mut challenge = c.poll_receive(&mut r);
    challenge.resize(4096, 0); // as AUTH_Receive AL = 4096 pads it
    let reply = match h.handle_challenge(&challenge, &mut r, 7) {
        Ok(x) => x,
        Err(e) => {
            if let Some(x) = e.failure2_explanation() {
                c.handle_send(&h.failure2(x));
            }
            return Err(e);
        }
    };
    c.handle_send(&reply);
    let s1 = c.poll_receive(&mut r);
    match h.handle_success1(&s1) {
        Ok(Some(s2)) => {
            c.handle_send(&s2);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if let Some(x) = e.failure2_explanation() {
                c.handle_send(&h.failure2(x));
            }
            Err(e)
        }
    }
}

#[test]
fn every_hash_and_group_authenticates_one_way_and_both_ways() {
    let mut combos: Vec<(HashId, DhGroup)> = HashId::ALL
        .iter()
        .flat_map(|&h| [(h, DhGroup::Null), (h, DhGroup::Ffdhe2048)])
        .collect();
    // The larger groups once each (modular exponentiation is slow in a
    // debug build).
    combos.extend(DhGroup::ALL[2..].iter().map(|&g| (HashId::Sha256, g)));
    for (i, (hash, group)) in combos.into_iter().enumerate() {
        for bidirectional in [false, true] {
            for transform in [None, Some(hash)] {
                let hs = secret(1, transform);
                let cs = bidirectional.then(|| secret(2, transform));
                let mut c = controller(hash, group, hs.clone(), cs.clone());
                let mut h = host(hs, cs, i as u16);
                run(&mut c, &mut h, i as u64)
                    .unwrap_or_else(|e| panic!("{hash} {group} bidi={bidirectional}: {e}"));
                assert!(c.is_authenticated(), "{hash} {group}");
                assert_eq!(h.negotiated(), Some((hash, group)));
                assert_eq!(
                    c.take_outcome(),
                    Some(Outcome::Authenticated {
                        hash,
                        dhgroup: group,
                        bidirectional
                    })
                );
            }
        }
    }
}

#[test]
fn a_wrong_host_secret_gets_failure1_and_no_access() {
    let mut c = controller(HashId::Sha256, DhGroup::Ffdhe2048, secret(1, None), None);
    let mut h = host(secret(9, None), None, 5);
    let e = run(&mut c, &mut h, 1).unwrap_err();
    assert_eq!(
        e,
        HostAuthError::Refused {
            explanation: reason::FAILED
        }
    );
    assert!(!c.is_authenticated());
    assert!(matches!(
        c.take_outcome(),
        Some(Outcome::Failed {
            explanation: reason::FAILED,
            ..
        })
    ));
}

#[test]
fn a_controller_without_the_right_secret_is_caught_by_the_host() {
    // The host insists on controller authentication with secret 2; the
    // controller knows secret 3.
    let mut c = controller(
        HashId::Sha384,
        DhGroup::Null,
        secret(1, None),
        Some(secret(3, None)),
    );
    let mut h = host(secret(1, None), Some(secret(2, None)), 5);
    let e = run(&mut c, &mut h, 2).unwrap_err();
    assert_eq!(e, HostAuthError::ControllerNotAuthenticated);
    // The host said so with Failure2: the queue is not authenticated.
    assert!(!c.is_authenticated());
    // And one without any controller secret answers Failure1.
    let mut c = controller(HashId::Sha384, DhGroup::Null, secret(1, None), None);
    let mut h = host(secret(1, None), Some(secret(2, None)), 6);
    assert_eq!(
        run(&mut c, &mut h, 3).unwrap_err(),
        HostAuthError::Refused {
            explanation: reason::FAILED
        }
    );
}

#[test]
fn a_replayed_reply_is_refused() {
    let hs = secret(1, None);
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    let mut r = rng(4);
    // A first transaction, recorded.
    let mut h = host(hs.clone(), None, 10);
    c.handle_send(&h.negotiate());
    let ch = c.poll_receive(&mut r);
    let reply = h.handle_challenge(&ch, &mut r, 0).unwrap();
    c.handle_send(&reply);
    c.poll_receive(&mut r);
    assert!(c.is_authenticated());
    // An attacker replays the whole transcript on a new queue: the
    // controller's fresh challenge makes the old reply worthless.
    let mut c2 = controller(HashId::Sha256, DhGroup::Null, hs, None);
    c2.handle_send(&h.negotiate());
    let _fresh = c2.poll_receive(&mut r);
    c2.handle_send(&reply);
    assert!(!c2.is_authenticated());
    let f = Message::decode(&c2.poll_receive(&mut r)).unwrap();
    assert_eq!(
        f,
        Message::Failure {
            first: true,
            t_id: 10,
            explanation: reason::FAILED
        }
    );
}

#[test]
fn messages_out_of_order_or_malformed_fail_the_transaction() {
    let hs = secret(1, None);
    let mut r = rng(5);
    // Reply before Negotiate.
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    let mut h = host(hs.clone(), None, 1);
    let mut other = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    other.handle_send(&h.negotiate());
    let reply = h
        .handle_challenge(&other.poll_receive(&mut r), &mut r, 0)
        .unwrap();
    c.handle_send(&reply);
    let f = Message::decode(&c.poll_receive(&mut r)).unwrap();
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
    // Garbage.
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    c.handle_send(&[0, 0, 0]);
    let f = Message::decode(&c.poll_receive(&mut r)).unwrap();
    assert!(
        matches!(
            f,
            Message::Failure {
                explanation: reason::INCORRECT_PAYLOAD,
                ..
            }
        ),
        "{f:?}"
    );
    // A Reply for another transaction ID.
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    let mut h = host(hs.clone(), None, 1);
    c.handle_send(&h.negotiate());
    let ch = c.poll_receive(&mut r);
    let mut reply = h.handle_challenge(&ch, &mut r, 0).unwrap();
    reply[4] ^= 1;
    c.handle_send(&reply);
    assert!(!c.is_authenticated());
    // Negotiate with no usable hash.
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs, None);
    let mut n = h.negotiate();
    n[12..15].copy_from_slice(&[9, 9, 9]);
    c.handle_send(&n);
    let f = Message::decode(&c.poll_receive(&mut r)).unwrap();
    assert!(
        matches!(
            f,
            Message::Failure {
                explanation: reason::HASH_UNUSABLE,
                ..
            }
        ),
        "{f:?}"
    );
}

#[test]
fn the_controller_prefers_its_configured_choice_when_offered() {
    let hs = secret(1, None);
    let mut c = controller(HashId::Sha512, DhGroup::Ffdhe3072, hs.clone(), None);
    let mut h = host(hs, None, 3);
    run(&mut c, &mut h, 6).unwrap();
    assert_eq!(h.negotiated(), Some((HashId::Sha512, DhGroup::Ffdhe3072)));
}

#[test]
fn reauthentication_keeps_access_until_it_fails() {
    let hs = secret(1, None);
    let mut c = controller(HashId::Sha256, DhGroup::Null, hs.clone(), None);
    run(&mut c, &mut host(hs.clone(), None, 1), 7).unwrap();
    assert!(c.is_authenticated());
    // A new Negotiate: still authenticated while it runs.
    let h = host(hs, None, 2);
    c.handle_send(&h.negotiate());
    assert!(c.is_authenticated() && c.in_progress());
    // It fails (wrong secret): access ends.
    let mut bad = host(secret(5, None), None, 2);
    let mut r = rng(8);
    let ch = c.poll_receive(&mut r);
    c.handle_send(&bad.handle_challenge(&ch, &mut r, 0).unwrap());
    assert!(!c.is_authenticated());
}
