// mncl::Communicator: an RAII owner of an mncl_comm_t with typed collectives over any contiguous
// buffer (Span, std::vector, std::array...) and object collectives for serializable types.
//
//   mncl::Communicator comm;                       // from MNCL_RANK/MNCL_SIZE/MNCL_STORE...
//   std::vector<float> grads = ...;
//   comm.allreduce(grads, mncl::ReduceOp::kAvg);   // in place
//   auto names = comm.gather_obj(std::string("rank ") + std::to_string(comm.rank()));
//
// Every failure throws an mncl::Error subclass (see error.hpp). As with the C API, collectives
// must be issued in the same order on every rank; a size mismatch detected here throws on the
// rank that made it, before anything is sent.
#ifndef MNCL_FRONTENDS_COMMUNICATOR_HPP
#define MNCL_FRONTENDS_COMMUNICATOR_HPP

#include <mncl/mncl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends/dtype.hpp"
#include "mncl/frontends/error.hpp"
#include "mncl/frontends/serialize.hpp"
#include "mncl/frontends/span.hpp"

namespace mncl {

enum class ReduceOp : int {
  kSum = MNCL_SUM,
  kProd = MNCL_PROD,
  kMin = MNCL_MIN,
  kMax = MNCL_MAX,
  kAvg = MNCL_AVG,
};

// Objects are sent in messages of at most this many bytes unless configured otherwise.
inline constexpr std::size_t kDefaultMaxMessageBytes = std::size_t{16} << 20;

struct CommunicatorOptions {
  std::string backend;  // "naive", "gloo", a plugin path, a comma list, "auto"; "": MNCL_BACKEND
  int rank = MNCL_FROM_ENV;
  int size = MNCL_FROM_ENV;
  std::string bootstrap;  // "tcp://host:port" or "file:///dir"; "": MNCL_STORE
  int64_t timeout_ms = MNCL_FROM_ENV;
  int device = MNCL_FROM_ENV;
  // The largest single message bcast_obj, gather_obj, send_obj... send; bigger objects go in
  // chunks. Bounds the backend's per-message memory (the naive one stages messages whole).
  std::size_t max_message_bytes = kDefaultMaxMessageBytes;
};

// Settings of a communicator made by a split (Communicator::split, split_host,
// split_cross_host); the defaults take each one from the parent, not from the environment.
struct SplitOptions {
  std::string backend;  // a name, a path, a comma list or "auto" (for the group's own ranks
                        // and hosts: shm for the ranks of one host); "": the parent's
  int64_t timeout_ms = MNCL_FROM_ENV;  // -1: the parent's
  int device = MNCL_FROM_ENV;          // -1: the parent's
};

// One non-blocking operation in flight. The operation's buffers must stay untouched until
// wait() or a test() that returns true. The destructor waits (bounded by the communicator's
// timeout) so buffers are never freed under a running operation.
class Request {
 public:
  Request() noexcept = default;
  // keep_alive owns whatever the operation reads after the call returned (pointer arrays).
  explicit Request(mncl_request_t request, std::shared_ptr<const void> keep_alive = nullptr)
      : request_(request), keep_alive_(std::move(keep_alive)) {}
  Request(Request &&other) noexcept { *this = std::move(other); }
  Request &operator=(Request &&other) noexcept {
    if (this != &other) {
      finish_quietly();
      request_ = std::exchange(other.request_, nullptr);
      keep_alive_ = std::move(other.keep_alive_);
    }
    return *this;
  }
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request() { finish_quietly(); }

  // True while the operation has not been completed by wait() or test().
  bool pending() const noexcept { return request_ != nullptr; }

  // Blocks until the operation ends (bounded by the communicator's timeout); throws its error.
  void wait() {
    if (!request_) return;
    const mncl_status_t status = mncl_wait(std::exchange(request_, nullptr), -1);
    keep_alive_.reset();
    check(status, "mncl_wait");
  }
  // True once the operation has ended (successfully; a failure throws). An error with done
  // unset (another thread waiting on the request, say) leaves the request pending: the
  // operation may still be using its buffers, so wait() and the destructor must still wait.
  bool test() {
    if (!request_) return true;
    int done = 0;
    const mncl_status_t status = mncl_test(request_, &done);
    if (done) {
      request_ = nullptr;  // freed by mncl_test when done
      keep_alive_.reset();
    }
    check(status, "mncl_test");
    return done != 0;
  }

 private:
  void finish_quietly() noexcept {
    if (request_) (void)mncl_wait(std::exchange(request_, nullptr), -1);
    keep_alive_.reset();
  }

  mncl_request_t request_ = nullptr;
  std::shared_ptr<const void> keep_alive_;
};

// One send or receive of a batch (Communicator::sendrecv_batch / isendrecv_batch), made by
// isend_op or irecv_op: the buffer, its element count and dtype, and the peer. It only points at
// the buffer, which must stay alive and untouched until the batch has completed.
class P2POp {
 public:
  P2POp() noexcept = default;
  // isend_op and irecv_op say the same more briefly.
  template <class T>
  P2POp(mncl_p2p_kind_t kind, Span<T> buf, int peer) noexcept
      : op_{sizeof(mncl_p2p_op_t),
            static_cast<int32_t>(kind),
            peer,
            const_cast<std::remove_cv_t<T> *>(buf.data()),
            buf.size(),
            static_cast<int32_t>(dtype_of<T>()),
            0} {}
  mncl_p2p_kind_t kind() const noexcept { return static_cast<mncl_p2p_kind_t>(op_.kind); }
  bool is_send() const noexcept { return op_.kind == MNCL_P2P_SEND; }
  int peer() const noexcept { return op_.peer; }
  void *data() const noexcept { return op_.buf; }
  std::size_t count() const noexcept { return op_.count; }
  mncl_dtype_t dtype() const noexcept { return static_cast<mncl_dtype_t>(op_.dtype); }
  // The C API's op (what mncl_sendrecv_batch reads).
  const mncl_p2p_op_t &c_op() const noexcept { return op_; }

