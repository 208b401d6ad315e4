#!/bin/sh
# Guest as NVMe/TCP host: discovery only (no I/O controller).
#
# Env:
#   SUBNQN              subsystem NQN that the discovery log must list (required)
#   TARGET_ADDR         default 10.0.2.2
#   DISC_PORT           default ${TARGET_PORT:-4420}
#   EXPECT_TRSVCID      if set, the SUBNQN entry must advertise this port
#   EXPECT_TRADDR       if set, the SUBNQN entry must advertise this address
#   EXPECT_ENTRIES      if set, the discovery log must hold exactly this many records
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
DISC_PORT=${DISC_PORT:-${TARGET_PORT:-4420}}

step modprobe
run modprobe nvme-tcp

step discover
out=$(nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" 2>&1) || { echo "$out"; fail "nvme discover failed"; }
echo "$out"
echo "$out" | grep -Eq "subnqn: +$SUBNQN\$" || fail "discovery log does not list $SUBNQN"

# the record for SUBNQN: the lines of its "=====Discovery Log Entry N======" block
entry=$(echo "$out" | awk -v nqn="$SUBNQN" '
    /^=+Discovery Log Entry/ { if (found) exit; blk = "" }
    { blk = blk $0 "\n" }
    $1 == "subnqn:" && $2 == nqn { found = 1 }
    END { if (found) printf "%s", blk }')
if [ -n "${EXPECT_TRSVCID:-}" ]; then
    echo "$entry" | grep -Eq "^trsvcid: +$EXPECT_TRSVCID\$" || fail "entry for $SUBNQN does not advertise port $EXPECT_TRSVCID"
fi
if [ -n "${EXPECT_TRADDR:-}" ]; then
    echo "$entry" | grep -Eq "^traddr: +$EXPECT_TRADDR\$" || fail "entry for $SUBNQN does not advertise address $EXPECT_TRADDR"
fi
echo "$entry" | grep -Eq "^trtype: +tcp\$" || fail "entry for $SUBNQN is not trtype tcp"
if [ -n "${EXPECT_ENTRIES:-}" ]; then
    n=$(echo "$out" | grep -c '^=*Discovery Log Entry' || true)
    [ "$n" = "$EXPECT_ENTRIES" ] || fail "discovery log has $n records, expected $EXPECT_ENTRIES"
fi
[ -z "$(ctrls_for_nqn "$SUBNQN")" ] || fail "discovery left an I/O controller for $SUBNQN behind"
echo
echo "host-discover-only: all steps passed"
