// Convolution as an implicit GEMM on CUDA cores (float32, exact: no tf32): the three passes of cuda_ops/conv2d.cuh
// for NHWC (channels-last) activations and KRSC weights, on the matmul ladder's top CUDA-core kernel (v5,
// cuda_ops/matmul_simt.cu: its tile shapes, fragments and k loop, cuda_ops/simt_tile.cuh) with loaders that gather
// the convolution's operands instead of reading a matrix. The GEMMs are implicit_mma's (cuda_ops/conv2d_implicit.cu):
//
//   forward          y (N P Q, K)   = A (N P Q, R S C) B (R S C, K)        A[m, (r, s, c)] = x[n, p sh - ph + r dh,
//                                                                                              q sw - pw + s dw, c]
//   backward_input   dx (N H W, C)  = dy gathered (N H W, R S K) W' (R S K, C), one GEMM per stride phase
//                                     (backward_input_gemm in cuda_ops/conv2d_implicit.cuh: no FMA on an inserted zero)
//   backward_weight  dw^T (R S C, K) = A^T (R S C, N P Q) dy (N P Q, K), split along N P Q, the splits added in a
//                                     fixed order (deterministic)
//
// What this rung adds over im2col + the same GEMM (cuda_ops/conv2d_im2col.cu), the float32 path before it: no patch
// matrix. In float32 that matrix is R S times the input (9x for 3x3: 1.2 GB for ResNet-18's first stage at batch
// 512), written and read once more per pass, and the weight gradient's GEMM (K x R S C, summed over N P Q) ran
// without a split. Here:
//   - The gathered tile lands transposed in shared memory (k-major, as v5 needs it) one element per cp.async: a
//     warp copies runs of 8 consecutive k (one 32-byte sector: 8 channels of one input pixel where
//     C is a multiple of 8; with C = 4 mod 8 a run crosses two taps, each element placed on its own) of 32 output pixels.
//     Per block the output pixels' (image, ih0, iw0) are decoded once into a table in shared memory; per k tile
//     each thread decodes its k values into taps (two divisions by constants, FastDivmod), and a copy whose pixel
//     falls in the padding is zero-filled by cp.async's source size (never read).
//   - backward_weight's gathered operand is contiguous along its GEMM rows (4 channels of one tap: one 16-byte
//     cp.async); each thread's 4 channels stay the same for the whole block, so only the pixel is decoded per copy.
//   - Epilogues store from registers: each thread's 4 consecutive output channels are one 16-byte store, a warp's
//     stores cover whole 128-byte rows. Bias and relu in the forward's epilogue; the statistics of conv2d_stats are
//     computed after it, over the stored output (cuda_ops/conv2d.cu), as for direct and im2col.
//
// Tiles (TileConfig, 256 threads as 8 warps of 32 x 64, each thread 8 x 8 in 2 x 2 patches of 4 x 4, 2 blocks per
// SM): 128 x 128, or 256 x 64 where the GEMM has at most 64 columns (64 output channels; 64-channel weight
// gradients), BK = 16.
//
// Requirements (conv2d_simt_supported says which one failed): float32; groups 1; channel counts (C for x, K for dy)
// a multiple of 4, channel stride 1, the other strides multiples of 4, 16-byte aligned bases (the op layer pads the
// 3-channel stem and makes tensors channels-last); the weight KRSC (16-byte aligned rows in the forward);
// backward_input dilation 1; backward_weight dy dense NHWC and dw KRSC; sizes below 2^30
// (implicit_operands_supported, cuda_ops/conv2d_implicit.cuh: implicit_mma's operands). sm_80 or newer (cp.async).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "conv2d.cuh"
#include "conv2d_implicit.cuh"
#include "simt_tile.cuh"

