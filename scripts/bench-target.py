#!/usr/bin/env python3
"""Sluice host against Sluice target on loopback, each pinned to its own core,
stated as ratios to the TCP wire floor measured in the same run.

    scripts/bench-target.py [--runtime 5] [--modes busy-poll,adaptive] [--out docs/benchmarks.md]
                            [--spdk spdk.json]

For each polling mode (target and host in the same mode) and workload
(4 KiB randread/randwrite at QD 1 and 32, 128 KiB sequential read/write at
QD 8), runs `sluice bench --floor --json` on the bench core against `sluice
target` on the target core (RAM namespace), with the floor's echo server on
the target's core too (`--floor-server-cpu`), reads the target's CPU time
from /proc before and after, and writes a markdown table between the
`<!-- bench-target: begin/end -->` markers of --out (the rest of the file,
the commentary included, is left alone). Needs a release build (it makes
one).

The floor (crates/sluice-bench/src/floor.rs) is what the wire carries for the
workload: QD 1 against the busy-polled ping-pong round trip, small blocks at
QD > 1 against the batched pipelined loop (many requests per syscall each
way) bounded by bulk bandwidth / block size, 128 KiB against bulk TCP. The
old blocking echo loop is kept in a column for history.

`--spdk FILE`: SPDK's own figures for the same workloads on this machine, as
JSON `{"randread 4k 32": {"iops": 350000, "p50_us": 60}, ...}` (keys
"rw bs qd"); adds a column with the ratio to SPDK. Without it the column is
left out (SPDK is not installed here).
"""
import argparse, json, os, socket, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target", "release", "sluice")
NQN = "nqn.2026-11.io.sluice:ram0"
WORKLOADS = [
    ("randread", "4k", 1), ("randread", "4k", 32),
    ("randwrite", "4k", 1), ("randwrite", "4k", 32),
    ("read", "128k", 8), ("write", "128k", 8),
]
BENCH_CPU, TARGET_CPU = "0", "1"
BEGIN = "<!-- bench-target: begin -->"
END = "<!-- bench-target: end -->"
HOST_POLLING = {"busy-poll": "busy", "adaptive": "adaptive", "interrupt": "interrupt"}


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"target did not listen on {port}")


