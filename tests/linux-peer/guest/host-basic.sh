#!/bin/sh
# Guest as NVMe/TCP host against a target (Sluice on this machine by default, at 10.0.2.2).
#
# Env:
#   SUBNQN            subsystem NQN to connect to (required)
#   TARGET_ADDR       target address (default 10.0.2.2 = the machine running QEMU)
#   TARGET_PORT       I/O controller port (default 4420)
#   DISC_PORT         discovery port (default TARGET_PORT; may equal it)
#   CONNECT_ARGS      extra `nvme connect` args, e.g. "--hdr-digest --data-digest -i 2"
#   EXPECT_NS_BYTES   if set, the namespace size in bytes must equal this
#   EXPECT_IO_QUEUES  if set, the namespace must have at least this many blk-mq hw queues
#   SKIP_DISCOVER=1   skip the discovery step (target without a discovery service)
#   FIO_SIZE          fio region size (default 64m); FIO=0 skips fio
#   FIO_OFFSET        fio region offset (default 16m; the dd patterns live outside it)
#   EXPECT_GROW_BYTES if set, the machine running QEMU grows the namespace online
#                     (`sluice volume resize`) once this guest's first writes
#                     arrived; after fio the namespace must reach this size
#                     (through a Namespace Attribute Changed event) and take data
#                     past its old end
#   REAUTH=1          after the first read-back, write the controller's own
#                     DH-HMAC-CHAP secret back to sysfs: the kernel re-authenticates
#                     every queue on the live connection; data must still read back
#   SECOND_CONTROLLER=1  after connecting, connect a second controller to the same
#                     subsystem through DISC_PORT (a second path) and spread I/O over
#                     both paths (multipath iopolicy round-robin)
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DISC_PORT=${DISC_PORT:-$TARGET_PORT}
CONNECT_ARGS=${CONNECT_ARGS:-}
FIO_SIZE=${FIO_SIZE:-64m}
FIO_OFFSET=${FIO_OFFSET:-16m}
FIO=${FIO:-1}
T0=$(now_s)

wait_connected() {
    i=0
    while [ $i -lt 100 ]; do                        # up to 20 s
        NS=$(ns_for_nqn "$SUBNQN" || true)
        [ -n "$NS" ] && break
        sleep 0.2; i=$((i + 1))
    done
    [ -n "$NS" ] || fail "no namespace block device for $SUBNQN after 20 s"
    CTRL=$(ctrls_for_nqn "$SUBNQN" | head -n1)
    [ -n "$CTRL" ] || fail "no tcp controller for $SUBNQN"
    NSDEV=/dev/$NS
    info "controller /dev/$CTRL ($(cat /sys/class/nvme/$CTRL/address)), namespace $NSDEV"
}

do_connect() {
    # shellcheck disable=SC2086
    run nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$SUBNQN" $CONNECT_ARGS
    wait_connected
}

do_disconnect() {
    run nvme disconnect -n "$SUBNQN"
    i=0
    while [ $i -lt 50 ]; do
        [ -z "$(ctrls_for_nqn "$SUBNQN")" ] && [ ! -b "$NSDEV" ] && return 0
        sleep 0.2; i=$((i + 1))
    done
    fail "controller/namespace for $SUBNQN still present 10 s after disconnect"
}

step modprobe
run modprobe nvme-tcp
info "hostnqn $(cat /etc/nvme/hostnqn), target $TARGET_ADDR:$TARGET_PORT, discovery port $DISC_PORT"
[ -z "$(ctrls_for_nqn "$SUBNQN")" ] || fail "a controller for $SUBNQN already exists before connect"