namespace torchext::cuda_ops {
namespace {

//                             BM   BN  BK  GM  GN TGM TGN VW PAD ST MINB
using SimtWide = TileConfig<128, 128, 16, 32, 64, 4, 8, 4, 4, 2, 2, true>;
using SimtTall = TileConfig<256, 64, 16, 32, 64, 4, 8, 4, 4, 2, 2, true>;
static_assert(SimtWide::THREADS == 256 && SimtTall::THREADS == 256, "8 warps");

// An output pixel's place in the gathered operand: x's element offset of (image, ih0, iw0) with ih0 = p stride_h -
// pad_h (likewise iw0), so tap (r, s) reads base + r dil_h x_sh + s dil_w x_sw + c at row ih0 + r dil_h. A row past
// the GEMM's m has ih0 far below 0: every tap of it is out of the image and loads 0.
struct alignas(16) PixelRow {
  int64_t base;
  int ih0, iw0;
};
constexpr int kRowPastEnd = -(1 << 30);

template <class C>
struct FpropSmem {
  static constexpr int OPERANDS = 2 * (C::BK * C::LDA + C::BK * C::LDB) * static_cast<int>(sizeof(float));
  static constexpr int ROWS = OPERANDS;                                    // PixelRow[BM]
  static constexpr int Y_OFF = ROWS + C::BM * static_cast<int>(sizeof(PixelRow));  // int64_t[BM]: y's row offsets
  static constexpr int BYTES = Y_OFF + C::BM * static_cast<int>(sizeof(int64_t));
};

template <class C>
struct WgradSmem {
  static constexpr int BYTES = 2 * (C::BK * C::LDA + C::BK * C::LDB) * static_cast<int>(sizeof(float));
};

// One float copied by cp.async (through L1: sizes below 16 bytes take .ca) when `ok`, else zero-filled; src must
// be a valid address either way (the caller passes the tensor's base for a copy it skips).
__device__ __forceinline__ void cp_async4_if(float* dst, const float* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  .reg .u32 n;\n"
      "  setp.ne.u32 p, %2, 0;\n"
      "  selp.u32 n, 4, 0, p;\n"
      "  cp.async.ca.shared.global [%0], [%1], 4, n;\n"
      "}\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(static_cast<unsigned>(ok))
      : "memory");
#endif
}

// The forward's A tile (also a backward_input phase's, gathered from dy): BM output pixels x BK values of k =
// (r, s, c), landing transposed (As[kk * LDA + mm]). Thread t copies k offsets t % KW + KW kq of the pixels
// t / KW + RP rr (AsyncTransposeLoader's pattern: a warp reads whole sectors, its smem writes hit 32 banks).
template <class C>
struct GatherLoader {
  static constexpr int KW = 8, RP = C::THREADS / KW, PASSES = C::BM / RP, KQ = C::BK / KW;
  static_assert(C::THREADS % KW == 0 && C::BM % RP == 0 && C::BK % KW == 0, "whole passes");
  const Gather<float>* g;
  const PixelRow* rows;  // the block's table in shared memory
  int k;                 // this thread's first k in the current tile

  __device__ __forceinline__ static int r0() { return threadIdx.x / KW; }
  __device__ __forceinline__ static int kk0() { return threadIdx.x % KW; }

  __device__ __forceinline__ void init(const Gather<float>& gather, const PixelRow* table, int k_begin) {
    g = &gather;
    rows = table;
    k = k_begin + kk0();
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, float* s) {
    int dr[KQ], ds[KQ];
    int64_t off[KQ];
    bool k_ok[KQ];
#pragma unroll
    for (int kq = 0; kq < KQ; ++kq) {
      int tap, c, r, sx;
      g->c.divmod(k + kq * KW, tap, c);
      g->s.divmod(tap, r, sx);
      dr[kq] = r * g->dil_h;
      ds[kq] = sx * g->dil_w;
      off[kq] = dr[kq] * g->x_sh + ds[kq] * g->x_sw + c;
      k_ok[kq] = FULL || kk0() + kq * KW < k_left;
    }
    float* dst = s + kk0() * C::LDA + r0();
#pragma unroll
    for (int rr = 0; rr < PASSES; ++rr) {
      const PixelRow row = rows[r0() + rr * RP];
#pragma unroll
      for (int kq = 0; kq < KQ; ++kq) {
        const bool ok = k_ok[kq] && static_cast<unsigned>(row.ih0 + dr[kq]) < static_cast<unsigned>(g->h) &&
                        static_cast<unsigned>(row.iw0 + ds[kq]) < static_cast<unsigned>(g->w);
        cp_async4_if(dst + kq * KW * C::LDA + rr * RP, ok ? g->x + row.base + off[kq] : g->x, ok);
      }
    }
    k += C::BK;
  }
  __device__ __forceinline__ void store(float* /*s*/) const {}
  __device__ __forceinline__ void wait() const { cp_async_wait_all(); }
};

// backward_weight's A tile: BM columns j = (r, s, c) of the patch matrix x BK pixels, landing as is (As[kk * LDA +
// mm], consecutive j consecutive channels of one tap): thread t copies the 4 channels j = m0 + 4 (t % RV) of the
// pixels t / RV + DK it, one 16-byte cp.async each.
template <class C>
struct WgradGatherLoader {
  static constexpr int VEC = 4, RV = C::BM / VEC, DK = C::THREADS / RV, ITERS = C::BK * RV / C::THREADS;
  static_assert(C::THREADS % RV == 0 && (C::BK * RV) % C::THREADS == 0, "whole vectors per thread");
  const Gather<float>* g;
  int64_t off;      // x's offset of this thread's channels at the tap: r dil_h x_sh + s dil_w x_sw + c
  int dr, ds;       // r dil_h - pad_h, s dil_w - pad_w
  int pixel;        // this thread's first pixel in the current tile
  bool column_ok;   // its 4 columns lie below the GEMM's m

