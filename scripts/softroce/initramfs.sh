# shellcheck shell=bash
# Guest kernel discovery and the tiny initramfs (static busybox + modules).

# Modules the initramfs loads: 9p over virtio-pci for the host root, overlay,
# and the virtio serial (output) and net (two-host wire) drivers. Loading them
# here is faster than modprobe over 9p. Everything else is modprobe'd from
# the host's /lib/modules/<ver>, seen through 9p.
readonly SR_INITRAMFS_MODULES="virtio_pci 9pnet_virtio 9p overlay virtio_console virtio_net"

# Sets SR_KVER and SR_KERNEL: the newest /boot/vmlinuz-* whose modules exist.
sr_select_kernel() {
  local k v best=""
  for k in /boot/vmlinuz-*; do
    [[ -r $k ]] || continue
    v=${k#/boot/vmlinuz-}
    [[ -d /lib/modules/$v/kernel && -e /lib/modules/$v/modules.dep ]] || continue
    best+="$v"$'\n'
  done
  if ! compgen -G '/boot/vmlinuz-*' >/dev/null; then
    sr_die "$SR_E_ENV" "no kernel image in /boot; run: sudo $SR_SELF provision (installs linux-image-amd64)"
  fi
  [[ -n $best ]] ||
    sr_die "$SR_E_ENV" "no readable /boot/vmlinuz-* with a matching /lib/modules/<version>; run: sudo $SR_SELF provision (linux-image-amd64), and make /boot/vmlinuz-* readable"
  SR_KVER=$(printf '%s' "$best" | sort -V | tail -n1)
  SR_KERNEL=/boot/vmlinuz-$SR_KVER
}

# Prints the insmod order (absolute .ko paths, deduplicated) for the modules.
sr_module_order() { # KVER MODULE...
  local kver=$1; shift
  local m out
  for m in "$@"; do
    out=$(modprobe -S "$kver" --show-depends "$m" 2>&1) ||
      sr_die "$SR_E_ENV" "modprobe -S $kver --show-depends $m failed: $out; run: sudo $SR_SELF provision"
    printf '%s\n' "$out"
  done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}

sr_cache_dir() {
  local base=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
  if ! mkdir -p "$base/node-ibverbs" 2>/dev/null || [[ ! -w $base/node-ibverbs ]]; then
    base=${TMPDIR:-/tmp}/node-ibverbs-cache-$(id -u)
    mkdir -p "$base/node-ibverbs"
  fi
  printf '%s\n' "$base/node-ibverbs"
}

# Sets SR_INITRD to a cached (or freshly built) initramfs for $SR_KVER.
sr_initramfs() {
  local busybox
  busybox=$(command -v busybox || true)
  [[ -n $busybox ]] || sr_die "$SR_E_ENV" "busybox not found; run: sudo $SR_SELF provision (installs busybox-static)"
  # The initramfs has no libc: busybox must be static.
  if LC_ALL=C ldd "$busybox" 2>&1 | grep -q '=>'; then
    sr_die "$SR_E_ENV" "$busybox is dynamically linked; install busybox-static: sudo $SR_SELF provision"
  fi
  local hash cache
  hash=$(cat "$SR_DIR/initramfs.sh" "$SR_DIR/guest-init.sh" "$busybox" | sha256sum | cut -c1-16)
  cache=$(sr_cache_dir)
  SR_INITRD=$cache/initramfs-$SR_KVER-$hash.cpio.gz
  [[ -s $SR_INITRD ]] && return 0

  local t0 work ko out name
  t0=$(sr_now)
  work=$(mktemp -d "${TMPDIR:-/tmp}/softroce-initramfs.XXXXXX")
  SR_CLEANUP_DIRS+=("$work")
  mkdir -p "$work"/{bin,dev,proc,sys,lower,rw,newroot,xfer,modules}
  cp "$busybox" "$work/bin/busybox"
  ln -s busybox "$work/bin/sh"
  cp "$SR_DIR/guest-init.sh" "$work/init"
  chmod 755 "$work/init" "$work/bin/busybox"
  # shellcheck disable=SC2086
  for ko in $(sr_module_order "$SR_KVER" $SR_INITRAMFS_MODULES); do
    name=${ko##*/}
    case $name in
      *.ko)     out=$name; cp "$ko" "$work/modules/$out" ;;
      *.ko.xz)  out=${name%.xz};  xz -dc "$ko" >"$work/modules/$out" 2>/dev/null || busybox xzcat "$ko" >"$work/modules/$out" ;;
      *.ko.gz)  out=${name%.gz};  gzip -dc "$ko" >"$work/modules/$out" ;;
      *.ko.zst) out=${name%.zst}
                command -v zstd >/dev/null || sr_die "$SR_E_ENV" "kernel modules are .ko.zst but zstd is missing; run: sudo apt-get install zstd"
                zstd -qdc "$ko" >"$work/modules/$out" ;;
      *) sr_die "$SR_E_ENV" "unexpected module file $ko" ;;
    esac
    printf '%s\n' "$out" >>"$work/modules/order"
  done
  (cd "$work" && find . -mindepth 1 | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 2>/dev/null) |
    gzip -1 >"$SR_INITRD.tmp.$$"
  mv -f "$SR_INITRD.tmp.$$" "$SR_INITRD"
  rm -rf "$work"
  # drop initramfs images built by older versions of these scripts
  local old
  for old in "$cache"/initramfs-*.cpio.gz; do
    [[ $old == "$SR_INITRD" ]] || rm -f "$old"
  done
  sr_log "built $SR_INITRD in $(sr_elapsed "$t0") s"
}
