#!/bin/sh
# Guest as NVMe/TCP host with a persistent discovery controller while the
# target adds a subsystem (a configuration reload on the machine running
# QEMU): the kernel must get a Discovery Log Page Change event
# (uevent NVME_AEN=0x70f002, what the nvme-cli udev rule acts on), after
# which the discovery log lists the new subsystem and the host connects
# to it and uses it.
#
# Env:
#   ADDED_NQN         NQN of the subsystem the reload adds (required)
#   TARGET_ADDR       target address (default 10.0.2.2)
#   TARGET_PORT       I/O controller port (default 4420)
#   DISC_PORT         discovery port (default TARGET_PORT)
set -eu
. /guest/lib.sh

: "${ADDED_NQN:?ADDED_NQN must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DISC_PORT=${DISC_PORT:-$TARGET_PORT}
DISC_NQN=nqn.2014-08.org.nvmexpress.discovery
T0=$(now_s)

step modprobe
run modprobe nvme-tcp

step uevent-listener
# busybox's uevent runs the handler for every kernel uevent, with the
# event's variables in its environment (as udev would see them).
cat >/tmp/aen.sh <<'SH'
#!/bin/sh
[ -n "${NVME_AEN:-}" ] && echo "$NVME_AEN ${DEVNAME:-?}" >>/tmp/aen.log
exit 0
SH
chmod 755 /tmp/aen.sh
: >/tmp/aen.log
uevent /tmp/aen.sh &
UEVENT_PID=$!
sleep 0.5

step persistent-discovery
out=$(nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" --persistent 2>&1) ||
    { echo "$out"; fail "nvme discover --persistent failed"; }
echo "$out" | grep -E "subnqn|trsvcid" | sed 's/^/  /'
echo "$out" | grep -Eq "subnqn: +$ADDED_NQN\$" && fail "$ADDED_NQN is listed before the target added it"
DCTRL=$(for c in /sys/class/nvme/nvme*; do
    [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$DISC_NQN" ] && basename "$c"
done | head -n1)
[ -n "$DCTRL" ] || fail "no persistent discovery controller after nvme discover --persistent"
info "persistent discovery controller /dev/$DCTRL"

step discovery-change-event
i=0
while [ $i -lt 450 ] && ! grep -q "0x70f002" /tmp/aen.log; do   # up to 90 s
    sleep 0.2; i=$((i + 1))
done
grep -q "0x70f002" /tmp/aen.log ||
    fail "no NVME_AEN=0x70f002 uevent within 90 s (events seen: $(tr '\n' ' ' </tmp/aen.log))"
info "uevent NVME_AEN=$(grep 0x70f002 /tmp/aen.log | head -n1) after $((i / 5)) s of waiting"
[ -e "/sys/class/nvme/$DCTRL" ] || fail "the persistent discovery controller went away"

step discover-added
out=$(nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" 2>&1) ||
    { echo "$out"; fail "nvme discover failed"; }
echo "$out" | grep -Eq "subnqn: +$ADDED_NQN\$" || { echo "$out"; fail "the discovery log does not list $ADDED_NQN"; }
info "the discovery log lists $ADDED_NQN"

step connect-added
run nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$ADDED_NQN"
NS=$(wait_ns_for_nqn "$ADDED_NQN") || fail "no namespace block device for $ADDED_NQN after 20 s"
run dd if=/dev/urandom of=/tmp/pat bs=1048576 count=2 2>/dev/null
run dd if=/tmp/pat of="/dev/$NS" bs=1048576 oflag=direct conv=notrunc
rm -f /tmp/rd
run dd if="/dev/$NS" of=/tmp/rd bs=1048576 count=2 iflag=direct
cmp /tmp/pat /tmp/rd || fail "data read back from $ADDED_NQN differ"
info "/dev/$NS of $ADDED_NQN reads back"

step disconnect
run nvme disconnect -n "$ADDED_NQN"
run nvme disconnect -d "$DCTRL"
kill "$UEVENT_PID" 2>/dev/null || true

echo
echo "host-discovery-aen: all steps passed in $(awk -v a="$T0" -v b="$(now_s)" 'BEGIN{printf "%.1f", b-a}') s"
