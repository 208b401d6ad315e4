//! A configuration reload adds and removes whole subsystems, replaces who a
//! subsystem admits, and the tenants, while the target runs: a subsystem
//! added takes Connects and I/O while the others serve on; one removed
//! fails its controllers and is then unknown; a host added connects; a host removed is
//! refused at its next Connect and its live controller is failed, its
//! queues closing at their next check; data it wrote stays; tenants are
//! created, replaced and deleted, a host may move between them; a file that changes
//! anything a reload cannot apply is refused whole and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use sluice_config::{NamespaceConfig, SubsystemConfig};
use sluice_proto::command::admin;
use sluice_proto::fabrics::{cc, prop, CNTLID_DYNAMIC};
use sluice_proto::identify::IdentifyController;
use sluice_proto::pdu::PduHeader;
use sluice_proto::Status;
use sluice_target::queue::CONTROLLER_CHECK_INTERVAL;
use sluice_target::registry::Registry;
use sluice_target::reload::{
    reload, AccessChange, NamespaceGrowth, ReloadError, ReloadReport, RemovedSubsystem,
};
use sluice_target::tenant::TenantRuntime;
use std::sync::Arc;
use std::time::Duration;

const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000b2";

fn refused(c: &sluice_proto::command::Cqe) -> bool {
    let s = c.status();
    (s.sct, s.sc)
        == (
            Status::CONNECT_INVALID_HOST.sct,
            Status::CONNECT_INVALID_HOST.sc,
        )
}

/// Connects an admin queue as `hostnqn`; its completion.
fn admin_as(reg: &Arc<Registry>, hostnqn: &str) -> (Pair, sluice_proto::command::Cqe) {
    admin_of(reg, SUBNQN, hostnqn)
}

/// Connects an admin queue of `subnqn` as `hostnqn`; its completion.
fn admin_of(
    reg: &Arc<Registry>,
    subnqn: &str,
    hostnqn: &str,
) -> (Pair, sluice_proto::command::Cqe) {
    let mut p = Pair::new(reg.clone());
    p.icreq(false, false);
    let c = p.connect_as(subnqn, hostnqn, 0, CNTLID_DYNAMIC);
    (p, c)
}

/// A controller of `subnqn` for `hostnqn`, enabled, and one I/O queue.
fn controller_of(reg: &Arc<Registry>, subnqn: &str, hostnqn: &str) -> (Pair, Pair, u16) {
    let (mut a, c) = admin_of(reg, subnqn, hostnqn);
    assert!(c.status().is_success(), "{:?}", c.status());
    let id = u16::try_from(c.result).unwrap();
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    assert_eq!(a.prop_set(prop::CC, u64::from(en)), Status::SUCCESS);
    let mut q = Pair::new(reg.clone());
    q.icreq(false, false);
    assert!(q.connect_as(subnqn, hostnqn, 1, id).status().is_success());
    (a, q, id)
}

fn unknown_subsystem(c: &sluice_proto::command::Cqe) -> bool {
    c.status().same_code(Status::CONNECT_INVALID_PARAMETERS)
}

const ADDED: &str = "nqn.2026-12.io.sluice:added";

fn added_subsystem() -> SubsystemConfig {
    SubsystemConfig::new(ADDED)
        .with_host(OTHER)
        .with_namespace(NamespaceConfig::ram(1, 1 << 20).with_block_size(512))
}

