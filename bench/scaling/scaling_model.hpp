// The α–β (Hockney) cost model behind mncl-scaling: allreduce time from per-message latency α
// and per-byte time β = 1 / bandwidth, for the ring, recursive halving-doubling and
// hierarchical (intra-node reduce-scatter, inter-node allreduce, intra-node allgather)
// algorithms, and the data-parallel step time built on it.
//
// Allreduce of n bytes over p ranks (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009):
//   ring:              2(p-1) α + 2(p-1)/p · n β
//   halving-doubling:  2 log2(p) α + 2(p-1)/p · n β        (p a power of two; otherwise the
//                      ranks beyond the largest power of two p' first fold in: + 2 α + n β)
//   hierarchical:      g ranks per node, N = p/g nodes:
//                      2 [(g-1) α_i + (g-1)/g · n β_i]  +  best(ring, hd) over N nodes of n/g
// A data-parallel step with compute time C, gradient G bytes sent as w bytes per float32
// (4, or 2 for fp16/bf16), in ceil(G·w/4 / F) fusion buffers of at most F bytes:
//   T_comm(p) = buffers · latency_part(p) + bandwidth_part(p, G·w/4)
//   T(p)      = C + T_copy + T_comm − overlap · min(C, T_comm)   (double buffering: overlap 1)
//   weak-scaling efficiency E(p) = T(1) / T(p) with T(1) = C + T_copy;  speedup p · E(p)
#ifndef MNCL_BENCH_SCALING_MODEL_HPP
#define MNCL_BENCH_SCALING_MODEL_HPP

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace mncl_scaling {

// One link class: α seconds per message, β seconds per byte.
struct LinkCost {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  static LinkCost from_us_gbps(double alpha_us, double gbytes_per_s) {
    return {alpha_us * 1e-6, gbytes_per_s > 0 ? 1.0 / (gbytes_per_s * 1e9) : 0.0};
  }
  double bandwidth_gbps() const { return beta_s_per_byte > 0 ? 1e-9 / beta_s_per_byte : 0; }
};

enum class Algorithm { kRing, kHalvingDoubling, kHierarchical, kBest };

inline const char *algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHalvingDoubling:
      return "halving-doubling";
    case Algorithm::kHierarchical:
      return "hierarchical";
    case Algorithm::kBest:
      return "best";
  }
  return "?";
}

// The two parts of an allreduce's time, so fusion can multiply only the latency part.
struct CostParts {
  double latency_s = 0;    // per buffer
  double bandwidth_s = 0;  // for all the bytes together
  double total(double buffers) const { return buffers * latency_s + bandwidth_s; }
};

inline CostParts ring_cost(int p, double bytes, const LinkCost &l) {
  if (p <= 1) return {};
  const double steps = 2.0 * (p - 1);
  return {steps * l.alpha_s, steps / p * bytes * l.beta_s_per_byte};
}

inline CostParts halving_doubling_cost(int p, double bytes, const LinkCost &l) {
  if (p <= 1) return {};
  int pow2 = 1, log2p = 0;
  while (pow2 * 2 <= p) pow2 *= 2, ++log2p;
  CostParts c{2.0 * log2p * l.alpha_s, 2.0 * (pow2 - 1) / pow2 * bytes * l.beta_s_per_byte};
  if (pow2 != p) {  // fold the extra ranks in and out
    c.latency_s += 2 * l.alpha_s;
    c.bandwidth_s += bytes * l.beta_s_per_byte;
  }
  return c;
}

// The cheaper of ring and halving-doubling for `buffers` buffers sharing `bytes`.
inline CostParts best_flat_cost(int p, double bytes, const LinkCost &l, double buffers = 1) {
  const CostParts r = ring_cost(p, bytes, l), h = halving_doubling_cost(p, bytes, l);
  return r.total(buffers) <= h.total(buffers) ? r : h;
}

// ranks_per_node ranks share a node's intra link; the node count is p / ranks_per_node.
inline CostParts hierarchical_cost(int p, int ranks_per_node, double bytes, const LinkCost &inter,
                                   const LinkCost &intra, double buffers = 1) {
  const int g = std::max(1, std::min(ranks_per_node, p));
  const int nodes = std::max(1, p / g);
  CostParts c;
  if (g > 1) {  // reduce-scatter, then allgather, inside the node
    c.latency_s += 2.0 * (g - 1) * intra.alpha_s;
    c.bandwidth_s += 2.0 * (g - 1) / g * bytes * intra.beta_s_per_byte;
  }
  const CostParts across = best_flat_cost(nodes, bytes / g, inter, buffers);
  c.latency_s += across.latency_s;
  c.bandwidth_s += across.bandwidth_s;
  return c;
}

