#!/bin/bash
# Runs as PID 1 inside the QEMU guest, chrooted into the (overlaid) host root.
# /.softroce is the per-run transfer share: config.sh and cmd.sh come in,
# rxe-ok / rxe-error / status go out. Always ends by powering the guest off.
set -u
X=/.softroce
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

poweroff_now() {
  sync
  echo o >/proc/sysrq-trigger
  sleep 30
}
rxe_fail() {
  echo "softroce-guest: $*"
  printf '%s\n' "$*" >"$X/rxe-error"
  poweroff_now
}

mark() { read -r up _ </proc/uptime; printf '%s %s\n' "$up" "$*" >>"$X/timing"; }
mark chroot
# shellcheck source=/dev/null
. "$X/config.sh"   # SR_TOPOLOGY SR_HOST_INDEX SR_NETDEV SR_ADDR SR_ADDR6 SR_PEER_ADDR SR_DEVICE (two-host: SR_R1_*, the second rail)

mkdir -p /tmp /dev/shm /dev/pts /run
# No tmpfs on /tmp: the overlay already makes it writable (and throwaway), and
# a checkout under the host's /tmp (a CI clone, say) must stay visible.
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts 2>/dev/null
[[ -e /dev/ptmx ]] || ln -s pts/ptmx /dev/ptmx
[[ -e /dev/fd ]] || ln -s /proc/self/fd /dev/fd
hostname "softroce-host${SR_HOST_INDEX:-0}" 2>/dev/null
ip link set lo up

# Output channels: virtio serial ports named stdout/stderr (no tty, no CRs).
mark mounts
[[ -d /sys/module/virtio_console ]] || modprobe virtio_console || rxe_fail "modprobe virtio_console failed"
out=/dev/console err=/dev/console
for _ in $(seq 1 100); do
  for p in /sys/class/virtio-ports/*; do
    [[ -r $p/name ]] || continue
    case $(cat "$p/name") in
      stdout) out=/dev/${p##*/} ;;
      stderr) err=/dev/${p##*/} ;;
    esac
  done
  [[ $out != /dev/console && $err != /dev/console && -c $out && -c $err ]] && break
  sleep 0.1
done

mark vports
msg=$(modprobe -a rdma_rxe rdma_ucm ib_uverbs 2>&1) || rxe_fail "modprobe rdma_rxe rdma_ucm ib_uverbs failed: $msg"
if [[ $SR_TOPOLOGY == two-host ]]; then
  [[ -d /sys/module/virtio_net ]] || msg=$(modprobe virtio_net 2>&1) || rxe_fail "modprobe virtio_net failed: $msg"
  for _ in $(seq 1 50); do [[ -e /sys/class/net/$SR_NETDEV ]] && break; sleep 0.1; done
  # The second wire's NIC, found by its MAC (not by probe order) and named for its rail.
  r1=
  for _ in $(seq 1 50); do
    for n in /sys/class/net/*; do
      [[ $(cat "$n/address" 2>/dev/null) == "$SR_R1_MAC" ]] && r1=${n##*/}
    done
    [[ -n $r1 ]] && break
    sleep 0.1
  done
  [[ -n $r1 ]] || rxe_fail "no NIC with MAC $SR_R1_MAC (the second wire)"
  if [[ $r1 != "$SR_R1_NETDEV" ]]; then
    msg=$(ip link set dev "$r1" name "$SR_R1_NETDEV" 2>&1) || rxe_fail "ip link set dev $r1 name $SR_R1_NETDEV failed: $msg"
  fi
else
  ip link add "$SR_NETDEV" type dummy || rxe_fail "ip link add $SR_NETDEV type dummy failed"
fi

# One rail: addresses on NETDEV, then an rxe DEVICE on it, ACTIVE.
rail_up() { # NETDEV ADDR ADDR6 DEVICE
  local netdev=$1 addr=$2 addr6=$3 device=$4 msg active=
  ip addr add "$addr/24" dev "$netdev" || rxe_fail "ip addr add $addr/24 dev $netdev failed"
  # An IPv6 address too (unique local, no DAD delay): rdma_cm works over both.
  ip -6 addr add "$addr6/64" dev "$netdev" nodad || rxe_fail "ip -6 addr add $addr6/64 dev $netdev failed"
  ip link set "$netdev" up || rxe_fail "ip link set $netdev up failed"
  mark "netdev $netdev"
  msg=$(rdma link add "$device" type rxe netdev "$netdev" 2>&1) ||
    rxe_fail "rdma link add $device type rxe netdev $netdev failed: $msg"
  for _ in $(seq 1 200); do
    if grep -q ACTIVE "/sys/class/infiniband/$device/ports/1/state" 2>/dev/null; then active=1; break; fi
    sleep 0.1
  done
  [[ -n $active ]] || rxe_fail "port 1 of $device not ACTIVE within 20 s (state: $(cat "/sys/class/infiniband/$device/ports/1/state" 2>&1))"
  mark "active $device"
}
rail_up "$SR_NETDEV" "$SR_ADDR" "$SR_ADDR6" "$SR_DEVICE"
[[ $SR_TOPOLOGY == two-host ]] && rail_up "$SR_R1_NETDEV" "$SR_R1_ADDR" "$SR_R1_ADDR6" "$SR_R1_DEVICE"
: >"$X/rxe-ok"

if [[ $SR_TOPOLOGY == two-host ]]; then
  # Barrier: the host writes "go" once both guests have rxe up.
  until [[ -e $X/go ]]; do sleep 0.1; done
  # bounded wait until the peer answers on the wire (the host also bounds us)
  if command -v ping >/dev/null 2>&1; then pingc=(ping); else pingc=(busybox ping); fi
  for _ in $(seq 1 30); do "${pingc[@]}" -c1 -W1 "$SR_PEER_ADDR" >/dev/null 2>&1 && break; sleep 0.1; done
  for _ in $(seq 1 30); do "${pingc[@]}" -c1 -W1 "$SR_R1_PEER_ADDR" >/dev/null 2>&1 && break; sleep 0.1; done
fi

: >"$X/started"
bash "$X/cmd.sh" </dev/null >"$out" 2>"$err"
rc=$?
mark cmd-done
printf '%s\n' "$rc" >"$X/status.tmp" && mv "$X/status.tmp" "$X/status"
poweroff_now
