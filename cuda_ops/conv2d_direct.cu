// Rung 1 of the convolution ladder (cuda_ops/conv2d.cuh): direct convolution, straight from global memory, no
// workspace. The GPU's correctness reference for the other rungs and the fallback for what they refuse (groups > 1,
// odd strides, any dtype).
//
//   x (N, C, H, W), w (K, C/G, R, S), y (N, K, P, Q), G groups of C/G input and K/G output channels, g = k / (K/G):
//   forward          y[n,k,p,q]  = act(bias[k] + sum_{c<C/G, r, s} x[n, g C/G + c, p sh - ph + r dh, q sw - pw + s dw]
//                                                                  w[k, c, r, s])
//   backward_input   dx[n,c,h,w] = sum over the taps (k in c's group, r, s) with h + ph - r dh = p sh, 0 <= p < P
//                                  (likewise w, s, q) of dy[n, k, p, q] w[k, c % (C/G), r, s]
//   backward_weight  dw[k,c,r,s] = sum_{n, p, q} dy[n, k, p, q] x[n, g C/G + c, p sh - ph + r dh, q sw - pw + s dw]
// (out-of-range input positions are the zero padding). Every tensor is read and written through its four strides
// (cuda_ops/conv2d_args.h), so any layout works; indices are 64-bit; sums are in acc_t<T>.
//
// Kernels (one version per pass; what each adds over nothing is that it is obviously right):
//   conv2d_direct_forward_kernel          one thread per output element, bias and the activation in the epilogue.
//                                         Threads are numbered along y's fastest dimension: k for a channels-last y
//                                         (then neighbouring threads read the same x element and neighbouring
//                                         weights), q for NCHW (neighbouring x elements, the same weight).
//   conv2d_direct_backward_input_kernel   one thread per input element; per tap row r the output row p is solved
//                                         for (one divisibility test) instead of testing every (p, r) pair, then
//                                         the output channels of the group are summed. Numbered along x's fastest
//                                         dimension.
//   conv2d_direct_backward_weight_kernel  one warp per weight element: lane l sums the (n, p, q) positions
//                                         l, l + 32, ... in order, then a butterfly warp sum. The order depends on the
//                                         shape only, so the result is the same bits on every run (no atomics).
//
// Napkin math: ResNet-18's 64 -> 64 3x3 layer on 8 x 32 x 32 is 2 x 8 x 64 x 32 x 32 x 576 = 0.6 GFLOP per pass;
// at one FMA per two loads from L1/L2 this runs at a few hundred GFLOP/s, milliseconds per pass: a reference, not a
// fast path.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"
#include "conv2d.cuh"
#include "matmul_epilogue.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;

