//! Crash test: the target process is killed (SIGKILL) while a host writes;
//! a new target on the same file must return every write that was
//! acknowledged before the kill (sled-style).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use sluice_config::{Config, NamespaceConfig, SubsystemConfig, TargetSettings};
use sluice_host::{ConnectOptions, Controller, IoFlags, ReconnectPolicy};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.sluice:crash";
const BLOCKS_PER_WRITE: u64 = 8; // 4 KiB writes on 512 B blocks
const SLOTS: u64 = 2048;

/// A port below the ephemeral range, which other tests' connections
/// cannot take before the process under test binds it.
fn free_port() -> u16 {
    sluice_meta::testing::free_loopback_port().expect("a free loopback port")
}

fn start_target(config: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["target", "--config"])
        .arg(config)
        .args(["--log", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sluice target starts")
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "target did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The content written to slot `slot` in generation `gen`.
fn block(slot: u64, generation: u64) -> Vec<u8> {
    let mut v = vec![0u8; (BLOCKS_PER_WRITE * 512) as usize];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (slot.wrapping_mul(31) ^ generation.wrapping_mul(7919) ^ i as u64) as u8;
    }
    v[..8].copy_from_slice(&generation.to_le_bytes());
    v[8..16].copy_from_slice(&slot.to_le_bytes());
    v
}

#[test]
fn acknowledged_writes_survive_a_killed_target() {
    let dir = std::env::temp_dir().join(format!("sluice-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("ns.img");
    let port = free_port();
    let config = dir.join("target.toml");
    // The `sluice target --config FILE` path: the file is written from a
    // builder-made config.
    let c = Config::default()
        .with_target(
            TargetSettings::default()
                .with_listen(SocketAddr::from(([127, 0, 0, 1], port)))
                .with_discovery_listen(None),
        )
        .with_subsystem(
            SubsystemConfig::new(NQN).allow_any_host().with_namespace(
                NamespaceConfig::file(1, &img)
                    .with_create(true)
                    .with_size(SLOTS * BLOCKS_PER_WRITE * 512)
                    .with_block_size(512),
            ),
        )
        .validated()
        .unwrap();
    std::fs::write(&config, c.to_toml().unwrap()).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // acked[slot] = last generation acknowledged for that slot.
    let acked: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0; SLOTS as usize]));
    let mut child = start_target(&config);
    wait_port(port);
    let opts = ConnectOptions {
        io_queues: 2,
        queue_depth: 16,
        command_timeout: Duration::from_secs(5),
        reconnect: ReconnectPolicy {
            attempts_max: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    // A second host that stays connected across the crash: it must report
    // the loss and then reconnect by itself once the target is back.
    let survivor_opts = ConnectOptions {
        hostnqn: "nqn.2014-08.org.nvmexpress:uuid:c0ffee00-0000-4000-8000-000000000002".into(),
        command_timeout: Duration::from_secs(5),
        reconnect: ReconnectPolicy {
            attempts_max: 10,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
            retry_io: false,
        },
        ..Default::default()
    };
    let survivor = rt
        .block_on(Controller::connect(addr, NQN, survivor_opts))
        .unwrap();
    let writes_done = rt.block_on(async {
        let c = Controller::connect(addr, NQN, opts.clone()).await.unwrap();
        let ns = c.namespace(1).unwrap();
        let mut tasks = Vec::new();
        for w in 0..8u64 {
            let ns = ns.clone();
            let acked = acked.clone();
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                for generation in 1.. {
                    let slot = (generation * 8 + w) % SLOTS;
                    let fua = generation % 3 == 0;
                    let r = ns
                        .write(
                            slot * BLOCKS_PER_WRITE,
                            &block(slot, generation),
                            IoFlags {
                                fua,
                                ..Default::default()
                            },
                        )
                        .await;
                    if r.is_err() {
                        break;
                    }
                    acked.lock().unwrap()[slot as usize] = generation;
                    n += 1;
                }
                n
            }));
        }
        // Let the writers run, then kill the target without warning.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        child.kill().unwrap();
        child.wait().unwrap();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    assert!(
        writes_done > 100,
        "the writers made progress before the kill ({writes_done})"
    );

    // While the target is down, the surviving host reports the loss.
    let sns = survivor.namespace(1).unwrap();
    let down = rt.block_on(sns.read(0, 512, IoFlags::default()));
    assert!(
        down.is_err(),
        "a read with the target down must fail, got {down:?}"
    );

    // A new target on the same file returns every acknowledged write.
    let mut child = start_target(&config);
    wait_port(port);
    // The surviving host reconnects on its next I/O (with back-off) and reads
    // the same data as a fresh connection.
    let back = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match sns.read(0, 4096, IoFlags::default()).await {
                Ok(d) => break Ok(d),
                Err(e) if Instant::now() >= deadline => break Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let back = back.expect("the surviving host reconnects to the restarted target");
    let acked = acked.lock().unwrap().clone();
    let mismatches = rt.block_on(async {
        let c = Controller::connect(addr, NQN, opts).await.unwrap();
        let ns = c.namespace(1).unwrap();
        let mut bad = Vec::new();
        for slot in 0..SLOTS {
            let g = acked[slot as usize];
            if g == 0 {
                continue;
            }
            let d = ns
                .read(
                    slot * BLOCKS_PER_WRITE,
                    (BLOCKS_PER_WRITE * 512) as usize,
                    IoFlags::default(),
                )
                .await
                .unwrap();
            let got = u64::from_le_bytes(d[..8].try_into().unwrap());
            // A later, unacknowledged write may also have landed; an older one may not.
            if got < g || (got == g && d != block(slot, g)) {
                bad.push((slot, g, got));
            }
        }
        bad
    });
    let fresh = rt.block_on(async {
        let c = Controller::connect(addr, NQN, ConnectOptions::default())
            .await
            .unwrap();
        c.namespace(1)
            .unwrap()
            .read(0, 4096, IoFlags::default())
            .await
            .unwrap()
    });
    assert_eq!(back, fresh, "the reconnected host sees the same data");
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        mismatches.is_empty(),
        "acknowledged writes lost (slot, acked gen, found gen): {:?}",
        &mismatches[..mismatches.len().min(10)]
    );
}
