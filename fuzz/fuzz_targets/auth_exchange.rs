//! The controller's DH-HMAC-CHAP state machine fed sequences of AUTH_Send
//! payloads and AUTH_Receive calls, as a hostile host would send them:
//! never a panic; every AUTH_Receive answer decodes; and no sequence gets a
//! queue authenticated without a Reply that matches the secret (the fuzzer
//! cannot know the secret, so it never may). Each step is one byte of kind
//! (even: send, odd: receive), a length byte, then that many payload bytes;
//! bytes 0x00/0x01 as the first payload byte splice in a valid Negotiate.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use sluice_auth::message::Message;
use sluice_auth::{
    ControllerAuth, ControllerConfig, DhGroup, HashId, HostAuth, HostConfig, Secret,
};

fuzz_target!(|data: &[u8]| {
    let secret = Secret::new(vec![7; 32], None).expect("32-byte key");
    let cfg = Arc::new(ControllerConfig {
        hostnqn: "nqn.fuzz:host".into(),
        subnqn: "nqn.fuzz:sub".into(),
        host_secret: secret,
        ctrl_secret: None,
        hash: HashId::Sha256,
        dhgroup: DhGroup::Null,
    });
    let mut c = ControllerAuth::new(cfg, 1);
    // The fuzzer's host does not know the secret.
    let negotiate = HostAuth::new(
        HostConfig {
            hostnqn: "nqn.fuzz:host".into(),
            subnqn: "nqn.fuzz:sub".into(),
            secret: Secret::new(vec![8; 32], None).expect("32-byte key"),
            ctrl_secret: None,
        },
        0,
    )
    .negotiate();
    let mut counter = 0u8;
    let mut rest = data;
    while let [kind, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (payload, next) = tail.split_at(n);
        rest = next;
        if kind % 2 == 0 {
            match payload.first() {
                Some(0) | Some(1) => c.handle_send(&negotiate),
                _ => c.handle_send(payload),
            }
        } else {
            let out = c.poll_receive(&mut |b: &mut [u8]| {
                for x in b {
                    counter = counter.wrapping_add(1);
                    *x = counter;
                }
            });
            assert!(
                Message::decode(&out).is_ok(),
                "the controller sent an undecodable message"
            );
        }
        assert!(!c.is_authenticated(), "authenticated without the secret");
        let _ = c.take_outcome();
    }
});
