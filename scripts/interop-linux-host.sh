#!/usr/bin/env bash
# Interop suite: the real Linux kernel NVMe/TCP host (Debian 6.1 and 6.12
# kernels in QEMU) against a Sluice target running on this machine.
#
#   scripts/interop-linux-host.sh [--kernels "6.1 6.12"] [--keep-logs DIR]
#       [--send-scheduler immediate|unified|isolated] [--coalescing off|static|adaptive|calibrated]
#       [--quick]   (one host scenario and the denied host per kernel)
#       [--inline-data BYTES]   (in-capsule data the target takes, e.g. 128k:
#                               the host then sends writes up to that size in
#                               their capsules, received in place past 16 KiB)
#
# Needs scripts/install-linux-peer.sh to have run (scripts/test.sh does it).
# Starts `sluice target` with a config of seven subsystems (RAM 512 B blocks,
# file with O_DIRECT/io_uring and 4 KiB blocks, one whose allow-list
# excludes the guest, one that requires DH-HMAC-CHAP, one whose file
# namespace reloads grow while the guest is connected, and one to which a
# reload adds a namespace and takes it away while the guest is connected,
# and one the guest shares with a host on this machine for reservations;
# a reload also adds an eighth while the guest holds a persistent discovery
# controller), then boots a guest per scenario. Prints one line per
# scenario and a final "N passed, M failed" line; exits non-zero on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KERNELS="6.1 6.12"
KEEP=""
SEND_ARGS=()
QUICK=0
INLINE=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --kernels) KERNELS=$2; shift ;;
        --send-scheduler) SEND_ARGS+=(--send-scheduler "$2"); shift ;;
        --coalescing) SEND_ARGS+=(--coalescing "$2"); shift ;;
        --quick) QUICK=1 ;;
        --inline-data) INLINE=$2; shift ;;
        --keep-logs) KEEP=$2; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "interop: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

PORT=${SLUICE_INTEROP_PORT:-34420}
DPORT=${SLUICE_INTEROP_DISC_PORT:-38009}
GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-000000000001
RAM_NQN=nqn.2026-11.io.sluice:interop-ram
FILE_NQN=nqn.2026-11.io.sluice:interop-file4k
CLOSED_NQN=nqn.2026-11.io.sluice:interop-closed
AUTH_NQN=nqn.2026-11.io.sluice:interop-dhchap
ATTACH_NQN=nqn.2026-11.io.sluice:interop-attach
ATTACH_NS2_BYTES=$((48 << 20))
GROW_NQN=nqn.2026-11.io.sluice:interop-grow
# The grown namespace's size at start; each kernel's scenario raises it by
# 16 MiB through its `size`, then by 16 MiB more underneath.
GROW_BYTES=$((32 << 20))
DISC_ADDED_NQN=nqn.2026-11.io.sluice:interop-added
# Reservations: the guest and a second host on this machine share it.
RESV_NQN=nqn.2026-11.io.sluice:interop-reserve
OTHER_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-0000000000b0
# Admitted by the authenticating subsystem's allow-list but given no secret.
UNKEYED_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-0000000000ff
AUTH_BYTES=$((128 << 20))
RAM_BYTES=$((256 << 20))
FILE_BYTES=$((192 << 20))

