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

// Rows begin, begin + step, ... below end.
struct PoolRange {
  int64_t begin, end;
};

// max_pool2d: the first row of output o's window inside the input and the end of its span (step d). torch's order:
// begin moves up by d until it is inside.
TORCHEXT_POOL_HD PoolRange max_window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t begin = o * s - p;
  const int64_t span_end = begin + (k - 1) * d + 1;
  if (begin < 0) begin += (-begin + d - 1) / d * d;
  return {begin, span_end < in ? span_end : in};
}

// avg_pool2d: output o's window clipped to the input, and `size`, its extent clipped only at in + p (what
// count_include_pad divides by).
TORCHEXT_POOL_HD PoolRange avg_window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p, int64_t* size) {
  const int64_t begin = o * s - p;
  int64_t end = begin + k;
  if (end > in + p) end = in + p;
  *size = end - begin;
  return {begin > 0 ? begin : 0, end < in ? end : in};
}

// avg_pool2d's divisor for output (oh, ow).
TORCHEXT_POOL_HD int64_t avg_divisor(const Pool2dGeometry& g, int64_t oh, int64_t ow) {
  if (g.divisor_override != 0) return g.divisor_override;
  int64_t size_h, size_w;
  const PoolRange rh = avg_window(oh, g.h, g.kh, g.sh, g.ph, &size_h);
  const PoolRange rw = avg_window(ow, g.w, g.kw, g.sw, g.pw, &size_w);
  return g.count_include_pad ? size_h * size_w : (rh.end - rh.begin) * (rw.end - rw.begin);
}

// adaptive_avg_pool2d: output o's window [floor(o in / out), ceil((o + 1) in / out)).
TORCHEXT_POOL_HD PoolRange adaptive_window(int64_t o, int64_t in, int64_t out) {
  return {o * in / out, ((o + 1) * in + out - 1) / out};
}

// The outputs [begin, end) whose max / avg window spans input row i (span d (k - 1) + 1).
TORCHEXT_POOL_HD PoolRange rows_covering(int64_t i, int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = d * (k - 1) + 1;
  const int64_t begin = i + p < span ? 0 : (i + p - span) / s + 1;
  const int64_t end = (i + p) / s + 1;
  return {begin, end < out ? end : out};
}

// The outputs [begin, end) whose adaptive window holds input row i (the inverse of adaptive_window).
TORCHEXT_POOL_HD PoolRange adaptive_rows_covering(int64_t i, int64_t in, int64_t out) {
  return {i * out / in, ((i + 1) * out + in - 1) / in};
}

}  // namespace torchext::cuda_ops
