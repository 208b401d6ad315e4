#!/usr/bin/env bash
# Exports with unmodified tools: `sluice nbd` driven by fio (nbd engine),
# qemu-img and nbdcopy; `sluice fuse` + losetup + mkfs.ext4 + mount; a
# `sluice fuse --cpu-share` mount that must be throttled (metrics, exit table);
# `sluice fuse --transport uring` (FUSE over io_uring) with fio verify and ext4.
# Self-contained: installs the tools it needs (root, Debian). Prints one
# PASS/FAIL line per check and "N passed, M failed"; exits non-zero on failure.
set -uo pipefail
cd "$(dirname "$0")/.."

PASS=0
FAIL=0
pass() { echo "PASS: $*"; PASS=$((PASS + 1)); }
fail() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }
check() { local name=$1; shift; if "$@" >>"$WORK/log" 2>&1; then pass "$name"; else fail "$name (see $WORK/log)"; fi; }

WORK=$(mktemp -d /tmp/sluice-exports.XXXXXX)
PIDS=()
LOOP=""
MNT_EXT=""
MNT_FUSE=""
MNT_CAP=""
MNT_URING=""
MNT_AUTO=""
cleanup() {
    set +e
    [ -n "$MNT_EXT" ] && mountpoint -q "$MNT_EXT" && umount "$MNT_EXT"
    [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[$i]}" 2>/dev/null
        for _ in $(seq 50); do kill -0 "${PIDS[$i]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${PIDS[$i]}" 2>/dev/null
    done
    [ -n "$MNT_FUSE" ] && mountpoint -q "$MNT_FUSE" && fusermount3 -u "$MNT_FUSE"
    [ -n "$MNT_CAP" ] && mountpoint -q "$MNT_CAP" && fusermount3 -u "$MNT_CAP"
    [ -n "$MNT_URING" ] && mountpoint -q "$MNT_URING" && umount -l "$MNT_URING"
    [ -n "$MNT_AUTO" ] && mountpoint -q "$MNT_AUTO" && umount -l "$MNT_AUTO"
    [ -n "${URING_WAS:-}" ] && [ -w "$URING_PARAM" ] && echo "$URING_WAS" > "$URING_PARAM"
    if [ "${KEEP_WORK:-0}" != 1 ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

need=()
command -v fio >/dev/null || need+=(fio)
command -v qemu-img >/dev/null || need+=(qemu-utils)
command -v nbdcopy >/dev/null || need+=(libnbd-bin)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >"$WORK/apt.log" 2>&1 \
        || { echo "apt-get install failed:"; tail -20 "$WORK/apt.log"; }
fi
echo "tools: $(fio --version 2>&1 | head -1); $(qemu-img --version 2>&1 | head -1); $(nbdcopy --version 2>&1 | head -1); $(mkfs.ext4 -V 2>&1 | head -1)"

# SLUICE=path/to/sluice skips the build.
if [ -z "${SLUICE:-}" ]; then
    scripts/install-build-deps.sh
    cargo build --release -q -p sluice-cli || { echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; }
    SLUICE=target/release/sluice
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 100); do eval "$1" && return 0; sleep 0.1; done; return 1; }

# ext4 on a loop device over a FUSE file ($1), the checks labelled $2:
# mkfs, files written with dd, checksums after a remount, fsck clean.
ext4_on_loop() {
    local file=$1 label=$2
    if LOOP=$(losetup -f --show "$file" 2>>"$WORK/log"); then pass "losetup $LOOP ($label)"; else fail "losetup ($label)"; return; fi
    MNT_EXT=$WORK/ext4
    mkdir -p "$MNT_EXT"
    check "mkfs.ext4 ($label)" mkfs.ext4 -q -F "$LOOP"
    check "mount ext4 ($label)" mount "$LOOP" "$MNT_EXT"
    check "write files with dd ($label)" bash -c "set -e; for i in 1 2 3; do dd if=/dev/urandom of=\"$MNT_EXT/f\$i\" bs=1M count=8 status=none; done; \
        dd if=/dev/urandom of='$MNT_EXT/small' bs=777 count=3 status=none; sync; cd '$MNT_EXT'; sha256sum f1 f2 f3 small > '$WORK/sums-$label'; [ \$(wc -l < '$WORK/sums-$label') = 4 ]"
    check "umount ext4 ($label)" umount "$MNT_EXT"
    check "remount ext4 ($label)" mount "$LOOP" "$MNT_EXT"
    check "checksums after remount ($label)" bash -c "cd '$MNT_EXT' && sha256sum -c --quiet '$WORK/sums-$label'"
    check "umount ext4 again ($label)" umount "$MNT_EXT"
    MNT_EXT=""
    check "fsck clean ($label)" e2fsck -fn "$LOOP"
    check "detach loop ($label)" losetup -d "$LOOP"
    LOOP=""
}

