// Argument checks shared by the CPU and CUDA backends of mse_loss, binary_cross_entropy_with_logits and
// multi_margin_loss (defined in csrc/losses_cpu.cpp). Each raises an error that names the argument.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "checks.h"

namespace torchext::losses {

// self floating; target with self's device, dtype and shape.
void check_pointwise_args(const char* op, const at::Tensor& self, const at::Tensor& target);

// A weight-like operand that must broadcast to self, returned in the form the kernels read as
// value[i % *period]: one element (period 1), a last-dimension vector (period C) or the expanded full tensor
// (period numel). Undefined when absent.
at::Tensor broadcast_operand(const char* op, const at::Tensor& self, const std::optional<at::Tensor>& operand,
                             const char* name, int64_t* period);

// binary_cross_entropy_with_logits' operands, checked, in the kernels' broadcast form (see broadcast_operand).
struct BceOperands {
  at::Tensor weight, pos_weight;  // undefined when absent
  int64_t weight_period = 1, pos_weight_period = 1;
};
BceOperands check_bce_args(const char* op, const at::Tensor& self, const at::Tensor& target,
                           const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& pos_weight);

// grad_output of a loss: the loss's shape under 'none', 0-dim otherwise; returned contiguous.
at::Tensor check_grad_output(const char* op, const at::Tensor& grad_output, const at::Tensor& self,
                             at::IntArrayRef loss_shape, Reduction reduction);

// mse_loss's optional weight: self's shape, device and dtype; returned contiguous (undefined when absent).
at::Tensor check_mse_weight(const char* op, const at::Tensor& self, const std::optional<at::Tensor>& weight);

// multi_margin_loss: p in {1, 2}; self (N, C), (C,) or 0-dim; target int64 with one index per row; weight (C,).
void check_multi_margin_args(const char* op, const at::Tensor& self, const at::Tensor& target, int64_t p,
                             const std::optional<at::Tensor>& weight, int64_t* rows, int64_t* cols);
std::vector<int64_t> multi_margin_loss_shape(const at::Tensor& target, Reduction reduction);

// Raises the IndexError for a target outside [0, cols) at `row`.
// `note` is appended to the message (target_check_note for a deferred check).
[[noreturn]] void report_bad_target(const char* op, int64_t row, int64_t value, int64_t cols, const char* note = "");

}  // namespace torchext::losses
