#!/usr/bin/env python3
"""RocksDB on an elastic volume beside a streaming tenant (issue 11, item 6;
as PINoF Fig. 8 and Flint Fig. 11 measured their applications).

    scripts/bench-rocksdb.py [--runtime 20] [--repeats 3] [--keys 200000] [--out docs/experiments]
                             [--fuse-transport fuser|uring]

Two Sluice targets with two emulated SSDs each (400 MB/s and 40k IOPS
reading, 200 MB/s and 20k IOPS writing, 4 channels) form a pool managed by
`sluice control` (redb). Two tenants' volumes spread over all four drives:

* `db` (4 GiB, tenant db): `sluice fuse --volume db` exposes it as a file, a
  loop device (direct I/O) carries ext4, and RocksDB's `db_bench` (Debian's
  rocksdb-tools) runs on it with direct reads and a small block cache, so
  its gets reach the volume: fillrandom once (kept as a copy that every
  condition starts from), then readrandom and
  readwhilewriting (its writer held to 1 MB/s) for `--runtime` seconds
  each;
* `stream` (1 GiB, tenant stream): `sluice bench --volume stream` streams
  128 KiB random reads at QD 32 over the same drives.

Each repeat runs db_bench alone, then beside the streamer with no
isolation, with the bandwidth auction (`sluice auction on`), with the
targets' per-tenant fair queuing (docs/tenants.md: the two tenants' hosts
moved from one shared tenant to a tenant each through the targets' admin
API), and with both; all in the same processes. Cells are medians over the repeats with the range in
brackets; ratios are to the solo run of the same repeat. Goals: beside
the streamer, >= 0.8 of solo ops/s and P99 within 2x of solo.

Installs what it needs (rocksdb-tools, fuse3, e2fsprogs) with apt-get
(root), builds `sluice` in release mode, writes rocksdb.md under --out
(rocksdb-uring.md with --fuse-transport uring).
Needs root for losetup and mount.
"""
import argparse, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target", "release", "sluice")
NQN = "nqn.2026-11.io.sluice:rocks"
# The host NQNs volume clients of tenants db and stream connect with.
DB_HOST = "nqn.2026-11.io.sluice:tenant:db"
STREAM_HOST = "nqn.2026-11.io.sluice:tenant:stream"
# A modest drive: a 128 KiB read holds its transfer "bus" for 330 us, which
# a 4 KiB read that arrives behind it waits out. (At 100 MB/s the wait is
# 1.3 ms and db_bench, whose FUSE path serves one request at a time, drops
# to a tenth whatever the scheduling; at 1 GB/s the streamer takes this
# 2-core machine's CPU instead of the drives.)
SSD = ("{ read_bytes_per_sec_max = 400000000, write_bytes_per_sec_max = 200000000, "
       "read_iops_max = 40000, write_iops_max = 20000, parallelism = 4 }")


