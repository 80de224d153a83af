#include "mncl/frontends/links.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "mncl/frontends/error.hpp"
#include "shape_check.hpp"

namespace mncl {

namespace {

// SplitMix64: a tiny generator whose output is the same everywhere (initialisation must not
// depend on the standard library's distributions). Its state advances by a constant, so draw
// k is computed directly: a shard of a weight matrix is initialised without the rest.
constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;
uint64_t splitmix64_draw(uint64_t seed, uint64_t k) {
  uint64_t z = seed + (k + 1) * kSplitMixGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1).
float symmetric_unit(uint64_t bits) {
  return static_cast<float>((bits >> 40) * 0x1.0p-23) - 1.0f;
}

// shape and data are public: a caller may have changed one without the other (the loops
// below index data by the shape).
void require_consistent(const Tensor &t, const std::string &who) {
  if (t.data.size() != Tensor::element_count(t.shape)) {
    throw InvalidArgument(who + ": a tensor of shape " + t.shape_string() + " holds " +
                          std::to_string(t.data.size()) + " elements");
  }
}

void require_2d(const Tensor &t, int64_t cols, const std::string &who) {
  if (t.shape.size() != 2 || t.shape[1] != cols) {
    throw InvalidArgument(who + ": expected a {batch, " + std::to_string(cols) + "} tensor, got " +
                          t.shape_string());
  }
  require_consistent(t, who);
}

// out[0..n) += a * in[0..n): the one kernel the dense layer's two big products reduce to.
inline void axpy(float a, const float *__restrict in, float *__restrict out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) out[k] += a * in[k];
}

// Dot product with independent partial sums so the compiler can vectorize it without
// reassociating (no -ffast-math needed).
inline float dot(const float *__restrict a, const float *__restrict b, int64_t n) {
  float partial[8] = {};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[k + lane] * b[k + lane];
  }
  float sum = 0.0f;
  for (; k < n; ++k) sum += a[k] * b[k];
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tensor and Parameter
// ---------------------------------------------------------------------------------------------

Tensor::Tensor(std::vector<int64_t> shape_, std::vector<float> data_)
    : shape(std::move(shape_)), data(std::move(data_)) {
  if (data.size() != element_count(shape)) {
    throw InvalidArgument("Tensor: shape " + shape_string() + " needs " +
                          std::to_string(element_count(shape)) + " elements, got " +
                          std::to_string(data.size()));
  }
}

std::size_t Tensor::element_count(const std::vector<int64_t> &shape) {
  for (int64_t d : shape) {
    if (d < 0) throw InvalidArgument("Tensor: negative dimension " + std::to_string(d));
  }
  // Checked: a product that wraps (say {2^62, 4} -> 0) would pass for an empty tensor.
  const std::optional<std::size_t> count = internal::checked_element_count(shape);
  if (!count) {
    std::string s;
    for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
    throw InvalidArgument("Tensor: shape {" + s + "} has more elements than int64 can count");
  }
  return shape.empty() ? 0 : *count;
}

std::string Tensor::shape_string() const {
  std::string s = "{";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "}";
}

void Tensor::load(InArchive &ar) {
  std::vector<int64_t> new_shape;
  std::vector<float> new_data;
  ar >> new_shape >> new_data;
  try {
    *this = Tensor(std::move(new_shape), std::move(new_data));
  } catch (const SerializationError &) {
    throw;
  } catch (const InvalidArgument &e) {
    throw SerializationError(std::string("Tensor::load: ") + e.what());
  }
}

void Parameter::load(InArchive &ar) {
  std::string loaded_name;
  std::vector<float> loaded_value;
  ar >> loaded_name >> loaded_value;
  if (loaded_value.size() != value.size() && !value.empty()) {
    throw SerializationError("Parameter " + name + ": " + std::to_string(value.size()) +
                             " elements, but the saved one has " +
                             std::to_string(loaded_value.size()));
  }
  name = std::move(loaded_name);
  value = std::move(loaded_value);
  grad.assign(value.size(), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Dense
// ---------------------------------------------------------------------------------------------

Dense::Dense(int64_t in_features, int64_t out_features, uint64_t seed, bool compute_input_grad)
    : in_(in_features), out_(out_features), compute_input_grad_(compute_input_grad) {
  if (in_ <= 0 || out_ <= 0) throw InvalidArgument("Dense: feature counts must be positive");
  const auto weights = static_cast<std::size_t>(in_ * out_);
  weight_.name = "W";
  weight_.value.resize(weights);
  weight_.grad.assign(weights, 0.0f);
  bias_.name = "b";
  bias_.value.assign(static_cast<std::size_t>(out_), 0.0f);
  bias_.grad.assign(static_cast<std::size_t>(out_), 0.0f);
  weight_.value = initial_weights(in_, out_, seed, 0, in_, 0, out_);
}

std::vector<float> Dense::initial_weights(int64_t in_features, int64_t out_features, uint64_t seed,
                                          int64_t row_begin, int64_t row_end, int64_t col_begin,
                                          int64_t col_end) {
  if (in_features <= 0 || out_features <= 0 || row_begin < 0 || row_begin > row_end ||
      row_end > in_features || col_begin < 0 || col_begin > col_end || col_end > out_features) {
    throw InvalidArgument("Dense::initial_weights: rows [" + std::to_string(row_begin) + ", " +
                          std::to_string(row_end) + ") x columns [" + std::to_string(col_begin) +
                          ", " + std::to_string(col_end) + ") are not within {" +
                          std::to_string(in_features) + ", " + std::to_string(out_features) + "}");
  }
  const float limit = std::sqrt(6.0f / static_cast<float>(in_features));  // He-uniform, for ReLU
  std::vector<float> weights;
  weights.reserve(static_cast<std::size_t>((row_end - row_begin) * (col_end - col_begin)));
  for (int64_t i = row_begin; i < row_end; ++i) {
    for (int64_t j = col_begin; j < col_end; ++j) {
      const auto k = static_cast<uint64_t>(i) * static_cast<uint64_t>(out_features) +
                     static_cast<uint64_t>(j);  // draw k of the row-major {in, out} matrix
      weights.push_back(limit * symmetric_unit(splitmix64_draw(seed, k)));
    }
  }
  return weights;
}

std::string Dense::name() const {
  return "Dense(" + std::to_string(in_) + ", " + std::to_string(out_) + ")";
}

Tensor Dense::forward(const Tensor &x) {
  require_2d(x, in_, name() + "::forward");
  input_ = x;
  const int64_t batch = x.rows();
  Tensor y({batch, out_});
  for (int64_t b = 0; b < batch; ++b) {
    std::copy(bias_.value.begin(), bias_.value.end(), y.data.begin() + b * out_);
  }
  // Row i of W is reused by the whole batch while the batch's outputs stay in cache; zero
  // inputs (ReLU outputs, blank pixels) are skipped.
  const float *w = weight_.value.data();
  for (int64_t i = 0; i < in_; ++i) {
    const float *w_row = w + i * out_;
    for (int64_t b = 0; b < batch; ++b) {
      const float a = x.data[static_cast<std::size_t>(b * in_ + i)];
      if (a != 0.0f) axpy(a, w_row, y.data.data() + b * out_, out_);
    }
  }
  return y;
}

Tensor Dense::backward(const Tensor &grad_y) {
  require_2d(grad_y, out_, name() + "::backward");
  const int64_t batch = grad_y.rows();
  if (input_.empty() || input_.rows() != batch) {
    throw InvalidArgument(name() + "::backward: no forward of a batch of " + std::to_string(batch) +
                          " to go back through");
  }
  const float *dy = grad_y.data.data();
  // dW = x^T dy, row by row; db = column sums of dy.
  std::fill(weight_.grad.begin(), weight_.grad.end(), 0.0f);
  for (int64_t i = 0; i < in_; ++i) {
    float *dw_row = weight_.grad.data() + i * out_;
    for (int64_t b = 0; b < batch; ++b) {
      const float a = input_.data[static_cast<std::size_t>(b * in_ + i)];
      if (a != 0.0f) axpy(a, dy + b * out_, dw_row, out_);
    }
  }
  std::fill(bias_.grad.begin(), bias_.grad.end(), 0.0f);
  for (int64_t b = 0; b < batch; ++b) axpy(1.0f, dy + b * out_, bias_.grad.data(), out_);
  if (!compute_input_grad_) return Tensor();
  // dx = dy W^T: each element a dot product of a dy row with a W row.
  Tensor grad_x({batch, in_});
  const float *w = weight_.value.data();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < in_; ++i) {
      grad_x.data[static_cast<std::size_t>(b * in_ + i)] = dot(dy + b * out_, w + i * out_, out_);
    }
  }
  return grad_x;
}

// ---------------------------------------------------------------------------------------------
// ReLU and Sequential
// ---------------------------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor &x) {
  require_consistent(x, "ReLU::forward");  // (backward reads output_ by the gradient's shape)
  output_ = x;
  for (float &v : output_.data) v = v > 0.0f ? v : 0.0f;
  return output_;
}

