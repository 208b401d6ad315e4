//! The host's side of one DH-HMAC-CHAP transaction, sans-IO: the caller
//! sends `negotiate()` with AUTH_Send, reads the Challenge with
//! AUTH_Receive and passes it to `handle_challenge`, sends the Reply it
//! returns, reads Success1 into `handle_success1`, and sends Success2 when
//! that returns one. On an error it sends `failure2(..)` (when the error
//! came from checking the controller) and gives up on the connection.

use crate::algo::{DhGroup, HashId};
use crate::crypto::{self, DhKeyPair};
use crate::key::Secret;
use crate::message::{reason, Message, Negotiate, Reply};

/// What the host authenticates with.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub hostnqn: String,
    pub subnqn: String,
    pub secret: Secret,
    /// When set, the host also makes the controller prove this secret.
    pub ctrl_secret: Option<Secret>,
}

/// Why the exchange failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostAuthError {
    #[error("the controller refused the host: {} ({explanation:#04x})", reason::describe(*explanation))]
    Refused { explanation: u8 },
    #[error("the controller's response is wrong: it does not know the controller secret")]
    ControllerNotAuthenticated,
    #[error("{detail}")]
    Protocol { explanation: u8, detail: String },
}

impl HostAuthError {
    /// The explanation for the Failure2 to send, if one is due.
    pub fn failure2_explanation(&self) -> Option<u8> {
        match self {
            HostAuthError::Refused { .. } => None,
            HostAuthError::ControllerNotAuthenticated => Some(reason::FAILED),
            HostAuthError::Protocol { explanation, .. } => Some(*explanation),
        }
    }
}

fn protocol(explanation: u8, detail: impl Into<String>) -> HostAuthError {
    HostAuthError::Protocol {
        explanation,
        detail: detail.into(),
    }
}

/// One transaction on one queue.
#[derive(Debug)]
pub struct HostAuth {
    cfg: HostConfig,
    t_id: u16,
    hash: Option<HashId>,
    dhgroup: DhGroup,
    session_key: Option<Vec<u8>>,
    c2: Option<Vec<u8>>,
    s2: u32,
}

impl HostAuth {
    pub fn new(cfg: HostConfig, t_id: u16) -> HostAuth {
        HostAuth {
            cfg,
            t_id,
            hash: None,
            dhgroup: DhGroup::Null,
            session_key: None,
            c2: None,
            s2: 0,
        }
    }

    /// The negotiated hash and group, once the Challenge came.
    pub fn negotiated(&self) -> Option<(HashId, DhGroup)> {
        self.hash.map(|h| (h, self.dhgroup))
    }

    /// The Negotiate: every hash and DH group, strongest hash last as Linux
    /// orders them (the controller picks).
    pub fn negotiate(&self) -> Vec<u8> {
        Message::Negotiate(Negotiate {
            t_id: self.t_id,
            sc_c: 0,
            hashes: HashId::ALL.iter().map(|h| h.id()).collect(),
            dhgroups: DhGroup::ALL.iter().map(|g| g.id()).collect(),
        })
        .encode()
    }

    fn expect(&self, data: &[u8], want: &'static str) -> Result<Message, HostAuthError> {
        let m =
            Message::decode(data).map_err(|e| protocol(e.explanation(), format!("{want}: {e}")))?;
        if let Message::Failure {
            first: true,
            explanation,
            ..
        } = m
        {
            return Err(HostAuthError::Refused { explanation });
        }
        if m.name() != want {
            return Err(protocol(
                reason::INCORRECT_MESSAGE,
                format!("expected {want}, got {}", m.name()),
            ));
        }
        if m.t_id() != self.t_id {
            return Err(protocol(
                reason::INCORRECT_MESSAGE,
                format!("{want} for transaction {}, not {}", m.t_id(), self.t_id),
            ));
        }
        Ok(m)
    }

