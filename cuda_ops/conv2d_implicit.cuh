// What the implicit-GEMM rungs of the convolution share (cuda_ops/conv2d_implicit.cu on mma.sync,
// cuda_ops/conv2d_wgmma.cu on Hopper's wgmma, cuda_ops/conv2d_simt.cu on CUDA cores): the GEMMs' parameters
// (FpropParams for the forward and each stride phase of backward_input, WgradParams for backward_weight), the gathered
// operand's geometry (Gather, FastDivmod), what they need of the operands (implicit_operands_supported), and the
// host-side drivers that turn a convolution into those GEMMs: forward_gemm (with the statistics' second pass) and
// backward_input_gemm (the stride phases, their sub-kernels, and one zero fill for the phases without a tap). Each
// rung passes its own GEMM launcher.
// Internal to those files (an anonymous namespace: each gets its own copy of the kernels).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.cuh"
#include "conv2d.cuh"
#include "sm90.cuh"

namespace torchext::cuda_ops {
namespace {

// n / d and n % d for 0 <= n < 2^31 and a divisor fixed per launch, by a multiply-high and a shift (Granlund and
// Montgomery): mul = ceil(2^(31 + l) / d) with l = ceil(log2 d), so mul < 2^32 and the quotient is exact.
struct FastDivmod {
  int d = 1;
  uint32_t mul = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(int divisor) : d(divisor) {
    if (d <= 1) return;
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    mul = static_cast<uint32_t>(((uint64_t{1} << (31 + l)) + d - 1) / d);
    shift = static_cast<uint32_t>(l - 1);
  }
  __device__ __forceinline__ int div(int n) const {
    return d == 1 ? n : static_cast<int>(__umulhi(static_cast<uint32_t>(n), mul) >> shift);
  }
  __device__ __forceinline__ void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * d;
  }
};

// The gathered operand of both GEMMs: pixel m of the output grid -> (image, p, q), column k -> tap (r, s) and
// channel; x[image, ih, iw, ch] at x + image x_sn + ih x_sh + iw x_sw + ch with ih = p stride_h - pad_h + r dil_h
// (likewise iw). Pads may be negative (backward_input's phases).
template <typename T>
struct Gather {
  FastDivmod pq, q;  // m -> image, pixel -> (p, q)
  FastDivmod c, s;   // k -> tap (r, s) and channel
  const T* x = nullptr;
  int64_t x_sn = 0, x_sh = 0, x_sw = 0;
  int h = 0, w = 0;
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
};

// The forward's GEMM (also one phase of backward_input): y[m -> (image, p, q), j] = act(bias[j] +
// sum_k A[m, k] B[k, j]), A gathered from x, B the weight as n rows of k values (K-major).
template <typename T>
struct FpropParams {
  int m = 0, n = 0, k = 0;  // rows (output pixels), columns (output channels), R S C
  int tiles_m = 0, tiles_n = 0;
  Gather<T> g;
  const T* wt = nullptr;  // row j at wt + j w_lead
  int64_t w_lead = 0;
  T* y = nullptr;  // element (image, p, q, j) at y + image y_sn + p y_sh + q y_sw + j
  int64_t y_sn = 0, y_sh = 0, y_sw = 0;
  bool vec_store = false;
  const T* bias = nullptr;
  float* stats_partial = nullptr;  // [2][n][tiles_m]: each tile's column sums, then its sums of squares
};

// The weight gradient's GEMM: dw[i, j] = sum_pixel dy[pixel, i] A[pixel, j], A gathered from x as in the forward.
template <typename T>
struct WgradParams {
  int m = 0, n = 0, k = 0;  // output channels, R S C, N P Q
  int tiles_m = 0, tiles_n = 0;
  int kt_per_split = 0;
  Gather<T> g;
  const T* dy = nullptr;  // pixel kk's channels at dy + kk dy_lead
  int64_t dy_lead = 0;
  T* dw = nullptr;          // one split: element (i, j) at dw + i dw_lead + j
  float* dw_acc = nullptr;  // or there, in float (Conv2dArgs::w_acc)
  int64_t dw_lead = 0;
  float* partial = nullptr;  // several splits: [split][m][n]
};

// (which ? squares : sums)[j] = sum over tiles of partial[(which * n + j) * tiles + tile], in a fixed order: one
// block per (j, which), threads striding over the tiles, then the block's fixed reduction tree.
__global__ void conv2d_stats_reduce_kernel(const float* partial, int tiles, int n, float* sums, float* squares) {
  __shared__ float scratch[32];
  const int64_t row = static_cast<int64_t>(blockIdx.y) * n + blockIdx.x;
  float sum = 0.f;
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) sum += partial[row * tiles + t];
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) (blockIdx.y == 0 ? sums : squares)[blockIdx.x] = sum;
}

