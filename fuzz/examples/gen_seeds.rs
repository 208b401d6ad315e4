//! Regenerates the committed seed corpus under fuzz/seeds/ from sluice-proto's
//! own encoders. Build it WITHOUT the fuzzing RUSTFLAGS:
//!
//!     cd fuzz && cargo run --example gen_seeds --target-dir target/seedgen -- seeds
//!
//! The seeds are small valid inputs that get each target past its length and
//! shape checks at once, so a 20-second smoke run reaches the deep code.

use std::path::Path;

use sluice_proto::command::Sqe;
use sluice_proto::fabrics::{fctype, ConnectCommand, ConnectData, PropertyCommand};
use sluice_proto::identify::{
    encode_active_ns_list, encode_ns_descriptors, IdentifyController, IdentifyNamespace,
};
use sluice_proto::log::{
    adrfam, encode_discovery_log, lid, subtype, DiscoveryEntry, GetLogPage, TRTYPE_TCP,
};
use sluice_proto::pdu::{encode_pdu, DataHeader, IcReq, IcResp, PduHeader, R2t, TermReq, TxParams};
use sluice_proto::reservation::{NotificationLog, Registrant, ReservationStatus};
use sluice_proto::Cqe;

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
}

/// Framer input: 8 config bytes, then the stream (see fuzz_targets/framer.rs).
fn framer_seed(
    c2h: bool,
    init: bool,
    hd: bool,
    dd: bool,
    pda: u8,
    pdus: &[(PduHeader, Vec<u8>)],
) -> Vec<u8> {
    let flags = c2h as u8 | (init as u8) << 1 | (hd as u8) << 2 | (dd as u8) << 3;
    let dlm = (8192u32 / 16) as u16;
    let mut out = vec![flags, pda, dlm as u8, (dlm >> 8) as u8, 0, 6, 40, 255];
    let tx = TxParams {
        hdgst: init && hd,
        ddgst: init && dd,
        pda: if init { pda } else { 0 },
    };
    for (h, d) in pdus {
        encode_pdu(h, d, &tx, &mut out);
    }
    out
}

fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "seeds".into());
    let dir = Path::new(&dir);

    // --- framer ---
    let icreq = PduHeader::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: true,
        maxr2t: 0,
    });
    let icresp = PduHeader::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: false,
        ddgst: false,
        maxh2cdata: 8192,
    });
    let term = |c2h: bool| {
        let t = TermReq {
            fes: 1,
            fei: 2,
            data: vec![4, 0, 72, 0, 72, 0, 0, 0],
        };
        let d = t.data.clone();
        (
            if c2h {
                PduHeader::C2HTermReq(t)
            } else {
                PduHeader::H2CTermReq(t)
            },
            d,
        )
    };
    write(
        dir,
        "framer",
        "h2c-icreq",
        &framer_seed(
            false,
            false,
            false,
            false,
            0,
            &[(icreq, vec![]), term(false)],
        ),
    );
    write(
        dir,
        "framer",
        "c2h-icresp",
        &framer_seed(
            true,
            false,
            false,
            false,
            0,
            &[(icresp, vec![]), term(true)],
        ),
    );
    let cmd = Sqe::rw(0x01, 7, 1, 0, 1, false);
    for (hd, dd, pda) in [
        (false, false, 0u8),
        (true, true, 0),
        (true, false, 3),
        (false, true, 31),
    ] {
        let tag = format!("hd{}-dd{}-pda{}", hd as u8, dd as u8, pda);
        let h2c = vec![
            (PduHeader::CapsuleCmd(cmd), vec![]),
            (PduHeader::CapsuleCmd(cmd), vec![0xa5; 512]),
            (
                PduHeader::H2CData(DataHeader {
                    cccid: 7,
                    ttag: 1,
                    offset: 0,
                    len: 64,
                    last: true,
                    success: false,
                }),
                vec![0x5a; 64],
            ),
        ];
        write(
            dir,
            "framer",
            &format!("h2c-{tag}"),
            &framer_seed(false, true, hd, dd, pda, &h2c),
        );
        let c2h = vec![
            (
                PduHeader::R2t(R2t {
                    cccid: 7,
                    ttag: 1,
                    offset: 0,
                    len: 4096,
                }),
                vec![],
            ),
            (
                PduHeader::C2HData(DataHeader {
                    cccid: 7,
                    ttag: 0,
                    offset: 0,
                    len: 64,
                    last: true,
                    success: true,
                }),
                vec![0x3c; 64],
            ),
            (
                PduHeader::CapsuleResp(Cqe::new(7, sluice_proto::Status::SUCCESS)),
                vec![],
            ),
        ];
        write(
            dir,
            "framer",
            &format!("c2h-{tag}"),
            &framer_seed(true, true, hd, dd, pda, &c2h),
        );
    }

    // --- connect_data ---
    let cd = ConnectData {
        hostid: *b"0123456789abcdef",
        cntlid: 0xffff,
        subnqn: sluice_proto::DISCOVERY_NQN.into(),
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001".into(),
    };
    write(dir, "connect_data", "discovery", &cd.encode());
    let long = ConnectData {
        subnqn: "n".repeat(223),
        hostnqn: "nqn.\u{e9}\u{20ac}".into(),
        ..cd.clone()
    };
    write(dir, "connect_data", "long-utf8", &long.encode());

    // --- identify ---
    let ctrl = IdentifyController {
        vid: 0x1b36,
        serial: "SLUICE0001".into(),
        model: "Sluice NVMe/TCP".into(),
        firmware: "0.1.0".into(),
        nn: 4,
        subnqn: "nqn.2024-01.io.sluice:disk0".into(),
        ..Default::default()
    };
    write(dir, "identify", "controller", &ctrl.encode());
    let ns = IdentifyNamespace {
        nsze: 1 << 20,
        ncap: 1 << 20,
        nuse: 1 << 20,
        lbads: 12,
        nguid: [7; 16],
        eui64: [9; 8],
        ..Default::default()
    };
    write(dir, "identify", "namespace", &ns.encode());
    write(
        dir,
        "identify",
        "ns-descriptors",
        &encode_ns_descriptors(&[1; 16], &[2; 16]),
    );
    write(
        dir,
        "identify",
        "active-ns-list",
        &encode_active_ns_list(&[1, 2, 3, 9], 0)[..64],
    );

    // --- reservation ---
    let report = ReservationStatus {
        generation: 3,
        rtype: 1,
        ptpl: false,
        registrant_count: 2,
        registrants: vec![
            Registrant {
                cntlid: 0xffff,
                holds: true,
                hostid: [0xa; 16],
                key: 5,
            },
            Registrant {
                cntlid: 0xffff,
                holds: false,
                hostid: [0xb; 16],
                key: 7,
            },
        ],
    };
    write(dir, "reservation", "report", &report.encode_extended(192));
    let log = NotificationLog {
        count: 1,
        kind: 1,
        available: 0,
        nsid: 1,
    };
    write(dir, "reservation", "notification-log", &log.encode());

    // --- discovery_log ---
    let e = |i: u16| DiscoveryEntry {
        trtype: TRTYPE_TCP,
        adrfam: adrfam::IPV4,
        subtype: subtype::NVME,
        treq: 0,
        portid: i,
        cntlid: 0xffff,
        asqsz: 32,
        eflags: 0,
        trsvcid: "4420".into(),
        subnqn: format!("nqn.2024-01.io.sluice:disk{i}"),
        traddr: "127.0.0.1".into(),
        sectype: 0,
    };
    write(
        dir,
        "discovery_log",
        "two-entries",
        &encode_discovery_log(3, &[e(0), e(1)]),
    );
    write(
        dir,
        "discovery_log",
        "header-only",
        &encode_discovery_log(1, &[])[..32],
    );

    // --- sqe_fields ---
    let conn = ConnectCommand {
        cid: 1,
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 4,
        kato_ms: 120_000,
    };
    write(dir, "sqe_fields", "connect", &conn.to_sqe().0);
    let glp = GetLogPage {
        lid: lid::DISCOVERY,
        lsp: 0,
        rae: true,
        len_bytes: 3072,
        offset_bytes: 1024,
    };
    write(dir, "sqe_fields", "get-log-page", &glp.to_sqe(2, 0).0);
    let prop = PropertyCommand {
        size8: true,
        offset: 0,
        value: 0,
    };
    write(
        dir,
        "sqe_fields",
        "property-get",
        &prop.to_sqe(3, fctype::PROPERTY_GET).0,
    );

    // --- host_queue: a large read, a solicited write and a flush, each
    // answered in full by a well-behaved controller (the steps' encoding is
    // in fuzz_targets/host_queue.rs) ---
    for (name, cfg) in [("plain", 0u8), ("digests", 3), ("isolated-idle", 12)] {
        let mut b = vec![cfg, 7];
        b.extend(8192u16.to_le_bytes()); // in-capsule limit
        b.extend(16384u32.to_le_bytes()); // MAXH2CDATA - 4
        let read_len = 131_072u32;
        b.push(0); // submit a read
        b.extend(read_len.to_le_bytes());
        b.push(0); // into a new buffer
        b.extend([3, 0, 8]); // C2HData for the open command, SUCCESS
        b.extend((read_len - 1).to_le_bytes()); // all of it
        b.extend([11, 0]); // deliver everything
        let write_len = 40_000u32;
        b.push(1); // submit a write
        b.extend(write_len.to_le_bytes());
        b.extend([4, 0, 0]); // R2T for the open command
        b.extend((write_len - 1).to_le_bytes());
        b.extend(1u16.to_le_bytes());
        b.extend([11, 0, 10]); // deliver, then the host sends its H2CData
        b.extend([5, 0, 0]); // CapsuleResp, success
        b.extend([2, 10, 5, 0, 0, 11, 0]); // a flush and its response
        write(dir, "host_queue", name, &b);
    }

    // --- auth_host: the real exchange, nothing flipped, in each setting
    // (flags: ask the controller to authenticate, ffdhe2048) ---
    for flags in 0u8..4 {
        write(dir, "auth_host", &format!("flags{flags}"), &[flags, 0, 0]);
    }
}
