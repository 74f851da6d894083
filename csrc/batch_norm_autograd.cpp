// Autograd kernels for torchext::batch_norm, batch_norm_relu, batch_norm_add_relu and batch_norm_backward.
//
// First order. One Function serves the three forwards: it runs the op below autograd, saves input, weight, the
// statistics (save_mean, save_invstd) and the relu mask, and its backward calls torchext::batch_norm_backward through
// the dispatcher with output_mask set from what is needed: grad_input, grad_weight, grad_bias, and for
// batch_norm_add_relu grad_residual (the masked grad_out, from the same pass). The statistics and the mask are
// non-differentiable outputs; the running buffers and num_batches_tracked, updated in place by the kernel, get their
// version counters bumped here (what an ADInplaceOrView kernel would do).
//
// The stats-from-convolution path (`sum`, `sum_sq` given): they are a promise that they are the per-channel sums of
// `input` (conv2d_stats' outputs for it). The input's gradient is then batch norm's full gradient, the statistics'
// dependence on the input included, and no gradient flows into `sum` and `sum_sq`: conv2d_stats' backward gets only
// its output's gradient, with no extra pass. (Sums of anything else than `input` would get wrong gradients.)
//
// Second order. batch_norm_backward's Autograd kernel runs the op below autograd when no graph is recorded (plain
// backward, AOTAutograd's trace). Otherwise (create_graph=True with something requiring grad) it composes the same
// gradients from differentiable ATen ops in the statistics' dtype, recomputing mean and invstd from `input` in training
// (eps is an argument of the backward op for this), reading them from save_mean / save_invstd in eval; the relu mask is
// unpacked into a boolean tensor (relu's second derivative is zero). ATen's autograd then gives the second and higher
// derivatives with respect to grad_out, input and weight.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "autograd.h"
#include "batch_norm.h"

namespace torchext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptionalTensor = std::optional<at::Tensor>;
using Variant = std::optional<c10::string_view>;

using BatchNormSignature = batch_norm_signatures::BatchNorm;
using BatchNormReluSignature = batch_norm_signatures::BatchNormRelu;
using BatchNormAddReluSignature = batch_norm_signatures::BatchNormAddRelu;
using BatchNormBackwardSignature = batch_norm_signatures::BatchNormBackward;

const c10::TypedOperatorHandle<BatchNormSignature>& batch_norm_op() {
  static const auto op = find_op<BatchNormSignature>("torchext::batch_norm");
  return op;
}
const c10::TypedOperatorHandle<BatchNormReluSignature>& batch_norm_relu_op() {
  static const auto op = find_op<BatchNormReluSignature>("torchext::batch_norm_relu");
  return op;
}
const c10::TypedOperatorHandle<BatchNormAddReluSignature>& batch_norm_add_relu_op() {
  static const auto op = find_op<BatchNormAddReluSignature>("torchext::batch_norm_add_relu");
  return op;
}
const c10::TypedOperatorHandle<BatchNormBackwardSignature>& batch_norm_backward_op() {
  static const auto op = find_op<BatchNormBackwardSignature>("torchext::batch_norm_backward");
  return op;
}

// Which forward: plain, + relu, + residual + relu.
enum Kind : int64_t { kPlain = 0, kRelu = 1, kAddRelu = 2 };

Variant variant_of(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : Variant(v.toStringRef());  // lives in saved_data for the whole backward
}

class BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
 public:
  // Arguments 0-3 are the differentiable ones: input, residual (batch_norm_add_relu's), weight, bias.
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const OptionalTensor& residual,
                               const OptionalTensor& weight, const OptionalTensor& bias,
                               const OptionalTensor& running_mean, const OptionalTensor& running_var,
                               const OptionalTensor& sum, const OptionalTensor& sum_sq,
                               const OptionalTensor& num_batches_tracked, int64_t kind, bool training, double momentum,
                               double eps, Variant variant) {
    Tensor out, mask, save_mean, save_invstd;
    if (kind == kPlain) {
      std::tie(out, save_mean, save_invstd) =
          call_below_autograd(batch_norm_op(), input, weight, bias, running_mean, running_var, training, momentum, eps,
                              sum, sum_sq, variant, num_batches_tracked);
    } else if (kind == kRelu) {
      std::tie(out, mask, save_mean, save_invstd) =
          call_below_autograd(batch_norm_relu_op(), input, weight, bias, running_mean, running_var, training, momentum,
                              eps, sum, sum_sq, variant, num_batches_tracked);
    } else {
      std::tie(out, mask, save_mean, save_invstd) =
          call_below_autograd(batch_norm_add_relu_op(), input, *residual, weight, bias, running_mean, running_var,
                              training, momentum, eps, sum, sum_sq, variant, num_batches_tracked);
    }
    if (training) {
      for (const OptionalTensor* t : {&running_mean, &running_var, &num_batches_tracked}) {
        if (t->has_value() && (*t)->defined()) torch::autograd::impl::bump_version(**t);
      }
    }
    ctx->set_materialize_grads(false);
    if (mask.defined()) {
      ctx->mark_non_differentiable({mask, save_mean, save_invstd});
    } else {
      ctx->mark_non_differentiable({save_mean, save_invstd});
    }
    ctx->save_for_backward({input, value_or_undefined(weight), save_mean, save_invstd, mask});
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["training"] = training;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["variant"] = variant.has_value() ? c10::IValue(std::string(*variant)) : c10::IValue();
    // needs_input_grad counts the tensors given (an absent optional has no slot): their positions.
    int64_t next = 1;
    const auto slot = [&next](const OptionalTensor& t) { return t.has_value() && t->defined() ? next++ : int64_t{-1}; };
    ctx->saved_data["slot_residual"] = slot(residual);
    ctx->saved_data["slot_weight"] = slot(weight);
    ctx->saved_data["slot_bias"] = slot(bias);
    if (kind == kPlain) return {out, save_mean, save_invstd};
    return {out, mask, save_mean, save_invstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(14);
    const Tensor& grad = grads[0];
    const auto needs = [ctx](const char* key) {
      const int64_t slot = ctx->saved_data[key].toInt();
      return slot >= 0 && ctx->needs_input_grad(slot);
    };
    const std::array<bool, 4> mask = {ctx->needs_input_grad(0), needs("slot_weight"), needs("slot_bias"),
                                      needs("slot_residual")};
    if (!grad.defined() || !(mask[0] || mask[1] || mask[2] || mask[3])) return result;
    const auto saved = ctx->get_saved_variables();
    auto [grad_input, grad_weight, grad_bias, grad_residual] =
        batch_norm_backward_op().call(grad, saved[0], as_optional(saved[1]), saved[2], saved[3], as_optional(saved[4]),
                                      ctx->saved_data["training"].toBool(), ctx->saved_data["eps"].toDouble(), mask,
                                      variant_of(ctx->saved_data["variant"]));
    if (mask[0]) result[0] = grad_input;
    if (mask[3]) result[1] = grad_residual;
    if (mask[1]) result[2] = grad_weight;
    if (mask[2]) result[3] = grad_bias;
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> batch_norm_autograd(const Tensor& input, const OptionalTensor& weight,
                                                       const OptionalTensor& bias, const OptionalTensor& running_mean,
                                                       const OptionalTensor& running_var, bool training,
                                                       double momentum, double eps, const OptionalTensor& sum,
                                                       const OptionalTensor& sum_sq, Variant variant,
                                                       const OptionalTensor& num_batches_tracked) {
  const auto out = BatchNormFunction::apply(input, std::nullopt, weight, bias, running_mean, running_var, sum, sum_sq,
                                            num_batches_tracked, kPlain, training, momentum, eps, variant);
  return {out[0], out[1], out[2]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_relu_autograd(
    const Tensor& input, const OptionalTensor& weight, const OptionalTensor& bias, const OptionalTensor& running_mean,
    const OptionalTensor& running_var, bool training, double momentum, double eps, const OptionalTensor& sum,
    const OptionalTensor& sum_sq, Variant variant, const OptionalTensor& num_batches_tracked) {
  const auto out = BatchNormFunction::apply(input, std::nullopt, weight, bias, running_mean, running_var, sum, sum_sq,
                                            num_batches_tracked, kRelu, training, momentum, eps, variant);
  return {out[0], out[1], out[2], out[3]};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_add_relu_autograd(
    const Tensor& input, const Tensor& residual, const OptionalTensor& weight, const OptionalTensor& bias,
    const OptionalTensor& running_mean, const OptionalTensor& running_var, bool training, double momentum, double eps,
    const OptionalTensor& sum, const OptionalTensor& sum_sq, Variant variant,
    const OptionalTensor& num_batches_tracked) {
  const auto out =
      BatchNormFunction::apply(input, OptionalTensor(residual), weight, bias, running_mean, running_var, sum, sum_sq,
                               num_batches_tracked, kAddRelu, training, momentum, eps, variant);
  return {out[0], out[1], out[2], out[3]};
}

// The packed relu mask (csrc/batch_norm.h) as a boolean tensor shaped like input: the bits in memory order, viewed
// through the layout rule's physical order.
Tensor unpack_mask(const Tensor& mask, const Tensor& input) {
  const Tensor bits = at::arange(8, mask.options());
  Tensor flat = mask.unsqueeze(1).bitwise_right_shift(bits).bitwise_and(1).reshape({-1}).narrow(0, 0, input.numel());
  flat = flat.to(at::kBool);
  const at::MemoryFormat fmt = batch_norm_memory_format(input);
  const auto sizes = input.sizes();
  if (fmt == at::MemoryFormat::ChannelsLast) {
    return flat.view({sizes[0], sizes[2], sizes[3], sizes[1]}).permute({0, 3, 1, 2});
  }
  if (fmt == at::MemoryFormat::ChannelsLast3d) {
    return flat.view({sizes[0], sizes[2], sizes[3], sizes[4], sizes[1]}).permute({0, 4, 1, 2, 3});
  }
  return flat.view(sizes);
}

// batch_norm_backward from differentiable ATen ops (see the top of the file). Results as the op's: an empty tensor
// where output_mask is false.
std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_composed(
    const Tensor& grad_out, const Tensor& input, const OptionalTensor& weight, const Tensor& save_mean,
    const Tensor& save_invstd, const OptionalTensor& mask, bool training, double eps, std::array<bool, 4> output_mask) {
  const at::ScalarType gdt = check_batch_norm_backward_args("torchext::batch_norm_backward", grad_out, input, weight,
                                                            save_mean, save_invstd, mask, output_mask);
  const at::ScalarType acc = batch_norm_stats_dtype(input.scalar_type());
  std::vector<int64_t> dims{0}, channel_shape(input.dim(), 1);
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  channel_shape[1] = input.size(1);
  const Tensor x = input.to(acc);
  Tensor dz = grad_out.to(acc);
  if (mask.has_value() && mask->defined()) dz = at::where(unpack_mask(*mask, input), dz, at::zeros({}, dz.options()));
  Tensor mean, invstd;
  if (training) {
    mean = x.mean(dims, /*keepdim=*/true);
    invstd = ((x - mean).square().mean(dims, /*keepdim=*/true) + eps).rsqrt();
  } else {
    mean = save_mean.view(channel_shape);
    invstd = save_invstd.view(channel_shape);
  }
  const Tensor xhat = (x - mean) * invstd;
  const Tensor empty = at::empty({0}, input.options());
  Tensor grad_input = empty, grad_weight = empty.to(gdt), grad_bias = empty.to(gdt), grad_residual = empty;
  if (output_mask[0]) {
    Tensor k = invstd;
    if (weight.has_value() && weight->defined()) k = k * weight->to(acc).view(channel_shape);
    Tensor g = dz;
    if (training) {
      g = dz - dz.mean(dims, /*keepdim=*/true) - xhat * (dz * xhat).mean(dims, /*keepdim=*/true);
    }
    grad_input = (k * g).to(input.scalar_type());
  }
  if (output_mask[1]) grad_weight = (dz * xhat).sum(dims).to(gdt);
  if (output_mask[2]) grad_bias = dz.sum(dims).to(gdt);
  if (output_mask[3]) grad_residual = dz.to(input.scalar_type());
  return {grad_input, grad_weight, grad_bias, grad_residual};
}

// batch_norm_backward's Autograd kernel: the op itself when no graph is recorded, else the composed backward.
std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_autograd(
    const Tensor& grad_out, const Tensor& input, const OptionalTensor& weight, const Tensor& save_mean,
    const Tensor& save_invstd, const OptionalTensor& mask, bool training, double eps, std::array<bool, 4> output_mask,
    Variant variant) {
  if (!needs_graph(grad_out, input, weight)) {
    return call_below_autograd(batch_norm_backward_op(), grad_out, input, weight, save_mean, save_invstd, mask,
                               training, eps, output_mask, variant);
  }
  return batch_norm_backward_composed(grad_out, input, weight, save_mean, save_invstd, mask, training, eps,
                                      output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) {
  m.impl("batch_norm", &batch_norm_autograd);
  m.impl("batch_norm_relu", &batch_norm_relu_autograd);
  m.impl("batch_norm_add_relu", &batch_norm_add_relu_autograd);
  m.impl("batch_norm_backward", &batch_norm_backward_autograd);
}

}  // namespace torchext
