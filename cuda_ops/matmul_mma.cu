// Tensor-core matmul through mma.sync (sm_80 and newer): C = act(A B + bias), A (m, k), B (k, n), C (m, n),
// `batch` independent products, shapes and strides as in cuda_ops/matmul.cuh.
//
// Types: bf16 and fp16 run mma.sync m16n8k16 with float32 accumulation. float32 runs only when the caller allows
// tf32 (args.allow_tf32): A and B are rounded to tf32 in registers (cvt.rna.tf32.f32, round to nearest, ties away)
// and multiplied with mma.sync m16n8k8, accumulating in float32. float64 has no tensor-core path here.
//
// What this version adds over the CUDA-core ladder (cuda_ops/matmul_simt.cu, v5 warp_tiled):
//   - Tensor cores. Each warp owns a 64x64 tile of C as 4 x 8 m16n8 accumulator fragments (128 floats per
//     thread); one k-step of 16 (bf16/fp16) or 8 (tf32) elements is 32 mma.sync per warp.
//   - Block tiles of 128 x 256 (8 warps, 2 x 4) for large problems and 128 x 128 (4 warps, two blocks per SM)
//     when the large tiles would not fill the GPU; BK is 128 bytes of k (64 bf16/fp16, 32 tf32).
//   - A 3-stage cp.async pipeline (16-byte cp.async.cg, global -> shared without registers) in dynamic shared
//     memory: 144 KiB (large tile) or 96 KiB (small). Tiles k+1 and k+2 are in flight while tile k is multiplied,
//     and the fragments of k-step s+1 are read from shared memory while the mma of k-step s run; one barrier per
//     k-tile.
//   - Operand layouts read in place, one kernel per pair (template): A K-major (a_cs == 1, row-major) or M-major
//     (a_rs == 1, column-major); B K-major (b_rs == 1) or N-major (b_cs == 1). Shared memory keeps each tile
//     in its global layout; 16-byte chunks are XOR-swizzled (chunk ^= row % 8 within each 128-byte line) so the
//     cp.async stores and the ldmatrix reads are free of bank conflicts. Fragments come from ldmatrix.x4, with
//     .trans for MN-major bf16/fp16; MN-major tf32 (no 32-bit transpose in ldmatrix) uses ld.shared.b32 with a
//     swizzle of chunk ^= 2 * (row % 4), conflict-free for that access pattern.
//   - Any m, n, k. Blocks whose C tile lies inside the matrix copy whole k-tiles without any check (a loop of
//     its own, so that the checks are not if-converted into it); edge blocks and the last k-tiles zero-fill what
//     lies outside through cp.async's src-size operand (0 bytes outside, fewer than 16 at a ragged end).
//   - Any strides: the 16-byte path needs each operand's base, line stride and batch stride 16-byte aligned and
//     one unit stride. Otherwise (an odd k or n, a strided view) a general kernel loads elements one by one
//     through both strides, synchronously, into K-major shared memory (coalesced along whichever stride is 1),
//     with the same tensor-core inner loop and the small tile: slower, never wrong.
//   - Tiles are visited in groups of 8 tile-rows (row-major inside a group) so that blocks running together
//     share A and B panels in L2. Batch runs over grid.z (looping beyond 65535); a batch stride of 0 broadcasts.
//   - Epilogue: the fp32 accumulators are staged through shared memory (the pipeline's buffers), then each
//     thread takes 4 adjacent columns of a row: z = acc + bias, aux = z, C = act(z), the function of
//     store_epilogue (cuda_ops/matmul_epilogue.cuh), coalesced, one 4-element store when C and aux allow it.
//
// Napkin math (4096^3 bf16, 137 GFLOP): each k-tile of a large block moves (128 + 256) x 64 x 2 = 48 KiB from L2
// into shared memory for 4.2 MFLOP; each warp reads 4 KiB of fragments (8 ldmatrix.x4) per 32 mma.sync, which
// keeps shared-memory bandwidth under the tensor cores' rate only with 64 x 64 warp tiles. 128 accumulators and
// two buffers of fragments (64 registers) per thread put the kernels at 240-255 registers, no spills on sm_90a.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "matmul.cuh"
#include "matmul_epilogue.cuh"
#include "mma_sync.cuh"