WORK=$(mktemp -d /tmp/sluice-interop.XXXXXX)
LOGDIR=${KEEP:-$WORK/logs}
mkdir -p "$LOGDIR"
TARGET_PID=""
cleanup() {
    if [[ -n "$TARGET_PID" ]] && kill -0 "$TARGET_PID" 2>/dev/null; then
        kill -INT "$TARGET_PID" 2>/dev/null || true
        wait "$TARGET_PID" 2>/dev/null || true
    fi
    rm -f "$WORK/ns-file.img" "$WORK/ns-grow.img"
    [[ -n "$KEEP" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

echo "interop: building sluice"
"$ROOT/scripts/install-build-deps.sh"
(cd "$ROOT" && cargo build -q -p sluice-cli)
SLUICE=$ROOT/target/debug/sluice

cat > "$WORK/target.toml" <<TOML
[target]
listen = "127.0.0.1:$PORT"
discovery_listen = "127.0.0.1:$DPORT"
# The guest reaches this machine at 10.0.2.2 through QEMU user networking.
advertise_addr = "10.0.2.2"
advertise_port = $PORT
workers = 2
polling = "adaptive"
io_queues_max = 4
${INLINE:+inline_data_bytes = \"$INLINE\"}

[[subsystem]]
nqn = "$RAM_NQN"
hosts = ["$GUEST_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = $RAM_BYTES
block_size = 512

[[subsystem]]
nqn = "$FILE_NQN"
hosts = ["$GUEST_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "$WORK/ns-file.img"
create = true
size = $FILE_BYTES
block_size = 4096
direct = true
engine = "io-uring"

[[subsystem]]
nqn = "$CLOSED_NQN"
hosts = ["nqn.2014-08.org.nvmexpress:uuid:someone-else"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "16MiB"
TOML

# DH-HMAC-CHAP secrets from `sluice gen-dhchap-key` (the kernel parses
# them: DHHC-1, the transform, base64 of key and CRC-32).
HOST_KEY=$("$SLUICE" gen-dhchap-key --hmac 1)
CTRL_KEY=$("$SLUICE" gen-dhchap-key --hmac 0 --key-length 48)
WRONG_KEY=$("$SLUICE" gen-dhchap-key --hmac 1)
WRONG_CTRL_KEY=$("$SLUICE" gen-dhchap-key --hmac 0 --key-length 48)
cat >> "$WORK/target.toml" <<TOML

# Hosts must authenticate (DH-HMAC-CHAP); the target prefers SHA-384 and
# FFDHE-3072, and proves CTRL_KEY to hosts that ask.
[[subsystem]]
nqn = "$AUTH_NQN"
hosts = ["$GUEST_HOSTNQN", "$UNKEYED_HOSTNQN"]
require_auth = true
[[subsystem.dhchap]]
host = "$GUEST_HOSTNQN"
secret = "$HOST_KEY"
ctrl_secret = "$CTRL_KEY"
hash = "sha384"
dhgroup = "ffdhe3072"
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = $AUTH_BYTES

# Reloads grow its namespace: the line marked grow-size is raised.
[[subsystem]]
nqn = "$GROW_NQN"
hosts = ["$GUEST_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "file"
path = "$WORK/ns-grow.img"
create = true
size = $GROW_BYTES # grow-size
block_size = 4096

# Reservations between the guest and a host on this machine.
[[subsystem]]
nqn = "$RESV_NQN"
hosts = ["$GUEST_HOSTNQN", "$OTHER_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "32MiB"

# Last in the file: a reload appends namespace 2 to it and takes it away.
[[subsystem]]
nqn = "$ATTACH_NQN"
hosts = ["$GUEST_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
backend = "ram"
size = "32MiB"
block_size = 512
TOML
cp "$WORK/target.toml" "$WORK/target.toml.base"

"$SLUICE" target --config "$WORK/target.toml" "${SEND_ARGS[@]}" --log info >"$LOGDIR/target.log" 2>&1 &
TARGET_PID=$!
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done
kill -0 "$TARGET_PID" || { echo "interop: target failed to start"; cat "$LOGDIR/target.log"; exit 1; }

PASSED=0
FAILED=0
FAILED_NAMES=()
run() {
    local name=$1 kernel=$2 script=$3; shift 3
    local t0=$SECONDS
    if "$ROOT/scripts/linux-peer-run.sh" --kernel "$kernel" --script "$ROOT/tests/linux-peer/guest/$script" \
        -e TARGET_PORT=$PORT -e DISC_PORT=$DPORT "$@" --timeout 280 --log "$LOGDIR/$name.log" \
        >"$LOGDIR/$name.out" 2>&1; then
        PASSED=$((PASSED + 1))
        echo "interop: PASS $name ($((SECONDS - t0)) s)"
    else
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("$name")
        echo "interop: FAIL $name ($((SECONDS - t0)) s); guest log tail:"
        tail -n 40 "$LOGDIR/$name.log" | sed 's/^/    /'
    fi
}

for k in $KERNELS; do
    if [[ $QUICK == 1 ]]; then
        run "linux-$k-file4k-digests-2q" "$k" host-basic.sh -e SUBNQN=$FILE_NQN -e EXPECT_NS_BYTES=$FILE_BYTES \
            -e "CONNECT_ARGS=--hdr-digest --data-digest -i 2" -e EXPECT_IO_QUEUES=2 -e FIO_SIZE=16m
        continue
    fi
    run "linux-$k-ram-plain" "$k" host-basic.sh -e SUBNQN=$RAM_NQN -e EXPECT_NS_BYTES=$RAM_BYTES -e FIO_SIZE=32m
    run "linux-$k-file4k-digests-2q" "$k" host-basic.sh -e SUBNQN=$FILE_NQN -e EXPECT_NS_BYTES=$FILE_BYTES \
        -e "CONNECT_ARGS=--hdr-digest --data-digest -i 2" -e EXPECT_IO_QUEUES=2 -e FIO_SIZE=32m
    run "linux-$k-denied" "$k" host-denied.sh -e SUBNQN=$CLOSED_NQN
done
if [[ $QUICK == 0 ]]; then
    # Two controllers with one I/O queue each: round robin deals both I/O
    # queues to the same worker, and the target hands one over after its
    # Connect (docs/target.md, "Workers and queue placement").
    k=${KERNELS##* }
    before=$(grep -c "handed to a less loaded worker" "$LOGDIR/target.log" || true)
    run "linux-$k-two-controllers-spread" "$k" host-basic.sh -e SUBNQN=$RAM_NQN -e EXPECT_NS_BYTES=$RAM_BYTES \
        -e "CONNECT_ARGS=-i 1" -e SECOND_CONTROLLER=1 -e SKIP_DISCOVER=1 -e FIO_SIZE=16m
    after=$(grep -c "handed to a less loaded worker" "$LOGDIR/target.log" || true)
    if [[ $after -gt $before ]]; then
        echo "interop: PASS I/O queue handed over between workers ($((after - before)) hand-overs)"
        PASSED=$((PASSED + 1))
    else
        echo "interop: FAIL no I/O queue was handed over between workers"
        FAILED=$((FAILED + 1))
        FAILED_NAMES+=("two-controllers-hand-over")
    fi
fi
# Namespaces added and removed by a reload (SIGHUP) while the guest is
# connected: the kernel must add and remove the block device on the
# Namespace Attribute Changed event alone. The guest's controller for
# ATTACH_NQN starts the addition; its connection to the discovery service
# (after it used NSID 2) starts the removal.
logged() { sed 's/\x1b\[[0-9;]*m//g' "$LOGDIR/target.log" | grep -F "$1" | grep -c -F "$2" || true; }
attach_reloads() {
    local ctrls=$1 discs=$2 i
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"$ATTACH_NQN\"") -gt $ctrls ]] && break
        sleep 0.5
    done
    sleep 1
    cp "$WORK/target.toml.base" "$WORK/target.toml"
    printf '[[subsystem.namespace]]\nnsid = 2\nbackend = "ram"\nsize = %d\nblock_size = 512\n' \
        "$ATTACH_NS2_BYTES" >>"$WORK/target.toml"
    kill -HUP "$TARGET_PID"
    echo "interop: reload adds NSID 2 to $ATTACH_NQN"
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"") -gt $discs ]] && break
        sleep 0.5
    done
    cp "$WORK/target.toml.base" "$WORK/target.toml"
    kill -HUP "$TARGET_PID"
    echo "interop: reload removes NSID 2 from $ATTACH_NQN"
}
if [[ $QUICK == 0 ]]; then
    for k in $KERNELS; do
        added_before=$(logged "reload: namespace added" "$ATTACH_NQN")
        removed_before=$(logged "reload: namespace removed" "$ATTACH_NQN")
        attach_reloads "$(logged "controller created" "subnqn=\"$ATTACH_NQN\"")" \
            "$(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"")" &
        watcher=$!
        run "linux-$k-namespace-attach-detach" "$k" host-attach.sh -e SUBNQN=$ATTACH_NQN \
            -e EXPECT_NS2_BYTES=$ATTACH_NS2_BYTES
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        cp "$WORK/target.toml.base" "$WORK/target.toml"
        kill -HUP "$TARGET_PID"
        added=$(( $(logged "reload: namespace added" "$ATTACH_NQN") - added_before ))
        removed=$(( $(logged "reload: namespace removed" "$ATTACH_NQN") - removed_before ))
        if [[ $added -eq 1 && $removed -eq 1 ]]; then
            echo "interop: PASS the target logged NSID 2 added and removed once each"
            PASSED=$((PASSED + 1))
        else
            echo "interop: FAIL the target logged NSID 2 added $added and removed $removed times (expected 1 and 1)"
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("linux-$k-namespace-reload-logged")
        fi
    done
fi
# A file namespace grown by reloads while the guest is connected: its
# `size` raised (the target extends the file), then its file grown
# underneath (the target finds it larger). The kernel must take in each new
# capacity on the Namespace Attribute Changed event alone. The guest's
# controller starts the first growth, its connection to the discovery
# service the second.
grow_size() {   # FILE BYTES: sets the grow-size line of a config file
    sed -i "s/^size = [0-9]* # grow-size/size = $2 # grow-size/" "$1"
}
grow_reloads() {
    local ctrls=$1 discs=$2 raised=$3 underneath=$4 i
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"$GROW_NQN\"") -gt $ctrls ]] && break
        sleep 0.5
    done
    sleep 1
    cp "$WORK/target.toml.base" "$WORK/target.toml"
    grow_size "$WORK/target.toml" "$raised"
    kill -HUP "$TARGET_PID"
    echo "interop: reload raises the size of $GROW_NQN's namespace to $raised"
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"") -gt $discs ]] && break
        sleep 0.5
    done
    truncate -s "$underneath" "$WORK/ns-grow.img"
    kill -HUP "$TARGET_PID"
    echo "interop: reload after growing $GROW_NQN's file to $underneath underneath"
}
if [[ $QUICK == 0 ]]; then
    # Namespaces never shrink: each kernel starts where the last left it.
    grow_now=$GROW_BYTES
    for k in $KERNELS; do
        raised=$((grow_now + (16 << 20)))
        underneath=$((grow_now + (32 << 20)))
        grown_before=$(logged "reload: namespace grew" "$GROW_NQN")
        grow_reloads "$(logged "controller created" "subnqn=\"$GROW_NQN\"")" \
            "$(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"")" \
            "$raised" "$underneath" &
        watcher=$!
        run "linux-$k-namespace-grows" "$k" host-grow.sh -e SUBNQN=$GROW_NQN \
            -e "EXPECT_BYTES=$grow_now $raised $underneath"
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        # The raised size stays in the configuration (a smaller one is refused).
        grow_size "$WORK/target.toml.base" "$raised"
        cp "$WORK/target.toml.base" "$WORK/target.toml"
        grow_now=$underneath
        grown=$(( $(logged "reload: namespace grew" "$GROW_NQN") - grown_before ))
        if [[ $grown -eq 2 ]]; then
            echo "interop: PASS the target logged $GROW_NQN's namespace grown twice"
            PASSED=$((PASSED + 1))
        else
            echo "interop: FAIL the target logged $GROW_NQN's namespace grown $grown times (expected 2)"
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("linux-$k-namespace-grew-logged")
        fi
    done
