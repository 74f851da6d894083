// The C++ API of matmul, matmul_kernel and linear (csrc/include/torchext/matmul.h).
#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torchext/matmul.h>

#include <cmath>
#include <tuple>

#include "api.h"
#include "matmul.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using Variant = std::optional<c10::string_view>;
using LinearSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                   c10::string_view);

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, std::optional<std::string_view> kernel) {
  static const auto op = find_op<Tensor(const Tensor&, const Tensor&, Variant)>("torchext::matmul");
  check_defined("matmul", "a", a);
  check_defined("matmul", "b", b);
  return op.call(a, b, kernel);
}

std::string matmul_kernel(const Tensor& a, const Tensor& b, std::optional<std::string_view> kernel) {
  static const auto op = find_op<std::string(const Tensor&, const Tensor&, Variant)>("torchext::matmul_kernel");
  check_defined("matmul_kernel", "a", a);
  check_defined("matmul_kernel", "b", b);
  return op.call(a, b, kernel);
}

Tensor linear(const Tensor& input, const Tensor& weight, const OptionalTensor& bias, std::string_view activation) {
  static const auto op = find_op<LinearSignature>("torchext::linear");
  check_defined("linear", "input", input);
  check_defined("linear", "weight", weight);
  return std::get<0>(op.call(input, weight, bias, activation));
}

namespace nn {

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_, std::string activation_)
    : options(options_), activation(std::move(activation_)) {
  parse_activation("torchext::nn::Linear", activation);  // a clear error now rather than at the first forward
  reset();
}

// As torch::nn::LinearImpl: the same parameters, registered under the same names, initialised the same way.
void LinearImpl::reset() {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const double bound = 1 / std::sqrt(fan_in);
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

Tensor LinearImpl::forward(const Tensor& input) {
  return torchext::linear(input, weight, as_optional(bias), activation);
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "torchext::nn::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << options.bias() << ", activation=" << activation
         << ")";
}

}  // namespace nn
}  // namespace torchext
