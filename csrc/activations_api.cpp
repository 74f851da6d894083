// The C++ API of the activations and add (csrc/include/torchext/activations.h): each function finds its registered op
// once and calls it through the dispatcher.
#include <torchext/activations.h>

#include "api.h"

namespace torchext {

namespace {
using Tensor = at::Tensor;
using Unary = Tensor(const Tensor&);
}  // namespace

Tensor relu(const Tensor& input) {
  static const auto op = find_op<Unary>("torchext::relu");
  check_defined("relu", "input", input);
  return op.call(input);
}

Tensor leaky_relu(const Tensor& input, double negative_slope) {
  static const auto op = find_op<Tensor(const Tensor&, double)>("torchext::leaky_relu");
  check_defined("leaky_relu", "input", input);
  return op.call(input, negative_slope);
}

Tensor sigmoid(const Tensor& input) {
  static const auto op = find_op<Unary>("torchext::sigmoid");
  check_defined("sigmoid", "input", input);
  return op.call(input);
}

Tensor tanh(const Tensor& input) {
  static const auto op = find_op<Unary>("torchext::tanh");
  check_defined("tanh", "input", input);
  return op.call(input);
}

Tensor gelu(const Tensor& input, std::string_view approximate) {
  static const auto op = find_op<Tensor(const Tensor&, c10::string_view)>("torchext::gelu");
  check_defined("gelu", "input", input);
  return op.call(input, approximate);
}

Tensor silu(const Tensor& input) {
  static const auto op = find_op<Unary>("torchext::silu");
  check_defined("silu", "input", input);
  return op.call(input);
}

Tensor add(const Tensor& input, const Tensor& other) {
  static const auto op = find_op<Tensor(const Tensor&, const Tensor&)>("torchext::add");
  check_defined("add", "input", input);
  check_defined("add", "other", other);
  return op.call(input, other);
}

namespace nn {

Tensor ReLUImpl::forward(const Tensor& input) { return torchext::relu(input); }
void ReLUImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::ReLU()"; }

Tensor LeakyReLUImpl::forward(const Tensor& input) { return torchext::leaky_relu(input, options.negative_slope()); }
void LeakyReLUImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::LeakyReLU(negative_slope=" << options.negative_slope() << ")";
}

Tensor SigmoidImpl::forward(const Tensor& input) { return torchext::sigmoid(input); }
void SigmoidImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::Sigmoid()"; }

Tensor TanhImpl::forward(const Tensor& input) { return torchext::tanh(input); }
void TanhImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::Tanh()"; }

Tensor GELUImpl::forward(const Tensor& input) { return torchext::gelu(input, options.approximate()); }
void GELUImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::GELU(approximate=" << options.approximate() << ")";
}

Tensor SiLUImpl::forward(const Tensor& input) { return torchext::silu(input); }
void SiLUImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::SiLU()"; }

}  // namespace nn
}  // namespace torchext
