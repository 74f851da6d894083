// Convolution as an implicit GEMM on Hopper's tensor cores (wgmma, sm_90a): the forward and the input's gradient of
// cuda_ops/conv2d.cuh for NHWC (channels-last) activations and KRSC weights in bf16 / fp16, accumulation in float32.
// The same GEMMs as cuda_ops/conv2d_implicit.cu (the forward y (N P Q, K) = A (N P Q, R S C) B (R S C, K) with A
// gathered from x; backward_input as one such GEMM per stride phase over dy and a gathered sub-kernel of w), built
// by the same drivers (cuda_ops/conv2d_implicit.cuh); backward_weight stays on implicit_mma.
//
// What this version adds over mma.sync (implicit_mma):
//   - wgmma: one instruction multiplies a 64 x N x 16 block for a warpgroup (4 warps), reading both operands from
//     shared memory through descriptors. mma.sync's ldmatrix traffic and register fragments go away, and with them
//     the register pressure that left implicit_mma at 6-8 warps per SM and its tensor pipe idle 70-80% of the time
//     (docs/conv2d.md, Nsight Compute).
//   - Warp specialization: warpgroup 0 produces (it gathers the tiles), warpgroups 1 and 2 consume (each owns 128
//     output rows: two m64 wgmmas per k-step). The gathered operand cannot come from TMA's tiled mode (each row is a
//     different input pixel, or padding), so the 128 producer threads copy it with cp.async, 16 bytes (8 channels)
//     at a time, into the 128-byte-swizzled layout wgmma reads; a chunk in the padding is zero-filled by cp.async's
//     src-size operand. The weight tile is copied the same way.
//   - An mbarrier ring of stages ("full": the stage's copies have landed; "empty": both consumers are done with it).
//     cp.async writes through the generic proxy and wgmma reads through the async proxy, so a producer thread
//     signals a stage only after its copies have completed (cp.async.wait_group) and it has issued
//     fence.proxy.async; it does so kLag stages behind the one it is filling, so the copies of kLag + 1 stages are
//     in flight.
//   - Persistent grid: one block per SM walks the tiles; the producer starts the next tile's copies while the
//     consumers run the epilogue of the current one. Convolutions have short k-loops (R S C: 576 for 64 channels,
//     9 k-steps), so filling the pipeline once per tile would cost a large share of the time.
//   - Epilogue from the accumulators: bias, relu, the stores, and batch norm's per-channel sum and sum of squares of
//     the stored values: a fixed tree over each warp's rows (shuffles), the 8 warps added in order through shared
//     memory, one partial per (channel, tile) into the workspace, and the shared second kernel adds the tiles in
//     order (deterministic). implicit_wgmma stores from the registers (two values per thread and row).
//   - implicit_tma's TMA-store epilogue: the consumers write the tile into a 128-byte-swizzled staging buffer
//     (stmatrix, conflict-free), one thread stores it with the copy engine as one 4-D box per 64 output channels
//     (the output's tensor map; the copy engine drops what lies outside it), and both consumers go on to the next
//     tile's k-loop while the copy drains; the staging is reused once that copy has read it. Stored from the
//     registers, the epilogue held both consumers, and so the tensor pipe, for about 40% of the time at 128 -> 128
//     channels, 16x16 (Nsight Compute's warp samples: 3119 in the epilogue against 4164 in the k-loop): 16 pairs of
//     4-byte stores per row group, each instruction touching 8 rows, every SM storing at the same moment. The
//     staging takes room from the rings (WgTile). TORCHEXT_CONV2D_TMA_STORE=0 switches it off; an output without a
//     tensor map (rows not 16-byte multiples, stride phases that do not nest) stores from the registers.
//   - implicit_tma's halo plan (stride 1, one image per tile, Q a multiple of 8): the input window of one tap column
//     s is loaded once, the tile's rows plus R - 1 more (one TMA box), and the R taps' A operands are that box from
//     row r Q on (whole 1024-byte swizzle atoms); boxes and weight tiles travel in two rings. Where each tap's
//     window was its own box, nine boxes of 256 rows became three of 320 at 32x32: the 64-channel layers were
//     L2-bound (docs/conv2d.md). It needs R of 2 or 3 and (R - 1) dil_h Q <= 128 (make_tma_maps), and serves every
//     one-GEMM launch: the forward and a stride-1 input gradient (or a launch of one stride phase).
//   - implicit_tma's backward_input: the stride phases' GEMMs (4 at stride 2, with 1 to 4 taps each) share one
//     persistent launch (PhaseSet: each tile finds its phase's parameters and tensor maps), the phases with the
//     longest k-loops first, where one launch per phase paid a pipeline fill and a tail for each short GEMM.
//
// Tiles: 256 (output pixels) x 128 (output channels), or 256 x 64 where there are at most 64 output channels; k-steps
// of 64 values (128 bytes: one swizzle span), 4 stages of 48 KiB (5 of 40 KiB for 256 x 64; the halo plan: 3 boxes of
// 48 KiB and 4 weight tiles of 16 KiB, or 6 of 8 KiB). With the TMA-store epilogue's staging (64 or 32 KiB): 3
// stages (4 for 256 x 64); the halo plan 2 boxes and 3 weight tiles (3 and 4 for 256 x 64). The ring's order is
// global: stages carry on from one tile to the next.
//
// Requirements (conv2d_wgmma_supported): an sm_90 GPU and a build with sm_90a code; bf16 or fp16 (float32 and tf32
// run on implicit_mma); forward or backward_input; and what implicit_mma requires of the operands (channels-last,
// channel counts a multiple of 8, 16-byte aligned rows; KRSC weights; backward_input dilation 1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common.cuh"
#include "conv2d.cuh"
#include "conv2d_implicit.cuh"
#include "mma_sync.cuh"  // cp.async wrappers
#include "sm90.cuh"

