#!/bin/sh
# /init of the Sluice Linux peer initramfs (runs under busybox ash as PID 1).
#
# Built into the base initramfs by scripts/install-linux-peer.sh. Each run appends a second,
# tiny cpio archive (built by scripts/linux-peer-run.sh) that provides:
#   /test.sh      the test to run (required)
#   /test.env     optional KEY=VALUE lines, sourced (exported) before /test.sh runs
#   /guest/*      the repo's tests/linux-peer/guest/ scripts (+ any --file extras)
#
# Kernel command line parameters understood here:
#   sluice.hostnqn=NQN   written to /etc/nvme/hostnqn (default: fixed uuid NQN below)
#   sluice.hostid=UUID   written to /etc/nvme/hostid  (default: fixed uuid below)
#   sluice.timeout=SECS  guest-side time limit for /test.sh (default 240)
#
# Serial console protocol (grepped by the host side):
#   SLUICE-PEER-BOOTED kver=... uptime=...   /init reached, modules loaded, network up
#   SLUICE-PEER-RESULT: PASS                 /test.sh exited 0
#   SLUICE-PEER-RESULT: FAIL rc=N            /test.sh exited N (or was killed by the timeout)
# then the guest powers off.

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/tmp
export TERM=dumb

DEFAULT_HOSTID=5c1a1ce0-0000-4000-8000-000000000001
DEFAULT_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:$DEFAULT_HOSTID

finish() {
    # $1 = rc of the test
    sync
    if [ "$1" = 0 ]; then
        echo
        echo "SLUICE-PEER-RESULT: PASS"
    else
        echo
        echo "SLUICE-PEER-RESULT: FAIL rc=$1"
    fi
    # let the serial tty drain before the machine disappears
    sleep 1
    poweroff -f
    # poweroff -f should not return; if it does, make sure PID 1 never exits (kernel panic)
    while :; do sleep 3600; done
}

mkdir -p /proc /sys /dev /tmp /run /etc/nvme
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || mdev -s
exec </dev/console >/dev/console 2>&1
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null || true

# Modules (list written at build time, in load order; built-ins are not listed).
for m in $(cat /etc/sluice-modules 2>/dev/null); do
    modprobe "$m" || echo "sluice-init: WARNING: modprobe $m failed"
done
mount -t configfs configfs /sys/kernel/config 2>/dev/null || \
    echo "sluice-init: WARNING: cannot mount configfs at /sys/kernel/config"

# Command line parameters.
HOSTNQN=$DEFAULT_HOSTNQN
HOSTID=$DEFAULT_HOSTID
GUEST_TIMEOUT=240
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        sluice.hostnqn=*) HOSTNQN=${arg#sluice.hostnqn=} ;;
        sluice.hostid=*) HOSTID=${arg#sluice.hostid=} ;;
        sluice.timeout=*) GUEST_TIMEOUT=${arg#sluice.timeout=} ;;
    esac
done
echo "$HOSTNQN" > /etc/nvme/hostnqn
echo "$HOSTID" > /etc/nvme/hostid

# Network: QEMU user networking, guest 10.0.2.15, host (this machine) at 10.0.2.2.
ip link set lo up
if ip link show eth0 >/dev/null 2>&1; then
    ip addr add 10.0.2.15/24 dev eth0
    ip link set eth0 up
    ip route add default via 10.0.2.2
else
    echo "sluice-init: WARNING: no eth0 (virtio_net missing?)"
fi
hostname sluice-peer

echo "SLUICE-PEER-BOOTED kver=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime) hostnqn=$HOSTNQN"

if [ ! -f /test.sh ]; then
    echo "sluice-init: no /test.sh in the initramfs (the test cpio was not appended?)"
    finish 127
fi

[ -f /test.env ] || : > /test.env

cd /tmp || true
# /test.env is sourced in the child shell so that a broken env file cannot kill PID 1.
timeout -s KILL "$GUEST_TIMEOUT" sh -c 'set -a; . /test.env || exit 126; set +a; exec sh /test.sh'
rc=$?
if [ "$rc" = 137 ]; then
    echo "sluice-init: /test.sh killed (guest timeout ${GUEST_TIMEOUT}s or SIGKILL)"
fi
echo "sluice-init: /test.sh finished rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
finish "$rc"
