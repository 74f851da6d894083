// Autograd (and CUDA autocast) kernels for every torchext op but matmul: C++ torch::autograd::Functions registered
// under the Autograd dispatch key, which costs far less host time than Python's torch.library.register_autograd
// (relu's forward plus backward on 4x4 CPU tensors: ~30 us here, ~55 us through Python, ~12 us for torch.relu). On
// a host-bound step, such as a small CNN at batch 128, that host time is the step time. matmul keeps its Python
// autograd (torchext/ops/matmul.py), whose backward calls matmul and so is differentiable.
//
// First order. Each op's Function runs the op below autograd (the CPU or CUDA kernel, or the fake kernel under
// torch.compile) and saves what its backward reads; backward calls the matching *_backward op through the
// dispatcher.
//
// Second order (create_graph=True: gradient penalties, Hessian-vector products). Every *_backward op has an
// Autograd kernel of its own. When grad mode is off (a plain backward, and AOTAutograd's trace of the backward) or
// none of its inputs requires grad, that kernel runs the op below autograd at once: first-order backward does the
// same work as before. Otherwise it applies a Function whose backward is the derivative of the *_backward op:
//   - with respect to grad_output, the same *_backward op (the op is linear in grad_output and its Jacobian is
//     symmetric) for the activations and softmax; log_softmax's and the losses' through ATen math or the op with
//     a unit grad_output;
//   - with respect to the saved input or output, differentiable ATen math (the activations' second derivatives are
//     written out below), or registered ops where they fit (cross_entropy's is softmax_backward on softmax(self)).
// Being differentiable themselves, these formulas give third and higher derivatives too.
// linear: `saved`, the pre-activation of gelu, gelu_tanh and silu, is a differentiable output (d saved = d(input
// weight^T + bias)), so the activation's second derivative reaches input, weight and bias through it; for none and
// relu it stays non-differentiable (relu's second derivative is zero). LinearFunction::backward runs the fused
// linear_backward op; that op's Autograd kernel, when grad mode is on and an input requires grad, composes the
// same gradients from differentiable ops instead (the activation's *_backward op, torchext::matmul, a sum).
// A gradient arriving at `saved` (only in a second backward) takes the composed path as well.
//
// Not implemented, raising NotImplementedError when such a gradient is asked for (never a silent zero): the
// gradients with respect to the losses' class and element weights (`weight`, `pos_weight`), and with respect to
// cross_entropy_backward's `lse` and `total_weight` (non-differentiable results of cross_entropy). Every other
// derivative is exact almost everywhere: relu's and leaky_relu's second derivatives are zero, as torch's are, and
// so is multi_margin_loss's for p=1 (torch's multi_margin_loss has no second derivative at all: it raises).
#include "autograd.h"

#include <ATen/autocast_mode.h>
#include <c10/util/accumulate.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>

#include "autocast_copies.h"
#include "conv2d.h"
#include "matmul.h"

namespace torchext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptionalTensor = std::optional<at::Tensor>;

// The activations' non-tensor argument (leaky_relu's negative_slope, gelu's approximate), kept in saved_data.
c10::IValue stored(double value) { return value; }
c10::IValue stored(c10::string_view value) { return std::string(value); }
template <typename T>
T restored(const c10::IValue& value);
template <>
double restored<double>(const c10::IValue& value) {
  return value.toDouble();
}
template <>
c10::string_view restored<c10::string_view>(const c10::IValue& value) {
  return value.toStringRef();  // lives in ctx->saved_data for the whole backward
}
template <typename... Arg>
void save_args(AutogradContext* ctx, const Arg&... arg) {
  ((ctx->saved_data["arg"] = stored(arg)), ...);
}

// The gradient with respect to a loss backward op's grad_output, along gg: the op is linear in grad_output, so this
// is gg * unit (unit: the op's result for a grad_output of ones) summed over what one grad_output element scales:
// everything for a 0-dim grad_output ('mean', 'sum'), one element ('none' of an elementwise loss), or the classes
// of one row ('none' of cross_entropy and multi_margin_loss).
Tensor grad_wrt_grad_output(const Tensor& gg, const Tensor& unit, const Tensor& grad_output) {
  const Tensor product = gg * unit;
  if (grad_output.dim() == 0) return product.sum();
  if (product.sizes() == grad_output.sizes()) return product;
  return product.sum(-1).reshape(grad_output.sizes());
}

void check_no_grad(AutogradContext* ctx, bool present, int64_t index, const char* op, const char* name,
                   const char* why) {
  TORCH_CHECK_NOT_IMPLEMENTED(!present || !ctx->needs_input_grad(index), op, ": the gradient with respect to `", name,
                              "` is not implemented", why);
}

// ---------------------------------------------------------------------------------------------------------------
// One-input ops whose backward op is (grad_output, saved[, arg]) -> grad_input: relu, sigmoid, tanh, softmax and
// log_softmax save their output, silu, leaky_relu and gelu their input. For each: its names, which tensor it saves,
// and the derivatives of its backward op gx = bw(g, s): with respect to g (kSelfAdjoint: bw(gg, s) itself) and,
// contracted with gg, with respect to s (saved_grad; undefined where it is zero). kSavedGradReadsGradOutput: whether
// saved_grad reads g.

struct Relu {
  static constexpr const char* kForward = "torchext::relu";
  static constexpr const char* kBackward = "torchext::relu_backward";
  static constexpr bool kSavesOutput = true, kSelfAdjoint = true, kSavedGradReadsGradOutput = false;
  static Tensor saved_grad(const Tensor&, const Tensor&, const Tensor&) { return Tensor(); }
};

struct LeakyRelu {
  static constexpr const char* kForward = "torchext::leaky_relu";
  static constexpr const char* kBackward = "torchext::leaky_relu_backward";
  static constexpr bool kSavesOutput = false, kSelfAdjoint = true, kSavedGradReadsGradOutput = false;
  static Tensor saved_grad(const Tensor&, const Tensor&, const Tensor&, double) { return Tensor(); }
};

struct Sigmoid {  // gx = g y (1 - y)
  static constexpr const char* kForward = "torchext::sigmoid";
  static constexpr const char* kBackward = "torchext::sigmoid_backward";
  static constexpr bool kSavesOutput = true, kSelfAdjoint = true, kSavedGradReadsGradOutput = true;
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& y) { return gg * g * (1 - 2 * y); }
};

struct Tanh {  // gx = g (1 - y^2)
  static constexpr const char* kForward = "torchext::tanh";
  static constexpr const char* kBackward = "torchext::tanh_backward";
  static constexpr bool kSavesOutput = true, kSelfAdjoint = true, kSavedGradReadsGradOutput = true;
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& y) { return -2 * gg * g * y; }
};

struct Silu {  // silu''(x) = s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x)
  static constexpr const char* kForward = "torchext::silu";
  static constexpr const char* kBackward = "torchext::silu_backward";
  static constexpr bool kSavesOutput = false, kSelfAdjoint = true, kSavedGradReadsGradOutput = true;
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& x) {
    const Tensor s = at::sigmoid(x);
    return gg * g * s * (1 - s) * (2 + x * (1 - 2 * s));
  }
};

struct Gelu {
  static constexpr const char* kForward = "torchext::gelu";
  static constexpr const char* kBackward = "torchext::gelu_backward";
  static constexpr bool kSavesOutput = false, kSelfAdjoint = true, kSavedGradReadsGradOutput = true;
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& x, c10::string_view approximate) {
    if (parse_gelu_approximate(approximate)) {
      // gelu_tanh(x) = x/2 (1 + t), t = tanh(u), u = k0 (x + k1 x^3):
      // gelu_tanh''(x) = (1 - t^2) (u' - x t u'^2 + x u''/2), u' = k0 (1 + 3 k1 x^2), u'' = 6 k0 k1 x.
      const double k0 = M_SQRT2 * M_2_SQRTPI * 0.5, k1 = 0.044715;
      const Tensor x2 = x * x;
      const Tensor t = at::tanh(k0 * (x + k1 * x2 * x));
      const Tensor du = k0 * (1 + 3 * k1 * x2);
      return gg * g * (1 - t * t) * (du - x * t * du * du + 3 * k0 * k1 * x2);
    }
    // gelu''(x) = phi(x) (2 - x^2), phi the standard normal density.
    const Tensor x2 = x * x;
    return gg * g * at::exp(-0.5 * x2) * (M_2_SQRTPI * M_SQRT1_2 * 0.5) * (2 - x2);
  }
};

