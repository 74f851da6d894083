// Batch normalization kernels: the statistics reduction, the per-channel finalize, the normalize pass and the
// backward's reduction and elementwise pass. The math and shapes are in cuda_ops/batch_norm_args.h: x is (A, C, B),
// element (a, c, b) at (a C + c) B + b; rows x C (channels-last, B = 1) or planes (contiguous NCHW, B = H W).
//
// Passes and bytes, for E elements of s bytes (bf16: s = 2) and the mask's E / 8 bytes:
//   forward (training)  1. statistics: each block sums (x - k) and (x - k)^2 over its tile in acc_t (k: the channel's
//                          first element, a shift that keeps the sum of squares from cancelling) and writes one
//                          partial pair per (chunk, channel) to the workspace                         reads E s
//                       2. finalize: per channel, the chunks' partials added in fixed order in float64; mean, invstd,
//                          the running buffers' update (on the device), save_mean / save_invstd and the per-channel
//                          (mean, scale, shift) of the normalize pass                                   C-sized
//                       3. normalize: y = act((x - mean) scale + shift [+ residual]), mask  reads E s (+ E s), writes
//                                                                                            E s + E / 8
//   forward (eval)      finalize from the running statistics, then normalize.
//   forward with sums   (conv2d_stats' sum / sum_sq) finalize from them, then normalize: no statistics pass.
//   backward            1. reduction: sum dz, sum dz (x - mean) per (chunk, channel), dz = dy & mask
//                                                                                 reads 2 E s + E / 8
//                       2. finalize: grad_weight, grad_bias, and dx = k (dz - r - q (x - mean)) per channel  C-sized
//                       3. elementwise: dx and grad_residual (= dz)      reads 2 E s + E / 8, writes E s (+ E s)
// The minimum is one read of each input and one write of each output; the multi-pass kernels add one read of x in
// the forward and of x and dy in the backward. The elementwise passes walk the tensor in the reverse order of the
// reductions, so their first reads find the reductions' last data still in L2 (the whole tensor, when it fits).
//
// The ladder (one launcher; the op's variant= names):
//   simple      reductions: a block per (channel, chunk) reading element by element through the (A, C, B) index
//               (strided in rows x C); elementwise: one thread per 8 elements, the channel computed per element.
//               Any shape, any alignment.
//   vectorized  16-byte loads and stores. rows x C (C % 8 == 0): 2-D blocks, threadIdx.x over 8-channel units of a row
//               (the thread's channels' coefficients in registers) and threadIdx.y over rows, 4 rows in flight per
//               thread (8 in half types' forward statistics). The reductions: 264 long blocks per pass (2 per SM on
//               an H200 and H100) that sweep the tensor together (RowsTile::for_rows_swept), each block's rows
//               added in one step through shared memory (in row order). bfloat16 and float16 are held as raw
//               32-bit words (Words8). Written for occupancy, which is what keeps enough bytes in flight: 32-bit
//               offsets where the tensor allows, the residual a template parameter, registers capped for 2 blocks per
//               SM (3 for half types' normalize); the finalize's block is 4 channels x 64 rows of chunks. The
//               backward's elementwise pass reads cache-streaming (its inputs' last use; L2 kept for the rows it has
//               not reached) and stores plainly (its outputs stay in L2 for their next reader). planes (B % 8 == 0): 8
//               elements of one plane per load, one channel per unit.
//   fused       vectorized's arguments; on rows x C its own kernels (the rest runs vectorized's). The finalize folded
//               into the reductions: each block writes its partial sums, and the last block of each group of 32
//               chunks (then the last group) adds them in chunk (group) order, found with integer counters zeroed by a
//               memset: no finalize launch and no single-block finalize looping over ~1000 chunks. Each thread holds
//               256 bytes of its unit's rows (16 rows of bf16). Each direction runs as ONE cooperative launch when
//               its grid fits on the GPU at once (256x8x8 and 512x4x4 bf16 at batch 512 on an H100): the training
//               forward keeps its rows in shared memory between the statistics and the normalize (x read once,
//               2 E s + E / 8 in all), the backward reads its tile again (from L2); else, and under graph capture, as
//               two launches (reduce + apply) with the same plan and code, hence the same bits. Each direction:
//               memset + 1 or 2 kernels.
// Determinism: every sum has a fixed order that depends on the shape only (chunk counts included, never on the GPU's
// multiprocessor count), no float atomics: the same bits on every run and every GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "batch_norm.cuh"
#include "batch_norm_math.h"
#include "common.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int kUnit = 8;                 // elements per mask byte, per vector unit
constexpr int kIlp = 4;                  // units in flight per thread (flat and planes kernels)
constexpr int64_t kTargetBlocks = 1024;  // planes reduction blocks per pass: a full wave on 132 SMs at 8 blocks each
// rows x C kernels (benchmarks/batch_norm_check.cu sweeps these on the GPU; H200 figures in docs/batch_norm.md):
// rows in flight per thread (the reductions' forward and backward, the elementwise passes), the blocks per
// multiprocessor their registers are capped for, and the reduction's blocks per pass. The reductions sweep the
// tensor with all blocks together (RowsTile::for_rows_swept): at 512x64x32x32 bf16 on an H200 the forward statistics
// took 27-29 us from 264 to 1056 blocks at 4 rows a group (27-30 at 8), where each block's own contiguous chunk took
// 31 at 264 and 41 at 1056 (CUDA events). 264: a constant, never the GPU's SM count, so the sums' order and bits are
// the same on every GPU. Half types' forward reads 8 rows at a time there (26.7 us against 28.7 at 4; the backward's 8
// spill); float and double keep 4 (not measured at 8).
constexpr int kReduceIlpBwd = 4, kElemIlp = 4;
template <typename T>
constexpr int kReduceIlpFwd = sizeof(T) == 2 ? 8 : 4;
template <typename T>
constexpr int kRowsMinBlocks = sizeof(T) == 8 ? 1 : 2;  // double's 64-byte units would spill at 2
template <typename T>
constexpr int kNormalizeMinBlocks = sizeof(T) == 2 ? 3 : kRowsMinBlocks<T>;  // half types: 84 registers fit in 80
constexpr int64_t kRowsReduceBlocks = 264;
constexpr int64_t kMinItemsPerThread = 4;
constexpr int kFinalizeCols = 4, kFinalizeRows = 64;  // 32 x 8 took 22 us for 1024 chunks, 4 x 64 7.5 (H200)
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 0x7fffffff;

// --- conversions ---------------------------------------------------------------------------------------------------

__device__ __forceinline__ double to_double(float v) { return v; }
__device__ __forceinline__ double to_double(double v) { return v; }
__device__ __forceinline__ double to_double(__half v) { return __half2float(v); }
__device__ __forceinline__ double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename P>
__device__ __forceinline__ P from_double(double v);
template <>
__device__ __forceinline__ float from_double<float>(double v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ double from_double<double>(double v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_double<__half>(double v) {
  return __double2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}

// 8 consecutive elements (16-byte aligned) as 16-byte vectors.
template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, T (&out)[kUnit]) {
  constexpr int V = kVec16<T>;
#pragma unroll
  for (int i = 0; i < kUnit / V; ++i) {
    const Vec<T, V> v = reinterpret_cast<const Vec<T, V>*>(p)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) out[i * V + j] = v.v[j];
  }
}

template <typename T>
__device__ __forceinline__ void store8(T* __restrict__ p, const T (&in)[kUnit]) {
  constexpr int V = kVec16<T>;
#pragma unroll
  for (int i = 0; i < kUnit / V; ++i) {
    Vec<T, V> v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = in[i * V + j];
    reinterpret_cast<Vec<T, V>*>(p)[i] = v;
  }
}

// 8 elements of a 2-byte type (bfloat16, float16) as their four 32-bit words, widened to float where they are used
// and narrowed back into words: the rows kernels' form for those types (float32 and float64 keep element arrays). For
// bfloat16 the widening is a shift or a mask of the element's word (exact: a bfloat16 is a float's upper half) and the
// narrowing packs two floats with one instruction; through __nv_bfloat16 values ptxas spent a byte permute and a
// multiply on each element's widening and a permute on each narrowing (SASS, sm_90). The relu mask is applied to the
// words (`masked`): a clear bit zeroes its element's 16 bits, the +0 the gradient gets there, and a set bit keeps
// grad_out's bits as they are (torch's threshold_backward; the other rungs go through float, which keeps every value
// but not necessarily a NaN's payload). On an H200 (bf16, batch 512, CUDA events, L2 flushed, builds alternated twice,
// the same bits: benchmarks/results/batch_norm_check_words_h200.txt) each backward took 0.9-1.6 us less at the two
// large shapes (BN + ReLU at 128x16x16: 54.9 -> 53.3-53.5 us) and within 0.4 us either way at the small ones: the
// gain is the reduction's, as the elementwise pass alone, after its reduction, ran 0.1-0.7 us slower (not tried with
// element arrays in it: a lead). The normalize without the residual took up to 1.1 us less (one row 0.1 us more). The
// normalize with the residual ran 0.3-1.0 us slower at 128x16x16 and 256x8x8 after its reduction (faster with L2
// flushed at the large shapes), so it keeps element arrays, as float32 and float64 do: float32 in this form ran up to
// 6 us slower per direction (one form) and its forward 18 us slower (another). float16 takes bfloat16's form
// (widening by conversion), not measured.
template <typename T>
struct Words8 {
  static_assert(sizeof(T) == 2, "the words' form is for 2-byte types");
  uint32_t w[4];  // word p: elements 2 p (low half) and 2 p + 1 (high half)

  __device__ __forceinline__ void load(const T* __restrict__ p) { set(*reinterpret_cast<const uint4*>(p)); }
  // Cache-streaming (evict-first) loads: the backward elementwise pass's (load8_last below says why).
  __device__ __forceinline__ void load_last(const T* __restrict__ p) { set(__ldcs(reinterpret_cast<const uint4*>(p))); }
  __device__ __forceinline__ void store(T* __restrict__ p) const {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  __device__ __forceinline__ float get(int j) const {
    const uint32_t v = w[j / 2];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(j % 2 == 0 ? v << 16 : v & 0xffff0000u);
    T h;
    __builtin_memcpy(&h, reinterpret_cast<const char*>(w) + 2 * j, 2);
    return to_acc<T>(h);
  }
  // The words of f(0), ..., f(7) (floats, called in element order), rounded to T two at a time.
  template <typename F>
  __device__ __forceinline__ static Words8 of(F&& f) {
    Words8 out;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) v[h] = f(2 * p + h);
      out.put2(p, v[0], v[1]);
    }
    return out;
  }
  // Elements 2 p and 2 p + 1 from a and b, rounded to T (to nearest even, as from_acc).
  __device__ __forceinline__ void put2(int p, float a, float b) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
      __builtin_memcpy(&w[p], &h, 4);
    } else {
      const T h[2] = {from_acc<T>(a), from_acc<T>(b)};
      __builtin_memcpy(&w[p], h, 4);
    }
  }
  // The elements whose bit in `bits` is clear zeroed (bit j: element j). prmt's sign-replicating selectors (nibble 8 +
  // k: byte k's top bit, eight times) spread the bits into 16-bit masks, after bits 0-3 are moved to the tops of bytes
  // 0-3 of one word and bits 4-7 of another by one multiply each (shifts of 7, 14, 21 and 28: no two products
  // overlap): two elements a permute and an and.
  __device__ __forceinline__ Words8 masked(uint8_t bits) const {
    const uint32_t tops[2] = {(bits & 0xfu) * 0x10204080u, (uint32_t(bits) >> 4) * 0x10204080u};
    Words8 out;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t m;
      asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m) : "r"(tops[p / 2]), "r"(0u), "r"(p % 2 == 0 ? 0x9988u : 0xbbaau));
      out.w[p] = w[p] & m;
    }
    return out;
  }

 private:
  __device__ __forceinline__ void set(uint4 v) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
};

