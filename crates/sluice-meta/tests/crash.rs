//! Crash tests: a child process runs a catalog workload (drives, create,
//! allocate, grow, delete, a failed drive leaving every chain, rebuilds and
//! remaps, zeroing beside faults that carry its steps, zeroing claims taken
//! over, a delete that quarantines slots and their release) and dies, by
//! `abort()` at an injected point (before or after a commit) or by SIGKILL at
//! a random moment; the parent then checks that the metadata holds either
//! the old or the new state of every change: no slot leaked or owned twice,
//! reservations adding up, and an interrupted delete finishable.
//!
//! The child is this test binary re-run with `SLUICE_CRASH_CHILD` set.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::process::Command;
use std::time::Duration;

use sluice_meta::catalog::{CatalogError, CrashPoint, FenceJob, Fenced, VolumeSpec, ZeroJob};
use sluice_meta::check::check_catalog;
use sluice_meta::testing::EtcdServer;
use sluice_meta::{Catalog, EtcdStore, MetaStore, RedbStore};
use sluice_volume::{DriveId, DriveSpec, DriveState, PlacementWeights, EXTENT_BYTES};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The workload: drives, then rounds of create, allocate, grow and delete.
/// Tolerates the state a previous (crashed) run left.
async fn workload<S: MetaStore>(c: &Catalog<S>, rounds: u32) {
    for i in 0..4u32 {
        let spec = DriveSpec {
            addr: format!("127.0.0.{}:4420", i % 2 + 1),
            nqn: format!("nqn.crash:d{i}"),
            nsid: 1,
        };
        match c.add_drive(spec, 512, 40 * EXTENT_BYTES, None).await {
            Ok(_) | Err(CatalogError::DuplicateDrive(_)) => {}
            Err(e) => panic!("add_drive: {e}"),
        }
    }
    c.resume_deletes().await.unwrap();
    // Zeroing claims a crashed run left are stale: take them over (fenced
    // and zeroed, both no-ops here), and release quarantined slots behind a
    // fence, as the control plane's zeroer does.
    for d in c.drives().await.unwrap() {
        let stale = c.stale_claims(&d);
        let fenced = c
            .recover_claims(
                d.id,
                &stale,
                &|_: FenceJob| async { Fenced::Yes },
                &|_: ZeroJob| async { Ok(()) },
            )
            .await
            .unwrap();
        assert_eq!(fenced, Fenced::Yes);
        let released = c
            .release_fenced_quarantine(d.id, &|_: FenceJob| async { Fenced::Yes })
            .await
            .unwrap();
        assert_eq!(released.0, Fenced::Yes);
        // The zeroer's batches: claim, zero (a no-op), declare clean.
        c.zero_ahead(d.id, 2, &|_: ZeroJob| async { Ok(()) })
            .await
            .unwrap();
    }
    for round in 0..rounds {
        let name = format!("v{}", round % 3);
        let v = match c
            .create_volume(VolumeSpec::new(&name, 6 * EXTENT_BYTES).with_replicas(2))
            .await
        {
            Ok(v) => v,
            Err(CatalogError::DuplicateVolume(_)) => c.volume(&name).await.unwrap(),
            Err(e) => panic!("create: {e}"),
        };
        // The first fault, then the rest beside a zeroer batch: its steps
        // ride on the faults' transactions ("allocate_extent.ride").
        c.allocate_extent(&name, v.id, 0).await.unwrap();
        let zero = |_: ZeroJob| async { Ok(()) };
        let (zeroed, ()) = tokio::join!(c.zero_ahead(DriveId(0), 2, &zero), async {
            for i in 1..v.extents() {
                c.allocate_extent(&name, v.id, i).await.unwrap();
            }
        });
        zeroed.unwrap();
        c.resize_volume(&name, v.size_bytes + EXTENT_BYTES)
            .await
            .unwrap();
        if round == 3 {
            // A delete that cannot fence drive 1: its slots there are
            // quarantined, then released once a fence holds.
            c.delete_volume_with(&name, |_| async { vec![DriveId(1)] })
                .await
                .unwrap();
            let fenced = |_: FenceJob| async { Fenced::Yes };
            c.release_fenced_quarantine(DriveId(1), &fenced)
                .await
                .unwrap();
        } else if round % 2 == 1 {
            c.delete_volume(&name).await.unwrap();
        }
        if round == 2 {
            // A chain change spanning volumes: a drive fails and leaves
            // every replicated chain, then comes back into service.
            c.fail_drive(DriveId(3)).await.unwrap();
            // Rebuilds of the degraded extents: begun and finished, begun
            // and aborted; a crash in between leaves one in progress, which
            // the next run's begin resumes.
            for v in c.degraded_volumes().await.unwrap() {
                for (k, e) in c
                    .degraded_extents(&v, 3)
                    .await
                    .unwrap()
                    .into_iter()
                    .enumerate()
                {
                    match c.begin_rebuild(&v.name, e.index).await {
                        Ok(Some(r)) if k == 1 => {
                            c.abort_rebuild(&r).await.unwrap();
                        }
                        Ok(Some(r)) => {
                            c.finish_rebuild(&r).await.unwrap();
                        }
                        Ok(None) | Err(CatalogError::PoolFull(_)) => {}
                        Err(e) => panic!("rebuild: {e}"),
                    }
                }
            }
            c.set_drive_state(DriveId(3), DriveState::Up).await.unwrap();
        }
        if round == 4 {
            // Remaps off drive 0: begun and finished, begun and aborted; a
            // crash between leaves one in progress, which the next run's
            // begin_rebuild resumes (it counts as needing the rebuilder).
            for v in c.degraded_volumes().await.unwrap() {
                for e in c.degraded_extents(&v, 8).await.unwrap() {
                    if let Ok(Some(r)) = c.begin_rebuild(&v.name, e.index).await {
                        c.finish_rebuild(&r).await.unwrap();
                    }
                }
            }
            if let Ok(l) = c.layout(&name).await {
                for (k, e) in l.extents.iter().enumerate().take(4) {
                    match c.begin_move(&name, e.index, DriveId(0), &[]).await {
                        Ok(Some(r)) if k % 2 == 1 => {
                            c.abort_rebuild(&r).await.unwrap();
                        }
                        Ok(Some(r)) => {
                            c.finish_rebuild(&r).await.unwrap();
                        }
                        Ok(None) | Err(CatalogError::PoolFull(_)) => {}
                        Err(e) => panic!("move: {e}"),
                    }
                }
            }
        }
    }
}

