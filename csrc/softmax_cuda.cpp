// CUDA wrappers for softmax and log_softmax over the last dimension: checks, device guard, dtype dispatch, then a
// cuda_ops/softmax.cu launcher on the current stream. The kernels read row-major (rows, cols) arrays, so inputs are
// made contiguous first and results are contiguous. A 0-dim tensor is one row of one element.
#include <torch/library.h>

#include "checks.h"
#include "cuda_utils.h"
#include "softmax.cuh"

namespace torchext {
namespace {

// (rows, cols) of a tensor reduced over its last dimension.
std::pair<int64_t, int64_t> rows_cols(const at::Tensor& t) {
  const int64_t cols = t.dim() == 0 ? 1 : t.size(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

at::Tensor forward_cuda(const char* op, const at::Tensor& self, bool log) {
  check_floating(op, self, "self");
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto [rows, cols] = rows_cols(x);
  if (rows == 0) return y;
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_softmax_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::softmax_forward(cuda_ptr<scalar_t>(x), cuda_mutable_ptr<scalar_t>(y), rows, cols, log,
                                             current_stream()));
  });
  return y;
}

at::Tensor backward_cuda(const char* op, const at::Tensor& grad_output, const at::Tensor& output, bool log) {
  check_floating(op, output, "output");
  check_like(op, output, "output", grad_output, "grad_output");
  c10::cuda::CUDAGuard guard(output.device());
  const at::Tensor y = output.contiguous();
  const at::Tensor g = grad_output.contiguous();
  at::Tensor gx = at::empty(y.sizes(), y.options());
  const auto [rows, cols] = rows_cols(y);
  if (rows == 0) return gx;
  TORCHEXT_DISPATCH_CUDA_FLOATING(y.scalar_type(), "torchext_softmax_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::softmax_backward(cuda_ptr<scalar_t>(g), cuda_ptr<scalar_t>(y),
                                              cuda_mutable_ptr<scalar_t>(gx), rows, cols, log, current_stream()));
  });
  return gx;
}

at::Tensor softmax_cuda(const at::Tensor& self) { return forward_cuda("torchext::softmax", self, false); }
at::Tensor softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output) {
  return backward_cuda("torchext::softmax_backward", grad_output, output, false);
}
at::Tensor log_softmax_cuda(const at::Tensor& self) { return forward_cuda("torchext::log_softmax", self, true); }
at::Tensor log_softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output) {
  return backward_cuda("torchext::log_softmax_backward", grad_output, output, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("softmax", &softmax_cuda);
  m.impl("softmax_backward", &softmax_backward_cuda);
  m.impl("log_softmax", &log_softmax_cuda);
  m.impl("log_softmax_backward", &log_softmax_backward_cuda);
}

}  // namespace torchext
