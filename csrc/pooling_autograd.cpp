// Autograd of torchext::max_pool2d, avg_pool2d, adaptive_avg_pool2d and their *_backward ops (csrc/autograd.h's
// helpers; the pattern of csrc/autograd.cpp). The pools run in the input's dtype under autocast, as torch's do, so
// there is no autocast kernel.
//
// First order: each forward saves its input (for grad_input's shape and layout, as torch's pooling saves `self`)
// and max_pool2d its indices; backward calls the *_backward op.
//
// Second order. Each pool is linear in its input once max_pool2d's argmax is fixed: y = P x, with P selecting the
// argmax (max), averaging windows (avg, adaptive). The backward op computes grad_input = P^T grad_output, so its
// derivative along ggi (a gradient arriving at grad_input) is
//   d grad_output = P ggi:  ggi gathered at the indices (max; as torch's max_pool_double_backward),
//                           avg_pool2d(ggi) and adaptive_avg_pool2d(ggi) with the forward's options;
//   d input       = 0       (the backward op reads only its shape; max_pool2d's argmax is piecewise constant);
//   indices: not differentiable.
// Those are registered (hence differentiable) ops or ATen's gather, so third and higher derivatives work too.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "autograd.h"

namespace torchext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using at::IntArrayRef;

using MaxPool2dSignature = std::tuple<Tensor, Tensor>(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, IntArrayRef,
                                                      bool);
using MaxPool2dBackwardSignature = Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef,
                                          IntArrayRef, bool, const Tensor&);
using AvgPool2dSignature = Tensor(const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool, bool,
                                  std::optional<int64_t>);
using AvgPool2dBackwardSignature = Tensor(const Tensor&, const Tensor&, IntArrayRef, IntArrayRef, IntArrayRef, bool,
                                          bool, std::optional<int64_t>);
using AdaptiveAvgPool2dSignature = Tensor(const Tensor&, IntArrayRef);
using AdaptiveAvgPool2dBackwardSignature = Tensor(const Tensor&, const Tensor&);

const c10::TypedOperatorHandle<MaxPool2dSignature>& max_pool2d_op() {
  static const auto op = find_op<MaxPool2dSignature>("torchext::max_pool2d");
  return op;
}
const c10::TypedOperatorHandle<MaxPool2dBackwardSignature>& max_pool2d_backward_op() {
  static const auto op = find_op<MaxPool2dBackwardSignature>("torchext::max_pool2d_backward");
  return op;
}
const c10::TypedOperatorHandle<AvgPool2dSignature>& avg_pool2d_op() {
  static const auto op = find_op<AvgPool2dSignature>("torchext::avg_pool2d");
  return op;
}
const c10::TypedOperatorHandle<AvgPool2dBackwardSignature>& avg_pool2d_backward_op() {
  static const auto op = find_op<AvgPool2dBackwardSignature>("torchext::avg_pool2d_backward");
  return op;
}
const c10::TypedOperatorHandle<AdaptiveAvgPool2dSignature>& adaptive_avg_pool2d_op() {
  static const auto op = find_op<AdaptiveAvgPool2dSignature>("torchext::adaptive_avg_pool2d");
  return op;
}
const c10::TypedOperatorHandle<AdaptiveAvgPool2dBackwardSignature>& adaptive_avg_pool2d_backward_op() {
  static const auto op = find_op<AdaptiveAvgPool2dBackwardSignature>("torchext::adaptive_avg_pool2d_backward");
  return op;
}

// The non-tensor arguments of max_pool2d and avg_pool2d, kept in saved_data.
struct PoolOptions {
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  bool ceil_mode = false, count_include_pad = true;
  std::optional<int64_t> divisor_override;

  void save(AutogradContext* ctx) const {
    ctx->saved_data["kernel_size"] = kernel_size;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["ceil_mode"] = ceil_mode;
    ctx->saved_data["count_include_pad"] = count_include_pad;
    ctx->saved_data["divisor_override"] = divisor_override.has_value() ? c10::IValue(*divisor_override) : c10::IValue();
  }

