// implicit_tma's weight gradient on Hopper's wgmma (sm_90a), bf16 / fp16, accumulation in float32:
//   dw (K, R S C) = dy^T (K, N P Q) A (N P Q, R S C),   A[pixel, (tap, c)] = x[n, p stride - pad + r dil, ...]
// for NHWC (channels-last) x and dy and a KRSC (channels-last) dw. The GEMM's reduction runs over the output pixels:
// N P Q is long (524,288 for ResNet-18's first stage at batch 512) and K x R S C small (64 x 576), so the pixels are
// split among the blocks and the splits' float32 partial tiles are added in a fixed order (deterministic).
//
// What this adds over implicit_mma's weight gradient (mma.sync with cp.async gathers, cuda_ops/conv2d_implicit.cu):
//   - Both operands come from the copy engine as boxes of the NHWC tensors, as in implicit_tma's forward
//     (cuda_ops/conv2d_wgmma.cu): a k-step is a box of whole output rows (box_n images x box_p rows x all Q columns,
//     at most 112 pixels); dy's box is {64 output channels, Q, box_p, box_n} at the step's pixels, and each of x's
//     three boxes is {64 input channels, Q columns x stride, box_p rows x stride, box_n} at coordinates shifted by
//     its tap, which TMA zero-fills where the window leaves the image (the padding) and strides (stride 2). One
//     thread issues every copy; a stage completes on its barrier's byte count.
//   - Both operands are MN-major in shared memory (each pixel a 128-byte row of 64 channels, 128-byte swizzled by the
//     copy engine), which wgmma reads transposed: no shuffling of the gathered operand.
//   - Tiles of 128 output channels (two consumer warpgroups of 64) x 192 columns (three 64-channel boxes: taps, or
//     channel chunks of one tap), one m64n192k16 wgmma per consumer and 16 pixels. With 64 output channels both
//     consumers share the tile and take alternate 16-pixel steps, each leaving its own partial sums.
//   - A persistent grid over (tile, split) units; the split count balances the waves against the partials' traffic.
//   - Rows of a stage past the box's pixels (the box's pixel count rounded up to 16) are zeroed once at the start:
//     the copy engine never writes them, so they add nothing.
//
// Requirements (conv2d_tma_wgrad_supported): what implicit_tma's forward needs (an sm_90 GPU, bf16 / fp16, an sm_90a
// build), what implicit_mma's weight gradient needs of the layouts (x channels-last, dy dense channels-last, dw
// KRSC, channel counts multiples of 8), at least 64 input and 64 output channels, R S ceil(C / 64) a multiple of 3
// (every 3x3 kernel; a 7x7 or 1x1 one only where ceil(C / 64) is a multiple of 3: the others run on implicit_mma),
// output rows of at most 112 pixels (Q <= 112, Q stride_w <= 256), strides at most 8.
//
// Deterministic: the split count depends on the shape and the GPU's multiprocessor count, so results are the same
// bits run to run on one GPU model, and may differ in the last bits between models.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.cuh"
#include "conv2d.cuh"
#include "conv2d_implicit.cuh"
#include "sm90.cuh"

