// Multi-process tests of the host splits (Communicator::split_host / split_cross_host / split
// with SplitOptions) and of mncl::HierarchicalCommunicator, on hosts simulated by mncl-run:
//
//   mncl-run -n 4 --ranks-per-host 2 -- hierarchical_mp_test --ranks-per-host 2
//
// The test's own --ranks-per-host says which layout to expect: world rank r on host r / M at
// position r % M, the last host holding what is left (3 ranks by 2: hosts of 2 and 1). With
// MNCL_TEST_HOST_MAP=h0,h1,... instead, rank r is on host h_r, where each rank names its host
// itself (mncl-run -n 4 -- sh -c 'MNCL_HOSTID=$(echo $MNCL_TEST_HOST_MAP | cut -d, -f$((MNCL_RANK
// + 1))) exec "$0" "$@"' hierarchical_mp_test), so a host's ranks need not be consecutive.
// Data are small integers, so every result, float32 included, is checked exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "mncl/frontends.hpp"
#include "recording_optimizer.hpp"
#include "spmd_gtest.hpp"

#ifndef MNCL_TEST_HAVE_SHM
#define MNCL_TEST_HAVE_SHM 0
#endif

namespace {

using mncl::HierarchicalAlgorithm;
using mncl::ReduceOp;
using mncl::Span;

// From the command line: how the launcher placed the ranks on (simulated) hosts.
int g_ranks_per_host = 0;             // --ranks-per-host M: rank r on host r / M
std::vector<std::string> g_host_map;  // MNCL_TEST_HOST_MAP: rank r on host g_host_map[r]

// Which host each world rank is on, and what follows from it. Hosts are numbered in the order
// of their first ranks, as HierarchicalCommunicator::inter_rank numbers them.
struct Layout {
  std::vector<int> host_of;  // world rank -> host

  static Layout of_world(int size) {
    Layout l;
    std::vector<std::string> seen;  // host names, numbered by their first rank
    for (int r = 0; r < size; ++r) {
      if (g_host_map.empty()) {
        l.host_of.push_back(r / g_ranks_per_host);
        continue;
      }
      const std::string &name = g_host_map.at(static_cast<std::size_t>(r));
      auto it = std::find(seen.begin(), seen.end(), name);
      if (it == seen.end()) it = seen.insert(seen.end(), name);
      l.host_of.push_back(static_cast<int>(it - seen.begin()));
    }
    return l;
  }
  int host(int rank) const { return host_of[rank]; }
  int num_hosts() const { return *std::max_element(host_of.begin(), host_of.end()) + 1; }
  std::vector<int> host_members(int h) const {
    std::vector<int> ranks;
    for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
      if (host_of[r] == h) ranks.push_back(r);
    }
    return ranks;
  }
  int host_size(int h) const { return static_cast<int>(host_members(h).size()); }
  // Place among the ranks of its host.
  int position(int rank) const {
    const auto members = host_members(host(rank));
    return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  }
  // The ranks at position p on every host that has one, in world rank order.
  std::vector<int> position_members(int p) const {
    std::vector<int> ranks;
    for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
      if (position(r) == p) ranks.push_back(r);
    }
    return ranks;
  }
  bool even() const {
    for (int h = 1; h < num_hosts(); ++h) {
      if (host_size(h) != host_size(0)) return false;
    }
    return true;
  }
  std::string host_sizes_text() const {
    std::string text;
    for (int h = 0; h < num_hosts(); ++h) {
      text += (h ? ", " : "") + std::to_string(host_size(h));
    }
    return text;
  }
};

const char *name_of(HierarchicalAlgorithm a) {
  return a == HierarchicalAlgorithm::kReduceBcast ? "reduce-bcast" : "two-dimensional";
}
const char *name_of(ReduceOp op) {
  return mncl_op_name(static_cast<mncl_op_t>(op));
}
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kAvg};
// Below, at and above intra sizes 1-3, a prime, one that no host size divides; and none.
const std::size_t kCounts[] = {0, 1, 2, 3, 7, 13, 1031};

