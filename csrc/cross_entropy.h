// Argument checks for torchext::cross_entropy shared by the CPU and CUDA backends.
#pragma once

#include <optional>

#include "checks.h"

namespace torchext {

// The accumulation dtype of the saved lse and total_weight: float64 for float64 logits, float32 otherwise.
inline at::ScalarType cross_entropy_acc_dtype(const at::Tensor& self) {
  return self.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_cross_entropy_args(const char* op, const at::Tensor& self, const at::Tensor& target,
                                     const std::optional<at::Tensor>& weight, double label_smoothing) {
  check_floating(op, self, "self");
  TORCH_CHECK_VALUE(self.dim() == 2, op, ": `self` must be 2-D logits (N, C), got shape ", self.sizes(),
                    " (torchext.ops.cross_entropy reshapes (C,) and (N, C, d1, ...) inputs)");
  TORCH_CHECK_VALUE(self.size(1) > 0 || self.size(0) == 0, op, ": `self` must have at least one class, got shape ",
                    self.sizes());
  check_same_device(op, self, "self", target, "target");
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, op, ": `target` must be int64 class indices, got ",
                   target.scalar_type(), " (probability targets are not supported)");
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == self.size(0), op, ": `target` must have shape (",
                    self.size(0), ",) to match `self` ", self.sizes(), ", got ", target.sizes());
  if (weight.has_value()) {
    check_same_device(op, self, "self", *weight, "weight");
    check_same_dtype(op, self, "self", *weight, "weight");
    TORCH_CHECK_VALUE(weight->dim() == 1 && weight->size(0) == self.size(1), op,
                      ": `weight` must be 1-D with one entry per class (", self.size(1), "), got shape ",
                      weight->sizes());
  }
  TORCH_CHECK_VALUE(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
                    ": `label_smoothing` must be in [0, 1], got ", label_smoothing);
}

// Backward: the forward's checks, grad_output (N elements under 'none', one otherwise, self's dtype and device) and
// the forward's saved lse and total_weight.
inline void check_cross_entropy_backward_args(const char* op, const at::Tensor& grad_output, const at::Tensor& self,
                                              const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                              double label_smoothing, Reduction red, const at::Tensor& lse,
                                              const at::Tensor& total_weight) {
  check_cross_entropy_args(op, self, target, weight, label_smoothing);
  const int64_t N = self.size(0), expected = red == Reduction::None ? N : 1;
  TORCH_CHECK_VALUE(grad_output.numel() == expected, op, ": `grad_output` must have ", expected,
                    " elements, got shape ", grad_output.sizes());
  check_same_device(op, self, "self", grad_output, "grad_output");
  check_same_dtype(op, self, "self", grad_output, "grad_output");
  const auto acc = cross_entropy_acc_dtype(self);
  TORCH_CHECK_VALUE(lse.numel() == N && lse.scalar_type() == acc && total_weight.numel() == 1 &&
                        total_weight.scalar_type() == acc,
                    op, ": `lse` and `total_weight` must be the forward's outputs");
  check_same_device(op, self, "self", lse, "lse");
  check_same_device(op, self, "self", total_weight, "total_weight");
}

}  // namespace torchext