/// The child's ride window: long enough that the workload's zeroer steps
/// surely ride on its faults, short enough that a step no fault follows
/// costs little.
const RIDE_WINDOW: Duration = Duration::from_millis(200);

#[test]
fn crash_child() {
    let Ok(spec) = std::env::var("SLUICE_CRASH_CHILD") else {
        return;
    };
    // "redb:PATH" or "etcd:ENDPOINT:PREFIX", then the crash point number.
    let crash_at: Option<u32> = std::env::var("SLUICE_CRASH_AT")
        .ok()
        .and_then(|s| s.parse().ok());
    // With SLUICE_CRASH_OP, only that operation's points count.
    let only_op = std::env::var("SLUICE_CRASH_OP").ok();
    let counter = std::sync::atomic::AtomicU32::new(0);
    let hook = move |p: CrashPoint| {
        let (CrashPoint::BeforeCommit(op) | CrashPoint::AfterCommit(op)) = p;
        if only_op.as_deref().is_some_and(|o| o != op) {
            return;
        }
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if Some(n) == crash_at {
            eprintln!("crashing at point {n}: {p:?}");
            std::process::abort();
        }
    };
    rt().block_on(async move {
        if let Some(path) = spec.strip_prefix("redb:") {
            let c = Catalog::new(
                RedbStore::open(path.as_ref()).unwrap(),
                PlacementWeights::default(),
            )
            .with_crash_hook(hook)
            .with_ride_window(RIDE_WINDOW);
            workload(&c, 6).await;
        } else if let Some(rest) = spec.strip_prefix("etcd:") {
            let (endpoint, prefix) = rest.rsplit_once('|').unwrap();
            let store = EtcdStore::connect(&[endpoint.to_owned()], prefix)
                .await
                .unwrap();
            let c = Catalog::new(store, PlacementWeights::default())
                .with_crash_hook(hook)
                .with_ride_window(RIDE_WINDOW);
            workload(&c, 6).await;
        }
    });
    println!("child finished");
}

/// Runs the child; returns whether it finished, and whether it crashed at
/// its injected point (and not of something else).
fn run_child(store: &str, crash_at: Option<u32>, kill_after: Option<Duration>) -> (bool, bool) {
    run_child_at(store, None, crash_at, kill_after)
}

/// [`run_child`], counting only the crash points of operation `op`.
fn run_child_at(
    store: &str,
    op: Option<&str>,
    crash_at: Option<u32>,
    kill_after: Option<Duration>,
) -> (bool, bool) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "crash_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("SLUICE_CRASH_CHILD", store)
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    if let Some(n) = crash_at {
        cmd.env("SLUICE_CRASH_AT", n.to_string());
    }
    if let Some(op) = op {
        cmd.env("SLUICE_CRASH_OP", op);
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(d) = kill_after {
        std::thread::sleep(d);
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let finished =
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("child finished");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "the child panicked: {stderr}");
    (finished, stderr.contains("crashing at point"))
}