    /// Takes the Challenge; returns the Reply to send.
    pub fn handle_challenge(
        &mut self,
        data: &[u8],
        random: &mut dyn FnMut(&mut [u8]),
        seqnum: u32,
    ) -> Result<Vec<u8>, HostAuthError> {
        let Message::Challenge(c) = self.expect(data, "Challenge")? else {
            return Err(protocol(reason::INCORRECT_MESSAGE, "expected Challenge"));
        };
        let hash = HashId::from_id(c.hash)
            .ok_or_else(|| protocol(reason::HASH_UNUSABLE, format!("hash {} unknown", c.hash)))?;
        if c.challenge.len() != hash.len_bytes() {
            return Err(protocol(
                reason::HASH_UNUSABLE,
                "challenge length differs from the hash's",
            ));
        }
        let group = DhGroup::from_id(c.dhgroup).ok_or_else(|| {
            protocol(
                reason::DHGROUP_UNUSABLE,
                format!("DH group {} unknown", c.dhgroup),
            )
        })?;
        let mut dh_value = Vec::new();
        if group == DhGroup::Null {
            if !c.dh_value.is_empty() {
                return Err(protocol(
                    reason::INCORRECT_PAYLOAD,
                    "DH value with the null group",
                ));
            }
        } else {
            let kp = DhKeyPair::generate(group, random)
                .ok_or_else(|| protocol(reason::DHGROUP_UNUSABLE, "no key pair"))?;
            let k = kp.shared(&c.dh_value).map_err(|e| {
                protocol(
                    reason::DHGROUP_UNUSABLE,
                    format!("controller DH value: {e}"),
                )
            })?;
            dh_value = kp.public().to_vec();
            self.session_key = Some(k);
        }
        self.hash = Some(hash);
        self.dhgroup = group;
        let c1 = crypto::augmented(hash, self.session_key.as_deref(), &c.challenge);
        let key = self.cfg.secret.transformed(&self.cfg.hostnqn);
        let response = crypto::host_response(
            hash,
            &key,
            &c1,
            c.seqnum,
            self.t_id,
            &self.cfg.hostnqn,
            &self.cfg.subnqn,
        );
        let challenge = if self.cfg.ctrl_secret.is_some() {
            let mut c2 = vec![0u8; hash.len_bytes()];
            random(&mut c2);
            self.s2 = if seqnum == 0 { 1 } else { seqnum };
            self.c2 = Some(c2.clone());
            Some(c2)
        } else {
            None
        };
        Ok(Message::Reply(Reply {
            t_id: self.t_id,
            seqnum: self.s2,
            response,
            challenge,
            dh_value,
        })
        .encode())
    }

    /// Takes Success1; returns the Success2 to send when the controller
    /// was asked to authenticate (and did).
    pub fn handle_success1(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, HostAuthError> {
        let Message::Success1(s) = self.expect(data, "Success1")? else {
            return Err(protocol(reason::INCORRECT_MESSAGE, "expected Success1"));
        };
        let hash = self
            .hash
            .ok_or_else(|| protocol(reason::INCORRECT_MESSAGE, "Success1 before Challenge"))?;
        if usize::from(s.hl) != hash.len_bytes() {
            return Err(protocol(
                reason::HASH_UNUSABLE,
                "Success1 hash length differs",
            ));
        }
        let (Some(c2), Some(secret)) = (&self.c2, &self.cfg.ctrl_secret) else {
            return Ok(None);
        };
        let Some(r2) = s.response else {
            return Err(HostAuthError::ControllerNotAuthenticated);
        };
        let c2 = crypto::augmented(hash, self.session_key.as_deref(), c2);
        let key = secret.transformed(&self.cfg.subnqn);
        let expect = crypto::controller_response(
            hash,
            &key,
            &c2,
            self.s2,
            self.t_id,
            &self.cfg.subnqn,
            &self.cfg.hostnqn,
        );
        if !crypto::equal(&expect, &r2) {
            return Err(HostAuthError::ControllerNotAuthenticated);
        }
        Ok(Some(Message::Success2 { t_id: self.t_id }.encode()))
    }

    /// The Failure2 for `explanation`.
    pub fn failure2(&self, explanation: u8) -> Vec<u8> {
        Message::Failure {
            first: false,
            t_id: self.t_id,
            explanation,
        }
        .encode()
    }
}
