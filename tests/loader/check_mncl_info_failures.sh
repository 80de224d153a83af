#!/usr/bin/env bash
# mncl-info with plugins that misbehave: a probe that throws (a std::exception or an int) or
# fails without a message makes that plugin unusable, with the reason, and mncl-info goes on; a
# plugin dlopen refuses is named with its reason where a backend list asks for it; mncl-info
# exits 3 when no backend is usable (0 when one is), 1 for a bad setting (a value a plugin or
# the core refuses, a misspelt MNCL_* name), and takes keywords in any case; and with
# MNCL_DEBUG=info the file being loaded is named before its static initializer kills the
# process.
# Usage: check_mncl_info_failures.sh <mncl-info> <probe mock folder> <refused mock folder>
#                                    <fatal mock folder>
set -u
info=$1 probe=$2 refused=$3 fatal=$4
# expect / refute on $out, and status
source "$(dirname "$0")/../topology/expect_lines.sh"
run() {  # run <description> <env...>: mncl-info under that environment; sets what, out, err, rc
  what=$1
  shift
  out=$(env "$@" "$info" --plugins --topology 2>"$tmp")
  rc=$?
  err=$(cat "$tmp")
  echo "=== $what (exit $rc)"
  echo "$out"
  echo "--- stderr"
  echo "$err"
}
expect_rc() {
  if [ "$rc" -ne "$1" ]; then
    echo "FAIL: exit status $rc, expected $1" >&2
    status=1
  fi
}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

run "probes that throw or fail silently, asked for by name" MNCL_PLUGIN_PATH="$probe" \
  MNCL_BACKEND=pthrow,pthrowint,psilent MNCL_MEMORY=host
expect '^  pthrow +loaded '
expect '^ +probe score 0: probe threw: probe of pthrow threw$'
expect '^ +probe score 0: probe threw: an exception that is not a std::exception$'
expect '^ +probe score 0: probe failed: MNCL_ERR_INTERNAL: \(no message\)$'
expect '^  -> none: no usable backend for MNCL_BACKEND='
expect '^  pthrow: unusable here: probe threw: probe of pthrow threw$'
expect '^  pthrowint: unusable here: probe threw: an exception that is not a std::exception$'
expect '^  psilent: unusable here: probe failed: MNCL_ERR_INTERNAL: \(no message\)$'
expect '^  Decision \(MNCL_BACKEND=pthrow,pthrowint,psilent\): none: '
out=$err refute 'terminate called'  # mncl-info must not die on a throwing probe
expect_rc 3

run "the same plugins beside a usable one" MNCL_PLUGIN_PATH="$probe" MNCL_BACKEND=auto \
  MNCL_MEMORY=host
expect '^ +pthrow +score +0  probe threw: probe of pthrow threw$'
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): [a-z]+$'
expect_rc 0

run "a plugin dlopen refuses, named by MNCL_BACKEND_HOST" MNCL_PLUGIN_PATH="$refused" \
  MNCL_BACKEND=auto MNCL_BACKEND_HOST=undef MNCL_MEMORY=host
expect '^  undef +REFUSED .*dlopen failed: .*undefined symbol: mncl_mock_missing_symbol$'
expect 'MNCL_BACKEND_HOST=undef: nothing in it is usable here; undef refused: dlopen failed: .*undefined symbol: mncl_mock_missing_symbol$'
refute 'undef not installed'  # a refused plugin is named with its reason
expect_rc 3

run "a core setting that means nothing" MNCL_STORE=http://x MNCL_MEMORY=host
expect "^Configuration error: MNCL_ERR_INVALID_ARGUMENT: MNCL_STORE: invalid store url 'http://x'"
expect_rc 1

run "a misspelt variable" MNCL_TIMOUT=5 MNCL_MEMORY=host
out=$err expect 'MNCL_TIMOUT is not a documented MNCL variable and has no effect \(did you mean MNCL_TIMEOUT\?\)'
expect_rc 1

run "keywords in upper case" MNCL_BACKEND=NAIVE MNCL_BIND=NONE MNCL_MEMORY=HOST
expect "^  -> naive: requested 'NAIVE'"
expect_rc 0

# A bad setting of a real plugin's own (gloo, where built): auto used to pass it over and
# choose another backend, exit 0.
if "$info" --plugins 2>/dev/null | grep -qE '^  gloo +loaded '; then
  run "a plugin's own setting that means nothing" MNCL_GLOO_ALGO=Bogus MNCL_MEMORY=host
  expect "^  gloo +REFUSED .*MNCL_GLOO_ALGO='Bogus' is not an algorithm"
  expect "^  -> none: backend 'gloo' refused its settings: gloo: MNCL_GLOO_ALGO='Bogus' is not an algorithm"
  expect_rc 1
  run "the same in another case" MNCL_GLOO_ALGO=RING MNCL_BACKEND=gloo MNCL_MEMORY=host
  expect "^  -> gloo: requested 'gloo'"
  expect_rc 0
fi

run "a static initializer that exits, MNCL_DEBUG=info" MNCL_PLUGIN_PATH="$fatal" MNCL_DEBUG=info
expect_rc 97
last=$(grep -E ' INFO .*\] loading ' <<<"$err" | tail -n 1)
if [[ "$last" != *"] loading $fatal/libmncl-ctorexit.so" ]]; then
  echo "FAIL: the last file named before the exit is not the fatal plugin (got: '$last')" >&2
  status=1
fi

[ "$status" -eq 0 ] && echo PASS || echo FAIL
exit $status
