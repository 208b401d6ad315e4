//! The target's admin side as Sluice's host core sees it: properties,
//! Identify, log pages, features, AERs, shutdown, Number of Queues, in every
//! send mode of the target.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_host::core::{Completion, Payload};
use sluice_host::HostError;
use sluice_pair::*;
use sluice_proto::command::{admin, Sqe};
use sluice_proto::fabrics::{cc, prop};
use sluice_proto::identify::{self, IdentifyController, IdentifyNamespace};
use sluice_proto::log::{self, lid, GetLogPage};
use sluice_proto::send::SendConfig;
use sluice_proto::Status;

fn every_target_send_mode() -> impl Iterator<Item = Params> {
    SCHEDULERS.into_iter().flat_map(|ts| {
        COALESCING.into_iter().map(move |co| Params {
            target_send: send_config(ts, co),
            ..Params::default()
        })
    })
}

fn admin_cmd(
    pair: &mut Pair,
    opcode: u8,
    nsid: u32,
    cdw10: u32,
    cdw11: u32,
    c2h_len: u32,
) -> Result<Completion, HostError> {
    let mut s = Sqe::new(opcode, 0, nsid);
    s.set_cdw(10, cdw10);
    s.set_cdw(11, cdw11);
    let pl = if c2h_len > 0 {
        Payload::Read(c2h_len)
    } else {
        Payload::None
    };
    pair.execute(ADMIN, s, pl)
}

fn identify(pair: &mut Pair, cns: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
    admin_cmd(pair, admin::IDENTIFY, nsid, cns as u32, 0, 4096).map(|c| c.data)
}

#[test]
fn properties_and_identify() {
    for p in every_target_send_mode() {
        let mut pair = Pair::new(p);
        assert!(pair.cntlid >= 1);
        let cap = pair.prop_get(prop::CAP).unwrap();
        assert_eq!(cap & 0xffff, 127, "MQES = queue_depth_max - 1");
        assert_ne!(cap & (1 << 37), 0, "NVM command set");
        assert_eq!(pair.prop_get(prop::VS).unwrap(), 0x0001_0300);

        let d = identify(&mut pair, identify::cns::CONTROLLER, 0).unwrap();
        let id = IdentifyController::decode(&d).unwrap();
        assert_eq!(id.cntlid, pair.cntlid);
        assert_eq!(id.subnqn, SUBNQN);
        assert_eq!(id.cntrltype, identify::cntrltype::IO);
        assert_eq!(id.ioccsz, (64 + 8192) / 16);
        assert_eq!(id.iorcsz, 1);
        assert_eq!(id.icdoff, 0);
        assert_eq!(id.mdts, 8, "1 MiB = 2^8 x 4 KiB");
        assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
        assert_eq!(id.nn, 1024, "the highest NSID a reload may add");
        assert_ne!(id.sgls & 1, 0);
        assert!(id.maxcmd > 0);

        let d = identify(&mut pair, identify::cns::NAMESPACE, NSID).unwrap();
        let ns = IdentifyNamespace::decode(&d).unwrap();
        assert_eq!(ns.nsze, 4 * 1024 * 1024 / 512);
        assert_eq!(ns.block_size_bytes(), 512);

        let d = identify(&mut pair, identify::cns::ACTIVE_NS_LIST, 0).unwrap();
        assert_eq!(identify::decode_active_ns_list(&d), vec![1]);
        let d = identify(&mut pair, identify::cns::NS_DESCRIPTORS, NSID).unwrap();
        let descs = identify::decode_ns_descriptors(&d);
        assert!(descs
            .iter()
            .any(|(t, v)| *t == identify::nidt::NGUID && v[..] == ns.nguid[..]));

        let r = identify(&mut pair, identify::cns::NAMESPACE, 9999);
        assert_eq!(nvme_status(&r), Some(Status::INVALID_NAMESPACE));
        let r = identify(&mut pair, 0x1f, 0);
        assert_eq!(nvme_status(&r), Some(Status::INVALID_FIELD));
        let r = admin_cmd(&mut pair, 0x7e, 0, 0, 0, 0);
        assert_eq!(nvme_status(&r), Some(Status::INVALID_OPCODE));
    }
}

