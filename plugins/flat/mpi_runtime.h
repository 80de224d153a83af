// The process-wide side of the flat plugin: MPI's lifetime, thread level, and the translation
// of MNCL dtypes, ops and errors into MPI ones.
//
// MPI can be initialized once per process and never again after MPI_Finalize. So flat
// initializes MPI on the first comm_create (never at load: auto-selection loads every plugin),
// only if the application has not, and finalizes it at process exit, only if it initialized it.
// The library is linked with -z nodelete so that exit handler stays mapped after the core
// unloads the plugin, and a plugin reloaded later finds MPI still alive.
#pragma once

#include <mncl/mncl_plugin.h>
#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace mncl::flat {

// True if a launcher that sets up MPI started this process (mpirun, or srun with PMI/PMIx):
// the same test as the core's launched_by_mpi.
bool launched_by_mpi_launcher();

// The number of processes the launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE), read without
// MPI; 0 when it does not say.
int launcher_world_size();

// What a job of `size` ranks started without a launcher is told (probe reason, comm_create).
std::string not_launched_message(int size);

// Initializes MPI on first use (thread-safe; a no-op when the application did it) and creates
// the fp16/bf16 datatypes and reduction ops. Throws kit::Error when MPI is unusable (already
// finalized, init failed).
void ensure_mpi(const mncl_host_v1_t *host);

// The thread level MPI provides (valid after ensure_mpi).
int mpi_thread_level();

// Held around every MPI call when MPI provides less than MPI_THREAD_MULTIPLE, so that
// communicators used from different threads never enter MPI at once. Cheap and uncontended in
// the usual one-thread case; takes no lock at all under MPI_THREAD_MULTIPLE.
class MpiLock {
 public:
  MpiLock();
  ~MpiLock();
  MpiLock(const MpiLock &) = delete;
  MpiLock &operator=(const MpiLock &) = delete;

 private:
  bool locked_;
};

// True once MPI is finalized (by us at exit, or by the application): handles are then dead.
bool mpi_finalized();

// MPI datatype of an MNCL dtype (fp16/bf16: 2-byte derived types). Valid after ensure_mpi.
MPI_Datatype mpi_datatype(int32_t dtype);
// MPI reduction of an MNCL op on an MNCL dtype: built-in ops, or user-defined ones that reduce
// fp16/bf16 in float32. AVG maps to the sum (the caller divides afterwards).
MPI_Op mpi_op(int32_t dtype, int32_t op);

// "MPI_ERR_TRUNCATE: message truncated" for an MPI return code.
std::string mpi_error_text(int rc);
// The MNCL status for an MPI error code: a communication failure is MNCL_ERR_REMOTE, lack of
// memory MNCL_ERR_SYSTEM, an argument MPI rejects (the core validated them all) a bug.
mncl_status_t mpi_error_status(int rc);

// Whether this Open MPI can take CUDA buffers (MPIX_Query_cuda_support), asked only when MPI
// is already initialized, as Open MPI documents; false otherwise.
bool mpi_cuda_aware_now();

}  // namespace mncl::flat
