#!/usr/bin/env bash
# One rank told to use another backend (MNCL_BACKEND on rank 1 only): mncl_comm_create must fail
# on every rank, quickly, naming each rank's choice and how it was made.
# Usage: forced_disagreement.sh <mncl-run> <create_probe> <a plugin .so for rank 1>
set -u
run=$1
probe=$2
other=$3
exec "$run" -n 3 --timeout 60 --tag-output -- sh -c '
  if [ "$MNCL_RANK" = 1 ]; then export MNCL_BACKEND="$0"; else export MNCL_BACKEND=auto; fi
  exec "$1" --expect MNCL_ERR_PLUGIN --contains "ranks disagree on the backend" \
    --contains "(MNCL_BACKEND=$0): rank 1" --contains "(auto): ranks 0 and 2" --max-seconds 30
' "$other" "$probe"
