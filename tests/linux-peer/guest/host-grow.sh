#!/bin/sh
# Guest as NVMe/TCP host while the target grows the connected namespace (a
# configuration reload on the machine running QEMU).
#
# The machine running QEMU raises the `size` of the file namespace (NSID 1,
# `create = true`) once this guest's controller exists: the target extends
# the file. Once this guest has connected to the discovery service (the
# signal that it used the grown part), the machine grows the file
# underneath (`truncate`) and reloads again: the target finds it larger.
# Each time the kernel must see the new capacity through the Namespace
# Attribute Changed event alone (no rescan asked for), use the new blocks,
# and read back what it wrote before.
#
# Env:
#   SUBNQN          subsystem NQN to connect to (required)
#   EXPECT_BYTES    the namespace's size at connect, after the first and the
#                   second growth: three byte counts, space-separated (required)
#   TARGET_ADDR     target address (default 10.0.2.2)
#   TARGET_PORT     I/O controller port (default 4420)
#   DISC_PORT       discovery port (default TARGET_PORT)
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
: "${EXPECT_BYTES:?EXPECT_BYTES must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DISC_PORT=${DISC_PORT:-$TARGET_PORT}
set -- $EXPECT_BYTES
[ $# -eq 3 ] || fail_quiet "EXPECT_BYTES must hold three sizes, not '$EXPECT_BYTES'"
BYTES0=$1 BYTES1=$2 BYTES2=$3
T0=$(now_s)

step modprobe
run modprobe nvme-tcp

step connect
run nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$SUBNQN"
NS=$(wait_ns_for_nqn "$SUBNQN") || fail "no block device for $SUBNQN after 20 s"
bytes() { echo $(($(cat "/sys/block/$NS/size") * 512)); }
[ "$(bytes)" = "$BYTES0" ] || fail "/dev/$NS is $(bytes) bytes at connect, expected $BYTES0"
info "/dev/$NS is $BYTES0 bytes"

step write-low
run dd if=/dev/urandom of=/tmp/pat0 bs=1048576 count=2 2>/dev/null
run dd if=/tmp/pat0 of="/dev/$NS" bs=1048576 oflag=direct conv=notrunc
check_low() {
    rm -f /tmp/rd0
    run dd if="/dev/$NS" of=/tmp/rd0 bs=1048576 count=2 iflag=direct
    cmp /tmp/pat0 /tmp/rd0 || fail "the first 2 MiB differ after read-back ($1)"
    info "the first 2 MiB read back ($1)"
}

# Waits until /dev/$NS has $1 bytes, then writes and reads back the last
# 1 MiB below that size (blocks that did not exist before).
grown_to() {
    i=0
    while [ $i -lt 450 ] && [ "$(bytes)" != "$1" ]; do      # up to 90 s
        sleep 0.2; i=$((i + 1))
    done
    [ "$(bytes)" = "$1" ] || fail "/dev/$NS is $(bytes) bytes 90 s into the wait for $1 (no rescan after the event?)"
    info "/dev/$NS grew to $1 bytes after $((i / 5)) s of waiting"
    dmesg | grep -iE "capacity|rescan" | tail -n 3 | sed 's/^/  dmesg: /' || true
    last=$(($1 / 1048576 - 1))
    run dd if=/dev/urandom of=/tmp/patn bs=1048576 count=1 2>/dev/null
    run dd if=/tmp/patn of="/dev/$NS" bs=1048576 seek=$last oflag=direct conv=notrunc
    rm -f /tmp/rdn
    run dd if="/dev/$NS" of=/tmp/rdn bs=1048576 skip=$last count=1 iflag=direct
    cmp /tmp/patn /tmp/rdn || fail "the last MiB of the grown namespace differs after read-back"
    info "the last MiB (new blocks) reads back"
}

step grown-by-size
grown_to "$BYTES1"
check_low "after the first growth"

step signal
# Connecting to the discovery service tells the machine running QEMU to
# grow the file underneath.
signal_by_discovery "$SUBNQN"

step grown-underneath
grown_to "$BYTES2"
check_low "after the second growth"
[ -n "$(ctrls_for_nqn "$SUBNQN")" ] || fail "the controller went away"

step disconnect
run nvme disconnect -n "$SUBNQN"

echo
echo "host-grow: all steps passed in $(awk -v a="$T0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
