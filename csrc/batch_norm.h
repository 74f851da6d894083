// Argument checks, the layout rule and the (A, C, B) view shared by the CPU and CUDA backends of torchext::batch_norm,
// batch_norm_relu, batch_norm_add_relu and batch_norm_backward.
//
// Layout rule (obeyed by both backends and the fake kernels in torchext/ops/batch_norm.py): the output, grad_input
// and grad_residual take input.suggest_memory_format() (channels-last for a 4-D input that suggests it,
// channels-last-3d for such a 5-D one, else contiguous), as torch's batch norm does. The kernels read input (and
// residual, grad_out) in that layout: a tensor in another layout (sliced, expanded, transposed) is copied into it
// first. save_mean, save_invstd, grad_weight and grad_bias are contiguous (C,).
//
// The relu mask: uint8, shape ((numel + 7) / 8,): bit j (value 1 << j) of byte u is 1 where element 8 u + j of the
// output, in memory order, passes its gradient: the pre-activation is positive or NaN (relu_backward's rule); the bits
// past numel are 0. Memory order is the layout rule's, so the
// backward, given the same input, reads it in the same order.
//
// Dtypes: input float32, float64, float16 or bfloat16 on both backends. weight, bias, running_mean and running_var
// (each optional) share one dtype: input's, or float32 for a float16 / bfloat16 input (torch's mixed-precision rule).
// The statistics (save_mean, save_invstd, and the optional sum / sum_sq of the stats-from-convolution path) are
// float64 for float64 inputs, else float32. grad_weight and grad_bias take weight's dtype (the statistics' without a
// weight).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "batch_norm_args.h"
#include "checks.h"

namespace torchext {

// The ops' C++ signatures (csrc/ops.cpp's schemas), for typed dispatcher calls (find_op in csrc/autograd.h): the
// Autograd kernels (csrc/batch_norm_autograd.cpp) and the C++ API (csrc/batch_norm_api.cpp) call them.
namespace batch_norm_signatures {
using Tensor = at::Tensor;
using OptionalTensor = std::optional<at::Tensor>;
using Variant = std::optional<c10::string_view>;
using BatchNorm = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const OptionalTensor&, const OptionalTensor&,
                                                     const OptionalTensor&, const OptionalTensor&, bool, double, double,
                                                     const OptionalTensor&, const OptionalTensor&, Variant,
                                                     const OptionalTensor&);
using BatchNormRelu = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const OptionalTensor&,
                                                                 const OptionalTensor&, const OptionalTensor&,
                                                                 const OptionalTensor&, bool, double, double,
                                                                 const OptionalTensor&, const OptionalTensor&, Variant,
                                                                 const OptionalTensor&);
using BatchNormAddRelu = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                    const OptionalTensor&, const OptionalTensor&,
                                                                    const OptionalTensor&, bool, double, double,
                                                                    const OptionalTensor&, const OptionalTensor&,
                                                                    Variant, const OptionalTensor&);
using BatchNormBackward = std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&,
                                                                     const OptionalTensor&, const Tensor&,
                                                                     const Tensor&, const OptionalTensor&, bool, double,
                                                                     std::array<bool, 4>, Variant);
}  // namespace batch_norm_signatures

// The layout rule (see the top of this file).
inline at::MemoryFormat batch_norm_memory_format(const at::Tensor& input) { return input.suggest_memory_format(); }

// Bytes of the relu mask for `numel` elements.
inline int64_t batch_norm_mask_bytes(int64_t numel) { return (numel + 7) / 8; }