// dw[i, j] = the splits' partial sums of (i, j), added in split order; O is the weight's type or float (w_acc).
template <typename O>
__global__ void conv2d_wgrad_reduce_kernel(const float* partial, int splits, int m, int n, O* dw, int64_t dw_lead) {
  const int64_t total = static_cast<int64_t>(m) * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int z = 0; z < splits; ++z) sum += partial[z * total + e];
    dw[(e / n) * dw_lead + e % n] = static_cast<O>(sum);
  }
}

// Launches it into dw_acc (float) where that is set, else into dw; the launch's error.
template <typename T>
cudaError_t launch_wgrad_reduce(const float* partial, int splits, int m, int n, T* dw, float* dw_acc, int64_t dw_lead,
                                cudaStream_t stream) {
  const unsigned grid = grid_for(static_cast<int64_t>(m) * n, 256);
  if (dw_acc != nullptr) {
    conv2d_wgrad_reduce_kernel<float><<<grid, 256, 0, stream>>>(partial, splits, m, n, dw_acc, dw_lead);
  } else {
    conv2d_wgrad_reduce_kernel<T><<<grid, 256, 0, stream>>>(partial, splits, m, n, dw, dw_lead);
  }
  return cudaGetLastError();
}

// The taps of backward_input's stride phase along one dimension: phase ph (pixels ph + stride i) takes the taps
// r = r0 + stride t, t < count, with r0 = (ph + pad) mod stride.
__host__ __device__ __forceinline__ int64_t phase_first_tap(int64_t ph, int64_t pad, int64_t stride) {
  return (ph + pad) % stride;
}
__host__ __device__ __forceinline__ int64_t phase_tap_count(int64_t r0, int64_t taps, int64_t stride) {
  return r0 < taps ? (taps - r0 + stride - 1) / stride : 0;
}

// Elements of phase (ph, pw)'s sub-kernel in backward_input's workspace, its start 256-byte aligned: C T U K.
template <typename T>
__host__ __device__ __forceinline__ int64_t phase_weight_elems(const Conv2dShape& sh, int64_t ph, int64_t pw) {
  const int64_t tr = phase_tap_count(phase_first_tap(ph, sh.pad_h, sh.stride_h), sh.r, sh.stride_h);
  const int64_t ts = phase_tap_count(phase_first_tap(pw, sh.pad_w, sh.stride_w), sh.s, sh.stride_w);
  const int64_t bytes = sh.c * tr * ts * sh.k * static_cast<int64_t>(sizeof(T));
  return (bytes + 255) / 256 * 256 / static_cast<int64_t>(sizeof(T));
}

// Where phase (ph, pw)'s sub-kernel starts in the workspace: the phases in (ph, pw) order, every one of them (those
// without pixels or taps keep their, possibly empty, place).
template <typename T>
__host__ __device__ __forceinline__ int64_t phase_weight_offset(const Conv2dShape& sh, int64_t ph, int64_t pw) {
  int64_t off = 0;
  for (int64_t i = 0; i < ph * sh.stride_w + pw; ++i) off += phase_weight_elems<T>(sh, i / sh.stride_w, i % sh.stride_w);
  return off;
}