struct Softmax {  // gx = y (g - sum(g y)), over the last dimension
  static constexpr const char* kForward = "torchext::softmax";
  static constexpr const char* kBackward = "torchext::softmax_backward";
  static constexpr bool kSavesOutput = true, kSelfAdjoint = true, kSavedGradReadsGradOutput = true;
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& y) {
    return gg * (g - (g * y).sum(-1, true)) - g * (gg * y).sum(-1, true);
  }
};

struct LogSoftmax {  // gx = g - exp(y) sum(g), over the last dimension
  static constexpr const char* kForward = "torchext::log_softmax";
  static constexpr const char* kBackward = "torchext::log_softmax_backward";
  static constexpr bool kSavesOutput = true, kSelfAdjoint = false, kSavedGradReadsGradOutput = true;
  static Tensor grad_output_grad(const Tensor& gg, const Tensor& y) { return gg - (gg * at::exp(y)).sum(-1, true); }
  static Tensor saved_grad(const Tensor& gg, const Tensor& g, const Tensor& y) {
    return -gg * at::exp(y) * g.sum(-1, true);
  }
};

template <typename Op, typename... Arg>
const c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, Arg...)>& backward_op() {
  static const auto op = find_op<Tensor(const Tensor&, const Tensor&, Arg...)>(Op::kBackward);
  return op;
}

template <typename Op, typename... Arg>
class UnaryFunction : public torch::autograd::Function<UnaryFunction<Op, Arg...>> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, Arg... arg) {
    static const auto op = find_op<Tensor(const Tensor&, Arg...)>(Op::kForward);
    Tensor out = call_below_autograd(op, self, arg...);
    ctx->save_for_backward({Op::kSavesOutput ? out : self});
    save_args(ctx, arg...);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(1 + sizeof...(Arg));
    if (!grads[0].defined()) return result;
    result[0] = backward_op<Op, Arg...>().call(grads[0], ctx->get_saved_variables()[0],
                                               restored<Arg>(ctx->saved_data["arg"])...);
    return result;
  }
};

template <typename Op, typename... Arg>
Tensor unary_autograd(const Tensor& self, Arg... arg) {
  return UnaryFunction<Op, Arg...>::apply(self, arg...);
}

// The backward op bw(grad_output, saved[, arg]) as a function of grad_output and saved.
template <typename Op, typename... Arg>
class UnaryBackwardFunction : public torch::autograd::Function<UnaryBackwardFunction<Op, Arg...>> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& saved, Arg... arg) {
    Tensor grad_input = call_below_autograd(backward_op<Op, Arg...>(), grad_output, saved, arg...);
    const bool saved_grad_reads_g = Op::kSavedGradReadsGradOutput && saved.requires_grad();
    ctx->save_for_backward({saved_grad_reads_g ? grad_output : Tensor(), saved});
    save_args(ctx, arg...);
    return grad_input;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(2 + sizeof...(Arg));
    const Tensor& gg = grads[0];
    if (!gg.defined()) return result;
    const auto saved = ctx->get_saved_variables();
    if (ctx->needs_input_grad(0)) {
      if constexpr (Op::kSelfAdjoint) {
        result[0] = backward_op<Op, Arg...>().call(gg, saved[1], restored<Arg>(ctx->saved_data["arg"])...);
      } else {
        result[0] = Op::grad_output_grad(gg, saved[1]);
      }
    }
    if (ctx->needs_input_grad(1)) {
      result[1] = Op::saved_grad(gg, saved[0], saved[1], restored<Arg>(ctx->saved_data["arg"])...);
    }
    return result;
  }
};

template <typename Op, typename... Arg>
Tensor unary_backward_autograd(const Tensor& grad_output, const Tensor& saved, Arg... arg) {
  if (!needs_graph(grad_output, saved)) {
    return call_below_autograd(backward_op<Op, Arg...>(), grad_output, saved, arg...);
  }
  return UnaryBackwardFunction<Op, Arg...>::apply(grad_output, saved, arg...);
}

// ---------------------------------------------------------------------------------------------------------------
// add: both gradients are grad_output itself (no copy, as torch's add). Having no arithmetic, the backward is its
// own derivative: double backward passes gg through the same way, with no *_backward op.

class AddFunction : public torch::autograd::Function<AddFunction> {
 public:
  static Tensor forward(AutogradContext*, const Tensor& self, const Tensor& other) {
    static const auto op = find_op<Tensor(const Tensor&, const Tensor&)>("torchext::add");
    return call_below_autograd(op, self, other);
  }

  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], grads[0]}; }
};

Tensor add_autograd(const Tensor& self, const Tensor& other) { return AddFunction::apply(self, other); }

// ---------------------------------------------------------------------------------------------------------------
// fork: n views of self; the gradients that reach them are summed with torchext::add (in order; an alias whose user
// gave no gradient is skipped). Under create_graph the adds record AddFunction nodes, so higher derivatives flow.

std::vector<Tensor> fork_views(const Tensor& self, int64_t n) {
  TORCH_CHECK_VALUE(n >= 1, "torchext::fork: `n` must be at least 1, got ", n);
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(self.alias());
  return out;
}

class ForkFunction : public torch::autograd::Function<ForkFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, int64_t n) {
    ctx->set_materialize_grads(false);
    return fork_views(self, n);
  }

  static variable_list backward(AutogradContext*, variable_list grads) {
    static const auto add = find_op<Tensor(const Tensor&, const Tensor&)>("torchext::add");
    Tensor total;
    for (const Tensor& g : grads) {
      if (g.defined()) total = total.defined() ? add.call(total, g) : g;
    }
    return {total, Tensor()};
  }
};

std::vector<Tensor> fork_autograd(const Tensor& self, int64_t n) { return ForkFunction::apply(self, n); }

// ---------------------------------------------------------------------------------------------------------------
// cross_entropy -> (loss, lse, total_weight); lse and total_weight are not differentiable. No gradient with
// respect to the class weights (an error at backward, as before).

using CrossEntropySignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                 c10::string_view, int64_t, double);
using CrossEntropyBackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                             c10::string_view, int64_t, double, const Tensor&, const Tensor&);

