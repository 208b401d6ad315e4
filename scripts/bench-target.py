#!/usr/bin/env python3
"""Sluice host against Sluice target on loopback, each pinned to its own core,
stated as ratios to the raw TCP wire floor measured in the same run.

    scripts/bench-target.py [--runtime 5] [--modes busy-poll,adaptive] [--out docs/benchmarks.md]

For each polling mode (target and host in the same mode) and workload
(4 KiB randread/randwrite at QD 1 and 32, 128 KiB sequential read/write at
QD 8), runs `sluice bench --floor --json` on core 0 against `sluice target`
on core 1 (RAM namespace), reads the target's CPU time from /proc before and
after, and writes a markdown table. Needs a release build (it makes one).
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
    target = subprocess.Popen(["taskset", "-c", "1", SLUICE, "target", "--listen", f"127.0.0.1:{port}",
                               "--discovery-listen", "", "--polling", mode, "--ram-size", "2GiB", "--log", "warn"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_port(port)
        for rw, bs, qd in WORKLOADS:
            t0 = cpu_seconds(target.pid)
            out = subprocess.run(["taskset", "-c", "0", SLUICE, "bench", "--target", f"127.0.0.1:{port}", "--nqn", NQN,
                                  "--rw", rw, "--bs", bs, "--qd", str(qd), "--runtime", str(runtime),
                                  "--polling", HOST_POLLING[mode], "--floor", "--span", "1g", "--json"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"bench failed for {rw} {bs} qd{qd}: {out.stderr}")
            tcpu = cpu_seconds(target.pid) - t0
            r = json.loads(out.stdout)
            j, f = r["jobs"][0], r["floor"]
            hcpu = r["cpu_user_s"] + r["cpu_sys_s"]
            rows.append(dict(mode=mode, rw=rw, bs=bs, qd=qd, iops=j["iops"], mib_s=j["bandwidth_mib_s"],
                             p50=j["latency_us_p50"], p99=j["latency_us_p99"], errors=j["errors"],
                             floor_rtt_p50=f["pingpong_latency_us_p50"], floor_iops=f["pipelined_iops"],
                             floor_qd=f["pipelined_qd"], floor_mib_s=f["bulk_mib_per_s"],
                             iops_per_cpu_s=j["ios"] / max(tcpu + hcpu, 1e-9), target_cpu_s=tcpu, host_cpu_s=hcpu))
            print(f"{mode:9} {rw:9} {bs:4} qd{qd:<2} {j['iops']:9.0f} IOPS {j['bandwidth_mib_s']:7.0f} MiB/s "
                  f"p50 {j['latency_us_p50']:7.1f} us | floor rtt p50 {f['pingpong_latency_us_p50']:.1f} us, "
                  f"pipelined {f['pipelined_iops']:.0f}/s, bulk {f['bulk_mib_per_s']:.0f} MiB/s", flush=True)
    finally:
        target.send_signal(2)
        target.wait(timeout=30)
    return rows


def ratio_cells(r):
    if r["bs"] == "128k":
        return f"{r['mib_s'] / r['floor_mib_s']:.2f} of bulk TCP"
    if r["qd"] == 1:
        return f"p50 {r['p50'] / r['floor_rtt_p50']:.2f}x TCP RTT"
    return f"{r['iops'] / r['floor_iops']:.2f} of pipelined TCP (QD {r['floor_qd']})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--modes", default="busy-poll,adaptive")
    ap.add_argument("--port", type=int, default=24420)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "sluice-cli"], cwd=ROOT, check=True)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[0]
    rows = []
    for m in a.modes.split(","):
        rows += run_mode(m, a.runtime, a.port)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[0]
    lines = [
        "# Benchmarks: Sluice host against Sluice target",
        "",
        f"Command: `scripts/bench-target.py --runtime {a.runtime} --modes {a.modes}` "
        f"({time.strftime('%Y-%m-%d')}, 1-minute load average {load_before} before, {load_after} after).",
        "",
        "RAM namespace, loopback, target pinned to core 1 and `sluice bench` to core 0, both in the same",
        "polling mode. Each row's floor was measured by the same `sluice bench --floor` invocation, just",
        "after the workload: raw TCP ping-pong of NVMe-sized messages (72 B request, 4112 B reply),",
        "the same pipelined at the job's QD, and bulk TCP bandwidth. IOPS per CPU-second counts target",
        "plus host CPU. Absolute numbers vary with this shared VM; the ratios are what to compare.",
        "",
        "| mode | workload | QD | IOPS | MiB/s | p50 µs | p99 µs | vs. wire floor | IOPS per CPU-s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['rw']} {r['bs']} | {r['qd']} | {r['iops']:.0f} | {r['mib_s']:.0f} | "
                     f"{r['p50']:.1f} | {r['p99']:.1f} | {ratio_cells(r)} | {r['iops_per_cpu_s']:.0f} |")
    lines += ["", "Goals of the data path: QD 32 4 KiB reads ≥ 0.80 of pipelined TCP; QD 1 latency ≤ 1.3x the raw",
              "round trip; 128 KiB reads ≥ 0.85 of bulk TCP.", "",
              "## Reading the numbers", "",
              "- **Busy-poll with one core per side loses.** `sluice bench` is a tokio program: the tasks",
              "  that submit I/O and the per-queue thread that owns the socket share the one core the",
              "  bench is pinned to. A queue thread that never sleeps takes that core from the tasks, so",
              "  submissions stall (see the millisecond p99s). The target alone busy-polls fine; busy-poll",
              "  needs a core per polling thread, which this 2-core machine cannot give both sides.",
              "- **QD 1 latency is host-bound.** The raw floor is one thread doing write/read on a socket.",
              "  A Sluice I/O crosses from the application task to the queue thread and back (two thread",
              "  hand-offs on the same core) on the host, and goes through framing, the backend queue",
              "  and the send scheduler on the target. The ~25 µs above the raw round trip is mostly the",
              "  host's hand-offs: the target's share can be seen from the Linux kernel host, which",
              "  has none of them (not measurable here: the kernel peers run under TCG emulation).",
              "- **Large transfers copy.** A 128 KiB read is copied RAM -> buffer -> send buffer on the",
              "  target and socket buffer -> framer -> result on the host; the bulk floor copies once per",
              "  side. Writes additionally wait for an R2T round trip above the 8 KiB in-capsule size.",
              "  Vectored sends straight from the read buffer and receiving into the caller's buffer",
              "  are the next steps.", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
