#!/usr/bin/env bash
# Sets up (installs packages, builds) and runs the whole test suite with ctest.
# In CI (CI=true), or with MNCL_TEST_SANITIZERS=1, it then also runs the reliability builds
# (scripts/reliability.sh: ASan+UBSan, TSan and fuzzing), built and fuzzing beside the main ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Open MPI refuses root unless told otherwise (CI runs as root); harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ "${CI:-}" != true ] && [ "${MNCL_TEST_SANITIZERS:-0}" != 1 ]; then
  exec ctest --test-dir "${MNCL_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
fi

# The main ctest leaves about half of the CPU idle (most of its tests wait: on timeouts, on
# peers), so the reliability builds and the fuzz run go beside it at idle priority (SCHED_IDLE:
# they get only what the tests leave), in a session of their own (stopped with this script if
# it ends first). Their output waits in a log until the end.
build_log=$(mktemp)
setsid -w chrt --idle 0 nice -n 19 \
  bash scripts/reliability.sh fuzz \
  >"$build_log" 2>&1 &
builder=$!
trap 'kill -- -"$builder" 2>/dev/null || true; rm -f "$build_log"' EXIT

status=0
ctest --test-dir "${MNCL_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@" || status=$?
[ "$status" -eq 0 ] || exit "$status"
echo "== waiting for the reliability builds and the fuzz run ($(date +%T))"
build_status=0
wait "$builder" || build_status=$?
cat "$build_log"
[ "$build_status" -eq 0 ] || {
  echo "the reliability builds or the fuzz run failed (exit $build_status)" >&2
  exit 1
}
bash scripts/reliability.sh sanitized --built