const c10::TypedOperatorHandle<CrossEntropyBackwardSignature>& cross_entropy_backward_op() {
  static const auto op = find_op<CrossEntropyBackwardSignature>("torchext::cross_entropy_backward");
  return op;
}

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, const Tensor& target,
                               const OptionalTensor& weight, c10::string_view reduction, int64_t ignore_index,
                               double label_smoothing) {
    static const auto op = find_op<CrossEntropySignature>("torchext::cross_entropy");
    auto [loss, lse, total_weight] =
        call_below_autograd(op, self, target, weight, reduction, ignore_index, label_smoothing);
    ctx->mark_non_differentiable({lse, total_weight});
    ctx->set_materialize_grads(false);
    if (self.requires_grad()) {
      ctx->save_for_backward({self, target, value_or_undefined(weight), lse, total_weight});
    }
    ctx->saved_data["weight_requires_grad"] = requires_grad(weight);
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    return {loss, lse, total_weight};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK_NOT_IMPLEMENTED(!ctx->saved_data["weight_requires_grad"].toBool(),
                                "torchext.ops.cross_entropy: no gradient with respect to `weight`");
    variable_list result(6);
    const auto saved = ctx->get_saved_variables();
    if (saved.empty() || !grads[0].defined()) return result;
    result[0] = cross_entropy_backward_op().call(
        grads[0], saved[0], saved[1], as_optional(saved[2]), ctx->saved_data["reduction"].toStringRef(),
        ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["label_smoothing"].toDouble(), saved[3], saved[4]);
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> cross_entropy_autograd(const Tensor& self, const Tensor& target,
                                                          const OptionalTensor& weight, c10::string_view reduction,
                                                          int64_t ignore_index, double label_smoothing) {
  const auto out = CrossEntropyFunction::apply(self, target, weight, reduction, ignore_index, label_smoothing);
  return {out[0], out[1], out[2]};
}

// cross_entropy_backward: gx[i] = r[i] softmax(x[i]) - (terms constant in x), with the row scale r[i] = s[i] c[i]:
// s the grad_output ('none'), grad_output / total_weight ('mean') or grad_output ('sum'); c[i] = (1 - eps) w[t[i]]
// + eps/C sum(w), 0 for ignored rows. So d/dx is softmax_backward(gg r, softmax(x)), and gx is linear in the
// grad_output: d/dg is the op at a unit grad_output, contracted with gg.
class CrossEntropyBackwardFunction : public torch::autograd::Function<CrossEntropyBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& self, const Tensor& target,
                        const OptionalTensor& weight, c10::string_view reduction, int64_t ignore_index,
                        double label_smoothing, const Tensor& lse, const Tensor& total_weight) {
    Tensor grad = call_below_autograd(cross_entropy_backward_op(), grad_output, self, target, weight, reduction,
                                      ignore_index, label_smoothing, lse, total_weight);
    ctx->save_for_backward({grad_output, self, target, value_or_undefined(weight), lse, total_weight});
    ctx->saved_data["has_weight"] = weight.has_value() && weight->defined();
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    return grad;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "torchext::cross_entropy_backward";
    constexpr const char* kNotDifferentiable = " (a non-differentiable result of torchext::cross_entropy)";
    const bool has_weight = ctx->saved_data["has_weight"].toBool();
    // Tensor arguments: grad_output 0, self 1, target 2, weight 3 when given, then lse and total_weight.
    const int64_t lse_index = has_weight ? 4 : 3;
    check_no_grad(ctx, has_weight, 3, op, "weight", "");
    check_no_grad(ctx, true, lse_index, op, "lse", kNotDifferentiable);
    check_no_grad(ctx, true, lse_index + 1, op, "total_weight", kNotDifferentiable);
    variable_list result(9);
    const Tensor& gg = grads[0];
    if (!gg.defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &self = saved[1], &target = saved[2], &weight = saved[3];
    const std::string& reduction = ctx->saved_data["reduction"].toStringRef();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const double eps = ctx->saved_data["label_smoothing"].toDouble();
    if (ctx->needs_input_grad(0)) {
      const Tensor unit = cross_entropy_backward_op().call(at::ones_like(g), self, target, as_optional(weight),
                                                           reduction, ignore_index, eps, saved[4], saved[5]);
      result[0] = grad_wrt_grad_output(gg, unit, g);
    }
    if (ctx->needs_input_grad(1)) {
      static const auto softmax = find_op<Tensor(const Tensor&)>("torchext::softmax");
      static const auto softmax_backward = find_op<Tensor(const Tensor&, const Tensor&)>("torchext::softmax_backward");
      const Tensor valid = target != ignore_index;
      Tensor coef = at::scalar_tensor(1.0, self.options());  // (1 - eps) + eps/C * C without class weights
      if (weight.defined()) {
        const Tensor target_weight = weight.index_select(0, at::where(valid, target, 0));
        coef = (1 - eps) * target_weight + (eps / static_cast<double>(self.size(1))) * weight.sum();
      }
      const Tensor scale = reduction == "mean" ? g / saved[5] : g;
      const Tensor row_scale = at::where(valid, scale * coef, 0).to(gg.scalar_type());
      result[1] = softmax_backward.call(gg * row_scale.unsqueeze(-1), softmax.call(self));
    }
    return result;
  }
};

Tensor cross_entropy_backward_autograd(const Tensor& grad_output, const Tensor& self, const Tensor& target,
                                       const OptionalTensor& weight, c10::string_view reduction, int64_t ignore_index,
                                       double label_smoothing, const Tensor& lse, const Tensor& total_weight) {
  if (!needs_graph(grad_output, self, weight, lse, total_weight)) {
    return call_below_autograd(cross_entropy_backward_op(), grad_output, self, target, weight, reduction, ignore_index,
                               label_smoothing, lse, total_weight);
  }
  return CrossEntropyBackwardFunction::apply(grad_output, self, target, weight, reduction, ignore_index,
                                             label_smoothing, lse, total_weight);
}

// ---------------------------------------------------------------------------------------------------------------
// mse_loss, binary_cross_entropy_with_logits, multi_margin_loss. Gradients with respect to self, and to target for
// mse_loss (-d/dself) and binary_cross_entropy_with_logits (the backward op with wrt_target); none with respect to
// `weight` or `pos_weight` (NotImplementedError when asked for).

using MseLossSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view);
using MseLossBackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                        c10::string_view);
using BceSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, const OptionalTensor&,
                            c10::string_view);
using BceBackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                    const OptionalTensor&, c10::string_view, bool);
using MultiMarginSignature = Tensor(const Tensor&, const Tensor&, int64_t, double, const OptionalTensor&,
                                    c10::string_view);
using MultiMarginBackwardSignature = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, double,
                                            const OptionalTensor&, c10::string_view);

const c10::TypedOperatorHandle<MseLossBackwardSignature>& mse_loss_backward_op() {
  static const auto op = find_op<MseLossBackwardSignature>("torchext::mse_loss_backward");
  return op;
}
const c10::TypedOperatorHandle<BceBackwardSignature>& bce_backward_op() {
  static const auto op = find_op<BceBackwardSignature>("torchext::binary_cross_entropy_with_logits_backward");
  return op;
}
const c10::TypedOperatorHandle<MultiMarginBackwardSignature>& multi_margin_backward_op() {
  static const auto op = find_op<MultiMarginBackwardSignature>("torchext::multi_margin_loss_backward");
  return op;
}

// grad_output / numel(self) under 'mean', else grad_output: the factor every element's gradient takes.
Tensor mean_scaled(const Tensor& grad_output, const Tensor& self, c10::string_view reduction) {
  return reduction == "mean" ? grad_output / static_cast<double>(self.numel()) : grad_output;
}

class MseLossFunction : public torch::autograd::Function<MseLossFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& target, const OptionalTensor& weight,
                        c10::string_view reduction) {
    static const auto op = find_op<MseLossSignature>("torchext::mse_loss");
    Tensor loss = call_below_autograd(op, self, target, weight, reduction);
    if (self.requires_grad() || target.requires_grad()) {
      ctx->save_for_backward({self, target, value_or_undefined(weight)});
    }
    ctx->saved_data["has_weight"] = weight.has_value() && weight->defined();
    ctx->saved_data["reduction"] = std::string(reduction);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_no_grad(ctx, ctx->saved_data["has_weight"].toBool(), 2, "torchext::mse_loss", "weight", "");
    variable_list result(4);
    if (!grads[0].defined() || !(ctx->needs_input_grad(0) || ctx->needs_input_grad(1))) return result;
    const auto saved = ctx->get_saved_variables();
    const Tensor g = mse_loss_backward_op().call(grads[0], saved[0], saved[1], as_optional(saved[2]),
                                                 ctx->saved_data["reduction"].toStringRef());
    if (ctx->needs_input_grad(0)) result[0] = g;
    if (ctx->needs_input_grad(1)) result[1] = -g;
    return result;
  }
};

Tensor mse_loss_autograd(const Tensor& self, const Tensor& target, const OptionalTensor& weight,
                         c10::string_view reduction) {
  return MseLossFunction::apply(self, target, weight, reduction);
}