// The backward elementwise pass's loads: cache-streaming (evict first). Its reads of dy and x are their last uses;
// marked evict-first they leave L2 to the rows the reduction read and the pass has not reached yet, which it reads in
// reverse order (the reduction's last rows first). On an H200 the backward of BN + ReLU went from 106.4 to 99.4 us at
// 512x64x32x32 bf16 and from 61.9 to 55.6 at 512x128x16x16 with these loads and streaming stores (means of two rounds,
// L2 flushed before each, CUDA events; benchmarks/results/batch_norm_check_streaming_h200.txt). Its stores (dx,
// grad_residual) are plain: with the streaming loads, streaming stores no longer sped up the pass (98.4 against 97.9
// us, 55.4 against 54.7), and plain ones leave its outputs in L2 for the next reader: the backward followed by a read
// of dx took 117.5 -> 115.5 us and 64.4 -> 61.2 (benchmarks/results/batch_norm_check_stores_h200.txt). The forward's
// normalize keeps plain accesses: streaming reads gained nothing at the two large shapes, and streaming y stores left
// the bf16 forward no faster there, made float32's up to 6.8 us slower and a following read of y 0.8-1.2 us slower
// (batch_norm_check_normalize_h200.txt, docs/batch_norm.md).
template <typename T>
__device__ __forceinline__ void load8_last(const T* __restrict__ p, T (&out)[kUnit]) {
  static_assert(sizeof(out) % 16 == 0);
#pragma unroll
  for (int i = 0; i < int(sizeof(out) / 16); ++i) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p) + i);
    __builtin_memcpy(reinterpret_cast<char*>(out) + 16 * i, &v, 16);
  }
}

template <typename A>
__device__ __forceinline__ A relu_value(A v) {
  return math::relu_forward(v);
}

// --- plans: grids and chunks, functions of the shape only ----------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// rows x C with C % 8 == 0: block (bx, by), bx 8-channel units of a row, by rows; grid (col_blocks, chunks).
struct RowsPlan {
  int bx = 1, by = 1;
  int64_t col_blocks = 0, chunks = 0, rows_per_chunk = 0;
};

RowsPlan rows_plan(int64_t rows, int64_t c, bool reduction, int64_t target_blocks = kRowsReduceBlocks,
                   int64_t items = 0) {
  RowsPlan p;
  const int64_t units = c / kUnit;
  p.bx = 1;
  while (p.bx < units && p.bx < 32) p.bx *= 2;
  p.by = kThreads / p.bx;
  p.col_blocks = ceil_div(units, p.bx);
  if (rows <= 0 || units <= 0) return p;
  if (items <= 0) items = reduction ? kMinItemsPerThread : 2 * kIlp;
  const int64_t want = ceil_div(rows, p.by * items);
  const int64_t cap = reduction ? std::max<int64_t>(1, target_blocks / p.col_blocks) : kMaxGridY;
  p.chunks = clamp64(want, 1, cap);
  p.rows_per_chunk = ceil_div(rows, p.chunks);
  p.chunks = ceil_div(rows, p.rows_per_chunk);
  return p;
}

// A block per (channel, chunk) over the channel's items (8-element units when vectorized, else elements).
struct ChannelPlan {
  int64_t chunks = 0, items_per_chunk = 0;
};

ChannelPlan channel_plan(int64_t items, int64_t c) {
  ChannelPlan p;
  if (items <= 0 || c <= 0) return p;
  const int64_t cap = std::min<int64_t>(kMaxGridY, std::max<int64_t>(1, kTargetBlocks / c));
  p.chunks = clamp64(ceil_div(items, kThreads * kMinItemsPerThread), 1, cap);
  p.items_per_chunk = ceil_div(items, p.chunks);
  p.chunks = ceil_div(items, p.items_per_chunk);
  return p;
}

// Which kernels a call runs.
enum class Path { simple, rows, planes };

Path path_of(BatchNormKernel kernel, const BatchNormShape& s) {
  if (kernel == BatchNormKernel::simple) return Path::simple;
  return s.b == 1 ? Path::rows : Path::planes;
}

// Chunks of the reduction for this path (0: no reduction).
int64_t reduce_chunks(Path path, const BatchNormShape& s) {
  const int64_t n = s.a * s.b;
  if (n == 0 || s.c == 0) return 0;
  switch (path) {
    case Path::rows:
      return rows_plan(s.a, s.c, true).chunks;
    case Path::planes:
      return channel_plan(n / kUnit, s.c).chunks;
    default:
      return channel_plan(n, s.c).chunks;
  }
}

// --- reductions ----------------------------------------------------------------------------------------------------
// Forward (BWD false): s0 += x - k, s1 += (x - k)^2 with k = x[c B]. Backward: s0 += dz, s1 += dz (x - mean).
// partial[chunk C + c] holds s0, partial[(chunks + chunk) C + c] s1.

// One thread's rows in the rows x C kernels (grid (column blocks, chunks), block (bx, by)): unit u = column block bx
// + tx (channels c0 .. c0 + 7) of the rows ty, ty + by, ... of the chunk (for_rows: the elementwise passes) or of
// the block's slabs (for_rows_swept: the reductions). I: the index type (int32_t where the tensor fits, which saves
// registers: occupancy is what keeps enough loads in flight).
template <typename I>
struct RowsTile {
  I C, units, u, c0, r0, r1, stride, mstride;  // stride, mstride: elements and mask bytes between a thread's rows

  __device__ __forceinline__ RowsTile(I rows, I channels, I rows_per_chunk, I chunk)
      : C(channels),
        units(channels / kUnit),
        u(I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x)),
        c0(u * kUnit),
        r0(chunk * rows_per_chunk),
        r1(r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows),
        stride(I(blockDim.y) * channels),
        mstride(I(blockDim.y) * units) {}

  __device__ __forceinline__ bool active() const { return u < units; }

  // body(std::integral_constant<int, K>{}, e, m) over the thread's rows in order, N at a time and then the tail one
  // by one: e is the first row's element offset at channel c0, m its mask byte; the group's rows are stride
  // (mstride) apart.
  template <int N, typename Body>
  __device__ __forceinline__ void for_rows(Body&& body) const {
    const I by = I(blockDim.y);
    I row = r0 + I(threadIdx.y);
    I e = row * C + c0, m = row * units + u;
    for (; row + I(N - 1) * by < r1; row += I(N) * by, e += I(N) * stride, m += I(N) * mstride) {
      body(std::integral_constant<int, N>{}, e, m);
    }
    for (; row < r1; row += by, e += stride, m += mstride) body(std::integral_constant<int, 1>{}, e, m);
  }

  // The reductions' order: the rows in slabs of N x blockDim.y, slab s to chunk s % chunks, so that the blocks sweep
  // the tensor together from its first row to its last instead of each streaming its own contiguous chunk. On an H200
  // this read 2-5 us faster per pass at ResNet-18's shapes (benchmarks/results/batch_norm_check_strided_h200.txt), and
  // the rows read last are the tensor's last, where the elementwise passes (reverse chunk order) start: still in L2.
  // body as in for_rows; a last, partial slab one row at a time.
  template <int N, typename Body>
  __device__ __forceinline__ void for_rows_swept(I rows, I chunk, I chunks, Body&& body) const {
    const I by = I(blockDim.y), slab = I(N) * by;
    for (I first = chunk * slab; first < rows; first += chunks * slab) {
      I row = first + I(threadIdx.y);
      if (first + slab <= rows) {
        body(std::integral_constant<int, N>{}, row * C + c0, row * units + u);
      } else {
        for (; row < rows; row += by) body(std::integral_constant<int, 1>{}, row * C + c0, row * units + u);
      }
    }
  }
};

template <typename T>
struct ReduceIn {
  const T* x = nullptr;
  const T* dy = nullptr;           // backward
  const uint8_t* mask = nullptr;   // backward, optional
  const acc_t<T>* mean = nullptr;  // backward
};

// N rows of one thread's unit (8 channels) from offset e (mask byte m), t.stride elements (t.mstride bytes) apart,
// added to its sums in row order. The loads are issued before the first use: N x 16 bytes (x 2 in the backward) in
// flight.
template <typename T, bool BWD, int N, typename I>
__device__ __forceinline__ void reduce_rows_group_words(const ReduceIn<T>& in, const RowsTile<I>& t, I e, I m,
                                                        const acc_t<T> (&ref)[kUnit], acc_t<T> (&s0)[kUnit],
                                                        acc_t<T> (&s1)[kUnit]) {
  using A = acc_t<T>;
  Words8<T> xv[N], gv[BWD ? N : 1];
  uint8_t bits[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    xv[i].load(in.x + e + I(i) * t.stride);
    if constexpr (BWD) {
      gv[i].load(in.dy + e + I(i) * t.stride);
      bits[i] = in.mask != nullptr ? in.mask[m + I(i) * t.mstride] : uint8_t(0xff);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    Words8<T> dzv;
    if constexpr (BWD) dzv = gv[i].masked(bits[i]);
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      const A d = xv[i].get(j) - ref[j];
      if constexpr (BWD) {
        const A dz = dzv.get(j);
        s0[j] += dz;
        s1[j] += dz * d;
      } else {
        s0[j] += d;
        s1[j] += d * d;
      }
    }
  }
}

// The same with element arrays (float32, float64: Words8 says why).
template <typename T, bool BWD, int N, typename I>
__device__ __forceinline__ void reduce_rows_group(const ReduceIn<T>& in, const RowsTile<I>& t, I e, I m,
                                                  const acc_t<T> (&ref)[kUnit], acc_t<T> (&s0)[kUnit],
                                                  acc_t<T> (&s1)[kUnit]) {
  using A = acc_t<T>;
  T xv[N][kUnit], gv[N][kUnit];
  uint8_t bits[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    load8(in.x + e + I(i) * t.stride, xv[i]);
    if constexpr (BWD) {
      load8(in.dy + e + I(i) * t.stride, gv[i]);
      bits[i] = in.mask != nullptr ? in.mask[m + I(i) * t.mstride] : uint8_t(0xff);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      const A d = to_acc<T>(xv[i][j]) - ref[j];
      if constexpr (BWD) {
        const A dz = (bits[i] >> j) & 1 ? to_acc<T>(gv[i][j]) : A(0);
        s0[j] += dz;
        s1[j] += dz * d;
      } else {
        s0[j] += d;
        s1[j] += d * d;
      }
    }
  }
}

// rows x C: each thread sums its unit over the rows of its block's slabs (RowsTile::for_rows_swept), N rows at a
// time; then the block's rows are added in row order (one barrier).
template <typename T, bool BWD, typename I, int N = BWD ? kReduceIlpBwd : kReduceIlpFwd<T>,
          int MINB = kRowsMinBlocks<T>>
