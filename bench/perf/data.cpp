#include "data.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "common/reduce.h"

namespace mncl::perf {

namespace {

constexpr double kSentinel = 77;  // outside every input range, and no result equals it

bool is_unsigned(mncl_dtype_t d) {
  return d == MNCL_UINT8 || d == MNCL_UINT32 || d == MNCL_UINT64;
}
bool is_v(CollKind k) {
  return k == CollKind::kAllgatherv || k == CollKind::kAlltoallv || k == CollKind::kGatherv ||
         k == CollKind::kScatterv;
}
bool is_float(mncl_dtype_t d) {
  return d == MNCL_FLOAT16 || d == MNCL_BFLOAT16 || d == MNCL_FLOAT32 || d == MNCL_FLOAT64;
}

// Integer results wrap like the target type (two's complement), as mncl.h specifies.
template <typename T>
void put_int(void *base, size_t i, double v) {
  static_cast<T *>(base)[i] = static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(v)));
}

void put(mncl_dtype_t d, void *base, size_t i, double v) {
  switch (d) {
    case MNCL_INT8:
      return put_int<int8_t>(base, i, v);
    case MNCL_UINT8:
      return put_int<uint8_t>(base, i, v);
    case MNCL_INT32:
      return put_int<int32_t>(base, i, v);
    case MNCL_UINT32:
      return put_int<uint32_t>(base, i, v);
    case MNCL_INT64:
      return put_int<int64_t>(base, i, v);
    case MNCL_UINT64:
      return put_int<uint64_t>(base, i, v);
    case MNCL_FLOAT16:
      static_cast<uint16_t *>(base)[i] = kit::float_to_float16_bits(static_cast<float>(v));
      return;
    case MNCL_BFLOAT16:
      static_cast<uint16_t *>(base)[i] = kit::float_to_bfloat16_bits(static_cast<float>(v));
      return;
    case MNCL_FLOAT32:
      static_cast<float *>(base)[i] = static_cast<float>(v);
      return;
    case MNCL_FLOAT64:
      static_cast<double *>(base)[i] = v;
      return;
  }
}

double get(mncl_dtype_t d, const void *base, size_t i) {
  switch (d) {
    case MNCL_INT8:
      return static_cast<const int8_t *>(base)[i];
    case MNCL_UINT8:
      return static_cast<const uint8_t *>(base)[i];
    case MNCL_INT32:
      return static_cast<const int32_t *>(base)[i];
    case MNCL_UINT32:
      return static_cast<const uint32_t *>(base)[i];
    case MNCL_INT64:
      return static_cast<double>(static_cast<const int64_t *>(base)[i]);
    case MNCL_UINT64:
      return static_cast<double>(static_cast<const uint64_t *>(base)[i]);
    case MNCL_FLOAT16:
      return kit::float16_bits_to_float(static_cast<const uint16_t *>(base)[i]);
    case MNCL_BFLOAT16:
      return kit::bfloat16_bits_to_float(static_cast<const uint16_t *>(base)[i]);
    case MNCL_FLOAT32:
      return static_cast<const float *>(base)[i];
    case MNCL_FLOAT64:
      return static_cast<const double *>(base)[i];
  }
  return 0;
}

// What storing v in the dtype and reading it back gives (wrapping, rounding).
double roundtrip(mncl_dtype_t d, double v) {
  unsigned char tmp[8];
  put(d, tmp, 0, v);
  return get(d, tmp, 0);
}

// op over all ranks of element `index` of their inputs, as the dtype would hold it.
double reduced_value(const Call &c, size_t index, int round) {
  double acc = kit::fold_ranks<double>(
      c.op, c.nranks, [&](int q) { return input_value(c.dtype, c.op, q, index, round); },
      [](double a, double b) { return a < b; });
  if (c.op == MNCL_AVG) {
    acc = is_float(c.dtype) ? acc / c.nranks : std::trunc(acc / c.nranks);
  }
  return roundtrip(c.dtype, acc);
}

// Significand bits, the implicit one included: integers up to 2^p in magnitude are exact.
int significand_bits(mncl_dtype_t d) {
  switch (d) {
    case MNCL_FLOAT16:
      return 11;
    case MNCL_BFLOAT16:
      return 8;
    case MNCL_FLOAT32:
      return 24;
    default:
      return 53;
  }
}

