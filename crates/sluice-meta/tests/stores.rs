//! The same tests against both stores: redb in a temporary file, and a real
//! etcd (Debian's etcd-server) started per test.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use sluice_meta::catalog::{CatalogError, FenceJob, Fenced, VolumeSpec, ZeroJob};
use sluice_meta::check::check_catalog;
use sluice_meta::testing::EtcdServer;
use sluice_meta::{Catalog, Committed, EtcdStore, MetaStore, RedbStore, StoreError, Txn};
use sluice_volume::{DriveId, DriveSpec, DriveState, PlacementWeights, EXTENT_BYTES};

const MIB: u64 = 1 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn redb() -> (tempfile::TempDir, RedbStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("meta.redb")).unwrap();
    (dir, store)
}

async fn etcd(server: &EtcdServer, prefix: &str) -> EtcdStore {
    EtcdStore::connect(std::slice::from_ref(&server.endpoint), prefix)
        .await
        .unwrap()
}

fn spec(i: u32, target: u32) -> DriveSpec {
    DriveSpec {
        addr: format!("127.0.0.{target}:4420"),
        nqn: format!("nqn.test:d{i}"),
        nsid: 1,
    }
}

// ------------------------------------------------------------- store semantics

async fn store_semantics<S: MetaStore>(s: S) {
    assert_eq!(s.get("a/x").await.unwrap(), None);
    let r1 = match s
        .commit(Txn::default().absent("a/x").put("a/x", b"1".to_vec()))
        .await
        .unwrap()
    {
        Committed::Applied { revision } => revision,
        c => panic!("{c:?}"),
    };
    let got = s.get("a/x").await.unwrap().unwrap();
    assert_eq!(got.value, b"1");
    assert_eq!(got.mod_revision, r1);
    // Absent no longer holds; a stale revision does not hold; nothing changes.
    assert_eq!(
        s.commit(Txn::default().absent("a/x").put("a/y", b"2".to_vec()))
            .await
            .unwrap(),
        Committed::Conflict
    );
    assert_eq!(
        s.commit(
            Txn::default()
                .unchanged("a/x", r1 + 100)
                .put("a/y", b"2".to_vec())
        )
        .await
        .unwrap(),
        Committed::Conflict
    );
    assert_eq!(s.get("a/y").await.unwrap(), None);
    let r2 = match s
        .commit(
            Txn::default()
                .unchanged("a/x", r1)
                .put("a/y", b"2".to_vec())
                .put("b/z", b"3".to_vec())
                .delete("a/x"),
        )
        .await
        .unwrap()
    {
        Committed::Applied { revision } => revision,
        c => panic!("{c:?}"),
    };
    assert!(r2 > r1);
    let (rev, listed) = s.list("a/").await.unwrap();
    assert!(rev >= r2);
    assert_eq!(
        listed.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        vec!["a/y"]
    );
    assert_eq!(listed[0].1.mod_revision, r2);
    // Limits are refused before the store sees them, the same on both.
    let mut big = Txn::default();
    for i in 0..200 {
        big = big.put(format!("c/{i}"), vec![]);
    }
    assert!(matches!(s.commit(big).await, Err(StoreError::TooLarge(_))));
    assert!(matches!(
        s.commit(Txn::default().put("c/1", vec![]).delete("c/1"))
            .await,
        Err(StoreError::TooLarge(_))
    ));
}

#[test]
fn redb_store_semantics() {
    let (_d, s) = redb();
    rt().block_on(store_semantics(s));
}

#[test]
fn etcd_store_semantics() {
    let Some(server) = EtcdServer::start_or_skip("etcd_store_semantics") else {
        return;
    };
    rt().block_on(async { store_semantics(etcd(&server, "/t1/").await).await });
}

// ------------------------------------------------------------- catalog life

async fn catalog_lifecycle<S: MetaStore>(s: S) {
    let c = Catalog::new(s, PlacementWeights::default());
    // Four drives of 8 extents on two targets.
    for i in 0..4 {
        c.add_drive(spec(i, i % 2 + 1), 512, 8 * EXTENT_BYTES + 4096, None)
            .await
            .unwrap();
    }
    assert!(matches!(
        c.add_drive(spec(0, 1), 512, 8 * EXTENT_BYTES, None).await,
        Err(CatalogError::DuplicateDrive(_))
    ));
    assert!(matches!(
        c.add_drive(spec(9, 1), 512, MIB, None).await,
        Err(CatalogError::Invalid {
            field: "drive size",
            ..
        })
    ));
    assert_eq!(c.capacity().await.unwrap(), (32, 0));

    let v = c
        .create_volume(VolumeSpec::new("db", 6 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    assert_eq!(c.capacity().await.unwrap(), (32, 12));
    assert!(matches!(
        c.create_volume(VolumeSpec::new("db", EXTENT_BYTES)).await,
        Err(CatalogError::DuplicateVolume(_))
    ));
    // 21 extents × 1 replica does not fit in the 20 unreserved.
    let e = c
        .create_volume(VolumeSpec::new("huge", 21 * EXTENT_BYTES))
        .await
        .unwrap_err();
    assert!(matches!(e, CatalogError::PoolFull(_)), "{e}");
    assert!(e.to_string().contains("capacity exceeded"), "{e}");
    let e = c
        .create_volume(VolumeSpec::new("bad/name", EXTENT_BYTES))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            CatalogError::Invalid {
                field: "volume name",
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        c.volume("nope").await,
        Err(CatalogError::UnknownVolume(_))
    ));

    // Lazy: nothing allocated until asked; allocation is idempotent.
    assert!(c.layout("db").await.unwrap().extents.is_empty());
    let e0 = c.allocate_extent("db", v.id, 0).await.unwrap();
    assert_eq!(c.allocate_extent("db", v.id, 0).await.unwrap(), e0);
    assert_eq!(e0.chain.len(), 2);
    assert_ne!(e0.chain[0].drive, e0.chain[1].drive);
    // Replicas on distinct targets (drives 0,2 on one, 1,3 on the other).
    assert_ne!(e0.chain[0].drive.0 % 2, e0.chain[1].drive.0 % 2);
    for i in 1..6 {
        c.allocate_extent("db", v.id, i).await.unwrap();
    }
    assert!(matches!(
        c.allocate_extent("db", v.id, 6).await,
        Err(CatalogError::ExtentOutOfRange { .. })
    ));
    let layout = c.layout("db").await.unwrap();
    assert_eq!(layout.extents.len(), 6);
    // 12 replicas over 4 drives: spread evenly.
    let per: BTreeMap<DriveId, u64> = layout.volume.extents_per_drive.clone();
    assert_eq!(
        per.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3, 3],
        "{per:?}"
    );
    check_catalog(c.store()).await.unwrap();

    // Grow online; shrink refused.
    let grown = c.resize_volume("db", 8 * EXTENT_BYTES).await.unwrap();
    assert_eq!(grown.extents(), 8);
    c.allocate_extent("db", v.id, 7).await.unwrap();
    let e = c.resize_volume("db", EXTENT_BYTES).await.unwrap_err();
    assert!(matches!(e, CatalogError::Shrink { .. }), "{e}");

    // A stale client (old id) after delete and re-create.
    c.delete_volume("db").await.unwrap();
    assert!(matches!(
        c.volume("db").await,
        Err(CatalogError::UnknownVolume(_))
    ));
    let summary = check_catalog(c.store()).await.unwrap();
    assert_eq!((summary.extents, summary.slots_used), (0, 0));
    assert_eq!(c.capacity().await.unwrap(), (32, 0));
    let v2 = c
        .create_volume(VolumeSpec::new("db", EXTENT_BYTES))
        .await
        .unwrap();
    assert_ne!(v2.id, v.id);
    assert!(matches!(
        c.allocate_extent("db", v.id, 0).await,
        Err(CatalogError::VolumeRecreated { .. })
    ));

    // A drive out of service takes no new extents.
    for d in 0..3 {
        c.set_drive_state(DriveId(d), DriveState::Down)
            .await
            .unwrap();
    }
    let e = c.allocate_extent("db", v2.id, 0).await.unwrap();
    assert_eq!(e.chain[0].drive, DriveId(3));
    check_catalog(c.store()).await.unwrap();

    // Tenants' SLO classes: set, changed, listed; bad names refused.
    assert!(c.tenants().await.unwrap().is_empty());
    c.set_tenant("nqn.2014-08.org.example:gold-host", "gold")
        .await
        .unwrap();
    c.set_tenant("web", "bronze").await.unwrap();
    c.set_tenant("web", "silver").await.unwrap();
    let t: Vec<(String, String)> = c
        .tenants()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.name, t.slo_class))
        .collect();
    assert_eq!(
        t,
        vec![
            ("nqn.2014-08.org.example:gold-host".into(), "gold".into()),
            ("web".into(), "silver".into())
        ]
    );
    for (name, class, field) in [("", "gold", "tenant"), ("x", "no spaces", "SLO class")] {
        let e = c.set_tenant(name, class).await.unwrap_err();
        assert!(
            matches!(&e, CatalogError::Invalid { field: f, .. } if *f == field),
            "{e}"
        );
    }
    check_catalog(c.store()).await.unwrap();
}