__global__ void __launch_bounds__(kThreads, MINB)
    reduce_rows_vec_kernel(ReduceIn<T> in, I rows, I C, I chunks, acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A sh[2][kThreads * kUnit];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const I chunk = blockIdx.y;
  const RowsTile<I> t(rows, C, rows, 0);  // its unit and strides; the rows are for_rows_swept's
  A s0[kUnit], s1[kUnit];
#pragma unroll
  for (int j = 0; j < kUnit; ++j) s0[j] = s1[j] = A(0);
  if (t.active()) {
    A ref[kUnit];
    if constexpr (BWD) {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) ref[j] = in.mean[t.c0 + j];
    } else {
      T k[kUnit];
      load8(in.x + t.c0, k);
#pragma unroll
      for (int j = 0; j < kUnit; ++j) ref[j] = to_acc<T>(k[j]);
    }
    t.template for_rows_swept<N>(rows, chunk, chunks, [&](auto n, I e, I m) {
      if constexpr (sizeof(T) == 2) {
        reduce_rows_group_words<T, BWD, decltype(n)::value>(in, t, e, m, ref, s0, s1);
      } else {
        reduce_rows_group<T, BWD, decltype(n)::value>(in, t, e, m, ref, s0, s1);
      }
    });
  }
  // The block's rows, added in one step: every thread stores its sums, one barrier, then thread k adds value k (and
  // k + kThreads, ...) of the block's 2 x bx x 8 sums over the by rows, in row order, and stores it (consecutive
  // threads, consecutive channels). It replaced a tree over ty (log2(by) levels, a barrier each), which runs after the
  // block's last loads, where nothing hides it: on an H200 each reduction took 0.1-0.5 us less (512x128x16x16 bf16:
  // forward statistics 16.6 -> 16.1 us, backward 28.0-28.2 -> 27.7; CUDA events, L2 flushed;
  // benchmarks/results/batch_norm_check_block_sum_h200.txt). A value adds `by` (blockDim.y) partial sums (at most 32 at
  // C >= 64; 256 at C = 8).
  const int per = bx * kUnit;  // a row's values of one sum: bx units of 8 channels
#pragma unroll
  for (int j = 0; j < kUnit; ++j) {
    sh[0][ty * per + tx * kUnit + j] = s0[j];
    sh[1][ty * per + tx * kUnit + j] = s1[j];
  }
  __syncthreads();
  for (int v = ty * bx + tx; v < 2 * per; v += bx * by) {
    const int which = v / per, rem = v - which * per;
    const I unit = I(blockIdx.x) * I(bx) + I(rem / kUnit);
    if (unit >= C / kUnit) continue;
    const A* col = sh[which] + rem;
    A sum = col[0];
#pragma unroll 8
    for (int r = 1; r < by; ++r) sum += col[r * per];
    partial[(which ? chunks + chunk : chunk) * C + unit * kUnit + rem % kUnit] = sum;
  }
}

// A block per (channel, chunk): VEC reads 8-element units of a plane (B % 8 == 0), else single elements through the
// (A, C, B) index (any layout: the 'simple' rung).
template <typename T, bool BWD, bool VEC>
__global__ void __launch_bounds__(kThreads)
    reduce_channel_kernel(ReduceIn<T> in, BatchNormShape s, int64_t items_per_chunk, int64_t chunks,
                          acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t c = blockIdx.x, chunk = blockIdx.y;
  const int64_t B = s.b, C = s.c;
  const int64_t items = VEC ? s.a * B / kUnit : s.a * B;
  const int64_t i0 = chunk * items_per_chunk;
  const int64_t i1 = i0 + items_per_chunk < items ? i0 + items_per_chunk : items;
  const A ref = BWD ? in.mean[c] : to_acc<T>(in.x[c * B]);
  A s0 = A(0), s1 = A(0);
  for (int64_t item = i0 + threadIdx.x; item < i1; item += kThreads) {
    const int64_t e = VEC ? item * kUnit : item;  // index in the channel's (a, b) space
    const int64_t a = e / B, b = e - a * B;
    const int64_t off = (a * C + c) * B + b;
    if constexpr (VEC) {
      T xv[kUnit], gv[kUnit];
      load8(in.x + off, xv);
      uint8_t bits = 0xff;
      if constexpr (BWD) {
        load8(in.dy + off, gv);
        if (in.mask != nullptr) bits = in.mask[off / kUnit];
      }
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        const A d = to_acc<T>(xv[j]) - ref;
        if constexpr (BWD) {
          const A dz = (bits >> j) & 1 ? to_acc<T>(gv[j]) : A(0);
          s0 += dz;
          s1 += dz * d;
        } else {
          s0 += d;
          s1 += d * d;
        }
      }
    } else {
      const A d = to_acc<T>(in.x[off]) - ref;
      if constexpr (BWD) {
        const bool pass = in.mask == nullptr || ((in.mask[off / kUnit] >> (off % kUnit)) & 1);
        const A dz = pass ? to_acc<T>(in.dy[off]) : A(0);
        s0 += dz;
        s1 += dz * d;
      } else {
        s0 += d;
        s1 += d * d;
      }
    }
  }
  s0 = block_sum(s0, scratch);
  s1 = block_sum(s1, scratch);
  if (threadIdx.x == 0) {
    partial[chunk * C + c] = s0;
    partial[(chunks + chunk) * C + c] = s1;
  }
}

// Column c's two sums over the chunks, in float64 and a fixed order: the block is COLS columns x ROWS rows of
// threads (8 warps); row ty adds chunks ty, ty + ROWS, ... in order, then a fixed tree over the rows (halves: row r
// adds row r + h for h = ROWS / 2, ..., 1) adds the rows. The halves that cross warps are added by warp 0 from shared
// memory after one barrier, the rest by shuffles within it: the tree's order, with one barrier instead of log2 ROWS
// + 1. The result is in row 0 (threadIdx.y == 0). Every thread of the block must call it.
template <int COLS, int ROWS, typename A>
__device__ __forceinline__ void chunk_sums(const A* __restrict__ partial, int64_t C, int64_t chunks, int64_t c,
                                           double* s0, double* s1) {
  static_assert((ROWS & (ROWS - 1)) == 0 && 32 % COLS == 0 && COLS * ROWS == 256, "8 warps of whole rows");
  constexpr int kRowsPerWarp = 32 / COLS, kWarps = ROWS / kRowsPerWarp;
  __shared__ double sh[2][ROWS][COLS];
  const int tx = threadIdx.x, ty = threadIdx.y;
  double a0 = 0, a1 = 0;
  if (c < C) {
#pragma unroll 4
    for (int64_t k = ty; k < chunks; k += ROWS) {
      a0 += static_cast<double>(partial[k * C + c]);
      a1 += static_cast<double>(partial[(chunks + k) * C + c]);
    }
  }
  sh[0][ty][tx] = a0;
  sh[1][ty][tx] = a1;
  __syncthreads();
  *s0 = *s1 = 0;
  if (ty >= kRowsPerWarp) return;
  // warp 0, row ty: the halves h >= kRowsPerWarp pair row ty + w kRowsPerWarp with ty + (w + h') kRowsPerWarp
  double v0[kWarps], v1[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    v0[w] = sh[0][ty + w * kRowsPerWarp][tx];
    v1[w] = sh[1][ty + w * kRowsPerWarp][tx];
  }
#pragma unroll
  for (int h = kWarps / 2; h > 0; h /= 2) {
#pragma unroll
    for (int w = 0; w < h; ++w) {
      v0[w] += v0[w + h];
      v1[w] += v1[w + h];
    }
  }
  a0 = v0[0];
  a1 = v1[0];
#pragma unroll
  for (int h = kRowsPerWarp / 2; h > 0; h /= 2) {  // rows ty < h add row ty + h, COLS h lanes on
    const double b0 = __shfl_down_sync(0xffffffffu, a0, h * COLS), b1 = __shfl_down_sync(0xffffffffu, a1, h * COLS);
    if (ty < h) {
      a0 += b0;
      a1 += b1;
    }
  }
  *s0 = a0;
  *s1 = a1;
}

// --- forward --------------------------------------------------------------------------------------------------------

// Per channel c, what the finalize reads besides the chunk sums: loaded before the sums, so that these loads' latency
// overlaps theirs.
struct ForwardChannelIn {
  double k = 0, sum = 0, sum_sq = 0, running_mean = 0, running_var = 0, w = 1, b = 0;
};

template <typename T, typename P>
__device__ __forceinline__ ForwardChannelIn load_forward_channel(const BatchNormForwardArgs<T, P>& args, int64_t c) {
  ForwardChannelIn in;
  if (args.training && args.shape.a * args.shape.b > 0) {
    if (args.sum != nullptr) {
      in.sum = static_cast<double>(args.sum[c]);
      in.sum_sq = static_cast<double>(args.sum_sq[c]);
    } else {
      in.k = to_double(args.x[c * args.shape.b]);  // the shift: the channel's first element
    }
  }
  // eval needs both running buffers (the op layer checks it: csrc/batch_norm.h); read only where given
  if (args.running_mean != nullptr) in.running_mean = to_double(args.running_mean[c]);
  if (args.running_var != nullptr) in.running_var = to_double(args.running_var[c]);
  if (args.weight != nullptr) in.w = to_double(args.weight[c]);
  if (args.bias != nullptr) in.b = to_double(args.bias[c]);
  return in;
}

// Per channel c, from its two chunk sums s0, s1 (unused in eval and with given sums) and its inputs: the statistics,
// the running buffers' update, save_mean / save_invstd, and chan = (mean, scale, shift). The finalize kernel and the
// fused rung's last block call it.
template <typename T, typename P>
__device__ __forceinline__ void finalize_forward_channel(const BatchNormForwardArgs<T, P>& args, int64_t c, double s0,
                                                         double s1, const ForwardChannelIn& in,
                                                         acc_t<T>* __restrict__ chan) {
  using A = acc_t<T>;
  const int64_t C = args.shape.c, n = args.shape.a * args.shape.b;
  double mean = 0, invstd = 0;
  if (args.training) {
    if (c == 0 && args.num_batches_tracked != nullptr) *args.num_batches_tracked += 1;
    if (n > 0) {
      if (args.sum != nullptr) {
        s0 = in.sum;
        s1 = in.sum_sq;
      }
      const math::ChannelStats st = math::stats_from_shifted_sums(in.k, s0, s1, n);
      mean = st.mean;
      invstd = math::inv_std(st.var_sum / static_cast<double>(n), args.eps);
      if (args.running_mean != nullptr) {
        args.running_mean[c] = from_double<P>(math::running_update(args.momentum, mean, in.running_mean));
      }
      if (args.running_var != nullptr) {
        const double unbiased = math::unbiased_var(st.var_sum, n);
        args.running_var[c] = from_double<P>(math::running_update(args.momentum, unbiased, in.running_var));
      }
    }
  } else {
    mean = in.running_mean;
    invstd = math::inv_std(in.running_var, args.eps);
  }
  args.save_mean[c] = static_cast<A>(mean);
  args.save_invstd[c] = static_cast<A>(invstd);
  chan[c] = static_cast<A>(mean);
  chan[C + c] = static_cast<A>(in.w * invstd);
  chan[2 * C + c] = static_cast<A>(in.b);
}

template <typename T, typename P, int COLS = kFinalizeCols, int ROWS = kFinalizeRows>
__global__ void __launch_bounds__(COLS* ROWS)
    finalize_forward_kernel(BatchNormForwardArgs<T, P> args, const acc_t<T>* __restrict__ partial, int64_t chunks,
                            acc_t<T>* __restrict__ chan) {
  const int64_t C = args.shape.c;
  const int64_t c = int64_t(blockIdx.x) * COLS + threadIdx.x;
  ForwardChannelIn in;
  if (threadIdx.y == 0 && c < C) in = load_forward_channel(args, c);
  double s0, s1;
  chunk_sums<COLS, ROWS>(partial, C, chunks, c, &s0, &s1);
  if (threadIdx.y != 0 || c >= C) return;
  finalize_forward_channel(args, c, s0, s1, in, chan);
}

struct ForwardFlags {
  bool residual, relu;
};

