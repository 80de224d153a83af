#!/usr/bin/env bash
# expect_fail_within.sh SECONDS command...: passes if the command exits non-zero within SECONDS
# (measured around the whole command, start-up included).
set -u
limit=$1
shift
start=$(date +%s%N)
"$@"
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
limit_ms=$(awk -v s="$limit" 'BEGIN { printf "%d", s * 1000 }')
echo "expect_fail_within: exit status $rc after ${elapsed_ms} ms (limit ${limit_ms} ms)"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the command succeeded; it should have failed" >&2
  exit 1
fi
if [ "$elapsed_ms" -gt "$limit_ms" ]; then
  echo "FAIL: took ${elapsed_ms} ms, more than ${limit_ms} ms" >&2
  exit 1
fi
exit 0
