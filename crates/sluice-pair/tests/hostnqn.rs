//! Hosts that give no identity (an empty HOSTNQN, an all-zero HOSTID, as
//! SPDK's perf sends with its default transport ID) and the log line every
//! refused Connect leaves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sluice_config::tenants::DEFAULT_TENANT;
use sluice_host::HostError;
use sluice_pair::*;
use sluice_proto::fabrics::{connect_data_offset, connect_invalid_param_result, CNTLID_DYNAMIC};
use sluice_proto::send::SendConfig;
use sluice_proto::Status;
use sluice_target::metrics::ANONYMOUS_HOST;
use sluice_target::tenant::TenantRuntime;

fn anonymous(open: bool) -> Params {
    Params {
        hostnqn: String::new(),
        hostid: [0; 16],
        open_subsystem: open,
        ..Params::default()
    }
}

/// The status and result a refused Connect answered with.
fn refusal<T: std::fmt::Debug>(r: Result<T, HostError>) -> (Status, u32) {
    match r {
        Err(HostError::Nvme { status, result, .. }) => (status, result),
        other => panic!("expected an NVMe status, got {other:?}"),
    }
}

#[test]
fn empty_hostnqn_on_an_open_subsystem_reads_back_under_the_default_tenant() {
    let p = anonymous(true);
    // Admin and I/O Connect with an empty NQN and a zero HOSTID.
    let mut pair = Pair::new(p.clone());
    let data = pattern(8192, 7);
    pair.write(8, &data).expect("write");
    assert_eq!(pair.read(8, data.len()).expect("read"), data);

    assert_eq!(pair.link(IO).target.hostnqn(), Some(""));
    let hosts = pair.reg.hosts.snapshot();
    let (_, anon) = hosts
        .iter()
        .find(|(h, _)| h == ANONYMOUS_HOST)
        .unwrap_or_else(|| panic!("no {ANONYMOUS_HOST} counters in {hosts:?}"));
    assert_eq!((anon.write_commands, anon.read_commands), (1, 1));
    assert_eq!(anon.write_bytes, 8192);
    assert!(hosts.iter().all(|(h, _)| !h.is_empty()), "{hosts:?}");

    let tenants = TenantRuntime::new(&config(&p), &pair.reg);
    let table = tenants.table();
    assert_eq!(
        table.tenant_of(pair.link(IO).target.hostnqn()),
        table.id(DEFAULT_TENANT).expect("default tenant")
    );
}

#[test]
fn empty_hostnqn_on_an_allow_list_is_connect_invalid_host() {
    let mut pair = Pair::unconnected(anonymous(false));
    pair.open_link(0, 32, SendConfig::default());
    let (st, result) = refusal(pair.connect(ADMIN, 0, 31, 0, CNTLID_DYNAMIC));
    assert_eq!((st.sct, st.sc), (0x1, 0x84), "{st}");
    assert_eq!(st, Status::CONNECT_INVALID_HOST);
    // IATTR = 1 (in the data), IPO = the HOSTNQN field, as nvmet answers.
    assert_eq!(
        result,
        connect_invalid_param_result(true, connect_data_offset::HOSTNQN)
    );
    assert!(pair.reg.hosts.snapshot().is_empty(), "nothing accounted");
}

#[test]
fn io_connect_must_repeat_the_admin_queues_empty_nqn_and_zero_hostid() {
    let p = anonymous(true);
    let mut pair = Pair::unconnected(p.clone());
    pair.connect_admin();
    let cntlid = pair.cntlid;
    let l = pair.open_link(1, p.depth, SendConfig::default());
    // A named host joining the anonymous host's controller: refused.
    let (st, result) = refusal(pair.connect_as(l, 1, p.depth - 1, 0, cntlid, [0; 16], HOSTNQN));
    assert_eq!(st, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(
        result,
        connect_invalid_param_result(true, connect_data_offset::HOSTNQN)
    );
    // The same (empty, zero) identity joins.
    pair.connect_as(l, 1, p.depth - 1, 0, cntlid, [0; 16], "")
        .expect("I/O Connect with the admin queue's identity");
    // Another HOSTID with the same (empty) NQN joins too: nvmet and SPDK
    // never compare HOSTIDs (tolerated, logged once).
    let l2 = pair.open_link(2, p.depth, SendConfig::default());
    pair.connect_as(l2, 2, p.depth - 1, 0, cntlid, [1; 16], "")
        .expect("I/O Connect with another HOSTID");
}
