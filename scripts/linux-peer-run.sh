#!/usr/bin/env bash
# Boot a Debian kernel in QEMU (TCG) with the Sluice peer initramfs and run one guest test script.
#
#   scripts/linux-peer-run.sh --kernel 6.1|6.12 --script FILE [--env FILE] [-e KEY=VALUE]...
#       [--file FILE]... [--hostfwd tcp:127.0.0.1:HPORT-:GPORT]... [--timeout SECONDS]
#       [--hostnqn NQN] [--hostid UUID] [--log FILE] [--verbose]
#
#   --kernel     kernel series installed by scripts/install-linux-peer.sh
#   --script     guest test, becomes /test.sh (run by busybox sh); exit 0 = PASS
#   --env        KEY=VALUE file, becomes /test.env (sourced with `set -a` before /test.sh)
#   -e KEY=VAL   appended to /test.env (after --env); repeatable
#   --file       extra file copied to /guest/<basename>; repeatable. tests/linux-peer/guest/*
#                is always available as /guest/* in the guest.
#   --hostfwd    QEMU user-net host forward (repeatable), e.g. tcp:127.0.0.1:14420-:4420
#   --timeout    wall-clock limit for the whole run (default 300); QEMU is killed after it. The
#                guest gets sluice.timeout = timeout-30 (min 10) for /test.sh itself. A guest
#                kernel oops panics the guest (oops=panic), which ends the run as a FAIL at once.
#   --hostnqn    guest /etc/nvme/hostnqn (default: fixed uuid NQN, see tests/linux-peer/init.sh)
#   --hostid     guest /etc/nvme/hostid
#   --log        write the serial console log here (written live; default: a temp file,
#                deleted on success)
#   --verbose    also stream the serial console to stdout
#
# Exit status: 0 only when the guest printed "SLUICE-PEER-RESULT: PASS"; 1 on FAIL or timeout;
# 2 on usage or setup errors. On failure the last 60 lines of the log are printed to stderr.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
CACHE=${LINUX_PEER_CACHE:-$REPO_ROOT/.cache/linux-peer}
GUEST_DIR=$REPO_ROOT/tests/linux-peer/guest

usage_die() { echo "linux-peer-run: ERROR: $*" >&2; echo "(see: $0 --help)" >&2; exit 2; }
log() { echo "linux-peer-run: $*" >&2; }

KERNEL='' SCRIPT='' ENV_FILE='' TIMEOUT=300 HOSTNQN='' HOSTID='' LOG='' VERBOSE=0
HOSTFWDS=() EXTRA_ENV=() EXTRA_FILES=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --kernel) KERNEL=${2:?--kernel needs a value}; shift ;;
        --script) SCRIPT=${2:?--script needs a file}; shift ;;
        --env) ENV_FILE=${2:?--env needs a file}; shift ;;
        -e) EXTRA_ENV+=("${2:?-e needs KEY=VALUE}"); shift ;;
        --file) EXTRA_FILES+=("${2:?--file needs a file}"); shift ;;
        --hostfwd) HOSTFWDS+=("${2:?--hostfwd needs a value}"); shift ;;
        --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift ;;
        --hostnqn) HOSTNQN=${2:?--hostnqn needs an NQN}; shift ;;
        --hostid) HOSTID=${2:?--hostid needs a uuid}; shift ;;
        --log) LOG=${2:?--log needs a file}; shift ;;
        --verbose) VERBOSE=1 ;;
        -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) usage_die "unknown argument: $1" ;;
    esac
    shift
