// Pooling from C++: max_pool2d, avg_pool2d and adaptive_avg_pool2d with torch.nn.functional's semantics, and the
// modules torchext::nn::MaxPool2d, AvgPool2d and AdaptiveAvgPool2d. Input (N, C, H, W) or unbatched (C, H, W);
// float32, float64, float16 and bfloat16 on CPU and CUDA. kernel_size, stride, padding and dilation take one value
// (both dimensions) or two; an empty stride ({}) means the kernel size; padding is at most half the kernel. The
// output (and max_pool2d's indices) is channels-last when a 4-D input suggests channels-last (csrc/pooling.h).
// Differentiable, double backward included. Source: csrc/pooling_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <tuple>

namespace torchext {

// (out, indices), as at::max_pool2d_with_indices and torchext.ops.max_pool2d: indices int64, ih * W + iw within each
// (H, W) plane; NaN propagates.
std::tuple<at::Tensor, at::Tensor> max_pool2d(const at::Tensor& input, at::IntArrayRef kernel_size,
                                              at::IntArrayRef stride = {}, at::IntArrayRef padding = 0,
                                              at::IntArrayRef dilation = 1, bool ceil_mode = false);
at::Tensor avg_pool2d(const at::Tensor& input, at::IntArrayRef kernel_size, at::IntArrayRef stride = {},
                      at::IntArrayRef padding = 0, bool ceil_mode = false, bool count_include_pad = true,
                      std::optional<int64_t> divisor_override = std::nullopt);
// output_size: one value (both dimensions) or two, each >= 0.
at::Tensor adaptive_avg_pool2d(const at::Tensor& input, at::IntArrayRef output_size);

namespace nn {

// torch::nn's pooling modules computed by the functions above: the same options and constructors, batched or
// unbatched input, printed as torch's with the torchext::nn prefix. (MaxPool2d and AvgPool2d hold their options
// themselves: libtorch's MaxPoolImpl / AvgPoolImpl bases are defined only for torch's own modules.)
class MaxPool2dImpl : public torch::nn::Cloneable<MaxPool2dImpl> {
 public:
  MaxPool2dImpl(torch::ExpandingArray<2> kernel_size) : MaxPool2dImpl(torch::nn::MaxPool2dOptions(kernel_size)) {}
  explicit MaxPool2dImpl(const torch::nn::MaxPool2dOptions& options_) : options(options_) {}
  void reset() override {}
  at::Tensor forward(const at::Tensor& input);
  // (out, indices), as torch::nn::MaxPool2d's.
  std::tuple<at::Tensor, at::Tensor> forward_with_indices(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  torch::nn::MaxPool2dOptions options;
};
TORCH_MODULE(MaxPool2d);

class AvgPool2dImpl : public torch::nn::Cloneable<AvgPool2dImpl> {
 public:
  AvgPool2dImpl(torch::ExpandingArray<2> kernel_size) : AvgPool2dImpl(torch::nn::AvgPool2dOptions(kernel_size)) {}
  explicit AvgPool2dImpl(const torch::nn::AvgPool2dOptions& options_) : options(options_) {}
  void reset() override {}
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  torch::nn::AvgPool2dOptions options;
};
TORCH_MODULE(AvgPool2d);

// output_size entries may be nullopt: that dimension keeps the input's size.
class AdaptiveAvgPool2dImpl
    : public torch::nn::AdaptiveAvgPoolImpl<2, torch::ExpandingArrayWithOptionalElem<2>, AdaptiveAvgPool2dImpl> {
 public:
  using torch::nn::AdaptiveAvgPoolImpl<2, torch::ExpandingArrayWithOptionalElem<2>,
                                       AdaptiveAvgPool2dImpl>::AdaptiveAvgPoolImpl;
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
};
TORCH_MODULE(AdaptiveAvgPool2d);

}  // namespace nn
}  // namespace torchext
