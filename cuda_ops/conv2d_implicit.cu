// Convolution as an implicit GEMM on tensor cores (mma.sync, sm_80 and newer): the three passes of
// cuda_ops/conv2d.cuh for NHWC (channels-last) activations and KRSC weights, bf16 / fp16, and float32 as tf32 where
// the caller allows it (args.allow_tf32). Accumulation in float32.
//
//   forward          y (N P Q, K)   = A (N P Q, R S C) B (R S C, K)        A[m, (r, s, c)] = x[n, p sh - ph + r dh,
//                                                                                              q sw - pw + s dw, c]
//   backward_input   dx (N H W, C)  = dy gathered (N H W, R S K) W' (R S K, C), one GEMM per stride phase (below)
//   backward_weight  dw (K, R S C)  = dy^T (K, N P Q) A (N P Q, R S C), split along N P Q
//
// What this version adds over im2col + GEMM (cuda_ops/conv2d_im2col.cu):
//   - No patch matrix. The loader of the gathered operand computes, for each 16-byte chunk (8 channels of bf16 /
//     fp16, 4 of float), the input pixel it comes from (padding, stride and dilation included) and copies it with
//     cp.async straight into the swizzled shared-memory tile the GEMM engine's mma.sync kernel uses
//     (cuda_ops/mma_sync.cuh); a chunk in the padding is zero-filled by cp.async's src-size operand, never read.
//     The patch matrix is R S times larger than the input (9x for 3x3): im2col writes and reads it once more.
//   - Per block, the output rows' (image, p, q) are decomposed once into a table in shared memory; per k-tile each
//     thread finds its tap (r, s, c) with two divisions by constants (multiply-high, FastDivmod below).
//   - backward_input at stride > 1: the gradient of input pixel h sums dy over the taps r with (h + ph - r) a
//     multiple of the stride; splitting the input pixels into stride^2 phases (h mod sh, w mod sw) makes that set
//     the same for every pixel of a phase, so each phase is a stride-1 implicit GEMM over dy with the sub-kernel of
//     its taps (flipped, transposed: W'[c, t, u, k] = w[k, c, r0 + sh (T - 1 - t), s0 + sw (U - 1 - u)]), written
//     to the phase's pixels with the stride. No MMA multiplies one of the zeros a stride-2 transposed convolution
//     inserts. The sub-kernels are gathered into the workspace first (K C R S elements).
//   - backward_weight: K (output channels) x R S C is small and N P Q long, so the k-loop is split over grid.z
//     when the tiles alone would not fill the GPU twice; each split writes its float32 partial tile to the
//     workspace and a second kernel adds the splits in a fixed order (deterministic).
//   - forward epilogue: bias, relu, and for batch norm the per-channel sum and sum of squares of the stored output:
//     each block reduces its tile's columns from shared memory into the workspace, a second kernel adds the tiles
//     in a fixed order (deterministic), so the statistics cost no second read of y.
//
// Tiles: 128 x 128 (4 warps, two blocks per SM) or 128 x 64 for 64 output channels (forward, backward_input) and
// 64 x 128 for 64 output channels (backward_weight); each warp computes 64 x 64 with mma.sync m16n8k16 (k8 for
// tf32), a 3-stage cp.async pipeline of 128-byte k-lines, as in cuda_ops/matmul_mma.cu.
//
// Requirements (conv2d_implicit_supported says which one failed): groups 1; channel counts (C for x, K for dy) a
// multiple of 8 (bf16 / fp16) or 4 (float), channel stride 1, the other strides multiples of that and 16-byte
// aligned bases (the op layer pads the 3-channel stem to 8 and makes tensors channels-last); the forward's weight
// KRSC; backward_input dilation 1; backward_weight dy dense NHWC and dw KRSC; sizes below 2^31.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "conv2d.cuh"
#include "conv2d_implicit.cuh"
#include "matmul_epilogue.cuh"
#include "mma_sync.cuh"

