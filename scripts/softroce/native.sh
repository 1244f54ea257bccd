# shellcheck shell=bash
# Native mode: the running kernel has RDMA (a real NIC, or rdma_rxe).

readonly SR_NATIVE_NETDEV=nibv0
readonly SR_NATIVE_RXE=rxe_nibv0
readonly SR_NATIVE_ADDR=198.18.0.1
readonly SR_NATIVE_ADDR6=fd00:198:18::1

# Can the running kernel give us an RDMA device? (ACTIVE port, or rxe loadable)
sr_native_possible() {
  [[ -n $(sr_active_ports) ]] && return 0
  sr_is_root || return 1
  command -v rdma >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 || return 1
  modprobe rdma_rxe >/dev/null 2>&1
}

sr_native_why_not() {
  if [[ ! -d /sys/class/infiniband ]] && ! sr_is_root; then
    echo "no RDMA device and not root (rdma_rxe needs root: sudo $SR_SELF up)"
  elif ! command -v rdma >/dev/null 2>&1; then
    echo "the rdma tool is missing (run: sudo $SR_SELF provision)"
  else
    echo "the running kernel $(uname -r) has no ACTIVE RDMA device and 'modprobe rdma_rxe' fails (use --mode vm)"
  fi
}

# Sets SR_N_DEVICE SR_N_NETDEV SR_N_ADDR, creating nibv0 + rxe_nibv0 if needed.
sr_native_up() {
  local first dev port
  first=$(sr_active_ports | head -n1)
  if [[ -n $first ]]; then
    # prefer our own device if it exists, else the first ACTIVE one
    if sr_active_ports | grep -q "^$SR_NATIVE_RXE "; then first="$SR_NATIVE_RXE 1"; fi
    dev=${first% *}; port=${first#* }
    SR_N_DEVICE=$dev
    SR_N_NETDEV=$(sr_dev_netdev "$dev" "$port")
    SR_N_ADDR=$(sr_netdev_addr "$SR_N_NETDEV")
    SR_N_ADDR6=
    [[ $dev == "$SR_NATIVE_RXE" ]] && SR_N_ADDR6=$SR_NATIVE_ADDR6
    return 0
  fi
  sr_is_root || sr_die "$SR_E_ENV" "no ACTIVE RDMA device; creating rxe needs root: sudo $SR_SELF up"
  command -v rdma >/dev/null 2>&1 || sr_die "$SR_E_ENV" "the rdma tool is missing; run: sudo $SR_SELF provision"
  modprobe rdma_rxe 2>/dev/null ||
    sr_die "$SR_E_ENV" "modprobe rdma_rxe failed: kernel $(uname -r) has no Soft-RoCE; use '$SR_SELF run --mode vm'"
  modprobe -a rdma_ucm ib_uverbs 2>/dev/null || true
  if [[ ! -e /sys/class/net/$SR_NATIVE_NETDEV ]]; then
    ip link add "$SR_NATIVE_NETDEV" type dummy ||
      sr_die "$SR_E_RXE" "ip link add $SR_NATIVE_NETDEV type dummy failed (is the dummy module available?)"
  fi
  ip -4 -o addr show dev "$SR_NATIVE_NETDEV" | grep -q " $SR_NATIVE_ADDR/" ||
    ip addr add "$SR_NATIVE_ADDR/24" dev "$SR_NATIVE_NETDEV" ||
    sr_die "$SR_E_RXE" "ip addr add $SR_NATIVE_ADDR/24 dev $SR_NATIVE_NETDEV failed"
  ip -6 -o addr show dev "$SR_NATIVE_NETDEV" | grep -q " $SR_NATIVE_ADDR6/" ||
    ip -6 addr add "$SR_NATIVE_ADDR6/64" dev "$SR_NATIVE_NETDEV" nodad ||
    sr_die "$SR_E_RXE" "ip -6 addr add $SR_NATIVE_ADDR6/64 dev $SR_NATIVE_NETDEV failed"
  ip link set "$SR_NATIVE_NETDEV" up || sr_die "$SR_E_RXE" "ip link set $SR_NATIVE_NETDEV up failed"
  if [[ ! -e /sys/class/infiniband/$SR_NATIVE_RXE ]]; then
    local msg
    msg=$(rdma link add "$SR_NATIVE_RXE" type rxe netdev "$SR_NATIVE_NETDEV" 2>&1) ||
      sr_die "$SR_E_RXE" "rdma link add $SR_NATIVE_RXE type rxe netdev $SR_NATIVE_NETDEV failed: $msg"
  fi
  local _i
  for ((_i = 0; _i < 200; _i++)); do
    grep -q ACTIVE "/sys/class/infiniband/$SR_NATIVE_RXE/ports/1/state" 2>/dev/null && break
    sleep 0.1
  done
  grep -q ACTIVE "/sys/class/infiniband/$SR_NATIVE_RXE/ports/1/state" 2>/dev/null ||
    sr_die "$SR_E_RXE" "port 1 of $SR_NATIVE_RXE not ACTIVE within 20 s; try: $SR_SELF down && $SR_SELF up"
  SR_N_DEVICE=$SR_NATIVE_RXE SR_N_NETDEV=$SR_NATIVE_NETDEV SR_N_ADDR=$SR_NATIVE_ADDR SR_N_ADDR6=$SR_NATIVE_ADDR6
}

sr_native_down() {
  local did=""
  if [[ -e /sys/class/infiniband/$SR_NATIVE_RXE || -e /sys/class/net/$SR_NATIVE_NETDEV ]]; then
    sr_is_root || sr_die "$SR_E_ENV" "removing $SR_NATIVE_RXE/$SR_NATIVE_NETDEV needs root: sudo $SR_SELF down"
  fi
  if [[ -e /sys/class/infiniband/$SR_NATIVE_RXE ]]; then
    rdma link delete "$SR_NATIVE_RXE" || sr_die "$SR_E_RXE" "rdma link delete $SR_NATIVE_RXE failed"
    did+=" $SR_NATIVE_RXE"
  fi
  if [[ -e /sys/class/net/$SR_NATIVE_NETDEV ]]; then
    ip link delete "$SR_NATIVE_NETDEV" || sr_die "$SR_E_RXE" "ip link delete $SR_NATIVE_NETDEV failed"
    did+=" $SR_NATIVE_NETDEV"
  fi
  if [[ -n $did ]]; then echo "softroce: removed$did"; else echo "softroce: nothing to remove"; fi
}

sr_native_status() {
  local d p dev port any="" nd addr
  for d in /sys/class/infiniband/*; do
    [[ -e $d ]] || continue
    any=1; dev=${d##*/}
    for p in "$d"/ports/*; do
      [[ -e $p ]] || continue
      port=${p##*/}
      nd=$(sr_dev_netdev "$dev" "$port"); addr=$(sr_netdev_addr "$nd")
      printf '%s port %s: state %s, link layer %s, netdev %s, address %s\n' "$dev" "$port" \
        "$(cut -d' ' -f2- "$p/state" 2>/dev/null)" "$(cat "$p/link_layer" 2>/dev/null)" "${nd:--}" "${addr:--}"
      local g gid
      for g in "$p"/gids/*; do
        [[ -r $g ]] || continue
        gid=$(cat "$g" 2>/dev/null) || continue
        [[ $gid == 0000:0000:0000:0000:0000:0000:0000:0000 ]] && continue
        printf '  gid %s %s (%s)\n' "${g##*/}" "$gid" "$(cat "$p/gid_attrs/types/${g##*/}" 2>/dev/null)"
      done
    done
  done
  [[ -n $any ]] || echo "no RDMA device; 'run' will use a QEMU guest"
}

sr_native_run() { # -- CMD...
  shift
  sr_native_up
  export SOFTROCE_MODE=native SOFTROCE_TOPOLOGY=single SOFTROCE_DEVICE=$SR_N_DEVICE
  export SOFTROCE_NETDEV=$SR_N_NETDEV SOFTROCE_ADDR=$SR_N_ADDR
  unset SOFTROCE_HOST_INDEX SOFTROCE_PEER_ADDR SOFTROCE_ADDR6
  [[ -z ${SR_N_ADDR6:-} ]] || export SOFTROCE_ADDR6=$SR_N_ADDR6
  local pid rc=0 t0 el
  t0=$(date +%s)
  "$@" <&0 &
  pid=$!
  SR_CLEANUP_PIDS+=("$pid")
  while sr_alive "$pid"; do
    el=$(( $(date +%s) - t0 ))
    if ((el >= SR_TIMEOUT)); then
      sr_cleanup
      sr_die "$SR_E_TIMEOUT" "CMD exceeded --timeout $SR_TIMEOUT s and was killed"
    fi
    sleep 0.2
  done
  wait "$pid" || rc=$?
  SR_CLEANUP_PIDS=()
  return "$rc"
}