Tensor ReLU::backward(const Tensor &grad_y) {
  if (grad_y.shape != output_.shape) {
    throw InvalidArgument("ReLU::backward: gradient " + grad_y.shape_string() +
                          " does not match the output " + output_.shape_string());
  }
  require_consistent(grad_y, "ReLU::backward");
  Tensor grad_x = grad_y;
  for (std::size_t k = 0; k < grad_x.data.size(); ++k) {
    if (output_.data[k] <= 0.0f) grad_x.data[k] = 0.0f;
  }
  return grad_x;
}

Tensor Sequential::forward(const Tensor &x) {
  Tensor h = x;
  for (auto &link : links_) h = link->forward(h);
  return h;
}

Tensor Sequential::backward(const Tensor &grad_y) {
  Tensor g = grad_y;
  for (auto it = links_.rbegin(); it != links_.rend(); ++it) g = (*it)->backward(g);
  return g;
}

std::vector<Parameter *> Sequential::parameters() {
  std::vector<Parameter *> all;
  for (auto &link : links_) {
    for (Parameter *p : link->parameters()) all.push_back(p);
  }
  return all;
}

std::vector<std::vector<float> *> Sequential::persistents() {
  std::vector<std::vector<float> *> all;
  for (auto &link : links_) {
    for (std::vector<float> *p : link->persistents()) all.push_back(p);
  }
  return all;
}