// mse_loss_backward: gx = 2 w (self - target) s, linear in both grad_output and self - target. So its derivative
// along gg with respect to self is the op itself with gg in place of self - target (and minus that for target).
class MseLossBackwardFunction : public torch::autograd::Function<MseLossBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& self, const Tensor& target,
                        const OptionalTensor& weight, c10::string_view reduction) {
    Tensor grad = call_below_autograd(mse_loss_backward_op(), grad_output, self, target, weight, reduction);
    ctx->save_for_backward({grad_output, self, target, value_or_undefined(weight)});
    ctx->saved_data["has_weight"] = weight.has_value() && weight->defined();
    ctx->saved_data["reduction"] = std::string(reduction);
    return grad;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_no_grad(ctx, ctx->saved_data["has_weight"].toBool(), 3, "torchext::mse_loss_backward", "weight", "");
    variable_list result(5);
    const Tensor& gg = grads[0];
    if (!gg.defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &self = saved[1], &target = saved[2];
    const OptionalTensor weight = as_optional(saved[3]);
    const std::string& reduction = ctx->saved_data["reduction"].toStringRef();
    const auto& op = mse_loss_backward_op();
    if (ctx->needs_input_grad(0)) {
      result[0] = grad_wrt_grad_output(gg, op.call(at::ones_like(g), self, target, weight, reduction), g);
    }
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const Tensor along = op.call(g, gg, at::zeros_like(gg), weight, reduction);
      if (ctx->needs_input_grad(1)) result[1] = along;
      if (ctx->needs_input_grad(2)) result[2] = -along;
    }
    return result;
  }
};

Tensor mse_loss_backward_autograd(const Tensor& grad_output, const Tensor& self, const Tensor& target,
                                  const OptionalTensor& weight, c10::string_view reduction) {
  if (!needs_graph(grad_output, self, target, weight)) {
    return call_below_autograd(mse_loss_backward_op(), grad_output, self, target, weight, reduction);
  }
  return MseLossBackwardFunction::apply(grad_output, self, target, weight, reduction);
}

class BceFunction : public torch::autograd::Function<BceFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& target, const OptionalTensor& weight,
                        const OptionalTensor& pos_weight, c10::string_view reduction) {
    static const auto op = find_op<BceSignature>("torchext::binary_cross_entropy_with_logits");
    Tensor loss = call_below_autograd(op, self, target, weight, pos_weight, reduction);
    if (self.requires_grad() || target.requires_grad()) {
      ctx->save_for_backward({self, target, value_or_undefined(weight), value_or_undefined(pos_weight)});
    }
    ctx->saved_data["has_weight"] = weight.has_value() && weight->defined();
    ctx->saved_data["has_pos_weight"] = pos_weight.has_value() && pos_weight->defined();
    ctx->saved_data["reduction"] = std::string(reduction);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "torchext::binary_cross_entropy_with_logits";
    const bool has_weight = ctx->saved_data["has_weight"].toBool();
    check_no_grad(ctx, has_weight, 2, op, "weight", "");
    check_no_grad(ctx, ctx->saved_data["has_pos_weight"].toBool(), has_weight ? 3 : 2, op, "pos_weight", "");
    variable_list result(5);
    if (!grads[0].defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const std::string& reduction = ctx->saved_data["reduction"].toStringRef();
    for (int64_t i = 0; i < 2; ++i) {
      if (ctx->needs_input_grad(i)) {
        result[i] = bce_backward_op().call(grads[0], saved[0], saved[1], as_optional(saved[2]), as_optional(saved[3]),
                                           reduction, /*wrt_target=*/i == 1);
      }
    }
    return result;
  }
};

Tensor bce_autograd(const Tensor& self, const Tensor& target, const OptionalTensor& weight,
                    const OptionalTensor& pos_weight, c10::string_view reduction) {
  return BceFunction::apply(self, target, weight, pos_weight, reduction);
}

// binary_cross_entropy_with_logits_backward, with s the grad_output (/ numel under 'mean'), w the weight, q the
// pos_weight, y the target, p = sigmoid(x):
//   wrt self:   gx = s w ((1 + (q - 1) y) p - q y),  d/dx = s w (1 + (q - 1) y) p (1 - p),  d/dy = s w ((q - 1) p - q)
//   wrt target: gy = s w ((q - 1) softplus(-x) - x),  d/dx = s w ((1 - q) (1 - p) - 1),  d/dy = 0
// and both are linear in the grad_output.
class BceBackwardFunction : public torch::autograd::Function<BceBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& self, const Tensor& target,
                        const OptionalTensor& weight, const OptionalTensor& pos_weight, c10::string_view reduction,
                        bool wrt_target) {
    Tensor grad =
        call_below_autograd(bce_backward_op(), grad_output, self, target, weight, pos_weight, reduction, wrt_target);
    ctx->save_for_backward({grad_output, self, target, value_or_undefined(weight), value_or_undefined(pos_weight)});
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["wrt_target"] = wrt_target;
    return grad;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    constexpr const char* op = "torchext::binary_cross_entropy_with_logits_backward";
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &self = saved[1], &target = saved[2], &weight = saved[3], &pos_weight = saved[4];
    check_no_grad(ctx, weight.defined(), 3, op, "weight", "");
    check_no_grad(ctx, pos_weight.defined(), weight.defined() ? 4 : 3, op, "pos_weight", "");
    variable_list result(7);
    const Tensor& gg = grads[0];
    if (!gg.defined()) return result;
    const std::string& reduction = ctx->saved_data["reduction"].toStringRef();
    const bool wrt_target = ctx->saved_data["wrt_target"].toBool();
    if (ctx->needs_input_grad(0)) {
      const Tensor unit = bce_backward_op().call(at::ones_like(g), self, target, as_optional(weight),
                                                 as_optional(pos_weight), reduction, wrt_target);
      result[0] = grad_wrt_grad_output(gg, unit, g);
    }
    const bool self_grad = ctx->needs_input_grad(1), target_grad = !wrt_target && ctx->needs_input_grad(2);
    if (!self_grad && !target_grad) return result;
    Tensor scale = gg * mean_scaled(g, self, reduction);
    if (weight.defined()) scale = scale * weight;
    const Tensor p = at::sigmoid(self);
    if (self_grad) {
      if (wrt_target) {
        result[1] = pos_weight.defined() ? scale * ((1 - pos_weight) * (1 - p) - 1) : -scale;
      } else {
        const Tensor d = p * (1 - p);
        result[1] = scale * (pos_weight.defined() ? (1 + (pos_weight - 1) * target) * d : d);
      }
    }
    if (target_grad) result[2] = pos_weight.defined() ? scale * ((pos_weight - 1) * p - pos_weight) : -scale;
    return result;
  }
};

Tensor bce_backward_autograd(const Tensor& grad_output, const Tensor& self, const Tensor& target,
                             const OptionalTensor& weight, const OptionalTensor& pos_weight, c10::string_view reduction,
                             bool wrt_target) {
  if (!needs_graph(grad_output, self, target, weight, pos_weight)) {
    return call_below_autograd(bce_backward_op(), grad_output, self, target, weight, pos_weight, reduction, wrt_target);
  }
  return BceBackwardFunction::apply(grad_output, self, target, weight, pos_weight, reduction, wrt_target);
}

class MultiMarginFunction : public torch::autograd::Function<MultiMarginFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, const Tensor& target, int64_t p, double margin,
                        const OptionalTensor& weight, c10::string_view reduction) {
    static const auto op = find_op<MultiMarginSignature>("torchext::multi_margin_loss");
    Tensor loss = call_below_autograd(op, self, target, p, margin, weight, reduction);
    if (self.requires_grad()) ctx->save_for_backward({self, target, value_or_undefined(weight)});
    ctx->saved_data["has_weight"] = weight.has_value() && weight->defined();
    ctx->saved_data["p"] = p;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["reduction"] = std::string(reduction);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_no_grad(ctx, ctx->saved_data["has_weight"].toBool(), 2, "torchext::multi_margin_loss", "weight", "");
    variable_list result(6);
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return result;
    const auto saved = ctx->get_saved_variables();
    result[0] = multi_margin_backward_op().call(grads[0], saved[0], saved[1], ctx->saved_data["p"].toInt(),
                                                ctx->saved_data["margin"].toDouble(), as_optional(saved[2]),
                                                ctx->saved_data["reduction"].toStringRef());
    return result;
  }
};

Tensor multi_margin_autograd(const Tensor& self, const Tensor& target, int64_t p, double margin,
                             const OptionalTensor& weight, c10::string_view reduction) {
  return MultiMarginFunction::apply(self, target, p, margin, weight, reduction);
}

