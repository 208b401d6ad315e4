#!/usr/bin/env bash
# Install the Linux kernel peer harness (QEMU + Debian 12 kernels + tiny initramfs).
#
#   scripts/install-linux-peer.sh [--no-tshark] [--kernel 6.1|6.12]...
#
# - apt-get installs the host tools (qemu-system-x86, busybox-static, cpio, kmod, nvme-cli, fio,
#   xz-utils, zstd, and tshark unless --no-tshark).
# - apt-get downloads two Debian 12 kernels (the 6.1 one linux-image-amd64 depends on, and the
#   newest linux-image-6.12.*+deb12-amd64), extracts them, and builds a base initramfs per
#   kernel (busybox, modules for nvme-tcp/nvmet-tcp/null_blk/virtio-net, nvme-cli, fio, /init).
# - Everything is cached under <repo>/.cache/linux-peer/ and rebuilt only when its inputs change.
#   On success it writes <cache>/kernel-<series>.env (KVER, VMLINUZ, INITRD) used by
#   scripts/linux-peer-run.sh, and prints the paths.
#
# Environment:
#   LINUX_PEER_CACHE      cache dir (default <repo>/.cache/linux-peer)
#   LINUX_PEER_612_PKG    force a 6.12 image package name (default: newest in apt-cache)
#   LINUX_PEER_61_PKG     force a 6.1 image package name (default: linux-image-amd64's dependency)
#   LINUX_PEER_NO_UPDATE  set to 1 to never run apt-get update
set -euo pipefail