// Where tap (r, s) of w lands in backward_input's workspace: the offset of its (c = 0, k = 0) value and the step
// between its consecutive c. Tap (r, s) belongs to phase (ph, pw) with r0 = r mod stride_h = (ph + pad_h) mod
// stride_h (likewise s), and lands in that phase's K-major B of C rows of T U K values, flipped:
// wp[c][t][u][k] = w[k][c][r0 + stride_h (T - 1 - t)][s0 + stride_w (U - 1 - u)].
template <typename T>
__host__ __device__ __forceinline__ void phase_tap_place(const Conv2dShape& sh, int64_t tap, int64_t& offset,
                                                         int64_t& c_step) {
  const int64_t r = tap / sh.s, s = tap % sh.s;
  const int64_t r0 = r % sh.stride_h, s0 = s % sh.stride_w;
  const int64_t ph = ((r0 - sh.pad_h) % sh.stride_h + sh.stride_h) % sh.stride_h;
  const int64_t pw = ((s0 - sh.pad_w) % sh.stride_w + sh.stride_w) % sh.stride_w;
  const int64_t tr = phase_tap_count(r0, sh.r, sh.stride_h), ts = phase_tap_count(s0, sh.s, sh.stride_w);
  const int64_t t = tr - 1 - r / sh.stride_h, u = ts - 1 - s / sh.stride_w;
  offset = phase_weight_offset<T>(sh, ph, pw) + (t * ts + u) * sh.k;
  c_step = tr * ts * sh.k;
}

// phase_tap_place for every tap, computed on the host and passed by value (kernels of up to 8 x 8 taps): the
// per-tap arithmetic (64-bit divisions, and a loop over the phases for the offset) is then not repeated by every
// block. With it in every block the kernel took 33 us for a 512 -> 512 3x3 weight on an H200, SMs busy and memory
// idle (Nsight Compute, 2026-11-28; benchmarks/results/ncu_conv2d_dgrad_h200.txt), as long as half the GEMM after it.
constexpr int kPhaseTableTaps = 64;
struct PhaseTapTable {
  int64_t offset[kPhaseTableTaps];  // phase_tap_place
  int64_t c_step[kPhaseTableTaps];
  int64_t src[kPhaseTableTaps];  // the tap's (k = 0, c = 0) value in w: r sh + s sw
};

// backward_input's sub-kernels, all stride phases in one launch: per tap a transpose of w's (K, C) slice into its
// place (phase_tap_place) through a 32 x 32 shared tile: the loads run along C (contiguous in the KRSC weights the
// tensor-core rungs take), the stores along K. Block (32, 8); grid (C tiles, K tiles, taps), each dimension strided
// where it exceeds the grid's limits. kTable: the places from `table` (R S <= kPhaseTableTaps), else computed here.
template <typename T, bool kTable>
__global__ void conv2d_phase_weights_kernel(Tensor4<const T> w, Conv2dShape sh, T* wp, PhaseTapTable table) {
  __shared__ T tile[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t tap = blockIdx.z; tap < sh.r * sh.s; tap += gridDim.z) {
    int64_t offset, c_step, src_offset;
    if constexpr (kTable) {
      offset = table.offset[tap], c_step = table.c_step[tap], src_offset = table.src[tap];
    } else {
      phase_tap_place<T>(sh, tap, offset, c_step);
      src_offset = (tap / sh.s) * w.sh + (tap % sh.s) * w.sw;
    }
    T* const dst = wp + offset;                // + c c_step + k
    const T* const src = w.data + src_offset;  // + k sn + c sc
    for (int64_t k0 = blockIdx.y * int64_t{32}; k0 < sh.k; k0 += gridDim.y * int64_t{32}) {
      for (int64_t c0 = blockIdx.x * int64_t{32}; c0 < sh.c; c0 += gridDim.x * int64_t{32}) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t k = k0 + ty + 8 * i, c = c0 + tx;
          if (k < sh.k && c < sh.c) tile[ty + 8 * i][tx] = src[k * w.sn + c * w.sc];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t c = c0 + ty + 8 * i, k = k0 + tx;
          if (k < sh.k && c < sh.c) dst[c * c_step + k] = tile[tx][ty + 8 * i];
        }
        __syncthreads();
      }
    }
  }
}

