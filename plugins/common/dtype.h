// Plugin kit: dtype and operator traits, and a dispatch from a runtime mncl_dtype_t to the C++
// type that stores it. Header-only; depends on the ABI headers alone.
//
//   size_t n = mncl::kit::dtype_size(coll->dtype) * coll->count;
//   mncl::kit::dispatch_dtype(coll->dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;  // int8_t ... double, kit::float16, kit::bfloat16
//     ...
//   });
#pragma once

#include <mncl/mncl.h>
#include <mncl/mncl_plugin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/half.h"

namespace mncl::kit {

// What dispatch_dtype passes to its callable: an empty value naming a type.
template <typename T>
struct type_tag {
  using type = T;
};

// True for the 2-byte float formats, which the kit reduces in float32.
template <typename T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// Calls f(type_tag<T>{}) with the storage type of dtype (fp16/bf16: the 2-byte wrappers of
// half.h). Returns false, without calling f, for a dtype this kit does not know (the core
// validates dtypes, so plugins rarely see that).
template <typename F>
bool dispatch_dtype(int32_t dtype, F &&f) {
  switch (dtype) {
    case MNCL_INT8:
      f(type_tag<int8_t>{});
      return true;
    case MNCL_UINT8:
      f(type_tag<uint8_t>{});
      return true;
    case MNCL_INT32:
      f(type_tag<int32_t>{});
      return true;
    case MNCL_UINT32:
      f(type_tag<uint32_t>{});
      return true;
    case MNCL_INT64:
      f(type_tag<int64_t>{});
      return true;
    case MNCL_UINT64:
      f(type_tag<uint64_t>{});
      return true;
    case MNCL_FLOAT16:
      f(type_tag<float16>{});
      return true;
    case MNCL_BFLOAT16:
      f(type_tag<bfloat16>{});
      return true;
    case MNCL_FLOAT32:
      f(type_tag<float>{});
      return true;
    case MNCL_FLOAT64:
      f(type_tag<double>{});
      return true;
    default:
      return false;
  }
}

// Element size in bytes; 0 for an unknown dtype.
constexpr size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case MNCL_INT8:
    case MNCL_UINT8:
      return 1;
    case MNCL_FLOAT16:
    case MNCL_BFLOAT16:
      return 2;
    case MNCL_INT32:
    case MNCL_UINT32:
    case MNCL_FLOAT32:
      return 4;
    case MNCL_INT64:
    case MNCL_UINT64:
    case MNCL_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

constexpr bool dtype_is_float(int32_t dtype) {
  return dtype == MNCL_FLOAT16 || dtype == MNCL_BFLOAT16 || dtype == MNCL_FLOAT32 ||
         dtype == MNCL_FLOAT64;
}

// Names as mncl_dtype_name()/mncl_op_name() spell them, for messages.
constexpr const char *dtype_name(int32_t dtype) {
  switch (dtype) {
    case MNCL_INT8:
      return "int8";
    case MNCL_UINT8:
      return "uint8";
    case MNCL_INT32:
      return "int32";
    case MNCL_UINT32:
      return "uint32";
    case MNCL_INT64:
      return "int64";
    case MNCL_UINT64:
      return "uint64";
    case MNCL_FLOAT16:
      return "float16";
    case MNCL_BFLOAT16:
      return "bfloat16";
    case MNCL_FLOAT32:
      return "float32";
    case MNCL_FLOAT64:
      return "float64";
    default:
      return "unknown";
  }
}

constexpr const char *op_name(int32_t op) {
  switch (op) {
    case MNCL_SUM:
      return "sum";
    case MNCL_PROD:
      return "prod";
    case MNCL_MIN:
      return "min";
    case MNCL_MAX:
      return "max";
    case MNCL_AVG:
      return "avg";
    default:
      return "unknown";
  }
}

// Every dtype / op this kit implements, as plugin dtype_mask / op_mask bits. Spelled out rather
// than MNCL_NUM_DTYPES so that a dtype appended to mncl.h is not advertised before the kit has it.
inline constexpr uint32_t kAllDtypesMask = (1u << (MNCL_FLOAT64 + 1)) - 1u;
inline constexpr uint32_t kAllOpsMask = (1u << (MNCL_AVG + 1)) - 1u;

// Kinds with a root (reduce, bcast, scatter, gather) and kinds that reduce.
inline bool is_rooted(int32_t kind) {
  return kind == MNCL_COLL_REDUCE || kind == MNCL_COLL_BCAST || kind == MNCL_COLL_SCATTER ||
         kind == MNCL_COLL_GATHER;
}
inline bool is_reduction(int32_t kind) {
  return kind == MNCL_COLL_ALLREDUCE || kind == MNCL_COLL_REDUCE ||
         kind == MNCL_COLL_REDUCE_SCATTER || kind == MNCL_COLL_ALLREDUCE_COALESCED;
}

// Whether a kind has a count per rank (plugin ABI v3: layout in kit::v_layout, common/coll.h).
inline bool is_v_kind(int32_t kind) {
  return kind == MNCL_COLL_ALLGATHERV || kind == MNCL_COLL_ALLTOALLV;
}

// Name of a collective kind for messages ("allreduce"); plugins share this one table.
inline const char *kind_name(int32_t kind) {
  switch (kind) {
    case MNCL_COLL_ALLREDUCE:
      return "allreduce";
    case MNCL_COLL_REDUCE:
      return "reduce";
    case MNCL_COLL_BCAST:
      return "bcast";
    case MNCL_COLL_SCATTER:
      return "scatter";
    case MNCL_COLL_GATHER:
      return "gather";
    case MNCL_COLL_ALLGATHER:
      return "allgather";
    case MNCL_COLL_REDUCE_SCATTER:
      return "reduce_scatter";
    case MNCL_COLL_ALLTOALL:
      return "alltoall";
    case MNCL_COLL_BARRIER:
      return "barrier";
    case MNCL_COLL_SEND:
      return "send";
    case MNCL_COLL_RECV:
      return "recv";
    case MNCL_COLL_ALLREDUCE_COALESCED:
      return "allreduce_coalesced";
    case MNCL_COLL_ALLGATHERV:
      return "allgatherv";
    case MNCL_COLL_ALLTOALLV:
      return "alltoallv";
    case MNCL_COLL_SENDRECV_BATCH:
      return "sendrecv_batch";
    case MNCL_COLL_GATHERV:
      return "gatherv";
    case MNCL_COLL_SCATTERV:
      return "scatterv";
    default:
      return "unknown collective";
  }
}

}  // namespace mncl::kit
