// flat's point-to-point receives when the sender's count disagrees with the receiver's: under
// mpirun with MNCL_BACKEND=flat (bounded or not), mncl_recv, mncl_sendrecv and
// mncl_sendrecv_batch, the message longer and shorter than its receive, small enough for MPI to
// send eagerly and large enough for its rendezvous protocol (where Open MPI 4.1's shared-memory
// transport writes a longer message past the end of the receive buffer before it reports the
// truncation: flat must never let a call that waits for its own receives do so). The receiving
// rank must fail with MNCL_ERR_REMOTE naming the sender, write nothing outside its buffer, and
// the sender must complete; a correct exchange on the same communicator must work afterwards.
// Also checked, with correct counts: a batch with several receives from one peer fills them in
// the batch's order (flat matches each peer's messages in order), and mncl_irecv, which keeps
// MPI's plain receive, still gets its data and reports a shorter message; a blocking receive
// behind a pending mncl_irecv from the same peer gets the later message. With --stall: a blocking
// sendrecv whose peer never calls ends with MNCL_ERR_TIMEOUT, a blocking recv with
// MNCL_ERR_ABORTED when another thread aborts the communicator (not a hang: flat runs blocking
// point to point polled, bounded by the timeout and the abort).
#include <mncl/mncl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "mismatch_harness.h"

