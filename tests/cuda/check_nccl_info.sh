#!/bin/sh
# Without a GPU, the nccl plugin must load, show its capabilities and be refused with "no CUDA
# device", in mncl-info and when asked for by name. Exits 77 (ctest: skipped) on a GPU machine.
# Usage: check_nccl_info.sh <mncl-info> <cuda_device_count> <create_probe>
set -u
if [ "$("$2")" != "0" ]; then
  echo "skipped: a CUDA device is present (the GPU tests cover this machine)"
  exit 77
fi
out=$("$1" --plugins 2>&1)
echo "$out"
status=0
expect() {
  if ! printf '%s\n' "$out" | grep -Eq -- "$1"; then
    echo "MISSING: a line matching /$1/" >&2
    status=1
  fi
}
expect '^  nccl +loaded '
# ABI v5: every kind, v4's batch (bit 14) and v5's gatherv and scatterv (bits 15, 16) included.
expect 'plugin ABI v5, memory host,cuda,async,stream, collectives 0x1ffff, dtypes 0x3ff, ops 0x1f'
expect 'probe score 0: no CUDA device'
# Asked for by name, creation fails on the plugin's reason.
MNCL_BACKEND=nccl MNCL_RANK=0 MNCL_SIZE=1 "$3" --expect MNCL_ERR_PLUGIN \
  --contains "no CUDA device" --max-seconds 30 || status=1
exit $status
