// CUDA wrappers for torchext::batch_norm, batch_norm_relu, batch_norm_add_relu and batch_norm_backward: the checks and
// layout rule of csrc/batch_norm.h, device guard, the variant by name or the ladder's default
// (cuda_ops/batch_norm.cuh), one launcher call on the current stream, checked. Workspaces come from the caching
// allocator; the running buffers (and num_batches_tracked) are updated on the device by the finalize kernel: no host
// synchronization, no device value read (CUDA-graph capture safe).
//
// The kernels read the input (and residual, grad_out) as a dense tensor in the layout rule's memory format: one in
// another layout (sliced, expanded, transposed, or channels-last where the rule says contiguous) is copied into it
// first. A running buffer that is not contiguous is updated in a contiguous copy, then copied back.
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "batch_norm.cuh"
#include "batch_norm.h"
#include "checks.h"
#include "cuda_utils.h"

namespace torchext {
namespace {

using cuda_ops::BatchNormKernel;

// The version named by `variant`, or nullopt for the ladder's default.
std::optional<BatchNormKernel> parse_variant(std::string_view op, const std::optional<c10::string_view>& variant) {
  if (!variant.has_value()) return std::nullopt;
  const std::string_view name(variant->data(), variant->size());
  for (int i = 0; i < static_cast<int>(BatchNormKernel::count); ++i) {
    const auto k = static_cast<BatchNormKernel>(i);
    if (name == cuda_ops::batch_norm_kernel_name(k)) return k;
  }
  TORCH_CHECK_VALUE(name != "cpu", op,
                    ": `variant` 'cpu' runs on CPU tensors; CUDA tensors take variant=None or one of ",
                    cuda_batch_norm_kernel_list());
  TORCH_CHECK_VALUE(false, op, ": unknown `variant` '", name, "'; valid names on CUDA are ",
                    cuda_batch_norm_kernel_list(), " (or None for the fastest that supports the arguments)");
}

// Runs fn.template operator()<P>() with P the parameters' CUDA type: cuda_t<scalar_t>, or float for a float32
// parameter of a half / bfloat16 input.
template <typename scalar_t, typename F>
void dispatch_params(at::ScalarType pdt, F&& fn) {
  if constexpr (std::is_same_v<scalar_t, c10::Half> || std::is_same_v<scalar_t, c10::BFloat16>) {
    if (pdt == at::kFloat) return fn.template operator()<float>();
  }
  fn.template operator()<cuda_t<scalar_t>>();
}

template <typename P>
const P* param_ptr(const at::Tensor& t) {
  return t.defined() ? static_cast<const P*>(t.const_data_ptr()) : nullptr;
}
template <typename P>
P* param_mutable_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? static_cast<P*>(t->data_ptr()) : nullptr;
}

at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->contiguous() : at::Tensor();
}