 private:
  mncl_p2p_op_t op_{sizeof(mncl_p2p_op_t), MNCL_P2P_SEND, 0, nullptr, 0, MNCL_UINT8, 0};
};
// A vector of P2POp is an array of mncl_p2p_op_t: batches go to the C API without a copy.
static_assert(sizeof(P2POp) == sizeof(mncl_p2p_op_t) && std::is_standard_layout_v<P2POp>);

// Sends the buffer to peer, as part of a batch. The dtype follows the element type.
template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
P2POp isend_op(Buffer &&buffer, int peer) noexcept {
  return P2POp(MNCL_P2P_SEND, as_const_span(buffer), peer);
}
// Receives into the buffer (all of it: the sender sends as many elements) from peer.
template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
P2POp irecv_op(Buffer &&buffer, int peer) noexcept {
  auto buf = as_span(buffer);
  static_assert(!std::is_const_v<typename decltype(buf)::element_type>,
                "irecv_op: the receive buffer must be writable");
  return P2POp(MNCL_P2P_RECV, buf, peer);
}
// Deleted: an op only points at its buffer, and a temporary container (isend_op(make_data(),
// peer)) is freed at the end of the statement, before the batch uses it. Keep the data in a
// named variable (or pass a Span over memory that lives on).
template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
P2POp isend_op(Buffer &&temporary, int peer) = delete;
template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
P2POp irecv_op(Buffer &&temporary, int peer) = delete;

namespace detail {
// A send and a receive buffer as spans of one element type, the receive one writable.
template <class Send, class Recv>
auto typed_pair(const Send &send, Recv &recv) {
  auto s = as_const_span(send);
  auto r = as_span(recv);
  static_assert(std::is_same_v<typename decltype(s)::value_type, typename decltype(r)::value_type>,
                "send and receive buffers must have the same element type");
  static_assert(!std::is_const_v<typename decltype(r)::element_type>,
                "the receive buffer must be writable");
  return std::make_pair(s, r);
}
}  // namespace detail

class Communicator {
 public:
  // Collective over every rank of the job: creates the communicator (see mncl_comm_create).
  explicit Communicator(const CommunicatorOptions &options = {}) {
    if (options.max_message_bytes == 0) {
      throw InvalidArgument("Communicator: max_message_bytes must be positive");
    }
    mncl_config_t config = MNCL_CONFIG_INIT;
    config.backend = options.backend.empty() ? nullptr : options.backend.c_str();
    config.rank = options.rank;
    config.size = options.size;
    config.bootstrap = options.bootstrap.empty() ? nullptr : options.bootstrap.c_str();
    config.timeout_ms = options.timeout_ms;
    config.device = options.device;
    check(mncl_comm_create(&config, &comm_), "mncl_comm_create");
    max_message_bytes_ = options.max_message_bytes;
    group_path_ = std::string();  // the whole job
    query_rank_and_size();
  }

  // Takes ownership of a handle created through the C API (nullptr gives an empty object).
  // group_path says which group of the job it is (see group_path()): "" for a communicator of
  // the whole job; unknown by default, as the frontends cannot tell from the handle.
  static Communicator adopt(mncl_comm_t handle, std::size_t max_message_bytes,
                            std::optional<std::string> group_path = std::nullopt) {
    return Communicator(handle, max_message_bytes, std::move(group_path));
  }