struct Network {
  std::string name;
  LinkCost inter;  // between nodes (or between ranks, when ranks_per_node is 1)
  LinkCost intra;  // inside a node (hierarchical only)
  int ranks_per_node = 1;
};

inline CostParts allreduce_cost(Algorithm a, int p, double bytes, const Network &net,
                                double buffers = 1) {
  switch (a) {
    case Algorithm::kRing:  // flat: every step may cross nodes, so the inter link bounds it
      return ring_cost(p, bytes, net.inter);
    case Algorithm::kHalvingDoubling:
      return halving_doubling_cost(p, bytes, net.inter);
    case Algorithm::kHierarchical:
      return hierarchical_cost(p, net.ranks_per_node, bytes, net.inter, net.intra, buffers);
    case Algorithm::kBest: {
      CostParts best = ring_cost(p, bytes, net.inter);
      for (Algorithm other : {Algorithm::kHalvingDoubling, Algorithm::kHierarchical}) {
        const CostParts c = allreduce_cost(other, p, bytes, net, buffers);
        if (c.total(buffers) < best.total(buffers)) best = c;
      }
      return best;
    }
  }
  return {};
}

// One data-parallel training step.
struct Workload {
  double compute_s = 0.1;           // forward + backward + optimizer step on one rank
  double grad_bytes = 100e6;        // float32 gradient bytes
  double wire_bytes_per_float = 4;  // 4: float32; 2: fp16/bf16 communication
  double fusion_bytes = 4 << 20;    // per buffer, in wire bytes (<= 0: one buffer)
  double overlap = 0;               // 0: exchange after compute; 1: fully behind the next step
  double copy_gbps = 0;             // pack/unpack memory bandwidth (0: not modelled)
};

inline double wire_bytes(const Workload &w) {
  return w.grad_bytes * w.wire_bytes_per_float / 4;
}
inline double fusion_buffers(const Workload &w) {
  const double bytes = wire_bytes(w);
  return w.fusion_bytes <= 0 ? 1 : std::max(1.0, std::ceil(bytes / w.fusion_bytes));
}
// Packing reads the float32 gradients and writes the wire buffer; unpacking the reverse.
inline double copy_seconds(const Workload &w) {
  return w.copy_gbps > 0 ? 2 * (w.grad_bytes + wire_bytes(w)) / (w.copy_gbps * 1e9) : 0;
}

struct StepEstimate {
  double comm_s = 0;     // allreduce time per step
  double exposed_s = 0;  // the part not hidden behind compute
  double step_s = 0;
  double efficiency = 1;  // weak scaling, vs one rank
  double speedup = 1;
};

inline StepEstimate estimate_step(const Workload &w, const Network &net, Algorithm a, int p) {
  StepEstimate e;
  const double buffers = fusion_buffers(w);
  e.comm_s = p > 1 ? allreduce_cost(a, p, wire_bytes(w), net, buffers).total(buffers) : 0;
  const double overlap = std::clamp(w.overlap, 0.0, 1.0);
  e.exposed_s = e.comm_s - overlap * std::min(w.compute_s, e.comm_s);
  const double base = w.compute_s + copy_seconds(w);
  e.step_s = base + (p > 1 ? e.exposed_s : 0);
  e.efficiency = base / e.step_s;
  e.speedup = p * e.efficiency;
  return e;
}

// Network presets (documented in README.md; numbers are typical achieved, not line rates).
inline bool preset_network(const std::string &name, Network &net) {
  if (name == "ib100") {  // 100 Gb/s InfiniBand EDR: ~11 GB/s achieved, ~2 µs per message
    net = {"100 Gb/s InfiniBand (EDR)", LinkCost::from_us_gbps(2.0, 11.0), {}, 1};
  } else if (name == "ib56") {  // FDR, as in ChainerMN's 2017 cluster
    net = {"56 Gb/s InfiniBand (FDR)", LinkCost::from_us_gbps(2.0, 6.0), {}, 1};
  } else if (name == "25gbe") {  // TCP over 25 GbE: ~2.8 GB/s, ~25 µs per message
    net = {"25 GbE (TCP)", LinkCost::from_us_gbps(25.0, 2.8), {}, 1};
  } else if (name == "10gbe") {
    net = {"10 GbE (TCP)", LinkCost::from_us_gbps(30.0, 1.1), {}, 1};
  } else {
    return false;
  }
  // Inside a node (hierarchical, --ranks-per-node > 1): PCIe 3 x16-class peer copies.
  net.intra = LinkCost::from_us_gbps(1.0, 10.0);
  return true;
}

}  // namespace mncl_scaling

#endif  // MNCL_BENCH_SCALING_MODEL_HPP
