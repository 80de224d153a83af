#!/usr/bin/env bash
# /dev/shm as containers have it: read-only, or too small for shm's segment (reserved whole at
# creation; Docker's default is 64 MiB). shm's probe says so, auto passes it over for another
# backend (the job runs), mncl-info shows why, and a job that names shm fails with the reason.
# Before, auto picked shm anyway and mncl_comm_create failed (shm_open: Read-only file system;
# cannot reserve ... bytes). Runs in a mount namespace of its own with a tmpfs of the size on
# /dev/shm: needs root, skipped (77) without it.
# Usage: shm_devshm_limits.sh <mncl-info> <mncl-run> <create_probe>
set -u
info=$1
run=$2
probe=$3
source "$(dirname "$0")/expect_lines.sh"
if ! unshare -m true 2>/dev/null; then
  echo "SKIP: no mount namespace of our own (not root?)"
  exit 77
fi
in_shm() {  # in_shm <size|ro> <command...>: the command with /dev/shm a tmpfs of that size
  local size=$1
  shift
  unshare -m bash -c 'opts="size=$0"; [ "$0" = ro ] && opts="size=64m,ro"
    mount -t tmpfs -o "$opts" tmpfs /dev/shm && exec "$@"' "$size" "$@"
}

check "mncl-info, read-only /dev/shm" in_shm ro "$info"
expect '^  Decision \(MNCL_BACKEND=auto, host memory\): '
refute '^  Decision \(MNCL_BACKEND=auto, host memory\): shm$'
expect 'shm unusable: /dev/shm is read-only here'

check "2 ranks on auto, 1 MiB /dev/shm" \
  in_shm 1m "$run" -n 2 --timeout 60 --tag-output -- "$probe" --setenv MNCL_BACKEND=auto --allreduce
[ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }

check "2 ranks naming shm, 1 MiB /dev/shm" \
  in_shm 1m "$run" -n 2 --timeout 60 --tag-output -- "$probe" --setenv MNCL_BACKEND=shm \
  --expect MNCL_ERR_PLUGIN --contains "needs" --contains "MiB of /dev/shm, which has"
[ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }

[ "$status" -eq 0 ] && echo PASS || echo FAIL
exit $status
