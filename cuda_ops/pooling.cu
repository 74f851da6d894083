// Pooling kernels (cuda_ops/pooling.cuh): max_pool2d, avg_pool2d and adaptive_avg_pool2d, forward and backward.
//
//   x (N, C, H, W) -> y (N, C, OH, OW); max also writes indices (ih W + iw, int64). Per output, over its window
//   (cuda_ops/pooling_args.h):
//     max       y = the first largest element, NaN winning (`v > best || isnan(v)` from -inf, torch's rule)
//     avg       y = sum / avg_divisor (divisor_override, or the window counted with or without the padding)
//     adaptive  y = sum / window size
//   backward, per input element, in (oh, ow) order over the outputs whose window spans it (rows_covering):
//     max       dx = sum of dy where indices == ih W + iw
//     avg       dx = sum of dy / divisor
// Versions (each launcher runs pool2d_choice's):
//   *_strided_kernel      one thread per written element, numbered along its memory order (c fastest in NHWC,
//                         w fastest in NCHW); reads through strides: any layout, any C.
//   *_nhwc_vec_kernel     one thread per (pixel, V channels): V-wide 16-byte loads and stores (V int64 indices as
//                         V / 2 16-byte stores), accumulators in registers.
//   global_avg_pool_nhwc_kernel / global_avg_pool_nchw_kernel: the 1 x 1 adaptive pool (see pooling.cuh).
//
// Napkin math (benchmarks/bench_pooling.py reports GB/s against it), bytes of element size s per pass:
//   max forward     read x + write y + write 8-byte indices  = N C (H W s + OH OW (s + 8))
//   max backward    read dy + indices, write dx               = N C (OH OW (s + 8) + H W s)
//   avg / adaptive  read x, write y (forward); read dy, write dx (backward)
// ResNet-18's stem pool (128 x 64 x 112 x 112 -> 56 x 56, bf16) moves 205 + 51 + 205 MB forward: the indices cost
// as much as the input. A gather backward reads each dy / index a few times (3x3 stride 2: up to 4 windows cover an
// element, 2.25 on average), from L2 after the first.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "common.cuh"
#include "pooling.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 0x7fffffff;

unsigned grid_of(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxGrid ? kMaxGrid : blocks);
}

__device__ __forceinline__ int64_t offset_of(const Strides4& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * s.n + c * s.c + h * s.h + w * s.w;
}

// The sizes and options in the index type I: int32_t where every element count and product of the window arithmetic
// fits (pool2d_fits_32bit), else int64_t. Coordinates and divisions are in I; memory offsets always in int64_t.
template <typename I>
struct Dims {
  I n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};
template <typename I>
Dims<I> dims_of(const Pool2dGeometry& g) {
  return {static_cast<I>(g.n),  static_cast<I>(g.c),  static_cast<I>(g.h),  static_cast<I>(g.w),  static_cast<I>(g.oh),
          static_cast<I>(g.ow), static_cast<I>(g.kh), static_cast<I>(g.kw), static_cast<I>(g.sh), static_cast<I>(g.sw),
          static_cast<I>(g.ph), static_cast<I>(g.pw), static_cast<I>(g.dh), static_cast<I>(g.dw)};
}

// (n, c, h, w) of element i of a (N, C, H, W) tensor numbered channels-fastest (NHWC) or width-fastest (NCHW).
template <typename I>
struct Pos {
  I n, c, h, w;
};
template <typename I>
__device__ __forceinline__ Pos<I> position(I i, I c, I h, I w, bool nhwc) {
  Pos<I> p;
  if (nhwc) {
    p.c = i % c;
    i /= c;
    p.w = i % w;
    i /= w;
    p.h = i % h;
    p.n = i / h;
  } else {
    p.w = i % w;
    i /= w;
    p.h = i % h;
    i /= h;
    p.c = i % c;
    p.n = i / c;
  }
  return p;
}

