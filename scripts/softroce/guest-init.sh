#!/bin/sh
# /init of the softroce initramfs (busybox sh, PID 1 in the QEMU guest).
# Mounts the host root (9p, read-only) under a tmpfs overlay, mounts the
# per-run transfer share (9p, read-write) at /.softroce, and chroots into the
# host's userland to run guest-setup.sh from the transfer share.
/bin/busybox mkdir -p /proc /sys /dev
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo 0 >/proc/sys/kernel/printk 2>/dev/null

fail() {
  echo "softroce-guest: $*"
  echo "softroce-guest: FATAL $*" >/dev/kmsg 2>/dev/null
  echo o >/proc/sysrq-trigger
  sleep 10
}

while read -r m; do
  insmod "/modules/$m" || fail "insmod $m failed"
done </modules/order

opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts" xfer /xfer || fail "mount of the xfer 9p share failed"
mount -t 9p -o "$opts,ro" hostroot /lower || fail "mount of the host root 9p share failed"
mount -t tmpfs -o mode=755 tmpfs /rw || fail "tmpfs failed"
mkdir -p /rw/upper /rw/work
if ! mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot; then
  fail "overlay mount on the 9p host root failed"
fi
mkdir -p /newroot/.softroce /newroot/proc /newroot/sys /newroot/dev
mount --move /xfer /newroot/.softroce
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
echo "softroce-guest: ready"
: >/newroot/.softroce/ready
exec chroot /newroot /bin/bash /.softroce/guest-setup.sh
fail "chroot to the host root failed (no /bin/bash on the host?)"
