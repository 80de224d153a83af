// Misuses of the frontends that must not compile, one case per MNCL_COMPILE_FAIL_<CASE> macro.
// ctest runs the compiler on this file (frontends.compile_fail.*, see CMakeLists.txt): with a
// case defined it must fail with that case's message; with none (the control) it must compile
// cleanly, so a case fails for its own line and not for a typo elsewhere.
#include <cstdint>
#include <vector>

#include "mncl/frontends.hpp"

namespace {

// An optimizer with state (a velocity per parameter) but no save/load members.
struct MomentumWithoutSaveLoad {
  std::vector<std::vector<float>> velocity;
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) {}
};

// Optimizers without state, declared so by a member or by the trait.
struct DeclaredStateless {
  static constexpr bool stateless_optimizer = true;
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) {}
};
struct TheirStateless {
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) {}
};

std::vector<float> make_data() {
  return std::vector<float>(4, 1.0f);
}

}  // namespace

template <>
struct mncl::is_stateless_optimizer<TheirStateless> : std::true_type {};

// Never called: only compiled.
void must_compile(mncl::Communicator &comm) {
  mncl::MultiNodeOptimizer<DeclaredStateless> declared(DeclaredStateless{}, comm);
  mncl::MultiNodeOptimizer<TheirStateless> theirs(TheirStateless{}, comm);
  mncl::MultiNodeOptimizer<mncl::Sgd> sgd(mncl::Sgd{}, comm);
  const auto bytes = mncl::to_bytes(declared);
  mncl::from_bytes(mncl::Span<const uint8_t>(bytes), declared);
  mncl::from_bytes(mncl::Span<const uint8_t>(mncl::to_bytes(theirs)), theirs);
  mncl::from_bytes(mncl::Span<const uint8_t>(mncl::to_bytes(sgd)), sgd);
  // Wrapping an optimizer without save/load is fine as long as it is not checkpointed.
  mncl::MultiNodeOptimizer<MomentumWithoutSaveLoad> unsaved(MomentumWithoutSaveLoad{}, comm);

  // Non-blocking calls on lvalues and on views (a temporary Span views lasting memory).
  std::vector<float> data = make_data(), other = make_data();
  const std::vector<float> constant = make_data();
  mncl::Request requests[] = {
      comm.isend(data, 1),
      comm.isend(constant, 1),
      comm.isend(mncl::Span<const float>(data), 1),
      comm.irecv(data, 1),
      comm.irecv(mncl::Span<float>(data.data(), 2), 1),
      comm.ibcast(data, 0),
      comm.ibcast(mncl::Span<float>(data), 0),
      comm.iallreduce(data),
      comm.iallreduce(mncl::Span<float>(data), mncl::ReduceOp::kMax),
      comm.isendrecv(data, 1, other, 1),
      comm.isendrecv(mncl::Span<const float>(data), 1, mncl::Span<float>(other), 1),
      comm.isendrecv_batch({mncl::isend_op(data, 1), mncl::irecv_op(other, 1),
                            mncl::irecv_op(mncl::Span<float>(other), 1)}),
  };
  (void)requests;

#if defined(MNCL_COMPILE_FAIL_SAVE_STATEFUL_OPTIMIZER)
  (void)mncl::to_bytes(unsaved);
#elif defined(MNCL_COMPILE_FAIL_LOAD_STATEFUL_OPTIMIZER)
  mncl::from_bytes(mncl::Span<const uint8_t>(bytes), unsaved);
#elif defined(MNCL_COMPILE_FAIL_ISEND_TEMPORARY)
  mncl::Request r = comm.isend(make_data(), 1);
#elif defined(MNCL_COMPILE_FAIL_IRECV_TEMPORARY)
  mncl::Request r = comm.irecv(make_data(), 1);
#elif defined(MNCL_COMPILE_FAIL_IBCAST_TEMPORARY)
  mncl::Request r = comm.ibcast(make_data(), 0);
#elif defined(MNCL_COMPILE_FAIL_IALLREDUCE_TEMPORARY)
  mncl::Request r = comm.iallreduce(make_data());
#elif defined(MNCL_COMPILE_FAIL_ISENDRECV_TEMPORARY)
  mncl::Request r = comm.isendrecv(data, 1, make_data(), 1);
#elif defined(MNCL_COMPILE_FAIL_ISEND_OP_TEMPORARY)
  mncl::Request r = comm.isendrecv_batch({mncl::isend_op(make_data(), 1)});
#elif defined(MNCL_COMPILE_FAIL_IRECV_OP_TEMPORARY)
  mncl::Request r = comm.isendrecv_batch({mncl::irecv_op(make_data(), 1)});
#endif
}