namespace torchext::cuda_ops {
namespace {

using namespace mma_sync;

constexpr int kStages = 3;
constexpr int kGroupM = 8;  // tile-rows per L2 group

template <int BM_, int BN_, int WARPS_M, int WARPS_N, int MIN_BLOCKS>
struct ConvTile {
  static constexpr int BM = BM_, BN = BN_, kWarpsM = WARPS_M, kWarpsN = WARPS_N, kMinBlocks = MIN_BLOCKS;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int WM = BM / kWarpsM, WN = BN / kWarpsN;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static constexpr int kStageBytes = (BM + BN) * kLineBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kCLd = BN + 8;            // the staged accumulators: BM rows of kCLd floats
  static constexpr int kRowTableBytes = BM * 24;  // forward: per output row, x's and y's offsets, ih0, iw0
  static constexpr int kSmemBytes = kPipeBytes + kRowTableBytes;
  static_assert(WM == 64 && WN == 64, "warp tile must be 64 x 64 (cuda_ops/mma_sync.cuh's Fragments)");
  static_assert(BM * kCLd * 4 <= kPipeBytes, "the epilogue stages the fp32 block tile in the stage buffers");
};
using Tile128x128 = ConvTile<128, 128, 2, 2, 2>;  // 128 threads, 99 KiB
using Tile128x64 = ConvTile<128, 64, 2, 1, 2>;    // 64 threads, 75 KiB: 64 output channels
using Tile64x128 = ConvTile<64, 128, 1, 2, 2>;    // 64 threads, 73.5 KiB: weight gradient of 64 output channels


// The block's tile, grouped kGroupM tile-rows at a time so that blocks running together share panels in L2.
__device__ __forceinline__ void block_tile(int tiles_m, int tiles_n, int bm, int bn, int& bm0, int& bn0) {
  const int pid = blockIdx.x;
  const int group_width = kGroupM * tiles_n;
  const int first_m = (pid / group_width) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  bm0 = (first_m + (pid % group_width) % group_rows) * bm;
  bn0 = ((pid % group_width) / group_rows) * bn;
}

// The k-loop shared by both kernels: k-tiles [kt_begin, kt_end) through the 3-stage pipeline, load_tile(stage,
// kt) issuing the cp.async copies of one k-tile into a stage (A at the stage, B kBOffset after it).
template <typename T, class Cfg, bool kAKMajor, bool kBKMajor, class LoadTile>
__device__ __forceinline__ void mainloop(float (&acc)[Cfg::MI][Cfg::NI][4], uint32_t smem0, int kt_begin, int kt_end,
                                         int lane, int wm0, int wn0, LoadTile&& load_tile) {
  constexpr int ES = sizeof(T), MI = Cfg::MI, NI = Cfg::NI;
  constexpr int kStepsPerTile = 4;  // k-steps of 32 bytes per stage
  constexpr int kBOffset = Cfg::BM * kLineBytes;
  const Fragments<T, MI, NI, Cfg::BM * ES, Cfg::BN * ES, kAKMajor, kBKMajor> frags(lane, wm0, wn0);
  uint32_t fa[2][MI][4], fb[2][NI][2];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int j = 0; j < NI; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
    }
  }
  const int num = kt_end - kt_begin;
  if (num <= 0) return;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num) load_tile(smem0 + st * Cfg::kStageBytes, kt_begin + st);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();
  int read_stage = 0, write_stage = kStages - 1;
  frags.load(fa[0], fb[0], smem0, smem0 + kBOffset, 0);
  for (int t = 0; t < num; ++t) {
#pragma unroll
    for (int s = 0; s < kStepsPerTile; ++s) {
      if (s == kStepsPerTile - 1) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
      }
      const uint32_t stage = smem0 + read_stage * Cfg::kStageBytes;
      frags.load(fa[(s + 1) & 1], fb[(s + 1) & 1], stage, stage + kBOffset, (s + 1) % kStepsPerTile);
      if (s == 0) {
        if (t + kStages - 1 < num) load_tile(smem0 + write_stage * Cfg::kStageBytes, kt_begin + t + kStages - 1);
        cp_async_commit();
        write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
      }
#pragma unroll
      for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) mma_m16n8<T>(acc[i][j], fa[s & 1][i], fb[s & 1][j]);
      }
    }
  }
}

