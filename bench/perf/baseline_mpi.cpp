// The raw MPI baseline: the same calls as MNCL's, through MPI_COMM_WORLD's duplicate, on the
// same buffers. Only usable when the job was launched by mpirun (MPI then owns the ranks). MPI
// runs at MPI_THREAD_MULTIPLE when the backend may be flat, else MPI_THREAD_FUNNELED (see
// mpi_process_init).
// The C API only: the C++ bindings add nothing here and warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "baseline.h"

namespace mncl::perf {

namespace {

bool g_we_initialized = false;

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

MPI_Datatype mpi_type(mncl_dtype_t d, bool reduces) {
  switch (d) {
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
    case MNCL_FLOAT32:
      return MPI_FLOAT;
    case MNCL_FLOAT64:
      return MPI_DOUBLE;
    // MPI has no 16-bit float reductions; moving them as opaque 16-bit words is fair.
    case MNCL_FLOAT16:
    case MNCL_BFLOAT16:
      return reduces ? MPI_DATATYPE_NULL : MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(mncl_op_t op) {
  switch (op) {
    case MNCL_SUM:
      return MPI_SUM;
    case MNCL_PROD:
      return MPI_PROD;
    case MNCL_MIN:
      return MPI_MIN;
    case MNCL_MAX:
      return MPI_MAX;
    case MNCL_AVG:
      return MPI_OP_NULL;  // MPI has no average
  }
  return MPI_OP_NULL;
}

void ok(int rc, const char *what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(msg, len));
}

class MpiBaseline : public Baseline {
 public:
  explicit MpiBaseline(MPI_Comm comm) : comm_(comm) {}
  ~MpiBaseline() override { MPI_Comm_free(&comm_); }
  const char *name() const override { return "mpi"; }
  std::string detail() const override {
    int level = -1;
    MPI_Query_thread(&level);
    switch (level) {
      case MPI_THREAD_SINGLE:
        return "MPI_THREAD_SINGLE";
      case MPI_THREAD_FUNNELED:
        return "MPI_THREAD_FUNNELED";
      case MPI_THREAD_SERIALIZED:
        return "MPI_THREAD_SERIALIZED";
      case MPI_THREAD_MULTIPLE:
        return "MPI_THREAD_MULTIPLE";
    }
    return "";
  }

  bool supports(const Call &c) const override {
    const bool reduces = spec_of(c.kind).reduces;
    if (mpi_type(c.dtype, reduces) == MPI_DATATYPE_NULL) return false;
    if (reduces && mpi_op(c.op) == MPI_OP_NULL) return false;
    // MPI counts and displacements are ints; the v collectives' packed displacements reach the
    // total of their counts (gatherv's and scatterv's root arrays are known on every rank, so
    // all ranks decide alike).
    const size_t largest =
        std::max({c.count, std::accumulate(c.recvcounts.begin(), c.recvcounts.end(), size_t(0)),
                  std::accumulate(c.sendcounts.begin(), c.sendcounts.end(), size_t(0))});
    return largest <= INT_MAX || refuse(c, largest);
  }

  void run(const Call &c) override {
    const bool reduces = spec_of(c.kind).reduces;
    const MPI_Datatype t = mpi_type(c.dtype, reduces);
    const MPI_Op op = reduces ? mpi_op(c.op) : MPI_OP_NULL;
    const int n = static_cast<int>(c.count);
    void *send = const_cast<void *>(c.sendbuf);
    const bool root = c.rank == c.root;
    switch (c.kind) {
      case CollKind::kAllreduce:
        ok(MPI_Allreduce(c.inplace ? MPI_IN_PLACE : send, c.recvbuf, n, t, op, comm_),
           "MPI_Allreduce");
        break;
      case CollKind::kReduce:
        ok(MPI_Reduce(root && c.inplace ? MPI_IN_PLACE : send, c.recvbuf, n, t, op, c.root, comm_),
           "MPI_Reduce");
        break;
      case CollKind::kBcast:
        ok(MPI_Bcast(c.recvbuf, n, t, c.root, comm_), "MPI_Bcast");
        break;
      case CollKind::kScatter:
        ok(MPI_Scatter(send, n, t, root && c.inplace ? MPI_IN_PLACE : c.recvbuf, n, t, c.root,
                       comm_),
           "MPI_Scatter");
        break;
      case CollKind::kGather:
        ok(MPI_Gather(root && c.inplace ? MPI_IN_PLACE : send, n, t, c.recvbuf, n, t, c.root,
                      comm_),
           "MPI_Gather");
        break;
      case CollKind::kAllgather:
        ok(MPI_Allgather(c.inplace ? MPI_IN_PLACE : send, n, t, c.recvbuf, n, t, comm_),
           "MPI_Allgather");
        break;
      case CollKind::kReduceScatter:
        // MPI's in-place form reads the whole input from recvbuf and leaves block 0 there:
        // the same data movement as MNCL's (result in the rank's own block).
        ok(c.inplace ? MPI_Reduce_scatter_block(MPI_IN_PLACE, send, n, t, op, comm_)
                     : MPI_Reduce_scatter_block(send, c.recvbuf, n, t, op, comm_),
           "MPI_Reduce_scatter_block");
        break;
      case CollKind::kAlltoall:
        ok(MPI_Alltoall(c.inplace ? MPI_IN_PLACE : send, n, t, c.recvbuf, n, t, comm_),
           "MPI_Alltoall");
        break;
      case CollKind::kAllgatherv:
        ok(MPI_Allgatherv(c.inplace ? MPI_IN_PLACE : send, n, t, c.recvbuf, ints(c.recvcounts, rc_),
                          ints(c.rdispls, rd_), t, comm_),
           "MPI_Allgatherv");
        break;
      case CollKind::kAlltoallv:
        ok(MPI_Alltoallv(send, ints(c.sendcounts, sc_), ints(c.sdispls, sd_), t, c.recvbuf,
                         ints(c.recvcounts, rc_), ints(c.rdispls, rd_), t, comm_),
           "MPI_Alltoallv");
        break;
      // The counts and displacements are the root's (only the root passes them, as with MNCL).
      case CollKind::kGatherv:
        ok(MPI_Gatherv(root && c.inplace ? MPI_IN_PLACE : send, n, t, c.recvbuf,
                       root ? ints(c.recvcounts, rc_) : nullptr,
                       root ? ints(c.rdispls, rd_) : nullptr, t, c.root, comm_),
           "MPI_Gatherv");
        break;
      case CollKind::kScatterv:
        ok(MPI_Scatterv(send, root ? ints(c.sendcounts, sc_) : nullptr,
                        root ? ints(c.sdispls, sd_) : nullptr, t,
                        root && c.inplace ? MPI_IN_PLACE : c.recvbuf, n, t, c.root, comm_),
           "MPI_Scatterv");
        break;
      case CollKind::kSendrecv: {
        if (c.nranks == 1) break;
        const int next = (c.rank + 1) % c.nranks, prev = (c.rank + c.nranks - 1) % c.nranks;
        ok(MPI_Sendrecv(send, n, t, next, 0, c.recvbuf, n, t, prev, 0, comm_, MPI_STATUS_IGNORE),
           "MPI_Sendrecv");
        break;
      }
    }
  }

  void barrier() override { ok(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  // Too many elements for MPI's int arguments: N/A in the raw column, said once per collective.
  bool refuse(const Call &c, size_t elems) const {
    if (c.rank == 0 && refused_.insert(c.kind).second)
      std::fprintf(stderr,
                   "mncl-perf: raw MPI: %s needs %zu elements in one call, beyond MPI's int "
                   "counts and displacements (INT_MAX = %d): raw column N/A from there on\n",
                   spec_of(c.kind).name, elems, INT_MAX);
    return false;
  }

  // The v collectives' size_t arrays as MPI's ints (supports() checked that they fit), into
  // buffers kept across calls so that the timed loop allocates nothing.
  const int *ints(const std::vector<size_t> &v, std::vector<int> &out) {
    out.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i]);
    return out.data();
  }

  MPI_Comm comm_;
  mutable std::set<CollKind> refused_;
  std::vector<int> sc_, sd_, rc_, rd_;
};

}  // namespace

bool mpi_process_init(int *argc, char ***argv, bool mpi_backend_possible) {
  if (!launched_by_mpi()) return false;
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return true;
  // One MPI_Init serves both the raw baseline and, under flat, the plugin, which finds MPI
  // initialized and uses it as is (plugins/flat/README.md, "MPI lifetime"). When the run may
  // use flat: MULTIPLE, as flat would ask for itself (it calls MPI from the core's worker
  // thread), so raw MPI runs under the same thread level as MNCL-flat. Otherwise (shm, gloo,
  // naive...: MPI is only the raw baseline) the level a plain MPI program would use: FUNNELED,
  // as only this (main) thread calls MPI while libmncl's own threads never do. MULTIPLE would
  // make Open MPI lock on every call and slow the raw column down for nothing.
  int provided = 0;
  const int wanted = mpi_backend_possible ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
  if (MPI_Init_thread(argc, argv, wanted, &provided) != MPI_SUCCESS) return false;
  g_we_initialized = true;
  // As flat asks of a program that initializes MPI (else it warns, and a failed flat call, a
  // timeout say, ends the job instead of returning MNCL's error). The raw baseline checks every
  // return code itself (ok()).
  if (mpi_backend_possible) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return true;
}

void mpi_process_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !finalized) MPI_Finalize();
}

std::unique_ptr<Baseline> make_mpi_baseline(mncl_comm_t comm, std::string *why) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    *why = "raw MPI needs the job to be launched by mpirun";
    return nullptr;
  }
  int mpi_rank = 0, mpi_size = 0, rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  mncl_comm_rank(comm, &rank);
  mncl_comm_size(comm, &size);
  if (mpi_rank != rank || mpi_size != size) {
    *why = "MPI_COMM_WORLD does not match the MNCL communicator";
    return nullptr;
  }
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return std::make_unique<MpiBaseline>(dup);
}

}  // namespace mncl::perf
