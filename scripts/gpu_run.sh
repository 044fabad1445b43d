#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, after scripts/gpu_bundle.sh here: the GPU tests
# and benchmarks, logs under $OUT (or ./gpu-logs).
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
nccl_lib=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/.gpu/lib:$nccl_lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L | tee "$out/smi.txt"
.gpu/bin/tributary-info --devices GPU:0 > "$out/info.txt" 2>&1; head -20 "$out/info.txt"
what=${1:-all}
if [[ $what == nccl ]]; then
  timeout 150 .gpu/bin/gpu_conformance_test --gtest_brief=1 --gtest_filter='NcclGpu/*_r1' 2>&1 |
    tail -40 | tee "$out/gpu_conformance_nccl.txt"
fi
if [[ $what == all || $what == tests ]]; then
  .gpu/bin/device_kernels_test --gtest_brief=1 2>&1 | tail -40 | tee "$out/device_kernels_test.txt"
  .gpu/bin/gpu_test --gtest_filter='-*MultiProcessConformance*' 2>&1 | tail -60 | tee "$out/gpu_test.txt"
  # nccl across processes (one GPU per rank): the cases that fit the visible GPUs run, the others
  # skip saying how many they need. Its own run: CUDA must not be initialised before the fork.
  timeout 300 .gpu/bin/gpu_test --gtest_brief=1 --gtest_filter='Nccl/*MultiProcessConformance*' 2>&1 |
    tail -40 | tee "$out/nccl_multiprocess_conformance.txt"
  # ring, gloo and ucx on GPU tensors staged through pinned host memory: processes share the GPU, and
  # two virtual GPUs per process give the two-replica cases.
  TRIBUTARY_VIRTUAL_GPUS=2 timeout 400 .gpu/bin/gpu_test --gtest_brief=1 \
    --gtest_filter='*Staged*' 2>&1 | tail -40 | tee "$out/staged_conformance.txt"
  TRIBUTARY_VIRTUAL_GPUS=2 .gpu/bin/gpu_test --gtest_filter='*Virtual*' 2>&1 | tail -8 | tee -a "$out/gpu_test.txt"
  # NCCL: one GPU is one rank (world size 1, one replica); the in-process backends get 8 virtual GPUs.
  timeout 150 .gpu/bin/gpu_conformance_test --gtest_brief=1 --gtest_filter='NcclGpu/*_r1' 2>&1 |
    tail -40 | tee "$out/gpu_conformance_nccl.txt"
  TRIBUTARY_VIRTUAL_GPUS=8 timeout 150 .gpu/bin/gpu_conformance_test --gtest_brief=1 \
    --gtest_filter='*n1001_*:*n7_*-NcclGpu/*' 2>&1 | tail -40 | tee "$out/gpu_conformance_in_process.txt"
fi
if [[ $what == all || $what == bench || $what == nccl ]]; then
  .gpu/bin/tributary-device-kernels-bench 2>&1 | tee "$out/device_kernels_bench.txt"
  timeout 120 .gpu/bin/tributary-bench -g 1 -b 1M -e 1G -f 4 -n 50 -w 10 \
      --json "$out/bench_g1.json" 2>&1 | tee "$out/bench_g1.txt"
fi
if [[ $what == all || $what == bench ]]; then
  # The host backends on GPU tensors (staged through pinned host memory), two ranks sharing GPU:0,
  # beside the same backends on host buffers; --ceiling states the GPU's copy bandwidth.
  timeout 150 .gpu/bin/tributary-bench --np 2 -g 1 --ceiling --backend ring --backend gloo \
      --backend ucx -b 64K -e 256M -f 4 --time-per-size 200ms \
      --json "$out/bench_staged_np2.json" 2>&1 | tee "$out/bench_staged_np2.txt"
  timeout 150 .gpu/bin/tributary-bench --np 2 --backend ring --backend gloo --backend ucx \
      -b 64K -e 256M -f 4 --time-per-size 200ms 2>&1 | tee "$out/bench_host_np2.txt"
fi
