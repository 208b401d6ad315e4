//! The host's side of DH-HMAC-CHAP (`sluice_auth::HostAuth`) fed a hostile
//! controller. The controller is a real `ControllerAuth` that knows the
//! host's secret but not the controller secret the host may ask it to
//! prove. Its Challenge (null group or ffdhe2048) and its Success1 reach
//! the host as they are, with fuzzed bytes flipped, or replaced by fuzzed
//! bytes altogether.
//!
//! Checked: no panic; a Reply the host sends decodes as a Reply; and when
//! the host asks the controller to authenticate, no Success1 the fuzzer
//! makes is accepted (it cannot know the controller secret).
//!
//! Input: a flags byte (bit 0: the host asks the controller to
//! authenticate; bit 1: ffdhe2048 instead of the null group; bit 2:
//! replace the Challenge, bit 3: replace the Success1), then for each of
//! the two messages a length byte and that many bytes: the replacement, or
//! (position, xor) pairs to flip in the real message.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use sluice_auth::message::Message;
use sluice_auth::{
    ControllerAuth, ControllerConfig, DhGroup, HashId, HostAuth, HostConfig, Secret,
};

const HOSTNQN: &str = "nqn.fuzz:host";
const SUBNQN: &str = "nqn.fuzz:sub";

/// The next message: the real one with bytes flipped, or fuzzed bytes.
fn message(real: &[u8], replace: bool, rest: &mut &[u8]) -> Vec<u8> {
    let (n, tail) = match rest.split_first() {
        Some((n, tail)) => (usize::from(*n).min(tail.len()), tail),
        None => (0, &[][..]),
    };
    let (mine, next) = tail.split_at(n);
    *rest = next;
    if replace {
        return mine.to_vec();
    }
    let mut m = real.to_vec();
    for pair in mine.chunks_exact(2) {
        if !m.is_empty() {
            let at = usize::from(pair[0]) % m.len();
            m[at] ^= pair[1];
        }
    }
    m
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let ask_ctrl = flags & 1 != 0;
    let group = if flags & 2 != 0 {
        DhGroup::Ffdhe2048
    } else {
        DhGroup::Null
    };
    let host_secret = Secret::new(vec![7; 32], None).expect("32-byte key");
    let mut host = HostAuth::new(
        HostConfig {
            hostnqn: HOSTNQN.into(),
            subnqn: SUBNQN.into(),
            secret: host_secret.clone(),
            ctrl_secret: ask_ctrl.then(|| Secret::new(vec![9; 32], None).expect("32-byte key")),
        },
        3,
    );
    // The hostile controller knows the host's secret, not the controller's.
    let mut ctrl = ControllerAuth::new(
        Arc::new(ControllerConfig {
            hostnqn: HOSTNQN.into(),
            subnqn: SUBNQN.into(),
            host_secret,
            ctrl_secret: Some(Secret::new(vec![8; 32], None).expect("32-byte key")),
            hash: HashId::Sha256,
            dhgroup: group,
        }),
        1,
    );
    let mut counter = 0u8;
    let mut random = |b: &mut [u8]| {
        for x in b {
            counter = counter.wrapping_add(0x3d);
            *x = counter;
        }
    };
    ctrl.handle_send(&host.negotiate());
    let challenge = ctrl.poll_receive(&mut random);
    let challenge = message(&challenge, flags & 4 != 0, &mut rest);
    let reply = match host.handle_challenge(&challenge, &mut random, 5) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.failure2_explanation().map(|x| host.failure2(x));
            return;
        }
    };
    assert!(
        matches!(Message::decode(&reply), Ok(Message::Reply(_))),
        "the host's Reply does not decode"
    );
    ctrl.handle_send(&reply);
    let success1 = ctrl.poll_receive(&mut random);
    let success1 = message(&success1, flags & 8 != 0, &mut rest);
    match host.handle_success1(&success1) {
        Ok(Some(success2)) => {
            assert!(
                !ask_ctrl,
                "the host accepted a controller that does not know the controller secret"
            );
            assert!(Message::decode(&success2).is_ok());
        }
        Ok(None) => {}
        Err(e) => {
            let _ = e.failure2_explanation().map(|x| host.failure2(x));
        }
    }
});