class Hierarchical : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(spmd::world_pointer(), nullptr);
    ASSERT_TRUE(g_ranks_per_host > 0 || !g_host_map.empty())
        << "pass --ranks-per-host M (as given to mncl-run) or set MNCL_TEST_HOST_MAP";
    if (!g_host_map.empty()) {
      ASSERT_EQ(g_host_map.size(), static_cast<std::size_t>(world().size()));
    }
    layout_ = Layout::of_world(world().size());
  }
  mncl::Communicator &world() { return spmd::world(); }
  int rank() { return world().rank(); }
  // The algorithms this layout allows (two-dimensional: hosts of one size).
  std::vector<HierarchicalAlgorithm> algorithms() const {
    if (!layout_.even()) return {HierarchicalAlgorithm::kReduceBcast};
    return {HierarchicalAlgorithm::kReduceBcast, HierarchicalAlgorithm::kTwoDimensional};
  }
  // Runs body(h) once per algorithm the layout allows, on a fresh HierarchicalCommunicator
  // that is destroyed (collectively) afterwards.
  template <class Body>
  void for_each_algorithm(Body body) {
    for (const auto algorithm : algorithms()) {
      SCOPED_TRACE(name_of(algorithm));
      mncl::HierarchicalCommunicator h(world(), options(algorithm));
      body(h);
      h.destroy();
    }
  }
  static mncl::HierarchicalOptions options(HierarchicalAlgorithm algorithm) {
    mncl::HierarchicalOptions o;
    o.algorithm = algorithm;
    return o;
  }

  Layout layout_;
};

// ---------------------------------------------------------------------------------------------
// Data: small integers, so sums and products are exact in every dtype, float32 included
// ---------------------------------------------------------------------------------------------

template <class T>
inline constexpr bool kNegatable =
    std::is_signed_v<T> || std::is_same_v<T, mncl::Float16> || std::is_same_v<T, mncl::BFloat16>;

template <class T>
T from_int(int v) {
  if constexpr (std::is_same_v<T, mncl::Float16>) {
    return mncl::to_float16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, mncl::BFloat16>) {
    return mncl::to_bfloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Rank r's element i: -5..5 (0..10 unsigned); for products +-1 or +-2, so that even 6 ranks
// stay far below any overflow.
template <class T>
int input_value(int rank, std::size_t i, ReduceOp op) {
  const int r = rank;
  const int k = static_cast<int>(i % 1009);
  if (op == ReduceOp::kProd) {
    const int v = 1 + (r + k) % 2;
    return kNegatable<T> && (r * 5 + k) % 3 == 0 ? -v : v;
  }
  const int v = (r * 7 + k * 3) % 11;
  return kNegatable<T> ? v - 5 : v;
}

template <class T>
std::vector<T> inputs(int rank, std::size_t count, ReduceOp op) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = from_int<T>(input_value<T>(rank, i, op));
  return v;
}

// What the allreduce must give, folded here over every rank's inputs (T: int32, int64, float).
template <class T>
std::vector<T> expected(int size, std::size_t count, ReduceOp op) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = static_cast<T>(input_value<T>(0, i, op));
    for (int r = 1; r < size; ++r) {
      const T x = static_cast<T>(input_value<T>(r, i, op));
      switch (op) {
        case ReduceOp::kProd:
          acc = static_cast<T>(acc * x);
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, x);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, x);
          break;
        default:  // SUM, and AVG's sum
          acc = static_cast<T>(acc + x);
      }
    }
    // mncl.h: AVG is the SUM divided by the size, integers truncating toward zero.
    out[i] = op == ReduceOp::kAvg ? static_cast<T>(acc / static_cast<T>(size)) : acc;
  }
  return out;
}