namespace torchext::cuda_ops {
namespace {

using namespace sm90;

constexpr int kThreads = 384;                 // producer warpgroup + two consumer warpgroups
constexpr int kBoxesB = 3;                    // x's 64-channel boxes per tile
constexpr int kBN = 64 * kBoxesB;             // columns (tap, channel) per tile
constexpr int kRowBytes = 128;                // one pixel of one box: 64 bf16 / fp16 channels
constexpr int kMaxRows = 112;                 // pixels per k-step, at most
constexpr int kMaxStages = 8;
constexpr int kStageBudget = 216 * 1024;      // shared memory for the stages
constexpr int kSmemBytes = 1024 /* alignment slack */ + kStageBudget + 2 * kMaxStages * 8;

// The launch's geometry, computed on the host (plan_wgrad).
struct WgradTmaPlan {
  int box_q = 0, box_p = 0, box_n = 0;  // a k-step's pixels: box_n images x box_p rows x box_q (= Q) columns
  int rows = 0, bk = 0;                 // box_n box_p box_q, and that rounded up to 16 (the stage's rows)
  int tiles_p = 1, steps_k = 0;         // k-steps per box_n images (ceil(P / box_p)), k-steps in all
  int chunks = 1, taps_s = 1;           // 64-channel chunks per tap, taps per kernel row
  int bm = 128, tiles_m = 0, tiles_n = 0, splits = 1, per_split = 0, slots = 1;
  int stages = 0, stage_bytes = 0;
  int stride_h = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int k = 0, n = 0, c = 0;  // output channels, R S C, input channels
  uint32_t tx_bytes = 0;
};

template <typename T>
struct WgradTmaParams {
  WgradTmaPlan plan;
  T* dw = nullptr;          // one slot: element (i, j) at dw + i dw_lead + j
  float* dw_acc = nullptr;  // or there, in float (Conv2dArgs::w_acc)
  int64_t dw_lead = 0;
  float* partial = nullptr;  // several slots: [slot][k][n]
};

#if defined(TORCHEXT_WGMMA_DEVICE)

// D (64 x 192, float) += A (64 x 16) B (16 x 192), both MN-major (transposed) in shared memory.
template <typename T>
struct WgradWgmma;

#define TORCHEXT_WGRAD_WGMMA(T, PTX_TYPE)                                                                  \
  template <>                                                                                              \
  struct WgradWgmma<T> {                                                                                   \
    __device__ __forceinline__ static void run(float (&d)[96], uint64_t desc_a, uint64_t desc_b) {        \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                             \
                   "wgmma.mma_async.sync.aligned.m64n192k16.f32." PTX_TYPE "." PTX_TYPE " "               \
                   TORCHEXT_WGMMA_D_REGS_96 ", %96, %97, p, 1, 1, 1, 1;\n}\n"                           \
                   : TORCHEXT_WGMMA_D_OPERANDS_96(d)                                                     \
                   : "l"(desc_a), "l"(desc_b));                                                            \
    }                                                                                                      \
  };
TORCHEXT_WGRAD_WGMMA(__nv_bfloat16, "bf16")
TORCHEXT_WGRAD_WGMMA(__half, "f16")
#undef TORCHEXT_WGRAD_WGMMA

#endif  // TORCHEXT_WGMMA_DEVICE

// Stage layout: kChunksA boxes of dy (64 output channels each), then kBoxesB boxes of x, each bk rows of 128 bytes.
// Units are (tile, split), tile = tn tiles_m + tm, unit = split tiles + tile, so the blocks working at one time
// share the pixels they read.
template <typename T, int BM>
__global__ void __launch_bounds__(kThreads, 1)
    conv2d_wgrad_tma_kernel(const WgradTmaParams<T> p, const __grid_constant__ CUtensorMap map_dy,
                            const __grid_constant__ CUtensorMap map_x) {
#if defined(TORCHEXT_WGMMA_DEVICE)
  constexpr int kChunksA = BM / 64;
  const WgradTmaPlan& pl = p.plan;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzling repeats every 1024 bytes and is computed from the address: boxes start on 1024.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int stages = pl.stages, chunk_bytes = pl.bk * kRowBytes, stage_bytes = pl.stage_bytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + stages * stage_bytes);
  uint64_t* empty = full + stages;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles = pl.tiles_m * pl.tiles_n, units = tiles * pl.splits;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);  // the producer's arrive; the bytes come from the copies
      mbar_init(&empty[s], 8);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (pl.rows < pl.bk) {  // the rows no box writes: zero once, for the tensor cores (the async proxy)
    const int pad = (pl.bk - pl.rows) * kRowBytes, total = stages * (kChunksA + kBoxesB) * pad;
    for (int i = threadIdx.x * 16; i < total; i += kThreads * 16) {
      *reinterpret_cast<int4*>(smem + (i / pad) * chunk_bytes + pl.rows * kRowBytes + i % pad) = make_int4(0, 0, 0, 0);
    }
    fence_proxy_async();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // Producer: one thread issues every box.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    if (tid == 0) {
      int s = 0;
      uint32_t phase = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const int tile = u % tiles, split = u / tiles;
        const int tm = tile % pl.tiles_m, tn = tile / pl.tiles_m;
        int xc[kBoxesB], xw[kBoxesB], xh[kBoxesB];  // x's boxes: channel, column and row offsets of their taps
#pragma unroll
        for (int b = 0; b < kBoxesB; ++b) {
          const int box = tn * kBoxesB + b, tap = box / pl.chunks, tr = tap / pl.taps_s;
          xc[b] = (box - tap * pl.chunks) * 64;
          xw[b] = (tap - tr * pl.taps_s) * pl.dil_w - pl.pad_w;
          xh[b] = tr * pl.dil_h - pl.pad_h;
        }
        const int kt0 = split * pl.per_split, kt1 = min(pl.steps_k, kt0 + pl.per_split);
        for (int kt = kt0; kt < kt1; ++kt) {
          const int n0 = (kt / pl.tiles_p) * pl.box_n, p0 = (kt % pl.tiles_p) * pl.box_p;
          mbar_wait(&empty[s], phase ^ 1);
          uint8_t* base = smem + s * stage_bytes;
          mbar_arrive_expect_tx(&full[s], pl.tx_bytes);
#pragma unroll
          for (int a = 0; a < kChunksA; ++a) {
            tma_load_4d(base + a * chunk_bytes, &map_dy, &full[s], tm * BM + 64 * a, 0, p0, n0);
          }
#pragma unroll
          for (int b = 0; b < kBoxesB; ++b) {
            tma_load_4d(base + (kChunksA + b) * chunk_bytes, &map_x, &full[s], xc[b], xw[b],
                        p0 * pl.stride_h + xh[b], n0);
          }
          if (++s == stages) s = 0, phase ^= 1;
        }
      }
    }
  } else {
    // Consumers: with 128 output channels, consumer c multiplies dy's box c by x's three boxes; with 64, both
    // multiply box 0, consumer c taking the 16-pixel steps c, c + 2, ... and leaving its own partial sums.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    const int consumer = warpgroup - 1, warp = tid / 32, lane = tid % 32;
    const int a_chunk = BM == 128 ? consumer : 0;
    const int step0 = BM == 128 ? 0 : consumer, step_inc = BM == 128 ? 1 : 2;
    const uint32_t stage0 = smem_addr(smem);
    // Descriptors of stage 0, step 0: other stages and steps are constant offsets (>> 4) of the address field.
    const uint32_t desc_a = smem_desc_lo(stage0 + a_chunk * chunk_bytes, chunk_bytes);
    const uint32_t desc_b = smem_desc_lo(stage0 + kChunksA * chunk_bytes, chunk_bytes);
    constexpr uint32_t kDescHi = smem_desc_hi(1024);
    constexpr uint32_t kStepUnits = 16 * kRowBytes >> 4;  // 16 pixels
    const int steps = pl.bk / 16;
    float d[96];
    int stage = 0, prev_stage = 0;
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const int tile = u % tiles, split = u / tiles;
      const int tm = tile % pl.tiles_m, tn = tile / pl.tiles_m;
      const int kt0 = split * pl.per_split, kt1 = min(pl.steps_k, kt0 + pl.per_split);
#pragma unroll
      for (int i = 0; i < 96; ++i) d[i] = 0.f;
      for (int kt = kt0; kt < kt1; ++kt) {
        mbar_wait(&full[stage], phase);
        const uint32_t so = uint32_t(stage * stage_bytes) >> 4;
        wgmma_fence();
        for (int step = step0; step < steps; step += step_inc) {
          WgradWgmma<T>::run(d, smem_desc(desc_a + so + step * kStepUnits, kDescHi),
                             smem_desc(desc_b + so + step * kStepUnits, kDescHi));
        }
        wgmma_commit();
        wgmma_wait<1>();  // this stage's wgmmas stay in flight; the previous stage's are done
        if (kt > kt0 && lane == 0) mbar_arrive(&empty[prev_stage]);
        prev_stage = stage;
        if (++stage == stages) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      if (kt1 > kt0 && lane == 0) mbar_arrive(&empty[prev_stage]);
#pragma unroll
      for (int i = 0; i < 96; ++i) asm volatile("" : "+f"(d[i])::"memory");

      // Epilogue. Accumulator layout of m64nNk16: warp w holds rows 16 w + lane / 4 (registers 4 j, 4 j + 1) and
      // + 8 (4 j + 2, 4 j + 3), columns 8 j + 2 (lane % 4) and + 1. Rows are output channels; column 64 b + cc is
      // channel 64 chunk + cc of tap `tap`, with (tap, chunk) = x's box b of the tile.
      const int slot = BM == 128 ? split : 2 * split + consumer;
      const int row0 = tm * BM + a_chunk * 64 + warp * 16 + lane / 4;
#pragma unroll
      for (int b = 0; b < kBoxesB; ++b) {
        const int box = tn * kBoxesB + b, tap = box / pl.chunks;
        const int c_base = (box - tap * pl.chunks) * 64;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = 8 * b + jj, c = c_base + 8 * jj + 2 * (lane & 3);
          if (c >= pl.c) continue;  // C is a multiple of 8: a pair is valid whole or not at all
          const int64_t col = static_cast<int64_t>(tap) * pl.c + c;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row >= pl.k) continue;
            const float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
            if (p.partial == nullptr && p.dw_acc != nullptr) {
              *reinterpret_cast<float2*>(p.dw_acc + row * p.dw_lead + col) = make_float2(v0, v1);
            } else if (p.partial == nullptr) {
              *reinterpret_cast<Vec<T, 2>*>(p.dw + row * p.dw_lead + col) =
                  Vec<T, 2>{{static_cast<T>(v0), static_cast<T>(v1)}};
            } else {
              *reinterpret_cast<float2*>(p.partial + (static_cast<int64_t>(slot) * pl.k + row) * pl.n + col) =
                  make_float2(v0, v1);
            }
          }
        }
      }
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side

