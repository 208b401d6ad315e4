//! The host's queue-pair core (`sluice_host::core::QueuePairCore`) fed a
//! hostile controller: after an ICResp (digests and MAXH2CDATA fuzzed), each
//! step submits a read (into a new, a recycled or a lent buffer), a write (in-capsule
//! or solicited) or a flush, or has the controller send a C2HData, R2T,
//! CapsuleResp or C2HTermReq with fuzzed fields (the CID of an outstanding
//! command or any CID, the expected offset or any offset, a bad data
//! digest), or raw bytes; bytes reach the core in reads of a fuzzed size
//! through `read_bufs`/`handle_read`, so large C2HData go the direct
//! receive path. Time jumps drive the timeouts; the send path is immediate
//! or PINoF's freights flushing when idle.
//!
//! Checked after every step, and at the end after the connection is lost:
//! - no panic, no arithmetic overflow (debug assertions are on);
//! - everything the host sends decodes; nothing follows an H2CTermReq;
//! - H2CData only for a solicited write submitted with that CID (it may
//!   have completed early, see `a_reused_slot_gets_a_cid_of_its_own`),
//!   inside the range the R2Ts that reached it asked for (unless raw bytes
//!   went to the host), carrying that write's own bytes;
//! - every submitted command completes exactly once (at the latest when
//!   the connection is lost), and nothing is left in flight;
//! - a read that succeeds returns its full length, and the controller's
//!   bytes when it sent only well-formed data PDUs, each sent for the
//!   command that holds its CID when it arrives; a write that succeeds
//!   hands back the caller's buffer;
//! - a read into lent memory writes only there and only until its
//!   completion: memory filled with a marker once the read completed
//!   (with data, an error or a timeout) still holds the marker at the end.
//!
//! With `HOST_QUEUE_TRACE` set, each step, PDU and completion is printed:
//! `HOST_QUEUE_TRACE=1 host_queue CRASH_FILE` reads a crashing input.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sluice_host::core::{CoreConfig, Event, LentBuf, Payload, QueuePairCore};
use sluice_proto::command::{io, Cqe, Sqe};
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{
    encode_pdu, DataHeader, Direction, IcResp, PduHeader, R2t, TermReq, TxParams,
};
use sluice_proto::send::{SchedulerKind, SendConfig};

#[path = "common/input.rs"]
mod input;
use input::Input;

/// Largest read or write the steps submit (above the core's C2HData limit
/// below, so the limit's refusal is reached too).
const IO_BYTES_MAX: u32 = 320 * 1024;
const C2H_DATA_MAX_BYTES: u32 = 256 * 1024;
const STEPS_MAX: usize = 256;

/// The byte at `offset` of the data that belongs to command `token`.
fn byte_of(token: u64, offset: u32) -> u8 {
    (token.wrapping_mul(131) as u32 ^ offset.wrapping_mul(7)) as u8
}

fn data_of(token: u64, from: u32, len: u32) -> Vec<u8> {
    (from..from.saturating_add(len))
        .map(|o| byte_of(token, o))
        .collect()
}

#[derive(Debug)]
enum Kind {
    Read { len: u32 },
    Write { len: u32 },
    Flush,
}

#[derive(Debug)]
struct Cmd {
    kind: Kind,
    cid: u16,
    /// C2HData bytes the controller sent in order (the next offset).
    sent: u32,
    /// What the controller's R2Ts for this command's CID asked for so far
    /// (the end of the range), counted when they are put on the wire: where
    /// the next R2T starts.
    r2t_end: u32,
    /// The same, counted when they reach the host (an R2T put on the wire
    /// before the command was submitted may name the CID the command then
    /// gets): how far the host may send H2CData.
    r2t_granted: u32,
    completed: bool,
    /// A C2HData sent for another command (or none) reached the host under
    /// this command's CID: its data is not its own.
    foreign: bool,
}

