#!/usr/bin/env bash
# Loads the arm64 prebuild under qemu-user with Debian's arm64 Node.js: the
# binary links and resolves every symbol against arm64 glibc, libstdc++ and
# rdma-core, and the package finds it through node-gyp-build. No RDMA device
# is needed (listDevices() is then []).
#   bash scripts/prebuilds/arm64-smoke.sh [ROOT]   (root; ROOT default /opt/node-ibverbs-arm64)
# Makes ROOT on first use from Debian's arm64 packages (apt-get download +
# dpkg -x: nothing is installed on the host besides qemu-user-static).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${1:-/opt/node-ibverbs-arm64}
prebuild=prebuilds/linux-arm64/node-ibverbs.glibc.node
[[ -f $prebuild ]] || { echo "arm64-smoke: $prebuild is missing (npm run release:prebuilds)" >&2; exit 1; }
command -v qemu-aarch64-static >/dev/null || apt-get install -y -q qemu-user-static

if [[ ! -x $root/usr/bin/node ]]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; apt-get update -q; }
  debs=$(mktemp -d)
  (cd "$debs" && chmod 777 . && apt-get download -q \
    nodejs:arm64 libnode108:arm64 libuv1:arm64 libssl3:arm64 libicu72:arm64 libc-ares2:arm64 \
    libnghttp2-14:arm64 libbrotli1:arm64 zlib1g:arm64 libstdc++6:arm64 libgcc-s1:arm64 libc6:arm64 \
    libibverbs1:arm64 librdmacm1:arm64 libnl-3-200:arm64 libnl-route-3-200:arm64 \
    node-acorn node-cjs-module-lexer node-undici node-busboy)
  mkdir -p "$root"
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$root"; done
  rm -rf "$debs"
fi

# qemu's -L looks up every path in ROOT first: the arm64 loader, libraries
# and Node's externalized builtins come from there, the package from here.
# PREBUILDS_ONLY: skip build/Release (the host's x64 build). LD_BIND_NOW: resolve
# every symbol at load (Node loads addons lazily), so a missing one fails here.
PREBUILDS_ONLY=1 LD_BIND_NOW=1 qemu-aarch64-static -L "$root" "$root/usr/bin/node" -e "
  const path = require('node:path')
  const found = require('node-gyp-build').resolve('.')
  if (path.relative('.', found) !== '$prebuild') throw new Error('node-gyp-build chose ' + found)
  const addon = require(found)
  console.log(JSON.stringify({ arch: process.arch, node: process.version, prebuild: path.relative('.', found),
    devices: addon.listDevices().length, completionWords: addon.completionWords }))
"
