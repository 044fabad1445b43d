#!/usr/bin/env bash
# The newcomer's path: installs what is missing, builds tributary in Release, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
. scripts/ccache_env.sh

build=${TRIBUTARY_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIBUTARY_WERROR=OFF >/dev/null
# Only what the main job runs (the library, the bench and the launcher it starts ranks with), and
# the tools the README's next steps use (info, tune): the first table appears minutes sooner;
# scripts/test.sh builds the rest.
cmake --build "$build" -j "$jobs" --target tributary-bench tributary-tune tributary-run tributary-info

out=${TRIBUTARY_OUT_DIR:-out}
mkdir -p "$out"
echo
echo "== tributary-bench: all-reduce across 4 CPU replicas, every in-process backend and the yardstick (a plain threaded sum), one run =="
"$build/bench/tributary-bench" -t 4 -b 8 -e 64M --ceiling \
  -J "$out/allreduce.json" --csv "$out/allreduce.csv" --plot "$out/allreduce.png"
echo
echo "== tributary-bench: all-reduce across 2 local processes: ring (shared memory), ring:intra_host=net (TCP loopback), ucx, gloo, and Gloo called directly =="
"$build/bench/tributary-bench" --np 2 -t 1 -b 8 -e 64M --ceiling \
  -J "$out/allreduce_np2.json" --csv "$out/allreduce_np2.csv" --plot "$out/allreduce_np2.png"
echo
echo "== tributary-bench: the same 2 processes, ring on buffers from Buffer::allocate_shareable, registered on every rank (-R 2: shared memory's direct path, no copies) =="
"$build/bench/tributary-bench" --np 2 -t 1 -b 8 -e 64M -R 2 --backend ring \
  -J "$out/allreduce_np2_shareable.json" --csv "$out/allreduce_np2_shareable.csv" \
  --plot "$out/allreduce_np2_shareable.png"
echo
echo "Tables above; figures in $out/allreduce*.json and .csv; the plots are $out/allreduce.png"
echo "(in-process replicas), $out/allreduce_np2.png (2 processes) and"
echo "$out/allreduce_np2_shareable.png (2 processes, registered shareable buffers)."
echo "Compare other backends or options with --backend SPEC (repeatable); see '$build/tools/tributary-info'."
