// CUDA wrapper for torchext::cross_entropy: checks, then cuda_ops/cross_entropy.cu on the current stream.
//
// Out-of-range targets: the forward kernel counts them on the device, and csrc/target_checks.h turns a nonzero
// count into an IndexError naming `target` (by default at a later call, without stopping the GPU), where PyTorch
// would stop the process with a device-side assert. Invalid rows give a NaN loss.
#include <torch/library.h>

#include "cross_entropy.cuh"
#include "cross_entropy.h"
#include "cuda_utils.h"
#include "target_checks.h"

namespace torchext {
namespace {

constexpr const char* kOp = "torchext::cross_entropy";

// Fills the kernel arguments; `weight_sum` holds sum(weight) when the kernels need it (weight and smoothing).
template <typename scalar_t>
auto make_args(const at::Tensor& x, const at::Tensor& t, const at::Tensor& w, const at::Tensor& weight_sum,
               Reduction red, int64_t ignore_index, double label_smoothing) {
  using T = cuda_t<scalar_t>;
  using A = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  cuda_ops::CrossEntropyArgs<T, A> args;
  args.logits = cuda_ptr<scalar_t>(x);
  args.target = t.const_data_ptr<int64_t>();
  args.weight = w.defined() ? cuda_ptr<scalar_t>(w) : nullptr;
  args.weight_sum = weight_sum.defined() ? weight_sum.const_data_ptr<A>() : nullptr;
  args.rows = x.size(0);
  args.classes = x.size(1);
  args.ignore_index = ignore_index;
  args.label_smoothing = static_cast<A>(label_smoothing);
  args.reduction = to_cuda_reduction(red);
  return args;
}

at::Tensor weight_sum_if_needed(const at::Tensor& w, double label_smoothing, at::ScalarType acc) {
  return (w.defined() && label_smoothing > 0) ? w.sum(acc) : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_cuda(const at::Tensor& self, const at::Tensor& target,
                                                                  const std::optional<at::Tensor>& weight,
                                                                  c10::string_view reduction, int64_t ignore_index,
                                                                  double label_smoothing) {
  check_cross_entropy_args(kOp, self, target, weight, label_smoothing);
  const Reduction red = parse_reduction(kOp, reduction);
  c10::cuda::CUDAGuard guard(self.device());
  const int64_t N = self.size(0), C = self.size(1);
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const auto acc = cross_entropy_acc_dtype(self);
  const auto acc_opts = self.options().dtype(acc);

  at::Tensor loss = red == Reduction::None ? at::empty({N}, self.options()) : at::empty({}, self.options());
  at::Tensor lse = at::empty({N}, acc_opts);
  at::Tensor total_weight = at::empty({}, acc_opts);
  at::Tensor bad_targets = at::empty({}, self.options().dtype(at::kInt));
  at::Tensor workspace = at::empty({cuda_ops::cross_entropy_workspace_size(N, C)}, acc_opts);
  const at::Tensor weight_sum = weight_sum_if_needed(w, label_smoothing, acc);
  const cudaStream_t stream = current_stream();
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_cross_entropy_cuda", [&] {
    auto args = make_args<scalar_t>(x, t, w, weight_sum, red, ignore_index, label_smoothing);
    using A = typename decltype(args)::Acc;
    C10_CUDA_CHECK(cuda_ops::cross_entropy_forward(args, cuda_mutable_ptr<scalar_t>(loss), lse.mutable_data_ptr<A>(),
                                                   total_weight.mutable_data_ptr<A>(),
                                                   bad_targets.mutable_data_ptr<int>(), workspace.mutable_data_ptr<A>(),
                                                   stream));
  });
  if (N > 0) {
    check_targets(bad_targets, [=](int64_t bad, bool deferred) {
      TORCH_CHECK_INDEX(bad == 0, kOp, ": `target` values must be in [0, ", C, ") or equal ignore_index (",
                        ignore_index, "); ", bad, " of ", N, " targets are not", target_check_note(deferred));
    });
  }
  return {loss, lse, total_weight};
}

at::Tensor cross_entropy_backward_cuda(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                       const std::optional<at::Tensor>& weight, c10::string_view reduction,
                                       int64_t ignore_index, double label_smoothing, const at::Tensor& lse,
                                       const at::Tensor& total_weight) {
  constexpr const char* op = "torchext::cross_entropy_backward";
  const Reduction red = parse_reduction(op, reduction);
  check_cross_entropy_backward_args(op, grad_output, self, target, weight, label_smoothing, red, lse, total_weight);
  const int64_t N = self.size(0), C = self.size(1);
  const auto acc = cross_entropy_acc_dtype(self);
  c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor x = self.contiguous(), t = target.contiguous(), g = grad_output.contiguous();
  const at::Tensor l = lse.contiguous();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor weight_sum = weight_sum_if_needed(w, label_smoothing, acc);
  at::Tensor grad = at::empty({N, C}, self.options());
  TORCHEXT_DISPATCH_CUDA_FLOATING(x.scalar_type(), "torchext_cross_entropy_backward_cuda", [&] {
    auto args = make_args<scalar_t>(x, t, w, weight_sum, red, ignore_index, label_smoothing);
    using A = typename decltype(args)::Acc;
    C10_CUDA_CHECK(cuda_ops::cross_entropy_backward(args, cuda_ptr<scalar_t>(g), l.const_data_ptr<A>(),
                                                    total_weight.const_data_ptr<A>(),
                                                    cuda_mutable_ptr<scalar_t>(grad), current_stream()));
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("cross_entropy", &cross_entropy_cuda);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cuda);
}

}  // namespace torchext
