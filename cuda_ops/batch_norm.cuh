// Batch normalization (nn.BatchNorm2d's forward in training and eval, fused with relu or residual add + relu, and its
// backward) on raw pointers and a stream, no ATen. The math, the (A, C, B) view of the input and the mask's format are
// in cuda_ops/batch_norm_args.h; the kernels and what each version of the ladder adds in cuda_ops/batch_norm.cu.
//
// T is float, double, __half or __nv_bfloat16; P (weight, bias, running buffers) is T or acc_t<T>; the statistics and
// the per-channel vectors are acc_t<T>, their final sums float64.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "acc_type.h"  // acc_t; plain C++, so csrc/batch_norm_cuda.cpp (host compiler) can include this header
#include "batch_norm_args.h"

namespace torchext::cuda_ops {

template <typename T, typename P>
using BatchNormForwardArgs = BatchNormForwardArgsT<T, P, acc_t<T>>;
template <typename T, typename P>
using BatchNormBackwardArgs = BatchNormBackwardArgsT<T, P, acc_t<T>>;

// Whether `kernel` can run these arguments; `why`, when given, receives a short reason on false. 'simple' runs
// everything; 'vectorized' and 'fused' need C % 8 == 0 (rows x C) or B % 8 == 0 (planes) and 16-byte aligned tensors.
template <typename T, typename P>
bool batch_norm_forward_supported(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args,
                                  const char** why = nullptr);
template <typename T, typename P>
bool batch_norm_backward_supported(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args,
                                   const char** why = nullptr);

// The fastest version that supports the arguments.
template <typename T, typename P>
BatchNormKernel batch_norm_forward_default_kernel(const BatchNormForwardArgs<T, P>& args);
template <typename T, typename P>
BatchNormKernel batch_norm_backward_default_kernel(const BatchNormBackwardArgs<T, P>& args);

// Device memory each pass needs, in bytes (the reduction's partial sums and the per-channel vectors).
template <typename T, typename P>
size_t batch_norm_forward_workspace_bytes(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args);
template <typename T, typename P>
size_t batch_norm_backward_workspace_bytes(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args);

// Runs the forward (statistics, finalize, normalize) or the backward (reduction, finalize, elementwise) on `stream`:
// no host synchronization, no device value read on the host (CUDA-graph capture safe). Returns cudaErrorNotSupported
// when the kernel does not support the arguments, else the launches' error. Empty sizes are valid.
template <typename T, typename P>
cudaError_t batch_norm_forward(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args, cudaStream_t stream,
                               void* workspace);
template <typename T, typename P>
cudaError_t batch_norm_backward(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args, cudaStream_t stream,
                                void* workspace);

}  // namespace torchext::cuda_ops