// 8 values of one unit: v = (x - mean) scale + shift [+ r], relu and its mask byte.
template <typename T>
__device__ __forceinline__ uint8_t normalize_unit(const T (&xv)[kUnit], const T (&rv)[kUnit],
                                                  const acc_t<T> (&mean)[kUnit], const acc_t<T> (&scale)[kUnit],
                                                  const acc_t<T> (&shift)[kUnit], ForwardFlags f, T (&yv)[kUnit]) {
  using A = acc_t<T>;
  uint8_t bits = 0;
#pragma unroll
  for (int j = 0; j < kUnit; ++j) {
    A v = (to_acc<T>(xv[j]) - mean[j]) * scale[j] + shift[j];
    if (f.residual) v += to_acc<T>(rv[j]);
    if (f.relu) {
      bits |= math::relu_bit(v) ? uint8_t(1u << j) : uint8_t(0);
      v = relu_value(v);
    }
    yv[j] = from_acc<T>(v);
  }
  return bits;
}

// The per-channel affine map of the normalize pass in registers: v = (x - mean) scale + shift. (Folded to x a + b with
// b = shift - mean scale it saves 8 registers, but leaves |mean scale| 2^-24 where x = mean: 2.7e-3 for a constant
// channel at 1000, enough to flip relu's mask; tests/test_batch_norm_kernels_gpu.py, constant channel.)
template <typename T>
struct NormalizeCoef {
  acc_t<T> mean[kUnit], a[kUnit], b[kUnit];

  __device__ __forceinline__ void load(const acc_t<T>* __restrict__ chan, int64_t C, int64_t c0) {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      mean[j] = chan[c0 + j];
      a[j] = chan[C + c0 + j];
      b[j] = chan[2 * C + c0 + j];
    }
  }
  __device__ __forceinline__ acc_t<T> apply(acc_t<T> x, int j) const { return (x - mean[j]) * a[j] + b[j]; }
};

// N rows of one unit from offset e (mask byte m): y = act(coef(x)) and the relu mask bytes (RELU), 2-byte types
// without the residual.
template <typename T, bool RELU, int N, typename I>
__device__ __forceinline__ void normalize_rows_group_words(const T* __restrict__ x, T* __restrict__ y,
                                                           uint8_t* __restrict__ mask, const RowsTile<I>& t, I e, I m,
                                                           const NormalizeCoef<T>& coef) {
  using A = acc_t<T>;
  Words8<T> xv[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    xv[i].load(x + e + I(i) * t.stride);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint8_t bits = 0;
    const Words8<T> yv = Words8<T>::of([&](int j) {
      const A v = coef.apply(xv[i].get(j), j);
      if constexpr (RELU) {
        bits |= math::relu_bit(v) ? uint8_t(1u << j) : uint8_t(0);
        return relu_value(v);
      }
      return v;
    });
    yv.store(y + e + I(i) * t.stride);
    if constexpr (RELU) mask[m + I(i) * t.mstride] = bits;
  }
}

// The same with element arrays and the residual: y = act(coef(x) [+ residual]) (float32, float64, and the residual's
// form for 2-byte types: Words8 says why).
template <typename T, bool RES, int N, typename I>
__device__ __forceinline__ void normalize_rows_group(const T* __restrict__ x, const T* __restrict__ res,
                                                     T* __restrict__ y, uint8_t* __restrict__ mask,
                                                     const RowsTile<I>& t, I e, I m, const NormalizeCoef<T>& coef,
                                                     bool relu) {
  using A = acc_t<T>;
  T xv[N][kUnit], rv[RES ? N : 1][kUnit];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    load8(x + e + I(i) * t.stride, xv[i]);
    if constexpr (RES) load8(res + e + I(i) * t.stride, rv[i]);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    T yv[kUnit];
    uint8_t bits = 0;
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      A v = coef.apply(to_acc<T>(xv[i][j]), j);
      if constexpr (RES) v += to_acc<T>(rv[i][j]);
      if (relu) {
        bits |= math::relu_bit(v) ? uint8_t(1u << j) : uint8_t(0);
        v = relu_value(v);
      }
      yv[j] = from_acc<T>(v);
    }
    store8(y + e + I(i) * t.stride, yv);
    if (relu) mask[m + I(i) * t.mstride] = bits;
  }
}

// rows x C, the tiles of rows_plan(elementwise), chunks in reverse order (the reduction's last rows are in L2).
template <typename T, bool RES, typename I, int N = kElemIlp, int MINB = kNormalizeMinBlocks<T>>
__global__ void __launch_bounds__(kThreads, MINB)
    normalize_rows_vec_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y,
                              uint8_t* __restrict__ mask, const acc_t<T>* __restrict__ chan, I rows, I C,
                              I rows_per_chunk, bool relu) {
  const RowsTile<I> t(rows, C, rows_per_chunk, I(gridDim.y) - 1 - I(blockIdx.y));
  if (!t.active()) return;
  NormalizeCoef<T> coef;
  coef.load(chan, C, t.c0);
  if constexpr (sizeof(T) != 2 || RES) {  // element arrays: Words8 says why
    t.template for_rows<N>([&](auto n, I e, I m) {
      normalize_rows_group<T, RES, decltype(n)::value>(x, res, y, mask, t, e, m, coef, relu);
    });
  } else if (relu) {  // relu a template parameter: as a runtime flag in the words' group, ptxas branched on every row
    t.template for_rows<N>(
        [&](auto n, I e, I m) { normalize_rows_group_words<T, true, decltype(n)::value>(x, y, mask, t, e, m, coef); });
  } else {
    t.template for_rows<N>(
        [&](auto n, I e, I m) { normalize_rows_group_words<T, false, decltype(n)::value>(x, y, mask, t, e, m, coef); });
  }
}

// Flat over units of 8 elements in memory order, kThreads x kIlp units per block chunk, chunks in reverse order. VEC:
// planes with B % 8 == 0 (one channel per unit, 16-byte loads); else any shape, element by element.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    normalize_flat_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y,
                          uint8_t* __restrict__ mask, const acc_t<T>* __restrict__ chan, BatchNormShape s,
                          int64_t numel, ForwardFlags f) {
  using A = acc_t<T>;
  const int64_t C = s.c, B = s.b;
  const int64_t units = (numel + kUnit - 1) / kUnit;
  const int64_t per_block = int64_t(kThreads) * kIlp;
  const int64_t nchunks = (units + per_block - 1) / per_block;
  for (int64_t k = blockIdx.x; k < nchunks; k += gridDim.x) {
    const int64_t chunk = nchunks - 1 - k;
#pragma unroll
    for (int i = 0; i < kIlp; ++i) {
      const int64_t unit = chunk * per_block + int64_t(i) * kThreads + threadIdx.x;
      if (unit >= units) continue;
      const int64_t e0 = unit * kUnit;
      T xv[kUnit], rv[kUnit], yv[kUnit];
      A mean[kUnit], scale[kUnit], shift[kUnit];
      if constexpr (VEC) {
        const int64_t c = (e0 / B) % C;
        load8(x + e0, xv);
        if (f.residual) load8(res + e0, rv);
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          mean[j] = chan[c];
          scale[j] = chan[C + c];
          shift[j] = chan[2 * C + c];
        }
        const uint8_t bits = normalize_unit(xv, rv, mean, scale, shift, f, yv);
        store8(y + e0, yv);
        if (f.relu) mask[unit] = bits;
      } else {
        const int count = numel - e0 < kUnit ? int(numel - e0) : kUnit;
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          const int64_t e = e0 + (j < count ? j : 0);
          const int64_t c = B == 1 ? e % C : (e / B) % C;
          xv[j] = x[e];
          rv[j] = f.residual ? res[e] : xv[j];
          mean[j] = chan[c];
          scale[j] = chan[C + c];
          shift[j] = chan[2 * C + c];
        }
        uint8_t bits = normalize_unit(xv, rv, mean, scale, shift, f, yv);
        for (int j = 0; j < count; ++j) y[e0 + j] = yv[j];
        if (f.relu) mask[unit] = count == kUnit ? bits : uint8_t(bits & ((1u << count) - 1u));
      }
    }
  }
}

// --- backward -------------------------------------------------------------------------------------------------------

// Per channel c, what the backward's finalize reads besides the chunk sums, loaded before them (as the forward's).
template <typename A>
struct BackwardChannelIn {
  double invstd = 0, w = 1;
  A mean = 0;
};

template <typename T, typename P>
__device__ __forceinline__ BackwardChannelIn<acc_t<T>> load_backward_channel(const BatchNormBackwardArgs<T, P>& args,
                                                                             int64_t c) {
  BackwardChannelIn<acc_t<T>> in;
  in.invstd = static_cast<double>(args.save_invstd[c]);
  if (args.weight != nullptr) in.w = to_double(args.weight[c]);
  in.mean = args.save_mean[c];
  return in;
}

// Per channel c, from its sums s0 = sum dz, s1 = sum dz (x - mean): grad_weight, grad_bias and coef = (k, q, r, mean)
// of dx = k (dz - r - q (x - mean)): k = w invstd, r = mean(dz), q = invstd^2 mean(dz (x - mean)) in training (0 in
// eval), the form torch's kernels use. The finalize kernel and the fused rung's last block call it.
template <typename T, typename P>
__device__ __forceinline__ void finalize_backward_channel(const BatchNormBackwardArgs<T, P>& args, int64_t c, double s0,
                                                          double s1, const BackwardChannelIn<acc_t<T>>& in,
                                                          acc_t<T>* __restrict__ coef) {
  using A = acc_t<T>;
  const int64_t C = args.shape.c, n = args.shape.a * args.shape.b;
  const double invstd = in.invstd;
  if (args.grad_bias != nullptr) args.grad_bias[c] = from_double<P>(s0);
  if (args.grad_weight != nullptr) args.grad_weight[c] = from_double<P>(s1 * invstd);
  const bool stats = args.training && n > 0;
  coef[c] = static_cast<A>(in.w * invstd);
  coef[C + c] = stats ? static_cast<A>(invstd * invstd * s1 / static_cast<double>(n)) : A(0);
  coef[2 * C + c] = stats ? static_cast<A>(s0 / static_cast<double>(n)) : A(0);
  coef[3 * C + c] = in.mean;
}

template <typename T, typename P, int COLS = kFinalizeCols, int ROWS = kFinalizeRows>
__global__ void __launch_bounds__(COLS* ROWS)
    finalize_backward_kernel(BatchNormBackwardArgs<T, P> args, const acc_t<T>* __restrict__ partial, int64_t chunks,
                             acc_t<T>* __restrict__ coef) {
  const int64_t C = args.shape.c;
  const int64_t c = int64_t(blockIdx.x) * COLS + threadIdx.x;
  BackwardChannelIn<acc_t<T>> in;
  if (threadIdx.y == 0 && c < C) in = load_backward_channel(args, c);
  double s0, s1;
  chunk_sums<COLS, ROWS>(partial, C, chunks, c, &s0, &s1);
  if (threadIdx.y != 0 || c >= C) return;
  finalize_backward_channel(args, c, s0, s1, in, coef);
}

struct BackwardFlags {
  bool training, grad_input, grad_residual, mask;
};

template <typename T>
__device__ __forceinline__ void backward_unit(const T (&gv)[kUnit], const T (&xv)[kUnit], uint8_t bits,
                                              const acc_t<T> (&k)[kUnit], const acc_t<T> (&q)[kUnit],
                                              const acc_t<T> (&r)[kUnit], const acc_t<T> (&mean)[kUnit],
                                              BackwardFlags f, T (&dx)[kUnit], T (&dz_out)[kUnit]) {
  using A = acc_t<T>;
#pragma unroll
  for (int j = 0; j < kUnit; ++j) {
    const A dz = (bits >> j) & 1 ? to_acc<T>(gv[j]) : A(0);
    dz_out[j] = from_acc<T>(dz);
    const A v = f.training ? dz - r[j] - q[j] * (to_acc<T>(xv[j]) - mean[j]) : dz;
    dx[j] = from_acc<T>(k[j] * v);
  }
}

