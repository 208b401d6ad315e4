//! Charging through the kernel: `ConnectOptions::cgroup` moves every queue
//! thread into a cgroup v1 `cpu` cgroup (needs root and
//! /sys/fs/cgroup/cpu; skipped with a printed reason otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::RealTarget;
use sluice_host::{ConnectOptions, Controller, HostError, IoFlags};

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";

/// Removes the test cgroup at the end (moving any thread left back to the
/// root first).
struct CgGuard(PathBuf);

impl Drop for CgGuard {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let tasks = std::fs::read_to_string(self.0.join("tasks")).unwrap_or_default();
            if tasks.trim().is_empty() || Instant::now() > deadline {
                for t in tasks.lines() {
                    let _ = std::fs::write(Path::new(CPU_ROOT).join("tasks"), t);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn opts() -> ConnectOptions {
    ConnectOptions {
        hostnqn: "nqn.2024-01.io.sluice:tenant-cg".into(),
        io_queues: 2,
        queue_depth: 16,
        command_timeout: Duration::from_secs(5),
        ..Default::default()
    }
}

fn cpu_stat(cg: &Path) -> (u64, u64) {
    let s = std::fs::read_to_string(cg.join("cpu.stat")).unwrap();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0u64)
    };
    (get("nr_periods "), get("nr_throttled "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_threads_join_cgroup_v1() {
    if !Path::new(CPU_ROOT).join("tasks").exists() {
        println!("SKIPPED: {CPU_ROOT} (cgroup v1 cpu) is absent");
        return;
    }
    let cg = Path::new(CPU_ROOT).join(format!("sluice-host-test-{}", std::process::id()));
    std::fs::create_dir_all(&cg).expect("create the test cgroup (root needed)");
    let _guard = CgGuard(cg.clone());
    // A CFS quota so the kernel's bandwidth control runs (nr_periods counts).
    std::fs::write(cg.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(cg.join("cpu.cfs_quota_us"), "500000").unwrap();

    let t = RealTarget::start();
    let c = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(cg.clone()),
            ..opts()
        },
    )
    .await
    .expect("connect");
    let tids = c.queue_tids();
    assert_eq!(tids.len(), 3, "admin + 2 I/O queues");
    let tasks: Vec<i32> = std::fs::read_to_string(cg.join("tasks"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    for tid in &tids {
        assert!(*tid > 0);
        assert!(tasks.contains(tid), "tid {tid} not in {tasks:?}");
        let own = sluice_cpu::thread_cgroups(*tid).unwrap();
        let name = cg.file_name().unwrap().to_str().unwrap();
        assert!(
            own.lines().any(|l| l.contains(":cpu") && l.ends_with(name)),
            "/proc/self/task/{tid}/cgroup: {own}"
        );
    }
    // This (test) thread stays outside.
    assert!(!tasks.contains(&sluice_runtime::clock::current_tid()));

    let cpu0: u64 = tids
        .iter()
        .map(|t| sluice_runtime::clock::thread_cpu_ns(*t).unwrap())
        .sum();
    let (p0, _) = cpu_stat(&cg);
    let ns = c.namespace(1).expect("ns");
    let data = vec![0x5au8; 64 * 1024];
    let end = Instant::now() + Duration::from_millis(400);
    while Instant::now() < end {
        ns.write(0, &data, IoFlags::default()).await.expect("write");
        let r = ns
            .read(0, data.len(), IoFlags::default())
            .await
            .expect("read");
        assert_eq!(r.len(), data.len());
    }
    let cpu1: u64 = tids
        .iter()
        .map(|t| sluice_runtime::clock::thread_cpu_ns(*t).unwrap())
        .sum();
    let (p1, _) = cpu_stat(&cg);
    assert!(cpu1 > cpu0, "queue threads used no CPU: {cpu0} -> {cpu1}");
    assert!(
        p1 > p0,
        "the cgroup's CFS bandwidth periods did not advance ({p0} -> {p1}): the kernel does not see its threads"
    );
    c.disconnect(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn missing_cgroup_fails_connect_naming_path() {
    let t = RealTarget::start();
    let bad = PathBuf::from("/sys/fs/cgroup/cpu/sluice-no-such-cgroup");
    let e = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(bad.clone()),
            ..opts()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, HostError::Cgroup(_)), "{e:?}");
    let s = e.to_string();
    assert!(
        s.contains(bad.to_str().unwrap()) && s.contains("does not exist"),
        "{s}"
    );
}

#[tokio::test]
async fn unwritable_cgroup_fails_connect_naming_path() {
    // A directory that looks like a v1 cgroup but whose `tasks` is a
    // directory (cannot be written): the queue thread's join fails, and
    // connect returns that error, naming the file.
    let d = std::env::temp_dir().join(format!("sluice-host-cg-{}", std::process::id()));
    std::fs::create_dir_all(d.join("tasks")).unwrap();
    let t = RealTarget::start();
    let e = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(d.clone()),
            ..opts()
        },
    )
    .await
    .unwrap_err();
    let _ = std::fs::remove_dir_all(&d);
    let s = e.to_string();
    assert!(matches!(e, HostError::Cgroup(_)), "{e:?}");
    assert!(
        s.contains(d.join("tasks").to_str().unwrap()) && s.contains("cannot write"),
        "{s}"
    );
    // Not a cgroup at all.
    let plain = std::env::temp_dir().join(format!("sluice-host-notcg-{}", std::process::id()));
    std::fs::create_dir_all(&plain).unwrap();
    let e = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(plain.clone()),
            ..opts()
        },
    )
    .await
    .unwrap_err()
    .to_string();
    let _ = std::fs::remove_dir_all(&plain);
    assert!(
        e.contains(plain.to_str().unwrap()) && e.contains("not a cgroup"),
        "{e}"
    );
}

/// The cgroup v2 mount point, if any (a unified hierarchy beside v1 here,
/// `/sys/fs/cgroup` itself on a v2-only machine).
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (ty == "cgroup2").then(|| PathBuf::from(dir))
    })
}

