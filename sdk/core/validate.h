// Argument validation for every collective, run before any plugin sees the call: enums,
// counts whose byte size overflows, roots and peers, NULL buffers, and the in-place rules of
// mncl.h (any other overlap of send and receive buffers is refused).
#pragma once

#include <mncl/mncl_plugin.h>

namespace mncl::core {

// Name of the public function for a kind ("mncl_allreduce").
const char *coll_function_name(int kind);
// Short name for logs and messages ("allreduce").
const char *coll_kind_name(int kind);
// This rank's payload in bytes (count x dtype size; the sum over buffers when coalesced).
size_t coll_bytes(const mncl_coll_v1_t &coll);

// Throws mncl::Error(MNCL_ERR_INVALID_ARGUMENT or MNCL_ERR_NOT_SUPPORTED) naming the function
// and what was wrong. `backend` supplies the capability masks.
void validate_collective(const mncl_coll_v1_t &coll, int rank, int size,
                         const mncl_plugin_v4_t &backend);

// The ops of a batch (mncl_sendrecv_batch; kinds MNCL_COLL_SEND/RECV), before any starts: kinds,
// peers, dtypes, counts, NULL buffers, and receive buffers that overlap another buffer of the
// batch. Messages name `fn` and the op's index.
void validate_batch(const char *fn, const mncl_p2p_v4_t *ops, size_t n, int rank, int size,
                    const mncl_plugin_v4_t &backend);

}  // namespace mncl::core