// multi_margin_loss_backward, per row with target t: gx[j] = a[j] z[j] for j != t, gx[t] = -sum_j a[j] z[j], where
// z[j] = margin - x[t] + x[j], a[j] = k [z[j] > 0] (p = 1: z[j] replaced by 1), k = 2 g w[t] / (C frames) (p = 2;
// g w[t] / (C frames) for p = 1). Linear in the grad_output; for p = 2 its derivative along gg with respect to x
// has the same form with z[j] replaced by gg[j] - gg[t]; for p = 1 it is zero.
class MultiMarginBackwardFunction : public torch::autograd::Function<MultiMarginBackwardFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& self, const Tensor& target,
                        int64_t p, double margin, const OptionalTensor& weight, c10::string_view reduction) {
    Tensor grad =
        call_below_autograd(multi_margin_backward_op(), grad_output, self, target, p, margin, weight, reduction);
    ctx->save_for_backward({grad_output, self, target, value_or_undefined(weight)});
    ctx->saved_data["p"] = p;
    ctx->saved_data["margin"] = margin;
    ctx->saved_data["reduction"] = std::string(reduction);
    return grad;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &g = saved[0], &self = saved[1], &target = saved[2], &weight = saved[3];
    check_no_grad(ctx, weight.defined(), 3, "torchext::multi_margin_loss_backward", "weight", "");
    variable_list result(7);
    const Tensor& gg = grads[0];
    if (!gg.defined()) return result;
    const int64_t p = ctx->saved_data["p"].toInt();
    const double margin = ctx->saved_data["margin"].toDouble();
    const std::string& reduction = ctx->saved_data["reduction"].toStringRef();
    const int64_t rows = self.dim() == 2 ? self.size(0) : 1, cols = self.dim() == 0 ? 1 : self.size(-1);
    if (ctx->needs_input_grad(0)) {
      const Tensor unit =
          multi_margin_backward_op().call(at::ones_like(g), self, target, p, margin, as_optional(weight), reduction);
      result[0] = grad_wrt_grad_output(gg, unit, g);
    }
    if (p == 2 && ctx->needs_input_grad(1)) {
      const Tensor x = self.reshape({rows, cols}), t = target.reshape({rows, 1}), d = gg.reshape({rows, cols});
      const double frames = reduction == "mean" ? static_cast<double>(rows) : 1.0;
      Tensor k = g.reshape({-1, 1}) * (2.0 / (frames * static_cast<double>(cols)));
      if (weight.defined()) k = k * weight.index_select(0, t.reshape({rows})).unsqueeze(1);
      const Tensor z = margin - x.gather(1, t) + x;
      const Tensor active = (z > 0).logical_and(at::arange(cols, t.options()) != t);
      const Tensor h = at::where(active, k * (d - d.gather(1, t)), 0);
      result[1] = (h - at::zeros_like(h).scatter(1, t, h.sum(1, true))).reshape(self.sizes());
    }
    return result;
  }
};

Tensor multi_margin_backward_autograd(const Tensor& grad_output, const Tensor& self, const Tensor& target, int64_t p,
                                      double margin, const OptionalTensor& weight, c10::string_view reduction) {
  if (!needs_graph(grad_output, self, weight)) {
    return call_below_autograd(multi_margin_backward_op(), grad_output, self, target, p, margin, weight, reduction);
  }
  return MultiMarginBackwardFunction::apply(grad_output, self, target, p, margin, weight, reduction);
}

// ---------------------------------------------------------------------------------------------------------------
// linear -> (out, saved): out = act(input @ weight^T + bias); `saved` is the pre-activation for gelu, gelu_tanh and
// silu (differentiable, see the header), else empty and non-differentiable. Backward keeps only what it reads:
// input for grad_weight, weight for grad_input, out for relu's derivative, saved for the others'. An operand whose
// values are not needed is saved as a one-element stand-in expanded to its shape, so that it is not kept alive.

using LinearSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                   c10::string_view);
using LinearBackwardSignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                   const Tensor&, const Tensor&, c10::string_view, bool,
                                                                   std::array<bool, 3>);

const c10::TypedOperatorHandle<LinearBackwardSignature>& linear_backward_op() {
  static const auto op = find_op<LinearBackwardSignature>("torchext::linear_backward");
  return op;
}

Tensor placeholder(const Tensor& like) { return at::empty({}, like.options()).expand(like.sizes()); }

// grad_out * act'(z) through the activations' differentiable *_backward ops.
Tensor activation_backward(const Tensor& grad_out, const Tensor& out, const Tensor& saved, MatmulActivation act) {
  switch (act) {
    case MatmulActivation::relu:
      return backward_op<Relu>().call(grad_out, out);
    case MatmulActivation::gelu:
      return backward_op<Gelu, c10::string_view>().call(grad_out, saved, "none");
    case MatmulActivation::gelu_tanh:
      return backward_op<Gelu, c10::string_view>().call(grad_out, saved, "tanh");
    case MatmulActivation::silu:
      return backward_op<Silu>().call(grad_out, saved);
    default:
      return grad_out;
  }
}

// linear_backward composed from differentiable ops (the activation's *_backward op, torchext::matmul, a sum), with
// grad_saved (a gradient reaching the pre-activation `saved` directly; may be undefined) added to grad_z. Results
// as linear_backward's: an empty tensor where output_mask is false or there is no bias.
std::tuple<Tensor, Tensor, Tensor> linear_backward_composed(const Tensor& grad_out, const Tensor& grad_saved,
                                                            const Tensor& input, const Tensor& weight,
                                                            const Tensor& out, const Tensor& saved,
                                                            MatmulActivation act, bool has_bias,
                                                            std::array<bool, 3> mask) {
  static const auto matmul =
      find_op<Tensor(const Tensor&, const Tensor&, std::optional<c10::string_view>)>("torchext::matmul");
  Tensor grad_z = grad_out.defined() ? activation_backward(grad_out, out, saved, act) : Tensor();
  if (grad_saved.defined()) grad_z = grad_z.defined() ? grad_z + grad_saved : grad_saved;
  const int64_t rows = c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
  const int64_t n = weight.size(0), k = weight.size(1);
  const Tensor gz = grad_z.reshape({rows, n});
  const Tensor empty = at::empty({0}, grad_z.options());
  return {mask[0] ? matmul.call(gz, weight, std::nullopt).reshape(input.sizes()) : empty,
          mask[1] ? matmul.call(gz.t(), input.reshape({rows, k}), std::nullopt) : empty,
          has_bias && mask[2] ? gz.sum(0) : empty};
}

// linear_backward's Autograd kernel: the fused op when no graph is recorded, else the composed backward.
std::tuple<Tensor, Tensor, Tensor> linear_backward_autograd(const Tensor& grad_out, const Tensor& input,
                                                            const Tensor& weight, const Tensor& out,
                                                            const Tensor& saved, c10::string_view activation,
                                                            bool has_bias, std::array<bool, 3> mask) {
  if (!needs_graph(grad_out, input, weight, out, saved)) {
    return call_below_autograd(linear_backward_op(), grad_out, input, weight, out, saved, activation, has_bias, mask);
  }
  constexpr const char* op = "torchext::linear_backward";
  const MatmulActivation act = parse_activation(op, activation);
  check_linear_backward_args(op, grad_out, input, weight, out, saved, act);
  return linear_backward_composed(grad_out, Tensor(), input, weight, out, saved, act, has_bias, mask);
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                               const OptionalTensor& bias, c10::string_view activation) {
    static const auto op = find_op<LinearSignature>("torchext::linear");
    auto [out, saved] = call_below_autograd(op, input, weight, bias, activation);
    const MatmulActivation act = parse_activation("torchext::linear", activation);
    const bool differentiable_saved = activation_saves_preactivation(act);
    if (!differentiable_saved) ctx->mark_non_differentiable({saved});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({
        weight.requires_grad() ? input : placeholder(input),
        input.requires_grad() ? weight : placeholder(weight),
        act == MatmulActivation::relu ? out : Tensor(),
        differentiable_saved ? saved : Tensor(),
    });
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return {out, saved};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // needs_input_grad counts tensor arguments only: input 0, weight 1, bias 2 when there is one.
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      has_bias && ctx->needs_input_grad(2)};
    variable_list result(4);
    const Tensor &grad_out = grads[0], &grad_saved = grads[1];
    if (!(grad_out.defined() || grad_saved.defined()) || !(mask[0] || mask[1] || mask[2])) return result;
    const auto saved = ctx->get_saved_variables();
    const std::string& activation = ctx->saved_data["activation"].toStringRef();
    Tensor grad_input, grad_weight, grad_bias;
    if (grad_saved.defined()) {
      std::tie(grad_input, grad_weight, grad_bias) =
          linear_backward_composed(grad_out, grad_saved, saved[0], saved[1], saved[2], saved[3],
                                   parse_activation("torchext::linear", activation), has_bias, mask);
    } else {
      const Tensor empty = at::empty({0}, grad_out.options());
      std::tie(grad_input, grad_weight, grad_bias) =
          linear_backward_op().call(grad_out, saved[0], saved[1], saved[2].defined() ? saved[2] : empty,
                                    saved[3].defined() ? saved[3] : empty, activation, has_bias, mask);
    }
    if (mask[0]) result[0] = grad_input;
    if (mask[1]) result[1] = grad_weight;
    if (mask[2]) result[2] = grad_bias;
    return result;
  }
};

