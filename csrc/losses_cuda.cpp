// CUDA wrappers for the losses: the argument checks shared with the CPU backend, device guard, dtype dispatch, then
// a cuda_ops/losses.cu launcher on the current stream. Inputs are made contiguous; weight-like operands reach the
// kernels as a value, a last-dimension vector or a full tensor (cuda_ops::LossOperand). multi_margin_loss reports
// an out-of-range target after one small device-to-host copy and a stream sync, skipped while the stream is being
// captured into a CUDA graph (such a row's loss and gradient are then NaN).
#include <torch/library.h>

#include <optional>
#include <vector>

#include "checks.h"
#include "cuda_utils.h"
#include "target_checks.h"
#include "losses.cuh"
#include "losses.h"

namespace torchext {
namespace {

// The loss tensor: input-shaped under 'none', 0-dim otherwise.
at::Tensor loss_output(const at::Tensor& x, at::IntArrayRef none_shape, Reduction r) {
  return at::empty(r == Reduction::None ? none_shape : at::IntArrayRef{}, x.options());
}

at::Tensor workspace_for(const at::Tensor& x) {
  return at::empty({static_cast<int64_t>(cuda_ops::loss_workspace_bytes())}, x.options().dtype(at::kByte));
}

template <typename scalar_t>
const cuda_t<scalar_t>* optional_ptr(const at::Tensor& t) {
  return t.defined() ? cuda_ptr<scalar_t>(t) : nullptr;
}

template <typename scalar_t>
cuda_ops::LossOperand<cuda_t<scalar_t>> operand(const at::Tensor& t, int64_t period) {
  return {optional_ptr<scalar_t>(t), period};
}

at::Tensor mse_loss_cuda(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                         c10::string_view reduction) {
  const char* op = "torchext::mse_loss";
  const Reduction r = parse_reduction(op, reduction);
  losses::check_pointwise_args(op, self, target);
  const at::Tensor w = losses::check_mse_weight(op, self, weight);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor out = loss_output(x, x.sizes(), r);
  at::Tensor ws = r == Reduction::None ? at::Tensor() : workspace_for(x);
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_mse_loss_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::mse_loss_forward(cuda_ptr<scalar_t>(x), cuda_ptr<scalar_t>(y), optional_ptr<scalar_t>(w),
                                              cuda_mutable_ptr<scalar_t>(out), x.numel(), to_cuda_reduction(r),
                                              ws.defined() ? ws.mutable_data_ptr() : nullptr, current_stream()));
  });
  return out;
}

at::Tensor mse_loss_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::mse_loss_backward";
  const Reduction r = parse_reduction(op, reduction);
  losses::check_pointwise_args(op, self, target);
  const at::Tensor w = losses::check_mse_weight(op, self, weight);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor g = losses::check_grad_output(op, grad_output, self, self.sizes(), r);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor grad = at::empty(x.sizes(), x.options());
  at::Tensor ws = r == Reduction::Mean && w.defined() ? workspace_for(x) : at::Tensor();
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_mse_loss_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::mse_loss_backward(cuda_ptr<scalar_t>(g), cuda_ptr<scalar_t>(x), cuda_ptr<scalar_t>(y),
                                               optional_ptr<scalar_t>(w), cuda_mutable_ptr<scalar_t>(grad), x.numel(),
                                               to_cuda_reduction(r), ws.defined() ? ws.mutable_data_ptr() : nullptr,
                                               current_stream()));
  });
  return grad;
}

at::Tensor binary_cross_entropy_with_logits_cuda(const at::Tensor& self, const at::Tensor& target,
                                                 const std::optional<at::Tensor>& weight,
                                                 const std::optional<at::Tensor>& pos_weight,
                                                 c10::string_view reduction) {
  const char* op = "torchext::binary_cross_entropy_with_logits";
  const Reduction r = parse_reduction(op, reduction);
  const losses::BceOperands o = losses::check_bce_args(op, self, target, weight, pos_weight);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor out = loss_output(x, x.sizes(), r);
  at::Tensor ws = r == Reduction::None ? at::Tensor() : workspace_for(x);
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_binary_cross_entropy_with_logits_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::binary_cross_entropy_with_logits_forward(
        cuda_ptr<scalar_t>(x), cuda_ptr<scalar_t>(y), operand<scalar_t>(o.weight, o.weight_period), operand<scalar_t>(o.pos_weight, o.pos_weight_period),
        cuda_mutable_ptr<scalar_t>(out), x.numel(), to_cuda_reduction(r), ws.defined() ? ws.mutable_data_ptr() : nullptr,
        current_stream()));
  });
  return out;
}

