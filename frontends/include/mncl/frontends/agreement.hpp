// "Every rank fails together" for the frontends' collective helpers: before any data moves, the
// ranks exchange whether each one refused its own arguments and a digest of what it passes
// (sizes, settings, progress), in one small allgather. Then every rank takes the same decision:
//  - a rank that refused its arguments throws its own error; the others throw RemoteError
//    naming it (instead of waiting for it in the next collective until the timeout);
//  - ranks whose digest differs from rank 0's make every rank throw InvalidArgument naming
//    them (instead of a collective of mismatched sizes: a wrong result or a timeout).
// Nothing has moved when it throws.
//
//   LayoutDigest digest;
//   for (const auto &p : params) digest.add(p.size());
//   agree_or_throw(comm, "MyHelper::run", own_error, digest.value());
#ifndef MNCL_FRONTENDS_AGREEMENT_HPP
#define MNCL_FRONTENDS_AGREEMENT_HPP

#include <cstdint>
#include <exception>
#include <string>

#include "mncl/frontends/communicator.hpp"

namespace mncl {

// FNV-1a over 64-bit words: what a rank passes, reduced to 63 bits (never negative, so that no
// digest reads as a refusal's marker).
class LayoutDigest {
 public:
  LayoutDigest &add(uint64_t word) noexcept {
    for (int byte = 0; byte < 8; ++byte) {
      hash_ ^= (word >> (8 * byte)) & 0xff;
      hash_ *= 0x100000001b3ull;
    }
    return *this;
  }
  int64_t value() const noexcept { return static_cast<int64_t>(hash_ >> 1); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

// Collective over `world` (see the top of the file). `own_error` is null when this rank accepts
// its arguments, else what it rethrows once every rank knows. `what` names the call in the
// messages. Returns normally only where every rank accepted and every digest is rank 0's.
void agree_or_throw(Communicator &world, const std::string &what, std::exception_ptr own_error,
                    int64_t digest);

}  // namespace mncl

#endif  // MNCL_FRONTENDS_AGREEMENT_HPP