#[test]
fn logs_and_features() {
    for p in every_target_send_mode() {
        let mut pair = Pair::new(p);
        pair.write(0, &pattern(4096, 5)).unwrap();
        let g = |l: u8, len: u32| GetLogPage {
            lid: l,
            lsp: 0,
            rae: false,
            len_bytes: len as u64,
            offset_bytes: 0,
        };
        let c = pair
            .execute(
                ADMIN,
                g(lid::SMART, 512).to_sqe(0, 0xffff_ffff),
                Payload::Read(512),
            )
            .unwrap();
        let smart = log::SmartLog::decode(&c.data).unwrap();
        assert_eq!(smart.host_write_commands, 1);
        assert_eq!(smart.data_units_written, 1);
        for l in [
            lid::ERROR,
            lid::FIRMWARE_SLOT,
            lid::CHANGED_NS_LIST,
            lid::COMMANDS_SUPPORTED,
        ] {
            let c = pair
                .execute(ADMIN, g(l, 64).to_sqe(0, 0), Payload::Read(64))
                .unwrap_or_else(|e| panic!("log {l:#x}: {e}"));
            assert_eq!(c.data.len(), 64);
        }
        let r = pair.execute(ADMIN, g(0x42, 64).to_sqe(0, 0), Payload::Read(64));
        assert_eq!(nvme_status(&r), Some(Status::INVALID_LOG_PAGE));
        // Keep alive timer feature round trip; saving is refused.
        admin_cmd(&mut pair, admin::SET_FEATURES, 0, 0x0f, 12000, 0).unwrap();
        let c = admin_cmd(&mut pair, admin::GET_FEATURES, 0, 0x0f, 0, 0).unwrap();
        assert_eq!(c.cqe.result, 12000);
        let r = admin_cmd(&mut pair, admin::SET_FEATURES, 0, 0x0f | 1 << 31, 1, 0);
        assert_eq!(nvme_status(&r), Some(Status::FEATURE_NOT_SAVEABLE));
        let r = admin_cmd(&mut pair, admin::GET_FEATURES, 0, 0x55, 0, 0);
        assert_eq!(nvme_status(&r), Some(Status::INVALID_FIELD));
    }
}

#[test]
fn async_event_requests_are_held_up_to_the_limit() {
    for p in every_target_send_mode() {
        let mut pair = Pair::new(p);
        let held: Vec<u64> = (0..4)
            .map(|_| {
                pair.submit(
                    ADMIN,
                    Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
                    Payload::None,
                )
            })
            .collect();
        pair.run();
        for t in &held {
            assert!(pair.take_result(ADMIN, *t).is_none(), "AERs are held");
        }
        let r = pair.execute(
            ADMIN,
            Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
            Payload::None,
        );
        assert_eq!(nvme_status(&r), Some(Status::AER_LIMIT_EXCEEDED));
    }
}

#[test]
fn shutdown_via_cc_reports_shst_complete() {
    for p in every_target_send_mode() {
        let mut pair = Pair::new(p);
        let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
        pair.prop_set(prop::CC, (en | 1 << cc::SHN_SHIFT) as u64)
            .unwrap();
        let csts = pair.prop_get(prop::CSTS).unwrap();
        assert_eq!(csts & 0xc, 0x8, "SHST = shutdown complete");
        // Disable: RDY clears.
        pair.prop_set(prop::CC, 0).unwrap();
        assert_eq!(pair.prop_get(prop::CSTS).unwrap() & 1, 0);
    }
}

#[test]
fn number_of_queues_limits_io_connects() {
    for p in every_target_send_mode() {
        let mut pair = Pair::unconnected(p);
        pair.connect_admin();
        let c = admin_cmd(&mut pair, admin::SET_FEATURES, 0, 0x07, 0x0001_0001, 0).unwrap();
        assert_eq!(c.cqe.result, 0x0001_0001, "2 queues granted (0's based)");
        let cntlid = pair.cntlid;
        for qid in [1u16, 2] {
            let l = pair.open_link(qid, 32, SendConfig::default());
            pair.connect(l, qid, 31, 0, cntlid).unwrap();
        }
        let l = pair.open_link(3, 32, SendConfig::default());
        let r = pair.connect(l, 3, 31, 0, cntlid);
        assert_eq!(nvme_status(&r), Some(Status::CONNECT_INVALID_PARAMETERS));
    }
}

