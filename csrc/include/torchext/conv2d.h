// 2-D convolution from C++: conv2d (act(conv(input, weight) + bias), act "none" or "relu" fused into the kernel),
// conv2d_stats (conv2d plus the per-output-channel sum and sum of squares of its output), and the module
// torchext::nn::Conv2d. input (N, C, H, W), weight (K, C / groups, kH, kW), bias (K); stride, padding and dilation
// take one value (both dimensions) or two. The output is channels-last when input or weight is (csrc/conv2d.h's
// layout rule, torch's). Source: csrc/conv2d_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>

namespace torchext {

// The CUDA ladder, slowest first (cuda_ops/conv2d_args.h); CPU tensors run "cpu".
inline constexpr const char* kConv2dKernels[] = {"direct",       "im2col",         "implicit_simt",
                                                 "implicit_mma", "implicit_wgmma", "implicit_tma"};

// `kernel` names one rung of the CUDA ladder (kConv2dKernels; "cpu" on the CPU); nullopt picks the fastest that
// supports the arguments (and is passed on to the backward).
at::Tensor conv2d(const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias = std::nullopt, at::IntArrayRef stride = 1,
                  at::IntArrayRef padding = 0, at::IntArrayRef dilation = 1, int64_t groups = 1,
                  std::string_view activation = "none", std::optional<std::string_view> kernel = std::nullopt);
// (out, sum, sum_sq): sum and sum_sq are float32 for float16 / bfloat16 / float32 inputs, float64 for float64.
std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_stats(const at::Tensor& input, const at::Tensor& weight,
                                                            const std::optional<at::Tensor>& bias = std::nullopt,
                                                            at::IntArrayRef stride = 1, at::IntArrayRef padding = 0,
                                                            at::IntArrayRef dilation = 1, int64_t groups = 1,
                                                            std::optional<std::string_view> kernel = std::nullopt);

namespace nn {

// torch::nn::Conv2d computed by torchext's conv2d: the same options (padding an amount, torch::kValid or
// torch::kSame; every padding_mode), parameters, initialisation and state-dict keys (torch's own ConvNdImpl holds
// them), batched (N, C, H, W) or unbatched (C, H, W) input; plus `activation` ("none" or "relu", fused).
class Conv2dImpl : public torch::nn::ConvNdImpl<2, Conv2dImpl> {
 public:
  Conv2dImpl(int64_t input_channels, int64_t output_channels, torch::ExpandingArray<2> kernel_size,
             std::string activation = "none")
      : Conv2dImpl(torch::nn::Conv2dOptions(input_channels, output_channels, kernel_size), std::move(activation)) {}
  explicit Conv2dImpl(const torch::nn::Conv2dOptions& options_, std::string activation = "none");
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::string activation;
};
TORCH_MODULE(Conv2d);

}  // namespace nn
}  // namespace torchext