// The accumulators into shared memory as BM rows of kCLd floats (the pipeline's buffers, free after the loop).
template <class Cfg>
__device__ __forceinline__ float* stage_accumulators(const float (&acc)[Cfg::MI][Cfg::NI][4], uint8_t* smem, int lane,
                                                     int wm0, int wn0) {
  cp_async_wait<0>();
  __syncthreads();
  float* cs = reinterpret_cast<float*>(smem);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < Cfg::MI; ++i) {
#pragma unroll
    for (int j = 0; j < Cfg::NI; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float2*>(cs + (wm0 + i * 16 + h * 8 + g) * Cfg::kCLd + wn0 + j * 8 + 2 * t) =
            make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
  }
  __syncthreads();
  return cs;
}

template <typename T, class Cfg, bool kRelu, bool kStats>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) conv2d_fprop_kernel(const FpropParams<T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int ES = sizeof(T), kElems = 16 / ES;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, NT = Cfg::kThreads, BK = kLineBytes / ES;
  constexpr int kBOffset = BM * kLineBytes;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / Cfg::kWarpsN) * Cfg::WM, wn0 = (warp % Cfg::kWarpsN) * Cfg::WN;
  int bm0, bn0;
  block_tile(p.tiles_m, p.tiles_n, BM, BN, bm0, bn0);
  const uint32_t smem0 = smem_addr(smem);

  // Each output row's offsets into x and y and its top-left input pixel, once per block.
  int64_t* row_x = reinterpret_cast<int64_t*>(smem + Cfg::kPipeBytes);
  int64_t* row_y = row_x + BM;
  int* row_ih = reinterpret_cast<int*>(row_y + BM);
  int* row_iw = row_ih + BM;
  for (int r = tid; r < BM; r += NT) {
    const int m = bm0 + r;
    if (m < p.m) {
      int image, pix, pp, qq;
      p.g.pq.divmod(m, image, pix);
      p.g.q.divmod(pix, pp, qq);
      row_x[r] = image * p.g.x_sn;
      row_y[r] = image * p.y_sn + pp * p.y_sh + qq * p.y_sw;
      row_ih[r] = pp * p.g.stride_h - p.g.pad_h;
      row_iw[r] = qq * p.g.stride_w - p.g.pad_w;
    } else {
      row_x[r] = 0;
      row_y[r] = 0;
      row_ih[r] = INT_MIN / 2;  // outside the image for every tap
      row_iw[r] = INT_MIN / 2;
    }
  }
  __syncthreads();

  // A: thread tid copies chunk a_c of rows a_r + i * NT / 8.
  constexpr int kAPasses = BM * 8 / NT, kARowsPerPass = NT / 8;
  const int a_c = tid & 7, a_r = tid >> 3;
  const KMajorLoader<T, BN, NT> b_loader(p.wt, p.w_lead, bn0, p.n, tid);
  auto load_tile = [&](uint32_t stage, int kt) {
    const int kk = kt * BK + a_c * kElems;
    const bool k_ok = kk < p.k;
    int tap, ch, tr, ts;
    p.g.c.divmod(kk, tap, ch);
    p.g.s.divmod(tap, tr, ts);
    const int dh = tr * p.g.dil_h, dw = ts * p.g.dil_w;
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = a_r + i * kARowsPerPass;
      const int ih = row_ih[r] + dh, iw = row_iw[r] + dw;
      const bool ok = k_ok && static_cast<unsigned>(ih) < static_cast<unsigned>(p.g.h) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(p.g.w);
      const T* src = ok ? p.g.x + row_x[r] + ih * p.g.x_sh + iw * p.g.x_sw + ch : p.g.x;
      cp_async16(stage + r * kLineBytes + ((a_c ^ (r & 7)) << 4), src, ok ? 16 : 0);
    }
    b_loader.load_edge(stage + kBOffset, p.wt, p.w_lead, p.k, kt * BK);
  };

  float acc[Cfg::MI][Cfg::NI][4];
  mainloop<T, Cfg, true, true>(acc, smem0, 0, (p.k + BK - 1) / BK, lane, wm0, wn0, load_tile);
  float* cs = stage_accumulators<Cfg>(acc, smem, lane, wm0, wn0);

  // Epilogue: 4 adjacent channels of one row per thread, rows along the threads.
  constexpr int kQuads = BN / 4;
  const int rows = min(BM, p.m - bm0);
  for (int idx = tid; idx < rows * kQuads; idx += NT) {
    const int r = idx / kQuads, col = bn0 + (idx % kQuads) * 4;
    if (col >= p.n) continue;
    float* v = cs + r * Cfg::kCLd + (idx % kQuads) * 4;
    T* out = p.y + row_y[r] + col;
    Vec<T, 4> o;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float z = v[e];
      if (p.bias != nullptr && col + e < p.n) z += static_cast<float>(p.bias[col + e]);
      if (kRelu) z = fmaxf(z, 0.f);
      o.v[e] = static_cast<T>(z);
      if (kStats) v[e] = static_cast<float>(o.v[e]);  // the statistics are of the values stored
    }
    if (p.vec_store && col + 4 <= p.n) {
      *reinterpret_cast<Vec<T, 4>*>(out) = o;
    } else {
      for (int e = 0; e < 4 && col + e < p.n; ++e) out[e] = o.v[e];
    }
  }
  if constexpr (kStats) {
    __syncthreads();
    const int tile_m = bm0 / BM;
    for (int cl = tid; cl < BN; cl += NT) {
      const int col = bn0 + cl;
      if (col >= p.n) continue;
      float sum = 0.f, sq = 0.f;
      for (int r = 0; r < rows; ++r) {
        const float v = cs[r * Cfg::kCLd + cl];
        sum += v;
        sq += v * v;
      }
      p.stats_partial[static_cast<int64_t>(col) * p.tiles_m + tile_m] = sum;
      p.stats_partial[(static_cast<int64_t>(p.n) + col) * p.tiles_m + tile_m] = sq;
    }
  }