// The kernel for `variant`, checked against the arguments, or the default.
template <typename Args, typename Supported, typename Default>
BatchNormKernel choose(std::string_view op, const std::optional<BatchNormKernel>& variant, const Args& args,
                       Supported supported, Default fallback, const at::Tensor& input) {
  if (!variant.has_value()) return fallback(args);
  const char* why = nullptr;
  TORCH_CHECK_VALUE(supported(*variant, args, &why), op, ": variant '", cuda_ops::batch_norm_kernel_name(*variant),
                    "' does not support these arguments: ", why != nullptr ? why : "not supported", " (",
                    input.scalar_type(), ", shape ", input.sizes(), ", strides ", input.strides(), ")");
  return *variant;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    std::string_view op, const at::Tensor& input, const at::Tensor* residual, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    const std::optional<c10::string_view>& variant_name, bool relu,
    const std::optional<at::Tensor>& num_batches_tracked) {
  const at::ScalarType pdt = check_batch_norm_args(op, input, residual, weight, bias, running_mean, running_var,
                                                   training, sum, sum_sq, num_batches_tracked);
  const std::optional<BatchNormKernel> variant = parse_variant(op, variant_name);
  c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat fmt = batch_norm_memory_format(input);
  const cuda_ops::BatchNormShape shape = batch_norm_shape(input, fmt);
  const at::Tensor x = in_format(input, fmt);
  const at::Tensor res = residual != nullptr ? in_format(*residual, fmt) : at::Tensor();
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(fmt));
  at::Tensor mask = at::empty({relu ? batch_norm_mask_bytes(input.numel()) : 0}, input.options().dtype(at::kByte));
  const auto st_opts = input.options().dtype(batch_norm_stats_dtype(input.scalar_type()));
  at::Tensor save_mean = at::empty({shape.c}, st_opts), save_invstd = at::empty({shape.c}, st_opts);
  const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
  const at::Tensor s = contiguous_or_undefined(sum), ss = contiguous_or_undefined(sum_sq);
  // Running buffers: written in training (contiguous stand-ins copied back after), read in eval.
  const at::Tensor rm = contiguous_or_undefined(running_mean), rv = contiguous_or_undefined(running_var);
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_batch_norm_cuda", [&] {
    using T = cuda_t<scalar_t>;
    using A = cuda_ops::acc_t<T>;
    dispatch_params<scalar_t>(pdt, [&]<typename P>() {
      cuda_ops::BatchNormForwardArgs<T, P> args;
      args.shape = shape;
      args.x = cuda_ptr<scalar_t>(x);
      args.residual = res.defined() ? cuda_ptr<scalar_t>(res) : nullptr;
      args.y = cuda_mutable_ptr<scalar_t>(out);
      args.mask = relu ? mask.mutable_data_ptr<uint8_t>() : nullptr;
      args.weight = param_ptr<P>(w);
      args.bias = param_ptr<P>(b);
      args.running_mean = rm.defined() ? static_cast<P*>(rm.data_ptr()) : nullptr;
      args.running_var = rv.defined() ? static_cast<P*>(rv.data_ptr()) : nullptr;
      args.sum = s.defined() ? static_cast<const A*>(s.const_data_ptr()) : nullptr;
      args.sum_sq = s.defined() ? static_cast<const A*>(ss.const_data_ptr()) : nullptr;
      args.save_mean = static_cast<A*>(save_mean.data_ptr());
      args.save_invstd = static_cast<A*>(save_invstd.data_ptr());
      args.training = training;
      args.num_batches_tracked = param_mutable_ptr<int64_t>(num_batches_tracked);
      args.momentum = momentum;
      args.eps = eps;
      const BatchNormKernel kernel = choose(op, variant, args, cuda_ops::batch_norm_forward_supported<T, P>,
                                            cuda_ops::batch_norm_forward_default_kernel<T, P>, input);
      const size_t bytes = cuda_ops::batch_norm_forward_workspace_bytes(kernel, args);
      at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, input.options().dtype(at::kByte));
      C10_CUDA_CHECK(cuda_ops::batch_norm_forward(kernel, args, current_stream(), workspace.mutable_data_ptr()));
    });
  });
  if (shape.c == 0 && num_batches_tracked.has_value() && num_batches_tracked->defined()) {
    num_batches_tracked->add_(1);  // no channel, no finalize kernel to count the batch
  }
  if (training) {
    if (rm.defined() && !rm.is_same(*running_mean)) running_mean->copy_(rm);
    if (rv.defined() && !rv.is_same(*running_var)) running_var->copy_(rv);
  }
  return {out, mask, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  auto [out, mask, save_mean, save_invstd] =
      forward("torchext::batch_norm", input, nullptr, weight, bias, running_mean, running_var, training, momentum, eps,
              sum, sum_sq, variant, false, num_batches_tracked);
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_relu_cuda(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  return forward("torchext::batch_norm_relu", input, nullptr, weight, bias, running_mean, running_var, training,
                 momentum, eps, sum, sum_sq, variant, true, num_batches_tracked);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_add_relu_cuda(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  return forward("torchext::batch_norm_add_relu", input, &residual, weight, bias, running_mean, running_var, training,
                 momentum, eps, sum, sum_sq, variant, true, num_batches_tracked);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& save_mean, const at::Tensor& save_invstd, const std::optional<at::Tensor>& mask, bool training,
    double eps, std::array<bool, 4> output_mask, std::optional<c10::string_view> variant_name) {
  constexpr const char* op = "torchext::batch_norm_backward";
  const at::ScalarType gdt =
      check_batch_norm_backward_args(op, grad_out, input, weight, save_mean, save_invstd, mask, output_mask);
  const std::optional<BatchNormKernel> variant = parse_variant(op, variant_name);
  (void)eps;  // the kernels read save_invstd; eps is the composed double backward's (csrc/batch_norm_autograd.cpp)
  c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat fmt = batch_norm_memory_format(input);
  const cuda_ops::BatchNormShape shape = batch_norm_shape(input, fmt);
  const at::TensorOptions opts = input.options();
  auto full = [&](bool wanted) {
    return wanted ? at::empty(input.sizes(), opts.memory_format(fmt)) : at::empty({0}, opts);
  };
  at::Tensor grad_input = full(output_mask[0]), grad_residual = full(output_mask[3]);
  at::Tensor grad_weight = at::empty({output_mask[1] ? shape.c : 0}, opts.dtype(gdt));
  at::Tensor grad_bias = at::empty({output_mask[2] ? shape.c : 0}, opts.dtype(gdt));
  if (!(output_mask[0] || output_mask[1] || output_mask[2] || output_mask[3])) {
    return {grad_input, grad_weight, grad_bias, grad_residual};
  }
  const at::Tensor x = in_format(input, fmt);
  const at::Tensor g = in_format(grad_out, fmt);
  const at::Tensor w = contiguous_or_undefined(weight), m = contiguous_or_undefined(mask);
  const at::Tensor sm = save_mean.contiguous(), si = save_invstd.contiguous();
  TORCHEXT_DISPATCH_CUDA_FLOATING(input.scalar_type(), "torchext_batch_norm_backward_cuda", [&] {
    using T = cuda_t<scalar_t>;
    using A = cuda_ops::acc_t<T>;
    dispatch_params<scalar_t>(gdt, [&]<typename P>() {
      cuda_ops::BatchNormBackwardArgs<T, P> args;
      args.shape = shape;
      args.grad_out = cuda_ptr<scalar_t>(g);
      args.x = cuda_ptr<scalar_t>(x);
      args.mask = m.defined() ? m.const_data_ptr<uint8_t>() : nullptr;
      args.weight = param_ptr<P>(w);
      args.save_mean = static_cast<const A*>(sm.const_data_ptr());
      args.save_invstd = static_cast<const A*>(si.const_data_ptr());
      args.training = training;
      args.grad_input = output_mask[0] ? cuda_mutable_ptr<scalar_t>(grad_input) : nullptr;
      args.grad_weight = output_mask[1] ? static_cast<P*>(grad_weight.data_ptr()) : nullptr;
      args.grad_bias = output_mask[2] ? static_cast<P*>(grad_bias.data_ptr()) : nullptr;
      args.grad_residual = output_mask[3] ? cuda_mutable_ptr<scalar_t>(grad_residual) : nullptr;
      const BatchNormKernel kernel = choose(op, variant, args, cuda_ops::batch_norm_backward_supported<T, P>,
                                            cuda_ops::batch_norm_backward_default_kernel<T, P>, input);
      const size_t bytes = cuda_ops::batch_norm_backward_workspace_bytes(kernel, args);
      at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, opts.dtype(at::kByte));
      C10_CUDA_CHECK(cuda_ops::batch_norm_backward(kernel, args, current_stream(), workspace.mutable_data_ptr()));
    });
  });
  return {grad_input, grad_weight, grad_bias, grad_residual};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("batch_norm", &batch_norm_cuda);
  m.impl("batch_norm_relu", &batch_norm_relu_cuda);
  m.impl("batch_norm_add_relu", &batch_norm_add_relu_cuda);
  m.impl("batch_norm_backward", &batch_norm_backward_cuda);
}

}  // namespace torchext
