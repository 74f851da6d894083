// Pooling on raw pointers and a stream, no ATen: max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and
// backward. The windows, their order and the divisors are cuda_ops/pooling_args.h's (shared with the CPU kernels).
//
//   x (N, C, H, W) the input, y (N, C, OH, OW) the output, indices (N, C, OH, OW) int64 (ih W + iw) for max;
//   backward reads dy (the output's gradient) and, for max, the indices, and writes dx (the input's gradient).
// Tensors are addressed through element strides in (n, c, h, w) order (Strides4): what the kernels read may have
// any layout (sliced, expanded, channels-last, ...); what they write (y, indices, dx) is dense NCHW or NHWC.
//
// The versions, side by side in cuda_ops/pooling.cu; the launchers pick one (pool2d_choice says which):
//   strided      one thread per written element, numbered along the written tensor's memory order; every dtype,
//                layout and size. The NCHW path.
//   nhwc_vec     NHWC, one thread per (pixel, 16-byte vector of channels): C / V threads per pixel, V = 16 /
//                sizeof(T) (8 for bf16 / fp16, 4 for fp32, 2 for fp64); 16-byte loads and stores along C (the
//                indices as V int64). Needs C % V == 0, channel stride 1 and 16-byte aligned rows in every tensor.
//   global_nhwc  adaptive_avg_pool2d to 1 x 1 on an NHWC input (ResNet's head): a block of 256 threads is (up to 32
//                vectors of channels) x (slices of the H W pixels); each thread sums its slice, the block adds the
//                slices in a fixed order (shared memory). Needs nhwc_vec's conditions on x.
//   global_nchw  adaptive_avg_pool2d to 1 x 1 on an input whose (H, W) planes are contiguous (NCHW): a group of
//                lanes (a power of two up to 32) per plane reads it coalesced, then a butterfly sum.
// Every backward gathers (each dx element sums over the outputs whose window covers it, in (oh, ow) order): no
// atomics, the same bits on every run. Sums are in acc_t<T> (float32 for half types); indices are 64-bit; nothing is
// read back to the host (the launchers are CUDA-graph safe).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "acc_type.h"  // plain C++: csrc/pooling_cuda.cpp (host compiler) includes this header
#include "pooling_args.h"

namespace torchext::cuda_ops {

enum class PoolKernel : int { strided = 0, nhwc_vec, global_nhwc, global_nchw, count };

inline constexpr const char* kPoolKernelNames[] = {"strided", "nhwc_vec", "global_nhwc", "global_nchw"};
static_assert(sizeof(kPoolKernelNames) / sizeof(kPoolKernelNames[0]) == static_cast<int>(PoolKernel::count));

inline const char* pool_kernel_name(PoolKernel k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < static_cast<int>(PoolKernel::count) ? kPoolKernelNames[i] : "unknown";
}

// The version a launcher runs for these operands: `read` is x (forward) or dy (backward), `aux` the indices (max:
// written by the forward, read by the backward; nullptr otherwise), `written` y or dx. The first of global_nhwc /
// global_nchw (adaptive forward to 1 x 1), nhwc_vec whose conditions hold, else strided.
enum class PoolOp : int {
  max_forward = 0,
  max_backward,
  avg_forward,
  avg_backward,
  adaptive_forward,
  adaptive_backward
};
template <typename T>
PoolKernel pool2d_choice(PoolOp op, const Pool2dGeometry& g, const void* read, Strides4 rs, const void* aux,
                         Strides4 as, const void* written, Strides4 ws);

template <typename T>
cudaError_t max_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, int64_t* indices, Strides4 ys,
                               cudaStream_t stream);
// indices has dy's shape; ys of indices given separately (a caller may pass torch's).
template <typename T>
cudaError_t max_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, const int64_t* indices, Strides4 is,
                                T* dx, Strides4 dxs, cudaStream_t stream);

// g.count_include_pad and g.divisor_override say avg_pool2d's divisor.
template <typename T>
cudaError_t avg_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, Strides4 ys,
                               cudaStream_t stream);
template <typename T>
cudaError_t avg_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, T* dx, Strides4 dxs,
                                cudaStream_t stream);

template <typename T>
cudaError_t adaptive_avg_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, Strides4 ys,
                                        cudaStream_t stream);
template <typename T>
cudaError_t adaptive_avg_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, T* dx, Strides4 dxs,
                                         cudaStream_t stream);

}  // namespace torchext::cuda_ops
