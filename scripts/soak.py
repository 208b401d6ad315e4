#!/usr/bin/env python3
"""Soak: three verified workloads on one target for a long time.

    scripts/soak.py [--sluice target/release/sluice] [--seconds 600]
                    [--hogs] [--dir DIR] [--port 24731]

Starts `sluice target` (2 workers, adaptive polling, the admin endpoint on
PORT+1) with three namespaces: RAM with 4 KiB blocks, a file in DIR
(io_uring, O_DIRECT, the file's own block size) and RAM with 512-byte
blocks. Runs one `sluice bench --verify` against each at once:

  ram4k  randrw 4-128 KiB, QD 16, 2 queues
  file   randrw 4-64 KiB, QD 8, header and data digests, the async engine
  ram512 randrw 512 B (50 %), 4 KiB (30 %), 32 KiB (20 %), QD 32, busy-poll

With --hogs, one CPU-bound loop pinned to each core runs alongside (a
noisy neighbour). Prints each job's IOPS, errors, verify errors and
latency percentiles up to the maximum, then the target's
`sluice_namespace_slow_ios_total` per namespace (backend I/Os of
`target.slow_io_ms`, 1 s, or longer; docs/target.md, *Slow backend I/O*).

Exit status 1 when a job failed, saw an I/O error or a verify error (data
read back is not what was written); slow I/Os are reported, not failures.
A long experiment, not a test (docs/target.md, *File namespaces*, has what
the first soak found).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--sluice", default="target/release/sluice")
ap.add_argument("--seconds", type=int, default=600)
ap.add_argument("--hogs", action="store_true")
ap.add_argument("--dir", default=None, help="where the file namespace lives (default: a new temporary directory)")
ap.add_argument("--port", type=int, default=24731)
a = ap.parse_args()
if not os.access(a.sluice, os.X_OK):
    sys.exit(f"soak: {a.sluice} is not an executable; build it first (cargo build --release -p sluice-cli)")
if a.seconds < 1:
    sys.exit("soak: --seconds must be at least 1")

work = a.dir or tempfile.mkdtemp(prefix="sluice-soak-")
os.makedirs(work, exist_ok=True)
nqn = "nqn.2026-12.io.sluice:soak"
admin = f"127.0.0.1:{a.port + 1}"
cfg_path = os.path.join(work, "soak.toml")
with open(cfg_path, "w") as f:
    f.write(f"""[target]
listen = "127.0.0.1:{a.port}"
discovery_listen = ""
workers = 2
polling = "adaptive"

[tenants]
admin_listen = "{admin}"

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"
block_size = 4096
[[subsystem.namespace]]
nsid = 2
backend = "file"
path = "{os.path.join(work, 'file.img')}"
create = true
engine = "io-uring"
size = "256MiB"
[[subsystem.namespace]]
nsid = 3
backend = "ram"
size = "128MiB"
block_size = 512
""")

JOBS = [
    ("ram4k", 1, ["--bs", "4k-128k", "--qd", "16", "--queues", "2"]),
    ("file", 2, ["--bs", "4k-64k", "--qd", "8", "--hdr-digest", "--data-digest", "--engine", "async"]),
    ("ram512", 3, ["--bs", "512:50,4k:30,32k:20", "--qd", "32", "--polling", "busy-poll"]),
]

log = open(os.path.join(work, "target.log"), "w")
target = subprocess.Popen([a.sluice, "target", "--config", cfg_path], stdout=log, stderr=subprocess.STDOUT)
hogs = []
jobs = []
failed = False
try:
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://{admin}/metrics", timeout=1).read()
            break
        except OSError:
            if target.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"soak: the target did not start; see {log.name}")
            time.sleep(0.1)
    if a.hogs:
        for cpu in sorted(os.sched_getaffinity(0)):
            hogs.append(subprocess.Popen([
                sys.executable, "-c",
                f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]))
    for i, (name, nsid, args) in enumerate(JOBS):
        cmd = [a.sluice, "bench", "--target", f"127.0.0.1:{a.port}", "--nqn", nqn,
               "--nsid", str(nsid), "--rw", "randrw", "--verify", "--json",
               "--runtime", str(a.seconds),
               "--hostnqn", f"nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-00000000000{i}"] + args
        out = open(os.path.join(work, f"{name}.json"), "w")
        err = open(os.path.join(work, f"{name}.err"), "w")
        jobs.append((name, subprocess.Popen(cmd, stdout=out, stderr=err), out.name, err.name))
    print(f"soak: {len(jobs)} jobs for {a.seconds} s{' with a CPU hog on every core' if a.hogs else ''}; files in {work}")
    for name, p, out, err in jobs:
        p.wait()
    print(f"{'job':8} {'IOPS':>9} {'errors':>7} {'verify':>7} {'p99 us':>9} {'p99.9 us':>9} {'p99.99 us':>10} {'max us':>10}")
    for name, p, out, err in jobs:
        text = open(out).read()
        try:
            r = json.loads(text[text.index("{"):])["total"]
        except (ValueError, KeyError) as e:
            print(f"{name:8} failed (exit {p.returncode}, {e}); see {err}")
            failed = True
            continue
        if p.returncode != 0 or r["errors"] or r["verify_errors"]:
            failed = True
        print(f"{name:8} {int(r['iops']):>9} {r['errors']:>7} {r['verify_errors']:>7} "
              f"{int(r['latency_us_p99']):>9} {int(r['latency_us_p999']):>9} "
              f"{int(r['latency_us_p9999']):>10} {int(r['latency_us_max']):>10}")
    metrics = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    for line in metrics.splitlines():
        if line.startswith("sluice_namespace_slow_ios_total{"):
            print(line)
finally:
    for h in hogs:
        h.kill()
    for _, p, _, _ in jobs:
        if p.poll() is None:
            p.kill()
    target.terminate()
    try:
        target.wait(timeout=10)
    except subprocess.TimeoutExpired:
        target.kill()
sys.exit(1 if failed else 0)