// The k-step's pixel box: box_q = Q, and (box_p, box_n) with at most kMaxRows pixels that wastes the fewest rows
// (the rows past the pixels, rounded up to 16, and the rows of a last partial box past P), the larger box on ties.
bool plan_pixels(const Conv2dShape& sh, WgradTmaPlan& pl) {
  if (sh.q > kMaxRows || sh.q * sh.stride_w > 256 || sh.stride_h > 8 || sh.stride_w > 8) return false;
  int64_t best_cost = INT64_MAX;
  for (int64_t bp = 1; bp <= sh.p && bp * sh.q <= kMaxRows && bp * sh.stride_h <= 256; ++bp) {
    for (int64_t bn = 1; bn <= (bp == sh.p ? std::min<int64_t>(sh.n, 256) : 1) && bn * bp * sh.q <= kMaxRows; ++bn) {
      const int64_t rows = bn * bp * sh.q, bk = (rows + 15) / 16 * 16;
      const int64_t steps = ((sh.n + bn - 1) / bn) * ((sh.p + bp - 1) / bp);
      const int64_t cost = steps * bk;
      if (cost < best_cost || (cost == best_cost && rows > pl.rows)) {
        best_cost = cost;
        pl.box_q = static_cast<int>(sh.q), pl.box_p = static_cast<int>(bp), pl.box_n = static_cast<int>(bn);
        pl.rows = static_cast<int>(rows), pl.bk = static_cast<int>(bk);
        pl.tiles_p = static_cast<int>((sh.p + bp - 1) / bp);
        pl.steps_k = static_cast<int>(steps);
      }
    }
  }
  return pl.rows > 0;
}

