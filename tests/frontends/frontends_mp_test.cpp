// Multi-process tests of the frontends: an SPMD GoogleTest binary run under mncl-run at several
// world sizes (every rank runs every test, in the same order, on one world communicator):
//
//   mncl-run -n 3 --backend naive -- frontends_mp_test [--gtest_filter=...]
//
// Rank 0 prints the usual output; other ranks print only their failures and a summary.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "mncl/frontends.hpp"
#include "mncl/frontends/hybrid.hpp"
#include "mncl/frontends/prefetch_loader.hpp"
#include "recording_optimizer.hpp"
#include "spmd_gtest.hpp"

namespace {

using mncl::Span;

// `call` on every rank, where rank `culprit` fails on its own (a tensor the layer cannot take,
// an object it cannot serialize): it must throw LocalError there, whose message holds
// `culprit_says`, and RemoteError holding `others_say` everywhere else (default: "rank(s) N",
// the layers' wording).
template <class LocalError = mncl::InvalidArgument, class Call>
void expect_fails_together(Call &&call, int culprit, const std::string &what,
                           std::string others_say = {}, const std::string &culprit_says = {}) {
  if (others_say.empty()) others_say = "rank(s) " + std::to_string(culprit);
  const bool guilty = spmd::world().rank() == culprit;
  try {
    call();
    ADD_FAILURE() << what << " returned although rank " << culprit << " failed";
  } catch (const mncl::RemoteError &e) {  // first: it may derive from LocalError
    EXPECT_FALSE(guilty) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(others_say), std::string::npos)
        << what << ": " << e.what();
  } catch (const LocalError &e) {
    EXPECT_TRUE(guilty) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(culprit_says), std::string::npos)
        << what << ": " << e.what();
  }
}

class Frontends : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(spmd::world_pointer(), nullptr); }
  mncl::Communicator &comm() { return spmd::world(); }
  int rank() const { return spmd::world().rank(); }
  int size() const { return spmd::world().size(); }
  // A fresh folder that rank 0 made, named on every rank; empty if mkdtemp failed.
  std::string checkpoint_dir() {
    std::string dir = "/tmp/mncl-ckpt-mp-XXXXXX";
    if (rank() == 0 && mkdtemp(dir.data()) == nullptr) dir.clear();
    comm().bcast_obj(dir);
    return dir;
  }
  // Once every rank is done with it.
  void remove_checkpoint_dir(const std::string &dir) {
    comm().barrier();
    if (rank() == 0) std::system(("rm -rf '" + dir + "'").c_str());
  }
};

// ---------------------------------------------------------------------------------------------
// Communicator
// ---------------------------------------------------------------------------------------------

TEST_F(Frontends, TypedCollectives) {
  std::vector<int64_t> values{rank(), 10 * rank(), 1};
  comm().allreduce(values);
  const int64_t ranks_sum = int64_t{size()} * (size() - 1) / 2;
  EXPECT_EQ(values, (std::vector<int64_t>{ranks_sum, 10 * ranks_sum, size()}));

  EXPECT_EQ(comm().allreduce_value(rank(), mncl::ReduceOp::kMax), size() - 1);
  EXPECT_DOUBLE_EQ(comm().allreduce_value(double(rank()), mncl::ReduceOp::kMin), 0.0);

  std::vector<float> bcast_buf(5, float(rank()));
  comm().bcast(bcast_buf, size() - 1);
  EXPECT_EQ(bcast_buf, std::vector<float>(5, float(size() - 1)));

  const std::vector<int32_t> mine{rank(), -rank()};
  const auto everyone = comm().allgather(mine);
  ASSERT_EQ(everyone.size(), 2u * size());
  for (int r = 0; r < size(); ++r) EXPECT_EQ(everyone[2 * r], r);

  std::vector<int32_t> gathered(rank() == 0 ? 2 * size() : 0);
  comm().gather(mine, gathered, 0);
  if (rank() == 0) {
    EXPECT_EQ(gathered, everyone);
  }

  std::vector<uint32_t> blocks(size());
  std::iota(blocks.begin(), blocks.end(), 0u);
  std::vector<uint32_t> reduced(1);
  comm().reduce_scatter(blocks, reduced);
  EXPECT_EQ(reduced[0], uint32_t(rank()) * size());

  std::vector<int32_t> sum(rank() == 1 % size() ? 2 : 0);
  comm().reduce(mine, sum, 1 % size());
  if (rank() == 1 % size()) {
    EXPECT_EQ(sum[0], int32_t(ranks_sum));
  }
  comm().barrier();
}

TEST_F(Frontends, VariableCountCollectives) {
  // Rank r contributes r elements of value r (rank 0 none).
  const std::vector<int32_t> mine(static_cast<std::size_t>(rank()), rank());
  const auto everyone = comm().allgatherv(mine);
  std::vector<int32_t> want;
  for (int r = 0; r < size(); ++r) want.insert(want.end(), static_cast<std::size_t>(r), r);
  EXPECT_EQ(everyone, want);

  // Rank r sends (r + j) % 3 elements of value 10 * r + j to rank j.
  std::vector<std::size_t> sendcounts(size()), recvcounts(size());
  std::vector<int32_t> send, expected;
  for (int j = 0; j < size(); ++j) {
    sendcounts[j] = static_cast<std::size_t>((rank() + j) % 3);
    recvcounts[j] = static_cast<std::size_t>((j + rank()) % 3);
    send.insert(send.end(), sendcounts[j], 10 * rank() + j);
    expected.insert(expected.end(), recvcounts[j], 10 * j + rank());
  }
  std::vector<int32_t> got(expected.size());
  comm().alltoallv(send, sendcounts, got, recvcounts);
  EXPECT_EQ(got, expected);
  std::vector<int32_t> too_small;
  if (!expected.empty()) {
    EXPECT_THROW(comm().alltoallv(send, sendcounts, too_small, recvcounts), mncl::InvalidArgument);
  }
}

TEST_F(Frontends, LocalSizeMismatchThrowsBeforeSending) {
  std::vector<float> send(4), recv(3);
  EXPECT_THROW(comm().allreduce(send, recv), mncl::InvalidArgument);
  std::vector<float> too_small(1);
  EXPECT_THROW(comm().allgather(send, too_small), mncl::InvalidArgument);
}

TEST_F(Frontends, LibraryErrorsBecomeExceptions) {
  std::vector<int32_t> buf(3);
  try {
    comm().bcast(buf, size());  // a root that does not exist, on every rank
    FAIL() << "bcast to root " << size() << " succeeded";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("mncl_bcast"), std::string::npos) << e.what();
  }
  comm().barrier();  // still usable
}

TEST_F(Frontends, NonBlockingRequests) {
  std::vector<double> a(1000, rank() + 0.5);
  mncl::Request request = comm().iallreduce(a);
  EXPECT_TRUE(request.pending());
  request.wait();
  EXPECT_FALSE(request.pending());
  EXPECT_DOUBLE_EQ(a[999], size() * (size() - 1) / 2.0 + 0.5 * size());
  std::vector<float> x(3, 1.0f), y(7, 2.0f);
  std::vector<Span<float>> bufs{Span<float>(x), Span<float>(y)};
  mncl::Request coalesced = comm().iallreduce_coalesced(bufs);
  while (!coalesced.test()) {
  }
  EXPECT_EQ(x, std::vector<float>(3, float(size())));
  EXPECT_EQ(y, std::vector<float>(7, 2.0f * size()));
}

// mncl_test can fail with the request still pending (here: another thread is in mncl_wait on
// it). Request::test then throws but keeps the request, so wait() still waits for the operation
// (it once dropped it: wait() returned at once, with the receive still to land in the buffer).
TEST_F(Frontends, RequestTestErrorKeepsTheRequestPending) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  if (rank() == 0) {
    std::vector<int32_t> got(5, -1);
    mncl_request_t raw = nullptr;
    ASSERT_EQ(mncl_irecv(comm().handle(), got.data(), got.size(), MNCL_INT32, 1, nullptr, &raw),
              MNCL_OK);
    mncl::Request request(raw);
    // Rank 1 sends only when told: until then the waits below run out of time, each holding
    // the request for up to 200 ms, so test() here finds it held sooner or later.
    std::atomic<bool> stop{false};
    std::thread waiter([&] {
      while (!stop) {
        const mncl_status_t status = mncl_wait(raw, 200);
        // INVALID_ARGUMENT: this call came while test() held the request.
        if (status != MNCL_ERR_TIMEOUT && status != MNCL_ERR_INVALID_ARGUMENT) {
          ADD_FAILURE() << "mncl_wait: " << mncl_status_string(status);
          return;
        }
      }
    });
    bool refused = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!refused && std::chrono::steady_clock::now() < deadline) {
      try {
        if (request.test()) {
          ADD_FAILURE() << "the receive ended before anything was sent";
          break;
        }
        std::this_thread::yield();
      } catch (const mncl::InvalidArgument &) {  // the other thread holds the request
        refused = true;
      }
    }
    stop = true;
    waiter.join();
    EXPECT_TRUE(refused) << "mncl_test never saw the other thread's wait";
    EXPECT_TRUE(request.pending()) << "a failed test() dropped a request still in flight";
    comm().send(std::vector<int32_t>{1}, 1);
    if (request.pending()) {
      request.wait();
    } else {
      (void)mncl_wait(raw, -1);  // (what the wrapper forgot: the buffer must not die under it)
    }
    EXPECT_EQ(got, (std::vector<int32_t>{7, 7, 7, 7, 7}));
  } else if (rank() == 1) {
    std::vector<int32_t> go(1);
    comm().recv(go, 0);
    comm().send(std::vector<int32_t>(5, 7), 0);
  }
  comm().barrier();
}

TEST_F(Frontends, Split) {
  mncl::Communicator half = comm().split(rank() % 2, -rank());  // reversed order inside
  ASSERT_TRUE(half.valid());
  const int expected_size = (size() + 1 - rank() % 2) / 2;
  EXPECT_EQ(half.size(), expected_size);
  EXPECT_EQ(half.allreduce_value(1), expected_size);
  EXPECT_EQ(half.rank(), expected_size - 1 - rank() / 2);
  mncl::Communicator none = comm().split(rank() == 0 ? 0 : MNCL_SPLIT_NONE);
  EXPECT_EQ(none.valid(), rank() == 0);
}

// ---------------------------------------------------------------------------------------------
// Point to point: sendrecv and batches (every rank sends and receives at once)
// ---------------------------------------------------------------------------------------------

// Element i of what `from` sends to `to` in exchange `tag`: distinct for every pair and tag.
int64_t p2p_value(int from, int to, int tag, std::size_t i) {
  return 1000000 * (tag + 1) + 10000 * from + 100 * to + static_cast<int64_t>(i % 97);
}
std::vector<int64_t> p2p_message(int from, int to, int tag, std::size_t count) {
  std::vector<int64_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = p2p_value(from, to, tag, i);
  return v;
}

// A ring shift, each rank sending to rank + 1 while receiving from rank - 1, in one call with
// no even/odd ordering: small and large (beyond any eager threshold) messages, and messages
// whose send and receive counts differ (each rank sends rank + 1 elements).
TEST_F(Frontends, SendrecvRingShift) {
  if (size() < 2) {
    std::vector<int64_t> x(4, 1), y(4);
    EXPECT_THROW(comm().sendrecv(x, 0, y, 0), mncl::InvalidArgument);  // not to oneself
    return;
  }
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{3} << 17}) {
    const auto send = p2p_message(rank(), next, 0, count);
    std::vector<int64_t> got(count, -1);
    comm().sendrecv(send, next, got, prev);
    EXPECT_EQ(got, p2p_message(prev, rank(), 0, count)) << count << " elements";
  }
  // Non-blocking, counts differing by direction, float data.
  std::vector<float> send(rank() + 1, 0.5f + rank()), got(prev + 1, -1.0f);
  mncl::Request request = comm().isendrecv(send, next, got, prev);
  EXPECT_TRUE(request.pending());
  request.wait();
  EXPECT_EQ(got, std::vector<float>(prev + 1, 0.5f + prev));
  // dest == source: a pairwise swap between ranks 2k and 2k + 1 (an odd last rank sits out).
  const int partner = rank() ^ 1;
  if (partner < size()) {
    const auto mine = p2p_message(rank(), partner, 1, 5);
    std::vector<int64_t> theirs(5);
    comm().sendrecv(mine, partner, theirs, partner);
    EXPECT_EQ(theirs, p2p_message(partner, rank(), 1, 5));
  }
  comm().barrier();
}

// A halo exchange in one batch: every rank sends a different dtype each way, receives from
// both neighbours, and sends an empty message; recvs listed before sends. With 2 ranks both
// neighbours are one rank, so the ops also check matching in array order per direction.
TEST_F(Frontends, SendrecvBatchHaloExchange) {
  EXPECT_NO_THROW(comm().sendrecv_batch({}));  // an empty batch is valid on any size
  EXPECT_NO_THROW(comm().isendrecv_batch({}).wait());
  if (size() < 2) return;
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  const std::size_t n = 4099;
  std::vector<double> to_next(n), from_prev(n, -1.0);
  std::vector<int32_t> to_prev(n + 1), from_next(n + 1, -1);
  for (std::size_t i = 0; i < n; ++i) to_next[i] = rank() + i / 8.0;
  for (std::size_t i = 0; i <= n; ++i) to_prev[i] = -rank() * 100000 - static_cast<int32_t>(i);
  std::vector<uint8_t> empty_out, empty_in;
  const std::vector<mncl::P2POp> ops{
      mncl::irecv_op(from_prev, prev), mncl::isend_op(to_next, next),
      mncl::irecv_op(from_next, next), mncl::isend_op(to_prev, prev),
      mncl::isend_op(empty_out, next), mncl::irecv_op(empty_in, prev)};
  EXPECT_FALSE(ops[0].is_send());
  EXPECT_EQ(ops[1].kind(), MNCL_P2P_SEND);
  EXPECT_EQ(ops[1].peer(), next);
  EXPECT_EQ(ops[1].count(), n);
  EXPECT_EQ(ops[1].dtype(), MNCL_FLOAT64);
  EXPECT_EQ(ops[2].dtype(), MNCL_INT32);
  EXPECT_EQ(ops[2].data(), from_next.data());
  EXPECT_EQ(ops[2].c_op().struct_size, sizeof(mncl_p2p_op_t));
  comm().sendrecv_batch(ops);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(from_prev[i], prev + i / 8.0) << i;
  for (std::size_t i = 0; i <= n; ++i) {
    ASSERT_EQ(from_next[i], -next * 100000 - static_cast<int32_t>(i)) << i;
  }

  // Non-blocking: one tensor to every other rank, one message from each (an all-to-all of
  // single ops), waited for by test().
  const auto mine = p2p_message(rank(), -1, 2, 33);
  std::vector<std::vector<int64_t>> inbox(size(), std::vector<int64_t>(33, -1));
  std::vector<mncl::P2POp> all;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    all.push_back(mncl::isend_op(mine, peer));  // send buffers may be shared
    all.push_back(mncl::irecv_op(inbox[peer], peer));
  }
  mncl::Request request = comm().isendrecv_batch(all);
  while (!request.test()) {
  }
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) {
      EXPECT_EQ(inbox[peer], p2p_message(peer, -1, 2, 33)) << "from " << peer;
    }
  }
  comm().barrier();
}

// Messages of a pair match in issue order across sendrecv, batches and send/recv.
TEST_F(Frontends, SendrecvBatchMatchesSendAndRecvInOrder) {
  if (size() < 2) return;
  if (rank() > 1) {
    comm().barrier();
    return;
  }
  const int peer = 1 - rank();
  std::vector<int64_t> a(7, -1), b(9, -1), c(11, -1);
  if (rank() == 0) {  // three sends: two in one batch, then a plain send
    // (Named: an op of a temporary does not compile, see NonBlockingCallsRefuseTemporaries.)
    const auto first = p2p_message(0, 1, 3, 7), second = p2p_message(0, 1, 4, 9);
    comm().sendrecv_batch({mncl::isend_op(first, peer), mncl::isend_op(second, peer)});
    comm().send(p2p_message(0, 1, 5, 11), peer);
  } else {  // a plain recv, then a batch of two receives
    comm().recv(a, peer);
    comm().sendrecv_batch({mncl::irecv_op(b, peer), mncl::irecv_op(c, peer)});
    EXPECT_EQ(a, p2p_message(0, 1, 3, 7));
    EXPECT_EQ(b, p2p_message(0, 1, 4, 9));
    EXPECT_EQ(c, p2p_message(0, 1, 5, 11));
  }
  comm().barrier();
}

// Errors found before anything starts: a peer that is this rank or out of range, overlapping
// receive buffers. The communicator stays usable.
TEST_F(Frontends, SendrecvBatchRejectsBadOpsLocally) {
  std::vector<int32_t> buf(8), other(8);
  const int peer = (rank() + 1) % size();  // this rank on a single-rank communicator
  EXPECT_THROW(comm().sendrecv_batch({mncl::isend_op(buf, rank())}), mncl::InvalidArgument);
  EXPECT_THROW(comm().isendrecv_batch({mncl::irecv_op(other, size())}), mncl::InvalidArgument);
  EXPECT_THROW(comm().sendrecv_batch({mncl::irecv_op(buf, peer),
                                      mncl::irecv_op(Span<int32_t>(buf.data() + 4, 4), peer)}),
               mncl::InvalidArgument);
  if (size() > 1) {  // the message names the offending op
    try {
      comm().sendrecv_batch({mncl::irecv_op(other, peer), mncl::isend_op(buf, rank())});
      FAIL() << "a batch sending to this rank succeeded";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("op 1"), std::string::npos) << e.what();
    }
  }
  try {
    comm().sendrecv(buf, peer, buf, peer);  // receives into its own send buffer
    FAIL() << "sendrecv from and into one buffer succeeded";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_EQ(e.status(), MNCL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("mncl_sendrecv"), std::string::npos) << e.what();
  }
  comm().barrier();
}

// ---------------------------------------------------------------------------------------------
// Objects, in chunks
// ---------------------------------------------------------------------------------------------

struct Message {
  std::string text;
  std::vector<double> numbers;
  void save(mncl::OutArchive &ar) const { ar << text << numbers; }
  void load(mncl::InArchive &ar) { ar >> text >> numbers; }
};

// An object the root cannot serialize: the root throws the reason and every other rank
// RemoteError, at once (they once waited for its bytes until the timeout). Afterwards the
// ranks are still in step.
struct FailsToSerialize {
  int value = 0;
  void save(mncl::OutArchive &) const { throw mncl::SerializationError("no bytes for this one"); }
  void load(mncl::InArchive &ar) { ar >> value; }
};

TEST_F(Frontends, BcastObjFailureOnTheRootFailsEveryRank) {
  const int root = size() - 1;
  FailsToSerialize obj;
  const auto start = std::chrono::steady_clock::now();
  expect_fails_together<mncl::SerializationError>([&] { comm().bcast_obj(obj, root); }, root,
                                                  "bcast_obj", "root " + std::to_string(root));
  // Well within the test's 20 s communicator timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(comm().allreduce_value(1), size());
  std::string text = rank() == root ? "still works" : "";
  comm().bcast_obj(text, root);
  EXPECT_EQ(text, "still works");
}

// An object that serializes or decodes on some ranks only: the every-rank object collectives
// fail on every rank together, the failing rank with its reason, the others with RemoteError
// naming it (they once waited for its bytes until the timeout, or returned while it threw), and
// the ranks stay in step. Rank `culprit` is the one that fails, by the object's own value.
struct FailsOnOneRank {
  int culprit = -1;
  bool fail_saving = false;
  void save(mncl::OutArchive &ar) const {
    if (fail_saving && spmd::world().rank() == culprit) {
      throw mncl::SerializationError("this rank's object does not serialize");
    }
    ar << static_cast<int32_t>(culprit) << fail_saving;
  }
  void load(mncl::InArchive &ar) {
    int32_t c = 0;
    ar >> c >> fail_saving;
    culprit = c;
    if (!fail_saving && spmd::world().rank() == culprit) {
      throw mncl::SerializationError("this rank cannot decode it");
    }
  }
};