template <class T>
bool same_bytes(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// ---------------------------------------------------------------------------------------------
// The splits
// ---------------------------------------------------------------------------------------------

TEST_F(Hierarchical, SplitsFollowTheHosts) {
  const int host = layout_.host(rank()), position = layout_.position(rank());
  mncl::Communicator on_host = world().split_host();
  EXPECT_EQ(on_host.allgather(std::vector<int>{rank()}), layout_.host_members(host));
  EXPECT_EQ(on_host.rank(), position);
  EXPECT_EQ(on_host.backend(), world().backend()) << "no backend given: the parent's";

  // Ordered by (key, rank): a decreasing key reverses the host's ranks.
  mncl::Communicator reversed = world().split_host(-rank());
  EXPECT_EQ(reversed.rank(), layout_.host_size(host) - 1 - position);

  mncl::Communicator across = world().split_cross_host();
  EXPECT_EQ(across.allgather(std::vector<int>{rank()}), layout_.position_members(position));
  const auto peers = layout_.position_members(position);
  EXPECT_EQ(across.rank(), std::find(peers.begin(), peers.end(), rank()) - peers.begin());

  mncl::SplitOptions naive;
  naive.backend = "naive";
  mncl::Communicator half = world().split(rank() % 2, 0, naive);
  EXPECT_EQ(half.backend(), "naive");
  EXPECT_EQ(half.allreduce_value(1), (world().size() + 1 - rank() % 2) / 2);
  EXPECT_EQ(half.max_message_bytes(), world().max_message_bytes());

  mncl::Communicator none = world().split(rank() == 0 ? 0 : MNCL_SPLIT_NONE, 0, naive);
  EXPECT_EQ(none.valid(), rank() == 0);

  for (auto *c : {&none, &half, &across, &reversed, &on_host}) c->destroy();
}

// ---------------------------------------------------------------------------------------------
// HierarchicalCommunicator
// ---------------------------------------------------------------------------------------------

TEST_F(Hierarchical, RanksSizesAndBackendsFollowTheLayout) {
  const int host = layout_.host(rank()), position = layout_.position(rank());
  // The plain communicator says the same without a split (mncl_comm_host_info), also for hosts
  // of different sizes and hosts whose ranks are not consecutive.
  EXPECT_EQ(world().intra_rank(), position);
  EXPECT_EQ(world().intra_size(), layout_.host_size(host));
  EXPECT_EQ(world().inter_rank(), host);
  EXPECT_EQ(world().inter_size(), layout_.num_hosts());
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    EXPECT_EQ(h.rank(), rank());
    EXPECT_EQ(h.size(), world().size());
    EXPECT_EQ(h.intra_rank(), position);
    EXPECT_EQ(h.intra_size(), layout_.host_size(host));
    EXPECT_EQ(h.inter_rank(), host);
    EXPECT_EQ(h.inter_size(), layout_.num_hosts());
    EXPECT_EQ(h.num_hosts(), layout_.num_hosts());
    EXPECT_EQ(h.intra().allgather(std::vector<int>{rank()}), layout_.host_members(host));
    // Across hosts: every position's group for two-dimensional, only the hosts' first ranks
    // for reduce-bcast (no idle groups). Its rank order is the world's, which need not be the
    // hosts' (inter_rank) where a host's ranks are not consecutive.
    if (h.options().algorithm == HierarchicalAlgorithm::kTwoDimensional || position == 0) {
      ASSERT_TRUE(h.inter().valid());
      EXPECT_EQ(h.inter().allgather(std::vector<int>{rank()}), layout_.position_members(position));
      EXPECT_EQ(h.inter().backend(), world().backend()) << "inter_backend \"\": the world's";
    } else {
      EXPECT_FALSE(h.inter().valid());
    }
    if (MNCL_TEST_HAVE_SHM) {
      EXPECT_EQ(h.intra().backend(), "shm") << "\"auto\" within a host, with shm built";
    } else {
      EXPECT_FALSE(h.intra().backend().empty());
    }
  });
}

