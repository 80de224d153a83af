#!/bin/sh
# One rank of `mpirun -np 2 sh same_job_id_folder.sh CREATE_PROBE`: store folders left by other
# jobs of the same Open MPI job id (mpirun's job ids differ in 16 bits only, and a killed rank 0
# in another container or boot cannot be judged stale) are not this job's, since its folder's
# name also carries the job's random transport key. Both stand-ins belong to another user, which
# fails a job that takes one for its own. Root only (chown): 77 otherwise.
set -u
. "$(dirname "$0")/rank0_ready.sh"
probe=${1:?usage: same_job_id_folder.sh CREATE_PROBE}
[ "$(id -u)" = 0 ] || exit 77
[ -n "${OMPI_MCA_ess_base_jobid:-}" ] || exit 77  # not Open MPI 4's mpirun: no private folder
if [ -z "${OMPI_MCA_orte_precondition_transports:-}" ]; then
  echo "FAIL: mpirun set no OMPI_MCA_orte_precondition_transports"
  exit 1
fi
old=/tmp/mncl-0-ompi-$OMPI_MCA_ess_base_jobid  # the name before the key was added
other=$old-0123456789abcdef-0123456789abcdef     # the same job id, another run's key
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  mkdir -p "$old" "$other" && chown 65534 "$old" "$other" && rank0_ready "$old.ready" || exit 1
else
  wait_for_rank0 "$old.ready"
fi
"$probe" --allreduce
rc=$?
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
  sleep 1
  rm -rf "$old" "$other" "$old.ready"
fi
exit $rc