TEST_F(Frontends, ObjectCollectivesFailTogetherWhenOneRankCannot) {
  const int culprit = size() - 1;
  const FailsOnOneRank bad_save{culprit, true}, bad_load{culprit, false};
  using Fails = mncl::SerializationError;
  const std::string names = "rank " + std::to_string(culprit);
  expect_fails_together<Fails>([&] { comm().allgather_obj(bad_save); }, culprit, "allgather_obj",
                               names);
  expect_fails_together<Fails>([&] { comm().gather_obj(bad_save, 0); }, culprit, "gather_obj",
                               names);
  expect_fails_together<Fails>([&] { comm().allgather_obj(bad_load); }, culprit,
                               "allgather_obj decode", names);
  if (culprit != 0) {  // decoded on the root only
    expect_fails_together<Fails>([&] { comm().gather_obj(bad_load, culprit); }, culprit,
                                 "gather_obj decode", names);
  }
  FailsOnOneRank received = rank() == 0 ? bad_load : FailsOnOneRank{};
  if (culprit != 0) {
    expect_fails_together<Fails>([&] { comm().bcast_obj(received, 0); }, culprit,
                                 "bcast_obj decode", names);
    expect_fails_together<Fails>(
        [&] { comm().scatter_obj(std::vector<FailsOnOneRank>(size(), bad_load), 0); }, culprit,
        "scatter_obj decode", names);
  }
  // A combine that throws on rank 0 (with one rank there is nothing to combine).
  if (size() > 1) {
    expect_fails_together<std::runtime_error>(
        [&] {
          comm().allreduce_obj(rank(),
                               [](int, int) -> int { throw std::runtime_error("combine"); });
        },
        0, "allreduce_obj combine", "rank 0");
  }
  // send_obj of an object that does not serialize: recv_obj fails at once.
  if (size() > 1) {
    if (rank() == 0) {
      EXPECT_THROW(comm().send_obj(FailsOnOneRank{0, true}, 1), Fails);
    } else if (rank() == 1) {
      EXPECT_THROW(comm().recv_obj<FailsOnOneRank>(0), mncl::RemoteError);
    }
  }
  EXPECT_EQ(comm().allreduce_value(1), size());  // still in step
}

TEST_F(Frontends, ObjectCollectivesInSmallChunks) {
  const std::size_t saved = comm().max_message_bytes();
  comm().set_max_message_bytes(7);  // every object takes many messages
  Message m{"from " + std::to_string(rank()), std::vector<double>(rank() + 3, rank())};
  Message b = m;
  comm().bcast_obj(b, size() - 1);
  EXPECT_EQ(b.text, "from " + std::to_string(size() - 1));
  EXPECT_EQ(b.numbers.size(), std::size_t(size() + 2));

  const auto all = comm().gather_obj(m, 0);
  if (rank() == 0) {
    ASSERT_EQ(all.size(), std::size_t(size()));
    for (int r = 0; r < size(); ++r) EXPECT_EQ(all[r].text, "from " + std::to_string(r));
  } else {
    EXPECT_TRUE(all.empty());
  }
  const auto names = comm().allgather_obj(m.text);
  ASSERT_EQ(names.size(), std::size_t(size()));
  EXPECT_EQ(names.back(), "from " + std::to_string(size() - 1));

  const std::string joined = comm().allreduce_obj(std::to_string(rank()));
  std::string expected;
  for (int r = 0; r < size(); ++r) expected += std::to_string(r);
  EXPECT_EQ(joined, expected);  // std::plus on strings, folded in rank order

  std::vector<std::vector<int>> parts;
  if (rank() == 0) {
    for (int r = 0; r < size(); ++r) parts.push_back(std::vector<int>(r, r));
  }
  EXPECT_EQ(comm().scatter_obj(parts, 0), std::vector<int>(rank(), rank()));
  // A root that passes the wrong number of objects throws, and every other rank with it (they
  // once waited for the timeout); the communicator works on.
  const int last = size() - 1;
  expect_fails_together(
      [&] {
        comm().scatter_obj(rank() == last ? std::vector<int>(size() + 1, 7) : std::vector<int>{},
                           last);
      },
      last, "scatter_obj of one object too many", "root " + std::to_string(last));
  EXPECT_EQ(comm().scatter_obj(parts, 0), std::vector<int>(rank(), rank()));

  if (size() > 1) {  // a ring of point-to-point objects
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    if (rank() % 2 == 0) {
      comm().send_obj(m, next);
      EXPECT_EQ(comm().recv_obj<Message>(prev).text, "from " + std::to_string(prev));
    } else {
      const Message got = comm().recv_obj<Message>(prev);
      comm().send_obj(m, next);
      EXPECT_EQ(got.text, "from " + std::to_string(prev));
    }
  }
  comm().set_max_message_bytes(saved);
}

// gatherv/scatterv with blocks of different sizes (rank 0's empty): packed in rank order, then
// at explicit displacements in reverse rank order with one-element gaps.
TEST_F(Frontends, GathervAndScattervUnevenBlocks) {
  const int root = size() / 2;
  auto count_of = [](int r) { return static_cast<std::size_t>(2 * r + r % 2); };
  const std::vector<int32_t> mine(count_of(rank()), 7 * rank() + 1);
  std::vector<std::size_t> counts;
  std::vector<int32_t> packed;
  for (int r = 0; r < size(); ++r) {
    counts.push_back(count_of(r));
    packed.insert(packed.end(), count_of(r), 7 * r + 1);
  }
  EXPECT_EQ(comm().gatherv(mine, root), rank() == root ? packed : std::vector<int32_t>{});

  std::vector<std::size_t> displs(size());
  std::size_t end = 0;
  for (int r = size() - 1; r >= 0; --r) {
    displs[r] = end;
    end += counts[r] + 1;
  }
  std::vector<int32_t> spread(rank() == root ? end : 0, -1), want_spread = spread;
  if (rank() == root) {
    for (int r = 0; r < size(); ++r)
      std::fill_n(want_spread.begin() + displs[r], counts[r], 7 * r + 1);
  }
  comm().gatherv(mine, spread, counts, root, displs);
  EXPECT_EQ(spread, want_spread);

  std::vector<int32_t> back(mine.size(), -1);
  comm().scatterv(rank() == root ? packed : std::vector<int32_t>{},
                  rank() == root ? counts : std::vector<std::size_t>{}, back, root);
  EXPECT_EQ(back, mine);
  std::fill(back.begin(), back.end(), -1);
  comm().scatterv(want_spread, counts, back, root, displs);  // the arrays matter on the root only
  EXPECT_EQ(back, mine);

  if (rank() == root) {  // local checks, before anything is sent
    if (!packed.empty()) {
      std::vector<int32_t> short_recv(packed.size() - 1);
      EXPECT_THROW(comm().gatherv(mine, short_recv, counts, root), mncl::InvalidArgument);
    }
    EXPECT_THROW(comm().scatterv(packed, std::vector<std::size_t>(size() + 1), back, root),
                 mncl::InvalidArgument);
  }
}

// Serializes to its bytes alone, with no length prefix: an empty one is zero bytes on the wire.
struct RawBytes {
  std::string bytes;
  void save(mncl::OutArchive &ar) const { ar.write(bytes.data(), bytes.size()); }
  void load(mncl::InArchive &ar) {
    bytes.resize(ar.remaining());
    ar.read(&bytes[0], bytes.size());
  }
};

// Rank 0's text is empty; the others' lengths go up and down with the rank (30, 12, 41 bytes for
// ranks 1-3), so the longest object is neither the first nor the last rank's.
std::string varied_text(int r) {
  const std::size_t length = r == 0 ? 0 : static_cast<std::size_t>((r * 29) % 47 + 1);
  std::string text;
  for (std::size_t i = 0; i < length; ++i) text += static_cast<char>('a' + (r * 7 + i) % 26);
  return text;
}

// allgather_obj (gather_obj, scatter_obj) moves the bytes in allgatherv (gatherv, scatterv) rounds
// of at most max_message_bytes per rank, as many as the longest object needs: ranks whose bytes are
// all sent (or that had none) keep taking part with nothing to contribute, or the collectives would
// stop matching.
TEST_F(Frontends, ObjectCollectivesInRoundsOfDifferentSizes) {
  const std::size_t saved = comm().max_message_bytes();
  std::vector<std::string> want_text;
  std::vector<std::vector<int32_t>> want_numbers;
  for (int r = 0; r < size(); ++r) {
    want_text.push_back(varied_text(r));
    want_numbers.push_back(std::vector<int32_t>(static_cast<std::size_t>(3 * r), 100 * r + 1));
  }
  for (std::size_t chunk : {std::size_t{1}, std::size_t{5}, std::size_t{64}, saved}) {
    SCOPED_TRACE("max_message_bytes " + std::to_string(chunk));
    comm().set_max_message_bytes(chunk);
    EXPECT_EQ(comm().allgather_obj(want_text[rank()]), want_text);
    EXPECT_EQ(comm().allgather_obj(want_numbers[rank()]), want_numbers);

    // Rank 0 contributes zero bytes (at np1, no rank any). EXPECT, never ASSERT, in this loop:
    // returning early would leave the other ranks waiting in the next collective.
    std::vector<std::string> raw_text, empty_text;
    for (const auto &raw : comm().allgather_obj(RawBytes{want_text[rank()]})) {
      raw_text.push_back(raw.bytes);
    }
    EXPECT_EQ(raw_text, want_text);
    for (const auto &raw : comm().allgather_obj(RawBytes{})) {  // nothing at all: no rounds
      empty_text.push_back(raw.bytes);
    }
    EXPECT_EQ(empty_text, std::vector<std::string>(static_cast<std::size_t>(size())));

    // gather_obj and scatter_obj run the same rounds as gathervs and scattervs.
    const int root = size() - 1;
    EXPECT_EQ(comm().gather_obj(want_text[rank()], root),
              rank() == root ? want_text : std::vector<std::string>{});
    EXPECT_EQ(comm().gather_obj(want_numbers[rank()], 0),
              rank() == 0 ? want_numbers : std::vector<std::vector<int32_t>>{});
    EXPECT_EQ(comm().scatter_obj(rank() == root ? want_text : std::vector<std::string>{}, root),
              want_text[rank()]);
    EXPECT_EQ(comm().scatter_obj(rank() == 0 ? want_numbers : std::vector<std::vector<int32_t>>{}),
              want_numbers[rank()]);

    // Still in step: a collective after the rounds matches on every rank.
    EXPECT_EQ(comm().allreduce_value(int64_t{rank()} + 1), int64_t{size()} * (size() + 1) / 2);
  }
  comm().set_max_message_bytes(saved);
}

// ---------------------------------------------------------------------------------------------
// Multi-node optimizer
// ---------------------------------------------------------------------------------------------

using mncl_testing::RecordingOptimizer;

struct Model {
  std::vector<std::vector<float>> values, grads;
  explicit Model(const std::vector<std::size_t> &sizes, float fill) {
    for (std::size_t n : sizes) {
      values.emplace_back(n, fill);
      grads.emplace_back(n, 0.0f);
    }
  }
  mncl::ParamSpans params() {
    mncl::ParamSpans spans;
    for (auto &v : values) spans.emplace_back(v);
    return spans;
  }
  mncl::GradSpans grad_spans() {
    mncl::GradSpans spans;
    for (auto &g : grads) spans.emplace_back(g.data(), g.size());
    return spans;
  }
};

struct OptimizerCase {
  mncl::GradDtype dtype;
  std::size_t fusion_bytes;
  const char *name;
};

class MultiNodeOptimizerTest : public Frontends,
                               public ::testing::WithParamInterface<OptimizerCase> {};

// The first update broadcasts rank 0's parameters and then steps with its gradients like any
// other: the broadcast consumes no gradient (it once did, which shifted allreduce_every's rounds
// by one micro-batch).
TEST_P(MultiNodeOptimizerTest, FirstUpdateBroadcastsThenGradientsAverage) {
  const std::vector<std::size_t> sizes{1, 1021, 5, 0, 300};
  Model model(sizes, 100.0f + rank());  // every rank starts elsewhere
  mncl::MultiNodeOptimizerOptions options;
  options.grad_dtype = GetParam().dtype;
  options.fusion_buffer_bytes = GetParam().fusion_bytes;
  mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm(), options);

  // Gradients rank, rank+1, rank+2 (cycling over the parameters) average to
  // (size-1)/2 + {0, 1, 2}.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::fill(model.grads[i].begin(), model.grads[i].end(), float(rank() + int(i % 3)));
  }
  EXPECT_TRUE(opt.update(model.params(), model.grad_spans()));
  EXPECT_EQ(opt.updates(), 1u);
  ASSERT_EQ(opt.actual_optimizer().seen.size(), 1u);
  const auto &averaged = opt.actual_optimizer().seen[0];
  const double tolerance = GetParam().dtype == mncl::GradDtype::kFloat32 ? 1e-6 : 2e-2;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(averaged[i].size(), sizes[i]);
    const double expected = (size() - 1) / 2.0 + double(i % 3);
    for (float g : averaged[i]) ASSERT_NEAR(g, expected, tolerance * (1 + expected)) << i;
    // Rank 0's parameters, broadcast before the step, minus the step (RecordingOptimizer).
    for (std::size_t j = 0; j < sizes[i]; ++j) {
      ASSERT_EQ(model.values[i][j], 100.0f - averaged[i][j]) << "parameters not broadcast";
    }
  }
  // And every rank stepped identically.
  const auto checksum = std::accumulate(model.values[2].begin(), model.values[2].end(), 0.0);
  EXPECT_EQ(comm().allreduce_value(checksum, mncl::ReduceOp::kMax),
            comm().allreduce_value(checksum, mncl::ReduceOp::kMin));
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, MultiNodeOptimizerTest,
    ::testing::Values(OptimizerCase{mncl::GradDtype::kFloat32, 4 << 20, "f32_one_buffer"},
                      OptimizerCase{mncl::GradDtype::kFloat32, 64, "f32_64_byte_buffers"},
                      OptimizerCase{mncl::GradDtype::kFloat32, 0, "f32_per_parameter"},
                      OptimizerCase{mncl::GradDtype::kFloat16, 100, "f16"},
                      OptimizerCase{mncl::GradDtype::kBFloat16, 4 << 20, "bf16"}),
    [](const auto &info) { return std::string(info.param.name); });

TEST_F(Frontends, DoubleBufferingLagsExactlyOneStep) {
  Model model({4, 9}, 0.0f);
  mncl::MultiNodeOptimizerOptions options;
  options.double_buffering = true;
  options.fusion_buffer_bytes = 16;
  mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm(), options);
  const double mean_rank = (size() - 1) / 2.0;
  for (int step = 0; step < 6; ++step) {
    for (auto &g : model.grads) std::fill(g.begin(), g.end(), float(10 * step + rank()));
    EXPECT_EQ(opt.update(model.params(), model.grad_spans()), step > 0) << "step " << step;
    const auto &seen = opt.actual_optimizer().seen;
    // Update 0 broadcasts and starts an exchange, update k >= 1 applies the average of update
    // k-1's gradients.
    ASSERT_EQ(seen.size(), std::size_t(step)) << "step " << step;
    if (step >= 1) {
      for (const auto &g : seen.back()) {
        for (float x : g) ASSERT_DOUBLE_EQ(x, 10.0 * (step - 1) + mean_rank) << "step " << step;
      }
    }
  }
  // synchronize() completes the last exchange without changing what the next step applies.
  opt.synchronize();
  EXPECT_DOUBLE_EQ(opt.averaged_grads()[1][0], 50.0 + mean_rank);
}

// A snapshot loaded into the other double-buffering mode applies every averaged gradient once:
// one saved with double buffering holds averages not applied yet (a run without applies them
// at its first step, before its own), one saved without holds averages applied already (a
// double-buffered run starts over: its first step only starts an exchange). They were once
// applied again, or dropped.
TEST_F(Frontends, SnapshotLoadsIntoTheOtherDoubleBufferingMode) {
  const double mean_rank = (size() - 1) / 2.0;
  auto run = [&](mncl::MultiNodeOptimizer<RecordingOptimizer> &opt, Model &model, int from,
                 int to) {
    for (int s = from; s < to; ++s) {  // the average of step s is 10 s + mean_rank
      for (auto &g : model.grads) std::fill(g.begin(), g.end(), float(10 * s + rank()));
      opt.update(model.params(), model.grad_spans());
    }
  };
  auto applied = [](mncl::MultiNodeOptimizer<RecordingOptimizer> &opt, std::vector<double> &into) {
    for (const auto &step : opt.actual_optimizer().seen) into.push_back(step[1][0]);
  };
  for (bool saved_double_buffering : {false, true}) {
    mncl::MultiNodeOptimizerOptions saved_options, loaded_options;
    saved_options.double_buffering = saved_double_buffering;
    loaded_options.double_buffering = !saved_double_buffering;
    Model model({3, 2}, 0.0f);
    std::vector<double> averages;  // every average applied, in order, over both runs
    std::vector<uint8_t> snapshot;
    {
      mncl::MultiNodeOptimizer<RecordingOptimizer> before(RecordingOptimizer{}, comm(),
                                                          saved_options);
      run(before, model, 0, 3);
      before.synchronize();
      snapshot = mncl::to_bytes(before);
      applied(before, averages);
    }
    mncl::MultiNodeOptimizer<RecordingOptimizer> after(RecordingOptimizer{}, comm(),
                                                       loaded_options);
    mncl::from_bytes(Span<const uint8_t>(snapshot), after);
    run(after, model, 3, 5);
    after.synchronize();
    applied(after, averages);
    // Double buffered, the last exchange's averages are still to be applied (the usual lag).
    const int last_applied = saved_double_buffering ? 4 : 3;
    std::vector<double> want;
    for (int s = 0; s <= last_applied; ++s) want.push_back(10.0 * s + mean_rank);
    EXPECT_EQ(averages, want) << (saved_double_buffering ? "double buffered, then not"
                                                         : "not double buffered, then so");
    EXPECT_DOUBLE_EQ(model.values[1][0], -std::accumulate(want.begin(), want.end(), 0.0));
  }
}

// allreduce_every may change between save and load at a step boundary, not inside a round.
TEST_F(Frontends, SnapshotLoadsWithAnotherAllreduceEveryAtAStepBoundary) {
  Model model({4}, 0.0f);
  mncl::MultiNodeOptimizerOptions two, three;
  two.allreduce_every = 2;
  three.allreduce_every = 3;
  mncl::MultiNodeOptimizer<RecordingOptimizer> saved(RecordingOptimizer{}, comm(), two);
  for (auto &g : model.grads) std::fill(g.begin(), g.end(), 1.0f);
  saved.update(model.params(), model.grad_spans());
  const auto mid_round = mncl::to_bytes(saved);
  EXPECT_TRUE(saved.update(model.params(), model.grad_spans()));
  const auto boundary = mncl::to_bytes(saved);
  mncl::MultiNodeOptimizer<RecordingOptimizer> loaded(RecordingOptimizer{}, comm(), three);
  EXPECT_THROW(mncl::from_bytes(Span<const uint8_t>(mid_round), loaded), mncl::InvalidArgument);
  // The load that threw changed nothing (it once left the snapshot's progress half loaded).
  EXPECT_EQ(loaded.updates(), 0u);
  EXPECT_EQ(loaded.pending_micro_batches(), 0);
  mncl::from_bytes(Span<const uint8_t>(boundary), loaded);
  for (int m = 0; m < 3; ++m) {
    EXPECT_EQ(loaded.update(model.params(), model.grad_spans()), m == 2) << m;
  }
  ASSERT_EQ(loaded.actual_optimizer().seen.size(), 1u);
  EXPECT_FLOAT_EQ(loaded.actual_optimizer().seen[0][0][0], 1.0f);  // the mean over 3, not 2
}

