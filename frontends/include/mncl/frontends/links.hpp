// A deliberately small neural-network toolkit, enough for MLP examples and the model-parallel
// chain: a float Tensor, Parameters (value + gradient), and Links with forward/backward.
//
// Links cache what backward needs during forward, so one backward follows each forward.
// backward() *overwrites* the parameters' gradients (no accumulation, no zero_grad needed).
// Any tensor library can join by implementing Link.
#ifndef MNCL_FRONTENDS_LINKS_HPP
#define MNCL_FRONTENDS_LINKS_HPP

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mncl/frontends/optimizer.hpp"
#include "mncl/frontends/serialize.hpp"
#include "mncl/frontends/span.hpp"

namespace mncl {

// A dense row-major float tensor. MLP activations are 2-D: {batch, features}.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape_, float fill = 0.0f)
      : shape(std::move(shape_)), data(element_count(shape), fill) {}
  Tensor(std::vector<int64_t> shape_, std::vector<float> data_);

  static std::size_t element_count(const std::vector<int64_t> &shape);
  bool empty() const noexcept { return shape.empty(); }
  std::size_t size() const noexcept { return data.size(); }
  // For 2-D tensors.
  int64_t rows() const { return shape.at(0); }
  int64_t cols() const { return shape.at(1); }
  float &at(int64_t row, int64_t col) { return data[static_cast<std::size_t>(row * cols() + col)]; }
  float at(int64_t row, int64_t col) const {
    return data[static_cast<std::size_t>(row * cols() + col)];
  }
  std::string shape_string() const;

  void save(OutArchive &ar) const { ar << shape << data; }
  void load(InArchive &ar);
};

struct Parameter {
  std::string name;
  std::vector<float> value;
  std::vector<float> grad;

  void save(OutArchive &ar) const { ar << name << value; }
  void load(InArchive &ar);
};

class Link {
 public:
  virtual ~Link() = default;
  virtual Tensor forward(const Tensor &x) = 0;
  // Gradient of the loss w.r.t. the last forward's input, given the one w.r.t. its output;
  // also sets the parameters' gradients.
  virtual Tensor backward(const Tensor &grad_y) = 0;
  virtual std::vector<Parameter *> parameters() { return {}; }
  // State that is learned but not trained by gradients (batch normalization's running
  // statistics): what allreduce_persistent averages and a checkpoint should keep.
  virtual std::vector<std::vector<float> *> persistents() { return {}; }
  // Training (batch statistics) or evaluation (running statistics) mode, for the links that
  // have one; containers pass it on.
  virtual void set_training(bool /*training*/) {}
  virtual std::string name() const = 0;
};

// y = x W + b, with W stored {in, out} so both the forward product and the weight gradient
// stream through contiguous rows. Initialisation: He-uniform from `seed` (deterministic).
class Dense : public Link {
 public:
  // compute_input_grad = false skips dL/dx (the first layer of a network never needs it).
  Dense(int64_t in_features, int64_t out_features, uint64_t seed, bool compute_input_grad = true);
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::vector<Parameter *> parameters() override { return {&weight_, &bias_}; }
  std::string name() const override;

  Parameter &weight() { return weight_; }
  Parameter &bias() { return bias_; }

  // Rows [row_begin, row_end) x columns [col_begin, col_end) of the weights Dense(in, out,
  // seed) starts with, row-major, computed without the rest of the matrix: what a
  // tensor-parallel shard of that layer starts with (tensor_parallel.hpp).
  static std::vector<float> initial_weights(int64_t in_features, int64_t out_features,
                                            uint64_t seed, int64_t row_begin, int64_t row_end,
                                            int64_t col_begin, int64_t col_end);

 private:
  int64_t in_, out_;
  bool compute_input_grad_;
  Parameter weight_, bias_;
  Tensor input_;
};

class ReLU : public Link {
 public:
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::string name() const override { return "ReLU"; }

 private:
  Tensor output_;
};

// Links applied in order (a Chain of one rank).
class Sequential : public Link {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Link>> links) : links_(std::move(links)) {}
  Sequential &add(std::shared_ptr<Link> link) {
    links_.push_back(std::move(link));
    return *this;
  }
  template <class L, class... Args>
  Sequential &emplace(Args &&...args) {
    return add(std::make_shared<L>(std::forward<Args>(args)...));
  }
  Tensor forward(const Tensor &x) override;
  Tensor backward(const Tensor &grad_y) override;
  std::vector<Parameter *> parameters() override;
  std::vector<std::vector<float> *> persistents() override;
  void set_training(bool training) override;
  std::string name() const override;
  const std::vector<std::shared_ptr<Link>> &links() const { return links_; }
  // Puts `link` in place of link `index` (InvalidArgument past the end, or for no link).
  void replace(std::size_t index, std::shared_ptr<Link> link);

 private:
  std::vector<std::shared_ptr<Link>> links_;
};

// Mean softmax cross-entropy over a batch of logits {batch, classes} and integer labels.
class SoftmaxCrossEntropy {
 public:
  // Returns the mean loss; remembers the probabilities for backward() and accuracy().
  float forward(const Tensor &logits, Span<const int32_t> labels);
  // dLoss/dlogits of the last forward (already divided by the batch size).
  Tensor backward() const;
  // Correctly classified samples of the last forward (argmax == label).
  std::size_t correct() const noexcept { return correct_; }

 private:
  Tensor probabilities_;
  std::vector<int32_t> labels_;
  std::size_t correct_ = 0;
};

// The spans an optimizer update takes, for a set of parameters.
ParamSpans value_spans(const std::vector<Parameter *> &params);
GradSpans grad_spans(const std::vector<Parameter *> &params);

// Parameter values as one serializable blob (for checkpoints), and back (sizes must match).
std::vector<std::vector<float>> snapshot_values(const std::vector<Parameter *> &params);
void restore_values(const std::vector<Parameter *> &params,
                    const std::vector<std::vector<float>> &values);
// The same for a model's persistent values (running statistics).
std::vector<std::vector<float>> snapshot_persistents(Link &model);
void restore_persistents(Link &model, const std::vector<std::vector<float>> &values);

}  // namespace mncl

#endif  // MNCL_FRONTENDS_LINKS_HPP