/// A subsystem added by a reload serves its host at once, with state of
/// its own, while the kept one serves on; removed, its controllers fail,
/// its queues close at their next check, it is unknown to Connects, and
/// once its connections are gone nothing holds its namespace (the
/// backend is freed). Added again, it is a new, empty namespace.
#[test]
fn reload_adds_and_removes_whole_subsystems_while_the_others_serve() {
    let before = config_in("immediate", default_ns());
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let (_a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    let data = pattern(4096, 7);
    assert_eq!(q.write(8, &data, 8192), Status::SUCCESS);
    assert!(
        unknown_subsystem(&admin_of(&reg, ADDED, OTHER).1),
        "not there yet"
    );
    let genctr = reg.genctr();

    // Listed first: the order of the subsystems does not matter.
    let mut after = before.clone();
    after.subsystems.insert(0, added_subsystem());
    let report = reload(&reg, &tenants, &after).expect("a subsystem may be added");
    assert_eq!(report.subsystems_added, vec![ADDED.to_string()]);
    assert!(report.access.is_empty() && report.subsystems_removed.is_empty());
    assert!(reg.genctr() > genctr, "discovery log pages list it");
    let added_ns = reg.subsystems()[ADDED].namespaces.get(1).unwrap();
    let kept_ns = reg.subsystems()[SUBNQN].namespaces.get(1).unwrap();
    assert_ne!(added_ns.index, kept_ns.index, "an index of its own");
    assert!(tenants.arbiters.get(added_ns.index).is_some());
    assert_eq!(
        tenants
            .ns_stats
            .get(added_ns.index)
            .map(|s| (s.nqn.as_str(), s.nsid)),
        Some((ADDED, 1))
    );

    // Its host writes and reads back; the kept subsystem serves on and its
    // data is its own.
    let (mut b, mut bq, b_id) = controller_of(&reg, ADDED, OTHER);
    let other = pattern(4096, 9);
    assert_eq!(bq.write(8, &other, 8192), Status::SUCCESS);
    assert_eq!(bq.read(8, 8), (Status::SUCCESS, other.clone()));
    assert_eq!(q.read(8, 8), (Status::SUCCESS, data.clone()));
    assert!(
        refused(&admin_of(&reg, ADDED, HOSTNQN).1),
        "its own host list"
    );
    assert_eq!(reload(&reg, &tenants, &after), Ok(ReloadReport::default()));
    let nguid = |a: &mut Pair| {
        let (st, id) = a.identify(0, 1);
        assert_eq!(st, Status::SUCCESS);
        id[104..120].to_vec()
    };
    let first_nguid = nguid(&mut b);

    // Removed.
    let genctr = reg.genctr();
    let report = reload(&reg, &tenants, &before).expect("a subsystem may be removed");
    assert_eq!(
        report.subsystems_removed,
        vec![RemovedSubsystem {
            nqn: ADDED.into(),
            controllers_failed: vec![(b_id, OTHER.into())],
        }]
    );
    assert!(report.subsystems_added.is_empty() && report.access.is_empty());
    assert!(reg.genctr() > genctr);
    assert!(!reg.subsystems().contains_key(ADDED));
    assert!(unknown_subsystem(&admin_of(&reg, ADDED, OTHER).1));
    let step = CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1);
    b.advance(step);
    bq.advance(step);
    q.advance(step);
    assert!(b.conn.is_closing() && bq.conn.is_closing());
    assert!(!q.conn.is_closing(), "the kept subsystem's queue");
    assert_eq!(q.read(8, 8), (Status::SUCCESS, data.clone()));
    // The I/O layer finishes closed connections; then nothing holds the
    // namespace (no cycle through the controller table).
    let held = Arc::downgrade(&added_ns);
    let old_index = added_ns.index;
    drop(added_ns);
    b.conn.finish();
    bq.conn.finish();
    drop((b, bq));
    assert!(held.upgrade().is_none(), "the removed namespace is freed");

    // Added again: a new namespace, empty, on a new index, with an NGUID
    // of its own (a host must not take it for the one it knew).
    reload(&reg, &tenants, &after).expect("added again");
    let again = reg.subsystems()[ADDED].namespaces.get(1).unwrap();
    assert!(again.index > old_index, "indices are not reused");
    let (mut b, mut bq, _) = controller_of(&reg, ADDED, OTHER);
    assert_eq!(bq.read(8, 8), (Status::SUCCESS, vec![0; 4096]));
    assert_ne!(nguid(&mut b), first_nguid);
    assert_eq!(reg.reloads.counts(), (4, 0));
}

/// The NSIDs of an Identify or log page data of little-endian u32s.
fn nsids(data: &[u8]) -> Vec<u32> {
    data.chunks(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .take_while(|v| *v != 0)
        .collect()
}

/// The active namespace list (Identify CNS 02h).
fn active(a: &mut Pair) -> Vec<u32> {
    let (st, d) = a.identify(2, 0);
    assert_eq!(st, Status::SUCCESS);
    nsids(&d)
}

/// Identify Namespace `nsid`: NSZE and NGUID.
fn identify_ns(a: &mut Pair, nsid: u32) -> (u64, Vec<u8>) {
    let (st, d) = a.identify(0, nsid);
    assert_eq!(st, Status::SUCCESS, "nsid {nsid}");
    (
        u64::from_le_bytes(d[0..8].try_into().unwrap()),
        d[104..120].to_vec(),
    )
}

/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices.
const AEN_NS_ATTRIBUTE: u32 = 1 << 8;
/// An AER completion's DW0 for Namespace Attribute Changed: type Notice
/// (2), information 00h, log page 04h (Changed Namespace List).
const NS_ATTRIBUTE_CHANGED_DW0: u32 = 0x0004_0002;
/// Asynchronous Event Configuration bit 31: Discovery Log Page Change
/// Notices.
const AEN_DISCOVERY_CHANGE: u32 = 1 << 31;
/// An AER completion's DW0 for Discovery Log Page Change: type Notice,
/// information F0h, log page 70h.
const DISCOVERY_CHANGE_DW0: u32 = 0x0070_f002;

/// The AER `cid`'s completion once the admin queue's next check has run.
fn aer_after_check(a: &mut Pair, cid: u16) -> Option<u32> {
    a.advance(CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1));
    a.take().into_iter().find_map(|g| match g.header {
        PduHeader::CapsuleResp(c) if c.cid == cid => {
            assert!(c.status().is_success());
            Some(c.result)
        }
        _ => None,
    })
}

/// The Changed Namespace List (read clears it).
fn changed_list(a: &mut Pair) -> Vec<u32> {
    let numd = 4096 / 4 - 1;
    let (c, d) = a.admin_cmd(
        admin::GET_LOG_PAGE,
        0xffff_ffff,
        u32::from(sluice_proto::log::lid::CHANGED_NS_LIST) | numd << 16,
        0,
        4096,
    );
    assert!(c.status().is_success());
    nsids(&d)
}

/// A target of `config` with a controller whose host enabled Namespace
/// Attribute Notices and holds AER 900, and one I/O queue.
struct Watched {
    reg: Arc<Registry>,
    tenants: TenantRuntime,
    a: Pair,
    q: Pair,
    cntlid: u16,
}

fn watched(config: &sluice_config::Config) -> Watched {
    let reg = registry(config);
    let tenants = TenantRuntime::new(config, &reg);
    let (mut a, cntlid) = admin_pair(&reg);
    let (c, _) = a.admin_cmd(admin::SET_FEATURES, 0, 0x0b, AEN_NS_ATTRIBUTE, 0);
    assert!(c.status().is_success());
    a.post_aer(900);
    let q = io_pair(&reg, cntlid, false, false);
    Watched {
        reg,
        tenants,
        a,
        q,
        cntlid,
    }
}