// Whether threads should be numbered along the channel (true) or the width (false) of a tensor with these strides.
inline bool channels_fastest(int64_t channels, int64_t sc, int64_t sw) {
  return channels > 1 && (sc == 1 || (sw != 1 && sc < sw));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) conv2d_direct_forward_kernel(const Conv2dArgs<T> a, bool chan_fast) {
  using A = acc_t<T>;
  const Conv2dShape s = a.shape;
  const int64_t total = s.n * s.k * s.p * s.q;
  const int64_t kg = s.k / s.groups, cg = s.c / s.groups;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n, k, p, q, t = i;
    if (chan_fast) {
      k = t % s.k;
      t /= s.k;
      q = t % s.q;
      t /= s.q;
      p = t % s.p;
      n = t / s.p;
    } else {
      q = t % s.q;
      t /= s.q;
      p = t % s.p;
      t /= s.p;
      k = t % s.k;
      n = t / s.k;
    }
    const T* xb = a.x.data + n * a.x.sn + (k / kg) * cg * a.x.sc;
    const T* wb = a.w.data + k * a.w.sn;
    A acc = A(0);
    for (int64_t r = 0; r < s.r; ++r) {
      const int64_t ih = p * s.stride_h - s.pad_h + r * s.dil_h;
      if (ih < 0 || ih >= s.h) continue;
      for (int64_t ss = 0; ss < s.s; ++ss) {
        const int64_t iw = q * s.stride_w - s.pad_w + ss * s.dil_w;
        if (iw < 0 || iw >= s.w) continue;
        const T* xp = xb + ih * a.x.sh + iw * a.x.sw;
        const T* wp = wb + r * a.w.sh + ss * a.w.sw;
        for (int64_t c = 0; c < cg; ++c) acc += to_acc<T>(xp[c * a.x.sc]) * to_acc<T>(wp[c * a.w.sc]);
      }
    }
    if (a.bias != nullptr) acc += to_acc<T>(a.bias[k]);
    a.y.data[n * a.y.sn + k * a.y.sc + p * a.y.sh + q * a.y.sw] = from_acc<T>(apply_activation(acc, a.act));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) conv2d_direct_backward_input_kernel(const Conv2dArgs<T> a, bool chan_fast) {
  using A = acc_t<T>;
  const Conv2dShape s = a.shape;
  const int64_t total = s.n * s.c * s.h * s.w;
  const int64_t kg = s.k / s.groups, cg = s.c / s.groups;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n, c, h, w, t = i;
    if (chan_fast) {
      c = t % s.c;
      t /= s.c;
      w = t % s.w;
      t /= s.w;
      h = t % s.h;
      n = t / s.h;
    } else {
      w = t % s.w;
      t /= s.w;
      h = t % s.h;
      t /= s.h;
      c = t % s.c;
      n = t / s.c;
    }
    const int64_t g = c / cg, cl = c - g * cg;
    const T* dyb = a.y.data + n * a.y.sn + g * kg * a.y.sc;
    const T* wb = a.w.data + g * kg * a.w.sn + cl * a.w.sc;
    A acc = A(0);
    for (int64_t r = 0; r < s.r; ++r) {
      const int64_t th = h + s.pad_h - r * s.dil_h;  // = p * stride_h for the output row p this tap reaches
      if (th < 0) break;                               // decreasing in r: no later tap reaches a row either
      if (th % s.stride_h != 0) continue;
      const int64_t p = th / s.stride_h;
      if (p >= s.p) continue;
      for (int64_t ss = 0; ss < s.s; ++ss) {
        const int64_t tw = w + s.pad_w - ss * s.dil_w;
        if (tw < 0) break;
        if (tw % s.stride_w != 0) continue;
        const int64_t q = tw / s.stride_w;
        if (q >= s.q) continue;
        const T* dyp = dyb + p * a.y.sh + q * a.y.sw;
        const T* wp = wb + r * a.w.sh + ss * a.w.sw;
        for (int64_t k = 0; k < kg; ++k) acc += to_acc<T>(dyp[k * a.y.sc]) * to_acc<T>(wp[k * a.w.sn]);
      }
    }
    a.x.data[n * a.x.sn + c * a.x.sc + h * a.x.sh + w * a.x.sw] = from_acc<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) conv2d_direct_backward_weight_kernel(const Conv2dArgs<T> a) {
  using A = acc_t<T>;
  const Conv2dShape s = a.shape;
  const int64_t kg = s.k / s.groups, cg = s.c / s.groups;
  const int64_t total = s.k * cg * s.r * s.s;  // weight elements
  const int64_t npq = s.n * s.p * s.q;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t e = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; e < total; e += warps) {
    int64_t t = e;
    const int64_t ss = t % s.s;
    t /= s.s;
    const int64_t r = t % s.r;
    t /= s.r;
    const int64_t c = t % cg;
    const int64_t k = t / cg;
    const T* dyb = a.y.data + k * a.y.sc;
    const T* xb = a.x.data + ((k / kg) * cg + c) * a.x.sc;
    const int64_t oh = r * s.dil_h - s.pad_h, ow = ss * s.dil_w - s.pad_w;
    A acc = A(0);
    // Position `lane` of the flattened (n, p, q), then steps of 32 with carries (no division in the loop).
    int64_t q = lane, p = 0, n = 0;
    while (q >= s.q && s.q > 0) {
      q -= s.q;
      if (++p == s.p) p = 0, ++n;
    }
    for (int64_t i = lane; i < npq; i += 32) {
      const int64_t ih = p * s.stride_h + oh, iw = q * s.stride_w + ow;
      if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w) {
        acc += to_acc<T>(dyb[n * a.y.sn + p * a.y.sh + q * a.y.sw]) *
               to_acc<T>(xb[n * a.x.sn + ih * a.x.sh + iw * a.x.sw]);
      }
      q += 32;
      while (q >= s.q) {
        q -= s.q;
        if (++p == s.p) p = 0, ++n;
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) a.w.data[k * a.w.sn + c * a.w.sc + r * a.w.sh + ss * a.w.sw] = from_acc<T>(acc);
  }
}

}  // namespace

template <typename T>
bool conv2d_direct_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why) {
  const Conv2dShape& s = args.shape;
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if (pass != Conv2dPass::forward && pass != Conv2dPass::backward_input && pass != Conv2dPass::backward_weight) {
    return fail("direct: unknown pass");
  }
  if (s.n < 0 || s.c < 0 || s.h < 0 || s.w < 0 || s.k < 0 || s.r < 0 || s.s < 0 || s.p < 0 || s.q < 0) {
    return fail("direct: negative size");
  }
  if (s.groups < 1 || s.c % s.groups != 0 || s.k % s.groups != 0) {
    return fail("direct: groups must be at least 1 and divide both channel counts");
  }
  if (s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1 || s.pad_h < 0 || s.pad_w < 0) {
    return fail("direct: stride and dilation must be at least 1, padding non-negative");
  }
  return true;
}

template <typename T>
cudaError_t conv2d_direct(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream) {
  if (!conv2d_direct_supported(pass, args, nullptr)) return cudaErrorNotSupported;
  const Conv2dShape& s = args.shape;
  switch (pass) {
    case Conv2dPass::forward: {
      const int64_t total = s.n * s.k * s.p * s.q;
      if (total == 0) return cudaSuccess;
      conv2d_direct_forward_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          args, channels_fastest(s.k, args.y.sc, args.y.sw));
      break;
    }
    case Conv2dPass::backward_input: {
      const int64_t total = s.n * s.c * s.h * s.w;
      if (total == 0) return cudaSuccess;
      conv2d_direct_backward_input_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          args, channels_fastest(s.c, args.x.sc, args.x.sw));
      break;
    }
    default: {
      const int64_t total = s.k * (s.c / s.groups) * s.r * s.s;
      if (total == 0) return cudaSuccess;
      // One warp per weight element, kThreads / 32 per block.
      conv2d_direct_backward_weight_kernel<T><<<grid_for(total * 32, kThreads), kThreads, 0, stream>>>(args);
      break;
    }
  }
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_CONV2D_DIRECT(T)                                                      \
  template bool conv2d_direct_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**); \
  template cudaError_t conv2d_direct<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t);
TORCHEXT_INSTANTIATE_CONV2D_DIRECT(float)
TORCHEXT_INSTANTIATE_CONV2D_DIRECT(double)
TORCHEXT_INSTANTIATE_CONV2D_DIRECT(__half)
TORCHEXT_INSTANTIATE_CONV2D_DIRECT(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_DIRECT

}  // namespace torchext::cuda_ops
