#include "mncl/frontends/tensor_parallel.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "mncl/frontends/error.hpp"
#include "shape_check.hpp"

namespace mncl {

namespace {

// A tensor seen as rows x features: every dimension but the last is a row.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
};

// Empty when `t` has at least one dimension and its shape describes its data; else what is
// wrong with it (checking never throws: the caller may still have to join a collective).
std::string check_tensor(const Tensor &t, const std::string &who) {
  if (t.shape.empty()) {
    return who + ": expected a {rows..., features} tensor, got one without dimensions";
  }
  const std::optional<std::size_t> count = internal::checked_element_count(t.shape);
  if (!count || *count != t.data.size()) {
    return who + ": shape " + t.shape_string() + " does not describe its " +
           std::to_string(t.data.size()) + " elements";
  }
  return {};
}

// Empty when `t` is a gradient of the shape `expected` (the last forward's); else what is wrong.
std::string check_gradient(const Tensor &t, const std::vector<int64_t> &expected,
                           const std::string &who) {
  if (expected.empty()) return who + ": no forward to go back through";
  if (t.shape != expected) {
    return who + ": gradient " + t.shape_string() + " does not match the last forward's " +
           Tensor(expected).shape_string();
  }
  return check_tensor(t, who);
}

// Empty when `t` is a {batch, features} tensor describing its data; else what is wrong.
std::string check_dense(const Tensor &t, int64_t features, const std::string &who) {
  if (t.shape.size() != 2 || t.shape[1] != features) {
    return who + ": expected a {batch, " + std::to_string(features) + "} tensor, got " +
           t.shape_string();
  }
  return check_tensor(t, who);
}

// For a tensor that passed check_tensor.
Matrix as_matrix(const Tensor &t) {
  int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= t.shape[d];
  return {rows, t.shape.back()};
}

// What one small allgather tells every rank about every rank's tensor.
struct Layouts {
  std::vector<int64_t> rows, cols;
};

std::string per_rank(const std::vector<int64_t> &values) {
  std::string s;
  for (std::size_t r = 0; r < values.size(); ++r) {
    s += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + std::to_string(values[r]);
  }
  return s;
}

// FNV-1a of the dimensions before the last: tensors of the same rows but different shapes
// ({2, 3, f} and {3, 2, f}) must not be mixed up.
int64_t leading_shape_hash(const Tensor &t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t d = 0; d + 1 < t.shape.size(); ++d) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (static_cast<uint64_t>(t.shape[d]) >> (8 * byte)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  h ^= t.shape.size();
  return static_cast<int64_t>(h * 0x100000001b3ull);
}

// Every rank's [failed, rows, features, expected total features (-1: any), shape hash] in one
// small allgather, then the same decision on every rank (it depends only on what was
// gathered): the failed rank throws its own error, the others RemoteError naming it; tensors
// of different shapes apart from the features (and of different features, with
// same_features, or slices that are not one split of the expected total) throw
// InvalidArgument everywhere with the same message. Every pass of every layer here runs it,
// also the passes that move no data, so that a bad tensor on one rank never leaves the others
// waiting in the next collective. Returns the layouts when the data may move.
// `layer` (0: none) is a digest of the calling layer's own sizes and options, which must be the
// same on every rank too: layers of other widths once computed a result of no model at all.
Layouts agree(Communicator &group, const std::string &who, const std::string &own_error,
              const Tensor &t, bool same_features, int64_t expected_total, int64_t layer = 0) {
  constexpr std::size_t kFields = 5;
  const Matrix m = own_error.empty() ? as_matrix(t) : Matrix{};
  const std::vector<int64_t> mine = {own_error.empty() ? 0 : 1, m.rows, m.cols, expected_total,
                                     own_error.empty() ? leading_shape_hash(t) ^ layer : 0};
  const std::vector<int64_t> all = group.size() == 1 ? mine : group.allgather(mine);
  if (!own_error.empty()) throw InvalidArgument(own_error);
  const auto size = static_cast<std::size_t>(group.size());
  std::string failed;
  Layouts layouts;
  std::vector<int64_t> totals, hashes;
  for (std::size_t r = 0; r < size; ++r) {
    if (all[kFields * r] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    layouts.rows.push_back(all[kFields * r + 1]);
    layouts.cols.push_back(all[kFields * r + 2]);
    totals.push_back(all[kFields * r + 3]);
    hashes.push_back(all[kFields * r + 4]);
  }
  if (!failed.empty()) {
    throw RemoteError(who + ": rank(s) " + failed +
                      " passed a tensor this layer cannot take (their own errors say what)");
  }
  auto all_equal = [](const std::vector<int64_t> &v) {
    return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
  };
  if (!all_equal(layouts.rows)) {
    throw InvalidArgument(who + ": the ranks' tensors have different numbers of rows (" +
                          per_rank(layouts.rows) + ")");
  }
  if (!all_equal(hashes)) {
    throw InvalidArgument(who + ": the ranks' tensors differ in shape before the last dimension" +
                          (layer != 0 ? ", or the ranks' layers differ in size or options" : ""));
  }
  if (same_features && !all_equal(layouts.cols)) {
    throw InvalidArgument(who + ": the ranks' tensors have different numbers of features (" +
                          per_rank(layouts.cols) + ")");
  }
  int64_t sum = 0;
  for (int64_t cols : layouts.cols) {
    if (__builtin_add_overflow(sum, cols, &sum)) {
      throw InvalidArgument(who + ": the ranks' features (" + per_rank(layouts.cols) +
                            ") add up to more than an int64 holds");
    }
  }
  if (expected_total >= 0) {
    bool split_matches = all_equal(totals);
    for (std::size_t r = 0; split_matches && r < size; ++r) {
      const ShardRange shard = shard_range(static_cast<std::size_t>(totals[0]), group.size(),
                                           static_cast<int>(r), false);
      split_matches = layouts.cols[r] == static_cast<int64_t>(shard.size());
    }
    if (!split_matches) {
      throw InvalidArgument(who + ": the ranks' slices (" + per_rank(layouts.cols) +
                            " features) are not one split of the same features (totals " +
                            per_rank(totals) + ")");
    }
  }
  return layouts;
}

// For the passes that move no data: only the agreement (see agree), on a tensor that must be
// the same shape on every rank (replicated) or one slice of `expected_total` features.
void agree_without_data(Communicator &group, const std::string &who, const std::string &own_error,
                        const Tensor &t, int64_t expected_total = -1, int64_t layer = 0) {
  agree(group, who, own_error, t, expected_total < 0, expected_total, layer);
}

// The sum over the group of every rank's `t` (same rows and features on every rank).
Tensor allreduce_sum(Communicator &group, const std::string &who, const std::string &own_error,
                     const Tensor &t, int64_t layer = 0) {
  agree(group, who, own_error, t, true, -1, layer);
  Tensor sum = t;
  if (group.size() > 1) group.allreduce(Span<float>(sum.data));
  return sum;
}

// Every rank's features side by side in rank order; `begin`/`end` get this rank's columns.
Tensor gather_features(Communicator &group, const std::string &who, const std::string &own_error,
                       const Tensor &t, int64_t expected_total, int64_t &begin, int64_t &end,
                       int64_t layer = 0) {
  const Layouts layouts = agree(group, who, own_error, t, false, expected_total, layer);
  const auto size = static_cast<std::size_t>(group.size());
  const auto rank = static_cast<std::size_t>(group.rank());
  const int64_t rows = layouts.rows[0];
  std::vector<std::size_t> counts(size), displs(size);
  std::vector<int64_t> offsets(size + 1, 0);
  std::size_t total_elements = 0;
  for (std::size_t r = 0; r < size; ++r) {
    counts[r] = static_cast<std::size_t>(rows) * static_cast<std::size_t>(layouts.cols[r]);
    displs[r] = total_elements;
    total_elements += counts[r];
    offsets[r + 1] = offsets[r] + layouts.cols[r];
  }
  begin = offsets[rank];
  end = offsets[rank + 1];
  std::vector<float> blocks;
  const std::vector<float> *packed = &t.data;
  if (size > 1) {
    blocks.resize(total_elements);
    group.allgatherv(Span<const float>(t.data), Span<float>(blocks), counts, displs);
    packed = &blocks;
  }
  std::vector<int64_t> shape = t.shape;
  shape.back() = offsets[size];
  Tensor y(shape);
  const auto width = static_cast<std::size_t>(offsets[size]);
  for (std::size_t r = 0; r < size; ++r) {  // rank r's {rows, cols[r]} block -> its columns
    const auto cols = static_cast<std::size_t>(layouts.cols[r]);
    if (cols == 0) continue;
    for (std::size_t row = 0; row < static_cast<std::size_t>(rows); ++row) {
      const float *from = packed->data() + displs[r] + row * cols;
      std::copy(from, from + cols,
                y.data.begin() + static_cast<std::ptrdiff_t>(row * width +
                                                             static_cast<std::size_t>(offsets[r])));
    }
  }
  return y;
}

// Columns [begin, end) of a {rows..., features} tensor.
Tensor slice_features(const Tensor &t, int64_t begin, int64_t end) {
  const Matrix m = as_matrix(t);
  std::vector<int64_t> shape = t.shape;
  shape.back() = end - begin;
  Tensor y(shape);
  const auto width = static_cast<std::size_t>(end - begin);
  for (int64_t row = 0; row < m.rows; ++row) {
    const float *from = t.data.data() + row * m.cols + begin;
    std::copy(
        from, from + width,
        y.data.begin() + static_cast<std::ptrdiff_t>(row) * static_cast<std::ptrdiff_t>(width));
  }
  return y;
}

void require_splittable(const std::string &who, int64_t in, int64_t out, int64_t split,
                        const Communicator &group) {
  if (in <= 0 || out <= 0) {
    throw InvalidArgument(who + ": feature counts must be positive");
  }
  if (split < group.size()) {
    throw InvalidArgument(who + ": " + std::to_string(split) + " features cannot be split over " +
                          std::to_string(group.size()) + " ranks (each needs at least one)");
  }
}

// A dense layer's sizes and options as agree() compares them (never 0).
int64_t layer_digest(char kind, int64_t in, int64_t out, bool option_a, bool option_b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int64_t v : {int64_t{kind}, in, out, int64_t{option_a}, int64_t{option_b}}) {
    h ^= static_cast<uint64_t>(v);
    h *= 0x100000001b3ull;
  }
  return static_cast<int64_t>(h | 1);
}

}  // namespace