async fn verify<S: MetaStore>(store: S) {
    check_catalog(&store)
        .await
        .unwrap_or_else(|e| panic!("after crash: {e}"));
    let c = Catalog::new(store, PlacementWeights::default());
    c.resume_deletes().await.unwrap();
    check_catalog(c.store())
        .await
        .unwrap_or_else(|e| panic!("after resuming deletes: {e}"));
}

/// Crash points the workload passes through, counted by a clean run.
const POINTS_SAMPLED: u32 = 24;

#[test]
fn redb_survives_a_crash_at_every_kind_of_point() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    // Each run crashes at a later point of the same database's history: the
    // run after a crash starts from what the crash left.
    for (i, n) in (1..=POINTS_SAMPLED).map(|k| k * 7 % 61 + 1).enumerate() {
        let path = dir.path().join(format!("m{}.redb", i % 4));
        let spec = format!("redb:{}", path.display());
        assert_eq!(
            run_child(&spec, Some(n), None),
            (false, true),
            "the child should have crashed at point {n}"
        );
        rt.block_on(verify(RedbStore::open(&path).unwrap()));
    }
    // And a run with no crash completes on top of the crashed histories.
    let spec = format!("redb:{}", dir.path().join("m0.redb").display());
    assert_eq!(run_child(&spec, None, None), (true, false));
    rt.block_on(verify(
        RedbStore::open(&dir.path().join("m0.redb")).unwrap(),
    ));
}

/// Every step of a rebuild (begin, finish, abort), before and after its
/// commit: the process dies there, the fsck holds, and the next run
/// resumes the rebuild in progress.
#[test]
fn redb_survives_a_crash_at_every_rebuild_step() {
    crash_before_and_after_each(
        "r.redb",
        &["begin_rebuild", "finish_rebuild", "abort_rebuild"],
    );
}

/// For each operation of `ops` in turn, on one redb database: a child dies
/// before (point 1) and after (point 2) the operation's first commit, and
/// the fsck holds each time; then a run with no crash completes on top.
fn crash_before_and_after_each(file: &str, ops: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file);
    let spec = format!("redb:{}", path.display());
    let rt = rt();
    for op in ops {
        for n in [1, 2] {
            assert_eq!(
                run_child_at(&spec, Some(op), Some(n), None),
                (false, true),
                "the child should have crashed at point {n} of {op}"
            );
            rt.block_on(verify(RedbStore::open(&path).unwrap()));
        }
    }
    assert_eq!(run_child(&spec, None, None), (true, false));
    rt.block_on(verify(RedbStore::open(&path).unwrap()));
}

/// Every step of zeroing and quarantine, before and after its commit:
/// the zeroer's batch (claim, then declare clean with the next claim), a
/// zeroer step carried by a fault's transaction, a fault's own claim, the
/// take-over of the claim a crash left, the delete that quarantines, and
/// the release. The process dies there, the fsck
/// holds, and the next run takes over what was left.
#[test]
fn redb_survives_a_crash_at_every_zeroing_and_quarantine_step() {
    // A crash after "zero_ahead.claim" or "allocate_extent.ride" commits
    // leaves a stale claim, so the next run passes "recover_claims.take".
    crash_before_and_after_each(
        "z.redb",
        &[
            "zero_ahead",
            "zero_ahead.claim",
            "allocate_extent.ride",
            "recover_claims.take",
            "delete_volume.batch",
            "release_quarantine",
        ],
    );
}

#[test]
fn redb_survives_sigkill_at_random_moments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.redb");
    let spec = format!("redb:{}", path.display());
    let rt = rt();
    for i in 0..8u64 {
        // Spread the kills over start-up and the workload.
        run_child(
            &spec,
            None,
            Some(Duration::from_millis(30 + (i * 37) % 150)),
        );
        rt.block_on(verify(RedbStore::open(&path).unwrap()));
    }
}

#[test]
fn etcd_survives_a_crash_at_every_kind_of_point() {
    let Some(server) = EtcdServer::start_or_skip("etcd_survives_a_crash") else {
        return;
    };
    let rt = rt();
    for (i, n) in (1..=12u32).map(|k| k * 11 % 61 + 1).enumerate() {
        let prefix = format!("/crash{}/", i % 3);
        let spec = format!("etcd:{}|{prefix}", server.endpoint);
        assert_eq!(
            run_child(&spec, Some(n), None),
            (false, true),
            "the child should have crashed at point {n}"
        );
        rt.block_on(async {
            verify(
                EtcdStore::connect(std::slice::from_ref(&server.endpoint), &prefix)
                    .await
                    .unwrap(),
            )
            .await
        });
    }
}
