// mncl-bench-gloo: allreduce through MNCL's gloo backend vs. raw Gloo, same buffers, same run.
//
//   mncl-run -n 4 -- mncl-bench-gloo [--min-bytes 8] [--max-bytes 64Mi] [--algo ring|bcube|auto]
//                                    [--host 127.0.0.1]
//
// Both sides run float32 SUM, out of place, from one send buffer into one receive buffer, with
// the same Gloo algorithm (MNCL_GLOO_ALGO is set to --algo before the communicator exists; the
// raw side calls gloo::allreduce with the matching algorithm and gloo::sum<float>; with auto it
// applies the plugin's rule per size: bcube up to 64 KiB on 4, 8, ... ranks, else ring). The raw
// Gloo context is rendezvoused through MNCL itself (a rendezvous::Store whose waits are MNCL
// exchanges), so the program runs wherever MNCL does. Per size, single calls of the two sides
// alternate, each after a barrier, so drifting machine load hits both alike; a call's time is
// its slowest rank's, and the report gives the median (the ratio uses it) and the minimum.
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <mncl/mncl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parse_size.h"

namespace {

void check(mncl_status_t st, const char *what) {
  if (st != MNCL_OK) {
    std::fprintf(stderr, "mncl-bench-gloo: %s: %s: %s\n", what, mncl_status_string(st),
                 mncl_last_error());
    std::exit(1);
  }
}

// A gloo rendezvous store over an MNCL communicator. Gloo's connectFullMesh reads other
// ranks' keys asymmetrically (rank r reads only the host names of ranks below r) but every rank
// sets the same keys in the same order, so each set() is a collective exchange of that key:
// afterwards every rank holds every rank's value and get() never waits.
class MnclStore : public gloo::rendezvous::Store {
 public:
  explicit MnclStore(mncl_comm_t comm) : comm_(comm) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    pending_[key] = data;
    exchange();
  }
  std::vector<char> get(const std::string &key) override {
    auto it = all_.find(key);
    if (it == all_.end()) throw std::runtime_error("rendezvous: no rank set key " + key);
    return it->second;
  }
  void wait(const std::vector<std::string> &keys) override {
    for (const auto &k : keys) get(k);
  }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
    wait(keys);
  }

 private:
  void exchange() {
    std::string blob;  // key \0 len(8 bytes) value, repeated
    for (const auto &kv : pending_) {
      uint64_t n = kv.second.size();
      blob += kv.first;
      blob.push_back('\0');
      blob.append(reinterpret_cast<const char *>(&n), sizeof n);
      blob.append(kv.second.data(), kv.second.size());
    }
    pending_.clear();
    int size = 0;
    check(mncl_comm_size(comm_, &size), "mncl_comm_size");
    uint64_t mine = blob.size(), longest = 0;
    check(mncl_allreduce(comm_, &mine, &longest, 1, MNCL_UINT64, MNCL_MAX, nullptr),
          "rendezvous allreduce");
    std::vector<uint64_t> lens(static_cast<size_t>(size));
    check(mncl_allgather(comm_, &mine, lens.data(), 1, MNCL_UINT64, nullptr),
          "rendezvous allgather");
    blob.resize(longest);
    std::vector<char> every(longest * static_cast<size_t>(size));
    check(mncl_allgather(comm_, blob.data(), every.data(), longest, MNCL_UINT8, nullptr),
          "rendezvous allgather");
    for (int r = 0; r < size; ++r) {
      const char *p = every.data() + longest * static_cast<size_t>(r);
      const char *end = p + lens[static_cast<size_t>(r)];
      while (p < end) {
        std::string key(p);
        p += key.size() + 1;
        uint64_t n;
        std::memcpy(&n, p, sizeof n);
        p += sizeof n;
        all_[key] = std::vector<char>(p, p + n);
        p += n;
      }
    }
  }

  mncl_comm_t comm_;
  std::map<std::string, std::vector<char>> pending_, all_;
};