ShardRange feature_shard(int64_t total, const Communicator &group) {
  if (total < 0) throw InvalidArgument("feature_shard: negative feature count");
  return shard_range(static_cast<std::size_t>(total), group.size(), group.rank(), false);
}

// ---------------------------------------------------------------------------------------------
// The four collectives
// ---------------------------------------------------------------------------------------------

Tensor CopyToTensorParallel::forward(const Tensor &x) {
  shape_.clear();
  const std::string who = name() + "::forward";
  agree_without_data(*group_, who, check_tensor(x, who), x);
  shape_ = x.shape;
  return x;
}

Tensor CopyToTensorParallel::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  return allreduce_sum(*group_, who, check_gradient(grad_y, shape_, who), grad_y);
}

Tensor ReduceFromTensorParallel::forward(const Tensor &x) {
  shape_.clear();
  const std::string who = name() + "::forward";
  Tensor y = allreduce_sum(*group_, who, check_tensor(x, who), x);
  shape_ = x.shape;
  return y;
}

Tensor ReduceFromTensorParallel::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  agree_without_data(*group_, who, check_gradient(grad_y, shape_, who), grad_y);
  return grad_y;
}

Tensor GatherFromTensorParallel::forward(const Tensor &x) {
  output_shape_.clear();
  const std::string who = name() + "::forward";
  Tensor y = gather_features(*group_, who, check_tensor(x, who), x, -1, begin_, end_);
  output_shape_ = y.shape;
  return y;
}