at::Tensor binary_cross_entropy_with_logits_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self,
                                                          const at::Tensor& target,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& pos_weight,
                                                          c10::string_view reduction, bool wrt_target) {
  const char* op = "torchext::binary_cross_entropy_with_logits_backward";
  const Reduction r = parse_reduction(op, reduction);
  const losses::BceOperands o = losses::check_bce_args(op, self, target, weight, pos_weight);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor g = losses::check_grad_output(op, grad_output, self, self.sizes(), r);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor grad = at::empty(x.sizes(), x.options());
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_binary_cross_entropy_with_logits_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::binary_cross_entropy_with_logits_backward(
        cuda_ptr<scalar_t>(g), cuda_ptr<scalar_t>(x), cuda_ptr<scalar_t>(y), operand<scalar_t>(o.weight, o.weight_period),
        operand<scalar_t>(o.pos_weight, o.pos_weight_period), cuda_mutable_ptr<scalar_t>(grad), x.numel(), to_cuda_reduction(r), wrt_target,
        current_stream()));
  });
  return grad;
}

// *bad_row < rows means the kernel met a target outside [0, cols): report the first such row, now or at a later call
// (csrc/target_checks.h; the offending rows are NaN). A deferred report reads the value from `target` then.
void check_bad_row(const char* op, const at::Tensor& bad_row, const at::Tensor& target, int64_t rows, int64_t cols) {
  check_targets(bad_row, [op, target, rows, cols](int64_t row, bool deferred) {
    if (row < rows) {
      losses::report_bad_target(op, row, target.reshape({-1})[row].item<int64_t>(), cols, target_check_note(deferred));
    }
  });
}

at::Tensor multi_margin_loss_cuda(const at::Tensor& self, const at::Tensor& target, int64_t p, double margin,
                                  const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::multi_margin_loss";
  const Reduction r = parse_reduction(op, reduction);
  int64_t rows = 0, cols = 0;
  losses::check_multi_margin_args(op, self, target, p, weight, &rows, &cols);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  at::Tensor out = at::empty(losses::multi_margin_loss_shape(target, r), x.options());
  at::Tensor ws = r == Reduction::None ? at::Tensor() : workspace_for(x);
  at::Tensor bad_row = at::full({1}, rows, x.options().dtype(at::kLong));
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_multi_margin_loss_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::multi_margin_loss_forward(
        cuda_ptr<scalar_t>(x), t.const_data_ptr<int64_t>(), optional_ptr<scalar_t>(w), cuda_mutable_ptr<scalar_t>(out),
        rows, cols, static_cast<int>(p), margin, to_cuda_reduction(r), ws.defined() ? ws.mutable_data_ptr() : nullptr,
        bad_row.mutable_data_ptr<int64_t>(), current_stream()));
  });
  if (rows > 0) check_bad_row(op, bad_row, t, rows, cols);
  return out;
}

at::Tensor multi_margin_loss_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self,
                                           const at::Tensor& target, int64_t p, double margin,
                                           const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::multi_margin_loss_backward";
  const Reduction r = parse_reduction(op, reduction);
  int64_t rows = 0, cols = 0;
  losses::check_multi_margin_args(op, self, target, p, weight, &rows, &cols);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor g = losses::check_grad_output(op, grad_output, self, losses::multi_margin_loss_shape(target, r), r);
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  at::Tensor grad = at::empty(x.sizes(), x.options());
  at::Tensor bad_row = at::full({1}, rows, x.options().dtype(at::kLong));
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_multi_margin_loss_backward_cuda", [&] {
    C10_CUDA_CHECK(cuda_ops::multi_margin_loss_backward(
        cuda_ptr<scalar_t>(g), cuda_ptr<scalar_t>(x), t.const_data_ptr<int64_t>(), optional_ptr<scalar_t>(w),
        cuda_mutable_ptr<scalar_t>(grad), rows, cols, static_cast<int>(p), margin, to_cuda_reduction(r),
        bad_row.mutable_data_ptr<int64_t>(), current_stream()));
  });
  if (rows > 0) check_bad_row(op, bad_row, t, rows, cols);
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("mse_loss", &mse_loss_cuda);
  m.impl("mse_loss_backward", &mse_loss_backward_cuda);
  m.impl("binary_cross_entropy_with_logits", &binary_cross_entropy_with_logits_cuda);
  m.impl("binary_cross_entropy_with_logits_backward", &binary_cross_entropy_with_logits_backward_cuda);
  m.impl("multi_margin_loss", &multi_margin_loss_cuda);
  m.impl("multi_margin_loss_backward", &multi_margin_loss_backward_cuda);
}

}  // namespace torchext