namespace torchext::cuda_ops {
namespace {

using namespace sm90;

constexpr int kRowBytes = 128;  // bytes of k per stage and row: 64 bf16 / fp16 values
constexpr int kBK = 64;         // k per stage
constexpr int kBM = 256;        // output rows per tile: two consumers of 128
constexpr int kThreads = 384;   // producer warpgroup + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kTileGroupM = 8;  // tile-rows walked together for L2 reuse

// implicit_tma's halo plan (stride 1, one image per tile, Q a multiple of 8): the input window of one tap column s
// for all R taps of it is one box of the tile's rows plus (R - 1) dil_h more (at most kHaloRowsA rows of 128
// bytes), and tap (r, s)'s A operand is that box from row r dil_h Q on: a multiple of 8 rows, so it starts on a
// 1024-byte swizzle atom as every other operand does. Boxes and weight tiles travel in two rings of their own (a box
// serves R k-steps, a weight tile one): kAStages boxes, kBStages weight tiles.
constexpr int kHaloTaps = 3;
constexpr int kHaloRowsA = 384;

// kStore (implicit_tma): the TMA-store epilogue's staging buffer (kBM rows x BN columns, as
// 64-column halves of kBM rows x 128 bytes, 128-byte swizzled: the image of one TMA box each). It takes room from
// the rings: the halo plan's BN = 128 rings keep 2 boxes and 3 weight tiles (BN = 64: 3 and 4), the plain ring 3
// stages (BN = 64: 4).
template <int BN_, bool kHalo = false, bool kStore = false>
struct WgTile {
  static constexpr int BN = BN_;
  static constexpr int kAStages = kHalo ? (kStore && BN == 128 ? 2 : 3) : 0;  // halo rings
  static constexpr int kBStages = kHalo ? (BN == 64 ? (kStore ? 4 : 6) : (kStore ? 3 : 4)) : 0;
  static constexpr int kStages =
      kHalo ? kAStages + kBStages : (BN == 64 ? (kStore ? 4 : 5) : (kStore ? 3 : 4));  // barrier pairs
  static constexpr int kLag = kStages - 2;  // see the producer (cp.async only)
  static constexpr int kTileBytesA = (kHalo ? kHaloRowsA : kBM) * kRowBytes;
  static constexpr int kTileBytesB = BN * kRowBytes;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB;  // one ring (not halo)
  static constexpr int kRingBytes = kHalo ? kAStages * kTileBytesA + kBStages * kTileBytesB : kStages * kStageBytes;
  static constexpr int kHalfBytes = kBM * kRowBytes;               // staging: one 64-column half
  static constexpr int kStagingBytes = kStore ? BN / 64 * kHalfBytes : 0;
  static constexpr int kRowTableBytes = kStore ? 0 : kBM * 16;     // per row: x offset (int64), ih0, iw0 (cp.async)
  static constexpr int kStatsBytes = 2 * kConsumerWarps * BN * 4;  // per warp: column sums, sums of squares
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kRingBytes + kStagingBytes + kRowTableBytes +
                                    kStatsBytes + 2 * kStages * 8;
};

// Tile t of the persistent walk: kTileGroupM tile-rows at a time, column by column.
__device__ __forceinline__ void tile_of(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int group = kTileGroupM * tiles_n;
  const int first_m = (t / group) * kTileGroupM;
  const int rows = min(tiles_m - first_m, kTileGroupM);
  tm = first_m + (t % group) % rows;
  tn = (t % group) / rows;
}

// implicit_tma's tiling of the output grid (N, P, Q): a tile is box_n images x box_p rows x all Q columns (at most
// kBM pixels, in that order), so the input window of each tap is one box of the NHWC tensor: {64 channels, Q columns
// stepping by the stride, box_p rows stepping by the stride, box_n images}, starting at (c0, s dil_w - pad_w,
// p0 stride_h - pad_h + r dil_h, n0). Rows of the tile past box_n box_p Q (when kBM is not a multiple of the
// image's shape) are multiplied but never stored.
struct TmaBoxes {
  int box_q = 0, box_p = 0, box_n = 0;  // tile extent: columns (= Q), rows, images
  int tiles_p = 1;                      // tiles per box_n images: ceil(P / box_p)
  int tiles_m = 0;                      // ceil(N / box_n) tiles_p
  int images = 0, out_p = 0;            // N, P
  int chunks = 1, taps_s = 1;           // 64-channel chunks per tap, taps per kernel row
  int num_kt = 0;                       // k-steps per tile: taps x chunks (halo: tap columns x chunks)
  int halo_r = 0;                       // halo plan: taps per column R, each a stage's k-step (0: no halo)
  int halo_shift = 0;                   // halo plan: rows of the box from tap r to r + 1 (dil_h Q)
  int stride_h = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  uint32_t tx_bytes = 0;  // bytes each stage's two boxes deliver (halo plan: the box's; weight tiles: BN rows)
  FastDivmod pix, q;      // tile row -> (image in the tile, pixel), pixel -> (row, column)
};

// The boxes of an output grid of n x p x q pixels read with the given strides; false if TMA cannot express them
// (a box extent is at most 256 elements: q stride_w and box_p stride_h; strides at most 8).
inline bool plan_tma_boxes(int64_t n, int64_t p, int64_t q, int64_t stride_h, int64_t stride_w, TmaBoxes& b) {
  if (n <= 0 || p <= 0 || q <= 0 || stride_h < 1 || stride_h > 8 || stride_w < 1 || stride_w > 8) return false;
  if (q * stride_w > 256 || q > kBM) return false;
  b.box_q = static_cast<int>(q);
  if (p * q <= kBM) {  // whole images
    if (p * stride_h > 256) return false;
    b.box_p = static_cast<int>(p);
    b.box_n = static_cast<int>(std::min<int64_t>({kBM / (p * q), n, 256}));
    b.tiles_p = 1;
  } else {  // rows of one image
    b.box_p = static_cast<int>(std::min<int64_t>(kBM / q, 256 / stride_h));
    b.box_n = 1;
    b.tiles_p = ceil_div(p, b.box_p);
  }
  b.tiles_m = ceil_div(n, b.box_n) * b.tiles_p;
  b.images = static_cast<int>(n);
  b.out_p = static_cast<int>(p);
  b.stride_h = static_cast<int>(stride_h);
  b.pix = FastDivmod(b.box_p * b.box_q);
  b.q = FastDivmod(b.box_q);
  return true;
}

// The GEMMs of one launch: kPhases > 1 for backward_input's stride phases under implicit_tma (one persistent grid
// walks every phase's tiles, the phases with the most k-steps first, so the pipeline fills once and there is one
// tail, not one per phase), 1 otherwise. Phase i owns tiles [tile_end[i - 1], tile_end[i]); a launch of fewer phases
// than kPhases gives the unused ones no tiles (their tile_end is the total).
template <typename T, int kPhases>
struct PhaseSet {
  FpropParams<T> p[kPhases];
  TmaBoxes geo[kPhases];  // implicit_tma only
  int tile_end[kPhases] = {};
};

// implicit_tma's maps: phase i's A (the gathered tensor) and B (the weight) at 2 i and 2 i + 1, its output (the
// TMA-store epilogue) at 2 kPhases + i.
template <int kPhases>
struct TmaMaps {
  CUtensorMap m[3 * kPhases];
};

// The phase of tile t and its first tile.
template <typename T, int kPhases>
__device__ __forceinline__ int phase_of(const PhaseSet<T, kPhases>& set, int t, int& first) {
  int ph = 0;
#pragma unroll
  for (int i = 0; i + 1 < kPhases; ++i) ph += t >= set.tile_end[i];
  first = ph == 0 ? 0 : set.tile_end[ph - 1];
  return ph;
}

#if defined(TORCHEXT_WGMMA_DEVICE)

// D (64 x N, float) += A (64 x 16) B (16 x N), both K-major in shared memory, one instruction per warpgroup.
template <typename T, int N>
struct ConvWgmma;

// One specialization per (type, N): the PTX type name and the register list differ, nothing else. A and B are read
// from their descriptors (operands REGS and REGS + 1 after the REGS = N / 2 accumulators), scale-d on, no transposes.
#define TORCHEXT_CONV_WGMMA(T, PTX_TYPE, N, REGS, A_OP, B_OP)                                                     \
  template <>                                                                                               \
  struct ConvWgmma<T, N> {                                                                                  \
    __device__ __forceinline__ static void run(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b) {      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " "             \
                   TORCHEXT_WGMMA_D_REGS_##REGS ", " A_OP ", " B_OP ", p, 1, 1, 0, 0;\n}\n"           \
                   : TORCHEXT_WGMMA_D_OPERANDS_##REGS(d)                                               \
                   : "l"(desc_a), "l"(desc_b));                                                             \
    }                                                                                                       \
  };
TORCHEXT_CONV_WGMMA(__nv_bfloat16, "bf16", 128, 64, "%64", "%65")
TORCHEXT_CONV_WGMMA(__half, "f16", 128, 64, "%64", "%65")
TORCHEXT_CONV_WGMMA(__nv_bfloat16, "bf16", 64, 32, "%32", "%33")
TORCHEXT_CONV_WGMMA(__half, "f16", 64, 32, "%32", "%33")
#undef TORCHEXT_CONV_WGMMA

template <int R>
__device__ __forceinline__ void fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Named barriers: 0 is __syncthreads, 1 the producer warpgroup, 2 both consumer warpgroups.
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 2, 256;" ::: "memory"); }

#endif  // TORCHEXT_WGMMA_DEVICE

// kTma: the A and B tiles come from TMA (implicit_tma: tile t's phase ph reads set.geo[ph] and maps.m[2 ph],
// maps.m[2 ph + 1]); otherwise the producer warpgroup gathers them with cp.async (implicit_wgmma: one GEMM, set.p[0];
// geo and the maps unused). kHalo (implicit_tma, one GEMM): each stage is one tap column's halo box and its R taps'
// weights (WgTile), so the input window is read once per column instead of once per tap. kStore (implicit_tma): the
// epilogue writes the tile into shared memory and one thread stores it with TMA (maps.m[2 kPhases + ph], the output).
template <typename T, int BN, bool kRelu, bool kStats, bool kTma, int kPhases, bool kHalo = false, bool kStore = false>
__global__ void __launch_bounds__(kThreads, 1)
    conv2d_wgmma_fprop_kernel(const __grid_constant__ PhaseSet<T, kPhases> set,
                              const __grid_constant__ TmaMaps<kPhases> maps) {
#if defined(TORCHEXT_WGMMA_DEVICE)
  static_assert(kTma || kPhases == 1, "the cp.async producer runs one GEMM per launch");
  static_assert(!kHalo || (kTma && kPhases == 1), "the halo plan is implicit_tma's, one GEMM per launch");
  static_assert(!kStore || kTma, "the TMA-store epilogue is implicit_tma's");
  using Cfg = WgTile<BN, kHalo, kStore>;
  constexpr int kStages = Cfg::kStages, kLag = Cfg::kLag;
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzling repeats every 1024 bytes and is computed from the address: stages start on 1024.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* const staging = smem + Cfg::kRingBytes;  // kStore (1024-aligned: the ring is whole KiB)
  int4* row_table = reinterpret_cast<int4*>(staging + Cfg::kStagingBytes);
  float* stats_buf = reinterpret_cast<float*>(staging + Cfg::kStagingBytes + Cfg::kRowTableBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(stats_buf + 2 * kConsumerWarps * BN);
  uint64_t* empty = full + kStages;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int tiles = set.tile_end[kPhases - 1];

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // TMA: the producer's arrive with the stage's byte count; cp.async: every producer thread, once its copies
      // of the stage have landed.
      mbar_init(&full[s], kTma ? 1 : 128);
      mbar_init(&empty[s], kConsumerWarps);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0 && kTma) {
    // Producer, TMA: one thread issues each stage's two boxes (the tap's input window, the tap's weight rows; the halo
    // plan: a tap column's box into the box ring, then its R taps' weight rows into the weight ring).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    if (tid == 0) {
      int s = 0, sb = 0;  // sb: the halo plan's weight ring (s its box ring)
      uint32_t phase = 0, phase_b = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int first, tm, tn;
        const int ph = phase_of(set, t, first);
        const TmaBoxes& geo = set.geo[ph];
        tile_of(t - first, set.p[ph].tiles_m, set.p[ph].tiles_n, tm, tn);
        const int n0 = (tm / geo.tiles_p) * geo.box_n;
        const int h0 = (tm % geo.tiles_p) * geo.box_p * geo.stride_h - geo.pad_h;
        const int bn0 = tn * BN;
        // The phase's geometry in registers: the copies' asm clobbers memory, which would reload it every k-step.
        const int num_kt = geo.num_kt, taps_s = geo.taps_s, c_end = geo.chunks * kBK;
        const int w0 = -geo.pad_w, dil_w = geo.dil_w, dil_h = geo.dil_h;
        const uint32_t tx_bytes = geo.tx_bytes;
        const CUtensorMap* map_a = &maps.m[2 * ph];
        const CUtensorMap* map_b = &maps.m[2 * ph + 1];
        int tap = 0, c0 = 0;
        if constexpr (kHalo) {
          // Step kt: tap column `tap` of chunk c0: its box (tx_bytes) into the box ring, then the weights of taps
          // (r, tap), r < R, into the weight ring (barriers kAStages on).
          const int taps_r = geo.halo_r;
          uint8_t* const ring_b = smem + Cfg::kAStages * Cfg::kTileBytesA;
          for (int kt = 0; kt < num_kt; ++kt) {
            mbar_wait(&empty[s], phase ^ 1);
            mbar_arrive_expect_tx(&full[s], tx_bytes);
            tma_load_4d(smem + s * Cfg::kTileBytesA, map_a, &full[s], c0, tap * dil_w + w0, h0, n0);
            if (++s == Cfg::kAStages) s = 0, phase ^= 1;
            for (int r = 0; r < taps_r; ++r) {
              uint64_t* const fb = &full[Cfg::kAStages + sb];
              mbar_wait(&empty[Cfg::kAStages + sb], phase_b ^ 1);
              mbar_arrive_expect_tx(fb, Cfg::kTileBytesB);
              tma_load_3d(ring_b + sb * Cfg::kTileBytesB, map_b, fb, c0, r * taps_s + tap, bn0);
              if (++sb == Cfg::kBStages) sb = 0, phase_b ^= 1;
            }
            if (++tap == taps_s) tap = 0, c0 += kBK;
          }
        } else {
          for (int kt = 0; kt < num_kt; ++kt) {
            const int tr = tap / taps_s, ts = tap - tr * taps_s;
            mbar_wait(&empty[s], phase ^ 1);
            uint8_t* sa = smem + s * Cfg::kStageBytes;
            mbar_arrive_expect_tx(&full[s], tx_bytes);
            tma_load_4d(sa, map_a, &full[s], c0, ts * dil_w + w0, h0 + tr * dil_h, n0);
            tma_load_3d(sa + Cfg::kTileBytesA, map_b, &full[s], c0, tap, bn0);
            c0 += kBK;
            if (c0 == c_end) c0 = 0, ++tap;
            if (++s == kStages) s = 0, phase ^= 1;
          }
        }
      }
    }
  } else if (warpgroup == 0) {
    // Producer, cp.async. Thread tid copies 16-byte chunk c of rows r0, r0 + 16, ... of A (the tile's output pixels) and of B
    // (its output channels' weights); its chunk's tap (r, s) and channel are the same for all its rows.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    const FpropParams<T>& p = set.p[0];
    const int num_kt = (p.k + kBK - 1) / kBK;
    const int c = tid & 7, r0 = tid >> 3;
    int s = 0, issued = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int tm, tn;
      tile_of(t, p.tiles_m, p.tiles_n, tm, tn);
      const int bm0 = tm * kBM, bn0 = tn * BN;
      // The tile's rows: the address of the top-left input pixel of the row's window (as an integer: it may lie
      // in the padding, outside x) and its coordinates; a row past the end is outside every tap.
      producer_sync();  // every producer thread has issued the previous tile's copies
      for (int r = tid; r < kBM; r += 128) {
        const int m = bm0 + r;
        int4 e;
        if (m < p.m) {
          int image, pix, pp, qq;
          p.g.pq.divmod(m, image, pix);
          p.g.q.divmod(pix, pp, qq);
          const int ih0 = pp * p.g.stride_h - p.g.pad_h, iw0 = qq * p.g.stride_w - p.g.pad_w;
          const uint64_t addr =
              reinterpret_cast<uint64_t>(p.g.x) + sizeof(T) * (image * p.g.x_sn + ih0 * p.g.x_sh + iw0 * p.g.x_sw);
          e = make_int4(static_cast<int>(addr & 0xffffffffu), static_cast<int>(addr >> 32), ih0, iw0);
        } else {
          e = make_int4(0, 0, INT_MIN / 2, INT_MIN / 2);
        }
        row_table[r] = e;
      }
      producer_sync();
      // This thread's weight rows (output channels).
      const T* w_rows = p.wt + static_cast<int64_t>(bn0 + r0) * p.w_lead;
      const int64_t w_step = 16 * p.w_lead;
      for (int kt = 0; kt < num_kt; ++kt) {
        mbar_wait(&empty[s], phase ^ 1);
        const uint32_t sa = smem_addr(smem + s * Cfg::kStageBytes), sb = sa + Cfg::kTileBytesA;
        const int kk = kt * kBK + c * 8;
        const bool k_ok = kk < p.k;
        int tap, ch, tr, ts;
        p.g.c.divmod(k_ok ? kk : 0, tap, ch);
        p.g.s.divmod(tap, tr, ts);
        const int dh = tr * p.g.dil_h, dw = ts * p.g.dil_w;
        // The chunk's offset from a row's top-left pixel, the same for every row: one multiply per stage.
        const int64_t tap_bytes = sizeof(T) * (dh * p.g.x_sh + dw * p.g.x_sw + ch);
        const unsigned h_lim = k_ok ? static_cast<unsigned>(p.g.h) : 0u;  // k past the end: every chunk zero
#pragma unroll 4
        for (int i = 0; i < kBM / 16; ++i) {
          const int r = r0 + 16 * i;
          const int4 e = row_table[r];
          const bool ok =
              static_cast<unsigned>(e.z + dh) < h_lim && static_cast<unsigned>(e.w + dw) < static_cast<unsigned>(p.g.w);
          const uint64_t addr =
              ((static_cast<uint64_t>(static_cast<uint32_t>(e.y)) << 32) | static_cast<uint32_t>(e.x)) + tap_bytes;
          const T* src = ok ? reinterpret_cast<const T*>(addr) : p.g.x;
          mma_sync::cp_async16(sa + r * kRowBytes + ((c ^ (r & 7)) << 4), src, ok ? 16 : 0);
        }
#pragma unroll
        for (int i = 0; i < BN / 16; ++i) {
          const int r = r0 + 16 * i;
          const bool ok = k_ok && bn0 + r < p.n;
          const T* src = ok ? w_rows + i * w_step + kk : p.wt;
          mma_sync::cp_async16(sb + r * kRowBytes + ((c ^ (r & 7)) << 4), src, ok ? 16 : 0);
        }
        mma_sync::cp_async_commit();
        // Signal the stage filled kLag steps ago. kLag <= kStages - 2: a consumer releases a stage only once the
        // next one is full (it keeps one stage of wgmmas in flight), and the producer must not wait on a release
        // that waits on a signal it has not given.
        if (issued >= kLag) {
          mma_sync::cp_async_wait<kLag>();
          fence_proxy_async();
          mbar_arrive(&full[(s + kStages - kLag) % kStages]);
        }
        ++issued;
        if (++s == kStages) s = 0, phase ^= 1;
      }
    }
    mma_sync::cp_async_wait<0>();
    fence_proxy_async();
    for (int j = min(issued, kLag); j > 0; --j) mbar_arrive(&full[(s + kStages - j) % kStages]);
  } else {
    // Consumers: warpgroup 1 computes rows 0-127 of the tile, warpgroup 2 rows 128-255, each as two m64 blocks.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    using Mma = ConvWgmma<T, BN>;
    constexpr int kRegs = BN / 2;
    const int consumer = warpgroup - 1, warp = tid / 32, lane = tid % 32;
    const uint32_t stage0 = smem_addr(smem);
    const uint32_t desc_a0 = smem_desc_lo(stage0 + consumer * 128 * kRowBytes, 16);
    const uint32_t desc_a1 = smem_desc_lo(stage0 + (consumer * 128 + 64) * kRowBytes, 16);
    // B: after the stage's A tile, or (halo) the weight ring after the box ring.
    const uint32_t desc_b = smem_desc_lo(stage0 + (kHalo ? Cfg::kAStages : 1) * Cfg::kTileBytesA, 16);
    constexpr uint32_t kDescHi = smem_desc_hi(1024);
    float d0[kRegs], d1[kRegs];
    int stage = 0, prev_stage = 0;
    uint32_t phase = 0;
    int stage_b = 0, held_a = -1, held_b = -1;  // halo: the weight ring's stage; stages the last group read
    uint32_t phase_b = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int first, tm, tn;
      const int ph = phase_of(set, t, first);
      const FpropParams<T>& p = set.p[ph];
      const TmaBoxes& geo = set.geo[ph];
      tile_of(t - first, p.tiles_m, p.tiles_n, tm, tn);
      const int bm0 = tm * kBM, bn0 = tn * BN;
      const int num_kt = kTma ? geo.num_kt : (p.k + kBK - 1) / kBK;
#pragma unroll
      for (int i = 0; i < kRegs; ++i) d0[i] = 0.f, d1[i] = 0.f;
      // One k-step's wgmmas, committed as a group: A at `a`, B at `b` descriptor units (16 bytes) past the first
      // stage's A tile and B (weight) tile.
      auto k_step = [&](uint32_t a, uint32_t b) {
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < kBK / 16; ++step) {  // 16 values = 32 bytes = 2 descriptor units per step
          const uint64_t db = smem_desc(desc_b + b + 2 * step, kDescHi);
          Mma::run(d0, smem_desc(desc_a0 + a + 2 * step, kDescHi), db);
          Mma::run(d1, smem_desc(desc_a1 + a + 2 * step, kDescHi), db);
        }
        wgmma_commit();
      };
      if constexpr (kHalo) {
        // Step kt: the box of one tap column, then one wgmma group per tap r of it: A from row r halo_shift of the
        // box, B from the weight ring (descriptor units of 16 bytes). After each group, wgmma_wait<1> says the group
        // before it is done, so the weight tile it read goes back, and at r == 0 the box of the step before.
        const int taps_r = geo.halo_r;
        const uint32_t a_step = uint32_t(geo.halo_shift * kRowBytes) >> 4;
        for (int kt = 0; kt < num_kt; ++kt) {
          mbar_wait(&full[stage], phase);
          const uint32_t ao = uint32_t(stage * Cfg::kTileBytesA) >> 4;
#pragma unroll
          for (int r = 0; r < kHaloTaps; ++r) {
            if (r < taps_r) {  // the same for the whole warpgroup
              mbar_wait(&full[Cfg::kAStages + stage_b], phase_b);
              k_step(ao + r * a_step, uint32_t(stage_b * Cfg::kTileBytesB) >> 4);
              wgmma_wait<1>();
              if (lane == 0) {
                if (held_b >= 0) mbar_arrive(&empty[Cfg::kAStages + held_b]);
                if (r == 0 && held_a >= 0) mbar_arrive(&empty[held_a]);
              }
              if (r == 0) held_a = -1;
              held_b = stage_b;
              if (++stage_b == Cfg::kBStages) stage_b = 0, phase_b ^= 1;
            }
          }
          held_a = stage;
          if (++stage == Cfg::kAStages) stage = 0, phase ^= 1;
        }
        wgmma_wait<0>();
        if (lane == 0) {
          if (held_b >= 0) mbar_arrive(&empty[Cfg::kAStages + held_b]);
          if (held_a >= 0) mbar_arrive(&empty[held_a]);
        }
        held_a = held_b = -1;
      } else {
        for (int kt = 0; kt < num_kt; ++kt) {
          mbar_wait(&full[stage], phase);
          const uint32_t so = uint32_t(stage * Cfg::kStageBytes) >> 4;
          k_step(so, so);
          wgmma_wait<1>();  // this stage's wgmmas stay in flight; the previous stage's are done
          if (kt > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
          prev_stage = stage;
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
        wgmma_wait<0>();
        if (num_kt > 0 && lane == 0) mbar_arrive(&empty[prev_stage]);
      }
      fence_registers(d0);
      fence_registers(d1);

      // Epilogue. Accumulator layout of m64nNk16: warp w holds rows 16 w + lane / 4 (registers 4 j, 4 j + 1) and
      // + 8 (4 j + 2, 4 j + 3), columns 8 j + 2 (lane % 4) and + 1.
      // The phase's output in registers (else each store would reload it from the parameters).
      T* const y = p.y;
      const int64_t y_sn = p.y_sn, y_sh = p.y_sh, y_sw = p.y_sw;
      const int n = p.n;
      const bool vec_store = p.vec_store;
      const T* const bias = p.bias;
      int64_t row_off[4];
      bool row_ok[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) {  // rows: m64 block h / 2, + 8 if h odd
        const int r = consumer * 128 + (h >> 1) * 64 + warp * 16 + (lane >> 2) + (h & 1) * 8;
        int image = 0, pix = 0, pp = 0, qq = 0;
        if constexpr (kTma) {  // tile row r -> image n0 + i, row p0 + pp, column qq
          geo.pix.divmod(r, image, pix);
          geo.q.divmod(pix, pp, qq);
          image += (tm / geo.tiles_p) * geo.box_n;
          pp += (tm % geo.tiles_p) * geo.box_p;
          row_ok[h] = r < geo.box_n * geo.box_p * geo.box_q && image < geo.images && pp < geo.out_p;
        } else {
          const int m = bm0 + r;
          row_ok[h] = m < p.m;
          if (row_ok[h]) {
            p.g.pq.divmod(m, image, pix);
            p.g.q.divmod(pix, pp, qq);
          }
        }
        if (!row_ok[h]) image = pp = qq = 0;
        if constexpr (!kStore) row_off[h] = image * y_sn + pp * y_sh + qq * y_sw;
      }
      // kStore: the staging is free once the last tile's copies have read it (thread 128 issued them); stats_buf
      // once the last tile's partials have been read.
      if constexpr (kStore) {
        if (threadIdx.x == 128) tma_store_wait_read();
      }
      if constexpr (kStats || kStore) consumers_sync();
      // kStore: this lane's stmatrix addresses for accumulator groups (j - 1, j), j odd, of its m64 block b (rows
      // consumer 128 + 64 b + 16 warp ..): lane l addresses row l % 8 of matrix l / 8 (matrices: group j - 1 rows
      // 0-7, 8-15, group j rows 0-7, 8-15), 16-byte unit (j - 1) % 8 + l / 16 of its 64-column half, stored at
      // unit ^ (row % 8) (TMA's 128-byte swizzle; the staging and each 8 rows start on 1024 bytes). As in the GEMM
      // engine's epilogue (cuda_ops/matmul_wgmma.cu, staging_lane_for).
      const uint32_t st_row = smem_addr(staging) +
                              (consumer * 128 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * kRowBytes;
      const int st_x = (lane >> 4) ^ (lane & 7);
      uint32_t prev[4];  // kStore: group j - 1's packed pairs, per h
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = bn0 + 8 * j + 2 * (lane & 3);
        const bool c0 = col < n, c1 = col + 1 < n;
        const float b0 = bias != nullptr && c0 ? static_cast<float>(bias[col]) : 0.f;
        const float b1 = bias != nullptr && c1 ? static_cast<float>(bias[col + 1]) : 0.f;
        float s0 = 0.f, s1 = 0.f, q0 = 0.f, q1 = 0.f;
        uint32_t cur[4];
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const float* d = (h >> 1) ? d1 : d0;
          const int e = 4 * j + 2 * (h & 1);
          float v0 = d[e] + b0, v1 = d[e + 1] + b1;
          if (kRelu) v0 = fmaxf(v0, 0.f), v1 = fmaxf(v1, 0.f);
          const T o0 = static_cast<T>(v0), o1 = static_cast<T>(v1);
          if constexpr (kStore) {
            const Vec<T, 2> pair{{o0, o1}};
            std::memcpy(&cur[h], &pair, 4);
          } else if (row_ok[h] && c0) {
            T* out = y + row_off[h] + col;
            if (c1 && vec_store) {
              *reinterpret_cast<Vec<T, 2>*>(out) = Vec<T, 2>{{o0, o1}};
            } else {
              out[0] = o0;
              if (c1) out[1] = o1;
            }
          }
          if constexpr (kStats) {
            if (row_ok[h] && c0) {
              const float f0 = static_cast<float>(o0), f1 = c1 ? static_cast<float>(o1) : 0.f;
              s0 += f0, q0 += f0 * f0, s1 += f1, q1 += f1 * f1;
            }
          }
        }
        if constexpr (kStore) {
          if (j & 1) {
            const uint32_t at = st_row + (j / 8) * Cfg::kHalfBytes + ((((j - 1) & 7) ^ st_x) << 4);
            stmatrix_x4(at, prev[0], prev[1], cur[0], cur[1]);                  // block 0
            stmatrix_x4(at + 64 * kRowBytes, prev[2], prev[3], cur[2], cur[3]);  // block 1
          } else {
#pragma unroll
            for (int h = 0; h < 4; ++h) prev[h] = cur[h];
          }
        }
        if constexpr (kStats) {
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) {  // the 8 row groups of the warp, a fixed tree
            s0 += __shfl_xor_sync(0xffffffffu, s0, o), s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            q0 += __shfl_xor_sync(0xffffffffu, q0, o), q1 += __shfl_xor_sync(0xffffffffu, q1, o);
          }
          if (lane < 4) {
            const int cw = consumer * 4 + warp, cl = 8 * j + 2 * lane;
            stats_buf[cw * BN + cl] = s0, stats_buf[cw * BN + cl + 1] = s1;
            stats_buf[(kConsumerWarps + cw) * BN + cl] = q0, stats_buf[(kConsumerWarps + cw) * BN + cl + 1] = q1;
          }
        }
      }
      if constexpr (kStore) {
        // The tile's box per 64-column half: {64 channels, Q, box_p rows, box_n images} at (bn0 + 64 i, 0, p0, n0);
        // the copy engine drops rows and channels outside the output (and tile rows past the box are not in it).
        fence_proxy_async();
        consumers_sync();
        if (threadIdx.x == 128) {
          const int p0 = (tm % geo.tiles_p) * geo.box_p, n0 = (tm / geo.tiles_p) * geo.box_n;
#pragma unroll
          for (int i = 0; i < BN / 64; ++i) {
            if (bn0 + 64 * i < n) {
              tma_store_4d(&maps.m[2 * kPhases + ph], staging + i * Cfg::kHalfBytes, bn0 + 64 * i, 0, p0, n0);
            }
          }
          tma_store_commit();
        }
      }
      if constexpr (kStats) {
        consumers_sync();
        const int ct = consumer * 128 + tid;  // 0..255
        for (int q = ct; q < 2 * BN; q += 256) {
          const int which = q / BN, cl = q % BN, col = bn0 + cl;
          if (col >= n) continue;
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kConsumerWarps; ++w) sum += stats_buf[(which * kConsumerWarps + w) * BN + cl];
          p.stats_partial[(static_cast<int64_t>(which) * n + col) * p.tiles_m + tm] = sum;
        }
      }
    }
    if constexpr (kStore) {
      if (threadIdx.x == 128) tma_store_wait_all();  // shared memory stays until the copies have read it
    }
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side