// Grid-stride loop over [0, total): the counter is 64-bit, each index is handed out in I.
#define TORCHEXT_POOL_LOOP(i, total)                                                      \
  for (int64_t i##_64 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i##_64 < (total); \
       i##_64 += int64_t(gridDim.x) * blockDim.x)                                         \
    if (const I i = static_cast<I>(i##_64); true)

// Whether threads should be numbered channels-fastest for a written tensor with these strides.
bool channels_fastest(const Strides4& s) { return s.c < s.w; }

template <typename A>
__device__ __forceinline__ bool takes_max(A v, A best) {
  return v > best || isnan(v);
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

// V int64 indices as V / 2 16-byte accesses (V is 2, 4 or 8).
template <int V>
__device__ __forceinline__ void store_indices(int64_t* p, const int64_t (&w)[V]) {
#pragma unroll
  for (int j = 0; j < V / 2; ++j) reinterpret_cast<Vec<int64_t, 2>*>(p)[j] = Vec<int64_t, 2>{{w[2 * j], w[2 * j + 1]}};
}
template <int V>
__device__ __forceinline__ void load_indices(const int64_t* p, int64_t (&w)[V]) {
#pragma unroll
  for (int j = 0; j < V / 2; ++j) {
    const Vec<int64_t, 2> v = reinterpret_cast<const Vec<int64_t, 2>*>(p)[j];
    w[2 * j] = v.v[0];
    w[2 * j + 1] = v.v[1];
  }
}

// The windows of avg_pool2d and adaptive_avg_pool2d, for the kernels they share.
template <typename I>
struct AvgWindows {
  Dims<I> d;
  Pool2dGeometry g;  // count_include_pad, divisor_override
  __device__ PoolRange<I> rows(I oh) const {
    I size;
    return avg_window<I>(oh, d.h, d.kh, d.sh, d.ph, &size);
  }
  __device__ PoolRange<I> cols(I ow) const {
    I size;
    return avg_window<I>(ow, d.w, d.kw, d.sw, d.pw, &size);
  }
  __device__ I divisor(I oh, I ow) const {
    if (g.divisor_override != 0) return static_cast<I>(g.divisor_override);
    I size_h, size_w;
    const PoolRange<I> rh = avg_window<I>(oh, d.h, d.kh, d.sh, d.ph, &size_h);
    const PoolRange<I> rw = avg_window<I>(ow, d.w, d.kw, d.sw, d.pw, &size_w);
    return g.count_include_pad ? size_h * size_w : (rh.end - rh.begin) * (rw.end - rw.begin);
  }
  __device__ PoolRange<I> rows_covering(I ih) const {
    return cuda_ops::rows_covering<I>(ih, d.oh, d.kh, d.sh, d.ph, 1);
  }
  __device__ PoolRange<I> cols_covering(I iw) const {
    return cuda_ops::rows_covering<I>(iw, d.ow, d.kw, d.sw, d.pw, 1);
  }
};

template <typename I>
struct AdaptiveWindows {
  Dims<I> d;
  __device__ PoolRange<I> rows(I oh) const { return adaptive_window<I>(oh, d.h, d.oh); }
  __device__ PoolRange<I> cols(I ow) const { return adaptive_window<I>(ow, d.w, d.ow); }
  __device__ I divisor(I oh, I ow) const {
    const PoolRange<I> rh = rows(oh), rw = cols(ow);
    return (rh.end - rh.begin) * (rw.end - rw.begin);
  }
  __device__ PoolRange<I> rows_covering(I ih) const { return adaptive_rows_covering<I>(ih, d.h, d.oh); }
  __device__ PoolRange<I> cols_covering(I iw) const { return adaptive_rows_covering<I>(iw, d.w, d.ow); }
};

// --- max_pool2d ---------------------------------------------------------------------------------------------------

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_forward_strided_kernel(const Dims<I> d, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                                      int64_t* __restrict__ indices, const Strides4 ys, bool nhwc) {
  using A = acc_t<T>;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.c * d.oh * d.ow) {
    const Pos<I> o = position<I>(i, d.c, d.oh, d.ow, nhwc);
    const PoolRange<I> rh = max_window<I>(o.h, d.h, d.kh, d.sh, d.ph, d.dh);
    const PoolRange<I> rw = max_window<I>(o.w, d.w, d.kw, d.sw, d.pw, d.dw);
    const T* px = x + o.n * xs.n + o.c * xs.c;
    A best = -std::numeric_limits<A>::infinity();
    int64_t where = int64_t(rh.begin) * d.w + rw.begin;
    for (I ih = rh.begin; ih < rh.end; ih += d.dh) {
      for (I iw = rw.begin; iw < rw.end; iw += d.dw) {
        const A v = to_acc(px[ih * xs.h + iw * xs.w]);
        if (takes_max(v, best)) {
          best = v;
          where = int64_t(ih) * d.w + iw;
        }
      }
    }
    const int64_t out = offset_of(ys, o.n, o.c, o.h, o.w);
    y[out] = from_acc<T>(best);
    indices[out] = where;
  }
}

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_forward_nhwc_vec_kernel(const Dims<I> d, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                                       int64_t* __restrict__ indices, const Strides4 ys) {
  using A = acc_t<T>;
  const I cv = d.c / V;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.oh * d.ow * cv) {
    const Pos<I> o = position<I>(i, cv, d.oh, d.ow, true);
    const int64_t c0 = int64_t(o.c) * V;
    const PoolRange<I> rh = max_window<I>(o.h, d.h, d.kh, d.sh, d.ph, d.dh);
    const PoolRange<I> rw = max_window<I>(o.w, d.w, d.kw, d.sw, d.pw, d.dw);
    const T* px = x + o.n * xs.n + c0;
    A best[V];
    int64_t where[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      best[j] = -std::numeric_limits<A>::infinity();
      where[j] = int64_t(rh.begin) * d.w + rw.begin;
    }
    for (I ih = rh.begin; ih < rh.end; ih += d.dh) {
      for (I iw = rw.begin; iw < rw.end; iw += d.dw) {
        const Vec<T, V> v = load_vec<T, V>(px + ih * xs.h + iw * xs.w);
        const int64_t pos = int64_t(ih) * d.w + iw;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const A a = to_acc(v.v[j]);
          if (takes_max(a, best[j])) {
            best[j] = a;
            where[j] = pos;
          }
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(best[j]);
    const int64_t off = offset_of(ys, o.n, c0, o.h, o.w);
    *reinterpret_cast<Vec<T, V>*>(y + off) = out;
    store_indices<V>(indices + off, where);
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_backward_strided_kernel(const Dims<I> d, const T* __restrict__ dy, const Strides4 dys,
                                       const int64_t* __restrict__ indices, const Strides4 is, T* __restrict__ dx,
                                       const Strides4 dxs, bool nhwc) {
  using A = acc_t<T>;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.c * d.h * d.w) {
    const Pos<I> p = position<I>(i, d.c, d.h, d.w, nhwc);
    const PoolRange<I> rh = rows_covering<I>(p.h, d.oh, d.kh, d.sh, d.ph, d.dh);
    const PoolRange<I> rw = rows_covering<I>(p.w, d.ow, d.kw, d.sw, d.pw, d.dw);
    const int64_t pos = int64_t(p.h) * d.w + p.w;
    const T* pg = dy + p.n * dys.n + p.c * dys.c;
    const int64_t* pi = indices + p.n * is.n + p.c * is.c;
    A acc = 0;
    for (I oh = rh.begin; oh < rh.end; ++oh) {
      for (I ow = rw.begin; ow < rw.end; ++ow) {
        if (pi[oh * is.h + ow * is.w] == pos) acc += to_acc(pg[oh * dys.h + ow * dys.w]);
      }
    }
    dx[offset_of(dxs, p.n, p.c, p.h, p.w)] = from_acc<T>(acc);
  }
}

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_backward_nhwc_vec_kernel(const Dims<I> d, const T* __restrict__ dy, const Strides4 dys,
                                        const int64_t* __restrict__ indices, const Strides4 is, T* __restrict__ dx,
                                        const Strides4 dxs) {
  using A = acc_t<T>;
  const I cv = d.c / V;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.h * d.w * cv) {
    const Pos<I> p = position<I>(i, cv, d.h, d.w, true);
    const int64_t c0 = int64_t(p.c) * V;
    const PoolRange<I> rh = rows_covering<I>(p.h, d.oh, d.kh, d.sh, d.ph, d.dh);
    const PoolRange<I> rw = rows_covering<I>(p.w, d.ow, d.kw, d.sw, d.pw, d.dw);
    const int64_t pos = int64_t(p.h) * d.w + p.w;
    A acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0;
    for (I oh = rh.begin; oh < rh.end; ++oh) {
      for (I ow = rw.begin; ow < rw.end; ++ow) {
        int64_t where[V];
        load_indices<V>(indices + offset_of(is, p.n, c0, oh, ow), where);
        const Vec<T, V> gv = load_vec<T, V>(dy + offset_of(dys, p.n, c0, oh, ow));
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (where[j] == pos) acc[j] += to_acc(gv.v[j]);
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(acc[j]);
    *reinterpret_cast<Vec<T, V>*>(dx + offset_of(dxs, p.n, c0, p.h, p.w)) = out;
  }
}

// --- avg_pool2d and adaptive_avg_pool2d ---------------------------------------------------------------------------

template <typename T, typename I, typename Windows>
__global__ void __launch_bounds__(kThreads)
    avg_forward_strided_kernel(const Windows win, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                               const Strides4 ys, bool nhwc) {
  using A = acc_t<T>;
  const Dims<I>& d = win.d;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.c * d.oh * d.ow) {
    const Pos<I> o = position<I>(i, d.c, d.oh, d.ow, nhwc);
    const PoolRange<I> rh = win.rows(o.h), rw = win.cols(o.w);
    const T* px = x + o.n * xs.n + o.c * xs.c;
    A sum = 0;
    for (I ih = rh.begin; ih < rh.end; ++ih) {
      for (I iw = rw.begin; iw < rw.end; ++iw) sum += to_acc(px[ih * xs.h + iw * xs.w]);
    }
    y[offset_of(ys, o.n, o.c, o.h, o.w)] = from_acc<T>(sum / static_cast<A>(win.divisor(o.h, o.w)));
  }
}

template <typename T, int V, typename I, typename Windows>
__global__ void __launch_bounds__(kThreads)
    avg_forward_nhwc_vec_kernel(const Windows win, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                                const Strides4 ys) {
  using A = acc_t<T>;
  const Dims<I>& d = win.d;
  const I cv = d.c / V;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.oh * d.ow * cv) {
    const Pos<I> o = position<I>(i, cv, d.oh, d.ow, true);
    const int64_t c0 = int64_t(o.c) * V;
    const PoolRange<I> rh = win.rows(o.h), rw = win.cols(o.w);
    const T* px = x + o.n * xs.n + c0;
    A sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = 0;
    for (I ih = rh.begin; ih < rh.end; ++ih) {
      for (I iw = rw.begin; iw < rw.end; ++iw) {
        const Vec<T, V> v = load_vec<T, V>(px + ih * xs.h + iw * xs.w);
#pragma unroll
        for (int j = 0; j < V; ++j) sum[j] += to_acc(v.v[j]);
      }
    }
    const A div = static_cast<A>(win.divisor(o.h, o.w));
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(sum[j] / div);
    *reinterpret_cast<Vec<T, V>*>(y + offset_of(ys, o.n, c0, o.h, o.w)) = out;
  }
}

template <typename T, typename I, typename Windows>
__global__ void __launch_bounds__(kThreads)
    avg_backward_strided_kernel(const Windows win, const T* __restrict__ dy, const Strides4 dys, T* __restrict__ dx,
                                const Strides4 dxs, bool nhwc) {
  using A = acc_t<T>;
  const Dims<I>& d = win.d;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.c * d.h * d.w) {
    const Pos<I> p = position<I>(i, d.c, d.h, d.w, nhwc);
    const PoolRange<I> rh = win.rows_covering(p.h), rw = win.cols_covering(p.w);
    const T* pg = dy + p.n * dys.n + p.c * dys.c;
    A acc = 0;
    for (I oh = rh.begin; oh < rh.end; ++oh) {
      for (I ow = rw.begin; ow < rw.end; ++ow) {
        acc += to_acc(pg[oh * dys.h + ow * dys.w]) / static_cast<A>(win.divisor(oh, ow));
      }
    }
    dx[offset_of(dxs, p.n, p.c, p.h, p.w)] = from_acc<T>(acc);
  }
}

template <typename T, int V, typename I, typename Windows>
__global__ void __launch_bounds__(kThreads)
    avg_backward_nhwc_vec_kernel(const Windows win, const T* __restrict__ dy, const Strides4 dys, T* __restrict__ dx,
                                 const Strides4 dxs) {
  using A = acc_t<T>;
  const Dims<I>& d = win.d;
  const I cv = d.c / V;
  TORCHEXT_POOL_LOOP(i, int64_t(d.n) * d.h * d.w * cv) {
    const Pos<I> p = position<I>(i, cv, d.h, d.w, true);
    const int64_t c0 = int64_t(p.c) * V;
    const PoolRange<I> rh = win.rows_covering(p.h), rw = win.cols_covering(p.w);
    A acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0;
    for (I oh = rh.begin; oh < rh.end; ++oh) {
      for (I ow = rw.begin; ow < rw.end; ++ow) {
        const Vec<T, V> gv = load_vec<T, V>(dy + offset_of(dys, p.n, c0, oh, ow));
        const A div = static_cast<A>(win.divisor(oh, ow));
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += to_acc(gv.v[j]) / div;
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(acc[j]);
    *reinterpret_cast<Vec<T, V>*>(dx + offset_of(dxs, p.n, c0, p.h, p.w)) = out;
  }
}

// --- the global pool (adaptive_avg_pool2d to 1 x 1) ---------------------------------------------------------------

// Block (lanes, 256 / lanes): lane x owns channel vector chunk * lanes + x of image n = blockIdx.x / chunks, row y sums
// pixels y, y + rows, ... (walking h and w, no division); then thread (x, 0) adds the rows' partial sums in order
// 0, 1, ... (shared memory).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    global_avg_pool_nhwc_kernel(const Pool2dGeometry g, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                                const Strides4 ys, int64_t chunks) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  A* partial = reinterpret_cast<A*>(smem);
  const int64_t n = blockIdx.x / chunks, v = blockIdx.x % chunks * blockDim.x + threadIdx.x;
  const bool active = v < g.c / V;
  A sum[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum[j] = 0;
  if (active) {
    const T* px = x + n * xs.n + v * V;
    // Pixel p = ih W + iw for p = threadIdx.y, threadIdx.y + rows, ...: (ih, iw) advanced by rows each step.
    const int64_t rows = blockDim.y, step_h = rows / g.w, step_w = rows % g.w;
    int64_t ih = threadIdx.y / g.w, iw = threadIdx.y % g.w;
    for (; ih < g.h; ih += step_h, iw += step_w) {
      if (iw >= g.w) {
        iw -= g.w;
        ++ih;
        if (ih >= g.h) break;
      }
      const Vec<T, V> val = load_vec<T, V>(px + ih * xs.h + iw * xs.w);
#pragma unroll
      for (int j = 0; j < V; ++j) sum[j] += to_acc(val.v[j]);
    }
  }
  A* mine = partial + (threadIdx.y * blockDim.x + threadIdx.x) * V;
#pragma unroll
  for (int j = 0; j < V; ++j) mine[j] = sum[j];
  __syncthreads();
  if (threadIdx.y != 0 || !active) return;
  for (unsigned r = 1; r < blockDim.y; ++r) {
    const A* row = partial + (r * blockDim.x + threadIdx.x) * V;
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] += row[j];
  }
  const A count = static_cast<A>(g.h * g.w);
  Vec<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = from_acc<T>(sum[j] / count);
  *reinterpret_cast<Vec<T, V>*>(y + n * ys.n + v * V) = out;
}

// A group of `width` lanes (a power of two, at most 32) per contiguous (H, W) plane; every lane of the warp reaches
// the butterfly sum (the loop bound is the same for the whole block).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    global_avg_pool_nchw_kernel(const Pool2dGeometry g, const T* __restrict__ x, const Strides4 xs, T* __restrict__ y,
                                const Strides4 ys, int width) {
  using A = acc_t<T>;
  const int64_t planes = g.n * g.c, hw = g.h * g.w;
  const int per_block = kThreads / width, lane = threadIdx.x % width, group = threadIdx.x / width;
  for (int64_t base = int64_t(blockIdx.x) * per_block; base < planes; base += int64_t(gridDim.x) * per_block) {
    const int64_t plane = base + group;
    const int64_t n = plane / g.c, c = plane % g.c;
    A sum = 0;
    if (plane < planes) {
      const T* px = x + n * xs.n + c * xs.c;
      for (int64_t k = lane; k < hw; k += width) sum += to_acc(px[k]);
    }
    sum = warp_sum(sum, width);
    if (lane == 0 && plane < planes) y[n * ys.n + c * ys.c] = from_acc<T>(sum / static_cast<A>(hw));
  }
}

// --- choosing and launching ---------------------------------------------------------------------------------------

// nhwc_vec's conditions on one tensor of (N, C, h, w): channel stride 1, 16-byte aligned rows (the other strides
// multiples of V where their size is above 1) and pointer.
template <int V>
bool nhwc_vec_ok(const void* p, const Strides4& s, int64_t n, int64_t h, int64_t w) {
  return p != nullptr && aligned_to(p, 16) && s.c == 1 && (n <= 1 || s.n % V == 0) && (h <= 1 || s.h % V == 0) &&
         (w <= 1 || s.w % V == 0);
}

// Whether each (H, W) plane is contiguous (global_nchw).
bool planes_contiguous(const Strides4& s, int64_t h, int64_t w) { return (w <= 1 || s.w == 1) && (h <= 1 || s.h == w); }

bool is_forward(PoolOp op) {
  return op == PoolOp::max_forward || op == PoolOp::avg_forward || op == PoolOp::adaptive_forward;
}

}  // namespace

template <typename T>
PoolKernel pool2d_choice(PoolOp op, const Pool2dGeometry& g, const void* read, Strides4 rs, const void* aux,
                         Strides4 as, const void* written, Strides4 ws) {
  constexpr int V = kVec16<T>;
  const bool fwd = is_forward(op);
  const int64_t in_h = fwd ? g.h : g.oh, in_w = fwd ? g.w : g.ow, out_h = fwd ? g.oh : g.h, out_w = fwd ? g.ow : g.w;
  const bool vec_read = g.c % V == 0 && nhwc_vec_ok<V>(read, rs, g.n, in_h, in_w);
  if (op == PoolOp::adaptive_forward && g.oh == 1 && g.ow == 1) {
    if (vec_read && nhwc_vec_ok<V>(written, ws, g.n, 1, 1)) return PoolKernel::global_nhwc;
    if (planes_contiguous(rs, g.h, g.w)) return PoolKernel::global_nchw;
  }
  // The indices: written with y's strides (forward) or read (backward), in the tensor of output size.
  const bool vec_aux = aux == nullptr || nhwc_vec_ok<V>(aux, as, g.n, g.oh, g.ow);
  if (vec_read && vec_aux && nhwc_vec_ok<V>(written, ws, g.n, out_h, out_w)) return PoolKernel::nhwc_vec;
  return PoolKernel::strided;
}

namespace {

// Whether 32-bit coordinates suffice: every element count, and the products of the window arithmetic (o s + k d,
// (o + 1) in of the adaptive windows, a window's size, divisor_override) below 2^31.
bool pool2d_fits_32bit(const Pool2dGeometry& g) {
  constexpr int64_t limit = int64_t{1} << 31;
  const auto below = [&](int64_t v) { return v >= 0 && v < limit; };
  const int64_t span_h = g.oh * g.sh + g.kh * g.dh + g.h + 2 * g.ph,
                span_w = g.ow * g.sw + g.kw * g.dw + g.w + 2 * g.pw;
  return below(g.n * g.c * g.h * g.w) && below(g.n * g.c * g.oh * g.ow) && below((g.h + 1) * (g.oh + 1)) &&
         below((g.w + 1) * (g.ow + 1)) && below(span_h * span_w) && g.divisor_override > -limit &&
         g.divisor_override < limit;
}

// Runs f with the index type (int32_t or int64_t) as a type argument.
template <typename F>
cudaError_t with_index_type(const Pool2dGeometry& g, F&& f) {
  return pool2d_fits_32bit(g) ? f(int32_t{}) : f(int64_t{});
}

template <typename T, typename I>
cudaError_t max_forward_as(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, int64_t* indices, Strides4 ys,
                           cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const int64_t total = g.n * g.c * g.oh * g.ow;
  const Dims<I> d = dims_of<I>(g);
  if (pool2d_choice<T>(PoolOp::max_forward, g, x, xs, indices, ys, y, ys) == PoolKernel::nhwc_vec) {
    max_pool2d_forward_nhwc_vec_kernel<T, V, I><<<grid_of(total / V), kThreads, 0, stream>>>(d, x, xs, y, indices, ys);
  } else {
    max_pool2d_forward_strided_kernel<T, I>
        <<<grid_of(total), kThreads, 0, stream>>>(d, x, xs, y, indices, ys, channels_fastest(ys));
  }
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t max_backward_as(const Pool2dGeometry& g, const T* dy, Strides4 dys, const int64_t* indices, Strides4 is,
                            T* dx, Strides4 dxs, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const int64_t total = g.n * g.c * g.h * g.w;
  const Dims<I> d = dims_of<I>(g);
  if (pool2d_choice<T>(PoolOp::max_backward, g, dy, dys, indices, is, dx, dxs) == PoolKernel::nhwc_vec) {
    max_pool2d_backward_nhwc_vec_kernel<T, V, I>
        <<<grid_of(total / V), kThreads, 0, stream>>>(d, dy, dys, indices, is, dx, dxs);
  } else {
    max_pool2d_backward_strided_kernel<T, I>
        <<<grid_of(total), kThreads, 0, stream>>>(d, dy, dys, indices, is, dx, dxs, channels_fastest(dxs));
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t global_pool(PoolKernel kernel, const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, Strides4 ys,
                        cudaStream_t stream) {
  using A = acc_t<T>;
  constexpr int V = kVec16<T>;
  if (kernel == PoolKernel::global_nhwc) {
    const int64_t cv = g.c / V;
    const int lanes = cv >= 32 ? 32 : cv >= 16 ? 16 : cv >= 8 ? 8 : cv >= 4 ? 4 : cv >= 2 ? 2 : 1;
    const int64_t chunks = (cv + lanes - 1) / lanes;
    const dim3 block(lanes, kThreads / lanes);
    const size_t smem = size_t{kThreads} * V * sizeof(A);
    global_avg_pool_nhwc_kernel<T, V>
        <<<static_cast<unsigned>(g.n * chunks), block, smem, stream>>>(g, x, xs, y, ys, chunks);
  } else {
    const int64_t hw = g.h * g.w;
    const int width = hw >= 32 ? 32 : hw > 8 ? 16 : hw > 4 ? 8 : hw > 2 ? 4 : hw > 1 ? 2 : 1;
    const int64_t blocks = (g.n * g.c + kThreads / width - 1) / (kThreads / width);
    global_avg_pool_nchw_kernel<T>
        <<<static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid), kThreads, 0, stream>>>(g, x, xs, y, ys, width);
  }
  return cudaGetLastError();
}

template <typename T, typename I, typename Windows>
cudaError_t averages_forward_as(PoolOp op, const Windows& win, const Pool2dGeometry& g, const T* x, Strides4 xs, T* y,
                                Strides4 ys, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const int64_t total = g.n * g.c * g.oh * g.ow;
  PoolKernel kernel = pool2d_choice<T>(op, g, x, xs, nullptr, {}, y, ys);
  // global_nhwc's grid has one block per image and chunk of channels: beyond CUDA's limit, the strided version.
  if (kernel == PoolKernel::global_nhwc && g.n * ((g.c / V + 31) / 32) > kMaxGrid) kernel = PoolKernel::strided;
  switch (kernel) {
    case PoolKernel::global_nhwc:
    case PoolKernel::global_nchw:
      return global_pool<T>(kernel, g, x, xs, y, ys, stream);
    case PoolKernel::nhwc_vec:
      avg_forward_nhwc_vec_kernel<T, V, I, Windows><<<grid_of(total / V), kThreads, 0, stream>>>(win, x, xs, y, ys);
      break;
    default:
      avg_forward_strided_kernel<T, I, Windows>
          <<<grid_of(total), kThreads, 0, stream>>>(win, x, xs, y, ys, channels_fastest(ys));
  }
  return cudaGetLastError();
}

template <typename T, typename I, typename Windows>
cudaError_t averages_backward_as(PoolOp op, const Windows& win, const Pool2dGeometry& g, const T* dy, Strides4 dys,
                                 T* dx, Strides4 dxs, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  const int64_t total = g.n * g.c * g.h * g.w;
  if (pool2d_choice<T>(op, g, dy, dys, nullptr, {}, dx, dxs) == PoolKernel::nhwc_vec) {
    avg_backward_nhwc_vec_kernel<T, V, I, Windows><<<grid_of(total / V), kThreads, 0, stream>>>(win, dy, dys, dx, dxs);
  } else {
    avg_backward_strided_kernel<T, I, Windows>
        <<<grid_of(total), kThreads, 0, stream>>>(win, dy, dys, dx, dxs, channels_fastest(dxs));
  }
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t max_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, int64_t* indices, Strides4 ys,
                               cudaStream_t stream) {
  if (g.n * g.c * g.oh * g.ow == 0) return cudaSuccess;
  return with_index_type(
      g, [&](auto index) { return max_forward_as<T, decltype(index)>(g, x, xs, y, indices, ys, stream); });
}

template <typename T>
cudaError_t max_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, const int64_t* indices, Strides4 is,
                                T* dx, Strides4 dxs, cudaStream_t stream) {
  if (g.n * g.c * g.h * g.w == 0) return cudaSuccess;
  return with_index_type(
      g, [&](auto index) { return max_backward_as<T, decltype(index)>(g, dy, dys, indices, is, dx, dxs, stream); });
}

template <typename T>
cudaError_t avg_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, Strides4 ys,
                               cudaStream_t stream) {
  if (g.n * g.c * g.oh * g.ow == 0) return cudaSuccess;
  return with_index_type(g, [&](auto index) {
    using I = decltype(index);
    return averages_forward_as<T, I>(PoolOp::avg_forward, AvgWindows<I>{dims_of<I>(g), g}, g, x, xs, y, ys, stream);
  });
}

template <typename T>
cudaError_t avg_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, T* dx, Strides4 dxs,
                                cudaStream_t stream) {
  if (g.n * g.c * g.h * g.w == 0) return cudaSuccess;
  return with_index_type(g, [&](auto index) {
    using I = decltype(index);
    return averages_backward_as<T, I>(PoolOp::avg_backward, AvgWindows<I>{dims_of<I>(g), g}, g, dy, dys, dx, dxs,
                                      stream);
  });
}

template <typename T>
cudaError_t adaptive_avg_pool2d_forward(const Pool2dGeometry& g, const T* x, Strides4 xs, T* y, Strides4 ys,
                                        cudaStream_t stream) {
  if (g.n * g.c * g.oh * g.ow == 0) return cudaSuccess;
  return with_index_type(g, [&](auto index) {
    using I = decltype(index);
    return averages_forward_as<T, I>(PoolOp::adaptive_forward, AdaptiveWindows<I>{dims_of<I>(g)}, g, x, xs, y, ys,
                                     stream);
  });
}

template <typename T>
cudaError_t adaptive_avg_pool2d_backward(const Pool2dGeometry& g, const T* dy, Strides4 dys, T* dx, Strides4 dxs,
                                         cudaStream_t stream) {
  if (g.n * g.c * g.h * g.w == 0) return cudaSuccess;
  return with_index_type(g, [&](auto index) {
    using I = decltype(index);
    return averages_backward_as<T, I>(PoolOp::adaptive_backward, AdaptiveWindows<I>{dims_of<I>(g)}, g, dy, dys, dx, dxs,
                                      stream);
  });
}

#define TORCHEXT_INSTANTIATE_POOLING(T)                                                                                \
  template PoolKernel pool2d_choice<T>(PoolOp, const Pool2dGeometry&, const void*, Strides4, const void*, Strides4,    \
                                       const void*, Strides4);                                                         \
  template cudaError_t max_pool2d_forward<T>(const Pool2dGeometry&, const T*, Strides4, T*, int64_t*, Strides4,        \
                                             cudaStream_t);                                                            \
  template cudaError_t max_pool2d_backward<T>(const Pool2dGeometry&, const T*, Strides4, const int64_t*, Strides4, T*, \
                                              Strides4, cudaStream_t);                                                 \
  template cudaError_t avg_pool2d_forward<T>(const Pool2dGeometry&, const T*, Strides4, T*, Strides4, cudaStream_t);   \
  template cudaError_t avg_pool2d_backward<T>(const Pool2dGeometry&, const T*, Strides4, T*, Strides4, cudaStream_t);  \
  template cudaError_t adaptive_avg_pool2d_forward<T>(const Pool2dGeometry&, const T*, Strides4, T*, Strides4,         \
                                                      cudaStream_t);                                                   \
  template cudaError_t adaptive_avg_pool2d_backward<T>(const Pool2dGeometry&, const T*, Strides4, T*, Strides4,        \
                                                       cudaStream_t);

TORCHEXT_INSTANTIATE_POOLING(float)
TORCHEXT_INSTANTIATE_POOLING(double)
TORCHEXT_INSTANTIATE_POOLING(__half)
TORCHEXT_INSTANTIATE_POOLING(__nv_bfloat16)

}  // namespace torchext::cuda_ops
