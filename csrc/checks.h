// Argument checks shared by every op. Each message names the op, the argument and what was expected, so a user
// sees "torchext::cross_entropy: `target` must be int64 (class indices), got Float" rather than a crash.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>
#include <string_view>

namespace torchext {

enum class Reduction { None, Mean, Sum };

inline Reduction parse_reduction(std::string_view op, std::string_view reduction) {
  if (reduction == "none") return Reduction::None;
  if (reduction == "mean") return Reduction::Mean;
  if (reduction == "sum") return Reduction::Sum;
  TORCH_CHECK_VALUE(false, op, ": `reduction` must be 'none', 'mean' or 'sum', got '", reduction, "'");
}

// gelu's `approximate`: true for 'tanh', false for 'none'.
inline bool parse_gelu_approximate(std::string_view approximate) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                    "torchext::gelu: `approximate` must be 'none' or 'tanh', got '", approximate, "'");
  return approximate == "tanh";
}

// Floating dtypes each backend implements: float32/float64 on CPU; float32/float64/float16/bfloat16 on CUDA.
inline void check_floating(std::string_view op, const at::Tensor& t, std::string_view name) {
  auto dt = t.scalar_type();
  if (t.is_cuda()) {
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16, op, ": `",
                     name, "` must be float32, float64, float16 or bfloat16 on CUDA, got ", dt);
  } else {
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble, op, ": `", name,
                     "` must be float32 or float64 on CPU (float16/bfloat16 run on CUDA), got ", dt);
  }
}

// The floating dtypes of an op whose CPU kernels take the half types too (add, batch_norm, the pools): float32,
// float64, float16 and bfloat16 on either backend.
inline void check_floating_or_half(std::string_view op, const at::Tensor& t, std::string_view name) {
  const auto dt = t.scalar_type();
  TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16, op, ": `", name,
                   "` must be float32, float64, float16 or bfloat16, got ", dt);
}

inline void check_same_device(std::string_view op, const at::Tensor& a, std::string_view a_name, const at::Tensor& b,
                              std::string_view b_name) {
  TORCH_CHECK(a.device() == b.device(), op, ": `", b_name, "` must be on the same device as `", a_name, "` (",
              a.device(), "), got ", b.device());
}

inline void check_same_dtype(std::string_view op, const at::Tensor& a, std::string_view a_name, const at::Tensor& b,
                             std::string_view b_name) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": `", b_name, "` must have the same dtype as `", a_name,
                   "` (", a.scalar_type(), "), got ", b.scalar_type());
}

inline void check_same_shape(std::string_view op, const at::Tensor& a, std::string_view a_name, const at::Tensor& b,
                             std::string_view b_name) {
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), op, ": `", b_name, "` must have the same shape as `", a_name, "` ",
                    a.sizes(), ", got ", b.sizes());
}

// Checks a second tensor that goes with `a` elementwise: same device, dtype and shape.
inline void check_like(std::string_view op, const at::Tensor& a, std::string_view a_name, const at::Tensor& b,
                       std::string_view b_name) {
  check_same_device(op, a, a_name, b, b_name);
  check_same_dtype(op, a, a_name, b, b_name);
  check_same_shape(op, a, a_name, b, b_name);
}

// Elementwise kernels walk memory as a flat array. That is valid for any non-overlapping dense tensor (contiguous,
// channels-last, permuted...) as long as every operand has the same layout; the output then keeps the input's
// layout (empty_like preserves it). A tensor that is not dense is made contiguous first.
inline at::Tensor dense(const at::Tensor& t) { return t.is_non_overlapping_and_dense() ? t : t.contiguous(); }

// Whether two tensors of the same shape hold their elements in the same memory order: equal strides, leaving out
// dimensions of size 1, whose stride never matters.
inline bool same_strides(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// Whether `t` is one element expanded to its whole shape (every stride of a dimension longer than 1 is 0): the
// gradient that a sum or a mean hands back. Elementwise backward kernels read its single element in place of
// copying it out to the full shape first (torch's TensorIterator does the same).
inline bool is_broadcast_scalar(const at::Tensor& t) {
  if (t.numel() <= 1) return false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1 && t.stride(d) != 0) return false;
  }
  return true;
}

// `t` in the memory layout of the dense tensor `layout` (same shape): `t` itself where it already is, else a copy.
// An elementwise backward gives the gradient the layout of the tensor the forward saved, as torch's own backward
// kernels do: a channels-last network keeps channels-last gradients where grad_output comes in another layout (the
// contiguous gradient of a pooling layer, the expanded gradient of a mean). Making both contiguous instead would
// hand every layer before this one a gradient in the other layout (seen in ResNet-18: cuDNN and batch norm then
// run their slower NCHW kernels through the whole last stage).
inline at::Tensor in_layout_of(const at::Tensor& t, const at::Tensor& layout) {
  if (same_strides(t, layout)) return t;
  at::Tensor out = at::empty_like(layout);
  out.copy_(t);
  return out;
}

}  // namespace torchext