def log(*a):
    print("bench-rocksdb:", *a, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_for(pred, what, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    raise SystemExit(f"bench-rocksdb: {what} did not come up in {timeout} s")


def listening(port):
    def f():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False
    return f


def ensure_tools():
    need = [pkg for tool, pkg in [("db_bench", "rocksdb-tools"), ("fusermount3", "fuse3"),
                                  ("mkfs.ext4", "e2fsprogs"), ("losetup", "mount")]
            if shutil.which(tool) is None]
    if os.geteuid() != 0:
        raise SystemExit("bench-rocksdb: needs root (losetup, mount, apt-get)")
    if need:
        log("installing", " ".join(need))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *need], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    if not os.path.exists("/dev/fuse"):
        raise SystemExit("bench-rocksdb: /dev/fuse is missing")


def cpu_s(pid):
    """CPU seconds (user + system) a process has used so far; 0 once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_cpu():
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    tck = os.sysconf("SC_CLK_TCK")
    return (sum(v) - idle) / tck, sum(v) / tck


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise SystemExit(f"bench-rocksdb: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}{out.stdout[-2000:]}")
    return out.stdout


class Proc:
    def __init__(self, cmd, log_path):
        self.log = open(log_path, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


# (name, auction on, the targets' per-tenant fair queuing on)
CONDITIONS = [
    ("solo", False, False),
    ("streamer, isolation off", False, False),
    ("streamer, auction", True, False),
    ("streamer, target fair queuing", False, True),
    ("streamer, auction + target fair queuing", True, True),
]


def http(port, method, path, body):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    if r.status != 200:
        raise SystemExit(f"bench-rocksdb: {method} {path} on :{port}: {r.status} {text}")
    return text


def tenant_hosts(admin_port, separate):
    """Moves the two tenants' hosts into one shared tenant (no isolation
    between them) or into a tenant each (the target's fair queuing)."""
    if separate:
        http(admin_port, "PUT", "/v1/tenants/shared", json.dumps({"hosts": []}))
        http(admin_port, "PUT", "/v1/tenants/db", json.dumps({"hosts": [DB_HOST]}))
        http(admin_port, "PUT", "/v1/tenants/stream", json.dumps({"hosts": [STREAM_HOST]}))
    else:
        http(admin_port, "PUT", "/v1/tenants/db", json.dumps({"hosts": []}))
        http(admin_port, "PUT", "/v1/tenants/stream", json.dumps({"hosts": []}))
        http(admin_port, "PUT", "/v1/tenants/shared", json.dumps({"hosts": [DB_HOST, STREAM_HOST]}))


def parse_db_bench(text):
    """{benchmark: (ops/s, p50 us, p99 us)} from db_bench output with --histogram."""
    res = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^(\w+)\s*:\s*([\d.]+) micros/op (\d+) ops/sec", line)
        if m:
            current = m.group(1)
            res[current] = [float(m.group(3)), None, None]
            continue
        m = re.match(r"^Percentiles: P50: ([\d.]+) P75: [\d.]+ P99: ([\d.]+)", line)
        if m and current and res[current][1] is None:
            res[current][1] = float(m.group(1))
            res[current][2] = float(m.group(2))
    return {k: tuple(v) for k, v in res.items()}


def median_range(xs, fmt="{:.0f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", type=int, default=20)
    ap.add_argument("--conditions", default="",
                    help="comma-separated indices into the conditions (0 solo .. 4 both; default all; "
                         "solo always runs, for the ratios)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keys", type=int, default=200000)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "experiments"))
    ap.add_argument("--fuse-transport", choices=("fuser", "uring"), default="fuser",
                    help="`sluice fuse --transport` of the db volume's file")
    a = ap.parse_args()
    if a.runtime < 1 or a.repeats < 1 or a.keys < 1000:
        raise SystemExit("bench-rocksdb: --runtime >= 1, --repeats >= 1, --keys >= 1000")
    try:
        picked = sorted({0} | {int(x) for x in a.conditions.split(",") if x.strip()}) \
            if a.conditions.strip() else list(range(len(CONDITIONS)))
        conds = [CONDITIONS[i] for i in picked]
    except (ValueError, IndexError):
        raise SystemExit(f"bench-rocksdb: --conditions takes indices 0-{len(CONDITIONS) - 1}, "
                         f"comma-separated, not {a.conditions!r}")
    ensure_tools()
    log("building sluice (release)")
    subprocess.run([os.path.join(ROOT, "scripts", "install-build-deps.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice-cli"], cwd=ROOT, check=True)
    load_before = open("/proc/loadavg").read().split()[:3]
    work = tempfile.mkdtemp(prefix="sluice-rocksdb.")
    procs, loop, mounted, fuse_mnt = [], None, None, None
    try:
        targets, admins, target_procs = [], [], []
        for t in range(2):
            port = free_port()
            cfg = os.path.join(work, f"t{t}.toml")
            aport = free_port()
            with open(cfg, "w") as f:
                f.write(f'[target]\nlisten = "127.0.0.1:{port}"\ndiscovery_listen = ""\nworkers = 1\npolling = "adaptive"\n\n'
                        # Per-tenant fair queuing, switched at run time by
                        # moving the hosts between one shared tenant (no
                        # isolation: one FIFO) and a tenant each.
                        f'[tenants]\nscheduler = "fair"\ncost = "device"\ndispatch_depth = 4\n'
                        f'admin_listen = "127.0.0.1:{aport}"\n\n'
                        f'[[tenant]]\nname = "shared"\nhosts = ["{DB_HOST}", "{STREAM_HOST}"]\n\n'
                        f'[[tenant]]\nname = "db"\nhosts = []\n\n[[tenant]]\nname = "stream"\nhosts = []\n\n'
                        f'[[subsystem]]\nnqn = "{NQN}"\nallow_any_host = true\n')
                for nsid in (1, 2):
                    f.write(f'\n[[subsystem.namespace]]\nnsid = {nsid}\nbackend = "emulated-ssd"\nsize = "2GiB"\n'
                            f'block_size = 4096\nssd = {SSD}\n')
            procs.append(Proc([SLUICE, "--log", "warn", "target", "--config", cfg], os.path.join(work, f"t{t}.log")))
            target_procs.append(procs[-1])
            targets.append(port)
            admins.append(aport)
        cport = free_port()
        control = f"127.0.0.1:{cport}"
        procs.append(Proc([SLUICE, "--log", "warn", "control", "--listen", control,
                           "--metadata", f"redb:{work}/meta.redb"], os.path.join(work, "control.log")))
        control_proc = procs[-1]
        for p in targets + admins + [cport]:
            wait_for(listening(p), f"port {p}")
        c = ["--control", control]
        for p in targets:
            for nsid in ("1", "2"):
                run([SLUICE, "drive", "add", f"127.0.0.1:{p}", NQN, "--nsid", nsid, *c])
        run([SLUICE, "volume", "create", "db", "--size", "4GiB", "--tenant", "db", *c])
        run([SLUICE, "volume", "create", "stream", "--size", "1GiB", "--tenant", "stream", *c])
        log("filling the streamer's volume")
        run([SLUICE, "bench", "--volume", "stream", *c, "--rw", "write", "--bs", "1m", "--qd", "4",
             "--ios", "1024", "--json"])
        fuse_mnt = os.path.join(work, "fuse")
        os.makedirs(fuse_mnt)
        procs.append(Proc([SLUICE, "--log", "warn", "fuse", "--volume", "db", "--transport", a.fuse_transport,
                           *c, fuse_mnt],
                          os.path.join(work, "fuse.log")))
        fuse = procs[-1]
        img = os.path.join(fuse_mnt, "disk.img")
        wait_for(lambda: os.path.exists(img), "the FUSE file")
        loop = run(["losetup", "--direct-io=on", "-f", "--show", img]).strip()
        run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", loop])
        mounted = os.path.join(work, "db")
        os.makedirs(mounted)
        run(["mount", loop, mounted])
        db = os.path.join(mounted, "rocks")
        common = [f"--db={db}", f"--num={a.keys}", "--value_size=1000", "--compression_type=none",
                  "--cache_size=8388608", "--use_direct_reads=true",
                  "--use_direct_io_for_flush_and_compaction=true", "--histogram=1"]
        log(f"fillrandom, {a.keys} keys")
        run(["db_bench", "--benchmarks=fillrandom", *common])
        # Every condition starts from this database: readwhilewriting adds
        # files and compactions, and a database that grew through the
        # earlier conditions served gets 2x slower by the third repeat
        # (solo 7.9k, 5.5k, 3.7k ops/s), which no ratio within a repeat
        # could hide.
        base = db + ".base"
        run(["cp", "-a", db, base])
        results = {}  # (repeat, condition) -> {bench: (ops, p50, p99)}
        cpu = {}  # (repeat, condition) -> {part: cores used while db_bench ran}
        streams = {}
        for rep in range(a.repeats):
            for cond, auction, fq in conds:
                shutil.rmtree(db)
                run(["cp", "-a", base, db])
                run(["sync"])
                run([SLUICE, "auction", "on" if auction else "off", *c])
                for aport in admins:
                    tenant_hosts(aport, fq)
                streamer = None
                if cond != "solo":
                    streamer = subprocess.Popen(
                        [SLUICE, "--log", "warn", "bench", "--volume", "stream", *c, "--rw", "randread",
                         "--bs", "128k", "--qd", "32", "--runtime", str(2 * a.runtime + 8), "--json"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                    time.sleep(3)
                watcher = None
                if os.environ.get("BENCH_ROCKSDB_DEBUG") == "1":
                    # The auction's state every second, into the work log.
                    watcher = subprocess.Popen(
                        ["bash", "-c", f"while sleep 1; do {SLUICE} auction status --control {control}; done"],
                        stdout=open(os.path.join(work, f"auction-{rep}-{len(results)}.log"), "w"),
                        stderr=subprocess.DEVNULL)
                # The writer of readwhilewriting is held to 1 MB/s, so that
                # the database (and its compactions) stays the same size
                # from run to run.
                # CPU seconds each part spends while db_bench runs: on two
                # cores, the parts contend for CPU as much as for drives.
                parts = {"fuse": [fuse.p.pid], "targets": [t.p.pid for t in target_procs],
                         "control": [control_proc.p.pid]}
                if streamer is not None:
                    parts["streamer"] = [streamer.pid]
                before = {k: sum(cpu_s(p) for p in v) for k, v in parts.items()}
                kids_before = os.times()
                mach_before = machine_cpu()
                out = run(["db_bench", "--benchmarks=readrandom,readwhilewriting", "--use_existing_db=1",
                           f"--duration={a.runtime}", "--threads=4",
                           "--benchmark_write_rate_limit=1048576", *common])
                if watcher is not None:
                    watcher.kill()
                    watcher.wait()
                kids_after = os.times()
                mach_after = machine_cpu()
                used = {k: sum(cpu_s(p) for p in v) - before[k] for k, v in parts.items()}
                used["db_bench"] = ((kids_after.children_user + kids_after.children_system)
                                    - (kids_before.children_user + kids_before.children_system))
                wall = mach_after[1] - mach_before[1]
                used["machine busy"] = mach_after[0] - mach_before[0]
                cpu[(rep, cond)] = {k: v / wall * os.cpu_count() for k, v in used.items()} if wall > 0 else {}
                r = parse_db_bench(out)
                results[(rep, cond)] = r
                if streamer is not None:
                    so, _ = streamer.communicate(timeout=4 * a.runtime + 60)
                    try:
                        j = json.loads(so[so.index("{"):])
                        streams[(rep, cond)] = j["total"]["bytes"] / j["total"]["elapsed_s"] / 1e6
                    except (ValueError, KeyError):
                        streams[(rep, cond)] = float("nan")
                log(f"repeat {rep} {cond}: " + ", ".join(
                    f"{k} {v[0]:.0f} ops/s P99 {v[2]} us" for k, v in r.items())
                    + (f"; streamer {streams.get((rep, cond), float('nan')):.0f} MB/s" if cond != "solo" else "")
                    + "; cores: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu[(rep, cond)].items()))
        run([SLUICE, "auction", "off", *c])
    finally:
        if mounted and os.path.ismount(mounted):
            subprocess.run(["umount", mounted])
        if loop:
            subprocess.run(["losetup", "-d", loop])
        for p in reversed(procs):
            p.stop()
        if fuse_mnt and os.path.ismount(fuse_mnt):
            subprocess.run(["fusermount3", "-u", fuse_mnt])
        if fuse_mnt and os.path.ismount(fuse_mnt):
            # The uring transport mounts with mount(2), not fusermount3.
            subprocess.run(["umount", "-l", fuse_mnt])
        if os.environ.get("KEEP_WORK") != "1":
            shutil.rmtree(work, ignore_errors=True)

    md = ["# RocksDB on an elastic volume beside a streaming tenant", "",
          f"`scripts/bench-rocksdb.py --runtime {a.runtime} --repeats {a.repeats} --keys {a.keys} "
          f"--fuse-transport {a.fuse_transport}`; "
          f"load average before: {' '.join(load_before)}.", "",
          " ".join(__doc__.split("\n\n", 2)[1].split()), "",
          f"db_bench: {a.keys} keys of 1000 bytes, no compression, 8 MiB block cache, direct reads and "
          f"direct flush/compaction, 4 threads; readrandom and readwhilewriting {a.runtime} s each. "
          f"Medians over {a.repeats} repeats, ranges in brackets; ratios to solo per repeat.", "",
          "| benchmark | condition | ops/s | ratio to solo | P50 µs | P99 µs | P99 ÷ solo | streamer MB/s |",
          "|---|---|---|---|---|---|---|---|"]
    conditions = [name for name, _, _ in conds]
    for bench in ["readrandom", "readwhilewriting"]:
        for cond in conditions:
            rows = [results[(r, cond)].get(bench) for r in range(a.repeats)]
            solo = [results[(r, "solo")].get(bench) for r in range(a.repeats)]
            if any(x is None for x in rows + solo):
                md.append(f"| {bench} | {cond} | (missing) | | | | | |")
                continue
            ops = [x[0] for x in rows]
            ratio = [x[0] / s[0] for x, s in zip(rows, solo)]
            p50 = [x[1] for x in rows if x[1] is not None]
            p99 = [x[2] for x in rows if x[2] is not None]
            p99r = [x[2] / s[2] for x, s in zip(rows, solo) if x[2] and s[2]]
            st = [streams[(r, cond)] for r in range(a.repeats)] if cond != "solo" else []
            md.append(f"| {bench} | {cond} | {median_range(ops)} | {median_range(ratio, '{:.2f}')} | "
                      f"{median_range(p50) if p50 else '-'} | {median_range(p99) if p99 else '-'} | "
                      f"{median_range(p99r, '{:.2f}') if p99r else '-'} | {median_range(st) if st else '-'} |")
    md += ["", "Goals: beside the streamer, ops/s >= 0.8 of solo and P99 within 2x of solo.", "",
           "Cores each part used while db_bench ran (CPU seconds over wall seconds; the machine "
           f"has {os.cpu_count()}; medians over the repeats):", "",
           "| condition | db_bench | fuse | targets | streamer | control | machine busy |",
           "|---|---|---|---|---|---|---|"]
    for cond in conditions:
        def med(part):
            v = [cpu[(r, cond)][part] for r in range(a.repeats) if part in cpu.get((r, cond), {})]
            return f"{statistics.median(v):.2f}" if v else "-"
        md.append(f"| {cond} | {med('db_bench')} | {med('fuse')} | {med('targets')} | {med('streamer')} | "
                  f"{med('control')} | {med('machine busy')} |")
    os.makedirs(a.out, exist_ok=True)
    # One table per FUSE transport: the default's in rocksdb.md.
    name = "rocksdb.md" if a.fuse_transport == "fuser" else f"rocksdb-{a.fuse_transport}.md"
    path = os.path.join(a.out, name)
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    log("wrote", path)


if __name__ == "__main__":
    main()
