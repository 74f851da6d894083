// CPU kernels for the activations: one at::parallel_for over the flat data, float32 and float64.
// The math is cuda_ops/activation_math.h, shared with the CUDA kernels. Also add, the residual add where it is not
// fused, in all four floating dtypes (the CUDA side has them all, and a bfloat16 model's gradients meet in it).
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "activation_math.h"
#include "checks.h"

namespace torchext {
namespace {

template <typename F>
at::Tensor unary_cpu(const char* op, const at::Tensor& self, F f) {
  check_floating(op, self, "self");
  const at::Tensor x = dense(self);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_unary_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) yp[i] = f(xp[i]);
    });
  });
  return y;
}

// grad_x[i] = f(grad_y[i], saved[i]); `saved` is the forward input or output, as the derivative needs. grad_x takes
// saved's layout (checks.h, in_layout_of); a grad_y that is one element expanded is read as that element.
template <typename F>
at::Tensor binary_cpu(const char* op, const at::Tensor& grad_output, const at::Tensor& saved, const char* saved_name,
                      F f) {
  check_floating(op, saved, saved_name);
  check_like(op, saved, saved_name, grad_output, "grad_output");
  const at::Tensor s = dense(saved);
  const bool broadcast = is_broadcast_scalar(grad_output);
  const at::Tensor g = broadcast ? grad_output : in_layout_of(grad_output, s);
  at::Tensor gx = at::empty_like(s);
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "torchext_binary_cpu", [&] {
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* sp = s.const_data_ptr<scalar_t>();
    scalar_t* op_ = gx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, s.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      if (broadcast) {
        for (int64_t i = begin; i < end; ++i) op_[i] = f(gp[0], sp[i]);
      } else {
        for (int64_t i = begin; i < end; ++i) op_[i] = f(gp[i], sp[i]);
      }
    });
  });
  return gx;
}

at::Tensor relu_cpu(const at::Tensor& self) {
  return unary_cpu("torchext::relu", self, [](auto x) { return math::relu_forward(x); });
}
at::Tensor relu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cpu("torchext::relu_backward", grad_output, output, "output",
                    [](auto g, auto y) { return math::relu_backward(g, y); });
}

at::Tensor leaky_relu_cpu(const at::Tensor& self, double negative_slope) {
  return unary_cpu("torchext::leaky_relu", self, [=](auto x) {
    return math::leaky_relu_forward(x, static_cast<decltype(x)>(negative_slope));
  });
}
at::Tensor leaky_relu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self, double negative_slope) {
  return binary_cpu("torchext::leaky_relu_backward", grad_output, self, "self", [=](auto g, auto x) {
    return math::leaky_relu_backward(g, x, static_cast<decltype(x)>(negative_slope));
  });
}

at::Tensor sigmoid_cpu(const at::Tensor& self) {
  return unary_cpu("torchext::sigmoid", self, [](auto x) { return math::sigmoid_forward(x); });
}
at::Tensor sigmoid_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cpu("torchext::sigmoid_backward", grad_output, output, "output",
                    [](auto g, auto y) { return math::sigmoid_backward(g, y); });
}

at::Tensor tanh_cpu(const at::Tensor& self) {
  return unary_cpu("torchext::tanh", self, [](auto x) { return math::tanh_forward(x); });
}
at::Tensor tanh_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cpu("torchext::tanh_backward", grad_output, output, "output",
                    [](auto g, auto y) { return math::tanh_backward(g, y); });
}

at::Tensor gelu_cpu(const at::Tensor& self, c10::string_view approximate) {
  if (parse_gelu_approximate(approximate)) {
    return unary_cpu("torchext::gelu", self, [](auto x) { return math::gelu_tanh_forward(x); });
  }
  return unary_cpu("torchext::gelu", self, [](auto x) { return math::gelu_forward(x); });
}
at::Tensor gelu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self, c10::string_view approximate) {
  if (parse_gelu_approximate(approximate)) {
    return binary_cpu("torchext::gelu_backward", grad_output, self, "self",
                      [](auto g, auto x) { return math::gelu_tanh_backward(g, x); });
  }
  return binary_cpu("torchext::gelu_backward", grad_output, self, "self",
                    [](auto g, auto x) { return math::gelu_backward(g, x); });
}

at::Tensor silu_cpu(const at::Tensor& self) {
  return unary_cpu("torchext::silu", self, [](auto x) { return math::silu_forward(x); });
}
at::Tensor silu_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self) {
  return binary_cpu("torchext::silu_backward", grad_output, self, "self",
                    [](auto g, auto x) { return math::silu_backward(g, x); });
}

// self + other, the half types added in float32 and rounded once (as torch's add). The result takes self's layout
// (dense, then empty_like); other is read in that layout (in_layout_of: itself where its strides match, else a copy).
at::Tensor add_cpu(const at::Tensor& self, const at::Tensor& other) {
  check_floating_or_half("torchext::add", self, "self");
  check_like("torchext::add", self, "self", other, "other");
  const at::Tensor a = dense(self);
  const at::Tensor b = in_layout_of(other, a);
  at::Tensor out = at::empty_like(a);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "torchext_add_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* ap = a.const_data_ptr<scalar_t>();
    const scalar_t* bp = b.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, a.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        op_[i] = static_cast<scalar_t>(static_cast<acc_t>(ap[i]) + static_cast<acc_t>(bp[i]));
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("relu", &relu_cpu);
  m.impl("relu_backward", &relu_backward_cpu);
  m.impl("leaky_relu", &leaky_relu_cpu);
  m.impl("leaky_relu_backward", &leaky_relu_backward_cpu);
  m.impl("sigmoid", &sigmoid_cpu);
  m.impl("sigmoid_backward", &sigmoid_backward_cpu);
  m.impl("tanh", &tanh_cpu);
  m.impl("tanh_backward", &tanh_backward_cpu);
  m.impl("gelu", &gelu_cpu);
  m.impl("gelu_backward", &gelu_backward_cpu);
  m.impl("silu", &silu_cpu);
  m.impl("silu_backward", &silu_backward_cpu);
  m.impl("add", &add_cpu);
}

}  // namespace torchext
