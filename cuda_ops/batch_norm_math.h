// Batch normalization's per-channel arithmetic, written once for the CPU kernels (csrc/batch_norm_cpu.cpp) and the
// CUDA finalize kernels (cuda_ops/batch_norm.cu), in float64 on the C-sized vectors.
//
// Statistics come as shifted sums over a channel's n elements: s = sum (x - k), ss = sum (x - k)^2 for a shift k
// near the mean (the CPU's first-pass mean, the GPU's first element of the channel; 0 for conv2d_stats' plain sums).
// Then mean = k + s / n and var_sum = sum (x - mean)^2 = ss - s^2 / n, which cancels only as much as k is far from
// the mean: with k = 0 (plain sums, E[x^2] - E[x]^2) the float32 sums' rounding error of about 2^-24 E[x^2] n
// becomes var's relative error 2^-24 E[x^2] / var = 2^-24 (1 + mean^2 / var), and var is clamped at 0.
//
// The running statistics are updated as ATen's CPU and CUDA kernels do, from var_sum, with momentum in float64:
//   running_mean = momentum mean + (1 - momentum) running_mean
//   running_var  = momentum var_sum / (n - 1) + (1 - momentum) running_var        (n = 1: 0 / 0, NaN, as ATen)
// On the device each product and sum is rounded on its own (no fused multiply-add), so the GPU's float64 results are
// the same bits as torch's CPU ones for the same statistics.
#pragma once

#include <cmath>
#include <cstdint>

#include "activation_math.h"  // TORCHEXT_HD

namespace torchext::math {

struct ChannelStats {
  double mean = 0, var_sum = 0;
};

TORCHEXT_HD ChannelStats stats_from_shifted_sums(double k, double s, double ss, int64_t n) {
  ChannelStats st;
  if (n <= 0) return st;
  const double mean_shift = s / static_cast<double>(n);
  st.mean = k + mean_shift;
  const double var_sum = ss - s * mean_shift;
  st.var_sum = var_sum > 0 ? var_sum : 0.0;
  return st;
}

// 1 / sqrt(var + eps), and 0 where both are 0 (ATen's InvStd).
TORCHEXT_HD double inv_std(double var, double eps) {
  return var != 0.0 || eps != 0.0 ? 1.0 / std::sqrt(var + eps) : 0.0;
}

// momentum * stat + (1 - momentum) * running, each operation rounded separately.
TORCHEXT_HD double running_update(double momentum, double stat, double running) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(momentum, stat), __dmul_rn(__dadd_rn(1.0, -momentum), running));
#else
  return momentum * stat + (1.0 - momentum) * running;
#endif
}

// The unbiased variance the running statistics track.
TORCHEXT_HD double unbiased_var(double var_sum, int64_t n) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(var_sum, static_cast<double>(n - 1));
#else
  return var_sum / static_cast<double>(n - 1);
#endif
}

// The relu mask's bit for a pre-activation value v: 1 unless v <= 0 (a NaN passes its gradient, as relu_backward).
template <typename A>
TORCHEXT_HD bool relu_bit(A v) {
  return !(v <= A(0));
}

}  // namespace torchext::math
