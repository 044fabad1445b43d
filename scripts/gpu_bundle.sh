#!/usr/bin/env bash
# Collects the GPU tests and benchmarks of a build, with the shared libraries they need that a bare
# GPU machine lacks, into .gpu/ (git-ignored), for running where a GPU is lent (see the README's GPU
# section). NCCL itself does not travel: the GPU machine has its own (LD_LIBRARY_PATH).
#   scripts/gpu_bundle.sh [BUILD_DIR]     (default build-test)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-test}
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo /.gpu/ >> "$exclude"
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
bins=(tests/gpu_test tests/gpu_conformance_test tests/device_kernels_test tests/core_test
      bench/tributary-bench bench/tributary-device-kernels-bench tools/tributary-info
      tools/tributary-run)  # tributary-bench --np N relaunches itself under tributary-run
for b in "${bins[@]}"; do
  cp "$build/$b" .gpu/bin/
done
for b in .gpu/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | grep -vE 'libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libcuda\.so|libnccl\.so|libpthread|libdl\.so|librt\.so' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
# libtributary by its soname.
cp -L "$build"/libtributary.so.0 .gpu/lib/
strip --strip-debug .gpu/bin/* .gpu/lib/* 2>/dev/null || true
cp scripts/gpu_run.sh .gpu/
# The sampling profiler for `gpu_run.sh profile` (the GPU machine has no perf).
g++ -O2 -shared -fPIC scripts/host_profile/sampler.cc -o .gpu/sampler.so
du -sh .gpu
