//! SQE field parsers (Get Log Page, Connect, Property Get/Set, Fence and
//! the chain epoch of a write) on arbitrary
//! 64-byte submission queue entries: never panic, and parse/build/parse is
//! stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_proto::fabrics::{fctype, ConnectCommand, PropertyCommand};
use sluice_proto::fence::{self, Fence, FENCE_GRANULES_MAX};
use sluice_proto::log::GetLogPage;
use sluice_proto::Sqe;

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; 64];
    let n = data.len().min(64);
    raw[..n].copy_from_slice(&data[..n]);
    let sqe = Sqe(raw);

    let g = GetLogPage::parse(&sqe);
    assert!(g.len_bytes >= 4 && g.len_bytes % 4 == 0);
    assert_eq!(GetLogPage::parse(&g.to_sqe(sqe.cid(), sqe.nsid())), g);

    let c = ConnectCommand::parse(&sqe);
    assert_eq!(ConnectCommand::parse(&c.to_sqe()), c);

    let p = PropertyCommand::parse(&sqe);
    let _ = PropertyCommand::attrib_valid(&sqe);
    assert_eq!(
        PropertyCommand::parse(&p.to_sqe(sqe.cid(), fctype::PROPERTY_SET)),
        p
    );
    match Fence::parse(&sqe) {
        Ok(f) => {
            assert!(f.granules >= 1 && f.granules <= FENCE_GRANULES_MAX);
            assert_eq!(Fence::parse(&f.to_sqe()), Ok(f));
        }
        Err(st) => assert_eq!(st, sluice_proto::Status::INVALID_FIELD),
    }
    let mut w = sqe;
    let e = fence::io_epoch(&sqe);
    fence::set_io_epoch(&mut w, e);
    assert_eq!(w, sqe);
    let _ = format!("{sqe:?} {g:?} {c:?} {p:?}");
});
