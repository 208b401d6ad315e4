#!/usr/bin/env bash
# Interop with SPDK, both ways, on loopback:
#
#   scripts/interop-spdk.sh SPDK_DIR [--keep-logs DIR]
#
# SPDK_DIR is an SPDK tree built by scripts/build-spdk.sh (it needs
# build/bin/{nvmf_tgt,spdk_nvme_perf,spdk_nvme_identify,spdk_nvme_discover}
# and scripts/rpc.py). SPDK is not in Debian and its sources are not
# reachable from CI, so this is a command, not a CI stage.
#
# SPDK's host against Sluice's target:
#   - spdk_nvme_perf with its default transport ID (no hostnqn: an empty host
#     NQN) against an open subsystem: randread, randwrite, with digests; the
#     run must end with no error other than SPDK's own teardown line for the
#     I/O qpair (which SPDK prints against its own nvmf_tgt too);
#   - spdk_nvme_identify (Identify, log pages, features) and
#     spdk_nvme_discover against Sluice's discovery port;
#   - a subsystem with an allow-list refuses perf without hostnqn and admits
#     it with the listed one.
# Sluice's host against SPDK's nvmf_tgt (malloc bdev):
#   - sluice bench --verify, without and with digests, and with an empty-NQN
#     free (default) host NQN;
#   - reservations between two Sluice hosts (`sluice resv`, `sluice bench`).
# (`check` runs each in an `if`, where `set -e` does not apply: every
# step that can fail says `|| return 1`.)
# Prints "N passed, M failed"; exits 1 if any failed.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
SPDK=$(cd "$1" && pwd)
shift
KEEP=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --keep-logs) KEEP=$2; shift ;;
        *) echo "interop-spdk: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