std::tuple<Tensor, Tensor> linear_autograd(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                                           c10::string_view activation) {
  const auto out = LinearFunction::apply(input, weight, bias, activation);
  return {out[0], out[1]};
}

// ---------------------------------------------------------------------------------------------------------------
// conv2d -> act(conv(input, weight) + bias), act none or relu; conv2d_stats -> (out, sum, sum_sq) with the
// per-output-channel sum and sum of squares of out over N, H, W; conv2d_backward -> (grad_input, grad_weight,
// grad_bias). Backward saves input only for weight's gradient and weight only for input's (a one-element stand-in
// otherwise, as linear does), and the output for relu's derivative (relu) or sum_sq's (conv2d_stats). The forward's
// `variant` is passed on to every backward call.
//
// conv2d: grad_z = relu_backward(grad, out) (relu) or grad, then conv2d_backward(grad_z, ...).
// conv2d_stats: grad_z = g_out + g_sum[k] + 2 out g_sum_sq[k] (broadcast over N, H, W), then as conv2d.
// conv2d_backward (double backward): grad_input = conv2d_backward_input(grad_output, weight) is linear in
// (grad_output, weight), grad_weight = conv2d_backward_weight(grad_output, input) in (grad_output, input) and
// grad_bias = sum(grad_output) in grad_output, so along (ggi, ggw, ggb), as torch's _convolution_double_backward:
//   d grad_output = conv2d(ggi, weight) + conv2d(input, ggw, bias=ggb)
//   d input       = conv2d_backward(grad_output, input, ggw).grad_input
//   d weight      = conv2d_backward(grad_output, ggi, weight).grad_weight
// all registered (hence differentiable) ops, which gives third and higher derivatives too.

using Conv2dSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, int64_t, c10::string_view, std::optional<c10::string_view>);
using Conv2dStatsSignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                                int64_t, std::optional<c10::string_view>);
using Conv2dBackwardSignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                   at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                                   int64_t, std::array<bool, 3>,
                                                                   std::optional<c10::string_view>,
                                                                   std::optional<at::ScalarType>);

const c10::TypedOperatorHandle<Conv2dSignature>& conv2d_op() {
  static const auto op = find_op<Conv2dSignature>("torchext::conv2d");
  return op;
}
const c10::TypedOperatorHandle<Conv2dStatsSignature>& conv2d_stats_op() {
  static const auto op = find_op<Conv2dStatsSignature>("torchext::conv2d_stats");
  return op;
}
const c10::TypedOperatorHandle<Conv2dBackwardSignature>& conv2d_backward_op() {
  static const auto op = find_op<Conv2dBackwardSignature>("torchext::conv2d_backward");
  return op;
}

// The non-tensor arguments every conv2d call passes on, kept in saved_data.
struct Conv2dOptions {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  std::optional<std::string> variant;

  Conv2dOptions(at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                const std::optional<c10::string_view>& variant)
      : stride(stride.vec()), padding(padding.vec()), dilation(dilation.vec()), groups(groups) {
    if (variant.has_value()) this->variant = std::string(*variant);
  }

  void save(AutogradContext* ctx) const {
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["variant"] = variant.has_value() ? c10::IValue(*variant) : c10::IValue();
  }

  static Conv2dOptions load(AutogradContext* ctx) {
    const c10::IValue& v = ctx->saved_data["variant"];
    return Conv2dOptions(ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                         ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt(),
                         v.isNone() ? std::nullopt : std::optional<c10::string_view>(v.toStringRef()));
  }

  std::optional<c10::string_view> variant_view() const {
    return variant.has_value() ? std::optional<c10::string_view>(*variant) : std::nullopt;
  }

  Tensor conv2d(const Tensor& input, const Tensor& weight, const OptionalTensor& bias) const {
    return conv2d_op().call(input, weight, bias, stride, padding, dilation, groups, "none", variant_view());
  }

  std::tuple<Tensor, Tensor, Tensor> backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                                              std::array<bool, 3> mask,
                                              std::optional<at::ScalarType> grad_weight_dtype = std::nullopt) const {
    return conv2d_backward_op().call(grad_output, input, weight, stride, padding, dilation, groups, mask,
                                     variant_view(), grad_weight_dtype);
  }
};

// The saved input and weight: each only where the other's gradient is needed (the backward reads input for
// grad_weight and weight for grad_input). A placeholder input has no layout to suggest: where csrc/conv2d.h's rule
// gives grad_input channels-last from the input alone (a frozen weight that does not suggest it), a note says so.
// `computed`: the weight the kernels ran on, the float32 weight's autocast copy (csrc/autocast_copies.h) where the
// CUDA autocast kernel passed one, else the weight itself. With a copy, the backward reads the copy, returns the
// weight's gradient in the weight's dtype (what the cast's own node would), and, only for a second derivative
// (create_graph), casts the weight again differentiably; the weight is kept in saved_data for that, as
// save_for_backward would check its version, which the optimizer's step bumps, where the cast's node does not.
void save_conv2d_operands(AutogradContext* ctx, const Tensor& input, const Tensor& weight, const Tensor& out,
                          const OptionalTensor& computed) {
  const bool input_kept = weight.requires_grad();
  const Tensor& w = computed.has_value() ? *computed : weight;
  ctx->save_for_backward({input_kept ? input : placeholder(input), input.requires_grad() ? w : placeholder(w), out});
  if (!input_kept && input.requires_grad() && conv2d_memory_format(input) == at::MemoryFormat::ChannelsLast &&
      conv2d_memory_format(w) != at::MemoryFormat::ChannelsLast) {
    ctx->saved_data["grad_input_channels_last"] = true;
  }
  if (computed.has_value()) {
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["weight_version"] = weight._version();
  }
}

// The gradients of input, weight and bias from grad_z (the gradient of the pre-activation).
variable_list conv2d_input_grads(AutogradContext* ctx, const Tensor& grad_z, size_t count) {
  variable_list result(count);
  const bool has_bias = ctx->saved_data["has_bias"].toBool();
  const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                    has_bias && ctx->needs_input_grad(2)};
  if (!grad_z.defined() || !(mask[0] || mask[1] || mask[2])) return result;
  const auto saved = ctx->get_saved_variables();
  Tensor weight = saved[1];
  const auto master = ctx->saved_data.find("weight");  // the float32 weight, where its autocast copy ran
  if (master != ctx->saved_data.end() && mask[0] && at::GradMode::is_enabled() &&
      master->second.toTensor().requires_grad()) {
    const Tensor& w = master->second.toTensor();
    TORCH_CHECK(w._version() == ctx->saved_data["weight_version"].toInt(),
                "torchext::conv2d: the weight was modified by an inplace operation (an optimizer step?) after the "
                "forward whose graph is differentiated again (create_graph=True); its autocast copy holds the "
                "forward's value, but a second derivative needs the weight itself. Differentiate before the step.");
    weight = w.to(weight.scalar_type());  // the same bits, differentiable
  }
  // With a copy, the weight's gradient comes in the float32 weight's dtype straight from the kernel's float sums (under
  // create_graph too: conv2d_backward's node takes a float32 grad_weight's gradient back to the copy's dtype).
  const std::optional<at::ScalarType> gw_dtype =
      master != ctx->saved_data.end() ? std::optional(master->second.toTensor().scalar_type()) : std::nullopt;
  auto [grad_input, grad_weight, grad_bias] =
      Conv2dOptions::load(ctx).backward(grad_z, saved[0], weight, mask, gw_dtype);
  if (mask[0] && ctx->saved_data.count("grad_input_channels_last") > 0) {
    grad_input = grad_input.contiguous(at::MemoryFormat::ChannelsLast);  // the placeholder input suggested NCHW
  }
  if (mask[0]) result[0] = grad_input;
  if (mask[1]) result[1] = grad_weight;
  if (mask[2]) result[2] = grad_bias;
  return result;
}

