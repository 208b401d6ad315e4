//! The DH-HMAC-CHAP messages that AUTH_Send and AUTH_Receive carry (NVMe
//! Base 2.x, 8.3.4.5.x), as the Linux host and nvmet lay them out. Every
//! message starts with AUTH_TYPE, AUTH_ID, two reserved bytes and a
//! little-endian transaction ID. Decoding reads only what the message's own
//! lengths cover, so the zero padding of a 4 KiB AUTH_Receive buffer is
//! ignored, and refuses anything short.

/// SECP of AUTH_Send/AUTH_Receive for DH-HMAC-CHAP; SPSP0 and SPSP1 are 01h.
pub const SECP_DHCHAP: u8 = 0xe9;

/// AUTH_TYPE values.
pub mod auth_type {
    pub const COMMON: u8 = 0x00;
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH_ID values.
pub mod auth_id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xf0;
    pub const FAILURE1: u8 = 0xf1;
}

/// Reason code explanations of a Failure1/Failure2 (the reason code itself
/// is always 01h, "authentication failed").
pub mod reason {
    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    pub const INCORRECT_MESSAGE: u8 = 0x07;

    /// What an explanation code means, for logs.
    pub fn describe(code: u8) -> &'static str {
        match code {
            FAILED => "authentication failed",
            NOT_USABLE => "authentication protocol not usable",
            CONCAT_MISMATCH => "secure channel concatenation mismatch",
            HASH_UNUSABLE => "no usable hash function",
            DHGROUP_UNUSABLE => "no usable DH group",
            INCORRECT_PAYLOAD => "incorrect payload",
            INCORRECT_MESSAGE => "incorrect protocol message",
            _ => "unknown reason",
        }
    }
}

/// The DH-HMAC-CHAP protocol descriptor's AUTHID.
const DHCHAP_AUTH_ID: u8 = 0x01;
/// Hash identifiers and DH group identifiers a descriptor can list, each.
pub const IDS_MAX: usize = 30;
/// Messages are small: the largest is a Reply with an ffdhe8192 value
/// (16 + 2 × 64 + 1024 bytes). The Linux host's buffer is 4 KiB.
pub const MESSAGE_BYTES_MAX: usize = 4096;

/// One decoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2 {
        t_id: u16,
    },
    /// Failure1 (controller to host) or Failure2 (host to controller).
    Failure {
        first: bool,
        t_id: u16,
        explanation: u8,
    },
}

/// Host to controller: what the host can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    /// Secure channel concatenation requested (00h: none).
    pub sc_c: u8,
    /// Hash identifiers offered, in the host's order (raw: unknown ones are
    /// kept and skipped by the controller).
    pub hashes: Vec<u8>,
    /// DH group identifiers offered.
    pub dhgroups: Vec<u8>,
}

/// Controller to host: C1, S1 and the controller's DH value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash: u8,
    pub dhgroup: u8,
    pub seqnum: u32,
    pub challenge: Vec<u8>,
    pub dh_value: Vec<u8>,
}

/// Host to controller: R1, optionally C2 (bidirectional), S2 and the host's
/// DH value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    pub seqnum: u32,
    pub response: Vec<u8>,
    /// C2, when the host wants the controller to authenticate too.
    pub challenge: Option<Vec<u8>>,
    pub dh_value: Vec<u8>,
}

/// Controller to host: the host is authenticated; R2 when asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    pub hl: u8,
    pub response: Option<Vec<u8>>,
}

/// A message that cannot be decoded, with the reason explanation to answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("{what}: {have} bytes, at least {need} needed")]
    Short {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("unknown message: AUTH_TYPE {auth_type:#04x}, AUTH_ID {auth_id:#04x}")]
    Unknown { auth_type: u8, auth_id: u8 },
    #[error("{field}: {reason}")]
    Field {
        field: &'static str,
        reason: &'static str,
    },
}

impl MessageError {
    /// The Failure1/Failure2 explanation this error calls for.
    pub fn explanation(&self) -> u8 {
        match self {
            MessageError::Unknown { .. } => reason::INCORRECT_MESSAGE,
            _ => reason::INCORRECT_PAYLOAD,
        }
    }
}