// backward_input's stride phases with no tap (a kernel smaller than the stride: three of the four phases of a 1x1
// stride-2 convolution) receive no gradient. Phase (h mod stride_h, w mod stride_w) has none where
// (h + pad_h) mod stride_h >= taps_r or (w + pad_w) mod stride_w >= taps_s (its first tap r0 is past the kernel),
// so this one launch zeroes every such pixel of dx, the pixels of all tapless phases together, and leaves the others
// to the phases' GEMMs. U is the store: 16 bytes (uint4) where dx's channel rows are chunk-aligned, else one element
// as an integer of its size; dx's strides are in U. blockDim.x threads along a pixel's `units` stores, blockDim.y
// pixels, the pixels in a grid-stride loop. pixels = N H W and H + pad_h, W + pad_w stay below 2^31 (the implicit
// rungs' limits), as FastDivmod needs.
template <typename U>
__global__ void conv2d_zero_phases_kernel(Tensor4<U> dx, int64_t units, int64_t pixels, FastDivmod hw, FastDivmod w,
                                          FastDivmod stride_h, FastDivmod stride_w, int pad_h, int pad_w, int taps_r,
                                          int taps_s) {
  for (int64_t pix = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y; pix < pixels;
       pix += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    int image, rest, ih, iw, q, rh, rw;
    hw.divmod(static_cast<int>(pix), image, rest);
    w.divmod(rest, ih, iw);
    stride_h.divmod(ih + pad_h, q, rh);
    stride_w.divmod(iw + pad_w, q, rw);
    if (rh < taps_r && rw < taps_s) continue;  // a phase with taps: its GEMM writes this pixel
    U* px = dx.data + image * dx.sn + ih * dx.sh + iw * dx.sw;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) px[u * dx.sc] = U{};
  }
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// How many splits a weight gradient's k-loop (over the pixels, num_kt k-tiles) gets: enough blocks for two waves
// (`per_sm` blocks on each SM) where the `tiles` alone are fewer, each split at least `min_kt` k-tiles, at most
// 65535 (grid.z); rounded so that no split is empty. A function of the shape and the SM count only.
inline int wgrad_split_count(int64_t tiles, int64_t num_kt, int per_sm, int64_t min_kt) {
  const int64_t want = (2 * static_cast<int64_t>(sm_count()) * per_sm + tiles - 1) / tiles;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(num_kt / min_kt, 65535));
  const int64_t splits = std::max<int64_t>(1, std::min(want, most));
  const int64_t per = (num_kt + splits - 1) / splits;
  return static_cast<int>(per > 0 ? (num_kt + per - 1) / per : 1);
}

// A split weight gradient's workspace: each split's float32 partial of the whole K R S C gradient (none unsplit), which
// the fixed-order reduction adds.
inline size_t wgrad_partials_bytes(int64_t splits, const Conv2dShape& sh) {
  return splits > 1 ? static_cast<size_t>(splits * sh.k * sh.r * sh.s * sh.c) * sizeof(float) : 0;
}