  static PoolOptions load(AutogradContext* ctx) {
    PoolOptions o;
    o.kernel_size = ctx->saved_data["kernel_size"].toIntVector();
    o.stride = ctx->saved_data["stride"].toIntVector();
    o.padding = ctx->saved_data["padding"].toIntVector();
    o.dilation = ctx->saved_data["dilation"].toIntVector();
    o.ceil_mode = ctx->saved_data["ceil_mode"].toBool();
    o.count_include_pad = ctx->saved_data["count_include_pad"].toBool();
    const c10::IValue& d = ctx->saved_data["divisor_override"];
    if (!d.isNone()) o.divisor_override = d.toInt();
    return o;
  }

  static PoolOptions max(IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                         bool ceil_mode) {
    PoolOptions o;
    o.kernel_size = kernel_size.vec();
    o.stride = stride.vec();
    o.padding = padding.vec();
    o.dilation = dilation.vec();
    o.ceil_mode = ceil_mode;
    return o;
  }

  static PoolOptions avg(IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding, bool ceil_mode,
                         bool count_include_pad, std::optional<int64_t> divisor_override) {
    PoolOptions o = max(kernel_size, stride, padding, {1}, ceil_mode);
    o.count_include_pad = count_include_pad;
    o.divisor_override = divisor_override;
    return o;
  }

  Tensor max_backward(const Tensor& grad_output, const Tensor& input, const Tensor& indices) const {
    return max_pool2d_backward_op().call(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode,
                                         indices);
  }
  Tensor avg(const Tensor& input) const {
    return avg_pool2d_op().call(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  }
  Tensor avg_backward(const Tensor& grad_output, const Tensor& input) const {
    return avg_pool2d_backward_op().call(grad_output, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override);
  }
};

// max_pool2d_backward's derivative along ggi (shaped like input): ggi at each output's argmax. An index outside the
// plane (a window entirely in the padding: output -inf, torch's index of its first tap) contributes nothing.
Tensor gather_at_indices(const Tensor& ggi, const Tensor& indices) {
  const int64_t plane = ggi.size(-1) * ggi.size(-2);
  const Tensor idx = indices.flatten(-2);
  const Tensor valid = idx.lt(plane);
  const Tensor picked = ggi.flatten(-2).gather(-1, idx.clamp_max(std::max<int64_t>(plane - 1, 0)));
  return at::where(valid, picked, at::zeros({}, picked.options())).reshape(indices.sizes());
}

// --- max_pool2d ---------------------------------------------------------------------------------------------------

class MaxPool2dFunction : public torch::autograd::Function<MaxPool2dFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                               IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
    auto [out, indices] =
        call_below_autograd(max_pool2d_op(), input, kernel_size, stride, padding, dilation, ceil_mode);
    ctx->mark_non_differentiable({indices});
    ctx->save_for_backward({input, indices});
    PoolOptions::max(kernel_size, stride, padding, dilation, ceil_mode).save(ctx);
    return {out, indices};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(6);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return result;
    const auto saved = ctx->get_saved_variables();
    result[0] = PoolOptions::load(ctx).max_backward(grads[0], saved[0], saved[1]);
    return result;
  }
};

std::tuple<Tensor, Tensor> max_pool2d_autograd(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                                               IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
  const auto out = MaxPool2dFunction::apply(input, kernel_size, stride, padding, dilation, ceil_mode);
  return {out[0], out[1]};
}

class MaxPool2dBackwardFunction : public torch::autograd::Function<MaxPool2dBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& input, IntArrayRef kernel_size,
                        IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                        const Tensor& indices) {
    ctx->save_for_backward({indices});
    return call_below_autograd(max_pool2d_backward_op(), grad_output, input, kernel_size, stride, padding, dilation,
                               ceil_mode, indices);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(8);
    if (grads[0].defined() && ctx->needs_input_grad(0)) {
      result[0] = gather_at_indices(grads[0], ctx->get_saved_variables()[0]);
    }
    return result;
  }
};

Tensor max_pool2d_backward_autograd(const Tensor& grad_output, const Tensor& input, IntArrayRef kernel_size,
                                    IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool ceil_mode,
                                    const Tensor& indices) {
  if (!needs_graph(grad_output, input)) {
    return call_below_autograd(max_pool2d_backward_op(), grad_output, input, kernel_size, stride, padding, dilation,
                               ceil_mode, indices);
  }
  return MaxPool2dBackwardFunction::apply(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode,
                                          indices);
}

