// mncl-scaling: projects data-parallel training efficiency to 2..1024 nodes from a step's compute
// time, its gradient bytes and α–β network parameters — fitted from mncl-perf results or taken
// from a preset (100 Gb/s InfiniBand, 25 GbE, ...). See README.md and scaling_model.hpp.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "perf_fit.hpp"
#include "scaling_model.hpp"

using namespace mncl_scaling;

namespace {

const char *kUsage =
    "usage: mncl-scaling [options]\n"
    "network (one or more sources; default --network ib100):\n"
    "  --perf FILE            mncl-perf .json/.csv (or a sweep's); fits alpha-beta per backend\n"
    "  --network NAME         preset: ib100, ib56, 25gbe, 10gbe (repeatable)\n"
    "  --alpha-us X --gbps Y  a custom network: latency X us, bandwidth Y GB/s\n"
    "  --ranks-per-node G     ranks sharing a node (hierarchical algorithm; 1)\n"
    "  --fit-min-bytes N      ignore smaller sizes when fitting (0)\n"
    "workload (default --workload resnet50):\n"
    "  --workload NAME        resnet50 (102 MB float32 gradients, 145 ms/step: P100, batch 32)\n"
    "                         or mnist-mlp (784-256-10: 814 kB, 3 ms/step)\n"
    "  --compute-ms X         compute time per step on one rank\n"
    "  --grad-bytes N         float32 gradient bytes per step\n"
    "  --fusion-bytes N       fusion buffer size in wire bytes (4194304; 0: one buffer)\n"
    "  --fp16                 send gradients as fp16/bf16 (half the bytes)\n"
    "  --overlap X            share of the exchange hidden behind compute (0; 1: double "
    "buffering)\n"
    "  --copy-gbps X          model pack/unpack copies at this memory bandwidth (0: off)\n"
    "  --max-nodes N          project up to N nodes (1024)\n"
    "check a measurement (prints one 'check' line per run):\n"
    "  --check-backend B      use the fit of backend B from --perf\n"
    "  --check-ranks P        at P ranks (2)\n"
    "  --measured-efficiency E  the measured weak-scaling efficiency to compare with\n"
    "  --measured-comm-ms X   the measured communication wait per step (optional)\n"
    "  --compute-ms-at-p X    the compute per step measured at P ranks (ranks sharing cores\n"
    "                         run slower); adds a contention-corrected prediction\n"
    "  --self-test            check the formulas and the fit, exit 0/1\n";

struct Args {
  std::vector<std::string> perf_files, networks;
  double alpha_us = -1, gbps = -1;
  int ranks_per_node = 1;
  double fit_min_bytes = 0;
  Workload workload;
  std::string workload_name = "resnet50";
  int max_nodes = 1024;
  std::string check_backend;
  int check_ranks = 2;
  double measured_efficiency = -1, measured_comm_ms = -1, compute_ms_at_p = -1;
};

bool apply_workload(const std::string &name, Workload &w) {
  if (name == "resnet50") {  // 25.6 M parameters
    w.grad_bytes = 25.557e6 * 4;
    w.compute_s = 0.145;
  } else if (name == "mnist-mlp") {  // 784*256 + 256 + 256*10 + 10 parameters
    w.grad_bytes = (784.0 * 256 + 256 + 256 * 10 + 10) * 4;
    w.compute_s = 0.003;
  } else {
    return false;
  }
  return true;
}

Args parse(int argc, char **argv) {
  Args a;
  apply_workload(a.workload_name, a.workload);
  double compute_ms = -1, grad_bytes = -1;
  std::map<std::string, std::function<void(const std::string &)>> with_value{
      {"--perf", [&](const std::string &v) { a.perf_files.push_back(v); }},
      {"--network", [&](const std::string &v) { a.networks.push_back(v); }},
      {"--alpha-us", [&](const std::string &v) { a.alpha_us = std::stod(v); }},
      {"--gbps", [&](const std::string &v) { a.gbps = std::stod(v); }},
      {"--ranks-per-node", [&](const std::string &v) { a.ranks_per_node = std::stoi(v); }},
      {"--fit-min-bytes", [&](const std::string &v) { a.fit_min_bytes = std::stod(v); }},
      {"--workload",
       [&](const std::string &v) {
         if (!apply_workload(v, a.workload)) throw std::invalid_argument("unknown workload " + v);
         a.workload_name = v;
       }},
      {"--compute-ms", [&](const std::string &v) { compute_ms = std::stod(v); }},
      {"--grad-bytes", [&](const std::string &v) { grad_bytes = std::stod(v); }},
      {"--fusion-bytes", [&](const std::string &v) { a.workload.fusion_bytes = std::stod(v); }},
      {"--overlap", [&](const std::string &v) { a.workload.overlap = std::stod(v); }},
      {"--copy-gbps", [&](const std::string &v) { a.workload.copy_gbps = std::stod(v); }},
      {"--max-nodes", [&](const std::string &v) { a.max_nodes = std::stoi(v); }},
      {"--check-backend", [&](const std::string &v) { a.check_backend = v; }},
      {"--check-ranks", [&](const std::string &v) { a.check_ranks = std::stoi(v); }},
      {"--measured-efficiency",
       [&](const std::string &v) { a.measured_efficiency = std::stod(v); }},
      {"--measured-comm-ms", [&](const std::string &v) { a.measured_comm_ms = std::stod(v); }},
      {"--compute-ms-at-p", [&](const std::string &v) { a.compute_ms_at_p = std::stod(v); }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--fp16") {
      a.workload.wire_bytes_per_float = 2;
      continue;
    }
    const auto it = with_value.find(arg);
    if (it == with_value.end()) throw std::invalid_argument("unknown option " + arg);
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
    it->second(argv[++i]);
  }
  if (compute_ms >= 0) a.workload.compute_s = compute_ms * 1e-3, a.workload_name = "custom";
  if (grad_bytes >= 0) a.workload.grad_bytes = grad_bytes, a.workload_name = "custom";
  if (a.workload.compute_s <= 0) throw std::invalid_argument("--compute-ms must be positive");
  return a;
}

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1 << 20) {
    std::snprintf(buf, sizeof buf, "%.3g MiB", b / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.3g KiB", b / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  }
  return buf;
}

std::vector<int> node_counts(int max_nodes) {
  std::vector<int> nodes;
  for (int p = 2; p <= max_nodes; p *= 2) nodes.push_back(p);
  return nodes;
}

void print_projection(const Workload &w, const Network &net, int max_nodes) {
  std::printf(
      "\n== %s: %s gradients (%s on the wire, %.0f buffers of <= %s), %.1f ms compute "
      "per step; ranks per node %d ==\n",
      net.name.c_str(), human_bytes(w.grad_bytes).c_str(),
      w.wire_bytes_per_float == 2 ? "fp16" : "fp32", fusion_buffers(w),
      human_bytes(w.fusion_bytes).c_str(), w.compute_s * 1e3, net.ranks_per_node);
  std::printf("%6s %9s %9s %9s | %9s %7s %8s | %7s %8s\n", "nodes", "ring", "hd", "hier", "comm ms",
              "eff", "speedup", "+ovlp", "speedup");
  for (int nodes : node_counts(max_nodes)) {
    const int p = nodes * net.ranks_per_node;
    Workload plain = w, overlapped = w;
    plain.overlap = 0;
    overlapped.overlap = 1;
    const auto ring = estimate_step(plain, net, Algorithm::kRing, p);
    const auto hd = estimate_step(plain, net, Algorithm::kHalvingDoubling, p);
    const auto hier = estimate_step(plain, net, Algorithm::kHierarchical, p);
    const auto best = estimate_step(plain, net, Algorithm::kBest, p);
    const auto best_o = estimate_step(overlapped, net, Algorithm::kBest, p);
    std::printf("%6d %8.1f%% %8.1f%% %8.1f%% | %9.2f %6.1f%% %7.2fx | %6.1f%% %7.2fx\n", nodes,
                100 * ring.efficiency, 100 * hd.efficiency, 100 * hier.efficiency,
                best.comm_s * 1e3, 100 * best.efficiency, best.speedup, 100 * best_o.efficiency,
                best_o.speedup);
  }
  // Fusion-buffer size and fp16, at a few node counts, no overlap (overlap hides them).
  std::printf("fusion buffer (fp32 | fp16), best algorithm, no overlap:\n%10s", "buffer");
  const std::vector<int> at{8, 64, std::min(1024, max_nodes)};
  for (int nodes : at) std::printf("   %4d nodes fp32/fp16", nodes);
  std::printf("\n");
  for (double fusion : {64.0 * 1024, 1048576.0, 4194304.0, 16777216.0, 67108864.0, 0.0}) {
    std::printf("%10s", fusion == 0 ? "one" : human_bytes(fusion).c_str());
    for (int nodes : at) {
      Workload f32 = w, f16 = w;
      f32.overlap = f16.overlap = 0;
      f32.fusion_bytes = f16.fusion_bytes = fusion;
      f32.wire_bytes_per_float = 4;
      f16.wire_bytes_per_float = 2;
      const int p = nodes * net.ranks_per_node;
      std::printf("        %6.1f%% / %5.1f%%",
                  100 * estimate_step(f32, net, Algorithm::kBest, p).efficiency,
                  100 * estimate_step(f16, net, Algorithm::kBest, p).efficiency);
    }
    std::printf("\n");
  }
}

int self_test() {
  int failures = 0;
  auto expect = [&](bool ok, const char *what) {
    if (!ok) std::printf("FAIL: %s\n", what), ++failures;
  };
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * (1 + std::abs(b)); };
  const LinkCost l = LinkCost::from_us_gbps(10, 1);  // 10 us, 1 GB/s
  // At 2 ranks every algorithm is 2 alpha + n beta.
  for (auto c : {ring_cost(2, 1e6, l), halving_doubling_cost(2, 1e6, l)}) {
    expect(near(c.total(1), 20e-6 + 1e-3), "p=2 cost is 2a + nb");
  }
  expect(near(ring_cost(8, 8e6, l).total(1), 14 * 10e-6 + 14.0 / 8 * 8e-3), "ring p=8");
  expect(near(halving_doubling_cost(8, 8e6, l).total(1), 6 * 10e-6 + 14.0 / 8 * 8e-3), "hd p=8");
  expect(near(halving_doubling_cost(6, 6e6, l).total(1), 4 * 10e-6 + 1.5 * 6e-3 + 2 * 10e-6 + 6e-3),
         "hd p=6 folds two ranks");
  Network net{"t", l, LinkCost::from_us_gbps(1, 100), 4};
  expect(
      near(hierarchical_cost(16, 4, 16e6, l, net.intra).total(1),
           6e-6 + 1.5 * 16e6 / 100e9 +
               std::min(ring_cost(4, 4e6, l).total(1), halving_doubling_cost(4, 4e6, l).total(1))),
      "hierarchical 4 x 4");
  // fp16 halves the bandwidth part; fusion multiplies only the latency part.
  Workload w;
  w.compute_s = 0.1;
  w.grad_bytes = 64 << 20;
  w.fusion_bytes = 4 << 20;
  const double f32 = estimate_step(w, net, Algorithm::kRing, 4).comm_s;
  w.wire_bytes_per_float = 2;
  const double f16 = estimate_step(w, net, Algorithm::kRing, 4).comm_s;
  expect(near(f32 - 16 * 6 * 10e-6, 2 * (f16 - 8 * 6 * 10e-6)), "fp16 halves bytes and buffers");
  w.overlap = 1;
  expect(estimate_step(w, net, Algorithm::kRing, 4).efficiency == 1.0, "full overlap hides comm");
  expect(estimate_step(w, net, Algorithm::kRing, 1).efficiency == 1.0, "one rank is 100 %");
  // The fit recovers a = 2 alpha, b = beta from exact 2-rank timings.
  std::vector<PerfRow> rows;
  for (double n = 8; n <= 1 << 24; n *= 4) {
    rows.push_back({"x", "allreduce", "in-place", 2, n, (20e-6 + n / 1e9) * 1e6});
  }
  const Fit fit = fit_allreduce(rows, "x", 2);
  expect(std::abs(fit.link.alpha_s - 10e-6) < 1e-9, "fitted alpha");
  expect(std::abs(fit.link.bandwidth_gbps() - 1) < 1e-6, "fitted bandwidth");
  expect(fit.rms_relative_error < 1e-9, "exact fit");
  std::printf("mncl-scaling self-test: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--self-test") return self_test();
  }
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mncl-scaling: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    std::vector<Network> networks;
    std::map<std::string, Fit> fits;  // by backend, at check_ranks when present
    for (const auto &path : a.perf_files) {
      const PerfFile file = read_perf_file(path);
      if (a.workload.copy_gbps < 0) a.workload.copy_gbps = file.membw_gbps;
      for (const auto &[backend, ranks] : allreduce_groups(file.rows)) {
        const Fit fit = fit_allreduce(file.rows, backend, ranks, a.fit_min_bytes);
        std::printf(
            "fit %-8s %2d ranks, %2zu points: t(n) = %.1f us + n / %.3f GB/s  ->  alpha "
            "%.2f us, bandwidth %.3f GB/s (rms error %.0f %%)  [%s]\n",
            backend.c_str(), ranks, fit.points, fit.a_s * 1e6,
            fit.b_s_per_byte > 0 ? 1e-9 / fit.b_s_per_byte : 0, fit.link.alpha_s * 1e6,
            fit.link.bandwidth_gbps(), 100 * fit.rms_relative_error, path.c_str());
        if (!fits.count(backend) || ranks == a.check_ranks) fits[backend] = fit;
      }
    }
    if (!a.check_backend.empty()) {
      const auto it = fits.find(a.check_backend);
      if (it == fits.end()) throw std::runtime_error("no fit for backend " + a.check_backend);
      const Network net{"fitted " + a.check_backend, it->second.link, it->second.link, 1};
      const auto e = estimate_step(a.workload, net, Algorithm::kBest, a.check_ranks);
      std::printf(
          "check backend=%s ranks=%d compute_ms=%.3f grad_bytes=%.0f overlap=%.2f "
          "predicted_comm_ms=%.3f predicted_efficiency=%.4f",
          a.check_backend.c_str(), a.check_ranks, a.workload.compute_s * 1e3, a.workload.grad_bytes,
          a.workload.overlap, e.comm_s * 1e3, e.efficiency);
      if (a.measured_comm_ms >= 0) std::printf(" measured_comm_ms=%.3f", a.measured_comm_ms);
      if (a.measured_efficiency >= 0) {
        std::printf(" measured_efficiency=%.4f error_points=%+.1f", a.measured_efficiency,
                    100 * (e.efficiency - a.measured_efficiency));
      }
      if (a.compute_ms_at_p > 0) {  // the same comm model, on the slower compute of P ranks
        Workload slower = a.workload;
        slower.compute_s = a.compute_ms_at_p * 1e-3;
        const auto c = estimate_step(slower, net, Algorithm::kBest, a.check_ranks);
        const double corrected = a.workload.compute_s / c.step_s;
        std::printf(" compute_ms_at_p=%.3f corrected_efficiency=%.4f", a.compute_ms_at_p,
                    corrected);
        if (a.measured_efficiency >= 0) {
          std::printf(" corrected_error_points=%+.1f", 100 * (corrected - a.measured_efficiency));
        }
      }
      std::printf("\n");
      return 0;
    }
    for (const auto &[backend, fit] : fits) {
      networks.push_back(
          {"fitted " + backend + " (this machine, " + std::to_string(fit.ranks) + " ranks)",
           fit.link, fit.link, 1});
    }
    if (a.alpha_us >= 0 && a.gbps > 0) {
      networks.push_back(
          {"custom", LinkCost::from_us_gbps(a.alpha_us, a.gbps), LinkCost::from_us_gbps(1, 10), 1});
    }
    if (networks.empty() && a.networks.empty()) a.networks.push_back("ib100");
    for (const auto &name : a.networks) {
      Network net;
      if (!preset_network(name, net)) throw std::invalid_argument("unknown network " + name);
      networks.push_back(net);
    }
    std::printf("workload %s: compute %.2f ms/step, gradients %s (float32)%s\n",
                a.workload_name.c_str(), a.workload.compute_s * 1e3,
                human_bytes(a.workload.grad_bytes).c_str(),
                a.workload.overlap > 0 ? ", overlap given" : "");
    for (auto net : networks) {
      net.ranks_per_node = std::max(1, a.ranks_per_node);
      print_projection(a.workload, net, a.max_nodes);
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "mncl-scaling: %s\n", e.what());
    return 1;
  }
  return 0;
}
