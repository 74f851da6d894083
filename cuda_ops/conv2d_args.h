// The convolution engine's arguments, without CUDA headers: the CUDA launchers (cuda_ops/conv2d.cuh) take this
// struct, and the op layer (csrc/conv2d.h, csrc/conv2d_cuda.cpp) names the kernels with the same list.
//
//   x is the input (N, C, H, W), w the weight (K, C / groups, R, S), y the output (N, K, P, Q):
//       y[n, k, p, q] = act(bias[k] + sum_{c, r, s} x[n, g C/groups + c, p sh - ph + r dh, q sw - pw + s dw]
//                                                   w[k, c, r, s])            (g = k / (K / groups))
//   with P = (H + 2 ph - dh (R - 1) - 1) / sh + 1 and likewise Q. Every tensor is addressed through four element
//   strides in (n, c, h, w) order, so NCHW, NHWC (channels-last) and any other dense or strided layout describe
//   themselves; the tensor-core versions need NHWC activations and KRSC (weight channels-last) weights and say so
//   through conv2d_supported.
//
// One struct serves the three passes (Conv2dPass): forward reads x and w and writes y; backward_input reads y (the
// output's gradient) and w and writes x (the input's gradient); backward_weight reads y (the output's gradient) and
// x and writes w (the weight's gradient). Each pass overwrites what it writes (no accumulation).
#pragma once

#include <cstdint>

#include "matmul_args.h"  // Activation

namespace torchext::cuda_ops {

// The versions of the convolution ladder (cuda_ops/conv2d.cuh), in order; the op's `variant=` takes these names.
enum class Conv2dKernel : int {
  direct = 0,    // one output element per thread, straight from global memory: any layout, dtype, groups, dilation
  im2col,        // the patches of x copied into a workspace matrix, then the GEMM engine (cuda_ops/matmul.cuh)
  implicit_simt,  // implicit GEMM on CUDA cores (float32, exact): the matmul ladder's v5 with gathering loaders
  implicit_mma,  // implicit GEMM on tensor cores (mma.sync): tiles of the patch matrix gathered as they are loaded
  implicit_wgmma,  // the same GEMMs on Hopper's wgmma: a producer warpgroup gathers, two consumer warpgroups multiply
  implicit_tma,    // implicit_wgmma with each tap's tiles copied by TMA as boxes of the NHWC tensor (whole-row tiles)
  count
};

inline constexpr const char* kConv2dKernelNames[] = {"direct",         "im2col",        "implicit_simt",
                                                     "implicit_mma",   "implicit_wgmma", "implicit_tma"};
static_assert(sizeof(kConv2dKernelNames) / sizeof(kConv2dKernelNames[0]) == static_cast<int>(Conv2dKernel::count));

inline const char* conv2d_kernel_name(Conv2dKernel kernel) {
  const int i = static_cast<int>(kernel);
  return i >= 0 && i < static_cast<int>(Conv2dKernel::count) ? kConv2dKernelNames[i] : "unknown";
}

enum class Conv2dPass : int { forward = 0, backward_input, backward_weight };

inline const char* conv2d_pass_name(Conv2dPass pass) {
  return pass == Conv2dPass::forward ? "forward" : pass == Conv2dPass::backward_input ? "backward_input"
                                                                                     : "backward_weight";
}

// A 4-D tensor: its data and its element strides in (n, c, h, w) order (for the weight: (k, c, r, s)).
template <typename T>
struct Tensor4 {
  T* data = nullptr;
  int64_t sn = 0, sc = 0, sh = 0, sw = 0;
};

struct Conv2dShape {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t k = 0, r = 0, s = 0;         // output channels, kernel height and width (the weight is (k, c/groups, r, s))
  int64_t p = 0, q = 0;                // output height and width
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};

// A is the accumulation type: float for float, half and bfloat16; double for double.
template <typename T, typename A>
struct Conv2dArgsT {
  Conv2dShape shape;
  Tensor4<T> x, w, y;
  // Forward only (the epilogue): bias (k values, contiguous) or nullptr, the activation (none or relu), and
  // `stats`: when not nullptr, 2 k values written with the per-output-channel sum (first k) and sum of squares
  // (next k) of y over n, p and q, computed from the values stored (after bias and activation), in A. `stats_sq`,
  // when not nullptr, takes the k sums of squares instead (two separate tensors, no copy): see conv2d_stats_sq().
  const T* bias = nullptr;
  Activation act = Activation::none;
  A* stats = nullptr;
  A* stats_sq = nullptr;
  bool allow_tf32 = false;  // float only: tensor-core versions may round x and w (or y) to tf32
  // backward_weight only: when not nullptr, dw is written here in A (float for half and bfloat16), at w's element
  // strides, straight from the float sums (not rounded to T); w.data is then not written. Only implicit_mma and
  // implicit_tma take it (conv2d_supported says no for the others): autocast's float32 master weights' gradient.
  A* w_acc = nullptr;
};

// Where the sums of squares of `stats` go: stats_sq, or the k values after the sums.
template <typename T, typename A>
inline A* conv2d_stats_sq(const Conv2dArgsT<T, A>& a) {
  return a.stats_sq != nullptr ? a.stats_sq : a.stats + a.shape.k;
}

}  // namespace torchext::cuda_ops
