#!/usr/bin/env bash
# Sets up (installs packages, builds) and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Open MPI refuses root unless told otherwise (CI runs as root); harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "${MNCL_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