struct Ctrl {
    /// Parses what the host sends.
    rx: Framer,
    tx: TxParams,
    /// Bytes on their way to the host.
    wire: Vec<u8>,
    /// Bytes of the wire already handed to the host.
    wire_delivered: usize,
    /// Data PDUs and R2Ts on the wire, in order, to be counted for the
    /// command that holds their CID when they reach the host.
    on_wire: VecDeque<OnWire>,
    /// The host sent an H2CTermReq.
    host_terminated: bool,
    /// Prints each PDU sent (see `Run::trace`).
    trace: bool,
}

impl Ctrl {
    fn pdu(&mut self, h: &PduHeader, data: &[u8]) {
        if self.trace {
            eprintln!("  controller sends {h:?} ({} data bytes)", data.len());
        }
        encode_pdu(h, data, &self.tx, &mut self.wire);
    }

    /// Notes that the PDU just put on the wire is `what`.
    fn note(&mut self, cid: u16, what: Arrival) {
        self.on_wire.push_back(OnWire {
            end: self.wire_delivered + self.wire.len(),
            cid,
            what,
        });
    }
}

/// A PDU on its way to the host that matters to the command holding its
/// CID on arrival, which may not be the command it was sent for: a PDU put
/// on the wire before a command was submitted can name the CID the command
/// then gets.
struct OnWire {
    /// Where the PDU ends, counted from the first byte ever put on the wire.
    end: usize,
    cid: u16,
    what: Arrival,
}

enum Arrival {
    /// An R2T for this range.
    R2t { offset: u32, len: u32 },
    /// A C2HData carrying the bytes of command `token` (`u64::MAX`: none).
    C2hData { token: u64 },
}

struct Run {
    host: QueuePairCore,
    ctrl: Ctrl,
    now: Instant,
    cmds: HashMap<u64, Cmd>,
    /// The last command submitted with each CID (a CID comes back only
    /// once the core has freed it).
    by_cid: HashMap<u16, u64>,
    next_token: u64,
    /// Raw bytes went to the host: the data it reads may be anyone's.
    raw: bool,
    /// `HOST_QUEUE_TRACE` is set: each step, PDU and completion is printed
    /// (for reading a crashing input).
    trace: bool,
    /// Memory lent to reads, by token (freed after the core is dropped),
    /// and whether the read completed (the memory then holds `LENT_DONE`).
    lent: HashMap<u64, (*mut [u8], bool)>,
}

/// What lent memory holds once its read completed.
const LENT_DONE: u8 = 0x5C;

impl Run {
    /// Tokens of commands not yet completed, in token order.
    fn open(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .cmds
            .iter()
            .filter(|(_, c)| !c.completed)
            .map(|(t, _)| *t)
            .collect();
        v.sort_unstable();
        v
    }

    /// A CID for a controller PDU: an open command's, or any.
    fn pick(&self, inp: &mut Input<'_>) -> (u16, Option<u64>) {
        let sel = inp.u8();
        let open = self.open();
        if sel & 0x80 == 0 && !open.is_empty() {
            let t = open[usize::from(sel) % open.len()];
            (self.cmds[&t].cid, Some(t))
        } else {
            let cid = inp.u16();
            (cid, self.by_cid.get(&cid).copied())
        }
    }

    /// The range of the next data PDU for command `t` (a C2HData when
    /// `writes` is false, an R2T when true): where the previous one ended
    /// and a length up to the rest of the transfer, or (`flags` bits 0 and
    /// 1) any offset and any length below `len_max`.
    fn range(
        &self,
        inp: &mut Input<'_>,
        t: Option<u64>,
        writes: bool,
        flags: u8,
        len_max: u32,
    ) -> (u32, u32) {
        let next = t
            .and_then(|t| self.cmds.get(&t))
            .and_then(|c| match (&c.kind, writes) {
                (Kind::Read { len }, false) => Some((c.sent, *len)),
                (Kind::Write { len }, true) => Some((c.r2t_end, *len)),
                _ => None,
            });
        let (mut offset, mut len) = match next {
            Some((at, total)) => {
                let rest = total.saturating_sub(at);
                (at, if rest == 0 { 0 } else { 1 + inp.u32() % rest })
            }
            None => (0, inp.u32() % 65536),
        };
        if flags & 1 != 0 {
            offset = inp.u32();
        }
        if flags & 2 != 0 {
            len = inp.u32() % len_max;
        }
        (offset, len)
    }

