#!/usr/bin/env python3
"""What idle connections cost a Sluice target in CPU.

    scripts/idle-connections-cpu.py [--sluice target/release/sluice] [--connections 2000]

Starts `sluice target` (2 workers, limits raised so every socket is admitted),
opens the connections from 40 loopback source addresses without sending a
byte, and prints the target's CPU time over 5 s as a share of one core. A
benchmark, not a test.
"""
import argparse, os, resource, socket, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--sluice", default="target/release/sluice")
ap.add_argument("--connections", type=int, default=2000)
ap.add_argument("--port", type=int, default=45123)
a = ap.parse_args()
resource.setrlimit(resource.RLIMIT_NOFILE, (a.connections + 1024, a.connections + 1024))
cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
cfg.write(f"""[target]
listen = "127.0.0.1:{a.port}"
discovery_listen = ""
workers = 2
polling = "adaptive"
connections_max = 100000
connections_per_source_max = 100000
connections_handshaking_max = 100000
connections_handshaking_per_source_max = 100000
handshake_timeout_ms = 60000

[[subsystem]]
nqn = "nqn.2026-11.io.sluice:idle"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
""")
cfg.close()
p = subprocess.Popen([a.sluice, "target", "--config", cfg.name, "--log", "error"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    time.sleep(1.0)
    def cpu_s():
        f = open(f"/proc/{p.pid}/stat").read().split(")")[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    socks = []
    for i in range(a.connections):
        src = (f"127.0.{1 + i // 50}.{2 + i % 50}", 0)
        socks.append(socket.create_connection(("127.0.0.1", a.port), source_address=src))
        if i % 100 == 99:
            time.sleep(0.05)
    time.sleep(0.5)
    c0, t0 = cpu_s(), time.time()
    time.sleep(5)
    c1, t1 = cpu_s(), time.time()
    print(f"{a.connections} idle connections: target CPU {100 * (c1 - c0) / (t1 - t0):.1f} % of a core")
    for s in socks:
        s.close()
finally:
    p.terminate()
    p.wait()
    os.unlink(cfg.name)