TEST_F(Frontends, ZeroFillForMissingGradients) {
  Model model({3, 2}, 1.0f);
  mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm());
  // Parameter 1 has a gradient on rank 0 only.
  std::fill(model.grads[0].begin(), model.grads[0].end(), 1.0f);
  std::fill(model.grads[1].begin(), model.grads[1].end(), float(size()));
  mncl::GradSpans grads = model.grad_spans();
  if (rank() != 0) grads[1] = Span<const float>();
  opt.update(model.params(), grads);
  EXPECT_FLOAT_EQ(opt.actual_optimizer().seen.at(0)[1][0], 1.0f);  // size / size
  EXPECT_FLOAT_EQ(model.values[1][1], 0.0f);                       // stepped on every rank alike

  mncl::MultiNodeOptimizerOptions strict;
  strict.zero_fill = false;
  mncl::MultiNodeOptimizer<RecordingOptimizer> no_fill(RecordingOptimizer{}, comm(), strict);
  grads[1] = Span<const float>();
  EXPECT_THROW(no_fill.update(model.params(), grads), mncl::InvalidArgument);  // local check
}

// A gradient refused on one rank fails every rank together, at once (the others once waited in
// the exchange until the timeout), and nothing changes: the next update goes on in step.
TEST_F(Frontends, MultiNodeOptimizerBadGradientOnOneRankFailsEveryRank) {
  const int culprit = size() - 1;
  for (bool double_buffering : {false, true}) {
    SCOPED_TRACE(double_buffering ? "double buffering" : "blocking");
    Model model({4, 3}, 1.0f);
    for (auto &g : model.grads) std::fill(g.begin(), g.end(), float(rank()));
    mncl::MultiNodeOptimizerOptions options;
    options.double_buffering = double_buffering;
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm(), options);
    opt.update(model.params(), model.grad_spans());

    mncl::GradSpans grads = model.grad_spans();
    if (rank() == culprit) grads[1] = Span<const float>(model.grads[1].data(), 2);
    expect_fails_together([&] { opt.update(model.params(), grads); }, culprit, "bad gradient",
                          "rank " + std::to_string(culprit) + " could not take part",
                          "parameter 1 has 3 elements but its gradient 2");
    EXPECT_EQ(opt.updates(), 1u);
    EXPECT_EQ(opt.actual_optimizer().seen.size(), double_buffering ? 0u : 1u);

    EXPECT_TRUE(opt.update(model.params(), model.grad_spans()));
    const auto &seen = opt.actual_optimizer().seen;
    ASSERT_EQ(seen.size(), double_buffering ? 1u : 2u);
    for (const auto &step : seen) EXPECT_DOUBLE_EQ(step[1][2], (size() - 1) / 2.0);
    const double value = model.values[1][2];
    EXPECT_EQ(comm().allreduce_value(value, mncl::ReduceOp::kMax),
              comm().allreduce_value(value, mncl::ReduceOp::kMin));
  }
}

// Settings, parameter lists or progress that differ between the ranks fail every rank with
// InvalidArgument naming the ranks that differ from rank 0, before anything moves (another
// allreduce_every or fusion size once made the exchanges mismatch: a timeout or wrong sums).
TEST_F(Frontends, MultiNodeOptimizerRanksThatDifferFailTogether) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to differ";
  const std::string differ = "rank" + std::string(size() > 2 ? "s 1, " : " 1");
  auto expect_refused = [&](auto &&call, const char *what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find(differ), std::string::npos) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("passed other arguments than rank 0"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  Model model({5, 2}, 1.0f);
  const std::vector<uint8_t> none_yet = [&] {
    mncl::MultiNodeOptimizer<RecordingOptimizer> fresh(RecordingOptimizer{}, comm());
    return mncl::to_bytes(fresh);
  }();
  {  // another allreduce_every, another fusion size
    mncl::MultiNodeOptimizerOptions options;
    if (rank() > 0) options.allreduce_every = 2;
    mncl::MultiNodeOptimizer<RecordingOptimizer> every(RecordingOptimizer{}, comm(), options);
    expect_refused([&] { every.update(model.params(), model.grad_spans()); }, "allreduce_every");
    EXPECT_EQ(every.updates(), 0u);
    options = {};
    if (rank() > 0) options.fusion_buffer_bytes = 8;
    mncl::MultiNodeOptimizer<RecordingOptimizer> fusion(RecordingOptimizer{}, comm(), options);
    expect_refused([&] { fusion.update(model.params(), model.grad_spans()); }, "fusion size");
  }
  {  // another parameter list (same total), in update and in broadcast_parameters
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm());
    Model other({4, 3}, 1.0f);
    Model &mine = rank() > 0 ? other : model;
    expect_refused([&] { opt.update(mine.params(), mine.grad_spans()); }, "parameter list");
    expect_refused([&] { opt.broadcast_parameters(mine.params()); }, "broadcast_parameters");
    EXPECT_FALSE(opt.actual_optimizer().seen.size());
  }
  {  // other progress: a snapshot of one update loaded on rank 0 only
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm());
    opt.update(model.params(), model.grad_spans());
    const auto snapshot = mncl::to_bytes(opt);
    mncl::MultiNodeOptimizer<RecordingOptimizer> resumed(RecordingOptimizer{}, comm());
    mncl::from_bytes(Span<const uint8_t>(rank() == 0 ? snapshot : none_yet), resumed);
    expect_refused([&] { resumed.update(model.params(), model.grad_spans()); }, "progress");
  }
}

TEST_F(Frontends, MultiNodeSgdAndAdamKeepRanksInStep) {
  for (int which = 0; which < 2; ++which) {
    Model model({10, 3}, float(rank()));
    auto run = [&](auto &opt) {
      for (int step = 0; step < 4; ++step) {
        for (auto &g : model.grads) {
          for (std::size_t j = 0; j < g.size(); ++j) g[j] = float(rank() + j + step);
        }
        opt.update(model.params(), model.grad_spans());
      }
    };
    if (which == 0) {
      auto opt = mncl::make_multi_node_optimizer(mncl::Sgd({0.1f, 0.9f, 0.0f}), comm());
      run(opt);
    } else {
      auto opt = mncl::make_multi_node_optimizer(mncl::Adam({0.01f}), comm());
      run(opt);
    }
    const double local = model.values[0][7] + model.values[1][2];
    EXPECT_EQ(comm().allreduce_value(local, mncl::ReduceOp::kMax),
              comm().allreduce_value(local, mncl::ReduceOp::kMin));
  }
}

// ---------------------------------------------------------------------------------------------
// Datasets
// ---------------------------------------------------------------------------------------------

TEST_F(Frontends, ScatterIndexTenSamples) {
  const auto equal = mncl::scatter_index(rank() == 0 ? 10 : 0, comm());  // the root's n counts
  const auto disjoint = mncl::scatter_index(10, comm(), 0, false);
  if (size() == 3) {
    const mncl::ShardRange equal_expected[] = {{0, 4}, {3, 7}, {6, 10}};
    const mncl::ShardRange disjoint_expected[] = {{0, 4}, {4, 7}, {7, 10}};  // ChainerMN's
    EXPECT_EQ(equal, equal_expected[rank()]);
    EXPECT_EQ(disjoint, disjoint_expected[rank()]);
  }
  EXPECT_EQ(equal.size(), std::size_t((10 + size() - 1) / size()));
  EXPECT_EQ(comm().allreduce_value(uint64_t(disjoint.size())), 10u);
}

TEST_F(Frontends, ScatterDatasetSendsEachRankItsShard) {
  std::vector<std::string> dataset;
  if (rank() == 0) {
    for (int i = 0; i < 10; ++i) dataset.push_back("sample" + std::to_string(i));
  }
  const auto shard = mncl::scatter_dataset(dataset, comm());
  const auto range = mncl::shard_range(10, size(), rank());
  ASSERT_EQ(shard.size(), range.size());
  for (std::size_t i = 0; i < shard.size(); ++i) {
    EXPECT_EQ(shard[i], "sample" + std::to_string(range.begin + i));
  }

  // Shuffled and disjoint: together the shards hold every sample exactly once.
  mncl::ScatterOptions options;
  options.shuffle = true;
  options.seed = 1234;
  options.force_equal_length = false;
  options.root = size() - 1;
  std::vector<int> numbers;
  if (rank() == size() - 1) {
    numbers.resize(101);
    std::iota(numbers.begin(), numbers.end(), 0);
  }
  const auto mine = mncl::scatter_dataset(numbers, comm(), options);
  EXPECT_EQ(mine.size(), mncl::shard_range(101, size(), rank(), false).size());
  auto all = comm().allgather_obj(mine);
  std::vector<int> together;
  for (const auto &part : all) together.insert(together.end(), part.begin(), part.end());
  EXPECT_NE(together.front() * 1000 + together[1], 1);  // shuffled (0, 1 first is unlikely)
  std::sort(together.begin(), together.end());
  std::vector<int> expected(101);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(together, expected);
}

// A dataset that fails on the root, on the shard of the last rank or on the root's own: every
// rank throws, together (the last ranks once waited out the timeout for a shard that never
// came), and the communicator works on.
struct FailingDataset {
  std::size_t failing_index;
  std::size_t size() const { return 10; }
  int operator[](std::size_t i) const {
    if (i == failing_index) throw std::runtime_error("sample " + std::to_string(i) + " is bad");
    return static_cast<int>(i);
  }
};

