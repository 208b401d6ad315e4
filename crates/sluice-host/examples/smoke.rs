//! Smoke test against a real target:
//! `cargo run -p sluice-host --example smoke -- 127.0.0.1:14420 SUBNQN [HOSTNQN]`
//! Discovers, connects, writes and reads back several sizes, disconnects.

use std::time::Duration;

use sluice_host::{discover, ConnectOptions, Controller, IoFlags};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .ok_or("usage: smoke ADDR:PORT SUBNQN [HOSTNQN]")?
        .parse()?;
    let subnqn = args.next().ok_or("missing SUBNQN")?;
    let mut opts = ConnectOptions {
        io_queues: 2,
        queue_depth: 32,
        hdr_digest: std::env::var("HDGST").is_ok(),
        data_digest: std::env::var("DDGST").is_ok(),
        command_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    if let Some(h) = args.next() {
        opts.hostnqn = h;
    }
    match discover(addr, &opts).await {
        Ok(entries) => {
            for e in entries {
                println!(
                    "discovered: {} at {}:{} (subtype {})",
                    e.subnqn, e.traddr, e.trsvcid, e.subtype
                );
            }
        }
        Err(e) => println!("discovery failed: {e}"),
    }
    let c = Controller::connect(addr, &subnqn, opts).await?;
    let id = c.identify();
    println!(
        "connected: cntlid {} model `{}` mdts {} ioccsz {} maxcmd {} io queues {} max transfer {} B",
        c.cntlid(), id.model, id.mdts, id.ioccsz, id.maxcmd, c.io_queue_count(), c.max_transfer_bytes()
    );
    for n in c.namespaces() {
        println!(
            "namespace {}: {} blocks of {} B",
            n.nsid, n.size_blocks, n.block_size_bytes
        );
    }
    let nsid = c
        .namespaces()
        .first()
        .map(|n| n.nsid)
        .ok_or("no namespace")?;
    let ns = c.namespace(nsid)?;
    let bs = ns.block_size_bytes() as usize;
    for (lba, len) in [
        (0u64, bs),
        (8, 4096),
        (64, 64 * 1024),
        (1024, 1 << 20),
        (4096, 3 << 20),
    ] {
        let len = len.div_ceil(bs) * bs;
        let d: Vec<u8> = (0..len)
            .map(|i| ((i as u64 * 7 + lba) & 0xff) as u8)
            .collect();
        ns.write(
            lba,
            &d,
            IoFlags {
                urgent: true,
                barrier: false,
                fua: true,
                epoch: 0,
            },
        )
        .await?;
        let r = ns.read(lba, len, IoFlags::default()).await?;
        println!(
            "write+read {len:>8} B at LBA {lba:>5}: {}",
            if r == d { "ok" } else { "MISMATCH" }
        );
        if r != d {
            return Err("data mismatch".into());
        }
    }
    ns.flush().await?;
    match ns.write_zeroes(8, 8).await {
        Ok(()) => println!("write zeroes: ok"),
        Err(e) => println!("write zeroes: {e}"),
    }
    match ns.deallocate(64, 128).await {
        Ok(()) => println!("deallocate: ok"),
        Err(e) => println!("deallocate: {e}"),
    }
    c.disconnect(Duration::from_secs(2)).await;
    println!("SMOKE OK");
    Ok(())
}
