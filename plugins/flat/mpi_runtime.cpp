#include "flat/mpi_runtime.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI extensions: MPIX_Query_cuda_support
#endif

#include <cstdlib>

#include "common/dtype.h"
#include "common/host.h"
#include "common/reduce.h"
#include "flat/flat_comm.h"  // stop_progress_thread

namespace mncl::flat {

namespace kit = mncl::kit;

namespace {

// Set once under g_init_mutex; read without it afterwards (MPI cannot go back to uninitialized
// except through MPI_Finalize, which mpi_finalized() checks).
std::mutex g_init_mutex;
bool g_ready = false;           // ensure_mpi succeeded once
bool g_we_initialized = false;  // flat called MPI_Init_thread, so flat finalizes
int g_thread_level = MPI_THREAD_SINGLE;
std::mutex g_mpi_mutex;  // see MpiLock

MPI_Datatype g_half_types[2] = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL};  // float16, bfloat16
MPI_Op g_half_ops[2][4];                                                // [dtype][sum..max]
// Where MPI's built-in op breaks the ABI's rules, on Open MPI 4.1's op/avx component (chosen
// at run time on any x86 CPU with AVX): it adds 8-bit integers with saturation (100+100+100 is
// 127 in int8, not the wrapped 44), and its float MIN/MAX drop a NaN. Flat's own ops, the
// plugin kit's kernels that its small calls already use, make every count agree with naive.
MPI_Op g_int8_sum_ops[2] = {MPI_OP_NULL, MPI_OP_NULL};  // int8, uint8
MPI_Op g_float_ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL},
                            {MPI_OP_NULL, MPI_OP_NULL}};  // [float32, float64][min, max]

// inout[i] = in[i] op inout[i] by the plugin kit: fp16/bf16 computed in float32 (one rounding
// per step), integer SUM wrapping, float MIN/MAX propagating NaN. The ops are commutative, so
// the kit's dst = dst op src is the same.
template <int32_t Dtype, int32_t Op>
void kit_reduce(void *in, void *inout, int *len, MPI_Datatype *) {
  kit::reduce_into(inout, in, static_cast<size_t>(*len), Dtype, Op);
}

template <int32_t Dtype>
void create_half_ops(MPI_Op *ops) {
  MPI_Op_create(&kit_reduce<Dtype, MNCL_SUM>, 1, &ops[MNCL_SUM]);
  MPI_Op_create(&kit_reduce<Dtype, MNCL_PROD>, 1, &ops[MNCL_PROD]);
  MPI_Op_create(&kit_reduce<Dtype, MNCL_MIN>, 1, &ops[MNCL_MIN]);
  MPI_Op_create(&kit_reduce<Dtype, MNCL_MAX>, 1, &ops[MNCL_MAX]);
}

void create_kit_ops() {
  create_half_ops<MNCL_FLOAT16>(g_half_ops[0]);
  create_half_ops<MNCL_BFLOAT16>(g_half_ops[1]);
  MPI_Op_create(&kit_reduce<MNCL_INT8, MNCL_SUM>, 1, &g_int8_sum_ops[0]);
  MPI_Op_create(&kit_reduce<MNCL_UINT8, MNCL_SUM>, 1, &g_int8_sum_ops[1]);
  MPI_Op_create(&kit_reduce<MNCL_FLOAT32, MNCL_MIN>, 1, &g_float_ops[0][0]);
  MPI_Op_create(&kit_reduce<MNCL_FLOAT32, MNCL_MAX>, 1, &g_float_ops[0][1]);
  MPI_Op_create(&kit_reduce<MNCL_FLOAT64, MNCL_MIN>, 1, &g_float_ops[1][0]);
  MPI_Op_create(&kit_reduce<MNCL_FLOAT64, MNCL_MAX>, 1, &g_float_ops[1][1]);
}

void free_kit_ops() {
  for (auto &ops : g_half_ops) {
    for (MPI_Op &op : ops) MPI_Op_free(&op);
  }
  for (MPI_Op &op : g_int8_sum_ops) MPI_Op_free(&op);
  for (auto &ops : g_float_ops) {
    for (MPI_Op &op : ops) MPI_Op_free(&op);
  }
}