// Launches `count` (at most kPhases) GEMMs of `set` as one persistent grid; fills in their tile counts.
template <typename T, int BN, bool kRelu, bool kStats, bool kTma, int kPhases, bool kHalo = false, bool kStore = false>
cudaError_t launch_wgmma_fprop(PhaseSet<T, kPhases> set, int count, const TmaMaps<kPhases>& maps,
                               cudaStream_t stream) {
  constexpr auto kernel = conv2d_wgmma_fprop_kernel<T, BN, kRelu, kStats, kTma, kPhases, kHalo, kStore>;
  constexpr int kSmemBytes = WgTile<BN, kHalo, kStore>::kSmemBytes;
  if (count < 1 || count > kPhases) return cudaErrorInvalidValue;
  cudaError_t err = prepare_kernel<kernel>(kSmemBytes);
  if (err != cudaSuccess) return err;
  int64_t tiles = 0;
  for (int i = 0; i < kPhases; ++i) {
    if (i < count) {
      FpropParams<T>& p = set.p[i];
      p.tiles_m = kTma ? set.geo[i].tiles_m : ceil_div(p.m, kBM);
      p.tiles_n = ceil_div(p.n, BN);
      tiles += static_cast<int64_t>(p.tiles_m) * p.tiles_n;
    }
    if (tiles > INT_MAX) return cudaErrorInvalidValue;
    set.tile_end[i] = static_cast<int>(tiles);
  }
  if (tiles == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, sm_count()));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(set, maps);
  return cudaGetLastError();
}

