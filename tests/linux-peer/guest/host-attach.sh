#!/bin/sh
# Guest as NVMe/TCP host while the target adds and removes a namespace of
# the connected subsystem (a configuration reload on the machine running QEMU).
#
# The machine running QEMU adds NSID 2 once this guest's controller exists,
# and removes it once this guest has connected to the discovery service
# (the signal that NSID 2 was written and read back). The kernel must see
# both through Namespace Attribute Changed events alone (no rescan asked
# for), and namespace 1 must keep its data throughout.
#
# Env:
#   SUBNQN            subsystem NQN to connect to (required)
#   TARGET_ADDR       target address (default 10.0.2.2)
#   TARGET_PORT       I/O controller port (default 4420)
#   DISC_PORT         discovery port (default TARGET_PORT)
#   EXPECT_NS2_BYTES  the size NSID 2 must have once it appears (required)
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
: "${EXPECT_NS2_BYTES:?EXPECT_NS2_BYTES must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DISC_PORT=${DISC_PORT:-$TARGET_PORT}
T0=$(now_s)

# The block device of NSID $1 of subsystem $SUBNQN (the head device under
# native multipath, else the controller's namespace), if present.
ns_dev_for_nsid() {
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ -e "$s/subsysnqn" ] && [ "$(cat "$s/subsysnqn")" = "$SUBNQN" ] || continue
        for n in "$s"/nvme*n*; do
            b=$(basename "$n")
            case "$b" in nvme*c*n*) continue ;; esac
            [ "$(cat "/sys/block/$b/nsid" 2>/dev/null)" = "$1" ] && [ -b "/dev/$b" ] &&
                { echo "$b"; return 0; }
        done
    done
    for c in $(ctrls_for_nqn "$SUBNQN"); do
        for n in /sys/class/nvme/$c/${c}n*; do
            b=$(basename "$n")
            [ "$(cat "/sys/block/$b/nsid" 2>/dev/null)" = "$1" ] && [ -b "/dev/$b" ] &&
                { echo "$b"; return 0; }
        done
    done
    return 1
}

step modprobe
run modprobe nvme-tcp

step connect
run nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$SUBNQN"
i=0
NS1=""
while [ $i -lt 100 ] && [ -z "$NS1" ]; do
    NS1=$(ns_dev_for_nsid 1 || true)
    [ -n "$NS1" ] || { sleep 0.2; i=$((i + 1)); }
done
[ -n "$NS1" ] || fail "no block device for NSID 1 of $SUBNQN after 20 s"
CTRL=$(ctrls_for_nqn "$SUBNQN" | head -n1)
info "controller /dev/$CTRL, NSID 1 is /dev/$NS1"
[ -z "$(ns_dev_for_nsid 2 || true)" ] || fail "NSID 2 exists before the target added it"

step write-nsid-1
run dd if=/dev/urandom of=/tmp/pat1 bs=1048576 count=2 2>/dev/null
run dd if=/tmp/pat1 of="/dev/$NS1" bs=1048576 oflag=direct conv=notrunc
check_ns1() {
    rm -f /tmp/rd1
    run dd if="/dev/$NS1" of=/tmp/rd1 bs=1048576 count=2 iflag=direct
    cmp /tmp/pat1 /tmp/rd1 || fail "NSID 1's data differ after read-back ($1)"
    info "NSID 1 reads back ($1)"
}
check_ns1 "before"

step namespace-added
i=0
NS2=""
while [ $i -lt 450 ] && [ -z "$NS2" ]; do          # up to 90 s
    NS2=$(ns_dev_for_nsid 2 || true)
    [ -n "$NS2" ] || { sleep 0.2; i=$((i + 1)); }
done
[ -n "$NS2" ] || fail "NSID 2 did not appear within 90 s of the wait (no rescan after the event?)"
info "NSID 2 appeared as /dev/$NS2 after $((i / 5)) s of waiting"
dmesg | grep -iE "rescan|nvme.*ns|changed" | tail -n 5 | sed 's/^/  dmesg: /' || true
BYTES2=$(($(cat /sys/block/$NS2/size) * 512))
[ "$BYTES2" = "$EXPECT_NS2_BYTES" ] || fail "NSID 2 is $BYTES2 bytes, expected $EXPECT_NS2_BYTES"
run nvme list
run dd if=/dev/urandom of=/tmp/pat2 bs=1048576 count=2 2>/dev/null
run dd if=/tmp/pat2 of="/dev/$NS2" bs=1048576 seek=1 oflag=direct conv=notrunc
rm -f /tmp/rd2
run dd if="/dev/$NS2" of=/tmp/rd2 bs=1048576 skip=1 count=2 iflag=direct
cmp /tmp/pat2 /tmp/rd2 || fail "NSID 2's data differ after read-back"
info "NSID 2 reads back"
check_ns1 "with NSID 2 present"

step signal
# Connecting to the discovery service tells the machine running QEMU that
# NSID 2 was used: it removes it now.
signal_by_discovery "$SUBNQN"

step namespace-removed
i=0
while [ $i -lt 450 ] && [ -b "/dev/$NS2" ]; do      # up to 90 s
    sleep 0.2; i=$((i + 1))
done
[ ! -b "/dev/$NS2" ] || fail "/dev/$NS2 still present 90 s into the wait for NSID 2's removal"
info "/dev/$NS2 went away after $((i / 5)) s of waiting"
check_ns1 "after NSID 2 was removed"
[ -n "$(ctrls_for_nqn "$SUBNQN")" ] || fail "the controller went away with NSID 2"

step disconnect
run nvme disconnect -n "$SUBNQN"

echo
echo "host-attach: all steps passed in $(awk -v a="$T0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
