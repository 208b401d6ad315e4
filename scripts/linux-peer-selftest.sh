#!/usr/bin/env bash
# Validate the Linux peer harness end to end, without Sluice:
#   1. guest self-test: kernel nvmet-tcp target in the guest on 127.0.0.1:4420 + the real guest host
#      scripts against it (tests/linux-peer/guest/selftest-nvmet.sh);
#   2. guest-as-target through hostfwd: tests/linux-peer/guest/target-nvmet.sh in the guest, and from
#      this machine an NVMe/TCP ICReq to 127.0.0.1:HPORT that must get an ICResp back, then "stop" on
#      the control port;
#   3. cross (unless --quick): target-nvmet.sh in one guest behind hostfwd, host-suite.sh in a second
#      guest against 10.0.2.2:HPORT (the path a Sluice target on this machine is reached by), both
#      directions 6.1 <-> 6.12, with an allow-list and a denied host.
#
#   scripts/linux-peer-selftest.sh [--kernel 6.1|6.12]... [--base-port N] [--logdir DIR] [--quick]
#   Host ports used: BASE_PORT (default 14420) .. BASE_PORT+81.
#
# Runs scripts/install-linux-peer.sh first unless LINUX_PEER_SKIP_INSTALL=1.
# SELFTEST_NODIGEST_KERNELS (default "6.1 6.12"): kernels on which 1. is repeated without digests
# and with "-i 1".
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
RUN=$SCRIPT_DIR/linux-peer-run.sh
GUEST=$REPO_ROOT/tests/linux-peer/guest

KERNELS=() BASE_PORT=14420 LOGDIR='' QUICK=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --kernel) KERNELS+=("${2:?}"); shift ;;
        --base-port) BASE_PORT=${2:?}; shift ;;
        --logdir) LOGDIR=${2:?}; shift ;;
        --quick) QUICK=1 ;;
        -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "linux-peer-selftest: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[[ ${#KERNELS[@]} -gt 0 ]] || KERNELS=(6.1 6.12)
[[ -n $LOGDIR ]] || LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/linux-peer-selftest.XXXXXX")
mkdir -p "$LOGDIR"

if [[ ${LINUX_PEER_SKIP_INSTALL:-0} != 1 ]]; then
    kargs=()
    for k in "${KERNELS[@]}"; do kargs+=(--kernel "$k"); done
    "$SCRIPT_DIR/install-linux-peer.sh" --no-tshark "${kargs[@]}"
fi

declare -A RESULT
fail_count=0
record() { RESULT[$1]=$2; [[ $2 == PASS* ]] || fail_count=$((fail_count + 1)); echo "== $1: $2"; }

