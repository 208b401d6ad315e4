//! Handshake stage: ICReq → ICResp (digests, PDA, MAXH2CDATA), then the
//! Connect command, which creates the controller (admin queue) or joins an
//! existing one (I/O queue) and fixes the queue's id, depth, SQ flow
//! control and send scheduler. [`Session`] is what the handshake settled.
//!
//! Memory follows the stage: until Connect is accepted the framer reads in
//! [`HANDSHAKE_READ_CHUNK_BYTES`] pieces and takes no PDU data beyond the
//! Connect data (1 KiB), so a socket that stalls in the handshake (or
//! floods it) holds about a kilobyte of receive buffer; [`open_framer`]
//! gives the connected queue full-size reads and its negotiated PDU data
//! limit. The handshake as a whole must end within
//! `target.handshake_timeout_ms` of the accept.

use super::{ConnState, QueueConnection, ADMIN_INLINE_BYTES, HANDSHAKE_READ_CHUNK_BYTES};
use crate::controller::Controller;
use crate::registry::Registry;
use crate::subsystem::{NamespaceMap, SubsystemKind};
use sluice_proto::fabrics::{
    connect_data_offset, connect_invalid_param_result, connect_offset, read_nqn, ConnectCommand,
    ConnectData, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC, CONNECT_DATA_LEN,
};
use sluice_proto::framer::{Framer, READ_CHUNK_BYTES};
use sluice_proto::pdu::{Direction, IcReq, IcResp, PduHeader, TxParams};
use sluice_proto::send::PduClass;
use sluice_proto::{Sqe, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the handshake settled: the association of this queue.
#[derive(Debug)]
pub(super) struct Session {
    /// When the connection was accepted (connect timeout).
    pub(super) created: Instant,
    pub(super) qid: u16,
    /// Queue depth (SQSIZE + 1); 0 before Connect.
    pub(super) depth: u16,
    pub(super) ctrl: Option<Arc<Controller>>,
    /// The controller's subsystem's namespaces as this queue last took
    /// them, with their generation ([`Session::refresh_namespaces`]).
    pub(super) namespaces: Arc<NamespaceMap>,
    namespaces_generation: u64,
    /// The host's MAXR2T from ICReq (we issue one R2T per command).
    pub(super) maxr2t: u32,
    /// DH-HMAC-CHAP on this queue, when its host has a secret.
    pub(super) auth: Option<sluice_auth::ControllerAuth>,
    /// Failed authentication transactions on this queue.
    pub(super) auth_failures: u32,
}

/// Failed DH-HMAC-CHAP transactions a queue may have before it is closed
/// (a host guessing secrets online gets this many tries per connection).
pub(super) const AUTH_FAILURES_MAX: u32 = 3;

/// How long after the handshake deadline a queue may take to authenticate.
const AUTH_GRACE: Duration = Duration::from_secs(60);

impl Session {
    pub(super) fn new(now: Instant) -> Self {
        Session {
            created: now,
            qid: 0,
            depth: 0,
            ctrl: None,
            namespaces: Arc::default(),
            namespaces_generation: u64::MAX,
            maxr2t: 0,
            auth: None,
            auth_failures: 0,
        }
    }

    /// When a queue not yet connected is closed.
    pub(super) fn handshake_deadline(&self, reg: &Registry) -> Instant {
        self.created + Duration::from_millis(u64::from(reg.settings.handshake_timeout_ms))
    }

    /// When a connected queue that must authenticate and has not is closed
    /// (a slow guest's FFDHE-8192 exchange takes seconds, so a minute more
    /// than the handshake allows).
    pub(super) fn auth_deadline(&self, reg: &Registry) -> Instant {
        self.handshake_deadline(reg) + AUTH_GRACE
    }

    /// The keep-alive deadline; only the admin queue watches it.
    pub(super) fn keep_alive_deadline(&self, reg: &Registry) -> Option<Instant> {
        match (&self.ctrl, self.qid) {
            (Some(c), 0) => c.keep_alive_deadline(reg.settings.kato_grace_ms),
            _ => None,
        }
    }

    /// Takes the subsystem's namespaces anew if a reload replaced them
    /// since this queue last looked: before each command, and at the
    /// periodic check (so an idle queue lets go of a removed namespace).
    /// One atomic load when nothing changed.
    pub(super) fn refresh_namespaces(&mut self) {
        let Some(ctrl) = &self.ctrl else {
            return;
        };
        let ns = &ctrl.subsystem.namespaces;
        let generation = ns.generation();
        if generation != self.namespaces_generation {
            self.namespaces = ns.snapshot();
            self.namespaces_generation = generation;
        }
    }

    /// Ends this queue's part in the association: the admin queue removes
    /// the controller, an I/O queue gives its queue id back.
    pub(super) fn release(&mut self, reg: &Registry, span: &tracing::Span) {
        self.namespaces = Arc::default();
        if let Some(c) = self.ctrl.take() {
            if self.qid == 0 {
                // The admin queue ends the association.
                c.fail();
                reg.remove_controller(&c.subsystem, c.cntlid);
                tracing::info!(parent: span, cntlid = c.cntlid, "controller removed");
            } else {
                c.disconnect_io_queue(self.qid);
            }
        }
    }
}

/// Largest PDU data the framer accepts once connected (in-capsule,
/// H2CData, admin capsule).
pub(super) fn rx_data_max(reg: &Registry) -> u32 {
    let st = &reg.settings;
    st.inline_data_bytes
        .max(st.max_h2c_data_bytes)
        .max(ADMIN_INLINE_BYTES)
}

/// PDU data accepted before Connect is accepted: the Connect data
/// (`CONNECT_DATA_LEN` is 1024).
#[allow(clippy::cast_possible_truncation)]
const HANDSHAKE_DATA_MAX: u32 = CONNECT_DATA_LEN as u32;

/// The framer of a new connection: small reads, no data beyond Connect's.
pub(super) fn handshake_framer() -> Framer {
    let mut f = Framer::new(Direction::HostToController, HANDSHAKE_DATA_MAX);
    f.set_read_chunk(HANDSHAKE_READ_CHUNK_BYTES);
    f
}

/// Connect accepted: full-size reads and the queue's PDU data limit.
pub(super) fn open_framer(framer: &mut Framer, reg: &Registry) {
    framer.set_data_len_max(rx_data_max(reg));
    framer.set_read_chunk(READ_CHUNK_BYTES);
}

impl QueueConnection {
    /// ICReq: answer with ICResp and switch the framer and the encoder to
    /// the negotiated digests and alignment.
    pub(super) fn handle_ic_req(&mut self, framer: &mut Framer, r: IcReq, now: Instant) {
        self.session.maxr2t = r.maxr2t;
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            maxh2cdata: self.reg.settings.max_h2c_data_bytes,
        };
        framer.set_initialized(r.hdgst, r.ddgst, 0, HANDSHAKE_DATA_MAX);
        self.out.txp = TxParams {
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            pda: r.hpda,
        };
        self.out
            .send_pdu(PduClass::Control, &PduHeader::IcResp(resp), &[], now);
        self.state = ConnState::AwaitConnect;
        tracing::debug!(
            hdgst = r.hdgst,
            ddgst = r.ddgst,
            hpda = r.hpda,
            "connection initialized"
        );
    }

    /// The Connect command: returns its status and result (CNTLID).
    ///
    /// Every refusal logs exactly one line ([`Self::refuse`]). An empty
    /// HOSTNQN (all zero bytes, what SPDK's perf sends with no `hostnqn:`)
    /// and an all-zero HOSTID are a host that gave no identity, and are
    /// treated as the references treat them:
    ///
    /// * Linux nvmet (`drivers/nvme/target/core.c`, `nvmet_alloc_ctrl` and
    ///   `nvmet_host_allowed`) never checks the HOSTNQN's form: it
    ///   NUL-terminates the field and `strcmp`s it against the allow-list.
    ///   `allow_any_host` and the discovery subsystem admit it; otherwise
    ///   it answers Connect Invalid Host (1h/84h) with IATTR = 1 and IPO =
    ///   the HOSTNQN field (`IPO_IATTR_CONNECT_DATA(hostnqn)`). The HOSTID
    ///   is copied, never validated.
    /// * SPDK (`lib/nvmf/ctrlr.c`, `nvmf_ctrlr_cmd_connect` and
    ///   `nvmf_qpair_access_allowed`) refuses only a HOSTNQN with no NUL
    ///   (Invalid Parameters, IPO = HOSTNQN), then asks
    ///   `spdk_nvmf_subsystem_host_allowed`: an empty NQN passes on an
    ///   `allow_any_host` subsystem and fails an allow-list with
    ///   SPDK_NVMF_FABRIC_SC_INVALID_HOST (84h, no IATTR/IPO).
    ///
    /// Sluice admits it where any host is admitted (open subsystems and
    /// discovery), accounts it to the default tenant under the per-host
    /// label [`crate::metrics::ANONYMOUS_HOST`], and refuses it on an
    /// allow-list with Connect Invalid Host, IATTR/IPO naming HOSTNQN as
    /// nvmet does. A non-empty malformed HOSTNQN (no NUL within 256 bytes,
    /// over 223 bytes, not UTF-8, control characters) stays Connect
    /// Invalid Parameters naming the field (`ConnectData::parse`).
    pub(super) fn connect(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> (Status, u32) {
        let c = ConnectCommand::parse(sqe);
        let invalid = |in_data: bool, ipo: u16| {
            (
                Status::CONNECT_INVALID_PARAMETERS,
                connect_invalid_param_result(in_data, ipo),
            )
        };
        if c.recfmt != 0 {
            return self.refuse(
                &c,
                data,
                "recfmt",
                "unsupported record format",
                (Status::CONNECT_INCOMPATIBLE_FORMAT, 0),
            );
        }
        let cd = match ConnectData::parse(data) {
            Ok(cd) => cd,
            Err(e) => {
                return self.refuse(&c, data, e.field(), e.reason(), invalid(true, e.offset));
            }
        };
        self.span.record("hostnqn", logged_nqn(&cd.hostnqn));
        self.span.record("subnqn", cd.subnqn.as_str());
        let Some(sub) = self.reg.subsystem(&cd.subnqn) else {
            return self.refuse(
                &c,
                data,
                "subnqn",
                "unknown subsystem",
                invalid(true, connect_data_offset::SUBNQN),
            );
        };
        // One reading of who the subsystem admits serves every check below
        // (a reload may replace it meanwhile; the discovery subsystem's
        // admits every host and asks no secret).
        let access = sub.access();
        if !access.admits(&cd.hostnqn) {
            let reason = if cd.hostnqn.is_empty() {
                "no host NQN given and the subsystem admits only its listed hosts"
            } else {
                "host is not on the subsystem's allow-list"
            };
            return self.refuse(
                &c,
                data,
                "hostnqn",
                reason,
                (
                    Status::CONNECT_INVALID_HOST,
                    connect_invalid_param_result(true, connect_data_offset::HOSTNQN),
                ),
            );
        }
        let auth = access.auth.get(&cd.hostnqn).cloned();
        if auth.is_none() && access.require_auth {
            return self.refuse(
                &c,
                data,
                "hostnqn",
                "the subsystem requires DH-HMAC-CHAP and has no secret for this host",
                (
                    Status::CONNECT_INVALID_HOST,
                    connect_invalid_param_result(true, connect_data_offset::HOSTNQN),
                ),
            );
        }
        let mqes = self.reg.settings.queue_depth_max - 1;
        if c.sqsize == 0 || c.sqsize > mqes || (c.qid == 0 && c.sqsize < 31) {
            let reason = if c.sqsize == 0 {
                "SQSIZE 0"
            } else if c.sqsize > mqes {
                "SQSIZE above MQES"
            } else {
                "admin SQSIZE below 31"
            };
            return self.refuse(
                &c,
                data,
                "sqsize",
                reason,
                invalid(false, connect_offset::SQSIZE),
            );
        }
        let ctrl = if c.qid == 0 {
            if cd.cntlid != CNTLID_DYNAMIC {
                return self.refuse(
                    &c,
                    data,
                    "cntlid",
                    "admin Connect must ask for CNTLID FFFFh (dynamic model)",
                    invalid(true, connect_data_offset::CNTLID),
                );
            }
            let counters = self.reg.hosts.counters_for(&cd.hostnqn);
            let kato = c.kato_ms;
            let genctr = self.reg.genctr();
            let listed = if sub.kind == SubsystemKind::Discovery {
                self.reg.nqns_listed_for(&cd.hostnqn)
            } else {
                Vec::new()
            };
            let made = self.reg.add_controller(&sub, |id| {
                Arc::new(
                    Controller::new(
                        id,
                        sub.clone(),
                        cd.hostnqn.clone(),
                        cd.hostid,
                        kato,
                        counters,
                        now,
                    )
                    .seeing_discovery_log(genctr, listed),
                )
            });
            match made {
                // A reload may have replaced the access since the checks
                // above, and failed the live controllers it refuses before
                // this one was in the table: the reload swaps the access
                // before it reads the table, and this reads the access
                // after adding to the table, so one of the two sees the
                // other.
                Some(ctrl) if !sub.access().would_admit(&cd.hostnqn) => {
                    self.reg.remove_controller(&sub, ctrl.cntlid);
                    return self.refuse(
                        &c,
                        data,
                        "hostnqn",
                        "host refused by a configuration reload during its Connect",
                        (
                            Status::CONNECT_INVALID_HOST,
                            connect_invalid_param_result(true, connect_data_offset::HOSTNQN),
                        ),
                    );
                }
                Some(ctrl) => {
                    tracing::info!(cntlid = ctrl.cntlid, kato_ms = kato, "controller created");
                    ctrl
                }
                None => {
                    return self.refuse(
                        &c,
                        data,
                        "cntlid",
                        "no controller ID free in the subsystem",
                        (Status::CONNECT_CONTROLLER_BUSY, 0),
                    )
                }
            }
        } else {
            if sub.kind == SubsystemKind::Discovery {
                return self.refuse(
                    &c,
                    data,
                    "qid",
                    "I/O queue Connect to the discovery subsystem",
                    invalid(false, connect_offset::QID),
                );
            }
            let Some(ctrl) = self.reg.controller(&sub, cd.cntlid) else {
                return self.refuse(
                    &c,
                    data,
                    "cntlid",
                    "no such controller",
                    invalid(true, connect_data_offset::CNTLID),
                );
            };
            // The I/O queue joins the admin queue's association: the same
            // HOSTNQN, byte for byte (empty included).
            if ctrl.hostnqn != cd.hostnqn {
                return self.refuse(
                    &c,
                    data,
                    "hostnqn",
                    "controller belongs to another host NQN",
                    invalid(true, connect_data_offset::HOSTNQN),
                );
            }
            if ctrl.hostid != cd.hostid {
                // Neither nvmet nor SPDK compares HOSTIDs, and the HOSTNQN
                // (checked above) names the host: the queue joins.
                crate::tolerated::note(
                    crate::tolerated::Tolerated::IoConnectHostIdDiffers,
                    format_args!("cntlid {} qid {}", ctrl.cntlid, c.qid),
                );
            }
            if let Err(st) = ctrl.connect_io_queue(c.qid, self.reg.settings.io_queues_max) {
                let r = if st == Status::CONNECT_INVALID_PARAMETERS {
                    invalid(false, connect_offset::QID)
                } else {
                    (st, 0)
                };
                return self.refuse(
                    &c,
                    data,
                    "qid",
                    "queue ID above the granted number of queues or already connected",
                    r,
                );
            }
            ctrl
        };
        self.span.record("cntlid", ctrl.cntlid);
        self.span.record("qid", c.qid);
        let st = &self.reg.settings;
        let send = st.subsystem_send.get(&cd.subnqn).unwrap_or(&st.send);
        self.out.replace_scheduler(send.build(c.qid > 0), now);
        self.session.qid = c.qid;
        // sqsize <= queue_depth_max - 1 (checked above): no overflow.
        self.session.depth = c.sqsize + 1;
        let sq_flow_disabled = c.cattr & CATTR_DISABLE_SQ_FLOW != 0;
        let coalesced =
            c.qid > 0 && send.coalescing.mode != sluice_proto::coalesce::CoalesceMode::Off;
        self.out.connected(sq_flow_disabled, coalesced);
        let cntlid = ctrl.cntlid;
        self.session.ctrl = Some(ctrl);
        self.session.refresh_namespaces();
        self.state = ConnState::Ready;
        tracing::debug!(sqsize = c.sqsize, sq_flow_disabled, "queue connected");
        let mut result = u32::from(cntlid);
        if let Some(cfg) = auth {
            // Every queue authenticates; until it has, only Fabrics
            // commands run (admission answers Authentication Required).
            self.session.auth = Some(sluice_auth::ControllerAuth::new(
                cfg,
                sluice_auth::random_seqnum(),
            ));
            result |= sluice_proto::fabrics::CONNECT_AUTHREQ_ATR;
        }
        (Status::SUCCESS, result)
    }

    /// Logs one refused Connect (one line, at warn: peer, host NQN or
    /// `(empty)`, subsystem, QID, the field and why) and returns the
    /// status and result to answer with. Only refusals pay for this.
    pub(super) fn refuse(
        &self,
        c: &ConnectCommand,
        data: &[u8],
        field: &str,
        reason: &str,
        answer: (Status, u32),
    ) -> (Status, u32) {
        let peer = self.peer.map(|p| p.to_string());
        // Read leniently, as the host sent them (even when they did not
        // parse); the subscriber escapes what it prints.
        let (host, sub) = if data.len() >= CONNECT_DATA_LEN {
            (read_nqn(data, 512), read_nqn(data, 256))
        } else {
            ("(not received)".to_string(), "(not received)".to_string())
        };
        tracing::warn!(
            peer = peer.as_deref().unwrap_or("(unknown)"),
            hostnqn = logged_nqn(&host),
            subnqn = logged_nqn(&sub),
            qid = c.qid,
            field,
            reason,
            status = %answer.0,
            "Connect refused"
        );
        answer
    }
}

/// How a host NQN appears in the queue's span and in refusal lines: an
/// empty one as `(empty)` (its per-host counters are `(anonymous)`, its
/// tenant the default one, recorded in the span by the I/O layer).
fn logged_nqn(hostnqn: &str) -> &str {
    if hostnqn.is_empty() {
        "(empty)"
    } else {
        hostnqn
    }
}