  __device__ __forceinline__ static int rv() { return threadIdx.x % RV; }
  __device__ __forceinline__ static int kk0() { return threadIdx.x / RV; }

  __device__ __forceinline__ void init(const Gather<float>& gather, int m0, int m, int k_begin) {
    g = &gather;
    const int j = m0 + rv() * VEC;
    column_ok = j < m;  // m = R S C, a multiple of 4: the vector is in or out whole
    int tap, c, r, sx;
    g->c.divmod(column_ok ? j : 0, tap, c);
    g->s.divmod(tap, r, sx);
    dr = r * g->dil_h - g->pad_h;
    ds = sx * g->dil_w - g->pad_w;
    off = static_cast<int64_t>(r * g->dil_h) * g->x_sh + static_cast<int64_t>(sx * g->dil_w) * g->x_sw + c;
    pixel = k_begin + kk0();
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, float* s) {
    float* dst = s + kk0() * C::LDA + rv() * VEC;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      int image, rest, p, q;
      g->pq.divmod(pixel + it * DK, image, rest);
      g->q.divmod(rest, p, q);
      const int ih = p * g->stride_h + dr, iw = q * g->stride_w + ds;
      const bool ok = column_ok && (FULL || kk0() + it * DK < k_left) &&
                      static_cast<unsigned>(ih) < static_cast<unsigned>(g->h) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(g->w);
      const float* src = g->x + image * g->x_sn + static_cast<int64_t>(p * g->stride_h - g->pad_h) * g->x_sh +
                         static_cast<int64_t>(q * g->stride_w - g->pad_w) * g->x_sw + off;
      cp_async16(dst + it * DK * C::LDA, ok ? src : g->x, ok ? 16 : 0);
    }
    pixel += C::BK;
  }
  __device__ __forceinline__ void store(float* /*s*/) const {}
  __device__ __forceinline__ void wait() const { cp_async_wait_all(); }
};

// The thread's place in the block tile (tiled_gemm's): first row and column of its patches; its accumulators zeroed.
template <class C>
__device__ __forceinline__ void thread_start(int& a_off, int& b_off, float (&acc)[C::TM][C::TN]) {
  const int tid = threadIdx.x;
  const int group = tid / (C::TGM * C::TGN), lane = tid % (C::TGM * C::TGN);
  a_off = group / C::GROUPS_N * C::GM + lane / C::TGN * C::VW;
  b_off = group % C::GROUPS_N * C::GN + lane % C::TGN * C::VW;
#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
#pragma unroll
    for (int j = 0; j < C::TN; ++j) acc[i][j] = 0.f;
  }
}

// Accumulator (i, j) of the thread holds tile row a_off + (i / VW) TGM VW + i % VW, column b_off + (j / VW) TGN VW
// + j % VW.
template <class C>
__device__ __forceinline__ int patch_row(int a_off, int i) {
  return a_off + (i / C::VW) * C::TGM * C::VW + i % C::VW;
}
template <class C>
__device__ __forceinline__ int patch_col(int b_off, int jv) {
  return b_off + jv * C::TGN * C::VW;
}

