#!/bin/bash
# Saves the working tree's library (lib/ compiled) and its addon as a variant
# that `npm run bench -- icount --variants bench/results/variants/NAME,...`
# counts in the same boot as the others (its rows labelled [NAME]).
#   bash bench/icount/snapshot.sh NAME    (after npm run build)
set -euo pipefail
name=${1:?usage: snapshot.sh NAME}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/bench/results/variants/$name
rm -rf "$out"
mkdir -p "$out"
(cd "$root" && npx tsc -p tsconfig.json --outDir "$out/dist" --declaration false --sourceMap false)
cp "$root/build/Release/node_ibverbs.node" "$out/"
echo "$out"
