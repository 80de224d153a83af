#!/usr/bin/env bash
# ABI check against the baseline in abi/baseline/ (libabigail's abidw/abidiff, Debian
# abigail-tools). One script for both jobs, so the check and the update dump identically:
#
#   abi_check.sh check  <source dir> <out dir> <name>=<binary>...   (ctest, label abi)
#   abi_check.sh update <source dir> <out dir> <name>=<binary>...   (scripts/update-abi-baseline.sh)
#
# Each <name> is one description, abi/baseline/<name>.abi: libmncl (libmncl.so) and, per plugin
# ABI version N, mncl_plugin_v<N> (a tiny object exporting that version's table and the enums).
# The dumps keep only what the exported interfaces reach and only types defined in abi/mncl/
# (the public headers), without source locations or absolute paths, so they do not depend on the
# checkout, the build type (-O0/-O2, as long as there is -g) or internal code.
#
# check: abidiff's exit status is a bit mask: 1 error, 2 usage, 4 ABI change, 8 incompatible
# change. 8 (a removed or changed function or variable symbol) fails. 4 alone is re-run with
# --no-added-syms: when only additions caused it (new functions, new version nodes), they are
# compatible, printed, and pass; anything else (a struct, enum or signature changed) fails until
# reviewed and recorded with scripts/update-abi-baseline.sh.
set -u
mode=$1 src=$2 out=$3
shift 3
baseline_dir=$src/abi/baseline
headers=$src/abi/mncl

if ! command -v abidw >/dev/null || ! command -v abidiff >/dev/null; then
  echo "SKIPPED: abidw/abidiff not found (Debian package abigail-tools; scripts/setup.sh installs it)"
  exit 77
fi

# Writes the description of binary $1 to $2.
dump() {
  abidw --no-corpus-path --no-comp-dir-path --no-show-locs --exported-interfaces-only \
    --headers-dir "$headers" --drop-private-types --type-id-style hash "$1" |
    sed "s|path='$src/|path='|" >"$2"
}

mkdir -p "$out"
status=0
for pair in "$@"; do
  name=${pair%%=*} bin=${pair#*=}
  baseline=$baseline_dir/$name.abi current=$out/$name.abi
  if ! readelf -S "$bin" | grep -q '\.debug_info'; then
    echo "SKIPPED: $bin has no debug info; abidw needs -g (build type RelWithDebInfo or Debug)"
    exit 77
  fi
  dump "$bin" "$current" || { echo "FAIL: abidw $bin" >&2; exit 1; }
  if [ "$mode" = update ]; then
    cp "$current" "$baseline"
    echo "updated $baseline from $bin"
    continue
  fi
  [ -f "$baseline" ] || { echo "FAIL: no baseline $baseline (scripts/update-abi-baseline.sh)" >&2; status=1; continue; }
  report=$(abidiff "$baseline" "$current" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "$name: no ABI change against $baseline"
  elif [ $((rc & 3)) -ne 0 ]; then
    echo "FAIL: abidiff $baseline $current failed (exit $rc):" >&2
    echo "$report" >&2
    status=1
  elif [ $((rc & 8)) -ne 0 ]; then
    echo "FAIL: $name: INCOMPATIBLE ABI change against $baseline (abidiff exit $rc):" >&2
    echo "$report" >&2
    status=1
  elif abidiff --no-added-syms "$baseline" "$current" >/dev/null 2>&1; then
    echo "$name: compatible additions not yet in the baseline (record them at release time with"
    echo "scripts/update-abi-baseline.sh):"
    echo "$report"
  else
    echo "FAIL: $name: ABI change against $baseline (abidiff exit $rc). If it is intended and" >&2
    echo "compatible under the README's ABI rules, run scripts/update-abi-baseline.sh:" >&2
    echo "$report" >&2
    status=1
  fi
done
exit $status
