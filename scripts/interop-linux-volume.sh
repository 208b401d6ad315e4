#!/usr/bin/env bash
# Interop: the real Linux kernel host (Debian 6.12 in QEMU) uses an elastic,
# replicated volume through a Sluice target, unmodified (`nvme connect`, dd,
# fio verify). The volume's extents live on two other Sluice targets (the
# drives), managed by `sluice control` on redb:
#
#   guest ──NVMe/TCP──▶ front target (backend = "volume") ──▶ drive target A
#                                         │                  └▶ drive target B
#                                   sluice control (extent faults only)
#
#   scripts/interop-linux-volume.sh [--kernel 6.12] [--keep-logs DIR]
#
# Needs scripts/install-linux-peer.sh to have run (scripts/test.sh does it).
# Once the guest's first writes have allocated extents, the volume is grown
# online (`sluice volume resize`); the guest must see the new size (the
# target sends a Namespace Attribute Changed event) and write past the old
# end. Afterwards it checks that every extent has one replica on each drive
# target and that the target logs have no error.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KERNEL=6.12
KEEP=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --kernel) KERNEL=$2; shift ;;
        --keep-logs) KEEP=$2; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "interop-volume: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

PORT=${SLUICE_INTEROP_VOLUME_PORT:-34520}
DRIVE_PORTS=(34521 34522)
CONTROL=127.0.0.1:34529
GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-000000000001
VOL_NQN=nqn.2026-11.io.sluice:interop-volume
DRIVE_NQN=nqn.2026-11.io.sluice:ram0
VOL_BYTES=$((160 << 20))
GROWN_BYTES=$((192 << 20))

WORK=$(mktemp -d /tmp/sluice-interop-volume.XXXXXX)
LOGDIR=${KEEP:-$WORK/logs}
mkdir -p "$LOGDIR"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [[ -n "$KEEP" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "interop-volume: nothing listens on $1"; return 1
}

echo "interop-volume: building sluice"
"$ROOT/scripts/install-build-deps.sh"
(cd "$ROOT" && cargo build -q -p sluice-cli)
SLUICE=$ROOT/target/debug/sluice

for i in 0 1; do
    "$SLUICE" target --listen "127.0.0.1:${DRIVE_PORTS[$i]}" --discovery-listen "" --ram-size 256MiB \
        --log info >"$LOGDIR/drive$i.log" 2>&1 &
    PIDS+=($!)
done
"$SLUICE" control --listen "$CONTROL" --metadata "redb:$WORK/meta.redb" --log info >"$LOGDIR/control.log" 2>&1 &
PIDS+=($!)
for p in "${DRIVE_PORTS[@]}" "${CONTROL##*:}"; do wait_port "$p"; done
for p in "${DRIVE_PORTS[@]}"; do
    "$SLUICE" drive add "127.0.0.1:$p" "$DRIVE_NQN" --control "$CONTROL"
done
"$SLUICE" volume create vol --size "$VOL_BYTES" --replicas 2 --control "$CONTROL"

cat > "$WORK/front.toml" <<TOML
[target]
listen = "127.0.0.1:$PORT"
discovery_listen = ""
advertise_addr = "10.0.2.2"
advertise_port = $PORT
workers = 2
polling = "adaptive"

[[subsystem]]
nqn = "$VOL_NQN"
hosts = ["$GUEST_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "volume"
volume = "vol"
control = "$CONTROL"
TOML
"$SLUICE" target --config "$WORK/front.toml" --log info >"$LOGDIR/front.log" 2>&1 &
PIDS+=($!)
wait_port "$PORT" || { cat "$LOGDIR/front.log"; exit 1; }

PASSED=0
FAILED=0
t0=$SECONDS
name="linux-$KERNEL-volume-2-replicas"
"$ROOT/scripts/linux-peer-run.sh" --kernel "$KERNEL" --script "$ROOT/tests/linux-peer/guest/host-basic.sh" \
    -e TARGET_PORT=$PORT -e SKIP_DISCOVER=1 -e SUBNQN=$VOL_NQN -e EXPECT_NS_BYTES=$VOL_BYTES -e FIO_SIZE=32m \
    -e EXPECT_GROW_BYTES=$GROWN_BYTES \
    --timeout 280 --log "$LOGDIR/$name.log" >"$LOGDIR/$name.out" 2>&1 &
GUEST=$!
# Grow the volume online once the guest has written (its first dd
# allocates extents), while it is connected.
resized=0
while kill -0 "$GUEST" 2>/dev/null; do
    if "$SLUICE" volume list --control "$CONTROL" 2>/dev/null | grep -Eq '^vol .* [1-9][0-9]* of [0-9]+ extents allocated'; then
        "$SLUICE" volume resize vol --size "$GROWN_BYTES" --control "$CONTROL" && resized=1
        echo "interop-volume: grew vol to $GROWN_BYTES bytes online ($((SECONDS - t0)) s)"
        break
    fi
    sleep 1
done
[[ $resized -eq 1 ]] || echo "interop-volume: the guest ended before any extent was allocated; vol not resized"
if wait "$GUEST"; then
    PASSED=$((PASSED + 1)); echo "interop-volume: PASS $name ($((SECONDS - t0)) s)"
else
    FAILED=$((FAILED + 1)); echo "interop-volume: FAIL $name ($((SECONDS - t0)) s); guest log tail:"
    tail -n 40 "$LOGDIR/$name.log" | sed 's/^/    /'
fi

# Where the guest's writes went: every extent on both drive targets.
"$SLUICE" volume inspect vol --extents --control "$CONTROL" >"$LOGDIR/inspect.txt"
extents=$(grep -c '^  extent' "$LOGDIR/inspect.txt" || true)
both=$(grep '^  extent' "$LOGDIR/inspect.txt" | grep -c ' -> ' || true)
used=$("$SLUICE" drive list --control "$CONTROL" | grep -c ' [1-9][0-9]*/[0-9]* extents used' || true)
if [[ $extents -gt 0 && $both -eq $extents && $used -eq 2 ]]; then
    PASSED=$((PASSED + 1))
    echo "interop-volume: PASS $extents extents allocated by the guest's writes, each replicated on both drive targets"
else
    FAILED=$((FAILED + 1))
    echo "interop-volume: FAIL extents $extents, replicated $both, drives used $used"; cat "$LOGDIR/inspect.txt"
fi
if grep -qE "panicked|ERROR" "$LOGDIR"/front.log "$LOGDIR"/drive*.log "$LOGDIR"/control.log; then
    echo "interop-volume: FAIL logs have errors:"; grep -E "panicked|ERROR" "$LOGDIR"/*.log | head -20
    FAILED=$((FAILED + 1))
fi
echo "interop-volume: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