die() { echo "install-linux-peer: ERROR: $*" >&2; exit 1; }
log() { echo "install-linux-peer: $*" >&2; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
CACHE=${LINUX_PEER_CACHE:-$REPO_ROOT/.cache/linux-peer}
INIT_SRC=$REPO_ROOT/tests/linux-peer/init.sh
# The initramfs key also hashes this script itself, so any change here rebuilds it.
BUILD_VERSION=6

WANT_TSHARK=1
KERNELS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-tshark) WANT_TSHARK=0 ;;
        --kernel) [[ $# -ge 2 ]] || die "--kernel needs 6.1 or 6.12"; KERNELS+=("$2"); shift ;;
        -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument: $1 (try --help)" ;;
    esac
    shift
done
[[ ${#KERNELS[@]} -gt 0 ]] || KERNELS=(6.1 6.12)
for k in "${KERNELS[@]}"; do
    [[ $k == 6.1 || $k == 6.12 ]] || die "unsupported kernel series '$k' (use 6.1 or 6.12)"
done

[[ $(id -u) == 0 ]] || die "must run as root (apt-get install / dpkg -x / device-free cpio build)"
[[ -f $INIT_SRC ]] || die "missing $INIT_SRC"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12 only"

T0=$(date +%s)
mkdir -p "$CACHE/debs" "$CACHE/kernels" "$CACHE/initramfs"

APT_UPDATED=0
apt_update_once() {
    [[ $APT_UPDATED == 1 || ${LINUX_PEER_NO_UPDATE:-0} == 1 ]] && return 0
    log "apt-get update"
    apt-get update -qq || die "apt-get update failed"
    APT_UPDATED=1
}

# ---------------------------------------------------------------- host packages
# qemu-utils too: installing Debian's qemu-system-x86 removes a newer
# qemu-utils (a backport) that conflicts with it, and the tests need
# qemu-img (the NBD exports of volumes).
PKGS=(qemu-system-x86 qemu-utils busybox-static cpio kmod nvme-cli fio xz-utils zstd)
[[ $WANT_TSHARK == 1 ]] && PKGS+=(tshark)
# Twice: an install can remove a package that was there before it (the
# qemu-utils backport above), so what is missing is looked at again.
for round in 1 2; do
    MISSING=()
    for p in "${PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || MISSING+=("$p")
    done
    [[ ${#MISSING[@]} -eq 0 ]] && break
    apt_update_once
    if [[ " ${MISSING[*]} " == *" tshark "* ]]; then
        echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
    fi
    log "apt-get install ${MISSING[*]} (round $round)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${MISSING[@]}" \
        >/dev/null || die "apt-get install ${MISSING[*]} failed"
done
for c in qemu-system-x86_64 qemu-img busybox cpio depmod modprobe nvme fio xz zstd dpkg-deb ldd gzip sha256sum; do
    command -v "$c" >/dev/null || die "required command '$c' not found after install"
done
BUSYBOX=$(command -v busybox)
ldd "$BUSYBOX" >/dev/null 2>&1 && die "$BUSYBOX is dynamically linked; need busybox-static"

# ---------------------------------------------------------------- kernel package names
pkg_61() {
    if [[ -n ${LINUX_PEER_61_PKG:-} ]]; then echo "$LINUX_PEER_61_PKG"; return; fi
    apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-6\.1\.[^ ]*-amd64\)$/\1/p' | head -n1
}
pkg_612() {
    if [[ -n ${LINUX_PEER_612_PKG:-} ]]; then echo "$LINUX_PEER_612_PKG"; return; fi
    apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' 2>/dev/null |
        awk '{print $1}' | sort -V | tail -n1
}
kernel_pkg() {
    local series=$1 name
    name=$([[ $series == 6.1 ]] && pkg_61 || pkg_612)
    if [[ -z $name ]]; then
        apt_update_once
        name=$([[ $series == 6.1 ]] && pkg_61 || pkg_612)
    fi
    [[ -n $name ]] || die "cannot find a Debian 12 kernel package for $series in apt-cache"
    echo "$name"
}

fetch_deb() {  # $1 package name -> prints path of the cached .deb
    local pkg=$1 deb
    deb=$(ls -1 "$CACHE/debs/${pkg}_"*.deb 2>/dev/null | sort -V | tail -n1 || true)
    if [[ -n $deb ]]; then echo "$deb"; return; fi
    log "apt-get download $pkg"
    if ! (cd "$CACHE/debs" && apt-get download -qq "$pkg" >/dev/null 2>&1); then
        apt_update_once
        (cd "$CACHE/debs" && apt-get download -qq "$pkg" >/dev/null) || die "apt-get download $pkg failed"
    fi
    deb=$(ls -1 "$CACHE/debs/${pkg}_"*.deb 2>/dev/null | sort -V | tail -n1 || true)
    [[ -n $deb ]] || die "apt-get download $pkg produced no .deb in $CACHE/debs"
    echo "$deb"
}

# ---------------------------------------------------------------- initramfs build
MODULES=(virtio_pci virtio_net nvme-tcp nvme-fabrics nvmet nvmet-tcp null_blk configfs crc32c_generic)
OPTIONAL_MODULES=(crc32c-intel tls)   # tls: for NVMe/TCP TLS tests on 6.12 (CONFIG_NVME_TCP_TLS=y)

copy_with_libs() {  # $1 root, $2 binary path -> copies binary + ldd closure + loader
    local root=$1 bin=$2 lib
    install -D -m 755 "$bin" "$root/bin/$(basename "$bin")"
    while read -r lib; do
        [[ -n $lib ]] || continue
        [[ -e $lib ]] || die "library $lib of $bin does not exist"
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
        chmod 755 "$root$lib"   # libraries need mode 755 in the guest, else "Permission denied"
    done < <(ldd "$bin" | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}')
}

build_initramfs() {  # $1 extracted kernel root, $2 kver, $3 output .cpio.gz
    local kroot=$1 kver=$2 out=$3 work root m line ko dst rel builtin=()
    work=$(mktemp -d "$CACHE/initramfs/build.XXXXXX")
    root=$work/root
    mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,etc/nvme,lib/modules/"$kver"}
    ln -s bin "$root/sbin"
    mkdir -p "$root/usr"; ln -s ../bin "$root/usr/bin"; ln -s ../bin "$root/usr/sbin"

    # busybox and its applets
    install -m 755 "$BUSYBOX" "$root/bin/busybox"
    for a in $("$BUSYBOX" --list); do
        [[ -e $root/bin/$a ]] || ln -s busybox "$root/bin/$a"
    done

    # nvme-cli and fio with their libraries (and the dynamic loader, listed by ldd)
    copy_with_libs "$root" "$(command -v nvme)"
    copy_with_libs "$root" "$(command -v fio)"

    # module closure
    local all_mods=("${MODULES[@]}")
    for m in "${OPTIONAL_MODULES[@]}"; do
        if modprobe -d "$kroot" -S "$kver" --show-depends "$m" >/dev/null 2>&1; then
            all_mods+=("$m")
        else
            log "optional module $m not available for $kver (skipped)"
        fi
    done
    : > "$work/modlist"
    for m in "${all_mods[@]}"; do
        modprobe -d "$kroot" -S "$kver" --show-depends "$m" > "$work/deps" 2>&1 ||
            die "module $m not found for kernel $kver: $(cat "$work/deps")"
        while read -r line; do
            case "$line" in
                builtin\ *) builtin+=("${line#builtin }") ;;
                insmod\ *)
                    ko=$(awk '{print $2}' <<<"$line")
                    rel=${ko#"$kroot"/lib/modules/"$kver"/}
                    rel=${rel#"$kroot"/usr/lib/modules/"$kver"/}
                    dst=$root/lib/modules/$kver/$rel
                    case "$ko" in
                        *.ko.xz) dst=${dst%.xz}; mkdir -p "$(dirname "$dst")"; xz -dc "$ko" > "$dst" ;;
                        *.ko.zst) dst=${dst%.zst}; mkdir -p "$(dirname "$dst")"; zstd -qdc "$ko" > "$dst" ;;
                        *.ko.gz) dst=${dst%.gz}; mkdir -p "$(dirname "$dst")"; gzip -dc "$ko" > "$dst" ;;
                        *.ko) mkdir -p "$(dirname "$dst")"; cp "$ko" "$dst" ;;
                        *) die "unexpected module file $ko" ;;
                    esac
                    ;;
            esac
        done < "$work/deps"
        # load order for /init: the requested (non built-in) modules; modprobe pulls the deps.
        # null_blk is left to the tests (they load it with their own parameters), and so is tls.
        if grep -q '^insmod ' "$work/deps" && [[ $m != null_blk && $m != tls ]]; then echo "$m" >> "$work/modlist"; fi
    done
    local kmoddir=$kroot/lib/modules/$kver
    for f in modules.order modules.builtin modules.builtin.modinfo; do
        [[ -f $kmoddir/$f ]] && cp "$kmoddir/$f" "$root/lib/modules/$kver/"
    done
    depmod -b "$root" "$kver" || die "depmod -b $root $kver failed"
    cp "$work/modlist" "$root/etc/sluice-modules"
    log "kernel $kver: modules loaded by /init: $(tr '\n' ' ' < "$work/modlist")"
    [[ ${#builtin[@]} -gt 0 ]] && log "kernel $kver: built-in: $(printf '%s\n' "${builtin[@]}" | sort -u | tr '\n' ' ')"

    # /init and misc
    install -m 755 "$INIT_SRC" "$root/init"
    echo "root:x:0:0:root:/tmp:/bin/sh" > "$root/etc/passwd"
    echo "root:x:0:" > "$root/etc/group"
    echo "$kver" > "$root/etc/sluice-kver"

    # Uncompressed on purpose: fio's library closure (ceph, icu, ...) makes the tree ~90 MB and
    # gunzip inside the TCG guest costs ~3.5 s per boot; an uncompressed cpio unpacks fast.
    (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) \
        > "$work/initramfs.cpio" || die "cpio of $root failed"
    mv "$work/initramfs.cpio" "$out"
    rm -rf "$work"
}

# ---------------------------------------------------------------- per kernel
TOOLS_HASH=$( { sha256sum "${BASH_SOURCE[0]}" "$INIT_SRC" "$BUSYBOX" "$(command -v nvme)" "$(command -v fio)" | awk '{print $1}';
               echo "$BUILD_VERSION ${MODULES[*]} ${OPTIONAL_MODULES[*]}"; } | sha256sum | cut -c1-16)

for series in "${KERNELS[@]}"; do
    pkg=$(kernel_pkg "$series")
    deb=$(fetch_deb "$pkg")
    kroot=$CACHE/kernels/$pkg
    if [[ ! -f $kroot/.extracted ]]; then
        log "extracting $(basename "$deb")"
        rm -rf "$kroot"; mkdir -p "$kroot"
        dpkg -x "$deb" "$kroot" || die "dpkg -x $deb failed"
        touch "$kroot/.extracted"
    fi
    vmlinuz=$(ls -1 "$kroot"/boot/vmlinuz-* 2>/dev/null | head -n1 || true)
    [[ -n $vmlinuz ]] || die "no boot/vmlinuz-* in $deb"
    kver=${vmlinuz##*/vmlinuz-}
    [[ -d $kroot/lib/modules/$kver ]] || die "no lib/modules/$kver in $deb"
    if [[ ! -f $kroot/lib/modules/$kver/modules.dep ]]; then
        depmod -b "$kroot" "$kver" || die "depmod on extracted $kver failed"
    fi
    initrd=$CACHE/initramfs/base-$kver-$TOOLS_HASH.cpio
    if [[ ! -f $initrd ]]; then
        log "building base initramfs for $kver"
        build_initramfs "$kroot" "$kver" "$initrd"
        # drop stale builds of the same kernel
        find "$CACHE/initramfs" -maxdepth 1 -name "base-$kver-*.cpio*" ! -name "$(basename "$initrd")" -delete
    fi
    cat > "$CACHE/kernel-$series.env.tmp" <<EOF
SERIES=$series
PKG=$pkg
KVER=$kver
VMLINUZ=$vmlinuz
INITRD=$initrd
EOF
    mv "$CACHE/kernel-$series.env.tmp" "$CACHE/kernel-$series.env"
done

log "done in $(( $(date +%s) - T0 )) s"
for series in "${KERNELS[@]}"; do
    # shellcheck disable=SC1090
    ( . "$CACHE/kernel-$series.env"
      echo "kernel $SERIES: KVER=$KVER"
      echo "  VMLINUZ=$VMLINUZ"
      echo "  INITRD=$INITRD ($(du -h "$INITRD" | cut -f1))"
      echo "  ENV=$CACHE/kernel-$series.env" )
done
