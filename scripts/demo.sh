#!/usr/bin/env bash
# The main job in one command, on a fresh Linux machine: install what is
# missing (Debian packages as root, npm packages), build, and move verified
# data over real RDMA with examples/two-queue-pairs.mjs. Uses a real NIC or
# Soft-RoCE natively when the kernel has it, else a QEMU guest (see
# docs/softroce.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -eq 0 ]]; then
  bash scripts/softroce.sh provision
elif ! bash scripts/softroce.sh provision; then
  echo "demo: install the packages above first (sudo bash scripts/softroce.sh provision), then run this again" >&2
  exit 1
fi
[[ -d node_modules ]] || npm ci
[[ -f build/Release/node_ibverbs.node ]] || npm run build:native
[[ -f dist/index.js ]] || npm run build:ts

exec bash scripts/softroce.sh run -- node examples/two-queue-pairs.mjs
