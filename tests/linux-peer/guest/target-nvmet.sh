#!/bin/sh
# Guest as NVMe/TCP TARGET (kernel nvmet-tcp) for a host running on this machine, reached through
# QEMU hostfwd (e.g. --hostfwd tcp:127.0.0.1:14420-:4420 --hostfwd tcp:127.0.0.1:14499-:4499).
#
# Prints "SLUICE-PEER-READY" once the port is listening, then stays up until:
#   - a line "stop" arrives on the control port CTRL_PORT (host: printf 'stop\n' > /dev/tcp/...;
#     the host should repeat it every few seconds until the run ends: between two control
#     connections the listener is briefly down, and slirp then drops the connection), or
#   - TARGET_UP_SECONDS elapse.
# Either ends the test with exit 0 unless EXPECT_HOST_CONNECT=1 and no host ever created a
# controller (nvmet logs "creating ... controller"), or the stop never came and REQUIRE_STOP=1.
#
# Env:
#   SUBNQN              default nqn.2014-08.org.sluice:kernel-target
#   TARGET_PORT         listen port in the guest (default 4420), on 0.0.0.0
#   NS_MB               null_blk namespace size (default 1024)
#   ALLOWED_HOSTNQN     if set, only this host NQN may connect (else any host)
#   DHCHAP_KEY          with ALLOWED_HOSTNQN: that host must authenticate with this
#                       DHHC-1 secret; DHCHAP_CTRL_KEY, DHCHAP_HASH ("hmac(sha512)"),
#                       DHCHAP_DHGROUP ("ffdhe2048") are optional
#   TARGET_UP_SECONDS   default 120
#   CTRL_PORT           control port in the guest (default 4499)
#   EXPECT_HOST_CONNECT 1 = fail unless some host connected an I/O or admin controller
#   REQUIRE_STOP        1 = fail if TARGET_UP_SECONDS expire without a stop command
set -eu
. /guest/lib.sh
. /guest/lib-nvmet.sh

SUBNQN=${SUBNQN:-nqn.2014-08.org.sluice:kernel-target}
TARGET_PORT=${TARGET_PORT:-4420}
NS_MB=${NS_MB:-1024}
TARGET_UP_SECONDS=${TARGET_UP_SECONDS:-120}
CTRL_PORT=${CTRL_PORT:-4499}

step nvmet-setup
nvmet_setup "$SUBNQN" 0.0.0.0 "$TARGET_PORT" "$NS_MB" "${ALLOWED_HOSTNQN:-}"

step listen-check
i=0
while ! netstat -ltn 2>/dev/null | grep -q ":$TARGET_PORT "; do
    i=$((i + 1)); [ $i -lt 50 ] || fail "nothing listens on port $TARGET_PORT"
    sleep 0.1
done
netstat -ltn | grep ":$TARGET_PORT "

# control listener: busybox nc exits when the host closes the connection
: > /tmp/ctl
nc -l -p "$CTRL_PORT" > /tmp/ctl 2>/dev/null &
NC_PID=$!
# READY only once the control port listens too, or an early "stop" would be refused and lost
i=0
while ! netstat -ltn 2>/dev/null | grep -q ":$CTRL_PORT "; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "control listener on port $CTRL_PORT did not start"
    sleep 0.1
done

echo "SLUICE-PEER-READY subnqn=$SUBNQN port=$TARGET_PORT ctrl_port=$CTRL_PORT ns_bytes=$((NS_MB * 1048576))"

step serve
start=$(date +%s)
why=timeout
while [ $(( $(date +%s) - start )) -lt "$TARGET_UP_SECONDS" ]; do
    if grep -q '^stop' /tmp/ctl 2>/dev/null; then why=stop; break; fi
    if ! kill -0 "$NC_PID" 2>/dev/null; then
        # a control connection without "stop" (e.g. a port probe): listen again
        grep -q '^stop' /tmp/ctl 2>/dev/null && { why=stop; break; }
        nc -l -p "$CTRL_PORT" > /tmp/ctl 2>/dev/null &
        NC_PID=$!
    fi
    sleep 0.5
done
kill "$NC_PID" 2>/dev/null || true
info "serving ended by $why after $(( $(date +%s) - start )) s"

step report
dmesg | grep -E 'nvmet' | tail -n 30
if [ "${EXPECT_HOST_CONNECT:-0}" = 1 ]; then
    dmesg | grep -Eq 'nvmet: (creating|created) (nvm|discovery) controller' ||
        fail "no host created a controller on this target"
fi
if [ "${REQUIRE_STOP:-0}" = 1 ] && [ "$why" != stop ]; then
    fail "no stop command within $TARGET_UP_SECONDS s"
fi
echo "target-nvmet: done ($why)"
