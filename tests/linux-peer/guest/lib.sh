# Shared helpers for the guest scripts (sourced by busybox sh; lives at /guest/lib.sh).

step() { echo; echo "STEP $*"; }
info() { echo "  $*"; }
fail() { echo "FAIL: $*"; dmesg | tail -n 20 | sed 's/^/  dmesg: /'; exit 1; }
fail_quiet() { echo "FAIL: $*"; exit 1; }   # when the failing sub-script already printed dmesg

# Run a command, echo it first; fail the script with a clear message if it fails.
run() {
    echo "+ $*"
    "$@" || fail "command failed (rc=$?): $*"
}

# Controllers (e.g. nvme0) whose subsysnqn is $1 and transport tcp, one per line.
ctrls_for_nqn() {
    for c in /sys/class/nvme/nvme*; do
        [ -e "$c/subsysnqn" ] || continue
        [ "$(cat "$c/subsysnqn")" = "$1" ] || continue
        [ "$(cat "$c/transport" 2>/dev/null)" = tcp ] || continue
        basename "$c"
    done
}

# First namespace block device (e.g. nvme0n1) of subsystem $1. With native multipath (Debian's
# default) this is the ns head device under nvme-subsystem; else the controller's namespace.
ns_for_nqn() {
    for s in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ -e "$s/subsysnqn" ] || continue
        [ "$(cat "$s/subsysnqn")" = "$1" ] || continue
        for n in "$s"/nvme*n*; do
            b=$(basename "$n")
            case "$b" in nvme*c*n*) continue ;; esac
            [ -b "/dev/$b" ] && { echo "$b"; return 0; }
        done
    done
    for c in $(ctrls_for_nqn "$1"); do
        for n in /sys/class/nvme/$c/${c}n*; do
            b=$(basename "$n")
            [ -b "/dev/$b" ] && { echo "$b"; return 0; }
        done
    done
    return 1
}

# Waits up to 20 s for subsystem $1's namespace block device and prints its
# name (e.g. nvme0n1); returns 1 if none appears (callers: `|| fail ...`).
wait_ns_for_nqn() {
    i=0
    while [ $i -lt 100 ]; do
        ns=$(ns_for_nqn "$1" || true)
        [ -n "$ns" ] && { echo "$ns"; return 0; }
        sleep 0.2; i=$((i + 1))
    done
    return 1
}

# Directory holding blk-mq hctx dirs for namespace $1 (the path device under multipath).
mq_dir_for_ns() {
    if [ -d "/sys/block/$1/mq" ]; then echo "/sys/block/$1/mq"; return 0; fi
    for p in /sys/block/$1/device/nvme*c*n* /sys/block/nvme*c*n*; do
        [ -d "$p/mq" ] && { echo "$p/mq"; return 0; }
    done
    return 1
}

now_s() { cut -d' ' -f1 /proc/uptime; }

# Connects to the discovery service at $TARGET_ADDR:$DISC_PORT and checks
# that its log lists subsystem $1: the signal by which a guest tells the
# machine running QEMU that it may go on (it watches the target's log for
# the discovery controller's creation).
signal_by_discovery() {
    out=$(nvme discover -t tcp -a "$TARGET_ADDR" -s "$DISC_PORT" 2>&1) ||
        { echo "$out"; fail "nvme discover failed"; }
    echo "$out" | grep -Eq "subnqn: +$1\$" || fail "discovery log does not list $1"
}
