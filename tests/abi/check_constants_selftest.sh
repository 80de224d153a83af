#!/usr/bin/env bash
# Proves that check_constants.sh (ctest abi.constants) still catches what it is for, so that it
# cannot silently become a no-op: it copies the headers abi/mncl/ into a scratch source tree,
# records a baseline there (update mode), then edits one copy of the headers per case and
# expects the check to fail, naming the constant with both values, or to pass:
#
#   renumbered enumerator, changed #define, removed enumerator, removed #define, a #define that
#   is no longer an integer, a shrunk count, a version going back        -> fail
#   appended enumerator + grown count + new #define + newer version      -> pass, as additions
#   update with a renumbered enumerator (same MNCL_ABI_MAJOR)            -> refused, baseline kept
#   update with a renumbered enumerator and a new MNCL_ABI_MAJOR         -> recorded
#   update with additions, then check                                    -> recorded, passes
#
# Each edit must change the header (a case whose pattern no longer matches fails: adapt it).
# The real baseline and headers are never touched.
#
# Usage: check_constants_selftest.sh <source dir> <scratch dir> [<C compiler>]
set -u
src=$1 scratch=$2 cc=${3:-${CC:-cc}}
check=$(dirname "$0")/check_constants.sh
status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}

rm -rf "$scratch"
mkdir -p "$scratch/pristine/abi/baseline" || exit 1
cp -R "$src/abi/mncl" "$scratch/pristine/abi/" || exit 1
if ! "$check" update "$scratch/pristine" "$scratch/pristine/out" "$cc" \
  >"$scratch/pristine.log" 2>&1; then
  cat "$scratch/pristine.log"
  echo "FAIL: could not record a baseline of the unchanged headers" >&2
  exit 1
fi
# The list must hold the kinds of constants the check exists for, and none of the non-constants.
recorded=$scratch/pristine/abi/baseline/constants.txt
for name in MNCL_OK MNCL_FLOAT32 MNCL_P2P_RECV MNCL_COLL_SENDRECV_BATCH MNCL_LOG_TRACE \
  MNCL_CAP_HOST_MEMORY MNCL_CONFIG_MAGIC MNCL_PLUGIN_MAGIC MNCL_FROM_ENV MNCL_SPLIT_NONE \
  MNCL_NUM_DTYPES MNCL_VERSION MNCL_PLUGIN_ABI_CURRENT MNCL_COLL_MASK_ALL_V1; do
  grep -q "^$name -\?[0-9][0-9]*$" "$recorded" || fail "the recorded list lacks $name"
done
for name in MNCL_MNCL_H MNCL_PLUGIN_H MNCL_API MNCL_PLUGIN_EXPORT MNCL_CONFIG_INIT \
  MNCL_PLUGIN_V1_SYMBOL MNCL_VERSION_CODE MNCL_COLL_BIT; do
  grep -q "^$name " "$recorded" && fail "the recorded list has $name, which is no integer constant"
done
for line in 'MNCL_P2P_RECV 1' 'MNCL_FROM_ENV -1' 'MNCL_CAP_CUDA_MEMORY 2'; do
  grep -qx "$line" "$recorded" || fail "the recorded list lacks '$line'"
done