  Communicator(Communicator &&other) noexcept { *this = std::move(other); }
  Communicator &operator=(Communicator &&other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, nullptr);
      rank_ = other.rank_;
      size_ = other.size_;
      max_message_bytes_ = other.max_message_bytes_;
      group_path_ = std::move(other.group_path_);
      splits_ = other.splits_;
    }
    return *this;
  }
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;
  ~Communicator() { release(); }

  // False after a move, or for a split() with color MNCL_SPLIT_NONE.
  bool valid() const noexcept { return comm_ != nullptr; }
  explicit operator bool() const noexcept { return valid(); }
  mncl_comm_t handle() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  std::string backend() const {
    const char *name = nullptr;
    check(mncl_comm_backend(comm_, &name), "mncl_comm_backend");
    return name ? name : "";
  }
  // Where this rank runs, by host, without a collective call (mncl_comm_host_info): its place
  // among its host's ranks, how many share the host, the host's number and how many hosts;
  // ChainerMN's intra_rank, intra_size, inter_rank and inter_size.
  int local_rank() const { return host_info().local_rank; }
  int local_size() const { return host_info().local_size; }
  int host_index() const { return host_info().host_index; }
  int num_hosts() const { return host_info().num_hosts; }
  int intra_rank() const { return local_rank(); }
  int intra_size() const { return local_size(); }
  int inter_rank() const { return host_index(); }
  int inter_size() const { return num_hosts(); }
  std::size_t max_message_bytes() const noexcept { return max_message_bytes_; }
  // Which group of the job this communicator is, the same on its ranks and different from any
  // other group's (the checkpointer names its files by it): "" for the whole job (made by the
  // constructor); a split(color) appends "s<i>c<color>", i counting the splits made from the
  // parent so far (collective, so i agrees on the parent's ranks). nullopt where it cannot be
  // told: split_host and split_cross_host (the library picks their groups), adopt without a
  // group path, and whatever is split from those.
  const std::optional<std::string> &group_path() const noexcept { return group_path_; }
  void set_max_message_bytes(std::size_t bytes) {
    if (bytes == 0) throw InvalidArgument("set_max_message_bytes: must be positive");
    max_message_bytes_ = bytes;
  }

  // Collective: the ranks passing one color form a new communicator, ordered by (key, rank).
  // MNCL_SPLIT_NONE gives an empty (invalid) Communicator.
  Communicator split(int color, int key = 0) {
    auto path = child_path(color);
    mncl_comm_t child = nullptr;
    check(mncl_comm_split(comm_, color, key, &child), "mncl_comm_split");
    return Communicator(child, max_message_bytes_, std::move(path));
  }
  // As split(color, key), the new communicator with its own backend, timeout or device. The
  // ranks of one group must pass the same backend (else all of them throw InvalidArgument).
  Communicator split(int color, int key, const SplitOptions &options) {
    const mncl_config_t config = split_config(options);
    auto path = child_path(color);
    mncl_comm_t child = nullptr;
    check(mncl_comm_split_config(comm_, color, key, &config, &child), "mncl_comm_split_config");
    return Communicator(child, max_message_bytes_, std::move(path));
  }
  // Collective: the ranks of this rank's host (hosts told apart by MNCL_HOSTID, else the host
  // name), ordered by (key, rank) -- ChainerMN's intra communicator.
  Communicator split_host(int key = 0, const SplitOptions &options = {}) {
    return split_by_type(MNCL_SPLIT_TYPE_HOST, key, options);
  }
  // Collective: one rank per host, those at the same position among their host's ranks, ordered
  // by (key, rank); position 0 (every host's first rank) is ChainerMN's inter communicator. A
  // host with fewer ranks has no member in the groups of the higher positions.
  Communicator split_cross_host(int key = 0, const SplitOptions &options = {}) {
    return split_by_type(MNCL_SPLIT_TYPE_CROSS_HOST, key, options);
  }
  // Local, any thread: every blocked or later operation fails with AbortedError.
  void abort() noexcept {
    if (comm_) (void)mncl_comm_abort(comm_);
  }
  // Collective: frees the communicator now and reports a failure (the destructor cannot).
  void destroy() {
    if (!comm_) return;
    check(mncl_comm_destroy(std::exchange(comm_, nullptr)), "mncl_comm_destroy");
  }

  // ------------------------------------------------------------------------------------------
  // Typed collectives. Buffers are Spans or contiguous containers; the dtype follows the type.
  // ------------------------------------------------------------------------------------------

  template <class Buffer, class = detail::EnableIfBuffer<Buffer>>
  void allreduce(Buffer &&inout, ReduceOp op = ReduceOp::kSum) {
    auto buf = as_span(inout);
    check(mncl_allreduce(comm_, buf.data(), buf.data(), buf.size(), dtype<decltype(buf)>(),
                         c_op(op), nullptr),
          "mncl_allreduce");
  }
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void allreduce(const Send &send, Recv &&recv, ReduceOp op = ReduceOp::kSum) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(s.size() == r.size(), "allreduce", "send and receive buffers differ in size");
    check(mncl_allreduce(comm_, s.data(), r.data(), s.size(), dtype<decltype(r)>(), c_op(op),
                         nullptr),
          "mncl_allreduce");
  }
  // One value reduced over the ranks.
  template <class T>
  T allreduce_value(T value, ReduceOp op = ReduceOp::kSum) {
    check(mncl_allreduce(comm_, &value, &value, 1, dtype_of<T>(), c_op(op), nullptr),
          "mncl_allreduce");
    return value;
  }
  // The result lands in recv on `root` only (recv is ignored elsewhere).
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void reduce(const Send &send, Recv &&recv, int root, ReduceOp op = ReduceOp::kSum) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(rank_ != root || r.size() == s.size(), "reduce",
            "the root's receive buffer differs in size from the send buffer");
    check(mncl_reduce(comm_, s.data(), r.data(), s.size(), dtype<decltype(r)>(), c_op(op), root,
                      nullptr),
          "mncl_reduce");
  }
  template <class Buffer, class = detail::EnableIfBuffer<Buffer>>
  void bcast(Buffer &&buffer, int root) {
    auto buf = as_span(buffer);
    check(mncl_bcast(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), root, nullptr),
          "mncl_bcast");
  }
  // Rank r gets block r of the root's send buffer (size() * recv.size() elements).
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void scatter(const Send &send, Recv &&recv, int root) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(rank_ != root || s.size() == r.size() * size_, "scatter",
            "the root's send buffer must hold size() * recv.size() elements");
    check(mncl_scatter(comm_, s.data(), r.data(), r.size(), dtype<decltype(r)>(), root, nullptr),
          "mncl_scatter");
  }
  // The root's receive buffer (size() * send.size() elements) gets every rank's send buffer.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void gather(const Send &send, Recv &&recv, int root) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(rank_ != root || r.size() == s.size() * size_, "gather",
            "the root's receive buffer must hold size() * send.size() elements");
    check(mncl_gather(comm_, s.data(), r.data(), s.size(), dtype<decltype(r)>(), root, nullptr),
          "mncl_gather");
  }
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void allgather(const Send &send, Recv &&recv) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(r.size() == s.size() * size_, "allgather",
            "the receive buffer must hold size() * send.size() elements");
    check(mncl_allgather(comm_, s.data(), r.data(), s.size(), dtype<decltype(r)>(), nullptr),
          "mncl_allgather");
  }
  // Every rank's buffer, concatenated in rank order.
  template <class Send, class = detail::EnableIfBuffer<Send>>
  auto allgather(const Send &send) {
    auto s = as_const_span(send);
    std::vector<typename decltype(s)::value_type> all(s.size() * size_);
    allgather(s, all);
    return all;
  }
  // Rank i's send buffer (counts[i] elements, counts the same on every rank) lands at
  // recv[displs[i]] on every rank; without displs the blocks are packed in rank order.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void allgatherv(const Send &send, Recv &&recv, const std::vector<std::size_t> &counts,
                  std::vector<std::size_t> displs = {}) {
    auto [s, r] = detail::typed_pair(send, recv);
    if (displs.empty()) displs = packed_displs(counts);
    require(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(),
            "allgatherv", "counts and displs need one entry per rank");
    require(s.size() == counts[rank_], "allgatherv",
            "the send buffer must hold counts[rank()] elements");
    require(r.size() >= extent(counts, displs), "allgatherv",
            "the receive buffer must hold every block (displs[i] + counts[i] elements)");
    check(mncl_allgatherv(comm_, s.data(), s.size(), r.data(), counts.data(), displs.data(),
                          dtype<decltype(r)>(), nullptr),
          "mncl_allgatherv");
  }
  // Every rank's buffer, of any size, concatenated in rank order (the sizes travel first).
  template <class Send, class = detail::EnableIfBuffer<Send>>
  auto allgatherv(const Send &send) {
    auto s = as_const_span(send);
    const auto sizes = allgather(std::vector<uint64_t>{s.size()});
    const std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::vector<typename decltype(s)::value_type> all(extent(counts, packed_displs(counts)));
    allgatherv(s, all, counts);
    return all;
  }
  // Blocks packed in rank order on both sides: sendcounts[j] elements go to rank j, and
  // recvcounts[i] come from rank i (which must be what rank i sends here).
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void alltoallv(const Send &send, const std::vector<std::size_t> &sendcounts, Recv &&recv,
                 const std::vector<std::size_t> &recvcounts) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(sendcounts.size() == static_cast<std::size_t>(size_) &&
                recvcounts.size() == sendcounts.size(),
            "alltoallv", "sendcounts and recvcounts need one entry per rank");
    const auto sdispls = packed_displs(sendcounts), rdispls = packed_displs(recvcounts);
    require(s.size() == extent(sendcounts, sdispls), "alltoallv",
            "the send buffer must hold the sum of sendcounts");
    require(r.size() >= extent(recvcounts, rdispls), "alltoallv",
            "the receive buffer must hold the sum of recvcounts");
    check(mncl_alltoallv(comm_, s.data(), sendcounts.data(), sdispls.data(), r.data(),
                         recvcounts.data(), rdispls.data(), dtype<decltype(r)>(), nullptr),
          "mncl_alltoallv");
  }
  // Rank i's send buffer (counts[i] elements) lands at recv[displs[i]] on the root; without
  // displs the blocks are packed in rank order. Other ranks pass their send buffer only: counts,
  // displs and recv are read on the root.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void gatherv(const Send &send, Recv &&recv, const std::vector<std::size_t> &counts, int root,
               std::vector<std::size_t> displs = {}) {
    auto [s, r] = detail::typed_pair(send, recv);
    const bool is_root = rank_ == root;
    if (is_root) check_root_blocks(counts, displs, s.size(), r.size(), "gatherv");
    check(mncl_gatherv(comm_, s.data(), s.size(), is_root ? r.data() : nullptr,
                       is_root ? counts.data() : nullptr, is_root ? displs.data() : nullptr,
                       dtype<decltype(r)>(), root, nullptr),
          "mncl_gatherv");
  }
  // Every rank's buffer, of any size, concatenated in rank order on the root (the sizes travel
  // first); an empty vector elsewhere.
  template <class Send, class = detail::EnableIfBuffer<Send>>
  auto gatherv(const Send &send, int root) {
    auto s = as_const_span(send);
    std::vector<uint64_t> sizes(rank_ == root ? size_ : 0);
    gather(std::vector<uint64_t>{s.size()}, sizes, root);
    const std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::vector<typename decltype(s)::value_type> all(extent(counts, packed_displs(counts)));
    gatherv(s, all, counts, root);
    return all;
  }
  // The root's block i (counts[i] elements at send[displs[i]]; packed in rank order without
  // displs) lands in rank i's recv, which holds exactly that many. Other ranks pass their
  // receive buffer only: send, counts and displs are read on the root.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void scatterv(const Send &send, const std::vector<std::size_t> &counts, Recv &&recv, int root,
                std::vector<std::size_t> displs = {}) {
    auto [s, r] = detail::typed_pair(send, recv);
    const bool is_root = rank_ == root;
    if (is_root) check_root_blocks(counts, displs, r.size(), s.size(), "scatterv");
    check(mncl_scatterv(comm_, is_root ? s.data() : nullptr, is_root ? counts.data() : nullptr,
                        is_root ? displs.data() : nullptr, r.data(), r.size(), dtype<decltype(r)>(),
                        root, nullptr),
          "mncl_scatterv");
  }
  // send holds size() * recv.size() elements; rank r gets the reduction of block r.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void reduce_scatter(const Send &send, Recv &&recv, ReduceOp op = ReduceOp::kSum) {
    auto [s, r] = detail::typed_pair(send, recv);
    require(s.size() == r.size() * size_, "reduce_scatter",
            "the send buffer must hold size() * recv.size() elements");
    check(mncl_reduce_scatter(comm_, s.data(), r.data(), r.size(), dtype<decltype(r)>(), c_op(op),
                              nullptr),
          "mncl_reduce_scatter");
  }
  // Both buffers hold size() blocks; block j of rank i lands in block i of rank j.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void alltoall(const Send &send, Recv &&recv) {
    auto [s, r] = detail::typed_pair(send, recv);
    // size_ is 0 on an empty communicator (moved from, or MNCL_SPLIT_NONE): no division by it.
    require(valid(), "alltoall", "the communicator is empty (moved from, or not in a split)");
    require(s.size() == r.size() && s.size() % size_ == 0, "alltoall",
            "the buffers must be equal in size and hold size() equal blocks");
    check(mncl_alltoall(comm_, s.data(), r.data(), s.size() / size_, dtype<decltype(r)>(), nullptr),
          "mncl_alltoall");
  }
  // Blocks packed in order: displs[i] = counts[0] + ... + counts[i-1].
  static std::vector<std::size_t> packed_displs(const std::vector<std::size_t> &counts) {
    std::vector<std::size_t> displs(counts.size());
    for (std::size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
    return displs;
  }
  // Elements a buffer needs to hold every non-empty block.
  static std::size_t extent(const std::vector<std::size_t> &counts,
                            const std::vector<std::size_t> &displs) {
    std::size_t end = 0;
    for (std::size_t i = 0; i < counts.size() && i < displs.size(); ++i) {
      if (counts[i] != 0 && displs[i] + counts[i] > end) end = displs[i] + counts[i];
    }
    return end;
  }
  void barrier() { check(mncl_barrier(comm_, nullptr), "mncl_barrier"); }
  template <class Buffer, class = detail::EnableIfBuffer<Buffer>>
  void send(const Buffer &buffer, int peer) {
    auto buf = as_const_span(buffer);
    check(mncl_send(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), peer, nullptr),
          "mncl_send");
  }
  template <class Buffer, class = detail::EnableIfBuffer<Buffer>>
  void recv(Buffer &&buffer, int peer) {
    auto buf = as_span(buffer);
    check(mncl_recv(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), peer, nullptr),
          "mncl_recv");
  }
  // MPI_Sendrecv: sends `send` to dest while receiving `recv` from source (dest and source
  // may be the same rank, never this one). Both run at once, so a ring shift
  // (sendrecv(x, rank + 1, y, rank - 1) on every rank) cannot deadlock, on any backend.
  template <class Send, class Recv, class = detail::EnableIfBuffer<Send>,
            class = detail::EnableIfBuffer<Recv>>
  void sendrecv(const Send &send, int dest, Recv &&recv, int source) {
    auto [s, r] = detail::typed_pair(send, recv);
    check(mncl_sendrecv(comm_, s.data(), s.size(), dest, r.data(), r.size(), source,
                        dtype<decltype(r)>(), nullptr),
          "mncl_sendrecv");
  }
  // Sends and receives to and from any peers, started together and finished together (NCCL's
  // group of ncclSend/ncclRecv, PyTorch's batch_isend_irecv): a halo exchange, or a pipeline
  // stage sending activations forward while receiving gradients back. Ops match their peers'
  // send/recv in order, as send() and recv() do; receive buffers must not overlap each other
  // or a send buffer of the batch.
  //   comm.sendrecv_batch({mncl::isend_op(left, prev), mncl::isend_op(right, next),
  //                        mncl::irecv_op(halo_left, prev), mncl::irecv_op(halo_right, next)});
  void sendrecv_batch(Span<const P2POp> ops) {
    check(mncl_sendrecv_batch(comm_, c_ops(ops), ops.size(), nullptr), "mncl_sendrecv_batch");
  }
  void sendrecv_batch(std::initializer_list<P2POp> ops) {
    sendrecv_batch(Span<const P2POp>(ops.begin(), ops.size()));
  }
  // Several in-place allreduces of one type in one call (the backend may fuse them).
  template <class T>
  void allreduce_coalesced(const std::vector<Span<T>> &buffers, ReduceOp op = ReduceOp::kSum) {
    auto arrays = coalesced_arrays(buffers);
    check(mncl_allreduce_coalesced(comm_, arrays->sendbufs.data(), arrays->recvbufs.data(),
                                   arrays->counts.data(), buffers.size(), dtype_of<T>(), c_op(op),
                                   nullptr),
          "mncl_allreduce_coalesced");
  }

  // ------------------------------------------------------------------------------------------
  // Non-blocking forms: same rules, plus the buffers stay untouched until the Request ends.
  // ------------------------------------------------------------------------------------------

  // Each takes lvalues or views (Span) only: the overloads for temporary containers are
  // deleted, since the operation outlives the statement and such a buffer does not (keep the
  // data in a named variable until the Request ends).
  template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
  Request iallreduce(Buffer &&inout, ReduceOp op = ReduceOp::kSum) {
    auto buf = as_span(inout);
    mncl_request_t request = nullptr;
    check(mncl_iallreduce(comm_, buf.data(), buf.data(), buf.size(), dtype<decltype(buf)>(),
                          c_op(op), nullptr, &request),
          "mncl_iallreduce");
    return Request(request);
  }
  template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
  Request iallreduce(Buffer &&temporary, ReduceOp op = ReduceOp::kSum) = delete;
  template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
  Request ibcast(Buffer &&buffer, int root) {
    auto buf = as_span(buffer);
    mncl_request_t request = nullptr;
    check(
        mncl_ibcast(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), root, nullptr, &request),
        "mncl_ibcast");
    return Request(request);
  }
  template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
  Request ibcast(Buffer &&temporary, int root) = delete;
  template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
  Request isend(Buffer &&buffer, int peer) {
    auto buf = as_const_span(buffer);
    mncl_request_t request = nullptr;
    check(
        mncl_isend(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), peer, nullptr, &request),
        "mncl_isend");
    return Request(request);
  }
  template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
  Request isend(Buffer &&temporary, int peer) = delete;
  template <class Buffer, detail::EnableIfLastingBuffer<Buffer> = 0>
  Request irecv(Buffer &&buffer, int peer) {
    auto buf = as_span(buffer);
    mncl_request_t request = nullptr;
    check(
        mncl_irecv(comm_, buf.data(), buf.size(), dtype<decltype(buf)>(), peer, nullptr, &request),
        "mncl_irecv");
    return Request(request);
  }
  template <class Buffer, detail::EnableIfTemporaryBuffer<Buffer> = 0>
  Request irecv(Buffer &&temporary, int peer) = delete;
  template <class Send, class Recv,
            std::enable_if_t<detail::kIsBuffer<Send> && detail::kIsBuffer<Recv> &&
                                 !detail::kIsTemporaryContainer<Send> &&
                                 !detail::kIsTemporaryContainer<Recv>,
                             int> = 0>
  Request isendrecv(Send &&send, int dest, Recv &&recv, int source) {
    auto [s, r] = detail::typed_pair(send, recv);
    mncl_request_t request = nullptr;
    check(mncl_isendrecv(comm_, s.data(), s.size(), dest, r.data(), r.size(), source,
                         dtype<decltype(r)>(), nullptr, &request),
          "mncl_isendrecv");
    return Request(request);
  }
  template <class Send, class Recv,
            std::enable_if_t<detail::kIsBuffer<Send> && detail::kIsBuffer<Recv> &&
                                 (detail::kIsTemporaryContainer<Send> ||
                                  detail::kIsTemporaryContainer<Recv>),
                             int> = 0>
  Request isendrecv(Send &&send, int dest, Recv &&recv, int source) = delete;
  // One Request for the whole batch; the ops themselves are read during the call only.
  Request isendrecv_batch(Span<const P2POp> ops) {
    mncl_request_t request = nullptr;
    check(mncl_isendrecv_batch(comm_, c_ops(ops), ops.size(), nullptr, &request),
          "mncl_isendrecv_batch");
    return Request(request);
  }
  Request isendrecv_batch(std::initializer_list<P2POp> ops) {
    return isendrecv_batch(Span<const P2POp>(ops.begin(), ops.size()));
  }
  Request ibarrier() {
    mncl_request_t request = nullptr;
    check(mncl_ibarrier(comm_, nullptr, &request), "mncl_ibarrier");
    return Request(request);
  }
  template <class T>
  Request iallreduce_coalesced(const std::vector<Span<T>> &buffers, ReduceOp op = ReduceOp::kSum) {
    auto arrays = coalesced_arrays(buffers);
    mncl_request_t request = nullptr;
    check(mncl_iallreduce_coalesced(comm_, arrays->sendbufs.data(), arrays->recvbufs.data(),
                                    arrays->counts.data(), buffers.size(), dtype_of<T>(), c_op(op),
                                    nullptr, &request),
          "mncl_iallreduce_coalesced");
    return Request(request, std::move(arrays));  // the library may read the arrays later
  }

  // ------------------------------------------------------------------------------------------
  // Bytes and objects, in messages of at most max_message_bytes().
  // ------------------------------------------------------------------------------------------

  // The root's bytes onto every rank (others' contents are replaced).
  void bcast_bytes(std::vector<uint8_t> &bytes, int root) {
    uint64_t length = bytes.size();
    bcast(Span<uint64_t>(&length, 1), root);
    if (rank_ != root) bytes.resize(checked_length(length, "bcast_bytes"));
    for_each_chunk(bytes.size(), [&](std::size_t offset, std::size_t count) {
      bcast(Span<uint8_t>(bytes.data() + offset, count), root);
    });
  }
  void send_bytes(Span<const uint8_t> bytes, int peer) {
    const uint64_t length = bytes.size();
    send(Span<const uint64_t>(&length, 1), peer);
    for_each_chunk(bytes.size(), [&](std::size_t offset, std::size_t count) {
      send(bytes.subspan(offset, count), peer);
    });
  }
  std::vector<uint8_t> recv_bytes(int peer) {
    uint64_t length = 0;
    recv(Span<uint64_t>(&length, 1), peer);
    std::vector<uint8_t> bytes(checked_length(length, "recv_bytes"));
    for_each_chunk(bytes.size(), [&](std::size_t offset, std::size_t count) {
      recv(Span<uint8_t>(bytes.data() + offset, count), peer);
    });
    return bytes;
  }

  // The root's object onto every rank. If the root cannot serialize it, it throws the reason
  // and every other rank RemoteError, together (a flag travels with the length, as in
  // scatter_obj), instead of the others waiting out the timeout for bytes that never come.
  template <class T>
  void bcast_obj(T &obj, int root = 0) {
    std::vector<uint8_t> bytes;
    std::exception_ptr failure;
    if (rank_ == root) {
      try {
        bytes = to_bytes(obj);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    std::array<uint64_t, 2> announced{bytes.size(), failure ? 1u : 0u};  // length, flag
    bcast(announced, root);
    if (failure) std::rethrow_exception(failure);
    if (announced[1] != 0) {
      throw RemoteError("bcast_obj: root " + std::to_string(root) +
                        " could not serialize the object (it throws the reason)");
    }
    if (rank_ != root) bytes.resize(checked_length(announced[0], "bcast_obj"));
    for_each_chunk(bytes.size(), [&](std::size_t offset, std::size_t count) {
      bcast(Span<uint8_t>(bytes.data() + offset, count), root);
    });
    decoded_everywhere("bcast_obj", [&] {
      if (rank_ != root) from_bytes(Span<const uint8_t>(bytes), obj);
    });
  }
  // An object that does not serialize throws here, and recv_obj on the peer RemoteError (an
  // impossible length is sent in its place), instead of the peer waiting out the timeout.
  template <class T>
  void send_obj(const T &obj, int peer) {
    std::vector<uint8_t> bytes;
    try {
      bytes = to_bytes(obj);
    } catch (...) {
      const uint64_t failed = kFailedLength;
      send(Span<const uint64_t>(&failed, 1), peer);
      throw;
    }
    send_bytes(bytes, peer);
  }
  template <class T>
  T recv_obj(int peer) {
    const auto bytes = recv_bytes(peer);
    return from_bytes<T>(bytes);
  }
  // Every rank's object on `root`, in rank order; an empty vector elsewhere. As allgather_obj,
  // but the rounds are gathervs to the root (so, as scatter_obj, it needs a backend with the
  // v-collectives: plugin ABI v3 or later, as every bundled one).
  template <class T>
  std::vector<T> gather_obj(const T &obj, int root = 0) {
    std::vector<uint8_t> mine;
    const ObjectLayout layout = serialized_everywhere(obj, mine, "gather_obj");
    std::vector<uint8_t> all(rank_ == root ? layout.total : 0);
    std::vector<std::size_t> counts(size_), displs(size_);
    for_each_chunk(layout.longest, [&](std::size_t offset, std::size_t chunk) {
      layout.round(offset, chunk, counts, displs);
      const std::size_t sent = std::min(offset, mine.size());
      gatherv(Span<const uint8_t>(mine.data() + sent, counts[rank_]), all, counts, root, displs);
    });
    std::vector<T> objects;
    decoded_everywhere("gather_obj", [&] {
      if (rank_ == root) objects = layout.objects<T>(all);
    });
    return objects;
  }
  // Every rank's object on every rank, in rank order. The byte lengths travel first (one
  // allgather), then the bytes themselves in allgatherv rounds: in each, every rank sends the
  // next at most max_message_bytes() of its bytes (0 once it has sent them all); the longest
  // length sets the number of rounds, the same on every rank.
  template <class T>
  std::vector<T> allgather_obj(const T &obj) {
    std::vector<uint8_t> mine;
    const ObjectLayout layout = serialized_everywhere(obj, mine, "allgather_obj");
    std::vector<uint8_t> all(layout.total);
    std::vector<std::size_t> counts(size_), displs(size_);
    for_each_chunk(layout.longest, [&](std::size_t offset, std::size_t chunk) {
      layout.round(offset, chunk, counts, displs);
      const std::size_t sent = std::min(offset, mine.size());
      allgatherv(Span<const uint8_t>(mine.data() + sent, counts[rank_]), all, counts, displs);
    });
    std::vector<T> objects;
    decoded_everywhere("allgather_obj", [&] { objects = layout.objects<T>(all); });
    return objects;
  }
  // Rank r gets objs[r] of the root (objs is ignored elsewhere); only each rank's part is sent:
  // the root broadcasts the byte lengths, then scatterv rounds as in allgather_obj. If the root
  // cannot (objs of the wrong size, an object that does not serialize) it throws the reason and
  // every other rank RemoteError, together: a flag travels with the lengths.
  template <class T>
  T scatter_obj(const std::vector<T> &objs, int root = 0) {
    std::vector<uint64_t> announced(static_cast<std::size_t>(size_) + 1);  // lengths, flag
    std::vector<uint8_t> all;
    std::exception_ptr failure;
    if (rank_ == root) {
      try {
        require(objs.size() == static_cast<std::size_t>(size_), "scatter_obj",
                "the root must pass one object per rank");
        for (int r = 0; r < size_; ++r) {
          const auto bytes = to_bytes(objs[r]);
          announced[r] = bytes.size();
          all.insert(all.end(), bytes.begin(), bytes.end());
        }
      } catch (...) {
        failure = std::current_exception();
        std::fill(announced.begin(), announced.end(), 0);
        announced.back() = 1;
      }
    }
    bcast(announced, root);
    if (failure) std::rethrow_exception(failure);
    if (announced.back() != 0) {
      throw RemoteError("scatter_obj: root " + std::to_string(root) +
                        " could not provide the objects (it throws the reason)");
    }
    announced.pop_back();
    const ObjectLayout layout = object_layout(announced, "scatter_obj");
    std::vector<uint8_t> mine(layout.lengths[rank_]);
    std::vector<std::size_t> counts(size_), displs(size_);
    for_each_chunk(layout.longest, [&](std::size_t offset, std::size_t chunk) {
      layout.round(offset, chunk, counts, displs);
      const std::size_t got = std::min(offset, mine.size());
      scatterv(Span<const uint8_t>(all), counts, Span<uint8_t>(mine.data() + got, counts[rank_]),
               root, displs);
    });
    T object{};
    decoded_everywhere("scatter_obj", [&] { from_bytes(Span<const uint8_t>(mine), object); });
    return object;
  }
  // combine(...combine(combine(obj_0, obj_1), obj_2)..., obj_{size-1}) on every rank: the fold
  // runs once, on rank 0, in rank order, so every rank gets the identical result.
  // A combine that throws on rank 0 throws there and RemoteError everywhere else, together.
  template <class T, class Combine = std::plus<>>
  T allreduce_obj(const T &obj, Combine combine = {}) {
    const auto all = gather_obj(obj, 0);
    T result{};
    std::exception_ptr failure;
    if (rank_ == 0) {
      try {
        result = all.front();
        for (std::size_t i = 1; i < all.size(); ++i) result = combine(result, all[i]);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    uint64_t failed = failure ? 1 : 0;
    bcast(Span<uint64_t>(&failed, 1), 0);
    if (failure) std::rethrow_exception(failure);
    if (failed) {
      throw RemoteError(
          "allreduce_obj: rank 0 could not combine the objects (it throws the "
          "reason)");
    }
    bcast_obj(result, 0);
    return result;
  }

 private:
  Communicator(mncl_comm_t handle, std::size_t max_message_bytes,
               std::optional<std::string> group_path)
      : comm_(handle), max_message_bytes_(max_message_bytes), group_path_(std::move(group_path)) {
    if (comm_) query_rank_and_size();
  }

  // The path of the group that split(color) makes here (counting the split either way).
  std::optional<std::string> child_path(int color) {
    const uint64_t index = splits_++;
    if (!group_path_) return std::nullopt;
    return *group_path_ + "s" + std::to_string(index) + "c" + std::to_string(color);
  }

  static mncl_config_t split_config(const SplitOptions &options) {
    mncl_config_t config = MNCL_CONFIG_INIT;  // rank, size, bootstrap stay -1 / NULL
    config.backend = options.backend.empty() ? nullptr : options.backend.c_str();
    config.timeout_ms = options.timeout_ms;
    config.device = options.device;
    return config;
  }
  Communicator split_by_type(mncl_split_type_t type, int key, const SplitOptions &options) {
    const mncl_config_t config = split_config(options);
    ++splits_;  // (the split's group is not known here: no path for it)
    mncl_comm_t child = nullptr;
    check(mncl_comm_split_type(comm_, type, key, &config, &child), "mncl_comm_split_type");
    return Communicator(child, max_message_bytes_, std::nullopt);
  }

  // Called from constructors, where a throw skips the destructor: the handle is freed here.
  void query_rank_and_size() {
    try {
      check(mncl_comm_rank(comm_, &rank_), "mncl_comm_rank");
      check(mncl_comm_size(comm_, &size_), "mncl_comm_size");
    } catch (...) {
      // Aborted first: the peers, fine or not, may never reach this destroy.
      (void)mncl_comm_abort(comm_);
      (void)mncl_comm_destroy(std::exchange(comm_, nullptr));
      throw;
    }
  }

  void release() noexcept {
    if (!comm_) return;
    // Unwinding from an error: the peers may never reach the collective destroy, so do not
    // wait the full timeout for them.
    if (std::uncaught_exceptions() > 0) (void)mncl_comm_abort(comm_);
    (void)mncl_comm_destroy(std::exchange(comm_, nullptr));
  }

  template <class SpanType>
  static constexpr mncl_dtype_t dtype() {
    return dtype_of<typename SpanType::value_type>();
  }
  static mncl_op_t c_op(ReduceOp op) { return static_cast<mncl_op_t>(op); }
  static const mncl_p2p_op_t *c_ops(Span<const P2POp> ops) noexcept {
    return ops.empty() ? nullptr : &ops[0].c_op();
  }

  static void require(bool ok, const char *what, const char *message) {
    if (!ok) throw InvalidArgument(std::string(what) + ": " + message);
  }

  std::size_t checked_length(uint64_t length, const char *what) const {
    if (length == kFailedLength) {
      throw RemoteError(std::string(what) +
                        ": the peer could not serialize its object (it "
                        "throws the reason)");
    }
    if (length > static_cast<uint64_t>(SIZE_MAX / 2)) {
      throw RemoteError(std::string(what) + ": a peer announced an impossible length of " +
                        std::to_string(length) + " bytes");
    }
    return static_cast<std::size_t>(length);
  }
  // Sent in place of a length by a rank whose object does not serialize.
  static constexpr uint64_t kFailedLength = ~uint64_t{0};

  // "rank 2" or "ranks 1, 3" of those whose flag is set.
  static std::string ranks_flagged(const std::vector<uint64_t> &flags) {
    std::string ranks;
    int count = 0;
    for (std::size_t r = 0; r < flags.size(); ++r) {
      if (!flags[r]) continue;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
    return (count == 1 ? "rank " : "ranks ") + ranks;
  }

  // Runs `decode` (this rank's deserialization) and then agrees, in one allgather, whether
  // every rank managed: one that could not throws its reason, the others RemoteError naming it,
  // instead of the others returning and meeting that rank in some later collective.
  template <class Decode>
  void decoded_everywhere(const char *what, Decode &&decode) {
    std::exception_ptr failure;
    try {
      decode();
    } catch (...) {
      failure = std::current_exception();
    }
    const std::vector<uint64_t> failed = allgather(std::vector<uint64_t>{failure ? 1u : 0u});
    if (failure) std::rethrow_exception(failure);
    if (std::find(failed.begin(), failed.end(), 1u) != failed.end()) {
      throw RemoteError(std::string(what) + ": " + ranks_flagged(failed) +
                        " could not decode what it received (its own error says what)");
    }
  }

  // The root's side of gatherv / scatterv: displs default to packed blocks; one count and one
  // displacement per rank; its own block (gatherv's send, scatterv's receive buffer) holds
  // counts[root] elements, and the other buffer every block.
  void check_root_blocks(const std::vector<std::size_t> &counts, std::vector<std::size_t> &displs,
                         std::size_t own_size, std::size_t blocks_size, const char *what) const {
    if (displs.empty()) displs = packed_displs(counts);
    require(counts.size() == static_cast<std::size_t>(size_) && displs.size() == counts.size(),
            what, "the root's counts and displs need one entry per rank");
    require(own_size == counts[rank_], what,
            "the root's own buffer must hold counts[root] elements");
    require(blocks_size >= extent(counts, displs), what,
            "the root's buffer of blocks must hold every block (displs[i] + counts[i] elements)");
  }

  // Serialized objects of every rank, concatenated in rank order: where each one sits, and the
  // blocks of one round (at most `chunk` bytes of each object, from byte `offset` on).
  struct ObjectLayout {
    std::vector<std::size_t> lengths, offsets;
    std::size_t total = 0, longest = 0;

    void round(std::size_t offset, std::size_t chunk, std::vector<std::size_t> &counts,
               std::vector<std::size_t> &displs) const {
      for (std::size_t r = 0; r < lengths.size(); ++r) {
        const std::size_t done = std::min(offset, lengths[r]);
        counts[r] = std::min(chunk, lengths[r] - done);
        displs[r] = offsets[r] + done;
      }
    }
    template <class T>
    std::vector<T> objects(const std::vector<uint8_t> &all) const {
      std::vector<T> objs;
      objs.reserve(lengths.size());
      for (std::size_t r = 0; r < lengths.size(); ++r) {
        objs.push_back(from_bytes<T>(Span<const uint8_t>(all.data() + offsets[r], lengths[r])));
      }
      return objs;
    }
  };
  ObjectLayout object_layout(const std::vector<uint64_t> &announced, const char *what) const {
    ObjectLayout layout;
    for (uint64_t length : announced) {
      const std::size_t n = checked_length(length, what);
      layout.lengths.push_back(n);
      layout.offsets.push_back(layout.total);
      layout.total = checked_length(uint64_t{layout.total} + n, what);
      layout.longest = std::max(layout.longest, n);
    }
    return layout;
  }

  // This rank's object serialized into `mine`, and every rank's length (one allgather): a rank
  // whose object does not serialize throws the reason, the others RemoteError naming it.
  template <class T>
  ObjectLayout serialized_everywhere(const T &obj, std::vector<uint8_t> &mine, const char *what) {
    std::exception_ptr failure;
    try {
      mine = to_bytes(obj);
    } catch (...) {
      failure = std::current_exception();
    }
    std::vector<uint64_t> lengths =
        allgather(std::vector<uint64_t>{failure ? kFailedLength : uint64_t{mine.size()}});
    if (failure) std::rethrow_exception(failure);
    std::vector<uint64_t> failed(lengths.size());
    for (std::size_t r = 0; r < lengths.size(); ++r) failed[r] = lengths[r] == kFailedLength;
    if (std::find(failed.begin(), failed.end(), 1u) != failed.end()) {
      throw RemoteError(std::string(what) + ": " + ranks_flagged(failed) +
                        " could not serialize its object (its own error says what)");
    }
    return object_layout(lengths, what);
  }

  template <class Fn>
  void for_each_chunk(std::size_t total, Fn &&fn) const {
    for (std::size_t offset = 0; offset < total; offset += max_message_bytes_) {
      fn(offset, std::min(max_message_bytes_, total - offset));
    }
  }

  struct CoalescedArrays {
    std::vector<const void *> sendbufs;
    std::vector<void *> recvbufs;
    std::vector<std::size_t> counts;
  };
  template <class T>
  static std::shared_ptr<CoalescedArrays> coalesced_arrays(const std::vector<Span<T>> &buffers) {
    static_assert(!std::is_const_v<T>, "coalesced allreduce works in place: use Span<T>");
    auto arrays = std::make_shared<CoalescedArrays>();
    for (const auto &buffer : buffers) {
      arrays->sendbufs.push_back(buffer.data());
      arrays->recvbufs.push_back(buffer.data());
      arrays->counts.push_back(buffer.size());
    }
    return arrays;
  }

  mncl_comm_t comm_ = nullptr;
  struct HostInfo {
    int local_rank = 0, local_size = 0, host_index = 0, num_hosts = 0;
  };
  HostInfo host_info() const {
    HostInfo info;
    check(mncl_comm_host_info(comm_, &info.local_rank, &info.local_size, &info.host_index,
                              &info.num_hosts),
          "mncl_comm_host_info");
    return info;
  }

  int rank_ = 0;
  int size_ = 0;
  std::size_t max_message_bytes_ = kDefaultMaxMessageBytes;
  std::optional<std::string> group_path_;  // see group_path()
  uint64_t splits_ = 0;                    // splits made from this communicator so far
};

}  // namespace mncl

#endif  // MNCL_FRONTENDS_COMMUNICATOR_HPP
