// CUDA wrappers for the activations and add: checks, device guard, dtype dispatch, then a cuda_ops/activations.cu
// launcher on the current stream. Dense layouts (contiguous, channels-last, any permutation) run in place of their
// memory order; anything else is made contiguous first. A backward returns its gradient in the layout of the saved
// tensor (checks.h, in_layout_of).
#include <torch/library.h>

#include "activations.cuh"
#include "checks.h"
#include "cuda_utils.h"

namespace torchext {
namespace {

// launch(const T* x, T* y, int64_t n, cudaStream_t) for T the CUDA element type.
template <typename Launch>
at::Tensor unary_cuda(const char* op, const at::Tensor& self, Launch launch) {
  check_floating(op, self, "self");
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = dense(self);
  at::Tensor y = at::empty_like(x);
  if (x.numel() == 0) return y;
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_unary_cuda", [&] {
    C10_CUDA_CHECK(launch(cuda_ptr<scalar_t>(x), cuda_mutable_ptr<scalar_t>(y), x.numel(), current_stream()));
  });
  return y;
}

// launch(const T* grad_y, const T* saved, T* grad_x, int64_t n, bool grad_y_broadcast, cudaStream_t). A
// grad_output that is one element expanded (checks.h, is_broadcast_scalar) is passed as that element.
template <typename Launch>
at::Tensor binary_cuda(const char* op, const at::Tensor& grad_output, const at::Tensor& saved, const char* saved_name,
                       Launch launch) {
  check_floating(op, saved, saved_name);
  check_like(op, saved, saved_name, grad_output, "grad_output");
  c10::cuda::CUDAGuard guard(saved.device());
  const at::Tensor s = dense(saved);
  const bool broadcast = is_broadcast_scalar(grad_output);
  const at::Tensor g = broadcast ? grad_output : in_layout_of(grad_output, s);
  at::Tensor gx = at::empty_like(s);
  if (s.numel() == 0) return gx;
  TORCHEXT_DISPATCH_CUDA_FLOATING(s.scalar_type(), "torchext_binary_cuda", [&] {
    C10_CUDA_CHECK(launch(cuda_ptr<scalar_t>(g), cuda_ptr<scalar_t>(s), cuda_mutable_ptr<scalar_t>(gx), s.numel(),
                          broadcast, current_stream()));
  });
  return gx;
}

at::Tensor relu_cuda(const at::Tensor& self) {
  return unary_cuda("torchext::relu", self,
                    [](auto* x, auto* y, int64_t n, cudaStream_t s) { return cuda_ops::relu_forward(x, y, n, s); });
}
at::Tensor relu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cuda("torchext::relu_backward", grad_output, output, "output",
                     [](auto* g, auto* y, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::relu_backward(g, y, gx, n, bc, s);
                     });
}

at::Tensor leaky_relu_cuda(const at::Tensor& self, double negative_slope) {
  return unary_cuda("torchext::leaky_relu", self, [=](auto* x, auto* y, int64_t n, cudaStream_t s) {
    return cuda_ops::leaky_relu_forward(x, y, n, negative_slope, s);
  });
}
at::Tensor leaky_relu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, double negative_slope) {
  return binary_cuda("torchext::leaky_relu_backward", grad_output, self, "self",
                     [=](auto* g, auto* x, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::leaky_relu_backward(g, x, gx, n, negative_slope, bc, s);
                     });
}

at::Tensor sigmoid_cuda(const at::Tensor& self) {
  return unary_cuda("torchext::sigmoid", self,
                    [](auto* x, auto* y, int64_t n, cudaStream_t s) { return cuda_ops::sigmoid_forward(x, y, n, s); });
}
at::Tensor sigmoid_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cuda("torchext::sigmoid_backward", grad_output, output, "output",
                     [](auto* g, auto* y, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::sigmoid_backward(g, y, gx, n, bc, s);
                     });
}

at::Tensor tanh_cuda(const at::Tensor& self) {
  return unary_cuda("torchext::tanh", self,
                    [](auto* x, auto* y, int64_t n, cudaStream_t s) { return cuda_ops::tanh_forward(x, y, n, s); });
}
at::Tensor tanh_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output) {
  return binary_cuda("torchext::tanh_backward", grad_output, output, "output",
                     [](auto* g, auto* y, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::tanh_backward(g, y, gx, n, bc, s);
                     });
}

at::Tensor gelu_cuda(const at::Tensor& self, c10::string_view approximate) {
  const bool tanh_approx = parse_gelu_approximate(approximate);
  return unary_cuda("torchext::gelu", self, [=](auto* x, auto* y, int64_t n, cudaStream_t s) {
    return cuda_ops::gelu_forward(x, y, n, tanh_approx, s);
  });
}
at::Tensor gelu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, c10::string_view approximate) {
  const bool tanh_approx = parse_gelu_approximate(approximate);
  return binary_cuda("torchext::gelu_backward", grad_output, self, "self",
                     [=](auto* g, auto* x, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::gelu_backward(g, x, gx, n, tanh_approx, bc, s);
                     });
}

at::Tensor silu_cuda(const at::Tensor& self) {
  return unary_cuda("torchext::silu", self,
                    [](auto* x, auto* y, int64_t n, cudaStream_t s) { return cuda_ops::silu_forward(x, y, n, s); });
}
at::Tensor silu_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self) {
  return binary_cuda("torchext::silu_backward", grad_output, self, "self",
                     [](auto* g, auto* x, auto* gx, int64_t n, bool bc, cudaStream_t s) {
                       return cuda_ops::silu_backward(g, x, gx, n, bc, s);
                     });
}

// self + other (cuda_ops::add_forward); the layouts as add_cpu's: the result takes self's, other is read in it.
at::Tensor add_cuda(const at::Tensor& self, const at::Tensor& other) {
  check_floating_or_half("torchext::add", self, "self");
  check_like("torchext::add", self, "self", other, "other");
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor a = dense(self);
  const at::Tensor b = in_layout_of(other, a);
  at::Tensor out = at::empty_like(a);
  if (a.numel() == 0) return out;
  TORCHEXT_DISPATCH_CUDA_FLOATING(a.scalar_type(), "torchext_add_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::add_forward(cuda_ptr<scalar_t>(a), cuda_ptr<scalar_t>(b), cuda_mutable_ptr<scalar_t>(out),
                                         a.numel(), current_stream()));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("relu", &relu_cuda);
  m.impl("relu_backward", &relu_backward_cuda);
  m.impl("leaky_relu", &leaky_relu_cuda);
  m.impl("leaky_relu_backward", &leaky_relu_backward_cuda);
  m.impl("sigmoid", &sigmoid_cuda);
  m.impl("sigmoid_backward", &sigmoid_backward_cuda);
  m.impl("tanh", &tanh_cuda);
  m.impl("tanh_backward", &tanh_backward_cuda);
  m.impl("gelu", &gelu_cuda);
  m.impl("gelu_backward", &gelu_backward_cuda);
  m.impl("silu", &silu_cuda);
  m.impl("silu_backward", &silu_backward_cuda);
  m.impl("add", &add_cuda);
}

}  // namespace torchext