// The per-channel coefficients of dx in registers: dx = k (dz - r - q (x - mean)); eval (q = r = 0): k dz.
template <typename T>
struct BackwardCoef {
  acc_t<T> k[kUnit], q[kUnit], r[kUnit], mean[kUnit];

  __device__ __forceinline__ void load(const acc_t<T>* __restrict__ coef, int64_t C, int64_t c0) {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      k[j] = coef[c0 + j];
      q[j] = coef[C + c0 + j];
      r[j] = coef[2 * C + c0 + j];
      mean[j] = coef[3 * C + c0 + j];
    }
  }
  __device__ __forceinline__ acc_t<T> apply(acc_t<T> dz, acc_t<T> x, int j) const {
    return k[j] * (dz - r[j] - q[j] * (x - mean[j]));
  }
};

// N rows of one unit from offset e (mask byte m): dx and grad_residual (= dz).
template <typename T, int N, typename I>
__device__ __forceinline__ void backward_rows_group_words(const T* __restrict__ dy, const T* __restrict__ x,
                                                          const uint8_t* __restrict__ mask, T* __restrict__ dx,
                                                          T* __restrict__ gres, const RowsTile<I>& t, I e, I m,
                                                          const BackwardCoef<T>& coef, BackwardFlags f) {
  using A = acc_t<T>;
  const bool read_x = f.training && f.grad_input;
  Words8<T> gv[N], xv[N];
  uint8_t bits[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    gv[i].load_last(dy + e + I(i) * t.stride);
    if (read_x) {
      xv[i].load_last(x + e + I(i) * t.stride);
    } else {
      xv[i] = Words8<T>{};  // +0 (not read: eval, or no grad_input)
    }
    bits[i] = f.mask ? mask[m + I(i) * t.mstride] : uint8_t(0xff);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    // dz = dy where the mask's bit is set, else +0: grad_residual as it is (no rounding: the words of dy).
    const Words8<T> dzv = gv[i].masked(bits[i]);
    if (f.grad_input) {
      const Words8<T> dxv = Words8<T>::of([&](int j) {
        const A dz = dzv.get(j);
        return f.training ? coef.apply(dz, xv[i].get(j), j) : coef.k[j] * dz;
      });
      dxv.store(dx + e + I(i) * t.stride);
    }
    if (f.grad_residual) dzv.store(gres + e + I(i) * t.stride);
  }
}

// The same with element arrays (float32, float64).
template <typename T, int N, typename I>
__device__ __forceinline__ void backward_rows_group(const T* __restrict__ dy, const T* __restrict__ x,
                                                    const uint8_t* __restrict__ mask, T* __restrict__ dx,
                                                    T* __restrict__ gres, const RowsTile<I>& t, I e, I m,
                                                    const BackwardCoef<T>& coef, BackwardFlags f) {
  using A = acc_t<T>;
  const bool read_x = f.training && f.grad_input;
  T gv[N][kUnit], xv[N][kUnit];
  uint8_t bits[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    load8_last(dy + e + I(i) * t.stride, gv[i]);
    if (read_x) {
      load8_last(x + e + I(i) * t.stride, xv[i]);
    } else {
#pragma unroll
      for (int j = 0; j < kUnit; ++j) xv[i][j] = from_acc<T>(A(0));
    }
    bits[i] = f.mask ? mask[m + I(i) * t.mstride] : uint8_t(0xff);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    T dxv[kUnit], dzv[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      const A dz = (bits[i] >> j) & 1 ? to_acc<T>(gv[i][j]) : A(0);
      dzv[j] = from_acc<T>(dz);
      dxv[j] = from_acc<T>(f.training ? coef.apply(dz, to_acc<T>(xv[i][j]), j) : coef.k[j] * dz);
    }
    if (f.grad_input) store8(dx + e + I(i) * t.stride, dxv);
    if (f.grad_residual) store8(gres + e + I(i) * t.stride, dzv);
  }
}

template <typename T, typename I, int N = kElemIlp, int MINB = kRowsMinBlocks<T>>
__global__ void __launch_bounds__(kThreads, MINB)
    backward_rows_vec_kernel(const T* __restrict__ dy, const T* __restrict__ x, const uint8_t* __restrict__ mask,
                             T* __restrict__ dx, T* __restrict__ gres, const acc_t<T>* __restrict__ coef_in, I rows,
                             I C, I rows_per_chunk, BackwardFlags f) {
  const RowsTile<I> t(rows, C, rows_per_chunk, I(gridDim.y) - 1 - I(blockIdx.y));
  if (!t.active()) return;
  BackwardCoef<T> coef;
  coef.load(coef_in, C, t.c0);
  t.template for_rows<N>([&](auto n, I e, I m) {
    if constexpr (sizeof(T) == 2) {
      backward_rows_group_words<T, decltype(n)::value>(dy, x, mask, dx, gres, t, e, m, coef, f);
    } else {
      backward_rows_group<T, decltype(n)::value>(dy, x, mask, dx, gres, t, e, m, coef, f);
    }
  });
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(kThreads)
    backward_flat_kernel(const T* __restrict__ dy, const T* __restrict__ x, const uint8_t* __restrict__ mask,
                         T* __restrict__ dx, T* __restrict__ gres, const acc_t<T>* __restrict__ coef, BatchNormShape s,
                         int64_t numel, BackwardFlags f) {
  using A = acc_t<T>;
  const int64_t C = s.c, B = s.b;
  const int64_t units = (numel + kUnit - 1) / kUnit;
  const int64_t per_block = int64_t(kThreads) * kIlp;
  const int64_t nchunks = (units + per_block - 1) / per_block;
  const bool read_x = f.training && f.grad_input;
  for (int64_t kk = blockIdx.x; kk < nchunks; kk += gridDim.x) {
    const int64_t chunk = nchunks - 1 - kk;
#pragma unroll
    for (int i = 0; i < kIlp; ++i) {
      const int64_t unit = chunk * per_block + int64_t(i) * kThreads + threadIdx.x;
      if (unit >= units) continue;
      const int64_t e0 = unit * kUnit;
      T gv[kUnit], xv[kUnit], dxv[kUnit], dzv[kUnit];
      A k[kUnit], q[kUnit], r[kUnit], mean[kUnit];
      const uint8_t bits = f.mask ? mask[unit] : uint8_t(0xff);
      int count = kUnit;
      if constexpr (VEC) {
        const int64_t c = (e0 / B) % C;
        load8(dy + e0, gv);
        if (read_x) load8(x + e0, xv);
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          k[j] = coef[c];
          q[j] = coef[C + c];
          r[j] = coef[2 * C + c];
          mean[j] = coef[3 * C + c];
        }
      } else {
        count = numel - e0 < kUnit ? int(numel - e0) : kUnit;
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          const int64_t e = e0 + (j < count ? j : 0);
          const int64_t c = B == 1 ? e % C : (e / B) % C;
          gv[j] = dy[e];
          xv[j] = read_x ? x[e] : gv[j];
          k[j] = coef[c];
          q[j] = coef[C + c];
          r[j] = coef[2 * C + c];
          mean[j] = coef[3 * C + c];
        }
      }
      backward_unit(gv, xv, bits, k, q, r, mean, f, dxv, dzv);
      if constexpr (VEC) {
        if (f.grad_input) store8(dx + e0, dxv);
        if (f.grad_residual) store8(gres + e0, dzv);
      } else {
        for (int j = 0; j < count; ++j) {
          if (f.grad_input) dx[e0 + j] = dxv[j];
          if (f.grad_residual) gres[e0 + j] = dzv[j];
        }
      }
    }
  }
}

// --- launch helpers ------------------------------------------------------------------------------------------------

unsigned flat_grid(int64_t numel) {
  const int64_t units = (numel + kUnit - 1) / kUnit;
  const int64_t blocks = ceil_div(units, int64_t(kThreads) * kIlp);
  return static_cast<unsigned>(clamp64(blocks, 1, kMaxGridX));
}

size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// launch(I{}) with I = int32_t where every offset of the tensor (and of the partial sums) fits, else int64_t: the
// rows kernels' index type.
template <typename Launch>
void with_index_type(const BatchNormShape& s, Launch&& launch) {
  const int64_t limit = 0x7fffffff;
  // Threads of a last, short chunk start up to blockDim.y (<= kThreads) rows past the end: their row offsets too.
  if ((s.a + kThreads) * s.c * s.b < limit && 2 * (kRowsReduceBlocks + 1) * s.c < limit) {
    launch(int32_t(0));
  } else {
    launch(int64_t(0));
  }
}

bool aligned16(const void* p) { return p == nullptr || aligned_to(p, 16); }

template <typename T>
bool vectorized_shape_ok(const BatchNormShape& s, const char** why) {
  if (s.b == 1 ? s.c % kUnit != 0 : s.b % kUnit != 0) {
    if (why != nullptr) *why = "needs C % 8 == 0 (channels-last) or H W % 8 == 0 (NCHW)";
    return false;
  }
  return true;
}

template <typename T>
cudaError_t launch_reduce(Path path, const ReduceIn<T>& in, const BatchNormShape& s, int64_t chunks, bool bwd,
                          acc_t<T>* partial, cudaStream_t stream) {
  const int64_t n = s.a * s.b;
  if (chunks == 0) return cudaSuccess;
  if (path == Path::rows) {
    const RowsPlan p = rows_plan(s.a, s.c, true);
    if (p.chunks != chunks) return cudaErrorInvalidValue;  // the workspace was sized for reduce_chunks()'s count
    const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.chunks)), block(p.bx, p.by);
    with_index_type(s, [&](auto index) {
      using I = decltype(index);
      const I rows = I(s.a), c = I(s.c), chunks = I(p.chunks);
      if (bwd) {
        reduce_rows_vec_kernel<T, true, I><<<grid, block, 0, stream>>>(in, rows, c, chunks, partial);
      } else {
        reduce_rows_vec_kernel<T, false, I><<<grid, block, 0, stream>>>(in, rows, c, chunks, partial);
      }
    });
  } else {
    const bool vec = path == Path::planes;
    const ChannelPlan p = channel_plan(vec ? n / kUnit : n, s.c);
    if (s.c > kMaxGridX) return cudaErrorNotSupported;
    const dim3 grid(static_cast<unsigned>(s.c), static_cast<unsigned>(p.chunks));
    if (vec && bwd) {
      reduce_channel_kernel<T, true, true><<<grid, kThreads, 0, stream>>>(in, s, p.items_per_chunk, p.chunks, partial);
    } else if (vec) {
      reduce_channel_kernel<T, false, true><<<grid, kThreads, 0, stream>>>(in, s, p.items_per_chunk, p.chunks, partial);
    } else if (bwd) {
      reduce_channel_kernel<T, true, false><<<grid, kThreads, 0, stream>>>(in, s, p.items_per_chunk, p.chunks, partial);
    } else {
      reduce_channel_kernel<T, false, false>
          <<<grid, kThreads, 0, stream>>>(in, s, p.items_per_chunk, p.chunks, partial);
    }
  }
  return cudaGetLastError();
}

unsigned finalize_grid(int64_t c, int cols = kFinalizeCols) { return static_cast<unsigned>(ceil_div(c, cols)); }

// Workspace: [partial: 2 chunks C][per-channel: `vectors` x C], each part 16-byte aligned.
template <typename A>
struct Workspace {
  A* partial;
  A* vectors;
};

