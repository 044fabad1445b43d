#!/usr/bin/env bash
# Installs the Debian packages tributary needs to build and test, only those that are missing.
# Uses sudo when not root. Safe to run again: it does nothing when everything is present.
#   scripts/install-deps.sh               # what building and testing need
#   scripts/install-deps.sh --sanitizers  # also clang and its runtimes (sanitizers, libFuzzer)
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config git ca-certificates
  libfmt-dev libboost-dev libssl-dev nlohmann-json3-dev libgloo-dev libucx-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  pybind11-dev python3-dev python3-numpy python3-pytest python3-venv
  gnuplot-nox iproute2
  gdb  # the test watchdogs print a hung rank's stacks with it
)
if [ "${1:-}" = "--sanitizers" ]; then
  packages+=(clang libclang-rt-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