// The statistics' dtype for an input dtype.
inline at::ScalarType batch_norm_stats_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// The (A, C, B) view of a tensor in `format` (cuda_ops/batch_norm_args.h): rows x C for the channels-last formats,
// planes otherwise.
inline cuda_ops::BatchNormShape batch_norm_shape(const at::Tensor& input, at::MemoryFormat format) {
  cuda_ops::BatchNormShape s;
  s.c = input.size(1);
  int64_t spatial = 1;
  for (int64_t d = 2; d < input.dim(); ++d) spatial *= input.size(d);
  if (format == at::MemoryFormat::ChannelsLast || format == at::MemoryFormat::ChannelsLast3d) {
    s.a = input.size(0) * spatial;
    s.b = 1;
  } else {
    s.a = input.size(0);
    s.b = spatial;
  }
  return s;
}

// `t` in `format`: itself where it already is (dense in that memory order), else a copy.
inline at::Tensor in_format(const at::Tensor& t, at::MemoryFormat format) {
  return t.is_contiguous(format) ? t : t.contiguous(format);
}

namespace batch_norm_detail {

inline void check_channel_vector(std::string_view op, const at::Tensor& input, const at::Tensor& t,
                                 std::string_view name) {
  check_same_device(op, input, "input", t, name);
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == input.size(1), op, ": `", name, "` must have shape (", input.size(1),
                    ",) (one value per channel of `input`), got ", t.sizes());
}

}  // namespace batch_norm_detail

// The parameters' dtype (weight, bias, running_mean, running_var share it): the first given one's, checked against
// the others and against the rule at the top of this file; input's dtype when none is given.
inline at::ScalarType check_batch_norm_params(std::string_view op, const at::Tensor& input,
                                              std::initializer_list<std::pair<const at::Tensor*, const char*>> params) {
  using batch_norm_detail::check_channel_vector;
  std::optional<at::ScalarType> dtype;
  const char* first = nullptr;
  for (const auto& [t, name] : params) {
    if (t == nullptr || !t->defined()) continue;
    check_channel_vector(op, input, *t, name);
    if (!dtype.has_value()) {
      dtype = t->scalar_type();
      first = name;
      const bool reduced = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
      TORCH_CHECK_TYPE(*dtype == input.scalar_type() || (reduced && *dtype == at::kFloat), op, ": `", name,
                       "` must have `input`'s dtype (", input.scalar_type(), ")", reduced ? " or float32" : "",
                       ", got ", *dtype);
    } else {
      TORCH_CHECK_TYPE(t->scalar_type() == *dtype, op, ": `", name, "` must have the same dtype as `", first, "` (",
                       *dtype, "), got ", t->scalar_type());
    }
  }
  return dtype.value_or(input.scalar_type());
}

// The forward's checks; returns the parameters' dtype. residual: the add variant's (else nullptr).
inline at::ScalarType check_batch_norm_args(
    std::string_view op, const at::Tensor& input, const at::Tensor* residual, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, const std::optional<at::Tensor>& sum,
    const std::optional<at::Tensor>& sum_sq, const std::optional<at::Tensor>& num_batches_tracked) {
  check_floating_or_half(op, input, "input");
  TORCH_CHECK_VALUE(input.dim() >= 2, op, ": `input` must have at least 2 dimensions (N, C, ...), got ", input.dim(),
                    "-D with shape ", input.sizes());
  if (residual != nullptr) check_like(op, input, "input", *residual, "residual");
  auto get = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->defined() ? &*t : nullptr; };
  const at::ScalarType pdt = check_batch_norm_params(op, input,
                                                     {{get(weight), "weight"},
                                                      {get(bias), "bias"},
                                                      {get(running_mean), "running_mean"},
                                                      {get(running_var), "running_var"}});
  if (!training) {
    TORCH_CHECK_VALUE(get(running_mean) != nullptr && get(running_var) != nullptr, op,
                      ": `running_mean` and `running_var` are required when training=False (evaluation normalizes "
                      "with the running statistics)");
  }
  const bool has_sum = get(sum) != nullptr, has_sum_sq = get(sum_sq) != nullptr;
  TORCH_CHECK_VALUE(has_sum == has_sum_sq, op, ": `sum` and `sum_sq` go together: give both or neither");
  if (has_sum) {
    TORCH_CHECK_VALUE(training, op,
                      ": `sum` and `sum_sq` are batch statistics, used only when training=True (evaluation "
                      "normalizes with the running statistics)");
    const at::ScalarType st = batch_norm_stats_dtype(input.scalar_type());
    for (const auto& [t, name] : {std::pair{get(sum), "sum"}, std::pair{get(sum_sq), "sum_sq"}}) {
      batch_norm_detail::check_channel_vector(op, input, *t, name);
      TORCH_CHECK_TYPE(t->scalar_type() == st, op, ": `", name, "` must be ", st, " for a ", input.scalar_type(),
                       " input (conv2d_stats' statistics), got ", t->scalar_type());
    }
  }
  if (const at::Tensor* count = get(num_batches_tracked); count != nullptr) {
    TORCH_CHECK_VALUE(training, op,
                      ": `num_batches_tracked` counts training batches; give it only when training=True (evaluation "
                      "counts nothing)");
    check_same_device(op, input, "input", *count, "num_batches_tracked");
    TORCH_CHECK_TYPE(count->scalar_type() == at::kLong, op,
                     ": `num_batches_tracked` must be int64 (nn.BatchNorm2d's "
                     "counter), got ",
                     count->scalar_type());
    TORCH_CHECK_VALUE(count->numel() == 1, op, ": `num_batches_tracked` must hold one value, got shape ",
                      count->sizes());
  }
  return pdt;
}

