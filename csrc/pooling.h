// Argument checks, output sizes and the layout rule shared by the CPU and CUDA backends of torchext::max_pool2d,
// avg_pool2d, adaptive_avg_pool2d and their *_backward ops.
//
// Input: (N, C, H, W), or (C, H, W) unbatched (run as N = 1; the results are 3-D as well). As torch: N may be 0, C,
// H and W may not (adaptive_avg_pool2d: C may be 0 too; H and W may not).
//
// Output size of a max / avg pool along one dimension (torch's pooling_output_shape): with the window's span
// d (k - 1) + 1,
//   out = floor((in + 2 pad - span) / stride) + 1                       (ceil_mode false)
//   out = ceil((in + 2 pad - span) / stride) + 1, less one if the last window would start at or past in + pad
//                                                                       (ceil_mode true: a window may hang over the
//                                                                       right edge, but never starts in the right
//                                                                       padding or beyond it)
// and out must be at least 1. Window o covers rows o stride - pad + i d for i < k; rows outside [0, in) are the
// padding: -inf for max, zeros for avg. adaptive_avg_pool2d's window o covers [floor(o in / out),
// ceil((o + 1) in / out)).
//
// Layout rule (both backends and the fake kernels in torchext/ops/pooling.py): the output (and max_pool2d's
// indices) is channels-last when a 4-D input suggests channels-last (input.suggest_memory_format(), as
// csrc/conv2d.h's rule and torch's pooling), otherwise contiguous; 3-D results are contiguous. grad_input follows
// the same rule from input. The kernels read any input layout (sliced, expanded, ...) through its strides.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string_view>
#include <vector>

#include "checks.h"
#include "pooling_args.h"