// --- avg_pool2d ---------------------------------------------------------------------------------------------------

class AvgPool2dFunction : public torch::autograd::Function<AvgPool2dFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride,
                        IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                        std::optional<int64_t> divisor_override) {
    ctx->save_for_backward({input});
    PoolOptions::avg(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override).save(ctx);
    return call_below_autograd(avg_pool2d_op(), input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                               divisor_override);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(7);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return result;
    result[0] = PoolOptions::load(ctx).avg_backward(grads[0], ctx->get_saved_variables()[0]);
    return result;
  }
};

Tensor avg_pool2d_autograd(const Tensor& input, IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                           bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  return AvgPool2dFunction::apply(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

class AvgPool2dBackwardFunction : public torch::autograd::Function<AvgPool2dBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& input, IntArrayRef kernel_size,
                        IntArrayRef stride, IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                        std::optional<int64_t> divisor_override) {
    PoolOptions::avg(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override).save(ctx);
    return call_below_autograd(avg_pool2d_backward_op(), grad_output, input, kernel_size, stride, padding, ceil_mode,
                               count_include_pad, divisor_override);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(8);
    if (grads[0].defined() && ctx->needs_input_grad(0)) result[0] = PoolOptions::load(ctx).avg(grads[0]);
    return result;
  }
};

Tensor avg_pool2d_backward_autograd(const Tensor& grad_output, const Tensor& input, IntArrayRef kernel_size,
                                    IntArrayRef stride, IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                                    std::optional<int64_t> divisor_override) {
  if (!needs_graph(grad_output, input)) {
    return call_below_autograd(avg_pool2d_backward_op(), grad_output, input, kernel_size, stride, padding, ceil_mode,
                               count_include_pad, divisor_override);
  }
  return AvgPool2dBackwardFunction::apply(grad_output, input, kernel_size, stride, padding, ceil_mode,
                                          count_include_pad, divisor_override);
}

// --- adaptive_avg_pool2d ------------------------------------------------------------------------------------------

class AdaptiveAvgPool2dFunction : public torch::autograd::Function<AdaptiveAvgPool2dFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, IntArrayRef output_size) {
    ctx->save_for_backward({input});
    return call_below_autograd(adaptive_avg_pool2d_op(), input, output_size);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(2);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return result;
    result[0] = adaptive_avg_pool2d_backward_op().call(grads[0], ctx->get_saved_variables()[0]);
    return result;
  }
};

Tensor adaptive_avg_pool2d_autograd(const Tensor& input, IntArrayRef output_size) {
  return AdaptiveAvgPool2dFunction::apply(input, output_size);
}

class AdaptiveAvgPool2dBackwardFunction : public torch::autograd::Function<AdaptiveAvgPool2dBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& input) {
    ctx->saved_data["output_size"] = std::vector<int64_t>{grad_output.size(-2), grad_output.size(-1)};
    return call_below_autograd(adaptive_avg_pool2d_backward_op(), grad_output, input);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(2);
    if (grads[0].defined() && ctx->needs_input_grad(0)) {
      result[0] = adaptive_avg_pool2d_op().call(grads[0], ctx->saved_data["output_size"].toIntVector());
    }
    return result;
  }
};

Tensor adaptive_avg_pool2d_backward_autograd(const Tensor& grad_output, const Tensor& input) {
  if (!needs_graph(grad_output, input)) {
    return call_below_autograd(adaptive_avg_pool2d_backward_op(), grad_output, input);
  }
  return AdaptiveAvgPool2dBackwardFunction::apply(grad_output, input);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) {
  m.impl("max_pool2d", &max_pool2d_autograd);
  m.impl("max_pool2d_backward", &max_pool2d_backward_autograd);
  m.impl("avg_pool2d", &avg_pool2d_autograd);
  m.impl("avg_pool2d_backward", &avg_pool2d_backward_autograd);
  m.impl("adaptive_avg_pool2d", &adaptive_avg_pool2d_autograd);
  m.impl("adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward_autograd);
}

}  // namespace torchext