const char *thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown thread level";
  }
}

// Registered with atexit when flat initialized MPI: mpirun reports a rank that exits without
// MPI_Finalize as failed, so flat must finalize, and only at exit can it be sure nobody will
// need MPI again in this process. Skipped if the application finalized MPI itself.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  stop_progress_thread();  // it may still issue collectives on the objects freed here
  free_kit_ops();
  for (MPI_Datatype &t : g_half_types) MPI_Type_free(&t);
  MPI_Finalize();
}

}  // namespace

bool launched_by_mpi_launcher() {
  // The core's launched_by_mpi: Open MPI's mpirun, PMI-1/2 (MPICH, srun --mpi=pmi2), PMIx.
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (secure_getenv(name) != nullptr) return true;
  }
  return false;
}

int launcher_world_size() {
  // PMIx (srun --mpi=pmix) exports no size of its own: Slurm's step size stands in.
  for (const char *name :
       {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}) {
    if (const char *value = secure_getenv(name)) {
      const int size = std::atoi(value);
      if (size > 0) return size;
    }
  }
  return 0;
}

std::string not_launched_message(int size) {
  return kit::format(
      "not launched by mpirun/srun (OMPI_COMM_WORLD_SIZE unset): launch with mpirun -np %d "
      "<program> (or srun -n %d --mpi=pmix <program>); the flat backend runs on MPI and cannot "
      "join %d ranks started without an MPI launcher",
      size, size, size);
}

void ensure_mpi(const mncl_host_v1_t *host) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_ready) {
    if (mpi_finalized()) {
      throw kit::Error(MNCL_ERR_PLUGIN,
                       "flat: MPI has been finalized in this process and cannot be initialized "
                       "again; create flat communicators before MPI_Finalize");
    }
    return;
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw kit::Error(MNCL_ERR_PLUGIN,
                     "flat: the application has already called MPI_Finalize, and MPI cannot be "
                     "initialized twice in one process");
  }
  if (initialized) {
    MPI_Query_thread(&g_thread_level);
    MNCL_KIT_LOG(host, MNCL_LOG_INFO, "using MPI initialized by the application (%s)",
                 thread_level_name(g_thread_level));
    // Open MPI 4.1 reports a failed non-blocking collective on MPI_COMM_WORLD (below): with the
    // application's fatal handler there, a mismatch or a lost peer ends the job instead of
    // returning an error. The handler is the application's to choose: say so once.
    MPI_Errhandler world_handler = MPI_ERRHANDLER_NULL;
    if (MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler) == MPI_SUCCESS) {
      if (world_handler == MPI_ERRORS_ARE_FATAL) {
        MNCL_KIT_LOG(host, MNCL_LOG_WARN,
                     "MPI_COMM_WORLD's error handler is MPI_ERRORS_ARE_FATAL: Open MPI reports "
                     "failed non-blocking collectives there, so a failed flat call ends the job "
                     "instead of returning an error; set MPI_ERRORS_RETURN on MPI_COMM_WORLD to "
                     "get MNCL's errors");
      }
      if (world_handler != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&world_handler);
    }
  } else {
    // MULTIPLE when the library offers it: MNCL may be called from several threads (one per
    // communicator). Open MPI grants at least SERIALIZED, and MpiLock covers that case.
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_thread_level);
    if (rc != MPI_SUCCESS) {
      throw kit::Error(MNCL_ERR_PLUGIN,
                       kit::format("flat: MPI_Init_thread failed: %s", mpi_error_text(rc).c_str()));
    }
    g_we_initialized = true;
    // Open MPI 4.1 reports a failed non-blocking collective (MPI_Testall: the polled and
    // mncl_i* paths) on MPI_COMM_WORLD, not on flat's communicator: left fatal, it kills the
    // rank and mpirun the job. An application that initialized MPI keeps its own handler.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize_at_exit);
    MNCL_KIT_LOG(host, MNCL_LOG_INFO, "initialized MPI (%s); it is finalized at exit",
                 thread_level_name(g_thread_level));
  }
  if (g_thread_level < MPI_THREAD_SERIALIZED) {
    MNCL_KIT_LOG(host, MNCL_LOG_WARN,
                 "MPI was initialized with %s; call MNCL from the thread that initialized "
                 "MPI only, or initialize MPI with MPI_THREAD_MULTIPLE",
                 thread_level_name(g_thread_level));
  }

  // 2-byte opaque types: MPI never interprets fp16/bf16 bits itself, only our ops do.
  const char *names[2] = {"mncl_float16", "mncl_bfloat16"};
  for (int i = 0; i < 2; ++i) {
    MPI_Type_contiguous(2, MPI_BYTE, &g_half_types[i]);
    MPI_Type_set_name(g_half_types[i], names[i]);
    MPI_Type_commit(&g_half_types[i]);
  }
  create_kit_ops();
  g_ready = true;
}