// The forward, or one backward_input phase: y = act(A B + bias) on an output tile of BM pixels x BN channels.
// Tiles are numbered with the channel tiles fastest, so blocks running together read the same input pixels.
template <class C, bool kRelu>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    conv2d_simt_fprop_kernel(const __grid_constant__ FpropParams<float> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async (sm_80+): conv2d_simt_supported refuses such GPUs; a JIT of older code must not run silently
#else
  using S = FpropSmem<C>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  float* const smem = reinterpret_cast<float*>(smem_bytes);
  PixelRow* const rows = reinterpret_cast<PixelRow*>(smem_bytes + S::ROWS);
  int64_t* const y_off = reinterpret_cast<int64_t*>(smem_bytes + S::Y_OFF);
  const int mt = static_cast<int>(blockIdx.x) / p.tiles_n, nt = static_cast<int>(blockIdx.x) % p.tiles_n;
  const int m0 = mt * C::BM, n0 = nt * C::BN;

  for (int mm = threadIdx.x; mm < C::BM; mm += C::THREADS) {
    PixelRow row{0, kRowPastEnd, kRowPastEnd};
    int64_t yo = 0;
    if (m0 + mm < p.m) {
      int image, rest, pp, qq;
      p.g.pq.divmod(m0 + mm, image, rest);
      p.g.q.divmod(rest, pp, qq);
      row.ih0 = pp * p.g.stride_h - p.g.pad_h;
      row.iw0 = qq * p.g.stride_w - p.g.pad_w;
      row.base = image * p.g.x_sn + static_cast<int64_t>(row.ih0) * p.g.x_sh + static_cast<int64_t>(row.iw0) * p.g.x_sw;
      yo = image * p.y_sn + pp * p.y_sh + qq * p.y_sw;
    }
    rows[mm] = row;
    y_off[mm] = yo;
  }
  __syncthreads();

  GatherLoader<C> la;
  la.init(p.g, rows, 0);
  AsyncTransposeLoader<float, C::BN, C::BK, C::THREADS, C::LDB> lb;
  lb.init(p.wt + n0 * p.w_lead, p.w_lead, 1, min(p.n - n0, C::BN));
  int a_off, b_off;
  float acc[C::TM][C::TN];
  thread_start<C>(a_off, b_off, acc);
  const int64_t ktiles = (p.k + C::BK - 1) / C::BK;
  simt_k_loop<C>(la, lb, smem, ktiles, static_cast<int>(p.k - (ktiles - 1) * C::BK), a_off, b_off, acc);

  using V = Vec<float, C::VW>;
#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
    const int rr = patch_row<C>(a_off, i);
    if (m0 + rr >= p.m) continue;
    float* const yr = p.y + y_off[rr];
#pragma unroll
    for (int jv = 0; jv < C::ITN; ++jv) {
      const int col = n0 + patch_col<C>(b_off, jv);
      V v;
#pragma unroll
      for (int e = 0; e < C::VW; ++e) {
        float z = acc[i][jv * C::VW + e];
        if (p.bias != nullptr && col + e < p.n) z += p.bias[col + e];
        v.v[e] = kRelu ? fmaxf(z, 0.f) : z;
      }
      if (p.vec_store && col + C::VW <= p.n) {
        *reinterpret_cast<V*>(yr + col) = v;
      } else {
#pragma unroll
        for (int e = 0; e < C::VW; ++e) {
          if (col + e < p.n) yr[col + e] = v.v[e];
        }
      }
    }
  }
#endif
}

