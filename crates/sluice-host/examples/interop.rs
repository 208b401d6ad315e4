//! Interop check of the Sluice host against any NVMe/TCP target; exits
//! non-zero on the first failure. Used by scripts/interop-linux-target.sh
//! against the Linux kernel target (nvmet-tcp in QEMU).
//!
//! `interop ADDR:PORT SUBNQN [--digests] [--hostnqn NQN]`
//!
//! Checks: discovery lists SUBNQN; connect with 2 I/O queues; writes and
//! read-back from one block to 6 MiB (in-capsule, R2T with several H2CData
//! PDUs split at the target's MAXH2CDATA, transfers split at MDTS), 64 concurrent writes then reads spread
//! over both queues, Write Zeroes reads back zeroes, Flush, FUA writes,
//! reads beyond the namespace fail with LBA Out of Range, clean disconnect.

use sluice_host::core::Payload;
use sluice_host::{discover, ConnectOptions, Controller, HostError, IoFlags};
use sluice_proto::Sqe;
use sluice_testdata::pattern;
use std::process::ExitCode;
use std::time::Duration;

async fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: interop ADDR:PORT SUBNQN [--digests] [--hostnqn NQN]";
    let addr = args
        .next()
        .ok_or(usage)?
        .parse()
        .map_err(|e| format!("address: {e}"))?;
    let subnqn = args.next().ok_or(usage)?;
    let mut opts = ConnectOptions {
        io_queues: 2,
        queue_depth: 32,
        command_timeout: Duration::from_secs(30),
        // Large enough that one 6 MiB write crosses a 4 MiB MAXH2CDATA
        // (Linux nvmet's) within a single command; split at MDTS otherwise.
        max_transfer_bytes: 8 << 20,
        ..Default::default()
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--digests" => {
                opts.hdr_digest = true;
                opts.data_digest = true;
            }
            "--hostnqn" => opts.hostnqn = args.next().ok_or("--hostnqn needs a value")?,
            other => return Err(format!("unknown argument {other}; {usage}")),
        }
    }
    let step = |s: &str| println!("STEP {s}");

    step("discover");
    let entries = discover(addr, &opts)
        .await
        .map_err(|e| format!("discover: {e}"))?;
    if !entries.iter().any(|e| e.subnqn == subnqn) {
        return Err(format!("discovery log does not list {subnqn}: {entries:?}"));
    }

    step("connect");
    let c = Controller::connect(addr, &subnqn, opts.clone())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let id = c.identify();
    println!(
        "  cntlid {} model `{}` mdts {} ioccsz {} io queues {} max transfer {} B digests {}",
        c.cntlid(),
        id.model,
        id.mdts,
        id.ioccsz,
        c.io_queue_count(),
        c.max_transfer_bytes(),
        opts.hdr_digest
    );
    if c.io_queue_count() < 2 {
        return Err(format!(
            "asked for 2 I/O queues, got {}",
            c.io_queue_count()
        ));
    }
    let nsid = c
        .namespaces()
        .first()
        .map(|n| n.nsid)
        .ok_or("no namespace")?;
    let ns = c.namespace(nsid).map_err(|e| e.to_string())?;
    let bs = ns.block_size_bytes() as usize;

    step("write-read sizes");
    for (lba, len) in [
        (0u64, bs),
        (8, 4096),
        (64, 16384),
        (256, 65536),
        (1024, 1 << 20),
        (4096, 3 << 20),
    ] {
        let len = len.div_ceil(bs) * bs;
        let d = pattern(len, lba);
        ns.write(lba, &d, IoFlags::default())
            .await
            .map_err(|e| format!("write {len} B at {lba}: {e}"))?;
        let r = ns
            .read(lba, len, IoFlags::default())
            .await
            .map_err(|e| format!("read {len} B at {lba}: {e}"))?;
        if r != d {
            return Err(format!("read back {len} B at LBA {lba} differs"));
        }
        println!("  {len:>8} B at LBA {lba:>5}: ok");
    }

    step("concurrent");
    let base = 16384u64;
    let writes = (0..64u64).map(|i| {
        let ns = ns.clone();
        async move {
            ns.write(base + i * 16, &pattern(8192, i + 100), IoFlags::default())
                .await
        }
    });
    for r in futures_join(writes).await {
        r.map_err(|e| format!("concurrent write: {e}"))?;
    }
    let reads = (0..64u64).map(|i| {
        let ns = ns.clone();
        async move { (i, ns.read(base + i * 16, 8192, IoFlags::default()).await) }
    });
    for (i, r) in futures_join(reads).await {
        let d = r.map_err(|e| format!("concurrent read: {e}"))?;
        if d != pattern(8192, i + 100) {
            return Err(format!("concurrent read {i} differs"));
        }
    }

    step("fua-flush");
    let fua = IoFlags {
        fua: true,
        ..Default::default()
    };
    ns.write(32768, &pattern(4096, 7), fua)
        .await
        .map_err(|e| format!("FUA write: {e}"))?;
    ns.flush().await.map_err(|e| format!("flush: {e}"))?;

    step("write-zeroes");
    ns.write_zeroes(8, (4096 / bs) as u64)
        .await
        .map_err(|e| format!("write zeroes: {e}"))?;
    let z = ns
        .read(8, 4096, IoFlags::default())
        .await
        .map_err(|e| format!("read after write zeroes: {e}"))?;
    if z.iter().any(|&b| b != 0) {
        return Err("write zeroes did not zero".into());
    }

    step("out-of-range");
    // Sent raw: the library itself refuses out-of-range I/O before sending.
    let end = ns.size_blocks();
    let sqe = Sqe::rw(sluice_proto::command::io::READ, 0, nsid, end - 1, 2, false);
    match c.io(sqe, Payload::Read(2 * ns.block_size_bytes())).await {
        // Sluice answers LBA Out of Range; Linux nvmet on a bdev answers
        // Internal Error. Either way the host must surface an NVMe status.
        Err(HostError::Nvme { status, .. }) if status.sct == 0 && status.dnr => {
            println!("  error surfaced: {status}")
        }
        other => {
            return Err(format!(
                "read past the end gave {other:?}, expected an NVMe error status"
            ))
        }
    }

    step("disconnect");
    c.disconnect(Duration::from_secs(5)).await;
    Ok(())
}

/// Runs futures concurrently (a tiny join_all).
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        match h.await {
            Ok(v) => out.push(v),
            Err(e) => panic!("task failed: {e}"),
        }
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            println!("INTEROP OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("INTEROP FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