namespace torchext::cuda_ops {
namespace {

using namespace mma_sync;

constexpr int kStages = 3;
constexpr int kGroupM = 8;       // tile-rows per L2 group
constexpr int kMaxGridZ = 65535;

template <int BM_, int BN_, int WARPS_M, int WARPS_N, int MIN_BLOCKS>
struct MmaTile {
  static constexpr int BM = BM_, BN = BN_, kWarpsM = WARPS_M, kWarpsN = WARPS_N, kMinBlocks = MIN_BLOCKS;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int WM = BM / kWarpsM, WN = BN / kWarpsN;
  static constexpr int MI = WM / 16, NI = WN / 8;  // m16 x n8 fragments per warp
  static constexpr int kStageBytes = (BM + BN) * kLineBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  // The swizzle arithmetic of the fragment loads (XOR of a precomputed offset) assumes 64 x 64 warp tiles.
  static_assert(WM == 64 && WN == 64, "warp tile must be 64 x 64");
  static_assert(BM * (BN + 8) * 4 <= kSmemBytes, "the epilogue stages the fp32 block tile in the stage buffers");
};
using LargeTile = MmaTile<128, 256, 2, 4, 1>;  // 256 threads, 144 KiB
using SmallTile = MmaTile<128, 128, 2, 2, 2>;  // 128 threads, 96 KiB, two blocks per SM

// What the kernel needs besides the arguments; every size was checked against INT_MAX on the host.
template <typename T>
struct MmaParams {
  MatmulArgs<T> args;
  int m, n, k;
  int tiles_m, tiles_n;
  int64_t a_lead, b_lead;     // 16-byte path: stride between the contiguous lines of A and B
  bool a_mn_fast, b_mn_fast;  // general path: that operand has unit stride along m (A) or n (B)
  bool vec_store;             // C and aux take 4-element vector stores
};

// ---------------------------------------------------------------------------------------------------------------
// Shared-memory layouts of the operand tiles: cuda_ops/mma_sync.cuh.

// General strides: element (row, kk) at base[row * s_mn + kk * s_k], loaded one by one (zero outside the matrix)
// and stored as 16-byte chunks into the K-major layout. Threads run along rows when the operand has unit stride
// along them (mn_fast), else along k, so that each load instruction is coalesced across the warp.
template <typename T, int BX, int NT>
__device__ __forceinline__ void load_general(uint32_t dst, const T* base, int64_t s_mn, int64_t s_k, bool mn_fast,
                                             int row0, int rows, int k, int k0, int tid) {
  using Raw = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;
  constexpr int kElems = 16 / sizeof(T), kPasses = BX * 8 / NT;
  const Raw* raw = reinterpret_cast<const Raw*>(base);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int chunk = tid + p * NT;
    const int r = mn_fast ? chunk % BX : chunk >> 3;
    const int c = mn_fast ? chunk / BX : chunk & 7;
    const int row = row0 + r, kk = k0 + c * kElems;
    const bool row_ok = row < rows;
    const Raw* src = raw + static_cast<int64_t>(row_ok ? row : 0) * s_mn + static_cast<int64_t>(kk) * s_k;
    Raw v[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      v[e] = row_ok && kk + e < k ? *src : Raw(0);
      src += s_k;
    }
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2) {
        w[i] = static_cast<uint32_t>(v[2 * i]) | (static_cast<uint32_t>(v[2 * i + 1]) << 16);
      } else {
        w[i] = v[i];
      }
    }
    sts128(dst + r * kLineBytes + ((c ^ (r & 7)) << 4), w[0], w[1], w[2], w[3]);
  }
}

// Accumulators of the block tile, staged in shared memory (the pipeline's buffers, free after the main loop) as
// BM rows of kCLd floats; the pad of 8 floats makes the fragment stores conflict-free.
template <class Cfg>
constexpr int kCLd = Cfg::BN + 8;