#endif
}

template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) conv2d_wgrad_kernel(const WgradParams<T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int ES = sizeof(T), kElems = 16 / ES;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, NT = Cfg::kThreads, BK = kLineBytes / ES;
  constexpr int kBOffset = BM * kLineBytes;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / Cfg::kWarpsN) * Cfg::WM, wn0 = (warp % Cfg::kWarpsN) * Cfg::WN;
  int bm0, bn0;
  block_tile(p.tiles_m, p.tiles_n, BM, BN, bm0, bn0);
  const uint32_t smem0 = smem_addr(smem);

  // A = dy^T, M-major: BK lines (pixels) of BM output channels.
  const MnMajorLoader<T, BM, NT> a_loader(p.dy, p.dy_lead, bm0, p.m, tid);
  // B gathered from x, N-major: BK lines (pixels) of BN columns (r, s, c); thread tid copies chunk b_c of lines
  // b_line + i * kBLinesPerPass. Its column, hence its tap and channel, is fixed for the whole block.
  constexpr int kBChunks = BN / kElems, kBLinesPerPass = NT / kBChunks, kBPasses = BK / kBLinesPerPass;
  static_assert(NT % kBChunks == 0 && BK % kBLinesPerPass == 0, "B's chunks must divide evenly among the threads");
  const int b_c = tid % kBChunks, b_line = tid / kBChunks;
  const int col = bn0 + b_c * kElems;
  const bool col_ok = col < p.n;
  int tap, ch, tr, ts;
  p.g.c.divmod(col_ok ? col : 0, tap, ch);
  p.g.s.divmod(tap, tr, ts);
  const int oh = tr * p.g.dil_h - p.g.pad_h, ow = ts * p.g.dil_w - p.g.pad_w;
  const T* xc = p.g.x + ch;
  auto load_tile = [&](uint32_t stage, int kt) {
    a_loader.load_edge(stage, p.dy, p.dy_lead, p.k, kt * BK);
#pragma unroll 4
    for (int i = 0; i < kBPasses; ++i) {
      const int line = b_line + i * kBLinesPerPass;
      const int pix = kt * BK + line;
      bool ok = col_ok && pix < p.k;
      const T* src = p.g.x;
      if (ok) {
        int image, rem, pp, qq;
        p.g.pq.divmod(pix, image, rem);
        p.g.q.divmod(rem, pp, qq);
        const int ih = pp * p.g.stride_h + oh, iw = qq * p.g.stride_w + ow;
        ok = static_cast<unsigned>(ih) < static_cast<unsigned>(p.g.h) &&
             static_cast<unsigned>(iw) < static_cast<unsigned>(p.g.w);
        src = ok ? xc + image * p.g.x_sn + ih * p.g.x_sh + iw * p.g.x_sw : p.g.x;
      }
      cp_async16(stage + kBOffset + line * (BN * ES) + (mn_major_chunk<ES>(b_c, line) << 4), src, ok ? 16 : 0);
    }
  };

  const int num_kt = (p.k + BK - 1) / BK;
  const int kt_begin = blockIdx.z * p.kt_per_split, kt_end = min(num_kt, kt_begin + p.kt_per_split);
  float acc[Cfg::MI][Cfg::NI][4];
  mainloop<T, Cfg, false, false>(acc, smem0, kt_begin, kt_end, lane, wm0, wn0, load_tile);
  const float* cs = stage_accumulators<Cfg>(acc, smem, lane, wm0, wn0);

  const int rows = min(BM, p.m - bm0);
  for (int idx = tid; idx < rows * BN; idx += NT) {
    const int r = idx / BN, j = bn0 + idx % BN;
    if (j >= p.n) continue;
    const float v = cs[r * Cfg::kCLd + idx % BN];
    if (p.partial != nullptr) {
      p.partial[(static_cast<int64_t>(blockIdx.z) * p.m + bm0 + r) * p.n + j] = v;
    } else if (p.dw_acc != nullptr) {
      p.dw_acc[(bm0 + r) * p.dw_lead + j] = v;
    } else {
      p.dw[(bm0 + r) * p.dw_lead + j] = static_cast<T>(v);
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side


// The splits of backward_weight's k-loop (wgrad_split_count), each at least 8 k-tiles.
template <class Cfg>
int wgrad_splits(int64_t m, int64_t n, int64_t k, int es) {
  const int64_t bk = kLineBytes / es;
  const int64_t tiles = static_cast<int64_t>(ceil_div(m, Cfg::BM)) * ceil_div(n, Cfg::BN);
  return wgrad_split_count(tiles, (k + bk - 1) / bk, Cfg::kMinBlocks, 8);
}

template <typename T>
int64_t wgrad_splits_for(const Conv2dShape& sh) {
  const int64_t m = sh.k, n = sh.r * sh.s * sh.c, k = sh.n * sh.p * sh.q;
  return m <= 64 ? wgrad_splits<Tile64x128>(m, n, k, sizeof(T)) : wgrad_splits<Tile128x128>(m, n, k, sizeof(T));
}

template <typename T, class Cfg, bool kRelu, bool kStats>
cudaError_t launch_fprop(FpropParams<T> p, cudaStream_t stream) {
  constexpr auto kernel = conv2d_fprop_kernel<T, Cfg, kRelu, kStats>;
  cudaError_t err = prepare_kernel<kernel>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  p.tiles_m = ceil_div(p.m, Cfg::BM);
  p.tiles_n = ceil_div(p.n, Cfg::BN);
  kernel<<<static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), Cfg::kThreads, Cfg::kSmemBytes,
           stream>>>(p);
  return cudaGetLastError();
}

template <typename T, class Cfg>
cudaError_t launch_fprop_cfg(const FpropParams<T>& p, bool relu, bool stats, cudaStream_t stream) {
  if (stats) {
    return relu ? launch_fprop<T, Cfg, true, true>(p, stream) : launch_fprop<T, Cfg, false, true>(p, stream);
  }
  return relu ? launch_fprop<T, Cfg, true, false>(p, stream) : launch_fprop<T, Cfg, false, false>(p, stream);
}

template <typename T>
cudaError_t run_fprop(const FpropParams<T>& p, bool relu, bool stats, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  return p.n <= 64 ? launch_fprop_cfg<T, Tile128x64>(p, relu, stats, stream)
                   : launch_fprop_cfg<T, Tile128x128>(p, relu, stats, stream);
}

// Bytes of the stats partials for a forward of m rows and n channels: [2][n][tiles_m] floats.
int64_t stats_partial_bytes(int64_t m, int64_t n) {
  const int64_t bm = n <= 64 ? Tile128x64::BM : Tile128x128::BM;
  return 2 * n * ((m + bm - 1) / bm) * static_cast<int64_t>(sizeof(float));
}

template <typename T>
cudaError_t forward(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace) {
  const int bm = a.shape.k <= 64 ? Tile128x64::BM : Tile128x128::BM;
  return forward_gemm(a, stream, workspace, run_fprop<T>, ceil_div(a.shape.n * a.shape.p * a.shape.q, bm));
}

template <typename T>
cudaError_t backward_input(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace) {
  return backward_input_gemm(a, stream, workspace, each_phase<T>(run_fprop<T>));
}

template <typename T, class Cfg>
cudaError_t launch_wgrad(WgradParams<T> p, int splits, cudaStream_t stream) {
  constexpr auto kernel = conv2d_wgrad_kernel<T, Cfg>;
  cudaError_t err = prepare_kernel<kernel>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  p.tiles_m = ceil_div(p.m, Cfg::BM);
  p.tiles_n = ceil_div(p.n, Cfg::BN);
  const int num_kt = ceil_div(p.k, kLineBytes / static_cast<int>(sizeof(T)));
  p.kt_per_split = std::max(1, ceil_div(num_kt, splits));
  const dim3 grid(static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), 1,
                  static_cast<unsigned>(splits));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return launch_wgrad_reduce(p.partial, splits, p.m, p.n, p.dw, p.dw_acc, p.dw_lead, stream);
}

