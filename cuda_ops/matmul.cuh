// The GEMM engine: C = act(A B + bias), on raw pointers and a stream, no ATen.
//
//   A is (m, k), B is (k, n), C is (m, n), optionally batched: `batch` independent products, operand X of batch
//   b starting at x + b * x_bs. A and B are read through two strides each (row stride, column stride), so a
//   transposed or column-major operand is read in place and backward never materializes a transpose. C and the
//   optional pre-activation output `aux` have column stride 1.
//
//   Epilogue, fused into every kernel, computed in the accumulation type:
//       z = A B (+ bias[j], broadcast over rows)     stored to aux when aux != nullptr
//       C = act(z)                                   act in {none, relu, gelu, gelu_tanh, silu}
//
// The ladder: one launcher (matmul) picks any of these versions; each file's opening comment says what its
// versions add.
//   cuda_ops/matmul_simt.cu    CUDA cores, every dtype:  v1 naive, v2 smem_tiled, v3 register_blocked,
//                              v4 vectorized, v5 warp_tiled
//   cuda_ops/matmul_mma.cu     tensor cores, mma.sync (sm_80+): bf16 / fp16, and tf32 for float inputs
//   cuda_ops/matmul_wgmma.cu   tensor cores, Hopper wgmma + TMA (sm_90a): bf16 / fp16, and tf32 for float inputs
//
// T is float, double, __half or __nv_bfloat16. Accumulation is in float (double for double).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "matmul_args.h"

namespace torchext::cuda_ops {

// Whether `kernel` can run `args` on the current device: dtype, architecture, tf32 permission, and the
// alignment and stride rules of its loads. `why`, when given, receives a short reason on false.
template <typename T>
bool matmul_supported(MatmulKernel kernel, const MatmulArgs<T>& args, const char** why = nullptr);

// Device memory that matmul(kernel, args, ...) can use, in bytes (0: none). The CUDA-core versions v2-v5 use it
// for split-K (matmul_simt.cu): where their grid would have fewer tiles than the GPU has multiprocessors, k is cut
// into chunks whose partial sums (in the accumulation type) are added up by a second kernel. wgmma uses it for
// stream-K (matmul_wgmma.cu): products of few tiles and a long k have their tiles cut along k over all
// multiprocessors.
template <typename T>
size_t matmul_workspace_bytes(MatmulKernel kernel, const MatmulArgs<T>& args);

// Runs one version on `stream`. Returns cudaErrorNotSupported when matmul_supported is false, else the launch's
// error. m, n or k of 0 is valid (k == 0 gives C = act(bias or 0)). `workspace` holds
// matmul_workspace_bytes(kernel, args) bytes, or is nullptr (then nothing is split; the result is the same).
template <typename T>
cudaError_t matmul(MatmulKernel kernel, const MatmulArgs<T>& args, cudaStream_t stream, void* workspace = nullptr);

// The fastest version that supports `args` on the current device.
template <typename T>
MatmulKernel matmul_default_kernel(const MatmulArgs<T>& args);

// Per-family launchers behind matmul(). Each returns cudaErrorNotSupported for a version or argument set it
// does not handle.
template <typename T>
cudaError_t matmul_simt(MatmulKernel kernel, const MatmulArgs<T>& args, cudaStream_t stream, void* workspace = nullptr);
template <typename T>
bool matmul_simt_supported(MatmulKernel kernel, const MatmulArgs<T>& args, const char** why);
template <typename T>
size_t matmul_simt_workspace_bytes(MatmulKernel kernel, const MatmulArgs<T>& args);
// The blocks a CUDA-core version's launch runs given a workspace: output tiles times k splits.
template <typename T>
int64_t matmul_simt_blocks(MatmulKernel kernel, const MatmulArgs<T>& args);
template <typename T>
cudaError_t matmul_mma_sync(const MatmulArgs<T>& args, cudaStream_t stream);
template <typename T>
bool matmul_mma_sync_supported(const MatmulArgs<T>& args, const char** why);
// wgmma's workspace is for stream-K (matmul_wgmma.cu, plan_schedule): where the tiles fill at most half the GPU and
// k is long, their k-steps are spread over every multiprocessor, and the blocks hand partial sums to each other
// through it. Without one, each tile is computed by one block.
template <typename T>
size_t matmul_wgmma_workspace_bytes(const MatmulArgs<T>& args);
template <typename T>
cudaError_t matmul_wgmma(const MatmulArgs<T>& args, cudaStream_t stream, void* workspace = nullptr);
template <typename T>
bool matmul_wgmma_supported(const MatmulArgs<T>& args, const char** why);

// Linear backward's elementwise half, one pass over grad_out (m rows of n, all three contiguous row-major):
//   grad_z = grad_out * act'(saved)       saved = y for relu, z (aux) for gelu / gelu_tanh / silu
//   grad_bias[j] = sum_i grad_z[i, j]    when grad_bias != nullptr (deterministic, fixed order)
// For act == none grad_z may be nullptr (it equals grad_out) and only the bias gradient is computed.
// `workspace` holds linear_backward_epilogue_workspace_bytes(m, n) bytes (0 means none needed).
template <typename T>
cudaError_t linear_backward_epilogue(const T* grad_out, const T* saved, T* grad_z, T* grad_bias, int64_t m, int64_t n,
                                     Activation act, void* workspace, cudaStream_t stream);
size_t linear_backward_epilogue_workspace_bytes(int64_t m, int64_t n);

}  // namespace torchext::cuda_ops

namespace torchext::cuda_ops {

// dst (batch, rows, cols), contiguous, from a source whose rows are its contiguous dimension: dst[b][r][c] =
// src[b * src_bs + r + c * src_cs]. A tiled transpose through shared memory, coalesced on both sides. Used to give
// tf32 wgmma the K-major operand it needs (32-bit wgmma operands are K-major only) when the input is M/N-major.
template <typename T>
cudaError_t transpose_copy(const T* src, int64_t rows, int64_t cols, int64_t src_cs, int64_t batch, int64_t src_bs,
                           T* dst, cudaStream_t stream);

}  // namespace torchext::cuda_ops