template <typename A>
Workspace<A> split_workspace(void* base, int64_t chunks, int64_t c) {
  char* p = static_cast<char*>(base);
  return {reinterpret_cast<A*>(p), reinterpret_cast<A*>(p + align16(size_t(2 * chunks * c) * sizeof(A)))};
}

template <typename A>
size_t workspace_bytes(int64_t chunks, int64_t c, int vectors) {
  return align16(size_t(2 * chunks * c) * sizeof(A)) + align16(size_t(vectors) * size_t(c) * sizeof(A));
}

// --- the fused rung: rows x C, the finalize folded into the reduction ------------------------------------------------
// One plan per shape (never the GPU's): blocks (bx, by) as in rows_plan, grid (chunks, col_blocks); in chunk k, thread
// (tx, ty) of column block cb reads unit u = cb bx + tx (channels 8 u .. 8 u + 7) of rows k by R + ty + by i, i < R,
// R = kFusedRows<T> rows (256 bytes of one unit per thread: 16 rows for half types, 8 float; 2 double).
//   reduction  each thread sums its rows in order; the block's rows by a fixed shared-memory tree over ty; one partial
//              pair per (chunk, channel). Then, with device-scope integer counters (no float atomics): the last block
//              of each group of kFusedGroup consecutive chunks adds the group's partials in chunk order (float64), and
//              the last group of the column block adds the groups in group order and finalizes its channels
//              (finalize_*_channel). Which block does the adding depends on timing, the order of the additions never.
//   apply      normalize (forward) or dx and grad_residual (backward) over the same tiles, chunks in reverse order.
//   single     reduction and apply in one cooperative launch: the blocks of a column block wait on its ready flag
//              (set by the block that finalized it) before the apply. The forward keeps each thread's R rows of x in
//              shared memory (kHeldBytes): x is read once; the backward reads its tile again. The same code and the
//              same plan as reduction + apply, so the same bits; taken when the grid fits on the GPU at once and the
//              stream is not capturing, else the two launches run.

// Rows a thread: 256 bytes of its unit (16 rows for half types, 8 float); 128 for double, whose registers run out.
template <typename T>
constexpr int kFusedRows = sizeof(T) == 8 ? 2 : 256 / (kUnit * int(sizeof(T)));
// Chunks a first-level group adds.
constexpr int kFusedGroup = 32;
// Rows of a second tensor (the residual; the backward's dy and x) in flight a thread.
constexpr int kFusedBatch = 4;

struct FusedPlan {
  int bx = 1, by = 1;
  int64_t rows = 0, c = 0, col_blocks = 0, chunks = 0, rows_per_chunk = 0, groups = 0;
};

template <typename T>
FusedPlan fused_plan(int64_t rows, int64_t c) {
  FusedPlan p;
  p.rows = rows;
  p.c = c;
  const int64_t units = c / kUnit;
  while (p.bx < units && p.bx < 32) p.bx *= 2;
  p.by = kThreads / p.bx;
  p.col_blocks = ceil_div(units, p.bx);
  if (rows <= 0 || units <= 0) return p;
  p.rows_per_chunk = int64_t(p.by) * kFusedRows<T>;
  p.chunks = ceil_div(rows, p.rows_per_chunk);
  p.groups = ceil_div(p.chunks, kFusedGroup);
  return p;
}

// Whether the fused kernels can take this plan (grid limits), else the vectorized ones run.
bool fused_plan_ok(const FusedPlan& p) { return p.chunks > 0 && p.chunks <= kMaxGridX && p.col_blocks <= kMaxGridY; }

// The fused kernels' workspace: partial [2][chunks][C] (acc_t), group sums [2][groups][C] (float64), the per-channel
// vectors [4][C] (acc_t), counters [col_blocks][groups] (group arrivals), [col_blocks] (groups done), [col_blocks]
// (ready flags), zeroed before each launch.
template <typename A>
struct FusedWs {
  A* partial;
  double* group;
  A* vectors;
  unsigned* counters;
};

template <typename A>
size_t fused_part_bytes(const FusedPlan& p, int part) {
  switch (part) {
    case 0:
      return align16(size_t(2 * p.chunks * p.c) * sizeof(A));
    case 1:
      return align16(size_t(2 * p.groups * p.c) * sizeof(double));
    case 2:
      return align16(size_t(4 * p.c) * sizeof(A));
    default:
      return align16(size_t(p.col_blocks * (p.groups + 2)) * sizeof(unsigned));
  }
}

template <typename A>
size_t fused_workspace_bytes(const FusedPlan& p) {
  return fused_part_bytes<A>(p, 0) + fused_part_bytes<A>(p, 1) + fused_part_bytes<A>(p, 2) + fused_part_bytes<A>(p, 3);
}

template <typename A>
FusedWs<A> split_fused_workspace(void* base, const FusedPlan& p) {
  char* q = static_cast<char*>(base);
  FusedWs<A> ws;
  ws.partial = reinterpret_cast<A*>(q);
  q += fused_part_bytes<A>(p, 0);
  ws.group = reinterpret_cast<double*>(q);
  q += fused_part_bytes<A>(p, 1);
  ws.vectors = reinterpret_cast<A*>(q);
  q += fused_part_bytes<A>(p, 2);
  ws.counters = reinterpret_cast<unsigned*>(q);
  return ws;
}

// One unit (8 elements) as whole 16-byte words, so that rows held across the reduction stay packed in registers (two
// bf16 per register, not one).
template <typename T>
struct PackedUnit {
  uint4 w[kUnit * sizeof(T) / 16];
};

template <typename T>
__device__ __forceinline__ void load_packed(const T* __restrict__ p, PackedUnit<T>& out) {
#pragma unroll
  for (int i = 0; i < int(kUnit * sizeof(T) / 16); ++i) out.w[i] = reinterpret_cast<const uint4*>(p)[i];
}

template <typename T>
__device__ __forceinline__ void unpack(const PackedUnit<T>& in, T (&out)[kUnit]) {
  static_assert(sizeof(out) == sizeof(in.w));
  __builtin_memcpy(out, in.w, sizeof(out));
}

__device__ __forceinline__ void ready_release(unsigned* flag) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(1u) : "memory");
}
__device__ __forceinline__ void ready_wait(const unsigned* flag) {
  unsigned v = 0;
  while (true) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v != 0) break;
    __nanosleep(64);
  }
}

// sum_{k < n} p[k stride] in float64, k in order, 16 loads in flight (read through L2: other blocks wrote them).
template <typename V>
__device__ __forceinline__ double sum_column(const V* p, int64_t stride, int64_t n) {
  double acc = 0;
  for (int64_t k0 = 0; k0 < n; k0 += 16) {
    V v[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = k0 + i < n ? __ldcg(p + (k0 + i) * stride) : V(0);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (k0 + i < n) acc += static_cast<double>(v[i]);
    }
  }
  return acc;
}

// The block's shared memory for fused_reduce.
template <typename A>
struct FusedShared {
  A tree[2][kThreads * kUnit];
  double total[2][kThreads];  // the column block's sums, bx * 8 <= kThreads channels
  bool last;
};

// Every thread of the block calls this with its sums over its rows of unit u (zeros where u >= units). Writes the
// block's partial for chunk `chunk`, then the counters' cascade (see above). Returns true in the one block that ends
// the column block's sums, with them in sh.total[0 or 1][channel - cb bx 8].
template <typename A>
__device__ bool fused_reduce(const A (&s0)[kUnit], const A (&s1)[kUnit], const FusedPlan& p, int64_t chunk, int64_t cb,
                             const FusedWs<A>& ws, FusedShared<A>& sh) {
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * bx + tx;
  const int64_t C = p.c, units = C / kUnit, u = cb * bx + tx;
  const int slot = tid * kUnit;
#pragma unroll
  for (int j = 0; j < kUnit; ++j) {
    sh.tree[0][slot + j] = s0[j];
    sh.tree[1][slot + j] = s1[j];
  }
  for (int half = by / 2; half > 0; half /= 2) {
    __syncthreads();
    if (ty < half) {
      const int other = ((ty + half) * bx + tx) * kUnit;
#pragma unroll
      for (int j = 0; j < kUnit; ++j) {
        sh.tree[0][slot + j] += sh.tree[0][other + j];
        sh.tree[1][slot + j] += sh.tree[1][other + j];
      }
    }
  }
  if (ty == 0 && u < units) {
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      ws.partial[chunk * C + u * kUnit + j] = sh.tree[0][slot + j];
      ws.partial[(p.chunks + chunk) * C + u * kUnit + j] = sh.tree[1][slot + j];
    }
    __threadfence();
  }
  __syncthreads();
  const int64_t grp = chunk / kFusedGroup, k0 = grp * kFusedGroup;
  const int64_t k1 = k0 + kFusedGroup < p.chunks ? k0 + kFusedGroup : p.chunks;
  if (tid == 0) sh.last = atomicAdd(&ws.counters[cb * p.groups + grp], 1u) == unsigned(k1 - k0 - 1);
  __syncthreads();
  if (!sh.last) return false;
  __threadfence();
  const int64_t c_begin = cb * bx * kUnit;
  const int nch = static_cast<int>(C - c_begin < int64_t(bx) * kUnit ? C - c_begin : int64_t(bx) * kUnit);
  for (int item = tid; item < 2 * nch; item += kThreads) {
    const int which = item < nch ? 0 : 1;
    const int64_t c = c_begin + item - which * nch;
    ws.group[(which * p.groups + grp) * C + c] = sum_column(ws.partial + (which * p.chunks + k0) * C + c, C, k1 - k0);
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) sh.last = atomicAdd(&ws.counters[p.col_blocks * p.groups + cb], 1u) == unsigned(p.groups - 1);
  __syncthreads();
  if (!sh.last) return false;
  __threadfence();
  for (int item = tid; item < 2 * nch; item += kThreads) {
    const int which = item < nch ? 0 : 1;
    const int64_t c = c_begin + item - which * nch;
    sh.total[which][item - which * nch] = sum_column(ws.group + which * p.groups * C + c, C, p.groups);
  }
  __syncthreads();
  return true;
}

enum class FusedMode { reduce, apply, single };

template <typename T, typename P>
struct FusedForwardParams {
  BatchNormForwardArgs<T, P> args;
  FusedPlan plan;
  FusedWs<acc_t<T>> ws;
};

// The single launch's rows of x, held in shared memory between the statistics and the normalize: [R][words][threads]
// 16-byte words (consecutive threads, consecutive words: no bank conflicts). 64 KiB a block (32 KiB for double).
template <typename T>
constexpr int kWords = kUnit * int(sizeof(T)) / 16;
template <typename T>
constexpr int kHeldBytes = kFusedRows<T> * kWords<T> * 16 * kThreads;

