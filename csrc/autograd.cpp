// Autograd (and CUDA autocast) kernels for the ops a training step calls at every layer: the activations, softmax,
// cross_entropy and linear. They are C++ torch::autograd::Functions registered under the Autograd dispatch key,
// which costs far less host time than Python's torch.library.register_autograd (relu's forward plus backward on
// 4x4 CPU tensors: ~30 us here, ~55 us through Python, ~12 us for torch.relu). On a host-bound step, such as a
// small CNN at batch 128, that host time is the step time.
//
// Each Function's forward runs the op below autograd (the CPU or CUDA kernel, or the fake kernel under
// torch.compile) and saves what its backward op reads; backward calls the matching *_backward op through the
// dispatcher. matmul and the other losses keep their Python autograd (torchext/ops/matmul.py, losses.py).
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

namespace torchext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using OptionalTensor = std::optional<at::Tensor>;

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// ---------------------------------------------------------------------------------------------------------------
// One-input ops whose backward op is (grad_output, saved[, arg]) -> grad_input: relu, sigmoid, tanh, softmax and
// log_softmax save their output, silu, leaky_relu and gelu their input.

// The op's names and which tensor its backward reads.
#define TORCHEXT_UNARY_OP(NAME, OP, SAVES_OUTPUT)                           \
  struct NAME {                                                            \
    static constexpr const char* kForward = "torchext::" OP;               \
    static constexpr const char* kBackward = "torchext::" OP "_backward";  \
    static constexpr bool kSavesOutput = SAVES_OUTPUT;                     \
  };
TORCHEXT_UNARY_OP(Relu, "relu", true)
TORCHEXT_UNARY_OP(Sigmoid, "sigmoid", true)
TORCHEXT_UNARY_OP(Tanh, "tanh", true)
TORCHEXT_UNARY_OP(Silu, "silu", false)
TORCHEXT_UNARY_OP(Softmax, "softmax", true)
TORCHEXT_UNARY_OP(LogSoftmax, "log_softmax", true)
TORCHEXT_UNARY_OP(LeakyRelu, "leaky_relu", false)
TORCHEXT_UNARY_OP(Gelu, "gelu", false)
#undef TORCHEXT_UNARY_OP

template <typename Op>
class UnaryFunction : public torch::autograd::Function<UnaryFunction<Op>> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self) {
    static const auto op = find_op<Tensor(const Tensor&)>(Op::kForward);
    Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = op.call(self);
    }
    ctx->save_for_backward({Op::kSavesOutput ? out : self});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<Tensor(const Tensor&, const Tensor&)>(Op::kBackward);
    if (!grads[0].defined()) return {Tensor()};
    return {op.call(grads[0], ctx->get_saved_variables()[0])};
  }
};

template <typename Op>
Tensor unary_autograd(const Tensor& self) {
  return UnaryFunction<Op>::apply(self);
}

// The same for ops with one non-tensor argument after `self` (leaky_relu's negative_slope, gelu's approximate),
// kept for backward in ctx->saved_data as a `Stored` (an IValue can hold a double or a std::string).
template <typename Op, typename Arg, typename Stored>
class UnaryWithArgFunction : public torch::autograd::Function<UnaryWithArgFunction<Op, Arg, Stored>> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& self, Arg arg) {
    static const auto op = find_op<Tensor(const Tensor&, Arg)>(Op::kForward);
    Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = op.call(self, arg);
    }
    ctx->save_for_backward({Op::kSavesOutput ? out : self});
    ctx->saved_data["arg"] = Stored(arg);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<Tensor(const Tensor&, const Tensor&, Arg)>(Op::kBackward);
    if (!grads[0].defined()) return {Tensor(), Tensor()};
    const Stored arg = ctx->saved_data["arg"].to<Stored>();
    return {op.call(grads[0], ctx->get_saved_variables()[0], arg), Tensor()};
  }
};

Tensor leaky_relu_autograd(const Tensor& self, double negative_slope) {
  return UnaryWithArgFunction<LeakyRelu, double, double>::apply(self, negative_slope);
}

Tensor gelu_autograd(const Tensor& self, c10::string_view approximate) {
  return UnaryWithArgFunction<Gelu, c10::string_view, std::string>::apply(self, approximate);
}

// ---------------------------------------------------------------------------------------------------------------
// cross_entropy -> (loss, lse, total_weight); lse and total_weight are not differentiable. No gradient with
// respect to the class weights (an error at backward, as before).

using CrossEntropySignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                  c10::string_view, int64_t, double);

