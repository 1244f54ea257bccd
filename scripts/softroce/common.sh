# shellcheck shell=bash
# Shared helpers for scripts/softroce.sh (sourced, not executed).

# Exit codes (documented in docs/softroce.md).
readonly SR_E_ENV=201      # environment unavailable (root, packages, kernel, ...)
readonly SR_E_BOOT=202     # guest did not boot in time / QEMU died
readonly SR_E_RXE=203      # rxe device did not come up
readonly SR_E_TIMEOUT=204  # CMD exceeded --timeout
readonly SR_E_USAGE=2      # bad command line

# Debian packages the environment and the project need.
readonly SR_PACKAGES="qemu-system-x86 linux-image-amd64 rdma-core ibverbs-utils libibverbs-dev librdmacm-dev rdmacm-utils perftest busybox-static iproute2 kmod pkg-config etcd-server"

sr_die() { # sr_die CODE MESSAGE...
  local code=$1; shift
  printf 'softroce: %s\n' "$*" >&2
  exit "$code"
}

sr_log() { # progress messages, only with SOFTROCE_VERBOSE=1
  if [[ ${SOFTROCE_VERBOSE:-0} == 1 ]]; then printf 'softroce: %s\n' "$*" >&2; fi
}

sr_is_root() { [[ $(id -u) == 0 ]]; }

sr_now() { date +%s.%N; }
sr_elapsed() { # sr_elapsed START -> seconds since START (float, 1 decimal)
  awk -v s="$1" -v n="$(sr_now)" 'BEGIN{printf "%.1f", n-s}'
}

# Print the ACTIVE RDMA devices of the running kernel, one "dev port" per line.
sr_active_ports() {
  local p dev port
  for p in /sys/class/infiniband/*/ports/*/state; do
    [[ -e $p ]] || continue
    if grep -q ACTIVE "$p" 2>/dev/null; then
      port=${p%/state}; port=${port##*/}
      dev=${p#/sys/class/infiniband/}; dev=${dev%%/*}
      printf '%s %s\n' "$dev" "$port"
    fi
  done
}

# Netdev an RDMA device port is bound to (empty if none, e.g. InfiniBand).
sr_dev_netdev() { # DEV PORT
  local dev=$1 port=${2:-1} nd
  if command -v rdma >/dev/null 2>&1; then
    nd=$(rdma link show "$dev/$port" 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p' | head -n1)
    if [[ -n $nd ]]; then printf '%s\n' "$nd"; return; fi
  fi
  for nd in /sys/class/infiniband/"$dev"/ports/"$port"/gid_attrs/ndevs/*; do
    [[ -r $nd ]] || continue
    nd=$(cat "$nd" 2>/dev/null) || continue
    if [[ -n $nd ]]; then printf '%s\n' "$nd"; return; fi
  done
  for nd in /sys/class/infiniband/"$dev"/device/net/*; do
    [[ -e $nd ]] && { printf '%s\n' "${nd##*/}"; return; }
  done
  return 0
}

# First IPv4 address of a netdev (empty if none).
sr_netdev_addr() {
  [[ -n ${1:-} ]] || return 0
  ip -4 -o addr show dev "$1" 2>/dev/null | awk '{split($4,a,"/"); print a[1]; exit}'
}

# Directories removed and processes killed when the script exits.
SR_CLEANUP_DIRS=()
SR_CLEANUP_PIDS=()
sr_cleanup() {
  local pid d
  for pid in "${SR_CLEANUP_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${SR_CLEANUP_PIDS[@]}"; do
    # bounded wait, then KILL
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  SR_CLEANUP_PIDS=()
  for d in "${SR_CLEANUP_DIRS[@]}"; do rm -rf "$d"; done
  SR_CLEANUP_DIRS=()
}

sr_alive() { # PID: running and not a zombie
  kill -0 "$1" 2>/dev/null || return 1
  local st
  st=$(sed 's/.*) //; s/ .*//' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $st != Z ]]
}
