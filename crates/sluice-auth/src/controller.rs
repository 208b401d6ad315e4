//! The controller's side of one DH-HMAC-CHAP transaction on one queue,
//! sans-IO: `handle_send` takes each AUTH_Send payload, `poll_receive`
//! produces each AUTH_Receive payload, and the caller asks
//! `is_authenticated` before admitting other commands. Randomness comes in
//! through a closure, so tests are deterministic.
//!
//! The sequence, as nvmet runs it: Negotiate (host) → Challenge (controller:
//! C1, S1, its DH value) → Reply (host: R1, optionally C2 and S2, its DH
//! value) → Success1 (controller, with R2 when C2 came) → Success2 (host,
//! bidirectional only). A host without C2 is authenticated when its Reply
//! checks out; with C2, once it sends Success2. Any error makes the next
//! AUTH_Receive a Failure1 and leaves the queue unauthenticated. A Negotiate
//! at any time starts a new transaction (re-authentication); the queue stays
//! authenticated meanwhile unless that transaction fails.

use std::sync::Arc;

use crate::algo::{DhGroup, HashId};
use crate::crypto::{self, DhKeyPair};
use crate::key::Secret;
use crate::message::{reason, Challenge, Message, Success1};

/// What the controller knows about one host.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub hostnqn: String,
    pub subnqn: String,
    /// The host's secret (it proves knowing it).
    pub host_secret: Secret,
    /// The controller's secret, for hosts that ask it to authenticate too.
    pub ctrl_secret: Option<Secret>,
    /// Preferred hash, used when the host offers it.
    pub hash: HashId,
    /// Preferred DH group, used when the host offers it.
    pub dhgroup: DhGroup,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for a Negotiate.
    Negotiate,
    /// The next AUTH_Receive returns the Challenge.
    Challenge,
    /// Waiting for the Reply.
    Reply,
    /// The next AUTH_Receive returns Success1.
    Success1,
    /// Waiting for Success2 (bidirectional), or done.
    Success2,
    /// The next AUTH_Receive returns Failure1.
    Failure1,
    /// Finished (successfully or not) until the next Negotiate.
    Done,
}

/// How a transaction ended, reported once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Authenticated {
        hash: HashId,
        dhgroup: DhGroup,
        bidirectional: bool,
    },
    /// The host failed: the explanation code and what happened.
    Failed { explanation: u8, detail: String },
}

/// One queue's DH-HMAC-CHAP state.
#[derive(Debug)]
pub struct ControllerAuth {
    cfg: Arc<ControllerConfig>,
    step: Step,
    t_id: u16,
    hash: HashId,
    dhgroup: DhGroup,
    c1: Vec<u8>,
    s1: u32,
    keypair: Option<DhKeyPair>,
    session_key: Option<Vec<u8>>,
    c2: Option<Vec<u8>>,
    s2: u32,
    authenticated: bool,
    failure: u8,
    outcome: Option<Outcome>,
    seqnum: u32,
}

impl ControllerAuth {
    /// A queue whose host must authenticate. `seqnum` seeds the sequence
    /// numbers (S1) this queue hands out; pick it at random.
    pub fn new(cfg: Arc<ControllerConfig>, seqnum: u32) -> ControllerAuth {
        ControllerAuth {
            hash: cfg.hash,
            dhgroup: cfg.dhgroup,
            cfg,
            step: Step::Negotiate,
            t_id: 0,
            c1: Vec::new(),
            s1: 0,
            keypair: None,
            session_key: None,
            c2: None,
            s2: 0,
            authenticated: false,
            failure: 0,
            outcome: None,
            seqnum,
        }
    }

    /// Whether the host has authenticated (commands other than Fabrics
    /// ones may run).
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether a transaction is under way (neither finished nor failed).
    pub fn in_progress(&self) -> bool {
        !matches!(self.step, Step::Negotiate | Step::Done)
    }

    /// The outcome of the last transaction, once (for the log line).
    pub fn take_outcome(&mut self) -> Option<Outcome> {
        self.outcome.take()
    }

    fn fail(&mut self, explanation: u8, detail: impl Into<String>) {
        self.authenticated = false;
        self.failure = explanation;
        self.step = Step::Failure1;
        self.outcome = Some(Outcome::Failed {
            explanation,
            detail: detail.into(),
        });
        self.forget_secrets();
    }

    fn forget_secrets(&mut self) {
        use zeroize::Zeroize;
        self.c1.zeroize();
        if let Some(k) = self.session_key.as_mut() {
            k.zeroize();
        }
        self.session_key = None;
        self.keypair = None;
    }

    fn next_seqnum(&mut self) -> u32 {
        self.seqnum = self.seqnum.wrapping_add(1);
        if self.seqnum == 0 {
            self.seqnum = 1;
        }
        self.seqnum
    }

