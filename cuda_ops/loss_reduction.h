// How a loss kernel reduces its per-element (or per-row) losses. Plain C++, shared by cuda_ops/ and csrc/.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define TORCHEXT_LOSS_HD __host__ __device__ __forceinline__
#else
#define TORCHEXT_LOSS_HD inline
#endif

namespace torchext::cuda_ops {

enum class LossReduction : int { None = 0, Mean = 1, Sum = 2 };

// A weighted 'mean': sum / total_weight, and NaN where the total weight is 0, whatever the sum. That is torch's
// cross_entropy: its NLL part is 0 / 0 there, so label smoothing's nonzero part (x / 0 = inf) does not show. The
// same rule scales backward (grad_output / total_weight), so such a loss's gradient is NaN too, as torch's.
template <typename A>
TORCHEXT_LOSS_HD A weighted_mean(A sum, A total_weight) {
  return total_weight == A(0) ? static_cast<A>(NAN) : sum / total_weight;
}

}  // namespace torchext::cuda_ops
