// Raw-library baselines: the library under a plugin, called directly on the same buffers in the
// same process, right after MNCL at every size, so that "MNCL / raw" compares like with like.
//
//   mpi   raw MPI (MPI_Allreduce...), when mncl-perf was built with MPI and runs under mpirun
//   gloo  raw Gloo (gloo::allreduce...), when mncl-perf was built with Gloo
//
// A baseline that cannot run a call (a dtype or op the library lacks) reports it through
// supports(), and the table shows N/A there instead of a ratio.
#pragma once

#include <mncl/mncl.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives.h"

namespace mncl::perf {

class Baseline {
 public:
  virtual ~Baseline() = default;
  virtual const char *name() const = 0;
  // How the library runs, for the header and the JSON (e.g. MPI's thread level); may be "".
  virtual std::string detail() const { return ""; }
  virtual bool supports(const Call &c) const = 0;
  // Runs one call to completion; throws std::runtime_error on failure.
  virtual void run(const Call &c) = 0;
  virtual void barrier() = 0;
};

// The names this build can offer ("mpi", "gloo").
std::vector<std::string> available_baselines();

// Called first thing in main: a baseline that needs process-wide setup (MPI_Init) does it
// here, before libmncl creates any communicator. `backend_spec` is the run's backend (--backend,
// else MNCL_BACKEND, else "auto"; a comma list of candidates), which decides MPI's thread level.
void baseline_process_init(int *argc, char ***argv, const std::string &backend_spec);
void baseline_process_finalize();

// `which`: "none", "mpi", "gloo" or "auto" (the library under `backend`: flat -> mpi,
// gloo -> gloo, others none). Returns nullptr when no baseline applies, with the reason in
// *why. The communicator provides rank, size and a channel to agree on rendezvous details.
std::unique_ptr<Baseline> make_baseline(const std::string &which, const std::string &backend,
                                        mncl_comm_t comm, std::string *why);

// Per library (compiled in only when found by CMake).
std::unique_ptr<Baseline> make_mpi_baseline(mncl_comm_t comm, std::string *why);
std::unique_ptr<Baseline> make_gloo_baseline(mncl_comm_t comm, std::string *why);
// `mpi_backend_possible`: the run may pick flat, which needs MPI_THREAD_MULTIPLE.
bool mpi_process_init(int *argc, char ***argv, bool mpi_backend_possible);
void mpi_process_finalize();

}  // namespace mncl::perf