if [ "${SKIP_DISCOVER:-0}" != 1 ]; then
    step discover
    out=$(nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" 2>&1) ||
        { echo "$out"; fail "nvme discover failed"; }
    echo "$out"
    echo "$out" | grep -Eq "subnqn: +$SUBNQN\$" || fail "discovery log does not list $SUBNQN"
fi

step connect
do_connect

if [ "${SECOND_CONTROLLER:-0}" = 1 ]; then
    step second-controller
    # shellcheck disable=SC2086
    # A second path: the same subsystem through the target's other port
    # (nvme-cli refuses a second controller with identical parameters).
    run nvme connect -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" -n "$SUBNQN" $CONNECT_ARGS
    i=0
    while [ "$(ctrls_for_nqn "$SUBNQN" | wc -l)" -lt 2 ] && [ $i -lt 50 ]; do
        sleep 0.2; i=$((i + 1))
    done
    [ "$(ctrls_for_nqn "$SUBNQN" | wc -l)" -ge 2 ] || fail "no second controller for $SUBNQN"
    for p in /sys/class/nvme-subsystem/nvme-subsys*/iopolicy; do
        [ -e "$p" ] && echo round-robin >"$p" 2>/dev/null && info "$p: $(cat "$p")"
    done
    info "controllers for $SUBNQN: $(ctrls_for_nqn "$SUBNQN" | tr '\n' ' ')"
fi

step list
run nvme list
step id-ctrl
out=$(nvme id-ctrl "/dev/$CTRL") || fail "nvme id-ctrl /dev/$CTRL failed"
echo "$out" | head -n 30
echo "$out" | grep -Eq "^subnqn +: $SUBNQN\$" || fail "id-ctrl subnqn is not $SUBNQN"
step id-ns
out=$(nvme id-ns "$NSDEV") || fail "nvme id-ns $NSDEV failed"
echo "$out" | head -n 30

step size
SECTORS=$(cat /sys/block/$NS/size)
BYTES=$((SECTORS * 512))
MIB=$((BYTES / 1048576))
info "namespace size $BYTES bytes ($MIB MiB), logical block $(cat /sys/block/$NS/queue/logical_block_size)"
if [ -n "${EXPECT_NS_BYTES:-}" ]; then
    [ "$BYTES" = "$EXPECT_NS_BYTES" ] || fail "namespace is $BYTES bytes, expected $EXPECT_NS_BYTES"
fi
[ "$MIB" -ge 96 ] || fail "namespace too small for this test ($MIB MiB < 96 MiB)"

step queues
MQ=$(mq_dir_for_ns "$NS") || fail "no blk-mq dir for $NS"
NQ=$(ls -d "$MQ"/[0-9]* | wc -l)
info "$NQ blk-mq hw queues in $MQ"
dmesg | grep -E "nvme[0-9]+: mapped [0-9]+/[0-9]+/[0-9]+" | tail -n 1 | sed 's/^/  dmesg: /' || true
if [ -n "${EXPECT_IO_QUEUES:-}" ]; then
    [ "$NQ" -ge "$EXPECT_IO_QUEUES" ] || fail "$NQ I/O queues < expected $EXPECT_IO_QUEUES"
fi

# dd patterns: A at 0, B at 5 MiB, 12 KiB at 12 MiB + 4 KiB, C at the last 4 MiB; fio uses [16 MiB, 80 MiB).
step dd-write
OFF_A=0; OFF_B=5; OFF_C=$((MIB - 4))
for p in A B C; do
    run dd if=/dev/urandom of=/tmp/pat$p bs=1048576 count=4 2>/dev/null
done
run dd if=/tmp/patA of="$NSDEV" bs=1048576 seek=$OFF_A oflag=direct conv=notrunc
run dd if=/tmp/patB of="$NSDEV" bs=1048576 seek=$OFF_B oflag=direct conv=notrunc
run dd if=/tmp/patC of="$NSDEV" bs=1048576 seek=$OFF_C oflag=direct conv=notrunc
# a few 4 KiB writes at odd offsets (different PDU sizes than the 1 MiB ones)
run dd if=/dev/urandom of=/tmp/patS bs=4096 count=3 2>/dev/null
run dd if=/tmp/patS of="$NSDEV" bs=4096 seek=3073 oflag=direct conv=notrunc   # 12 MiB + 4 KiB

check_patterns() {
    off=0
    for p in A B C; do
        eval off=\$OFF_$p
        rm -f /tmp/rd$p
        run dd if="$NSDEV" of=/tmp/rd$p bs=1048576 skip=$off count=4 iflag=direct
        cmp /tmp/pat$p /tmp/rd$p || fail "pattern $p at ${off} MiB differs after read-back"
        info "pattern $p at ${off} MiB OK"
    done
    rm -f /tmp/rdS
    run dd if="$NSDEV" of=/tmp/rdS bs=4096 skip=3073 count=3 iflag=direct
    cmp /tmp/patS /tmp/rdS || fail "4 KiB pattern at 12 MiB + 4 KiB differs after read-back"
    info "4 KiB pattern OK"
}
step dd-verify
check_patterns

if [ "${REAUTH:-0}" = 1 ]; then
    step re-authenticate
    SECRET=$(cat "/sys/class/nvme/$CTRL/dhchap_secret")
    case "$SECRET" in DHHC-1:*) ;; *) fail "no DH-HMAC-CHAP secret on $CTRL ($SECRET)";; esac
    before=$(dmesg | grep -c "re-authenticating controller" || true)
    # The same secret: no key change, a new transaction on every queue.
    printf '%s' "$SECRET" > "/sys/class/nvme/$CTRL/dhchap_secret"
    i=0
    while [ $i -lt 50 ]; do
        [ "$(dmesg | grep -c "re-authenticating controller" || true)" -gt "$before" ] && break
        sleep 0.2; i=$((i + 1))
    done
    [ "$(dmesg | grep -c "re-authenticating controller" || true)" -gt "$before" ] ||
        fail "the kernel did not start re-authentication"
    sleep 2
    dmesg | grep -iE "authentication failed|auth.*error" && fail "re-authentication failed"
    dmesg | grep -E "re-authenticating|authenticated" | tail -n 6 | sed 's/^/  dmesg: /' || true
    check_patterns