/// This process's cgroup v2 path relative to the mount (`0::/path`).
fn own_v2_cgroup() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::").map(|p| p.to_string()))
}

/// Puts the process back into its v2 cgroup and removes the test ones.
struct V2Guard {
    root: PathBuf,
    orig: String,
    domain: PathBuf,
}

impl Drop for V2Guard {
    fn drop(&mut self) {
        let orig = self.root.join(self.orig.trim_start_matches('/'));
        let _ = std::fs::write(orig.join("cgroup.procs"), std::process::id().to_string());
        let _ = std::fs::remove_dir(self.domain.join("t"));
        let _ = std::fs::remove_dir(&self.domain);
    }
}

/// cgroup v2: the queue threads join a threaded cgroup through
/// `cgroup.threads` (the kernel's own view, `/proc/self/task/TID/cgroup`,
/// is checked), and a domain cgroup is refused unless `cgroup_procs` is
/// set. The v2 hierarchy here has no `cpu` controller, so quota enforcement
/// is not shown; only the kernel's membership rules are exercised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_threads_join_cgroup_v2_threaded() {
    let (Some(root), Some(orig)) = (cgroup2_root(), own_v2_cgroup()) else {
        println!("SKIPPED: no cgroup v2 mount");
        return;
    };
    let domain = root.join(format!("sluice-host-v2-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&domain) {
        println!(
            "SKIPPED: cannot create {} ({e}; root needed)",
            domain.display()
        );
        return;
    }
    let guard = V2Guard {
        root: root.clone(),
        orig,
        domain: domain.clone(),
    };
    let t = RealTarget::start();

    // A domain cgroup without the opt-in: refused, naming the path.
    let e = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(domain.clone()),
            ..opts()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, HostError::Cgroup(_)), "{e:?}");
    assert!(e.to_string().contains(domain.to_str().unwrap()), "{e}");

    // The process joins the domain, whose child is made threaded.
    std::fs::write(domain.join("cgroup.procs"), std::process::id().to_string())
        .expect("move the test process into the v2 domain");
    let threaded = domain.join("t");
    std::fs::create_dir(&threaded).unwrap();
    std::fs::write(threaded.join("cgroup.type"), "threaded").unwrap();
    let c = Controller::connect(
        t.addr(),
        &t.subnqn,
        ConnectOptions {
            cgroup: Some(threaded.clone()),
            ..opts()
        },
    )
    .await
    .expect("connect with a threaded v2 cgroup");
    let rel = format!(
        "0::/{}",
        threaded.strip_prefix(&root).unwrap().to_str().unwrap()
    );
    let tids = c.queue_tids();
    assert_eq!(tids.len(), 3, "admin + 2 I/O queues");
    let listed = std::fs::read_to_string(threaded.join("cgroup.threads")).unwrap();
    for tid in &tids {
        let own = sluice_cpu::thread_cgroups(*tid).unwrap();
        assert!(
            own.lines().any(|l| l == rel),
            "tid {tid}: {own} (want {rel})"
        );
        assert!(listed.lines().any(|l| l == tid.to_string()), "{listed}");
    }
    // The caller's thread stays in the domain.
    let me = sluice_cpu::thread_cgroups(sluice_runtime::clock::current_tid()).unwrap();
    assert!(!me.lines().any(|l| l == rel), "{me}");
    // And the queue threads work from there.
    let ns = c.namespace(1).expect("ns");
    let data = vec![0xa5u8; 8192];
    ns.write(0, &data, IoFlags::default()).await.expect("write");
    let r = ns
        .read(0, data.len(), IoFlags::default())
        .await
        .expect("read");
    assert_eq!(&r[..], &data[..]);
    c.disconnect(Duration::from_secs(2)).await;
    // Thread exit empties the threaded cgroup before the guard removes it.
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end
        && !std::fs::read_to_string(threaded.join("cgroup.threads"))
            .unwrap_or_default()
            .trim()
            .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(guard);
}
