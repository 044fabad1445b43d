#!/usr/bin/env bash
# Builds tributary with sanitizers (clang) and runs tests under them. Installs what it needs first.
#   scripts/sanitize.sh address [ctest args]  # AddressSanitizer + UndefinedBehaviorSanitizer:
#                                             # every test but the slow label, unless ctest args say
#   scripts/sanitize.sh thread [ctest args]   # ThreadSanitizer: the threaded unit tests
# Any report fails the run (halt_on_error, -fno-sanitize-recover). Build dirs: build-asan (shared
# with the fuzz targets of scripts/fuzz.sh) and build-tsan. CI (.ci/run) runs both kinds.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread [ctest args...]}
shift
scripts/install-deps.sh --sanitizers
. scripts/ccache_env.sh
jobs=$(nproc 2>/dev/null || echo 2)
# No Python module: an instrumented extension cannot be loaded by an uninstrumented python3 (the
# bindings are tested by the main suite).
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang
        -DCMAKE_CXX_COMPILER=clang++ -DTRIBUTARY_WITH_CUDA=OFF -DTRIBUTARY_WITH_NCCL=OFF
        -DTRIBUTARY_BUILD_PYTHON=OFF)
# TRIBUTARY_SANITIZE_TARGETS="a b": build only these targets (what the ctest args select), not all.
targets=()
[ -z "${TRIBUTARY_SANITIZE_TARGETS:-}" ] || read -r -a targets <<<"$TRIBUTARY_SANITIZE_TARGETS"
case $kind in
  address)
    build=build-asan
    # The fuzz targets build here too (scripts/fuzz.sh): one ASan+UBSan build serves both, the
    # library carrying libFuzzer's coverage counters (harmless to the tests).
    cmake -S . -B "$build" "${common[@]}" -DTRIBUTARY_SANITIZE=address,undefined \
      -DTRIBUTARY_FUZZ=ON >/dev/null
    cmake --build "$build" -j "$jobs" ${targets[@]+--target "${targets[@]}"}
    # UCX's own malloc hooks fight ASan's allocator; tributary needs neither.
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
    export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp}
    [ $# -gt 0 ] || set -- -LE slow
    ;;
  thread)
    build=build-tsan
    cmake -S . -B "$build" "${common[@]}" -DTRIBUTARY_SANITIZE=thread \
      -DTRIBUTARY_BUILD_BENCH=ON >/dev/null
    cmake --build "$build" -j "$jobs" --target core_test algorithms_test store_test
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    [ $# -gt 0 ] || set -- -R '^(core_test|algorithms_test|store_test)$'
    ;;
  *)
    echo "sanitize.sh: unknown kind '$kind'; use address or thread" >&2
    exit 2
    ;;
esac
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
