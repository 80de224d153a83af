#include "mncl/frontends/agreement.hpp"

#include <vector>

namespace mncl {
namespace {

// "rank 2" or "ranks 1, 3".
std::string ranks_named(const std::vector<int> &ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void agree_or_throw(Communicator &world, const std::string &what, std::exception_ptr own_error,
                    int64_t digest) {
  // [refused (1) or not (0), digest (0 when refused)] per rank.
  const std::vector<int64_t> mine = {own_error ? 1 : 0, own_error ? 0 : digest};
  std::vector<int64_t> all = mine;
  if (world.size() > 1) {
    try {
      all = world.allgather(mine);
    } catch (const Error &) {
      // Peers that never came (a dead one, a misuse): this rank's own error still says most.
      if (own_error) std::rethrow_exception(own_error);
      throw;
    }
  }
  if (own_error) std::rethrow_exception(own_error);
  std::vector<int> refused, differ;
  for (int r = 0; r < world.size(); ++r) {
    const auto at = static_cast<std::size_t>(2 * r);
    if (all[at] != 0) {
      refused.push_back(r);
    } else if (all[at + 1] != all[1] && all[0] == 0) {
      differ.push_back(r);
    }
  }
  if (!refused.empty()) {
    throw RemoteError(what + ": " + ranks_named(refused) +
                      " could not take part: its arguments or resources failed there (that rank's "
                      "own error says what); nothing was moved");
  }
  if (!differ.empty()) {
    throw InvalidArgument(what + ": " + ranks_named(differ) +
                          " passed other arguments than rank 0 (the number or sizes of the "
                          "buffers, the settings, or the progress so far); nothing was moved");
  }
}

}  // namespace mncl
