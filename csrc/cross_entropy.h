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

}  // namespace torchext