namespace torchext {

namespace pooling_detail {

// int[2] arguments: one value (both dimensions) or two; `empty_as`, when given, stands for an empty list (torch's
// stride=[]: the kernel size).
inline std::array<int64_t, 2> pair(std::string_view op, at::IntArrayRef v, std::string_view name,
                                   const std::array<int64_t, 2>* empty_as = nullptr) {
  if (v.empty() && empty_as != nullptr) return *empty_as;
  TORCH_CHECK_VALUE(v.size() == 1 || v.size() == 2, op, ": `", name, "` must have 1 or 2 values, got ", v.size(),
                    empty_as != nullptr ? " (or none: the kernel size)" : "");
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

inline const char* dim_name(int d) { return d == 0 ? "height" : "width"; }

}  // namespace pooling_detail

// The input's dimensions: 3-D (C, H, W) or 4-D (N, C, H, W); H and W non-empty; C non-empty unless allow_empty_c.
inline void check_pool_input(std::string_view op, const at::Tensor& input, bool allow_empty_c) {
  // Every pooling kernel takes the four floating dtypes on CPU and CUDA (the averages accumulate half types in
  // float32).
  check_floating_or_half(op, input, "input");
  TORCH_CHECK_VALUE(input.dim() == 3 || input.dim() == 4, op,
                    ": `input` must be 4-D (N, C, H, W) or 3-D (C, H, W), got ", input.dim(), "-D with shape ",
                    input.sizes());
  const int64_t c = input.size(-3), h = input.size(-2), w = input.size(-1);
  TORCH_CHECK_VALUE(h > 0 && w > 0 && (allow_empty_c || c > 0), op, ": `input` must have non-empty ",
                    allow_empty_c ? "height and width" : "channels, height and width",
                    " (only the batch dimension may be 0), got shape ", input.sizes());
}

// The input viewed as (N, C, H, W): itself, or a 3-D input with N = 1 in front.
inline at::Tensor as_4d(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(0) : t; }

// The layout rule (see the top of this file), for the output given `input`, and for grad_input.
inline at::MemoryFormat pool_memory_format(const at::Tensor& input) {
  return input.dim() == 4 && input.suggest_memory_format() == at::MemoryFormat::ChannelsLast
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

// One output dimension of a max / avg pool (the formula at the top of this file).
inline int64_t pool_output_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                                bool ceil_mode) {
  const int64_t span = dilation * (kernel - 1) + 1;
  const int64_t num = in + 2 * pad - span + (ceil_mode ? stride - 1 : 0);
  // Floor division (num may be negative: the window is larger than the padded input).
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// The checks of max_pool2d (dilation given) and avg_pool2d (dilation 1): kernel_size >= 1, stride >= 1 (none: the
// kernel size), 0 <= padding <= kernel_size / 2, dilation >= 1, and an output of at least 1 x 1. Returns the
// geometry of the (N, C, H, W) view of input.
inline cuda_ops::Pool2dGeometry check_pool2d_args(std::string_view op, const at::Tensor& input,
                                                  at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                  at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  using pooling_detail::dim_name;
  using pooling_detail::pair;
  check_pool_input(op, input, /*allow_empty_c=*/false);
  const std::array<int64_t, 2> k = pair(op, kernel_size, "kernel_size");
  for (int d = 0; d < 2; ++d) {
    TORCH_CHECK_VALUE(k[d] >= 1, op, ": `kernel_size` must be at least 1, got ", kernel_size);
  }
  const std::array<int64_t, 2> s = pair(op, stride, "stride", &k);
  const std::array<int64_t, 2> p = pair(op, padding, "padding");
  const std::array<int64_t, 2> dl = pair(op, dilation, "dilation");
  for (int d = 0; d < 2; ++d) {
    TORCH_CHECK_VALUE(s[d] >= 1, op, ": `stride` must be at least 1, got ", stride);
    TORCH_CHECK_VALUE(dl[d] >= 1, op, ": `dilation` must be at least 1, got ", dilation);
    TORCH_CHECK_VALUE(p[d] >= 0, op, ": `padding` must be non-negative, got ", padding);
    TORCH_CHECK_VALUE(p[d] <= k[d] / 2, op, ": `padding` must be at most half of `kernel_size` (", k[d] / 2,
                      " for a kernel ", dim_name(d), " of ", k[d], "), got ", p[d]);
  }
  const at::Tensor x = as_4d(input);
  cuda_ops::Pool2dGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.kh = k[0];
  g.kw = k[1];
  g.sh = s[0];
  g.sw = s[1];
  g.ph = p[0];
  g.pw = p[1];
  g.dh = dl[0];
  g.dw = dl[1];
  g.oh = pool_output_size(g.h, g.kh, g.ph, g.sh, g.dh, ceil_mode);
  g.ow = pool_output_size(g.w, g.kw, g.pw, g.sw, g.dw, ceil_mode);
  TORCH_CHECK_VALUE(g.oh >= 1 && g.ow >= 1, op, ": the output would be empty: `input` is ", g.h, " x ", g.w,
                    ", padding ", p[0], " x ", p[1], ", the window spans ", g.dh * (g.kh - 1) + 1, " x ",
                    g.dw * (g.kw - 1) + 1, " (kernel_size ", kernel_size, ", dilation ", dilation,
                    "), which gives an output of ", g.oh, " x ", g.ow, "; it must be at least 1 x 1");
  return g;
}

// avg_pool2d's divisor_override: none, or non-zero.
inline int64_t check_divisor_override(std::string_view op, const std::optional<int64_t>& divisor_override) {
  if (!divisor_override.has_value()) return 0;
  TORCH_CHECK_VALUE(*divisor_override != 0, op,
                    ": `divisor_override` must not be 0 (None divides by the window's size)");
  return *divisor_override;
}

// adaptive_avg_pool2d's checks: output_size entries >= 0 (as torch: 0 gives an empty output). Returns the geometry
// (oh, ow; the kernel fields unused).
inline cuda_ops::Pool2dGeometry check_adaptive_avg_pool2d_args(std::string_view op, const at::Tensor& input,
                                                               at::IntArrayRef output_size) {
  check_pool_input(op, input, /*allow_empty_c=*/true);
  const std::array<int64_t, 2> o = pooling_detail::pair(op, output_size, "output_size");
  TORCH_CHECK_VALUE(o[0] >= 0 && o[1] >= 0, op, ": `output_size` must be non-negative, got ", output_size);
  const at::Tensor x = as_4d(input);
  cuda_ops::Pool2dGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.oh = o[0];
  g.ow = o[1];
  return g;
}

// adaptive_avg_pool2d_backward's checks: input as the forward's; grad_output of input's dimensions, device and
// dtype, with input's N and C. Returns the geometry, the output size taken from grad_output.
inline cuda_ops::Pool2dGeometry check_adaptive_avg_pool2d_backward_args(std::string_view op,
                                                                        const at::Tensor& grad_output,
                                                                        const at::Tensor& input) {
  check_pool_input(op, input, /*allow_empty_c=*/true);
  TORCH_CHECK(grad_output.device() == input.device(), op, ": `grad_output` must be on the same device as `input` (",
              input.device(), "), got ", grad_output.device());
  TORCH_CHECK_TYPE(grad_output.scalar_type() == input.scalar_type(), op,
                   ": `grad_output` must have the same dtype as `input` (", input.scalar_type(), "), got ",
                   grad_output.scalar_type());
  const bool same_lead = grad_output.dim() == input.dim() &&
                         grad_output.sizes().slice(0, input.dim() - 2) == input.sizes().slice(0, input.dim() - 2);
  TORCH_CHECK_VALUE(same_lead, op, ": `grad_output` must have shape (", input.dim() == 4 ? "N, " : "",
                    "C, OH, OW) with `input`'s ", input.dim() == 4 ? "N and C " : "C ",
                    input.sizes().slice(0, input.dim() - 2), ", got ", grad_output.sizes());
  cuda_ops::Pool2dGeometry g = check_adaptive_avg_pool2d_args(op, input, grad_output.sizes().slice(input.dim() - 2));
  return g;
}

// The output's shape: (N, C, OH, OW), or (C, OH, OW) for a 3-D input.
inline std::vector<int64_t> pool_out_shape(const at::Tensor& input, const cuda_ops::Pool2dGeometry& g) {
  if (input.dim() == 3) return {g.c, g.oh, g.ow};
  return {g.n, g.c, g.oh, g.ow};
}

// A backward op's grad_output (and max_pool2d_backward's indices): the forward's output shape, input's device;
// grad_output in input's dtype, indices int64.
inline void check_pool_grad_output(std::string_view op, const at::Tensor& grad_output, const at::Tensor& input,
                                   const cuda_ops::Pool2dGeometry& g, std::string_view name = "grad_output") {
  TORCH_CHECK(grad_output.device() == input.device(), op, ": `", name, "` must be on the same device as `input` (",
              input.device(), "), got ", grad_output.device());
  if (name == "indices") {
    TORCH_CHECK_TYPE(grad_output.scalar_type() == at::kLong, op, ": `indices` must be int64, got ",
                     grad_output.scalar_type());
  } else {
    TORCH_CHECK_TYPE(grad_output.scalar_type() == input.scalar_type(), op, ": `", name,
                     "` must have the same dtype as `input` (", input.scalar_type(), "), got ",
                     grad_output.scalar_type());
  }
  const std::vector<int64_t> shape = pool_out_shape(input, g);
  TORCH_CHECK_VALUE(grad_output.sizes() == at::IntArrayRef(shape), op, ": `", name, "` must have shape ",
                    at::IntArrayRef(shape), " (the forward's output), got ", grad_output.sizes());
}

// The output (max_pool2d's indices too) as a 4-D tensor in the layout rule's format, of `dtype`.
inline at::Tensor empty_pool_output(const at::Tensor& input, const cuda_ops::Pool2dGeometry& g, at::ScalarType dtype) {
  return at::empty({g.n, g.c, g.oh, g.ow}, input.options().dtype(dtype).memory_format(pool_memory_format(input)));
}

// grad_input as a 4-D tensor in the layout rule's format.
inline at::Tensor empty_pool_grad_input(const at::Tensor& input) {
  return at::empty(as_4d(input).sizes(), input.options().memory_format(pool_memory_format(input)));
}

// A 4-D result given back with input's dimensions (3-D for an unbatched input).
inline at::Tensor with_input_dims(const at::Tensor& t4, const at::Tensor& input) {
  return input.dim() == 3 ? t4.squeeze(0) : t4;
}

// Whether the results follow channels-last (the kernels then run along C, the fastest dimension).
inline bool pool_channels_last(const at::Tensor& input) {
  return pool_memory_format(input) == at::MemoryFormat::ChannelsLast;
}

// Element strides of a 4-D tensor, (n, c, h, w), for cuda_ops/ and the CPU kernels.
inline cuda_ops::Strides4 strides4(const at::Tensor& t4) {
  return {t4.stride(0), t4.stride(1), t4.stride(2), t4.stride(3)};
}

}  // namespace torchext
