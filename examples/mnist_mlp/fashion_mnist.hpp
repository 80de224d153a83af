// Fashion-MNIST for the examples: the IDX files of the Debian package dataset-fashion-mnist
// (/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz), plus what the data-parallel,
// model-parallel and hybrid examples share: options, batching, loading, the learning-rate
// schedule, the two-stage model, the epoch report and main().
#ifndef MNCL_EXAMPLES_FASHION_MNIST_HPP
#define MNCL_EXAMPLES_FASHION_MNIST_HPP

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "mncl/frontends.hpp"

namespace fashion_mnist {

constexpr int kPixels = 28 * 28;
constexpr int kClasses = 10;
constexpr const char *kDefaultDir = "/usr/share/datasets/fashion-mnist";
// The examples exit with this status when the data are not installed (ctest: skipped).
constexpr int kExitNoData = 77;

// One image and its label: trivially copyable, so scatter_dataset sends it as raw bytes.
struct Sample {
  std::array<uint8_t, kPixels> pixels;
  int32_t label;
};

// The whole file, gunzipped when its name ends in ".gz" (through the gzip tool, so the
// examples need no zlib headers).
inline std::vector<uint8_t> read_file(const std::string &path) {
  const bool gzipped = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::FILE *f = gzipped ? ::popen(("gzip -dc '" + path + "' 2>/dev/null").c_str(), "r")
                         : std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> bytes;
  std::array<uint8_t, 1 << 16> block;
  std::size_t n;
  while ((n = std::fread(block.data(), 1, block.size(), f)) > 0) {
    bytes.insert(bytes.end(), block.data(), block.data() + n);
  }
  const int status = gzipped ? ::pclose(f) : std::fclose(f);
  if (status != 0 || bytes.empty()) throw std::runtime_error("cannot read " + path);
  return bytes;
}

inline uint32_t big_endian(const std::vector<uint8_t> &bytes, std::size_t offset) {
  return uint32_t{bytes[offset]} << 24 | uint32_t{bytes[offset + 1]} << 16 |
         uint32_t{bytes[offset + 2]} << 8 | uint32_t{bytes[offset + 3]};
}

// Reads "<dir>/<split>-images-idx3-ubyte[.gz]" and the matching labels; split is "train" or
// "t10k". limit > 0 keeps only the first `limit` samples.
inline std::vector<Sample> load(const std::string &dir, const std::string &split,
                                std::size_t limit = 0) {
  auto find = [&](const std::string &stem) {
    const std::string plain = dir + "/" + stem;
    if (std::FILE *f = std::fopen(plain.c_str(), "rb")) {
      std::fclose(f);
      return plain;
    }
    return plain + ".gz";
  };
  const auto images = read_file(find(split + "-images-idx3-ubyte"));
  const auto labels = read_file(find(split + "-labels-idx1-ubyte"));
  if (images.size() < 16 || big_endian(images, 0) != 0x803 || big_endian(images, 8) != 28 ||
      big_endian(images, 12) != 28) {
    throw std::runtime_error(split + " images: not a 28x28 IDX image file");
  }
  if (labels.size() < 8 || big_endian(labels, 0) != 0x801) {
    throw std::runtime_error(split + " labels: not an IDX label file");
  }
  std::size_t count = big_endian(images, 4);
  if (count != big_endian(labels, 4) || images.size() != 16 + count * kPixels ||
      labels.size() != 8 + count) {
    throw std::runtime_error(split + ": image and label files disagree or are truncated");
  }
  if (limit > 0 && limit < count) count = limit;
  std::vector<Sample> samples(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(samples[i].pixels.data(), images.data() + 16 + i * kPixels, kPixels);
    samples[i].label = labels[8 + i];
    if (samples[i].label >= kClasses) throw std::runtime_error(split + ": label out of range");
  }
  return samples;
}

// A batch as the network's input {n, 784} in [0, 1], and its labels.
inline void make_batch(const Sample *const *samples, std::size_t n, mncl::Tensor &x,
                       std::vector<int32_t> &labels) {
  x = mncl::Tensor({static_cast<int64_t>(n), kPixels});
  labels.resize(n);
  constexpr float kScale = 1.0f / 255.0f;
  for (std::size_t b = 0; b < n; ++b) {
    const auto &pixels = samples[b]->pixels;
    float *row = x.data.data() + b * kPixels;
    for (int p = 0; p < kPixels; ++p) row[p] = static_cast<float>(pixels[p]) * kScale;
    labels[b] = samples[b]->label;
  }
}

// Command-line options shared by both examples.
struct Options {
  int epochs = 5;
  int batch_size = 128;  // global: split over the ranks in data parallelism
  int hidden = 256;
  float lr = 1e-3f;
  std::string lr_schedule = "cosine";  // or "constant"
  std::string optimizer = "adam";      // or "sgd" (momentum 0.9)
  uint64_t seed = 1;
  std::string data_dir = kDefaultDir;
  std::size_t train_limit = 0;  // 0: all 60000
  std::size_t test_limit = 0;   // 0: all 10000
  std::string grad_dtype = "float32";
  bool double_buffering = false;
  std::size_t fusion_bytes = std::size_t{4} << 20;
  std::string checkpoint_dir;       // empty: no checkpoints
  double min_accuracy = 0;          // exit 1 if the final test accuracy is lower
  int loader_threads = 2;           // background batch assemblers (0: in the training thread)
  std::size_t prefetch = 4;         // batches assembled ahead
  int allreduce_every = 1;          // micro-batches per gradient exchange
  int per_rank_batch = 0;           // > 0: weak scaling, the global batch is this times the ranks
  int model_parallel = 2;           // hybrid example: pipeline stages per replica
  std::string batch_norm = "none";  // or "local", "multi-node": after the hidden layer
};

inline const char *kUsage =
    "options:\n"
    "  --epochs N            training epochs (5)\n"
    "  --batch-size N        global batch size, split over the ranks (128)\n"
    "  --hidden N            hidden units of the 784-N-10 MLP (256)\n"
    "  --lr X                learning rate (0.001)\n"
    "  --lr-schedule S       cosine (decays to 0 over the run) or constant (cosine)\n"
    "  --optimizer adam|sgd  Adam, or SGD with momentum 0.9 (adam)\n"
    "  --seed N              initialisation and shuffling seed (1)\n"
    "  --data-dir DIR        IDX files (/usr/share/datasets/fashion-mnist)\n"
    "  --train-limit N       use only the first N training images (all)\n"
    "  --test-limit N        use only the first N test images (all)\n"
    "  --grad-dtype T        float32|float16|bfloat16 gradient exchange (float32)\n"
    "  --double-buffering    overlap the gradient exchange with the next step\n"
    "  --fusion-bytes N      fusion buffer size in bytes (4194304)\n"
    "  --checkpoint-dir DIR  save every epoch there, and resume from it\n"
    "  --min-accuracy X      exit 1 if the final test accuracy is below X (0..1)\n"
    "  --loader-threads N    background threads assembling batches (2; 0: none)\n"
    "  --prefetch N          batches assembled ahead of training (4)\n"
    "  --allreduce-every K   split each rank's batch into K micro-batches, one exchange (1)\n"
    "  --per-rank-batch N    weak scaling: global batch = N x ranks (overrides --batch-size)\n"
    "  --model-parallel M    hybrid example: pipeline stages per replica (2)\n"
    "  --batch-norm B        mnist_mlp: none, local or multi-node batch normalization after\n"
    "                        the hidden layer (none)\n";

// The whole of `text` as a number of type T, or std::invalid_argument ("'12x' is not an
// integer"): std::stoi alone took "12x" for 12 and said only "stoi" for "abc".
template <class T>
T number(const std::string &text) {
  size_t used = 0;
  T value{};
  try {
    if constexpr (std::is_floating_point_v<T>) {
      const double v = std::stod(text, &used);  // out_of_range past double's range
      if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<T>::max()) used = 0;
      value = static_cast<T>(v);
    } else if constexpr (std::is_signed_v<T>) {
      const long long v = std::stoll(text, &used);
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) used = 0;
      value = static_cast<T>(v);
    } else {
      const unsigned long long v = std::stoull(text, &used);
      if (text.find('-') != std::string::npos || v > std::numeric_limits<T>::max()) used = 0;
      value = static_cast<T>(v);
    }
  } catch (const std::logic_error &) {  // std::invalid_argument, std::out_of_range
    used = 0;
  }
  if (text.empty() || used != text.size()) {
    throw std::invalid_argument("'" + text + "' is not " +
                                (std::is_floating_point_v<T> ? "a number" : "an integer") +
                                " in range");
  }
  return value;
}