// One GEMM with the epilogue's options, or (kPhases > 1: backward_input's phases) several without them.
template <typename T, int BN, bool kTma, int kPhases, bool kHalo = false, bool kStore = false>
cudaError_t launch_wgmma_fprop_bn(const PhaseSet<T, kPhases>& set, int count, const TmaMaps<kPhases>& maps, bool relu,
                                  bool stats, cudaStream_t stream) {
  if constexpr (kPhases > 1) {
    if (relu || stats) return cudaErrorNotSupported;
    return launch_wgmma_fprop<T, BN, false, false, kTma, kPhases, false, kStore>(set, count, maps, stream);
  } else {
    if (stats) {
      return relu ? launch_wgmma_fprop<T, BN, true, true, kTma, 1, kHalo, kStore>(set, count, maps, stream)
                  : launch_wgmma_fprop<T, BN, false, true, kTma, 1, kHalo, kStore>(set, count, maps, stream);
    }
    return relu ? launch_wgmma_fprop<T, BN, true, false, kTma, 1, kHalo, kStore>(set, count, maps, stream)
                : launch_wgmma_fprop<T, BN, false, false, kTma, 1, kHalo, kStore>(set, count, maps, stream);
  }
}

// One GEMM of implicit_tma: the halo plan or not, the TMA-store epilogue or not.
template <typename T, int BN>
cudaError_t launch_tma_fprop_bn(const PhaseSet<T, 1>& set, const TmaMaps<1>& maps, bool store, bool relu, bool stats,
                                cudaStream_t stream) {
  if (set.geo[0].halo_r > 0) {
    return store ? launch_wgmma_fprop_bn<T, BN, true, 1, true, true>(set, 1, maps, relu, stats, stream)
                 : launch_wgmma_fprop_bn<T, BN, true, 1, true>(set, 1, maps, relu, stats, stream);
  }
  return store ? launch_wgmma_fprop_bn<T, BN, true, 1, false, true>(set, 1, maps, relu, stats, stream)
               : launch_wgmma_fprop_bn<T, BN, true, 1>(set, 1, maps, relu, stats, stream);
}