fi

if [ "$FIO" = 1 ]; then
    step fio
    if fio --enghelp 2>/dev/null | grep -qw libaio; then ENGINE=libaio; else ENGINE=psync; fi
    info "fio engine $ENGINE"
    t=$(now_s)
    run fio --name=v --filename="$NSDEV" --direct=1 --ioengine=$ENGINE --rw=randrw --rwmixread=50 \
        --bsrange=4k-1m --iodepth=8 --offset="$FIO_OFFSET" --size="$FIO_SIZE" \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randseed=1234 --group_reporting
    info "fio took $(awk -v a="$t" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
    step dd-verify-after-fio
    check_patterns
fi

if [ -n "${EXPECT_GROW_BYTES:-}" ]; then
    step online-resize
    i=0
    while [ $i -lt 300 ]; do                        # up to 60 s
        [ "$(($(cat /sys/block/$NS/size) * 512))" = "$EXPECT_GROW_BYTES" ] && break
        sleep 0.2; i=$((i + 1))
    done
    GROWN=$(($(cat /sys/block/$NS/size) * 512))
    [ "$GROWN" = "$EXPECT_GROW_BYTES" ] ||
        fail "namespace is $GROWN bytes, not $EXPECT_GROW_BYTES, 60 s into the wait for its online growth"
    info "namespace grew online from $BYTES to $GROWN bytes (seen after $((i / 5)) s of waiting)"
    dmesg | grep -iE "capacity change|rescan" | tail -n 3 | sed 's/^/  dmesg: /' || true
    run dd if=/dev/urandom of=/tmp/patG bs=1048576 count=2 2>/dev/null
    run dd if=/tmp/patG of="$NSDEV" bs=1048576 seek=$MIB oflag=direct conv=notrunc
    rm -f /tmp/rdG
    run dd if="$NSDEV" of=/tmp/rdG bs=1048576 skip=$MIB count=2 iflag=direct
    cmp /tmp/patG /tmp/rdG || fail "2 MiB written past the old end differ after read-back"
    info "2 MiB past the old end OK"
    check_patterns
fi

step flush
run nvme flush "$NSDEV"

step disconnect
do_disconnect

step reconnect
do_connect
step dd-verify-after-reconnect
check_patterns
step disconnect-final
do_disconnect

echo
echo "host-basic: all steps passed in $(awk -v a="$T0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
