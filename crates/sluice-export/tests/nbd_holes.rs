//! Reads of a device that knows its holes (as an elastic volume knows its
//! unallocated extents), over structured replies: holes go as
//! NBD_REPLY_TYPE_OFFSET_HOLE chunks and carry no zeros, data as
//! OFFSET_DATA chunks, the chunks tile the request in order, and the last
//! is a final NONE chunk. Without structured replies, or on a device with
//! no holes, a read is one reply with every byte.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

mod common;

use common::Client;
use sluice_export::errno::EINVAL;
use sluice_export::nbd::proto::*;
use sluice_export::nbd::server::ExportEntry;
use sluice_export::nbd::{NbdConfig, NbdServer};
use sluice_export::{BlockDevice, ByteDevice, MemDevice};
use sluice_host::HostError;
use std::collections::BTreeSet;
use std::sync::Mutex;

const BS: u32 = 4096;
/// Blocks per allocation unit (64 KiB), like a small extent.
const UNIT: u64 = 16;

/// A memory device that remembers which 64 KiB units were ever written.
struct Sparse {
    mem: MemDevice,
    written: Mutex<BTreeSet<u64>>,
}

impl BlockDevice for Sparse {
    fn block_size_bytes(&self) -> u32 {
        self.mem.block_size_bytes()
    }
    fn size_blocks(&self) -> u64 {
        self.mem.size_blocks()
    }
    async fn read_blocks(&self, lba: u64, len_bytes: usize) -> Result<Vec<u8>, HostError> {
        self.mem.read_blocks(lba, len_bytes).await
    }
    async fn write_blocks(&self, lba: u64, data: Vec<u8>, fua: bool) -> Result<(), HostError> {
        let end = lba + (data.len() as u64).div_ceil(u64::from(BS));
        self.written
            .lock()
            .unwrap()
            .extend(lba / UNIT..end.div_ceil(UNIT));
        self.mem.write_blocks(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), HostError> {
        self.mem.flush().await
    }
    async fn write_zeroes(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        self.mem.write_zeroes(lba, blocks).await
    }
    async fn deallocate(&self, lba: u64, blocks: u64) -> Result<(), HostError> {
        self.mem.deallocate(lba, blocks).await
    }
    fn reports_holes(&self) -> bool {
        true
    }
    async fn allocation(&self, lba: u64, blocks: u64) -> Result<Vec<(u64, bool)>, HostError> {
        let written = self.written.lock().unwrap();
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let unit_end = ((at / UNIT + 1) * UNIT).min(end);
            let a = written.contains(&(at / UNIT));
            match runs.last_mut() {
                Some((n, b)) if *b == a => *n += unit_end - at,
                _ => runs.push((unit_end - at, a)),
            }
            at = unit_end;
        }
        Ok(runs)
    }
}

fn serve(
    sparse: bool,
    structured_replies: bool,
) -> (
    tokio::runtime::Runtime,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let l = rt
        .block_on(async { tokio::net::UnixListener::bind(&sock) })
        .unwrap();
    let cfg = NbdConfig {
        export_name: "disk".into(),
        description: "holes".into(),
        read_only: false,
        hostnqn: "test".into(),
    };
    let mem = MemDevice::new(BS, 256); // 1 MiB
    if sparse {
        let server = NbdServer::with_exports_offering(
            vec![ExportEntry {
                dev: ByteDevice::new(Sparse {
                    mem,
                    written: Mutex::new(BTreeSet::new()),
                }),
                cfg,
                account: None,
            }],
            structured_replies,
        );
        rt.spawn(server.serve_unix(l));
    } else {
        rt.spawn(NbdServer::new(ByteDevice::new(mem), cfg).serve_unix(l));
    }
    (rt, dir, sock)
}

/// Writes 8 KiB at 64 KiB + 4 KiB (inside unit 1) and at 192 KiB (unit 3).
fn write_two_runs(c: &mut Client) {
    let a = vec![0xabu8; 8192];
    let b = vec![0xcdu8; 4096];
    c.send(CMD_WRITE, 0, 1, 65536 + 4096, 8192, &a);
    c.send(CMD_WRITE, 0, 2, 196608, 4096, &b);
    for _ in 0..2 {
        // Simple replies to writes even with structured replies on.
        let (_, errno, _) = c.reply(|_| 0);
        assert_eq!(errno, 0);
    }
}

