#!/usr/bin/env bash
# Installs what MNCL needs (Debian packages) when it is missing, then configures and builds
# into ./build. Safe to run again: it only installs and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libgloo-dev libhwloc-dev
          libboost-dev libboost-filesystem-dev libgtest-dev libbenchmark-dev
          dataset-fashion-mnist gzip
          clang libclang-rt-14-dev iproute2 util-linux                    # fuzzing, netns tests
          abigail-tools                                                 # ABI baseline check
          python3 python3-numpy python3-pip python3-setuptools python3-wheel python3-venv)  # python/
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

build_dir=${MNCL_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${MNCL_BUILD_TYPE:-RelWithDebInfo}" \
  ${MNCL_CMAKE_ARGS:-}
# MNCL_BUILD_TARGETS narrows the build (the sweep needs no tests); default: everything.
targets=()
for t in ${MNCL_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
