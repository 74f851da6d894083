// Batch normalization's engine arguments, without CUDA headers: the CUDA launchers (cuda_ops/batch_norm.cuh) take
// these structs, and the op layer (csrc/batch_norm.h, csrc/batch_norm_*.cpp) names the kernels with the same list.
//
//   x is the input viewed as (A, C, B): element (a, c, b) at offset (a C + c) B + b of a dense buffer. A channels-last
//   tensor (N, C, H, W) is rows x C (A = N H W, B = 1), a contiguous one is planes (A = N, B = H W); (N, C) is A = N,
//   B = 1. Each channel c reduces over its n = A B elements.
//
//   forward   y = act((x - mean) scale + shift [+ residual]),  scale = weight invstd, shift = bias
//             training: mean, var the biased batch statistics (or from given sums), invstd = 1 / sqrt(var + eps),
//             running_mean = (1 - m) running_mean + m mean, running_var = (1 - m) running_var + m var n / (n - 1);
//             eval: mean, var = running_mean, running_var.
//             relu: mask bit j of byte u is 1 where element 8 u + j (memory order) is positive.
//   backward  dz = dy [& mask]; grad_bias = sum dz; grad_weight = invstd sum dz (x - mean);
//             training: dx = weight invstd (dz - mean(dz) - (x - mean) invstd^2 mean(dz (x - mean)))
//             eval:     dx = weight invstd dz;           grad_residual = dz.
#pragma once

#include <cstdint>

namespace torchext::cuda_ops {

// The versions of the ladder (cuda_ops/batch_norm.cuh), in order; the op's `variant=` takes these names.
enum class BatchNormKernel : int {
  simple = 0,  // a block per (channel, chunk) for the reductions and one thread per 8 elements for the elementwise
               // passes, scalar loads: any (A, C, B), any alignment
  vectorized,  // 16-byte loads and stores: rows x C tiles (C % 8 == 0) or planes (B % 8 == 0), per-thread channel
               // parameters in registers, elementwise passes in reverse order (the last data read is still in L2)
  fused,       // vectorized's arguments; on rows x C, the finalize folded into the reductions (the last block adds
               // the partials in a fixed order) and each direction as one launch when its grid fits on the GPU
  count
};

inline constexpr const char* kBatchNormKernelNames[] = {"simple", "vectorized", "fused"};
static_assert(sizeof(kBatchNormKernelNames) / sizeof(kBatchNormKernelNames[0]) ==
              static_cast<int>(BatchNormKernel::count));

inline const char* batch_norm_kernel_name(BatchNormKernel kernel) {
  const int i = static_cast<int>(kernel);
  return i >= 0 && i < static_cast<int>(BatchNormKernel::count) ? kBatchNormKernelNames[i] : "unknown";
}

struct BatchNormShape {
  int64_t a = 0, c = 0, b = 1;
};

// T is the element type, P the parameters' (weight, bias, running buffers; T itself or A), A the statistics' (float
// for float, half and bfloat16; double for double). Pointers may be nullptr where the comment says so.
template <typename T, typename P, typename A>
struct BatchNormForwardArgsT {
  BatchNormShape shape;
  const T* x = nullptr;
  const T* residual = nullptr;  // added before the activation, or nullptr
  T* y = nullptr;
  uint8_t* mask = nullptr;  // relu when not nullptr: (numel + 7) / 8 bytes
  const P* weight = nullptr;
  const P* bias = nullptr;
  P* running_mean = nullptr;  // read in eval; updated in training when not nullptr
  P* running_var = nullptr;
  const A* sum = nullptr;  // training: the per-channel sum and sum of squares of x, replacing the statistics pass
  const A* sum_sq = nullptr;
  A* save_mean = nullptr;  // C values each: the mean and 1 / sqrt(var + eps) used
  A* save_invstd = nullptr;
  int64_t* num_batches_tracked = nullptr;  // training: 1 added (by channel 0's finalize), or nullptr
  bool training = true;
  double momentum = 0.1, eps = 1e-5;
};

template <typename T, typename P, typename A>
struct BatchNormBackwardArgsT {
  BatchNormShape shape;
  const T* grad_out = nullptr;
  const T* x = nullptr;
  const uint8_t* mask = nullptr;  // the forward's relu mask, or nullptr
  const P* weight = nullptr;      // nullptr: 1
  const A* save_mean = nullptr;
  const A* save_invstd = nullptr;
  bool training = true;
  T* grad_input = nullptr;  // each output nullptr when not wanted
  P* grad_weight = nullptr;
  P* grad_bias = nullptr;
  T* grad_residual = nullptr;  // dz
};

}  // namespace torchext::cuda_ops