// A size for --min-bytes / --max-bytes (mncl-perf's parser): 0 and malformed values exit.
size_t parse_bytes(const char *flag, const char *s) {
  try {
    const size_t v = mncl::bench::parse_size(s);
    if (v == 0) throw std::invalid_argument(std::string("'") + s + "' is 0");
    return v;
  } catch (const std::invalid_argument &e) {
    std::fprintf(stderr, "mncl-bench-gloo: %s: %s\n", flag, e.what());
    std::exit(2);
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char **argv) {
  size_t min_bytes = 8, max_bytes = 64u << 20;
  std::string algo = "ring", host = "127.0.0.1";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mncl-bench-gloo: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--min-bytes") {
      min_bytes = parse_bytes("--min-bytes", next());
    } else if (a == "--max-bytes") {
      max_bytes = parse_bytes("--max-bytes", next());
    } else if (a == "--algo") {
      algo = next();
    } else if (a == "--host") {
      host = next();
    } else {
      std::fprintf(stderr,
                   "usage: mncl-run -n 4 -- %s [--min-bytes N] [--max-bytes N] "
                   "[--algo ring|bcube|auto] [--host ADDR]\n",
                   argv[0]);
      return 2;
    }
  }
  if (min_bytes > max_bytes) {
    std::fprintf(stderr, "mncl-bench-gloo: --min-bytes (%zu) is above --max-bytes (%zu)\n",
                 min_bytes, max_bytes);
    return 2;
  }
  if (algo != "ring" && algo != "bcube" && algo != "auto") {
    std::fprintf(stderr, "mncl-bench-gloo: --algo must be ring, bcube or auto\n");
    return 2;
  }
  setenv("MNCL_GLOO_ALGO", algo.c_str(), 1);

  mncl_config_t config = MNCL_CONFIG_INIT;
  config.backend = "gloo";
  mncl_comm_t comm = nullptr;
  check(mncl_comm_create(&config, &comm), "mncl_comm_create");
  int rank = 0, size = 1;
  check(mncl_comm_rank(comm, &rank), "mncl_comm_rank");
  check(mncl_comm_size(comm, &size), "mncl_comm_size");

  // Raw Gloo: its own device and context, rendezvoused through MNCL.
  std::shared_ptr<gloo::Context> raw;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::seconds(120));
    MnclStore store(comm);
    ctx->connectFullMesh(store, dev);
    raw = ctx;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mncl-bench-gloo: raw gloo rendezvous failed: %s\n", e.what());
    return 1;
  }
  // The raw side runs the algorithm the plugin runs. With auto that is the plugin's rule
  // (plugins/gloo/gloo_comm.cpp, Comm::allreduce_plain): bcube up to 64 KiB on a power-of-two
  // number of ranks above 2, ring otherwise; mncl-perf's raw Gloo baseline mirrors it the same way.
  auto raw_algo = [&](size_t n) {
    const size_t bytes = n * sizeof(float);
    const bool pow2 = (size & (size - 1)) == 0;
    const bool bcube =
        algo == "bcube" || (algo == "auto" && bytes <= 64 * 1024 && size > 2 && pow2);
    return bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                 : gloo::AllreduceOptions::Algorithm::RING;
  };
  uint32_t raw_tag = 0;
  auto raw_allreduce = [&](const float *in, float *out, size_t n) {
    gloo::AllreduceOptions opts(raw);
    opts.setAlgorithm(raw_algo(n));
    opts.setInput(const_cast<float *>(in), n);
    opts.setOutput(out, n);
    opts.setReduceFunction(
        static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
    opts.setTag(raw_tag++);
    gloo::allreduce(opts);
  };

  const size_t max_count = std::max<size_t>(max_bytes / sizeof(float), 1);
  std::vector<float> send(max_count), recv(max_count);
  for (size_t i = 0; i < max_count; ++i) send[i] = static_cast<float>((i + rank) % 16);

  if (rank == 0) {
    std::printf(
        "# MNCL-gloo vs raw Gloo: allreduce float32 sum, out of place, %d ranks, "
        "algo %s; per size, calls alternate between the sides; median and min of the slowest "
        "rank's time per call\n",
        size, algo.c_str());
    std::printf("# %12s %8s %12s %12s %8s %12s %12s\n", "bytes", "calls", "mncl_med_us",
                "raw_med_us", "ratio", "mncl_min_us", "raw_min_us");
  }
  double worst_large = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t n = std::max<size_t>(bytes / sizeof(float), 1);
    // Correctness first, both sides: element i sums (i + r) % 16 over ranks.
    for (int side = 0; side < 2; ++side) {
      std::fill(recv.begin(), recv.begin() + n, -1.0f);
      if (side == 0) {
        check(mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_FLOAT32, MNCL_SUM, nullptr),
              "mncl_allreduce");
      } else {
        raw_allreduce(send.data(), recv.data(), n);
      }
      for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 97)) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += static_cast<float>((i + r) % 16);
        if (recv[i] != want) {
          std::fprintf(stderr, "rank %d: %s result wrong at %zu bytes, element %zu: %g != %g\n",
                       rank, side == 0 ? "mncl" : "raw", bytes, i, recv[i], want);
          return 1;
        }
      }
    }
    // Samples per side: ~0.3 s of work, at least 25, as rank 0 estimates it.
    double t0 = now_s();
    check(mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_FLOAT32, MNCL_SUM, nullptr),
          "mncl_allreduce");
    const double est = now_s() - t0;
    int64_t iters =
        static_cast<int64_t>(std::min(400.0, std::max(25.0, 0.3 / std::max(est, 1e-6))));
    check(mncl_bcast(comm, &iters, 1, MNCL_INT64, 0, nullptr), "mncl_bcast");

    // One call at a time, the two sides alternating (and swapping which goes first), each
    // started right after a barrier: load bursts on a shared machine hit both sides alike.
    std::vector<double> local(2 * static_cast<size_t>(iters)), slowest(local.size());
    for (int64_t it = 0; it < iters; ++it) {
      for (int k = 0; k < 2; ++k) {
        const int side = (k + static_cast<int>(it)) % 2;
        check(mncl_barrier(comm, nullptr), "mncl_barrier");
        const double start = now_s();
        if (side == 0) {
          check(mncl_allreduce(comm, send.data(), recv.data(), n, MNCL_FLOAT32, MNCL_SUM, nullptr),
                "mncl_allreduce");
        } else {
          raw_allreduce(send.data(), recv.data(), n);
        }
        local[2 * static_cast<size_t>(it) + static_cast<size_t>(side)] = now_s() - start;
      }
    }
    // A call takes as long as its slowest rank.
    check(mncl_allreduce(comm, local.data(), slowest.data(), local.size(), MNCL_FLOAT64, MNCL_MAX,
                         nullptr),
          "mncl_allreduce");
    std::vector<double> t_mncl, t_raw;
    for (int64_t it = 0; it < iters; ++it) {
      t_mncl.push_back(slowest[2 * static_cast<size_t>(it)]);
      t_raw.push_back(slowest[2 * static_cast<size_t>(it) + 1]);
    }
    std::sort(t_mncl.begin(), t_mncl.end());
    std::sort(t_raw.begin(), t_raw.end());
    const double m = t_mncl[t_mncl.size() / 2], r = t_raw[t_raw.size() / 2];
    if (bytes >= (1u << 20)) worst_large = std::max(worst_large, m / r);
    if (rank == 0) {
      std::printf("  %12zu %8lld %12.1f %12.1f %8.3f %12.1f %12.1f\n", n * sizeof(float),
                  static_cast<long long>(iters), m * 1e6, r * 1e6, m / r, t_mncl[0] * 1e6,
                  t_raw[0] * 1e6);
      std::fflush(stdout);
    }
  }
  if (rank == 0 && worst_large > 0) {
    std::printf("# worst ratio at >= 1 MiB: %.3f (dispatch overhead %+.1f %%)\n", worst_large,
                (worst_large - 1) * 100);
  }
  raw.reset();
  check(mncl_comm_destroy(comm), "mncl_comm_destroy");
  return 0;
}