// z = acc + bias, aux = z, C = act(z) for the block tile staged in `cs`: store_epilogue's function, computed in
// float, with threads along rows (coalesced) and 4 columns per thread, stored as one 4-element vector when C and
// aux allow it.
template <typename T, class Cfg, Activation kAct>
__device__ __forceinline__ void mma_epilogue(const MmaParams<T>& p, int64_t bz, int bm0, int bn0, const float* cs,
                                             int tid) {
  constexpr int kQuads = Cfg::BN / 4;
  const MatmulArgs<T>& args = p.args;
  T* c = args.c + bz * args.c_bs;
  T* aux = args.aux != nullptr ? args.aux + bz * args.c_bs : nullptr;
  const bool has_bias = args.bias != nullptr;
  const int rows = min(Cfg::BM, p.m - bm0);
  for (int idx = tid; idx < rows * kQuads; idx += Cfg::kThreads) {
    const int r = idx / kQuads, col = bn0 + (idx % kQuads) * 4;
    if (col >= p.n) continue;
    const float4 v = *reinterpret_cast<const float4*>(cs + r * kCLd<Cfg> + (idx % kQuads) * 4);
    float z[4] = {v.x, v.y, v.z, v.w};
    const int64_t off = static_cast<int64_t>(bm0 + r) * args.c_rs + col;
    if (p.vec_store && col + 4 <= p.n) {
      Vec<T, 4> out, pre;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (has_bias) z[e] += static_cast<float>(args.bias[col + e]);
        pre.v[e] = static_cast<T>(z[e]);
        out.v[e] = static_cast<T>(apply_activation(z[e], kAct));
      }
      if (aux != nullptr) *reinterpret_cast<Vec<T, 4>*>(aux + off) = pre;
      *reinterpret_cast<Vec<T, 4>*>(c + off) = out;
    } else {
      for (int e = 0; e < 4 && col + e < p.n; ++e) {
        if (has_bias) z[e] += static_cast<float>(args.bias[col + e]);
        if (aux != nullptr) aux[off + e] = static_cast<T>(z[e]);
        c[off + e] = static_cast<T>(apply_activation(z[e], kAct));
      }
    }
  }
}

