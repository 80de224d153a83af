// mncl-bench-nccl: allreduce through MNCL's nccl backend vs. raw NCCL, same buffers, same run.
//
//   mncl-run -n <GPUs> -- mncl-bench-nccl [--min-bytes 8] [--max-bytes 1Gi] [--rounds 5]
//
// float32 SUM, out of place, on the GPU of the local rank, on one stream. Per size and round,
// each side enqueues `iters` back-to-back calls and synchronizes the stream; the time per call
// is the slowest rank's. Rounds alternate the sides so drifting clocks hit both alike; the
// report gives the median over rounds and the ratio MNCL / raw (1.00 = no overhead). The raw
// communicator's unique id travels through MNCL (a bcast of host memory).
#include <cuda_runtime_api.h>
#include <mncl/mncl.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/parse_size.h"

namespace {

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "mncl-bench-nccl: %s\n", what.c_str());
  std::exit(1);
}
void check(mncl_status_t st, const char *what) {
  if (st != MNCL_OK)
    die(std::string(what) + ": " + mncl_status_string(st) + ": " + mncl_last_error());
}
void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

std::string human(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 30))
    std::snprintf(buf, sizeof buf, "%zuGi", bytes >> 30);
  else if (bytes >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%zuMi", bytes >> 20);
  else if (bytes >= (1u << 10))
    std::snprintf(buf, sizeof buf, "%zuKi", bytes >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu", bytes);
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
  size_t min_bytes = 8, max_bytes = size_t{1} << 30;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    try {
      if (a == "--min-bytes" && i + 1 < argc)
        min_bytes = mncl::bench::parse_size(argv[++i]);
      else if (a == "--max-bytes" && i + 1 < argc)
        max_bytes = mncl::bench::parse_size(argv[++i]);
      else if (a == "--rounds" && i + 1 < argc)
        rounds = mncl::bench::parse_number<int>(argv[++i], 1, 1 << 20);
      else
        die("usage: mncl-bench-nccl [--min-bytes N] [--max-bytes N] [--rounds N]");
    } catch (const std::invalid_argument &e) {
      die(a + ": " + e.what());
    }
  }
  setenv("MNCL_BACKEND", "nccl", 0);  // the comparison is about this backend
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) die("no CUDA device");
  const char *local = std::getenv("MNCL_LOCAL_RANK");
  const int device = (local ? std::atoi(local) : 0) % count;
  check(cudaSetDevice(device), "cudaSetDevice");

  mncl_comm_t comm = nullptr;
  check(mncl_comm_create(nullptr, &comm), "mncl_comm_create");
  int rank = 0, size = 1;
  mncl_comm_rank(comm, &rank);
  mncl_comm_size(comm, &size);
  ncclUniqueId id;
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check(mncl_bcast(comm, &id, sizeof id, MNCL_UINT8, 0, nullptr), "mncl_bcast (NCCL id)");
  ncclComm_t raw = nullptr;
  check(ncclCommInitRank(&raw, size, id, rank), "ncclCommInitRank");

  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  void *send = nullptr, *recv = nullptr;
  check(cudaMalloc(&send, max_bytes), "cudaMalloc");
  check(cudaMalloc(&recv, max_bytes), "cudaMalloc");
  check(cudaMemset(send, 0, max_bytes), "cudaMemset");

  // Seconds per call of `iters` back-to-back calls, the slowest rank's.
  auto timed = [&](auto &&one, int iters) {
    check(mncl_barrier(comm, nullptr), "mncl_barrier");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) one();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    check(mncl_allreduce(comm, &s, &s, 1, MNCL_FLOAT64, MNCL_MAX, nullptr), "mncl_allreduce");
    return s;
  };

  if (rank == 0) {
    std::printf("# mncl-bench-nccl: allreduce float32 sum, %d rank%s, GPU %d of %d, %d rounds\n",
                size, size > 1 ? "s" : "", device, count, rounds);
    std::printf("%10s %8s %14s %14s %8s\n", "bytes", "iters", "raw_nccl_us", "mncl_us", "ratio");
  }
  std::vector<double> small_ratios, large_ratios, all_ratios;
  for (size_t bytes = std::max<size_t>(min_bytes, 4); bytes <= max_bytes; bytes *= 2) {
    const size_t n = bytes / 4;
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{4} << 30) / bytes, 5, 200));
    auto raw_call = [&] {
      check(ncclAllReduce(send, recv, n, ncclFloat32, ncclSum, raw, stream), "ncclAllReduce");
    };
    auto mncl_call = [&] {
      check(mncl_allreduce(comm, send, recv, n, MNCL_FLOAT32, MNCL_SUM, stream), "mncl_allreduce");
    };
    timed(raw_call, 2);  // warm-up
    timed(mncl_call, 2);
    std::vector<double> raw_t, mncl_t;
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        raw_t.push_back(timed(raw_call, iters));
        mncl_t.push_back(timed(mncl_call, iters));
      } else {
        mncl_t.push_back(timed(mncl_call, iters));
        raw_t.push_back(timed(raw_call, iters));
      }
    }
    const double raw_s = median(raw_t), mncl_s = median(mncl_t), ratio = mncl_s / raw_s;
    all_ratios.push_back(ratio);
    if (bytes <= (64u << 10)) small_ratios.push_back(ratio);
    if (bytes >= (64u << 20)) large_ratios.push_back(ratio);
    if (rank == 0) {
      std::printf("%10s %8d %14.2f %14.2f %8.3f\n", human(bytes).c_str(), iters, raw_s * 1e6,
                  mncl_s * 1e6, ratio);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    auto summary = [](const std::vector<double> &v) {  // "n/a" for a range the sweep missed
      char buf[32] = "n/a";
      if (!v.empty()) std::snprintf(buf, sizeof buf, "%.3f", median(v));
      return std::string(buf);
    };
    std::printf("overhead: MNCL/raw NCCL median ratio %s (<=64Ki: %s, >=64Mi: %s), %s..%s\n",
                summary(all_ratios).c_str(), summary(small_ratios).c_str(),
                summary(large_ratios).c_str(), human(min_bytes).c_str(), human(max_bytes).c_str());
  }
  cudaFree(send);
  cudaFree(recv);
  ncclCommDestroy(raw);
  check(mncl_comm_destroy(comm), "mncl_comm_destroy");
  return 0;
}
