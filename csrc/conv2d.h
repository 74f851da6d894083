// Argument checks, the output shape and the layout rule shared by the CPU and CUDA backends of torchext::conv2d,
// conv2d_stats and conv2d_backward.
//
// Layout rule (obeyed by both backends and the fake kernels in torchext/ops/conv2d.py): the output and grad_input
// are channels-last when `input` or `weight` suggests channels-last (suggest_memory_format(), torch's rule for its
// convolutions: a model whose weights are channels-last runs channels-last from its first convolution on, whatever
// its input's layout), otherwise contiguous (NCHW). grad_weight is contiguous when weight is, channels-last when
// weight suggests it; grad_bias is contiguous.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string_view>
#include <vector>

#include "checks.h"
#include "conv2d_args.h"
#include "matmul.h"

namespace torchext {

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

namespace conv2d_detail {

// int[2] arguments: one value (used for both dimensions) or two.
inline std::array<int64_t, 2> pair(std::string_view op, at::IntArrayRef v, std::string_view name) {
  TORCH_CHECK_VALUE(v.size() == 1 || v.size() == 2, op, ": `", name, "` must have 1 or 2 values, got ", v.size());
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

}  // namespace conv2d_detail

// conv2d's activation: 'none' or 'relu' (relu's backward needs only the output, which the autograd saves).
inline MatmulActivation parse_conv2d_activation(std::string_view op, std::string_view name) {
  TORCH_CHECK_VALUE(name == "none" || name == "relu", op, ": `activation` must be 'none' or 'relu', got '", name,
                    "'");
  return name == "relu" ? MatmulActivation::relu : MatmulActivation::none;
}

// The forward's checks: input (N, C, H, W), weight (K, C / groups, R, S), bias (K), same device and dtype,
// stride >= 1, padding >= 0, dilation >= 1, groups >= 1 dividing C and K, and an output of at least 1 x 1.
inline Conv2dParams check_conv2d_args(std::string_view op, const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                      at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  using conv2d_detail::pair;
  check_floating(op, input, "input");
  check_same_device(op, input, "input", weight, "weight");
  check_same_dtype(op, input, "input", weight, "weight");
  TORCH_CHECK_VALUE(input.dim() == 4, op, ": `input` must be 4-D (N, C, H, W), got ", input.dim(), "-D with shape ",
                    input.sizes(), " (add a batch dimension with unsqueeze(0) for a single image)");
  TORCH_CHECK_VALUE(weight.dim() == 4, op, ": `weight` must be 4-D (out_channels, in_channels / groups, kH, kW), got ",
                    weight.dim(), "-D with shape ", weight.sizes());
  Conv2dParams p;
  p.stride = pair(op, stride, "stride");
  p.padding = pair(op, padding, "padding");
  p.dilation = pair(op, dilation, "dilation");
  p.groups = groups;
  for (int d = 0; d < 2; ++d) {
    TORCH_CHECK_VALUE(p.stride[d] >= 1, op, ": `stride` must be at least 1, got ", stride);
    TORCH_CHECK_VALUE(p.padding[d] >= 0, op, ": `padding` must be non-negative, got ", padding);
    TORCH_CHECK_VALUE(p.dilation[d] >= 1, op, ": `dilation` must be at least 1, got ", dilation);
  }
  TORCH_CHECK_VALUE(groups >= 1, op, ": `groups` must be at least 1, got ", groups);
  const int64_t c = input.size(1), k = weight.size(0);
  TORCH_CHECK_VALUE(c % groups == 0, op, ": `input`'s ", c, " channels must be divisible by `groups` (", groups, ")");
  TORCH_CHECK_VALUE(k % groups == 0, op, ": `weight`'s ", k, " output channels must be divisible by `groups` (", groups,
                    ")");
  TORCH_CHECK_VALUE(weight.size(1) * groups == c, op, ": `weight` must have ", c / groups,
                    " input channels (dim 1) to match `input`'s ", c, " channels",
                    groups > 1 ? " divided by groups" : "", ", got ", weight.size(1), " (weight is ", weight.sizes(),
                    ", input is ", input.sizes(), ")");
  for (int d = 0; d < 2; ++d) {
    const int64_t size = input.size(2 + d), kernel = weight.size(2 + d);
    const int64_t span = p.dilation[d] * (kernel - 1) + 1;
    TORCH_CHECK_VALUE(size + 2 * p.padding[d] >= span, op, ": `input`'s ", d == 0 ? "height" : "width", " ", size,
                      " plus padding 2 x ", p.padding[d], " is smaller than the kernel's ", d == 0 ? "height" : "width",
                      " ", span, " (dilation included): the output would be empty");
  }
  if (bias.has_value()) {
    check_same_device(op, input, "input", *bias, "bias");
    check_same_dtype(op, input, "input", *bias, "bias");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == k, op, ": `bias` must have shape (", k,
                      ",) (out_channels), got ", bias->sizes());
  }
  return p;
}

// (N, K, P, Q).
inline std::vector<int64_t> conv2d_out_shape(const at::Tensor& input, const at::Tensor& weight,
                                             const Conv2dParams& p) {
  std::vector<int64_t> shape{input.size(0), weight.size(0), 0, 0};
  for (int d = 0; d < 2; ++d) {
    shape[2 + d] = (input.size(2 + d) + 2 * p.padding[d] - p.dilation[d] * (weight.size(2 + d) - 1) - 1) / p.stride[d] + 1;
  }
  return shape;
}

// The layout rule (see the top of this file): of grad_weight given the weight ...
inline at::MemoryFormat conv2d_memory_format(const at::Tensor& t) {
  return t.suggest_memory_format() == at::MemoryFormat::ChannelsLast ? at::MemoryFormat::ChannelsLast
                                                                       : at::MemoryFormat::Contiguous;
}

// ... and of the output and grad_input given the input and the weight.
inline at::MemoryFormat conv2d_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  return conv2d_memory_format(input) == at::MemoryFormat::ChannelsLast ? at::MemoryFormat::ChannelsLast
                                                                        : conv2d_memory_format(weight);
}

