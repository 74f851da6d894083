// The C++ API of conv2d and conv2d_stats (csrc/include/torchext/conv2d.h). The module's 'same' padding is computed
// as torchext/functional.py does (and ATen's _convolution_mode): dilation (k - 1) in total per dimension, half on
// each side, the odd one after the input (one pad).
#include <ATen/ATen.h>
#include <torch/nn/functional/padding.h>
#include <torchext/conv2d.h>

#include <sstream>
#include <variant>

#include "api.h"
#include "conv2d.h"

namespace torchext {
namespace {

// The public header's list of the CUDA ladder's names (for LibTorch programs, without the engine's headers) must be
// the engine's (cuda_ops/conv2d_args.h, through conv2d.h): checked here, at compile time.
constexpr bool same_name(const char* a, const char* b) { return *a == *b && (*a == '\0' || same_name(a + 1, b + 1)); }
constexpr bool same_kernel_names() {
  constexpr size_t n = sizeof(kConv2dKernels) / sizeof(kConv2dKernels[0]);
  if (n != sizeof(cuda_ops::kConv2dKernelNames) / sizeof(cuda_ops::kConv2dKernelNames[0])) return false;
  for (size_t i = 0; i < n; ++i) {
    if (!same_name(kConv2dKernels[i], cuda_ops::kConv2dKernelNames[i])) return false;
  }
  return true;
}
static_assert(same_kernel_names(), "torchext::kConv2dKernels (csrc/include/torchext/conv2d.h) must list "
              "cuda_ops::kConv2dKernelNames (cuda_ops/conv2d_args.h) in the same order");

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using Variant = std::optional<c10::string_view>;
using Conv2dSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, int64_t, c10::string_view, Variant);
using Conv2dStatsSignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                                int64_t, Variant);

torch::nn::functional::PadFuncOptions::mode_t pad_mode(const torch::nn::detail::conv_padding_mode_t& mode) {
  if (std::holds_alternative<torch::enumtype::kReflect>(mode)) return torch::kReflect;
  if (std::holds_alternative<torch::enumtype::kReplicate>(mode)) return torch::kReplicate;
  return torch::kCircular;
}

// int[2] arguments given as one value, expanded to both dimensions as Python's argument parsing does for the schema
// (so that the kernels' messages quote the same two values from both languages); any other length goes to the
// kernel's check as it is.
std::vector<int64_t> pair(at::IntArrayRef values) {
  return values.size() == 1 ? std::vector<int64_t>{values[0], values[0]} : values.vec();
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const OptionalTensor& bias, at::IntArrayRef stride,
              at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::string_view activation,
              std::optional<std::string_view> kernel) {
  static const auto op = find_op<Conv2dSignature>("torchext::conv2d");
  check_defined("conv2d", "input", input);
  check_defined("conv2d", "weight", weight);
  return op.call(input, weight, bias, pair(stride), pair(padding), pair(dilation), groups, activation, kernel);
}

std::tuple<Tensor, Tensor, Tensor> conv2d_stats(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation, int64_t groups,
                                                std::optional<std::string_view> kernel) {
  static const auto op = find_op<Conv2dStatsSignature>("torchext::conv2d_stats");
  check_defined("conv2d_stats", "input", input);
  check_defined("conv2d_stats", "weight", weight);
  return op.call(input, weight, bias, pair(stride), pair(padding), pair(dilation), groups, kernel);
}

namespace nn {

Conv2dImpl::Conv2dImpl(const torch::nn::Conv2dOptions& o, std::string activation_)
    : ConvNdImpl(torch::nn::detail::ConvNdOptions<2>(o.in_channels(), o.out_channels(), o.kernel_size())
                     .stride(o.stride())
                     .padding(o.padding())
                     .dilation(o.dilation())
                     .transposed(false)
                     .output_padding(0)
                     .groups(o.groups())
                     .bias(o.bias())
                     .padding_mode(o.padding_mode())),
      activation(std::move(activation_)) {
  parse_conv2d_activation("torchext::nn::Conv2d", activation);  // a clear error now rather than at the first forward
}

Tensor Conv2dImpl::forward(const Tensor& input) {
  check_defined("nn::Conv2d::forward", "input", input);
  const bool unbatched = input.dim() == 3;
  Tensor x = unbatched ? input.unsqueeze(0) : input;
  std::vector<int64_t> padding{0, 0};
  if (!std::holds_alternative<torch::enumtype::kZeros>(options.padding_mode())) {
    // As torch::nn::Conv2d: pad by the mode first (reset() computed the amounts, 'same' included), then no padding.
    namespace F = torch::nn::functional;
    x = F::pad(x, F::PadFuncOptions(_reversed_padding_repeated_twice).mode(pad_mode(options.padding_mode())));
  } else if (std::holds_alternative<torch::enumtype::kSame>(options.padding())) {
    std::vector<int64_t> extra(2);
    for (int d = 0; d < 2; ++d) {
      const int64_t total = (*options.dilation())[d] * ((*options.kernel_size())[d] - 1);
      padding[d] = total / 2;
      extra[d] = total - 2 * padding[d];
    }
    if (extra[0] || extra[1]) x = at::constant_pad_nd(x, {0, extra[1], 0, extra[0]});
  } else if (const auto* amounts = std::get_if<torch::ExpandingArray<2>>(&options.padding())) {
    padding = {(**amounts)[0], (**amounts)[1]};
  }
  const Tensor out = torchext::conv2d(x, weight, as_optional(bias), *options.stride(), padding, *options.dilation(),
                                      options.groups(), activation);
  return unbatched ? out.squeeze(0) : out;
}

void Conv2dImpl::pretty_print(std::ostream& stream) const {
  std::ostringstream base;
  ConvNdImpl::pretty_print(base);  // "torch::nn::Conv2d(3, 8, kernel_size=[3, 3], ...)"
  std::string text = base.str();
  text.replace(0, text.find("::Conv2d"), "torchext::nn");
  if (activation != "none") text.insert(text.size() - 1, ", activation=" + activation);
  stream << text;
}

}  // namespace nn
}  // namespace torchext
