// CUDA wrappers for torchext::max_pool2d, avg_pool2d, adaptive_avg_pool2d and their *_backward ops: csrc/pooling.h's
// checks and layout rule, a device guard, the dtype dispatch, and one launch of cuda_ops/pooling.cuh on the current
// stream, checked. The kernels read the inputs through their strides (no copy of any layout) and write the results
// allocated here (dense NCHW or NHWC); nothing is read back to the host (CUDA-graph capture safe).
#include <torch/library.h>

#include <optional>
#include <string_view>
#include <tuple>

#include "cuda_utils.h"
#include "pooling.cuh"
#include "pooling.h"

namespace torchext {
namespace {

using cuda_ops::Pool2dGeometry;

void check_cuda_input(std::string_view op, const at::Tensor& input) {
  TORCH_CHECK(input.is_cuda(), op, ": `input` must be a CUDA tensor here, got ", input.device());
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_cuda(const at::Tensor& input, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                   at::IntArrayRef dilation, bool ceil_mode) {
  constexpr const char* op = "torchext::max_pool2d";
  const Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, dilation, ceil_mode);
  check_cuda_input(op, input);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  at::Tensor idx = empty_pool_output(input, g, at::kLong);
  const at::Tensor x = as_4d(input);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_max_pool2d_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::max_pool2d_forward(g, cuda_ptr<scalar_t>(x), strides4(x), cuda_mutable_ptr<scalar_t>(y),
                                                idx.mutable_data_ptr<int64_t>(), strides4(y), current_stream()));
  });
  return {with_input_dims(y, input), with_input_dims(idx, input)};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                    bool ceil_mode, const at::Tensor& indices) {
  constexpr const char* op = "torchext::max_pool2d_backward";
  const Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, dilation, ceil_mode);
  check_cuda_input(op, input);
  check_pool_grad_output(op, grad_output, input, g);
  check_pool_grad_output(op, indices, input, g, "indices");
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor dx = empty_pool_grad_input(input);
  const at::Tensor dy = as_4d(grad_output), idx = as_4d(indices);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_max_pool2d_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::max_pool2d_backward(g, cuda_ptr<scalar_t>(dy), strides4(dy), idx.const_data_ptr<int64_t>(),
                                                 strides4(idx), cuda_mutable_ptr<scalar_t>(dx), strides4(dx),
                                                 current_stream()));
  });
  return with_input_dims(dx, input);
}

Pool2dGeometry avg_pool2d_geometry(std::string_view op, const at::Tensor& input, at::IntArrayRef kernel_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                                   bool count_include_pad, const std::optional<int64_t>& divisor_override) {
  Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, {1}, ceil_mode);
  g.count_include_pad = count_include_pad;
  g.divisor_override = check_divisor_override(op, divisor_override);
  check_cuda_input(op, input);
  return g;
}

at::Tensor avg_pool2d_cuda(const at::Tensor& input, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                           std::optional<int64_t> divisor_override) {
  constexpr const char* op = "torchext::avg_pool2d";
  const Pool2dGeometry g =
      avg_pool2d_geometry(op, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  const at::Tensor x = as_4d(input);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_avg_pool2d_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::avg_pool2d_forward(g, cuda_ptr<scalar_t>(x), strides4(x), cuda_mutable_ptr<scalar_t>(y),
                                                strides4(y), current_stream()));
  });
  return with_input_dims(y, input);
}

at::Tensor avg_pool2d_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel_size,
                                    at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                                    bool count_include_pad, std::optional<int64_t> divisor_override) {
  constexpr const char* op = "torchext::avg_pool2d_backward";
  const Pool2dGeometry g =
      avg_pool2d_geometry(op, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  check_pool_grad_output(op, grad_output, input, g);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor dx = empty_pool_grad_input(input);
  const at::Tensor dy = as_4d(grad_output);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_avg_pool2d_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::avg_pool2d_backward(g, cuda_ptr<scalar_t>(dy), strides4(dy),
                                                 cuda_mutable_ptr<scalar_t>(dx), strides4(dx), current_stream()));
  });
  return with_input_dims(dx, input);
}

at::Tensor adaptive_avg_pool2d_cuda(const at::Tensor& input, at::IntArrayRef output_size) {
  constexpr const char* op = "torchext::adaptive_avg_pool2d";
  const Pool2dGeometry g = check_adaptive_avg_pool2d_args(op, input, output_size);
  check_cuda_input(op, input);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  const at::Tensor x = as_4d(input);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_adaptive_avg_pool2d_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::adaptive_avg_pool2d_forward(g, cuda_ptr<scalar_t>(x), strides4(x),
                                                         cuda_mutable_ptr<scalar_t>(y), strides4(y), current_stream()));
  });
  return with_input_dims(y, input);
}

at::Tensor adaptive_avg_pool2d_backward_cuda(const at::Tensor& grad_output, const at::Tensor& input) {
  constexpr const char* op = "torchext::adaptive_avg_pool2d_backward";
  const Pool2dGeometry g = check_adaptive_avg_pool2d_backward_args(op, grad_output, input);
  check_cuda_input(op, input);
  c10::cuda::CUDAGuard guard(input.device());
  at::Tensor dx = empty_pool_grad_input(input);
  const at::Tensor dy = as_4d(grad_output);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_adaptive_avg_pool2d_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::adaptive_avg_pool2d_backward(
        g, cuda_ptr<scalar_t>(dy), strides4(dy), cuda_mutable_ptr<scalar_t>(dx), strides4(dx), current_stream()));
  });
  return with_input_dims(dx, input);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("max_pool2d", &max_pool2d_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
  m.impl("avg_pool2d", &avg_pool2d_cuda);
  m.impl("avg_pool2d_backward", &avg_pool2d_backward_cuda);
  m.impl("adaptive_avg_pool2d", &adaptive_avg_pool2d_cuda);
  m.impl("adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward_cuda);
}

}  // namespace torchext