// The launch's geometry: boxes, tiles, stages; false where the rung cannot run the shape. Cheap: the support checks
// call it alone; the launch adds plan_splits.
bool plan_geometry(const Conv2dShape& sh, WgradTmaPlan& pl) {
  if (sh.c < 64 || sh.k < 64) return false;
  pl.chunks = ceil_div(sh.c, 64);
  const int64_t boxes = sh.r * sh.s * pl.chunks;
  if (boxes % kBoxesB != 0 || !plan_pixels(sh, pl)) return false;
  pl.bm = sh.k <= 64 ? 64 : 128;
  pl.tiles_m = ceil_div(sh.k, pl.bm);
  pl.tiles_n = static_cast<int>(boxes / kBoxesB);
  pl.taps_s = static_cast<int>(sh.s);
  pl.stride_h = static_cast<int>(sh.stride_h);
  pl.pad_h = static_cast<int>(sh.pad_h), pl.pad_w = static_cast<int>(sh.pad_w);
  pl.dil_h = static_cast<int>(sh.dil_h), pl.dil_w = static_cast<int>(sh.dil_w);
  pl.k = static_cast<int>(sh.k), pl.n = static_cast<int>(sh.r * sh.s * sh.c), pl.c = static_cast<int>(sh.c);
  const int boxes_per_stage = pl.bm / 64 + kBoxesB;
  pl.stage_bytes = boxes_per_stage * pl.bk * kRowBytes;
  pl.stages = std::min(kMaxStages, kStageBudget / pl.stage_bytes);
  if (pl.stages < 2) return false;
  pl.tx_bytes = static_cast<uint32_t>(boxes_per_stage * pl.rows * kRowBytes);
  return true;
}

