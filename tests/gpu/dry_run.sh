#!/usr/bin/env bash
# tests/gpu/run.sh without a GPU: a stand-in nvidia-smi reporting two GPUs, and the fake CUDA
# runtime, driver and NCCL of tests/cuda/fake_gpu (built by run.sh) first on LD_LIBRARY_PATH.
# It checks the script's plumbing (build targets, launches, summary lines) before a session on
# real hardware spends its time on it; its figures say nothing about a GPU.
#
#   tests/gpu/dry_run.sh [build-dir]        (default build-gpu-dry)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$(realpath -m "${1:-build-gpu-dry}")
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
cat >"$bin/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  -L) printf 'GPU 0: Fake GPU (UUID: GPU-fake-0)\nGPU 1: Fake GPU (UUID: GPU-fake-1)\n' ;;
  *--query-gpu=name*) printf 'Fake GPU\nFake GPU\n' ;;
  *) echo "fake nvidia-smi (tests/gpu/dry_run.sh)" ;;
esac
SMI
chmod +x "$bin/nvidia-smi"
# The fake's memcpy "kernels" make 1 GiB slow; deferred groups would only add noise.
PATH="$bin:$PATH" LD_LIBRARY_PATH="$BUILD/tests/cuda/fake-gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  MNCL_GPU_CHECK_MAX_BYTES="${MNCL_GPU_CHECK_MAX_BYTES:-16Mi}" MNCL_FAKE_NCCL_DEFER_EVERY=0 \
  bash tests/gpu/run.sh "$BUILD"