class Conv2dFunction : public torch::autograd::Function<Conv2dFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                        at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                        c10::string_view activation, std::optional<c10::string_view> variant,
                        const OptionalTensor& weight_copy) {
    const Tensor& w = weight_copy.has_value() ? *weight_copy : weight;
    Tensor out =
        call_below_autograd(conv2d_op(), input, w, bias, stride, padding, dilation, groups, activation, variant);
    const bool relu = parse_conv2d_activation("torchext::conv2d", activation) == MatmulActivation::relu;
    save_conv2d_operands(ctx, input, weight, relu ? out : Tensor(), weight_copy);
    Conv2dOptions(stride, padding, dilation, groups, variant).save(ctx);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor& grad = grads[0];
    if (!grad.defined()) return variable_list(10);
    const Tensor out = ctx->get_saved_variables()[2];
    return conv2d_input_grads(ctx, out.defined() ? backward_op<Relu>().call(grad, out) : grad, 10);
  }
};

Tensor conv2d_autograd(const Tensor& input, const Tensor& weight, const OptionalTensor& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, c10::string_view activation,
                       std::optional<c10::string_view> variant) {
  return Conv2dFunction::apply(input, weight, bias, stride, padding, dilation, groups, activation, variant,
                               OptionalTensor());
}

class Conv2dStatsFunction : public torch::autograd::Function<Conv2dStatsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                               const OptionalTensor& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef dilation, int64_t groups, std::optional<c10::string_view> variant,
                               const OptionalTensor& weight_copy) {
    const Tensor& w = weight_copy.has_value() ? *weight_copy : weight;
    auto [out, sum, sum_sq] =
        call_below_autograd(conv2d_stats_op(), input, w, bias, stride, padding, dilation, groups, variant);
    ctx->set_materialize_grads(false);
    save_conv2d_operands(ctx, input, weight, out, weight_copy);
    Conv2dOptions(stride, padding, dilation, groups, variant).save(ctx);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return {out, sum, sum_sq};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Tensor &g_out = grads[0], &g_sum = grads[1], &g_sum_sq = grads[2];
    Tensor grad_z = g_out;
    const auto add = [&grad_z](const Tensor& t) { grad_z = grad_z.defined() ? grad_z + t : t; };
    if (g_sum.defined() || g_sum_sq.defined()) {
      const Tensor out = ctx->get_saved_variables()[2];
      // In the statistics' dtype (float32 for half inputs), rounded to the output's once.
      Tensor per_element;
      if (g_sum_sq.defined()) per_element = 2 * out.to(g_sum_sq.scalar_type()) * g_sum_sq.view({1, -1, 1, 1});
      if (g_sum.defined()) {
        const Tensor s = g_sum.view({1, -1, 1, 1});
        per_element = per_element.defined() ? per_element + s : s.expand(out.sizes());
      }
      add(per_element.to(out.scalar_type()));
    }
    return conv2d_input_grads(ctx, grad_z, 9);
  }
};

std::tuple<Tensor, Tensor, Tensor> conv2d_stats_autograd(const Tensor& input, const Tensor& weight,
                                                         const OptionalTensor& bias, at::IntArrayRef stride,
                                                         at::IntArrayRef padding, at::IntArrayRef dilation,
                                                         int64_t groups, std::optional<c10::string_view> variant) {
  const auto out =
      Conv2dStatsFunction::apply(input, weight, bias, stride, padding, dilation, groups, variant, OptionalTensor());
  return {out[0], out[1], out[2]};
}

class Conv2dBackwardFunction : public torch::autograd::Function<Conv2dBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& grad_output, const Tensor& input,
                               const Tensor& weight, at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> mask,
                               std::optional<c10::string_view> variant,
                               std::optional<at::ScalarType> grad_weight_dtype) {
    auto [grad_input, grad_weight, grad_bias] =
        call_below_autograd(conv2d_backward_op(), grad_output, input, weight, stride, padding, dilation, groups, mask,
                            variant, grad_weight_dtype);
    ctx->set_materialize_grads(false);
    // grad_output for the input's and weight's derivatives, input and weight for grad_output's.
    const bool go_needed = grad_output.requires_grad();
    ctx->save_for_backward(
        {(input.requires_grad() && mask[1]) || (weight.requires_grad() && mask[0]) ? grad_output
                                                                                   : placeholder(grad_output),
         go_needed && mask[1] ? input : placeholder(input), go_needed && mask[0] ? weight : placeholder(weight)});
    Conv2dOptions(stride, padding, dilation, groups, variant).save(ctx);
    ctx->saved_data["mask"] = int64_t{mask[0]} | int64_t{mask[1]} << 1 | int64_t{mask[2]} << 2;
    return {grad_input, grad_weight, grad_bias};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(10);
    const auto saved = ctx->get_saved_variables();
    const Tensor &go = saved[0], &input = saved[1], &weight = saved[2];
    // Gradients reaching the empty results of entries output_mask left out are ignored. grad_weight's may be float32
    // (grad_weight_dtype): the convolutions below take it in grad_output's dtype.
    const int64_t mask = ctx->saved_data["mask"].toInt();
    const Tensor ggi = mask & 1 ? grads[0] : Tensor();
    Tensor ggw = mask & 2 ? grads[1] : Tensor();
    if (ggw.defined() && ggw.scalar_type() != go.scalar_type()) ggw = ggw.to(go.scalar_type());
    const Tensor ggb = mask & 4 ? grads[2] : Tensor();
    const Conv2dOptions options = Conv2dOptions::load(ctx);
    if (ctx->needs_input_grad(0)) {
      Tensor grad;
      if (ggw.defined()) grad = options.conv2d(input, ggw, as_optional(ggb));
      if (ggi.defined()) {
        const Tensor t = options.conv2d(ggi, weight, grad.defined() ? OptionalTensor() : as_optional(ggb));
        grad = grad.defined() ? grad + t : t;
      }
      if (!grad.defined() && ggb.defined()) grad = ggb.view({1, -1, 1, 1}).expand(go.sizes());
      result[0] = grad;
    }
    if (ctx->needs_input_grad(1) && ggw.defined()) {
      result[1] = std::get<0>(options.backward(go, input, ggw, {true, false, false}));
    }
    if (ctx->needs_input_grad(2) && ggi.defined()) {
      result[2] = std::get<1>(options.backward(go, ggi, weight, {false, true, false}));
    }
    return result;
  }
};

// conv2d_backward's Autograd kernel: the op itself when no graph is recorded, else the Function above.
std::tuple<Tensor, Tensor, Tensor> conv2d_backward_autograd(const Tensor& grad_output, const Tensor& input,
                                                            const Tensor& weight, at::IntArrayRef stride,
                                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                                            int64_t groups, std::array<bool, 3> mask,
                                                            std::optional<c10::string_view> variant,
                                                            std::optional<at::ScalarType> grad_weight_dtype) {
  if (!needs_graph(grad_output, input, weight)) {
    return call_below_autograd(conv2d_backward_op(), grad_output, input, weight, stride, padding, dilation, groups,
                               mask, variant, grad_weight_dtype);
  }
  const auto out = Conv2dBackwardFunction::apply(grad_output, input, weight, stride, padding, dilation, groups, mask,
                                                 variant, grad_weight_dtype);
  return {out[0], out[1], out[2]};
}

