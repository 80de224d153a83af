// The coalesced allreduce gives the same result as one allreduce per buffer, on any backend.
// An SPMD program (like the conformance suite): every rank allreduces 100 buffers of assorted
// sizes with one mncl_allreduce_coalesced call and again with 100 mncl_allreduce calls, for
// several dtypes and every op, and checks that both are bit-identical and equal to the value
// computed locally. The data are small integers, exact in every dtype, so the summation order
// of a backend cannot change the bits. Run it under any launcher, with any MNCL_BACKEND:
//
//   mpirun -np 3 coalesced_test             MNCL_BACKEND=flat
//   mncl-run -n 3 --backend naive -- coalesced_test
#include <mncl/mncl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mncl_test_data.h"

namespace {

// The element codec and the reduction data are the conformance suite's.
using mncl_testing::encode;
using mncl_testing::mix;

int g_rank = 0, g_size = 1;
int g_failures = 0;

#define CHECK_MNCL(call)                                                                           \
  do {                                                                                             \
    const mncl_status_t st_ = (call);                                                              \
    if (st_ != MNCL_OK) {                                                                          \
      std::fprintf(stderr, "rank %d: %s failed: %s: %s\n", g_rank, #call, mncl_status_string(st_), \
                   mncl_last_error());                                                             \
      std::exit(2); /* the ranks can no longer match their calls: stop */                          \
    }                                                                                              \
  } while (0)

// 100 sizes: empty, tiny, odd, primes and a few larger ones, in no order.
std::vector<size_t> assorted_counts() {
  std::vector<size_t> counts;
  const size_t fixed[] = {0, 1, 2, 3, 7, 31, 64, 100, 257, 1021, 4099, 12289};
  for (size_t c : fixed) counts.push_back(c);
  for (size_t b = counts.size(); b < 100; ++b) counts.push_back(mix(b) % 600);
  return counts;
}

void check_case(mncl_comm_t comm, mncl_dtype_t dt, mncl_op_t op, bool nonblocking) {
  const size_t es = mncl_dtype_size(dt);
  const std::vector<size_t> counts = assorted_counts();
  const size_t n = counts.size();
  std::vector<std::vector<unsigned char>> send(n), coalesced(n), single(n), want(n);
  std::vector<const void *> sendbufs(n);
  std::vector<void *> recvbufs(n);
  for (size_t b = 0; b < n; ++b) {
    // At least one byte, so that count 0 still has distinct, non-NULL pointers.
    const size_t bytes = counts[b] * es + 1;
    send[b].assign(bytes, 0);
    want[b].assign(bytes, 0);
    const int seed = static_cast<int>(b);  // each buffer holds other values
    for (size_t i = 0; i < counts[b]; ++i) {
      encode(dt, mncl_testing::reduce_input(dt, op, g_rank, g_size, i, seed), &send[b][i * es]);
      encode(dt, mncl_testing::reduce_output(dt, op, g_size, i, seed), &want[b][i * es]);
    }
    coalesced[b] = send[b];
    single[b].assign(bytes, 0xA5);
    // Every third buffer in place, the others out of place.
    if (b % 3 == 0) {
      sendbufs[b] = coalesced[b].data();
    } else {
      coalesced[b].assign(bytes, 0xA5);
      sendbufs[b] = send[b].data();
    }
    recvbufs[b] = coalesced[b].data();
  }
  if (nonblocking) {
    mncl_request_t req = nullptr;
    CHECK_MNCL(mncl_iallreduce_coalesced(comm, sendbufs.data(), recvbufs.data(), counts.data(), n,
                                         dt, op, nullptr, &req));
    CHECK_MNCL(mncl_wait(req, -1));
  } else {
    CHECK_MNCL(mncl_allreduce_coalesced(comm, sendbufs.data(), recvbufs.data(), counts.data(), n,
                                        dt, op, nullptr));
  }
  for (size_t b = 0; b < n; ++b) {
    CHECK_MNCL(mncl_allreduce(comm, send[b].data(), single[b].data(), counts[b], dt, op, nullptr));
  }
  for (size_t b = 0; b < n; ++b) {
    const size_t bytes = counts[b] * es;
    const bool same = std::memcmp(coalesced[b].data(), single[b].data(), bytes) == 0;
    const bool right = std::memcmp(single[b].data(), want[b].data(), bytes) == 0;
    if (same && right) continue;
    ++g_failures;
    std::fprintf(stderr, "rank %d: %s %s %s buffer %zu (count %zu%s): %s\n", g_rank,
                 nonblocking ? "iallreduce_coalesced" : "allreduce_coalesced", mncl_dtype_name(dt),
                 mncl_op_name(op), b, counts[b], b % 3 == 0 ? ", in place" : "",
                 !same ? "coalesced result differs from the single allreduce"
                       : "both differ from the expected values");
  }
}

}  // namespace

int main() {
  mncl_comm_t comm = nullptr;
  CHECK_MNCL(mncl_comm_create(nullptr, &comm));
  CHECK_MNCL(mncl_comm_rank(comm, &g_rank));
  CHECK_MNCL(mncl_comm_size(comm, &g_size));
  const char *backend = "?";
  CHECK_MNCL(mncl_comm_backend(comm, &backend));

  const mncl_dtype_t dtypes[] = {MNCL_INT8,    MNCL_UINT8,    MNCL_INT32,   MNCL_INT64,
                                 MNCL_FLOAT16, MNCL_BFLOAT16, MNCL_FLOAT32, MNCL_FLOAT64};
  const mncl_op_t ops[] = {MNCL_SUM, MNCL_PROD, MNCL_MIN, MNCL_MAX, MNCL_AVG};
  int cases = 0;
  for (mncl_dtype_t dt : dtypes) {
    for (mncl_op_t op : ops) {
      check_case(comm, dt, op, false);
      ++cases;
    }
  }
  check_case(comm, MNCL_FLOAT32, MNCL_SUM, true);
  check_case(comm, MNCL_INT32, MNCL_AVG, true);
  cases += 2;
  CHECK_MNCL(mncl_comm_destroy(comm));
  std::printf("rank %d/%d on %s: %d cases of 100 buffers, %s\n", g_rank, g_size, backend, cases,
              g_failures == 0 ? "coalesced == single allreduces" : "MISMATCHES");
  return g_failures == 0 ? 0 : 1;
}
