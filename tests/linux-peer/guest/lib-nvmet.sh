# Configure the in-guest kernel NVMe/TCP target (nvmet-tcp) on a memory-backed null_blk device.
# Sourced from /guest/lib.sh users.
#
# nvmet_setup SUBNQN ADDR PORT NS_MB [ALLOWED_HOSTNQN]
#   ADDR is the listen address (127.0.0.1 or 0.0.0.0); empty ALLOWED_HOSTNQN = allow any host.
#   Sets NVMET_BLKDEV to the backing device.

NVMET=/sys/kernel/config/nvmet

nvmet_setup() {
    _nqn=$1 _addr=$2 _port=$3 _mb=$4 _host=${5:-}
    run modprobe nvmet
    run modprobe nvmet-tcp
    # nr_devices=0: no default (non memory-backed) device; we create one through configfs
    if [ ! -d /sys/module/null_blk ]; then
        run modprobe null_blk nr_devices=0
    fi
    [ -d /sys/kernel/config/nullb ] || fail "null_blk configfs (/sys/kernel/config/nullb) missing"
    _nb=/sys/kernel/config/nullb/sluice$_port
    run mkdir "$_nb"
    echo "$_mb" > "$_nb/size" || fail "null_blk size"
    echo 512 > "$_nb/blocksize" || fail "null_blk blocksize"
    echo 1 > "$_nb/memory_backed" || fail "null_blk memory_backed"
    echo 1 > "$_nb/power" || fail "null_blk power on"
    # recent kernels name the disk after the configfs item, older ones nullb<index>
    i=0
    while [ $i -lt 50 ]; do
        for NVMET_BLKDEV in /dev/$(basename "$_nb") /dev/nullb$(cat "$_nb/index"); do
            [ -b "$NVMET_BLKDEV" ] && break 2
        done
        sleep 0.1; i=$((i + 1))
    done
    [ -b "$NVMET_BLKDEV" ] || fail "$NVMET_BLKDEV did not appear"
    info "backing device $NVMET_BLKDEV ($_mb MiB, memory backed)"

    _s=$NVMET/subsystems/$_nqn
    run mkdir "$_s"
    if [ -n "$_host" ]; then
        echo 0 > "$_s/attr_allow_any_host"
        [ -d "$NVMET/hosts/$_host" ] || run mkdir "$NVMET/hosts/$_host"
        run ln -s "$NVMET/hosts/$_host" "$_s/allowed_hosts/$_host"
        info "allowed host: $_host"
        # DH-HMAC-CHAP (kernels with NVME_TARGET_AUTH): the host must
        # authenticate with DHCHAP_KEY; DHCHAP_CTRL_KEY lets it make the
        # target prove itself.
        if [ -n "${DHCHAP_KEY:-}" ]; then
            _h=$NVMET/hosts/$_host
            [ -e "$_h/dhchap_key" ] || fail "this kernel's nvmet has no DH-HMAC-CHAP (no $_h/dhchap_key)"
            printf %s "$DHCHAP_KEY" > "$_h/dhchap_key" || fail "writing dhchap_key"
            if [ -n "${DHCHAP_CTRL_KEY:-}" ]; then
                printf %s "$DHCHAP_CTRL_KEY" > "$_h/dhchap_ctrl_key" || fail "writing dhchap_ctrl_key"
            fi
            if [ -n "${DHCHAP_HASH:-}" ]; then
                echo "$DHCHAP_HASH" > "$_h/dhchap_hash" || fail "writing dhchap_hash"
            fi
            if [ -n "${DHCHAP_DHGROUP:-}" ]; then
                echo "$DHCHAP_DHGROUP" > "$_h/dhchap_dhgroup" || fail "writing dhchap_dhgroup"
            fi
            info "DH-HMAC-CHAP required of $_host (hash $(cat "$_h/dhchap_hash"), group $(cat "$_h/dhchap_dhgroup"))"
        fi
    else
        echo 1 > "$_s/attr_allow_any_host"
        info "any host allowed"
    fi
    run mkdir "$_s/namespaces/1"
    printf %s "$NVMET_BLKDEV" > "$_s/namespaces/1/device_path" || fail "namespace device_path"
    echo 1 > "$_s/namespaces/1/enable" || fail "namespace enable"

    _p=$NVMET/ports/$_port
    run mkdir "$_p"
    echo tcp > "$_p/addr_trtype"
    echo ipv4 > "$_p/addr_adrfam"
    echo "$_addr" > "$_p/addr_traddr"
    echo "$_port" > "$_p/addr_trsvcid"
    run ln -s "$_s" "$_p/subsystems/$_nqn"
    dmesg | grep -i 'nvmet_tcp: enabling port' | tail -n1 | sed 's/^/  dmesg: /' || true
    info "nvmet: $_nqn on tcp $_addr:$_port"
}