# Send an NVMe/TCP ICReq to 127.0.0.1:$1 and require an ICResp (PDU type 0x01, hlen 128, plen 128).
icreq_check() {
    local port=$1 resp
    resp=$(timeout 20 bash -c '
        exec 3<>/dev/tcp/127.0.0.1/'"$port"' || exit 3
        # ICReq: type 0, flags 0, hlen 128, pdo 0, plen 128 (LE), pfv 0, hpda 0, dgst 0, maxr2t 0
        { printf "\x00\x00\x80\x00\x80\x00\x00\x00"; head -c 120 /dev/zero; } >&3
        head -c 128 <&3 | od -An -tx1 | tr -s " \n" " "
    ') || { echo "ICReq exchange with 127.0.0.1:$port failed"; return 1; }
    echo "ICResp bytes: $resp"
    [[ $resp == " 01 00 80 00 80 00 00 00 "* ]] || { echo "not an ICResp"; return 1; }
}

# Send "stop" to the guest's control port until the run with pid $2 ends (at most ~60 s). One try
# is not enough: slirp refuses the connection while the guest's listener is (re)starting.
send_stop() {  # $1 host control port, $2 pid of the linux-peer-run.sh
    local cport=$1 pid=$2 n
    for n in $(seq 30); do
        kill -0 "$pid" 2>/dev/null || return 0
        printf 'stop\n' 2>/dev/null > "/dev/tcp/127.0.0.1/$cport" || true
        for _ in $(seq 10); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
        [[ $n == 1 ]] || echo "stop to 127.0.0.1:$cport: retry $n"
    done
}

idx=0
for k in "${KERNELS[@]}"; do
    # 1. in-guest self-test
    t0=$(date +%s)
    if "$RUN" --kernel "$k" --script "$GUEST/selftest-nvmet.sh" --timeout 300 --log "$LOGDIR/selftest-$k.log"; then
        record "selftest-nvmet $k" "PASS ($(( $(date +%s) - t0 )) s)"
    else
        record "selftest-nvmet $k" "FAIL (log $LOGDIR/selftest-$k.log)"
    fi

    # 1b. same without digests and with one I/O queue
    if [[ " ${SELFTEST_NODIGEST_KERNELS-6.1 6.12} " == *" $k "* ]]; then
        t0=$(date +%s)
        if "$RUN" --kernel "$k" --script "$GUEST/selftest-nvmet.sh" --timeout 300 \
            --log "$LOGDIR/selftest-nodigest-$k.log" -e SELFTEST_CONNECT_ARGS="-i 1" -e SELFTEST_IO_QUEUES=1; then
            record "selftest-nvmet-nodigest $k" "PASS ($(( $(date +%s) - t0 )) s)"
        else
            record "selftest-nvmet-nodigest $k" "FAIL (log $LOGDIR/selftest-nodigest-$k.log)"
        fi
    fi

    # 2. guest as target through hostfwd
    hport=$((BASE_PORT + idx)) cport=$((BASE_PORT + 79 + idx)); idx=$((idx + 1))
    log=$LOGDIR/target-$k.log
    t0=$(date +%s)
    "$RUN" --kernel "$k" --script "$GUEST/target-nvmet.sh" --timeout 200 --log "$log" \
        --hostfwd "tcp:127.0.0.1:$hport-:4420" --hostfwd "tcp:127.0.0.1:$cport-:4499" \
        -e TARGET_UP_SECONDS=150 -e REQUIRE_STOP=1 &
    run_pid=$!
    ready=0
    for _ in $(seq 600); do
        if grep -aq 'SLUICE-PEER-READY' "$log" 2>/dev/null; then ready=1; break; fi
        kill -0 "$run_pid" 2>/dev/null || break
        sleep 0.2
    done
    ok=0
    if [[ $ready == 1 ]]; then
        echo "target ready after $(( $(date +%s) - t0 )) s: $(grep -ao 'SLUICE-PEER-READY.*' "$log" | tr -d '\r')"
        icreq_check "$hport" && ok=1
        send_stop "$cport" "$run_pid"
    else
        echo "target never printed SLUICE-PEER-READY"
    fi
    if wait "$run_pid" && [[ $ok == 1 ]]; then
        record "target-nvmet+hostfwd $k" "PASS ($(( $(date +%s) - t0 )) s)"
    else
        record "target-nvmet+hostfwd $k" "FAIL (log $log)"
    fi
done

# 3. cross: guest A = kernel target behind hostfwd, guest B = host-suite.sh against 10.0.2.2:HPORT,
#    i.e. exactly the path a Sluice target on this machine is reached by (virtio-net + slirp), and a
#    real Linux host against target-nvmet.sh. Needs two kernels; skipped with --quick.
cross_run() {  # $1 target kernel, $2 host kernel, $3 host port base
    local tk=$1 hk=$2 hport=$3 cport=$(( $3 + 1 )) tlog hlog tpid ready=0 ok=0 t0
    local nqn=nqn.2014-08.org.sluice:cross hnqn=nqn.2014-08.org.nvmexpress:uuid:5c1a1ce0-0000-4000-8000-000000000002
    tlog=$LOGDIR/cross-target-$tk.log hlog=$LOGDIR/cross-host-$hk.log
    t0=$(date +%s)
    "$RUN" --kernel "$tk" --script "$GUEST/target-nvmet.sh" --timeout 290 --log "$tlog" \
        --hostfwd "tcp:127.0.0.1:$hport-:4420" --hostfwd "tcp:127.0.0.1:$cport-:4499" \
        -e SUBNQN=$nqn -e ALLOWED_HOSTNQN=$hnqn -e TARGET_UP_SECONDS=250 -e REQUIRE_STOP=1 \
        -e EXPECT_HOST_CONNECT=1 &
    tpid=$!
    for _ in $(seq 600); do
        if grep -aq 'SLUICE-PEER-READY' "$tlog" 2>/dev/null; then ready=1; break; fi
        kill -0 "$tpid" 2>/dev/null || break
        sleep 0.2
    done
    if [[ $ready == 1 ]] && "$RUN" --kernel "$hk" --script "$GUEST/host-suite.sh" --timeout 240 --log "$hlog" \
        --hostnqn $hnqn --hostid 5c1a1ce0-0000-4000-8000-000000000002 \
        -e SUBNQN=$nqn -e TARGET_PORT="$hport" -e "CONNECT_ARGS=--hdr-digest --data-digest -i 2" \
        -e EXPECT_IO_QUEUES=2 -e EXPECT_NS_BYTES=1073741824 -e DENIED=1; then
        ok=1
    fi
    send_stop "$cport" "$tpid"
    if wait "$tpid" && [[ $ok == 1 ]]; then
        record "cross host $hk -> 10.0.2.2 -> target $tk" "PASS ($(( $(date +%s) - t0 )) s)"
    else
        record "cross host $hk -> 10.0.2.2 -> target $tk" "FAIL (logs $hlog $tlog)"
    fi
}
if [[ $QUICK == 0 && ${#KERNELS[@]} -ge 2 ]]; then
    cross_run "${KERNELS[0]}" "${KERNELS[1]}" $((BASE_PORT + 10))
    cross_run "${KERNELS[1]}" "${KERNELS[0]}" $((BASE_PORT + 20))
fi

echo
for key in "${!RESULT[@]}"; do echo "$key: ${RESULT[$key]}"; done | sort
echo "logs in $LOGDIR"
total=${#RESULT[@]}
echo "$((total - fail_count)) passed, $fail_count failed"
[[ $fail_count == 0 ]]