// ---------------------------------------------------------------------------------------------------------------
// CUDA autocast: PyTorch's rules for the ops these replace. cross_entropy runs in float32 (its logits and class
// weights are cast up); linear in the autocast dtype (float16 or bfloat16). at::autocast::cached_cast casts only
// floating CUDA tensors other than float64, and caches the cast of a leaf weight for the autocast region, as
// torch's own linear does. The CPU autocast rules stay in Python (torchext/ops/_common.py).

std::tuple<Tensor, Tensor, Tensor> cross_entropy_autocast_cuda(const Tensor& self, const Tensor& target,
                                                               const OptionalTensor& weight, c10::string_view reduction,
                                                               int64_t ignore_index, double label_smoothing) {
  static const auto op = find_op<CrossEntropySignature>("torchext::cross_entropy");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  constexpr auto cuda = c10::DeviceType::CUDA;
  return op.call(at::autocast::cached_cast(at::kFloat, self, cuda), target,
                 at::autocast::cached_cast(at::kFloat, weight, cuda), reduction, ignore_index, label_smoothing);
}

std::tuple<Tensor, Tensor> linear_autocast_cuda(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                                                c10::string_view activation) {
  static const auto op = find_op<LinearSignature>("torchext::linear");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  constexpr auto cuda = c10::DeviceType::CUDA;
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(cuda);
  return op.call(at::autocast::cached_cast(dtype, input, cuda), at::autocast::cached_cast(dtype, weight, cuda),
                 at::autocast::cached_cast(dtype, bias, cuda), activation);
}

// conv2d and conv2d_stats in the autocast dtype, as torch's conv2d (lower_precision_fp). Where the float32 weight has
// a fresh autocast copy (csrc/autocast_copies.h), the kernels read the copy instead of a cast: the op's autograd
// Function is applied here with the weight itself as its input (so its node returns the weight's gradient, in
// float32) and the copy to compute with. That skips only the Tracer key between autocast and autograd, and
// autocast_copies::fresh refuses under tracing. Without a graph to record, the op runs on the copy.
//
// A float32 weight without a copy, in the same plain eager calls that may use one, is cast here outside autograd and
// handed to the Function the same way: its node returns the float32 gradient straight from the kernel's float sums
// (conv2d_backward's grad_weight_dtype), where autocast's cast node would have rounded it through the autocast dtype
// and cast it back (one more node and one more kernel per convolution and step). Training is then the same bits with
// copies and without. Elsewhere (tracing, torch.compile, fake tensors, ...) the weight goes through cached_cast.

// The operands in the autocast dtype: input and bias cast (cached_cast), and the weight's computing form where the call
// can take it: its fresh copy, or its cast made here (else the weight is cast by the caller).
struct Conv2dAutocastOperands {
  at::ScalarType dtype;
  Tensor input;
  OptionalTensor bias;
  std::optional<Tensor> weight_copy;
};

Conv2dAutocastOperands conv2d_autocast_operands(const Tensor& input, const Tensor& weight, const OptionalTensor& bias) {
  constexpr auto cuda = c10::DeviceType::CUDA;
  Conv2dAutocastOperands a{at::autocast::get_autocast_dtype(cuda), Tensor(), OptionalTensor(), std::nullopt};
  a.input = at::autocast::cached_cast(a.dtype, input, cuda);
  a.bias = at::autocast::cached_cast(a.dtype, bias, cuda);
  a.weight_copy = autocast_copies::fresh(weight, a.dtype);  // nullopt at once while there are no copies
  if (a.weight_copy.has_value() && !autocast_copies::plain(a.input)) a.weight_copy.reset();
  if (!a.weight_copy.has_value() && weight.defined() && weight.scalar_type() == at::kFloat && needs_graph(weight) &&
      autocast_copies::plain(weight) && autocast_copies::plain(a.input)) {
    at::AutoGradMode no_grad(false);
    a.weight_copy = weight.to(a.dtype);
  }
  return a;
}

Tensor conv2d_autocast_cuda(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                            c10::string_view activation, std::optional<c10::string_view> variant) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const Conv2dAutocastOperands a = conv2d_autocast_operands(input, weight, bias);
  if (a.weight_copy.has_value() && needs_graph(weight)) {
    return Conv2dFunction::apply(a.input, weight, a.bias, stride, padding, dilation, groups, activation, variant,
                                 a.weight_copy);
  }
  const Tensor w =
      a.weight_copy.has_value() ? *a.weight_copy : at::autocast::cached_cast(a.dtype, weight, c10::DeviceType::CUDA);
  return conv2d_op().call(a.input, w, a.bias, stride, padding, dilation, groups, activation, variant);
}

std::tuple<Tensor, Tensor, Tensor> conv2d_stats_autocast_cuda(const Tensor& input, const Tensor& weight,
                                                              const OptionalTensor& bias, at::IntArrayRef stride,
                                                              at::IntArrayRef padding, at::IntArrayRef dilation,
                                                              int64_t groups, std::optional<c10::string_view> variant) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const Conv2dAutocastOperands a = conv2d_autocast_operands(input, weight, bias);
  if (a.weight_copy.has_value() && needs_graph(weight)) {
    const auto out =
        Conv2dStatsFunction::apply(a.input, weight, a.bias, stride, padding, dilation, groups, variant, a.weight_copy);
    return {out[0], out[1], out[2]};
  }
  const Tensor w =
      a.weight_copy.has_value() ? *a.weight_copy : at::autocast::cached_cast(a.dtype, weight, c10::DeviceType::CUDA);
  return conv2d_stats_op().call(a.input, w, a.bias, stride, padding, dilation, groups, variant);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) {
  m.impl("relu", &unary_autograd<Relu>);
  m.impl("relu_backward", &unary_backward_autograd<Relu>);
  m.impl("leaky_relu", &unary_autograd<LeakyRelu, double>);
  m.impl("leaky_relu_backward", &unary_backward_autograd<LeakyRelu, double>);
  m.impl("sigmoid", &unary_autograd<Sigmoid>);
  m.impl("sigmoid_backward", &unary_backward_autograd<Sigmoid>);
  m.impl("tanh", &unary_autograd<Tanh>);
  m.impl("tanh_backward", &unary_backward_autograd<Tanh>);
  m.impl("gelu", &unary_autograd<Gelu, c10::string_view>);
  m.impl("gelu_backward", &unary_backward_autograd<Gelu, c10::string_view>);
  m.impl("silu", &unary_autograd<Silu>);
  m.impl("silu_backward", &unary_backward_autograd<Silu>);
  m.impl("add", &add_autograd);
  m.impl("fork", &fork_autograd);
  m.impl("softmax", &unary_autograd<Softmax>);
  m.impl("softmax_backward", &unary_backward_autograd<Softmax>);
  m.impl("log_softmax", &unary_autograd<LogSoftmax>);
  m.impl("log_softmax_backward", &unary_backward_autograd<LogSoftmax>);
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("cross_entropy_backward", &cross_entropy_backward_autograd);
  m.impl("mse_loss", &mse_loss_autograd);
  m.impl("mse_loss_backward", &mse_loss_backward_autograd);
  m.impl("binary_cross_entropy_with_logits", &bce_autograd);
  m.impl("binary_cross_entropy_with_logits_backward", &bce_backward_autograd);
  m.impl("multi_margin_loss", &multi_margin_autograd);
  m.impl("multi_margin_loss_backward", &multi_margin_backward_autograd);
  m.impl("linear", &linear_autograd);
  m.impl("linear_backward", &linear_backward_autograd);
  m.impl("conv2d", &conv2d_autograd);
  m.impl("conv2d_stats", &conv2d_stats_autograd);
  m.impl("conv2d_backward", &conv2d_backward_autograd);
}

// fork below autograd, on every backend (meta and fake tensors included): the views alone.
TORCH_LIBRARY_IMPL(torchext, CompositeExplicitAutograd, m) { m.impl("fork", &fork_views); }

TORCH_LIBRARY_IMPL(torchext, AutocastCUDA, m) {
  m.impl("cross_entropy", &cross_entropy_autocast_cuda);
  m.impl("linear", &linear_autocast_cuda);
  m.impl("conv2d", &conv2d_autocast_cuda);
  m.impl("conv2d_stats", &conv2d_stats_autocast_cuda);
}

}  // namespace torchext