template <typename T>
cudaError_t backward_weight(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace) {
  const Conv2dShape& sh = a.shape;
  WgradParams<T> p;
  p.m = static_cast<int>(sh.k);
  p.n = static_cast<int>(sh.r * sh.s * sh.c);
  p.k = static_cast<int>(sh.n * sh.p * sh.q);
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  p.g = input_gather(a);
  p.dy = a.y.data;
  p.dy_lead = sh.k;
  p.dw = a.w.data;
  p.dw_acc = a.w_acc;
  p.dw_lead = a.w.sn;
  const int splits = p.k == 0 ? 1 : static_cast<int>(wgrad_splits_for<T>(sh));
  p.partial = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  return p.m <= 64 ? launch_wgrad<T, Tile64x128>(p, splits, stream) : launch_wgrad<T, Tile128x128>(p, splits, stream);
}

}  // namespace

template <typename T>
bool conv2d_implicit_supported(Conv2dPass pass, const Conv2dArgs<T>& a, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if constexpr (std::is_same_v<T, double>) {
    return fail("implicit_mma: float64 has no tensor-core path (bf16, fp16, or float32 as tf32)");
  } else {
    if (std::is_same_v<T, float> && !a.allow_tf32) {
      return fail("implicit_mma: float32 runs on tensor cores only as tf32, and tf32 is off for convolutions "
                  "(torch.backends.cudnn.allow_tf32)");
    }
    if (compute_capability() < 80) return fail("implicit_mma: needs a GPU of compute capability 8.0 or newer");
    if (smem_optin() < Tile128x128::kSmemBytes) return fail("implicit_mma: the device has too little shared memory");
    return implicit_operands_supported(pass, a, why);
  }
}