Tensor GatherFromTensorParallel::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  agree_without_data(*group_, who, check_gradient(grad_y, output_shape_, who), grad_y);
  return slice_features(grad_y, begin_, end_);
}

Tensor ScatterToTensorParallel::forward(const Tensor &x) {
  input_shape_.clear();
  const std::string who = name() + "::forward";
  agree_without_data(*group_, who, check_tensor(x, who), x);  // x replicated
  const ShardRange shard = feature_shard(x.shape.back(), *group_);
  begin_ = static_cast<int64_t>(shard.begin);
  end_ = static_cast<int64_t>(shard.end);
  Tensor y = slice_features(x, begin_, end_);
  input_shape_ = x.shape;
  return y;
}

Tensor ScatterToTensorParallel::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  std::vector<int64_t> expected = input_shape_;
  if (!expected.empty()) expected.back() = end_ - begin_;
  const int64_t total = input_shape_.empty() ? 0 : input_shape_.back();
  int64_t begin = 0, end = 0;
  return gather_features(*group_, who, check_gradient(grad_y, expected, who), grad_y, total, begin,
                         end);
}

// ---------------------------------------------------------------------------------------------
// The split dense layers
// ---------------------------------------------------------------------------------------------

ColumnParallelDense::ColumnParallelDense(int64_t in_features, int64_t out_features,
                                         Communicator &group, uint64_t seed,
                                         ColumnParallelOptions options)
    : group_(&group), in_(in_features), out_(out_features), options_(options) {
  require_splittable("ColumnParallelDense", in_, out_, out_, group);
  columns_ = feature_shard(out_, group);
  const auto c0 = static_cast<int64_t>(columns_.begin), c1 = static_cast<int64_t>(columns_.end);
  local_ = std::make_unique<Dense>(in_, c1 - c0, seed, options_.compute_input_grad);
  local_->weight().value = Dense::initial_weights(in_, out_, seed, 0, in_, c0, c1);
}

