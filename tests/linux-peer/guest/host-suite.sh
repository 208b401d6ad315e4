#!/bin/sh
# One boot, several guest-as-host checks against one target, in order:
#   host-discover-only.sh (unless SKIP_DISCOVER=1), host-basic.sh, host-denied.sh (if DENIED=1).
# Takes the union of those scripts' environment variables (see each script).
set -eu
. /guest/lib.sh
if [ "${SKIP_DISCOVER:-0}" != 1 ]; then
    step "RUN host-discover-only.sh"
    sh /guest/host-discover-only.sh || fail_quiet "host-discover-only.sh failed"
fi
step "RUN host-basic.sh"
sh /guest/host-basic.sh || fail_quiet "host-basic.sh failed"
if [ "${DENIED:-0}" = 1 ]; then
    step "RUN host-denied.sh"
    sh /guest/host-denied.sh || fail_quiet "host-denied.sh failed"
fi
echo
echo "host-suite: all passed"