// The absolute error a correct backend may show in element `index` of a reduction's result: 0
// (an exact comparison) unless the order of operations can change the rounding. mncl.h lets
// floating-point reductions differ in the last bits between backends (summation order; 16-bit
// floats may be accumulated in float32), so what matters is whether any order rounds:
// * integers: exact (they wrap, in any order);
// * MIN, MAX: a selection, exact;
// * PROD: the inputs are 1 or 2, so every partial product is a power of two, exact in any order;
//   an overflow (float16 at 16+ ranks: 2^16 > 65504) gives infinity in any order too, as all
//   factors are >= 1, and infinity must compare equal to infinity;
// * SUM: the inputs are small integers, so while the sum of their magnitudes A stays within 2^p
//   (bfloat16 256, float16 2048: 51 / 409 ranks at |input| <= 5) every partial sum is an integer
//   the dtype holds exactly, in any order; beyond that the order changes the rounding, and the
//   bound of any order of n-1 additions, n * 2^-p * A, applies (as nccl-tests, which checks
//   floating-point sums with a tolerance);
// * floating-point AVG: the sum, then a division by n that may round differently (in float32,
//   then narrowed; by a multiplication with 1/n; each input divided first): (n + 4) * 2^-p * A / n
//   covers those and any summation order. That bound is a backend rounding in the dtype at
//   every step (as NCCL's pre-multiplied AVG may): for bfloat16 from 8 ranks it exceeds one
//   rank's share of an element, so a missing rank shows in some elements only (still failing
//   the run), not in each.
double tolerance(const Call &c, size_t index, int round) {
  if (!is_float(c.dtype) || !spec_of(c.kind).reduces) return 0;
  if (c.op != MNCL_SUM && c.op != MNCL_AVG) return 0;
  double a = 0;  // sum of the magnitudes of the inputs
  for (int q = 0; q < c.nranks; ++q)
    a += std::fabs(roundtrip(c.dtype, input_value(c.dtype, c.op, q, index, round)));
  const int p = significand_bits(c.dtype);
  const double u = std::ldexp(1.0, -p), n = c.nranks;
  if (c.op == MNCL_SUM) return a <= std::ldexp(1.0, p) ? 0 : n * u * a;
  return (n + 4) * u * a / n;
}

}  // namespace

// splitmix64's finaliser: every input bit affects every output bit.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hash of (rank, index, round), so that no two ranks, blocks or rounds hold the same data (a
// linear formula repeats every few ranks/elements, which lets a result taken from the wrong rank
// or block pass the check). The range stays small (PROD: 1..2, else 11 values) so that sums and
// products over the ranks stay exact in every dtype, half/bf16/int8 included (up to the bounds
// tolerance() gives: float16 products overflow to infinity at 16+ ranks, exactly so in any order).
double input_value(mncl_dtype_t dtype, mncl_op_t op, int rank, size_t index, int round) {
  const uint64_t mix =
      mix64(mix64(mix64(static_cast<uint64_t>(rank)) ^ static_cast<uint64_t>(index)) ^
            static_cast<uint64_t>(static_cast<uint32_t>(round)));
  if (op == MNCL_PROD) return 1 + static_cast<double>(mix % 2);
  const double v = static_cast<double>(mix % 11);
  return is_unsigned(dtype) ? v : v - 5;
}

void fill_for_check(const Call &c, const Layout &l, void *send, void *recv, int round) {
  const size_t big = std::max(l.send_elems, l.recv_elems);
  for (size_t i = 0; i < big; ++i) put(c.dtype, recv, i, kSentinel);
  // The v collectives also get a guard element right after the packed blocks, which no count
  // reaches (the buffers hold one element more than the largest size).
  if (is_v(c.kind)) put(c.dtype, recv, l.recv_elems, kSentinel);
  if (c.kind == CollKind::kBcast) {
    if (c.rank == c.root)
      for (size_t i = 0; i < l.count; ++i)
        put(c.dtype, c.recvbuf, i, input_value(c.dtype, c.op, c.rank, i, round));
    return;
  }
  // The send pointer may lie inside recv (in place): write the inputs after the sentinel.
  (void)send;
  size_t n_send = l.send_elems;
  if ((c.kind == CollKind::kScatter || c.kind == CollKind::kScatterv) && c.rank != c.root)
    n_send = 0;
  // In place, allgatherv's (and gatherv's root's) send block lies inside recvbuf: write exactly
  // the block.
  if (c.kind == CollKind::kAllgatherv || c.kind == CollKind::kGatherv) n_send = c.count;
  void *dst = const_cast<void *>(c.sendbuf);
  for (size_t i = 0; i < n_send; ++i)
    put(c.dtype, dst, i, input_value(c.dtype, c.op, c.rank, i, round));
}