#[test]
fn redb_catalog_lifecycle() {
    let (_d, s) = redb();
    rt().block_on(catalog_lifecycle(s));
}

#[test]
fn etcd_catalog_lifecycle() {
    let Some(server) = EtcdServer::start_or_skip("etcd_catalog_lifecycle") else {
        return;
    };
    rt().block_on(async { catalog_lifecycle(etcd(&server, "/t2/").await).await });
}

// ------------------------------------------------- deleting a big volume

async fn big_delete<S: MetaStore>(s: S) {
    let c = Catalog::new(s, PlacementWeights::default());
    for i in 0..8 {
        c.add_drive(spec(i, i), 4096, 64 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = c
        .create_volume(VolumeSpec::new("big", 150 * EXTENT_BYTES).with_replicas(3))
        .await
        .unwrap();
    for i in 0..150 {
        c.allocate_extent("big", v.id, i).await.unwrap();
    }
    // 450 replicas: more than one transaction's worth.
    c.delete_volume("big").await.unwrap();
    let s = check_catalog(c.store()).await.unwrap();
    assert_eq!((s.volumes, s.extents, s.slots_used), (0, 0, 0));
}

#[test]
fn redb_big_delete_spans_transactions() {
    let (_d, s) = redb();
    rt().block_on(big_delete(s));
}

#[test]
fn etcd_big_delete_spans_transactions() {
    let Some(server) = EtcdServer::start_or_skip("etcd_big_delete") else {
        return;
    };
    rt().block_on(async { big_delete(etcd(&server, "/t3/").await).await });
}

// ------------------------------------------- two writers on one store

async fn racing_allocators<S: MetaStore + Clone>(s: S) {
    let a = Arc::new(Catalog::new(s.clone(), PlacementWeights::default()));
    let b = Arc::new(Catalog::new(s, PlacementWeights::default()));
    for i in 0..3 {
        a.add_drive(spec(i, i), 512, 40 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = a
        .create_volume(VolumeSpec::new("r", 32 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for cat in [a.clone(), b.clone(), a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..32 {
                got.push(cat.allocate_extent("r", v.id, i).await.unwrap());
            }
            got
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    // Every writer saw the same chain for every extent, and nothing is owned
    // twice or leaked.
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
    let s = check_catalog(a.store()).await.unwrap();
    assert_eq!(s.slots_used, 64);
}

#[test]
fn redb_racing_allocators_agree() {
    let (_d, s) = redb();
    rt().block_on(racing_allocators(s));
}

#[test]
fn etcd_racing_allocators_agree() {
    let Some(server) = EtcdServer::start_or_skip("etcd_racing_allocators") else {
        return;
    };
    rt().block_on(async { racing_allocators(etcd(&server, "/t4/").await).await });
}

// ------------------------------------- zeroing never erases a committed slot

/// Extent faults take only clean slots, zeroed under a claim before. Here
/// parallel faults (a volume client's writers faulting distinct extents)
/// race a second zeroer refilling the same drives: no Write Zeroes may land
/// on a slot some extent owns, since its client may already have written
/// there. Each zeroing waits a different time, then looks at what is
/// committed.
async fn zeroing_spares_committed_slots<S: MetaStore>(s: S) {
    let c = Arc::new(Catalog::new(s, PlacementWeights::default()));
    for i in 0..3 {
        c.add_drive(spec(i, i), 512, 40 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = c
        .create_volume(VolumeSpec::new("z", 16 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    let erased = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let zeroer = |who: u64, c: Arc<Catalog<S>>, erased: Arc<std::sync::Mutex<Vec<String>>>| {
        move |job: ZeroJob| {
            let (cat, erased) = (c.clone(), erased.clone());
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(1 + 3 * (who % 4))).await;
                // The moment the zeroes would land.
                let layout = cat.layout("z").await.map_err(|e| e.to_string())?;
                for e in &layout.extents {
                    for r in e
                        .chain
                        .iter()
                        .filter(|r| r.drive == job.drive.id && job.slots.contains(&r.slot))
                    {
                        erased.lock().unwrap().push(format!(
                            "zeroer {who} zeroed slot {} of {}, committed to extent {}",
                            r.slot, r.drive, e.index
                        ));
                    }
                }
                Ok(())
            }
        }
    };
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (c, erased) = (c.clone(), erased.clone());
        let z = zeroer(i, c.clone(), erased);
        tasks.push(tokio::spawn(async move {
            c.allocate_with("z", v.id, i, z).await.unwrap();
        }));
    }
    {
        let (c, erased) = (c.clone(), erased.clone());
        tasks.push(tokio::spawn(async move {
            let z = zeroer(9, c.clone(), erased);
            for round in 0..6u32 {
                c.zero_ahead(DriveId(round % 3), 2, &z).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let erased = erased.lock().unwrap().clone();
    assert!(erased.is_empty(), "{erased:#?}");
    let s = check_catalog(c.store()).await.unwrap();
    assert_eq!(s.slots_used, 16);
}

#[test]
fn redb_zeroing_spares_committed_slots() {
    let (_d, s) = redb();
    rt().block_on(zeroing_spares_committed_slots(s));
}

#[test]
fn etcd_zeroing_spares_committed_slots() {
    let Some(server) = EtcdServer::start_or_skip("etcd_zeroing_spares_committed_slots") else {
        return;
    };
    rt().block_on(async { zeroing_spares_committed_slots(etcd(&server, "/t9/").await).await });
}

/// While extent faults commit back to back, the zeroer's steps (declare a
/// zeroed batch clean, claim the next) ride on the faults' transactions
/// instead of committing alone: every batch is still claimed by this
/// process in the store before its zeroes go out, at an epoch no lower than
/// the claim's revision; no zeroes land on a slot an extent owns; and the
/// ridden steps leave the same counts as steps committed alone would.
async fn zeroer_steps_ride_on_faults<S: MetaStore>(s: S) {
    let c = Arc::new(Catalog::new(s, PlacementWeights::default()));
    for i in 0..2 {
        c.add_drive(spec(i, i), 512, 200 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let extents = 120u64;
    let v = c
        .create_volume(VolumeSpec::new("r", extents * EXTENT_BYTES))
        .await
        .unwrap();
    let inline = |_job: ZeroJob| async { Ok(()) };
    // One fault first, so that the zeroer finds faults committing.
    c.allocate_with("r", v.id, 0, inline).await.unwrap();
    let problems = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let zeroer = {
        let (c, problems, stop) = (c.clone(), problems.clone(), stop.clone());
        tokio::spawn(async move {
            let zero = |job: ZeroJob| {
                let (c, problems) = (c.clone(), problems.clone());
                async move {
                    let drives = c.drives().await.map_err(|e| e.to_string())?;
                    let d = drives.iter().find(|d| d.id == job.drive.id).unwrap();
                    for slot in &job.slots {
                        if !d
                            .zeroing
                            .iter()
                            .any(|z| z.slot == *slot && z.claimant == c.claimant())
                        {
                            problems.lock().unwrap().push(format!(
                                "slot {slot} of {} zeroed without a committed claim",
                                d.id
                            ));
                        }
                    }
                    let layout = c.layout("r").await.map_err(|e| e.to_string())?;
                    for e in &layout.extents {
                        for r in e
                            .chain
                            .iter()
                            .filter(|r| r.drive == job.drive.id && job.slots.contains(&r.slot))
                        {
                            problems.lock().unwrap().push(format!(
                                "slot {} of {} zeroed while extent {} owns it",
                                r.slot, r.drive, e.index
                            ));
                        }
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    Ok(())
                }
            };
            let mut made = 0;
            for round in 0..200u32 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                made += c.zero_ahead(DriveId(round % 2), 4, &zero).await.unwrap();
            }
            made
        })
    };
    for i in 1..extents {
        c.allocate_with("r", v.id, i, inline).await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let made = zeroer.await.unwrap();
    let problems = problems.lock().unwrap().clone();
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        c.zeroer_steps_ridden() > 0,
        "no zeroer step rode on {extents} back-to-back faults"
    );
    let s = check_catalog(c.store()).await.unwrap();
    assert_eq!(s.slots_used, extents);
    // What was declared clean and not taken since is still clean; nothing
    // is left claimed (every ride was answered, every batch declared).
    let drives = c.drives().await.unwrap();
    assert!(drives.iter().all(|d| d.zeroing.is_empty()), "{drives:#?}");
    let clean: usize = drives.iter().map(|d| d.slots_clean()).sum();
    assert!(clean <= made, "{clean} clean slots, {made} made clean");
}

#[test]
fn redb_zeroer_steps_ride_on_faults() {
    let (_d, s) = redb();
    rt().block_on(zeroer_steps_ride_on_faults(s));
}

#[test]
fn etcd_zeroer_steps_ride_on_faults() {
    let Some(server) = EtcdServer::start_or_skip("etcd_zeroer_steps_ride_on_faults") else {
        return;
    };
    rt().block_on(async { zeroer_steps_ride_on_faults(etcd(&server, "/t40/").await).await });
}

// ------------------------------------------ stale claims and quarantine

/// Drive `id` as the catalog holds it now.
async fn drive<S: MetaStore>(c: &Catalog<S>, id: DriveId) -> sluice_volume::DriveRecord {
    c.drives()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.id == id)
        .unwrap()
}

/// A zeroing claim whose claimant is gone (here: its zeroing failed, as
/// when a leader is deposed mid-zeroing) is taken over by another process,
/// fenced above the old claim's epoch, zeroed at that epoch and declared
/// clean; on a drive that cannot fence it is quarantined instead. A deleted
/// volume's slots on a drive the delete could not fence are quarantined,
/// and released by a later fence or by the operator. The fsck holds after
/// every step.
async fn stale_claims_and_quarantine<S: MetaStore + Clone>(s: S) {
    let old = Catalog::new(s.clone(), PlacementWeights::default());
    let new = Catalog::new(s, PlacementWeights::default());
    assert_ne!(old.claimant(), new.claimant());
    let d0 = old
        .add_drive(spec(0, 0), 512, 8 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let d1 = old
        .add_drive(spec(1, 1), 512, 8 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let old_epoch = Arc::new(std::sync::Mutex::new(0));
    let failing = {
        let old_epoch = old_epoch.clone();
        move |job: ZeroJob| {
            *old_epoch.lock().unwrap() = job.epoch;
            async { Err("the old leader stalled".to_owned()) }
        }
    };
    for d in [d0.id, d1.id] {
        let e = old.zero_ahead(d, 2, &failing).await.unwrap_err();
        assert!(e.to_string().contains("stalled"), "{e}");
    }
    check_catalog(new.store()).await.unwrap();
    let old_epoch = *old_epoch.lock().unwrap();
    let stale = new.stale_claims(&drive(&new, d0.id).await);
    assert_eq!(stale, vec![0, 1]);

    // A drive that fences: fenced above the old zeroing, zeroed at the fence.
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let fence = {
        let seen = seen.clone();
        move |job: FenceJob| {
            seen.lock()
                .unwrap()
                .push(("fence", job.slots.clone(), job.epoch));
            async { Fenced::Yes }
        }
    };
    let zero = {
        let seen = seen.clone();
        move |job: ZeroJob| {
            seen.lock()
                .unwrap()
                .push(("zero", job.slots.clone(), job.epoch));
            async { Ok(()) }
        }
    };
    assert_eq!(
        new.recover_claims(d0.id, &stale, &fence, &zero)
            .await
            .unwrap(),
        Fenced::Yes
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[0].0, &seen[0].1), ("fence", &vec![0, 1]));
    assert_eq!((seen[1].0, &seen[1].1), ("zero", &vec![0, 1]));
    assert!(
        seen[0].2 > old_epoch,
        "fence {} not above the old zeroing {old_epoch}",
        seen[0].2
    );
    assert_eq!(seen[0].2, seen[1].2);
    let d = drive(&new, d0.id).await;
    assert_eq!((d.clean.clone(), d.zeroing.len()), (vec![0, 1], 0));
    check_catalog(new.store()).await.unwrap();

    // A drive that cannot fence: quarantined; then not reachable at all.
    let stale = new.stale_claims(&drive(&new, d1.id).await);
    let cannot = |_: FenceJob| async { Fenced::Unsupported };
    let never = |_: ZeroJob| async { panic!("zeroed without a fence") };
    assert_eq!(
        new.recover_claims(d1.id, &stale, &cannot, &never)
            .await
            .unwrap(),
        Fenced::Unsupported
    );
    let d = drive(&new, d1.id).await;
    assert_eq!((d.quarantined.clone(), d.zeroing.len()), (vec![0, 1], 0));
    assert_eq!(d.slots_free(), 6, "quarantined slots are not free");
    check_catalog(new.store()).await.unwrap();
    assert_eq!(new.release_quarantine(d1.id).await.unwrap(), 2);

    // A delete that could not fence d1 quarantines the volume's slots there.
    let v = new
        .create_volume(VolumeSpec::new("q", 2 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    for i in 0..2 {
        new.allocate_with("q", v.id, i, &zero).await.unwrap();
    }
    new.delete_volume_with("q", |_| async move { vec![d1.id] })
        .await
        .unwrap();
    check_catalog(new.store()).await.unwrap();
    let d = drive(&new, d1.id).await;
    assert_eq!(d.quarantined.len(), 2, "{d:?}");
    let d = drive(&new, d0.id).await;
    assert!(d.quarantined.is_empty(), "{d:?}");
    let unreachable = |_: FenceJob| async { Fenced::NotNow("unreachable".into()) };
    assert_eq!(
        new.release_fenced_quarantine(d1.id, &unreachable)
            .await
            .unwrap(),
        (Fenced::NotNow("unreachable".into()), 0)
    );
    let fenced_at = Arc::new(std::sync::Mutex::new(0));
    let fence = {
        let fenced_at = fenced_at.clone();
        move |job: FenceJob| {
            *fenced_at.lock().unwrap() = job.epoch;
            async { Fenced::Yes }
        }
    };
    assert_eq!(
        new.release_fenced_quarantine(d1.id, &fence).await.unwrap(),
        (Fenced::Yes, 2)
    );
    // Every later owner of those slots writes above the fence.
    let fenced_at = *fenced_at.lock().unwrap();
    let v = new
        .create_volume(VolumeSpec::new("r", 8 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    for i in 0..8 {
        let a = new.allocate_with("r", v.id, i, &zero).await.unwrap();
        assert!(
            a.extent.epoch > fenced_at,
            "epoch {} at or below the fence {fenced_at}",
            a.extent.epoch
        );
    }
    let s = check_catalog(new.store()).await.unwrap();
    assert_eq!(s.slots_used, 16);
}

#[test]
fn redb_stale_claims_are_fenced_and_unfenced_slots_quarantined() {
    let (_d, s) = redb();
    rt().block_on(stale_claims_and_quarantine(s));
}

#[test]
fn etcd_stale_claims_are_fenced_and_unfenced_slots_quarantined() {
    let Some(server) = EtcdServer::start_or_skip("etcd_stale_claims") else {
        return;
    };
    rt().block_on(async { stale_claims_and_quarantine(etcd(&server, "/t12/").await).await });
}

/// An extent fault whose chosen drive has every free slot claimed by a
/// zeroer that died (its claims stand until recovery) takes another drive
/// with room instead of waiting on those claims and giving up; with no
/// other drive it waits and reports contention (retryable), not a full
/// pool.
async fn faults_go_around_a_drive_held_by_stale_claims<S: MetaStore + Clone>(s: S) {
    let dead = Catalog::new(s.clone(), PlacementWeights::default());
    let c = Catalog::new(s, PlacementWeights::default());
    let died = |_: ZeroJob| async { Err::<(), String>("died".into()) };
    let a = c
        .add_drive(spec(0, 0), 512, 4 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let v = c
        .create_volume(VolumeSpec::new("v", 2 * EXTENT_BYTES))
        .await
        .unwrap();
    // Every free slot of the only drive claimed by the dead zeroer.
    assert!(dead.zero_ahead(a.id, 4, &died).await.is_err());
    assert_eq!(drive(&c, a.id).await.zeroing.len(), 4);
    match c.allocate_extent("v", v.id, 0).await {
        Err(CatalogError::Contended(_)) => {}
        other => panic!("no other drive: contended, got {other:?}"),
    }
    // A second drive with room: the fault takes it.
    let b = c
        .add_drive(spec(1, 1), 512, 4 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let e = c.allocate_extent("v", v.id, 0).await.unwrap();
    assert_eq!(
        e.chain.iter().map(|r| r.drive).collect::<Vec<_>>(),
        vec![b.id]
    );
    check_catalog(c.store()).await.unwrap();
}

#[test]
fn redb_faults_go_around_a_drive_held_by_stale_claims() {
    let (_d, s) = redb();
    rt().block_on(faults_go_around_a_drive_held_by_stale_claims(s));
}

// ------------------------------------------------------------- corrupt keys

#[test]
fn corrupt_metadata_names_the_key() {
    let (_d, s) = redb();
    rt().block_on(async {
        s.commit(Txn::default().put("drives/00000000", b"{\"id\": \"x\"".to_vec()))
            .await
            .unwrap();
        let e = check_catalog(&s).await.unwrap_err().to_string();
        assert!(e.contains("drives/00000000"), "{e}");
        let c = Catalog::new(s, PlacementWeights::default());
        let e = c.drives().await.unwrap_err().to_string();
        assert!(e.contains("drives/00000000"), "{e}");
    });
}

// ------------------------------------------------------------- model test

#[derive(Clone, Debug)]
enum Op {
    AddDrive(u32),
    Create(u8, u64, u8),
    Alloc(u8, u64),
    Resize(u8, u64),
    Delete(u8),
    DriveDown(u32),
    /// The zeroer makes up to n slots of a drive clean.
    ZeroAhead(u32, u8),
    /// Another control plane claims slots of a drive and dies zeroing.
    StaleClaims(u32, u8),
    /// Stale claims taken over on a drive that fences (or cannot).
    Recover(u32, bool),
    /// A delete that cannot fence one drive: its slots there quarantined.
    DeleteUnfenced(u8, u32),
    /// The quarantine of a drive released (by a fence, or the operator).
    Release(u32, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..6).prop_map(Op::AddDrive),
        (0u8..4, 1u64..12, 1u8..4).prop_map(|(n, e, r)| Op::Create(n, e, r)),
        (0u8..4, 0u64..14).prop_map(|(n, i)| Op::Alloc(n, i)),
        (0u8..4, 0u64..16).prop_map(|(n, e)| Op::Resize(n, e)),
        (0u8..4).prop_map(Op::Delete),
        (0u32..6).prop_map(Op::DriveDown),
        (0u32..6, 1u8..5).prop_map(|(i, n)| Op::ZeroAhead(i, n)),
        (0u32..6, 1u8..4).prop_map(|(i, n)| Op::StaleClaims(i, n)),
        (0u32..6, any::<bool>()).prop_map(|(i, f)| Op::Recover(i, f)),
        (0u8..4, 0u32..6).prop_map(|(n, i)| Op::DeleteUnfenced(n, i)),
        (0u32..6, any::<bool>()).prop_map(|(i, f)| Op::Release(i, f)),
    ]
}

/// What the model expects of the pool: drives (up, slots), volumes (extents,
/// replicas, allocated extents).
#[derive(Default)]
struct Model {
    drives: BTreeMap<u32, (bool, u64, DriveId)>,
    volumes: BTreeMap<u8, (u64, u8, BTreeSet<u64>)>,
}

impl Model {
    fn capacity(&self) -> u64 {
        self.drives
            .values()
            .filter(|(up, _, _)| *up)
            .map(|(_, s, _)| s)
            .sum()
    }
    fn reserved(&self) -> u64 {
        self.volumes
            .values()
            .map(|(e, r, _)| e * u64::from(*r))
            .sum()
    }
    fn used(&self) -> u64 {
        self.volumes
            .values()
            .map(|(_, r, a)| a.len() as u64 * u64::from(*r))
            .sum()
    }
}

/// Quarantined slots on drives in service (not available to reserve).
async fn quarantined_up<S: MetaStore>(c: &Catalog<S>) -> u64 {
    c.drives()
        .await
        .map(|ds| {
            ds.iter()
                .filter(|d| d.state == DriveState::Up)
                .map(|d| d.quarantined.len() as u64)
                .sum::<u64>()
        })
        .unwrap_or(0)
}

async fn run_model<S: MetaStore + Clone>(s: S, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let other = Catalog::new(s.clone(), PlacementWeights::default());
    let c = Catalog::new(s, PlacementWeights::default());
    let noop = |_: ZeroJob| async { Ok::<(), String>(()) };

    let mut m = Model::default();
    let mut ids: BTreeMap<u8, sluice_volume::VolumeId> = BTreeMap::new();
    let name = |n: u8| format!("vol{n}");
    for op in ops {
        match op {
            Op::AddDrive(i) => {
                let r = c
                    .add_drive(spec(i, i % 3), 512, 6 * EXTENT_BYTES, None)
                    .await;
                prop_assert_eq!(r.is_ok(), !m.drives.contains_key(&i), "{:?}", r);
                if let Ok(d) = r {
                    m.drives.insert(i, (true, 6, d.id));
                    prop_assert_eq!(d.slots_total, 6);
                }
            }
            Op::Create(n, e, r) => {
                let res = c
                    .create_volume(VolumeSpec::new(name(n), e * EXTENT_BYTES).with_replicas(r))
                    .await;
                let up = m.drives.values().filter(|(u, _, _)| *u).count();
                let held = quarantined_up(&c).await;
                let fits =
                    m.reserved() + e * u64::from(r) + held <= m.capacity() && up >= usize::from(r);
                match res {
                    Ok(v) => {
                        prop_assert!(!m.volumes.contains_key(&n) && fits);
                        m.volumes.insert(n, (e, r, BTreeSet::new()));
                        ids.insert(n, v.id);
                    }
                    Err(CatalogError::DuplicateVolume(_)) => {
                        prop_assert!(m.volumes.contains_key(&n))
                    }
                    Err(CatalogError::PoolFull(_)) => {
                        prop_assert!(!m.volumes.contains_key(&n) && !fits)
                    }
                    Err(e) => prop_assert!(false, "{}", e),
                }
            }
            Op::Alloc(n, i) => {
                let id = ids
                    .get(&n)
                    .copied()
                    .unwrap_or(sluice_volume::VolumeId(u64::MAX));
                let res = c.allocate_extent(&name(n), id, i).await;
                // Drives in service with a free slot no zeroer has claimed
                // (StaleClaims leaves a dead catalog's claims until Recover).
                let claimable = if matches!(res, Err(CatalogError::Contended(_))) {
                    let mut k = 0;
                    for (up, _, id) in m.drives.values() {
                        let d = drive(&c, *id).await;
                        k += usize::from(*up && d.slots_free() > d.zeroing.len() as u64);
                    }
                    k
                } else {
                    0
                };
                match (res, m.volumes.get_mut(&n)) {
                    (Ok(e), Some((ext, r, alloc))) => {
                        prop_assert!(i < *ext);
                        prop_assert_eq!(e.chain.len(), usize::from(*r));
                        alloc.insert(i);
                    }
                    (Err(CatalogError::UnknownVolume(_)), None) => {}
                    (Err(CatalogError::ExtentOutOfRange { .. }), Some((ext, _, _))) => {
                        prop_assert!(i >= *ext)
                    }
                    // Drives went down or filled up with other volumes'
                    // extents: the reservation counts in-service capacity.
                    (Err(CatalogError::PoolFull(_)), Some(_)) => {}
                    // Fewer drives than replicas have a slot the fault can
                    // claim: it waits for the claims, then gives up (the
                    // caller retries; recovery releases a dead one's).
                    (Err(CatalogError::Contended(_)), Some((_, r, _)))
                        if claimable < usize::from(*r) => {}
                    (r, v) => prop_assert!(
                        false,
                        "alloc {:?} with model {:?}",
                        r,
                        v.map(|v| (v.0, v.1))
                    ),
                }
            }
            Op::Resize(n, e) => {
                let res = c.resize_volume(&name(n), e.max(1) * EXTENT_BYTES).await;
                match (res, m.volumes.get_mut(&n)) {
                    (Ok(v), Some(model)) => {
                        prop_assert!(e.max(1) >= model.0);
                        model.0 = v.extents();
                    }
                    (Err(CatalogError::Shrink { .. }), Some(model)) => {
                        prop_assert!(e.max(1) < model.0)
                    }
                    (Err(CatalogError::PoolFull(_)), Some(_)) => {}
                    (Err(CatalogError::UnknownVolume(_)), None) => {}
                    (r, _) => prop_assert!(false, "resize {:?}", r),
                }
            }
            Op::Delete(n) => {
                let res = c.delete_volume(&name(n)).await;
                prop_assert_eq!(res.is_ok(), m.volumes.remove(&n).is_some());
            }
            Op::ZeroAhead(i, n) => {
                if let Some((_, _, id)) = m.drives.get(&i) {
                    c.zero_ahead(*id, usize::from(n), &noop)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            Op::StaleClaims(i, n) => {
                if let Some((_, _, id)) = m.drives.get(&i) {
                    let fail = |_: ZeroJob| async { Err::<(), String>("died".into()) };
                    match other.zero_ahead(*id, usize::from(n), &fail).await {
                        Ok(0) | Err(CatalogError::Prepare(_)) => {}
                        r => prop_assert!(false, "stale claim {:?}", r),
                    }
                }
            }
            Op::Recover(i, fences) => {
                if let Some((_, _, id)) = m.drives.get(&i) {
                    let stale = c.stale_claims(&drive(&c, *id).await);
                    let fence = move |_: FenceJob| async move {
                        if fences {
                            Fenced::Yes
                        } else {
                            Fenced::Unsupported
                        }
                    };
                    c.recover_claims(*id, &stale, &fence, &noop)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let d = drive(&c, *id).await;
                    prop_assert!(d.zeroing.is_empty(), "claims left: {:?}", d.zeroing);
                }
            }
            Op::DeleteUnfenced(n, i) => {
                let unfenced: Vec<DriveId> = m.drives.get(&i).map(|d| d.2).into_iter().collect();
                let res = c
                    .delete_volume_with(&name(n), |_| {
                        let unfenced = unfenced.clone();
                        async move { unfenced }
                    })
                    .await;
                prop_assert_eq!(res.is_ok(), m.volumes.remove(&n).is_some());
            }
            Op::Release(i, fences) => {
                if let Some((_, _, id)) = m.drives.get(&i) {
                    if fences {
                        c.release_fenced_quarantine(*id, &|_: FenceJob| async { Fenced::Yes })
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    } else {
                        c.release_quarantine(*id)
                            .await
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                    let d = drive(&c, *id).await;
                    prop_assert!(d.quarantined.is_empty());
                }
            }
            Op::DriveDown(i) => match m.drives.get_mut(&i) {
                Some(d) => {
                    c.set_drive_state(d.2, DriveState::Down)
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    d.0 = false;
                }
                None => {
                    let unknown = c.set_drive_state(DriveId(1000 + i), DriveState::Down).await;
                    prop_assert!(matches!(unknown, Err(CatalogError::UnknownDrive(_))));
                }
            },
        }
        let summary = check_catalog(c.store())
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(summary.slots_used, m.used());
        prop_assert_eq!(summary.volumes, m.volumes.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Random operations agree with a model of the pool, and the catalog's
    /// invariants hold after every one.
    #[test]
    fn redb_catalog_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let (_d, s) = redb();
        rt().block_on(run_model(s, ops))?;
    }
}

#[test]
fn etcd_catalog_matches_the_model() {
    let Some(server) = EtcdServer::start_or_skip("etcd_catalog_matches_the_model") else {
        return;
    };
    let rt = rt();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        ..ProptestConfig::default()
    });
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&proptest::collection::vec(op(), 1..30), |ops| {
            let prefix = format!(
                "/model{}/",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            rt.block_on(async { run_model(etcd(&server, &prefix).await, ops).await })
        })
        .unwrap();
}

// ------------------------------------------------------------- failed drives

async fn failed_drive<S: MetaStore>(s: S) {
    let c = Catalog::new(s, PlacementWeights::default());
    for i in 0..3 {
        c.add_drive(spec(i, i), 512, 80 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let r2 = c
        .create_volume(VolumeSpec::new("r2", 70 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    let r1 = c
        .create_volume(VolumeSpec::new("r1", 10 * EXTENT_BYTES))
        .await
        .unwrap();
    for i in 0..70 {
        c.allocate_extent("r2", r2.id, i).await.unwrap();
    }
    for i in 0..10 {
        c.allocate_extent("r1", r1.id, i).await.unwrap();
    }
    let on_d0 = |l: &sluice_meta::catalog::VolumeLayout| {
        l.extents
            .iter()
            .filter(|e| e.chain.iter().any(|r| r.drive == DriveId(0)))
            .count() as u64
    };
    let before = on_d0(&c.layout("r2").await.unwrap());
    let single_before = on_d0(&c.layout("r1").await.unwrap());
    assert!(
        before > 40,
        "enough chains to need several transactions: {before}"
    );
    // Shortens every replicated chain on the drive, in several transactions.
    assert_eq!(c.fail_drive(DriveId(0)).await.unwrap(), before);
    let l = c.layout("r2").await.unwrap();
    assert_eq!(on_d0(&l), 0);
    assert!(l.volume.epoch > r2.epoch);
    assert!(l
        .extents
        .iter()
        .all(|e| e.chain.len() == 1 || e.chain.len() == 2));
    // Single-replica extents keep their only copy.
    assert_eq!(on_d0(&c.layout("r1").await.unwrap()), single_before);
    let d0 = c
        .drives()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.id == DriveId(0))
        .unwrap();
    assert_eq!(d0.state, DriveState::Down);
    check_catalog(c.store()).await.unwrap();
    // Idempotent.
    assert_eq!(c.fail_drive(DriveId(0)).await.unwrap(), 0);
}

#[test]
fn redb_failed_drive_leaves_every_replicated_chain() {
    let (_d, s) = redb();
    rt().block_on(failed_drive(s));
}

#[test]
fn etcd_failed_drive_leaves_every_replicated_chain() {
    let Some(server) = EtcdServer::start_or_skip("etcd_failed_drive") else {
        return;
    };
    rt().block_on(async { failed_drive(etcd(&server, "/t5/").await).await });
}

// ------------------------------------- the allocation fast path stays fresh

async fn drive_added_elsewhere_is_used<S: MetaStore + Clone>(s: S) {
    let a = Catalog::new(s.clone(), PlacementWeights::default());
    let b = Catalog::new(s, PlacementWeights::default());
    a.add_drive(spec(0, 0), 512, 40 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let v = a
        .create_volume(VolumeSpec::new("f", 20 * EXTENT_BYTES))
        .await
        .unwrap();
    for i in 0..4 {
        a.allocate_extent("f", v.id, i).await.unwrap();
    }
    // Another control plane adds a drive; `a`'s copies do not know it.
    let d1 = b
        .add_drive(spec(1, 1), 512, 40 * EXTENT_BYTES, None)
        .await
        .unwrap();
    let mut on_new = 0;
    for i in 4..12 {
        let e = a.allocate_extent("f", v.id, i).await.unwrap();
        on_new += usize::from(e.chain[0].drive == d1.id);
    }
    assert!(on_new >= 6, "the new drive takes the spread: {on_new} of 8");
    // And a drive taken down elsewhere gets nothing new.
    b.set_drive_state(d1.id, DriveState::Down).await.unwrap();
    for i in 12..16 {
        assert_ne!(
            a.allocate_extent("f", v.id, i).await.unwrap().chain[0].drive,
            d1.id
        );
    }
    check_catalog(a.store()).await.unwrap();
}

#[test]
fn redb_allocation_fast_path_sees_changes_made_elsewhere() {
    let (_d, s) = redb();
    rt().block_on(drive_added_elsewhere_is_used(s));
}

#[test]
fn etcd_allocation_fast_path_sees_changes_made_elsewhere() {
    let Some(server) = EtcdServer::start_or_skip("etcd_fast_path") else {
        return;
    };
    rt().block_on(async { drive_added_elsewhere_is_used(etcd(&server, "/t6/").await).await });
}

// ------------------------------------------------------------------ rebuilds

/// A failed drive leaves degraded extents; each is rebuilt onto a drive
/// outside its chain, on another target while one has room, through
/// begin (a reserved replica, a higher epoch) and finish (the replica joins
/// the tail at a higher epoch still) or abort (the slot comes back). The
/// fsck holds at every step, and the replica being rebuilt is lost cleanly
/// when its own drive fails.
async fn used<S: MetaStore>(c: &Catalog<S>) -> u64 {
    c.drives()
        .await
        .unwrap()
        .iter()
        .map(|d| d.slots_used())
        .sum()
}

async fn rebuild<S: MetaStore>(s: S) {
    let c = Catalog::new(s, PlacementWeights::default());
    // Drives 0 and 1 on target 0, 2 and 3 on targets 1 and 2.
    for (i, t) in [(0, 0), (1, 0), (2, 1), (3, 2)] {
        c.add_drive(spec(i, t), 512, 20 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = c
        .create_volume(VolumeSpec::new("v", 8 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    let mut epochs = Vec::new();
    for i in 0..8 {
        let e = c.allocate_extent("v", v.id, i).await.unwrap();
        assert!(e.epoch > 0);
        epochs.push(e.epoch);
    }
    assert!(c.degraded_volumes().await.unwrap().is_empty());
    let victim = c.layout("v").await.unwrap().extents[0].chain[0].drive;
    let shortened = c.fail_drive(victim).await.unwrap();
    assert!(shortened > 0);
    let degraded = c.degraded_volumes().await.unwrap();
    assert_eq!(degraded.len(), 1);
    assert_eq!(degraded[0].degraded_extents, shortened);
    check_catalog(c.store()).await.unwrap();
    let todo = c.degraded_extents(&degraded[0], 100).await.unwrap();
    assert_eq!(todo.len() as u64, shortened);

    // Begin: a new replica outside the chain, on a target it does not use.
    let e0 = &todo[0];
    let r = c.begin_rebuild("v", e0.index).await.unwrap().unwrap();
    let target = r.target().unwrap();
    assert!(!e0.chain.iter().any(|x| x.drive == target.drive));
    assert_ne!(target.drive, victim);
    let target_of = |d: DriveId| spec(d.0, [0, 0, 1, 2][d.0 as usize]).addr;
    assert_ne!(target_of(target.drive), target_of(e0.chain[0].drive));
    assert!(r.extent.epoch > e0.epoch, "the epoch rises at begin");
    check_catalog(c.store()).await.unwrap();
    // Begin again: the same rebuild (a restarted control plane resumes it).
    assert_eq!(
        c.begin_rebuild("v", e0.index).await.unwrap(),
        Some(r.clone())
    );
    // Finish: the replica joins the tail, at a higher epoch.
    let done = c.finish_rebuild(&r).await.unwrap().unwrap();
    assert_eq!(done.chain.len(), 2);
    assert_eq!(done.chain[1], target);
    assert!(done.epoch > r.extent.epoch);
    assert_eq!(
        c.finish_rebuild(&r).await.unwrap(),
        None,
        "finishing twice changes nothing"
    );
    assert_eq!(
        c.begin_rebuild("v", e0.index).await.unwrap(),
        None,
        "no longer degraded"
    );
    check_catalog(c.store()).await.unwrap();

    // Abort gives the slot back; the extent stays degraded.
    let e1 = &todo[1];
    let before = used(&c).await;
    let r = c.begin_rebuild("v", e1.index).await.unwrap().unwrap();
    assert_eq!(used(&c).await, before + 1);
    c.abort_rebuild(&r).await.unwrap().unwrap();
    assert_eq!(used(&c).await, before);
    check_catalog(c.store()).await.unwrap();

    // The drive being rebuilt onto fails: the rebuild is dropped, its slot
    // freed, and the extent stays degraded for another attempt.
    let r = c.begin_rebuild("v", e1.index).await.unwrap().unwrap();
    c.fail_drive(r.target().unwrap().drive).await.unwrap();
    let l = c.layout("v").await.unwrap();
    let e = l.extents.iter().find(|e| e.index == e1.index).unwrap();
    assert_eq!(e.rebuilding, None);
    assert_eq!(
        c.finish_rebuild(&r).await.unwrap(),
        None,
        "a lost rebuild cannot finish"
    );
    check_catalog(c.store()).await.unwrap();

    // Rebuild everything still degraded onto what is left.
    loop {
        let vols = c.degraded_volumes().await.unwrap();
        let Some(v) = vols.first() else { break };
        for e in c.degraded_extents(v, 100).await.unwrap() {
            match c.begin_rebuild("v", e.index).await {
                Ok(Some(r)) => {
                    c.finish_rebuild(&r).await.unwrap().unwrap();
                }
                Ok(None) => {}
                Err(CatalogError::PoolFull(m)) => panic!("two drives remain: {m}"),
                Err(e) => panic!("{e}"),
            }
        }
    }
    let l = c.layout("v").await.unwrap();
    assert!(l
        .extents
        .iter()
        .all(|e| e.chain.len() == 2 && e.rebuilding.is_none()));
    assert_eq!(l.volume.degraded_extents, 0);
    check_catalog(c.store()).await.unwrap();
    // Deleting frees everything, rebuilt replicas included.
    c.delete_volume("v").await.unwrap();
    assert_eq!(used(&c).await, 0);
    check_catalog(c.store()).await.unwrap();
}

#[test]
fn redb_rebuilds_restore_every_chain() {
    let (_d, s) = redb();
    rt().block_on(rebuild(s));
}

#[test]
fn etcd_rebuilds_restore_every_chain() {
    let Some(server) = EtcdServer::start_or_skip("etcd_rebuild") else {
        return;
    };
    rt().block_on(async { rebuild(etcd(&server, "/t7/").await).await });
}

// ------------------------------------------------------------------ remaps

/// An extent remapped off a (congested) drive: begin reserves a replica
/// outside the chain and the drives to avoid and marks the old one
/// retiring (the extent counts as needing the rebuilder, so a restarted
/// control plane resumes it); finish swaps them and frees the old slot;
/// abort gives the new slot back and lifts the epoch over the fence the
/// move may have raised. A failure of either drive mid-move ends clean.
async fn remap<S: MetaStore>(s: S) {
    let c = Catalog::new(s, PlacementWeights::default());
    for (i, t) in [(0, 0), (1, 1), (2, 2), (3, 3)] {
        c.add_drive(spec(i, t), 512, 20 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = c
        .create_volume(VolumeSpec::new("v", 8 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    for i in 0..8 {
        c.allocate_extent("v", v.id, i).await.unwrap();
    }
    let l = c.layout("v").await.unwrap();
    let e0 = l.extents[0].clone();
    let (hot, other) = (e0.chain[0].drive, e0.chain[1].drive);
    let free: Vec<DriveId> = (0..4)
        .map(DriveId)
        .filter(|d| *d != hot && *d != other)
        .collect();
    let avoid = free[0];
    // Nowhere to go when every drive outside the chain is to be avoided.
    assert!(matches!(
        c.begin_move("v", 0, hot, &free).await,
        Err(CatalogError::PoolFull(_))
    ));
    // Avoided drives are not chosen.
    let r = c.begin_move("v", 0, hot, &[avoid]).await.unwrap().unwrap();
    assert_eq!(r.target().unwrap().drive, free[1]);
    c.abort_rebuild(&r).await.unwrap().unwrap();
    let e0 = c.layout("v").await.unwrap().extents[0].clone();
    // A drive the chain does not use: nothing to move.
    assert_eq!(c.begin_move("v", 0, avoid, &[]).await.unwrap(), None);
    let before = used(&c).await;
    let r = c.begin_move("v", 0, hot, &[]).await.unwrap().unwrap();
    let to = r.target().unwrap();
    assert!(to.drive != hot && to.drive != other);
    assert_eq!(r.extent.retiring, Some(e0.chain[0]));
    assert!(r.extent.epoch > e0.epoch);
    assert_eq!(used(&c).await, before + 1);
    assert_eq!(c.volume("v").await.unwrap().degraded_extents, 1);
    check_catalog(c.store()).await.unwrap();
    // Resumed as any rebuild in progress; not begun twice.
    assert_eq!(c.begin_rebuild("v", 0).await.unwrap(), Some(r.clone()));
    assert_eq!(c.begin_move("v", 0, other, &[]).await.unwrap(), None);
    let todo = c.degraded_volumes().await.unwrap();
    assert_eq!(c.degraded_extents(&todo[0], 10).await.unwrap().len(), 1);
    // Finish: the new replica replaces the retiring one; its slot is free.
    let done = c.finish_rebuild(&r).await.unwrap().unwrap();
    assert_eq!(done.chain.len(), 2);
    assert!(!done.chain.iter().any(|x| x.drive == hot));
    assert_eq!(done.chain[1], to);
    assert_eq!(done.retiring, None);
    assert!(done.epoch > r.extent.epoch);
    assert_eq!(used(&c).await, before);
    let vol = c.volume("v").await.unwrap();
    assert_eq!(vol.degraded_extents, 0);
    assert_eq!(vol.extents_per_drive.values().sum::<u64>(), 16);
    check_catalog(c.store()).await.unwrap();

    // Abort: the chain is as it was, at an epoch above the move's.
    let e1 = c.layout("v").await.unwrap().extents[1].clone();
    let r = c
        .begin_move("v", 1, e1.chain[1].drive, &[])
        .await
        .unwrap()
        .unwrap();
    let back = c.abort_rebuild(&r).await.unwrap().unwrap();
    assert_eq!(back.chain, e1.chain);
    assert!(back.epoch > r.extent.epoch);
    assert_eq!(used(&c).await, before);
    assert_eq!(c.volume("v").await.unwrap().degraded_extents, 0);
    check_catalog(c.store()).await.unwrap();

    // The new replica's drive fails mid-move: the move is given up.
    let e2 = c.layout("v").await.unwrap().extents[2].clone();
    let r = c
        .begin_move("v", 2, e2.chain[0].drive, &[])
        .await
        .unwrap()
        .unwrap();
    c.fail_drive(r.target().unwrap().drive).await.unwrap();
    let e = c.layout("v").await.unwrap().extents[2].clone();
    assert_eq!((e.rebuilding, e.retiring), (None, None));
    assert!(e.epoch > r.extent.epoch);
    assert_eq!(c.finish_rebuild(&r).await.unwrap(), None);
    check_catalog(c.store()).await.unwrap();

    // The retiring replica's drive fails mid-move: the copy now replaces
    // a lost replica, and finishing restores the chain.
    let e3 = c
        .layout("v")
        .await
        .unwrap()
        .extents
        .into_iter()
        .find(|e| e.chain.len() == 2)
        .unwrap();
    let r = c
        .begin_move("v", e3.index, e3.chain[0].drive, &[])
        .await
        .unwrap()
        .unwrap();
    c.fail_drive(e3.chain[0].drive).await.unwrap();
    let e = c.layout("v").await.unwrap().extents[usize::try_from(e3.index).unwrap()].clone();
    assert_eq!(e.retiring, None);
    assert_eq!(e.rebuilding, r.target());
    check_catalog(c.store()).await.unwrap();
    let r = c.begin_rebuild("v", e3.index).await.unwrap().unwrap();
    let done = c.finish_rebuild(&r).await.unwrap().unwrap();
    assert_eq!(done.chain.len(), 2);
    check_catalog(c.store()).await.unwrap();
    c.delete_volume("v").await.unwrap();
    assert_eq!(used(&c).await, 0);
    check_catalog(c.store()).await.unwrap();
}

#[test]
fn redb_remaps_move_an_extent_off_a_drive() {
    let (_d, s) = redb();
    rt().block_on(remap(s));
}

#[test]
fn etcd_remaps_move_an_extent_off_a_drive() {
    let Some(server) = EtcdServer::start_or_skip("etcd_remap") else {
        return;
    };
    rt().block_on(async { remap(etcd(&server, "/t8/").await).await });
}

// ------------------------------------------- operations interleaved between reads

/// Runs `op` once, at the first read of `at` after a read of anything
/// under `after`: another control plane's transaction landing between two
/// reads of one operation (each of which reads the store key by key, not
/// at one moment).
struct Interleaved<S> {
    inner: Arc<S>,
    after: String,
    at: String,
    armed: std::sync::atomic::AtomicBool,
    op: tokio::sync::Mutex<Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>>,
    fired: std::sync::atomic::AtomicBool,
}

impl<S: MetaStore> Interleaved<S> {
    /// A plain handle on the same store (nothing interleaved).
    fn plain(inner: &Arc<S>) -> Interleaved<S> {
        Interleaved {
            inner: inner.clone(),
            after: String::new(),
            at: String::new(),
            armed: false.into(),
            op: tokio::sync::Mutex::new(None),
            fired: false.into(),
        }
    }

    fn with(
        inner: &Arc<S>,
        after: String,
        at: String,
        op: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Interleaved<S> {
        Interleaved {
            after,
            at,
            op: tokio::sync::Mutex::new(Some(Box::pin(op))),
            ..Interleaved::plain(inner)
        }
    }

    async fn read(&self, key: &str) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.at.is_empty() {
            return;
        }
        if key == self.at && self.armed.load(SeqCst) {
            if let Some(op) = self.op.lock().await.take() {
                op.await;
                self.fired.store(true, SeqCst);
            }
        }
        if key.starts_with(&self.after) {
            self.armed.store(true, SeqCst);
        }
    }
}

impl<S: MetaStore> MetaStore for Interleaved<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    async fn get(&self, key: &str) -> Result<Option<sluice_meta::Versioned>, StoreError> {
        self.read(key).await;
        self.inner.get(key).await
    }
    async fn list(
        &self,
        prefix: &str,
    ) -> Result<(u64, Vec<(String, sluice_meta::Versioned)>), StoreError> {
        self.read(prefix).await;
        self.inner.list(prefix).await
    }
    async fn commit(&self, txn: Txn) -> Result<Committed, StoreError> {
        self.inner.commit(txn).await
    }
}

/// Two drives on each of three targets, a volume of 6 extents with 2
/// replicas on them.
async fn replicated<S: MetaStore>(store: &Arc<S>) -> Catalog<Interleaved<S>> {
    let c = Catalog::new(Interleaved::plain(store), PlacementWeights::default());
    for (i, t) in [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)] {
        c.add_drive(spec(i, t), 512, 20 * EXTENT_BYTES, None)
            .await
            .unwrap();
    }
    let v = c
        .create_volume(VolumeSpec::new("v", 6 * EXTENT_BYTES).with_replicas(2))
        .await
        .unwrap();
    for i in 0..6 {
        c.allocate_extent("v", v.id, i).await.unwrap();
    }
    c
}

/// One drive's failure reported twice at once (two clients lose the same
/// target, or a client and the rebuilder's probe): the second report reads
/// the extents, then the first commits (taking the drive out of their
/// chains and freeing its slots), then the second reads the drive and
/// finds those slots free. That is a stale read, retried, not an
/// inconsistency: both reports succeed, the chains are shortened once,
/// and the fsck holds. (Before, the second report failed with "slot N of
/// dK is already free", and a volume client writing through the failure
/// saw that error.)
async fn a_failure_reported_twice_at_once<S: MetaStore>(store: S) {
    let store = Arc::new(store);
    let c = replicated(&store).await;
    let v = c.layout("v").await.unwrap();
    let victim = v.extents[0].chain[0].drive;
    let first = Arc::new(Catalog::new(
        Interleaved::plain(&store),
        PlacementWeights::default(),
    ));
    let shortened_first = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let op = {
        let (first, n) = (first.clone(), shortened_first.clone());
        async move {
            let k = first.fail_drive(victim).await.unwrap();
            n.store(k, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let second = Catalog::new(
        Interleaved::with(
            &store,
            sluice_meta::keys::extents_of(v.volume.id),
            sluice_meta::keys::drive(victim),
            op,
        ),
        PlacementWeights::default(),
    );
    let shortened_second = second.fail_drive(victim).await.unwrap();
    assert!(
        second
            .store()
            .fired
            .load(std::sync::atomic::Ordering::SeqCst),
        "the first report landed between the second's reads"
    );
    let shortened_first = shortened_first.load(std::sync::atomic::Ordering::SeqCst);
    let on_victim = v
        .extents
        .iter()
        .filter(|e| e.chain.iter().any(|r| r.drive == victim))
        .count() as u64;
    assert!(on_victim > 0);
    assert_eq!(shortened_first, on_victim, "the first report did it all");
    assert_eq!(shortened_second, 0, "nothing was left to the second");
    let after = c.layout("v").await.unwrap();
    assert!(after
        .extents
        .iter()
        .all(|e| e.chain.iter().all(|r| r.drive != victim)));
    let d = c.drives().await.unwrap();
    let victim_record = d.iter().find(|d| d.id == victim).unwrap();
    assert_eq!(
        victim_record.slots_used(),
        0,
        "its slots were given back once"
    );
    check_catalog(store.as_ref()).await.unwrap();
}

/// A rebuild onto a drive is given up (its copy failed) while that drive
/// is failed: the failure commits between the abort's read of the extent
/// and its read of the drive. The abort finds the rebuild gone (`None`),
/// not an inconsistency, and the slot is freed once.
async fn a_rebuild_aborted_as_its_drive_fails<S: MetaStore>(store: S) {
    let store = Arc::new(store);
    let c = replicated(&store).await;
    let victim = c.layout("v").await.unwrap().extents[0].chain[0].drive;
    c.fail_drive(victim).await.unwrap();
    let degraded = c.degraded_volumes().await.unwrap();
    let todo = c.degraded_extents(&degraded[0], 100).await.unwrap();
    let r = c.begin_rebuild("v", todo[0].index).await.unwrap().unwrap();
    let target = r.target().unwrap().drive;
    let used_before = used(&c).await;
    let other = Arc::new(Catalog::new(
        Interleaved::plain(&store),
        PlacementWeights::default(),
    ));
    let op = {
        let other = other.clone();
        async move {
            other.fail_drive(target).await.unwrap();
        }
    };
    let aborting = Catalog::new(
        Interleaved::with(
            &store,
            sluice_meta::keys::extent(r.volume.id, r.extent.index),
            sluice_meta::keys::drive(target),
            op,
        ),
        PlacementWeights::default(),
    );
    assert_eq!(aborting.abort_rebuild(&r).await.unwrap(), None);
    assert!(aborting
        .store()
        .fired
        .load(std::sync::atomic::Ordering::SeqCst));
    let l = c.layout("v").await.unwrap();
    let e = l
        .extents
        .iter()
        .find(|e| e.index == r.extent.index)
        .unwrap();
    assert_eq!(e.rebuilding, None);
    // The rebuild's reserved slot was freed once, by the failure (with
    // every other slot on that drive).
    let d = c.drives().await.unwrap();
    assert_eq!(d.iter().find(|d| d.id == target).unwrap().slots_used(), 0);
    assert!(used(&c).await < used_before);
    check_catalog(store.as_ref()).await.unwrap();
}

#[test]
fn redb_operations_interleaved_between_reads_retry_instead_of_failing() {
    let (_d, s) = redb();
    rt().block_on(a_failure_reported_twice_at_once(s));
    let (_d, s) = redb();
    rt().block_on(a_rebuild_aborted_as_its_drive_fails(s));
}

#[test]
fn etcd_operations_interleaved_between_reads_retry_instead_of_failing() {
    let Some(server) = EtcdServer::start_or_skip("etcd_interleaved") else {
        return;
    };
    rt().block_on(async {
        a_failure_reported_twice_at_once(etcd(&server, "/t-il1/").await).await;
        a_rebuild_aborted_as_its_drive_fails(etcd(&server, "/t-il2/").await).await;
    });
}