// A group's backend failing on one host only: its ranks get that error, every other rank a
// RemoteError, at once (not after the timeout in the next world collective); the world goes on.
TEST_F(Hierarchical, AGroupFailingOnOneHostFailsEveryRankAlike) {
  const int host = layout_.host(rank());
  mncl::HierarchicalOptions o;
  o.intra_backend = host == 0 ? "no-such-backend" : "auto";
  try {
    mncl::HierarchicalCommunicator h(world(), o);
    FAIL() << "no rank may succeed";
  } catch (const mncl::PluginError &e) {
    EXPECT_EQ(host, 0) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-backend"), std::string::npos) << e.what();
  } catch (const mncl::RemoteError &e) {
    EXPECT_NE(host, 0) << e.what();
    EXPECT_NE(std::string(e.what()).find("failed on other ranks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(world().allreduce_value(1), world().size());
}

// 16-bit floats accumulate in float32 and round once, as the world's allreduce on naive: a
// host's fp16 partial sum of 2 x 40000 would overflow to inf, and bf16 256 + 1 on one host
// would round to 256 before the other hosts' ones are added.
TEST_F(Hierarchical, SixteenBitFloatsAccumulateInFloat32) {
  const int size = world().size();
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    std::vector<mncl::Float16> big(3, mncl::to_float16(40000.0f));
    h.allreduce(big, ReduceOp::kAvg);
    for (auto v : big) EXPECT_EQ(mncl::to_float(v), 40000.0f);
    std::vector<mncl::BFloat16> sum(5, mncl::to_bfloat16(rank() == 0 ? 256.0f : 1.0f));
    h.allreduce(sum, ReduceOp::kSum);
    const float want = mncl::to_float(mncl::to_bfloat16(256.0f + static_cast<float>(size - 1)));
    for (auto v : sum) EXPECT_EQ(mncl::to_float(v), want);
  });
}

TEST_F(Hierarchical, TwoDimensionalRefusesHostsOfDifferentSizesOnEveryRank) {
  if (layout_.even()) {
    EXPECT_NO_THROW({
      mncl::HierarchicalCommunicator h(world(), options(HierarchicalAlgorithm::kTwoDimensional));
      h.destroy();
    });
  } else {
    try {
      mncl::HierarchicalCommunicator h(world(), options(HierarchicalAlgorithm::kTwoDimensional));
      FAIL() << "hosts of " << layout_.host_sizes_text() << " ranks were accepted";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("have " + layout_.host_sizes_text() + " ranks"),
                std::string::npos)
          << e.what();
    }
  }
  // Every rank made the same decision: the world goes on (a rank left behind would time out).
  EXPECT_EQ(world().allreduce_value(1), world().size());
  mncl::HierarchicalCommunicator h(world(), options(HierarchicalAlgorithm::kReduceBcast));
  std::vector<int64_t> v{rank()};
  h.allreduce(v);
  EXPECT_EQ(v[0], int64_t{world().size()} * (world().size() - 1) / 2);
}

template <class T>
void check_every_op_and_count(mncl::HierarchicalCommunicator &h) {
  const int rank = h.rank(), size = h.size();
  for (const ReduceOp op : kOps) {
    for (const std::size_t count : kCounts) {
      SCOPED_TRACE(std::string(mncl_dtype_name(mncl::dtype_of<T>())) + " " + name_of(op) +
                   " count " + std::to_string(count));
      const std::vector<T> want = expected<T>(size, count, op);
      std::vector<T> inout = inputs<T>(rank, count, op);
      h.allreduce(inout, op);
      EXPECT_EQ(inout, want) << "in place";

      const std::vector<T> send = inputs<T>(rank, count, op);
      std::vector<T> recv(count, static_cast<T>(99));
      h.allreduce(send, recv, op);
      EXPECT_EQ(recv, want) << "out of place";
      EXPECT_EQ(send, inputs<T>(rank, count, op)) << "the send buffer was written";
    }
  }
}

TEST_F(Hierarchical, EveryOpAndCountIsExactInPlaceAndOutOfPlace) {
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    check_every_op_and_count<int32_t>(h);
    check_every_op_and_count<int64_t>(h);
    check_every_op_and_count<float>(h);
  });
}

