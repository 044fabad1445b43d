#!/usr/bin/env bash
# Builds tributary and runs the whole test suite. Installs what it needs first (Debian packages).
#   scripts/test.sh                 # everything (what CI runs)
#   scripts/test.sh -LE slow        # extra arguments go to ctest, e.g. skip the slow label
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
. scripts/ccache_env.sh

build=${TRIBUTARY_TEST_BUILD_DIR:-build-test}
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIBUTARY_WERROR=ON \
  -DTRIBUTARY_BUILD_STATIC=ON >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
