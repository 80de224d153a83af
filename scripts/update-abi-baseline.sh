#!/usr/bin/env bash
# Records the current ABI as the baseline (abi/baseline/*.abi) that ctest's abi.baseline check
# compares against. Run it when a release intentionally changes the ABI in a compatible way
# (new functions, new enumerators, fields appended to a struct_size-versioned struct), review
# `git diff abi/baseline`, and commit the result with the change.
#
# Builds libmncl and the plugin-ABI object into MNCL_BUILD_DIR (default: build; it must be a
# build with debug info, RelWithDebInfo or Debug) and dumps them with abidw.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MNCL_BUILD_DIR:-build}
[ -f "$build_dir/CMakeCache.txt" ] ||
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${MNCL_BUILD_TYPE:-RelWithDebInfo}"
cmake --build "$build_dir" -j"$(nproc)" --target mncl mncl_plugin_abi_v1
exec tests/abi/abi_check.sh update "$PWD" "$build_dir/tests/abi/current" \
  libmncl="$build_dir/lib/libmncl.so" \
  mncl_plugin_v1="$build_dir/tests/abi/libmncl_plugin_abi_v1.so"