ncase=0
# Runs one case: <name> <mode> <expected exit: 0 or 1> <expected output (grep -F)> <header> <sed
# script>... (one or more header/sed pairs). The case's tree is $scratch/<name>.
run_case() {
  local name=$1 mode=$2 want_rc=$3 want_text=$4
  shift 4
  local dir=$scratch/$name rc
  ncase=$((ncase + 1))
  rm -rf "$dir"
  cp -R "$scratch/pristine" "$dir" && rm -rf "$dir/out" || return
  while [ $# -ge 2 ]; do
    sed -i "$2" "$dir/abi/mncl/$1"
    if cmp -s "$dir/abi/mncl/$1" "$scratch/pristine/abi/mncl/$1"; then
      fail "case '$name': the edit '$2' does not change $1 (adapt the case to the header)"
      return
    fi
    shift 2
  done
  "$check" "$mode" "$dir" "$dir/out" "$cc" >"$dir.log" 2>&1
  rc=$?
  if [ $rc -ne "$want_rc" ] || ! grep -qF -- "$want_text" "$dir.log"; then
    fail "case '$name': expected exit $want_rc and '$want_text', got exit $rc:"
    sed 's/^/    /' "$dir.log" >&2
  else
    echo "ok: $name ($mode, exit $rc): $(grep -F -- "$want_text" "$dir.log" | head -1)"
  fi
}

run_case renumbered-enumerator check 1 'FAIL: MNCL_P2P_RECV changed: baseline 1, now 2' \
  mncl.h 's/MNCL_P2P_RECV = 1/MNCL_P2P_RECV = 2/'
run_case changed-define check 1 'FAIL: MNCL_CAP_CUDA_MEMORY changed: baseline 2, now 32' \
  mncl_plugin_v1.h 's/^\(#define MNCL_CAP_CUDA_MEMORY\) (1ull << 1)/\1 (1ull << 5)/'
run_case removed-enumerator check 1 'FAIL: MNCL_AVG was removed (baseline 4)' \
  mncl.h '/^ *MNCL_AVG = 4/d'
run_case removed-define check 1 'FAIL: MNCL_SPLIT_NONE was removed (baseline -1)' \
  mncl.h '/^#define MNCL_SPLIT_NONE /d'
run_case define-not-integer check 1 \
  'FAIL: MNCL_FROM_ENV is no longer an integer constant (baseline -1' \
  mncl.h 's/^#define MNCL_FROM_ENV (-1)/#define MNCL_FROM_ENV "-1"/'
run_case shrunk-count check 1 'FAIL: MNCL_NUM_DTYPES shrank: baseline 10, now 9' \
  mncl.h 's/^#define MNCL_NUM_DTYPES 10/#define MNCL_NUM_DTYPES 9/'
run_case version-back check 1 'FAIL: MNCL_VERSION shrank' \
  mncl.h 's/^\(#define MNCL_VERSION_[A-Z]*\) [0-9][0-9]*$/\1 0/'
additions=(mncl.h 's/^\( *\)MNCL_AVG = 4$/\1MNCL_AVG = 4,\n\1MNCL_SELFTEST_OP = 5/'
  mncl.h 's/^#define MNCL_NUM_OPS 5$/#define MNCL_NUM_OPS 6\n#define MNCL_SELFTEST_FLAG (1ull << 40)/'
  mncl.h 's/^#define MNCL_VERSION_PATCH \([0-9]*\)/#define MNCL_VERSION_PATCH 9\1/')
run_case additions check 0 'compatible additions not yet in the baseline' "${additions[@]}"
for want in '  MNCL_SELFTEST_OP 5' '  MNCL_SELFTEST_FLAG 1099511627776' 'MNCL_NUM_OPS grew 5 -> 6' \
  'MNCL_VERSION grew' 'OK: every constant'; do
  grep -qF -- "$want" "$scratch/additions.log" 2>/dev/null ||
    fail "case 'additions': the output lacks '$want'"
done
run_case update-refuses-renumbered update 1 'Recorded nothing' \
  mncl.h 's/MNCL_P2P_RECV = 1/MNCL_P2P_RECV = 2/'
cmp -s "$scratch/update-refuses-renumbered/abi/baseline/constants.txt" "$recorded" ||
  fail "case 'update-refuses-renumbered': the refused update changed the baseline"
run_case update-new-abi-major update 0 'with the incompatible changes above (new MNCL_ABI_MAJOR)' \
  mncl.h 's/MNCL_P2P_RECV = 1/MNCL_P2P_RECV = 2/' \
  mncl.h 's/^#define MNCL_ABI_MAJOR \([0-9]*\)$/#define MNCL_ABI_MAJOR 9\1/'
grep -qx 'MNCL_P2P_RECV 2' "$scratch/update-new-abi-major/abi/baseline/constants.txt" ||
  fail "case 'update-new-abi-major': the baseline did not record MNCL_P2P_RECV 2"
run_case update-records-additions update 0 'updated ' "${additions[@]}"
dir=$scratch/update-records-additions
if "$check" check "$dir" "$dir/out" "$cc" >"$dir.recheck.log" 2>&1 &&
  grep -q 'OK: every constant' "$dir.recheck.log" &&
  ! grep -q 'compatible additions' "$dir.recheck.log" &&
  grep -qx 'MNCL_SELFTEST_OP 5' "$dir/abi/baseline/constants.txt"; then
  echo "ok: update-records-additions: the recorded additions then pass without being listed"
else
  fail "case 'update-records-additions': after the update, check did not pass cleanly:"
  sed 's/^/    /' "$dir.recheck.log" >&2
fi

[ $status -eq 0 ] && echo "OK: check_constants.sh caught all $ncase cases (trees in $scratch)"
exit $status
