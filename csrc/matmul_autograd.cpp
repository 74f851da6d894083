// matmul's autograd and CUDA autocast rule, in C++ so that LibTorch programs get them too (they were Python's,
// torch.library.register_autograd in torchext/ops/matmul.py). linear's are in csrc/autograd.cpp.
//
// c = a @ b for a (*, M, K) and b (K, N) or (*, K, N), batch dimensions broadcast:
//   grad_a = grad @ b^T, summed over the batch dimensions a was broadcast along (sum_to_size(a's shape));
//   grad_b = a^T @ grad: for a 2-D b one (K, M*) @ (M*, N) product over every row of every batch entry, else
//            batched and summed over the dimensions b was broadcast along.
// The transposes are views (the engine reads operands through their strides). Both products call torchext::matmul
// through the dispatcher, whose Autograd kernel is this one: the backward is differentiable, so double backward
// (and higher) works. The forward saves a only for grad_b and b only for grad_a; the backward runs the default
// kernel whatever `variant` the forward named.
//
// CUDA autocast: matmul and matmul_kernel run in the autocast dtype (float16 or bfloat16), as torch's matmul;
// at::autocast::cached_cast casts only floating CUDA tensors other than float64. The CPU autocast rule (float32:
// the CPU kernels are float32 / float64) stays in Python (torchext/ops/_common.py), as for every op.
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "autograd.h"

namespace torchext {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using Variant = std::optional<c10::string_view>;
using MatmulSignature = Tensor(const Tensor&, const Tensor&, Variant);
using MatmulKernelSignature = std::string(const Tensor&, const Tensor&, Variant);

const c10::TypedOperatorHandle<MatmulSignature>& matmul_op() {
  static const auto op = find_op<MatmulSignature>("torchext::matmul");
  return op;
}

class MatmulFunction : public torch::autograd::Function<MatmulFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b, Variant variant) {
    Tensor out = call_below_autograd(matmul_op(), a, b, variant);
    ctx->save_for_backward({b.requires_grad() ? a : Tensor(), a.requires_grad() ? b : Tensor()});
    ctx->saved_data["a_shape"] = a.sym_sizes();
    ctx->saved_data["b_shape"] = b.sym_sizes();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(3);
    const Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const Tensor &a = saved[0], &b = saved[1];
    if (ctx->needs_input_grad(0)) {
      result[0] =
          matmul_op().call(grad, b.mT(), std::nullopt).sum_to_size_symint(ctx->saved_data["a_shape"].toSymIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      const std::vector<c10::SymInt> b_shape = ctx->saved_data["b_shape"].toSymIntVector();
      if (b_shape.size() == 2) {
        // flatten, not reshape(-1, k): k or n may be 0.
        result[1] = matmul_op().call(a.flatten(0, -2).mT(), grad.flatten(0, -2), std::nullopt);
      } else {
        result[1] = matmul_op().call(a.mT(), grad, std::nullopt).sum_to_size_symint(b_shape);
      }
    }
    return result;
  }
};

Tensor matmul_autograd(const Tensor& a, const Tensor& b, Variant variant) {
  return MatmulFunction::apply(a, b, variant);
}

Tensor matmul_autocast_cuda(const Tensor& a, const Tensor& b, Variant variant) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  constexpr auto cuda = c10::DeviceType::CUDA;
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(cuda);
  return matmul_op().call(at::autocast::cached_cast(dtype, a, cuda), at::autocast::cached_cast(dtype, b, cuda),
                          variant);
}

std::string matmul_kernel_autocast_cuda(const Tensor& a, const Tensor& b, Variant variant) {
  static const auto op = find_op<MatmulKernelSignature>("torchext::matmul_kernel");
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  constexpr auto cuda = c10::DeviceType::CUDA;
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(cuda);
  return op.call(at::autocast::cached_cast(dtype, a, cuda), at::autocast::cached_cast(dtype, b, cuda), variant);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) { m.impl("matmul", &matmul_autograd); }

TORCH_LIBRARY_IMPL(torchext, AutocastCUDA, m) {
  m.impl("matmul", &matmul_autocast_cuda);
  m.impl("matmul_kernel", &matmul_kernel_autocast_cuda);
}

}  // namespace torchext