fi
# Reservations with a second host: the guest registers and acquires Write
# Exclusive through nvme-cli and the kernel; once it signals (a discovery
# connect), the host on this machine (`sluice resv`, `sluice bench` as
# OTHER_HOSTNQN) checks that its writes are refused and its reads are not,
# registers and preempts the guest (Preempt and Abort); the guest checks
# its side. Afterwards the other host clears everything and writes again.
bench_counts() {   # ARGS...: "IOS ERRORS" of a 1 s sluice bench
    local j
    j=$("$SLUICE" bench "$@" --bs 4096 --qd 4 --runtime 1 --json --log warn 2>/dev/null) || { echo "0 0"; return; }
    echo "$(grep -m1 -o '"ios": [0-9]*' <<<"$j" | grep -o '[0-9]*$') $(grep -m1 -o '"errors": [0-9]*' <<<"$j" | grep -o '[0-9]*$')"
}
resv_other_host() {   # DISCS VERDICT_FILE
    local discs=$1 verdict=$2 i rep w r
    local at=(--target "127.0.0.1:$PORT" --nqn "$RESV_NQN" --hostnqn "$OTHER_HOSTNQN")
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"") -gt $discs ]] && break
        sleep 0.5
    done
    rep=$("$SLUICE" resv report "${at[@]}" --json --log warn 2>&1) || true
    if [[ $rep != *'"rtype":1,'* || $rep != *'"registrant_count":1,'* || $rep != *'"key":5,"holds":true'* ]]; then
        echo "the other host's report: $rep" >"$verdict"
    fi
    read -r w_ios w_err <<<"$(bench_counts "${at[@]}" --rw write)"
    read -r r_ios r_err <<<"$(bench_counts "${at[@]}" --rw read)"
    if [[ $w_ios -eq 0 || $w_err -ne $w_ios || $r_ios -eq 0 || $r_err -ne 0 ]]; then
        echo "the other host under the guest's Write Exclusive: writes $w_ios with $w_err errors (all expected), reads $r_ios with $r_err errors (none expected)" >>"$verdict"
    fi
    "$SLUICE" resv register "${at[@]}" --nrkey 7 --log warn >>"$verdict.log" 2>&1 ||
        echo "the other host could not register" >>"$verdict"
    "$SLUICE" resv acquire "${at[@]}" --action preempt-abort --rtype write-exclusive --crkey 7 --prkey 5 --log warn >>"$verdict.log" 2>&1 ||
        echo "the other host could not preempt the guest" >>"$verdict"
    echo "interop: the other host checked its access and preempted the guest"
}
if [[ $QUICK == 0 ]]; then
    for k in $KERNELS; do
        verdict="$WORK/resv-$k.verdict"
        : >"$verdict"
        resv_other_host "$(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"")" "$verdict" &
        watcher=$!
        run "linux-$k-reservations" "$k" host-reserve.sh -e SUBNQN=$RESV_NQN
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        at=(--target "127.0.0.1:$PORT" --nqn "$RESV_NQN" --hostnqn "$OTHER_HOSTNQN")
        "$SLUICE" resv release "${at[@]}" --action clear --crkey 7 --log warn >>"$verdict.log" 2>&1 ||
            echo "the other host could not clear the reservations" >>"$verdict"
        read -r w_ios w_err <<<"$(bench_counts "${at[@]}" --rw write)"
        [[ $w_ios -gt 0 && $w_err -eq 0 ]] || echo "after the clear: writes $w_ios with $w_err errors" >>"$verdict"
        if [[ ! -s $verdict ]]; then
            echo "interop: PASS the other host was refused writes, read, preempted the guest and cleared"
            PASSED=$((PASSED + 1))
        else
            echo "interop: FAIL the other host: $(tr '\n' ';' <"$verdict")"
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("linux-$k-reservations-other-host")
        fi
    done