// batch_norm_backward's checks; returns the dtype of grad_weight and grad_bias.
inline at::ScalarType check_batch_norm_backward_args(std::string_view op, const at::Tensor& grad_out,
                                                     const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                                     const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                                     const std::optional<at::Tensor>& mask,
                                                     std::array<bool, 4> output_mask) {
  check_floating_or_half(op, input, "input");
  TORCH_CHECK_VALUE(input.dim() >= 2, op, ": `input` must have at least 2 dimensions (N, C, ...), got ", input.dim(),
                    "-D");
  check_like(op, input, "input", grad_out, "grad_out");
  const at::ScalarType st = batch_norm_stats_dtype(input.scalar_type());
  for (const auto& [t, name] : {std::pair{&save_mean, "save_mean"}, std::pair{&save_invstd, "save_invstd"}}) {
    batch_norm_detail::check_channel_vector(op, input, *t, name);
    TORCH_CHECK_TYPE(t->scalar_type() == st, op, ": `", name, "` must be ", st, " (the forward's statistics), got ",
                     t->scalar_type());
  }
  const bool has_weight = weight.has_value() && weight->defined();
  const at::ScalarType pdt = check_batch_norm_params(op, input, {{has_weight ? &*weight : nullptr, "weight"}});
  const bool has_mask = mask.has_value() && mask->defined();
  if (has_mask) {
    check_same_device(op, input, "input", *mask, "mask");
    TORCH_CHECK_TYPE(mask->scalar_type() == at::kByte, op,
                     ": `mask` must be uint8 (the forward's packed relu bits), got ", mask->scalar_type());
    TORCH_CHECK_VALUE(mask->dim() == 1 && mask->size(0) == batch_norm_mask_bytes(input.numel()), op,
                      ": `mask` must have shape (", batch_norm_mask_bytes(input.numel()),
                      ",) (one bit per element of `input`), got ", mask->sizes());
  }
  TORCH_CHECK_VALUE(!output_mask[3] || has_mask, op,
                    ": output_mask[3] (grad_residual) needs the forward's relu `mask` (batch_norm_add_relu)");
  return has_weight ? pdt : st;
}

// The CUDA ladder's version names (cuda_ops/batch_norm_args.h), for messages on either backend.
inline std::string cuda_batch_norm_kernel_list() {
  std::string out;
  for (const char* name : cuda_ops::kBatchNormKernelNames) {
    out += std::string(out.empty() ? "" : ", ") + "'" + name + "'";
  }
  return out;
}

}  // namespace torchext