PORT=$(free_port)
NQN=nqn.2026-11.io.sluice:ram0
"$SLUICE" target --listen 127.0.0.1:$PORT --discovery-listen "" --ram-size 512MiB >"$WORK/target.log" 2>&1 &
PIDS+=($!)
wait_for "(echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null" || { fail "target start"; }

# `sluice nbd` of export "disk" on the Unix socket $1, logging to $2; its
# start passes or fails as "$3"; further arguments are its options.
start_nbd() {
    local sock=$1 log=$2 label=$3
    shift 3
    "$SLUICE" nbd --target 127.0.0.1:$PORT --nqn $NQN --unix "$sock" --export-name disk "$@" >"$log" 2>&1 &
    PIDS+=($!)
    if wait_for "[ -S '$sock' ]"; then pass "$label listening"; else fail "$label start"; cat "$log"; fi
}

SOCK=$WORK/nbd.sock
start_nbd "$SOCK" "$WORK/nbd.log" "sluice nbd on a Unix socket"
URI="nbd+unix:///disk?socket=$SOCK"

check "nbdinfo sees 512 MiB export" bash -c "nbdinfo --size '$URI' | grep -qx 536870912"
check "qemu-img info" bash -c "qemu-img info --image-opts driver=nbd,path='$SOCK',export=disk | grep -q 'virtual size: 512 MiB'"

check "fio randrw 4k-128k crc32c verify, iodepth 8" \
    fio --name=nbd --ioengine=nbd --uri="nbd+unix:///disk?socket=$SOCK" --rw=randrw --bsrange=4k-128k \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --size=64m --iodepth=8 --output="$WORK/fio.txt"
if [ -f "$WORK/fio.txt" ]; then grep -E "READ:|WRITE:" "$WORK/fio.txt" | sed 's/^/    /'; fi

head -c 48M /dev/urandom >"$WORK/in.raw"
truncate -s 64M "$WORK/in.raw"
check "nbdcopy file -> nbd" nbdcopy "$WORK/in.raw" "$URI"
check "nbdcopy nbd -> file" bash -c "nbdcopy '$URI' '$WORK/out.raw' && truncate -s 64M '$WORK/out.raw'"
check "nbdcopy round trip identical" cmp "$WORK/in.raw" "$WORK/out.raw"
check "qemu-img convert nbd -> qcow2 -> compare" bash -c \
    "qemu-img convert -f raw -O qcow2 '$WORK/in.raw' '$WORK/in.qcow2' && \
     qemu-img convert -n -f qcow2 --target-image-opts '$WORK/in.qcow2' driver=nbd,path='$SOCK',export=disk && \
     qemu-img compare --image-opts driver=file,filename='$WORK/in.raw' driver=nbd,path='$SOCK',export=disk"
# Unaligned I/O through qemu's NBD client (minimum block size 1 advertised):
# a 7-byte write at 60 MiB + 1001 (a zero area), read back, neighbours still zero.
check "unaligned write/read (qemu-io)" bash -c "out=\$(qemu-io -c 'write -P 0x5a 62915561 7' -c 'read -P 0x5a 62915561 7' -c 'read -P 0 62915568 16' \
    --image-opts driver=nbd,path='$SOCK',export=disk 2>&1); echo \"\$out\"; \
    ! grep -qi 'fail' <<<\"\$out\" && grep -q 'read 16/16' <<<\"\$out\""

# Several NBD connections at once (multi-conn): 4 fio jobs, each its own
# libnbd connection, writing and verifying its own 24 MiB region at QD 16,
# random block sizes, while the others run (after the comparisons above,
# which need the export past 64 MiB to read as zeros).
CONNS_BEFORE=$(grep -c 'transmission phase' "$WORK/nbd.log" || true)
check "4 concurrent NBD connections, crc32c-verified writes in disjoint regions" \
    fio --name=multi --ioengine=nbd --uri="nbd+unix:///disk?socket=$SOCK" --numjobs=4 --rw=randwrite \
        --bsrange=4k-64k --iodepth=16 --size=24m --offset=128m --offset_increment=24m \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --group_reporting --output="$WORK/fio-multi.txt"
if [ -f "$WORK/fio-multi.txt" ]; then grep -E "READ:|WRITE:" "$WORK/fio-multi.txt" | sed 's/^/    /'; fi
check "the fio jobs each had their own NBD connection" \
    bash -c "[ \$(grep -c 'transmission phase' '$WORK/nbd.log') -ge $((CONNS_BEFORE + 4)) ]"