/// A namespace that grows online (an elastic volume resized by its control
/// plane), the way the Linux host follows it: the controller advertises
/// Namespace Attribute Notices, a held AER completes with the notice at the
/// next controller check, the Changed Namespace List names the namespace,
/// Identify shows the new size and I/O past the old end works. A second
/// growth before the host read the log sends no second notice; after the
/// read, it does.
#[test]
fn namespace_growth_is_announced_by_an_async_event() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let start_bytes: u64 = 4 << 20;
    let size = Arc::new(AtomicU64::new(start_bytes));
    let mut pair = Pair::new(Params {
        growable: Some(size.clone()),
        ns_bytes: start_bytes,
        ..Params::default()
    });
    let bs = u64::from(pair.params.block_size);
    let ns_blocks = |pair: &mut Pair| {
        let d = identify(pair, identify::cns::NAMESPACE, NSID).unwrap();
        IdentifyNamespace::decode(&d).unwrap().nsze
    };
    let changed_log = |pair: &mut Pair, rae: bool| {
        let g = GetLogPage {
            lid: lid::CHANGED_NS_LIST,
            lsp: 0,
            rae,
            len_bytes: 4096,
            offset_bytes: 0,
        };
        let c = pair
            .execute(ADMIN, g.to_sqe(0, 0xffff_ffff), Payload::Read(4096))
            .unwrap();
        c.data
            .chunks(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .take_while(|v| *v != 0)
            .collect::<Vec<u32>>()
    };
    let aer = |pair: &mut Pair| {
        pair.submit(
            ADMIN,
            Sqe::new(admin::ASYNC_EVENT_REQUEST, 0, 0),
            Payload::None,
        )
    };

    let d = identify(&mut pair, identify::cns::CONTROLLER, 0).unwrap();
    let oaes = IdentifyController::decode(&d).unwrap().oaes;
    assert_ne!(
        oaes & 1 << 8,
        0,
        "OAES advertises Namespace Attribute Notices"
    );
    // What Linux does: enable the advertised notices, post an AER.
    admin_cmd(&mut pair, admin::SET_FEATURES, 0, 0x0b, oaes, 0).unwrap();
    let first = aer(&mut pair);
    pair.advance(Duration::from_secs(1));
    assert!(
        pair.take_result(ADMIN, first).is_none(),
        "nothing changed yet"
    );
    let old_blocks = start_bytes / bs;
    assert_eq!(ns_blocks(&mut pair), old_blocks);
    let r = pair.write(old_blocks, &pattern(4096, 1));
    assert_eq!(nvme_status(&r), Some(Status::LBA_OUT_OF_RANGE));

    size.store(2 * start_bytes, Ordering::Release);
    pair.advance(Duration::from_millis(250));
    let c = pair
        .take_result(ADMIN, first)
        .expect("the AER completes within one controller check (200 ms)")
        .unwrap();
    assert!(c.cqe.status.status().is_success());
    assert_eq!(
        c.cqe.result, 0x0004_0002,
        "Notice, Namespace Attribute Changed, log page 04h"
    );
    assert_eq!(ns_blocks(&mut pair), 2 * old_blocks);
    let data = pattern(8192, 2);
    pair.write(old_blocks + 8, &data).unwrap();
    assert_eq!(pair.read(old_blocks + 8, data.len()).unwrap(), data);
    let r = pair.write(2 * old_blocks, &pattern(4096, 3));
    assert_eq!(nvme_status(&r), Some(Status::LBA_OUT_OF_RANGE));

    // Masked until the log is read (RAE keeps it masked).
    let second = aer(&mut pair);
    assert_eq!(changed_log(&mut pair, true), vec![NSID]);
    size.store(3 * start_bytes, Ordering::Release);
    pair.advance(Duration::from_secs(1));
    assert!(pair.take_result(ADMIN, second).is_none(), "masked");
    assert_eq!(changed_log(&mut pair, false), vec![NSID]);
    assert_eq!(
        changed_log(&mut pair, false),
        Vec::<u32>::new(),
        "read clears it"
    );
    assert_eq!(ns_blocks(&mut pair), 3 * old_blocks);

    // Unmasked: the next growth completes the AER still held.
    size.store(4 * start_bytes, Ordering::Release);
    pair.advance(Duration::from_millis(250));
    let c = pair
        .take_result(ADMIN, second)
        .expect("a notice after the log was read")
        .unwrap();
    assert_eq!(c.cqe.result, 0x0004_0002);
    assert_eq!(ns_blocks(&mut pair), 4 * old_blocks);
}