TEST_F(Frontends, ScatterDatasetFailsEveryRankTogether) {
  const int root = size() > 1 ? 1 : 0;
  // The first sample of the last non-root rank's shard, then of the root's own shard.
  const int last = root == size() - 1 ? 0 : size() - 1;
  for (const int failing_rank : {last, root}) {
    const FailingDataset dataset{mncl::shard_range(10, size(), failing_rank).begin};
    mncl::ScatterOptions options;
    options.root = root;
    expect_fails_together<std::runtime_error>(
        [&] { mncl::scatter_dataset(dataset, comm(), options); }, root, "scatter_dataset",
        "root " + std::to_string(root), "is bad");
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// ChainerMN's multi-node iterator: the root's items reach every rank in order, then the end
// on every rank alike; a source that throws fails every rank at that item.
TEST_F(Frontends, MultiNodeIteratorGivesTheRootsItemsToEveryRank) {
  using Item = std::pair<int32_t, std::vector<float>>;
  const int root = size() - 1;
  const bool on_root = rank() == root;
  auto counting_source = [](int count, int throw_at) {
    return [count, throw_at, k = 0]() mutable -> std::optional<Item> {
      if (k == throw_at) throw std::runtime_error("source boom");
      if (k == count) return std::nullopt;
      ++k;
      return Item{k, std::vector<float>(static_cast<std::size_t>(k), 0.5f * k)};
    };
  };
  mncl::MultiNodeIterator<Item> items(
      comm(), on_root ? counting_source(4, -1) : mncl::MultiNodeIterator<Item>::Source(), root);
  for (int k = 1; k <= 4; ++k) {
    const std::optional<Item> item = items.next();
    ASSERT_TRUE(item.has_value()) << k;
    EXPECT_EQ(item->first, k);
    EXPECT_EQ(item->second, std::vector<float>(static_cast<std::size_t>(k), 0.5f * k));
  }
  EXPECT_FALSE(items.next().has_value());
  EXPECT_TRUE(items.done());
  EXPECT_FALSE(items.next().has_value());  // spent: no communication

  mncl::MultiNodeIterator<Item> failing(
      comm(), on_root ? counting_source(4, 2) : mncl::MultiNodeIterator<Item>::Source(), root);
  EXPECT_EQ(failing.next()->first, 1);
  EXPECT_EQ(failing.next()->first, 2);
  expect_fails_together<std::runtime_error>(
      [&] { failing.next(); }, root, "the source's third item",
      "the source failed on the root (rank " + std::to_string(root) + "): source boom");
  EXPECT_FALSE(failing.next().has_value());

  // A move-only item (moved into the broadcast, never copied).
  struct Boxed {
    std::unique_ptr<int> value = std::make_unique<int>(0);
    void save(mncl::OutArchive &ar) const { ar << *value; }
    void load(mncl::InArchive &ar) { ar >> *value; }
  };
  int next_value = 7;
  mncl::MultiNodeIterator<Boxed> boxes(
      comm(),
      [&]() -> std::optional<Boxed> {
        Boxed box;
        *box.value = next_value++;
        return box;
      },
      root);
  EXPECT_EQ(*boxes.next()->value, 7);
  EXPECT_EQ(*boxes.next()->value, 8);

  // A root that is no rank, on every rank: each says so.
  EXPECT_THROW(mncl::MultiNodeIterator<Item>(comm(), counting_source(1, -1), size()),
               mncl::InvalidArgument);
  // The root without a source: it says so, the others name it.
  expect_fails_together(
      [&] { mncl::MultiNodeIterator<Item>(comm(), mncl::MultiNodeIterator<Item>::Source(), root); },
      root, "a root without a source", "rank " + std::to_string(root) + " could not take part");
}

// A shard that does not decode on one rank (its samples' load throws there) fails every rank
// together (the others once returned while the root waited in a bcast for it until the
// timeout); a rank given another root fails every rank at once (it once waited for a shard from
// the wrong rank until the timeout).
TEST_F(Frontends, ScatterDatasetDecodeFailureOrAnotherRootFailsEveryRankTogether) {
  const int culprit = size() - 1;
  const std::vector<FailsOnOneRank> dataset(std::size_t(3 * size()),
                                            FailsOnOneRank{culprit, false});
  if (culprit != 0) {
    expect_fails_together<mncl::SerializationError>([&] { mncl::scatter_dataset(dataset, comm()); },
                                                    culprit, "scatter_dataset decode",
                                                    "rank(s) " + std::to_string(culprit));
  }
  if (size() > 1) {
    mncl::ScatterOptions options;
    options.root = rank() == culprit ? 0 : culprit;
    try {
      mncl::scatter_dataset(std::vector<int>(6, 1), comm(), options);
      ADD_FAILURE() << "scattered with two roots";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("passed other arguments than rank 0"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// ---------------------------------------------------------------------------------------------
// Evaluator
// ---------------------------------------------------------------------------------------------

TEST_F(Frontends, EvaluatorWeightsBySampleCount) {
  mncl::Evaluator evaluator(comm());
  // Rank r saw r + 1 samples with mean accuracy r.
  const auto global = evaluator.average({{"accuracy", double(rank())}, {"loss", 1.0}}, rank() + 1);
  double weighted = 0, count = 0;
  for (int r = 0; r < size(); ++r) weighted += double(r) * (r + 1), count += r + 1;
  EXPECT_DOUBLE_EQ(global.at("accuracy"), weighted / count);
  EXPECT_DOUBLE_EQ(global.at("loss"), 1.0);

  // A rank without samples may report nothing; batch means are weighted by batch sizes.
  std::vector<int> shard(rank() == 0 ? 0 : 5 + rank(), rank());
  const auto metrics = evaluator.evaluate(shard, 4, [](const int *batch, std::size_t n) {
    return mncl::Metrics{{"value", double(std::accumulate(batch, batch + n, 0)) / double(n)}};
  });
  if (size() > 1) {
    double sum = 0, samples = 0;
    for (int r = 1; r < size(); ++r) sum += double(r) * (5 + r), samples += 5 + r;
    EXPECT_DOUBLE_EQ(metrics.at("value"), sum / samples);
  } else {
    EXPECT_TRUE(metrics.empty());
  }

  if (size() > 1) {  // names that differ between ranks fail on every rank alike
    EXPECT_THROW(evaluator.average({{rank() == 0 ? "a" : "b", 1.0}}, 1), mncl::InvalidArgument);
    // So does a rank with samples but no metrics (it once counted as "not reporting": its
    // samples divided the others' sums, and nobody was told).
    mncl::Metrics none;
    EXPECT_THROW(evaluator.average(rank() == 0 ? none : mncl::Metrics{{"loss", 1.0}}, 10),
                 mncl::InvalidArgument);
  }
  // A rank without samples is ignored, whatever it reports: NaN means of nothing (0 / 0) too.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto ignored = evaluator.average({{"loss", rank() == 0 ? nan : 2.0}}, rank() == 0 ? 0 : 3);
  if (size() > 1) {
    EXPECT_EQ(ignored.at("loss"), 2.0);
  } else {
    EXPECT_TRUE(ignored.empty());
  }
}

// A sample that evaluate_batch refuses (a label out of range, say). Its own type, so that a
// TimeoutError (the others left waiting for the failed rank) never passes for it.
struct BadSample : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An evaluate_batch that throws on one rank, or a batch_size of 0 there, fails every rank
// together in the averaging's own allreduce: that rank rethrows its exception, the others throw
// RemoteError naming it (they once waited for it until the timeout). Then the world goes on.
TEST_F(Frontends, EvaluatorFailureOnOneRankFailsEveryRank) {
  mncl::Evaluator evaluator(comm());
  const int culprit = size() - 1;
  const std::string others_say = "rank " + std::to_string(culprit) + " could not evaluate";
  const std::vector<int> shard(10, rank());
  const auto mean = [](const int *batch, std::size_t n) {
    return mncl::Metrics{{"value", double(std::accumulate(batch, batch + n, 0)) / double(n)}};
  };
  int batches = 0;  // the culprit's second batch holds a bad sample
  expect_fails_together<BadSample>(
      [&] {
        evaluator.evaluate(shard, 4, [&](const int *batch, std::size_t n) {
          if (rank() == culprit && ++batches == 2) throw BadSample("sample 4 is bad");
          return mean(batch, n);
        });
      },
      culprit, "evaluate_batch throws", others_say, "sample 4 is bad");
  expect_fails_together([&] { evaluator.evaluate(shard, rank() == culprit ? 0 : 4, mean); },
                        culprit, "batch_size 0", others_say, "batch_size must be positive");
  // Also where the culprit has no samples (it once counted as not reporting).
  const std::vector<int> none;
  expect_fails_together(
      [&] {
        evaluator.evaluate(rank() == culprit ? none : shard, rank() == culprit ? 0 : 4, mean);
      },
      culprit, "batch_size 0, no samples", others_say, "batch_size must be positive");
  // A metric that only some batches report (it was divided by every sample: biased to zero).
  batches = 0;
  expect_fails_together(
      [&] {
        evaluator.evaluate(shard, 4, [&](const int *batch, std::size_t n) {
          mncl::Metrics m = mean(batch, n);
          if (rank() == culprit && ++batches == 1) m["extra"] = 1.0;
          return m;
        });
      },
      culprit, "a metric of one batch only", others_say, "reports other metric names");

  const auto metrics = evaluator.evaluate(shard, 4, mean);
  EXPECT_DOUBLE_EQ(metrics.at("value"), (size() - 1) / 2.0);
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// Where several ranks fail, each rethrows its own exception, and the others throw RemoteError
// naming the first and the last of them.
TEST_F(Frontends, EvaluatorFailuresOnSeveralRanksEachThrowTheirOwn) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks to fail";
  mncl::Evaluator evaluator(comm());
  const int last = size() - 1;
  const bool fails = rank() == 0 || rank() == last;
  const std::string mine = "rank " + std::to_string(rank()) + "'s sample is bad";
  try {
    evaluator.evaluate(std::vector<int>(3, rank()), 2, [&](const int *, std::size_t) {
      if (fails) throw BadSample(mine);
      return mncl::Metrics{{"value", 1.0}};
    });
    ADD_FAILURE() << "evaluate returned although ranks 0 and " << last << " failed";
  } catch (const BadSample &e) {
    EXPECT_TRUE(fails) << e.what();
    EXPECT_EQ(std::string(e.what()), mine);
  } catch (const mncl::RemoteError &e) {
    EXPECT_FALSE(fails) << e.what();
    EXPECT_NE(std::string(e.what()).find("ranks 0 and " + std::to_string(last)), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// ---------------------------------------------------------------------------------------------
// Checkpointer (the kill-a-rank scenario runs as its own test: checkpoint_resume_test.sh)
// ---------------------------------------------------------------------------------------------

TEST_F(Frontends, CheckpointerAgreesOnTheNewestCommonIteration) {
  const std::string dir = checkpoint_dir();
  ASSERT_FALSE(dir.empty());
  mncl::Checkpointer ckpt(comm(), dir, "state", {3, false, false});
  for (uint64_t it = 1; it <= 4; ++it) {
    // The last rank "dies" before saving 4; rank 0's 3 is corrupt.
    if (it == 4 && rank() == size() - 1) break;
    ckpt.save(it, std::vector<int>{rank(), int(it)});
  }
  if (rank() == 0) {
    std::FILE *f = std::fopen(ckpt.path(3).c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -1, SEEK_END);
    std::fputc('!', f);
    std::fclose(f);
  }
  comm().barrier();
  std::vector<int> state;
  const auto resumed = ckpt.resume(state);
  // size 1: rank 0 is also the last rank (3 corrupt, 4 never saved) -> 2.
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(*resumed, 2u);
  EXPECT_EQ(state, (std::vector<int>{rank(), 2}));
  remove_checkpoint_dir(dir);
}

// A rank whose directory cannot be made (a file stands in its path, or where it would be) or
// whose arguments are refused fails the constructor, and every other rank learns of it there: they
// used to go on to resume() and wait for it until the timeout. A healthy construction follows.
TEST_F(Frontends, CheckpointerConstructionFailsOnEveryRank) {
  const std::string dir = checkpoint_dir();
  ASSERT_FALSE(dir.empty());
  const std::string blocker = dir + "/a-file";
  if (rank() == 0) {
    std::FILE *f = std::fopen(blocker.c_str(), "w");
    EXPECT_NE(f, nullptr);  // (not ASSERT: every rank must reach the barrier)
    if (f != nullptr) std::fclose(f);
  }
  comm().barrier();
  enum Flaw { kBelowAFile, kAFile, kBadName };
  for (int culprit = 0; culprit < size(); ++culprit) {
    for (const Flaw flaw : {kBelowAFile, kAFile, kBadName}) {
      const bool mine = rank() == culprit;
      const std::string where = !mine || flaw == kBadName ? dir
                                : flaw == kAFile          ? blocker
                                                          : blocker + "/below";
      const std::string name = mine && flaw == kBadName ? "a/b" : "state";
      try {
        mncl::Checkpointer ckpt(comm(), where, name, {2, false, false});
        ADD_FAILURE() << "rank " << culprit << "'s failure went unnoticed here";
      } catch (const mncl::RemoteError &e) {
        EXPECT_FALSE(mine) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(culprit)), std::string::npos)
            << e.what();
      } catch (const mncl::InvalidArgument &e) {
        EXPECT_TRUE(mine && flaw == kBadName) << e.what();
      } catch (const mncl::CheckpointError &e) {
        EXPECT_TRUE(mine && flaw != kBadName) << e.what();
        EXPECT_NE(std::string(e.what()).find(flaw == kAFile ? "not a directory" : "creating"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  mncl::Checkpointer ckpt(comm(), dir, "state", {2, false, false});
  std::vector<int> state;
  EXPECT_FALSE(ckpt.resume(state).has_value());
  remove_checkpoint_dir(dir);
}

// A rank whose snapshots are gone (its directory lost, replaced, or not shared) while the others
// hold several: resume once started afresh on every rank, and the first saves pruned the
// others' snapshots, the run's whole progress. Now every rank throws, naming the ranks, and
// nothing is deleted. A save cut short before every rank wrote its first snapshot (one
// iteration on some ranks) still starts afresh.
TEST_F(Frontends, CheckpointerRefusesToStartAfreshOverSnapshotsOneRankLost) {
  if (size() < 2) GTEST_SKIP() << "needs a rank to lose its snapshots and one to keep them";
  const std::string dir = checkpoint_dir();
  ASSERT_FALSE(dir.empty());
  mncl::Checkpointer ckpt(comm(), dir, "state", {2, false, false});
  const int lost = size() - 1;
  for (uint64_t it = 1; it <= 3; ++it) ckpt.save(it, std::vector<int>{rank(), int(it)});
  if (rank() == lost) {
    for (uint64_t it : ckpt.local_iterations()) std::remove(ckpt.path(it).c_str());
  }
  comm().barrier();
  std::vector<int> state;
  try {
    ckpt.resume(state);
    ADD_FAILURE() << "resumed, or started afresh, over the other ranks' snapshots";
  } catch (const mncl::CheckpointError &e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hold none"), std::string::npos) << what;
    EXPECT_NE(what.find("ranks " + std::to_string(lost) + " hold none"), std::string::npos) << what;
  }
  EXPECT_EQ(ckpt.local_iterations().size(), rank() == lost ? 0u : 2u) << "snapshots deleted";

  // The first save cut short: rank 0 alone wrote iteration 1. Nothing in common: afresh.
  comm().barrier();
  if (rank() == 0) std::system(("rm -f '" + dir + "'/state.*").c_str());
  comm().barrier();
  if (rank() == 0) ckpt.save(1, std::vector<int>{0, 1});
  comm().barrier();
  EXPECT_FALSE(ckpt.resume(state).has_value());
  remove_checkpoint_dir(dir);
}

// A snapshot that verifies but does not decode on one rank (the last): the others have loaded
// it already. With an older snapshot every rank holds, all fall back to it; without one, every
// rank throws (it once returned "nothing to resume" while the others kept what they loaded).
TEST_F(Frontends, CheckpointerFailedLoadOnOneRankFailsEveryRankOrFallsBack) {
  for (bool older : {true, false}) {
    const std::string dir = checkpoint_dir();
    ASSERT_FALSE(dir.empty());
    mncl::Checkpointer ckpt(comm(), dir, "state", {3, false, false});
    if (older) ckpt.save(1, std::vector<int>{rank(), 1});
    if (rank() == size() - 1) {
      const std::vector<uint8_t> three_bytes{1, 2, 3};  // a vector<int> needs 8 for its length
      ckpt.save_bytes(2, mncl::Span<const uint8_t>(three_bytes));
    } else {
      ckpt.save(2, std::vector<int>{rank(), 2});
    }
    comm().barrier();
    std::vector<int> state{-1};
    if (older) {
      const auto resumed = ckpt.resume(state);
      ASSERT_TRUE(resumed.has_value());
      EXPECT_EQ(*resumed, 1u);
      EXPECT_EQ(state, (std::vector<int>{rank(), 1}));
    } else {
      try {
        ckpt.resume(state);
        ADD_FAILURE() << "resume returned although rank " << size() - 1 << " could not load";
      } catch (const mncl::CheckpointError &e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("iteration 2"), std::string::npos) << what;
        // The failing rank's reason, on every rank; the others did load it.
        EXPECT_NE(what.find("rank " + std::to_string(size() - 1) + ": "), std::string::npos)
            << what;
        EXPECT_NE(what.find(std::to_string(size() - 1) + " loaded it whole"), std::string::npos)
            << what;
      }
    }
    remove_checkpoint_dir(dir);
  }
}

// A snapshot that decodes but does not fit this run (load throws InvalidArgument, as
// MultiNodeOptimizer's does for another allreduce_every mid-round), on every rank or on one:
// every rank throws InvalidArgument naming it and the reason, without falling back to an older
// snapshot (which rolled training back) or deleting the newer one.
TEST_F(Frontends, CheckpointerMisfitSnapshotFailsEveryRankAndDeletesNothing) {
  // The last rank refuses the settings; everywhere: every rank does; with the last rank
  // refusing, rank 0 may also fail to decode it (the message names the refusal, not that).
  for (const char *mode : {"everywhere", "last", "last, rank 0 corrupt"}) {
    const bool everywhere = std::strcmp(mode, "everywhere") == 0;
    const bool rank0_corrupt = std::strcmp(mode, "last, rank 0 corrupt") == 0 && size() > 1;
    const std::string dir = checkpoint_dir();
    ASSERT_FALSE(dir.empty());
    mncl::Checkpointer ckpt(comm(), dir, "state", {3, false, false});
    for (uint64_t it = 1; it <= 2; ++it) ckpt.save(it, std::vector<int>{rank(), int(it)});
    const int refusing = everywhere ? -1 : size() - 1;
    std::vector<uint64_t> loaded;
    try {
      ckpt.resume_with([&](mncl::Span<const uint8_t> payload) {
        std::vector<int> state;
        mncl::from_bytes(payload, state);
        loaded.push_back(static_cast<uint64_t>(state.at(1)));
        if (state.at(1) == 2 && (refusing < 0 || rank() == refusing)) {
          throw mncl::InvalidArgument("saved with another setting");
        }
        if (state.at(1) == 2 && rank() == 0 && rank0_corrupt) {
          throw mncl::SerializationError("does not decode");
        }
      });
      ADD_FAILURE() << "resume returned although iteration 2 did not fit";
    } catch (const mncl::InvalidArgument &e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("iteration 2"), std::string::npos) << what;
      EXPECT_NE(what.find("rank " + std::to_string(refusing < 0 ? 0 : refusing) +
                          ": saved with another setting"),
                std::string::npos)
          << mode << ": " << what;
    }
    EXPECT_EQ(loaded, std::vector<uint64_t>{2}) << "an older snapshot was loaded";
    EXPECT_EQ(ckpt.local_iterations(), (std::vector<uint64_t>{1, 2})) << "a snapshot was deleted";
    remove_checkpoint_dir(dir);
  }
}

namespace {
// Rewrites a snapshot's header as a job of `job_size` ranks would have written it (the size
// field and the header's checksum: magic 8 | version 4 | rank 4 | size 4 | group length 4 |
// ... | header crc at 44 over the 44 bytes before it, then the group).
void rewrite_job_size(const std::string &path, uint32_t job_size) {
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(bytes.size(), 48u) << path;
  std::memcpy(bytes.data() + 16, &job_size, sizeof job_size);
  uint32_t group_length;
  std::memcpy(&group_length, bytes.data() + 20, sizeof group_length);
  const uint32_t crc = mncl::crc32(bytes.data() + 48, group_length, mncl::crc32(bytes.data(), 44));
  std::memcpy(bytes.data() + 44, &crc, sizeof crc);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char *>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

// A rerun with another number of ranks in the same directory: its resume once skipped every
// snapshot ("written by a job of N ranks") and returned nullopt, and its first saves then
// pruned and overwrote the bigger job's files (same names). Now resume throws on every rank,
// saves never overwrite nor prune a snapshot of another job size, and nothing is lost.
TEST_F(Frontends, CheckpointerKeepsSnapshotsOfAnotherJobSize) {
  const std::string dir = checkpoint_dir();
  ASSERT_FALSE(dir.empty());
  mncl::Checkpointer ckpt(comm(), dir, "state", {3, false, false});
  const uint32_t other_size = static_cast<uint32_t>(size()) + 1;
  for (uint64_t it = 2; it <= 4; ++it) {
    ckpt.save(it, std::vector<int>{rank(), int(it)});
    rewrite_job_size(ckpt.path(it), other_size);
  }
  std::string why;
  EXPECT_FALSE(ckpt.read_snapshot(4, &why).has_value());
  EXPECT_NE(why.find("written by a job of " + std::to_string(other_size) + " ranks"),
            std::string::npos)
      << why;
  // The payload need not be intact: save() and prune() read the header alone, and resume()
  // judges alike (it once started afresh where saves then refused that iteration).
  {
    std::fstream f(ckpt.path(4), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('!');
  }
  std::vector<int> state{-1};
  try {
    ckpt.resume(state);
    ADD_FAILURE() << "resume returned although the directory holds another job size's snapshots";
  } catch (const mncl::CheckpointError &e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a job of " + std::to_string(other_size) + " ranks wrote"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("iteration 4"), std::string::npos) << what;
  }
  EXPECT_EQ(state, std::vector<int>{-1});
  // Not overwritten (same name)...
  EXPECT_THROW(ckpt.save(3, std::vector<int>{rank(), 3}), mncl::CheckpointError);
  // ... nor pruned as older than the 3 kept, nor as newer than what was just saved.
  ckpt.save(5, std::vector<int>{rank(), 5});
  ckpt.save(6, std::vector<int>{rank(), 6});
  ckpt.save(7, std::vector<int>{rank(), 7});
  ckpt.save(8, std::vector<int>{rank(), 8});
  ckpt.save(1, std::vector<int>{rank(), 1});  // 5-8 now an abandoned future: deleted
  for (uint64_t it = 2; it <= 4; ++it) {
    EXPECT_FALSE(ckpt.read_snapshot(it, &why).has_value());
    EXPECT_NE(why.find(it < 4 ? "written by a job of" : "payload checksum"), std::string::npos)
        << it << ": " << why;
  }
  EXPECT_EQ(ckpt.local_iterations(), std::vector<uint64_t>{1});
  // This job's own snapshot resumes; the others stay.
  const auto resumed = ckpt.resume(state);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(*resumed, 1u);
  EXPECT_EQ(state, (std::vector<int>{rank(), 1}));
  for (uint64_t it = 2; it <= 4; ++it) {
    EXPECT_TRUE(std::ifstream(ckpt.path(it)).good()) << ckpt.path(it) << " was deleted";
  }
  remove_checkpoint_dir(dir);
}

// Hybrid training checkpoints each stage's data-parallel group, whose ranks share rank numbers
// with the other stages' groups. The files were once <name>.<rank>.<iteration> for all of them:
// the stages wrote the same files, and a resume loaded another stage's state. Now each group
// has its own files, and a snapshot of another group is refused by its header whatever its
// name.
TEST_F(Frontends, CheckpointerOnSubCommunicatorsKeepsGroupsApart) {
  if (size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks (2 stages)";
  const std::string dir = checkpoint_dir();
  ASSERT_FALSE(dir.empty());
  auto groups = mncl::split_hybrid(comm(), 2);
  const int stage = groups.coords.stage, replica = groups.coords.replica;
  mncl::Checkpointer ckpt(groups.data_parallel, dir, "model", {3, false, false});
  // One stage after the other: shared files would then hold stage 1's states.
  for (int s = 0; s < 2; ++s) {
    if (stage == s) {
      for (uint64_t it = 1; it <= 3; ++it) ckpt.save(it, std::vector<int>{stage, replica, int(it)});
    }
    comm().barrier();
  }
  const auto paths = comm().allgather_obj(ckpt.path(3));
  EXPECT_EQ(std::set<std::string>(paths.begin(), paths.end()).size(), std::size_t(size()))
      << "processes share snapshot files";
  std::vector<int> state;
  auto resumed = ckpt.resume(state);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(*resumed, 3u);
  EXPECT_EQ(state, (std::vector<int>{stage, replica, 3})) << "another group's state";

  // Stage 1 replaces its iteration 4 by stage 0's of the same replica (world rank ^ 1): refused
  // on every rank of its group, which resume 3 again; stage 0 resumes its own 4.
  ckpt.save(4, std::vector<int>{stage, replica, 4});
  const auto fours = comm().allgather_obj(ckpt.path(4));
  if (stage == 1) {
    std::ifstream in(fours[rank() ^ 1], std::ios::binary);
    ASSERT_TRUE(in.good());
    std::ofstream(ckpt.path(4), std::ios::binary) << in.rdbuf();
  }
  comm().barrier();
  if (stage == 1) {
    std::string why;
    EXPECT_FALSE(ckpt.read_snapshot(4, &why).has_value());
    EXPECT_NE(why.find("written by group"), std::string::npos) << why;
  }
  state.clear();
  resumed = ckpt.resume(state);
  ASSERT_TRUE(resumed.has_value());
  const int expected = stage == 1 ? 3 : 4;
  EXPECT_EQ(*resumed, uint64_t(expected));
  EXPECT_EQ(state, (std::vector<int>{stage, replica, expected}));
  remove_checkpoint_dir(dir);
  groups.model_parallel.destroy();
  groups.data_parallel.destroy();
}

// ---------------------------------------------------------------------------------------------
// Model parallelism
// ---------------------------------------------------------------------------------------------

// The five links of a small MLP, built identically on every rank from fixed seeds.
std::vector<std::shared_ptr<mncl::Link>> mlp_links() {
  return {std::make_shared<mncl::Dense>(6, 16, 11), std::make_shared<mncl::ReLU>(),
          std::make_shared<mncl::Dense>(16, 12, 12), std::make_shared<mncl::ReLU>(),
          std::make_shared<mncl::Dense>(12, 4, 13)};
}

mncl::Tensor test_input() {
  mncl::Tensor x({5, 6});
  for (std::size_t k = 0; k < x.data.size(); ++k) x.data[k] = std::sin(0.7f * float(k)) + 0.1f;
  return x;
}
const std::vector<int32_t> kLabels{0, 3, 1, 2, 3};

struct Reference {
  mncl::Tensor logits, grad_x;
  float loss = 0;
  std::vector<std::vector<float>> param_grads;  // per link, its parameters' gradients
};

Reference run_reference() {
  auto links = mlp_links();
  mncl::Sequential mlp(links);
  Reference ref;
  ref.logits = mlp.forward(test_input());
  mncl::SoftmaxCrossEntropy loss;
  ref.loss = loss.forward(ref.logits, kLabels);
  ref.grad_x = mlp.backward(loss.backward());
  for (auto &link : links) {
    std::vector<float> all;
    for (auto *p : link->parameters()) all.insert(all.end(), p->grad.begin(), p->grad.end());
    ref.param_grads.push_back(all);
  }
  return ref;
}

void expect_near(const std::vector<float> &a, const std::vector<float> &b, const char *what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-5f) << what << " " << k;
}

// Stage s of `stages` runs links [first[s], first[s+1]) on rank s, in a pipeline.
TEST_F(Frontends, ModelParallelPipelineMatchesOneRank) {
  const Reference ref = run_reference();
  const int stages = std::min(size(), 3);
  const std::vector<std::vector<int>> stage_links[] = {
      {}, {{0, 1, 2, 3, 4}}, {{0, 1, 2, 3}, {4}}, {{0, 1}, {2, 3}, {4}}};
  if (rank() >= stages) return;  // idle ranks
  auto links = mlp_links();
  std::vector<int> mine = stage_links[stages][rank()];
  auto stage = std::make_shared<mncl::Sequential>();
  for (int k : mine) stage->add(links[k]);
  mncl::MultiNodeChainList chain(comm());
  chain.add_link(stage, rank() > 0 ? std::optional<int>(rank() - 1) : std::nullopt,
                 rank() + 1 < stages ? std::optional<int>(rank() + 1) : std::nullopt);

  const mncl::Tensor y = chain.forward(rank() == 0 ? test_input() : mncl::Tensor());
  mncl::Tensor grad_y;
  if (rank() == stages - 1) {
    expect_near(y.data, ref.logits.data, "logits");
    mncl::SoftmaxCrossEntropy loss;
    EXPECT_NEAR(loss.forward(y, kLabels), ref.loss, 1e-6f);
    grad_y = loss.backward();
  } else {
    EXPECT_TRUE(y.empty());
  }
  const mncl::Tensor grad_x = chain.backward(grad_y);
  if (rank() == 0) {
    expect_near(grad_x.data, ref.grad_x.data, "input gradient");
  }
  for (int k : mine) {
    std::vector<float> all;
    for (auto *p : links[k]->parameters()) all.insert(all.end(), p->grad.begin(), p->grad.end());
    expect_near(all, ref.param_grads[k], "parameter gradient");
  }
}

// ChainerMN's "there and back" placement: rank 0 holds the first and last links, rank 1 the
// middle, so rank 0 has two links with different peers.
TEST_F(Frontends, ModelParallelThereAndBackMatchesOneRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Reference ref = run_reference();
  if (rank() > 1) return;
  auto links = mlp_links();
  mncl::MultiNodeChainList chain(comm());
  if (rank() == 0) {
    chain.add_link(std::make_shared<mncl::Sequential>(
                       std::vector<std::shared_ptr<mncl::Link>>{links[0], links[1]}),
                   std::nullopt, 1);
    chain.add_link(links[4], 1, std::nullopt);
  } else {
    chain.add_link(std::make_shared<mncl::Sequential>(
                       std::vector<std::shared_ptr<mncl::Link>>{links[2], links[3]}),
                   0, 0);
  }
  const mncl::Tensor y = chain.forward(rank() == 0 ? test_input() : mncl::Tensor());
  mncl::Tensor grad_y;
  if (rank() == 0) {
    expect_near(y.data, ref.logits.data, "logits");
    mncl::SoftmaxCrossEntropy loss;
    loss.forward(y, kLabels);
    grad_y = loss.backward();
  }
  const mncl::Tensor grad_x = chain.backward(grad_y);
  if (rank() == 0) {
    expect_near(grad_x.data, ref.grad_x.data, "input gradient");
  }
  for (int k : rank() == 0 ? std::vector<int>{0, 4} : std::vector<int>{2}) {
    std::vector<float> all;
    for (auto *p : links[k]->parameters()) all.insert(all.end(), p->grad.begin(), p->grad.end());
    expect_near(all, ref.param_grads[k], "parameter gradient");
  }
  EXPECT_THROW(chain.add_link(links[1], rank(), std::nullopt), mncl::InvalidArgument);
}

// ChainerMN's intra_rank / intra_size / inter_rank / inter_size (the usual GPU choice), without
// a collective call: the host split's rank and size, and the host's number.
TEST_F(Frontends, IntraRankMatchesTheHostSplit) {
  mncl::Communicator host = comm().split_host();
  EXPECT_EQ(comm().intra_rank(), host.rank());
  EXPECT_EQ(comm().intra_size(), host.size());
  EXPECT_EQ(comm().local_rank(), host.rank());
  mncl::Communicator cross = comm().split_cross_host();
  if (comm().intra_rank() == 0) {  // group 0: every host's first rank, in host order
    EXPECT_EQ(comm().inter_rank(), cross.rank());
    EXPECT_EQ(comm().inter_size(), cross.size());
    EXPECT_EQ(comm().num_hosts(), cross.size());
  }
  EXPECT_EQ(host.inter_size(), 1);
  EXPECT_EQ(host.inter_rank(), 0);
}

// A rank has one output: a second link without rank_out is refused (forward returned only the
// last one's output, and backward fed the loss gradient to both: wrong gradients, silently).
TEST_F(Frontends, ModelParallelRefusesASecondOutput) {
  auto links = mlp_links();
  mncl::MultiNodeChainList chain(comm());
  chain.add_link(links[0]);
  try {
    chain.add_link(links[1]);
    ADD_FAILURE() << "a second link without rank_out was accepted";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("already has a link without rank_out"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(chain.size(), 1u);
  if (size() >= 2) chain.add_link(links[1], std::nullopt, (rank() + 1) % size());  // fine
}

// y = 2x, dL/dx = 2 dL/dy; throws, or returns a tensor that cannot travel, when told to.
class DoublingStage : public mncl::Link {
 public:
  bool throw_forward = false, throw_backward = false, short_output = false, wider = false,
       no_input_grad = false, negative_shape = false;
  mncl::Tensor forward(const mncl::Tensor &x) override {
    if (throw_forward) throw std::runtime_error("stage forward boom");
    mncl::Tensor y = x;
    for (float &v : y.data) v *= 2;
    if (short_output) y.data.pop_back();
    if (negative_shape) y.shape[0] = -y.shape[0];  // a shape no tensor has
    if (wider) y = mncl::Tensor({x.rows(), x.cols() + 1}, 2.0f);
    return y;
  }
  mncl::Tensor backward(const mncl::Tensor &grad_y) override {
    if (throw_backward) throw std::runtime_error("stage backward boom");
    if (no_input_grad) return mncl::Tensor();  // as Dense(..., compute_input_grad = false)
    mncl::Tensor g = grad_y;
    for (float &v : g.data) v *= 2;
    return g;
  }
  std::string name() const override { return "DoublingStage"; }
};

// One training pass of `chain`: x in on rank 0, a gradient of ones out on rank 0 (where the
// output is). "" when it went through, with output and input gradient both `gain` everywhere;
// else where and what failed: "forward own: <what>", "backward remote: <what>".
std::string chain_pass(mncl::MultiNodeChainList &chain, const mncl::Tensor &x, float gain) {
  const bool first = spmd::world().rank() == 0;
  std::string call = "forward";
  try {
    const mncl::Tensor y = chain.forward(first ? x : mncl::Tensor());
    call = "backward";
    const mncl::Tensor g = chain.backward(first ? mncl::Tensor(x.shape, 1.0f) : mncl::Tensor());
    if (first) {
      EXPECT_EQ(y.data, std::vector<float>(x.size(), gain));
      EXPECT_EQ(g.data, std::vector<float>(x.size(), gain));
    } else {
      EXPECT_TRUE(y.empty());
      EXPECT_TRUE(g.empty());
    }
    return "";
  } catch (const mncl::RemoteError &e) {
    return call + " remote: " + e.what();
  } catch (const std::exception &e) {
    return call + " own: " + e.what();
  }
}

bool starts_with(const std::string &text, const std::string &prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// A stage that fails fails the pass on every stage at once, in forward or in backward, in
// training and in evaluation mode; the stages stay paired, so the next pass is right. Before,
// the stages beside it waited for their tensor until the timeout.
TEST_F(Frontends, ModelParallelFailureOnOneStageFailsEveryStage) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int stages = std::min(size(), 3);
  if (rank() >= stages) return;  // idle ranks
  auto stage = std::make_shared<DoublingStage>();
  mncl::MultiNodeChainList chain(comm());
  chain.add_link(stage, rank() > 0 ? std::optional<int>(rank() - 1) : std::nullopt,
                 rank() + 1 < stages ? std::optional<int>(rank() + 1) : std::nullopt);
  chain.set_backward_follows(true);                                     // training passes
  EXPECT_THROW(chain.backward(mncl::Tensor()), mncl::InvalidArgument);  // no forward yet
  const bool last = rank() == stages - 1;
  const mncl::Tensor x({2, 3}, 1.0f);
  const float gain = float(1 << stages);
  // One healthy pass: y = 2^stages x, and the input gradient 2^stages times the output's.
  auto healthy_pass = [&](const char *when) {
    const mncl::Tensor y = chain.forward(rank() == 0 ? x : mncl::Tensor());
    if (last) {
      EXPECT_EQ(y.data, std::vector<float>(6, gain)) << when;
    } else {
      EXPECT_TRUE(y.empty()) << when;
    }
    const mncl::Tensor grad_x = chain.backward(last ? mncl::Tensor({2, 3}, 1.0f) : mncl::Tensor());
    if (rank() == 0) {
      EXPECT_EQ(grad_x.data, std::vector<float>(6, gain)) << when;
    }
  };
  healthy_pass("before");
  // One backward per forward: a second would wait for gradients nobody sends.
  EXPECT_THROW(chain.backward(mncl::Tensor()), mncl::InvalidArgument);
  // Where each rank's exception came from: "forward" or "backward", and what it says.
  struct Outcome {
    std::string call, what;
    bool remote = false;
  };
  auto train_pass = [&]() {
    Outcome out;
    try {
      out.call = "forward";
      chain.forward(rank() == 0 ? x : mncl::Tensor());
      out.call = "backward";
      chain.backward(last ? mncl::Tensor({2, 3}, 1.0f) : mncl::Tensor());
      out.call = "none";
    } catch (const mncl::RemoteError &e) {
      out.remote = true;
      out.what = e.what();
    } catch (const std::exception &e) {
      out.what = e.what();
    }
    return out;
  };
  for (int culprit = 0; culprit < stages; ++culprit) {
    const std::string label = "culprit " + std::to_string(culprit);
    // Forward, training: the stages after it fail in their forward, those before it in their
    // backward (their forward was done), the culprit with the link's own exception.
    stage->throw_forward = rank() == culprit;
    Outcome out = train_pass();
    stage->throw_forward = false;
    if (rank() == culprit) {
      EXPECT_EQ(out.call, "forward") << label;
      EXPECT_FALSE(out.remote) << label;
      EXPECT_EQ(out.what, "stage forward boom") << label;
      // Nothing to go back through; the peers were told already.
      EXPECT_THROW(chain.backward(mncl::Tensor()), mncl::InvalidArgument) << label;
    } else {
      EXPECT_EQ(out.call, rank() < culprit ? "backward" : "forward") << label;
      EXPECT_TRUE(out.remote) << label << ": " << out.what;
      EXPECT_NE(out.what.find("failed on rank " + std::to_string(culprit)), std::string::npos)
          << label << ": " << out.what;
      EXPECT_NE(out.what.find("DoublingStage) forward: stage forward boom"), std::string::npos)
          << label << ": " << out.what;
    }
    healthy_pass("after a failed forward");

    // Backward: the stages before it (which receive its gradients) fail, those after it are done.
    stage->throw_backward = rank() == culprit;
    out = train_pass();
    stage->throw_backward = false;
    if (rank() > culprit) {
      EXPECT_EQ(out.call, "none") << label << ": " << out.what;
    } else {
      EXPECT_EQ(out.call, "backward") << label;
      EXPECT_EQ(out.remote, rank() != culprit) << label << ": " << out.what;
      EXPECT_NE(out.what.find("stage backward boom"), std::string::npos) << label << out.what;
    }
    healthy_pass("after a failed backward");

    // A tensor that cannot travel (data shorter than its shape, a negative dimension): refused
    // before it leaves.
    for (bool *flaw : {&stage->short_output, &stage->negative_shape}) {
      if (culprit == stages - 1) break;
      *flaw = rank() == culprit;
      out = train_pass();
      *flaw = false;
      EXPECT_EQ(out.call, rank() < culprit ? "backward" : "forward") << label;
      EXPECT_NE(out.what.find("cannot travel"), std::string::npos) << label << ": " << out.what;
      EXPECT_EQ(out.remote, rank() != culprit) << label << ": " << out.what;
      healthy_pass("after a tensor that could not travel");
    }

    // Forward-only passes (no backward follows): the stages after the culprit fail, those
    // before it return.
    auto forward_only_pass = [&] {
      stage->throw_forward = rank() == culprit;
      try {
        chain.forward(rank() == 0 ? x : mncl::Tensor());
        EXPECT_LT(rank(), culprit) << label << ": the forward returned";
      } catch (const mncl::RemoteError &e) {
        EXPECT_GT(rank(), culprit) << label << ": " << e.what();
      } catch (const std::runtime_error &e) {
        EXPECT_EQ(rank(), culprit) << label << ": " << e.what();
      }
      stage->throw_forward = false;
      const mncl::Tensor y = chain.forward(rank() == 0 ? x : mncl::Tensor());
      if (last) {
        EXPECT_EQ(y.data, std::vector<float>(6, gain)) << label;
      }
    };
    chain.set_backward_follows(false);
    forward_only_pass();
    chain.set_backward_follows(true);
    healthy_pass("after forward-only passes");
    // Said to be followed by a backward, yet forward only: the failed forward's markers for the
    // ranks upstream are never received in that pass, and are dropped by their next backward.
    // Only where a small send completes unreceived (not gloo, whose sends wait for their
    // receive: there the failing rank would wait until the timeout).
    if (comm().backend() != "gloo") {
      forward_only_pass();
      healthy_pass("after forward-only passes said to be followed by backward");
    }
  }
}

// Tensors of every size about the 1 KiB that travels in the header's message (256 floats) go
// through a pipeline of doubling stages and back exactly, value by value, one after another on
// the same chain: inline, then following the header, then inline again.
TEST_F(Frontends, ModelParallelTensorsAboutTheInlineSizeArriveExactly) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int stages = std::min(size(), 3);
  if (rank() >= stages) return;
  mncl::MultiNodeChainList chain(comm());
  chain.add_link(std::make_shared<DoublingStage>(),
                 rank() > 0 ? std::optional<int>(rank() - 1) : std::nullopt,
                 rank() + 1 < stages ? std::optional<int>(rank() + 1) : std::nullopt);
  const float gain = float(1 << stages);
  for (int64_t count : {1, 255, 256, 257, 3000, 256, 2, 1 << 12}) {
    SCOPED_TRACE(std::to_string(count) + " floats");
    mncl::Tensor x({1, count}), g({count, 1});
    for (int64_t k = 0; k < count; ++k) {
      x.data[std::size_t(k)] = 0.5f + float(k);
      g.data[std::size_t(k)] = -float(k) - 0.25f;
    }
    const mncl::Tensor y = chain.forward(rank() == 0 ? x : mncl::Tensor());
    if (rank() == stages - 1) {
      ASSERT_EQ(y.shape, x.shape);
      for (int64_t k = 0; k < count; ++k) ASSERT_EQ(y.data[std::size_t(k)], gain * x.data[k]) << k;
    }
    const mncl::Tensor gx = chain.backward(rank() == stages - 1 ? g : mncl::Tensor());
    if (rank() == 0) {
      ASSERT_EQ(gx.shape, g.shape);
      for (int64_t k = 0; k < count; ++k) ASSERT_EQ(gx.data[std::size_t(k)], gain * g.data[k]) << k;
    }
  }
}

// A skip connection of 4 MiB tensors (past what shm, gloo and MPI hand over without a
// receive): rank 0's A feeds rank 1's B and rank 2's C, which also takes B's output. y = 2 (2x +
// 2 (2x)) = 12x and the input gradient 12 g. Rank 0's sends go as one batch, so either order
// of its list completes, and rank 2's receives either order of its own (in sequence, rank 0
// sending to 2 before 1 while rank 2 received from 1 first waited until the timeout; so did
// the backward, until it took the lists in reverse). A branch without an input gradient
// counts as zero.
TEST_F(Frontends, ModelParallelSkipConnectionOfLargeTensors) {
  if (size() < 3) GTEST_SKIP() << "needs three ranks";
  if (rank() > 2) return;
  const int last = 2;
  const int64_t n = 1 << 20;
  for (bool reversed_lists : {false, true}) {
    auto stage = std::make_shared<DoublingStage>();
    mncl::MultiNodeChainList chain(comm());
    if (rank() == 0) {
      chain.add_link(stage, {}, reversed_lists ? mncl::ChainRanks{2, 1} : mncl::ChainRanks{1, 2});
    } else if (rank() == 1) {
      chain.add_link(stage, 0, 2);
    } else {
      chain.add_link(stage, reversed_lists ? mncl::ChainRanks{1, 0} : mncl::ChainRanks{0, 1}, {});
    }
    chain.set_backward_follows(true);
    for (bool b_has_input_grad : {true, false}) {
      SCOPED_TRACE(std::string(reversed_lists ? "reversed lists" : "lists in model order") +
                   (b_has_input_grad ? "" : ", B without an input gradient"));
      stage->no_input_grad = rank() == 1 && !b_has_input_grad;
      const mncl::Tensor y =
          chain.forward(rank() == 0 ? mncl::Tensor({1, n}, 1.0f) : mncl::Tensor());
      if (rank() == last) {
        ASSERT_EQ(y.size(), std::size_t(n));
        EXPECT_EQ(y.data.front(), 12.0f);
        EXPECT_EQ(y.data.back(), 12.0f);
      }
      const mncl::Tensor g =
          chain.backward(rank() == last ? mncl::Tensor({1, n}, 1.0f) : mncl::Tensor());
      if (rank() == 0) {
        const float expected = b_has_input_grad ? 12.0f : 4.0f;  // C's 2 g, through A: 4 g
        ASSERT_EQ(g.size(), std::size_t(n));
        EXPECT_EQ(g.data.front(), expected);
        EXPECT_EQ(g.data.back(), expected);
      }
    }
  }
}

// Two chains of 4 MiB tensors that complete with single sends and receives, and once waited
// until the timeout when a list's headers and payloads went as separate batches: a join whose
// first rank sends to it before it feeds the second (rank 0: a -> 2, b -> 1; rank 1: c -> 2;
// rank 2: d <- {0, 1}: y = 2 (2x + 2 (2x)) = 12x), and a fan-out whose second rank first waits
// on the first (rank 0: a -> {1, 2}; rank 1: e -> 2, then f <- 2, an output; rank 2: g <- 1,
// an output, then h -> 1: both outputs 8x, the input gradient 16).
TEST_F(Frontends, ModelParallelJoinsAndFanOutsCompleteWhereSingleCallsDo) {
  if (size() < 3) GTEST_SKIP() << "needs three ranks";
  if (rank() > 2) return;
  const int64_t n = 1 << 20;
  auto link = [] { return std::make_shared<DoublingStage>(); };
  auto all = [](const mncl::Tensor &t, float value) {
    return t.size() == std::size_t(1 << 20) && t.data.front() == value && t.data.back() == value;
  };
  const mncl::Tensor x({1, n}, 1.0f), ones({1, n}, 1.0f);
  {
    mncl::MultiNodeChainList join(comm());
    if (rank() == 0) {
      join.add_link(link(), {}, 2);
      join.add_link(link(), {}, 1);
    } else if (rank() == 1) {
      join.add_link(link(), 0, 2);
    } else {
      join.add_link(link(), {0, 1}, {});
    }
    const mncl::Tensor y = join.forward(rank() == 0 ? x : mncl::Tensor());
    EXPECT_TRUE(rank() == 2 ? all(y, 12.0f) : y.empty()) << "join output";
    const mncl::Tensor g = join.backward(rank() == 2 ? ones : mncl::Tensor());
    EXPECT_TRUE(rank() == 0 ? all(g, 12.0f) : g.empty()) << "join input gradient";
  }
  {
    mncl::MultiNodeChainList fan_out(comm());
    if (rank() == 0) {
      fan_out.add_link(link(), {}, {1, 2});
    } else if (rank() == 1) {
      fan_out.add_link(link(), 0, 2);
      fan_out.add_link(link(), 2, {});
    } else {
      fan_out.add_link(link(), 1, {});
      fan_out.add_link(link(), 0, 1);
    }
    const mncl::Tensor y = fan_out.forward(rank() == 0 ? x : mncl::Tensor());
    EXPECT_TRUE(rank() == 0 ? y.empty() : all(y, 8.0f)) << "fan-out outputs";
    const mncl::Tensor g = fan_out.backward(rank() == 0 ? mncl::Tensor() : ones);
    EXPECT_TRUE(rank() == 0 ? all(g, 16.0f) : g.empty()) << "fan-out input gradient";
  }
}

// "There and back" (rank 0: A to rank 1, then C from rank 1; rank 1: B): C fails after A's
// tensor went out for real, in forward and in backward; or B fails.
TEST_F(Frontends, ModelParallelThereAndBackFailsBothRanks) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  if (rank() > 1) return;
  auto a = std::make_shared<DoublingStage>(), b = std::make_shared<DoublingStage>(),
       c = std::make_shared<DoublingStage>();
  mncl::MultiNodeChainList chain(comm());
  if (rank() == 0) {
    chain.add_link(a, std::nullopt, 1);
    chain.add_link(c, 1, std::nullopt);
  } else {
    chain.add_link(b, 0, 0);
  }
  chain.set_backward_follows(true);
  const mncl::Tensor x({1, 2}, 1.0f);
  EXPECT_EQ(chain_pass(chain, x, 8.0f), "");
  c->throw_forward = rank() == 0;
  std::string out = chain_pass(chain, x, 8.0f);
  c->throw_forward = false;
  EXPECT_TRUE(starts_with(out, rank() == 0 ? "forward own: stage forward boom"
                                           : "backward remote: MultiNodeChainList::backward: the "
                                             "pass failed on rank 0: link 1 (DoublingStage)"))
      << out;
  EXPECT_EQ(chain_pass(chain, x, 8.0f), "");
  c->throw_backward = rank() == 0;
  out = chain_pass(chain, x, 8.0f);
  c->throw_backward = false;
  EXPECT_TRUE(
      starts_with(out, rank() == 0 ? "backward own: stage backward boom" : "backward remote: "))
      << out;
  EXPECT_EQ(chain_pass(chain, x, 8.0f), "");
  b->throw_forward = rank() == 1;
  out = chain_pass(chain, x, 8.0f);
  b->throw_forward = false;
  EXPECT_TRUE(starts_with(out, rank() == 1 ? "forward own: stage forward boom"
                                           : "forward remote: MultiNodeChainList::forward: the "
                                             "pass failed on rank 1: link 0 (DoublingStage)"))
      << out;
  EXPECT_EQ(chain_pass(chain, x, 8.0f), "");
}

// Branches (ChainerMN's lists of ranks): rank 0's trunk A feeds B on ranks 1 and 2, whose
// outputs rank 0's head C sums. Every link doubles: y = 2 (2 (2x) + 2 (2x)) = 16x, and the
// input gradient is 16 times the output's. Failures in a branch and in the join fail the ranks
// that wait on them.
TEST_F(Frontends, ModelParallelBranchesSumAndFailTogether) {
  if (size() < 3) GTEST_SKIP() << "needs three ranks";
  if (rank() > 2) return;
  auto a = std::make_shared<DoublingStage>(), b = std::make_shared<DoublingStage>(),
       c = std::make_shared<DoublingStage>();
  mncl::MultiNodeChainList chain(comm());
  if (rank() == 0) {
    EXPECT_THROW(chain.add_link(a, {}, {1, 1}), mncl::InvalidArgument);  // named twice
    EXPECT_THROW(chain.add_link(a, {}, {1, 0}), mncl::InvalidArgument);  // this rank
    chain.add_link(a, {}, {1, 2});
    chain.add_link(c, {1, 2}, {});
  } else {
    chain.add_link(b, 0, 0);
  }
  chain.set_backward_follows(true);
  const mncl::Tensor x({2, 2}, 1.0f);
  EXPECT_EQ(chain_pass(chain, x, 16.0f), "");
  // Branch 2 fails in its forward: the join on rank 0 fails (branch 1's tensor came), and
  // branch 1, which finished its forward, fails in its backward.
  b->throw_forward = rank() == 2;
  std::string out = chain_pass(chain, x, 16.0f);
  b->throw_forward = false;
  const char *expected[] = {
      "forward remote: MultiNodeChainList::forward: the pass failed on rank 2",
      "backward remote: MultiNodeChainList::backward: the pass failed on "
      "rank 2",
      "forward own: stage forward boom"};
  EXPECT_TRUE(starts_with(out, expected[rank()])) << out;
  EXPECT_EQ(chain_pass(chain, x, 16.0f), "");
  // Branch 1's output has another shape than branch 2's: the join refuses the sum.
  b->wider = rank() == 1;
  out = chain_pass(chain, x, 16.0f);
  b->wider = false;
  if (rank() == 0) {
    EXPECT_TRUE(starts_with(out,
                            "forward own: MultiNodeChainList::forward: link 1 sums the "
                            "activations of ranks 1 and 2, of shapes {2, 3} and {2, 2}"))
        << out;
  } else {
    EXPECT_TRUE(starts_with(out,
                            "backward remote: MultiNodeChainList::backward: the pass failed "
                            "on rank 0"))
        << out;
  }
  EXPECT_EQ(chain_pass(chain, x, 16.0f), "");
  // The head fails in its backward: both branches, then the trunk's rank, fail in backward.
  c->throw_backward = rank() == 0;
  out = chain_pass(chain, x, 16.0f);
  c->throw_backward = false;
  EXPECT_TRUE(starts_with(out, rank() == 0 ? "backward own: stage backward boom"
                                           : "backward remote: MultiNodeChainList::backward: the "
                                             "pass failed on rank 0: link 1 (DoublingStage) "
                                             "backward: stage backward boom"))
      << out;
  EXPECT_EQ(chain_pass(chain, x, 16.0f), "");
}

// The communicator failing while a rank tells its peers of a failed pass: the error says both.
// Rank 1 does not say that a backward follows (against the rule), so rank 0's failed forward
// waits for a gradient marker that never comes, until the pair's 300 ms timeout.
TEST_F(Frontends, ModelParallelCommunicatorFailureKeepsTheStagesError) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  mncl::SplitOptions options;
  options.timeout_ms = 300;
  mncl::Communicator pair = comm().split(rank() < 2 ? 0 : MNCL_SPLIT_NONE, rank(), options);
  auto stage = std::make_shared<DoublingStage>();
  if (rank() == 0) {
    mncl::MultiNodeChainList chain(pair);
    chain.add_link(stage, {}, 1);
    chain.set_backward_follows(true);
    stage->throw_forward = true;
    try {
      chain.forward(mncl::Tensor({1, 1}, 1.0f));
      ADD_FAILURE() << "the failed forward returned";
    } catch (const mncl::TimeoutError &e) {
      EXPECT_NE(std::string(e.what()).find("(the pass had failed already: link 0 (DoublingStage) "
                                           "forward: stage forward boom)"),
                std::string::npos)
          << e.what();
    }
  } else if (rank() == 1) {
    mncl::MultiNodeChainList chain(pair);
    chain.add_link(stage, 0, {});
    EXPECT_THROW(chain.forward(mncl::Tensor()), mncl::RemoteError);
  }
  comm().barrier();  // rank 1 waits for rank 0's timeout before it aborts the pair
  pair.abort();      // rank 0's receive timed out: nothing more on this pair
}

// A rank whose chain has seen other passes than its peer's (rebuilt, or a forward skipped)
// fails at its receive instead of taking one batch's tensor for another's.
TEST_F(Frontends, ModelParallelPassesOutOfStepFail) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  if (rank() > 1) return;
  auto stage = std::make_shared<DoublingStage>();
  mncl::MultiNodeChainList chain(comm());
  if (rank() == 0) {
    chain.add_link(stage, std::nullopt, 1);
  } else {
    chain.add_link(stage, 0, std::nullopt);
  }
  const mncl::Tensor x({1, 4}, 1.0f);
  chain.forward(x);
  if (rank() == 0) {
    chain.forward(x);  // pass 2
    return;
  }
  mncl::MultiNodeChainList rebuilt(comm());  // rank 1 starts again at pass 1
  rebuilt.add_link(stage, 0, std::nullopt);
  try {
    rebuilt.forward(mncl::Tensor());
    ADD_FAILURE() << "a tensor of pass 2 was taken for pass 1";
  } catch (const mncl::RemoteError &e) {
    EXPECT_NE(std::string(e.what()).find("of its pass 2 to this rank's pass 1"), std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Frontends, part 2: communication frequency, the prefetching loader on a shard, hybrid groups
// ---------------------------------------------------------------------------------------------

// allreduce_every = k over k micro-batches steps exactly like k = 1 over their mean gradient
// (one k-times larger batch), with 1/k of the exchanges (equal up to float rounding: one path
// divides the sums by k * size, the other averages means).
TEST_F(Frontends, AllreduceEveryMatchesOneLargerBatch) {
  const int k = 3;
  for (bool double_buffering : {false, true}) {
    Model micro({7, 300}, 1.0f), large({7, 300}, 1.0f);
    mncl::MultiNodeOptimizerOptions every_k;
    every_k.allreduce_every = k;
    every_k.double_buffering = double_buffering;
    every_k.fusion_buffer_bytes = 512;
    mncl::MultiNodeOptimizerOptions every_1 = every_k;
    every_1.allreduce_every = 1;
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt_k(RecordingOptimizer{}, comm(), every_k);
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt_1(RecordingOptimizer{}, comm(), every_1);
    // The first k micro-batches make the first step: the first update's broadcast consumes
    // none of them (it once did, so the rounds ran one micro-batch late).
    for (int step = 0; step < 4; ++step) {
      for (auto &g : large.grads) std::fill(g.begin(), g.end(), 0.0f);
      for (int m = 0; m < k; ++m) {
        for (std::size_t i = 0; i < micro.grads.size(); ++i) {
          for (std::size_t j = 0; j < micro.grads[i].size(); ++j) {
            micro.grads[i][j] = float(3 * (rank() + 1) * (m + 1) + int(j % 5) + step);
            large.grads[i][j] += micro.grads[i][j] / k;  // the mean over the larger batch
          }
        }
        const bool stepped = opt_k.update(micro.params(), micro.grad_spans());
        EXPECT_EQ(stepped, m == k - 1 && (!double_buffering || step > 0)) << step << " " << m;
        EXPECT_EQ(opt_k.pending_micro_batches(), (m + 1) % k);
      }
      EXPECT_EQ(opt_1.update(large.params(), large.grad_spans()), !double_buffering || step > 0);
      EXPECT_EQ(opt_k.updates(), uint64_t(k) * (step + 1));
      for (std::size_t i = 0; i < micro.values.size(); ++i) {
        for (std::size_t j = 0; j < micro.values[i].size(); ++j) {
          const float expected = large.values[i][j];
          ASSERT_NEAR(micro.values[i][j], expected, 1e-4 * (1 + std::abs(expected)))
              << "step " << step << (double_buffering ? ", double buffering" : "");
        }
      }
    }
    EXPECT_EQ(opt_k.actual_optimizer().seen.size(), opt_1.actual_optimizer().seen.size());
    EXPECT_EQ(opt_k.stats().exchanges, 4u);
    EXPECT_EQ(opt_k.stats().bytes, 4u * 307 * sizeof(float));
  }
  mncl::MultiNodeOptimizerOptions bad;
  bad.allreduce_every = 0;
  EXPECT_THROW(mncl::MultiNodeOptimizer<RecordingOptimizer>(RecordingOptimizer{}, comm(), bad),
               mncl::InvalidArgument);
}

// A wrapped optimizer whose step throws on one rank (caught there, training goes on): every rank
// took part in that round's exchange, and the next round averages its own micro-batches only.
// Before, the step came before the accumulator was cleared, so that rank sent the failed
// round's gradients again with the next round's.
TEST_F(Frontends, AStepThatThrowsSpendsItsRound) {
  struct ThrowsOnce {
    bool armed = false;
    void update(const mncl::ParamSpans &, const mncl::GradSpans &) {
      if (armed) {
        armed = false;
        throw std::runtime_error("the wrapped optimizer failed");
      }
    }
  };
  const int k = 2;
  for (bool double_buffering : {false, true}) {
    mncl::MultiNodeOptimizerOptions options;
    options.allreduce_every = k;
    options.double_buffering = double_buffering;
    mncl::MultiNodeOptimizer<ThrowsOnce> opt(ThrowsOnce{}, comm(), options);
    Model model({5}, 0.0f);
    for (int round = 0; round < 4; ++round) {
      // The first step that applies averages throws on the last rank.
      if (round == (double_buffering ? 1 : 0) && rank() == size() - 1) {
        opt.actual_optimizer().armed = true;
      }
      for (int m = 0; m < k; ++m) {
        for (auto &g : model.grads) std::fill(g.begin(), g.end(), float(10 * (round + 1)));
        try {
          opt.update(model.params(), model.grad_spans());
        } catch (const std::runtime_error &e) {
          EXPECT_EQ(rank(), size() - 1) << e.what();
          EXPECT_EQ(m, k - 1);
        }
      }
      opt.synchronize();
      ASSERT_EQ(opt.averaged_grads().size(), 1u);
      for (float average : opt.averaged_grads()[0]) {
        ASSERT_EQ(average, float(10 * (round + 1)))
            << "round " << round << (double_buffering ? ", double buffering" : "");
      }
    }
  }
}

// The float32 averages are the correctly rounded means sum / (ranks x k): with integer gradients
// whose sums are exact, every average is exactly the mean. (They were once sums * (1 / (ranks x
// k)), 1 ulp off for many divisors: 21 * (1 / 7.0f) = 3.0000002.)
TEST_F(Frontends, AveragedGradientsAreTheExactMeans) {
  for (int k : {1, 3, 5, 7, 11, 13}) {
    mncl::MultiNodeOptimizerOptions options;
    options.allreduce_every = k;
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, comm(), options);
    Model model({40}, 0.0f);
    for (int m = 0; m < k; ++m) {  // the first k updates make the first step
      // Element j: the mean over ranks and micro-batches is j + 1 (rank r, micro-batch m add
      // j + 1 + (r - (size-1)/2) * 2 + (m - (k-1)/2) * 2, integers symmetric about j + 1).
      for (std::size_t j = 0; j < model.grads[0].size(); ++j) {
        model.grads[0][j] = float(int(j) + 1 + (2 * rank() - (size() - 1)) + (2 * m - (k - 1)));
      }
      opt.update(model.params(), model.grad_spans());
    }
    ASSERT_EQ(opt.actual_optimizer().seen.size(), 1u) << "k " << k;
    const auto &averaged = opt.actual_optimizer().seen[0][0];
    for (std::size_t j = 0; j < averaged.size(); ++j) {
      ASSERT_EQ(averaged[j], float(j + 1)) << "k " << k << ", element " << j;
    }
    // A load replaces the vectors behind averaged_grads(): its spans follow (they once pointed
    // at the freed ones; AddressSanitizer runs this test).
    const std::vector<uint8_t> snapshot = mncl::to_bytes(opt);
    mncl::from_bytes(mncl::Span<const uint8_t>(snapshot), opt);
    ASSERT_EQ(opt.averaged_grads().size(), 1u);
    for (std::size_t j = 0; j < averaged.size(); ++j) {
      ASSERT_EQ(opt.averaged_grads()[0][j], float(j + 1)) << "after a load, element " << j;
    }
  }
}

// The same with a real MLP and Adam: k micro-batches of b samples against batches of k * b.
TEST_F(Frontends, AllreduceEveryTrainsLikeTheLargerBatchMlp) {
  const int k = 4, micro_batch = 3, features = 6, classes = 3;
  auto build = [&] {
    auto mlp = std::make_shared<mncl::Sequential>();
    mlp->emplace<mncl::Dense>(features, 5, 11)
        .emplace<mncl::ReLU>()
        .emplace<mncl::Dense>(5, classes, 12);
    return mlp;
  };
  auto data = [&](int step, int first, int count) {  // rank- and step-dependent inputs
    mncl::Tensor x({count, features});
    std::vector<int32_t> labels(count);
    for (int b = 0; b < count; ++b) {
      for (int f = 0; f < features; ++f) {
        x.at(b, f) = std::sin(0.7f * (first + b) + 0.3f * f + step + 1.3f * rank());
      }
      labels[b] = (first + b + rank()) % classes;
    }
    return std::make_pair(x, labels);
  };
  auto micro = build(), large = build();
  const auto pm = micro->parameters(), pl = large->parameters();
  mncl::MultiNodeOptimizerOptions every_k;
  every_k.allreduce_every = k;
  mncl::MultiNodeOptimizer<mncl::Adam> opt_k(mncl::Adam({0.01f}), comm(), every_k);
  mncl::MultiNodeOptimizer<mncl::Adam> opt_1(mncl::Adam({0.01f}), comm());
  mncl::SoftmaxCrossEntropy loss;
  for (int step = 0; step < 5; ++step) {
    for (int m = 0; m < k; ++m) {
      const auto [x, labels] = data(step, m * micro_batch, micro_batch);
      loss.forward(micro->forward(x), labels);
      micro->backward(loss.backward());
      EXPECT_EQ(opt_k.update(mncl::value_spans(pm), mncl::grad_spans(pm)), m == k - 1);
    }
    const auto [x, labels] = data(step, 0, k * micro_batch);
    loss.forward(large->forward(x), labels);
    large->backward(loss.backward());
    opt_1.update(mncl::value_spans(pl), mncl::grad_spans(pl));
  }
  for (std::size_t i = 0; i < pm.size(); ++i) {
    for (std::size_t j = 0; j < pm[i]->value.size(); ++j) {
      ASSERT_NEAR(pm[i]->value[j], pl[i]->value[j], 1e-5f) << pm[i]->name << " " << j;
    }
  }
  EXPECT_EQ(opt_k.actual_optimizer().steps(), 5u);  // no micro-batch left over
  EXPECT_EQ(opt_k.pending_micro_batches(), 0);
}

// Each rank's loader walks its own (disjoint) shard: per epoch, every sample of the shard once,
// so over the ranks every sample of the dataset exactly once; the order repeats with the seed.
TEST_F(Frontends, PrefetchLoaderCoversTheShardOncePerEpoch) {
  std::vector<int> dataset;
  if (rank() == 0) {
    dataset.resize(997);
    std::iota(dataset.begin(), dataset.end(), 0);
  }
  mncl::ScatterOptions scatter;
  scatter.shuffle = true;
  scatter.seed = 5;
  scatter.force_equal_length = false;
  const auto shard = mncl::scatter_dataset(dataset, comm(), scatter);
  mncl::PrefetchOptions options;
  options.batch_size = 10;
  options.threads = 2;
  options.depth = 3;
  options.seed = 100 + rank();
  options.drop_last = false;
  using Loader = mncl::PrefetchLoader<int, std::vector<int>>;
  auto copy = [](const int *const *s, std::size_t n, std::vector<int> &out) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(*s[i]);
  };
  Loader loader(shard, options, copy);
  std::vector<int> first_epoch;
  for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
    loader.start_epoch(epoch);
    std::vector<int> mine;
    while (auto batch = loader.next()) mine.insert(mine.end(), batch->begin(), batch->end());
    if (epoch == 1) first_epoch = mine;
    std::vector<int> sorted_mine = mine, sorted_shard = shard;
    std::sort(sorted_mine.begin(), sorted_mine.end());
    std::sort(sorted_shard.begin(), sorted_shard.end());
    ASSERT_EQ(sorted_mine, sorted_shard) << "epoch " << epoch;
    auto all = comm().allgather_obj(mine);
    std::vector<int> together;
    for (const auto &part : all) together.insert(together.end(), part.begin(), part.end());
    std::sort(together.begin(), together.end());
    std::vector<int> expected(997);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(together, expected) << "epoch " << epoch;
  }
  Loader again(shard, options, copy);
  again.start_epoch(1);
  std::vector<int> replay;
  while (auto batch = again.next()) replay.insert(replay.end(), batch->begin(), batch->end());
  EXPECT_EQ(replay, first_epoch);
}

// Hybrid groups for every model-parallel size that divides the world: membership, and an
// optimizer on the data-parallel group averages only the same stage of every replica.
TEST_F(Frontends, HybridSplitGroupsAndAveragesWithinDataParallelGroups) {
  for (int stages = 1; stages <= size(); ++stages) {
    if (size() % stages != 0) continue;
    auto groups = mncl::split_hybrid(comm(), stages);
    const auto &c = groups.coords;
    ASSERT_EQ(c.stages, stages);
    ASSERT_EQ(c.replicas, size() / stages);
    EXPECT_EQ(rank(), c.replica * stages + c.stage);
    EXPECT_EQ(groups.data_parallel.size(), c.replicas);
    EXPECT_EQ(groups.data_parallel.rank(), c.replica);
    EXPECT_EQ(groups.model_parallel.size(), stages);
    EXPECT_EQ(groups.model_parallel.rank(), c.stage);
    // Who is in my groups, as the groups themselves see it.
    EXPECT_EQ(groups.data_parallel.allgather(std::vector<int>{rank()}),
              mncl::data_parallel_members(c));
    EXPECT_EQ(groups.model_parallel.allgather(std::vector<int>{rank()}),
              mncl::model_parallel_members(c));

    // Gradient = world rank: averages over {stage, stage + M, ...} only.
    Model model({3, 4}, float(rank()));
    mncl::MultiNodeOptimizer<RecordingOptimizer> opt(RecordingOptimizer{}, groups.data_parallel);
    opt.broadcast_parameters(model.params());
    // The broadcast came from replica 0 of my stage (world rank == stage).
    EXPECT_EQ(model.values[0][0], float(c.stage));
    for (auto &g : model.grads) std::fill(g.begin(), g.end(), float(rank()));
    opt.update(model.params(), model.grad_spans());
    double expected = 0;
    for (int r : mncl::data_parallel_members(c)) expected += r;
    expected /= c.replicas;
    ASSERT_EQ(opt.actual_optimizer().seen.size(), 1u);  // no second broadcast: a step
    for (const auto &g : opt.actual_optimizer().seen.at(0)) {
      for (float x : g) ASSERT_DOUBLE_EQ(x, expected) << stages << " stages";
    }
    // Activations flow along the pipeline of my replica only.
    if (stages > 1) {
      auto &mp = groups.model_parallel;
      const int next = (mp.rank() + 1) % stages, prev = (mp.rank() + stages - 1) % stages;
      std::vector<int> got(1);
      if (mp.rank() % 2 == 0) {  // operations run in order: pair sends with receives
        mp.send(std::vector<int>{rank()}, next);
        mp.recv(got, prev);
      } else {
        mp.recv(got, prev);
        mp.send(std::vector<int>{rank()}, next);
      }
      EXPECT_EQ(got[0], c.replica * stages + (c.stage + stages - 1) % stages);
    }
    groups.model_parallel.destroy();
    groups.data_parallel.destroy();
  }
}

// ---------------------------------------------------------------------------------------------
// Batch normalization across ranks
// ---------------------------------------------------------------------------------------------

// Rank r's share of a global batch: uneven, and none at all on rank 2 (from 3 ranks on).
int bn_rows(int r) {
  return std::vector<int>{2, 3, 0, 1}[r % 4];
}
int bn_first_row(int r) {
  int first = 0;
  for (int q = 0; q < r; ++q) first += bn_rows(q);
  return first;
}

// Rows [first, first + rows) of the global batch {rows, 3, 2} of step `step`: channel means
// far from 0 (10 to 12), so the statistics are not those of a centered input.
mncl::Tensor bn_rows_of(int first, int rows, int step, bool gradient) {
  mncl::Tensor t({rows, 3, 2});
  for (int b = 0; b < rows; ++b) {
    for (int c = 0; c < 3; ++c) {
      for (int s = 0; s < 2; ++s) {
        const int g = first + b + 7 * step;
        t.data[std::size_t((b * 3 + c) * 2 + s)] =
            gradient ? std::cos(0.23f * g - 0.7f * c + 0.9f * s)
                     : 10.0f + c + 3.0f * std::sin(0.37f * g + 1.1f * c + 0.5f * s);
      }
    }
  }
  return t;
}

void expect_close(const std::vector<float> &got, const std::vector<float> &want, const char *what,
                  std::size_t offset = 0) {
  for (std::size_t k = 0; k < got.size(); ++k) {
    const float expected = want[offset + k];
    EXPECT_NEAR(got[k], expected, 2e-5f * std::max(1.0f, std::fabs(expected))) << what << " " << k;
  }
}

// Every rank normalizes its rows by the global batch's statistics: outputs, input gradients and
// running statistics as one process holding the whole batch computes them (a BatchNormalization,
// checked against finite differences in frontends_unit_test), gamma's and beta's gradients
// those divided by the number of ranks; over two steps and two finetuning ones, in {batch, C, d}
// layout.
TEST_F(Frontends, MultiNodeBatchNormalizationMatchesTheGlobalBatch) {
  const int total = bn_first_row(size()), first = bn_first_row(rank()), rows = bn_rows(rank());
  const std::size_t per_row = 3 * 2, offset = std::size_t(first) * per_row;
  mncl::BatchNormalization whole(3);
  mncl::MultiNodeBatchNormalization mine(3, comm());
  for (auto *bn : {static_cast<mncl::BatchNormalization *>(&whole),
                   static_cast<mncl::BatchNormalization *>(&mine)}) {
    bn->gamma().value = {0.5f, 1.5f, -2.0f};
    bn->beta().value = {0.25f, 0.0f, 1.0f};
  }
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {  // the last two steps finetune: the running statistics average them
      whole.start_finetuning();
      mine.start_finetuning();
    }
    const mncl::Tensor y_all = whole.forward(bn_rows_of(0, total, step, false));
    const mncl::Tensor gx_all = whole.backward(bn_rows_of(0, total, step, true));
    const mncl::Tensor y = mine.forward(bn_rows_of(first, rows, step, false));
    ASSERT_EQ(y.shape, (std::vector<int64_t>{rows, 3, 2}));
    expect_close(y.data, y_all.data, "output", offset);
    const mncl::Tensor gx = mine.backward(bn_rows_of(first, rows, step, true));
    expect_close(gx.data, gx_all.data, "input gradient", offset);
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(mine.batch_mean()[c], whole.batch_mean()[c], 1e-9) << c;
      EXPECT_NEAR(mine.batch_var()[c], whole.batch_var()[c], 1e-9) << c;
    }
    expect_close(mine.running_mean(), whole.running_mean(), "running mean");
    expect_close(mine.running_var(), whole.running_var(), "running variance");
    std::vector<float> gamma_mean = whole.gamma().grad, beta_mean = whole.beta().grad;
    for (float &g : gamma_mean) g /= float(size());
    for (float &g : beta_mean) g /= float(size());
    expect_close(mine.gamma().grad, gamma_mean, "gamma gradient");
    expect_close(mine.beta().grad, beta_mean, "beta gradient");
  }
  // Evaluation mode: the running statistics, no communication (rank 0 alone may call it).
  if (rank() == 0) {
    mine.set_training(false);
    whole.set_training(false);
    expect_close(mine.forward(bn_rows_of(0, 2, 5, false)).data,
                 whole.forward(bn_rows_of(0, 2, 5, false)).data, "evaluation output");
  }
}

// An MLP with batch normalization trained data-parallel (equal shards, each rank's loss the mean
// over its rows, MultiNodeOptimizer averaging) steps exactly like one process training on the
// global batch with plain BatchNormalization and SGD.
TEST_F(Frontends, MultiNodeBatchNormalizationTrainsLikeOneProcess) {
  const int per_rank = 2, features = 4, classes = 3;
  auto build = [&](bool multi_node) {
    auto mlp = std::make_shared<mncl::Sequential>();
    mlp->emplace<mncl::Dense>(features, 6, 21);
    if (multi_node) {
      mlp->emplace<mncl::MultiNodeBatchNormalization>(6, comm());
    } else {
      mlp->emplace<mncl::BatchNormalization>(6);
    }
    mlp->emplace<mncl::ReLU>().emplace<mncl::Dense>(6, classes, 22);
    return mlp;
  };
  auto batch = [&](int step, int first, int rows) {
    mncl::Tensor x({rows, features});
    std::vector<int32_t> labels(rows);
    for (int b = 0; b < rows; ++b) {
      for (int f = 0; f < features; ++f)
        x.at(b, f) = std::sin(0.9f * (first + b) + 0.4f * f + step);
      labels[b] = (first + b + step) % classes;
    }
    return std::make_pair(x, labels);
  };
  auto distributed = build(true), single = build(false);
  // ChainerMN's create_mnbn_model: a model with plain BatchNormalization, trained a step on
  // each rank alone (the same rows everywhere), then converted, nested in a Sequential, trains
  // as the single process that took the same first step.
  auto local = build(false), single_warm = build(false);
  mncl::Sequential converted;
  converted.add(local);
  mncl::Sgd plain({0.5f});
  mncl::SoftmaxCrossEntropy loss;
  auto step_of = [&](mncl::Link &model, const mncl::Tensor &x, const std::vector<int32_t> &labels) {
    loss.forward(model.forward(x), labels);
    model.backward(loss.backward());
    auto params = model.parameters();
    plain.update(mncl::value_spans(params), mncl::grad_spans(params));
  };
  const auto [x_warm, labels_warm] = batch(5, 0, per_rank);
  step_of(*local, x_warm, labels_warm);
  step_of(*single_warm, x_warm, labels_warm);
  const float warm_running_var =
      static_cast<mncl::BatchNormalization &>(*local->links()[1]).running_var()[0];
  EXPECT_NE(warm_running_var, 1.0f);  // the step moved it: the conversion must carry it
  EXPECT_EQ(mncl::convert_to_multi_node_batch_normalization(converted, comm()), 1u);
  EXPECT_EQ(mncl::convert_to_multi_node_batch_normalization(converted, comm()), 0u);
  auto *converted_bn = dynamic_cast<mncl::MultiNodeBatchNormalization *>(local->links()[1].get());
  ASSERT_NE(converted_bn, nullptr);
  EXPECT_EQ(converted_bn->running_var()[0], warm_running_var);

  const auto pd = distributed->parameters(), ps = single->parameters();
  const auto pc = converted.parameters(), pw = single_warm->parameters();  // after converting
  mncl::MultiNodeOptimizer<mncl::Sgd> opt(mncl::Sgd({0.5f}), comm());
  mncl::MultiNodeOptimizer<mncl::Sgd> opt_converted(mncl::Sgd({0.5f}), comm());
  for (int step = 0; step < 3; ++step) {
    const auto [x, labels] = batch(step, rank() * per_rank, per_rank);
    loss.forward(distributed->forward(x), labels);
    distributed->backward(loss.backward());
    opt.update(mncl::value_spans(pd), mncl::grad_spans(pd));
    loss.forward(converted.forward(x), labels);
    converted.backward(loss.backward());
    opt_converted.update(mncl::value_spans(pc), mncl::grad_spans(pc));
    const auto [x_all, labels_all] = batch(step, 0, per_rank * size());
    step_of(*single, x_all, labels_all);
    step_of(*single_warm, x_all, labels_all);
  }
  ASSERT_EQ(pd.size(), ps.size());
  ASSERT_EQ(pc.size(), pw.size());
  for (std::size_t i = 0; i < pd.size(); ++i) {
    expect_close(pd[i]->value, ps[i]->value, "parameter");
    expect_close(pc[i]->value, pw[i]->value, "parameter of the converted model");
  }
  const auto rd = distributed->persistents(), rs = single->persistents();
  const auto rc = converted.persistents(), rw = single_warm->persistents();
  ASSERT_EQ(rd.size(), 2u);
  ASSERT_EQ(rc.size(), 2u);
  for (std::size_t i = 0; i < rd.size(); ++i) {
    expect_close(*rd[i], *rs[i], "running statistic");
    expect_close(*rc[i], *rw[i], "running statistic of the converted model");
  }
}

// The conversion keeps a layer's mode and finetuning state, keeps a layer used twice one layer,
// leaves multi-node layers as they are, and drops the last forward: a backward right after it
// fails on every rank (it would mix the local batch into the global sums).
TEST_F(Frontends, ConvertToMultiNodeBatchNormalizationKeepsStateAndSharing) {
  auto shared = std::make_shared<mncl::BatchNormalization>(2);
  auto evaluating = std::make_shared<mncl::BatchNormalization>(2);
  auto already = std::make_shared<mncl::MultiNodeBatchNormalization>(2, comm());
  auto inner = std::make_shared<mncl::Sequential>();
  inner->add(shared).add(evaluating);
  mncl::Sequential model;
  model.add(shared).add(inner).add(already);
  shared->forward(mncl::Tensor({2, 2}, {1, 2, 3, 5}));  // a forward of its own batch
  shared->start_finetuning();
  evaluating->set_training(false);

  EXPECT_EQ(mncl::convert_to_multi_node_batch_normalization(model, comm()), 2u);
  auto *first = dynamic_cast<mncl::MultiNodeBatchNormalization *>(model.links()[0].get());
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(inner->links()[0].get(), first) << "a layer used twice stays one layer";
  EXPECT_TRUE(first->finetuning());
  EXPECT_TRUE(first->training());
  auto *second = dynamic_cast<mncl::MultiNodeBatchNormalization *>(inner->links()[1].get());
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(second->training());
  EXPECT_EQ(model.links()[2], already);
  EXPECT_TRUE(first->batch_mean().empty());
  try {
    first->backward(mncl::Tensor({2, 2}, 1.0f));
    ADD_FAILURE() << "a backward without a forward of the converted layer went through";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("no forward"), std::string::npos) << e.what();
  }
  // The converted layer works on: a forward of the global batch, then its backward.
  const mncl::Tensor y = first->forward(mncl::Tensor({1, 2}, {float(rank()), 1.0f}));
  EXPECT_EQ(first->finetuned_batches(), 1);
  const double mean = (size() - 1) / 2.0;
  EXPECT_NEAR(first->batch_mean()[0], mean, 1e-12);
  EXPECT_NO_THROW(first->backward(mncl::Tensor({1, 2}, 1.0f)));
  (void)y;
}

// A rank whose input does not fit still takes part in the reduction, so no rank waits: it throws
// InvalidArgument, every other rank RemoteError; the layer and the world work on afterwards.
TEST_F(Frontends, MultiNodeBatchNormalizationBadInputOnOneRankFailsEveryRank) {
  mncl::MultiNodeBatchNormalization bn(2, comm());
  const bool culprit = rank() == size() - 1;
  bn.forward(mncl::Tensor({1, 2}, {1.0f, 2.0f}));
  bn.backward(mncl::Tensor({1, 2}, {1.0f, 1.0f}));
  try {
    bn.forward(mncl::Tensor({1, culprit ? 3 : 2}));
    ADD_FAILURE() << "forward took a bad input";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_TRUE(culprit) << e.what();
    EXPECT_NE(std::string(e.what()).find("{batch, 2, ...}"), std::string::npos) << e.what();
  } catch (const mncl::RemoteError &e) {
    EXPECT_FALSE(culprit) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 other rank"), std::string::npos) << e.what();
  }
  // The failed forward left nothing to go back through (not the batch before it), on every
  // rank: all of them say so, together.
  EXPECT_THROW(bn.backward(mncl::Tensor({1, 2}, {1.0f, 1.0f})), mncl::InvalidArgument);
  // A shape that does not describe its data fails every rank alike, without reading past it.
  mncl::Tensor short_data;
  short_data.shape = {2, 2};
  short_data.data = {1.0f};
  try {
    bn.forward(culprit ? short_data : mncl::Tensor({2, 2}));
    ADD_FAILURE() << "forward took a short tensor";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_TRUE(culprit) << e.what();
  } catch (const mncl::RemoteError &e) {
    EXPECT_FALSE(culprit) << e.what();
  }
  const mncl::Tensor x({2, 2}, {float(rank()), 1.0f, float(rank()) + 2.0f, 3.0f});
  const mncl::Tensor y = bn.forward(x);
  // Channel 0 holds {r, r + 2} on every rank r: global mean (size - 1) / 2 + 1.
  EXPECT_DOUBLE_EQ(bn.batch_mean()[0], (size() - 1) / 2.0 + 1.0);
  EXPECT_DOUBLE_EQ(bn.batch_mean()[1], 2.0);
  // A backward with the wrong shape on one rank fails every rank alike.
  try {
    bn.backward(mncl::Tensor({culprit ? 1 : 2, 2}));
    ADD_FAILURE() << "backward took a bad gradient";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_TRUE(culprit) << e.what();
  } catch (const mncl::RemoteError &e) {
    EXPECT_FALSE(culprit) << e.what();
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// allreduce_persistent averages per-rank BatchNormalization running statistics.
TEST_F(Frontends, AllreducePersistentAveragesRunningStatistics) {
  auto running_after = [](int r) {
    mncl::BatchNormalization bn(2);
    bn.forward(mncl::Tensor({2, 2}, {float(r), 1.0f, float(3 * r), 5.0f}));
    return std::make_pair(bn.running_mean(), bn.running_var());
  };
  mncl::Sequential model;
  model.emplace<mncl::Dense>(2, 2, 1).emplace<mncl::BatchNormalization>(2);
  auto *bn = static_cast<mncl::BatchNormalization *>(model.links()[1].get());
  bn->forward(mncl::Tensor({2, 2}, {float(rank()), 1.0f, float(3 * rank()), 5.0f}));
  mncl::allreduce_persistent(comm(), model);
  for (std::size_t c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int r = 0; r < size(); ++r) {
      mean += running_after(r).first[c];
      var += running_after(r).second[c];
    }
    EXPECT_NEAR(bn->running_mean()[c], mean / size(), 1e-6) << c;
    EXPECT_NEAR(bn->running_var()[c], var / size(), 1e-5) << c;
  }
  // A rank whose model has no running statistics (it once skipped the allreduce, and the others
  // waited for it until the timeout): every rank throws, naming it.
  if (size() > 1) {
    mncl::Sequential plain;
    plain.emplace<mncl::Dense>(2, 2, 1);
    try {
      mncl::allreduce_persistent(comm(), rank() == size() - 1 ? plain : model);
      ADD_FAILURE() << "averaged models of other layouts";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(size() - 1)), std::string::npos)
          << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor parallelism (tensor_parallel.hpp)
// ---------------------------------------------------------------------------------------------

// Small integers, so every product and sum is exact in float whatever the order: the parallel
// layers must then equal their one-process twins exactly.
mncl::Tensor integer_tensor(std::vector<int64_t> shape, int salt) {
  mncl::Tensor t(std::move(shape));
  for (std::size_t k = 0; k < t.data.size(); ++k) {
    t.data[k] = float(int((k * 7 + std::size_t(salt) * 3) % 9) - 4);
  }
  return t;
}
void make_integer(mncl::Dense &dense, int salt) {
  for (std::size_t k = 0; k < dense.weight().value.size(); ++k) {
    dense.weight().value[k] = float(int((k * 5 + std::size_t(salt)) % 7) - 3);
  }
  for (std::size_t k = 0; k < dense.bias().value.size(); ++k) {
    dense.bias().value[k] = float(int((k + std::size_t(salt)) % 5) - 2);
  }
}
// Rows [r0, r1) x columns [c0, c1) of a row-major matrix of `cols` columns.
std::vector<float> block_of(const std::vector<float> &m, std::size_t cols, std::size_t r0,
                            std::size_t r1, std::size_t c0, std::size_t c1) {
  std::vector<float> out;
  for (std::size_t r = r0; r < r1; ++r) {
    out.insert(out.end(), m.begin() + long(r * cols + c0), m.begin() + long(r * cols + c1));
  }
  return out;
}

// The Megatron MLP block (column-parallel, ReLU, row-parallel) equals Dense, ReLU, Dense on
// one process: outputs, input gradients and every shard's parameter gradients, exactly. 7
// hidden features split unevenly over 2, 3 and 4 ranks.
TEST_F(Frontends, TensorParallelMlpBlockMatchesOneProcess) {
  const int64_t in = 5, hidden = 7, out = 3;
  mncl::Dense ref1(in, hidden, 11), ref2(hidden, out, 12);
  mncl::ColumnParallelDense col(in, hidden, comm(), 11, mncl::ColumnParallelOptions{false, true});
  mncl::RowParallelDense row(hidden, out, comm(), 12);
  const mncl::ShardRange cs = col.columns(), rs = row.rows();
  EXPECT_EQ(cs, mncl::shard_range(hidden, size(), rank(), false));
  EXPECT_EQ(rs, cs);
  // The shards start as the slices of the one-process layers (same seeds).
  EXPECT_EQ(col.weight().value, block_of(ref1.weight().value, hidden, 0, in, cs.begin, cs.end));
  EXPECT_EQ(row.weight().value, block_of(ref2.weight().value, out, rs.begin, rs.end, 0, out));
  EXPECT_EQ(row.bias().value, ref2.bias().value);
  make_integer(ref1, 1);
  make_integer(ref2, 2);
  col.weight().value = block_of(ref1.weight().value, hidden, 0, in, cs.begin, cs.end);
  col.bias().value = block_of(ref1.bias().value, hidden, 0, 1, cs.begin, cs.end);
  row.weight().value = block_of(ref2.weight().value, out, rs.begin, rs.end, 0, out);
  row.bias().value = ref2.bias().value;

  mncl::Sequential reference, parallel;
  reference.add(std::shared_ptr<mncl::Link>(&ref1, [](mncl::Link *) {}))
      .emplace<mncl::ReLU>()
      .add(std::shared_ptr<mncl::Link>(&ref2, [](mncl::Link *) {}));
  parallel.add(std::shared_ptr<mncl::Link>(&col, [](mncl::Link *) {}))
      .emplace<mncl::ReLU>()
      .add(std::shared_ptr<mncl::Link>(&row, [](mncl::Link *) {}));
  const mncl::Tensor x = integer_tensor({4, in}, 3), dy = integer_tensor({4, out}, 4);
  const mncl::Tensor y_ref = reference.forward(x), dx_ref = reference.backward(dy);
  const mncl::Tensor y = parallel.forward(x);
  EXPECT_EQ(y.shape, y_ref.shape);
  EXPECT_EQ(y.data, y_ref.data);
  const mncl::Tensor dx = parallel.backward(dy);
  EXPECT_EQ(dx.shape, dx_ref.shape);
  EXPECT_EQ(dx.data, dx_ref.data);
  EXPECT_EQ(col.weight().grad, block_of(ref1.weight().grad, hidden, 0, in, cs.begin, cs.end));
  EXPECT_EQ(col.bias().grad, block_of(ref1.bias().grad, hidden, 0, 1, cs.begin, cs.end));
  EXPECT_EQ(row.weight().grad, block_of(ref2.weight().grad, out, rs.begin, rs.end, 0, out));
  EXPECT_EQ(row.bias().grad, ref2.bias().grad);
  EXPECT_EQ(parallel.parameters().size(), 4u);

  // Each layer alone: the column-parallel one gathering its output, the row-parallel one
  // taking the whole (replicated) input and gathering its gradient.
  mncl::ColumnParallelDense col_gather(in, hidden, comm(), 11);
  col_gather.weight().value = col.weight().value;
  col_gather.bias().value = col.bias().value;
  const mncl::Tensor h_ref = ref1.forward(x);
  EXPECT_EQ(col_gather.forward(x).data, h_ref.data);
  const mncl::Tensor dh = integer_tensor({4, hidden}, 5);
  EXPECT_EQ(col_gather.backward(dh).data, ref1.backward(dh).data);
  EXPECT_EQ(col_gather.weight().grad,
            block_of(ref1.weight().grad, hidden, 0, in, cs.begin, cs.end));

  mncl::RowParallelDense row_whole(hidden, out, comm(), 12, mncl::RowParallelOptions{false, true});
  row_whole.weight().value = row.weight().value;
  row_whole.bias().value = row.bias().value;
  const mncl::Tensor h = integer_tensor({4, hidden}, 6);
  EXPECT_EQ(row_whole.forward(h).data, ref2.forward(h).data);
  const mncl::Tensor dh_whole = row_whole.backward(dy);
  EXPECT_EQ(dh_whole.shape, (std::vector<int64_t>{4, hidden}));
  EXPECT_EQ(dh_whole.data, ref2.backward(dy).data);
  EXPECT_EQ(row_whole.bias().grad, ref2.bias().grad);
}

// The four collectives on {2, 2, f} tensors with f different on every rank (rank r holds r
// features, so rank 0 none): gather puts them side by side, each the adjoint of the other.
TEST_F(Frontends, TensorParallelCollectivesAndTheirAdjoints) {
  const int total = size() * (size() - 1) / 2;  // 0 + 1 + ... + size-1 features
  auto value = [](int row, int feature) { return float(100 * row + feature); };
  mncl::Tensor mine({2, 2, rank()});
  const int first = rank() * (rank() - 1) / 2;
  for (int row = 0; row < 4; ++row) {
    for (int f = 0; f < rank(); ++f)
      mine.data[std::size_t(row * rank() + f)] = value(row, first + f);
  }
  mncl::GatherFromTensorParallel gather(comm());
  const mncl::Tensor all = gather.forward(mine);
  ASSERT_EQ(all.shape, (std::vector<int64_t>{2, 2, total}));
  for (int row = 0; row < 4; ++row) {
    for (int f = 0; f < total; ++f)
      EXPECT_EQ(all.data[std::size_t(row * total + f)], value(row, f));
  }
  EXPECT_EQ(gather.backward(all).data, mine.data);  // its own columns back

  // Scatter: this rank's shard of a replicated x; backward gathers the shards' gradients.
  const mncl::Tensor x = integer_tensor({3, 5}, 7);
  mncl::ScatterToTensorParallel scatter(comm());
  const mncl::ShardRange shard = mncl::feature_shard(5, comm());
  const mncl::Tensor part = scatter.forward(x);
  EXPECT_EQ(part.data, block_of(x.data, 5, 0, 3, shard.begin, shard.end));
  EXPECT_EQ(scatter.backward(part).data, x.data);

  // Copy: identity forward, sum backward; Reduce: the sum forward, identity backward.
  mncl::CopyToTensorParallel copy(comm());
  mncl::ReduceFromTensorParallel reduce(comm());
  const mncl::Tensor mine_ints = integer_tensor({2, 3}, rank());
  mncl::Tensor sum({2, 3});
  for (int r = 0; r < size(); ++r) {
    const mncl::Tensor t = integer_tensor({2, 3}, r);
    for (std::size_t k = 0; k < sum.size(); ++k) sum.data[k] += t.data[k];
  }
  EXPECT_EQ(copy.forward(mine_ints).data, mine_ints.data);
  EXPECT_EQ(copy.backward(mine_ints).data, sum.data);
  EXPECT_EQ(reduce.forward(mine_ints).data, sum.data);
  EXPECT_EQ(reduce.backward(mine_ints).data, mine_ints.data);
  EXPECT_THROW(reduce.backward(x), mncl::InvalidArgument);  // not the last forward's shape
}

// A wrong tensor on one rank fails every rank together (its own InvalidArgument, RemoteError
// naming it elsewhere), ranks disagreeing on the batch fail alike, a backward after a failed
// forward is refused everywhere, and the world works on.
TEST_F(Frontends, TensorParallelBadInputOnOneRankFailsEveryRank) {
  const int culprit = size() - 1;
  const bool guilty = rank() == culprit;
  auto expect_together = [&](auto &&call, const char *what) {
    expect_fails_together(call, culprit, what);
  };
  mncl::ColumnParallelDense col(3, 4, comm(), 1);  // gathers its output
  col.forward(mncl::Tensor({2, 3}, 1.0f));
  expect_together([&] { col.forward(mncl::Tensor({2, guilty ? 4 : 3}, 1.0f)); }, "column forward");
  // Nothing to go back through now (not the batch before), on any rank.
  EXPECT_THROW(col.backward(mncl::Tensor({2, 4})), mncl::InvalidArgument);
  col.forward(mncl::Tensor({2, 3}, 1.0f));
  expect_together([&] { col.backward(mncl::Tensor({guilty ? 1 : 2, 4})); }, "column backward");

  mncl::RowParallelDense row(4, 2, comm(), 2, mncl::RowParallelOptions{false, true});
  mncl::Tensor short_data;
  short_data.shape = {2, 4};
  short_data.data = {1.0f};
  expect_together([&] { row.forward(guilty ? short_data : mncl::Tensor({2, 4})); }, "row forward");
  mncl::ReduceFromTensorParallel reduce(comm());
  expect_together(
      [&] {
        reduce.forward(guilty ? mncl::Tensor() : mncl::Tensor({1, 2}));
      },
      "reduce forward");
  if (size() > 1) {
    // Every rank's tensor is fine on its own; together they disagree: all say so alike.
    try {
      row.forward(mncl::Tensor({guilty ? 3 : 2, 4}));
      ADD_FAILURE() << "row forward took batches of different sizes";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("different numbers of rows"), std::string::npos)
          << e.what();
    }
    mncl::Tensor uneven({2, guilty ? 1 : 2});
    try {
      reduce.forward(uneven);
      ADD_FAILURE() << "reduce forward took tensors of different widths";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find("different numbers of features"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(row.backward(mncl::Tensor({2, 2})), mncl::InvalidArgument);
  EXPECT_EQ(row.forward(mncl::Tensor({2, 4}, 1.0f)).shape, (std::vector<int64_t>{2, 2}));
  EXPECT_THROW(mncl::ColumnParallelDense(3, size() - 1, comm(), 1), mncl::InvalidArgument);
  if (size() > 1) {
    // Layers of other widths on one rank (each fine on its own, the same input everywhere):
    // they once computed a result of no model at all, OK on every rank.
    const int64_t hidden = 2 * size() + (guilty ? 2 * size() : 0);
    mncl::ColumnParallelDense wide(4, hidden, comm(), 1, mncl::ColumnParallelOptions{false, true});
    mncl::RowParallelDense back(hidden, 2, comm(), 2);
    for (const char *which : {"column", "row"}) {
      try {
        const mncl::Tensor x({2, 4}, 1.0f);
        if (std::string(which) == "column") {
          wide.forward(x);
        } else {
          back.forward(mncl::Tensor({2, hidden / size()}, 1.0f));
        }
        ADD_FAILURE() << which << " layers of other widths were taken";
      } catch (const mncl::InvalidArgument &e) {
        EXPECT_NE(std::string(e.what()).find("layers differ in size or options"), std::string::npos)
            << which << ": " << e.what();
      }
    }
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// A bad tensor that reaches a pass moving no data (the column-parallel layer of the MLP block
// without gather, the row-parallel layer's backward) still fails every rank together, not one
// rank at once and the others in the next layer's collective; so do the collective links, N-D
// tensors of different shapes, replicated inputs of different widths and slices that are not
// one split.
TEST_F(Frontends, TensorParallelBadInputFailsTogetherInEveryPass) {
  const int culprit = size() - 1;
  const bool guilty = rank() == culprit;
  auto expect_together = [&](auto &&call, const char *what) {
    expect_fails_together(call, culprit, what);
  };
  auto expect_all_refuse = [&](auto &&call, const char *what, const char *why) {
    try {
      call();
      ADD_FAILURE() << what << " took tensors that disagree";
    } catch (const mncl::InvalidArgument &e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << what << ": " << e.what();
    }
  };
  mncl::Sequential block;
  block.emplace<mncl::ColumnParallelDense>(3, 6, comm(), 1, mncl::ColumnParallelOptions{false})
      .emplace<mncl::ReLU>()
      .emplace<mncl::RowParallelDense>(6, 2, comm(), 2);
  expect_together([&] { block.forward(mncl::Tensor({2, guilty ? 4 : 3}, 1.0f)); }, "block forward");
  block.forward(mncl::Tensor({2, 3}, 1.0f));
  auto block_backward_bad = [&] { block.backward(mncl::Tensor({2, guilty ? 3 : 2}, 1.0f)); };
  expect_together(block_backward_bad, "block backward");
  block.forward(mncl::Tensor({2, 3}, 1.0f));
  EXPECT_EQ(block.backward(mncl::Tensor({2, 2}, 1.0f)).shape, (std::vector<int64_t>{2, 3}));

  mncl::CopyToTensorParallel copy(comm());
  auto copy_bad = [&] { copy.forward(guilty ? mncl::Tensor() : mncl::Tensor({1, 2})); };
  expect_together(copy_bad, "copy forward");
  mncl::GatherFromTensorParallel gather(comm());
  gather.forward(mncl::Tensor({2, 1}, 1.0f));
  auto gather_bad = [&] { gather.backward(mncl::Tensor({2, size() + (guilty ? 1 : 0)})); };
  expect_together(gather_bad, "gather backward");
  mncl::ScatterToTensorParallel scatter(comm());
  scatter.forward(mncl::Tensor({2, 8}, 1.0f));
  const auto my_width = int64_t(mncl::feature_shard(8, comm()).size());
  auto scatter_bad = [&] { scatter.backward(mncl::Tensor({guilty ? 3 : 2, my_width})); };
  expect_together(scatter_bad, "scatter backward");
  if (size() > 1) {
    auto gather_shapes = [&] {
      gather.forward(
          mncl::Tensor(guilty ? std::vector<int64_t>{2, 3, 1} : std::vector<int64_t>{3, 2, 1}));
    };
    expect_all_refuse(gather_shapes, "gather forward", "differ in shape");
    auto copy_widths = [&] { copy.forward(mncl::Tensor({2, guilty ? 5 : 4})); };
    expect_all_refuse(copy_widths, "copy forward", "different numbers of features");
    auto scatter_widths = [&] { scatter.forward(mncl::Tensor({2, guilty ? 5 : 4})); };
    expect_all_refuse(scatter_widths, "scatter forward", "different numbers of features");
    // Layers built for different widths (the culprit's 1 wider): refused at the forward now
    // (the layers' sizes are agreed), where each rank's gradient fitting its own slice once
    // passed the forward and failed only the backward, as no split of one width.
    mncl::ColumnParallelDense narrow(3, 2 * size() + (guilty ? 1 : 0), comm(), 1,
                                     mncl::ColumnParallelOptions{false, false});
    auto other_widths = [&] { narrow.forward(mncl::Tensor({2, 3}, 1.0f)); };
    expect_all_refuse(other_widths, "column forward", "layers differ in size or options");
    mncl::ColumnParallelDense column(3, 2 * size(), comm(), 1,
                                     mncl::ColumnParallelOptions{true, false});
    column.forward(mncl::Tensor({0, 3}));  // an empty batch is a batch
    EXPECT_TRUE(column.backward(mncl::Tensor({0, 2 * size()})).empty());
    auto rows_differ = [&] { column.forward(mncl::Tensor({guilty ? 1 : 0, 3})); };
    expect_all_refuse(rows_differ, "column forward", "different numbers of rows");
  }
  EXPECT_EQ(comm().allreduce_value(1), size());
}

// Three SGD steps of the parallel block stay with the one-process block (up to float sum
// order), and the replicated bias stays bit for bit the same on every rank.
TEST_F(Frontends, TensorParallelTrainsLikeOneProcess) {
  mncl::Dense ref1(6, 10, 21), ref2(10, 4, 22);
  auto col = std::make_shared<mncl::ColumnParallelDense>(6, 10, comm(), 21,
                                                         mncl::ColumnParallelOptions{false, false});
  auto row = std::make_shared<mncl::RowParallelDense>(10, 4, comm(), 22);
  mncl::Sequential parallel({col, std::make_shared<mncl::ReLU>(), row});
  mncl::Sequential reference({std::shared_ptr<mncl::Link>(&ref1, [](mncl::Link *) {}),
                              std::make_shared<mncl::ReLU>(),
                              std::shared_ptr<mncl::Link>(&ref2, [](mncl::Link *) {})});
  mncl::Sgd sgd_ref({0.1f}), sgd({0.1f});
  for (int step = 0; step < 3; ++step) {
    mncl::Tensor x({5, 6});
    for (std::size_t k = 0; k < x.size(); ++k) x.data[k] = std::sin(0.3f * float(k + step));
    mncl::SoftmaxCrossEntropy loss_ref, loss;
    const std::vector<int32_t> labels{0, 3, 1, 2, 3};
    const float expected = loss_ref.forward(reference.forward(x), labels);
    EXPECT_NEAR(loss.forward(parallel.forward(x), labels), expected, 1e-5f) << step;
    reference.backward(loss_ref.backward());
    EXPECT_TRUE(parallel.backward(loss.backward()).empty());  // no input gradient asked for
    sgd_ref.update(mncl::value_spans(reference.parameters()),
                   mncl::grad_spans(reference.parameters()));
    sgd.update(mncl::value_spans(parallel.parameters()), mncl::grad_spans(parallel.parameters()));
  }
  const mncl::ShardRange cs = col->columns();
  expect_near(col->weight().value, block_of(ref1.weight().value, 10, 0, 6, cs.begin, cs.end),
              "column weights");
  expect_near(row->bias().value, ref2.bias().value, "row bias");
  const std::vector<float> biases = comm().allgather(row->bias().value);
  for (int r = 0; r < size(); ++r) {
    EXPECT_TRUE(std::equal(row->bias().value.begin(), row->bias().value.end(),
                           biases.begin() + long(r) * 4))
        << "rank " << r << "'s replicated bias differs";
  }
}

// Tensor x data parallelism: the world split into replicas (split_hybrid) of a tensor-parallel
// group of 2 ranks (1 with an odd world), each replica on its own rows of the global batch,
// the gradients averaged over the replicas by a MultiNodeOptimizer on the data-parallel group:
// two SGD steps equal one process's on the whole batch.
TEST_F(Frontends, TensorTimesDataParallelTrainsLikeOneProcessOnTheGlobalBatch) {
  const int tensor_ranks = size() % 2 == 0 ? 2 : 1;
  auto groups = mncl::split_hybrid(comm(), tensor_ranks);
  const int replicas = groups.coords.replicas, replica = groups.coords.replica;
  const int64_t rows = 3;  // per replica
  auto global_batch = [&](int step) {
    mncl::Tensor x({rows * replicas, 5});
    for (std::size_t k = 0; k < x.size(); ++k) x.data[k] = std::cos(0.4f * float(k) + float(step));
    std::vector<int32_t> labels(static_cast<std::size_t>(rows * replicas));
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 7 + step) % 3);
    return std::make_pair(x, labels);
  };
  mncl::Dense ref1(5, 6, 31), ref2(6, 3, 32);
  mncl::Sequential reference({std::shared_ptr<mncl::Link>(&ref1, [](mncl::Link *) {}),
                              std::make_shared<mncl::ReLU>(),
                              std::shared_ptr<mncl::Link>(&ref2, [](mncl::Link *) {})});
  auto col = std::make_shared<mncl::ColumnParallelDense>(5, 6, groups.model_parallel, 31,
                                                         mncl::ColumnParallelOptions{false, false});
  auto row = std::make_shared<mncl::RowParallelDense>(6, 3, groups.model_parallel, 32);
  mncl::Sequential parallel({col, std::make_shared<mncl::ReLU>(), row});
  mncl::Sgd sgd_ref({0.5f});
  mncl::MultiNodeOptimizer<mncl::Sgd> opt(mncl::Sgd({0.5f}), groups.data_parallel);
  const auto params = parallel.parameters();
  for (int step = 0; step < 2; ++step) {
    const auto [x, labels] = global_batch(step);
    mncl::SoftmaxCrossEntropy loss_ref, loss;
    loss_ref.forward(reference.forward(x), labels);
    reference.backward(loss_ref.backward());
    sgd_ref.update(mncl::value_spans(reference.parameters()),
                   mncl::grad_spans(reference.parameters()));
    // My replica's rows; the loss's mean over them, averaged over the replicas, is the global
    // mean (equal shares).
    mncl::Tensor mine({rows, 5});
    std::copy(x.data.begin() + replica * rows * 5, x.data.begin() + (replica + 1) * rows * 5,
              mine.data.begin());
    const std::vector<int32_t> my_labels(labels.begin() + replica * rows,
                                         labels.begin() + (replica + 1) * rows);
    loss.forward(parallel.forward(mine), my_labels);
    parallel.backward(loss.backward());
    opt.update(mncl::value_spans(params), mncl::grad_spans(params));
  }
  const mncl::ShardRange cs = col->columns(), rs = row->rows();
  expect_near(col->weight().value, block_of(ref1.weight().value, 6, 0, 5, cs.begin, cs.end),
              "column weights");
  expect_near(col->bias().value, block_of(ref1.bias().value, 6, 0, 1, cs.begin, cs.end),
              "column bias");
  expect_near(row->weight().value, block_of(ref2.weight().value, 3, rs.begin, rs.end, 0, 3),
              "row weights");
  expect_near(row->bias().value, ref2.bias().value, "row bias");
  groups.model_parallel.destroy();
  groups.data_parallel.destroy();
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  spmd::install_spmd();
  return RUN_ALL_TESTS();
}
