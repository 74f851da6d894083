// Autograd kernel of torchext::sgd_. The op is not differentiable; it updates params and momentum_buffers in place,
// so this kernel does what an ADInplaceOrView kernel would for an in-place ATen op: it refuses params that require
// grad while grad mode is on (torch's in-place ops refuse such leaves; optimizers step under torch.no_grad()), runs
// the op below autograd, and bumps the version counter of every tensor it wrote, so that a backward whose graph saved
// a parameter before the step raises ("modified by an inplace operation") instead of using the new values. With
// autocast_copies, the copies the kernel wrote then become fresh at those new versions (csrc/autocast_copies.h).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <optional>

#include "autocast_copies.h"
#include "autograd.h"

namespace torchext {
namespace {

using SgdSignature = void(at::TensorList, at::TensorList, at::TensorList, double, double, double, double, bool, bool,
                          bool, const std::optional<at::Tensor>&, std::optional<at::ScalarType>);

void sgd_autograd(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
                  double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
                  bool is_first_step, const std::optional<at::Tensor>& lr_tensor,
                  std::optional<at::ScalarType> autocast_copies) {
  if (at::GradMode::is_enabled()) {
    for (size_t i = 0; i < params.size(); ++i) {
      TORCH_CHECK(!requires_grad(params[i]), "torchext::sgd_: `params[", i,
                  "]` requires grad and grad mode is on: an optimizer step writes into it, so call it under "
                  "torch.no_grad() (as torch.optim's optimizers do)");
    }
  }
  static const auto op = find_op<SgdSignature>("torchext::sgd_");
  call_below_autograd(op, params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov, maximize,
                      is_first_step, lr_tensor, autocast_copies);
  for (const at::Tensor& p : params) torch::autograd::impl::bump_version(p);
  for (const at::Tensor& b : momentum_buffers) torch::autograd::impl::bump_version(b);
  if (autocast_copies.has_value()) autocast_copies::confirm_step(params);  // fresh at the versions just bumped
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) { m.impl("sgd_", &sgd_autograd); }

}  // namespace torchext