int mpi_thread_level() {
  return g_thread_level;
}

MpiLock::MpiLock() : locked_(g_thread_level < MPI_THREAD_MULTIPLE) {
  if (locked_) g_mpi_mutex.lock();
}
MpiLock::~MpiLock() {
  if (locked_) g_mpi_mutex.unlock();
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

MPI_Datatype mpi_datatype(int32_t dtype) {
  switch (dtype) {
    case MNCL_INT8:
      return MPI_INT8_T;
    case MNCL_UINT8:
      return MPI_UINT8_T;
    case MNCL_INT32:
      return MPI_INT32_T;
    case MNCL_UINT32:
      return MPI_UINT32_T;
    case MNCL_INT64:
      return MPI_INT64_T;
    case MNCL_UINT64:
      return MPI_UINT64_T;
    case MNCL_FLOAT16:
      return g_half_types[0];
    case MNCL_BFLOAT16:
      return g_half_types[1];
    case MNCL_FLOAT32:
      return MPI_FLOAT;
    case MNCL_FLOAT64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(int32_t dtype, int32_t op) {
  const int32_t base = op == MNCL_AVG ? MNCL_SUM : op;  // AVG: sum, then divide
  if (base < MNCL_SUM || base > MNCL_MAX) return MPI_OP_NULL;
  if (dtype == MNCL_FLOAT16 || dtype == MNCL_BFLOAT16) {
    return g_half_ops[dtype == MNCL_BFLOAT16 ? 1 : 0][base];
  }
  if ((dtype == MNCL_INT8 || dtype == MNCL_UINT8) && base == MNCL_SUM) {
    return g_int8_sum_ops[dtype == MNCL_UINT8 ? 1 : 0];
  }
  if ((dtype == MNCL_FLOAT32 || dtype == MNCL_FLOAT64) && (base == MNCL_MIN || base == MNCL_MAX)) {
    return g_float_ops[dtype == MNCL_FLOAT64 ? 1 : 0][base == MNCL_MAX ? 1 : 0];
  }
  // Built-in ops otherwise: MIN/MAX on MPI_UINT*_T compare as unsigned, wider integer SUM and
  // every integer PROD wrap (op/avx saturates only 8-bit sums).
  static const MPI_Op kBuiltin[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
  return kBuiltin[base];
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    return kit::format("MPI error code %d", rc);
  }
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return kit::format("%s (MPI error class %d)", text, cls);
}

mncl_status_t mpi_error_status(int rc) {
  int cls = MPI_ERR_UNKNOWN;
  MPI_Error_class(rc, &cls);
  switch (cls) {
    case MPI_ERR_NO_MEM:
      return MNCL_ERR_SYSTEM;
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_INTERN:
      return MNCL_ERR_INTERNAL;
    default:
      return MNCL_ERR_REMOTE;  // truncation, a lost peer, a transport failure
  }
}

bool mpi_cuda_aware_now() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized && MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace mncl::flat