class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& self, const Tensor& target,
                               const OptionalTensor& weight, c10::string_view reduction, int64_t ignore_index,
                               double label_smoothing) {
    static const auto op = find_op<CrossEntropySignature>("torchext::cross_entropy");
    Tensor loss, lse, total_weight;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(loss, lse, total_weight) = op.call(self, target, weight, reduction, ignore_index, label_smoothing);
    }
    ctx->mark_non_differentiable({lse, total_weight});
    if (self.requires_grad()) {
      ctx->save_for_backward({self, target, weight.value_or(Tensor()), lse, total_weight});
    }
    ctx->saved_data["weight_requires_grad"] = weight.has_value() && weight->defined() && weight->requires_grad();
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    return {loss, lse, total_weight};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = find_op<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptionalTensor&,
                                          c10::string_view, int64_t, double, const Tensor&, const Tensor&)>(
        "torchext::cross_entropy_backward");
    TORCH_CHECK_NOT_IMPLEMENTED(!ctx->saved_data["weight_requires_grad"].toBool(),
                                "torchext.ops.cross_entropy: no gradient with respect to `weight`");
    variable_list result(6);
    const auto saved = ctx->get_saved_variables();
    if (saved.empty() || !grads[0].defined()) return result;
    const OptionalTensor weight = saved[2].defined() ? OptionalTensor(saved[2]) : std::nullopt;
    result[0] = op.call(grads[0], saved[0], saved[1], weight, ctx->saved_data["reduction"].toStringRef(),
                        ctx->saved_data["ignore_index"].toInt(), ctx->saved_data["label_smoothing"].toDouble(),
                        saved[3], saved[4]);
    return result;
  }
};

std::tuple<Tensor, Tensor, Tensor> cross_entropy_autograd(const Tensor& self, const Tensor& target,
                                                          const OptionalTensor& weight, c10::string_view reduction,
                                                          int64_t ignore_index, double label_smoothing) {
  const auto out = CrossEntropyFunction::apply(self, target, weight, reduction, ignore_index, label_smoothing);
  return {out[0], out[1], out[2]};
}

// ---------------------------------------------------------------------------------------------------------------
// linear -> (out, saved): out = act(input @ weight^T + bias); `saved` (the pre-activation for gelu, gelu_tanh and
// silu, else empty) is not differentiable. Backward keeps only what it reads: input for grad_weight, weight for
// grad_input, out for relu's derivative, saved for the others'. An operand whose values are not needed is saved as
// a one-element stand-in expanded to its shape, so that it is not kept alive.

using LinearSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                   c10::string_view);

Tensor placeholder(const Tensor& like) { return at::empty({}, like.options()).expand(like.sizes()); }

bool saves_preactivation(c10::string_view activation) {
  return activation == "gelu" || activation == "gelu_tanh" || activation == "silu";
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                               const OptionalTensor& bias, c10::string_view activation) {
    static const auto op = find_op<LinearSignature>("torchext::linear");
    Tensor out, saved;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::tie(out, saved) = op.call(input, weight, bias, activation);
    }
    ctx->mark_non_differentiable({saved});
    const bool relu = activation == "relu";
    ctx->save_for_backward({
        weight.requires_grad() ? input : placeholder(input),
        input.requires_grad() ? weight : placeholder(weight),
        relu ? out : Tensor(),
        saves_preactivation(activation) ? saved : Tensor(),
    });
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return {out, saved};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        find_op<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, c10::string_view, bool, std::array<bool, 3>)>(
            "torchext::linear_backward");
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    // needs_input_grad counts tensor arguments only: input 0, weight 1, bias 2 when there is one.
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      has_bias && ctx->needs_input_grad(2)};
    variable_list result(4);
    if (!grads[0].defined() || !(mask[0] || mask[1] || mask[2])) return result;
    const auto saved = ctx->get_saved_variables();
    const Tensor empty = at::empty({0}, grads[0].options());
    auto [grad_input, grad_weight, grad_bias] =
        op.call(grads[0], saved[0], saved[1], saved[2].defined() ? saved[2] : empty,
                saved[3].defined() ? saved[3] : empty, ctx->saved_data["activation"].toStringRef(), has_bias, mask);
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
// CUDA autocast: PyTorch's rules for the ops these replace. cross_entropy runs in float32 (its logits and class
// weights are cast up); linear in the autocast dtype (float16 or bfloat16). at::autocast::cached_cast casts only
// floating CUDA tensors other than float64, and caches the cast of a leaf weight for the autocast region, as
// torch's own linear does. The CPU autocast rules stay in Python (torchext/ops/_common.py).

std::tuple<Tensor, Tensor, Tensor> cross_entropy_autocast_cuda(const Tensor& self, const Tensor& target,
                                                               const OptionalTensor& weight,
                                                               c10::string_view reduction, int64_t ignore_index,
                                                               double label_smoothing) {
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

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) {
  m.impl("relu", &unary_autograd<Relu>);
  m.impl("sigmoid", &unary_autograd<Sigmoid>);
  m.impl("tanh", &unary_autograd<Tanh>);
  m.impl("silu", &unary_autograd<Silu>);
  m.impl("leaky_relu", &leaky_relu_autograd);
  m.impl("gelu", &gelu_autograd);
  m.impl("softmax", &unary_autograd<Softmax>);
  m.impl("log_softmax", &unary_autograd<LogSoftmax>);
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("linear", &linear_autograd);
}

TORCH_LIBRARY_IMPL(torchext, AutocastCUDA, m) {
  m.impl("cross_entropy", &cross_entropy_autocast_cuda);
  m.impl("linear", &linear_autocast_cuda);
}

}  // namespace torchext
