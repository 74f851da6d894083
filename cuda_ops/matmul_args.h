// The matmul engine's arguments, without CUDA headers: the CUDA launchers (cuda_ops/matmul.cuh) and the CPU GEMM
// (csrc/matmul_cpu.cpp) take the same struct, and the op layer (csrc/matmul.h) parses activations into the same
// enum, so the two backends cannot drift apart.
//
//   A is (m, k), B is (k, n), C is (m, n), optionally batched; see cuda_ops/matmul.cuh for the epilogue.
#pragma once

#include <cstdint>

namespace torchext::cuda_ops {

enum class Activation : int { none = 0, relu, gelu, gelu_tanh, silu };

// The versions of the CUDA ladder (cuda_ops/matmul.cuh); the CPU side names them in messages too.
enum class MatmulKernel : int {
  naive = 0,         // v1: one thread per output element, operands straight from global memory
  smem_tiled,        // v2: square tiles of A and B staged through shared memory
  register_blocked,  // v3: each thread computes a small tile of C in registers
  vectorized,        // v4: 16-byte loads, transposed/padded shared memory, double buffering
  warp_tiled,        // v5: warp-level tiling with tuned block shapes
  mma_sync,          // tensor cores through mma.sync (sm_80+)
  wgmma,             // tensor cores through wgmma + TMA (sm_90a)
  count
};

// Names used by the op's `kernel=` argument and the benchmarks, in MatmulKernel's order.
inline constexpr const char* kMatmulKernelNames[] = {
    "naive", "smem_tiled", "register_blocked", "vectorized", "warp_tiled", "mma_sync", "wgmma"};
static_assert(sizeof(kMatmulKernelNames) / sizeof(kMatmulKernelNames[0]) == static_cast<int>(MatmulKernel::count));

inline const char* matmul_kernel_name(MatmulKernel kernel) {
  const int i = static_cast<int>(kernel);
  return i >= 0 && i < static_cast<int>(MatmulKernel::count) ? kMatmulKernelNames[i] : "unknown";
}

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