// conv2d_backward's checks: the forward's, and grad_output shaped like the forward's output.
inline Conv2dParams check_conv2d_backward_args(std::string_view op, const at::Tensor& grad_output,
                                               const at::Tensor& input, const at::Tensor& weight,
                                               at::IntArrayRef stride, at::IntArrayRef padding,
                                               at::IntArrayRef dilation, int64_t groups) {
  const Conv2dParams p = check_conv2d_args(op, input, weight, std::nullopt, stride, padding, dilation, groups);
  check_same_device(op, input, "input", grad_output, "grad_output");
  check_same_dtype(op, input, "input", grad_output, "grad_output");
  const std::vector<int64_t> shape = conv2d_out_shape(input, weight, p);
  TORCH_CHECK_VALUE(grad_output.sizes() == at::IntArrayRef(shape), op, ": `grad_output` must have shape ",
                    at::IntArrayRef(shape), " (the forward's output), got ", grad_output.sizes());
  return p;
}

// conv2d_backward's grad_weight dtype: the weight's (None), or float32 for a float16 / bfloat16 weight (the float32
// master weight's gradient under autocast, from the float sums without rounding to the weight's dtype).
inline at::ScalarType check_grad_weight_dtype(std::string_view op, const at::Tensor& weight,
                                              std::optional<at::ScalarType> grad_weight_dtype) {
  const at::ScalarType w = weight.scalar_type();
  if (!grad_weight_dtype.has_value() || *grad_weight_dtype == w) return w;
  TORCH_CHECK_TYPE(*grad_weight_dtype == at::kFloat && (w == at::kHalf || w == at::kBFloat16), op,
                   ": `grad_weight_dtype` must be the weight's dtype (", w, ")",
                   w == at::kHalf || w == at::kBFloat16 ? " or float32" : "", ", got ", *grad_weight_dtype);
  return *grad_weight_dtype;
}

// The engine's shape struct for these tensors.
inline cuda_ops::Conv2dShape conv2d_shape(const at::Tensor& input, const at::Tensor& weight, const Conv2dParams& p) {
  cuda_ops::Conv2dShape s;
  s.n = input.size(0);
  s.c = input.size(1);
  s.h = input.size(2);
  s.w = input.size(3);
  s.k = weight.size(0);
  s.r = weight.size(2);
  s.s = weight.size(3);
  const std::vector<int64_t> out = conv2d_out_shape(input, weight, p);
  s.p = out[2];
  s.q = out[3];
  s.stride_h = p.stride[0];
  s.stride_w = p.stride[1];
  s.pad_h = p.padding[0];
  s.pad_w = p.padding[1];
  s.dil_h = p.dilation[0];
  s.dil_w = p.dilation[1];
  s.groups = p.groups;
  return s;
}

// The CUDA ladder's version names (cuda_ops/conv2d_args.h), for messages on either backend.
inline std::string cuda_conv2d_kernel_list() {
  std::string out;
  for (const char* name : cuda_ops::kConv2dKernelNames) out += std::string(out.empty() ? "" : ", ") + "'" + name + "'";
  return out;
}

}  // namespace torchext