void Sequential::set_training(bool training) {
  for (auto &link : links_) link->set_training(training);
}

void Sequential::replace(std::size_t index, std::shared_ptr<Link> link) {
  if (index >= links_.size() || !link) {
    throw InvalidArgument("Sequential::replace: link " + std::to_string(index) + " of " +
                          std::to_string(links_.size()) + (link ? "" : ", by no link"));
  }
  links_[index] = std::move(link);
}

std::string Sequential::name() const {
  std::string s = "Sequential(";
  for (std::size_t i = 0; i < links_.size(); ++i) s += (i ? ", " : "") + links_[i]->name();
  return s + ")";
}

// ---------------------------------------------------------------------------------------------
// Softmax cross-entropy
// ---------------------------------------------------------------------------------------------

float SoftmaxCrossEntropy::forward(const Tensor &logits, Span<const int32_t> labels) {
  if (logits.shape.size() != 2 || static_cast<std::size_t>(logits.rows()) != labels.size()) {
    throw InvalidArgument("SoftmaxCrossEntropy: logits " + logits.shape_string() + " but " +
                          std::to_string(labels.size()) + " labels");
  }
  require_consistent(logits, "SoftmaxCrossEntropy");
  const int64_t batch = logits.rows(), classes = logits.cols();
  probabilities_ = Tensor(logits.shape);
  labels_.assign(labels.begin(), labels.end());
  correct_ = 0;
  double total_loss = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t label = labels[static_cast<std::size_t>(b)];
    if (label < 0 || label >= classes) {
      throw InvalidArgument("SoftmaxCrossEntropy: label " + std::to_string(label) +
                            " out of range for " + std::to_string(classes) + " classes");
    }
    const float *z = logits.data.data() + b * classes;
    float *p = probabilities_.data.data() + b * classes;
    const int64_t argmax = std::max_element(z, z + classes) - z;
    const float max_logit = z[argmax];
    double sum = 0.0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - max_logit));
    const double log_sum = std::log(sum);
    for (int64_t c = 0; c < classes; ++c) {
      p[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - max_logit) - log_sum));
    }
    total_loss += log_sum - static_cast<double>(z[label] - max_logit);  // -log p[label]
    if (argmax == label) ++correct_;
  }
  return batch ? static_cast<float>(total_loss / static_cast<double>(batch)) : 0.0f;
}

