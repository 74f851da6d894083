// Convolution (2-D, cross-correlation as in torch.nn.functional.conv2d) on raw pointers and a stream, no ATen:
// forward, the input's gradient and the weight's gradient. Shapes, strides and the epilogue are described in
// cuda_ops/conv2d_args.h.
//
// The ladder: one launcher (conv2d) runs any version for any pass; each file's opening comment says what its
// versions add.
//   cuda_ops/conv2d_direct.cu    direct convolution, one output element per thread (every dtype, layout, groups,
//                                dilation): the reference the others are tested against on the GPU
//   cuda_ops/conv2d_im2col.cu    explicit im2col into a workspace + the GEMM engine (cuda_ops/matmul.cuh); the
//                                gradients through the same GEMMs and col2im
//   cuda_ops/conv2d_simt.cu      implicit GEMM on CUDA cores (float32, exact): the matmul ladder's top CUDA-core
//                                kernel with loaders that gather the tiles (padding, stride, dilation) as they copy
//                                them; the input gradient per stride phase, the weight gradient split along N P Q
//   cuda_ops/conv2d_implicit.cu  implicit GEMM on tensor cores (mma.sync, bf16/fp16/tf32): the loader computes each
//                                tile's input addresses (padding, stride, dilation) as it copies them; the input's
//                                gradient at stride > 1 split into stride^2 phases so no MMA multiplies an inserted
//                                zero; the weight's gradient split along N P Q with a deterministic reduction
//   cuda_ops/conv2d_wgmma.cu     implicit GEMM on Hopper's wgmma (sm_90a, bf16/fp16): a producer warpgroup gathers
//                                the tiles with cp.async into an mbarrier ring, two consumer warpgroups multiply,
//                                persistent over the tiles (forward and backward_input)
//                                (implicit_tma, same file: each tap's tiles copied by TMA as boxes of the NHWC
//                                tensor, the output tiled in whole image rows; the default where it runs)
//   cuda_ops/conv2d_wgrad_tma.cu implicit_tma's backward_weight: dy and x as TMA boxes of whole output rows, both
//                                MN-major, wgmma, the pixels split with a deterministic reduction
//   cuda_ops/conv2d.cu           the launcher, the default choice, the bias gradient and the statistics pass
//
// T is float, double, __half or __nv_bfloat16; accumulation in acc_t<T> (cuda_ops/common.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "acc_type.h"  // acc_t; plain C++, so csrc/conv2d_cuda.cpp (host compiler) can include this header
#ifdef __CUDACC__
#include "common.cuh"  // the device helpers, for the .cu files that reach them through this header
#endif
#include "conv2d_args.h"

namespace torchext::cuda_ops {

template <typename T>
using Conv2dArgs = Conv2dArgsT<T, acc_t<T>>;

// Whether `kernel` can run `pass` for `args` on the current device; `why`, when given, receives a short reason on
// false.
template <typename T>
bool conv2d_supported(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args, const char** why = nullptr);

// Device memory conv2d(kernel, pass, args, ...) needs, in bytes (0: none).
template <typename T>
size_t conv2d_workspace_bytes(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args);

// Runs one version of one pass on `stream`. Returns cudaErrorNotSupported when conv2d_supported is false, else the
// launch's error. Empty sizes are valid (an empty reduction writes zeros, or act(bias)). `workspace` holds
// conv2d_workspace_bytes(kernel, pass, args) bytes.
template <typename T>
cudaError_t conv2d(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream,
                   void* workspace);

// The fastest version that supports `pass` for `args` on the current device.
template <typename T>
Conv2dKernel conv2d_default_kernel(Conv2dPass pass, const Conv2dArgs<T>& args);

// grad_bias[k] = sum over n, p, q of y[n, k, p, q] (y holds the output's gradient), deterministic (fixed order).
template <typename T>
size_t conv2d_backward_bias_workspace_bytes(const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_backward_bias(const Conv2dArgs<T>& args, T* grad_bias, cudaStream_t stream, void* workspace);

// args.stats from args.y after the fact (the versions whose epilogue does not accumulate them), deterministic.
// Same workspace size as conv2d_backward_bias.
template <typename T>
cudaError_t conv2d_output_stats(const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

// Per-family launchers behind conv2d() (same contracts).
template <typename T>
bool conv2d_direct_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
cudaError_t conv2d_direct(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream);

template <typename T>
bool conv2d_im2col_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_im2col_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_im2col(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

template <typename T>
bool conv2d_simt_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_simt_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_simt(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

template <typename T>
bool conv2d_implicit_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_implicit_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_implicit(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

template <typename T>
bool conv2d_wgmma_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_wgmma_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_wgmma(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

template <typename T>
bool conv2d_tma_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_tma_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_tma(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

// implicit_tma's backward_weight (cuda_ops/conv2d_wgrad_tma.cu), reached through conv2d_tma*.
template <typename T>
bool conv2d_tma_wgrad_supported(const Conv2dArgs<T>& args, const char** why);
template <typename T>
size_t conv2d_tma_wgrad_workspace_bytes(const Conv2dArgs<T>& args);
template <typename T>
cudaError_t conv2d_tma_wgrad(const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace);

}  // namespace torchext::cuda_ops