// kAsync: 16-byte cp.async loads with A K-major (kAKMajor) or M-major, B K-major (kBKMajor) or N-major.
// !kAsync: the general path (element loads through both strides, both tiles K-major in shared memory).
template <typename T, class Cfg, bool kAsync, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) matmul_mma_sync_kernel(const MmaParams<T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(kAsync || (kAKMajor && kBKMajor), "the general path stages both operands K-major");
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int ES = sizeof(T);
  constexpr int BM = Cfg::BM, BN = Cfg::BN, MI = Cfg::MI, NI = Cfg::NI, NT = Cfg::kThreads;
  constexpr int BK = kLineBytes / ES;
  constexpr int kStepsPerTile = 4;                   // k-steps of 32 bytes (16 bf16/fp16 or 8 tf32) per stage
  constexpr int kLineA = BM * ES, kLineB = BN * ES;  // MN-major line bytes
  constexpr int kBOffset = BM * kLineBytes;          // B tile after the A tile in a stage
  const MatmulArgs<T>& args = p.args;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / Cfg::kWarpsN) * Cfg::WM, wn0 = (warp % Cfg::kWarpsN) * Cfg::WN;
  const int g = lane >> 2, t = lane & 3;

  // Tile of C, grouped kGroupM tile-rows at a time for L2 reuse.
  const int pid = blockIdx.x;
  const int group_width = kGroupM * p.tiles_n;
  const int first_m = (pid / group_width) * kGroupM;
  const int group_rows = min(p.tiles_m - first_m, kGroupM);
  const int bm0 = (first_m + (pid % group_width) % group_rows) * BM;
  const int bn0 = ((pid % group_width) / group_rows) * BN;

  const uint32_t smem0 = smem_addr(smem);

  const Fragments<T, MI, NI, kLineA, kLineB, kAKMajor, kBKMajor> frags(lane, wm0, wn0);
  uint32_t fa[2][MI][4], fb[2][NI][2];
  float acc[MI][NI][4];

  // Fragments of k-step s (0..3) of the stage at `stage` into buffer `buf`.
  auto load_fragments = [&](int buf, uint32_t stage, int s) { frags.load(fa[buf], fb[buf], stage, stage + kBOffset, s); };

  for (int64_t bz = blockIdx.z; bz < args.batch; bz += gridDim.z) {
    const T* a = args.a + bz * args.a_bs;
    const T* b = args.b + bz * args.b_bs;

    using ALoader = std::conditional_t<kAKMajor, KMajorLoader<T, BM, NT>, MnMajorLoader<T, BM, NT>>;
    using BLoader = std::conditional_t<kBKMajor, KMajorLoader<T, BN, NT>, MnMajorLoader<T, BN, NT>>;
    const ALoader a_loader(a, p.a_lead, bm0, p.m, tid);
    const BLoader b_loader(b, p.b_lead, bn0, p.n, tid);
    // Copies k-tile kt into `stage`; kInterior: the tile lies inside both matrices (no checks needed).
    auto load_tile = [&](uint32_t stage, int kt, auto interior) {
      const int k0 = kt * BK;
      if constexpr (!kAsync) {
        load_general<T, BM, NT>(stage, a, args.a_rs, args.a_cs, p.a_mn_fast, bm0, p.m, p.k, k0, tid);
        load_general<T, BN, NT>(stage + kBOffset, b, args.b_cs, args.b_rs, p.b_mn_fast, bn0, p.n, p.k, k0, tid);
      } else if constexpr (decltype(interior)::value) {
        a_loader.load_interior(stage, p.a_lead, k0);
        b_loader.load_interior(stage + kBOffset, p.b_lead, k0);
      } else {
        a_loader.load_edge(stage, a, p.a_lead, p.k, k0);
        b_loader.load_edge(stage + kBOffset, b, p.b_lead, p.k, k0);
      }
    };

#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < NI; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;
      }
    }

    const int num_k_tiles = (p.k + BK - 1) / BK;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < num_k_tiles) load_tile(smem0 + st * Cfg::kStageBytes, st, std::false_type{});
      cp_async_commit();  // empty groups keep the count uniform
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();

    int read_stage = 0, write_stage = kStages - 1;
    load_fragments(0, smem0, 0);

    // One k-tile: multiply stage `read_stage` while tile kt + kStages - 1 is copied into `write_stage`.
    auto k_tile = [&](int kt, auto interior) {
#pragma unroll
      for (int s = 0; s < kStepsPerTile; ++s) {
        if (s == kStepsPerTile - 1) {
          // Tile kt + 1 has landed (at most kStages - 2 newer groups pending), and every warp is done reading
          // tile kt - 1's stage, which the next iteration overwrites.
          cp_async_wait<kStages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
        }
        // The last k-step prefetches k-step 0 of the next tile (unused stale data after the last tile).
        load_fragments((s + 1) & 1, smem0 + read_stage * Cfg::kStageBytes, (s + 1) % kStepsPerTile);
        if (s == 0) {
          if (decltype(interior)::value || kt + kStages - 1 < num_k_tiles) {
            load_tile(smem0 + write_stage * Cfg::kStageBytes, kt + kStages - 1, interior);
          }
          cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#pragma unroll
          for (int j = 0; j < NI; ++j) mma_m16n8<T>(acc[i][j], fa[s & 1][i], fb[s & 1][j]);
        }
      }
    };
    // Blocks whose tile of C lies inside the matrix copy their k-tiles without checks up to the last whole one;
    // edge blocks and the tail check every copy. (Two copies of the loop, so that the checks of the edge path
    // are not if-converted into the interior one.)
    int kt = 0;
    if (kAsync && bm0 + BM <= p.m && bn0 + BN <= p.n) {
      const int interior_end = p.k / BK - (kStages - 1);  // the tile copied by iteration kt is kt + kStages - 1
      for (; kt < interior_end; ++kt) k_tile(kt, std::true_type{});
    }
    for (; kt < num_k_tiles; ++kt) k_tile(kt, std::false_type{});

    // Stage the accumulators through shared memory, then store rows of C.
    cp_async_wait<0>();
    __syncthreads();
    float* cs = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < NI; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<float2*>(cs + (wm0 + i * 16 + h * 8 + g) * kCLd<Cfg> + wn0 + j * 8 + 2 * t) =
              make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
    __syncthreads();
    switch (args.act) {
      case Activation::relu:
        mma_epilogue<T, Cfg, Activation::relu>(p, bz, bm0, bn0, cs, tid);
        break;
      case Activation::gelu:
        mma_epilogue<T, Cfg, Activation::gelu>(p, bz, bm0, bn0, cs, tid);
        break;
      case Activation::gelu_tanh:
        mma_epilogue<T, Cfg, Activation::gelu_tanh>(p, bz, bm0, bn0, cs, tid);
        break;
      case Activation::silu:
        mma_epilogue<T, Cfg, Activation::silu>(p, bz, bm0, bn0, cs, tid);
        break;
      default:
        mma_epilogue<T, Cfg, Activation::none>(p, bz, bm0, bn0, cs, tid);
        break;
    }
    __syncthreads();  // the next batch's prologue overwrites stages that warps may still be reading
  }