# The default `--direct-queues 4`: each of those connections ran to
# completion on its own thread and NVMe/TCP queue.
check "those connections were served by the run-to-completion path" \
    bash -c "[ \$(grep -c 'served by the run-to-completion path' '$WORK/nbd.log') -ge 4 ]"

# A second server refusing structured replies (`--structured-replies
# false`, nbdkit's --no-sr): libnbd falls back to simple replies, has no
# block status, and verified I/O still round-trips.
SOCK_SIMPLE=$WORK/nbd-simple.sock
start_nbd "$SOCK_SIMPLE" "$WORK/nbd-simple.log" "sluice nbd --structured-replies false" --structured-replies false
URI_SIMPLE="nbd+unix:///disk?socket=$SOCK_SIMPLE"
check "nbdinfo: simple replies only" bash -c "nbdinfo '$URI_SIMPLE' | grep -q 'using simple packets'"
check "nbdinfo --map refused without structured replies" bash -c "! nbdinfo --map '$URI_SIMPLE' >/dev/null 2>&1"
check "fio randrw crc32c verify over simple replies" \
    fio --name=simple --ioengine=nbd --uri="$URI_SIMPLE" --rw=randrw --bsrange=4k-128k \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --size=32m --offset=256m --iodepth=16 --output="$WORK/fio-simple.txt"

# FUSE: one file, loop device, ext4.
MNT_FUSE=$WORK/fuse
mkdir -p "$MNT_FUSE"
"$SLUICE" fuse --target 127.0.0.1:$PORT --nqn $NQN "$MNT_FUSE" --file-name disk.img --transport fuser >"$WORK/fuse.log" 2>&1 &
FUSE_PID=$!
PIDS+=($FUSE_PID)
if wait_for "[ -f '$MNT_FUSE/disk.img' ]"; then pass "sluice fuse mounted"; else fail "sluice fuse mount"; cat "$WORK/fuse.log"; fi
check "file size is the namespace size" bash -c "[ \$(stat -c %s '$MNT_FUSE/disk.img') = 536870912 ]"
check "nbd data visible through FUSE" bash -c "cmp -i 2097152 -n 1048576 '$WORK/in.raw' '$MNT_FUSE/disk.img'"
ext4_on_loop "$MNT_FUSE/disk.img" fuser
check "SIGTERM unmounts FUSE" bash -c "kill -TERM $FUSE_PID; for i in \$(seq 100); do mountpoint -q '$MNT_FUSE' || exit 0; sleep 0.1; done; exit 1"

# FUSE with a CPU cap (i-NVMe throttle): data still correct, the export is
# throttled, its counters are on --metrics and printed on exit.
MNT_CAP=$WORK/fuse-cap
mkdir -p "$MNT_CAP"
MPORT=$(free_port)
"$SLUICE" fuse --target 127.0.0.1:$PORT --nqn $NQN "$MNT_CAP" --transport fuser --cpu-share 0.05 --metrics 127.0.0.1:$MPORT \
    >"$WORK/fuse-cap.log" 2>&1 &
CAP_PID=$!
PIDS+=($CAP_PID)
if wait_for "[ -f '$MNT_CAP/disk.img' ]"; then pass "sluice fuse --cpu-share 0.05 mounted"; else fail "sluice fuse --cpu-share mount"; cat "$WORK/fuse-cap.log"; fi
check "dd 16 MiB through the capped FUSE file, read back" bash -c \
    "dd if='$WORK/in.raw' of='$MNT_CAP/disk.img' bs=1M seek=256 count=16 conv=notrunc,fsync status=none && \
     dd if='$MNT_CAP/disk.img' bs=1M skip=256 count=16 status=none | cmp - <(head -c 16M '$WORK/in.raw')"
check "capped FUSE export throttled (--metrics)" bash -c \
    "curl -sf http://127.0.0.1:$MPORT/metrics | tee '$WORK/metrics.txt' | \
     grep -E '^sluice_export_throttle_events_total\{export=\"disk.img\",hostnqn=\"[^\"]+\"\} [1-9]'"
if [ -f "$WORK/metrics.txt" ]; then grep -E '^sluice_export_(cpu_seconds|throttle)' "$WORK/metrics.txt" | sed 's/^/    /'; fi
check "SIGTERM prints the capped export's counters" bash -c "kill -TERM $CAP_PID; \
    for i in \$(seq 100); do kill -0 $CAP_PID 2>/dev/null || break; sleep 0.1; done; \
    ! mountpoint -q '$MNT_CAP' && awk '\$1 == \"disk.img\" && \$7 > 0 { ok = 1 } END { exit !ok }' '$WORK/fuse-cap.log'"

