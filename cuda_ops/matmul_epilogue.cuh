// The epilogue every matmul kernel applies to its accumulators (cuda_ops/matmul.cuh): z = acc + bias[j], then
// C = act(z), with z also stored to aux when asked. One definition, so every version of the ladder computes the
// same function, and the activation math is the one the standalone activation kernels use. (One difference: wgmma
// applies gelu, gelu_tanh and silu to z as stored, rounded to the output dtype, like PyTorch's Linear followed by
// the activation; see its epilogue in cuda_ops/matmul_wgmma.cu.)
#pragma once

#include "activation_math.h"
#include "common.cuh"
#include "matmul.cuh"

namespace torchext::cuda_ops {

template <typename A>
__device__ __forceinline__ A apply_activation(A z, Activation act) {
  switch (act) {
    case Activation::relu:
      return math::relu_forward(z);
    case Activation::gelu:
      return math::gelu_forward(z);
    case Activation::gelu_tanh:
      return math::gelu_tanh_forward(z);
    case Activation::silu:
      return math::silu_forward(z);
    default:
      return z;
  }
}

// d act / dz evaluated from what the forward saved (y for relu, z otherwise), times g.
template <typename A>
__device__ __forceinline__ A apply_activation_backward(A g, A saved, Activation act) {
  switch (act) {
    case Activation::relu:
      return math::relu_backward(g, saved);
    case Activation::gelu:
      return math::gelu_backward(g, saved);
    case Activation::gelu_tanh:
      return math::gelu_tanh_backward(g, saved);
    case Activation::silu:
      return math::silu_backward(g, saved);
    default:
      return g;
  }
}

// Writes element (i, j) of batch b's output from its accumulator. Bounds are the caller's job.
template <typename T, typename A>
__device__ __forceinline__ void store_epilogue(const MatmulArgs<T>& p, int64_t b, int64_t i, int64_t j, A acc) {
  A z = acc;
  if (p.bias != nullptr) z += static_cast<A>(p.bias[j]);
  const int64_t off = b * p.c_bs + i * p.c_rs + j;
  if (p.aux != nullptr) p.aux[off] = static_cast<T>(z);
  p.c[off] = static_cast<T>(apply_activation(z, p.act));
}

}  // namespace torchext::cuda_ops
