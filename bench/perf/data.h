// Test data for the -c checks: every rank can compute every other rank's input, so each rank
// verifies its own output without extra communication (as nccl-tests does).
//
// Inputs are small integers (in [-5, 5], [0, 10] for unsigned types, {1, 2} for PROD): exact in
// every dtype, including float16 and bfloat16, so MIN, MAX, PROD (powers of two, float16's
// overflow to infinity included) and SUM (while the inputs' magnitudes add up to at most 2^p,
// p the significand bits) come out the same whatever the order of operations and are compared
// exactly; only floating-point AVG (its division) and floating-point SUM beyond that bound get a
// tolerance (data.cpp, tolerance()).
#pragma once

#include <mncl/mncl.h>

#include <cstddef>
#include <cstdint>

#include "collectives.h"

namespace mncl::perf {

// Element `index` of rank `rank`'s send buffer in check round `round`.
double input_value(mncl_dtype_t dtype, mncl_op_t op, int rank, size_t index, int round);

// Fills the send side of `c` (the in-place pointers included) with this rank's inputs and the
// receive side with a sentinel no result can equal.
void fill_for_check(const Call &c, const Layout &l, void *send, void *recv, int round);

// Counts the wrong elements of this rank's result of `c` (0 where it receives nothing).
int64_t count_wrong(const Call &c, const Layout &l, int round);

}  // namespace mncl::perf
