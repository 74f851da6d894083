// The pooling kernels' arguments and window arithmetic, without CUDA headers: written once for the CPU kernels
// (csrc/pooling_cpu.cpp) and the CUDA kernels (cuda_ops/pooling.cu), so both visit the same windows in the same
// order.
//
//   x is the input (N, C, H, W), y the output (N, C, OH, OW). Along one dimension (rows; columns alike):
//   max_pool2d   window of output o: rows o s - p + i d (i < k) inside [0, H); -inf stands for the padding.
//   avg_pool2d   window of output o: rows [o s - p, o s - p + k) inside [0, H); the divisor is divisor_override,
//                or the window's size counting the padding but not what hangs past it (ceil_mode)
//                (count_include_pad), or the number of input elements in it.
//   adaptive     window of output o: rows [floor(o H / OH), ceil((o + 1) H / OH)), divided by its size.
// Backward gathers: input row i receives from the outputs whose window spans it, rows_covering(i) (every output o
// with o s - p <= i <= o s - p + d (k - 1)); max_pool2d's keeps those whose argmax is i.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TORCHEXT_POOL_HD __host__ __device__ __forceinline__
#else
#define TORCHEXT_POOL_HD inline
#endif

namespace torchext::cuda_ops {

// Element strides of a 4-D tensor in (n, c, h, w) order.
struct Strides4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

// Sizes and options of one pooling call. kh..dw are max_pool2d's and avg_pool2d's (dilation 1 for avg_pool2d);
// adaptive_avg_pool2d uses only n, c, h, w, oh, ow.
struct Pool2dGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t oh = 0, ow = 0;              // output
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  bool count_include_pad = true;  // avg_pool2d
  int64_t divisor_override = 0;   // avg_pool2d: 0 for none
};

// Rows begin, begin + step, ... below end. I is the index type: int64_t, or int32_t where the CUDA launchers know
// every product fits (cuda_ops/pooling.cu: 32-bit division is several times cheaper).
template <typename I = int64_t>
struct PoolRange {
  I begin, end;
};

// max_pool2d: the first row of output o's window inside the input and the end of its span (step d). torch's order:
// begin moves up by d until it is inside.
template <typename I>
TORCHEXT_POOL_HD PoolRange<I> max_window(I o, I in, I k, I s, I p, I d) {
  I begin = o * s - p;
  const I span_end = begin + (k - 1) * d + 1;
  if (begin < 0) begin += (-begin + d - 1) / d * d;
  return {begin, span_end < in ? span_end : in};
}

// avg_pool2d: output o's window clipped to the input, and `size`, its extent clipped only at in + p (what
// count_include_pad divides by).
template <typename I>
TORCHEXT_POOL_HD PoolRange<I> avg_window(I o, I in, I k, I s, I p, I* size) {
  const I begin = o * s - p;
  I end = begin + k;
  if (end > in + p) end = in + p;
  *size = end - begin;
  return {begin > 0 ? begin : I(0), end < in ? end : in};
}

// avg_pool2d's divisor for output (oh, ow).
template <typename I>
TORCHEXT_POOL_HD I avg_divisor(const Pool2dGeometry& g, I oh, I ow) {
  if (g.divisor_override != 0) return static_cast<I>(g.divisor_override);
  I size_h, size_w;
  const PoolRange<I> rh = avg_window<I>(oh, g.h, g.kh, g.sh, g.ph, &size_h);
  const PoolRange<I> rw = avg_window<I>(ow, g.w, g.kw, g.sw, g.pw, &size_w);
  return g.count_include_pad ? size_h * size_w : (rh.end - rh.begin) * (rw.end - rw.begin);
}

// adaptive_avg_pool2d: output o's window [floor(o in / out), ceil((o + 1) in / out)).
template <typename I>
TORCHEXT_POOL_HD PoolRange<I> adaptive_window(I o, I in, I out) {
  return {o * in / out, ((o + 1) * in + out - 1) / out};
}

// The outputs [begin, end) whose max / avg window spans input row i (span d (k - 1) + 1).
template <typename I>
TORCHEXT_POOL_HD PoolRange<I> rows_covering(I i, I out, I k, I s, I p, I d) {
  const I span = d * (k - 1) + 1;
  const I begin = i + p < span ? I(0) : (i + p - span) / s + 1;
  const I end = (i + p) / s + 1;
  return {begin, end < out ? end : out};
}

// The outputs [begin, end) whose adaptive window holds input row i (the inverse of adaptive_window).
template <typename I>
TORCHEXT_POOL_HD PoolRange<I> adaptive_rows_covering(I i, I in, I out) {
  return {i * out / in, ((i + 1) * out + in - 1) / in};
}

}  // namespace torchext::cuda_ops
