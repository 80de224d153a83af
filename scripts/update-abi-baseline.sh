#!/usr/bin/env bash
# Records the current ABI as the baseline (abi/baseline/*.abi, and abi/baseline/constants.txt)
# that ctest's abi.baseline and abi.constants checks compare against. Run it when a release
# intentionally changes the ABI in a compatible way (new functions, new enumerators or constants,
# fields appended to a struct_size-versioned struct), review `git diff abi/baseline`, and commit
# the result with the change.
#
#   scripts/update-abi-baseline.sh                   libmncl, plus new plugin ABI versions
#   scripts/update-abi-baseline.sh mncl_plugin_v2    also re-records these (an unreleased one)
#
# Plugin ABI versions are frozen headers (abi/mncl/mncl_plugin_v<N>.h), each described by the
# object mncl_plugin_abi_v<N> (tests/abi) in abi/baseline/mncl_plugin_v<N>.abi. A version
# without a baseline is recorded; one with a baseline is only checked, and a change fails (a
# released plugin ABI never changes: fix the header, or name the version to re-record it while
# it is still unreleased). libmncl.abi is always rewritten. constants.txt (every enumerator and
# integer #define of abi/mncl/*.h, with its value; tests/abi/check_constants.sh) is rewritten
# unless a constant was removed or changed (other than the versions and counts that script lists
# as changing by design), which only a new MNCL_ABI_MAJOR may record: then nothing is recorded.
#
# Builds libmncl and the plugin-ABI objects into MNCL_BUILD_DIR (default: build; it must be a
# build with debug info, RelWithDebInfo or Debug) with MNCL_JOBS jobs (default: nproc) and
# dumps them with abidw.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MNCL_BUILD_DIR:-build}
[ -f "$build_dir/CMakeCache.txt" ] ||
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${MNCL_BUILD_TYPE:-RelWithDebInfo}"

versions=$(ls abi/mncl/mncl_plugin_v*.h | sed -n 's|.*/mncl_plugin_v\([0-9][0-9]*\)\.h$|\1|p' |
  sort -n)
known=" libmncl $(echo $versions | sed 's/\([0-9][0-9]*\)/mncl_plugin_v\1/g') "
for name in "$@"; do
  if [[ "$known" != *" $name "* ]]; then
    echo "unknown plugin ABI baseline '$name' (known:$known)" >&2
    exit 2
  fi
done

targets=(mncl)
record=("libmncl=$build_dir/lib/libmncl.so")
frozen=()
for v in $versions; do
  targets+=("mncl_plugin_abi_v$v")
  pair="mncl_plugin_v$v=$build_dir/tests/abi/libmncl_plugin_abi_v$v.so"
  if [ ! -f "abi/baseline/mncl_plugin_v$v.abi" ] || [[ " $* " == *" mncl_plugin_v$v "* ]]; then
    record+=("$pair")
  else
    frozen+=("$pair")
  fi
done
cmake --build "$build_dir" -j"${MNCL_JOBS:-$(nproc)}" --target "${targets[@]}"

# Frozen versions first, so that a changed released plugin ABI records nothing.
if [ ${#frozen[@]} -gt 0 ]; then
  rc=0
  tests/abi/abi_check.sh check "$PWD" "$build_dir/tests/abi/current" "${frozen[@]}" || rc=$?
  if [ $rc -eq 1 ]; then
    echo "Recorded nothing: a plugin ABI above differs from its baseline. Released plugin ABIs" >&2
    echo "are frozen: undo the change (a new version is a new header). Only while a version is" >&2
    echo "unreleased, re-record it by name: $0 mncl_plugin_v<N>" >&2
  fi
  [ $rc -eq 0 ] || exit $rc
fi
# The constants before libmncl.abi, so that a refused constant change records nothing. They are
# evaluated with the build's C compiler, as ctest's abi.constants does.
c_compiler=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
tests/abi/check_constants.sh update "$PWD" "$build_dir/tests/abi/current" "${c_compiler:-cc}"
exec tests/abi/abi_check.sh update "$PWD" "$build_dir/tests/abi/current" "${record[@]}"