Tensor SoftmaxCrossEntropy::backward() const {
  Tensor grad = probabilities_;
  if (grad.empty()) return grad;
  const int64_t batch = grad.rows(), classes = grad.cols();
  const float scale = batch ? 1.0f / static_cast<float>(batch) : 0.0f;
  for (int64_t b = 0; b < batch; ++b) {
    float *g = grad.data.data() + b * classes;
    g[labels_[static_cast<std::size_t>(b)]] -= 1.0f;
    for (int64_t c = 0; c < classes; ++c) g[c] *= scale;
  }
  return grad;
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

ParamSpans value_spans(const std::vector<Parameter *> &params) {
  ParamSpans spans;
  for (Parameter *p : params) spans.emplace_back(p->value);
  return spans;
}

GradSpans grad_spans(const std::vector<Parameter *> &params) {
  GradSpans spans;
  for (Parameter *p : params) spans.emplace_back(p->grad.data(), p->grad.size());
  return spans;
}

std::vector<std::vector<float>> snapshot_values(const std::vector<Parameter *> &params) {
  std::vector<std::vector<float>> values;
  for (const Parameter *p : params) values.push_back(p->value);
  return values;
}

namespace {

// Copies `values` into `targets`, element counts checked first.
void restore_into(const char *who, const std::vector<std::vector<float> *> &targets,
                  const std::vector<std::vector<float>> &values) {
  if (values.size() != targets.size()) {
    throw InvalidArgument(std::string(who) + ": " + std::to_string(values.size()) +
                          " saved arrays for " + std::to_string(targets.size()));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (values[i].size() != targets[i]->size()) {
      throw InvalidArgument(std::string(who) + ": array " + std::to_string(i) + " has " +
                            std::to_string(targets[i]->size()) + " elements, saved " +
                            std::to_string(values[i].size()));
    }
  }
  for (std::size_t i = 0; i < targets.size(); ++i) *targets[i] = values[i];
}

}  // namespace

void restore_values(const std::vector<Parameter *> &params,
                    const std::vector<std::vector<float>> &values) {
  std::vector<std::vector<float> *> targets;
  for (Parameter *p : params) targets.push_back(&p->value);
  restore_into("restore_values", targets, values);
}

std::vector<std::vector<float>> snapshot_persistents(Link &model) {
  std::vector<std::vector<float>> values;
  for (const std::vector<float> *p : model.persistents()) values.push_back(*p);
  return values;
}

void restore_persistents(Link &model, const std::vector<std::vector<float>> &values) {
  restore_into("restore_persistents", model.persistents(), values);
}

}  // namespace mncl
