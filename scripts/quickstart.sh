#!/usr/bin/env bash
# The newcomer's path: installs what is missing, builds tributary in Release, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

build=${TRIBUTARY_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$jobs"

echo
echo "== tributary-info: what this build offers =="
"$build/tools/tributary-info" --replicas 4
echo
echo "== all-reduce across 4 CPU replicas with each in-process backend =="
for spec in reduction_to_one_device hierarchical_copy; do
  "$build/examples/allreduce_demo" --replicas 4 --count $((16 << 20)) --backend "$spec"
  echo
done