/// A reload adds a namespace to a kept subsystem and takes it out again:
/// the live queue's next command reaches it, the host gets a Namespace
/// Attribute Changed event naming it (Changed Namespace List), and
/// Identify lists it; removed, commands naming it get Invalid Namespace
/// while namespace 1 serves on, the host is told again, and once the
/// queues have looked nothing holds it. Added back, it is a new, empty
/// namespace with an NGUID of its own. A kept namespace's settings
/// changed, or an added one that cannot be opened, refuse the file.
#[test]
fn reload_adds_and_removes_namespaces_of_a_kept_subsystem() {
    let before = config_in("immediate", default_ns());
    let Watched {
        reg,
        tenants,
        mut a,
        mut q,
        cntlid,
    } = watched(&before);
    let one = pattern(4096, 3);
    assert_eq!(q.write_ns(1, 8, &one, 8192), Status::SUCCESS);
    assert_eq!(q.write_ns(2, 8, &one, 8192), Status::INVALID_NAMESPACE);
    assert_eq!(active(&mut a), vec![1]);
    assert_eq!(identify_ns(&mut a, 2).0, 0, "inactive: all zeroes");
    let id = IdentifyController::decode(&a.identify(1, 0).1).unwrap();
    assert_eq!(id.nn, 1024, "NN is the highest NSID a reload may add");

    let mut after = before.clone();
    after.subsystems[0]
        .namespaces
        .push(NamespaceConfig::ram(2, 1 << 20).with_block_size(512));
    let report = reload(&reg, &tenants, &after).expect("a namespace may be added");
    assert_eq!(report.namespaces_added, vec![(SUBNQN.to_string(), 2)]);
    assert!(report.subsystems_added.is_empty() && report.namespaces_removed.is_empty());
    assert!(report.access.is_empty(), "its access did not change");
    let added = reg.subsystems()[SUBNQN].namespaces.get(2).unwrap();
    assert_eq!(
        tenants
            .ns_stats
            .get(added.index)
            .map(|s| (s.nqn.as_str(), s.nsid)),
        Some((SUBNQN, 2)),
        "state of its own"
    );
    // The live I/O queue's next command reaches it.
    let two = pattern(4096, 5);
    assert_eq!(q.write_ns(2, 8, &two, 8192), Status::SUCCESS);
    assert_eq!(q.read_ns(2, 8, 8), (Status::SUCCESS, two.clone()));
    assert_eq!(q.read_ns(1, 8, 8), (Status::SUCCESS, one.clone()));
    // The host is told at the admin queue's next check.
    assert_eq!(aer_after_check(&mut a, 900), Some(NS_ATTRIBUTE_CHANGED_DW0));
    assert_eq!(changed_list(&mut a), vec![2]);
    assert_eq!(active(&mut a), vec![1, 2]);
    let (nsze, nguid) = identify_ns(&mut a, 2);
    assert_eq!(nsze, 2048);
    assert_eq!(reload(&reg, &tenants, &after), Ok(ReloadReport::default()));
    // A second I/O queue, connected now and idle from here on.
    let mut idle = Pair::new(reg.clone());
    idle.icreq(false, false);
    assert!(idle.connect(2, cntlid, HOSTNQN, 0).status().is_success());

    // Removed.
    a.post_aer(901);
    let held = Arc::downgrade(&added);
    let old_index = added.index;
    drop(added);
    let report = reload(&reg, &tenants, &before).expect("a namespace may be removed");
    assert_eq!(report.namespaces_removed, vec![(SUBNQN.to_string(), 2)]);
    assert!(report.namespaces_added.is_empty() && report.subsystems_removed.is_empty());
    assert_eq!(q.read_ns(2, 8, 8).0, Status::INVALID_NAMESPACE);
    assert_eq!(q.read_ns(1, 8, 8), (Status::SUCCESS, one.clone()));
    assert_eq!(aer_after_check(&mut a, 901), Some(NS_ATTRIBUTE_CHANGED_DW0));
    assert_eq!(changed_list(&mut a), vec![2]);
    assert_eq!(active(&mut a), vec![1]);
    assert_eq!(identify_ns(&mut a, 2).0, 0);
    assert!(!q.conn.is_closing() && !a.conn.is_closing());
    q.advance(CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1));
    assert!(
        held.upgrade().is_some(),
        "the idle queue has not looked yet"
    );
    idle.advance(CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1));
    assert!(
        held.upgrade().is_none(),
        "once the queues have looked, nothing holds the removed namespace"
    );

    // Added back: new, empty, a higher index, another NGUID.
    reload(&reg, &tenants, &after).expect("added again");
    let again = reg.subsystems()[SUBNQN].namespaces.get(2).unwrap();
    assert!(again.index > old_index, "indices are not reused");
    assert_eq!(q.read_ns(2, 8, 8), (Status::SUCCESS, vec![0; 4096]));
    assert_ne!(identify_ns(&mut a, 2).1, nguid);

    // Refused whole: a kept namespace changed (and an added host with it).
    let mut changed = after.clone();
    changed.subsystems[0].namespaces[1] = NamespaceConfig::ram(2, 2 << 20).with_block_size(512);
    changed.subsystems[0].hosts.push(OTHER.into());
    match reload(&reg, &tenants, &changed) {
        Err(ReloadError::NeedsRestart { what }) => {
            assert!(what.contains("namespace 2"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(refused(&admin_as(&reg, OTHER).1), "the host list stays");
    // Refused whole: an added namespace that cannot be opened.
    let mut bad = after.clone();
    bad.subsystems[0]
        .namespaces
        .push(NamespaceConfig::file(3, "/nonexistent/sluice-reload-test"));
    bad.subsystems[0].hosts.push(OTHER.into());
    match reload(&reg, &tenants, &bad) {
        Err(ReloadError::Add(why)) => assert!(why.contains("nsid 3") || why.contains('3'), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(active(&mut a), vec![1, 2]);
    assert!(refused(&admin_as(&reg, OTHER).1), "the host list stays");
    assert_eq!(reg.reloads.counts(), (4, 2));
}

/// A temporary file, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        let p =
            std::env::temp_dir().join(format!("sluice-reload-{tag}-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A reload grows a `file` namespace of a kept subsystem: extended to a
/// raised `size` (a created file), or found grown underneath (as
/// `truncate -s` leaves it). The live queue's next command reaches the new
/// blocks while the data below stays, the host is told (Namespace
/// Attribute Changed naming it) and Identify reports the new size. A
/// smaller `size`, and a RAM namespace's new size, refuse the whole file.
#[test]
fn reload_grows_file_namespaces() {
    let img = TempFile::new("grow");
    let file_ns = |size: u64| {
        NamespaceConfig::file(1, &img.0)
            .with_create(true)
            .with_block_size(512)
            .with_size(size)
    };
    let before = config_in("immediate", file_ns(1 << 20));
    let Watched {
        reg,
        tenants,
        mut a,
        mut q,
        ..
    } = watched(&before);
    let low = pattern(4096, 3);
    assert_eq!(q.write_ns(1, 8, &low, 8192), Status::SUCCESS);
    assert_eq!(q.write_ns(1, 2048, &low, 8192), Status::LBA_OUT_OF_RANGE);
    assert_eq!(identify_ns(&mut a, 1).0, 2048);
    // A reload that changes nothing grows nothing.
    assert_eq!(reload(&reg, &tenants, &before), Ok(ReloadReport::default()));

    // A raised `size`: the file is extended, the namespace takes it in.
    let after = config_in("immediate", file_ns(2 << 20));
    let report = reload(&reg, &tenants, &after).expect("a created file may grow");
    assert_eq!(
        report.namespaces_grown,
        vec![NamespaceGrowth {
            nqn: SUBNQN.into(),
            nsid: 1,
            size_bytes_before: 1 << 20,
            size_bytes: 2 << 20,
        }]
    );
    assert_eq!(std::fs::metadata(&img.0).unwrap().len(), 2 << 20);
    let high = pattern(4096, 9);
    assert_eq!(q.write_ns(1, 2048, &high, 8192), Status::SUCCESS);
    assert_eq!(q.read_ns(1, 2048, 8), (Status::SUCCESS, high.clone()));
    assert_eq!(q.read_ns(1, 8, 8), (Status::SUCCESS, low.clone()));
    assert_eq!(aer_after_check(&mut a, 900), Some(NS_ATTRIBUTE_CHANGED_DW0));
    assert_eq!(changed_list(&mut a), vec![1]);
    assert_eq!(identify_ns(&mut a, 1).0, 4096);

    // Grown underneath, by a part block too: whole blocks, at the next reload.
    a.post_aer(901);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&img.0)
        .unwrap();
    f.set_len((3 << 20) + 100).unwrap();
    assert_eq!(
        q.write_ns(1, 4096, &high, 8192),
        Status::LBA_OUT_OF_RANGE,
        "not before a reload"
    );
    assert_eq!(
        aer_after_check(&mut a, 901),
        None,
        "nothing told before a reload"
    );
    let report = reload(&reg, &tenants, &after).expect("the same file");
    assert_eq!(
        report
            .namespaces_grown
            .iter()
            .map(|g| (g.size_bytes_before, g.size_bytes))
            .collect::<Vec<_>>(),
        vec![(2 << 20, 3 << 20)]
    );
    assert_eq!(
        q.write_ns(1, 6143, &high[..512], 8192),
        Status::SUCCESS,
        "the last block"
    );
    assert_eq!(
        q.write_ns(1, 6144, &high[..512], 8192),
        Status::LBA_OUT_OF_RANGE,
        "not the part block"
    );
    assert_eq!(aer_after_check(&mut a, 901), Some(NS_ATTRIBUTE_CHANGED_DW0));
    assert_eq!(changed_list(&mut a), vec![1]);
    assert_eq!(identify_ns(&mut a, 1).0, 6144);

    // Shrunk underneath: the namespace keeps its size; no event.
    a.post_aer(902);
    f.set_len(3 << 20).unwrap();
    assert_eq!(reload(&reg, &tenants, &after), Ok(ReloadReport::default()));
    assert_eq!(aer_after_check(&mut a, 902), None);
    assert_eq!(identify_ns(&mut a, 1).0, 6144);

    // Refused whole: a smaller `size`, and a RAM namespace's new size.
    match reload(&reg, &tenants, &before) {
        Err(ReloadError::NeedsRestart { what }) => {
            assert!(
                what.contains("namespace 1") && what.contains("never shrinks"),
                "{what}"
            );
        }
        other => panic!("{other:?}"),
    }
    let ram = config_in("immediate", default_ns());
    let ram_reg = registry(&ram);
    let ram_tenants = TenantRuntime::new(&ram, &ram_reg);
    let mut bigger = ram.clone();
    let size = bigger.subsystems[0].namespaces[0].size_bytes.unwrap();
    bigger.subsystems[0].namespaces[0].size_bytes = Some(size * 2);
    match reload(&ram_reg, &ram_tenants, &bigger) {
        Err(ReloadError::NeedsRestart { what }) => {
            assert!(
                what.contains("namespace 1's `size`") && what.contains("create = true"),
                "{what}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(identify_ns(&mut a, 1).0, 6144);
    assert!(!q.conn.is_closing() && !a.conn.is_closing());
}

/// A block device grown underneath (a loop device whose file grew, told
/// by `losetup -c`, as an `lvextend` leaves an LV) grows its namespace at
/// the next reload. Runs where this runs as root with `losetup` (as the
/// test suite does), and says so when it cannot.
#[test]
fn reload_grows_a_namespace_on_a_grown_block_device() {
    let img = TempFile::new("grow-dev");
    std::fs::write(&img.0, vec![0u8; 1 << 20]).unwrap();
    let attach = std::process::Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&img.0)
        .output();
    let dev = match attach {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        other => {
            eprintln!("skipping the block device case: losetup failed: {other:?}");
            return;
        }
    };
    let detach = || {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &dev])
            .status();
    };
    let config = config_in(
        "immediate",
        NamespaceConfig::file(1, std::path::Path::new(&dev)).with_block_size(512),
    );
    let reg = registry(&config);
    let tenants = TenantRuntime::new(&config, &reg);
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    assert_eq!(identify_ns(&mut a, 1).0, 2048);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img.0)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let refreshed = std::process::Command::new("losetup")
        .args(["-c", &dev])
        .status();
    let report = reload(&reg, &tenants, &config);
    let data = pattern(4096, 4);
    let wrote = q.write_ns(1, 4088, &data, 8192);
    let read = q.read_ns(1, 4088, 8);
    // A raised `size` with `create = true` on a device (whose size is the
    // device's) refuses the whole file, naming the namespace and the key.
    let created = |bytes: u64| {
        config_in(
            "immediate",
            NamespaceConfig::file(1, std::path::Path::new(&dev))
                .with_block_size(512)
                .with_create(true)
                .with_size(bytes),
        )
    };
    let dev_reg = registry(&created(1 << 20));
    let dev_tenants = TenantRuntime::new(&created(1 << 20), &dev_reg);
    let raised = reload(&dev_reg, &dev_tenants, &created(8 << 20));
    let dev_size = dev_reg.subsystems()[SUBNQN]
        .namespaces
        .get(1)
        .unwrap()
        .size_bytes();
    drop((q, a, tenants, reg, dev_tenants, dev_reg));
    detach();
    match raised {
        Err(ReloadError::Grow(why)) => assert!(
            why.contains("namespace 1") && why.contains("`size`") && why.contains("device"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(dev_size, 2 << 20, "the device's size, unchanged");
    assert!(refreshed.is_ok_and(|s| s.success()), "losetup -c");
    let report = report.expect("the same file");
    assert_eq!(
        report
            .namespaces_grown
            .iter()
            .map(|g| (g.nsid, g.size_bytes))
            .collect::<Vec<_>>(),
        vec![(1, 2 << 20)]
    );
    assert_eq!(wrote, Status::SUCCESS);
    assert_eq!(read, (Status::SUCCESS, data));
}

/// The discovery log (header and entries, without RAE): its generation
/// counter and the subsystem NQNs it lists.
fn discovery_log(d: &mut Pair) -> (u64, Vec<String>) {
    let numd = 4 * 1024 / 4 - 1;
    let (c, data) = d.admin_cmd(
        admin::GET_LOG_PAGE,
        0,
        u32::from(sluice_proto::log::lid::DISCOVERY) | numd << 16,
        0,
        4 * 1024,
    );
    assert!(c.status().is_success());
    let h = sluice_proto::log::decode_discovery_header(&data).unwrap();
    let entries = sluice_proto::log::decode_discovery_entries(&data[1024..], h.numrec.min(3));
    (h.genctr, entries.into_iter().map(|e| e.subnqn).collect())
}

/// A discovery controller that enabled Discovery Log Page Change notices
/// gets one when a reload changes what the log lists for its host (at its
/// next check): none for a subsystem added for another host, one when a
/// reload adds its host to it, none for a reload that changes nothing, and
/// the next only once it has read the log: then a removal is told too.
#[test]
fn a_discovery_controller_is_told_when_a_reload_changes_the_log() {
    let before = config_in("immediate", default_ns());
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let mut d = Pair::new(reg.clone());
    d.icreq(false, false);
    let c = d.connect_to(sluice_proto::DISCOVERY_NQN, 0, CNTLID_DYNAMIC, 0);
    assert!(c.status().is_success());
    assert_eq!(d.prop_set(prop::CC, u64::from(cc::EN)), Status::SUCCESS);
    let id = IdentifyController::decode(&d.identify(1, 0).1).unwrap();
    assert_eq!(
        id.oaes, AEN_DISCOVERY_CHANGE,
        "OAES: Discovery Log Page Change"
    );
    let (c, _) = d.admin_cmd(admin::SET_FEATURES, 0, 0x0b, AEN_DISCOVERY_CHANGE, 0);
    assert!(c.status().is_success());
    let (genctr, listed) = discovery_log(&mut d);
    assert!(!listed.iter().any(|n| n == ADDED));
    d.post_aer(700);
    assert_eq!(aer_after_check(&mut d, 700), None, "nothing changed yet");

    // Added for another host: this host's log is the same.
    let mut others = before.clone();
    others.subsystems.push(added_subsystem());
    reload(&reg, &tenants, &others).unwrap();
    assert!(reg.genctr() > genctr);
    assert_eq!(
        aer_after_check(&mut d, 700),
        None,
        "not listed for this host"
    );
    // Its host added to the subsystem's list: listed now.
    let mut after = others.clone();
    after.subsystems[1].hosts.push(HOSTNQN.into());
    reload(&reg, &tenants, &after).unwrap();
    assert_eq!(aer_after_check(&mut d, 700), Some(DISCOVERY_CHANGE_DW0));
    d.post_aer(701);
    // Masked until the log is read: another change sends nothing.
    reload(&reg, &tenants, &before).unwrap();
    assert_eq!(aer_after_check(&mut d, 701), None, "masked");
    reload(&reg, &tenants, &after).unwrap();
    let (now, listed) = discovery_log(&mut d);
    assert!(now > genctr);
    assert!(listed.iter().any(|n| n == ADDED), "{listed:?}");
    assert_eq!(aer_after_check(&mut d, 701), None, "the host read it all");
    assert_eq!(reload(&reg, &tenants, &after), Ok(ReloadReport::default()));
    assert_eq!(
        aer_after_check(&mut d, 701),
        None,
        "a reload that changes nothing"
    );
    reload(&reg, &tenants, &before).unwrap();
    assert_eq!(
        aer_after_check(&mut d, 701),
        Some(DISCOVERY_CHANGE_DW0),
        "removed"
    );
}

/// A subsystem whose backend cannot be opened refuses the whole file:
/// nothing of it applies (not the other subsystem's host list either),
/// and no namespace index is used up.
#[test]
fn a_subsystem_that_cannot_be_built_refuses_the_whole_file() {
    let before = config_in("immediate", default_ns());
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let mut bad = before.clone();
    bad.subsystems[0].hosts.push(OTHER.into());
    bad.subsystems.push(
        SubsystemConfig::new(ADDED)
            .with_host(OTHER)
            .with_namespace(NamespaceConfig::file(1, "/nonexistent/sluice-reload-test")),
    );
    match reload(&reg, &tenants, &bad) {
        Err(ReloadError::Add(why)) => assert!(why.contains(ADDED), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!reg.subsystems().contains_key(ADDED));
    assert!(refused(&admin_as(&reg, OTHER).1), "the host list stays");
    let mut good = before.clone();
    good.subsystems.push(added_subsystem());
    reload(&reg, &tenants, &good).expect("the file mended");
    let kept = reg.subsystems()[SUBNQN].namespaces.get(1).unwrap().index;
    assert_eq!(
        reg.subsystems()[ADDED].namespaces.get(1).unwrap().index,
        kept + 1
    );
    assert_eq!(reg.reloads.counts(), (1, 1));
}

#[test]
fn reload_admits_added_hosts_and_fails_the_controllers_of_removed_ones() {
    let before = config_in("immediate", default_ns());
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    let data = pattern(4096, 5);
    assert_eq!(q.write(8, &data, 8192), Status::SUCCESS);
    assert!(refused(&admin_as(&reg, OTHER).1), "not listed yet");
    let genctr = reg.genctr();

    let mut after = before.clone();
    after.subsystems[0].hosts = vec![OTHER.into()];
    let report = reload(&reg, &tenants, &after).expect("only access changed");
    assert_eq!(report.tenants, Vec::<String>::new());
    assert_eq!(
        report.access,
        vec![AccessChange {
            nqn: SUBNQN.into(),
            hosts_added: vec![OTHER.into()],
            hosts_removed: vec![HOSTNQN.into()],
            allow_any_host: None,
            auth_changed: false,
            controllers_failed: vec![(cntlid, HOSTNQN.into())],
        }]
    );
    assert!(reg.genctr() > genctr, "discovery log pages change");

    // The removed host's queues close at their next check; it is refused
    // from now on.
    assert!(!a.conn.is_closing() && !q.conn.is_closing());
    let step = CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1);
    a.advance(step);
    q.advance(step);
    assert!(a.conn.is_closing(), "admin queue of the removed host");
    assert!(q.conn.is_closing(), "I/O queue of the removed host");
    assert!(refused(&admin_as(&reg, HOSTNQN).1));

    // The added host connects and reads what the removed one wrote.
    let (mut b, c) = admin_as(&reg, OTHER);
    assert!(c.status().is_success(), "{:?}", c.status());
    let b_id = u16::try_from(c.result).unwrap();
    let en = cc::EN | 6 << cc::IOSQES_SHIFT | 4 << cc::IOCQES_SHIFT;
    assert_eq!(b.prop_set(prop::CC, u64::from(en)), Status::SUCCESS);
    let mut bq = Pair::new(reg.clone());
    bq.icreq(false, false);
    assert!(bq.connect_as(SUBNQN, OTHER, 1, b_id).status().is_success());
    assert_eq!(bq.read(8, 8), (Status::SUCCESS, data));

    // Anything beyond access: refused whole, access unchanged.
    let mut restart = after.clone();
    restart.subsystems[0].hosts = vec![HOSTNQN.into()];
    restart.target.queue_depth_max -= 1;
    match reload(&reg, &tenants, &restart) {
        Err(ReloadError::NeedsRestart { what }) => assert_eq!(what, "`[target]`"),
        other => panic!("{other:?}"),
    }
    assert!(
        refused(&admin_as(&reg, HOSTNQN).1),
        "nothing of the refused file applied"
    );
    assert!(admin_as(&reg, OTHER).1.status().is_success());
    // The same file again changes nothing.
    assert_eq!(reload(&reg, &tenants, &after), Ok(ReloadReport::default()));
    b.advance(step);
    assert!(!b.conn.is_closing() && !bq.conn.is_closing());
    // `sluice_target_config_reloads_total`: two applied, one refused.
    assert_eq!(reg.reloads.counts(), (2, 1));
}

/// Turning `allow_any_host` off fails the controllers of unlisted hosts and
/// keeps the listed ones'.
#[test]
fn closing_an_open_subsystem_keeps_only_listed_hosts() {
    let mut open = config_in("immediate", default_ns());
    open.subsystems[0].allow_any_host = true;
    let reg = registry(&open);
    let tenants = TenantRuntime::new(&open, &reg);
    let (mut listed, _) = admin_pair(&reg);
    let (mut stranger, c) = admin_as(&reg, OTHER);
    assert!(c.status().is_success(), "open subsystem admits anyone");
    let mut closed = open.clone();
    closed.subsystems[0].allow_any_host = false;
    let changes = reload(&reg, &tenants, &closed).unwrap().access;
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].allow_any_host, Some(false));
    assert_eq!(changes[0].controllers_failed.len(), 1);
    assert_eq!(changes[0].controllers_failed[0].1, OTHER);
    let step = CONTROLLER_CHECK_INTERVAL + Duration::from_millis(1);
    listed.advance(step);
    stranger.advance(step);
    assert!(stranger.conn.is_closing());
    assert!(!listed.conn.is_closing());
    assert!(refused(&admin_as(&reg, OTHER).1));
}

/// Tenants: one created with the host added beside it, then the host moved
/// to another tenant and a limit changed, in one file each; a file that
/// removes a tenant is refused, and its host list with it.
#[test]
fn reload_creates_and_replaces_tenants() {
    use sluice_config::tenants::{RateSpec, TenantSpec, TenantsConfig};
    let mut before = config_in("immediate", default_ns());
    before.tenants = TenantsConfig::fair();
    before.tenants.tenants.push(TenantSpec {
        hosts: vec![HOSTNQN.into()],
        ..TenantSpec::new("silver")
    });
    let before = before.validated().unwrap();
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let of = |h: &str| {
        let t = tenants.table();
        let id = t.tenant_of(Some(h));
        t.spec(id).map(|s| s.name.clone()).unwrap()
    };
    assert_eq!(
        (of(HOSTNQN), of(OTHER)),
        ("silver".into(), "default".into())
    );

    let mut gold = before.clone();
    gold.subsystems[0].hosts.push(OTHER.into());
    gold.tenants.tenants.push(TenantSpec {
        hosts: vec![OTHER.into()],
        limit: RateSpec {
            iops: Some(1000),
            ..RateSpec::default()
        },
        ..TenantSpec::new("gold")
    });
    let gold = gold.validated().unwrap();
    let generation = tenants.generation();
    let report = reload(&reg, &tenants, &gold).unwrap();
    assert_eq!(report.tenants, vec!["gold".to_string()]);
    assert_eq!(report.access.len(), 1);
    assert_eq!(of(OTHER), "gold");
    assert!(
        tenants.generation() > generation,
        "workers pick the new table up"
    );
    assert!(admin_as(&reg, OTHER).1.status().is_success());

    // The first host moves from silver to gold (checked as one table: it
    // is never in both), and gold's limit goes.
    let mut moved = gold.clone();
    moved.tenants.tenants[0].hosts.clear();
    moved.tenants.tenants[1].hosts.push(HOSTNQN.into());
    moved.tenants.tenants[1].limit = RateSpec::default();
    let moved = moved.validated().unwrap();
    let report = reload(&reg, &tenants, &moved).unwrap();
    assert_eq!(
        report.tenants,
        vec!["silver".to_string(), "gold".to_string()]
    );
    assert!(report.access.is_empty());
    assert_eq!((of(HOSTNQN), of(OTHER)), ("gold".into(), "gold".into()));
    let t = tenants.table();
    let g = t.spec(t.id("gold").unwrap()).unwrap();
    assert_eq!(g.limit, RateSpec::default());

    // Removing a tenant deletes it: its hosts belong to the default tenant
    // from then on, and the access change of the same file applies.
    let gold_id = tenants.table().id("gold").unwrap();
    let mut removed = moved.clone();
    removed.tenants.tenants.remove(1);
    removed.subsystems[0].hosts.retain(|h| h != OTHER);
    let removed = removed.validated().unwrap();
    let report = reload(&reg, &tenants, &removed).unwrap();
    assert_eq!(report.tenants_removed, vec!["gold".to_string()]);
    assert_eq!(report.tenants, Vec::<String>::new());
    assert_eq!(report.access.len(), 1);
    assert_eq!(
        (of(HOSTNQN), of(OTHER)),
        ("default".into(), "default".into())
    );
    let t = tenants.table();
    assert_eq!((t.id("gold"), t.spec(gold_id)), (None, None));
    assert!(!tenants.tenants_json().contains("gold"));
    assert!(refused(&admin_as(&reg, OTHER).1));
    // The same file again changes nothing; gold listed again is a new
    // tenant (a new id: the old one's counters stay with it).
    assert!(reload(&reg, &tenants, &removed).unwrap().is_empty());
    let report = reload(&reg, &tenants, &moved).unwrap();
    assert_eq!(report.tenants, vec!["gold".to_string()]);
    let t = tenants.table();
    assert_ne!(t.id("gold"), Some(gold_id));
    assert_eq!(of(HOSTNQN), "gold");
}

/// A `default` entry removed from the file reverts to the implicit default
/// tenant (no limit), in the same slot; a tenant with a `charge_cgroup`
/// cannot be removed without a restart.
#[test]
fn removing_the_default_entry_restores_the_implicit_default() {
    use sluice_config::tenants::{RateSpec, TenantSpec, TenantsConfig};
    let mut before = config_in("immediate", default_ns());
    before.tenants = TenantsConfig::fair();
    before.tenants.tenants.push(TenantSpec {
        limit: RateSpec {
            iops: Some(500),
            ..RateSpec::default()
        },
        ..TenantSpec::new("default")
    });
    let before = before.validated().unwrap();
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    let id = tenants.table().id("default").unwrap();
    let mut after = before.clone();
    after.tenants.tenants.clear();
    let after = after.validated().unwrap();
    let report = reload(&reg, &tenants, &after).unwrap();
    assert_eq!(report.tenants_removed, vec!["default".to_string()]);
    let t = tenants.table();
    assert_eq!(t.id("default"), Some(id));
    assert_eq!(t.tenant_of(Some(HOSTNQN)), id);
    assert_eq!(t.spec(id).unwrap().limit, RateSpec::default());

    let mut charged = before.clone();
    charged.tenants.tenants.push(TenantSpec {
        charge_cgroup: Some("sluice-test".into()),
        ..TenantSpec::new("cg")
    });
    let reg = registry(&charged);
    let tenants = TenantRuntime::new(&charged, &reg);
    match reload(&reg, &tenants, &before) {
        Err(ReloadError::NeedsRestart { what }) => {
            assert!(
                what.contains("`cg` (removed, with a `charge_cgroup`)"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(tenants.table().id("cg").is_some());
}

/// A file whose tenants no longer fit the table the admin API changed
/// (the API put a host in one tenant, the file puts it in another) is
/// refused with the tenants' error, and its access changes do not apply.
#[test]
fn tenants_that_clash_with_the_api_refuse_the_whole_file() {
    use sluice_config::tenants::{TenantSpec, TenantsConfig};
    let mut before = config_in("immediate", default_ns());
    before.tenants = TenantsConfig::fair();
    let before = before.validated().unwrap();
    let reg = registry(&before);
    let tenants = TenantRuntime::new(&before, &reg);
    tenants
        .update_json("api", &format!(r#"{{"hosts": ["{OTHER}"]}}"#))
        .unwrap();
    let mut clash = before.clone();
    clash.subsystems[0].hosts.push(OTHER.into());
    clash.tenants.tenants.push(TenantSpec {
        hosts: vec![OTHER.into()],
        ..TenantSpec::new("file")
    });
    let clash = clash.validated().unwrap();
    match reload(&reg, &tenants, &clash) {
        Err(ReloadError::Tenants(why)) => assert!(why.contains(OTHER), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(
        refused(&admin_as(&reg, OTHER).1),
        "the host list did not apply"
    );
    let t = tenants.table();
    assert_eq!(t.id("file"), None);
    assert_eq!(reg.reloads.counts(), (0, 1));
}

/// Reservations belong to the namespace: a reload that keeps it keeps
/// them (the live queue's writes stay refused), one that removes it takes
/// them along, and the namespace added back under the same NSID starts
/// with none.
#[test]
fn reload_keeps_a_kept_namespaces_reservations() {
    use sluice_proto::reservation::{
        AcquireAction, AcquireCommand, Cptpl, RegisterAction, RegisterCommand, ReservationType,
    };
    let mut before = config_in("immediate", default_ns());
    before.subsystems[0]
        .namespaces
        .push(NamespaceConfig::ram(2, 1 << 20).with_block_size(512));
    let Watched {
        reg,
        tenants,
        mut q,
        ..
    } = watched(&before);
    // Another host holds Exclusive Access on namespace 1.
    let other = [9u8; 16];
    let ns1 = reg.subsystems()[SUBNQN].namespaces.get(1).unwrap();
    let register = RegisterCommand {
        action: RegisterAction::Register,
        ignore_existing_key: false,
        cptpl: Cptpl::NoChange,
    };
    ns1.reservations.register(&other, register, 0, 5).unwrap();
    let acquire = AcquireCommand {
        action: AcquireAction::Acquire,
        ignore_existing_key: false,
        rtype: ReservationType::ExclusiveAccess,
    };
    ns1.reservations.acquire(&other, acquire, 5, 0).unwrap();
    let data = pattern(4096, 4);
    assert_eq!(q.write_ns(1, 8, &data, 8192), Status::RESERVATION_CONFLICT);

    // Kept (namespace 2 removed meanwhile): still held, still refused.
    let mut kept = before.clone();
    kept.subsystems[0].namespaces.truncate(1);
    let report = reload(&reg, &tenants, &kept).expect("namespace 2 may go");
    assert_eq!(report.namespaces_removed, vec![(SUBNQN.to_string(), 2)]);
    assert_eq!(q.write_ns(1, 8, &data, 8192), Status::RESERVATION_CONFLICT);
    let ns1_now = reg.subsystems()[SUBNQN].namespaces.get(1).unwrap();
    assert_eq!(ns1_now.reservations.summary(), (2, 1));

    // Removed, then added back: a new namespace, no reservation.
    let mut none = kept.clone();
    none.subsystems[0].namespaces[0] = NamespaceConfig::ram(3, 1 << 20).with_block_size(512);
    reload(&reg, &tenants, &none).expect("namespace 1 may go");
    reload(&reg, &tenants, &kept).expect("namespace 1 may come back");
    assert_eq!(q.write_ns(1, 8, &data, 8192), Status::SUCCESS);
    let back = reg.subsystems()[SUBNQN].namespaces.get(1).unwrap();
    assert_eq!(back.reservations.summary(), (0, 0));
}
