#!/usr/bin/env bash
# Interop suite: the Sluice host library and `sluice bench` against the real
# Linux kernel NVMe/TCP target (nvmet-tcp, null_blk namespace) in QEMU.
#
#   scripts/interop-linux-target.sh [--kernels "6.1 6.12"] [--keep-logs DIR]
#
# Per kernel: boot the guest as a target (reached through hostfwd), run the
# host interop checks (crates/sluice-host/examples/interop.rs) without and
# with digests, run `sluice bench --verify` with two tenants, then stop the
# guest. On the last kernel, also kill the target mid-run and check that the
# bench reports the failure instead of hanging. Prints "N passed, M failed".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KERNELS="6.1 6.12"
KEEP=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --kernels) KERNELS=$2; shift ;;
        --keep-logs) KEEP=$2; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "interop-target: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

HPORT=${SLUICE_INTEROP_TARGET_PORT:-34520}
CPORT=${SLUICE_INTEROP_CTRL_PORT:-34599}
SUBNQN=nqn.2014-08.org.sluice:kernel-target
WORK=$(mktemp -d /tmp/sluice-interop-target.XXXXXX)
LOGDIR=${KEEP:-$WORK/logs}
mkdir -p "$LOGDIR"
QPID=""
GUEST_LOG=""
# Kills this run's QEMU itself (the wrapper script's trap may not run on SIGKILL).
stop_qemu() {
    pkill -9 -f "hostfwd=tcp:127.0.0.1:$HPORT-" 2>/dev/null || true
    if [[ -n "$QPID" ]]; then wait "$QPID" 2>/dev/null || true; fi
    QPID=""
}