template <typename T, typename P, FusedMode M>
__global__ void __launch_bounds__(kThreads, 2) batch_norm_fused_forward_kernel(const FusedForwardParams<T, P> fp) {
  using A = acc_t<T>;
  constexpr int R = kFusedRows<T>, NB = R < kFusedBatch ? R : kFusedBatch;
  static_assert(R % NB == 0);
  __shared__ FusedShared<A> sh;
  extern __shared__ uint4 held[];  // single: kHeldBytes<T>
  const BatchNormForwardArgs<T, P>& args = fp.args;
  const FusedPlan& p = fp.plan;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, tid = ty * bx + tx;
  const int64_t C = p.c, rows = p.rows, units = C / kUnit;
  const int64_t cb = blockIdx.y, u = cb * bx + tx, c0 = u * kUnit;
  const bool active = u < units;
  // Reverse chunk order in the apply launch: the reduction's last rows are still in L2.
  const int64_t chunk = M == FusedMode::apply ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x);
  const int64_t r0 = chunk * p.rows_per_chunk + ty;
  if constexpr (M != FusedMode::apply) {
    PackedUnit<T> xv[R];  // all R loads in flight
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + int64_t(i) * by;
      if (active && r < rows) load_packed(args.x + r * C + c0, xv[i]);
    }
    A s0[kUnit], s1[kUnit], ref[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) s0[j] = s1[j] = ref[j] = A(0);
    if (active) {
      T k[kUnit];
      load8(args.x + c0, k);  // the shift: row 0, as finalize_forward_channel reads it
#pragma unroll
      for (int j = 0; j < kUnit; ++j) ref[j] = to_acc<T>(k[j]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (active && r0 + int64_t(i) * by < rows) {
        T xr[kUnit];
        unpack(xv[i], xr);
#pragma unroll
        for (int j = 0; j < kUnit; ++j) {
          const A d = to_acc<T>(xr[j]) - ref[j];
          s0[j] += d;
          s1[j] += d * d;
        }
        if constexpr (M == FusedMode::single) {
#pragma unroll
          for (int w = 0; w < kWords<T>; ++w) held[(i * kWords<T> + w) * kThreads + tid] = xv[i].w[w];
        }
      }
    }
    if (fused_reduce(s0, s1, p, chunk, cb, fp.ws, sh)) {
      const int64_t c_begin = cb * bx * kUnit;
      if (tid < bx * kUnit && c_begin + tid < C) {
        finalize_forward_channel(args, c_begin + tid, sh.total[0][tid], sh.total[1][tid],
                                 load_forward_channel(args, c_begin + tid), fp.ws.vectors);
        __threadfence();
      }
      __syncthreads();
      if (tid == 0) ready_release(&fp.ws.counters[p.col_blocks * (p.groups + 1) + cb]);
    }
  }
  if constexpr (M == FusedMode::single) {
    // Every block of the column block is resident (cooperative launch): wait for the one that finalized it.
    if (tid == 0) ready_wait(&fp.ws.counters[p.col_blocks * (p.groups + 1) + cb]);
    __syncthreads();
  }
  if constexpr (M != FusedMode::reduce) {
    if (!active) return;
    const A* chan = fp.ws.vectors;
    A mean[kUnit], scale[kUnit], shift[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      mean[j] = __ldcg(chan + c0 + j);
      scale[j] = __ldcg(chan + C + c0 + j);
      shift[j] = __ldcg(chan + 2 * C + c0 + j);
    }
    const ForwardFlags f{args.residual != nullptr, args.mask != nullptr};
#pragma unroll
    for (int i0 = 0; i0 < R; i0 += NB) {
      T xb[NB][kUnit], rv[NB][kUnit];
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int64_t r = r0 + int64_t(i0 + i) * by;
        if (r < rows) {
          if constexpr (M == FusedMode::apply) {
            load8(args.x + r * C + c0, xb[i]);
          } else {
            PackedUnit<T> pu;
#pragma unroll
            for (int w = 0; w < kWords<T>; ++w) pu.w[w] = held[((i0 + i) * kWords<T> + w) * kThreads + tid];
            unpack(pu, xb[i]);
          }
          if (f.residual) load8(args.residual + r * C + c0, rv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int64_t r = r0 + int64_t(i0 + i) * by;
        if (r < rows) {
          T yv[kUnit];
          const uint8_t bits = normalize_unit(xb[i], rv[i], mean, scale, shift, f, yv);
          store8(args.y + r * C + c0, yv);
          if (f.relu) args.mask[r * units + u] = bits;
        }
      }
    }
  }
}

template <typename T, typename P>
struct FusedBackwardParams {
  BatchNormBackwardArgs<T, P> args;
  FusedPlan plan;
  FusedWs<acc_t<T>> ws;
};

// reduce: sum dz and sum dz (x - mean) and the finalize (grad_weight, grad_bias, coef); apply: dx and grad_residual;
// single: both, the apply reading its tile again (just read: from L2) after the column block's ready flag.
template <typename T, typename P, FusedMode M>
__global__ void __launch_bounds__(kThreads, 2) batch_norm_fused_backward_kernel(const FusedBackwardParams<T, P> fp) {
  using A = acc_t<T>;
  constexpr int R = kFusedRows<T>, NB = R < kFusedBatch ? R : kFusedBatch;
  static_assert(R % NB == 0);
  __shared__ FusedShared<A> sh;
  const BatchNormBackwardArgs<T, P>& args = fp.args;
  const FusedPlan& p = fp.plan;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, tid = ty * bx + tx;
  const int64_t C = p.c, rows = p.rows, units = C / kUnit;
  const int64_t cb = blockIdx.y, u = cb * bx + tx, c0 = u * kUnit;
  const bool active = u < units;
  const int64_t chunk = M == FusedMode::apply ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x);
  const int64_t r0 = chunk * p.rows_per_chunk + ty;
  if constexpr (M != FusedMode::apply) {
    A s0[kUnit], s1[kUnit], mean[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      s0[j] = s1[j] = A(0);
      mean[j] = active ? args.save_mean[c0 + j] : A(0);
    }
#pragma unroll
    for (int i0 = 0; i0 < R; i0 += NB) {
      PackedUnit<T> gv[NB], xv[NB];
      uint8_t bits[NB];
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int64_t r = r0 + int64_t(i0 + i) * by;
        bits[i] = 0;
        if (active && r < rows) {
          load_packed(args.grad_out + r * C + c0, gv[i]);
          load_packed(args.x + r * C + c0, xv[i]);
          bits[i] = args.mask != nullptr ? args.mask[r * units + u] : uint8_t(0xff);
        }
      }
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        if (active && r0 + int64_t(i0 + i) * by < rows) {
          T gr[kUnit], xr[kUnit];
          unpack(gv[i], gr);
          unpack(xv[i], xr);
#pragma unroll
          for (int j = 0; j < kUnit; ++j) {
            const A dz = (bits[i] >> j) & 1 ? to_acc<T>(gr[j]) : A(0);
            s0[j] += dz;
            s1[j] += dz * (to_acc<T>(xr[j]) - mean[j]);
          }
        }
      }
    }
    if (fused_reduce(s0, s1, p, chunk, cb, fp.ws, sh)) {
      const int64_t c_begin = cb * bx * kUnit;
      if (tid < bx * kUnit && c_begin + tid < C) {
        finalize_backward_channel(args, c_begin + tid, sh.total[0][tid], sh.total[1][tid],
                                  load_backward_channel(args, c_begin + tid), fp.ws.vectors);
        __threadfence();
      }
      __syncthreads();
      if (tid == 0) ready_release(&fp.ws.counters[p.col_blocks * (p.groups + 1) + cb]);
    }
  }
  if constexpr (M == FusedMode::single) {
    if (tid == 0) ready_wait(&fp.ws.counters[p.col_blocks * (p.groups + 1) + cb]);
    __syncthreads();
  }
  if constexpr (M != FusedMode::reduce) {
    if (!active) return;
    const A* coef = fp.ws.vectors;
    A k[kUnit], q[kUnit], r[kUnit], mean[kUnit];
#pragma unroll
    for (int j = 0; j < kUnit; ++j) {
      k[j] = __ldcg(coef + c0 + j);
      q[j] = __ldcg(coef + C + c0 + j);
      r[j] = __ldcg(coef + 2 * C + c0 + j);
      mean[j] = __ldcg(coef + 3 * C + c0 + j);
    }
    const BackwardFlags f{args.training, args.grad_input != nullptr, args.grad_residual != nullptr,
                          args.mask != nullptr};
    const bool read_x = f.training && f.grad_input;
#pragma unroll
    for (int i0 = 0; i0 < R; i0 += NB) {
      PackedUnit<T> gv[NB], xv[NB];
      uint8_t bits[NB];
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int64_t rr = r0 + int64_t(i0 + i) * by;
        if (rr < rows) {
          load_packed(args.grad_out + rr * C + c0, gv[i]);
          if (read_x) load_packed(args.x + rr * C + c0, xv[i]);
          bits[i] = f.mask ? args.mask[rr * units + u] : uint8_t(0xff);
        }
      }
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int64_t rr = r0 + int64_t(i0 + i) * by;
        if (rr < rows) {
          T gr[kUnit], xr[kUnit], dxv[kUnit], dzv[kUnit];
          unpack(gv[i], gr);
          unpack(xv[i], xr);
          backward_unit(gr, xr, bits[i], k, q, r, mean, f, dxv, dzv);
          if (f.grad_input) store8(args.grad_input + rr * C + c0, dxv);
          if (f.grad_residual) store8(args.grad_residual + rr * C + c0, dzv);
        }
      }
    }
  }
}

// Whether a single launch can run now: TORCHEXT_BATCH_NORM_SINGLE is not "0" (the tests' way to compare
// it with the two launches), the stream is not capturing (graphs get the two launches), the device takes cooperative
// launches, and the grid fits on it at once with `smem` bytes of dynamic shared memory a block (Kernel's occupancy,
// cached for the first device asked).
template <auto Kernel>
bool single_launch_fits(int64_t blocks, int smem, cudaStream_t stream) {
  const char* env = std::getenv("TORCHEXT_BATCH_NORM_SINGLE");
  if (env != nullptr && env[0] == '0') return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaStreamCaptureStatusNone) return false;
  int device = 0, coop = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
      (smem > 0 && prepare_kernel<Kernel>(smem) != cudaSuccess)) {
    (void)cudaGetLastError();
    return false;
  }
  static const int per_sm = [smem] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, kThreads, smem) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return coop != 0 && blocks <= int64_t(per_sm) * sm_count();
}

template <typename T, typename P>
bool fused_forward_applies(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& a) {
  return kernel == BatchNormKernel::fused && a.shape.b == 1 && a.training && a.sum == nullptr &&
         fused_plan_ok(fused_plan<T>(a.shape.a, a.shape.c));
}

template <typename T, typename P>
bool fused_backward_applies(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& a) {
  return kernel == BatchNormKernel::fused && a.shape.b == 1 && fused_plan_ok(fused_plan<T>(a.shape.a, a.shape.c));
}

// Counters zeroed, then the single launch where it fits, else reduce and apply (the same bits).
template <typename T, typename P>
cudaError_t fused_forward(const BatchNormForwardArgs<T, P>& args, void* workspace, cudaStream_t stream) {
  using A = acc_t<T>;
  const FusedPlan plan = fused_plan<T>(args.shape.a, args.shape.c);
  FusedForwardParams<T, P> fp{args, plan, split_fused_workspace<A>(workspace, plan)};
  cudaError_t err = cudaMemsetAsync(fp.ws.counters, 0, fused_part_bytes<A>(plan, 3), stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.chunks), static_cast<unsigned>(plan.col_blocks)), block(plan.bx, plan.by);
  constexpr auto single = batch_norm_fused_forward_kernel<T, P, FusedMode::single>;
  if (single_launch_fits<single>(plan.chunks * plan.col_blocks, kHeldBytes<T>, stream)) {
    void* params[] = {&fp};
    err =
        cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(single), grid, block, params, kHeldBytes<T>, stream);
    if (err == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();  // not launched (e.g. fewer multiprocessors under MPS): the two launches, same bits
  }
  batch_norm_fused_forward_kernel<T, P, FusedMode::reduce><<<grid, block, 0, stream>>>(fp);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  batch_norm_fused_forward_kernel<T, P, FusedMode::apply><<<grid, block, 0, stream>>>(fp);
  return cudaGetLastError();
}

