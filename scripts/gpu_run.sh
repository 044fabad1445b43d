#!/usr/bin/env bash
# Runs on the GPU machine, in the repository root, after scripts/gpu_bundle.sh here: the GPU
# benchmarks (first, on a quiet machine), then the GPU tests (several at once: the machine has many
# cores). Every step has its own time limit, so one hang cannot eat the lease. Logs go to a folder
# that is packed into $OUT/logs.tgz after every step (what is under $OUT comes back even when the
# whole command is stopped); a summary goes to stdout.
#   bash .gpu/gpu_run.sh [all|bench|tests|compare|profile]
# compare: nccl's launch modes beside the direct line, then (when .gpu/old/libtributary.so.0 is
# there) the earlier library against this one, then the nccl tests.
# profile: the nccl line at 1 MiB under .gpu/sampler.so (scripts/host_profile), into $OUT with the
# machine's libc; read it here with scripts/host_profile/symbolize.py against build-test's
# unstripped libtributary.so.0.1.0 and tributary-bench.
set -uo pipefail
out=${OUT:-gpu-logs}
mkdir -p "$out"
logs=$(mktemp -d)/logs
mkdir -p "$logs"
snap() { tar -C "$(dirname "$logs")" -czf "$out/logs.tgz" logs; }
nccl_lib=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/.gpu/lib:$nccl_lib:${LD_LIBRARY_PATH:-}
export TRIBUTARY_TIMEOUT=60s
bin=.gpu/bin
what=${1:-all}
start=$SECONDS
step() { echo "== [$((SECONDS - start))s] $*"; }

step smi
nvidia-smi -L | tee "$logs/smi.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >> "$logs/smi.txt"
ls "$nccl_lib" >> "$logs/smi.txt" 2>&1
$bin/tributary-info > "$logs/info.txt" 2>&1
sed -n 1,30p "$logs/info.txt"
snap

if [[ $what == compare || $what == all ]]; then
  # nccl's two launch modes beside ncclAllReduce called directly, interleaved, out of place and in
  # place, non-blocking issue (-z 0) and a wait per call (-z 1).
  passes="1 2"; [[ $what == all ]] && passes=1
  for pass in $passes; do
    for z in 0 1; do
      step "nccl launch=nonblocking and launch=blocking beside ncclAllReduce, -z $z, pass $pass"
      timeout 90 $bin/tributary-bench -g 1 -z $z -b 64K -e 256M -f 4 -n 50 -w 10 -T 30 \
          --backend nccl --backend nccl:launch=blocking --reference nccl 2>&1 |
        tee "$logs/launch_z${z}_$pass.txt"
      snap
    done
  done
  # The same question asked of NCCL alone: NCCL_COMM_BLOCKING=1 makes every communicator blocking
  # (setup included), so launch=nonblocking pays no helper thread either.
  step "nccl with NCCL_COMM_BLOCKING=1 beside ncclAllReduce, -z 0"
  NCCL_COMM_BLOCKING=1 timeout 60 $bin/tributary-bench -g 1 -b 64K -e 256M -f 4 -n 50 -w 10 \
      -T 30 --backend nccl --reference nccl 2>&1 | tee "$logs/launch_env_blocking.txt"
  snap
fi

if [[ $what == compare && -f .gpu/old/libtributary.so.0 ]]; then
  # Before and after a library change, in one run: .gpu/old/ holds the earlier libtributary.so.0
  # (the bench binary is the new one; Work's state is private to the library). Interleaved.
  for pass in 1 2; do
    for lib in old new; do
      step "nccl beside ncclAllReduce, library $lib, pass $pass"
      libpath=$LD_LIBRARY_PATH
      [[ $lib == old ]] && libpath=$PWD/.gpu/old:$libpath
      LD_LIBRARY_PATH=$libpath timeout 60 $bin/tributary-bench -g 1 -b 64K -e 256M -f 4 -n 50 \
          -w 10 -T 30 --backend nccl --reference nccl 2>&1 | tee "$logs/cmp_${lib}_z0_$pass.txt"
      LD_LIBRARY_PATH=$libpath timeout 60 $bin/tributary-bench -g 1 -z 1 -b 64K -e 256M -f 4 \
          -n 50 -w 10 -T 30 --backend nccl --reference nccl 2>&1 | tee "$logs/cmp_${lib}_z1_$pass.txt"
      snap
    done
  done
  snap
fi

if [[ $what == compare ]]; then
  step "nccl tests (both launch modes)"
  timeout 60 $bin/gpu_test --gtest_brief=1 --gtest_filter='Nccl.*:GpuStrategies.*' 2>&1 |
    tee "$logs/gpu_test_nccl.txt" | tail -5
  timeout 200 $bin/gpu_conformance_test --gtest_brief=1 --gtest_filter='Nccl*Gpu/*_r1' 2>&1 |
    tee "$logs/conformance_nccl.txt" | tail -5
  timeout 90 $bin/gpu_test --gtest_brief=1 --gtest_filter='Nccl*/*MultiProcessConformance*' 2>&1 |
    tee "$logs/nccl_multiprocess.txt" | tail -5
  snap