std::string ColumnParallelDense::name() const {
  return "ColumnParallelDense(" + std::to_string(in_) + ", " + std::to_string(out_) + ")[:, " +
         std::to_string(columns_.begin) + ":" + std::to_string(columns_.end) + "]";
}

// Each pass has one agreement (and at most one data collective after it): a rank whose tensor
// is wrong still joins it, carrying its error, so every rank fails together (see agree).
Tensor ColumnParallelDense::forward(const Tensor &x) {
  forward_done_ = false;
  const std::string who = name() + "::forward";
  const std::string error = check_dense(x, in_, who);
  const int64_t layer =
      layer_digest('C', in_, out_, options_.gather_output, options_.compute_input_grad);
  if (!options_.gather_output) {
    agree_without_data(*group_, who, error, x, -1, layer);  // x replicated
    Tensor y = local_->forward(x);
    batch_ = x.rows();
    forward_done_ = true;
    return y;
  }
  const Tensor y_local = error.empty() ? local_->forward(x) : Tensor();
  int64_t begin = 0, end = 0;
  Tensor y = gather_features(*group_, who, error, y_local, out_, begin, end, layer);
  batch_ = x.rows();
  forward_done_ = true;
  return y;
}

Tensor ColumnParallelDense::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  const int64_t width = options_.gather_output ? out_ : static_cast<int64_t>(columns_.size());
  std::string error =
      forward_done_ ? check_dense(grad_y, width, who) : who + ": no forward to go back through";
  if (error.empty() && grad_y.rows() != batch_) {
    error = who + ": gradient of " + std::to_string(grad_y.rows()) + " rows for a forward of " +
            std::to_string(batch_);
  }
  const int64_t layer =
      layer_digest('C', in_, out_, options_.gather_output, options_.compute_input_grad);
  if (!options_.compute_input_grad) {
    // dy replicated when the output was gathered, else one slice of the out features.
    agree_without_data(*group_, who, error, grad_y, options_.gather_output ? -1 : out_, layer);
  }
  Tensor grad_x;
  if (error.empty()) {
    const auto c0 = static_cast<int64_t>(columns_.begin), c1 = static_cast<int64_t>(columns_.end);
    grad_x = local_->backward(options_.gather_output ? slice_features(grad_y, c0, c1) : grad_y);
  }
  if (!options_.compute_input_grad) return grad_x;
  return allreduce_sum(*group_, who, error, grad_x, layer);  // x went to every rank's columns
}