fi
# A subsystem added by a reload while the guest holds a persistent
# discovery controller: the kernel must get the Discovery Log Page Change
# event (uevent NVME_AEN=0x70f002), then find the subsystem in the log and
# use it. The guest's persistent discovery connect starts the addition.
added_reload() {
    local discs=$1 i
    for ((i = 0; i < 600; i++)); do
        [[ $(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"") -gt $discs ]] && break
        sleep 0.5
    done
    sleep 1
    cp "$WORK/target.toml.base" "$WORK/target.toml"
    printf '\n[[subsystem]]\nnqn = "%s"\nhosts = ["%s"]\n[[subsystem.namespace]]\nnsid = 1\nbackend = "ram"\nsize = "16MiB"\n' \
        "$DISC_ADDED_NQN" "$GUEST_HOSTNQN" >>"$WORK/target.toml"
    kill -HUP "$TARGET_PID"
    echo "interop: reload adds subsystem $DISC_ADDED_NQN"
}
if [[ $QUICK == 0 ]]; then
    for k in $KERNELS; do
        sent_before=$(logged "asynchronous event sent: discovery log page changed" "")
        added_reload "$(logged "controller created" "subnqn=\"nqn.2014-08.org.nvmexpress.discovery\"")" &
        watcher=$!
        run "linux-$k-discovery-change-event" "$k" host-discovery-aen.sh -e ADDED_NQN=$DISC_ADDED_NQN
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        cp "$WORK/target.toml.base" "$WORK/target.toml"
        kill -HUP "$TARGET_PID"
        sent=$(( $(logged "asynchronous event sent: discovery log page changed" "") - sent_before ))
        if [[ $sent -ge 1 ]]; then
            echo "interop: PASS the target logged $sent Discovery Log Page Change event(s) sent"
            PASSED=$((PASSED + 1))
        else
            echo "interop: FAIL the target logged no Discovery Log Page Change event sent"
            FAILED=$((FAILED + 1)); FAILED_NAMES+=("linux-$k-discovery-change-logged")
        fi
    done