inline Options parse_options(int argc, char **argv) {
  Options o;
  // Option -> what to do with its value ("" for the flag without one).
  const std::map<std::string, std::function<void(const std::string &)>> setters{
      {"--epochs", [&](const std::string &v) { o.epochs = number<int>(v); }},
      {"--batch-size", [&](const std::string &v) { o.batch_size = number<int>(v); }},
      {"--hidden", [&](const std::string &v) { o.hidden = number<int>(v); }},
      {"--lr", [&](const std::string &v) { o.lr = number<float>(v); }},
      {"--lr-schedule", [&](const std::string &v) { o.lr_schedule = v; }},
      {"--optimizer", [&](const std::string &v) { o.optimizer = v; }},
      {"--seed", [&](const std::string &v) { o.seed = number<decltype(o.seed)>(v); }},
      {"--data-dir", [&](const std::string &v) { o.data_dir = v; }},
      {"--train-limit",
       [&](const std::string &v) { o.train_limit = number<decltype(o.train_limit)>(v); }},
      {"--test-limit",
       [&](const std::string &v) { o.test_limit = number<decltype(o.test_limit)>(v); }},
      {"--grad-dtype", [&](const std::string &v) { o.grad_dtype = v; }},
      {"--fusion-bytes",
       [&](const std::string &v) { o.fusion_bytes = number<decltype(o.fusion_bytes)>(v); }},
      {"--checkpoint-dir", [&](const std::string &v) { o.checkpoint_dir = v; }},
      {"--min-accuracy", [&](const std::string &v) { o.min_accuracy = number<double>(v); }},
      {"--loader-threads", [&](const std::string &v) { o.loader_threads = number<int>(v); }},
      {"--prefetch", [&](const std::string &v) { o.prefetch = number<decltype(o.prefetch)>(v); }},
      {"--allreduce-every", [&](const std::string &v) { o.allreduce_every = number<int>(v); }},
      {"--per-rank-batch", [&](const std::string &v) { o.per_rank_batch = number<int>(v); }},
      {"--model-parallel", [&](const std::string &v) { o.model_parallel = number<int>(v); }},
      {"--batch-norm", [&](const std::string &v) { o.batch_norm = v; }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--double-buffering") {
      o.double_buffering = true;
      continue;
    }
    const auto setter = setters.find(arg);
    if (setter == setters.end()) {
      throw std::invalid_argument("unknown option " + arg + "\n" + kUsage);
    }
    if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
    try {
      setter->second(argv[++i]);
    } catch (const std::invalid_argument &e) {
      throw std::invalid_argument(arg + ": " + e.what());
    }
  }
  if (o.epochs < 0 || o.batch_size <= 0 || o.hidden <= 0) {
    throw std::invalid_argument("epochs, batch size and hidden units must be positive");
  }
  if (o.loader_threads < 0 || o.allreduce_every < 1 || o.per_rank_batch < 0 ||
      o.model_parallel < 1) {
    throw std::invalid_argument(
        "--loader-threads >= 0, --allreduce-every >= 1, --per-rank-batch >= 0 and "
        "--model-parallel >= 1 please");
  }
  if (o.lr_schedule != "cosine" && o.lr_schedule != "constant") {
    throw std::invalid_argument("--lr-schedule must be cosine or constant");
  }
  if (o.optimizer != "adam" && o.optimizer != "sgd") {
    throw std::invalid_argument("--optimizer must be adam or sgd");
  }
  return o;
}

