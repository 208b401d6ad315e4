#!/usr/bin/env bash
# Installs what building Sluice needs beyond Rust: protoc (Debian's
# protobuf-compiler), for the control plane's gRPC code and etcd's client.
# With --tests, also etcd (Debian's etcd-server), which the metadata tests
# start for real, and qemu-img (qemu-utils), which the CLI's volume tests
# drive over NBD.
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [[ "${1:-}" == --tests ]]; then
    command -v etcd >/dev/null || need+=(etcd-server)
    command -v qemu-img >/dev/null || need+=(qemu-utils)
fi
if [[ ${#need[@]} -gt 0 ]]; then
    echo "installing ${need[*]}"
    SUDO=""
    [[ $(id -u) -eq 0 ]] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || {
        $SUDO apt-get update -q >/dev/null
        $SUDO apt-get install -y -q "${need[@]}" >/dev/null
    }
fi
# Debian's etcd-server package may start a system etcd on 2379; the tests use
# their own ports, so it is left alone.