// The other dtypes, bit for bit against the world's own allreduce.
template <class T>
void check_against_world(mncl::HierarchicalCommunicator &h) {
  for (const ReduceOp op : kOps) {
    for (const std::size_t count : {std::size_t{5}, std::size_t{1031}}) {
      SCOPED_TRACE(std::string(mncl_dtype_name(mncl::dtype_of<T>())) + " " + name_of(op) +
                   " count " + std::to_string(count));
      std::vector<T> flat = inputs<T>(h.rank(), count, op), mine = flat;
      h.world().allreduce(flat, op);
      h.allreduce(mine, op);
      EXPECT_TRUE(same_bytes(mine, flat));
    }
  }
}

TEST_F(Hierarchical, EveryDtypeMatchesTheWorldAllreduce) {
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    check_against_world<int8_t>(h);
    check_against_world<uint8_t>(h);
    check_against_world<uint32_t>(h);
    check_against_world<uint64_t>(h);
    check_against_world<double>(h);
    check_against_world<mncl::Float16>(h);
    check_against_world<mncl::BFloat16>(h);
  });
}

TEST_F(Hierarchical, CoalescedBuffersApartAndBackToBack) {
  const int size = world().size();
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      SCOPED_TRACE(name_of(op));
      // Apart: packed and unpacked around one allreduce (an empty buffer among them).
      std::vector<int32_t> a = inputs<int32_t>(rank(), 7, op), empty,
                           b = inputs<int32_t>(rank(), 3, op);
      h.allreduce_coalesced(
          std::vector<Span<int32_t>>{Span<int32_t>(a), Span<int32_t>(empty), Span<int32_t>(b)}, op);
      EXPECT_EQ(a, expected<int32_t>(size, 7, op));
      EXPECT_EQ(b, expected<int32_t>(size, 3, op));
      // Back to back: the buckets of one buffer, reduced where they are.
      std::vector<float> flat = inputs<float>(rank(), 11, op);
      const Span<float> all(flat);
      h.allreduce_coalesced(
          std::vector<Span<float>>{all.subspan(0, 4), all.subspan(4, 5), all.subspan(9)}, op);
      EXPECT_EQ(flat, expected<float>(size, 11, op));
    }
    h.allreduce_coalesced(std::vector<Span<float>>{});  // nothing to do, on every rank alike
  });
}

TEST_F(Hierarchical, BufferMistakesThrowBeforeAnythingIsSent) {
  mncl::HierarchicalCommunicator h(world());
  std::vector<float> send(4), recv(3);
  EXPECT_THROW(h.allreduce(send, recv), mncl::InvalidArgument);
  std::vector<float> both(6);
  EXPECT_THROW(h.allreduce(Span<const float>(both.data(), 4), Span<float>(both.data() + 2, 4)),
               mncl::InvalidArgument);
  h.allreduce(both);  // still in step with each other
  h.destroy();
}

// `call` on every rank, where rank `culprit` refuses its own arguments: InvalidArgument there,
// holding `culprit_says`, and RemoteError naming it on every other rank. A TimeoutError (the
// others left waiting for the culprit in a level's collective) is neither and fails the test.
template <class Call>
void expect_fails_together(Call &&call, int culprit, const std::string &what,
                           const std::string &culprit_says) {
  const bool guilty = spmd::world().rank() == culprit;
  try {
    call();
    ADD_FAILURE() << what << " returned although rank " << culprit << " refused";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_TRUE(guilty) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(culprit_says), std::string::npos)
        << what << ": " << e.what();
  } catch (const mncl::RemoteError &e) {
    EXPECT_FALSE(guilty) << what << ": " << e.what();
    EXPECT_NE(
        std::string(e.what()).find("rank " + std::to_string(culprit) + " could not take part"),
        std::string::npos)
        << what << ": " << e.what();
  }
}

