#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/) under AddressSanitizer + UndefinedBehaviorSanitizer.
#   scripts/fuzz.sh [SECONDS] [TARGET...]   # each target for SECONDS (default 60); all by default
# Targets: spec config cluster store_server ring_handshake ring_frames tfrecord csv, and
# ucx_messages where UCX is built in. Each starts from its committed seeds (fuzz/corpus/TARGET) and
# keeps what it finds in build-asan/fuzz/corpus/TARGET, so later runs go on from there; a crash
# leaves its input in build-asan/fuzz/artifacts/ and fails the script.
# CI (.ci/run) runs each target briefly.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
explicit_targets=${targets[*]}
[ ${#targets[@]} -gt 0 ] || targets=(spec config cluster store_server ring_handshake ring_frames tfrecord csv)
scripts/install-deps.sh --sanitizers
. scripts/ccache_env.sh
# The same build as scripts/sanitize.sh address (same options, so neither reconfigures the other).
build=build-asan
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DTRIBUTARY_WITH_CUDA=OFF -DTRIBUTARY_WITH_NCCL=OFF \
  -DTRIBUTARY_BUILD_PYTHON=OFF -DTRIBUTARY_SANITIZE=address,undefined -DTRIBUTARY_FUZZ=ON \
  >/dev/null
# The UCX target exists when UCX was found (libucx-dev); by default it runs too.
if [ -z "$explicit_targets" ] &&
   cmake --build "$build" --target help 2>/dev/null | grep -q '^fuzz_ucx_messages:'; then
  targets+=(ucx_messages)
fi
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]/#/fuzz_}"
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
mkdir -p "$build/fuzz/artifacts"
status=0
for t in "${targets[@]}"; do
  corpus="$build/fuzz/corpus/$t"
  mkdir -p "$corpus"
  echo "fuzz.sh: $t for ${seconds}s" >&2
  # -rss_limit_mb and -malloc_limit_mb: an input that makes a parser allocate without bound is a
  # finding too. -timeout: one input may take at most 10 s.
  # A target may carry LeakSanitizer suppressions of its own (fuzz/TARGET.lsan.supp, each with why).
  supp=fuzz/$t.lsan.supp
  if ! LSAN_OPTIONS=${LSAN_OPTIONS:-$([ -f "$supp" ] && echo "suppressions=$PWD/$supp")} \
      "$build/fuzz/fuzz_$t" "$corpus" "fuzz/corpus/$t" -max_total_time="$seconds" \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$build/fuzz/artifacts/$t-" 2>"$build/fuzz/$t.log"; then
    echo "fuzz.sh: $t FAILED; its log ends:" >&2
    tail -40 "$build/fuzz/$t.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/fuzz/$t.log" |
      sed "s/^/fuzz.sh: $t: /" >&2
  fi
done
exit $status
