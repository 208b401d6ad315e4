#!/usr/bin/env bash
# Builds SPDK's nvmf_tgt and spdk_nvme_perf as the local performance and
# conformance baseline, outside Sluice's git tree. Nothing here is committed.
#
#   scripts/build-spdk.sh OUT_DIR SPDK_SRC DPDK_SRC ISAL_SRC
#
# Each *_SRC is a git repository (a local mirror or a URL) of spdk/spdk,
# DPDK/dpdk and intel/isa-l. SPDK's dpdk submodule pins a commit of SPDK's own
# DPDK fork that is not public; the public tag v26.03 builds and works, so it
# is used instead (override with DPDK_REF). isa-l is checked out at the commit
# SPDK's submodule pins. Afterwards OUT_DIR/spdk/build/bin holds nvmf_tgt and
# spdk_nvme_perf, and OUT_DIR/spdk/scripts/rpc.py configures the target.
set -euo pipefail
if [[ $# -ne 4 ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1 spdk_src=$2 dpdk_src=$3 isal_src=$4
dpdk_ref=${DPDK_REF:-v26.03}
jobs=${JOBS:-$(nproc)}

pkgs=(build-essential meson ninja-build pkg-config nasm python3-pyelftools
    python3-jinja2 python3-yaml python3-tabulate libnuma-dev libssl-dev uuid-dev
    libaio-dev libncurses-dev libcunit1-dev libjson-c-dev libcmocka-dev autoconf
    automake libtool)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing ${missing[*]}"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
        $SUDO apt-get update -q >/dev/null
        $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
    }
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
if [[ ! -d $out/spdk/.git ]]; then
    git clone -q "$spdk_src" "$out/spdk"
fi
cd "$out/spdk"
isal_commit=$(git ls-tree HEAD isa-l | awk '{print $3}')
if [[ ! -e isa-l/.git ]]; then
    rm -rf isa-l
    git clone -q "$isal_src" isa-l
fi
git -C isa-l checkout -q "$isal_commit"
if [[ ! -e dpdk/.git ]]; then
    rm -rf dpdk
    git clone -q "$dpdk_src" dpdk
fi
git -C dpdk checkout -q "$dpdk_ref"

# SPDK's build runs Python helpers that need the Debian modules above.
export PATH=/usr/bin:$PATH
if [[ ! -f mk/config.mk ]] || ! grep -q "CONFIG_TESTS?=n" mk/config.mk; then
    ./configure --without-crypto --without-isal-crypto --without-vhost \
        --without-virtio --without-fsdev --without-nvme-cuse --without-rdma \
        --without-xnvme --without-vfio-user --without-ocf --without-uring \
        --without-fio --without-shared --without-usdt --without-golang \
        --disable-tests --disable-unit-tests --disable-examples
fi
make -j"$jobs"
ls -l build/bin/nvmf_tgt build/bin/spdk_nvme_perf
echo "SPDK built in $out/spdk (commit $(git rev-parse --short HEAD), DPDK $dpdk_ref)"