def run_mode(mode, runtime, port):
    target = subprocess.Popen(["taskset", "-c", TARGET_CPU, SLUICE, "target", "--listen", f"127.0.0.1:{port}",
                               "--discovery-listen", "", "--polling", mode, "--ram-size", "2GiB", "--log", "warn"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(port)
        for rw, bs, qd in WORKLOADS:
            t0 = cpu_seconds(target.pid)
            out = subprocess.run(["taskset", "-c", BENCH_CPU, SLUICE, "bench", "--target", f"127.0.0.1:{port}", "--nqn", NQN,
                                  "--rw", rw, "--bs", bs, "--qd", str(qd), "--runtime", str(runtime),
                                  "--polling", HOST_POLLING[mode], "--floor", "--floor-server-cpu", TARGET_CPU,
                                  "--span", "1g", "--json"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"bench failed for {rw} {bs} qd{qd}: {out.stderr}")
            tcpu = cpu_seconds(target.pid) - t0
            r = json.loads(out.stdout)
            j, f = r["jobs"][0], r["floor"]
            hcpu = r["cpu_user_s"] + r["cpu_sys_s"]
            rows.append(dict(mode=mode, rw=rw, bs=bs, qd=qd, iops=j["iops"], mib_s=j["bandwidth_mib_s"],
                             p50=j["latency_us_p50"], p99=j["latency_us_p99"], errors=j["errors"],
                             floor=f,
                             iops_per_cpu_s=j["ios"] / max(tcpu + hcpu, 1e-9), target_cpu_s=tcpu, host_cpu_s=hcpu))
            print(f"{mode:9} {rw:9} {bs:4} qd{qd:<2} {j['iops']:9.0f} IOPS {j['bandwidth_mib_s']:7.0f} MiB/s "
                  f"p50 {j['latency_us_p50']:7.1f} us | floor {f['floor_basis']} {f['floor_iops']:.0f}/s "
                  f"(batched {f['batched_iops']:.0f}/s {f['batched_polling']}, bulk {f['bulk_mib_per_s']:.0f} MiB/s "
                  f"= {f['bulk_iops_ceiling']:.0f}/s, busy rtt p50 {f['busy_pingpong_latency_us_p50']:.1f} us) | "
                  f"old echo: rtt p50 {f['pingpong_latency_us_p50']:.1f} us, {f['pipelined_iops']:.0f}/s", flush=True)
    finally:
        target.send_signal(2)
        target.wait(timeout=30)
    return rows


def ratio_cells(r):
    """The ratio to the floor for the workload (floor.rs decides the basis)."""
    f = r["floor"]
    if r["qd"] == 1:
        how = "busy" if f["floor_basis"] == "busy_rtt" else "blocking"
        return f"p50 {r['p50'] / f['floor_latency_us_p50']:.2f}x {how} RTT ({f['floor_latency_us_p50']:.1f} µs)"
    if f["block_size_bytes"] >= 64 * 1024:
        what = "bulk TCP" if f["floor_basis"] == "bulk" else "batched TCP"
        return f"{r['mib_s'] / f['floor_mib_per_s']:.2f} of {what} ({f['floor_mib_per_s']:.0f} MiB/s)"
    what = {"bulk": "bulk ceiling", "echo_pipelined": "echo loop"}.get(f["floor_basis"], "batched TCP")
    return f"{r['iops'] / f['floor_iops']:.2f} of {what} ({f['floor_iops'] / 1000:.0f}k, QD {f['batched_qd']})"


def old_ratio_cell(r):
    """The ratio to the old blocking echo loop, for history."""
    f = r["floor"]
    if r["bs"] == "128k":
        return f"{r['mib_s'] / f['bulk_blocking_mib_per_s']:.2f} of blocking bulk"
    if r["qd"] == 1:
        return f"p50 {r['p50'] / f['pingpong_latency_us_p50']:.2f}x"
    return f"{r['iops'] / f['pipelined_iops']:.2f}"


def spdk_cell(r, spdk):
    ref = spdk.get(f"{r['rw']} {r['bs']} {r['qd']}")
    if not ref:
        return "-"
    if r["qd"] == 1 and ref.get("p50_us"):
        return f"p50 {r['p50'] / ref['p50_us']:.2f}x"
    return f"{r['iops'] / ref['iops']:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--modes", default="busy-poll,adaptive")
    ap.add_argument("--port", type=int, default=24420)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--spdk", help="JSON of SPDK's figures for the same workloads (see the module doc)")
    a = ap.parse_args()
    spdk = None
    if a.spdk:
        with open(a.spdk) as f:
            spdk = json.load(f)
    subprocess.run([os.path.join(ROOT, "scripts", "install-build-deps.sh")], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice-cli"], cwd=ROOT, check=True)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    rows = []
    for m in a.modes.split(","):
        rows += run_mode(m, a.runtime, a.port)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]
    lines = [
        BEGIN,
        f"Command: `scripts/bench-target.py --runtime {a.runtime} --modes {a.modes}` "
        f"({time.strftime('%Y-%m-%d')}, 1-minute load average {load_before} before, {load_after} after).",
        "",
        f"RAM namespace, loopback, target pinned to core {TARGET_CPU} and `sluice bench` to core {BENCH_CPU}, "
        "both in the same",
        "polling mode. Each row's floor was measured by the same `sluice bench --floor` invocation, just",
        f"before the workload, with the floor's echo server pinned to the target's core {TARGET_CPU} "
        "(`--floor-server-cpu`) and its",
        "client on the bench's core. Messages have the workload's shape: a read is a 72 B request and a",
        "16 B + block reply, a write a 72 B + block request and a 24 B reply. The floor is what the wire",
        "carries for the workload (crates/sluice-bench/src/floor.rs):",
        "",
        "- QD 1: the **busy-polled ping-pong**, both ends spinning on non-blocking reads (no epoll,",
        "  no sleep), one request and one reply; the ratio is p50 over its p50 round trip.",
        "- 4 KiB at QD 32: the **batched pipelined loop**: the client keeps QD requests outstanding and",
        "  writes all it may send in one `write` (up to QD requests per syscall), the server reads all",
        "  that is there and answers everything it read with one `write`, the client reads replies in",
        "  256 KiB reads. It runs busy-polled and blocking and keeps the better; never above the bulk",
        "  ceiling.",
        "- 128 KiB: **bulk TCP**, one connection streaming 1 MiB writes into a sink, blocking and",
        "  busy-polled, the better kept (bulk bandwidth / block size is the IOPS ceiling of every",
        "  block size).",
        "",
        "The old floor, a blocking echo loop with one 72 B / 4112 B message per syscall (far below",
        "what the wire carries), is kept in the last column for history (128 KiB: the blocking bulk).",
        "IOPS per CPU-second counts target plus host CPU. Absolute numbers vary with this shared VM;",
        "the ratios are what to compare.",
        "",
        "| mode | workload | QD | IOPS | MiB/s | p50 µs | p99 µs | vs. wire floor |"
        + (" vs. SPDK |" if spdk else "") + " IOPS per CPU-s | vs. old echo loop |",
        "|---|---|---|---|---|---|---|---|" + ("---|" if spdk else "") + "---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['rw']} {r['bs']} | {r['qd']} | {r['iops']:.0f} | {r['mib_s']:.0f} | "
                     f"{r['p50']:.1f} | {r['p99']:.1f} | {ratio_cells(r)} | "
                     + (f"{spdk_cell(r, spdk)} | " if spdk else "")
                     + f"{r['iops_per_cpu_s']:.0f} | {old_ratio_cell(r)} |")
    lines.append(END)
    with open(a.out) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"bench-target: {a.out} has no {BEGIN} ... {END} block to replace")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(a.out, "w") as f:
        f.write(head + "\n".join(lines) + tail)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