int64_t count_wrong(const Call &c, const Layout &l, int round) {
  const size_t n = static_cast<size_t>(c.nranks), r = static_cast<size_t>(c.rank);
  const mncl_dtype_t d = c.dtype;
  int64_t wrong = 0;
  // Equal values (equal infinities included) pass; NaN only where NaN is expected; else the
  // difference must be within the tolerance, which is 0 except for some reductions.
  auto check_tol = [&](size_t i, double expected, double tol) {
    const double got = get(d, c.recvbuf, i);
    const bool ok = got == expected || (std::isnan(got) && std::isnan(expected)) ||
                    (tol > 0 && std::fabs(got - expected) <= tol);
    if (!ok) ++wrong;
  };
  auto check = [&](size_t i, double expected) { check_tol(i, expected, 0); };
  // Element i of the result holds the reduction of the inputs' element `index`.
  auto check_reduced = [&](size_t i, size_t index) {
    check_tol(i, reduced_value(c, index, round), tolerance(c, index, round));
  };
  auto in = [&](size_t rank, size_t index) {
    return roundtrip(d, input_value(d, c.op, static_cast<int>(rank), index, round));
  };
  const size_t per = l.count;
  switch (c.kind) {
    case CollKind::kAllreduce:
      for (size_t i = 0; i < l.count; ++i) check_reduced(i, i);
      break;
    case CollKind::kReduce:
      if (c.rank == c.root)
        for (size_t i = 0; i < l.count; ++i) check_reduced(i, i);
      break;
    case CollKind::kBcast:
      for (size_t i = 0; i < l.count; ++i) check(i, in(c.root, i));
      break;
    case CollKind::kScatter:
      for (size_t i = 0; i < per; ++i) check(i, in(c.root, r * per + i));
      break;
    case CollKind::kGather:
      if (c.rank == c.root)
        for (size_t q = 0; q < n; ++q)
          for (size_t i = 0; i < per; ++i) check(q * per + i, in(q, i));
      break;
    case CollKind::kAllgather:
      for (size_t q = 0; q < n; ++q)
        for (size_t i = 0; i < per; ++i) check(q * per + i, in(q, i));
      break;
    case CollKind::kReduceScatter:
      for (size_t i = 0; i < per; ++i) check_reduced(i, r * per + i);
      break;
    case CollKind::kAlltoall:
      for (size_t q = 0; q < n; ++q)
        for (size_t i = 0; i < per; ++i) check(q * per + i, in(q, r * per + i));
      break;
    case CollKind::kSendrecv:
      if (n > 1)
        for (size_t i = 0; i < l.count; ++i) check(i, in((r + n - 1) % n, i));
      break;
    case CollKind::kAllgatherv:
      for (size_t q = 0; q < n; ++q)
        for (size_t i = 0; i < c.recvcounts[q]; ++i) check(c.rdispls[q] + i, in(q, i));
      check(l.recv_elems, kSentinel);
      break;
    case CollKind::kAlltoallv:
      for (size_t q = 0; q < n; ++q) {
        // Where rank q's block for this rank starts in q's (packed) send buffer.
        size_t from = 0;
        for (size_t j = 0; j < r; ++j)
          from += v_pair(l.count, c.nranks, static_cast<int>(q), static_cast<int>(j));
        for (size_t i = 0; i < c.recvcounts[q]; ++i) check(c.rdispls[q] + i, in(q, from + i));
      }
      check(l.recv_elems, kSentinel);
      break;
    case CollKind::kGatherv:
      if (c.rank == c.root) {
        for (size_t q = 0; q < n; ++q)
          for (size_t i = 0; i < c.recvcounts[q]; ++i) check(c.rdispls[q] + i, in(q, i));
        check(l.recv_elems, kSentinel);
      } else {
        // Not the root: nothing may land in recvbuf.
        for (size_t i = 0; i <= l.recv_elems; ++i) check(i, kSentinel);
      }
      break;
    case CollKind::kScatterv: {
      // Rank r's block starts at sdispls[r] of the root's packed send buffer.
      const size_t from = c.sdispls[r];
      for (size_t i = 0; i < c.count; ++i) check(i, in(static_cast<size_t>(c.root), from + i));
      // The element after the block keeps its sentinel, unless in place at the root, where the
      // block lies inside the send buffer and the root's next block follows it.
      if (!(c.inplace && c.rank == c.root)) check(c.count, kSentinel);
      break;
    }
  }
  return wrong;
}

}  // namespace mncl::perf