#endif
}

// ---------------------------------------------------------------------------------------------------------------
// Host side

// Compute capability major and opt-in shared memory per block of the current device, cached per device.
struct DeviceCaps {
  int cc_major = 0;
  int smem_optin = 0;
};

DeviceCaps device_caps() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // cc_major * 2^20 + smem_optin, 0 = not queried yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return {};
  int packed = device < kMaxDevices ? cached[device].load(std::memory_order_relaxed) : 0;
  if (packed == 0) {
    int major = 0, smem = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      return {};
    }
    packed = (major << 20) | (smem & ((1 << 20) - 1));
    if (device < kMaxDevices) cached[device].store(packed, std::memory_order_relaxed);
  }
  DeviceCaps caps;
  caps.cc_major = packed >> 20;
  caps.smem_optin = packed & ((1 << 20) - 1);
  return caps;
}

// How one operand is read: unit stride along k (K-major) or along m / n (MN-major), the stride between its
// contiguous lines, and whether the 16-byte cp.async path may read it. Strides of extent-1 dimensions are never
// used, so they are ignored.
struct OperandPlan {
  bool k_major = true;
  bool async_ok = false;
  int64_t lead = 0;
};

template <typename T>
OperandPlan plan_operand(const T* ptr, int64_t s_mn, int64_t s_k, int64_t s_b, int64_t mn, int64_t k, int64_t batch) {
  OperandPlan plan;
  if (s_k == 1 || (s_mn != 1 && k == 1)) {
    plan.k_major = true;
    plan.lead = mn == 1 ? 0 : s_mn;
  } else if (s_mn == 1 || mn == 1) {
    plan.k_major = false;
    plan.lead = k == 1 ? 0 : s_k;
  } else {
    return plan;  // no unit stride: general path
  }
  const int64_t es = static_cast<int64_t>(sizeof(T));
  plan.async_ok = aligned_to(ptr, 16) && (plan.lead * es) % 16 == 0 && (batch == 1 || (s_b * es) % 16 == 0);
  return plan;
}

template <typename T, class Cfg, bool kAsync, bool kAKMajor, bool kBKMajor>
cudaError_t launch_mma(const MmaParams<T>& p, cudaStream_t stream) {
  constexpr auto kernel = matmul_mma_sync_kernel<T, Cfg, kAsync, kAKMajor, kBKMajor>;
  const cudaError_t err = prepare_kernel<kernel>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.tiles_m) * static_cast<unsigned>(p.tiles_n), 1,
                  static_cast<unsigned>(std::min<int64_t>(p.args.batch, kMaxGridZ)));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, class Cfg>
cudaError_t launch_mma_async(MmaParams<T> p, bool a_k_major, bool b_k_major, cudaStream_t stream) {
  p.tiles_m = static_cast<int>((p.args.m + Cfg::BM - 1) / Cfg::BM);
  p.tiles_n = static_cast<int>((p.args.n + Cfg::BN - 1) / Cfg::BN);
  if (a_k_major) {
    return b_k_major ? launch_mma<T, Cfg, true, true, true>(p, stream)
                     : launch_mma<T, Cfg, true, true, false>(p, stream);
  }
  return b_k_major ? launch_mma<T, Cfg, true, false, true>(p, stream)
                   : launch_mma<T, Cfg, true, false, false>(p, stream);
}

}  // namespace