namespace {

using flat_test::fail;
using flat_test::kGuard;
using flat_test::kGuards;

std::vector<int32_t> message(size_t count, int from, int salt) {
  std::vector<int32_t> m(count);
  for (size_t k = 0; k < count; ++k) m[k] = static_cast<int32_t>(1000000 * from + 1000 * salt + k);
  return m;
}

// The receiver's side of one exchange: the status it wants, the data and the guards.
void check_received(int rank, const std::string &name, mncl_status_t st, int sender,
                    const std::vector<int32_t> &buf, size_t count, size_t sent, int salt) {
  const std::string error = st == MNCL_OK ? "" : mncl_last_error();
  if (sent == count) {
    if (st != MNCL_OK) fail(rank, name + ": failed: " + error);
  } else if (st != MNCL_ERR_REMOTE) {
    fail(rank, name + ": got " + mncl_status_string(st) + " (" + error + "), want MNCL_ERR_REMOTE");
  } else if (error.find("rank " + std::to_string(sender)) == std::string::npos) {
    fail(rank, name + ": the error does not name rank " + std::to_string(sender) + ": " + error);
  } else if (rank == 0) {
    std::printf("%s: %s\n", name.c_str(), error.c_str());
  }
  const std::vector<int32_t> want = message(count, sender, salt);
  for (size_t k = 0; st == MNCL_OK && k < count; ++k) {
    if (buf[k] != want[k]) {
      fail(rank, name + ": element " + std::to_string(k) + " is wrong");
      break;
    }
  }
  for (size_t k = count; k < buf.size(); ++k) {
    if (buf[k] != kGuard) {
      fail(rank, name + ": element " + std::to_string(k) + " past the receive overwritten");
      break;
    }
  }
}

// One int32 op of a batch.
mncl_p2p_op_t p2p_op(mncl_p2p_kind_t kind, int peer, void *buf, size_t count) {
  mncl_p2p_op_t op = {};
  op.struct_size = sizeof(mncl_p2p_op_t);
  op.kind = kind;
  op.peer = peer;
  op.dtype = MNCL_INT32;
  op.buf = buf;
  op.count = count;
  return op;
}

enum class Form { kRecv, kSendrecv, kBatch };

const char *form_name(Form f) {
  return f == Form::kRecv ? "send/recv" : f == Form::kSendrecv ? "sendrecv" : "sendrecv_batch";
}

// Rank 1 sends `sent` elements to rank 0, which receives `count`; with sendrecv / batch, rank 0
// sends a correct message back at the same time. Other ranks stay out.
void exchange(mncl_comm_t comm, int rank, Form form, size_t count, size_t sent, int salt) {
  const std::string name = std::string(form_name(form)) + ", " + std::to_string(sent) +
                           " elements sent, " + std::to_string(count) + " expected";
  if (rank > 1) return;
  const std::vector<int32_t> out = message(rank == 1 ? sent : count, rank, salt);
  std::vector<int32_t> in(count + kGuards, kGuard);
  const int peer = 1 - rank;
  mncl_status_t st = MNCL_OK;
  switch (form) {
    case Form::kRecv:
      st = rank == 1 ? mncl_send(comm, out.data(), sent, MNCL_INT32, 0, nullptr)
                     : mncl_recv(comm, in.data(), count, MNCL_INT32, 1, nullptr);
      break;
    case Form::kSendrecv:
      st = mncl_sendrecv(comm, out.data(), out.size(), peer, in.data(), count, peer, MNCL_INT32,
                         nullptr);
      break;
    case Form::kBatch: {
      const mncl_p2p_op_t ops[2] = {
          p2p_op(MNCL_P2P_RECV, peer, in.data(), count),
          p2p_op(MNCL_P2P_SEND, peer, const_cast<int32_t *>(out.data()), out.size())};
      st = mncl_sendrecv_batch(comm, ops, 2, nullptr);
      break;
    }
  }
  if (rank == 0) {
    check_received(rank, name, st, 1, in, count, sent, salt);
  } else if (form == Form::kRecv) {
    if (st != MNCL_OK) fail(rank, name + ": the sender failed: " + mncl_last_error());
  } else {
    check_received(rank, name + " (the correct direction)", st, 0, in, count, count, salt);
  }
}

// A batch receiving three messages of different sizes from one peer, interleaved with a send:
// each lands in its own buffer, in the batch's order.
void same_peer_batch(mncl_comm_t comm, int rank, int salt) {
  if (rank > 1) return;
  const int peer = 1 - rank;
  const size_t sizes[3] = {5, 70000, 0};
  std::vector<std::vector<int32_t>> out(3), in(3);
  std::vector<mncl_p2p_op_t> ops;
  for (int i = 0; i < 3; ++i) {
    out[i] = message(sizes[i], rank, salt + i);
    in[i].assign(sizes[i] + kGuards, kGuard);
    ops.push_back(p2p_op(MNCL_P2P_RECV, peer, in[i].data(), sizes[i]));
    ops.push_back(p2p_op(MNCL_P2P_SEND, peer, out[i].data(), sizes[i]));
  }
  const mncl_status_t st = mncl_sendrecv_batch(comm, ops.data(), ops.size(), nullptr);
  for (int i = 0; i < 3; ++i) {
    check_received(rank, "batch of three receives from one peer, receive " + std::to_string(i), st,
                   peer, in[i], sizes[i], sizes[i], salt + i);
  }
}

// Rank 0 receives two messages each from ranks 1 and 2 in one batch, interleaved by peer
// (2, 1, 2, 1): each fills its own buffer in the batch's order per peer. mismatched: the first
// message from each of them is 3 elements longer, and the error must name op 0 (rank 2's),
// the first mismatched op in array order, whatever order flat matched them in.
void two_peer_batch(mncl_comm_t comm, int rank, bool mismatched, int salt) {
  if (rank > 2) return;
  const std::string name =
      std::string("batch receiving from ranks 2, 1, 2, 1") + (mismatched ? ", mismatched" : "");
  const int peers[4] = {2, 1, 2, 1};
  const size_t counts[4] = {6, 60000, 60000, 3};
  if (rank != 0) {
    for (int i = 0; i < 4; ++i) {
      if (peers[i] != rank) continue;
      const bool longer = mismatched && (i == 0 || i == 1);
      const std::vector<int32_t> out = message(counts[i] + (longer ? 3 : 0), rank, salt + i);
      if (mncl_send(comm, out.data(), out.size(), MNCL_INT32, 0, nullptr) != MNCL_OK) {
        fail(rank, name + ": a sender failed: " + mncl_last_error());
      }
    }
    return;
  }
  std::vector<std::vector<int32_t>> in(4);
  std::vector<mncl_p2p_op_t> ops;
  for (int i = 0; i < 4; ++i) {
    in[i].assign(counts[i] + kGuards, kGuard);
    ops.push_back(p2p_op(MNCL_P2P_RECV, peers[i], in[i].data(), counts[i]));
  }
  const mncl_status_t st = mncl_sendrecv_batch(comm, ops.data(), ops.size(), nullptr);
  if (mismatched) {
    const std::string error = st == MNCL_OK ? "" : mncl_last_error();
    if (st != MNCL_ERR_REMOTE || error.find("op 0") == std::string::npos ||
        error.find("rank 2") == std::string::npos) {
      fail(rank, name + ": got " + mncl_status_string(st) + " (" + error +
                     "), want MNCL_ERR_REMOTE naming op 0 and rank 2");
    } else {
      std::printf("%s: %s\n", name.c_str(), error.c_str());
    }
  }
  for (int i = 0; i < 4; ++i) {
    const std::string what = name + ", op " + std::to_string(i);
    if (mismatched && (i == 0 || i == 1)) {  // nothing written past the receive
      for (size_t k = counts[i]; k < in[i].size(); ++k) {
        if (in[i][k] != kGuard)
          fail(rank, what + ": element " + std::to_string(k) + " overwritten");
      }
    } else {  // the correct ops received their data all the same
      check_received(rank, what, mismatched ? MNCL_OK : st, peers[i], in[i], counts[i], counts[i],
                     salt + i);
    }
  }
}

// A blocking receive behind a pending mncl_irecv from the same peer: the irecv (posted first)
// gets the first message, a rendezvous-sized one, the blocking receive the second.
void irecv_then_recv(mncl_comm_t comm, int rank, int salt) {
  const std::string name = "blocking recv behind a pending irecv";
  const size_t first = 100000, second = 8;
  if (rank == 1) {
    const std::vector<int32_t> a = message(first, rank, salt), b = message(second, rank, salt + 1);
    if (mncl_send(comm, a.data(), first, MNCL_INT32, 0, nullptr) != MNCL_OK ||
        mncl_send(comm, b.data(), second, MNCL_INT32, 0, nullptr) != MNCL_OK) {
      fail(rank, name + ": the sender failed: " + mncl_last_error());
    }
  } else if (rank == 0) {
    std::vector<int32_t> a(first + kGuards, kGuard), b(second + kGuards, kGuard);
    mncl_request_t request = nullptr;
    mncl_status_t st = mncl_irecv(comm, a.data(), first, MNCL_INT32, 1, nullptr, &request);
    const mncl_status_t st_b =
        st == MNCL_OK ? mncl_recv(comm, b.data(), second, MNCL_INT32, 1, nullptr) : st;
    if (st == MNCL_OK) st = mncl_wait(request, 60000);
    check_received(rank, name + " (the irecv)", st, 1, a, first, first, salt);
    check_received(rank, name + " (the recv)", st_b, 1, b, second, second, salt + 1);
  }
}

// --stall: rank 1 never takes part; rank 0's blocking calls must end with the timeout (a
// communicator of its own with a 1 s timeout) and with an abort from another thread.
int stall() {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.timeout_ms = 1000;
  mncl_comm_t world = nullptr, bounded = nullptr, aborted = nullptr;
  int rank = -1;
  if (mncl_comm_create(nullptr, &world) != MNCL_OK || mncl_comm_rank(world, &rank) != MNCL_OK ||
      mncl_comm_create(&config, &bounded) != MNCL_OK ||
      mncl_comm_split(world, 0, rank, &aborted) != MNCL_OK) {
    std::fprintf(stderr, "rank %d: communicators: %s\n", rank, mncl_last_error());
    return 1;
  }
  if (rank == 0) {
    std::vector<int32_t> out = message(8, rank, 1), in(8 + kGuards, kGuard);
    mncl_status_t st =
        mncl_sendrecv(bounded, out.data(), 8, 1, in.data(), 8, 1, MNCL_INT32, nullptr);
    if (st != MNCL_ERR_TIMEOUT) {
      fail(rank, std::string("sendrecv with a silent peer: got ") + mncl_status_string(st) +
                     ", want MNCL_ERR_TIMEOUT: " + (st == MNCL_OK ? "" : mncl_last_error()));
    } else {
      std::printf("sendrecv with a silent peer: %s\n", mncl_last_error());
    }
    std::thread aborter([aborted] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      mncl_comm_abort(aborted);
    });
    st = mncl_recv(aborted, in.data(), 8, MNCL_INT32, 1, nullptr);
    aborter.join();
    if (st != MNCL_ERR_ABORTED) {
      fail(rank, std::string("recv from a silent peer, aborted: got ") + mncl_status_string(st) +
                     ", want MNCL_ERR_ABORTED");
    }
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k] != kGuard) fail(rank, "a failed receive wrote its buffer");
    }
  }
  // In step again on the world communicator (default timeout), then done.
  if (mncl_barrier(world, nullptr) != MNCL_OK) {
    fail(rank, std::string("barrier: ") + mncl_last_error());
  }
  mncl_comm_destroy(aborted);
  mncl_comm_destroy(bounded);
  mncl_comm_destroy(world);
  std::printf("rank %d: stall cases, %d failures\n", rank, flat_test::g_failures);
  return flat_test::g_failures == 0 ? 0 : 1;
}