fn need(what: &'static str, b: &[u8], n: usize) -> Result<(), MessageError> {
    if b.len() < n {
        return Err(MessageError::Short {
            what,
            need: n,
            have: b.len(),
        });
    }
    Ok(())
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn header(out: &mut Vec<u8>, auth_type: u8, auth_id: u8, t_id: u16) {
    out.extend_from_slice(&[auth_type, auth_id, 0, 0]);
    out.extend_from_slice(&t_id.to_le_bytes());
}

/// A u8 length field (hash lengths are at most 64).
fn len8(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// A u16 length field (DH values are at most 1024 bytes).
fn len16(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_le_bytes()
}

impl Message {
    /// The transaction ID.
    pub fn t_id(&self) -> u16 {
        match self {
            Message::Negotiate(m) => m.t_id,
            Message::Challenge(m) => m.t_id,
            Message::Reply(m) => m.t_id,
            Message::Success1(m) => m.t_id,
            Message::Success2 { t_id } | Message::Failure { t_id, .. } => *t_id,
        }
    }

    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Negotiate(_) => "Negotiate",
            Message::Challenge(_) => "Challenge",
            Message::Reply(_) => "Reply",
            Message::Success1(_) => "Success1",
            Message::Success2 { .. } => "Success2",
            Message::Failure { first: true, .. } => "Failure1",
            Message::Failure { first: false, .. } => "Failure2",
        }
    }

    pub fn decode(b: &[u8]) -> Result<Message, MessageError> {
        need("message header", b, 6)?;
        let (ty, id, t_id) = (b[0], b[1], le16(b, 4));
        match (ty, id) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                need("Negotiate", b, 8)?;
                let (sc_c, napd) = (b[6], b[7]);
                if napd == 0 {
                    return Err(MessageError::Field {
                        field: "NAPD",
                        reason: "no authentication protocol offered",
                    });
                }
                // Each descriptor is 64 bytes; only DH-HMAC-CHAP is defined,
                // so the first one that names it is used.
                let mut found = None;
                for i in 0..usize::from(napd) {
                    let at = 8 + 64 * i;
                    need("Negotiate protocol descriptor", b, at + 64)?;
                    if b[at] == DHCHAP_AUTH_ID {
                        found = Some(at);
                        break;
                    }
                }
                let at = found.ok_or(MessageError::Field {
                    field: "AUTHID",
                    reason: "DH-HMAC-CHAP is not among the offered protocols",
                })?;
                let (halen, dhlen) = (usize::from(b[at + 2]), usize::from(b[at + 3]));
                if halen > IDS_MAX || dhlen > IDS_MAX {
                    return Err(MessageError::Field {
                        field: "HALEN/DHLEN",
                        reason: "more than 30 identifiers",
                    });
                }
                let ids = &b[at + 4..at + 64];
                Ok(Message::Negotiate(Negotiate {
                    t_id,
                    sc_c,
                    hashes: ids[..halen].to_vec(),
                    dhgroups: ids[IDS_MAX..IDS_MAX + dhlen].to_vec(),
                }))
            }
            (auth_type::DHCHAP, auth_id::CHALLENGE) => {
                need("Challenge", b, 16)?;
                let hl = usize::from(b[6]);
                let dhvlen = usize::from(le16(b, 10));
                need("Challenge values", b, 16 + hl + dhvlen)?;
                Ok(Message::Challenge(Challenge {
                    t_id,
                    hash: b[8],
                    dhgroup: b[9],
                    seqnum: le32(b, 12),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
                }))
            }
            (auth_type::DHCHAP, auth_id::REPLY) => {
                need("Reply", b, 16)?;
                let hl = usize::from(b[6]);
                let cvalid = b[8] != 0;
                let dhvlen = usize::from(le16(b, 10));
                // The C2 field is always there (zero when not valid).
                need("Reply values", b, 16 + 2 * hl + dhvlen)?;
                Ok(Message::Reply(Reply {
                    t_id,
                    seqnum: le32(b, 12),
                    response: b[16..16 + hl].to_vec(),
                    challenge: cvalid.then(|| b[16 + hl..16 + 2 * hl].to_vec()),
                    dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                }))
            }
            (auth_type::DHCHAP, auth_id::SUCCESS1) => {
                need("Success1", b, 16)?;
                let hl = usize::from(b[6]);
                let rvalid = b[8] != 0;
                let response = if rvalid {
                    need("Success1 response", b, 16 + hl)?;
                    Some(b[16..16 + hl].to_vec())
                } else {
                    None
                };
                Ok(Message::Success1(Success1 {
                    t_id,
                    hl: b[6],
                    response,
                }))
            }
            (auth_type::DHCHAP, auth_id::SUCCESS2) => Ok(Message::Success2 { t_id }),
            // Linux sends failures as common messages; accept either type.
            (auth_type::COMMON | auth_type::DHCHAP, auth_id::FAILURE1 | auth_id::FAILURE2) => {
                need("Failure", b, 8)?;
                Ok(Message::Failure {
                    first: id == auth_id::FAILURE1,
                    t_id,
                    explanation: b[7],
                })
            }
            _ => Err(MessageError::Unknown {
                auth_type: ty,
                auth_id: id,
            }),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Message::Negotiate(m) => {
                header(&mut out, auth_type::COMMON, auth_id::NEGOTIATE, m.t_id);
                out.extend_from_slice(&[m.sc_c, 1]);
                let (h, d) = (m.hashes.len().min(IDS_MAX), m.dhgroups.len().min(IDS_MAX));
                let mut desc = [0u8; 64];
                desc[0] = DHCHAP_AUTH_ID;
                desc[2] = len8(h);
                desc[3] = len8(d);
                desc[4..4 + h].copy_from_slice(&m.hashes[..h]);
                desc[4 + IDS_MAX..4 + IDS_MAX + d].copy_from_slice(&m.dhgroups[..d]);
                out.extend_from_slice(&desc);
            }
            Message::Challenge(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::CHALLENGE, m.t_id);
                out.extend_from_slice(&[len8(m.challenge.len()), 0, m.hash, m.dhgroup]);
                out.extend_from_slice(&len16(m.dh_value.len()));
                out.extend_from_slice(&m.seqnum.to_le_bytes());
                out.extend_from_slice(&m.challenge);
                out.extend_from_slice(&m.dh_value);
            }
            Message::Reply(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::REPLY, m.t_id);
                let hl = m.response.len();
                out.extend_from_slice(&[len8(hl), 0, u8::from(m.challenge.is_some()), 0]);
                out.extend_from_slice(&len16(m.dh_value.len()));
                out.extend_from_slice(&m.seqnum.to_le_bytes());
                out.extend_from_slice(&m.response);
                match &m.challenge {
                    Some(c) => out.extend_from_slice(c),
                    None => out.resize(out.len() + hl, 0),
                }
                out.extend_from_slice(&m.dh_value);
            }
            Message::Success1(m) => {
                header(&mut out, auth_type::DHCHAP, auth_id::SUCCESS1, m.t_id);
                out.extend_from_slice(&[m.hl, 0, u8::from(m.response.is_some())]);
                out.resize(16, 0);
                if let Some(r) = &m.response {
                    out.extend_from_slice(r);
                }
            }
            Message::Success2 { t_id } => {
                header(&mut out, auth_type::DHCHAP, auth_id::SUCCESS2, *t_id);
                out.resize(16, 0);
            }
            Message::Failure {
                first,
                t_id,
                explanation,
            } => {
                let id = if *first {
                    auth_id::FAILURE1
                } else {
                    auth_id::FAILURE2
                };
                header(&mut out, auth_type::COMMON, id, *t_id);
                out.extend_from_slice(&[0x01, *explanation]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Negotiate(Negotiate {
                t_id: 3,
                sc_c: 0,
                hashes: vec![1, 2, 3],
                dhgroups: vec![0, 1, 2, 3, 4, 5],
            }),
            Message::Challenge(Challenge {
                t_id: 3,
                hash: 1,
                dhgroup: 1,
                seqnum: 0xdead_beef,
                challenge: vec![9; 32],
                dh_value: vec![7; 256],
            }),
            Message::Reply(Reply {
                t_id: 3,
                seqnum: 0,
                response: vec![1; 48],
                challenge: None,
                dh_value: vec![],
            }),
            Message::Reply(Reply {
                t_id: 3,
                seqnum: 77,
                response: vec![1; 64],
                challenge: Some(vec![2; 64]),
                dh_value: vec![5; 1024],
            }),
            Message::Success1(Success1 {
                t_id: 3,
                hl: 32,
                response: Some(vec![4; 32]),
            }),
            Message::Success1(Success1 {
                t_id: 3,
                hl: 32,
                response: None,
            }),
            Message::Success2 { t_id: 3 },
            Message::Failure {
                first: true,
                t_id: 3,
                explanation: reason::FAILED,
            },
            Message::Failure {
                first: false,
                t_id: 3,
                explanation: reason::INCORRECT_PAYLOAD,
            },
        ]
    }

    #[test]
    fn every_message_round_trips_and_padding_is_ignored() {
        for m in samples() {
            let mut b = m.encode();
            assert_eq!(Message::decode(&b).unwrap(), m);
            b.resize(MESSAGE_BYTES_MAX, 0);
            assert_eq!(Message::decode(&b).unwrap(), m, "padded {}", m.name());
        }
    }

    #[test]
    fn layouts_match_the_linux_structures() {
        // Negotiate: 8-byte header + one 64-byte descriptor; DH ids at 30.
        let n = samples()[0].encode();
        assert_eq!(n.len(), 72);
        assert_eq!(&n[..8], &[0, 0, 0, 0, 3, 0, 0, 1]);
        assert_eq!(&n[8..12], &[1, 0, 3, 6]);
        assert_eq!(&n[12..15], &[1, 2, 3]);
        assert_eq!(&n[42..48], &[0, 1, 2, 3, 4, 5]);
        // Challenge: hl at 6, hashid 8, dhgid 9, dhvlen 10, seqnum 12.
        let c = samples()[1].encode();
        assert_eq!(c.len(), 16 + 32 + 256);
        assert_eq!(&c[6..16], &[32, 0, 1, 1, 0, 1, 0xef, 0xbe, 0xad, 0xde]);
        // Reply without C2 still carries hl zero bytes for it.
        assert_eq!(samples()[2].encode().len(), 16 + 2 * 48);
        // Success1: 16-byte header, rvalid at 8, then R2.
        let s = samples()[4].encode();
        assert_eq!((s.len(), s[6], s[8]), (48, 32, 1));
        // Failure1: common type, rescode 1, explanation.
        assert_eq!(samples()[7].encode(), vec![0, 0xf1, 0, 0, 3, 0, 1, 1]);
    }

    #[test]
    fn short_or_unknown_messages_are_refused_with_the_right_explanation() {
        for m in samples() {
            let b = m.encode();
            let e = Message::decode(&b[..b.len() - 1]);
            if !matches!(
                m,
                Message::Success2 { .. } | Message::Success1(Success1 { response: None, .. })
            ) {
                let e = e.unwrap_err();
                assert_eq!(
                    e.explanation(),
                    reason::INCORRECT_PAYLOAD,
                    "{}: {e}",
                    m.name()
                );
            }
        }
        let e = Message::decode(&[1, 9, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(e.explanation(), reason::INCORRECT_MESSAGE);
        let mut n = samples()[0].encode();
        n[10] = 31; // HALEN
        assert!(Message::decode(&n).is_err());
        n[10] = 3;
        n[8] = 2; // AUTHID
        assert!(Message::decode(&n).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(b in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let _ = Message::decode(&b);
        }

        #[test]
        fn decoded_messages_reencode_to_a_prefix_that_decodes_the_same(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(m) = Message::decode(&b) {
                prop_assert_eq!(Message::decode(&m.encode()).unwrap(), m);
            }
        }
    }
}