// backward_weight: dw^T (R S C x K) over the pixels [split kt_per_split BK, ...) of grid.z's split; one split writes
// dw (element (i, j) at dw + i dw_lead + j), several write their float32 partials ([split][K][R S C], 16-byte
// aligned) for conv2d_wgrad_reduce_kernel. p.m = K and p.n = R S C are WgradParams' (the GEMM here is transposed:
// its rows are p.n, its columns p.m). `vec`: dw takes 16-byte stores (aligned, dw_lead a multiple of 4).
template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    conv2d_simt_wgrad_kernel(const __grid_constant__ WgradParams<float> p, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async (sm_80+): conv2d_simt_supported refuses such GPUs; a JIT of older code must not run silently
#else
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  float* const smem = reinterpret_cast<float*>(smem_bytes);
  const int gm = p.n, gn = p.m;  // the GEMM's rows (R S C) and columns (K)
  const int mt = static_cast<int>(blockIdx.x) / p.tiles_n, nt = static_cast<int>(blockIdx.x) % p.tiles_n;
  const int m0 = mt * C::BM, n0 = nt * C::BN;
  const int64_t kb = static_cast<int64_t>(blockIdx.z) * p.kt_per_split * C::BK;
  const int64_t ke = std::min<int64_t>(p.k, kb + static_cast<int64_t>(p.kt_per_split) * C::BK);
  const int64_t klen = ke > kb ? ke - kb : 0;

  WgradGatherLoader<C> la;
  la.init(p.g, m0, gm, static_cast<int>(kb));
  AsyncRowLoader<float, C::BN, C::BK, C::THREADS, C::LDB> lb;
  lb.init(p.dy + kb * p.dy_lead + n0, 1, p.dy_lead, min(gn - n0, C::BN));
  int a_off, b_off;
  float acc[C::TM][C::TN];
  thread_start<C>(a_off, b_off, acc);
  const int64_t ktiles = (klen + C::BK - 1) / C::BK;
  simt_k_loop<C>(la, lb, smem, ktiles, static_cast<int>(klen - (ktiles - 1) * C::BK), a_off, b_off, acc);

  // The thread's VW consecutive rows j of one column i are VW consecutive floats of dw's row i.
  float* const out = p.partial != nullptr ? p.partial + static_cast<int64_t>(blockIdx.z) * gn * gm : p.dw;
  const int64_t lead = p.partial != nullptr ? gm : p.dw_lead;
  const bool vec_ok = p.partial != nullptr || vec;
  using V = Vec<float, C::VW>;
#pragma unroll
  for (int ip = 0; ip < C::ITM; ++ip) {
    const int row = m0 + patch_row<C>(a_off, ip * C::VW);
#pragma unroll
    for (int j = 0; j < C::TN; ++j) {
      const int col = n0 + patch_col<C>(b_off, j / C::VW) + j % C::VW;
      if (col >= gn || row >= gm) continue;
      float* dst = out + col * lead + row;
      V v;
#pragma unroll
      for (int e = 0; e < C::VW; ++e) v.v[e] = acc[ip * C::VW + e][j];
      if (vec_ok && row + C::VW <= gm) {
        *reinterpret_cast<V*>(dst) = v;
      } else {
#pragma unroll
        for (int e = 0; e < C::VW; ++e) {
          if (row + e < gm) dst[e] = v.v[e];
        }
      }
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side

template <class C, bool kRelu>
cudaError_t launch_fprop(FpropParams<float> p, cudaStream_t stream) {
  constexpr auto kernel = conv2d_simt_fprop_kernel<C, kRelu>;
  cudaError_t err = prepare_kernel<kernel>(FpropSmem<C>::BYTES);
  if (err != cudaSuccess) return err;
  p.tiles_m = ceil_div(p.m, C::BM);
  p.tiles_n = ceil_div(p.n, C::BN);
  kernel<<<static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), C::THREADS, FpropSmem<C>::BYTES,
           stream>>>(p);
  return cudaGetLastError();
}

cudaError_t run_fprop(const FpropParams<float>& p, bool relu, bool /*stats: computed after, by conv2d()*/,
                      cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.n <= 64) return relu ? launch_fprop<SimtTall, true>(p, stream) : launch_fprop<SimtTall, false>(p, stream);
  return relu ? launch_fprop<SimtWide, true>(p, stream) : launch_fprop<SimtWide, false>(p, stream);
}

// backward_weight's GEMM: R S C rows, K columns, N P Q deep; 256 x 64 tiles for at most 64 output channels.
template <class C>
int64_t wgrad_tiles(const Conv2dShape& sh) {
  return static_cast<int64_t>(ceil_div(sh.r * sh.s * sh.c, C::BM)) * ceil_div(sh.k, C::BN);
}

// Splits of the pixels (wgrad_split_count), each at least 16 k tiles (256 pixels, so the epilogue's stores stay
// small against the FMAs).
template <class C>
int wgrad_splits(const Conv2dShape& sh) {
  return wgrad_split_count(wgrad_tiles<C>(sh), (sh.n * sh.p * sh.q + C::BK - 1) / C::BK, C::MIN_BLOCKS, 16);
}

int wgrad_splits_for(const Conv2dShape& sh) {
  return sh.k <= 64 ? wgrad_splits<SimtTall>(sh) : wgrad_splits<SimtWide>(sh);
}

template <class C>
cudaError_t launch_wgrad(WgradParams<float> p, int splits, bool vec, cudaStream_t stream) {
  constexpr auto kernel = conv2d_simt_wgrad_kernel<C>;
  cudaError_t err = prepare_kernel<kernel>(WgradSmem<C>::BYTES);
  if (err != cudaSuccess) return err;
  p.tiles_m = ceil_div(p.n, C::BM);  // the transposed GEMM's row tiles (R S C) ...
  p.tiles_n = ceil_div(p.m, C::BN);  // ... and column tiles (K)
  const int64_t num_kt = (static_cast<int64_t>(p.k) + C::BK - 1) / C::BK;
  p.kt_per_split = static_cast<int>(std::max<int64_t>(1, (num_kt + splits - 1) / splits));
  const dim3 grid(static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), 1,
                  static_cast<unsigned>(splits));
  kernel<<<grid, C::THREADS, WgradSmem<C>::BYTES, stream>>>(p, vec);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return launch_wgrad_reduce(p.partial, splits, p.m, p.n, p.dw, nullptr, p.dw_lead, stream);
}