// A channels-last activation tensor the 16-byte loads can read: channel stride 1, the channel count and the
// other strides multiples of the chunk, base aligned.
template <typename T>
bool chunk_ready(const Tensor4<T>& t, int64_t channels) {
  constexpr int64_t kElems = 16 / sizeof(T);
  return (t.sc == 1 || channels <= 1) && channels % kElems == 0 && t.sn % kElems == 0 && t.sh % kElems == 0 &&
         t.sw % kElems == 0 && aligned_to(t.data, 16);
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// What the drivers below need of the operands, for each rung that runs them (implicit_simt, implicit_mma, and the
// wgmma rungs through implicit_mma's check): groups 1, sizes below 2^30, channels-last activations whose channel rows
// are whole 16-byte chunks (chunk_ready), KRSC weights (16-byte aligned rows in the forward), the forward's
// activation none or relu, dilation 1 in backward_input, grad_output dense in backward_weight. False with the reason
// in `why` (without a rung's name: the op layer names the variant) otherwise.
template <typename T>
bool implicit_operands_supported(Conv2dPass pass, const Conv2dArgs<T>& a, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const Conv2dShape& sh = a.shape;
  if (sh.groups != 1) return fail("groups > 1 is not supported (the direct version runs them)");
  constexpr int64_t kMax = INT_MAX / 2;
  if (sh.n * sh.p * sh.q > kMax || sh.n * sh.h * sh.w > kMax || sh.r * sh.s * sh.c > kMax ||
      sh.r * sh.s * sh.k > kMax || sh.k > kMax || sh.c > kMax) {
    return fail("sizes must stay below 2^30 rows and columns");
  }
  // Rows and columns as ints: the padded image, and a tap's offset r dil_h (implicit_simt's loader decodes k a few
  // taps past the kernel in a partial last k tile; those copies are masked, their arithmetic must not overflow).
  if (sh.h + 2 * sh.pad_h > kMax || sh.w + 2 * sh.pad_w > kMax || (sh.r + 8) * sh.dil_h > kMax ||
      (sh.s + 8) * sh.dil_w > kMax) {
    return fail("image too large");
  }
  const bool krsc =
      (a.w.sc == 1 || sh.c <= 1) && (a.w.sw == sh.c || sh.s <= 1) && (a.w.sh == sh.s * sh.c || sh.r <= 1);
  switch (pass) {
    case Conv2dPass::forward: {
      if (!chunk_ready(a.x, sh.c)) {
        return fail("the input must be channels-last with a channel count that is a multiple of 8 (bf16/fp16) or 4 "
                    "(float32), 16-byte aligned");
      }
      constexpr int64_t kElems = 16 / sizeof(T);
      if (!krsc || a.w.sn % kElems != 0 || !aligned_to(a.w.data, 16)) {
        return fail("the weight must be channels-last (K, R, S, C), 16-byte aligned");
      }
      if (a.y.sc != 1 && sh.k > 1) return fail("the output must be channels-last");
      if (a.act != Activation::none && a.act != Activation::relu) {
        return fail("the epilogue's activation must be none or relu");
      }
      return true;
    }
    case Conv2dPass::backward_input:
      if (sh.dil_h != 1 || sh.dil_w != 1) return fail("backward_input needs dilation 1");
      if (!chunk_ready(a.y, sh.k)) {
        return fail("grad_output must be channels-last with a channel count that is a multiple of 8 (bf16/fp16) or 4 "
                    "(float32), 16-byte aligned");
      }
      if (a.x.sc != 1 && sh.c > 1) return fail("grad_input must be channels-last");
      return true;
    case Conv2dPass::backward_weight: {
      if (!chunk_ready(a.x, sh.c)) {
        return fail("the input must be channels-last with a channel count that is a multiple of 8 (bf16/fp16) or 4 "
                    "(float32), 16-byte aligned");
      }
      const bool dense = chunk_ready(a.y, sh.k) && (a.y.sw == sh.k || sh.q <= 1) &&
                         (a.y.sh == sh.q * sh.k || sh.p <= 1) && (a.y.sn == sh.p * sh.q * sh.k || sh.n <= 1);
      if (!dense) return fail("backward_weight needs grad_output dense channels-last");
      if (!krsc) return fail("grad_weight must be channels-last (K, R, S, C)");
      return true;
    }
  }
  return fail("unknown pass");
}

// The gathered operand for the forward and the weight gradient: x itself, with the convolution's geometry.
template <typename T>
Gather<T> input_gather(const Conv2dArgs<T>& a) {
  const Conv2dShape& sh = a.shape;
  Gather<T> g;
  g.pq = FastDivmod(static_cast<int>(std::max<int64_t>(1, sh.p * sh.q)));
  g.q = FastDivmod(static_cast<int>(std::max<int64_t>(1, sh.q)));
  g.c = FastDivmod(static_cast<int>(std::max<int64_t>(1, sh.c)));
  g.s = FastDivmod(static_cast<int>(sh.s));
  g.x = a.x.data;
  g.x_sn = a.x.sn;
  g.x_sh = a.x.sh;
  g.x_sw = a.x.sw;
  g.h = static_cast<int>(sh.h);
  g.w = static_cast<int>(sh.w);
  g.stride_h = static_cast<int>(sh.stride_h);
  g.stride_w = static_cast<int>(sh.stride_w);
  g.pad_h = static_cast<int>(sh.pad_h);
  g.pad_w = static_cast<int>(sh.pad_w);
  g.dil_h = static_cast<int>(sh.dil_h);
  g.dil_w = static_cast<int>(sh.dil_w);
  return g;
}

// The forward as one GEMM: run(params, relu, stats, stream) launches the rung's kernel; `stats_tiles` is its number
// of tiles along the output pixels (the statistics' partials are [2][n][stats_tiles]).
template <typename T, class Run>
cudaError_t forward_gemm(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace, Run&& run, int stats_tiles) {
  const Conv2dShape& sh = a.shape;
  FpropParams<T> p;
  p.m = static_cast<int>(sh.n * sh.p * sh.q);
  p.n = static_cast<int>(sh.k);
  p.k = static_cast<int>(sh.r * sh.s * sh.c);
  p.g = input_gather(a);
  p.wt = a.w.data;
  p.w_lead = a.w.sn;
  p.y = a.y.data;
  p.y_sn = a.y.sn;
  p.y_sh = a.y.sh;
  p.y_sw = a.y.sw;
  p.vec_store = aligned_to(a.y.data, 4 * sizeof(T)) && a.y.sn % 4 == 0 && a.y.sh % 4 == 0 && a.y.sw % 4 == 0;
  p.bias = a.bias;
  const bool stats = a.stats != nullptr;
  if (stats) {
    if (p.m == 0 || p.n == 0) {
      if (p.n == 0) return cudaSuccess;
      const cudaError_t err = cudaMemsetAsync(a.stats, 0, sizeof(float) * p.n, stream);
      return err != cudaSuccess ? err : cudaMemsetAsync(conv2d_stats_sq(a), 0, sizeof(float) * p.n, stream);
    }
    p.stats_partial = static_cast<float*>(workspace);
  }
  cudaError_t err = run(p, a.act == Activation::relu, stats, stream);
  if (err != cudaSuccess || !stats) return err;
  conv2d_stats_reduce_kernel<<<dim3(static_cast<unsigned>(p.n), 2), 256, 0, stream>>>(p.stats_partial, stats_tiles,
                                                                                      p.n, a.stats,
                                                                                      conv2d_stats_sq(a));
  return cudaGetLastError();
}

// Zeroes dx (a.x) at the pixels of the stride phases with no tap: conv2d_zero_phases_kernel, 16-byte stores where
// chunk_ready allows. taps_r = taps_s = 0 zeroes every pixel. Dilation 1 (the implicit rungs' backward_input).
template <typename U, typename T>
cudaError_t launch_zero_phases(const Conv2dArgs<T>& a, int64_t taps_r, int64_t taps_s, cudaStream_t stream) {
  const Conv2dShape& sh = a.shape;
  constexpr int64_t kPer = sizeof(U) / sizeof(T);  // elements per store; chunk-aligned strides where above 1
  const Tensor4<U> dx{reinterpret_cast<U*>(a.x.data), a.x.sn / kPer, kPer == 1 ? a.x.sc : 1, a.x.sh / kPer,
                      a.x.sw / kPer};
  const int64_t units = sh.c / kPer, pixels = sh.n * sh.h * sh.w;
  int lanes = 1;  // threads per pixel: a power of two covering its stores, at most a warp
  while (lanes < units && lanes < 32) lanes *= 2;
  const dim3 block(lanes, 256 / lanes);
  conv2d_zero_phases_kernel<U><<<grid_for(pixels, static_cast<int>(block.y)), block, 0, stream>>>(
      dx, units, pixels, FastDivmod(static_cast<int>(sh.h * sh.w)), FastDivmod(static_cast<int>(sh.w)),
      FastDivmod(static_cast<int>(sh.stride_h)), FastDivmod(static_cast<int>(sh.stride_w)),
      static_cast<int>(sh.pad_h), static_cast<int>(sh.pad_w), static_cast<int>(taps_r), static_cast<int>(taps_s));
  return cudaGetLastError();
}

template <typename T>
cudaError_t zero_phases(const Conv2dArgs<T>& a, int64_t taps_r, int64_t taps_s, cudaStream_t stream) {
  using Element = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
  return chunk_ready(a.x, a.shape.c) ? launch_zero_phases<uint4>(a, taps_r, taps_s, stream)
                                     : launch_zero_phases<Element>(a, taps_r, taps_s, stream);
}

// backward_input as one GEMM per stride phase with taps, and one zero_phases launch for the phases without (none
// of them a GEMM with k = 0). One launch writes every phase's sub-kernel; then run(phases, count, stream) runs the
// phases' GEMMs: one launch each, or (implicit_tma) several phases in one persistent launch.
template <typename T, class Run>
cudaError_t backward_input_gemm(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace, Run&& run) {
  const Conv2dShape& sh = a.shape;
  if (sh.n == 0 || sh.c == 0 || sh.h == 0 || sh.w == 0) return cudaSuccess;
  if (sh.k == 0) return zero_phases(a, 0, 0, stream);  // no grad_output channels: dx = 0
  T* wp = static_cast<T*>(workspace);
  const Tensor4<const T> w{a.w.data, a.w.sn, a.w.sc, a.w.sh, a.w.sw};
  if (sh.r * sh.s > 0) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((sh.c + 31) / 32, 65535)),
                    static_cast<unsigned>(std::min<int64_t>((sh.k + 31) / 32, 65535)),
                    static_cast<unsigned>(std::min<int64_t>(sh.r * sh.s, 65535)));
    PhaseTapTable table{};
    if (sh.r * sh.s <= kPhaseTableTaps) {
      for (int64_t tap = 0; tap < sh.r * sh.s; ++tap) {
        phase_tap_place<T>(sh, tap, table.offset[tap], table.c_step[tap]);
        table.src[tap] = (tap / sh.s) * w.sh + (tap % sh.s) * w.sw;
      }
      conv2d_phase_weights_kernel<T, true><<<grid, dim3(32, 8), 0, stream>>>(w, sh, wp, table);
    } else {
      conv2d_phase_weights_kernel<T, false><<<grid, dim3(32, 8), 0, stream>>>(w, sh, wp, table);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  std::vector<FpropParams<T>> phases;
  bool tapless = false;  // some phase with pixels has no tap
  for (int ph = 0; ph < sh.stride_h; ++ph) {
    for (int pw = 0; pw < sh.stride_w; ++pw) {
      // Input pixels h = ph + stride_h i take the taps r = r0 + stride_h t (t < tr_count), from dy row
      // i + d_h - t; likewise along w.
      const int64_t hi = ph < sh.h ? (sh.h - ph + sh.stride_h - 1) / sh.stride_h : 0;
      const int64_t wi = pw < sh.w ? (sh.w - pw + sh.stride_w - 1) / sh.stride_w : 0;
      if (hi == 0 || wi == 0) continue;
      const int64_t r0 = phase_first_tap(ph, sh.pad_h, sh.stride_h), s0 = phase_first_tap(pw, sh.pad_w, sh.stride_w);
      const int64_t tr_count = phase_tap_count(r0, sh.r, sh.stride_h);
      const int64_t ts_count = phase_tap_count(s0, sh.s, sh.stride_w);
      const int64_t d_h = (ph + sh.pad_h - r0) / sh.stride_h, d_w = (pw + sh.pad_w - s0) / sh.stride_w;
      const int64_t taps = tr_count * ts_count;
      if (taps == 0) {
        tapless = true;
        continue;
      }
      FpropParams<T> p;
      p.m = static_cast<int>(sh.n * hi * wi);
      p.n = static_cast<int>(sh.c);
      p.k = static_cast<int>(taps * sh.k);
      p.g.pq = FastDivmod(static_cast<int>(hi * wi));
      p.g.q = FastDivmod(static_cast<int>(wi));
      p.g.c = FastDivmod(static_cast<int>(std::max<int64_t>(1, sh.k)));
      p.g.s = FastDivmod(static_cast<int>(std::max<int64_t>(1, ts_count)));
      p.g.x = a.y.data;  // dy, (n, p, q, k)
      p.g.x_sn = a.y.sn;
      p.g.x_sh = a.y.sh;
      p.g.x_sw = a.y.sw;
      p.g.h = static_cast<int>(sh.p);
      p.g.w = static_cast<int>(sh.q);
      p.g.pad_h = static_cast<int>(tr_count - 1 - d_h);  // dy row i - pad_h + t = i + d_h - (tr_count - 1 - t)
      p.g.pad_w = static_cast<int>(ts_count - 1 - d_w);
      p.wt = wp + phase_weight_offset<T>(sh, ph, pw);
      p.w_lead = taps * sh.k;
      p.y = a.x.data + ph * a.x.sh + pw * a.x.sw;  // dx at the phase's pixels
      p.y_sn = a.x.sn;
      p.y_sh = a.x.sh * sh.stride_h;
      p.y_sw = a.x.sw * sh.stride_w;
      p.vec_store = aligned_to(p.y, 4 * sizeof(T)) && p.y_sn % 4 == 0 && p.y_sh % 4 == 0 && p.y_sw % 4 == 0;
      phases.push_back(p);
    }
  }
  if (!phases.empty()) {
    const cudaError_t err = run(phases.data(), static_cast<int>(phases.size()), stream);
    if (err != cudaSuccess) return err;
  }
  return tapless ? zero_phases(a, sh.r, sh.s, stream) : cudaSuccess;
}