// The learning rate for step `step` of `total`: a cosine decay ends the run on small steps, so
// the final accuracy does not depend on where the last noisy step happened to land.
inline float learning_rate(const Options &o, std::size_t step, std::size_t total) {
  if (o.lr_schedule == "constant" || total == 0) return o.lr;
  const double progress = static_cast<double>(step) / static_cast<double>(total);
  return static_cast<float>(o.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
}
// The same for step `step` (from 0) of epoch `epoch` (from 1), with `steps` steps per epoch.
inline float learning_rate_at(const Options &o, int epoch, std::size_t step, std::size_t steps) {
  return learning_rate(o, static_cast<std::size_t>(epoch - 1) * steps + step,
                       static_cast<std::size_t>(o.epochs) * steps);
}

// Both splits, limited as the options say. Returns what went wrong, or "": only rank 0 reads,
// then broadcasts this so that every rank stops together.
inline std::string load_sets(const Options &o, std::vector<Sample> &train_set,
                             std::vector<Sample> &test_set) {
  try {
    train_set = load(o.data_dir, "train", o.train_limit);
    test_set = load(o.data_dir, "t10k", o.test_limit);
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}

// A training batch as the prefetching loader hands it over.
struct Batch {
  mncl::Tensor x;
  std::vector<int32_t> labels;
};
inline void assemble(const Sample *const *samples, std::size_t n, Batch &out) {
  make_batch(samples, n, out.x, out.labels);
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The gradient exchange options that every example takes from the command line.
inline mncl::MultiNodeOptimizerOptions exchange_options(const Options &o) {
  mncl::MultiNodeOptimizerOptions exchange;
  exchange.double_buffering = o.double_buffering;
  exchange.fusion_buffer_bytes = o.fusion_bytes;
  return exchange;
}

// Test sets are evaluated in batches of this many samples.
constexpr std::size_t kTestBatch = 500;
// Calls f(begin, n) for the test batches [begin, begin + n) of `total` samples, in order.
template <class F>
void for_each_test_batch(std::size_t total, F &&f) {
  for (std::size_t begin = 0; begin < total; begin += kTestBatch) {
    f(begin, std::min(kTestBatch, total - begin));
  }
}

// The 784-H-10 MLP of the two-stage examples, cut after the ReLU: stage 0 (Dense(784, H) +
// ReLU) sends its activations to rank 1 of the chain's group, stage 1 (Dense(H, 10)) takes them
// from rank 0. The seeds are those of the data-parallel model, so all start from the same one.
inline void add_mlp_stage(mncl::MultiNodeChainList &chain, const Options &o, bool first_stage) {
  if (first_stage) {
    auto layers = std::make_shared<mncl::Sequential>();
    layers->emplace<mncl::Dense>(kPixels, o.hidden, o.seed, false).emplace<mncl::ReLU>();
    chain.add_link(layers, std::nullopt, 1);
  } else {
    chain.add_link(std::make_shared<mncl::Dense>(o.hidden, kClasses, o.seed + 1), 0, std::nullopt);
  }
}

// One epoch's line, {train loss, train accuracy, test loss, test accuracy}.
inline void print_epoch(const std::vector<double> &metrics, int epoch, double seconds) {
  std::printf("epoch %d  train loss %.4f acc %.4f  test loss %.4f acc %.4f  time %.2f s\n", epoch,
              metrics[0], metrics[1], metrics[2], metrics[3], seconds);
  std::fflush(stdout);
}

// The two-stage examples' epoch report: stage 1 (rank 1 of `pipeline`) holds `metrics`, {train
// loss, train accuracy, test loss, test accuracy}, and sends them to stage 0; `print` says
// whether this rank prints them. Returns the test accuracy.
inline double report_epoch(mncl::Communicator &pipeline, std::vector<double> &metrics, int epoch,
                           double seconds, bool print) {
  pipeline.bcast(metrics, 1);
  if (print) print_epoch(metrics, epoch, seconds);
  return metrics[3];
}

// The last line of every example (check_accuracy.sh reads it).
inline void print_final(double accuracy, int epochs, double seconds) {
  std::printf("final test accuracy %.4f after %d epochs, %.2f s\n", accuracy, epochs, seconds);
}

// The examples' main(): parses the options, then runs train(comm, options, optimizer) on the
// world communicator with the optimizer they name (Adam, or SGD with momentum 0.9). Returns
// train's status, 2 for bad options, 1 for an exception; `name` prefixes the messages.
template <class Train>
int main_with(int argc, char **argv, const char *name, Train &&train) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
  try {
    mncl::Communicator comm;
    int status;
    if (options.optimizer == "adam") {
      status = train(comm, options, mncl::Adam({options.lr}));
    } else {
      status = train(comm, options, mncl::Sgd({options.lr, 0.9f, 0.0f}));
    }
    comm.destroy();
    return status;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace fashion_mnist

#endif  // MNCL_EXAMPLES_FASHION_MNIST_HPP