template <typename T>
bool matmul_mma_sync_supported(const MatmulArgs<T>& args, const char** why) {
  auto fail = [why](const char* reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  if constexpr (std::is_same_v<T, double>) {
    return fail("mma_sync: float64 has no tensor-core path (bf16, fp16, or float32 as tf32)");
  } else {
    if (std::is_same_v<T, float> && !args.allow_tf32) {
      return fail("mma_sync: float32 runs on tensor cores only as tf32, and allow_tf32 is off");
    }
    const DeviceCaps caps = device_caps();
    if (caps.cc_major < 8) return fail("mma_sync: needs a GPU of compute capability 8.0 or newer");
    if (caps.smem_optin < SmallTile::kSmemBytes) return fail("mma_sync: the device has too little shared memory");
    constexpr int64_t kMaxDim = INT_MAX - 1024;  // 32-bit row / column / k indices with room for a tile
    if (args.m > kMaxDim || args.n > kMaxDim || args.k > kMaxDim) {
      return fail("mma_sync: m, n and k must be below 2^31");
    }
    const int64_t tiles =
        ((args.m + SmallTile::BM - 1) / SmallTile::BM) * ((args.n + SmallTile::BN - 1) / SmallTile::BN);
    if (tiles > INT_MAX) return fail("mma_sync: too many output tiles for one grid");
    return true;
  }
}

template <typename T>
cudaError_t matmul_mma_sync(const MatmulArgs<T>& args, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, double>) {
    return cudaErrorNotSupported;
  } else {
    if (!matmul_mma_sync_supported(args, nullptr)) return cudaErrorNotSupported;
    if (args.m <= 0 || args.n <= 0 || args.batch <= 0) return cudaSuccess;

    MmaParams<T> p{};
    p.args = args;
    p.m = static_cast<int>(args.m);
    p.n = static_cast<int>(args.n);
    p.k = static_cast<int>(args.k);
    constexpr int es = static_cast<int>(sizeof(T));
    p.vec_store = aligned_to(args.c, 4 * es) && args.c_rs % 4 == 0 && (args.batch == 1 || args.c_bs % 4 == 0) &&
                  (args.aux == nullptr || aligned_to(args.aux, 4 * es));

    const OperandPlan pa = plan_operand(args.a, args.a_rs, args.a_cs, args.a_bs, args.m, args.k, args.batch);
    const OperandPlan pb = plan_operand(args.b, args.b_cs, args.b_rs, args.b_bs, args.n, args.k, args.batch);
    if (!pa.async_ok || !pb.async_ok) {
      p.a_mn_fast = args.a_rs == 1 && args.a_cs != 1;
      p.b_mn_fast = args.b_cs == 1 && args.b_rs != 1;
      p.tiles_m = static_cast<int>((args.m + SmallTile::BM - 1) / SmallTile::BM);
      p.tiles_n = static_cast<int>((args.n + SmallTile::BN - 1) / SmallTile::BN);
      return launch_mma<T, SmallTile, false, true, true>(p, stream);
    }
    p.a_lead = pa.lead;
    p.b_lead = pb.lead;

    // The large tile when it fits the device and its tiles fill every multiprocessor at least once; the small one
    // (twice the blocks) otherwise.
    const int64_t large_tiles =
        ((args.m + LargeTile::BM - 1) / LargeTile::BM) * ((args.n + LargeTile::BN - 1) / LargeTile::BN) * args.batch;
    const bool large =
        device_caps().smem_optin >= LargeTile::kSmemBytes && args.n > SmallTile::BN && large_tiles >= sm_count();
    return large ? launch_mma_async<T, LargeTile>(p, pa.k_major, pb.k_major, stream)
                 : launch_mma_async<T, SmallTile>(p, pa.k_major, pb.k_major, stream);
  }
}

#define TORCHEXT_INSTANTIATE_MATMUL_MMA(T)                                        \
  template bool matmul_mma_sync_supported<T>(const MatmulArgs<T>&, const char**); \
  template cudaError_t matmul_mma_sync<T>(const MatmulArgs<T>&, cudaStream_t);
TORCHEXT_INSTANTIATE_MATMUL_MMA(float)
TORCHEXT_INSTANTIATE_MATMUL_MMA(double)
TORCHEXT_INSTANTIATE_MATMUL_MMA(__half)
TORCHEXT_INSTANTIATE_MATMUL_MMA(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_MATMUL_MMA

}  // namespace torchext::cuda_ops