    /// An AUTH_Send payload.
    pub fn handle_send(&mut self, data: &[u8]) {
        let m = match Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                let x = e.explanation();
                self.fail(x, format!("undecodable message: {e}"));
                return;
            }
        };
        match m {
            Message::Negotiate(n) => {
                self.forget_secrets();
                self.t_id = n.t_id;
                self.c2 = None;
                self.s2 = 0;
                if n.sc_c != 0 {
                    return self.fail(
                        reason::CONCAT_MISMATCH,
                        "secure channel concatenation asked for; this target has no TLS",
                    );
                }
                // The preferred hash if offered, else the first usable one.
                let offered: Vec<HashId> = n
                    .hashes
                    .iter()
                    .filter_map(|&h| HashId::from_id(h))
                    .collect();
                let Some(hash) = offered
                    .iter()
                    .copied()
                    .find(|&h| h == self.cfg.hash)
                    .or_else(|| offered.first().copied())
                else {
                    return self.fail(reason::HASH_UNUSABLE, "no usable hash offered");
                };
                let groups: Vec<DhGroup> = n
                    .dhgroups
                    .iter()
                    .filter_map(|&g| DhGroup::from_id(g))
                    .collect();
                let Some(dhgroup) = groups
                    .iter()
                    .copied()
                    .find(|&g| g == self.cfg.dhgroup)
                    .or_else(|| groups.first().copied())
                else {
                    return self.fail(reason::DHGROUP_UNUSABLE, "no usable DH group offered");
                };
                self.hash = hash;
                self.dhgroup = dhgroup;
                self.step = Step::Challenge;
            }
            Message::Reply(r) if self.step == Step::Reply => {
                if r.t_id != self.t_id {
                    return self.fail(
                        reason::INCORRECT_PAYLOAD,
                        "transaction ID differs from the Negotiate's",
                    );
                }
                if r.response.len() != self.hash.len_bytes() {
                    return self.fail(
                        reason::INCORRECT_PAYLOAD,
                        "response length differs from the hash length",
                    );
                }
                if let Some(kp) = &self.keypair {
                    match kp.shared(&r.dh_value) {
                        Ok(k) => self.session_key = Some(k),
                        Err(e) => {
                            return self
                                .fail(reason::DHGROUP_UNUSABLE, format!("host DH value: {e}"));
                        }
                    }
                } else if !r.dh_value.is_empty() {
                    return self.fail(reason::INCORRECT_PAYLOAD, "DH value with the null group");
                }
                let c1 = crypto::augmented(self.hash, self.session_key.as_deref(), &self.c1);
                let key = self.cfg.host_secret.transformed(&self.cfg.hostnqn);
                let expect = crypto::host_response(
                    self.hash,
                    &key,
                    &c1,
                    self.s1,
                    self.t_id,
                    &self.cfg.hostnqn,
                    &self.cfg.subnqn,
                );
                if !crypto::equal(&expect, &r.response) {
                    return self.fail(
                        reason::FAILED,
                        "host response does not match (wrong secret or replayed reply)",
                    );
                }
                self.c2 = r.challenge;
                self.s2 = r.seqnum;
                if self.c2.is_none() {
                    self.authenticated = true;
                    self.outcome = Some(Outcome::Authenticated {
                        hash: self.hash,
                        dhgroup: self.dhgroup,
                        bidirectional: false,
                    });
                }
                self.step = Step::Success1;
            }
            Message::Success2 { t_id } if self.step == Step::Success2 && self.c2.is_some() => {
                if t_id != self.t_id {
                    return self.fail(
                        reason::INCORRECT_PAYLOAD,
                        "transaction ID differs in Success2",
                    );
                }
                self.authenticated = true;
                self.outcome = Some(Outcome::Authenticated {
                    hash: self.hash,
                    dhgroup: self.dhgroup,
                    bidirectional: true,
                });
                self.c2 = None;
                self.step = Step::Done;
            }
            Message::Failure {
                first: false,
                explanation,
                ..
            } => {
                self.fail(
                    explanation,
                    format!("host sent Failure2: {}", reason::describe(explanation)),
                );
                // The host gave up: nothing more to tell it.
                self.step = Step::Done;
            }
            other => {
                let name = other.name();
                self.fail(reason::INCORRECT_MESSAGE, format!("unexpected {name}"));
            }
        }
    }

    /// The next AUTH_Receive payload (the caller pads it to AL).
    pub fn poll_receive(&mut self, random: &mut dyn FnMut(&mut [u8])) -> Vec<u8> {
        match self.step {
            Step::Challenge => {
                self.c1 = vec![0u8; self.hash.len_bytes()];
                random(&mut self.c1);
                self.s1 = self.next_seqnum();
                self.keypair = DhKeyPair::generate(self.dhgroup, random);
                let dh_value = self
                    .keypair
                    .as_ref()
                    .map(|k| k.public().to_vec())
                    .unwrap_or_default();
                self.step = Step::Reply;
                Message::Challenge(Challenge {
                    t_id: self.t_id,
                    hash: self.hash.id(),
                    dhgroup: self.dhgroup.id(),
                    seqnum: self.s1,
                    challenge: self.c1.clone(),
                    dh_value,
                })
                .encode()
            }
            Step::Success1 => {
                let response = match &self.c2 {
                    None => None,
                    Some(c2) => {
                        let Some(secret) = &self.cfg.ctrl_secret else {
                            self.fail(reason::FAILED, "host asked the controller to authenticate, and it has no controller secret");
                            return self.poll_receive(random);
                        };
                        let c2 = crypto::augmented(self.hash, self.session_key.as_deref(), c2);
                        let key = secret.transformed(&self.cfg.subnqn);
                        Some(crypto::controller_response(
                            self.hash,
                            &key,
                            &c2,
                            self.s2,
                            self.t_id,
                            &self.cfg.subnqn,
                            &self.cfg.hostnqn,
                        ))
                    }
                };
                self.step = if response.is_some() {
                    Step::Success2
                } else {
                    Step::Done
                };
                self.forget_secrets();
                Message::Success1(Success1 {
                    t_id: self.t_id,
                    hl: u8::try_from(self.hash.len_bytes()).unwrap_or(u8::MAX),
                    response,
                })
                .encode()
            }
            Step::Failure1 => {
                self.step = Step::Done;
                Message::Failure {
                    first: true,
                    t_id: self.t_id,
                    explanation: self.failure,
                }
                .encode()
            }
            Step::Negotiate | Step::Reply | Step::Success2 | Step::Done => {
                self.fail(reason::FAILED, "AUTH_Receive with nothing to receive");
                self.poll_receive(random)
            }
        }
    }
}