RowParallelDense::RowParallelDense(int64_t in_features, int64_t out_features, Communicator &group,
                                   uint64_t seed, RowParallelOptions options)
    : group_(&group), in_(in_features), out_(out_features), options_(options) {
  require_splittable("RowParallelDense", in_, out_, in_, group);
  rows_ = feature_shard(in_, group);
  const auto r0 = static_cast<int64_t>(rows_.begin), r1 = static_cast<int64_t>(rows_.end);
  local_ = std::make_unique<Dense>(r1 - r0, out_, seed, options_.compute_input_grad);
  local_->weight().value = Dense::initial_weights(in_, out_, seed, r0, r1, 0, out_);
  bias_.name = "b";
  bias_.value.assign(static_cast<std::size_t>(out_), 0.0f);  // as Dense's bias starts
  bias_.grad.assign(static_cast<std::size_t>(out_), 0.0f);
}

std::string RowParallelDense::name() const {
  return "RowParallelDense(" + std::to_string(in_) + ", " + std::to_string(out_) + ")[" +
         std::to_string(rows_.begin) + ":" + std::to_string(rows_.end) + ", :]";
}

Tensor RowParallelDense::forward(const Tensor &x) {
  forward_done_ = false;
  const std::string who = name() + "::forward";
  const auto r0 = static_cast<int64_t>(rows_.begin), r1 = static_cast<int64_t>(rows_.end);
  const std::string error = check_dense(x, options_.input_is_parallel ? r1 - r0 : in_, who);
  // The local product goes through a Dense whose bias stays zero; the real bias is added once,
  // after the sum, so it is counted once and not once per rank.
  Tensor partial;
  if (error.empty()) {
    partial = local_->forward(options_.input_is_parallel ? x : slice_features(x, r0, r1));
  }
  Tensor y = allreduce_sum(
      *group_, who, error, partial,
      layer_digest('R', in_, out_, options_.input_is_parallel, options_.compute_input_grad));
  const auto out = static_cast<std::size_t>(out_);
  for (std::size_t row = 0; row < y.size() / out; ++row) {
    for (std::size_t j = 0; j < out; ++j) y.data[row * out + j] += bias_.value[j];
  }
  batch_ = x.rows();
  forward_done_ = true;
  return y;
}

Tensor RowParallelDense::backward(const Tensor &grad_y) {
  const std::string who = name() + "::backward";
  std::string error =
      forward_done_ ? check_dense(grad_y, out_, who) : who + ": no forward to go back through";
  if (error.empty() && grad_y.rows() != batch_) {
    error = who + ": gradient of " + std::to_string(grad_y.rows()) + " rows for a forward of " +
            std::to_string(batch_);
  }
  // Only a replicated input's gradient needs a collective (every rank's slice of it).
  const bool gathers = options_.compute_input_grad && !options_.input_is_parallel;
  const int64_t layer =
      layer_digest('R', in_, out_, options_.input_is_parallel, options_.compute_input_grad);
  if (!gathers) agree_without_data(*group_, who, error, grad_y, -1, layer);  // dy replicated
  Tensor grad_x;
  if (error.empty()) {
    // y's gradient is the same on every rank, and so is the bias's.
    const auto out = static_cast<std::size_t>(out_);
    std::fill(bias_.grad.begin(), bias_.grad.end(), 0.0f);
    for (std::size_t row = 0; row < grad_y.size() / out; ++row) {
      for (std::size_t j = 0; j < out; ++j) bias_.grad[j] += grad_y.data[row * out + j];
    }
    grad_x = local_->backward(grad_y);
  }
  if (!gathers) return grad_x;
  int64_t begin = 0, end = 0;
  return gather_features(*group_, who, error, grad_x, in_, begin, end, layer);
}

}  // namespace mncl