cudaError_t forward(const Conv2dArgs<float>& a, cudaStream_t stream, void* workspace) {
  return forward_gemm(a, stream, workspace, run_fprop, 0);
}

cudaError_t backward_input(const Conv2dArgs<float>& a, cudaStream_t stream, void* workspace) {
  return backward_input_gemm(a, stream, workspace, each_phase<float>(run_fprop));
}

cudaError_t backward_weight(const Conv2dArgs<float>& a, cudaStream_t stream, void* workspace) {
  const Conv2dShape& sh = a.shape;
  WgradParams<float> p;
  p.m = static_cast<int>(sh.k);
  p.n = static_cast<int>(sh.r * sh.s * sh.c);
  p.k = static_cast<int>(sh.n * sh.p * sh.q);
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  p.g = input_gather(a);
  p.dy = a.y.data;
  p.dy_lead = sh.k;
  p.dw = a.w.data;
  p.dw_lead = a.w.sn;
  const int splits = p.k == 0 ? 1 : wgrad_splits_for(sh);
  p.partial = splits > 1 ? static_cast<float*>(workspace) : nullptr;
  const bool vec = aligned_to(p.dw, 16) && p.dw_lead % 4 == 0;
  return sh.k <= 64 ? launch_wgrad<SimtTall>(p, splits, vec, stream) : launch_wgrad<SimtWide>(p, splits, vec, stream);
}

}  // namespace

template <typename T>
bool conv2d_simt_supported(Conv2dPass pass, const Conv2dArgs<T>& a, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if constexpr (!std::is_same_v<T, float>) {
    return fail("implicit_simt: float32 only (bf16 / fp16 run on the tensor-core versions, float64 on direct and "
                "im2col)");
  } else {
    if (compute_capability() < 80) return fail("implicit_simt: needs a GPU of compute capability 8.0 or newer");
    if (smem_optin() < FpropSmem<SimtTall>::BYTES) {
      return fail("implicit_simt: the device has too little shared memory");
    }
    return implicit_operands_supported(pass, a, why);  // implicit_mma's operands: the same drivers
  }
}

template <typename T>
size_t conv2d_simt_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& a) {
  if constexpr (!std::is_same_v<T, float>) {
    return 0;
  } else {
    const Conv2dShape& sh = a.shape;
    switch (pass) {
      case Conv2dPass::forward:
        return 0;
      case Conv2dPass::backward_input:
        return backward_input_workspace_bytes<float>(sh);
      case Conv2dPass::backward_weight: {
        const int64_t splits = sh.n * sh.p * sh.q == 0 ? 1 : wgrad_splits_for(sh);
        return wgrad_partials_bytes(splits, sh);
      }
    }
    return 0;
  }
}

template <typename T>
cudaError_t conv2d_simt(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if constexpr (!std::is_same_v<T, float>) {
    return cudaErrorNotSupported;
  } else {
    if (!conv2d_simt_supported(pass, args, nullptr) || args.stats != nullptr) return cudaErrorNotSupported;
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

#define TORCHEXT_INSTANTIATE_CONV2D_SIMT(T)                                                        \
  template bool conv2d_simt_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**);         \
  template size_t conv2d_simt_workspace_bytes<T>(Conv2dPass, const Conv2dArgs<T>&);               \
  template cudaError_t conv2d_simt<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D_SIMT(float)
TORCHEXT_INSTANTIATE_CONV2D_SIMT(double)
TORCHEXT_INSTANTIATE_CONV2D_SIMT(__half)
TORCHEXT_INSTANTIATE_CONV2D_SIMT(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_SIMT

}  // namespace torchext::cuda_ops
