// Single-process tests of the frontends: serialization, 16-bit floats, shard arithmetic, the
// optimizers' math, the layers' gradients (against finite differences), and the checkpoint file
// format (on a one-rank communicator).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mncl/frontends.hpp"
#include "recording_optimizer.hpp"

namespace {

using mncl::Span;

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

TEST(Errors, StatusesMapToTheirClasses) {
  auto thrown_status = [](mncl_status_t status) {
    try {
      mncl::throw_status(status, "mncl_test_call");
    } catch (const mncl::Error &e) {
      EXPECT_NE(std::string(e.what()).find("mncl_test_call"), std::string::npos) << e.what();
      return e.status();
    }
    return MNCL_OK;
  };
  EXPECT_THROW(mncl::throw_status(MNCL_ERR_TIMEOUT, "x"), mncl::TimeoutError);
  EXPECT_THROW(mncl::throw_status(MNCL_ERR_REMOTE, "x"), mncl::RemoteError);
  EXPECT_THROW(mncl::throw_status(MNCL_ERR_INVALID_ARGUMENT, "x"), mncl::InvalidArgument);
  EXPECT_THROW(mncl::throw_status(MNCL_ERR_ABORTED, "x"), mncl::AbortedError);
  EXPECT_THROW(mncl::throw_status(MNCL_ERR_PLUGIN, "x"), mncl::PluginError);
  for (mncl_status_t status : {MNCL_ERR_INVALID_ARGUMENT, MNCL_ERR_NOT_SUPPORTED, MNCL_ERR_TIMEOUT,
                               MNCL_ERR_REMOTE, MNCL_ERR_ABORTED, MNCL_ERR_PLUGIN,
                               MNCL_ERR_BOOTSTRAP, MNCL_ERR_SYSTEM, MNCL_ERR_INTERNAL}) {
    EXPECT_EQ(thrown_status(status), status);
  }
  EXPECT_NO_THROW(mncl::check(MNCL_OK, "x"));
  EXPECT_THROW(mncl::check(MNCL_IN_PROGRESS, "x"), mncl::InternalError);
}

TEST(Errors, CApiFailureCarriesTheLibraryMessage) {
  mncl_config_t config = MNCL_CONFIG_INIT;
  config.magic = 0;  // rejected before anything is created
  mncl_comm_t comm = nullptr;
  try {
    mncl::check(mncl_comm_create(&config, &comm), "mncl_comm_create");
    FAIL() << "a config without its magic was accepted";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("mncl_comm_create: "), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Serialization
// ---------------------------------------------------------------------------------------------

struct Point {  // trivially copyable: bytes as they are
  int32_t x, y;
  bool operator==(const Point &o) const { return x == o.x && y == o.y; }
};

struct Record {  // a user type with its own format
  std::string name;
  std::vector<Point> points;
  std::map<std::string, double> scores;
  void save(mncl::OutArchive &ar) const { ar << name << points << scores; }
  void load(mncl::InArchive &ar) { ar >> name >> points >> scores; }
  bool operator==(const Record &o) const {
    return name == o.name && points == o.points && scores == o.scores;
  }
};

template <class T>
T round_trip(const T &value) {
  return mncl::from_bytes<T>(mncl::to_bytes(value));
}

TEST(Serialize, RoundTrips) {
  EXPECT_EQ(round_trip(42), 42);
  EXPECT_EQ(round_trip(2.5), 2.5);
  EXPECT_EQ(round_trip(std::string()), "");
  EXPECT_EQ(round_trip(std::string("héllo\0x", 8)), std::string("héllo\0x", 8));
  EXPECT_EQ(round_trip(std::vector<float>{1, 2, 3}), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(round_trip(std::vector<bool>{true, false, true}), (std::vector<bool>{1, 0, 1}));
  EXPECT_EQ(round_trip(std::vector<std::string>{"a", "", "ccc"}),
            (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(round_trip(std::pair<int, std::string>{7, "seven"}),
            (std::pair<int, std::string>{7, "seven"}));
  EXPECT_EQ(round_trip(std::array<std::string, 2>{"x", "y"}),
            (std::array<std::string, 2>{"x", "y"}));
  const Record record{"r", {{1, 2}, {3, 4}}, {{"acc", 0.5}, {"loss", 1.25}}};
  EXPECT_EQ(round_trip(record), record);
  EXPECT_EQ(round_trip(std::vector<Record>{record, Record{}}),
            (std::vector<Record>{record, Record{}}));
  static_assert(mncl::is_serializable<Record>());
  static_assert(mncl::is_serializable<std::vector<std::map<int, Point>>>());
  static_assert(!mncl::is_serializable<int *>());
  static_assert(!mncl::is_serializable<std::vector<std::vector<int *>>>());
}

TEST(Serialize, BadInputThrowsInsteadOfReadingPastTheEnd) {
  auto bytes = mncl::to_bytes(std::vector<std::string>{"alpha", "beta"});
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(mncl::from_bytes<std::vector<std::string>>(Span<const uint8_t>(bytes.data(), cut)),
                 mncl::SerializationError)
        << "cut at " << cut;
  }
  bytes.push_back(0);
  EXPECT_THROW(mncl::from_bytes<std::vector<std::string>>(bytes), mncl::SerializationError);
  // A length prefix claiming far more than is there: no huge allocation, an error.
  const std::vector<uint8_t> absurd = mncl::to_bytes(uint64_t{1} << 60);
  EXPECT_THROW(mncl::from_bytes<std::vector<double>>(absurd), mncl::SerializationError);
  EXPECT_THROW(mncl::from_bytes<std::string>(absurd), mncl::SerializationError);
  EXPECT_THROW(mncl::from_bytes<std::vector<std::string>>(absurd), mncl::SerializationError);
}

// ---------------------------------------------------------------------------------------------
// 16-bit floats
// ---------------------------------------------------------------------------------------------

TEST(Dtype, Float16KnownValues) {
  EXPECT_EQ(mncl::to_float16(0.0f).bits, 0x0000);
  EXPECT_EQ(mncl::to_float16(-0.0f).bits, 0x8000);
  EXPECT_EQ(mncl::to_float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(mncl::to_float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(mncl::to_float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(mncl::to_float16(65519.0f).bits, 0x7bff);  // rounds down
  EXPECT_EQ(mncl::to_float16(65520.0f).bits, 0x7c00);  // rounds to infinity
  EXPECT_EQ(mncl::to_float16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_EQ(mncl::to_float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(mncl::to_float16(std::ldexp(1.0f, -25)).bits, 0x0000);  // tie to even: zero
  EXPECT_EQ(mncl::to_float16(std::ldexp(3.0f, -26)).bits, 0x0001);  // above the tie
  EXPECT_EQ(mncl::to_float16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
  // Ties to even between 1 and the next half (1 + 2^-10).
  EXPECT_EQ(mncl::to_float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(mncl::to_float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_TRUE(std::isnan(mncl::to_float(mncl::to_float16(std::nanf("")))));
}

TEST(Dtype, Float16RoundTripsEveryHalf) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const mncl::Float16 half{static_cast<uint16_t>(bits)};
    const float f = mncl::to_float(half);
    if (std::isnan(f)) continue;
    ASSERT_EQ(mncl::to_float16(f).bits, bits) << "half bits " << bits;
  }
}

TEST(Dtype, BFloat16) {
  EXPECT_EQ(mncl::to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(mncl::to_float(mncl::BFloat16{0x4049}), 3.140625f);
  EXPECT_EQ(mncl::to_bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);  // tie to even
  EXPECT_EQ(mncl::to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(mncl::to_float(mncl::to_bfloat16(std::nanf("")))));
  static_assert(mncl::dtype_of<mncl::BFloat16>() == MNCL_BFLOAT16);
  static_assert(mncl::dtype_of<int64_t>() == MNCL_INT64);
  static_assert(mncl::dtype_of<const uint8_t>() == MNCL_UINT8);
}

// ---------------------------------------------------------------------------------------------
// Spans
// ---------------------------------------------------------------------------------------------

TEST(Span, ViewsContainersWithoutCopying) {
  std::vector<float> v{1, 2, 3};
  Span<float> s(v);
  Span<const float> c = s;
  EXPECT_EQ(c.data(), v.data());
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(s.subspan(1).size(), 2u);
  EXPECT_EQ(s.subspan(5, 1).size(), 0u);
  int array[4] = {};
  EXPECT_EQ(Span<int>(array).size(), 4u);
  static_assert(!std::is_constructible_v<Span<float>, const std::vector<float> &>);
  static_assert(!std::is_constructible_v<Span<float>, std::vector<double> &>);
}

// ---------------------------------------------------------------------------------------------
// Shards
// ---------------------------------------------------------------------------------------------

TEST(ScatterIndex, TenSamplesThreeRanks) {
  using R = mncl::ShardRange;
  // Equal lengths of ceil(10/3) = 4: shards overlap (samples 3 and 6 appear twice).
  EXPECT_EQ(mncl::shard_range(10, 3, 0, true), (R{0, 4}));
  EXPECT_EQ(mncl::shard_range(10, 3, 1, true), (R{3, 7}));
  EXPECT_EQ(mncl::shard_range(10, 3, 2, true), (R{6, 10}));
  // Disjoint, the first 10 % 3 ranks one longer: ChainerMN's _scatter_index.
  EXPECT_EQ(mncl::shard_range(10, 3, 0, false), (R{0, 4}));
  EXPECT_EQ(mncl::shard_range(10, 3, 1, false), (R{4, 7}));
  EXPECT_EQ(mncl::shard_range(10, 3, 2, false), (R{7, 10}));
  EXPECT_EQ(mncl::shard_range(11, 4, 2, false), (R{6, 9}));
  EXPECT_EQ(mncl::shard_range(11, 4, 3, false), (R{9, 11}));
  EXPECT_THROW(mncl::shard_range(10, 3, 3), mncl::InvalidArgument);
}

TEST(ScatterIndex, PropertiesForManySizes) {
  for (std::size_t n = 0; n <= 60; ++n) {
    for (int size = 1; size <= 9; ++size) {
      std::size_t covered = 0;
      std::size_t shortest = n, longest = 0;
      for (int rank = 0; rank < size; ++rank) {
        const auto equal = mncl::shard_range(n, size, rank, true);
        EXPECT_EQ(equal.size(), (n + size - 1) / size) << n << "/" << size;
        EXPECT_LE(equal.end, n);
        const auto disjoint = mncl::shard_range(n, size, rank, false);
        EXPECT_EQ(disjoint.begin, covered) << n << "/" << size << " rank " << rank;
        // ChainerMN's: the first n % size ranks hold the longer shards.
        EXPECT_EQ(disjoint.size(), n / size + (std::size_t(rank) < n % size ? 1 : 0));
        covered = disjoint.end;
        shortest = std::min(shortest, disjoint.size());
        longest = std::max(longest, disjoint.size());
      }
      EXPECT_EQ(covered, n);
      EXPECT_LE(longest - std::min(shortest, longest), 1u);
    }
  }
}

TEST(ScatterIndex, PermutationIsReproducible) {
  const auto a = mncl::permutation(1000, 7);
  EXPECT_EQ(a, mncl::permutation(1000, 7));
  EXPECT_NE(a, mncl::permutation(1000, 8));
  // Pinned: the Python package's mncl.permutation (tests/python/test_objects.py) must agree.
  EXPECT_EQ(mncl::permutation(10, 7), (std::vector<std::size_t>{0, 7, 4, 9, 3, 1, 2, 8, 6, 5}));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
}

// ---------------------------------------------------------------------------------------------
// Optimizers
// ---------------------------------------------------------------------------------------------

TEST(Optimizers, SgdWithMomentum) {
  std::vector<float> p{1.0f, -1.0f};
  const std::vector<float> g{0.5f, -0.25f};
  mncl::Sgd sgd({0.1f, 0.9f, 0.0f});
  sgd.update({Span<float>(p)}, {Span<const float>(g)});
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.05f);
  sgd.update({Span<float>(p)}, {Span<const float>(g)});
  // v2 = 0.9 * (-0.05) - 0.05 = -0.095
  EXPECT_FLOAT_EQ(p[0], 0.95f - 0.095f);
  EXPECT_FLOAT_EQ(p[1], -1.0f + 0.025f + 0.0475f);
  std::vector<float> other(3);
  const std::vector<float> other_g(3);
  EXPECT_THROW(sgd.update({Span<float>(other)}, {Span<const float>(other_g)}),
               mncl::InvalidArgument);
}

// Optimizer state for fewer parameters than the update passes (the list grew, or a load restored
// fewer arrays) is refused before any state[i] is read (it was read past its end first).
TEST(Optimizers, StateForFewerParametersIsRefused) {
  std::vector<float> p{1.0f}, q{2.0f, 3.0f};
  const std::vector<float> g{0.5f}, h{0.5f, 0.5f};
  mncl::Sgd sgd({0.1f, 0.9f, 0.0f});
  sgd.update({Span<float>(p)}, {Span<const float>(g)});
  try {
    sgd.update({Span<float>(p), Span<float>(q)}, {Span<const float>(g), Span<const float>(h)});
    ADD_FAILURE() << "a second parameter without state was accepted";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("2 parameters but optimizer state for 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(Optimizers, AdamFirstStepMovesByLr) {
  // With bias correction the first Adam step is lr * sign(g) (up to eps).
  std::vector<float> p{0.0f, 0.0f, 0.0f};
  const std::vector<float> g{3.0f, -0.001f, 0.0f};
  mncl::Adam adam({0.01f});
  adam.update({Span<float>(p)}, {Span<const float>(g)});
  EXPECT_NEAR(p[0], -0.01f, 1e-6);
  EXPECT_NEAR(p[1], 0.01f, 1e-5);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(adam.steps(), 1u);
  // State survives a round trip.
  mncl::Adam restored({0.01f});
  mncl::from_bytes(mncl::to_bytes(adam), restored);
  std::vector<float> p2 = p;
  adam.update({Span<float>(p)}, {Span<const float>(g)});
  restored.update({Span<float>(p2)}, {Span<const float>(g)});
  EXPECT_EQ(p, p2);
}

// ---------------------------------------------------------------------------------------------
// Layers: analytic gradients against central differences (in double-checked float).
// ---------------------------------------------------------------------------------------------

mncl::Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  mncl::Tensor t(std::move(shape));
  uint32_t state = seed;
  for (float &v : t.data) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
  return t;
}

// Every analytic gradient of link's parameters, and grad_x of its input x, against central
// differences of loss_at (a forward from an input, returning the loss). Call it right after the
// backward: the gradients are copied first, as probing runs forwards that overwrite caches.
template <class Loss>
void expect_gradients_match_finite_differences(mncl::Link &link, const mncl::Tensor &x,
                                               const mncl::Tensor &grad_x, Loss loss_at) {
  const auto params = link.parameters();
  std::vector<std::vector<float>> grads;
  for (auto *p : params) grads.push_back(p->grad);
  const float h = 1e-2f;
  for (std::size_t k = 0; k < params.size(); ++k) {
    for (std::size_t j = 0; j < params[k]->value.size(); ++j) {
      float &w = params[k]->value[j];
      const float saved = w;
      w = saved + h;
      const double up = loss_at(x);
      w = saved - h;
      const double down = loss_at(x);
      w = saved;
      EXPECT_NEAR(grads[k][j], (up - down) / (2 * h), 2e-3)
          << "parameter " << k << " (" << params[k]->name << ")[" << j << "]";
    }
  }
  for (std::size_t j = 0; j < x.data.size(); ++j) {
    mncl::Tensor probe = x;
    probe.data[j] += h;
    const double up = loss_at(probe);
    probe.data[j] -= 2 * h;
    const double down = loss_at(probe);
    EXPECT_NEAR(grad_x.data[j], (up - down) / (2 * h), 2e-3) << "input " << j;
  }
}

TEST(Links, DenseReluSoftmaxGradientsMatchFiniteDifferences) {
  mncl::Sequential mlp;
  mlp.emplace<mncl::Dense>(5, 7, 1).emplace<mncl::ReLU>().emplace<mncl::Dense>(7, 3, 2);
  const mncl::Tensor x = random_tensor({4, 5}, 3);
  const std::vector<int32_t> labels{0, 2, 1, 2};
  mncl::SoftmaxCrossEntropy loss_fn;
  auto loss_at = [&](const mncl::Tensor &input) {
    mncl::SoftmaxCrossEntropy f;
    return static_cast<double>(f.forward(mlp.forward(input), labels));
  };
  loss_fn.forward(mlp.forward(x), labels);
  const mncl::Tensor grad_x = mlp.backward(loss_fn.backward());
  expect_gradients_match_finite_differences(mlp, x, grad_x, loss_at);
}

TEST(Links, SoftmaxCrossEntropyValuesAndAccuracy) {
  mncl::SoftmaxCrossEntropy f;
  const mncl::Tensor logits({2, 3}, {0.0f, 0.0f, 0.0f, 10.0f, 0.0f, 0.0f});
  const std::vector<int32_t> labels{1, 0};
  const float loss = f.forward(logits, labels);
  const double expected = (std::log(3.0) + std::log(1.0 + 2.0 * std::exp(-10.0))) / 2.0;
  EXPECT_NEAR(loss, expected, 1e-6);
  EXPECT_EQ(f.correct(), 1u);  // row 0 is a three-way tie: argmax 0 != 1
  const std::vector<int32_t> bad{1, 3};
  EXPECT_THROW(f.forward(logits, bad), mncl::InvalidArgument);
}

TEST(Links, DenseRejectsWrongShapes) {
  mncl::Dense dense(4, 2, 0);
  EXPECT_THROW(dense.forward(mncl::Tensor({3, 5})), mncl::InvalidArgument);
  EXPECT_THROW(dense.backward(mncl::Tensor({3, 2})), mncl::InvalidArgument);  // no forward yet
  mncl::Tensor short_data({3, 4});
  short_data.data.pop_back();  // shape and data are public: they can disagree
  EXPECT_THROW(dense.forward(short_data), mncl::InvalidArgument);
}

// ReLU and the softmax loss too refuse a tensor whose data is shorter than its shape (they read
// past its end: a heap overflow under ASan, a loss of 1e29 without).
TEST(Links, ReluAndSoftmaxRejectDataShorterThanTheShape) {
  mncl::ReLU relu;
  relu.forward(mncl::Tensor({2, 3}));
  mncl::Tensor short_grad({2, 3});
  short_grad.data.resize(2);
  EXPECT_THROW(relu.backward(short_grad), mncl::InvalidArgument);
  mncl::Tensor long_grad({2, 3});
  long_grad.data.resize(600);
  EXPECT_THROW(relu.backward(long_grad), mncl::InvalidArgument);
  EXPECT_THROW(relu.forward(short_grad), mncl::InvalidArgument);
  mncl::SoftmaxCrossEntropy loss;
  mncl::Tensor logits({2, 3});
  logits.data.resize(3);
  const std::vector<int32_t> labels{0, 1};
  EXPECT_THROW(loss.forward(logits, mncl::Span<const int32_t>(labels)), mncl::InvalidArgument);
}

// A shape whose element count overflows is refused, not taken for an empty tensor ({2^62, 4}
// once wrapped to 0 elements, and a Dense layer then wrote 2^62 rows into nothing).
TEST(Links, TensorShapesThatOverflowAreRejected) {
  const int64_t huge = int64_t{1} << 62;
  EXPECT_THROW(mncl::Tensor({huge, 4}, {}), mncl::InvalidArgument);
  EXPECT_THROW(mncl::Tensor({huge, 4}), mncl::InvalidArgument);
  EXPECT_THROW(mncl::Tensor({4, huge, 0, huge}), mncl::InvalidArgument);
  EXPECT_EQ(mncl::Tensor({huge, 0}).data.size(), 0u);  // empty, and its index math fits
  mncl::OutArchive out;
  out << std::vector<int64_t>{huge, 4} << std::vector<float>{};
  mncl::Tensor loaded;
  mncl::InArchive in(mncl::Span<const uint8_t>(out.bytes()));
  EXPECT_THROW(loaded.load(in), mncl::SerializationError);
}

// A shard's initial weights are that block of the whole layer's (what a tensor-parallel
// layer starts with), and they do not change between versions: pinned values of seed 7.
TEST(Links, DenseInitialWeightsOfABlockAreThatBlockOfTheLayer) {
  const mncl::Dense dense(5, 7, 7);
  const std::vector<float> &all = const_cast<mncl::Dense &>(dense).weight().value;
  for (int64_t r0 : {0, 2}) {
    for (int64_t c0 : {0, 3, 7}) {
      const std::vector<float> block = mncl::Dense::initial_weights(5, 7, 7, r0, 5, c0, 7);
      ASSERT_EQ(block.size(), std::size_t((5 - r0) * (7 - c0)));
      for (int64_t i = r0; i < 5; ++i) {
        for (int64_t j = c0; j < 7; ++j) {
          EXPECT_EQ(block[std::size_t((i - r0) * (7 - c0) + (j - c0))],
                    all[std::size_t(i * 7 + j)]);
        }
      }
    }
  }
  const float limit = std::sqrt(6.0f / 5.0f);
  for (float w : all) EXPECT_LE(std::fabs(w), limit);
  // SplitMix64 draws, computed independently (the generator's reference algorithm).
  EXPECT_EQ(all[0], -0x1.ee53f2p-3f);
  EXPECT_EQ(all[1], -0x1.0f049ap+0f);
  EXPECT_EQ(all[2], 0x1.c18c2ep-1f);
  EXPECT_THROW(mncl::Dense::initial_weights(5, 7, 7, 0, 6, 0, 7), mncl::InvalidArgument);
  EXPECT_THROW(mncl::Dense::initial_weights(5, 7, 7, 3, 2, 0, 7), mncl::InvalidArgument);
  EXPECT_THROW(mncl::Dense::initial_weights(5, 7, 7, 0, 5, -1, 7), mncl::InvalidArgument);
}

// Batch normalization: the loss sum_k w_k y_k (fixed weights w), so dL/dy = w; every gradient
// against central differences, for {batch, channels} and {batch, channels, h, w} inputs.
TEST(Links, BatchNormalizationGradientsMatchFiniteDifferences) {
  for (const std::vector<int64_t> &shape :
       {std::vector<int64_t>{5, 3}, std::vector<int64_t>{3, 2, 2, 3}}) {
    mncl::BatchNormalization bn(shape[1]);
    for (std::size_t c = 0; c < bn.gamma().value.size(); ++c) {
      bn.gamma().value[c] = 0.5f + 0.25f * float(c);
      bn.beta().value[c] = -0.1f * float(c);
    }
    const mncl::Tensor x = random_tensor(shape, 7);
    const mncl::Tensor w = random_tensor(shape, 8);
    auto loss_at = [&](const mncl::Tensor &input) {
      const mncl::Tensor y = bn.forward(input);
      double loss = 0;
      for (std::size_t k = 0; k < y.data.size(); ++k) loss += double(w.data[k]) * y.data[k];
      return loss;
    };
    loss_at(x);
    const mncl::Tensor grad_x = bn.backward(w);
    expect_gradients_match_finite_differences(bn, x, grad_x, loss_at);
  }
}

// Known values: one channel of {1, 2, 3, 4} has mean 2.5 and variance 1.25 (biased; the
// running variance takes the unbiased 5/3).
TEST(Links, BatchNormalizationStatisticsAndEvaluationMode) {
  mncl::BatchNormalizationOptions options;
  options.decay = 0.75f;
  options.eps = 0.25f;  // 1.25 + 0.25 = 1.5
  mncl::BatchNormalization bn(1, options);
  const mncl::Tensor y = bn.forward(mncl::Tensor({4, 1}, {1, 2, 3, 4}));
  for (int k = 0; k < 4; ++k) {
    EXPECT_FLOAT_EQ(y.data[k], float((k + 1 - 2.5) / std::sqrt(1.5))) << k;
  }
  EXPECT_DOUBLE_EQ(bn.batch_mean()[0], 2.5);
  EXPECT_DOUBLE_EQ(bn.batch_var()[0], 1.25);
  EXPECT_FLOAT_EQ(bn.running_mean()[0], 0.25f * 2.5f);
  EXPECT_FLOAT_EQ(bn.running_var()[0], 0.75f + 0.25f * (5.0f / 3.0f));

  // Evaluation mode (set through a container) normalizes by the running statistics and leaves
  // them alone; its backward is gamma / std * dy, with this batch's own sums for gamma, beta.
  mncl::Sequential model;
  auto shared = std::shared_ptr<mncl::BatchNormalization>(&bn, [](auto *) {});
  model.add(shared);
  ASSERT_EQ(model.persistents().size(), 2u);
  EXPECT_EQ(model.persistents()[0], &bn.running_mean());
  model.set_training(false);
  EXPECT_FALSE(bn.training());
  const float mean = bn.running_mean()[0], var = bn.running_var()[0];
  bn.gamma().value[0] = 2.0f;
  const mncl::Tensor z = model.forward(mncl::Tensor({2, 1}, {1, 3}));
  const double inv_std = 1.0 / std::sqrt(double(var) + 0.25);
  EXPECT_FLOAT_EQ(z.data[0], float(2.0 * (1 - mean) * inv_std));
  EXPECT_FLOAT_EQ(z.data[1], float(2.0 * (3 - mean) * inv_std));
  EXPECT_EQ(bn.running_mean()[0], mean);
  const mncl::Tensor gx = model.backward(mncl::Tensor({2, 1}, {1, -3}));
  EXPECT_FLOAT_EQ(gx.data[0], float(2.0 * inv_std));
  EXPECT_FLOAT_EQ(gx.data[1], float(-6.0 * inv_std));
  EXPECT_FLOAT_EQ(bn.beta().grad[0], -2.0f);
  EXPECT_FLOAT_EQ(bn.gamma().grad[0], float((1 - mean) * inv_std - 3 * (3 - mean) * inv_std));
}

// Finetuning: the running statistics become the plain mean of the batches' statistics since
// start_finetuning(), whatever they were; stopping returns to the decay; starting again restarts.
TEST(Links, BatchNormalizationFinetuningAveragesTheBatches) {
  mncl::BatchNormalization bn(2);
  bn.forward(mncl::Tensor({2, 2}, {100, -50, 300, 70}));  // running statistics far off
  bn.start_finetuning();
  EXPECT_TRUE(bn.finetuning());
  // Channel 0: means 2, 5, 11; unbiased variances 2, 8, 18. Channel 1, ten times channel 0:
  // means 20, 50, 110; variances 200, 800, 1800.
  const std::vector<std::vector<float>> c0_of = {{1, 3}, {3, 7}, {8, 14}};
  for (std::size_t b = 0; b < c0_of.size(); ++b) {
    bn.forward(
        mncl::Tensor({2, 2}, {c0_of[b][0], 10 * c0_of[b][0], c0_of[b][1], 10 * c0_of[b][1]}));
    EXPECT_EQ(bn.finetuned_batches(), int64_t(b + 1));
  }
  EXPECT_FLOAT_EQ(bn.running_mean()[0], 6.0f);         // (2 + 5 + 11) / 3
  EXPECT_FLOAT_EQ(bn.running_var()[0], 28.0f / 3.0f);  // (2 + 8 + 18) / 3
  EXPECT_FLOAT_EQ(bn.running_mean()[1], 60.0f);
  EXPECT_FLOAT_EQ(bn.running_var()[1], 2800.0f / 3.0f);
  // Evaluation forwards do not count.
  bn.set_training(false);
  bn.forward(mncl::Tensor({1, 2}, {0, 0}));
  EXPECT_EQ(bn.finetuned_batches(), 3);
  bn.set_training(true);
  bn.stop_finetuning();
  bn.forward(mncl::Tensor({2, 2}, {0, 0, 2, 0}));  // mean 1, unbiased variance 2
  EXPECT_FLOAT_EQ(bn.running_mean()[0], 0.9f * 6.0f + 0.1f * 1.0f);
  EXPECT_FLOAT_EQ(bn.running_var()[0], 0.9f * (28.0f / 3.0f) + 0.1f * 2.0f);
  bn.start_finetuning();
  bn.forward(mncl::Tensor({2, 2}, {4, 0, 6, 0}));  // the first batch: decay 0, its own statistics
  EXPECT_FLOAT_EQ(bn.running_mean()[0], 5.0f);
  EXPECT_FLOAT_EQ(bn.running_var()[0], 2.0f);
}

TEST(Links, SequentialReplaceRefusesWhatIsNotThere) {
  mncl::Sequential model;
  model.emplace<mncl::ReLU>();
  model.replace(0, std::make_shared<mncl::BatchNormalization>(2));
  EXPECT_EQ(model.links()[0]->name(), "BatchNormalization(2)");
  EXPECT_THROW(model.replace(1, std::make_shared<mncl::ReLU>()), mncl::InvalidArgument);
  EXPECT_THROW(model.replace(0, nullptr), mncl::InvalidArgument);
}

TEST(Links, BatchNormalizationRejectsBadInput) {
  EXPECT_THROW(mncl::BatchNormalization(0), mncl::InvalidArgument);
  mncl::BatchNormalizationOptions bad_decay;
  bad_decay.decay = 1.5f;
  EXPECT_THROW(mncl::BatchNormalization(2, bad_decay), mncl::InvalidArgument);
  mncl::BatchNormalization bn(3);
  EXPECT_THROW(bn.backward(mncl::Tensor({2, 3})), mncl::InvalidArgument);  // no forward yet
  EXPECT_THROW(bn.forward(mncl::Tensor({2, 4})), mncl::InvalidArgument);
  EXPECT_THROW(bn.forward(mncl::Tensor({6})), mncl::InvalidArgument);
  // No samples at all: nothing to normalize by.
  EXPECT_THROW(bn.forward(mncl::Tensor({0, 3})), mncl::InvalidArgument);
  bn.forward(mncl::Tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  EXPECT_THROW(bn.backward(mncl::Tensor({3, 3})), mncl::InvalidArgument);
  // Shapes that do not describe their data: short, negative, overflowing; as input and as
  // gradient (which must not be read past its end).
  for (const std::vector<int64_t> &shape :
       {std::vector<int64_t>{2, 3}, std::vector<int64_t>{-1, 3},
        std::vector<int64_t>{int64_t{1} << 40, 3, int64_t{1} << 40},
        std::vector<int64_t>{0, 3, int64_t{1} << 40, int64_t{1} << 40}}) {
    mncl::Tensor bad;
    bad.shape = shape;
    bad.data = {1.0f};
    EXPECT_THROW(bn.forward(bad), mncl::InvalidArgument) << bad.shape_string();
  }
  bn.forward(mncl::Tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  mncl::Tensor short_gradient;
  short_gradient.shape = {2, 3};
  short_gradient.data = {1.0f};
  EXPECT_THROW(bn.backward(short_gradient), mncl::InvalidArgument);
  // A failed forward leaves nothing to go back through, not the batch before it.
  EXPECT_THROW(bn.forward(mncl::Tensor({2, 4})), mncl::InvalidArgument);
  EXPECT_THROW(bn.backward(mncl::Tensor({2, 3})), mncl::InvalidArgument);
  // Without gamma and beta there are no parameters.
  mncl::BatchNormalizationOptions fixed;
  fixed.use_gamma = fixed.use_beta = false;
  mncl::BatchNormalization plain(3, fixed);
  EXPECT_TRUE(plain.parameters().empty());
  // ... and the output is x_hat itself: mean 0 and (biased) variance 1 / (1 + eps / var).
  const mncl::Tensor y = plain.forward(mncl::Tensor({2, 3}, {1, 2, 3, 5, 6, 7}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_FLOAT_EQ(y.data[c] + y.data[3 + c], 0.0f) << c;
    EXPECT_NEAR(y.data[3 + c], 2.0 / std::sqrt(4.0 + 2e-5), 1e-6) << c;
  }
  plain.backward(mncl::Tensor({2, 3}, {1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(plain.beta().grad, std::vector<float>(3, 0.0f));
}

// ---------------------------------------------------------------------------------------------
// Checkpoint files, on a one-rank communicator
// ---------------------------------------------------------------------------------------------

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/mncl-ckpt-unit-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    mncl::CommunicatorOptions options;
    options.rank = 0;
    options.size = 1;
    comm_ = std::make_unique<mncl::Communicator>(options);
  }
  void TearDown() override {
    comm_.reset();
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  static void copy_file(const std::string &from, const std::string &to) {
    std::ifstream in(from, std::ios::binary);
    ASSERT_TRUE(in.good()) << from;
    std::ofstream(to, std::ios::binary) << in.rdbuf();
  }
  static void corrupt_byte(const std::string &path, long offset) {
    std::FILE *f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
    std::fputc(c ^ 0x5a, f);
    std::fclose(f);
  }
  std::string dir_;
  std::unique_ptr<mncl::Communicator> comm_;
  mncl::CheckpointerOptions quiet_{2, false, false};
};

TEST_F(CheckpointFiles, SaveResumeAndPrune) {
  mncl::Checkpointer ckpt(*comm_, dir_ + "/nested/dir", "model", quiet_);
  std::vector<std::string> state;
  EXPECT_FALSE(ckpt.resume(state).has_value());
  for (uint64_t it = 1; it <= 5; ++it)
    ckpt.save(it, std::vector<std::string>{"it", std::to_string(it)});
  EXPECT_EQ(ckpt.local_iterations(), (std::vector<uint64_t>{4, 5}));  // keep = 2
  EXPECT_EQ(ckpt.path(5), dir_ + "/nested/dir/model.0.5");
  EXPECT_EQ(ckpt.resume(state), std::optional<uint64_t>(5));
  EXPECT_EQ(state, (std::vector<std::string>{"it", "5"}));
}

TEST_F(CheckpointFiles, CorruptAndPartialFilesAreSkipped) {
  mncl::Checkpointer ckpt(*comm_, dir_, "m", {4, false, false});
  for (uint64_t it = 1; it <= 4; ++it) ckpt.save(it, std::vector<float>(100, float(it)));
  corrupt_byte(ckpt.path(4), -1);  // payload bit flip
  corrupt_byte(ckpt.path(3), 20);  // header bit flip
  {                                // 2: truncated (a crash before the data reached the disk)
    const auto bytes = ckpt.read_snapshot(2);
    ASSERT_TRUE(bytes.has_value());
    ASSERT_EQ(truncate(ckpt.path(2).c_str(), 60), 0);
  }
  std::ofstream(ckpt.path(9) + ".tmp") << "half-written";  // a temporary is never a snapshot
  std::ofstream(dir_ + "/m.0.7") << "not a checkpoint at all";
  std::string why;
  EXPECT_FALSE(ckpt.read_snapshot(4, &why).has_value());
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  EXPECT_FALSE(ckpt.read_snapshot(2, &why).has_value());
  EXPECT_NE(why.find("payload"), std::string::npos) << why;
  EXPECT_EQ(ckpt.local_iterations(), (std::vector<uint64_t>{1}));
  std::vector<float> state;
  EXPECT_EQ(ckpt.resume(state), std::optional<uint64_t>(1));
  EXPECT_EQ(state, std::vector<float>(100, 1.0f));
  // Resuming at 1 deletes the abandoned newer files.
  EXPECT_EQ(access(ckpt.path(7).c_str(), F_OK), -1);
}

TEST_F(CheckpointFiles, SnapshotThatDoesNotDeserializeFallsBack) {
  mncl::Checkpointer ckpt(*comm_, dir_, "m", {3, false, false});
  ckpt.save(1, std::vector<float>{1.0f});
  ckpt.save(2, std::string("a different type"));
  std::vector<float> state;
  EXPECT_EQ(ckpt.resume(state), std::optional<uint64_t>(1));
  EXPECT_EQ(state, std::vector<float>{1.0f});
}

// Every uint64 iteration can be saved, listed and resumed (names of 20 digits were once never
// listed, so such a snapshot was neither resumed nor pruned).
TEST_F(CheckpointFiles, IterationsUpToTheLargestUint64) {
  mncl::Checkpointer ckpt(*comm_, dir_, "m", {3, false, false});
  const uint64_t big = 10000000000000000000ull, largest = ~uint64_t{0};
  ckpt.save(big, std::vector<int>{1});
  ckpt.save(largest, std::vector<int>{2});
  EXPECT_EQ(ckpt.local_iterations(), (std::vector<uint64_t>{big, largest}));
  std::vector<int> state;
  EXPECT_EQ(ckpt.resume(state), std::optional<uint64_t>(largest));
  EXPECT_EQ(state, std::vector<int>{2});
  std::ofstream(dir_ + "/m.0.18446744073709551616") << "2^64: not an iteration";
  EXPECT_EQ(ckpt.local_iterations(), (std::vector<uint64_t>{big, largest}));
}

// A snapshot that verifies but does not load, with nothing older: resume may have changed the
// state, so it throws rather than report "nothing to resume".
TEST_F(CheckpointFiles, SnapshotThatDoesNotDeserializeWithNothingOlderThrows) {
  mncl::Checkpointer ckpt(*comm_, dir_, "m", {3, false, false});
  ckpt.save(2, std::string("a different type"));
  std::vector<float> state;
  EXPECT_THROW(ckpt.resume(state), mncl::CheckpointError);
}

// Groups of one job: two splits of the one-rank world, each the rank 0 of its group. Each
// writes files of its own (they once were all <name>.0.<iteration>), and a file of another
// group, or of the whole job, is refused by its header whatever its name.
TEST_F(CheckpointFiles, GroupsOfOneJobKeepTheirOwnSnapshots) {
  mncl::Communicator first = comm_->split(0), second = comm_->split(0);
  const mncl::CheckpointerOptions keep_all{8, false, false};
  mncl::Checkpointer a(first, dir_, "m", keep_all), b(second, dir_, "m", keep_all);
  mncl::Checkpointer whole(*comm_, dir_, "m", keep_all);
  a.save(1, std::string("first"));
  b.save(1, std::string("second"));
  whole.save(1, std::string("whole"));
  EXPECT_EQ(a.path(1), dir_ + "/m.s0c0.0.1");
  EXPECT_EQ(b.path(1), dir_ + "/m.s1c0.0.1");
  EXPECT_EQ(whole.path(1), dir_ + "/m.0.1");  // as before groups: old snapshots still load
  EXPECT_EQ(a.group(), "s0c0");
  EXPECT_EQ(whole.group(), "");
  std::string state;
  EXPECT_EQ(a.resume(state), std::optional<uint64_t>(1));
  EXPECT_EQ(state, "first");
  EXPECT_EQ(b.resume(state), std::optional<uint64_t>(1));
  EXPECT_EQ(state, "second");
  EXPECT_EQ(whole.resume(state), std::optional<uint64_t>(1));
  EXPECT_EQ(state, "whole");

  // Newer snapshots of the others under this one's names (the iteration in the header fits).
  a.save(4, std::string("first, 4"));
  b.save(2, std::string("second, 2"));
  whole.save(3, std::string("whole, 3"));
  copy_file(b.path(2), a.path(2));
  copy_file(whole.path(3), a.path(3));
  copy_file(a.path(4), whole.path(4));
  std::string why;
  EXPECT_FALSE(a.read_snapshot(2, &why).has_value());
  EXPECT_NE(why.find("written by group 's1c0'"), std::string::npos) << why;
  EXPECT_FALSE(a.read_snapshot(3, &why).has_value());
  EXPECT_NE(why.find("written by the whole job"), std::string::npos) << why;
  EXPECT_FALSE(whole.read_snapshot(4, &why).has_value());
  EXPECT_NE(why.find("written by group 's0c0'"), std::string::npos) << why;
  EXPECT_EQ(a.local_iterations(), (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(a.resume(state), std::optional<uint64_t>(4));
  EXPECT_EQ(state, "first, 4");
  EXPECT_EQ(whole.resume(state), std::optional<uint64_t>(3));
  EXPECT_EQ(state, "whole, 3");
}

// A communicator that cannot tell its group (split_host, adopt) is refused, unless the group is
// named: a guess could mix the groups' states.
TEST_F(CheckpointFiles, GroupUnknownToTheCommunicatorMustBeNamed) {
  mncl::Communicator host = comm_->split_host();
  ASSERT_TRUE(host.valid());
  try {
    mncl::Checkpointer ckpt(host, dir_, "m", quiet_);
    FAIL() << "a checkpointer on split_host's group was made without a group name";
  } catch (const mncl::InvalidArgument &e) {
    EXPECT_NE(std::string(e.what()).find("CheckpointerOptions::group"), std::string::npos)
        << e.what();
  }
  mncl::Communicator below = host.split(0);  // a split of an unknown group is unknown too
  EXPECT_THROW(mncl::Checkpointer(below, dir_, "m", quiet_), mncl::InvalidArgument);

  mncl::CheckpointerOptions named = quiet_;
  named.group = "host-0";
  mncl::Checkpointer ckpt(host, dir_, "m", named);
  EXPECT_EQ(ckpt.path(4), dir_ + "/m.uhost-0.0.4");
  ckpt.save(4, 44);
  int state = 0;
  EXPECT_EQ(ckpt.resume(state), std::optional<uint64_t>(4));
  EXPECT_EQ(state, 44);
  // Appended to a known path; and only characters that are safe in a file name.
  named.group = "x";
  EXPECT_EQ(mncl::Checkpointer(*comm_, dir_, "m", named).path(1), dir_ + "/m.ux.0.1");
  named.group = "a/b.c";
  EXPECT_THROW(mncl::Checkpointer(*comm_, dir_, "m", named), mncl::InvalidArgument);
}

// Communicator::group_path: "" for the job, one "s<split>c<color>" per split(color) from it,
// unknown (nullopt) from split_host on; moves carry it.
TEST(Communicator, GroupPathNamesEachSplit) {
  mncl::CommunicatorOptions options;
  options.rank = 0;
  options.size = 1;
  mncl::Communicator world(options);
  EXPECT_EQ(world.group_path(), std::optional<std::string>(""));
  mncl::Communicator a = world.split(3);
  mncl::Communicator b = world.split(3, 0, mncl::SplitOptions{});
  mncl::Communicator host = world.split_host();
  mncl::Communicator none = world.split(MNCL_SPLIT_NONE);
  mncl::Communicator c = world.split(7);
  EXPECT_EQ(a.group_path(), std::optional<std::string>("s0c3"));
  EXPECT_EQ(b.group_path(), std::optional<std::string>("s1c3"));
  EXPECT_EQ(host.group_path(), std::nullopt);
  EXPECT_EQ(c.group_path(), std::optional<std::string>("s4c7"));  // every split counts
  EXPECT_EQ(a.split(0).group_path(), std::optional<std::string>("s0c3s0c0"));
  EXPECT_EQ(host.split(0).group_path(), std::nullopt);
  mncl::Communicator moved = std::move(a);
  EXPECT_EQ(moved.group_path(), std::optional<std::string>("s0c3"));
  EXPECT_EQ(moved.split(1).group_path(), std::optional<std::string>("s0c3s1c1"));
  EXPECT_EQ(mncl::Communicator::adopt(nullptr, 1024).group_path(), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// Compile-time refusals (the compiler's own errors: frontends.compile_fail.*)
// ---------------------------------------------------------------------------------------------

// Non-blocking calls keep pointers into their buffers past the statement, so a temporary
// container (freed at its end) does not compile there; lvalues and views (a Span, even a
// temporary one) do. (comm.isend(make_vector(), peer) once compiled, and the operation read
// freed memory.)
struct Isend {
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b) const -> decltype(c.isend(std::forward<B>(b), 1));
};
struct Irecv {
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b) const -> decltype(c.irecv(std::forward<B>(b), 1));
};
struct Ibcast {
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b) const -> decltype(c.ibcast(std::forward<B>(b), 0));
};
struct Iallreduce {
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b) const -> decltype(c.iallreduce(std::forward<B>(b)));
};
struct IsendrecvSend {  // b sent, an lvalue received
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b, std::vector<float> &r) const
      -> decltype(c.isendrecv(std::forward<B>(b), 1, r, 1));
};
struct IsendrecvRecv {  // an lvalue sent, into b
  template <class B>
  auto operator()(mncl::Communicator &c, B &&b, std::vector<float> &s) const
      -> decltype(c.isendrecv(s, 1, std::forward<B>(b), 1));
};
struct IsendOp {
  template <class B>
  auto operator()(B &&b) const -> decltype(mncl::isend_op(std::forward<B>(b), 1));
};
struct IrecvOp {
  template <class B>
  auto operator()(B &&b) const -> decltype(mncl::irecv_op(std::forward<B>(b), 1));
};

template <class Call, class... Rest>
constexpr bool takes_lasting_buffers_only() {
  using Vector = std::vector<float>;
  return !std::is_invocable_v<Call, Rest..., Vector> &&    // a temporary container
         std::is_invocable_v<Call, Rest..., Vector &> &&   // an lvalue
         std::is_invocable_v<Call, Rest..., Span<float>>;  // a view, even a temporary one
}

TEST(NonBlocking, CallsRefuseTemporaryContainers) {
  using C = mncl::Communicator &;
  using V = std::vector<float> &;
  static_assert(takes_lasting_buffers_only<Isend, C>());
  static_assert(std::is_invocable_v<Isend, C, const std::vector<float> &>);
  static_assert(std::is_invocable_v<Isend, C, Span<const float>>);
  static_assert(takes_lasting_buffers_only<Irecv, C>());
  static_assert(takes_lasting_buffers_only<Ibcast, C>());
  static_assert(takes_lasting_buffers_only<Iallreduce, C>());
  static_assert(!std::is_invocable_v<IsendrecvSend, C, std::vector<float>, V>);
  static_assert(std::is_invocable_v<IsendrecvSend, C, V, V>);
  static_assert(std::is_invocable_v<IsendrecvSend, C, Span<const float>, V>);
  static_assert(!std::is_invocable_v<IsendrecvRecv, C, std::vector<float>, V>);
  static_assert(std::is_invocable_v<IsendrecvRecv, C, Span<float>, V>);
  static_assert(takes_lasting_buffers_only<IsendOp>());
  static_assert(std::is_invocable_v<IsendOp, Span<const float>>);
  static_assert(takes_lasting_buffers_only<IrecvOp>());
  SUCCEED();
}

// Optimizers declared stateless, by a member or by the trait; the bundled ones save their state.
// A setting kept const makes an optimizer not assignable, which a load must not need.
struct ConstLrSgd {
  static constexpr bool stateless_optimizer = true;
  const float lr = 0.5f;
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) const {}
};
// State that cannot be copied, though its type says it can (a vector of move-only items).
struct MoveOnlySlots {
  std::vector<std::unique_ptr<float>> slots;
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) {}
  void save(mncl::OutArchive &ar) const { ar << uint64_t{slots.size()}; }
  void load(mncl::InArchive &ar) {
    uint64_t n = 0;
    ar >> n;
    slots.resize(n);
  }
};
struct TheirSgd {
  std::vector<float> scratch;  // a work buffer, not state (and not trivially copyable)
  void update(const mncl::ParamSpans &, const mncl::GradSpans &) {}
};
}  // namespace
template <>
struct mncl::is_stateless_optimizer<TheirSgd> : std::true_type {};
namespace {

TEST(MultiNodeOptimizer, StatelessOptimizersAreDeclared) {
  static_assert(mncl::is_stateless_optimizer<mncl_testing::RecordingOptimizer>::value);
  static_assert(mncl::is_stateless_optimizer<TheirSgd>::value);
  static_assert(!mncl::is_stateless_optimizer<mncl::Sgd>::value);
  static_assert(mncl::is_serializable<mncl::Sgd>() && mncl::is_serializable<mncl::Adam>());
  static_assert(!mncl::is_serializable<TheirSgd>());
  // And their multi-node optimizers checkpoint (without them, save/load do not compile).
  mncl::CommunicatorOptions options;
  options.rank = 0;
  options.size = 1;
  mncl::Communicator comm(options);
  mncl::MultiNodeOptimizer<TheirSgd> opt(TheirSgd{}, comm);
  std::vector<float> p(2, 1.0f), g(2, 1.0f);
  opt.update({Span<float>(p)}, {Span<const float>(g)});
  mncl::MultiNodeOptimizer<TheirSgd> loaded(TheirSgd{}, comm);
  mncl::from_bytes(Span<const uint8_t>(mncl::to_bytes(opt)), loaded);
  EXPECT_EQ(loaded.updates(), 1u);
  // Neither assignable nor truly copyable: their snapshots load too.
  mncl::MultiNodeOptimizer<ConstLrSgd> const_lr(ConstLrSgd{}, comm);
  const_lr.update({Span<float>(p)}, {Span<const float>(g)});
  mncl::from_bytes(Span<const uint8_t>(mncl::to_bytes(const_lr)), const_lr);
  EXPECT_EQ(const_lr.updates(), 1u);
  mncl::MultiNodeOptimizer<MoveOnlySlots> slots(MoveOnlySlots{}, comm);
  slots.actual_optimizer().slots.resize(3);
  const auto snapshot = mncl::to_bytes(slots);
  slots.actual_optimizer().slots.resize(5);
  mncl::from_bytes(Span<const uint8_t>(snapshot), slots);
  EXPECT_EQ(slots.actual_optimizer().slots.size(), 3u);
  // A load that throws puts the wrapped optimizer's state back (5 slots), as it was.
  auto truncated = snapshot;
  truncated.pop_back();
  slots.actual_optimizer().slots.resize(5);
  EXPECT_THROW(mncl::from_bytes(Span<const uint8_t>(truncated), slots), mncl::SerializationError);
  EXPECT_EQ(slots.actual_optimizer().slots.size(), 5u);
}

// An empty communicator (a split's MNCL_SPLIT_NONE) refuses alltoall with an error instead of
// dividing by its size 0 (SIGFPE).
TEST(Communicator, EmptyCommunicatorRefusesAlltoall) {
  mncl::CommunicatorOptions options;
  options.rank = 0;
  options.size = 1;
  mncl::Communicator comm(options);
  mncl::Communicator none = comm.split(MNCL_SPLIT_NONE);
  ASSERT_FALSE(none.valid());
  std::vector<int> send(4), recv(4);
  EXPECT_THROW(none.alltoall(send, recv), mncl::InvalidArgument);
  EXPECT_NO_THROW(comm.alltoall(send, recv));
}

TEST(Crc32, KnownValue) {
  EXPECT_EQ(mncl::crc32("123456789", 9), 0xcbf43926u);
  EXPECT_EQ(mncl::crc32("", 0), 0u);
}

}  // namespace

// A chain link's rank_in / rank_out: none, one rank or several, in every spelling a caller may
// hold them; a value out of int's range becomes -1 (refused by add_link), never a rank by
// wrapping.
TEST(ChainRanks, SpellingsOfNoneOneAndSeveralRanks) {
  using mncl::ChainRanks;
  using Ranks = std::vector<int>;
  EXPECT_TRUE(ChainRanks().empty());
  EXPECT_TRUE(ChainRanks(std::nullopt).empty());
  EXPECT_TRUE(ChainRanks({}).empty());
  EXPECT_TRUE(ChainRanks(std::optional<int>()).empty());
  EXPECT_TRUE(ChainRanks(std::vector<int>()).empty());
  EXPECT_EQ(ChainRanks(3).ranks, Ranks{3});
  EXPECT_EQ(ChainRanks(std::optional<int>(2)).ranks, Ranks{2});
  EXPECT_EQ(ChainRanks(std::optional<int64_t>(5)).ranks, Ranks{5});
  EXPECT_EQ((ChainRanks{1, 2}).ranks, (Ranks{1, 2}));
  EXPECT_EQ(ChainRanks(std::vector<size_t>{2, 0}).ranks, (Ranks{2, 0}));
  EXPECT_EQ(ChainRanks(std::vector<int64_t>{int64_t{1} << 40, -3}).ranks, (Ranks{-1, -1}));
  EXPECT_EQ(ChainRanks(std::optional<uint64_t>(~uint64_t{0})).ranks, Ranks{-1});
}
