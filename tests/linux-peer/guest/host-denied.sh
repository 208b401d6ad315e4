#!/bin/sh
# Guest as NVMe/TCP host with a host NQN that is NOT on the target's allow-list: connect must fail.
#
# Env:
#   SUBNQN            subsystem NQN (required)
#   TARGET_ADDR       default 10.0.2.2; TARGET_PORT default 4420
#   DENIED_HOSTNQN    host NQN to present (default: a fixed NQN that no allow-list should contain)
#   DENIED_HOSTID     host id to present with it (default: a fixed uuid)
#   CONNECT_ARGS      extra `nvme connect` args
#   EXPECT_DENIED_DMESG  1 (default): the host kernel must log the rejection
#                        ("Connect Invalid Host" / "... is not allowed"); 0 only prints dmesg
set -eu
. /guest/lib.sh

: "${SUBNQN:?SUBNQN must be set}"
TARGET_ADDR=${TARGET_ADDR:-10.0.2.2}
TARGET_PORT=${TARGET_PORT:-4420}
DENIED_HOSTNQN=${DENIED_HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:dec1ded0-0000-4000-8000-00000000dead}
DENIED_HOSTID=${DENIED_HOSTID:-dec1ded0-0000-4000-8000-00000000dead}
CONNECT_ARGS=${CONNECT_ARGS:-}

step modprobe
run modprobe nvme-tcp
[ -z "$(ctrls_for_nqn "$SUBNQN")" ] || fail "a controller for $SUBNQN already exists"

step connect-denied
dmesg -c >/dev/null 2>&1 || true
echo "+ nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n $SUBNQN --hostnqn=$DENIED_HOSTNQN --hostid=$DENIED_HOSTID $CONNECT_ARGS"
rc=0
# shellcheck disable=SC2086
nvme connect -t tcp -a "$TARGET_ADDR" -s "$TARGET_PORT" -n "$SUBNQN" \
    --hostnqn="$DENIED_HOSTNQN" --hostid="$DENIED_HOSTID" $CONNECT_ARGS || rc=$?
info "nvme connect rc=$rc"
[ "$rc" != 0 ] || fail "nvme connect with a host NQN not on the allow-list succeeded"

step no-device
sleep 1
[ -z "$(ctrls_for_nqn "$SUBNQN")" ] || fail "a controller for $SUBNQN exists after a denied connect"
NS=$(ns_for_nqn "$SUBNQN" || true)
[ -z "$NS" ] || fail "namespace $NS appeared after a denied connect"
info "no controller, no namespace: OK"

step dmesg
dmesg | tail -n 20
if [ "${EXPECT_DENIED_DMESG:-1}" = 1 ]; then
    # host-side (nvme-fabrics) messages only, not nvmet's when the target runs in this guest:
    #   6.1/6.12: "nvme nvme0: Connect for subsystem NQN is not allowed, hostnqn: ..."
    #   older:    "nvme nvme0: Connect Invalid Host"
    dmesg | grep -Eq "nvme nvme[0-9]+: (Connect Invalid Host|Connect for subsystem .* is not allowed)" ||
        fail "kernel did not log a Connect Invalid Host / not allowed rejection"
    info "kernel logged the host rejection: OK"
fi
echo
echo "host-denied: all steps passed"
