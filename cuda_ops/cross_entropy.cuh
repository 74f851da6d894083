// Cross entropy over class indices: fused log-softmax + NLL with optional class weights, ignore_index and label
// smoothing, forward and backward. See cross_entropy.cu for the math and the kernels.
#pragma once

#include <cuda_runtime.h>

#include "loss_reduction.h"

#include <cstdint>

namespace torchext::cuda_ops {

// Arguments shared by forward and backward. logits is (rows, classes) row-major; target (rows,) int64; weight
// (classes,) or null; weight_sum points to sum(weight) (acc type) when weight is given and label_smoothing > 0.
template <typename T, typename A>
struct CrossEntropyArgs {
  using Acc = A;
  const T* logits;
  const int64_t* target;
  const T* weight;
  const A* weight_sum;
  int64_t rows;
  int64_t classes;
  int64_t ignore_index;
  A label_smoothing;
  LossReduction reduction;
};

// Number of acc-type elements of workspace cross_entropy_forward needs.
int64_t cross_entropy_workspace_size(int64_t rows, int64_t classes);

// Writes loss (rows elements for None, 1 otherwise), lse (rows, acc type), total_weight (1, acc type: the summed
// weight of non-ignored rows, the 'mean' divisor) and bad_targets (1 int: how many targets were neither in
// [0, classes) nor ignore_index; those rows' losses are NaN).
template <typename T, typename A>
cudaError_t cross_entropy_forward(const CrossEntropyArgs<T, A>& args, T* loss, A* lse, A* total_weight,
                                  int* bad_targets, A* workspace, cudaStream_t stream);

// grad_loss has rows elements for None, 1 otherwise. Writes grad_logits (rows, classes).
template <typename T, typename A>
cudaError_t cross_entropy_backward(const CrossEntropyArgs<T, A>& args, const T* grad_loss, const A* lse,
                                   const A* total_weight, T* grad_logits, cudaStream_t stream);

}  // namespace torchext::cuda_ops