    /// Hands `n` bytes of the wire to the host the way a socket does.
    fn deliver(&mut self, mut n: usize) {
        n = n.min(self.ctrl.wire.len());
        if self.trace {
            eprintln!("  deliver {n} of {} bytes", self.ctrl.wire.len());
        }
        let mut at = 0;
        while at < n {
            let (a, b) = self.host.read_bufs();
            let room = a.len() + b.len();
            if room == 0 {
                break;
            }
            let k = room.min(n - at);
            let src = &self.ctrl.wire[at..at + k];
            let first = k.min(a.len());
            a[..first].copy_from_slice(&src[..first]);
            b[..k - first].copy_from_slice(&src[first..]);
            self.host.handle_read(self.now, k);
            at += k;
        }
        self.ctrl.wire.drain(..at);
        self.ctrl.wire_delivered += at;
        // PDUs the host has now read in full count for the command that
        // holds their CID now.
        while let Some(w) = self.ctrl.on_wire.front() {
            if w.end > self.ctrl.wire_delivered {
                break;
            }
            let Some(w) = self.ctrl.on_wire.pop_front() else {
                break;
            };
            let Some(&holder) = self.by_cid.get(&w.cid) else {
                continue;
            };
            let Some(c) = self.cmds.get_mut(&holder) else {
                continue;
            };
            match w.what {
                Arrival::R2t { offset, len } => {
                    if offset == c.r2t_granted {
                        c.r2t_granted = c.r2t_granted.saturating_add(len);
                    }
                }
                Arrival::C2hData { token } => c.foreign |= token != holder,
            }
        }
    }

    /// Takes what the host sends and checks it.
    fn transmit(&mut self) {
        while let Some(b) = self.host.poll_transmit() {
            assert!(
                !self.ctrl.host_terminated || b.is_empty(),
                "the host sent {} bytes after its H2CTermReq",
                b.len()
            );
            self.ctrl.rx.feed(&b);
        }
        loop {
            let p = match self.ctrl.rx.next_pdu() {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => panic!("the host sent a malformed PDU: {e}"),
            };
            assert!(
                !self.ctrl.host_terminated,
                "the host sent a PDU after its H2CTermReq"
            );
            assert!(p.data_digest_ok, "the host's data digest is wrong");
            if self.trace {
                eprintln!("  host sent {:?} ({} data bytes)", p.header, p.data.len());
            }
            match &p.header {
                PduHeader::IcReq(_) | PduHeader::CapsuleCmd(_) => {}
                PduHeader::H2CTermReq(_) => self.ctrl.host_terminated = true,
                PduHeader::H2CData(d) => {
                    // The command may have timed out (completed for the
                    // caller) and still hold its CID.
                    let t = self
                        .by_cid
                        .get(&d.cccid)
                        .unwrap_or_else(|| panic!("H2CData for CID {}, never used", d.cccid));
                    let c = &self.cmds[t];
                    let Kind::Write { len } = c.kind else {
                        panic!("H2CData for CID {}, which does not write", d.cccid);
                    };
                    let end = d
                        .offset
                        .checked_add(d.len)
                        .expect("H2CData range overflows");
                    // Raw or mangled bytes may have formed R2Ts of their own.
                    assert!(
                        end <= len && (self.raw || end <= c.r2t_granted),
                        "H2CData {}+{} past the R2Ts' {} (write of {len})",
                        d.offset,
                        d.len,
                        c.r2t_granted
                    );
                    assert!(
                        p.data == data_of(*t, d.offset, d.len).as_slice(),
                        "H2CData carries other bytes than the write's"
                    );
                }
                other => panic!("the host sent {other:?}"),
            }
        }
    }

