#!/usr/bin/env bash
# Runs every Sluice test, installing what the tests need on a fresh Debian 12
# machine (QEMU, two Debian kernels, nvme-cli, fio; a C++ compiler for the
# fuzzers; protoc and etcd for the control plane). Stages:
#   0. scripts/check-module-cycles.py no import circle inside any crate (python3 only)
#   1. cargo test --workspace        unit, property, in-memory protocol and loopback tests
#   2. scripts/fuzz-smoke.sh         every decoder fuzzed for FUZZ_SECONDS (default 15) each
#   3. scripts/interop-linux-host.sh the Linux 6.1 and 6.12 kernel hosts against our target
#                                    (all scenarios; then quick runs with the isolated and
#                                    unified send paths and completion coalescing, the
#                                    second with 128 KiB of in-capsule data)
#      scripts/interop-linux-volume.sh the Linux 6.12 host on an elastic volume
#   4. scripts/interop-linux-target.sh our host against the Linux kernel target
#   5. scripts/test-exports.sh       fio (nbd engine), qemu-img, nbdcopy through `sluice nbd`;
#                                    mkfs/mount through `sluice fuse` and a loop device (needs root)
# Set SLUICE_SKIP_PEERS=1 to skip 3-4 (they need QEMU and ~10 minutes).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# Incremental caches help edit-compile loops, not one build from scratch,
# and they doubled the test build's size on disk (3 GB of 12; stop 34's CI
# run filled its disk).
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

# The whole run writes about 6 GB (debug and release builds, the fuzzers,
# the Linux peers' kernels); each stage prints what is left, so a full disk
# is seen as one and not as a linker crash.
disk_free() { df -Pm . | awk 'NR == 2 { printf "%.1f GB free on %s", $4 / 1024, $6 }'; }
stage() { echo; echo "=== $* === ($(disk_free))"; }
PASSED=0
FAILED=0
record() {
    if [[ $1 -eq 0 ]]; then PASSED=$((PASSED + 1)); echo "stage ok: $2"; else FAILED=$((FAILED + 1)); echo "stage FAILED: $2"; fi
}

stage "installing build and test dependencies (protoc, etcd)"
scripts/install-build-deps.sh --tests
# The metadata tests start a real etcd; here a missing etcd fails them
# instead of skipping them.
export SLUICE_REQUIRE_ETCD=1

if [[ "${SLUICE_SKIP_PEERS:-0}" != 1 ]]; then
    stage "installing the Linux peer harness (QEMU, kernels, nvme-cli, fio)"
    scripts/install-linux-peer.sh --no-tshark
fi

stage "module cycles (no import circle inside any crate)"
set +e
python3 scripts/check-module-cycles.py "$ROOT"
rc=$?
set -e
record $rc "module cycles"

stage "cargo test --workspace"
set +e
cargo test --workspace --all-targets --no-fail-fast 2>&1
rc=$?
set -e
record $rc "cargo test"

stage "fuzz smoke"
set +e
scripts/fuzz-smoke.sh "${FUZZ_SECONDS:-15}"
rc=$?
set -e
record $rc "fuzz smoke"

if [[ "${SLUICE_SKIP_PEERS:-0}" != 1 ]]; then
    stage "Linux kernel host against the Sluice target"
    set +e
    scripts/interop-linux-host.sh
    rc=$?
    set -e
    record $rc "interop: Linux host"
    # The last quick run also takes 128 KiB of in-capsule data: Linux then
    # sends writes up to 128 KiB in their capsules (fio's 4k-1m verify).
    for modes in "isolated calibrated 8k" "unified adaptive 128k"; do
        set -- $modes
        stage "Linux kernel host against the Sluice target, send path $1, coalescing $2, in-capsule data $3"
        set +e
        scripts/interop-linux-host.sh --quick --send-scheduler "$1" --coalescing "$2" --inline-data "$3"
        rc=$?
        set -e
        record $rc "interop: Linux host ($1/$2/$3)"
    done
    stage "Linux kernel host on an elastic volume (extents replicated on two other targets)"
    set +e
    scripts/interop-linux-volume.sh
    rc=$?
    set -e
    record $rc "interop: Linux host on a volume"
    stage "Sluice host against the Linux kernel target"
    set +e
    scripts/interop-linux-target.sh
    rc=$?
    set -e
    record $rc "interop: Linux target"
fi

stage "exports: NBD and FUSE with unmodified tools"
set +e
bash scripts/test-exports.sh
rc=$?
set -e
record $rc "exports"


echo
echo "stages: $PASSED passed, $FAILED failed ($(disk_free))"
[[ $FAILED -eq 0 ]]