template <typename T>
size_t conv2d_implicit_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& a) {
  const Conv2dShape& sh = a.shape;
  switch (pass) {
    case Conv2dPass::forward:
      return a.stats != nullptr ? align256(static_cast<size_t>(stats_partial_bytes(sh.n * sh.p * sh.q, sh.k))) : 0;
    case Conv2dPass::backward_input:
      return backward_input_workspace_bytes<T>(sh);
    case Conv2dPass::backward_weight: {
      const int64_t splits = sh.n * sh.p * sh.q == 0 ? 1 : wgrad_splits_for<T>(sh);
      return wgrad_partials_bytes(splits, sh);
    }
  }
  return 0;
}

template <typename T>
cudaError_t conv2d_implicit(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if constexpr (std::is_same_v<T, double>) {
    return cudaErrorNotSupported;
  } else {
    if (!conv2d_implicit_supported(pass, args, nullptr)) return cudaErrorNotSupported;
    switch (pass) {
      case Conv2dPass::forward:
        return forward(args, stream, workspace);
      case Conv2dPass::backward_input:
        return backward_input(args, stream, workspace);
      case Conv2dPass::backward_weight:
        return backward_weight(args, stream, workspace);
    }
    return cudaErrorNotSupported;
  }
}

#define TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT(T)                                                           \
  template bool conv2d_implicit_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**);            \
  template size_t conv2d_implicit_workspace_bytes<T>(Conv2dPass, const Conv2dArgs<T>&);                  \
  template cudaError_t conv2d_implicit<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT(float)
TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT(double)
TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT(__half)
TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_IMPLICIT

}  // namespace torchext::cuda_ops
