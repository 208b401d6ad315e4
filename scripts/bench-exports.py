#!/usr/bin/env python3
"""Exports against the host library beneath them: fio through `sluice nbd`
(over a Unix socket, as local clients reach it, and over loopback TCP) and
through a `sluice fuse` file (directly, and through ext4 on a loop device
over it, as file systems reach it), `sluice bench` alone, and nbdkit's
memory plugin (Unix socket, no network hop) as the yardstick, on the same
Sluice target; and fio's nbd engine alone on core 1 against nbdkit's null
plugin on core 0: the client's own ceiling, whatever the server.

    scripts/bench-exports.py [--runtime 3] [--repeats 3] [--out docs/benchmarks.md]

The target (RAM namespace, adaptive polling) runs on core 0; the export and
its load generator (fio, or `sluice bench`) share core 1, as an application
and its export would. Workloads: 4 KiB random reads at QD 32 and 128 KiB
sequential reads at QD 8, each `--runtime` seconds, each path `--repeats`
times in rotation (so drift hits every path alike); cells are medians with
the range in brackets. "CPU µs/IO" is the CPU time of the process that
serves the I/O on core 1 (the export, nbdkit, or `sluice bench` itself,
which also generates the load) over the I/Os done. Ratios: NBD over
`sluice bench` and FUSE over NBD (the goals are >= 0.8 and >= 0.5).

Installs what it needs (fio, nbdkit, libnbd-bin) with apt-get when run as
root, and makes a release build of `sluice`. Writes its table between the
markers `<!-- bench-exports:begin -->` and `<!-- bench-exports:end -->` of
--out (appended once when absent).
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target", "release", "sluice")
NQN = "nqn.2026-11.io.sluice:ram0"
TARGET_CPU, LOAD_CPU = "0", "1"
WORKLOADS = [("randread", "4k", 32), ("read", "128k", 8)]
SPAN = "512m"
BEGIN, END = "<!-- bench-exports:begin -->", "<!-- bench-exports:end -->"


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(pred, what, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit(f"bench-exports: {what} did not come up in {timeout} s")


def listening(port):
    def f():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False
    return f


def listening_unix(path):
    def f():
        try:
            c = socket.socket(socket.AF_UNIX)
            c.settimeout(0.2)
            c.connect(path)
            c.close()
            return True
        except OSError:
            return False
    return f


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def ensure_tools():
    need = [pkg for tool, pkg in [("fio", "fio"), ("nbdkit", "nbdkit"), ("nbdinfo", "libnbd-bin"),
                                  ("mkfs.ext4", "e2fsprogs"), ("losetup", "mount")]
            if shutil.which(tool) is None]
    if need:
        if os.geteuid() != 0:
            raise SystemExit(f"bench-exports: missing {', '.join(need)}; install them (apt-get install {' '.join(need)})")
        print(f"bench-exports: installing {' '.join(need)}", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", *need], check=True, env=env, stdout=subprocess.DEVNULL)
    if not os.path.exists("/dev/fuse"):
        raise SystemExit("bench-exports: /dev/fuse is missing (the FUSE row needs it)")
    # The io_uring FUSE row: the kernel offers FUSE-over-io_uring only with
    # this switch on (root may turn it on; without it that row measures
    # the session's /dev/fuse fallback, and says so in sluice fuse's log).
    param = "/sys/module/fuse/parameters/enable_uring"
    try:
        with open(param, "w") as f:
            f.write("Y")
    except OSError as e:
        print(f"bench-exports: cannot turn on FUSE-over-io_uring ({param}: {e})", flush=True)


def fio(args, runtime):
    cmd = ["taskset", "-c", LOAD_CPU, "fio", "--name=x", "--time_based", f"--runtime={runtime}",
           "--ramp_time=0", "--output-format=json", "--numjobs=1", *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench-exports: fio failed: {' '.join(cmd)}\n{out.stderr}{out.stdout[-2000:]}")
    # fio may print warnings before the JSON.
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    j = job["read"]
    fio_cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    return j["iops"], j["bw_bytes"] / 2**20, j["total_ios"], fio_cpu_s


def fio_workload(rw, bs, qd):
    return [f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", f"--size={SPAN}"]


class Server:
    """A process (on the load core unless `cpu` says otherwise) whose CPU
    time is charged to its rows."""

    def __init__(self, cmd, ready, what, cpu=LOAD_CPU):
        self.p = subprocess.Popen(["taskset", "-c", cpu, *cmd], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: self.p.poll() is not None or ready(), what)
        except SystemExit:
            self.stop()
            raise
        if self.p.poll() is not None:
            raise SystemExit(f"bench-exports: {what} exited: {self.p.stderr.read()[-2000:]}")

    def cpu(self):
        return cpu_seconds(self.p.pid)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def run_bench(port, runtime):
    rows = {}
    for rw, bs, qd in WORKLOADS:
        out = subprocess.run(["taskset", "-c", LOAD_CPU, SLUICE, "bench", "--target", f"127.0.0.1:{port}", "--nqn", NQN,
                              "--rw", rw, "--bs", bs, "--qd", str(qd), "--runtime", str(runtime), "--span", SPAN,
                              "--json", "--log", "warn"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"bench-exports: sluice bench failed: {out.stderr}")
        r = json.loads(out.stdout)
        j = r["jobs"][0]
        cpu = r["cpu_user_s"] + r["cpu_sys_s"]
        rows[(rw, bs, qd)] = (j["iops"], j["bandwidth_mib_s"], cpu / max(j["ios"], 1) * 1e6)
    return rows


def run_served(server, target_of, runtime, teardown=None, charge_fio=False):
    """Each workload through `server`; `teardown` (what was stacked on the
    server, such as a file system) runs before the server stops. The CPU
    column is the server's, or fio's own with `charge_fio`."""
    rows = {}
    try:
        for rw, bs, qd in WORKLOADS:
            c0 = server.cpu()
            iops, mib, ios, fio_cpu_s = fio([*target_of, *fio_workload(rw, bs, qd)], runtime)
            cpu_s = fio_cpu_s if charge_fio else server.cpu() - c0
            rows[(rw, bs, qd)] = (iops, mib, cpu_s / max(ios, 1) * 1e6)
    finally:
        if teardown:
            teardown()
        server.stop()
    return rows


def run_nbd(port, runtime, work, extra=(), tcp=False):
    """fio through `sluice nbd`, over a Unix socket (how local clients such
    as qemu and libnbd reach an NBD server) or over loopback TCP."""
    if tcp:
        nport = free_port()
        listen, ready = ["--listen", f"127.0.0.1:{nport}"], listening(nport)
        uri = f"nbd://127.0.0.1:{nport}/disk"
    else:
        path = os.path.join(work, f"nbd-{free_port()}.sock")
        listen, ready = ["--unix", path], listening_unix(path)
        uri = f"nbd+unix:///disk?socket={path}"
    s = Server([SLUICE, "nbd", "--target", f"127.0.0.1:{port}", "--nqn", NQN, *listen,
                "--export-name", "disk", "--log", "warn", *extra], ready, "sluice nbd")
    return run_served(s, ["--ioengine=nbd", f"--uri={uri}"], runtime)


def start_fuse(port, work, transport, tag):
    """`sluice fuse --transport transport` on its own mountpoint: (server,
    mountpoint, the file)."""
    mnt = os.path.join(work, f"{tag}-{transport}")
    os.makedirs(mnt, exist_ok=True)
    f = os.path.join(mnt, "disk.img")
    s = Server([SLUICE, "fuse", "--target", f"127.0.0.1:{port}", "--nqn", NQN, mnt, "--file-name", "disk.img",
                "--transport", transport, "--log", "warn"], lambda: os.path.exists(f), "sluice fuse")
    return s, mnt, f


def unmount_fuse(mnt):
    """Whatever the session left mounted (fuser's mount, or ours over io_uring)."""
    if os.path.ismount(mnt) and subprocess.run(["fusermount", "-u", mnt], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)


def run_fuse(port, runtime, work, transport="fuser"):
    s, mnt, f = start_fuse(port, work, transport, "fuse")
    try:
        return run_served(s, ["--ioengine=libaio", "--direct=1", f"--filename={f}"], runtime)
    finally:
        unmount_fuse(mnt)


def run_fuse_fs(port, runtime, work, transport):
    """fio on a file in ext4, mounted from a loop device (direct I/O) over
    the `sluice fuse` file: the way mkfs and mount reach the export. The
    CPU column is the export's alone (the loop device's kernel workers are
    not charged)."""
    ext = os.path.join(work, f"ext4-{transport}")
    os.makedirs(ext, exist_ok=True)
    s, mnt, f = start_fuse(port, work, transport, "fuse-fs")
    loop = []

    def teardown():
        if os.path.ismount(ext):
            subprocess.run(["umount", ext], stderr=subprocess.DEVNULL)
        for dev in loop:
            subprocess.run(["losetup", "-d", dev], stderr=subprocess.DEVNULL)

    try:
        loop.append(subprocess.run(["losetup", "--direct-io=on", "-f", "--show", f], check=True,
                                   capture_output=True, text=True).stdout.strip())
        dio = subprocess.run(["losetup", "-n", "-O", "DIO", loop[0]], capture_output=True, text=True).stdout.strip()
        if dio != "1":
            raise SystemExit(f"bench-exports: {loop[0]} over the FUSE file runs without direct I/O")
        subprocess.run(["mkfs.ext4", "-q", "-F", loop[0]], check=True)
        subprocess.run(["mount", loop[0], ext], check=True)
        data = os.path.join(ext, "data")
        # Written whole, so the reads reach the export (an unwritten ext4
        # extent reads as zeros without any I/O).
        subprocess.run(["dd", "if=/dev/zero", f"of={data}", "bs=1M", f"count={int(SPAN[:-1])}",
                        "oflag=direct", "status=none"], check=True)
    except BaseException:
        teardown()
        s.stop()
        unmount_fuse(mnt)
        raise
    try:
        return run_served(s, ["--ioengine=libaio", "--direct=1", f"--filename={data}"], runtime, teardown)
    finally:
        unmount_fuse(mnt)


def run_nbdkit(runtime, work, extra=()):
    path = os.path.join(work, f"nbdkit-{free_port()}.sock")
    s = Server(["nbdkit", "--foreground", "--exit-with-parent", "-U", path, *extra, "memory", "1G"],
               listening_unix(path), "nbdkit")
    return run_served(s, ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={path}"], runtime)


def run_fio_ceiling(runtime, work):
    """fio's nbd engine with core 1 to itself, against nbdkit's null plugin
    (no data, no work) on core 0 beside the idle target: what the client
    alone can do, whatever the server. The CPU column is fio's."""
    path = os.path.join(work, f"nbdkit-null-{free_port()}.sock")
    s = Server(["nbdkit", "--foreground", "--exit-with-parent", "-U", path, "null", "1G"],
               listening_unix(path), "nbdkit null", cpu=TARGET_CPU)
    return run_served(s, ["--ioengine=nbd", f"--uri=nbd+unix:///?socket={path}"], runtime, charge_fio=True)


def cell(samples, i, scale=1.0, fmt="{:.0f}"):
    v = [s[i] * scale for s in samples]
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    a = ap.parse_args()
    if a.runtime < 1 or a.repeats < 1:
        raise SystemExit("bench-exports: --runtime and --repeats must be at least 1")
    ensure_tools()
    subprocess.run([os.path.join(ROOT, "scripts", "install-build-deps.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice-cli"], cwd=ROOT, check=True)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    port = free_port()
    work = tempfile.mkdtemp(prefix="sluice-bench-exports.")
    target = subprocess.Popen(["taskset", "-c", TARGET_CPU, SLUICE, "target", "--listen", f"127.0.0.1:{port}",
                               "--discovery-listen", "", "--polling", "adaptive", "--ram-size", "1GiB", "--log", "warn"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paths = [
        ("`sluice bench` → target (the host library alone)", lambda: run_bench(port, a.runtime)),
        ("fio (nbd engine) → `sluice nbd` (Unix socket) → target", lambda: run_nbd(port, a.runtime, work)),
        ("fio (libaio, O_DIRECT) → `sluice fuse --transport fuser` (/dev/fuse) file → target",
         lambda: run_fuse(port, a.runtime, work)),
        ("fio (nbd engine) → `sluice nbd` (loopback TCP) → target",
         lambda: run_nbd(port, a.runtime, work, tcp=True)),
        ("fio (nbd engine) → `sluice nbd --direct-queues 0` (task path, for comparison) → target",
         lambda: run_nbd(port, a.runtime, work, ["--direct-queues", "0"])),
        ("fio (nbd engine) → nbdkit memory plugin (Unix socket), no network hop, for scale",
         lambda: run_nbdkit(a.runtime, work)),
        ("fio (libaio, O_DIRECT) → `sluice fuse --transport uring` (FUSE over io_uring) file → target",
         lambda: run_fuse(port, a.runtime, work, "uring")),
        ("fio (nbd engine) → `sluice nbd --structured-replies false` (Unix socket) → target",
         lambda: run_nbd(port, a.runtime, work, ["--structured-replies", "false"])),
        ("fio (nbd engine) → nbdkit memory plugin `--no-sr` (Unix socket), for scale",
         lambda: run_nbdkit(a.runtime, work, ["--no-sr"])),
        ("fio (libaio, O_DIRECT) → ext4 file → loop device (direct I/O) → `sluice fuse --transport fuser` file → target",
         lambda: run_fuse_fs(port, a.runtime, work, "fuser")),
        ("fio (libaio, O_DIRECT) → ext4 file → loop device (direct I/O) → `sluice fuse --transport uring` file → target",
         lambda: run_fuse_fs(port, a.runtime, work, "uring")),
        ("fio (nbd engine) alone on core 1 → nbdkit null plugin on core 0: the client's own ceiling (CPU: fio's)",
         lambda: run_fio_ceiling(a.runtime, work)),
    ]
    results = {name: {w: [] for w in WORKLOADS} for name, _ in paths}
    try:
        wait_for(listening(port), "sluice target")
        for rep in range(a.repeats):
            for name, run in paths:
                rows = run()
                for w, r in rows.items():
                    results[name][w].append(r)
                    print(f"[{rep + 1}/{a.repeats}] {name}: {w[0]} {w[1]} QD {w[2]}: {r[0]:.0f} IOPS, "
                          f"{r[1]:.0f} MiB/s, {r[2]:.1f} CPU µs/IO", flush=True)
    finally:
        target.send_signal(signal.SIGINT)
        target.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]

    small, large = WORKLOADS
    lines = [
        BEGIN,
        "## Exports: fio through NBD and FUSE against the host library",
        "",
        f"Command: `scripts/bench-exports.py --runtime {a.runtime} --repeats {a.repeats}` "
        f"({time.strftime('%Y-%m-%d')}, 1-minute load average {load_before} before, {load_after} after).",
        "",
        "Sluice target (RAM, adaptive polling) on core 0; the export (or nbdkit) and fio, or `sluice bench`, "
        "on core 1. Median of the repeats, range in brackets. CPU µs/IO: the serving process on core 1 "
        "(for `sluice bench`, the bench itself, load generation included).",
        "",
        "| path | 4 KiB randread QD 32, IOPS | CPU µs/IO | 128 KiB read QD 8, GB/s | CPU µs/IO |",
        "|---|---|---|---|---|",
    ]
    for name, _ in paths:
        s, l = results[name][small], results[name][large]
        lines.append(f"| {name} | {cell(s, 0)} | {cell(s, 2, fmt='{:.1f}')} | "
                     f"{cell(l, 1, 2**20 / 1e9, '{:.2f}')} | {cell(l, 2, fmt='{:.1f}')} |")
    med = {name: {w: statistics.median(r[0] for r in results[name][w]) for w in WORKLOADS} for name, _ in paths}
    bench, nbd, fuse, nbd_tcp, nbdkit, fuse_uring, nbd_simple, nbdkit_simple, fs_fuser, fs_uring, ceiling = (
        paths[i][0] for i in (0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11))

    def ratio(x, y, w):
        return f"{med[x][w] / med[y][w]:.2f}"
    lines += [
        "",
        f"Ratios of medians: NBD / `sluice bench` = {ratio(nbd, bench, small)} (4 KiB) and "
        f"{ratio(nbd, bench, large)} (128 KiB), goal >= 0.8 (over loopback TCP {ratio(nbd_tcp, bench, small)} and "
        f"{ratio(nbd_tcp, bench, large)}); FUSE / NBD, goal >= 0.5: over io_uring (what `sluice fuse` runs by "
        f"default as root where the kernel offers it, as here) {ratio(fuse_uring, nbd, small)} and "
        f"{ratio(fuse_uring, nbd, large)}, over /dev/fuse (fuser, the default elsewhere) {ratio(fuse, nbd, small)} "
        f"and {ratio(fuse, nbd, large)}. The yardstick: nbdkit's memory plugin, which serves from RAM with no network hop, "
        f"reaches {ratio(nbdkit, bench, small)} and {ratio(nbdkit, bench, large)} of `sluice bench` (at 4 KiB, the "
        f"ceiling of fio's nbd engine sharing its core with the server); NBD reaches {ratio(nbd, nbdkit, small)} "
        f"and {ratio(nbd, nbdkit, large)} of nbdkit. fio's nbd engine alone, with a core to itself and a server "
        f"that does nothing, reaches {ratio(ceiling, bench, small)} and {ratio(ceiling, bench, large)} of "
        f"`sluice bench`: no NBD server can take fio past that. FUSE over io_uring / FUSE over /dev/fuse (fuser) = "
        f"{ratio(fuse_uring, fuse, small)} and {ratio(fuse_uring, fuse, large)}. "
        f"Simple replies only (`--structured-replies false`; nbdkit `--no-sr`): NBD / `sluice bench` = "
        f"{ratio(nbd_simple, bench, small)} and {ratio(nbd_simple, bench, large)}; against structured replies "
        f"{ratio(nbd_simple, nbd, small)} and {ratio(nbd_simple, nbd, large)} (nbdkit "
        f"{ratio(nbdkit_simple, nbdkit, small)} and {ratio(nbdkit_simple, nbdkit, large)}). "
        f"Through ext4 on a loop device over the FUSE file (how mkfs and mount reach it): io_uring / fuser = "
        f"{ratio(fs_uring, fs_fuser, small)} and {ratio(fs_uring, fs_fuser, large)} (on the file itself "
        f"{ratio(fuse_uring, fuse, small)} and {ratio(fuse_uring, fuse, large)}); through ext4 / on the file: "
        f"fuser {ratio(fs_fuser, fuse, small)} and {ratio(fs_fuser, fuse, large)}, io_uring "
        f"{ratio(fs_uring, fuse_uring, small)} and {ratio(fs_uring, fuse_uring, large)}.",
        END,
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    text = open(a.out).read() if os.path.exists(a.out) else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + table + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + table
    with open(a.out, "w") as f:
        f.write(text)
    print(f"bench-exports: wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
