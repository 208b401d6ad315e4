//! The streaming PDU receiver on arbitrary bytes.
//!
//! Input layout (all of it is fuzzer controlled):
//!   byte 0: bit 0 direction (0 = host to controller), bit 1 initialized,
//!           bit 2 header digests, bit 3 data digests, bit 4 feed everything at once,
//!           bit 5 split data PDUs and capsules with data off (`split_pdu`)
//!           and receive their rest outside the framer, as the host's and
//!           the target's I/O layers do
//!   byte 1: PDA (0's based dwords, any u8)
//!   bytes 2-3: data_len_max / 16 (little endian), so at most ~1 MiB
//!   bytes 4-7: chunk sizes (each + 1), used in a cycle
//!   rest: the byte stream
//!
//! Checks: no panic; errors carry an FES in 1..=6 and are sticky; every decoded
//! PDU, re-encoded with `encode_pdu` under the same parameters, decodes back to
//! the same header and data in a fresh framer; a split PDU's head and rest
//! add up to its DATAL; a split that its caller refuses changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::framer::Framer;
use sluice_proto::pdu::{encode_pdu, term_req_for, DecodeError, Direction, PduHeader, TxParams};

const CONFIG_LEN: usize = 8;

#[derive(Clone, Copy)]
struct Config {
    direction: Direction,
    initialized: bool,
    hdgst: bool,
    ddgst: bool,
    pda: u8,
    data_len_max: u32,
}

impl Config {
    fn framer(&self) -> Framer {
        let mut f = Framer::new(self.direction, self.data_len_max);
        if self.initialized {
            f.set_initialized(self.hdgst, self.ddgst, self.pda, self.data_len_max);
        }
        f
    }
}

fn check_error(e: &DecodeError, f: &mut Framer) {
    let fes = e.fes();
    assert!((1..=6).contains(&fes), "FES {fes} out of range for {e:?}");
    let _ = e.fei();
    let _ = e.to_string();
    let tr = term_req_for(e, f.current_header());
    assert!(tr.data.len() <= 128);
    // Sticky: the same error again, also after more bytes arrive.
    assert_eq!(f.next_pdu().err().as_ref(), Some(e), "error not sticky");
    f.feed(&[0u8; 9]);
    assert_eq!(
        f.next_pdu().err().as_ref(),
        Some(e),
        "error not sticky after feed"
    );
}

fn round_trip(cfg: &Config, header: &PduHeader, data: &[u8]) {
    let tx = TxParams {
        hdgst: cfg.initialized && cfg.hdgst,
        ddgst: cfg.initialized && cfg.ddgst,
        pda: if cfg.initialized { cfg.pda } else { 0 },
    };
    let mut wire = Vec::new();
    encode_pdu(header, data, &tx, &mut wire);
    let mut f = cfg.framer();
    f.feed(&wire);
    match f.next_pdu() {
        Ok(Some(p)) => {
            assert_eq!(&p.header, header, "re-encoded PDU header differs");
            assert_eq!(p.data, data, "re-encoded PDU data differs");
            assert!(p.data_digest_ok, "re-encoded PDU has a bad data digest");
        }
        Ok(None) => panic!("re-encoded PDU incomplete: {header:?} wire {wire:02x?}"),
        Err(e) => panic!("re-encoded PDU rejected: {e} for {header:?} wire {wire:02x?}"),
    }
    assert_eq!(f.buffered(), 0, "re-encoded PDU longer than its PLEN");
}

/// Drains the framer. Returns false once it has failed.
fn drain(cfg: &Config, f: &mut Framer) -> bool {
    loop {
        let decoded = match f.next_pdu() {
            Ok(None) => return true,
            Ok(Some(p)) => {
                if !(cfg.initialized && cfg.ddgst) {
                    assert!(p.data_digest_ok, "data digest checked without data digests");
                }
                assert!(!p.raw_header.is_empty());
                (p.header.clone(), p.data.to_vec())
            }
            Err(e) => {
                check_error(&e, f);
                return false;
            }
        };
        round_trip(cfg, &decoded.0, &decoded.1);
    }
}

