#!/usr/bin/env bash
# Sluice against SPDK on this machine, side by side (see scripts/bench-vs-spdk.py
# for the pairs, rows and method):
#
#   scripts/bench-vs-spdk.sh SPDK_DIR [--runtime S] [--repeats N] [--rows ...] [--write-doc]
#
# SPDK_DIR: an SPDK tree built by scripts/build-spdk.sh. SPDK is not part of
# Sluice and not needed by CI; without it this script only says so.
set -euo pipefail
if [[ $# -lt 1 || ! -x "$1/build/bin/nvmf_tgt" || ! -x "$1/build/bin/spdk_nvme_perf" ]]; then
    echo "bench-vs-spdk: give an SPDK tree with build/bin/nvmf_tgt and build/bin/spdk_nvme_perf" >&2
    echo "  (build one with scripts/build-spdk.sh OUT_DIR SPDK_SRC DPDK_SRC ISAL_SRC)" >&2
    exit 2
fi
exec python3 "$(dirname "${BASH_SOURCE[0]}")/bench-vs-spdk.py" "$@"