// The split count (at most 1024) that minimizes an estimate of the time: the waves of (tile, split) units times each
// unit's k-steps, plus writing and reading back the partial sums. Only the smallest split count of each k-steps-per-
// split value is a candidate, so the walk goes from one such value to the next (about 2 sqrt(steps) candidates).
void plan_splits(int sms, WgradTmaPlan& pl) {
  const int64_t tiles = static_cast<int64_t>(pl.tiles_m) * pl.tiles_n, steps = pl.steps_k;
  const double step_us = 2.0 * pl.bm * kBN * pl.bk / 4.5e6;  // one k-step of one tile at ~4.5 TFLOP/s per SM
  const double partial_us_per_slot = 2.0 * 4.0 * pl.k * pl.n / 3.0e6;  // written once, read once, at ~3 TB/s
  const int64_t most = std::min<int64_t>(steps, 1024);
  double best = 1e300;
  for (int64_t s = 1; s <= most;) {
    const int64_t per = (steps + s - 1) / s;
    const int64_t waves = (tiles * s + sms - 1) / sms;
    const int64_t slots = pl.bm == 64 ? 2 * s : s;
    const double t = waves * per * step_us + (slots > 1 ? slots * partial_us_per_slot : 0.0);
    if (t < best) best = t, pl.splits = static_cast<int>(s), pl.per_split = static_cast<int>(per);
    if (per == 1) break;
    s = (steps + per - 2) / (per - 1);  // the smallest split count with fewer k-steps per split
  }
  pl.slots = pl.bm == 64 ? 2 * pl.splits : pl.splits;
}

bool plan_wgrad(const Conv2dShape& sh, int sms, WgradTmaPlan& pl) {
  if (!plan_geometry(sh, pl)) return false;
  plan_splits(sms, pl);
  return true;
}

// x and dy readable as TMA boxes; dw's rows writable as pairs (the epilogue's 4-byte stores of one slot, 8-byte into
// w_acc).
template <typename T>
bool tma_wgrad_layouts_ok(const Conv2dArgs<T>& a) {
  const Conv2dShape& sh = a.shape;
  cuuint64_t strides[3];
  const bool dw_ok = a.w_acc != nullptr ? aligned_to(a.w_acc, 2 * sizeof(float)) : aligned_to(a.w.data, 2 * sizeof(T));
  return tma_strides<T>(sh.c, sh.w, sh.h, sh.n, a.x.sw, a.x.sh, a.x.sn, strides) &&
         tma_strides<T>(sh.k, sh.q, sh.p, sh.n, a.y.sw, a.y.sh, a.y.sn, strides) && (a.w.sn % 2 == 0 || sh.k <= 1) &&
         dw_ok;
}

// The input rows the convolution reads: the last valid output row's last tap, plus one. x's map ends there, so a
// k-step's rows past P (a last partial box) read zeros, not image rows no output uses (0 * inf would be NaN).
inline int64_t rows_read(const Conv2dShape& sh) {
  const int64_t last = (sh.p - 1) * sh.stride_h - sh.pad_h + (sh.r - 1) * sh.dil_h;
  return std::clamp<int64_t>(last + 1, 1, sh.h);
}

template <typename T, int BM>
cudaError_t launch_wgrad_tma(const WgradTmaParams<T>& p, const CUtensorMap (&maps)[2], cudaStream_t stream) {
  constexpr auto kernel = conv2d_wgrad_tma_kernel<T, BM>;
  cudaError_t err = prepare_kernel<kernel>(kSmemBytes);
  if (err != cudaSuccess) return err;
  const WgradTmaPlan& pl = p.plan;
  const int64_t units = static_cast<int64_t>(pl.tiles_m) * pl.tiles_n * pl.splits;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(units, sm_count()));
  const int smem = 1024 + pl.stages * pl.stage_bytes + 2 * pl.stages * 8;
  kernel<<<grid, kThreads, smem, stream>>>(p, maps[0], maps[1]);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.partial == nullptr) return err;
  return launch_wgrad_reduce(p.partial, pl.slots, pl.k, pl.n, p.dw, p.dw_acc, p.dw_lead, stream);
}

}  // namespace