/// A data PDU split off the framer: its data so far, and what is missing.
struct Split {
    header: PduHeader,
    data: Vec<u8>,
    rest: usize,
    ddgst: bool,
}

/// Drains the framer, splitting data PDUs off. Returns false once it failed.
fn drain_split(cfg: &Config, f: &mut Framer, split: &mut Option<Split>) -> bool {
    loop {
        if let Some(sp) = split {
            if sp.rest > 0 {
                return true;
            }
            if sp.ddgst && f.take_bytes(4).is_none() {
                return true;
            }
            let done = split.take().expect("split");
            round_trip(cfg, &done.header, &done.data);
            continue;
        }
        match f.next_pdu() {
            Ok(Some(p)) => {
                let (h, d) = (p.header.clone(), p.data.to_vec());
                round_trip(cfg, &h, &d);
            }
            Ok(None) => {
                let buffered = f.buffered();
                if let Ok(refused) = f.split_pdu(1, |_| false) {
                    assert!(refused.is_none(), "split a PDU its caller refused");
                    assert_eq!(f.buffered(), buffered, "a refused split moved the framer");
                }
                match f.split_pdu(1, |_| true) {
                    Ok(None) => return true,
                    Ok(Some(sp)) => {
                        match &sp.header {
                            PduHeader::H2CData(d) | PduHeader::C2HData(d) => assert_eq!(
                                sp.data_head.len() + sp.data_rest,
                                d.len as usize,
                                "head + rest != DATAL"
                            ),
                            PduHeader::CapsuleCmd(_) => {}
                            other => panic!("split a PDU that carries no data: {other:?}"),
                        }
                        assert!(sp.data_rest > 0);
                        *split = Some(Split {
                            header: sp.header,
                            data: sp.data_head.to_vec(),
                            rest: sp.data_rest,
                            ddgst: sp.ddgst,
                        });
                        assert_eq!(f.buffered(), 0, "framer kept bytes of a split PDU");
                    }
                    Err(e) => {
                        check_error(&e, f);
                        return false;
                    }
                }
            }
            Err(e) => {
                check_error(&e, f);
                return false;
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < CONFIG_LEN {
        return;
    }
    let (c, stream) = input.split_at(CONFIG_LEN);
    let cfg = Config {
        direction: if c[0] & 1 == 0 {
            Direction::HostToController
        } else {
            Direction::ControllerToHost
        },
        initialized: c[0] & 2 != 0,
        hdgst: c[0] & 4 != 0,
        ddgst: c[0] & 8 != 0,
        pda: c[1],
        data_len_max: u16::from_le_bytes([c[2], c[3]]) as u32 * 16,
    };
    let all_at_once = c[0] & 0x10 != 0;
    let chunks = [c[4], c[5], c[6], c[7]];

    let mut f = cfg.framer();
    if c[0] & 0x20 != 0 {
        let mut split = None;
        let mut rest = stream;
        let mut i = 0;
        while !rest.is_empty() {
            let mut n = (chunks[i % 4] as usize + 1).min(rest.len());
            i += 1;
            if let Some(sp) = split.as_mut().filter(|sp: &&mut Split| sp.rest > 0) {
                let k = n.min(sp.rest);
                sp.data.extend_from_slice(&rest[..k]);
                sp.rest -= k;
                rest = &rest[k..];
                n -= k;
            }
            f.feed(&rest[..n]);
            rest = &rest[n..];
            if !drain_split(&cfg, &mut f, &mut split) {
                return;
            }
        }
        return;
    }
    if all_at_once {
        f.feed(stream);
        drain(&cfg, &mut f);
        return;
    }
    let mut rest = stream;
    let mut i = 0;
    while !rest.is_empty() {
        let n = (chunks[i % 4] as usize + 1).min(rest.len());
        i += 1;
        // Half the time through read_buf/advance, as the I/O layer does.
        if i % 2 == 0 {
            let b = f.read_buf();
            assert!(b.len() >= n);
            b[..n].copy_from_slice(&rest[..n]);
            f.advance(n);
        } else {
            f.feed(&rest[..n]);
        }
        rest = &rest[n..];
        if !drain(&cfg, &mut f) {
            return;
        }
    }
});