    fn events(&mut self) {
        while let Some(ev) = self.host.poll_event() {
            let Event::Complete { token, result } = ev else {
                continue;
            };
            if self.trace {
                eprintln!(
                    "  token {token} completed: {:?}",
                    result.as_ref().map(|d| d.data.len())
                );
            }
            let c = self
                .cmds
                .get_mut(&token)
                .unwrap_or_else(|| panic!("completion of unknown token {token}"));
            assert!(!c.completed, "token {token} completed twice");
            c.completed = true;
            if let Some((mem, done)) = self.lent.get_mut(&token) {
                // SAFETY: the core handed out the read's completion: the
                // memory (from `Box::into_raw`, freed at the end) is ours.
                let mem = unsafe { &mut **mem };
                if let (Ok(_), Kind::Read { len }) = (&result, &c.kind) {
                    assert_eq!(mem.len(), *len as usize, "lent read length");
                    if !self.raw && !c.foreign {
                        assert!(
                            mem[..] == data_of(token, 0, *len)[..],
                            "a lent read holds other bytes than the controller sent"
                        );
                    }
                }
                mem.fill(LENT_DONE);
                *done = true;
            }
            if let Ok(done) = result {
                match c.kind {
                    Kind::Read { .. } if self.lent.contains_key(&token) => {
                        assert!(done.data.is_empty(), "a lent read's data is the lender's");
                    }
                    Kind::Read { len } => {
                        assert_eq!(done.data.len(), len as usize, "read length");
                        if !self.raw && !c.foreign {
                            assert!(
                                done.data == data_of(token, 0, len),
                                "a read returned other bytes than the controller sent"
                            );
                        }
                    }
                    Kind::Write { len } => {
                        assert!(
                            done.data == data_of(token, 0, len),
                            "a write handed back other bytes"
                        );
                    }
                    Kind::Flush => assert!(done.data.is_empty()),
                }
            }
        }
    }