template <typename T, typename P>
cudaError_t fused_backward(const BatchNormBackwardArgs<T, P>& args, void* workspace, cudaStream_t stream) {
  using A = acc_t<T>;
  const FusedPlan plan = fused_plan<T>(args.shape.a, args.shape.c);
  FusedBackwardParams<T, P> fp{args, plan, split_fused_workspace<A>(workspace, plan)};
  cudaError_t err = cudaMemsetAsync(fp.ws.counters, 0, fused_part_bytes<A>(plan, 3), stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(plan.chunks), static_cast<unsigned>(plan.col_blocks)), block(plan.bx, plan.by);
  const bool apply = args.grad_input != nullptr || args.grad_residual != nullptr;
  constexpr auto single = batch_norm_fused_backward_kernel<T, P, FusedMode::single>;
  if (apply && single_launch_fits<single>(plan.chunks * plan.col_blocks, 0, stream)) {
    void* params[] = {&fp};
    if (cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(single), grid, block, params, 0, stream) ==
        cudaSuccess) {
      return cudaSuccess;
    }
    (void)cudaGetLastError();
  }
  batch_norm_fused_backward_kernel<T, P, FusedMode::reduce><<<grid, block, 0, stream>>>(fp);
  err = cudaGetLastError();
  if (err != cudaSuccess || !apply) return err;
  batch_norm_fused_backward_kernel<T, P, FusedMode::apply><<<grid, block, 0, stream>>>(fp);
  return cudaGetLastError();
}

}  // namespace

// --- the launcher ----------------------------------------------------------------------------------------------------

template <typename T, typename P>
bool batch_norm_forward_supported(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args, const char** why) {
  switch (kernel) {
    case BatchNormKernel::simple:
      return true;
    case BatchNormKernel::vectorized:
    case BatchNormKernel::fused:  // vectorized's arguments; the fused kernels take the rows x C ones
      if (!vectorized_shape_ok<T>(args.shape, why)) return false;
      if (!aligned16(args.x) || !aligned16(args.y) || !aligned16(args.residual)) {
        if (why != nullptr) *why = "needs 16-byte aligned input, residual and output";
        return false;
      }
      return true;
    default:
      if (why != nullptr) *why = "unknown kernel";
      return false;
  }
}

template <typename T, typename P>
bool batch_norm_backward_supported(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args, const char** why) {
  switch (kernel) {
    case BatchNormKernel::simple:
      return true;
    case BatchNormKernel::vectorized:
    case BatchNormKernel::fused:
      if (!vectorized_shape_ok<T>(args.shape, why)) return false;
      if (!aligned16(args.grad_out) || !aligned16(args.x) || !aligned16(args.grad_input) ||
          !aligned16(args.grad_residual)) {
        if (why != nullptr) *why = "needs 16-byte aligned grad_out, input and gradients";
        return false;
      }
      return true;
    default:
      if (why != nullptr) *why = "unknown kernel";
      return false;
  }
}

template <typename T, typename P>
BatchNormKernel batch_norm_forward_default_kernel(const BatchNormForwardArgs<T, P>& args) {
  return batch_norm_forward_supported(BatchNormKernel::vectorized, args) ? BatchNormKernel::vectorized
                                                                         : BatchNormKernel::simple;
}

template <typename T, typename P>
BatchNormKernel batch_norm_backward_default_kernel(const BatchNormBackwardArgs<T, P>& args) {
  return batch_norm_backward_supported(BatchNormKernel::vectorized, args) ? BatchNormKernel::vectorized
                                                                          : BatchNormKernel::simple;
}

template <typename T, typename P>
size_t batch_norm_forward_workspace_bytes(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args) {
  if (fused_forward_applies(kernel, args)) {
    return fused_workspace_bytes<acc_t<T>>(fused_plan<T>(args.shape.a, args.shape.c));
  }
  const bool stats_pass = args.training && args.sum == nullptr;
  const int64_t chunks = stats_pass ? reduce_chunks(path_of(kernel, args.shape), args.shape) : 0;
  return workspace_bytes<acc_t<T>>(chunks, args.shape.c, 3);
}

template <typename T, typename P>
size_t batch_norm_backward_workspace_bytes(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args) {
  if (fused_backward_applies(kernel, args)) {
    return fused_workspace_bytes<acc_t<T>>(fused_plan<T>(args.shape.a, args.shape.c));
  }
  const bool sums =
      args.grad_weight != nullptr || args.grad_bias != nullptr || (args.training && args.grad_input != nullptr);
  const int64_t chunks = sums ? reduce_chunks(path_of(kernel, args.shape), args.shape) : 0;
  return workspace_bytes<acc_t<T>>(chunks, args.shape.c, 4);
}

template <typename T, typename P>
cudaError_t batch_norm_forward(BatchNormKernel kernel, const BatchNormForwardArgs<T, P>& args, cudaStream_t stream,
                               void* workspace) {
  using A = acc_t<T>;
  if (!batch_norm_forward_supported(kernel, args)) return cudaErrorNotSupported;
  const BatchNormShape& s = args.shape;
  if (s.c == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  if (fused_forward_applies(kernel, args)) return fused_forward(args, workspace, stream);
  const Path path = path_of(kernel, s);
  const bool stats_pass = args.training && args.sum == nullptr;
  const int64_t chunks = stats_pass ? reduce_chunks(path, s) : 0;
  const Workspace<A> ws = split_workspace<A>(workspace, chunks, s.c);
  ReduceIn<T> in;
  in.x = args.x;
  cudaError_t err = launch_reduce<T>(path, in, s, chunks, false, ws.partial, stream);
  if (err != cudaSuccess) return err;
  finalize_forward_kernel<T, P>
      <<<finalize_grid(s.c), dim3(kFinalizeCols, kFinalizeRows), 0, stream>>>(args, ws.partial, chunks, ws.vectors);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t numel = s.a * s.c * s.b;
  if (numel == 0) return cudaSuccess;
  const ForwardFlags f{args.residual != nullptr, args.mask != nullptr};
  if (path == Path::rows) {
    const RowsPlan p = rows_plan(s.a, s.c, false);
    const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.chunks)), block(p.bx, p.by);
    with_index_type(s, [&](auto index) {
      using I = decltype(index);
      const I rows = I(s.a), c = I(s.c), rpc = I(p.rows_per_chunk);
      if (f.residual) {
        normalize_rows_vec_kernel<T, true, I>
            <<<grid, block, 0, stream>>>(args.x, args.residual, args.y, args.mask, ws.vectors, rows, c, rpc, f.relu);
      } else {
        normalize_rows_vec_kernel<T, false, I>
            <<<grid, block, 0, stream>>>(args.x, args.residual, args.y, args.mask, ws.vectors, rows, c, rpc, f.relu);
      }
    });
  } else if (path == Path::planes) {
    normalize_flat_kernel<T, true>
        <<<flat_grid(numel), kThreads, 0, stream>>>(args.x, args.residual, args.y, args.mask, ws.vectors, s, numel, f);
  } else {
    normalize_flat_kernel<T, false>
        <<<flat_grid(numel), kThreads, 0, stream>>>(args.x, args.residual, args.y, args.mask, ws.vectors, s, numel, f);
  }
  return cudaGetLastError();
}

template <typename T, typename P>
cudaError_t batch_norm_backward(BatchNormKernel kernel, const BatchNormBackwardArgs<T, P>& args, cudaStream_t stream,
                                void* workspace) {
  using A = acc_t<T>;
  if (!batch_norm_backward_supported(kernel, args)) return cudaErrorNotSupported;
  const BatchNormShape& s = args.shape;
  if (s.c == 0) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  if (fused_backward_applies(kernel, args)) return fused_backward(args, workspace, stream);
  const Path path = path_of(kernel, s);
  const bool sums =
      args.grad_weight != nullptr || args.grad_bias != nullptr || (args.training && args.grad_input != nullptr);
  const int64_t chunks = sums ? reduce_chunks(path, s) : 0;
  const Workspace<A> ws = split_workspace<A>(workspace, chunks, s.c);
  ReduceIn<T> in;
  in.x = args.x;
  in.dy = args.grad_out;
  in.mask = args.mask;
  in.mean = args.save_mean;
  cudaError_t err = launch_reduce<T>(path, in, s, chunks, true, ws.partial, stream);
  if (err != cudaSuccess) return err;
  finalize_backward_kernel<T, P>
      <<<finalize_grid(s.c), dim3(kFinalizeCols, kFinalizeRows), 0, stream>>>(args, ws.partial, chunks, ws.vectors);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t numel = s.a * s.c * s.b;
  if (numel == 0 || (args.grad_input == nullptr && args.grad_residual == nullptr)) return cudaSuccess;
  const BackwardFlags f{args.training, args.grad_input != nullptr, args.grad_residual != nullptr, args.mask != nullptr};
  if (path == Path::rows) {
    const RowsPlan p = rows_plan(s.a, s.c, false);
    const dim3 grid(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.chunks)), block(p.bx, p.by);
    with_index_type(s, [&](auto index) {
      using I = decltype(index);
      backward_rows_vec_kernel<T, I><<<grid, block, 0, stream>>>(args.grad_out, args.x, args.mask, args.grad_input,
                                                                 args.grad_residual, ws.vectors, I(s.a), I(s.c),
                                                                 I(p.rows_per_chunk), f);
    });
  } else if (path == Path::planes) {
    backward_flat_kernel<T, true><<<flat_grid(numel), kThreads, 0, stream>>>(
        args.grad_out, args.x, args.mask, args.grad_input, args.grad_residual, ws.vectors, s, numel, f);
  } else {
    backward_flat_kernel<T, false><<<flat_grid(numel), kThreads, 0, stream>>>(
        args.grad_out, args.x, args.mask, args.grad_input, args.grad_residual, ws.vectors, s, numel, f);
  }
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_BATCH_NORM(T, P)                                                                         \
  template bool batch_norm_forward_supported<T, P>(BatchNormKernel, const BatchNormForwardArgs<T, P>&, const char**); \
  template bool batch_norm_backward_supported<T, P>(BatchNormKernel, const BatchNormBackwardArgs<T, P>&,              \
                                                    const char**);                                                    \
  template BatchNormKernel batch_norm_forward_default_kernel<T, P>(const BatchNormForwardArgs<T, P>&);                \
  template BatchNormKernel batch_norm_backward_default_kernel<T, P>(const BatchNormBackwardArgs<T, P>&);              \
  template size_t batch_norm_forward_workspace_bytes<T, P>(BatchNormKernel, const BatchNormForwardArgs<T, P>&);       \
  template size_t batch_norm_backward_workspace_bytes<T, P>(BatchNormKernel, const BatchNormBackwardArgs<T, P>&);     \
  template cudaError_t batch_norm_forward<T, P>(BatchNormKernel, const BatchNormForwardArgs<T, P>&, cudaStream_t,     \
                                                void*);                                                               \
  template cudaError_t batch_norm_backward<T, P>(BatchNormKernel, const BatchNormBackwardArgs<T, P>&, cudaStream_t,   \
                                                 void*);
TORCHEXT_INSTANTIATE_BATCH_NORM(float, float)
TORCHEXT_INSTANTIATE_BATCH_NORM(double, double)
TORCHEXT_INSTANTIATE_BATCH_NORM(__half, __half)
TORCHEXT_INSTANTIATE_BATCH_NORM(__half, float)
TORCHEXT_INSTANTIATE_BATCH_NORM(__nv_bfloat16, __nv_bfloat16)
TORCHEXT_INSTANTIATE_BATCH_NORM(__nv_bfloat16, float)
#undef TORCHEXT_INSTANTIATE_BATCH_NORM

}  // namespace torchext::cuda_ops
