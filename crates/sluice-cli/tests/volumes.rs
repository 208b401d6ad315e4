//! The control plane from the command line, as an operator uses it: two
//! `sluice target` processes as drives, `sluice control` on redb, `sluice
//! drive add`, `sluice volume create/list/inspect/resize/delete`, and a
//! verified `sluice bench --volume` whose writes land on both targets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2026-11.io.sluice:ram0";

/// A port below the ephemeral range, which other tests' connections
/// cannot take before the process under test binds it.
fn free_port() -> u16 {
    sluice_meta::testing::free_loopback_port().expect("a free loopback port")
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Killed {
    Killed(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .args(["--log", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .args(["--log", "warn"])
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = sluice(args);
    assert!(
        out.status.success(),
        "sluice {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str], needle: &str) {
    let out = sluice(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sluice {args:?} should fail");
    assert!(
        err.contains(needle),
        "sluice {args:?}: {err:?} should name {needle:?}"
    );
}

/// Two `sluice target` processes (64 MiB RAM each, no discovery port) and
/// `sluice control` on a redb file, all listening.
struct Pool {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    targets: Vec<Killed>,
    control: String,
    _control: Killed,
}

impl Pool {
    fn start() -> Pool {
        Pool::with_targets(2)
    }

    fn with_targets(n: usize) -> Pool {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let targets = ports
            .iter()
            .map(|p| {
                let listen = format!("127.0.0.1:{p}");
                spawn(&[
                    "target",
                    "--listen",
                    &listen,
                    "--discovery-listen",
                    "",
                    "--ram-size",
                    "64MiB",
                ])
            })
            .collect();
        let cport = free_port();
        let control = format!("127.0.0.1:{cport}");
        let meta = format!("redb:{}", dir.path().join("meta.redb").display());
        let _control = spawn(&["control", "--listen", &control, "--metadata", &meta]);
        for p in ports.iter().copied().chain([cport]) {
            wait_port(p);
        }
        Pool {
            dir,
            ports,
            targets,
            control,
            _control,
        }
    }
}

#[test]
fn operator_builds_a_pool_and_benches_a_replicated_volume() {
    let pool = Pool::start();
    let (ports, control) = (pool.ports.clone(), pool.control.clone());
    let c = ["--control", control.as_str()];
    for &p in &ports {
        let out = ok(&[&["drive", "add", &format!("127.0.0.1:{p}"), NQN], &c[..]].concat());
        assert!(out.contains("0/32 extents used"), "{out}");
    }
    fails(
        &[
            &["drive", "add", &format!("127.0.0.1:{}", ports[0]), NQN],
            &c[..],
        ]
        .concat(),
        "already in the pool",
    );
    ok(&[
        &[
            "volume",
            "create",
            "vol1",
            "--size",
            "48MiB",
            "--replicas",
            "2",
        ],
        &c[..],
    ]
    .concat());
    fails(
        &[&["volume", "create", "vol1", "--size", "4MiB"], &c[..]].concat(),
        "already exists",
    );
    fails(
        &[&["volume", "create", "huge", "--size", "1GiB"], &c[..]].concat(),
        "capacity exceeded",
    );
    fails(
        &[&["volume", "create", "x", "--size", "12 parsecs"], &c[..]].concat(),
        "--size",
    );
    fails(
        &[&["volume", "inspect", "nope"], &c[..]].concat(),
        "not found",
    );

    // A verified random read/write workload through the volume.
    let out = ok(&[
        &[
            "bench", "--volume", "vol1", "--rw", "randrw", "--bs", "4k-64k", "--qd", "4", "--ios",
            "600", "--verify", "--json",
        ],
        &c[..],
    ]
    .concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"]["ios"], 600, "{out}");
    assert_eq!(v["total"]["errors"], 0, "{out}");
    assert_eq!(v["total"]["verify_errors"], 0, "{out}");

    // Extents were allocated on first write, two replicas each, on both
    // targets' drives.
    let inspect = ok(&[&["volume", "inspect", "vol1", "--extents"], &c[..]].concat());
    assert!(
        inspect.contains(&format!("127.0.0.1:{}", ports[0]))
            && inspect.contains(&format!("127.0.0.1:{}", ports[1])),
        "{inspect}"
    );
    assert!(inspect.contains(" -> "), "{inspect}");
    let list = ok(&[&["volume", "list"], &c[..]].concat());
    assert!(
        list.contains("vol1") && list.contains("2 replica(s)"),
        "{list}"
    );

    ok(&[&["volume", "resize", "vol1", "--size", "56MiB"], &c[..]].concat());
    fails(
        &[&["volume", "resize", "vol1", "--size", "8MiB"], &c[..]].concat(),
        "not shrink",
    );
    ok(&[&["volume", "delete", "vol1"], &c[..]].concat());
    let drives = ok(&[&["drive", "list"], &c[..]].concat());
    assert_eq!(drives.matches("0/32 extents used").count(), 2, "{drives}");
}

#[test]
fn control_refuses_to_listen_beyond_loopback_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let meta = format!("redb:{}", dir.path().join("m.redb").display());
    fails(
        &["control", "--listen", "0.0.0.0:0", "--metadata", &meta],
        "--token-file",
    );
    fails(&["control", "--metadata", "mysql://x"], "--metadata");
    for (flag, bad) in [
        ("--rebuild-rate", "1KiB"),
        ("--rebuild-rate", "fast"),
        ("--rebuild-parallel", "0"),
        ("--rebuild-parallel", "1000"),
    ] {
        fails(&["control", "--metadata", &meta, flag, bad], flag);
    }
    fails(&["bench", "--rw", "read"], "--volume");
}

#[test]
fn killing_a_target_mid_workload_loses_no_acknowledged_write_and_its_replicas_are_rebuilt() {
    let mut pool = Pool::with_targets(3);
    let (ports, control) = (pool.ports.clone(), pool.control.clone());
    let c = ["--control", control.as_str()];
    for &p in &ports {
        ok(&[&["drive", "add", &format!("127.0.0.1:{p}"), NQN], &c[..]].concat());
    }
    ok(&[
        &[
            "volume",
            "create",
            "r",
            "--size",
            "32MiB",
            "--replicas",
            "2",
        ],
        &c[..],
    ]
    .concat());
    // A verified read/write workload; verify checks every read against the
    // last acknowledged write of each block.
    let bench = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "--volume",
            "r",
            "--control",
            &control,
            "--rw",
            "randrw",
            "--bs",
            "16k",
            "--qd",
            "4",
        ])
        .args(["--runtime", "5", "--verify", "--json", "--log", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    // SIGKILL: no goodbye on any connection.
    let mut dead = pool.targets.remove(1);
    dead.0.kill().unwrap();
    dead.0.wait().unwrap();
    let out = bench.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["total"]["ios"].as_u64().unwrap() > 100, "{v}");
    assert_eq!(v["total"]["errors"], 0, "{v}");
    assert_eq!(v["total"]["verify_errors"], 0, "{v}");
    let drives = ok(&[&["drive", "list"], &c[..]].concat());
    assert_eq!(drives.matches("down").count(), 1, "{drives}");
    // The dead target's replicas are rebuilt onto the third target, in the
    // background of the verified workload (at 32 MiB/s, under a second on
    // this volume; a loaded machine may finish after the bench).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let rebuilds = loop {
        // Progress starts at 0 degraded before the first scan: wait for
        // the metadata to show no degraded extent and for rebuilt work.
        // Both reads must agree: the progress report read first may still
        // show the last extent copying when the list read after it no
        // longer shows it degraded.
        let r = ok(&[&["volume", "rebuilds"], &c[..]].concat());
        let list = ok(&[&["volume", "list"], &c[..]].concat());
        let done = !list.contains("degraded")
            && r.contains("degraded extents 0")
            && !r.contains("rebuilt 0 ");
        if done || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(rebuilds.contains("degraded extents 0"), "{rebuilds}");
    assert!(!rebuilds.contains("rebuilt 0 "), "{rebuilds}");
    let list = ok(&[&["volume", "list"], &c[..]].concat());
    assert!(!list.contains("degraded"), "{list}");
    let inspect = ok(&[&["volume", "inspect", "r", "--extents"], &c[..]].concat());
    assert!(!inspect.contains("rebuilding onto"), "{inspect}");
    for line in inspect
        .lines()
        .filter(|l| l.contains("extent ") && l.contains(" -> "))
    {
        assert_eq!(
            line.matches(" -> ").count(),
            1,
            "two replicas again: {line}"
        );
    }
}

#[test]
fn nbd_exports_a_volume_to_unmodified_tools() {
    let pool = Pool::start();
    let (ports, control, dir) = (pool.ports.clone(), pool.control.clone(), &pool.dir);
    let c = ["--control", control.as_str()];
    for &p in &ports {
        ok(&[&["drive", "add", &format!("127.0.0.1:{p}"), NQN], &c[..]].concat());
    }
    ok(&[
        &[
            "volume",
            "create",
            "nbdvol",
            "--size",
            "16MiB",
            "--replicas",
            "2",
        ],
        &c[..],
    ]
    .concat());
    let nport = free_port();
    let listen = format!("127.0.0.1:{nport}");
    let mport = free_port();
    let metrics = format!("127.0.0.1:{mport}");
    let _nbd = spawn(&[
        "nbd",
        "--volume",
        "nbdvol",
        "--control",
        &control,
        "--listen",
        &listen,
        "--eio",
        "--metrics",
        &metrics,
    ]);
    wait_port(nport);
    wait_port(mport);
    // 6 MiB of data, written by qemu-img through NBD, compared back: the
    // rest of the 16 MiB export reads as zeros (unallocated).
    let src = dir.path().join("src.raw");
    let data: Vec<u8> = (0..6u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let url = format!("nbd://127.0.0.1:{nport}/sluice");
    let run = |args: &[&str]| {
        let out = Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img (qemu-utils) runs");
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&[
        "convert",
        "-n",
        "-f",
        "raw",
        "-O",
        "raw",
        src.to_str().unwrap(),
        &url,
    ]);
    let cmp = run(&[
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        src.to_str().unwrap(),
        &url,
    ]);
    assert!(cmp.contains("identical"), "{cmp}");
    // Every drive I/O went through the volume's eIO gate, and the export's
    // /metrics shows it: admitted, none left waiting.
    let m = sluice_admin::client::request(&metrics, "GET", "/metrics", "", None).unwrap();
    let samples = sluice_admin::metrics::parse_text(&m.body);
    let of_volume = |name: &str| {
        samples
            .iter()
            .find(|x| x.0 == name && x.1.iter().any(|l| l == &("volume".into(), "nbdvol".into())))
            .map(|x| x.2)
    };
    // qemu-img wrote 6 MiB and read them back: at least one drive I/O per
    // 2 MiB extent on each of the two replicas, and one per extent read.
    let admitted = of_volume("sluice_isolation_eio_admitted_total").unwrap_or(0.0);
    assert!(admitted >= 9.0, "{}", m.body);
    assert_eq!(
        of_volume("sluice_isolation_eio_pending"),
        Some(0.0),
        "{}",
        m.body
    );
    assert_eq!(
        of_volume("sluice_isolation_eio_inflight"),
        Some(0.0),
        "{}",
        m.body
    );
    // qemu-img reads the allocation map through NBD block status
    // (`base:allocation`, structured replies): the 6 MiB written are data,
    // the 10 MiB of unallocated extents a hole that reads as zeros.
    let map = run(&["map", "--output=json", "-f", "raw", &url]);
    let map: serde_json::Value = serde_json::from_str(&map).expect("qemu-img map prints JSON");
    let runs: Vec<(u64, u64, bool, bool)> = map
        .as_array()
        .expect("a list of ranges")
        .iter()
        .map(|r| {
            (
                r["start"].as_u64().unwrap(),
                r["length"].as_u64().unwrap(),
                r["data"].as_bool().unwrap(),
                r["zero"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        vec![(0, 6 << 20, true, false), (6 << 20, 10 << 20, false, true)],
        "{map}"
    );
    // A plain read across data and the unallocated rest: qemu's NBD client
    // gets the rest as hole chunks (no zeros on the wire) and must see
    // the data, then zeros.
    let io = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0 6M 10M",
            "-c",
            "read -v 6291440 32",
            &url,
        ])
        .output()
        .expect("qemu-io (qemu-utils) runs");
    let io_out = String::from_utf8_lossy(&io.stdout);
    assert!(
        io.status.success()
            && io_out.contains("read 10485760/10485760 bytes")
            && !io_out.contains("Pattern verification failed"),
        "qemu-io: {io_out} {}",
        String::from_utf8_lossy(&io.stderr)
    );
    // The last 16 bytes of data, then 16 zeros.
    let tail = &data[(6 << 20) - 16..];
    let hex: String = tail.iter().map(|b| format!("{b:02x} ")).collect();
    assert!(io_out.contains(hex.trim()), "{io_out}");
    // Three extents were allocated, on both targets.
    let inspect = ok(&[&["volume", "inspect", "nbdvol", "--extents"], &c[..]].concat());
    assert_eq!(inspect.matches("  extent ").count(), 3, "{inspect}");
}

#[test]
fn drives_are_found_through_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let (port, dport) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{port}");
    let disc = format!("127.0.0.1:{dport}");
    let _t = spawn(&[
        "target",
        "--listen",
        &listen,
        "--discovery-listen",
        &disc,
        "--ram-size",
        "64MiB",
    ]);
    let cport = free_port();
    let control = format!("127.0.0.1:{cport}");
    let meta = format!("redb:{}", dir.path().join("meta.redb").display());
    let _cp = spawn(&["control", "--listen", &control, "--metadata", &meta]);
    for p in [port, dport, cport] {
        wait_port(p);
    }
    let out = ok(&["drive", "discover", &disc, "--control", &control]);
    assert!(
        out.contains("1 drive(s) added") && out.contains(&listen),
        "{out}"
    );
    // Discovering again adds nothing and says why.
    let out = sluice(&["drive", "discover", &disc, "--control", &control]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 drive(s) added"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already in the pool"));
}

#[test]
fn operator_runs_a_volume_through_the_eio_scheduler_and_reads_the_shadow_view() {
    let dir = tempfile::tempdir().unwrap();
    let tport = free_port();
    let listen = format!("127.0.0.1:{tport}");
    let (cport, aport) = (free_port(), free_port());
    let control = format!("127.0.0.1:{cport}");
    // The target reports its own counters to the view too.
    let _target = spawn(&[
        "target",
        "--listen",
        &listen,
        "--discovery-listen",
        "",
        "--ram-size",
        "64MiB",
        "--view-control",
        &control,
        "--view-interval-ms",
        "50",
    ]);
    let admin = format!("127.0.0.1:{aport}");
    let meta = format!("redb:{}", dir.path().join("meta.redb").display());
    let _control = spawn(&[
        "control",
        "--listen",
        &control,
        "--metadata",
        &meta,
        "--admin-listen",
        &admin,
        "--view-epoch-ms",
        "50",
    ]);
    for p in [tport, cport, aport] {
        wait_port(p);
    }
    let c = ["--control", control.as_str()];
    ok(&[&["drive", "add", &listen, NQN], &c[..]].concat());
    ok(&[&["volume", "create", "v", "--size", "16MiB"], &c[..]].concat());
    let out = ok(&[
        &[
            "bench", "--volume", "v", "--eio", "--rw", "randrw", "--bs", "4k-64k", "--qd", "8",
            "--ios", "400", "--verify", "--json",
        ],
        &c[..],
    ]
    .concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"]["ios"], 400, "{out}");
    assert_eq!(v["total"]["verify_errors"], 0, "{out}");

    // The bench's agent reported its I/O: the view knows the drive, the
    // target port and the bench as a client.
    let top = ok(&[&["top", "--count", "1"], &c[..]].concat());
    assert!(top.contains("drive d0"), "{top}");
    assert!(top.contains("TGT MB/s"), "{top}");
    // The target's agent reports the drive within its interval: the row
    // gets the target's columns.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let top = ok(&[&["top", "--count", "1"], &c[..]].concat());
        let drive_row = top.lines().find(|l| l.starts_with("drive d0")).unwrap();
        if drive_row.split_whitespace().count() >= 10 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the target's columns stay empty: {top}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(top.contains(&format!("port {listen}")), "{top}");
    assert!(top.contains("client "), "{top}");
    assert!(top.contains("epoch "), "{top}");
    let metrics = sluice_admin::client::request(&admin, "GET", "/metrics", "", None).unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("sluice_view_drive_bytes_per_second{drive=\"0\"}"),
        "{}",
        metrics.body
    );
    let view = sluice_admin::client::request(&admin, "GET", "/v1/view", "", None).unwrap();
    assert!(view.body.contains("\"Drive\": 0"), "{}", view.body);

    for (flag, bad) in [("--view-epoch-ms", "0"), ("--view-queue-delay-us", "-1")] {
        fails(&["control", "--metadata", &meta, flag, bad], flag);
    }
    fails(
        &[
            "control",
            "--metadata",
            &meta,
            "--admin-listen",
            "0.0.0.0:0",
        ],
        "--admin-listen",
    );
    fails(
        &["bench", "--eio", "--target", "x", "--nqn", "y"],
        "--volume",
    );
    fails(
        &[
            "target",
            "--listen",
            "127.0.0.1:0",
            "--view-control",
            &control,
            "--view-port",
            "no-port",
        ],
        "--view-port",
    );
    fails(&["target", "--view-port", "a:1"], "--view-control");

    // The auction and the tenants' classes, from the command line.
    let status = ok(&[&["auction", "status"], &c[..]].concat());
    assert!(status.starts_with("auction off"), "{status}");
    let on = ok(&[&["auction", "on"], &c[..]].concat());
    assert!(on.starts_with("auction on"), "{on}");
    assert!(on.contains("d0 "), "{on}");
    let t = ok(&[&["tenant", "set", "web", "--slo-class", "gold"], &c[..]].concat());
    assert!(t.contains("web  class gold  weight 4"), "{t}");
    let l = ok(&[&["tenant", "list"], &c[..]].concat());
    assert!(
        l.contains("classes bronze=1,gold=4,silver=2  (default bronze)"),
        "{l}"
    );
    fails(
        &[&["tenant", "set", "web", "--slo-class", "platinum"], &c[..]].concat(),
        "platinum",
    );
    ok(&[&["auction", "off"], &c[..]].concat());
    for (flag, bad, needle) in [
        ("--slo-classes", "gold=zero", "--slo-classes"),
        ("--default-slo-class", "platinum", "default SLO class"),
        ("--auction-epoch-ms", "0", "--auction-epoch-ms"),
        ("--auction-inflation", "-1", "--auction-inflation"),
    ] {
        fails(&["control", "--metadata", &meta, flag, bad], needle);
    }
}