template <typename T>
bool conv2d_tma_wgrad_supported(const Conv2dArgs<T>& a, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const Conv2dShape& sh = a.shape;
  if (sh.n * sh.p * sh.q == 0 || sh.k * sh.c * sh.r * sh.s == 0) return true;  // nothing to multiply
  if (smem_optin() < kSmemBytes) return fail("implicit_tma: the device has too little shared memory");
  WgradTmaPlan pl;
  if (!plan_geometry(sh, pl)) {
    return fail("implicit_tma: backward_weight needs at least 64 input and output channels, R S ceil(C / 64) a "
                "multiple of 3 (every 3x3 kernel), output rows of at most 112 pixels and strides at most 8 "
                "(implicit_mma runs the others)");
  }
  if (!tma_wgrad_layouts_ok(a)) return fail("implicit_tma: x and grad_output must be channels-last");
  return true;
}

template <typename T>
size_t conv2d_tma_wgrad_workspace_bytes(const Conv2dArgs<T>& a) {
  WgradTmaPlan pl;
  if (!plan_wgrad(a.shape, sm_count(), pl) || pl.slots <= 1) return 0;
  return static_cast<size_t>(pl.slots) * pl.k * pl.n * sizeof(float);
}

template <typename T>
cudaError_t conv2d_tma_wgrad(const Conv2dArgs<T>& a, cudaStream_t stream, void* workspace) {
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return cudaErrorNotSupported;
  } else {
    const Conv2dShape& sh = a.shape;
    if (sh.k * sh.c * sh.r * sh.s == 0) return cudaSuccess;
    if (sh.n * sh.p * sh.q == 0) {  // no pixels: dw = 0 (KRSC, rows of R S C values dw_lead apart)
      const size_t elem = a.w_acc != nullptr ? sizeof(float) : sizeof(T), row = sh.r * sh.s * sh.c * elem;
      void* dw = a.w_acc != nullptr ? static_cast<void*>(a.w_acc) : static_cast<void*>(a.w.data);
      return cudaMemset2DAsync(dw, sh.k > 1 ? a.w.sn * elem : row, 0, row, sh.k, stream);
    }
    WgradTmaParams<T> p;
    if (!plan_wgrad(sh, sm_count(), p.plan) || !tma_wgrad_layouts_ok(a)) return cudaErrorNotSupported;
    p.dw = a.w.data;
    p.dw_acc = a.w_acc;
    p.dw_lead = a.w.sn;
    p.partial = p.plan.slots > 1 ? static_cast<float*>(workspace) : nullptr;
    CUtensorMap maps[2];
    const WgradTmaPlan& pl = p.plan;
    if (!encode_nhwc_map<T>(maps[0], a.y.data, sh.k, sh.q, sh.p, sh.n, a.y.sw, a.y.sh, a.y.sn, pl.box_q, pl.box_p,
                            pl.box_n, 1, 1) ||
        !encode_nhwc_map<T>(maps[1], a.x.data, sh.c, sh.w, rows_read(sh), sh.n, a.x.sw, a.x.sh, a.x.sn, pl.box_q, pl.box_p,
                            pl.box_n, static_cast<int>(sh.stride_w), static_cast<int>(sh.stride_h))) {
      return cudaErrorNotSupported;
    }
    return pl.bm == 64 ? launch_wgrad_tma<T, 64>(p, maps, stream) : launch_wgrad_tma<T, 128>(p, maps, stream);
  }
}

#define TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA(T)                                            \
  template bool conv2d_tma_wgrad_supported<T>(const Conv2dArgs<T>&, const char**);         \
  template size_t conv2d_tma_wgrad_workspace_bytes<T>(const Conv2dArgs<T>&);               \
  template cudaError_t conv2d_tma_wgrad<T>(const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA(float)
TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA(double)
TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA(__half)
TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_WGRAD_TMA

}  // namespace torchext::cuda_ops