template <typename T>
cudaError_t run_wgmma_fprop(const FpropParams<T>& p, bool relu, bool stats, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  PhaseSet<T, 1> set;
  set.p[0] = p;
  const TmaMaps<1> maps = {};
  return p.n <= 64 ? launch_wgmma_fprop_bn<T, 64, false>(set, 1, maps, relu, stats, stream)
                   : launch_wgmma_fprop_bn<T, 128, false>(set, 1, maps, relu, stats, stream);
}

// ---------------------------------------------------------------------------------------------------------------
// implicit_tma's tensor maps

// The halo plan is on unless TORCHEXT_CONV2D_HALO=0, the TMA-store epilogue unless TORCHEXT_CONV2D_TMA_STORE=0 (read
// at each launch: the tests compare both forms in one process, and benchmarks/bench_conv2d.py times what each bought).
inline bool env_enabled(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}
inline bool halo_enabled() { return env_enabled("TORCHEXT_CONV2D_HALO"); }
inline bool tma_store_enabled() { return env_enabled("TORCHEXT_CONV2D_TMA_STORE"); }

// A = the gathered tensor (p.g: n images of g.h x g.w pixels of C channels), read in boxes of {64 channels, Q
// columns x stride_w, box_p rows x stride_h, box_n images} stepping by the stride; B = the weight, {C, taps, n
// rows} with the tap's C values contiguous, read in boxes of {64, 1, BN}. Both 128-byte swizzled, zero-filled outside.
//
// With `halo` (one GEMM per launch, and halo_enabled()), the halo plan where the conditions below hold: A is read in
// boxes of {64 channels, Q columns, box_p + (R - 1) dil_h rows, 1 image}, one per tap column (geo.halo_r = R), B as
// before; geo.halo_r stays 0 otherwise.
template <typename T>
bool make_tma_maps(const FpropParams<T>& p, int bn, TmaBoxes& geo, CUtensorMap* maps, bool halo = false) {
  auto encode = sm90::encode_tiled_fn();
  if (encode == nullptr) return false;
  const int64_t pq = p.g.pq.d, q = p.g.q.d, cg = p.g.c.d;
  if (pq <= 0 || q <= 0 || cg <= 0 || p.k % cg != 0) return false;
  const int64_t n = p.m / pq, taps = p.k / cg;
  if (!plan_tma_boxes(n, pq / q, q, p.g.stride_h, p.g.stride_w, geo)) return false;
  geo.chunks = ceil_div(cg, kBK);
  geo.taps_s = p.g.s.d;
  geo.num_kt = static_cast<int>(taps) * geo.chunks;
  geo.pad_h = p.g.pad_h, geo.pad_w = p.g.pad_w, geo.dil_h = p.g.dil_h, geo.dil_w = p.g.dil_w;
  geo.tx_bytes = static_cast<uint32_t>(kRowBytes * (geo.box_n * geo.box_p * geo.box_q + bn));
  geo.halo_r = 0;
  const int64_t taps_r = taps / geo.taps_s, halo_rows = geo.box_p + (taps_r - 1) * p.g.dil_h;
  if (halo && halo_enabled() && p.g.stride_h == 1 && p.g.stride_w == 1 && geo.box_n == 1 && q % 8 == 0 &&
      taps_r >= 2 && taps_r <= kHaloTaps &&
      kBM - 1 + (taps_r - 1) * p.g.dil_h * q < kHaloRowsA) {  // the tile's last row at the last tap: in the box's room
    // (so the box, box_p Q <= kBM rows plus (R - 1) dil_h Q, fits it too)
    geo.halo_r = static_cast<int>(taps_r);
    geo.halo_shift = static_cast<int>(p.g.dil_h * q);
    geo.num_kt = geo.taps_s * geo.chunks;
    geo.tx_bytes = static_cast<uint32_t>(kRowBytes * halo_rows * q);  // the box (weight tiles: their own ring)
  }
  const int box_h = geo.halo_r > 0 ? static_cast<int>(halo_rows) : geo.box_p;
  if (!encode_nhwc_map<T>(maps[0], p.g.x, cg, p.g.w, p.g.h, n, p.g.x_sw, p.g.x_sh, p.g.x_sn, geo.box_q, box_h,
                          geo.box_n, p.g.stride_w, p.g.stride_h)) {
    return false;
  }

  constexpr int64_t es = sizeof(T);
  const int64_t lead = p.n > 1 ? p.w_lead * es : taps * cg * es;
  if (lead < taps * cg * es || lead % 16 != 0 || (cg * es) % 16 != 0) return false;
  const cuuint64_t b_dims[3] = {cuuint64_t(cg), cuuint64_t(taps), cuuint64_t(p.n)};
  const cuuint64_t b_strides[2] = {cuuint64_t(cg * es), cuuint64_t(lead)};
  const cuuint32_t b_box[3] = {cuuint32_t(kBK), 1, cuuint32_t(bn)};
  const cuuint32_t b_steps[3] = {1, 1, 1};
  const CUresult r = encode(&maps[1], sm90::tma_dtype<T>(), 3, const_cast<T*>(p.wt), b_dims, b_strides, b_box, b_steps,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// The most shared memory a TMA-store launch takes (any tile width, with or without the halo plan).
constexpr int kStoreSmemBytes = std::max({WgTile<64, false, true>::kSmemBytes, WgTile<128, false, true>::kSmemBytes,
                                          WgTile<64, true, true>::kSmemBytes, WgTile<128, true, true>::kSmemBytes});

// The TMA-store epilogue's map of a GEMM's output (boxes of {64 channels, Q, box_p rows, box_n images}, the tile's
// pixels in its row order), where the output has one (a 16-byte-aligned start, channels-last strides that nest) and
// the device has the shared memory; false otherwise (the epilogue then stores from the registers).
template <typename T>
bool make_output_map(const FpropParams<T>& p, const TmaBoxes& geo, CUtensorMap& map) {
  return smem_optin() >= kStoreSmemBytes && reinterpret_cast<uintptr_t>(p.y) % 16 == 0 &&
         encode_nhwc_map<T>(map, p.y, p.n, geo.box_q, geo.out_p, geo.images, p.y_sw, p.y_sh, p.y_sn, geo.box_q,
                            geo.box_p, geo.box_n, 1, 1);
}

// implicit_tma's GEMM launcher (the drivers' `run`). A GEMM with no k (a forward with no input channels; the rung's
// checks refuse those today, and backward_input zeroes its tapless stride phases without a GEMM) only writes
// act(bias): the gathering kernel does that with no copies, where an empty dimension has no tensor map.
template <typename T>
cudaError_t run_tma_fprop(const FpropParams<T>& p, bool relu, bool stats, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.k == 0) return run_wgmma_fprop(p, relu, stats, stream);
  const int bn = p.n <= 64 ? 64 : 128;
  PhaseSet<T, 1> set;
  set.p[0] = p;
  TmaMaps<1> maps;
  // The halo plan where its rings fit in shared memory (they do on an H100 / H200). Measured on an H200
  // (benchmarks/results/conv2d_halo_rings_cifar_bf16_gpu_h200.md, and _off_ with TORCHEXT_CONV2D_HALO=0 in the same
  // call): 64 -> 64 at 32x32 forward 118.7 -> 104.7 us, 128 -> 128 at 16x16 82.9 -> 81.4. A first form with one
  // ring (a stage: the box and its R weight tiles) ran 128-column tiles slower (99.7 against 83.1 us: only two such
  // stages fit; conv2d_halo_bn128_trial_cifar_bf16_gpu_h200.csv).
  const bool halo = smem_optin() >= (bn == 64 ? WgTile<64, true>::kSmemBytes : WgTile<128, true>::kSmemBytes);
  if (!make_tma_maps(p, bn, set.geo[0], maps.m, halo)) return cudaErrorNotSupported;
  // The TMA-store epilogue where the output has a tensor map (16-byte aligned, channels-last strides): the
  // consumers write the tile to shared memory and go on to the next tile while the copy engine stores it. With
  // direct stores from the registers both consumers stood in the epilogue for about 40% of their time at 128 -> 128
  // channels, 16x16 (Nsight Compute warp samples, docs/conv2d.md): the tensor pipe idled meanwhile.
  const bool store = tma_store_enabled() && make_output_map(p, set.geo[0], maps.m[2]);
  return bn == 64 ? launch_tma_fprop_bn<T, 64>(set, maps, store, relu, stats, stream)
                  : launch_tma_fprop_bn<T, 128>(set, maps, store, relu, stats, stream);
}

// backward_input's phases under implicit_tma (backward_input_gemm's launcher): up to kTmaPhases of them per
// persistent launch, the phases with the most k-steps first (their tiles are the longest: the grid's static
// round robin then ends on short ones). Every phase has the same n (C); none has k = 0.
constexpr int kTmaPhases = 4;

template <typename T>
cudaError_t run_tma_phases(const FpropParams<T>* phases, int count, cudaStream_t stream) {
  std::vector<FpropParams<T>> order(phases, phases + count);
  std::stable_sort(order.begin(), order.end(), [](const FpropParams<T>& a, const FpropParams<T>& b) { return a.k > b.k; });
  for (int first = 0; first < count; first += kTmaPhases) {
    const int group = std::min(kTmaPhases, count - first);
    if (group == 1) {
      const cudaError_t err = run_tma_fprop(order[first], false, false, stream);
      if (err != cudaSuccess) return err;
      continue;
    }
    const int bn = order[first].n <= 64 ? 64 : 128;
    PhaseSet<T, kTmaPhases> set;
    TmaMaps<kTmaPhases> maps = {};
    bool store = tma_store_enabled();  // every phase's output must have a map
    for (int i = 0; i < group; ++i) {
      set.p[i] = order[first + i];
      if (set.p[i].m == 0 || set.p[i].n == 0 || set.p[i].k == 0) return cudaErrorInvalidValue;
      if (!make_tma_maps(set.p[i], bn, set.geo[i], &maps.m[2 * i])) return cudaErrorNotSupported;
      store = store && make_output_map(set.p[i], set.geo[i], maps.m[2 * kTmaPhases + i]);
    }
    cudaError_t err;
    if (bn == 64) {
      err = store ? launch_wgmma_fprop_bn<T, 64, true, kTmaPhases, false, true>(set, group, maps, false, false, stream)
                  : launch_wgmma_fprop_bn<T, 64, true>(set, group, maps, false, false, stream);
    } else {
      err = store ? launch_wgmma_fprop_bn<T, 128, true, kTmaPhases, false, true>(set, group, maps, false, false, stream)
                  : launch_wgmma_fprop_bn<T, 128, true>(set, group, maps, false, false, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// The forward's tiles along the output pixels (the statistics' partials are [2][K][tiles]).
inline int tma_forward_tiles(const Conv2dShape& sh) {
  TmaBoxes geo;
  return plan_tma_boxes(sh.n, sh.p, sh.q, sh.stride_h, sh.stride_w, geo) ? geo.tiles_m : 0;
}

}  // namespace

namespace {

// What both wgmma rungs need (`tma` picks the rung named in the reasons). The operands' requirements are
// implicit_mma's (the same GEMMs); its reasons are passed on without their "implicit_mma: " prefix.
template <typename T>
bool wgmma_rung_supported(Conv2dPass pass, const Conv2dArgs<T>& a, bool tma, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return fail(tma ? "implicit_tma: bf16 and fp16 only (float32 as tf32 runs on implicit_mma)"
                    : "implicit_wgmma: bf16 and fp16 only (float32 as tf32 runs on implicit_mma)");
  } else {
#if !defined(TORCHEXT_BUILT_SM90A)
    return fail(tma ? "implicit_tma: this build has no sm_90a code (build with 9.0 in TORCH_CUDA_ARCH_LIST)"
                    : "implicit_wgmma: this build has no sm_90a code (build with 9.0 in TORCH_CUDA_ARCH_LIST)");
#endif
    if (compute_capability() != 90) {
      return fail(tma ? "implicit_tma: needs an sm_90 GPU (H100 / H200)"
                      : "implicit_wgmma: needs an sm_90 GPU (H100 / H200)");
    }
    if (smem_optin() < WgTile<64>::kSmemBytes || smem_optin() < WgTile<128>::kSmemBytes) {
      return fail(tma ? "implicit_tma: the device has too little shared memory"
                      : "implicit_wgmma: the device has too little shared memory");
    }
    if (pass == Conv2dPass::backward_weight && !tma) {
      return fail("implicit_wgmma: backward_weight is not on this rung (implicit_tma and implicit_mma run it)");
    }
    const char* reason = nullptr;
    if (!conv2d_implicit_supported(pass, a, &reason)) {
      constexpr char kPrefix[] = "implicit_mma: ";
      if (reason != nullptr && std::strncmp(reason, kPrefix, sizeof(kPrefix) - 1) == 0) reason += sizeof(kPrefix) - 1;
      return fail(reason);
    }
    return true;
  }
}

}  // namespace

template <typename T>
bool conv2d_wgmma_supported(Conv2dPass pass, const Conv2dArgs<T>& a, const char** why) {
  return wgmma_rung_supported(pass, a, false, why);
}

template <typename T>
bool conv2d_tma_supported(Conv2dPass pass, const Conv2dArgs<T>& a, const char** why) {
  if (!wgmma_rung_supported(pass, a, true, why)) return false;
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if (sm90::encode_tiled_fn() == nullptr) return fail("implicit_tma: the driver has no cuTensorMapEncodeTiled");
  const Conv2dShape& sh = a.shape;
  if (pass == Conv2dPass::backward_weight) return conv2d_tma_wgrad_supported(a, why);  // cuda_ops/conv2d_wgrad_tma.cu
  // Each k-step reads 64 channels of one tap; with fewer, most of it would be TMA's zero fill, where implicit_wgmma
  // packs several taps into a k-step (the 3-channel stem, padded to 8: 9 k-steps here against 2).
  if ((pass == Conv2dPass::forward ? sh.c : sh.k) < kBK) {
    return fail(pass == Conv2dPass::forward ? "implicit_tma: needs at least 64 input channels (implicit_wgmma runs fewer)"
                                            : "implicit_tma: needs at least 64 output channels for backward_input "
                                              "(implicit_wgmma runs fewer)");
  }
  TmaBoxes geo;
  cuuint64_t strides[3];
  if (pass == Conv2dPass::forward) {
    if (sh.n * sh.p * sh.q == 0) return true;
    if (!plan_tma_boxes(sh.n, sh.p, sh.q, sh.stride_h, sh.stride_w, geo)) {
      return fail("implicit_tma: the output rows must be at most 256 / stride wide (a TMA box) and strides at most 8");
    }
    if (!tma_strides<T>(sh.c, sh.w, sh.h, sh.n, a.x.sw, a.x.sh, a.x.sn, strides)) {
      return fail("implicit_tma: the input's strides must nest in (n, h, w, c) order (channels-last)");
    }
  } else {  // backward_input: stride phases of at most ceil(H / stride) x ceil(W / stride) pixels, read at stride 1
    if (sh.n * sh.h * sh.w == 0) return true;
    const int64_t hi = (sh.h + sh.stride_h - 1) / sh.stride_h, wi = (sh.w + sh.stride_w - 1) / sh.stride_w;
    if (!plan_tma_boxes(sh.n, hi, wi, 1, 1, geo)) {
      return fail("implicit_tma: backward_input needs rows of at most 256 pixels per stride phase (a TMA box)");
    }
    if (!tma_strides<T>(sh.k, sh.q, sh.p, sh.n, a.y.sw, a.y.sh, a.y.sn, strides)) {
      return fail("implicit_tma: grad_output's strides must nest in (n, h, w, c) order (channels-last)");
    }
  }
  return true;
}

template <typename T>
size_t conv2d_wgmma_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& a) {
  const Conv2dShape& sh = a.shape;
  switch (pass) {
    case Conv2dPass::forward: {
      if (a.stats == nullptr) return 0;
      const int64_t tiles_m = (sh.n * sh.p * sh.q + kBM - 1) / kBM;
      return align256(static_cast<size_t>(2 * sh.k * tiles_m) * sizeof(float));
    }
    case Conv2dPass::backward_input:
      return backward_input_workspace_bytes<T>(sh);
    case Conv2dPass::backward_weight:
      return 0;
  }
  return 0;
}

template <typename T>
cudaError_t conv2d_wgmma(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return cudaErrorNotSupported;
  } else {
    if (!conv2d_wgmma_supported(pass, args, nullptr)) return cudaErrorNotSupported;
    switch (pass) {
      case Conv2dPass::forward:
        return forward_gemm(args, stream, workspace, run_wgmma_fprop<T>,
                            ceil_div(args.shape.n * args.shape.p * args.shape.q, kBM));
      case Conv2dPass::backward_input:
        return backward_input_gemm(args, stream, workspace, each_phase<T>(run_wgmma_fprop<T>));
      case Conv2dPass::backward_weight:
        break;
    }
    return cudaErrorNotSupported;
  }
}

template <typename T>
size_t conv2d_tma_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& a) {
  const Conv2dShape& sh = a.shape;
  switch (pass) {
    case Conv2dPass::forward:
      if (a.stats == nullptr) return 0;
      return align256(static_cast<size_t>(2 * sh.k * tma_forward_tiles(sh)) * sizeof(float));
    case Conv2dPass::backward_input:
      return backward_input_workspace_bytes<T>(sh);
    case Conv2dPass::backward_weight:
      return conv2d_tma_wgrad_workspace_bytes(a);
  }
  return 0;
}

