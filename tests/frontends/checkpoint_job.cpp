// A tiny "training job" for the checkpoint kill-and-resume test. Each iteration allreduces a
// counter (so the ranks move in lockstep) and saves {iteration, sum}. Options:
//   checkpoint_job DIR ITERATIONS [--die-rank R --die-at K] [--expect-resume K]
// --die-rank/--die-at: rank R, while saving iteration K, leaves a half-written temporary and a
//   corrupt snapshot K (as a crash with a non-atomic writer would), then kills itself (SIGKILL).
// --expect-resume: the job must resume at exactly K (0: from scratch), else exits 3.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "mncl/frontends.hpp"

namespace {

struct State {
  uint64_t iteration = 0;
  int64_t sum = 0;
  void save(mncl::OutArchive &ar) const { ar << iteration << sum; }
  void load(mncl::InArchive &ar) { ar >> iteration >> sum; }
};

// The sum after `iteration` iterations of adding (iteration * size) each time.
int64_t expected_sum(uint64_t iteration, int size) {
  return static_cast<int64_t>(iteration * (iteration + 1) / 2) * size;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: checkpoint_job DIR ITERATIONS [options]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t iterations = std::strtoull(argv[2], nullptr, 10);
  int die_rank = -1;
  uint64_t die_at = 0;
  long expect_resume = -1;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--die-rank")) die_rank = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--die-at")) die_at = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--expect-resume")) expect_resume = std::atol(argv[i + 1]);
  }
  try {
    mncl::Communicator comm;
    mncl::Checkpointer ckpt(comm, dir, "job", {2, true, true});
    State state;
    const auto resumed = ckpt.resume(state);
    const long resumed_at = resumed ? static_cast<long>(*resumed) : 0;
    std::printf("rank %d: resumed at %ld\n", comm.rank(), resumed_at);
    if (resumed &&
        (state.iteration != *resumed || state.sum != expected_sum(state.iteration, comm.size()))) {
      std::fprintf(stderr, "rank %d: loaded an inconsistent state\n", comm.rank());
      return 3;
    }
    if (expect_resume >= 0 && resumed_at != expect_resume) {
      std::fprintf(stderr, "rank %d: resumed at %ld, expected %ld\n", comm.rank(), resumed_at,
                   expect_resume);
      return 3;
    }
    for (uint64_t it = state.iteration + 1; it <= iterations; ++it) {
      state.sum += comm.allreduce_value(static_cast<int64_t>(it));
      state.iteration = it;
      if (comm.rank() == die_rank && it == die_at) {
        const std::string final_path = ckpt.path(it);
        std::ofstream(final_path + ".tmp") << "half of a snapsh";
        std::ofstream(final_path) << "MNCLCKPT garbage that no checksum will accept";
        std::fflush(nullptr);
        ::raise(SIGKILL);
      }
      ckpt.save(it, state);
    }
    std::printf("rank %d: done at %llu\n", comm.rank(),
                static_cast<unsigned long long>(state.iteration));
    comm.destroy();
  } catch (const mncl::Error &e) {
    std::fprintf(stderr, "checkpoint_job: %s\n", e.what());
    return 1;
  }
  return 0;
}