// `call` on every rank, where rank `odd` passes other arguments than the others: the same
// InvalidArgument naming it on every rank (not a timeout, nor OK with a wrong result).
template <class Call>
void expect_refused_everywhere(Call &&call, int odd, const std::string &what) {
  try {
    call();
    ADD_FAILURE() << what << " returned although rank " << odd << " passed other arguments";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(odd) +
                                         " passed other arguments than rank 0"),
              std::string::npos)
        << what << ": " << e.what();
  }
}

// A buffer refused on one rank fails every rank together, before anything moves: that rank
// throws InvalidArgument, the others RemoteError naming it (they once waited for it in the
// levels' collectives until the timeout). Then everyone goes on in step.
TEST_F(Hierarchical, ABufferRefusedOnOneRankFailsEveryRank) {
  const int culprit = world().size() - 1;
  const bool guilty = rank() == culprit;
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    const std::vector<float> send(4, 1.0f);
    std::vector<float> recv(guilty ? 3 : 4, 7.0f);
    expect_fails_together([&] { h.allreduce(send, recv); }, culprit, "sizes", "differ in size");
    EXPECT_EQ(recv, std::vector<float>(guilty ? 3 : 4, 7.0f)) << "nothing moves";
    // In place on the others; on the culprit a receive buffer 2 elements into its send buffer.
    std::vector<float> both(6, 1.0f);
    expect_fails_together(
        [&] {
          h.allreduce(Span<const float>(both.data(), 4),
                      Span<float>(both.data() + (guilty ? 2 : 0), 4));
        },
        culprit, "overlap", "overlap without being the same");
    EXPECT_EQ(both, std::vector<float>(6, 1.0f)) << "nothing moves";
    // An op that mncl.h does not have, in place and coalesced.
    const auto op = guilty ? static_cast<ReduceOp>(99) : ReduceOp::kSum;
    expect_fails_together([&] { h.allreduce(both, op); }, culprit, "unknown op",
                          "unknown reduction op 99");
    expect_fails_together(
        [&] { h.allreduce_coalesced(std::vector<Span<float>>{Span<float>(both)}, op); }, culprit,
        "unknown op, coalesced", "unknown reduction op 99");
    EXPECT_EQ(both, std::vector<float>(6, 1.0f)) << "nothing moves";

    std::vector<int64_t> v{rank()};
    h.allreduce(v);
    EXPECT_EQ(v[0], int64_t{world().size()} * (world().size() - 1) / 2);
  });
}

// Ranks that pass different counts, ops, dtypes or calls fail together with InvalidArgument
// naming the odd rank, before anything moves. The levels' collectives never see the whole
// world's arguments, so these once gave a timeout (an empty buffer on one rank) or OK with a
// wrong result on every rank (kAvg against kSum; 3 elements against 4, which two-dimensional
// padded).
TEST_F(Hierarchical, RanksThatPassDifferentArgumentsFailTogether) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to differ";
  const int odd = world().size() - 1;
  const bool is_odd = rank() == odd;
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    std::vector<int32_t> empty_on_one(is_odd ? 0 : 4, 1);
    expect_refused_everywhere([&] { h.allreduce(empty_on_one); }, odd, "empty on one rank");
    EXPECT_EQ(empty_on_one, std::vector<int32_t>(is_odd ? 0 : 4, 1)) << "nothing moves";

    std::vector<double> values(4, double(rank() + 1));
    expect_refused_everywhere(
        [&] { h.allreduce(values, is_odd ? ReduceOp::kAvg : ReduceOp::kSum); }, odd,
        "kAvg against kSum");
    EXPECT_EQ(values, std::vector<double>(4, double(rank() + 1))) << "nothing moves";

    std::vector<double> three_or_four(is_odd ? 3 : 4, 1.0), out(three_or_four.size());
    expect_refused_everywhere([&] { h.allreduce(three_or_four); }, odd, "3 against 4");
    expect_refused_everywhere([&] { h.allreduce(three_or_four, out); }, odd,
                              "3 against 4, out of place");
    EXPECT_EQ(three_or_four, std::vector<double>(is_odd ? 3 : 4, 1.0)) << "nothing moves";

    std::vector<float> floats(4, 1.0f);
    std::vector<int32_t> ints(4, 1);
    expect_refused_everywhere(
        [&] {
          if (is_odd) {
            h.allreduce(floats);
          } else {
            h.allreduce(ints);
          }
        },
        odd, "float32 against int32");

    // Coalesced: the same total in other buckets, an extra empty buffer, or a plain allreduce.
    std::vector<int32_t> flat(7, rank());
    const Span<int32_t> all(flat);
    std::vector<int32_t> none;
    expect_refused_everywhere(
        [&] {
          h.allreduce_coalesced(
              is_odd ? std::vector<Span<int32_t>>{all.subspan(0, 3), all.subspan(3)}
                     : std::vector<Span<int32_t>>{all.subspan(0, 4), all.subspan(4)});
        },
        odd, "other buckets");
    expect_refused_everywhere(
        [&] {
          h.allreduce_coalesced(is_odd ? std::vector<Span<int32_t>>{all, Span<int32_t>(none)}
                                       : std::vector<Span<int32_t>>{all});
        },
        odd, "an extra empty buffer");
    expect_refused_everywhere(
        [&] {
          if (is_odd) {
            h.allreduce_coalesced(std::vector<Span<int32_t>>{all});
          } else {
            h.allreduce(flat);
          }
        },
        odd, "coalesced against plain");
    EXPECT_EQ(flat, std::vector<int32_t>(7, rank())) << "nothing moves";

    std::vector<int64_t> v{rank()};
    h.allreduce(v, ReduceOp::kSum);
    EXPECT_EQ(v[0], int64_t{world().size()} * (world().size() - 1) / 2);
  });
}