fi
# DH-HMAC-CHAP (Linux 6.12 has NVME_HOST_AUTH; 6.1 does not): one-way,
# bidirectional, and a wrong secret refused and logged with the peer.
if [[ " $KERNELS " == *" 6.12 "* ]]; then
    # With a re-authentication the host starts on the live connection: the
    # target must authenticate every queue (admin + 2 I/O) three times:
    # at connect, at re-authentication, and at the reconnect the script ends with.
    auths_logged() { sed 's/\x1b\[[0-9;]*m//g' "$LOGDIR/target.log" | grep -c "host authenticated (DH-HMAC-CHAP)" || true; }
    before=$(auths_logged)
    run "linux-6.12-dhchap" 6.12 host-basic.sh -e SUBNQN=$AUTH_NQN -e EXPECT_NS_BYTES=$AUTH_BYTES \
        -e "CONNECT_ARGS=--dhchap-secret=$HOST_KEY -i 2" -e EXPECT_IO_QUEUES=2 -e FIO_SIZE=16m -e SKIP_DISCOVER=1 \
        -e REAUTH=1
    after=$(auths_logged)
    if [[ $((after - before)) -ge 9 ]]; then
        echo "interop: PASS Linux re-authenticated every queue on the live connection ($((after - before)) authentications)"
        PASSED=$((PASSED + 1))
    else
        echo "interop: FAIL $((after - before)) authentications logged, expected at least 9 (3 queues x connect, re-auth, reconnect)"
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("dhchap-reauth")
    fi
    if [[ $QUICK == 0 ]]; then
        run "linux-6.12-dhchap-bidirectional" 6.12 host-basic.sh -e SUBNQN=$AUTH_NQN -e EXPECT_NS_BYTES=$AUTH_BYTES \
            -e "CONNECT_ARGS=--dhchap-secret=$HOST_KEY --dhchap-ctrl-secret=$CTRL_KEY -i 1" -e FIO_SIZE=16m -e SKIP_DISCOVER=1
    fi