# FUSE over io_uring (`--transport uring`, a session of our own): the
# kernel offers it when the fuse module's enable_uring is on (root may turn
# it on). Concurrent verified direct I/O at QD 32, then ext4 on a loop
# device over the file, as above.
MNT_URING=$WORK/fuse-uring
mkdir -p "$MNT_URING"
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_WAS=$(cat "$URING_PARAM" 2>/dev/null || true)
[ -w "$URING_PARAM" ] && echo Y > "$URING_PARAM"
"$SLUICE" fuse --target 127.0.0.1:$PORT --nqn $NQN "$MNT_URING" --transport uring --log info \
    >"$WORK/fuse-uring.log" 2>&1 &
URING_PID=$!
PIDS+=($URING_PID)
if wait_for "[ -f '$MNT_URING/disk.img' ]"; then pass "sluice fuse --transport uring mounted"; else fail "sluice fuse --transport uring mount"; cat "$WORK/fuse-uring.log"; fi
if [ "$(cat "$URING_PARAM" 2>/dev/null)" = Y ]; then
    check "the session runs over io_uring, on its own NVMe/TCP queue" grep -q 'transport=IoUring.*direct_queue=true' "$WORK/fuse-uring.log"
else
    echo "  (this kernel offers no FUSE-over-io_uring: the session serves /dev/fuse)"
fi
check "fio randrw 4k-256k crc32c verify, 2 jobs at iodepth 32, over io_uring" \
    fio --name=uring --filename="$MNT_URING/disk.img" --ioengine=libaio --direct=1 --rw=randrw \
        --bsrange=4k-256k --iodepth=32 --numjobs=2 --size=32m --offset=320m --offset_increment=32m \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 --group_reporting --output="$WORK/fio-uring.txt"
if [ -f "$WORK/fio-uring.txt" ]; then grep -E "READ:|WRITE:" "$WORK/fio-uring.txt" | sed 's/^/    /'; fi
ext4_on_loop "$MNT_URING/disk.img" io_uring
check "SIGTERM unmounts the io_uring FUSE session" bash -c "kill -TERM $URING_PID; for i in \$(seq 100); do mountpoint -q '$MNT_URING' || exit 0; sleep 0.1; done; exit 1"

# The default transport, `auto`: io_uring where root and the kernel offers
# it, else fuser's /dev/fuse session. Both ways, with the module parameter
# set each way (restored on exit). Each mount writes 4 MiB at its own
# place (MiB 460 and 464 of the file, from MiB 40 and 44 of in.raw: bytes
# no earlier check left there) and reads it back; the second also reads
# what the first wrote.
auto_mount() { # $1: Y or N, $2: the transport the log must name, $3: MiB of in.raw to copy
    MNT_AUTO=$WORK/fuse-auto-$1
    mkdir -p "$MNT_AUTO"
    echo "$1" > "$URING_PARAM"
    "$SLUICE" fuse --target 127.0.0.1:$PORT --nqn $NQN "$MNT_AUTO" --log info >"$WORK/fuse-auto-$1.log" 2>&1 &
    local pid=$!
    PIDS+=($pid)
    if wait_for "[ -f '$MNT_AUTO/disk.img' ]"; then pass "sluice fuse (auto, enable_uring=$1) mounted"; else fail "sluice fuse (auto, enable_uring=$1) mount"; cat "$WORK/fuse-auto-$1.log"; fi
    check "auto with enable_uring=$1 chose $2, saying why" grep -q "FUSE transport chosen transport=$2 why=\"auto: " "$WORK/fuse-auto-$1.log"
    check "dd 4 MiB through the auto mount (enable_uring=$1), read back" bash -c \
        "dd if='$WORK/in.raw' of='$MNT_AUTO/disk.img' bs=1M skip=$3 seek=$(($3 + 420)) count=4 oflag=direct conv=notrunc,fsync status=none && \
         cmp <(dd if='$MNT_AUTO/disk.img' bs=1M skip=$(($3 + 420)) count=4 iflag=direct status=none) <(dd if='$WORK/in.raw' bs=1M skip=$3 count=4 status=none)"
    if [ "$1" = N ]; then
        check "the fuser mount reads what the io_uring mount wrote" bash -c \
            "cmp <(dd if='$MNT_AUTO/disk.img' bs=1M skip=460 count=4 iflag=direct status=none) <(dd if='$WORK/in.raw' bs=1M skip=40 count=4 status=none)"
    fi
    check "SIGTERM unmounts the auto mount (enable_uring=$1)" bash -c "kill -TERM $pid; for i in \$(seq 100); do mountpoint -q '$MNT_AUTO' || exit 0; sleep 0.1; done; exit 1"
}
if [ -w "$URING_PARAM" ] && [ "$(id -u)" = 0 ]; then
    auto_mount Y Uring 40
    auto_mount N Fuser 44
else
    echo "  (no writable $URING_PARAM or not root: the auto transport's two ways are not checked here)"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