    fn submit(&mut self, kind: Kind, recycle: bool, lend: bool) {
        let token = self.next_token;
        self.next_token += 1;
        let (sqe, payload) = match kind {
            Kind::Read { len } => (
                Sqe::rw(io::READ, 0, 1, 0, 1, false),
                if recycle && lend {
                    let mem = Box::into_raw(vec![0xA5u8; len as usize].into_boxed_slice());
                    self.lent.insert(token, (mem, false));
                    let at = std::ptr::NonNull::new(mem.cast::<u8>()).expect("a boxed slice");
                    // SAFETY: the memory stays allocated until the end of
                    // the run, after the core is dropped, and the harness
                    // touches it only once the read completed.
                    Payload::ReadLent(unsafe { LentBuf::new(at, len as usize) })
                } else if recycle {
                    Payload::ReadInto(vec![0xA5; len as usize])
                } else {
                    Payload::Read(len)
                },
            ),
            Kind::Write { len } => (
                Sqe::rw(io::WRITE, 0, 1, 0, 1, false),
                Payload::Write(data_of(token, 0, len)),
            ),
            Kind::Flush => (Sqe::new(io::FLUSH, 0, 1), Payload::None),
        };
        let submitted = self.host.submit(self.now, sqe, payload, token);
        if self.trace {
            eprintln!(
                "  submit token {token} {kind:?}: {:?}",
                submitted.as_ref().map_err(|e| e.to_string())
            );
        }
        if let Ok(cid) = submitted {
            self.by_cid.insert(cid, token);
            self.cmds.insert(
                token,
                Cmd {
                    kind,
                    cid,
                    sent: 0,
                    r2t_end: 0,
                    r2t_granted: 0,
                    completed: false,
                    foreign: false,
                },
            );
        }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        let op = inp.u8() % 12;
        if self.trace {
            eprintln!("step {op}");
        }
        match op {
            0 => {
                let len = inp.u32() % IO_BYTES_MAX;
                let recycle = inp.bool();
                let lend = recycle && inp.bool();
                self.submit(Kind::Read { len }, recycle, lend);
            }
            1 => {
                let len = inp.u32() % IO_BYTES_MAX;
                self.submit(Kind::Write { len }, false, false);
            }
            2 => self.submit(Kind::Flush, false, false),
            3 => {
                // C2HData: the expected offset or any, a length up to the
                // rest or any.
                let (cid, t) = self.pick(inp);
                let flags = inp.u8();
                let (offset, len) = self.range(inp, t, false, flags, 2 * C2H_DATA_MAX_BYTES);
                let last = flags & 4 != 0;
                let success = flags & 8 != 0;
                let token = t.unwrap_or(u64::MAX);
                let data = data_of(token, offset, len);
                let h = PduHeader::C2HData(DataHeader {
                    cccid: cid,
                    ttag: 0,
                    offset,
                    len,
                    last,
                    success,
                });
                let at = self.ctrl.wire.len();
                self.ctrl.pdu(&h, &data);
                self.ctrl.note(cid, Arrival::C2hData { token });
                if flags & 16 != 0 && self.ctrl.tx.ddgst && len > 0 {
                    // A bad data digest.
                    if let Some(b) = self.ctrl.wire.last_mut() {
                        *b ^= 0x5a;
                    }
                }
                if flags & 32 != 0 && self.ctrl.wire.len() > at {
                    // One mangled header or data byte.
                    let k = at + usize::from(inp.u16()) % (self.ctrl.wire.len() - at);
                    self.ctrl.wire[k] ^= inp.u8() | 1;
                    self.raw = true;
                }
                if let Some(c) = t.and_then(|t| self.cmds.get_mut(&t)) {
                    if offset == c.sent {
                        c.sent = c.sent.saturating_add(len);
                    }
                }
            }
            4 => {
                // R2T: the next range of a write, or any.
                let (cid, t) = self.pick(inp);
                let flags = inp.u8();
                let (offset, len) = self.range(inp, t, true, flags, u32::MAX);
                let ttag = inp.u16();
                self.ctrl.pdu(
                    &PduHeader::R2t(R2t {
                        cccid: cid,
                        ttag,
                        offset,
                        len,
                    }),
                    &[],
                );
                self.ctrl.note(cid, Arrival::R2t { offset, len });
                if let Some(c) = t.and_then(|t| self.cmds.get_mut(&t)) {
                    if offset == c.r2t_end {
                        c.r2t_end = c.r2t_end.saturating_add(len);
                    }
                }
            }
            5 => {
                // CapsuleResp: success or any status.
                let (cid, _) = self.pick(inp);
                let mut b = [0u8; 16];
                b[12..14].copy_from_slice(&cid.to_le_bytes());
                if inp.bool() {
                    let st = inp.u16();
                    b[14..16].copy_from_slice(&st.to_le_bytes());
                    b[0..4].copy_from_slice(&inp.u32().to_le_bytes());
                }
                self.ctrl.pdu(&PduHeader::CapsuleResp(Cqe::decode(&b)), &[]);
            }
            6 => {
                let fes = inp.u16();
                let fei = inp.u32();
                self.ctrl.pdu(
                    &PduHeader::C2HTermReq(TermReq {
                        fes,
                        fei,
                        data: Vec::new(),
                    }),
                    &[],
                );
            }
            7 => {
                let n = usize::from(inp.u8());
                let b = inp.bytes(n);
                self.ctrl.wire.extend_from_slice(&b);
                self.raw = true;
            }
            8 => {
                self.now += Duration::from_millis(u64::from(inp.u16()) * 4);
                self.host.handle_timeout(self.now);
                self.host.poll_send(self.now);
            }
            9 => {
                let n = usize::from(inp.u16()) * 16 + 1;
                self.deliver(n);
            }
            10 => {
                self.host.handle_idle(self.now);
                self.transmit();
            }
            _ => {
                if inp.u8() == 0xff {
                    self.host.handle_connection_lost("fuzz: connection lost");
                } else {
                    let n = self.ctrl.wire.len();
                    self.deliver(n);
                }
            }
        }
        self.events();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let cfg_byte = inp.u8();
    let (hd, dd) = (cfg_byte & 1 != 0, cfg_byte & 2 != 0);
    let depth = u16::from(inp.u8() % 8) + 1;
    let in_capsule_max_bytes = u32::from(inp.u16());
    let maxh2cdata = inp.u32() % (256 * 1024) + 4;
    let now = Instant::now();
    let trace = std::env::var_os("HOST_QUEUE_TRACE").is_some();
    let cfg = CoreConfig {
        qid: 1,
        depth,
        hdr_digest: hd,
        data_digest: dd,
        in_capsule_max_bytes,
        command_timeout: Duration::from_secs(1),
        c2h_data_max_bytes: C2H_DATA_MAX_BYTES,
    };
    let host = if cfg_byte & 4 != 0 {
        let send = SendConfig {
            scheduler: SchedulerKind::Isolated,
            flush_when_idle: cfg_byte & 8 != 0,
            ..SendConfig::default()
        };
        QueuePairCore::with_scheduler(cfg, now, send.build(true))
    } else {
        QueuePairCore::new(cfg, now)
    };
    let mut run = Run {
        host,
        ctrl: Ctrl {
            rx: Framer::new(Direction::HostToController, 1 << 20),
            tx: TxParams::default(),
            wire: Vec::new(),
            wire_delivered: 0,
            on_wire: VecDeque::new(),
            host_terminated: false,
            trace,
        },
        now,
        cmds: HashMap::new(),
        by_cid: HashMap::new(),
        next_token: 0,
        raw: false,
        trace,
        lent: HashMap::new(),
    };
    run.transmit();
    // The ICResp: the digests the host asked for, or others.
    let (rhd, rdd) = if cfg_byte & 16 != 0 {
        (cfg_byte & 32 != 0, cfg_byte & 64 != 0)
    } else {
        (hd, dd)
    };
    run.ctrl.pdu(
        &PduHeader::IcResp(IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: rhd,
            ddgst: rdd,
            maxh2cdata,
        }),
        &[],
    );
    run.ctrl.tx = TxParams {
        hdgst: rhd,
        ddgst: rdd,
        pda: 0,
    };
    let n = run.ctrl.wire.len();
    run.deliver(n);
    if let Some(neg) = run.host.negotiated() {
        run.ctrl
            .rx
            .set_initialized(neg.hdr_digest, neg.data_digest, neg.cpda, 1 << 20);
    }
    run.transmit();
    for _ in 0..STEPS_MAX {
        if inp.done() {
            break;
        }
        run.step(&mut inp);
        run.transmit();
    }
    // The end: what is on the wire arrives, then the connection goes.
    let n = run.ctrl.wire.len();
    run.deliver(n);
    run.host.poll_send(run.now);
    run.transmit();
    run.host.handle_connection_lost("fuzz: end");
    run.events();
    assert_eq!(
        run.host.in_flight(),
        0,
        "slots left after the connection closed"
    );
    let open = run.open();
    assert!(open.is_empty(), "commands never completed: {open:?}");
    let Run { host, lent, .. } = run;
    drop(host);
    for (token, (mem, done)) in lent {
        // SAFETY: from `Box::into_raw`; the core that wrote into it is gone.
        let mem = unsafe { Box::from_raw(mem) };
        if done {
            assert!(
                mem.iter().all(|&b| b == LENT_DONE),
                "token {token}: lent memory written after its read completed"
            );
        }
    }
});