done
[[ $KERNEL == 6.1 || $KERNEL == 6.12 ]] || usage_die "--kernel must be 6.1 or 6.12"
[[ -n $SCRIPT ]] || usage_die "--script FILE is required"
[[ -f $SCRIPT ]] || usage_die "script not found: $SCRIPT"
[[ -z $ENV_FILE || -f $ENV_FILE ]] || usage_die "env file not found: $ENV_FILE"
[[ $TIMEOUT =~ ^[0-9]+$ && $TIMEOUT -ge 10 ]] || usage_die "--timeout must be an integer >= 10"
for f in ${EXTRA_FILES[@]+"${EXTRA_FILES[@]}"}; do [[ -f $f ]] || usage_die "file not found: $f"; done
for kv in ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || usage_die "-e expects KEY=VALUE, got: $kv"
done
for fwd in ${HOSTFWDS[@]+"${HOSTFWDS[@]}"}; do
    [[ $fwd =~ ^(tcp|udp):[0-9.]*:[0-9]+-[0-9.]*:[0-9]+$ ]] ||
        usage_die "--hostfwd expects tcp:127.0.0.1:HPORT-:GPORT, got: $fwd"
done
for v in "$HOSTNQN" "$HOSTID"; do
    [[ $v != *[[:space:]]* ]] || usage_die "--hostnqn/--hostid must not contain whitespace"
done

KENV=$CACHE/kernel-$KERNEL.env
[[ -f $KENV ]] || usage_die "kernel $KERNEL not installed ($KENV missing): run scripts/install-linux-peer.sh"
# shellcheck disable=SC1090
. "$KENV"
[[ -f $VMLINUZ && -f $INITRD ]] ||
    usage_die "kernel $KERNEL files missing ($VMLINUZ / $INITRD): re-run scripts/install-linux-peer.sh"