// mncl_irecv keeps MPI's plain receive: a correct message, then a shorter one (REMOTE).
void irecv(mncl_comm_t comm, int rank, size_t count, size_t sent, int salt) {
  const std::string name =
      "irecv, " + std::to_string(sent) + " elements sent, " + std::to_string(count) + " expected";
  if (rank == 1) {
    const std::vector<int32_t> out = message(sent, rank, salt);
    if (mncl_send(comm, out.data(), sent, MNCL_INT32, 0, nullptr) != MNCL_OK) {
      fail(rank, name + ": the sender failed: " + mncl_last_error());
    }
  } else if (rank == 0) {
    std::vector<int32_t> in(count + kGuards, kGuard);
    mncl_request_t request = nullptr;
    mncl_status_t st = mncl_irecv(comm, in.data(), count, MNCL_INT32, 1, nullptr, &request);
    if (st == MNCL_OK) st = mncl_wait(request, 60000);
    check_received(rank, name, st, 1, in, count, sent, salt);
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::string(argv[1]) == "--stall") {
    return stall();
  }
  mncl_comm_t comm = nullptr;
  int rank = -1, size = -1, exit_code = 0;
  if (!flat_test::open_world("p2p_mismatch_test", &comm, &rank, &size, &exit_code)) {
    return exit_code;
  }
  int salt = 0, cases = 0;
  for (const size_t count : {size_t{8}, size_t{100000}}) {  // 32 B (eager) and 400 KB
    for (const Form form : {Form::kRecv, Form::kSendrecv, Form::kBatch}) {
      for (const size_t sent : {count + 3, count - 3}) {
        exchange(comm, rank, form, count, sent, ++salt);
        exchange(comm, rank, form, count, count, ++salt);  // in step afterwards
        cases += 2;
      }
    }
    irecv(comm, rank, count, count, ++salt);
    irecv(comm, rank, count, count - 3, ++salt);
    same_peer_batch(comm, rank, salt += 10);
    cases += 3;
  }
  irecv_then_recv(comm, rank, salt += 10);
  ++cases;
  if (size >= 3) {
    two_peer_batch(comm, rank, false, salt += 10);
    two_peer_batch(comm, rank, true, salt += 10);
    two_peer_batch(comm, rank, false, salt += 10);  // in step afterwards
    cases += 3;
  }
  // Every rank, the ones left out of the exchanges included, ends on a collective.
  if (mncl_barrier(comm, nullptr) != MNCL_OK)
    fail(rank, std::string("barrier: ") + mncl_last_error());
  mncl_comm_destroy(comm);
  std::printf("rank %d: %d exchanges, %d failures\n", rank, cases, flat_test::g_failures);
  return flat_test::g_failures == 0 ? 0 : 1;
}
