#!/usr/bin/env bash
# gloo's creation failing where a container or a host puts it: every rank gets a clear error,
# and at once, not a crash or the timeout.
#   - A host name that does not resolve, ranks on several (posed) hosts: gloo listens on the
#     address of the host's name; Debian's Gloo walked an uninitialized getaddrinfo result and
#     every rank died of SIGSEGV. Now MNCL_ERR_SYSTEM naming the name and MNCL_GLOO_IFACE.
#     Needs a UTS namespace of its own (root): skipped without one.
#   - One rank's creation fails (a bad MNCL_GLOO_IFACE on rank 1 only): rank 1 leaves the
#     communicator's note, and the others, waiting for it in gloo's rendezvous, fail with
#     MNCL_ERR_REMOTE naming it and its reason. Before, every rank, rank 1 included, waited out
#     the timeout ("store key 'rank_1' not set").
# Usage: gloo_creation_failures.sh <mncl-run> <create_probe>
set -u
run=$1
probe=$2
source "$(dirname "$0")/expect_lines.sh"

if unshare -u true 2>/dev/null; then
  check "4 ranks on 2 posed hosts, a host name that does not resolve" \
    unshare -u bash -c 'hostname mncl-no-such-host.invalid &&
      exec "$0" -n 4 --ranks-per-host 2 --timeout 120 --tag-output -- "$1" \
        --setenv MNCL_BACKEND=gloo --setenv MNCL_TIMEOUT=60 --expect MNCL_ERR_SYSTEM \
        --contains "does not resolve" --contains "MNCL_GLOO_IFACE" --max-seconds 50' \
    "$run" "$probe"
  [ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }
  refute 'signal'
else
  echo "=== SKIP: an unresolvable host name (no UTS namespace of our own: not root?)"
fi

check "3 ranks, rank 1's gloo cannot bind (MNCL_GLOO_IFACE=nope0 there only)" \
  "$run" -n 3 --timeout 120 --tag-output -- bash -c '
    common=(--setenv MNCL_BACKEND=gloo --setenv MNCL_TIMEOUT=60 --max-seconds 50)
    if [ "$MNCL_RANK" = 1 ]; then
      exec "$0" "${common[@]}" --setenv MNCL_GLOO_IFACE=nope0 --expect MNCL_ERR_SYSTEM \
        --contains nope0
    fi
    exec "$0" "${common[@]}" --expect MNCL_ERR_REMOTE --contains "rank 1 (pid" \
      --contains nope0' "$probe"
[ "$rc" -eq 0 ] || { echo "FAIL: '$what' exited $rc" >&2; status=1; }

[ "$status" -eq 0 ] && echo PASS || echo FAIL
exit $status