command -v qemu-system-x86_64 >/dev/null || usage_die "qemu-system-x86_64 not found: run scripts/install-linux-peer.sh"
command -v cpio >/dev/null || usage_die "cpio not found: run scripts/install-linux-peer.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/linux-peer-run.XXXXXX")
QEMU_PID=
TAIL_PID=
cleanup() {
    if [[ -n $QEMU_PID ]] && kill -0 "$QEMU_PID" 2>/dev/null; then
        kill "$QEMU_PID" 2>/dev/null || true
        sleep 0.2
        kill -9 "$QEMU_PID" 2>/dev/null || true
    fi
    [[ -n $TAIL_PID ]] && kill "$TAIL_PID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- test cpio
mkdir -p "$TMP/root/guest"
install -m 755 "$SCRIPT" "$TMP/root/test.sh"
if [[ -d $GUEST_DIR ]]; then
    find "$GUEST_DIR" -maxdepth 1 -type f -exec install -m 755 {} "$TMP/root/guest/" \;
fi
for f in ${EXTRA_FILES[@]+"${EXTRA_FILES[@]}"}; do install -m 755 "$f" "$TMP/root/guest/"; done
: > "$TMP/root/test.env"
if [[ -n $ENV_FILE ]]; then cat "$ENV_FILE" >> "$TMP/root/test.env"; echo >> "$TMP/root/test.env"; fi
for kv in ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}; do
    # single-quote the value so the guest shell takes it literally
    printf "%s='%s'\n" "${kv%%=*}" "$(printf '%s' "${kv#*=}" | sed "s/'/'\\\\''/g")" >> "$TMP/root/test.env"
done
(cd "$TMP/root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) \
    > "$TMP/test.cpio"
# Linux unpacks concatenated cpio archives in one initrd; later files override earlier ones.
cat "$INITRD" "$TMP/test.cpio" > "$TMP/initrd"

# ---------------------------------------------------------------- boot
# The guest limit leaves room for the boot (~5-15 s under load) so the guest can still report.
GUEST_TIMEOUT=$(( TIMEOUT - 30 )); [[ $GUEST_TIMEOUT -ge 10 ]] || GUEST_TIMEOUT=10
# oops=panic + panic=-1 + -no-reboot: a kernel oops/BUG ends QEMU at once instead of a hang.
APPEND="console=ttyS0 quiet loglevel=4 oops=panic panic=-1 sluice.timeout=$GUEST_TIMEOUT"
[[ -n $HOSTNQN ]] && APPEND+=" sluice.hostnqn=$HOSTNQN"
[[ -n $HOSTID ]] && APPEND+=" sluice.hostid=$HOSTID"
NETDEV="user,id=n0"
for fwd in ${HOSTFWDS[@]+"${HOSTFWDS[@]}"}; do NETDEV+=",hostfwd=$fwd"; done

KEEP_LOG=1
if [[ -z $LOG ]]; then LOG=$TMP/serial.log; KEEP_LOG=0; fi
mkdir -p "$(dirname "$LOG")"
: > "$LOG"

log "kernel $KVER, script $(basename "$SCRIPT"), timeout ${TIMEOUT}s, log $LOG"
START=$(date +%s.%N)
# A stock kernel under TCG occasionally dies while booting, before any test
# runs (seen: an int3 oops in sched_clock_cpu while jump labels are patched
# at ~3 s). Such a boot, with no SLUICE-PEER-BOOTED marker and a kernel
# panic in the log, is retried (3 boots at most); a guest that booted and
# then failed is never retried.
BOOT_ATTEMPT=0
while :; do
BOOT_ATTEMPT=$((BOOT_ATTEMPT + 1))
: > "$LOG"
qemu-system-x86_64 -machine q35 -accel tcg,thread=multi -cpu max -smp 2 -m 2048 \
    -nographic -no-reboot -nodefaults -serial stdio \
    -kernel "$VMLINUZ" -initrd "$TMP/initrd" -append "$APPEND" \
    -netdev "$NETDEV" -device virtio-net-pci,netdev=n0,romfile= \
    </dev/null >>"$LOG" 2>&1 &
QEMU_PID=$!
if [[ $VERBOSE == 1 ]]; then
    tail -n +1 -f "$LOG" --pid="$QEMU_PID" &
    TAIL_PID=$!
fi

result=
deadline=$(( $(date +%s) + TIMEOUT ))
while :; do
    if grep -aq 'SLUICE-PEER-RESULT: ' "$LOG"; then
        result=$(grep -a 'SLUICE-PEER-RESULT: ' "$LOG" | tail -n1 | tr -d '\r')
        # give the guest a moment to power off by itself
        for _ in $(seq 50); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
        break
    fi
    if ! kill -0 "$QEMU_PID" 2>/dev/null; then
        result=$(grep -a 'SLUICE-PEER-RESULT: ' "$LOG" | tail -n1 | tr -d '\r' || true)
        [[ -n $result ]] || result="(QEMU exited without a result marker)"
        break
    fi
    if [[ $(date +%s) -ge $deadline ]]; then
        result="(host timeout after ${TIMEOUT}s: QEMU killed)"
        break
    fi
    sleep 0.2
done
if kill -0 "$QEMU_PID" 2>/dev/null; then
    kill "$QEMU_PID" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$QEMU_PID" 2>/dev/null || true
fi
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=
if [[ -n $TAIL_PID ]]; then sleep 0.3; kill "$TAIL_PID" 2>/dev/null || true; wait "$TAIL_PID" 2>/dev/null || true; TAIL_PID=; fi
ELAPSED=$(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')

booted=$(grep -ao 'SLUICE-PEER-BOOTED.*' "$LOG" | tail -n1 | tr -d '\r' || true)
if [[ -z $booted && $result != "SLUICE-PEER-RESULT: PASS" && $BOOT_ATTEMPT -lt 3 ]] &&
    grep -aq 'Kernel panic' "$LOG"; then
    cp "$LOG" "$LOG.boot-$BOOT_ATTEMPT" 2>/dev/null || true
    log "guest kernel died while booting (attempt $BOOT_ATTEMPT, before the test ran): booting again"
    continue
fi
break
done
if [[ $result == "SLUICE-PEER-RESULT: PASS" ]]; then
    log "PASS in ${ELAPSED}s (kernel $KVER; ${booted:-no boot marker})"
    exit 0
fi
log "FAIL in ${ELAPSED}s (kernel $KVER): ${result:-no result}"
echo "----- last 60 lines of $( [[ $KEEP_LOG == 1 ]] && echo "$LOG" || echo "serial log") -----" >&2
tail -n 60 "$LOG" | tr -d '\r' >&2
echo "-----" >&2
exit 1
