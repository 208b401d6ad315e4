//! A configuration reload replaces who a subsystem admits while the target
//! runs: a host added connects; a host removed is refused at its next
//! Connect and its live controller is failed, its queues closing at their
//! next check; data it wrote stays; a file that changes anything beyond
//! access is refused whole and leaves the access as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use sluice_proto::fabrics::{cc, prop, CNTLID_DYNAMIC};
use sluice_proto::Status;
use sluice_target::queue::CONTROLLER_CHECK_INTERVAL;
use sluice_target::reload::{AccessChange, ReloadError};
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
fn admin_as(
    reg: &Arc<sluice_target::registry::Registry>,
    hostnqn: &str,
) -> (Pair, sluice_proto::command::Cqe) {
    let mut p = Pair::new(reg.clone());
    p.icreq(false, false);
    let c = p.connect_as(SUBNQN, hostnqn, 0, CNTLID_DYNAMIC);
    (p, c)
}

#[test]
fn reload_admits_added_hosts_and_fails_the_controllers_of_removed_ones() {
    let before = config_in("immediate", default_ns());
    let reg = registry(&before);
    let (mut a, cntlid) = admin_pair(&reg);
    let mut q = io_pair(&reg, cntlid, false, false);
    let data = pattern(4096, 5);
    assert_eq!(q.write(8, &data, 8192), Status::SUCCESS);
    assert!(refused(&admin_as(&reg, OTHER).1), "not listed yet");
    let genctr = reg.genctr();

    let mut after = before.clone();
    after.subsystems[0].hosts = vec![OTHER.into()];
    let changes = reg.reload_access(&after).expect("only access changed");
    assert_eq!(
        changes,
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
    match reg.reload_access(&restart) {
        Err(ReloadError::NeedsRestart { what }) => assert_eq!(what, "`[target]`"),
        other => panic!("{other:?}"),
    }
    assert!(
        refused(&admin_as(&reg, HOSTNQN).1),
        "nothing of the refused file applied"
    );
    assert!(admin_as(&reg, OTHER).1.status().is_success());
    // The same file again changes nothing.
    assert_eq!(reg.reload_access(&after), Ok(vec![]));
    b.advance(step);
    assert!(!b.conn.is_closing() && !bq.conn.is_closing());
}

/// Turning `allow_any_host` off fails the controllers of unlisted hosts and
/// keeps the listed ones'.
#[test]
fn closing_an_open_subsystem_keeps_only_listed_hosts() {
    let mut open = config_in("immediate", default_ns());
    open.subsystems[0].allow_any_host = true;
    let reg = registry(&open);
    let (mut listed, _) = admin_pair(&reg);
    let (mut stranger, c) = admin_as(&reg, OTHER);
    assert!(c.status().is_success(), "open subsystem admits anyone");
    let mut closed = open.clone();
    closed.subsystems[0].allow_any_host = false;
    let changes = reg.reload_access(&closed).unwrap();
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
