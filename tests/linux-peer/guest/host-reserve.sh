#!/bin/sh
# Guest as NVMe/TCP host using reservations (nvme-cli's resv-* through the
# kernel), with a second host on the machine running QEMU (`sluice resv`
# and `sluice bench` under another host NQN).
#
# The guest registers (key 4), replaces its key (5) and acquires a Write
# Exclusive reservation; its writes and reads work. It then signals the
# machine by connecting to the discovery service: the other host checks
# that its writes are refused and its reads are not, registers (key 7) and
# preempts the guest (Preempt and Abort, Write Exclusive). The guest must
# then see its own writes refused (the kernel names the status), the report
# name the other host as holder, its reads still work, and a fresh
# registration still not let it write (Write Exclusive).
#
# Env:
#   SUBNQN        subsystem NQN to connect to (required)
#   TARGET_ADDR   target address (default 10.0.2.2)
#   TARGET_PORT   I/O controller port (default 4420)
#   DISC_PORT     discovery port (default TARGET_PORT)
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DISC_PORT=${DISC_PORT:-$TARGET_PORT}
T0=$(now_s)

step modprobe
run modprobe nvme-tcp

step connect
run nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$SUBNQN"
NS=$(wait_ns_for_nqn "$SUBNQN") || fail "no block device for $SUBNQN after 20 s"
DEV=/dev/$NS
info "hostid $(cat /etc/nvme/hostid 2>/dev/null || echo '(none)')"

# The extended report (128-bit Host Identifiers): --eds where nvme-cli
# has it, CDW11 bit 0 otherwise.
report() {
    if nvme resv-report --help 2>&1 | grep -q -- '--eds'; then
        nvme resv-report "$DEV" -n 1 --eds
    else
        nvme resv-report "$DEV" -n 1 --cdw11=1
    fi
}
# The first value of report field $1 (gen, rtype, regctl, rcsts, rkey, ...).
field() {
    report | awk -F: -v k="$1" '{ f = $1; gsub(/ /, "", f) } f == k { v = $2; gsub(/ /, "", v); print v; exit }'
}
expect() {   # FIELD VALUE WHAT
    v=$(field "$1")
    [ "$v" = "$2" ] || { report | sed 's/^/  report: /'; fail "resv-report: $1 is '$v', expected '$2' ($3)"; }
    info "resv-report: $1 = $2 ($3)"
}
write_block() {   # succeeds when the write does
    dd if=/tmp/pat of="$DEV" bs=4096 count=1 seek=16 oflag=direct conv=notrunc 2>/tmp/dd.err
}

step identify
oncs=$(nvme id-ctrl "$DEV" | awk -F: '$1 ~ /^oncs/ { gsub(/ /, "", $2); print $2 }')
[ $((oncs & 0x20)) -ne 0 ] || fail "ONCS $oncs has no Reservations bit (5)"
rescap=$(nvme id-ns "$DEV" -n 1 | awk -F: '$1 ~ /^rescap/ { gsub(/ /, "", $2); print $2 }')
[ "$rescap" = "0xfe" ] || fail "RESCAP is '$rescap', expected 0xfe"
info "ONCS $oncs (Reservations), RESCAP $rescap"

step register
run nvme resv-register "$DEV" -n 1 --nrkey=4 --rrega=0
expect regctl 1 "registered"
expect rtype 0 "no reservation yet"
run nvme resv-register "$DEV" -n 1 --crkey=4 --nrkey=5 --rrega=2
expect rkey 5 "key replaced"
if nvme resv-register "$DEV" -n 1 --crkey=4 --nrkey=6 --rrega=2 2>/tmp/resv.err; then
    fail "replacing with the old key succeeded"
fi
info "replacing with the old key is refused: $(head -c 200 /tmp/resv.err)"

step acquire
run nvme resv-acquire "$DEV" -n 1 --crkey=5 --rtype=1 --racqa=0
expect rtype 1 "Write Exclusive"
expect rcsts 1 "the guest holds it"
run dd if=/dev/urandom of=/tmp/pat bs=4096 count=1 2>/dev/null
write_block || fail "the holder's write failed: $(cat /tmp/dd.err)"
run dd if="$DEV" of=/tmp/rd bs=4096 count=1 skip=16 iflag=direct
cmp /tmp/pat /tmp/rd || fail "the holder's block reads back different"
info "the holder writes and reads back"

step other-host
# The machine's host checks its access and preempts this one.
signal_by_discovery "$SUBNQN"
i=0
while [ $i -lt 450 ] && write_block; do      # up to 90 s
    sleep 0.2; i=$((i + 1))
done
write_block && fail "still writing 90 s after the signal: not preempted"
info "preempted after $((i / 5)) s: the write fails ($(head -c 120 /tmp/dd.err))"
dmesg | grep -iE "reservation conflict|nexus" | tail -n 2 | sed 's/^/  dmesg: /' || true
dmesg | grep -qiE "reservation conflict|critical nexus" ||
    fail "the kernel did not report a reservation conflict"
expect rtype 1 "Write Exclusive, now the other host's"
expect regctl 1 "the guest's registration preempted"
expect rkey 7 "the other host's key"
run dd if="$DEV" of=/tmp/rd bs=4096 count=1 skip=16 iflag=direct
info "reads still work under Write Exclusive"

step register-again
run nvme resv-register "$DEV" -n 1 --nrkey=4 --rrega=0
expect regctl 2 "both registered"
write_block && fail "a registrant wrote under Write Exclusive"
info "registered again, still refused writes (Write Exclusive holds)"
# Releasing what it does not hold changes nothing.
run nvme resv-release "$DEV" -n 1 --crkey=4 --rtype=1 --rrela=0
expect rtype 1 "the other host still holds it"

step disconnect
run nvme disconnect -n "$SUBNQN"

echo
echo "host-reserve: all steps passed in $(awk -v a="$T0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
