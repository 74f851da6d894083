// The matmul engine's arguments, without CUDA headers: the CUDA launchers (cuda_ops/matmul.cuh) and the CPU GEMM
// (csrc/matmul_cpu.cpp) take the same struct, and the op layer (csrc/matmul.h) parses activations into the same
// enum, so the two backends cannot drift apart.
//
//   A is (m, k), B is (k, n), C is (m, n), optionally batched; see cuda_ops/matmul.cuh for the epilogue.
#pragma once

#include <cstdint>

namespace torchext::cuda_ops {

enum class Activation : int { none = 0, relu, gelu, gelu_tanh, silu };

template <typename T>
struct MatmulArgs {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  // Element (i, p) of A in batch b is a[b * a_bs + i * a_rs + p * a_cs]; likewise B (k x n). A batch stride of
  // 0 broadcasts that operand over the batch.
  const T* a = nullptr;
  int64_t a_rs = 0, a_cs = 0, a_bs = 0;
  const T* b = nullptr;
  int64_t b_rs = 0, b_cs = 0, b_bs = 0;
  // Element (i, j) of C in batch b is c[b * c_bs + i * c_rs + j].
  T* c = nullptr;
  int64_t c_rs = 0, c_bs = 0;
  const T* bias = nullptr;  // n values added to every row, or nullptr
  Activation act = Activation::none;
  T* aux = nullptr;         // when set, z (before the activation) is stored here with C's strides
  bool allow_tf32 = false;  // float only: tensor-core kernels may round A and B to tf32 (unused on the CPU)
};

}  // namespace torchext::cuda_ops
