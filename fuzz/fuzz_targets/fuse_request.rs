//! The FUSE session's request decoder and the file's rules on arbitrary
//! bytes, as `/dev/fuse` delivers them (one message) and as the io_uring
//! transport does (header, fixed argument and payload apart). Nothing
//! panics; every decoded request gets an outcome, and I/O never reaches
//! past the end of the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_export::fuse::abi::{fixed_arg_bytes, InHeader, Request, IN_HEADER_BYTES};
use sluice_export::fuse::ops::{BlockIo, FileRules, Outcome};

const SIZE: u64 = 64 << 20;

fn check(rules: &FileRules, nodeid: u64, r: &Request<'_>) {
    if let Outcome::Io(io) = rules.handle(nodeid, r) {
        match io {
            BlockIo::Read { offset, len } => assert!(offset + len as u64 <= SIZE),
            BlockIo::Write { offset, data, .. } => {
                assert!(!rules.read_only && offset + data.len() as u64 <= SIZE)
            }
            BlockIo::Zero { offset, len } => assert!(!rules.read_only && offset + len <= SIZE),
            BlockIo::Flush => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let rules = FileRules {
        file_name: "disk.img".into(),
        read_only: flags & 1 == 1,
        size_source: std::sync::Arc::new(|| SIZE),
        block_size_bytes: 4096,
        uid: 0,
        gid: 0,
        time_s: 0,
    };
    // As one /dev/fuse message.
    if let Ok((h, r)) = Request::parse_message(rest) {
        check(&rules, h.nodeid, &r);
    }
    // As the ring delivers it: the header, then the fixed argument, then
    // the payload.
    if let Ok(h) = InHeader::parse(rest) {
        let body = &rest[IN_HEADER_BYTES..];
        let fixed = fixed_arg_bytes(h.opcode).min(body.len());
        let (arg, payload) = body.split_at(fixed);
        if let Ok(r) = Request::parse(h.opcode, arg, payload) {
            check(&rules, h.nodeid, &r);
        }
    }
});
