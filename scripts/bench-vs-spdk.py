#!/usr/bin/env python3
"""Sluice against SPDK on this machine, side by side, in one run.

    scripts/bench-vs-spdk.sh SPDK_DIR [--runtime S] [--repeats N] [--slices K] [--rows ...]
                                      [--engine E] [--sluice-tcp-congestion NAME]
                                      [--write-doc]

SPDK_DIR is an SPDK tree built by scripts/build-spdk.sh (build/bin/nvmf_tgt,
build/bin/spdk_nvme_perf, scripts/rpc.py). Each pair runs with the target
pinned to CPU 0 and the host to CPU 1, on loopback, a 4 KiB-block RAM/malloc
namespace of 512 MiB (Sluice's with `huge_pages = true`, as SPDK's malloc
bdev sits on hugepages), no digests, written whole once after each target
starts (Sluice's RAM backend is sparse: unwritten ranges read as zeros
without touching memory, and a first write faults its chunk in). The pairs:

  perf>spdk      spdk_nvme_perf -> nvmf_tgt                (the SPDK pair)
  perf>sluice    spdk_nvme_perf -> sluice target (adaptive)
  bench>spdk     sluice bench (adaptive) -> nvmf_tgt
  bench-busy>spdk sluice bench (busy-poll) -> nvmf_tgt
  bench>sluice   sluice bench -> sluice target (both adaptive)
  bench-int>sluice  sluice bench (interrupt: waits in epoll, never spins)
                 -> sluice target (adaptive): the pair's CPU when the host
                 does not spin while the target works
  bench-spin2>sluice  sluice bench (adaptive, --spin-depth-max 2: spins only
                 while at most 2 commands are outstanding, else waits in
                 epoll) -> sluice target (adaptive): one host setting that
                 spins where a wake-up would cost a round trip (QD 1) and
                 sleeps where one serves a batch
  bench-batch>sluice  sluice bench (adaptive, --wake-batch-min 256KiB: while
                 at least 256 KiB of read data is due it does not spin, and
                 sleeps until half of it has arrived) -> sluice target
                 (adaptive): spins like the adaptive host at 4 KiB (32 reads
                 in flight are 131 KiB), sleeps in batches at 128 KiB
  bench-busy>sluice-busy  both in busy-poll mode (as the SPDK pair always is)

and the rows: 4 KiB randread QD 32, 4 KiB randwrite QD 32, 4 KiB randread
QD 1 (mean latency too), 128 KiB sequential read QD 8 (bandwidth). Each cell
is the median of --repeats runs of --runtime seconds, with the range. The
three targets (nvmf_tgt, the Sluice target adaptive, and busy-polling) run
side by side on CPU 0, each stopped with SIGSTOP while a pair on another
runs (nvmf_tgt's reactor and the busy-poll target spin even when idle, and
a running one would take half the core of the pair under test; a stopped
one keeps its sockets and uses no CPU). With --slices K each pair's run is
K runs of --runtime/K seconds, and every pair, on every target, takes its
turn in each slice (which goes first rotates every slice, the order
reverses every repeat), so that every ratio, across targets too, compares
the same phases of the machine: its copies have slow phases lasting
seconds, and it drifts 2-3x over minutes (docs/benchmarks.md). Tables
before 2026-12-07 12:00 UTC ran one target at a time, so their ratios
across targets (every goal's) compared runs up to a minute apart. Ratios
are taken within each repeat and reported as their median and range. With
--slices K > 1 a second table takes the goals' ratios per slice round
instead (the two pairs' slices of one round, some 10 s apart at most),
with their median and interquartile range over all rounds: the machine's
slow spells make each slice fast or slow for every pair alike, and a
repeat whose pair caught one more slow slice moves its ratio by 10-20 %.
CPU: the target's and the host's CPU-seconds over the
host's measured run only (read from /proc every 10 ms, CpuTrace): for
spdk_nvme_perf from its "Launching workers" line for the run time, for
`sluice bench` the window its report names (`cpu_window_unix_s`). Neither
side's start-up or tear-down counts (spdk_nvme_perf's DPDK set-up costs
about 0.15 CPU-s while nvmf_tgt spins beside it: counted per 1 s slice, it
flattered the Sluice pairs by about 7 %). So IOPS per CPU-second covers both
sides, over the same seconds as the IOPS; nvmf_tgt and
spdk_nvme_perf busy-poll a core each by design.

Every socket takes the system's TCP congestion control
(net.ipv4.tcp_congestion_control, named in the table's header) unless
--sluice-tcp-congestion NAME sets the Sluice target's (`target.tcp_congestion`;
on loopback, BBR holds back the Sluice target's bursts of 128 KiB reads, and
nvmf_tgt's reads move no more under CUBIC than under BBR: docs/target.md).

Prints a markdown table with ratios; with --write-doc also replaces the block
between the markers in docs/benchmarks.md. Run it on a quiet machine: a
compile beside it halves the numbers.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLUICE = ROOT / "target" / "release" / "sluice"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench-vs-spdk: begin -->"
END = "<!-- bench-vs-spdk: end -->"
# Below Linux's ephemeral range (32768-60999 by default): a run on
# 34720 once failed to listen, the port taken as the local end of some
# connection of the run before.
PORT_SPDK = 24720
PORT_SLUICE = 24721
PORT_SLUICE_BUSY = 24722
NQN_SPDK = "nqn.2016-06.io.spdk:bench"
NQN_SLUICE = "nqn.2026-11.io.sluice:bench"
PORTS = {"spdk": PORT_SPDK, "sluice": PORT_SLUICE, "sluice-busy": PORT_SLUICE_BUSY}
NQNS = {"spdk": NQN_SPDK, "sluice": NQN_SLUICE, "sluice-busy": NQN_SLUICE}
TARGET_CPU = 0
HOST_CPU = 1
# How often CpuTrace reads /proc (a reading costs about 30 µs).
CPU_TRACE_PERIOD_S = 0.01
# What each `sluice bench` pair passes to the host, by its name before ">".
BENCH_HOST_ARGS = {
    "bench": ["--polling", "adaptive"],
    "bench-busy": ["--polling", "busy-poll"],
    "bench-int": ["--polling", "interrupt"],
    "bench-spin2": ["--polling", "adaptive", "--spin-depth-max", "2"],
    "bench-batch": ["--polling", "adaptive", "--wake-batch-min", "256KiB"],
}
# What every `sluice bench` pair adds against a target, by its kind. Against
# nvmf_tgt the host writes a turn's commands 8 at a time: nvmf_tgt has time
# to spare at QD 32 and starts on the first ones while the host builds the
# rest; Sluice's target is saturated there and the extra writes only cost
# (docs/host.md, `--submit-chunk`).
BENCH_TARGET_ARGS = {
    "spdk": ["--submit-chunk", "8"],
}

ROWS = {
    "4k-randread-qd32": dict(rw="randread", bs=4096, qd=32, label="4K randread QD32"),
    "4k-randwrite-qd32": dict(rw="randwrite", bs=4096, qd=32, label="4K randwrite QD32"),
    "4k-randread-qd1": dict(rw="randread", bs=4096, qd=1, label="4K randread QD1"),
    "128k-read-qd8": dict(rw="read", bs=131072, qd=8, label="128K read QD8"),
}


def die(msg):
    print(f"bench-vs-spdk: {msg}", file=sys.stderr)
    sys.exit(2)


def cpu_s(pid):
    """utime + stime of a process and its threads, in seconds (None once it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class CpuTrace:
    """The CPU-seconds of some processes, read every CPU_TRACE_PERIOD_S by a
    thread, so that a process's CPU can be taken over a window known only
    afterwards: the host's measured run, without its start-up and tear-down
    (spdk_nvme_perf's DPDK set-up costs about 0.15 CPU-s, and nvmf_tgt spins
    all the while). Between readings the CPU is interpolated linearly."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.samples = []  # (UNIX time, {pid: CPU-s})
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._sample()
        self.thread.start()

    def watch(self, pid):
        with self.lock:
            self.pids.append(pid)
        self._sample()

    def _sample(self):
        with self.lock:
            t = time.time()
            row = {p: c for p in self.pids if (c := cpu_s(p)) is not None}
            self.samples.append((t, row))

    def _run(self):
        while not self.done.wait(CPU_TRACE_PERIOD_S):
            self._sample()

    def close(self):
        self.done.set()
        self.thread.join()
        self._sample()

    def _at(self, pid, t):
        pts = [(ts, row[pid]) for ts, row in self.samples if pid in row]
        if not pts:
            raise RuntimeError(f"no CPU reading of process {pid}")
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        return pts[-1][1]

    def between(self, pid, t0, t1):
        """CPU-seconds `pid` used from UNIX time t0 to t1."""
        return self._at(pid, t1) - self._at(pid, t0)


def wait_port(port, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    die(f"port {port} never opened")


class Paused:
    """A target stopped (SIGSTOP) while the pairs of other targets run, and
    resumed (SIGCONT) for its own. Each target runs in a session of its own
    (`start_new_session`): a stopped process in a process group that becomes
    orphaned (the shell that started this script exits, as a background
    job's does) gets SIGHUP from the kernel, which killed nvmf_tgt mid-run
    (and makes a Sluice target reload its file)."""

    def pause(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGSTOP)

    def resume(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)

    def ready(self, port):
        """Resumes the target and waits until its port takes a connection."""
        self.resume()
        if self.p.poll() is not None:
            raise RuntimeError(f"{type(self).__name__} exited with {self.p.returncode}")
        wait_port(port)

    def stop(self):
        # A stopped process acts on SIGINT only once it runs again.
        self.resume()
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()


class SpdkTarget(Paused):
    def __init__(self, spdk, work):
        self.sock = str(Path(work) / "spdk.sock")
        self.log = open(Path(work) / "nvmf_tgt.log", "w")
        self.p = subprocess.Popen(
            ["taskset", "-c", str(TARGET_CPU), f"{spdk}/build/bin/nvmf_tgt", "-m", "0x1",
             "--disable-cpumask-locks", "-r", self.sock],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(100):
            if Path(self.sock).exists():
                break
            time.sleep(0.1)
        env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
        rpc = [f"{spdk}/scripts/rpc.py", "-s", self.sock]
        try:
            for args in (["nvmf_create_transport", "-t", "TCP"],
                         ["bdev_malloc_create", "-b", "Malloc0", "512", "4096"],
                         ["nvmf_create_subsystem", NQN_SPDK, "-a", "-s", "SPDK0001"],
                         ["nvmf_subsystem_add_ns", NQN_SPDK, "Malloc0"],
                         ["nvmf_subsystem_add_listener", NQN_SPDK, "-t", "tcp", "-a", "127.0.0.1",
                          "-s", str(PORT_SPDK)]):
                subprocess.run(rpc + args, env=env, check=True, stdout=subprocess.DEVNULL)
            wait_port(PORT_SPDK)
        except BaseException:
            # An nvmf_tgt left behind spins on the target's core for good.
            self.stop()
            raise

class SluiceTarget(Paused):
    def __init__(self, work, polling="adaptive", tcp_congestion=None, port=PORT_SLUICE):
        cfg = Path(work) / f"target-{port}.toml"
        cc = f'tcp_congestion = "{tcp_congestion}"' if tcp_congestion else ""
        cfg.write_text(f"""
[target]
listen = "127.0.0.1:{port}"
discovery_listen = ""
workers = 1
polling = "{polling}"
{cc}

[[subsystem]]
nqn = "{NQN_SLUICE}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "512MiB"
block_size = 4096
huge_pages = true
""")
        self.log = open(Path(work) / f"sluice-target-{port}.log", "w")
        self.p = subprocess.Popen(
            ["taskset", "-c", str(TARGET_CPU), str(SLUICE), "target", "--config", str(cfg)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_port(port)
        except BaseException:
            self.stop()
            raise

def run_perf(spdk, port, nqn, row, runtime, tgt_pid):
    """spdk_nvme_perf: (IOPS, MiB/s, mean latency us, host CPU-s, target CPU-s),
    the CPU over its measured run: from its "Launching workers" line for
    `runtime` seconds (read line by line: stdbuf makes its stdout line-buffered)."""
    r = ROWS[row]
    cmd = ["stdbuf", "-oL", f"{spdk}/build/bin/spdk_nvme_perf",
           "-c", hex(1 << HOST_CPU), "-q", str(r["qd"]), "-o", str(r["bs"]), "-w", r["rw"],
           "-t", str(runtime),
           "-r", f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"]
    trace = CpuTrace([tgt_pid])
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        trace.watch(p.pid)
        launched = None
        lines = []
        timer = threading.Timer(runtime + 60, p.kill)
        timer.start()
        try:
            for line in p.stdout:
                if launched is None and "Launching workers" in line:
                    launched = time.time()
                lines.append(line)
            p.wait()
        finally:
            timer.cancel()
    finally:
        trace.close()
    text = "".join(lines)
    m = re.search(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
    if not m or launched is None:
        raise RuntimeError(f"spdk_nvme_perf gave no Total line or no launch line:\n{text[-2000:]}")
    window = (launched, launched + runtime)
    return (float(m.group(1)), float(m.group(2)), float(m.group(3)),
            trace.between(p.pid, *window), trace.between(tgt_pid, *window))


def run_bench(port, nqn, row, runtime, host_args, engine, tgt_pid):
    """sluice bench: (IOPS, MiB/s, mean latency us, host CPU-s, target CPU-s),
    the CPU over the window its report names (`cpu_window_unix_s`: its run,
    without connect and disconnect)."""
    r = ROWS[row]
    cmd = ["taskset", "-c", str(HOST_CPU), str(SLUICE), "bench", "--target", f"127.0.0.1:{port}",
           "--nqn", nqn, "--rw", r["rw"], "--bs", str(r["bs"]), "--qd", str(r["qd"]),
           "--runtime", str(runtime), "--json", *host_args]
    if engine:
        cmd += ["--engine", engine]
    trace = CpuTrace([tgt_pid])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime + 60)
    finally:
        trace.close()
    try:
        rep = json.loads(out.stdout[out.stdout.index("{"):])
    except (ValueError, json.JSONDecodeError):
        raise RuntimeError(f"sluice bench failed:\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}")
    t = rep["total"]
    if t["errors"]:
        raise RuntimeError(f"sluice bench reported {t['errors']} errors")
    return (t["iops"], t["bandwidth_mib_s"], t["latency_us_mean"],
            rep["cpu_user_s"] + rep["cpu_sys_s"], trace.between(tgt_pid, *rep["cpu_window_unix_s"]))


def precondition(spdk, port, nqn):
    """Writes the whole namespace once (128 KiB sequential writes for 3 s,
    several passes), so every row measures written memory: Sluice's RAM
    backend is sparse (a read of a never-written range fills zeros without
    touching memory, a first write allocates and faults its chunk), while
    SPDK's malloc bdev is allocated up front."""
    cmd = [f"{spdk}/build/bin/spdk_nvme_perf", "-c", hex(1 << HOST_CPU), "-q", "16", "-o", "131072",
           "-w", "write", "-t", "3",
           "-r", f"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    m = re.search(r"^Total\s*:\s*([\d.]+)\s+([\d.]+)", out.stdout + out.stderr, re.M)
    if not m or float(m.group(2)) * 3 < 512 * 1.5:
        raise RuntimeError(f"preconditioning wrote too little:\n{(out.stdout + out.stderr)[-1500:]}")


def fmt_iops(v):
    return f"{v / 1000:.0f}k" if v >= 1000 else f"{v:.0f}"


def cell(vals, kind):
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    if kind == "bw":
        return f"{med / 1024:.2f} GiB/s ({lo / 1024:.2f}-{hi / 1024:.2f})"
    if kind == "lat":
        return f"{med:.1f} µs ({lo:.1f}-{hi:.1f})"
    return f"{fmt_iops(med)} ({fmt_iops(lo)}-{fmt_iops(hi)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spdk_dir")
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slices", type=int, default=1,
                    help="cut each pair's run into this many slices that take turns with every other "
                         "pair's, on every target (--runtime must be a multiple)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--engine", default="", help="sluice bench --engine value (default: bench's default)")
    ap.add_argument("--sluice-tcp-congestion", default="",
                    help="the Sluice target's target.tcp_congestion (default: the system's)")
    ap.add_argument("--write-doc", action="store_true")
    a = ap.parse_args()
    spdk = Path(a.spdk_dir).resolve()
    for b in ("build/bin/nvmf_tgt", "build/bin/spdk_nvme_perf", "scripts/rpc.py"):
        if not (spdk / b).exists():
            die(f"{spdk / b} is missing: build SPDK with scripts/build-spdk.sh first")
    rows = a.rows.split(",")
    for r in rows:
        if r not in ROWS:
            die(f"--rows: unknown row {r!r} (known: {', '.join(ROWS)})")
    if a.runtime < 1 or a.repeats < 1:
        die("--runtime and --repeats must be at least 1")
    if a.slices < 1 or a.runtime % a.slices:
        die(f"--slices: {a.slices} must be at least 1 and divide --runtime ({a.runtime} s) into whole seconds")
    if a.sluice_tcp_congestion and not re.fullmatch(r"[A-Za-z0-9_-]{1,15}", a.sluice_tcp_congestion):
        die(f"--sluice-tcp-congestion: {a.sluice_tcp_congestion!r} is not a congestion control name (e.g. cubic)")
    system_cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    if os.cpu_count() < 2:
        die("needs two CPUs (target on 0, host on 1)")
    if int(Path("/proc/sys/vm/nr_hugepages").read_text()) < 1024:
        Path("/proc/sys/vm/nr_hugepages").write_text("1024")
    # DPDK finds hugepages only through a mounted hugetlbfs.
    if subprocess.run(["mountpoint", "-q", "/dev/hugepages"]).returncode != 0:
        Path("/dev/hugepages").mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "nodev", "/dev/hugepages"], check=True)
    subprocess.run([str(ROOT / "scripts" / "install-build-deps.sh")], check=True)
    subprocess.run(["cargo", "build", "-q", "--release", "--bin", "sluice"], cwd=ROOT, check=True)

    work = tempfile.mkdtemp(prefix="bench-vs-spdk.")
    pairs = ["perf>spdk", "perf>sluice", "bench>spdk", "bench-busy>spdk", "bench>sluice",
             "bench-int>sluice", "bench-spin2>sluice", "bench-batch>sluice", "bench-busy>sluice-busy"]
    # results[pair][row] = list of (iops, mib_s, lat_us, cpu_s_both)
    results = {p: {r: [] for r in rows} for p in pairs}
    # slices[pair][row][(repeat, slice)] = (iops, mib_s, cpu_s both sides)
    slices = {p: {r: {} for r in rows} for p in pairs}
    # All three targets run side by side on CPU 0, each stopped (SIGSTOP)
    # while a pair on another runs: nvmf_tgt's reactor spins on its core
    # even when idle (and so does the busy-poll Sluice target), so a target
    # left running beside the pair's would take half its core. A stopped
    # target's sockets stay open in the kernel; it uses no CPU until
    # SIGCONT. So the slices of every pair, on every target, can take
    # turns within seconds, and a ratio across targets (every goal's)
    # compares the same phases of the machine.
    for kind, port in PORTS.items():
        # A target left from an earlier run (a stopped one too) would answer
        # in place of the new one, which could not listen.
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                die(f"port {port} (the {kind} target's) is taken: is a target of an earlier run "
                    "still running?")
        except OSError:
            pass
    targets = {}
    try:
        for kind in ("spdk", "sluice", "sluice-busy"):
            if kind == "spdk":
                tgt = SpdkTarget(spdk, work)
            else:
                tgt = SluiceTarget(work, "busy-poll" if kind == "sluice-busy" else "adaptive",
                                   a.sluice_tcp_congestion or None, PORTS[kind])
            targets[kind] = tgt
            precondition(spdk, PORTS[kind], NQNS[kind])
            tgt.pause()
        slice_s = a.runtime // a.slices
        for rep in range(a.repeats):
            for row in rows:
                acc = {p: [0.0, 0.0, 0.0, 0.0] for p in pairs}  # I/Os, MiB, I/Os x latency, CPU-s
                for sl in range(a.slices):
                    # Every pair takes a turn in each slice; which goes
                    # first rotates, and the order reverses every repeat.
                    k = (rep + sl) % len(pairs)
                    order = pairs[k:] + pairs[:k]
                    for pair in (order if rep % 2 == 0 else order[::-1]):
                        host, kind = pair.split(">")
                        tgt = targets[kind]
                        args = BENCH_HOST_ARGS.get(host, []) + BENCH_TARGET_ARGS.get(kind, [])
                        tgt.ready(PORTS[kind])
                        try:
                            if host == "perf":
                                iops, mib, lat, hcpu, tcpu = run_perf(
                                    spdk, PORTS[kind], NQNS[kind], row, slice_s, tgt.p.pid)
                            else:
                                iops, mib, lat, hcpu, tcpu = run_bench(
                                    PORTS[kind], NQNS[kind], row, slice_s, args, a.engine,
                                    tgt.p.pid)
                        finally:
                            tgt.pause()
                        sums = acc[pair]
                        sums[0] += iops * slice_s
                        sums[1] += mib * slice_s
                        sums[2] += lat * iops * slice_s
                        sums[3] += hcpu + tcpu
                        slices[pair][row][(rep, sl)] = (iops, mib, hcpu + tcpu)
                        tag = f" slice {sl + 1}" if a.slices > 1 else ""
                        print(f"  repeat {rep + 1}{tag} {row:18} {pair:22} {fmt_iops(iops):>6} IOPS "
                              f"{mib:8.1f} MiB/s {lat:8.1f} µs  cpu {hcpu + tcpu:5.2f} s", flush=True)
                for pair, (ios, mib_total, lat_w, cpu) in acc.items():
                    results[pair][row].append((ios / a.runtime, mib_total / a.runtime,
                                               lat_w / ios if ios > 0 else 0.0, cpu))
    finally:
        for tgt in targets.values():
            tgt.stop()

    def med(pair, row, i):
        return statistics.median(v[i] for v in results[pair][row])

    def per_cpu(pair, row):
        return statistics.median(v[0] * a.runtime / v[3] if v[3] > 0 else 0 for v in results[pair][row])

    def ratio(num, den, row, i):
        """Median and range of num/den taken within each repeat."""
        rs = [n[i] / d[i] for n, d in zip(results[num][row], results[den][row]) if d[i] > 0]
        if not rs:
            return "-"
        return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"

    def cpu_ratio(num, den, row):
        rs = [(n[0] / n[3]) / (d[0] / d[3]) for n, d in zip(results[num][row], results[den][row])
              if n[3] > 0 and d[3] > 0 and d[0] > 0]
        return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})" if rs else "-"

    lines = []
    lines.append(f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
                 f"`scripts/bench-vs-spdk.sh` (SPDK {subprocess.run(['git', '-C', str(spdk), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}): "
                 f"target on CPU {TARGET_CPU}, host on CPU {HOST_CPU}, loopback, 4 KiB-block RAM/malloc "
                 f"namespace written whole first, no digests, {a.runtime} s per run"
                 + (f" in {a.slices} slices that take turns with every other pair's" if a.slices > 1 else "")
                 + f", median of {a.repeats} repeats (the three targets side by side, each stopped by SIGSTOP while another's pair runs; the pairs rotated every slice, their order reversed every repeat) "
                 f"(range in brackets); `sluice bench` engine: {a.engine or 'its default'}, "
                 f"against nvmf_tgt with `{' '.join(BENCH_TARGET_ARGS['spdk'])}`; "
                 f"TCP congestion control: the system's {system_cc}"
                 + (f", and {a.sluice_tcp_congestion} on the Sluice target's sockets (`target.tcp_congestion`)."
                    if a.sluice_tcp_congestion else " on every socket."))
    lines.append("")
    lines.append("| workload | " + " | ".join(pairs) + " |")
    lines.append("|---|" + "---|" * len(pairs))
    for row in rows:
        kind = "bw" if ROWS[row]["bs"] > 4096 else "iops"
        cells = [cell([v[1 if kind == "bw" else 0] for v in results[p][row]], kind) for p in pairs]
        lines.append(f"| {ROWS[row]['label']} | " + " | ".join(cells) + " |")
        if ROWS[row]["qd"] == 1:
            cells = [cell([v[2] for v in results[p][row]], "lat") for p in pairs]
            lines.append(f"| {ROWS[row]['label']} mean latency | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Ratios taken within each repeat, median (range) (the goals: each ≥ 1.0; the Sluice pair "
                 "also ≥ 1.5x the SPDK pair's IOPS per CPU-second; QD 1 as IOPS, so higher is better):")
    lines.append("")
    lines.append("| workload | perf>sluice / perf>spdk | bench>spdk / perf>spdk | bench-busy>spdk / bench>spdk "
                 "| bench>sluice / perf>spdk | bench-busy>sluice-busy / perf>spdk "
                 "| IOPS per CPU-s, SPDK pair | IOPS per CPU-s, Sluice pair (adaptive) | per CPU-s, Sluice / SPDK "
                 "| bench-int>sluice / perf>spdk | per CPU-s, Sluice (bench interrupt) / SPDK "
                 "| bench-spin2>sluice / perf>spdk | per CPU-s, Sluice (bench spin2) / SPDK "
                 "| bench-batch>sluice / perf>spdk | per CPU-s, Sluice (bench batch) / SPDK |")
    lines.append("|---|" + "---|" * 14)
    for row in rows:
        i = 1 if ROWS[row]["bs"] > 4096 else 0
        cells = [ratio("perf>sluice", "perf>spdk", row, i), ratio("bench>spdk", "perf>spdk", row, i),
                 ratio("bench-busy>spdk", "bench>spdk", row, i), ratio("bench>sluice", "perf>spdk", row, i),
                 ratio("bench-busy>sluice-busy", "perf>spdk", row, i)]
        lines.append(f"| {ROWS[row]['label']} | " + " | ".join(cells) + " | "
                     f"{fmt_iops(per_cpu('perf>spdk', row))} | {fmt_iops(per_cpu('bench>sluice', row))} | "
                     f"{cpu_ratio('bench>sluice', 'perf>spdk', row)} | "
                     f"{ratio('bench-int>sluice', 'perf>spdk', row, i)} | "
                     f"{cpu_ratio('bench-int>sluice', 'perf>spdk', row)} | "
                     f"{ratio('bench-spin2>sluice', 'perf>spdk', row, i)} | "
                     f"{cpu_ratio('bench-spin2>sluice', 'perf>spdk', row)} | "
                     f"{ratio('bench-batch>sluice', 'perf>spdk', row, i)} | "
                     f"{cpu_ratio('bench-batch>sluice', 'perf>spdk', row)} |")
    # The machine's slow phases come in spells of seconds (docs/benchmarks.md):
    # a slice is fast or slow for every pair alike, and a pair that caught one
    # more slow slice than another loses 10-20 % of a repeat's ratio. Ratios
    # of the two pairs' runs in the same slice round (at most a round, some
    # 10 s, apart), over every round, are the steadier estimate.
    def slice_ratios(num, den, row, per_cpu=False):
        i = 1 if ROWS[row]["bs"] > 4096 else 0
        rs = []
        for key, n in slices[num][row].items():
            d = slices[den][row].get(key)
            if d is None or d[i] <= 0 or (per_cpu and (n[2] <= 0 or d[2] <= 0)):
                continue
            rs.append((n[i] / n[2]) / (d[i] / d[2]) if per_cpu else n[i] / d[i])
        if not rs:
            return "-"
        q = statistics.quantiles(rs, n=4) if len(rs) > 1 else [rs[0]] * 3
        return f"{statistics.median(rs):.2f} ({q[0]:.2f}-{q[2]:.2f})"

    if a.slices > 1:
        lines.append("")
        lines.append("Ratios per slice round (the two pairs' slices in the same round), median "
                     "(interquartile range) over all rounds:")
        lines.append("")
        cols = [("perf>sluice", "perf>spdk", False), ("bench>spdk", "perf>spdk", False),
                ("bench-busy>spdk", "bench>spdk", False), ("bench>sluice", "perf>spdk", False),
                ("bench-busy>sluice-busy", "bench>sluice", False), ("bench>sluice", "perf>spdk", True),
                ("bench-spin2>sluice", "perf>spdk", True), ("bench-batch>sluice", "perf>spdk", False),
                ("bench-batch>sluice", "perf>spdk", True)]
        lines.append("| workload | " + " | ".join(
            f"{n} / {d}" + (" per CPU-s" if c else "") for n, d, c in cols) + " |")
        lines.append("|---|" + "---|" * len(cols))
        for row in rows:
            lines.append(f"| {ROWS[row]['label']} | "
                         + " | ".join(slice_ratios(n, d, row, c) for n, d, c in cols) + " |")
    table = "\n".join(lines)
    print()
    print(table)
    if a.write_doc:
        doc = DOC.read_text()
        block = f"{BEGIN}\n{table}\n{END}"
        if BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
        else:
            doc += "\n## Against SPDK on this machine\n\n" + block + "\n"
        DOC.write_text(doc)
        print(f"\nwrote the table into {DOC}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