cleanup() {
    stop_qemu
    [[ -n "$KEEP" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

echo "interop-target: building"
"$ROOT/scripts/install-build-deps.sh"
(cd "$ROOT" && cargo build -q -p sluice-cli && cargo build -q -p sluice-host --example interop)
SLUICE=$ROOT/target/debug/sluice
INTEROP=$ROOT/target/debug/examples/interop

PASSED=0
FAILED=0
check() {
    local name=$1; shift
    local t0=$SECONDS
    if "$@" >"$LOGDIR/$name.out" 2>&1; then
        PASSED=$((PASSED + 1)); echo "interop-target: PASS $name ($((SECONDS - t0)) s)"
    else
        FAILED=$((FAILED + 1)); echo "interop-target: FAIL $name ($((SECONDS - t0)) s)"; tail -n 30 "$LOGDIR/$name.out" | sed 's/^/    /'
        # A guest that went away mid-scenario (seen twice: nvmet closed the
        # connections, then the port refused them) is explained only by its
        # console, which the work directory's removal would take with it.
        if [[ -n "$QPID" && -n "$GUEST_LOG" ]] && ! kill -0 "$QPID" 2>/dev/null; then
            echo "    (the guest has exited; the end of its console, $GUEST_LOG:)"
            tail -n 60 "$GUEST_LOG" | sed 's/^/    | /'
        fi
    fi
}

boot_target() {
    local k=$1 log=$2; shift 2
    GUEST_LOG=$log
    "$ROOT/scripts/linux-peer-run.sh" --kernel "$k" --script "$ROOT/tests/linux-peer/guest/target-nvmet.sh" \
        -e SUBNQN=$SUBNQN -e NS_MB=512 -e TARGET_UP_SECONDS=400 -e EXPECT_HOST_CONNECT=1 "$@" \
        --hostfwd "tcp:127.0.0.1:$HPORT-:4420" --hostfwd "tcp:127.0.0.1:$CPORT-:4499" \
        --timeout 460 --log "$log" >"$log.run" 2>&1 &
    QPID=$!
    for _ in $(seq 240); do
        grep -q "SLUICE-PEER-READY" "$log" 2>/dev/null && return 0
        kill -0 "$QPID" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

stop_target() {
    # A connection to a forwarded port succeeds even before the guest listens:
    # repeat the stop until the guest exits (bounded).
    for _ in $(seq 60); do
        kill -0 "$QPID" 2>/dev/null || break
        printf 'stop\n' > "/dev/tcp/127.0.0.1/$CPORT" 2>/dev/null || true
        sleep 1
    done
    local rc=0
    wait "$QPID" || rc=$?
    QPID=""
    return $rc
}

bench_verify() {
    "$SLUICE" bench --target "127.0.0.1:$HPORT" --nqn $SUBNQN --rw randrw --bs 4k-64k --qd 4 --runtime 6 --verify \
        --span 64m --job "tenant-a,hostnqn=nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-0000000000aa,rw=randrw,bs=4k-64k,qd=4" --job "tenant-b,hostnqn=nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-0000000000bb,rw=randread,bs=4k,qd=2" \
        --json > "$LOGDIR/bench.json"
    python3 - "$LOGDIR/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
jobs = r.get("jobs", [])
assert len(jobs) == 2, f"expected 2 jobs, got {len(jobs)}"
for j in jobs:
    assert j.get("errors", 1) == 0 and j.get("verify_errors", 1) == 0, f"job {j.get('name')} had errors: {j}"
    assert j.get("ios", 0) > 0, f"job {j.get('name')} did no I/O: {j}"
print("bench ok:", [(j.get("name"), j.get("ios")) for j in jobs])
PY
}

last=${KERNELS##* }
for k in $KERNELS; do
    if ! boot_target "$k" "$LOGDIR/guest-$k.log"; then
        FAILED=$((FAILED + 1)); echo "interop-target: FAIL linux-$k target did not come up"; tail -n 40 "$LOGDIR/guest-$k.log" | sed 's/^/    /'
        stop_qemu
        continue
    fi
    check "linux-$k-host-plain" "$INTEROP" "127.0.0.1:$HPORT" $SUBNQN
    check "linux-$k-host-digests" "$INTEROP" "127.0.0.1:$HPORT" $SUBNQN --digests
    check "linux-$k-bench-verify-2-tenants" bench_verify
    check "linux-$k-target-clean-exit" stop_target
done

# DH-HMAC-CHAP against nvmet (Linux 6.12 has NVME_TARGET_AUTH; 6.1 does
# not): the host must authenticate with the secret nvmet holds, the target
# proves its own, and a wrong secret is refused.
AUTH_HOST=nqn.2014-08.org.nvmexpress:uuid:5a1c0000-0000-4000-8000-0000000000ac
dhchap_against_nvmet() {
    local key ctrl wrong
    key=$("$SLUICE" gen-dhchap-key --hmac 3)
    ctrl=$("$SLUICE" gen-dhchap-key --hmac 0 --key-length 32)
    wrong=$("$SLUICE" gen-dhchap-key --hmac 3)
    boot_target 6.12 "$LOGDIR/guest-dhchap.log" -e ALLOWED_HOSTNQN=$AUTH_HOST -e "DHCHAP_KEY=$key" \
        -e "DHCHAP_CTRL_KEY=$ctrl" -e "DHCHAP_HASH=hmac(sha512)" -e DHCHAP_DHGROUP=ffdhe2048 || { stop_qemu; return 1; }
    local rc=0
    "$SLUICE" bench --target "127.0.0.1:$HPORT" --nqn $SUBNQN --hostnqn $AUTH_HOST --dhchap-secret "$key" \
        --dhchap-ctrl-secret "$ctrl" --rw randrw --bs 4k-64k --qd 4 --queues 2 --ios 400 --verify --span 64m \
        --json > "$LOGDIR/dhchap-bench.json" 2> "$LOGDIR/dhchap-bench.err" || rc=$?
    if [[ $rc -ne 0 ]] || ! python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["total"]; assert t["ios"]==400 and t["errors"]==0 and t["verify_errors"]==0 and t["engine"]=="direct", t' "$LOGDIR/dhchap-bench.json"; then
        echo "bench with the right secrets failed (rc $rc):"; tail -5 "$LOGDIR/dhchap-bench.err"; stop_target || true; return 1
    fi
    echo "bench with the right secrets: 400 verified I/Os on authenticated direct queues"
    if "$SLUICE" bench --target "127.0.0.1:$HPORT" --nqn $SUBNQN --hostnqn $AUTH_HOST --dhchap-secret "$wrong" \
        --rw randread --ios 10 --json > /dev/null 2> "$LOGDIR/dhchap-wrong.err"; then
        echo "a wrong secret was accepted"; stop_target || true; return 1
    fi
    grep -q "authentication" "$LOGDIR/dhchap-wrong.err" || { echo "no authentication error:"; cat "$LOGDIR/dhchap-wrong.err"; stop_target || true; return 1; }
    echo "wrong secret refused: $(grep -o 'authentication.*' "$LOGDIR/dhchap-wrong.err" | head -1)"
    stop_target
}
if [[ " $KERNELS " == *" 6.12 "* ]]; then
    check "linux-6.12-dhchap-sluice-host-to-nvmet" dhchap_against_nvmet
fi

# The target disappears mid-run: the bench must report the errors and finish
# by itself (its host library retries the connection with back-off first).
killed_mid_run() {
    boot_target "$last" "$LOGDIR/guest-kill.log" || return 1
    "$SLUICE" bench --target "127.0.0.1:$HPORT" --nqn $SUBNQN --rw randread --qd 4 --runtime 20 --timeout-ms 5000 \
        --json > "$LOGDIR/kill-bench.json" 2> "$LOGDIR/kill-bench.err" &
    local bpid=$!
    sleep 8
    stop_qemu
    local t0=$SECONDS rc=0
    # The bench was asked for 20 s: it must end within its runtime plus the command timeout and slack.
    for _ in $(seq 120); do kill -0 $bpid 2>/dev/null || break; sleep 0.5; done
    if kill -0 $bpid 2>/dev/null; then kill $bpid; echo "bench still running $((SECONDS - t0)) s after the target died"; return 1; fi
    wait $bpid || rc=$?
    echo "bench exited with $rc $((SECONDS - t0)) s after the target died"; cat "$LOGDIR/kill-bench.err" | tail -5
    [[ $rc -ne 0 ]] || grep -q '"errors": *[1-9]' "$LOGDIR/kill-bench.json"
}
check "linux-$last-target-killed-mid-run" killed_mid_run

echo "interop-target: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