// A GEMM launcher of one phase turned into the phases' launcher backward_input_gemm calls: one launch per phase.
template <typename T, class Run>
auto each_phase(Run run) {
  return [run](const FpropParams<T>* phases, int count, cudaStream_t stream) {
    for (int i = 0; i < count; ++i) {
      const cudaError_t err = run(phases[i], false, false, stream);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  };
}

// The byte strides TMA reads an NHWC-ordered tensor of n x h x w x c elements with: each at most 2^40, a multiple
// of 16 and nesting (a dimension's stride spans the one inside it); a dimension of size 1 takes the nested stride.
// False where the tensor's strides cannot be written so.
template <typename T>
bool tma_strides(int64_t c, int64_t w, int64_t h, int64_t n, int64_t sw, int64_t sh, int64_t sn,
                 cuuint64_t (&out)[3]) {
  constexpr int64_t es = sizeof(T);
  const int64_t sizes[3] = {w, h, n}, strides[3] = {sw, sh, sn};
  int64_t span = c * es;  // bytes the dimension's stride must span
  for (int i = 0; i < 3; ++i) {
    const int64_t b = sizes[i] <= 1 ? (span + 15) / 16 * 16 : strides[i] * es;
    if (b < span || b % 16 != 0 || b >= (int64_t{1} << 40)) return false;
    out[i] = static_cast<cuuint64_t>(b);
    span = b * std::max<int64_t>(sizes[i], 1);
  }
  return true;
}

// A 4-D TMA map of an NHWC-ordered tensor (n images of h x w pixels of c channels, strides in elements) read in
// 128-byte-swizzled boxes of {64 channels, box_w columns, box_h rows, box_n images}, stepping `step_w` columns and
// `step_h` rows (the convolution's stride): each box lands as box_n box_h box_w rows of 128 bytes, zero-filled where
// it leaves the tensor. False where TMA cannot read the tensor so.
template <typename T>
bool encode_nhwc_map(CUtensorMap& map, const T* base, int64_t c, int64_t w, int64_t h, int64_t n, int64_t sw,
                     int64_t sh, int64_t sn, int box_w, int box_h, int box_n, int step_w, int step_h) {
  auto encode = sm90::encode_tiled_fn();
  cuuint64_t strides[3];
  if (encode == nullptr || !tma_strides<T>(c, w, h, n, sw, sh, sn, strides)) return false;
  if (box_w * step_w > 256 || box_h * step_h > 256 || box_n > 256 || step_w > 8 || step_h > 8) return false;
  const cuuint64_t dims[4] = {cuuint64_t(c), cuuint64_t(w), cuuint64_t(h), cuuint64_t(n)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_w * step_w), cuuint32_t(box_h * step_h), cuuint32_t(box_n)};
  const cuuint32_t steps[4] = {1, cuuint32_t(step_w), cuuint32_t(step_h), 1};
  return encode(&map, sm90::tma_dtype<T>(), 4, const_cast<T*>(base), dims, strides, box, steps,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// backward_input's workspace: the phases' sub-kernels, each 256-byte aligned (each tap belongs to one phase: K C R S
// elements in all).
template <typename T>
size_t backward_input_workspace_bytes(const Conv2dShape& sh) {
  return static_cast<size_t>(phase_weight_offset<T>(sh, sh.stride_h, 0)) * sizeof(T);
}

}  // namespace
}  // namespace torchext::cuda_ops