template <typename T>
cudaError_t conv2d_tma(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if constexpr (!std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return cudaErrorNotSupported;
  } else {
    if (!conv2d_tma_supported(pass, args, nullptr)) return cudaErrorNotSupported;
    switch (pass) {
      case Conv2dPass::forward:
        return forward_gemm(args, stream, workspace, run_tma_fprop<T>, tma_forward_tiles(args.shape));
      case Conv2dPass::backward_input:
        return backward_input_gemm(args, stream, workspace, run_tma_phases<T>);
      case Conv2dPass::backward_weight:
        return conv2d_tma_wgrad(args, stream, workspace);
    }
    return cudaErrorNotSupported;
  }
}

#define TORCHEXT_INSTANTIATE_CONV2D_WGMMA(T)                                               \
  template bool conv2d_wgmma_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**); \
  template size_t conv2d_wgmma_workspace_bytes<T>(Conv2dPass, const Conv2dArgs<T>&);       \
  template cudaError_t conv2d_wgmma<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);    \
  template bool conv2d_tma_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**);   \
  template size_t conv2d_tma_workspace_bytes<T>(Conv2dPass, const Conv2dArgs<T>&);         \
  template cudaError_t conv2d_tma<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D_WGMMA(float)
TORCHEXT_INSTANTIATE_CONV2D_WGMMA(double)
TORCHEXT_INSTANTIATE_CONV2D_WGMMA(__half)
TORCHEXT_INSTANTIATE_CONV2D_WGMMA(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_WGMMA

}  // namespace torchext::cuda_ops