fi

if [[ $what == profile ]]; then
  step "nccl at 1 MiB under the sampling profiler"
  SAMPLER_OUT=$out/prof LD_PRELOAD=$PWD/.gpu/sampler.so timeout 120 $bin/tributary-bench -g 1 \
      -b 1M -e 1M -n 300000 -w 100 -T 30 --backend nccl --reference none 2>&1 | tail -3
  cp -L /lib/x86_64-linux-gnu/libc.so.6 "$out/libc.so.6"
fi

if [[ $what == all || $what == bench ]]; then
  step device kernels bench
  timeout 60 $bin/tributary-device-kernels-bench 2>&1 | tee "$logs/device_kernels_bench.txt"; snap
  step "nccl beside ncclAllReduce called directly, and the in-process backends, one GPU"
  timeout 90 $bin/tributary-bench -g 1 -b 64K -e 1G -f 4 -n 50 -w 10 -T 30 \
      --json "$logs/bench_g1.json" 2>&1 | tee "$logs/bench_g1.txt"; snap
  step "the same, blocking (-z 1)"
  timeout 60 $bin/tributary-bench -g 1 -z 1 -b 64K -e 256M -f 4 -n 50 -w 10 -T 30 \
      --backend nccl --reference nccl 2>&1 | tee "$logs/bench_g1_z1.txt"; snap
  step "in-process backends on 4 virtual GPUs (one H100)"
  TRIBUTARY_VIRTUAL_GPUS=4 timeout 60 $bin/tributary-bench -g 4 -b 64K -e 256M -f 4 -T 30 \
      --time-per-size 200ms --backend reduction_to_one_device --backend hierarchical_copy \
      --reference none 2>&1 | tee "$logs/bench_g4_virtual.txt"; snap
  step "host backends on GPU tensors (staged), two ranks sharing GPU:0, with the copy ceilings"
  timeout 90 $bin/tributary-bench --np 2 -g 1 --ceiling --backend ring --backend gloo \
      --backend ucx -b 64K -e 256M -f 4 --time-per-size 200ms -T 30 \
      --json "$logs/bench_staged_np2.json" 2>&1 | tee "$logs/bench_staged_np2.txt"; snap
  step "the same backends on host buffers"
  timeout 60 $bin/tributary-bench --np 2 --backend ring --backend gloo --backend ucx \
      -b 64K -e 256M -f 4 --time-per-size 200ms -T 30 2>&1 | tee "$logs/bench_host_np2.txt"; snap
fi

if [[ $what == all || $what == tests ]]; then
  step "tests (in parallel)"
  gt() {  # name timeout binary args...
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@" > "$logs/$name.txt" 2>&1
    echo "rc=$?" >> "$logs/$name.txt"
  }
  gt device_kernels_test 60 $bin/device_kernels_test --gtest_brief=1 &
  gt gpu_test 120 $bin/gpu_test --gtest_filter='-*MultiProcessConformance*:*Staged*:*GpuMultiWorker*' &
  TRIBUTARY_VIRTUAL_GPUS=2 gt gpu_test_virtual 60 $bin/gpu_test --gtest_filter='*Virtual*' &
  gt conformance_nccl 240 $bin/gpu_conformance_test --gtest_brief=1 --gtest_filter='Nccl*Gpu/*_r1' &
  for s in 0 1 2 3; do
    TRIBUTARY_VIRTUAL_GPUS=8 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$s gt conformance_in_process_$s 200 \
      $bin/gpu_conformance_test --gtest_brief=1 --gtest_filter='*n1001_*:*n7_*-Nccl*Gpu/*' &
  done
  # Processes: nccl across processes (one GPU per rank: the cases that need more GPUs skip saying
  # so), then ring, gloo and ucx on GPU tensors staged through pinned host memory (processes share
  # the GPU; two virtual GPUs per process give the two-replica cases). CUDA must not be initialised
  # before the fork, so each is its own run.
  (gt nccl_multiprocess 120 $bin/gpu_test --gtest_brief=1 \
     --gtest_filter='Nccl*/*MultiProcessConformance*'
   TRIBUTARY_VIRTUAL_GPUS=2 gt staged_multiprocess 200 $bin/gpu_test --gtest_brief=1 \
     --gtest_filter='*Staged*'
   gt strategy_multiprocess 120 $bin/gpu_test --gtest_filter='*GpuMultiWorker*') &
  while [[ -n $(jobs -r) ]]; do sleep 10; snap; done
  wait
  snap
  step "test results"
  for f in "$logs"/*test*.txt "$logs"/conformance_*.txt "$logs"/*multiprocess*.txt; do
    echo "--- $(basename "$f")"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|tests? ran|^rc=' "$f" | head -25
  done
fi
step done
snap
