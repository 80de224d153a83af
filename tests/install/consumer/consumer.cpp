// Built against an installed MNCL with find_package(mncl CONFIG): the C++ frontends.
#include <cstdio>
#include <mncl/frontends/communicator.hpp>
#include <vector>

int main() {
  mncl::Communicator comm;
  std::vector<double> v{1.5, 2.5};
  comm.allreduce(v, mncl::ReduceOp::kSum);
  if (v[0] != 1.5 * comm.size() || v[1] != 2.5 * comm.size()) return 1;
  std::printf("consumer (C++ frontends): rank %d of %d: allreduce OK\n", comm.rank(), comm.size());
  return 0;
}