for b in nvmf_tgt spdk_nvme_perf spdk_nvme_identify spdk_nvme_discover; do
    [[ -x $SPDK/build/bin/$b ]] || { echo "interop-spdk: $SPDK/build/bin/$b missing (run scripts/build-spdk.sh)" >&2; exit 2; }
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${SLUICE_INTEROP_SPDK_PORT:-34620}
DPORT=$((PORT + 1))
SPORT=$((PORT + 2))
OPEN_NQN=nqn.2026-11.io.sluice:spdk-open
LISTED_NQN=nqn.2026-11.io.sluice:spdk-listed
HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5b1ce000-0000-4000-8000-000000005bdc
SPDK_NQN=nqn.2016-06.io.spdk:sluice-interop
WORK=$(mktemp -d /tmp/sluice-interop-spdk.XXXXXX)
LOGDIR=${KEEP:-$WORK/logs}
mkdir -p "$LOGDIR"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [[ -n "$KEEP" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

# Hugepages for SPDK (both programs), as in docs/benchmarks.md.
if [[ $(cat /proc/sys/vm/nr_hugepages) -lt 1024 ]]; then
    echo 1024 > /proc/sys/vm/nr_hugepages
fi
mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages && mount -t hugetlbfs nodev /dev/hugepages; }

echo "interop-spdk: building sluice"
"$ROOT/scripts/install-build-deps.sh"
(cd "$ROOT" && cargo build -q --release --bin sluice)
SLUICE=$ROOT/target/release/sluice

PASSED=0
FAILED=0
check() {
    local name=$1; shift
    local t0=$SECONDS
    if "$@" >"$LOGDIR/$name.out" 2>&1; then
        PASSED=$((PASSED + 1)); echo "interop-spdk: PASS $name ($((SECONDS - t0)) s)"
    else
        FAILED=$((FAILED + 1)); echo "interop-spdk: FAIL $name ($((SECONDS - t0)) s)"
        tail -n 20 "$LOGDIR/$name.out" | sed 's/^/    /'
    fi
}

wait_port() {
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "port $1 never opened" >&2
    return 1
}

# --- SPDK's host against Sluice's target -------------------------------------
cat > "$WORK/target.toml" <<EOF
[target]
listen = "127.0.0.1:$PORT"
discovery_listen = "127.0.0.1:$DPORT"

[[subsystem]]
nqn = "$OPEN_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "256MiB"

[[subsystem]]
nqn = "$LISTED_NQN"
hosts = ["$HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "64MiB"
EOF
SLUICE_LOG=info "$SLUICE" target --config "$WORK/target.toml" > "$LOGDIR/sluice-target.log" 2>&1 &
PIDS+=($!)
wait_port "$PORT"

trid() { echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:$1${2:+ hostnqn:$2}"; }

# perf must print its Total line, exit 0 and report no error but the I/O
# qpair teardown line SPDK prints against nvmf_tgt too.
perf_ok() {
    local out
    out=$(timeout 60 "$SPDK/build/bin/spdk_nvme_perf" "$@" 2>&1) || { echo "$out"; return 1; }
    echo "$out"
    grep -q '^Total' <<<"$out" || return 1
    if grep 'ERROR' <<<"$out" | grep -v 'qid:[1-9][0-9]*,.*CQ transport error -6' | grep -q .; then
        echo "unexpected errors" >&2
        return 1
    fi
}
# perf exits 0 even when it attaches no controller: the refusal shows as
# SPDK's report of the Connect status, 1h/84h (Connect Invalid Host).
perf_refused() {
    local out
    out=$(timeout 60 "$SPDK/build/bin/spdk_nvme_perf" "$@" 2>&1) || true
    echo "$out"
    grep -q 'Connect command completed with error: sct 1, sc 132' <<<"$out" || return 1
    if grep -q '^Total' <<<"$out"; then
        echo "perf ran, but the host is not on the allow-list" >&2
        return 1
    fi
}
PERF_ARGS=(-c 0x2 -q 16 -t 3)
check perf-default-trid-randread perf_ok "${PERF_ARGS[@]}" -o 4096 -w randread -r "$(trid $OPEN_NQN)"
check perf-default-trid-randwrite perf_ok "${PERF_ARGS[@]}" -o 16384 -w randwrite -r "$(trid $OPEN_NQN)"
check perf-digests-rw perf_ok "${PERF_ARGS[@]}" -o 65536 -w randrw -M 50 -H -I -r "$(trid $OPEN_NQN)"
check perf-4-queues perf_ok "${PERF_ARGS[@]}" -o 4096 -w randread -P 4 -r "$(trid $OPEN_NQN)"
check identify timeout 60 "$SPDK/build/bin/spdk_nvme_identify" -r "$(trid $OPEN_NQN)"
# spdk_nvme_discover prints the log, then waits for discovery AERs until
# interrupted; its host NQN is a random one, so only the open subsystem is
# listed. Interrupted, it detaches cleanly (exit 0).
discover_ok() {
    local out rc=0
    out=$(timeout -s INT 5 "$SPDK/build/bin/spdk_nvme_discover" -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$DPORT" 2>&1) || rc=$?
    echo "$out"
    grep -q "Subsystem Qualified Name: *$OPEN_NQN" <<<"$out" || return 1
    if grep -q "$LISTED_NQN" <<<"$out"; then
        echo "the discovery log lists a subsystem this host may not use" >&2
        return 1
    fi
    if grep 'ERROR' <<<"$out" | grep -q .; then
        echo "unexpected errors (exit $rc)" >&2
        return 1
    fi
}
check discover discover_ok
check perf-unlisted-host-refused perf_refused "${PERF_ARGS[@]}" -o 4096 -w randread -t 1 -r "$(trid $LISTED_NQN)"
check perf-listed-host perf_ok "${PERF_ARGS[@]}" -o 4096 -w randread -r "$(trid $LISTED_NQN $HOSTNQN)"
# The refusal is logged with the peer and the (empty) host NQN.
refusal_logged() {
    sed 's/\x1b\[[0-9;]*m//g' "$LOGDIR/sluice-target.log" |
        grep 'Connect refused' | grep "subnqn=\"$LISTED_NQN\"" | grep -q 'hostnqn="(empty)".*field="hostnqn"'
}
check refusal-logged refusal_logged

kill "${PIDS[-1]}" 2>/dev/null || true
wait "${PIDS[-1]}" 2>/dev/null || true
unset 'PIDS[-1]'

# --- Sluice's host against SPDK's nvmf_tgt -----------------------------------
RPC_SOCK=$WORK/spdk.sock
"$SPDK/build/bin/nvmf_tgt" -m 0x1 --disable-cpumask-locks -r "$RPC_SOCK" > "$LOGDIR/nvmf_tgt.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [[ -S $RPC_SOCK ]] && break; sleep 0.1; done
if [[ ! -S $RPC_SOCK ]]; then
    echo "interop-spdk: nvmf_tgt did not start:" >&2
    tail -5 "$LOGDIR/nvmf_tgt.log" >&2
    exit 1
fi
rpc() { PATH=/usr/bin:$PATH "$SPDK/scripts/rpc.py" -s "$RPC_SOCK" "$@" > /dev/null; }
rpc nvmf_create_transport -t TCP
rpc bdev_malloc_create -b Malloc0 128 4096
rpc nvmf_create_subsystem "$SPDK_NQN" -a -s SLUICE0001
rpc nvmf_subsystem_add_ns "$SPDK_NQN" Malloc0
rpc nvmf_subsystem_add_listener "$SPDK_NQN" -t tcp -a 127.0.0.1 -s "$SPORT"
wait_port "$SPORT"
BENCH=("$SLUICE" bench --target "127.0.0.1:$SPORT" --nqn "$SPDK_NQN" --runtime 3 --verify)
check bench-on-nvmf_tgt "${BENCH[@]}" --rw randrw --bs 4k-128k --qd 16
check bench-on-nvmf_tgt-digests "${BENCH[@]}" --rw randrw --bs 4k-64k --qd 8 --hdr-digest --data-digest
check bench-on-nvmf_tgt-large "${BENCH[@]}" --rw write --bs 1m --qd 4

# Reservations between two Sluice hosts on nvmf_tgt's namespace (SPDK's own
# reservation code): A registers and acquires Write Exclusive, B sees it in
# the report, is refused writes and an Acquire, registers, preempts A with
# Preempt and Abort, and clears.
resv_on_nvmf_tgt() {
    local at=(--target "127.0.0.1:$SPORT" --nqn "$SPDK_NQN" --log warn) rep j
    local a=(--hostnqn nqn.2026-11.io.sluice:spdk-resv-a) b=(--hostnqn nqn.2026-11.io.sluice:spdk-resv-b)
    "$SLUICE" resv register "${at[@]}" "${a[@]}" --nrkey 0xa1 || return 1
    "$SLUICE" resv acquire "${at[@]}" "${a[@]}" --rtype write-exclusive --crkey 0xa1 || return 1
    rep=$("$SLUICE" resv report "${at[@]}" "${b[@]}" --json) || return 1
    echo "B sees: $rep"
    [[ $rep == *'"rtype":1,'* && $rep == *'"key":161,"holds":true'* ]] || { echo "A does not hold Write Exclusive"; return 1; }
    j=$("$SLUICE" bench --target "127.0.0.1:$SPORT" --nqn "$SPDK_NQN" "${b[@]}" --rw write --bs 4k --qd 4 --runtime 1 --json --log warn) || return 1
    grep -q '"errors": 0,' <<<"$j" && { echo "B's writes were not refused"; return 1; }
    if "$SLUICE" resv acquire "${at[@]}" "${b[@]}" --rtype write-exclusive --crkey 0xb1; then
        echo "an unregistered host acquired"; return 1
    fi
    "$SLUICE" resv register "${at[@]}" "${b[@]}" --nrkey 0xb1 || return 1
    "$SLUICE" resv acquire "${at[@]}" "${b[@]}" --action preempt-abort --rtype write-exclusive --crkey 0xb1 --prkey 0xa1 || return 1
    rep=$("$SLUICE" resv report "${at[@]}" "${a[@]}" --json) || return 1
    echo "A sees: $rep"
    [[ $rep == *'"registrant_count":1,'* && $rep == *'"key":177,"holds":true'* ]] || { echo "B does not hold it alone"; return 1; }
    "$SLUICE" resv release "${at[@]}" "${b[@]}" --action clear --crkey 0xb1 || return 1
    rep=$("$SLUICE" resv report "${at[@]}" "${a[@]}" --json) || return 1
    [[ $rep == *'"rtype":0,'* && $rep == *'"registrant_count":0,'* ]] || { echo "not cleared: $rep"; return 1; }
}
check reservations-on-nvmf_tgt resv_on_nvmf_tgt

echo "interop-spdk: $PASSED passed, $FAILED failed (logs: $LOGDIR)"
[[ $FAILED -eq 0 ]]