// ---------------------------------------------------------------------------------------------
// MultiNodeOptimizer on a HierarchicalCommunicator
// ---------------------------------------------------------------------------------------------

using mncl_testing::RecordingOptimizer;

TEST_F(Hierarchical, MultiNodeOptimizerAveragesThroughTheHierarchy) {
  for_each_algorithm([&](mncl::HierarchicalCommunicator &h) {
    mncl::MultiNodeOptimizerOptions o;
    o.fusion_buffer_bytes = 16;  // 4 floats a bucket: several buckets of one buffer
    auto opt = mncl::make_multi_node_optimizer(RecordingOptimizer{}, h, o);
    std::vector<std::vector<float>> values{std::vector<float>(5, float(rank() + 100)),
                                           std::vector<float>(3, float(rank() + 100))};
    std::vector<std::vector<float>> grads{std::vector<float>(5, float(rank())),
                                          std::vector<float>(3, float(rank() + 1))};
    const mncl::ParamSpans params{Span<float>(values[0]), Span<float>(values[1])};
    const mncl::GradSpans grad_spans{Span<const float>(grads[0]), Span<const float>(grads[1])};
    opt.broadcast_parameters(params);  // from rank 0 (through the world)
    EXPECT_EQ(values[1], std::vector<float>(3, 100.0f));
    EXPECT_TRUE(opt.update(params, grad_spans));
    const float mean_rank = (world().size() - 1) / 2.0f;
    ASSERT_EQ(opt.actual_optimizer().seen.size(), 1u);
    const auto &averaged = opt.actual_optimizer().seen[0];
    for (float g : averaged[0]) EXPECT_FLOAT_EQ(g, mean_rank);
    for (float g : averaged[1]) EXPECT_FLOAT_EQ(g, mean_rank + 1);

    o.double_buffering = true;
    EXPECT_THROW(mncl::make_multi_node_optimizer(RecordingOptimizer{}, h, o),
                 mncl::InvalidArgument);
  });
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks-per-host") == 0) g_ranks_per_host = std::atoi(argv[i + 1]);
  }
  if (const char *map = std::getenv("MNCL_TEST_HOST_MAP")) {
    std::stringstream list(map);
    for (std::string host; std::getline(list, host, ',');) g_host_map.push_back(host);
  }
  spmd::install_spmd();
  return RUN_ALL_TESTS();
}