#[test]
fn holes_travel_as_hole_chunks_and_data_as_data_chunks() {
    let (_rt, _dir, sock) = serve(true, true);
    let mut c = Client::connect_structured(&sock, "disk");
    write_two_runs(&mut c);
    // Read 256 KiB from 0: hole (unit 0), data (unit 1), hole (unit 2),
    // data (unit 3).
    c.send(CMD_READ, 0, 9, 0, 262_144, &[]);
    let chunks = c.chunks();
    let mut at = 0u64;
    let mut image = vec![0u8; 262_144];
    let mut kinds = Vec::new();
    for (kind, flags, cookie, p) in &chunks {
        assert_eq!(*cookie, 9);
        kinds.push(*kind);
        if *kind == REPLY_TYPE_NONE {
            assert!(flags & REPLY_FLAG_DONE != 0 && p.is_empty());
            continue;
        }
        assert_eq!(flags & REPLY_FLAG_DONE, 0, "only the last chunk is final");
        let off = u64::from_be_bytes(p[0..8].try_into().unwrap());
        assert_eq!(off, at, "chunks tile the read in order");
        match *kind {
            REPLY_TYPE_OFFSET_HOLE => {
                assert_eq!(p.len(), 12, "a hole carries no data");
                at += u64::from(u32::from_be_bytes(p[8..12].try_into().unwrap()));
            }
            REPLY_TYPE_OFFSET_DATA => {
                let d = &p[8..];
                image[off as usize..off as usize + d.len()].copy_from_slice(d);
                at += d.len() as u64;
            }
            other => panic!("chunk type {other}"),
        }
    }
    assert_eq!(at, 262_144);
    assert_eq!(
        kinds,
        vec![
            REPLY_TYPE_OFFSET_HOLE,
            REPLY_TYPE_OFFSET_DATA,
            REPLY_TYPE_OFFSET_HOLE,
            REPLY_TYPE_OFFSET_DATA,
            REPLY_TYPE_NONE
        ]
    );
    let mut want = vec![0u8; 262_144];
    want[69_632..77_824].fill(0xab);
    want[196_608..200_704].fill(0xcd);
    assert!(image == want, "the chunks rebuild the bytes written");

    // A read wholly inside written data is one final data chunk.
    c.send(CMD_READ, 0, 10, 69_632, 8192, &[]);
    let chunks = c.chunks();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].0, REPLY_TYPE_OFFSET_DATA);
    assert!(chunks[0].1 & REPLY_FLAG_DONE != 0);
    // A read of a hole alone: one hole chunk and the final NONE.
    c.send(CMD_READ, 0, 11, 0, 4096, &[]);
    let kinds: Vec<u16> = c.chunks().iter().map(|c| c.0).collect();
    assert_eq!(kinds, vec![REPLY_TYPE_OFFSET_HOLE, REPLY_TYPE_NONE]);
}

#[test]
fn without_structured_replies_or_holes_a_read_carries_every_byte() {
    // Simple replies: the zeros of the holes are sent.
    let (_rt, _dir, sock) = serve(true, true);
    let mut c = Client::connect(&sock, "disk");
    write_two_runs(&mut c);
    let (errno, data) = c.call(CMD_READ, 0, 0, 262_144, &[]);
    assert_eq!(errno, 0);
    assert_eq!(data.len(), 262_144);
    assert!(data[..69_632].iter().all(|&b| b == 0) && data[69_632] == 0xab);
    // A device without holes: one data chunk, even over unwritten bytes.
    let (_rt, _dir, sock) = serve(false, true);
    let mut c = Client::connect_structured(&sock, "disk");
    c.send(CMD_READ, 0, 3, 0, 65_536, &[]);
    let chunks = c.chunks();
    assert_eq!(chunks.len(), 1);
    assert_eq!(
        (chunks[0].0, chunks[0].3.len()),
        (REPLY_TYPE_OFFSET_DATA, 8 + 65_536)
    );
}

/// A server refusing structured replies (`sluice nbd --structured-replies
/// false`): a client that asks is told NBD_REP_ERR_POLICY and carries on
/// with simple replies, reads over holes carry their zeros, and block
/// status is refused for want of the context.
#[test]
fn a_server_refusing_structured_replies_answers_simply() {
    let (_rt, _dir, sock) = serve(true, false);
    let mut c = Client::connect_structured(&sock, "disk");
    assert!(!c.structured, "the server refused structured replies");
    write_two_runs(&mut c);
    let (errno, data) = c.call(CMD_READ, 0, 0, 262_144, &[]);
    assert_eq!(errno, 0);
    let mut want = vec![0u8; 262_144];
    want[69_632..77_824].fill(0xab);
    want[196_608..200_704].fill(0xcd);
    assert!(
        data == want,
        "a simple reply carries every byte, holes as zeros"
    );
    let (errno, _) = c.call(CMD_BLOCK_STATUS, 0, 0, 4096, &[]);
    assert_eq!(
        errno, EINVAL,
        "no base:allocation without structured replies"
    );
    // A server left at the default acknowledges them.
    let (_rt2, _dir2, sock2) = serve(true, true);
    assert!(Client::connect_structured(&sock2, "disk").structured);
}
