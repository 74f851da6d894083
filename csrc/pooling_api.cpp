// The C++ API of max_pool2d, avg_pool2d and adaptive_avg_pool2d (csrc/include/torchext/pooling.h). int[2] arguments
// given as one value are expanded to both dimensions, as Python's wrappers (torchext/ops/pooling.py) do, so that the
// kernels' messages quote the same two values from both languages.
#include <ATen/ATen.h>
#include <torchext/pooling.h>

#include <sstream>
#include <vector>

#include "api.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using IntArrayRef = at::IntArrayRef;
using MaxPool2dSignature = std::tuple<Tensor, Tensor>(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef,
                                                      bool);
using AvgPool2dSignature = Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool,
                                  std::optional<int64_t>);
using AdaptiveAvgPool2dSignature = Tensor(const Tensor&, IntArrayRef);

std::vector<int64_t> pair(IntArrayRef values) {
  return values.size() == 1 ? std::vector<int64_t>{values[0], values[0]} : values.vec();
}

// torch's "torch::nn::MaxPool2d(...)" with the torchext::nn prefix.
template <typename Base>
void print_as_torchext(const Base& module, std::ostream& stream) {
  std::ostringstream base;
  module.Base::pretty_print(base);
  std::string text = base.str();
  if (text.rfind("torch::nn::", 0) == 0) text.replace(0, 5, "torchext");
  stream << text;
}

}  // namespace

std::tuple<Tensor, Tensor> max_pool2d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                                      IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
  static const auto op = find_op<MaxPool2dSignature>("torchext::max_pool2d");
  check_defined("max_pool2d", "input", input);
  return op.call(input, pair(kernel_size), pair(stride), pair(padding), pair(dilation), ceil_mode);
}

Tensor avg_pool2d(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding, bool ceil_mode,
                  bool count_include_pad, std::optional<int64_t> divisor_override) {
  static const auto op = find_op<AvgPool2dSignature>("torchext::avg_pool2d");
  check_defined("avg_pool2d", "input", input);
  return op.call(input, pair(kernel_size), pair(stride), pair(padding), ceil_mode, count_include_pad, divisor_override);
}

Tensor adaptive_avg_pool2d(const Tensor& input, IntArrayRef output_size) {
  static const auto op = find_op<AdaptiveAvgPool2dSignature>("torchext::adaptive_avg_pool2d");
  check_defined("adaptive_avg_pool2d", "input", input);
  return op.call(input, pair(output_size));
}

namespace nn {

Tensor MaxPool2dImpl::forward(const Tensor& input) { return std::get<0>(forward_with_indices(input)); }

std::tuple<Tensor, Tensor> MaxPool2dImpl::forward_with_indices(const Tensor& input) {
  check_defined("nn::MaxPool2d::forward", "input", input);
  return torchext::max_pool2d(input, *options.kernel_size(), *options.stride(), *options.padding(), *options.dilation(),
                              options.ceil_mode());
}

// As torch::nn::MaxPool2d prints itself.
void MaxPool2dImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "torchext::nn::MaxPool2d(kernel_size=" << options.kernel_size()
         << ", stride=" << options.stride() << ", padding=" << options.padding() << ", dilation=" << options.dilation()
         << ", ceil_mode=" << options.ceil_mode() << ")";
}

Tensor AvgPool2dImpl::forward(const Tensor& input) {
  check_defined("nn::AvgPool2d::forward", "input", input);
  return torchext::avg_pool2d(input, *options.kernel_size(), *options.stride(), *options.padding(), options.ceil_mode(),
                              options.count_include_pad(), options.divisor_override());
}

// As torch::nn::AvgPool2d prints itself.
void AvgPool2dImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::AvgPool2d(kernel_size=" << options.kernel_size() << ", stride=" << options.stride()
         << ", padding=" << options.padding() << ")";
}

Tensor AdaptiveAvgPool2dImpl::forward(const Tensor& input) {
  check_defined("nn::AdaptiveAvgPool2d::forward", "input", input);
  TORCH_CHECK_VALUE(input.dim() >= 2, "torchext::nn::AdaptiveAvgPool2d: `input` must have at least 2 dimensions, got ",
                    input.dim());
  const auto& requested = *options.output_size();
  std::vector<int64_t> output_size(2);
  for (int d = 0; d < 2; ++d) output_size[d] = requested[d].value_or(input.size(input.dim() - 2 + d));
  return torchext::adaptive_avg_pool2d(input, output_size);
}

void AdaptiveAvgPool2dImpl::pretty_print(std::ostream& stream) const {
  print_as_torchext<torch::nn::AdaptiveAvgPoolImpl<2, torch::ExpandingArrayWithOptionalElem<2>, AdaptiveAvgPool2dImpl>>(
      *this, stream);
}

}  // namespace nn
}  // namespace torchext