fi
if [[ " $KERNELS " == *" 6.12 "* && $QUICK == 0 ]]; then
    failures_logged() { sed 's/\x1b\[[0-9;]*m//g' "$LOGDIR/target.log" | grep "DH-HMAC-CHAP authentication failed" | grep -c 'peer="127' || true; }
    before=$(failures_logged)
    run "linux-6.12-dhchap-wrong-secret" 6.12 host-denied.sh -e SUBNQN=$AUTH_NQN -e EXPECT_DENIED_DMESG=0 \
        -e DENIED_HOSTNQN=$GUEST_HOSTNQN -e "CONNECT_ARGS=--dhchap-secret=$WRONG_KEY"
    after=$(failures_logged)
    if [[ $after -gt $before ]]; then
        echo "interop: PASS the wrong secret was logged with the peer address"
        PASSED=$((PASSED + 1))
    else
        echo "interop: FAIL no 'DH-HMAC-CHAP authentication failed' line with the peer in the target log"
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("dhchap-failure-logged")
    fi
    # The host expects a controller secret the target does not have: the
    # host itself must refuse the target (so the bidirectional pass above
    # means Linux checked the target's response).
    run "linux-6.12-dhchap-wrong-ctrl-secret" 6.12 host-denied.sh -e SUBNQN=$AUTH_NQN -e EXPECT_DENIED_DMESG=0 \
        -e DENIED_HOSTNQN=$GUEST_HOSTNQN -e "CONNECT_ARGS=--dhchap-secret=$HOST_KEY --dhchap-ctrl-secret=$WRONG_CTRL_KEY"
    # A listed host with no secret: refused at Connect (require_auth).
    run "linux-6.12-dhchap-no-secret" 6.12 host-denied.sh -e SUBNQN=$AUTH_NQN -e EXPECT_DENIED_DMESG=1 \
        -e DENIED_HOSTNQN=$UNKEYED_HOSTNQN
    # The base64 of each key (a log could quote it without the prefix).
    if grep -qF -e "${HOST_KEY:10:24}" -e "${CTRL_KEY:10:24}" -e "${WRONG_KEY:10:24}" -e "${WRONG_CTRL_KEY:10:24}" "$LOGDIR/target.log"; then
        echo "interop: FAIL a secret appears in the target log"
        FAILED=$((FAILED + 1)); FAILED_NAMES+=("dhchap-secret-logged")
    fi
fi
# SQ flow control disabled: the target answers reads with C2HData + SUCCESS.
last=${KERNELS##* }
[[ $QUICK == 1 ]] || run "linux-$last-ram-sqflow-off" "$last" host-basic.sh -e SUBNQN=$RAM_NQN -e "CONNECT_ARGS=--disable-sqflow" -e FIO_SIZE=16m

kill -INT "$TARGET_PID"
if ! wait "$TARGET_PID"; then
    echo "interop: FAIL target exited with an error"; FAILED=$((FAILED + 1)); FAILED_NAMES+=("target-exit")
fi
TARGET_PID=""
if grep -qE "panicked|ERROR" "$LOGDIR/target.log"; then
    echo "interop: FAIL target log has errors:"; grep -E "panicked|ERROR" "$LOGDIR/target.log" | head -20
    FAILED=$((FAILED + 1)); FAILED_NAMES+=("target-log")
fi
grep -E "target stopped|worker [0-9]" "$LOGDIR/target.log" | sed 's/^/interop: /' || true
[[ $FAILED -eq 0 ]] || echo "interop: failed: ${FAILED_NAMES[*]}; logs in $LOGDIR"
echo "interop: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
