#!/bin/sh
# One rank of `mpirun -np 2 sh private_store_folder.sh CREATE_PROBE`: the job's private file
# store folder (/tmp/mncl-<uid>-ompi-<jobid>-<transport key>), made first by another user (rank
# 0, as root, hands it to uid 65534 before anyone creates a communicator), must be refused with
# MNCL_ERR_BOOTSTRAP instead of being used for the job's keys. Root only (chown): 77 otherwise.
set -u
. "$(dirname "$0")/rank0_ready.sh"
probe=${1:?usage: private_store_folder.sh CREATE_PROBE}
[ "$(id -u)" = 0 ] || exit 77
[ -n "${OMPI_MCA_ess_base_jobid:-}" ] || exit 77  # not Open MPI 4's mpirun: no private folder
d=/tmp/mncl-0-ompi-$OMPI_MCA_ess_base_jobid${OMPI_MCA_orte_precondition_transports:+-$OMPI_MCA_orte_precondition_transports}
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  mkdir -p "$d" && chown 65534 "$d" && rank0_ready "$d.ready" || exit 1
else
  wait_for_rank0 "$d.ready"
fi
"$probe" --expect MNCL_ERR_BOOTSTRAP --contains "belongs to uid 65534" --max-seconds 30
rc=$?
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  sleep 1
  rm -rf "$d" "$d.ready"
fi
exit $rc
