// Loss functions, forward and backward: mse_loss, binary_cross_entropy_with_logits, multi_margin_loss.
// T is float, double, __half or __nv_bfloat16. Every launcher runs on `stream` and returns the launch's error.
// Every pointer is a contiguous (row-major) array; the caller makes it so. `out` holds n elements (rows for
// multi_margin_loss) under LossReduction::None and one element under Mean and Sum; `grad_output` likewise.
// Reductions are deterministic: per-block partial sums in `workspace` (loss_workspace_bytes() bytes, no
// initialisation needed), then one block adds them up in a fixed order. No float atomics.
#pragma once

#include <cuda_runtime.h>

#include "loss_reduction.h"

#include <cstddef>
#include <cstdint>

namespace torchext::cuda_ops {

// Device workspace the reducing launchers need, whatever the problem size.
size_t loss_workspace_bytes();

// A weight-like operand broadcast over the flat index i: element i % period (1: one value for every element,
// C: a vector along the last dimension, n: a full tensor). data == nullptr means "absent" (every value 1).
template <typename T>
struct LossOperand {
  const T* data;
  int64_t period;
};

// mse_loss: w (x - y)^2. w may be nullptr. Mean divides by n, or by sum(w) when w is given.
template <typename T>
cudaError_t mse_loss_forward(const T* x, const T* y, const T* w, T* out, int64_t n, LossReduction reduction,
                             void* workspace, cudaStream_t stream);
// grad_x = 2 w (x - y) grad_output [/ n or / sum(w) for Mean]. Needs the workspace only for a weighted Mean.
template <typename T>
cudaError_t mse_loss_backward(const T* grad_output, const T* x, const T* y, const T* w, T* grad_x, int64_t n,
                              LossReduction reduction, void* workspace, cudaStream_t stream);

// binary_cross_entropy_with_logits: w ((1 - y) x + (1 + (pw - 1) y) softplus(-x)). Mean divides by n.
template <typename T>
cudaError_t binary_cross_entropy_with_logits_forward(const T* x, const T* y, LossOperand<T> weight,
                                                     LossOperand<T> pos_weight, T* out, int64_t n,
                                                     LossReduction reduction, void* workspace, cudaStream_t stream);
// Gradient with respect to x, or with respect to y when wrt_target.
template <typename T>
cudaError_t binary_cross_entropy_with_logits_backward(const T* grad_output, const T* x, const T* y,
                                                      LossOperand<T> weight, LossOperand<T> pos_weight, T* grad,
                                                      int64_t n, LossReduction reduction, bool wrt_target,
                                                      cudaStream_t stream);

// multi_margin_loss on x (rows, cols) with target (rows,) int64 and w (cols,) or nullptr; p is 1 or 2.
// A target outside [0, cols) makes its row's loss (or gradient) NaN and lowers *bad_row to that row index
// (atomicMin): the caller initialises *bad_row to `rows` and reads it back to report the error.
template <typename T>
cudaError_t multi_margin_loss_forward(const T* x, const int64_t* target, const T* w, T* out, int64_t rows, int64_t cols,
                                      int p, double margin, LossReduction reduction, void* workspace, int64_t* bad_row,
                                      cudaStream_t stream);
template <typename T>
cudaError_t multi_margin_loss_backward(const T* grad_output, const T* x, const int64_t* target, const T* w, T* grad_x,
                                       int64_t rows, int64_t cols, int p, double margin, LossReduction reduction,
                                       int64_t* bad_row, cudaStream_t stream);

}  // namespace torchext::cuda_ops
