#!/usr/bin/env bash
# Soft-RoCE environment for node-ibverbs: run a command with a real RDMA
# device, natively (rdma_rxe / a real NIC) or inside a QEMU guest running
# Debian's kernel with the host root shared over 9p. See docs/softroce.md.
set -euo pipefail

SR_SELF=${BASH_SOURCE[0]}
# modprobe, ip and rdma live in sbin, which an ordinary user's PATH may lack.
SR_CALLER_PATH=$PATH
for _d in /usr/local/sbin /usr/sbin /sbin; do [[ :$PATH: == *:$_d:* ]] || PATH=$PATH:$_d; done
unset _d
SR_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/softroce" && pwd)
# shellcheck source=softroce/common.sh
. "$SR_DIR/common.sh"
# shellcheck source=softroce/provision.sh
. "$SR_DIR/provision.sh"
# shellcheck source=softroce/native.sh
. "$SR_DIR/native.sh"
# shellcheck source=softroce/initramfs.sh
. "$SR_DIR/initramfs.sh"
# shellcheck source=softroce/vm.sh
. "$SR_DIR/vm.sh"

sr_usage() {
  cat <<USAGE
usage: $SR_SELF COMMAND

  provision   install the Debian packages (root; prints the sudo command otherwise)
  run [--mode auto|native|vm] [--topology single|two-host] [--timeout SECONDS]
      [--memory MB] -- CMD [ARGS...]
              run CMD with a real RDMA device; exits with CMD's status
  up          native only: create the nibv0 dummy netdev + rxe_nibv0 (root)
  status      show RDMA devices, ports, state, GIDs, netdev, address
  down        remove nibv0 + rxe_nibv0

exit codes: 201 environment unavailable, 202 guest did not boot / QEMU died,
            203 rxe did not come up, 204 CMD exceeded --timeout, 2 usage
USAGE
}

sr_usage_die() { printf 'softroce: %s (see: %s help)\n' "$1" "$SR_SELF" >&2; exit "$SR_E_USAGE"; }

sr_run() {
  local mode=auto
  SR_TOPOLOGY=single SR_TIMEOUT=3600 SR_MEMORY=""
  while (($#)); do
    case $1 in
      --mode) mode=${2:-}; shift 2 || sr_usage_die "--mode needs a value" ;;
      --mode=*) mode=${1#*=}; shift ;;
      --topology) SR_TOPOLOGY=${2:-}; shift 2 || sr_usage_die "--topology needs a value" ;;
      --topology=*) SR_TOPOLOGY=${1#*=}; shift ;;
      --timeout) SR_TIMEOUT=${2:-}; shift 2 || sr_usage_die "--timeout needs a value" ;;
      --timeout=*) SR_TIMEOUT=${1#*=}; shift ;;
      --memory) SR_MEMORY=${2:-}; shift 2 || sr_usage_die "--memory needs a value" ;;
      --memory=*) SR_MEMORY=${1#*=}; shift ;;
      --) shift; break ;;
      -*) sr_usage_die "run: unknown option '$1' (put the command after --)" ;;
      *) break ;;
    esac
  done
  (($#)) || sr_usage_die "run: no command given after --"
  case $mode in auto|native|vm) ;; *) sr_usage_die "--mode must be auto, native or vm" ;; esac
  case $SR_TOPOLOGY in single|two-host) ;; *) sr_usage_die "--topology must be single or two-host" ;; esac
  [[ $SR_TIMEOUT =~ ^[1-9][0-9]*$ ]] || sr_usage_die "--timeout must be a positive number of seconds"
  [[ -z $SR_MEMORY || $SR_MEMORY =~ ^[1-9][0-9]*$ ]] || sr_usage_die "--memory must be a number of MB"
  SR_CWD=$(pwd)

  if [[ $mode == native ]]; then
    [[ $SR_TOPOLOGY == single ]] ||
      sr_die "$SR_E_ENV" "--mode native supports only --topology single (two-host needs --mode vm)"
    sr_native_possible || sr_die "$SR_E_ENV" "--mode native impossible: $(sr_native_why_not)"
  elif [[ $mode == auto ]]; then
    if [[ $SR_TOPOLOGY == single ]] && sr_native_possible; then mode=native; else mode=vm; fi
  fi
  sr_log "mode $mode, topology $SR_TOPOLOGY"

  local rc=0
  if [[ $mode == native ]]; then
    sr_native_run -- "$@" || rc=$?
  else
    sr_vm_run -- "$@" || rc=$?
  fi
  return "$rc"
}

main() {
  local cmd=${1:-help}
  (($#)) && shift
  trap 'sr_cleanup' EXIT
  trap 'sr_cleanup; trap - INT; kill -INT $$' INT
  trap 'sr_cleanup; exit 143' TERM
  trap 'sr_cleanup; exit 129' HUP
  case $cmd in
    provision) sr_provision "$@" ;;
    run) local rc=0; sr_run "$@" || rc=$?; exit "$rc" ;;
    up)
      sr_native_possible || sr_die "$SR_E_ENV" "cannot set up native RDMA: $(sr_native_why_not); 'run' will use a QEMU guest"
      sr_native_up
      echo "softroce: device $SR_N_DEVICE, netdev ${SR_N_NETDEV:--}, address ${SR_N_ADDR:--}"
      ;;
    status) sr_native_status ;;
    down) sr_native_down ;;
    help|-h|--help) sr_usage ;;
    *) sr_usage >&2; exit "$SR_E_USAGE" ;;
  esac
}

main "$@"
