// CPU kernel of the optimizer steps (float32 and float64) and the argument checks both backends share (csrc/optim.h).
// sgd_ walks each tensor's memory as a flat array (param, grad and buffer share one layout), in parallel over
// elements: no reduction, so the result does not depend on the thread count.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "checks.h"
#include "optim.h"
#include "optim_math.h"

namespace torchext {
namespace optim {

std::vector<at::Tensor> check_sgd_args(const char* op, at::TensorList params, at::TensorList grads,
                                       at::TensorList momentum_buffers, double momentum,
                                       const std::optional<at::Tensor>& lr_tensor,
                                       std::optional<at::ScalarType> autocast_copies) {
  TORCH_CHECK_VALUE(!autocast_copies.has_value() || *autocast_copies == at::kHalf || *autocast_copies == at::kBFloat16,
                    op, ": `autocast_copies` must be torch.float16 or torch.bfloat16 (an autocast dtype), got ",
                    *autocast_copies);
  TORCH_CHECK_VALUE(grads.size() == params.size(), op, ": `grads` must hold one tensor per param (", params.size(),
                    "), got ", grads.size());
  if (momentum != 0) {
    TORCH_CHECK_VALUE(momentum_buffers.size() == params.size(), op,
                      ": `momentum_buffers` must hold one tensor per param (", params.size(),
                      ") when momentum != 0, got ", momentum_buffers.size());
  } else {
    TORCH_CHECK_VALUE(momentum_buffers.empty(), op, ": `momentum_buffers` must be empty when momentum == 0, got ",
                      momentum_buffers.size(), " tensors");
  }
  std::vector<at::Tensor> dense_grads;
  dense_grads.reserve(params.size());
  std::unordered_map<const void*, size_t> seen;  // a param listed twice would be updated twice (racing on CUDA)
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string p_name = "params[" + std::to_string(i) + "]", g_name = "grads[" + std::to_string(i) + "]";
    const at::Tensor& p = params[i];
    TORCH_CHECK_VALUE(p.defined(), op, ": `", p_name, "` is undefined");
    TORCH_CHECK_VALUE(grads[i].defined(), op, ": `", g_name, "` is undefined (a param without a gradient is left out ",
                      "of the lists)");
    check_floating(op, p, p_name);
    if (i > 0) {
      check_same_device(op, params[0], "params[0]", p, p_name);
      check_same_dtype(op, params[0], "params[0]", p, p_name);
    }
    check_like(op, p, p_name, grads[i], g_name);
    TORCH_CHECK_VALUE(p.is_non_overlapping_and_dense(), op, ": `", p_name,
                      "` must be dense (non-overlapping, no gaps): it is updated in place; got strides ", p.strides());
    if (p.numel() > 0) {
      const auto [it, fresh] = seen.emplace(p.const_data_ptr(), i);
      TORCH_CHECK_VALUE(fresh, op, ": `", p_name, "` is the same tensor as `params[", it->second,
                        "]`: each param may appear once");
    }
    if (momentum != 0) {
      const std::string b_name = "momentum_buffers[" + std::to_string(i) + "]";
      const at::Tensor& b = momentum_buffers[i];
      TORCH_CHECK_VALUE(b.defined(), op, ": `", b_name, "` is undefined");
      check_like(op, p, p_name, b, b_name);
      TORCH_CHECK_VALUE(b.is_non_overlapping_and_dense() && same_strides(b, p), op, ": `", b_name,
                        "` must be dense with the strides of `", p_name, "` ", p.strides(), ", got ", b.strides());
    }
    dense_grads.push_back(in_layout_of(grads[i], p));
  }
  if (lr_tensor.has_value() && lr_tensor->defined()) {
    const at::Tensor& lr = *lr_tensor;
    TORCH_CHECK_VALUE(lr.numel() == 1, op, ": `lr_tensor` must hold one element, got shape ", lr.sizes());
    TORCH_CHECK_TYPE(lr.scalar_type() == at::kFloat || lr.scalar_type() == at::kDouble, op,
                     ": `lr_tensor` must be float32 or float64, got ", lr.scalar_type());
    if (!params.empty()) check_same_device(op, params[0], "params[0]", lr, "lr_tensor");
  }
  return dense_grads;
}

}  // namespace optim

namespace {

void sgd_cpu(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum,
             double dampening, double weight_decay, bool nesterov, bool maximize, bool is_first_step,
             const std::optional<at::Tensor>& lr_tensor, std::optional<at::ScalarType> autocast_copies) {
  const char* op = "torchext::sgd_";
  const std::vector<at::Tensor> g =
      optim::check_sgd_args(op, params, grads, momentum_buffers, momentum, lr_tensor, autocast_copies);
  if (lr_tensor.has_value() && lr_tensor->defined()) lr = lr_tensor->item<double>();
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "torchext_sgd_cpu", [&] {
      using A = scalar_t;  // float32 updates in float, as torch's CPU SGD
      const math::SgdUpdate<scalar_t, A> up{A(lr),    A(momentum), A(dampening),  A(weight_decay),
                                            nesterov, maximize,    is_first_step, momentum != 0};
      scalar_t* pp = p.mutable_data_ptr<scalar_t>();
      const scalar_t* gp = g[i].const_data_ptr<scalar_t>();
      scalar_t* bp = momentum != 0 ? momentum_buffers[i].mutable_data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, p.numel(), 32768, [&](int64_t begin, int64_t end) {
        for (int64_t j = begin; j < end; ++j) {
          scalar_t b = bp != nullptr ? bp[j] : scalar_t(0);
          pp[j] = up(pp[j], gp[j], b);
          if (bp != nullptr) bp[j] = b;
        }
      });
    });
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) { m.impl("sgd_", &sgd_cpu); }

}  // namespace torchext
