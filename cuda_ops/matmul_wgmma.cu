// Tensor-core GEMM for Hopper: wgmma fed by the bulk tensor copy engine (TMA), the top of the matmul ladder.
//
//   C (m, n) = act(A (m, k) B (k, n) + bias), batched; see cuda_ops/matmul.cuh for the arguments.
//   bf16 / fp16 inputs (A and B each K-major or M/N-major), and tf32 for float inputs when the caller allows it
//   (K-major A and B only: wgmma reads 32-bit operands K-major only). Accumulation in float.
//
// What this version adds over mma.sync (cuda_ops/matmul_mma.cu):
//   - wgmma: one instruction multiplies a 64 x 256 x 16 block for a whole warpgroup (4 warps), reading A and B
//     straight from shared memory through descriptors; no ldmatrix, no register staging of operands.
//   - TMA: one thread issues each tile copy; the copy engine computes the addresses, zero-fills what lies outside
//     the matrix (so any m, n, k works without predicated loads) and writes the 128-byte-swizzled layout that
//     wgmma reads without bank conflicts. Completion is counted in bytes on an mbarrier.
//   - Warp specialization: warpgroup 0 only issues copies (it gives most of its registers back with
//     setmaxnreg); warpgroups 1 and 2 each own 64 rows of the 128 x 256 tile and 128 float accumulators per
//     thread. A 3-stage ring of shared-memory buffers with "full" and "empty" barriers lets copies run ahead of
//     the math.
//   - Persistent grid: one block per multiprocessor walks the tiles, in groups of 8 tile-rows for L2 reuse; the
//     producer prefetches the next tile while the consumers run the epilogue of the current one.
//   - Stream-K for products of few tiles and a long k (given a workspace): a 1024 x 1024 output is 32 tiles, a
//     quarter of an H200's 132 multiprocessors. The tiles are cut along k and their k-steps dealt out evenly to
//     all blocks. A block that computes part of a tile leaves its partial sums in the workspace; the block that
//     computes the tile's last k-steps adds them, in a fixed order (the result does not change from call to call),
//     and runs the epilogue. See `Schedule` and `plan_schedule` below.
//
// Shapes per block: tile 128 (m) x 256 (n), k step 128 bytes (64 halves or 32 floats) per stage, 48 KiB per
// stage, 3 stages, and 32 KiB of output staging per consumer: 208 KiB of shared memory. Built only for sm_90a
// (wgmma and setmaxnreg are Hopper-specific); elsewhere the kernel body is empty and matmul_wgmma_supported() says
// no.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "matmul.cuh"
#include "matmul_epilogue.cuh"
#include "sm90.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kBM = 128;        // rows of C per tile: two consumer warpgroups of 64
constexpr int kBN = 256;        // columns of C per tile: the n of one wgmma
constexpr int kRowBytes = 128;  // bytes of k per stage and row: one 128-byte swizzle span
// 3 stages and a 32 KiB staging buffer per consumer (a 16-bit consumer's whole 64 x 256 output) rather than 4 and
// 16 KiB: the epilogue writes its output in one piece instead of waiting in the middle of it for the copy engine to
// read the first half out. Measured on an H200 (matmul_check --linear, three alternated runs): 1.5-3% faster on
// the Linear 8192 x 4096 -> 4096 GEMMs (NOTES_matmul.md, version 14). 4 stages and 32 KiB do not fit (256 KiB).
constexpr int kStages = 3;
constexpr int kTileBytesA = kBM * kRowBytes;  // 16 KiB
constexpr int kTileBytesB = kBN * kRowBytes;  // 32 KiB
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
constexpr int kChunkBytes = 64 * kRowBytes;  // one 64-wide M- or N-major box of 16-bit values: 8 KiB
constexpr int kConsumers = 2;
constexpr int kStagingBytes = 32 * 1024;  // per consumer: the output staging buffer of the TMA-store epilogue
// Layout: [stages][staging per consumer][full and empty barriers], from a 1024-aligned base.
constexpr int kSmemBytes =
    kStages * kStageBytes + kConsumers * kStagingBytes + 1024 /* alignment slack */ + 2 * kStages * 8 /* barriers */;
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr int kGroupM = 8;     // tile-rows walked together for L2 reuse

template <typename T>
constexpr int kBK = kRowBytes / sizeof(T);  // k per stage: 64 for 16-bit types, 32 for tf32

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers of the GEMM alone (the shared ones: cuda_ops/sm90.cuh). Only compiled into the sm_90a image.
using namespace sm90;

#if defined(TORCHEXT_WGMMA_DEVICE)

// Stream-K's hand-over between blocks: a flag in global memory, set with release semantics after the partial sums
// are written, read with acquire semantics before they are read.
__device__ __forceinline__ void flag_release(int* flag) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
}
__device__ __forceinline__ void flag_wait(const int* flag) {
  int v = 0;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  } while (v == 0);
}

// Float epilogue stores into the staging buffer (16-bit ones: stmatrix_x4, sm90.cuh), through 32-bit shared
// addresses (a generic pointer made the compiler emit 64-bit ST.E with 64-bit address arithmetic).
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across wgmma's asynchronous accesses.
__device__ __forceinline__ void fence_accumulators(float (&d)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x 256, float, 128 registers per thread) += A (64 x k) B (k x 256), one instruction per warpgroup.
template <typename T, bool kTransA, bool kTransB>
struct Wgmma;

template <bool kTransA, bool kTransB>
struct Wgmma<__nv_bfloat16, kTransA, kTransB> {
  static constexpr int kK = 16;
  __device__ __forceinline__ static void run(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " TORCHEXT_WGMMA_D_REGS_128
        ", %128, %129, p, 1, 1, %130, %131;\n"
        "}\n"
        : TORCHEXT_WGMMA_D_OPERANDS_128(d)
        : "l"(desc_a), "l"(desc_b), "n"(int(kTransA)), "n"(int(kTransB)));
  }
};

template <bool kTransA, bool kTransB>
struct Wgmma<__half, kTransA, kTransB> {
  static constexpr int kK = 16;
  __device__ __forceinline__ static void run(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " TORCHEXT_WGMMA_D_REGS_128
        ", %128, %129, p, 1, 1, %130, %131;\n"
        "}\n"
        : TORCHEXT_WGMMA_D_OPERANDS_128(d)
        : "l"(desc_a), "l"(desc_b), "n"(int(kTransA)), "n"(int(kTransB)));
  }
};

// tf32: the tensor cores read the top 19 bits of each float. K-major operands only.
template <>
struct Wgmma<float, false, false> {
  static constexpr int kK = 8;
  __device__ __forceinline__ static void run(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " TORCHEXT_WGMMA_D_REGS_128
        ", %128, %129, p, 1, 1;\n"
        "}\n"
        : TORCHEXT_WGMMA_D_OPERANDS_128(d)
        : "l"(desc_a), "l"(desc_b));
  }
};

#endif  // TORCHEXT_WGMMA_DEVICE

// Which tile of which batch the t-th work item is: tiles walk kGroupM tile-rows at a time, column by column, so
// the blocks running together share rows of A and columns of B in L2.
struct TileCoord {
  int b, tm, tn;
};
__device__ __forceinline__ TileCoord tile_coord(int t, int tiles_m, int tiles_n) {
  const int per_batch = tiles_m * tiles_n;
  const int b = t / per_batch, r = t % per_batch;
  const int group = kGroupM * tiles_n;
  const int first_m = (r / group) * kGroupM;
  const int rows = min(tiles_m - first_m, kGroupM);
  const int in_group = r % group;
  return {b, first_m + in_group % rows, in_group / rows};
}

// Which block computes what (stream-K, Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense
// Matrix-Matrix Multiplication on the GPU", 2023, in its "data-parallel + one stream-K wave" form).
//   - Tiles [0, dp_tiles) are data-parallel: block b computes tiles b, b + grid, b + 2 grid, ... whole; dp_tiles is
//     a multiple of the grid, so every block computes the same number.
//   - The last sk_tiles tiles (the partial wave) are stream-K: their sk_tiles * k_tiles k-steps, in order (tile by
//     tile, k-step by k-step), are cut into sk_blocks contiguous ranges of near-equal length, range b to block b.
//     A range is at most one tile long, so it holds the end of one tile and the start of the next, or a piece
//     inside one tile: at most two units of work, done upper first.
//   - Each tile belongs to the block whose range holds its last k-step (the owner). The blocks below the owner whose
//     ranges reach into the tile (its contributors) store their partial sums, one slot per block (only a block's
//     upper unit can be a contribution), and raise a flag. The owner adds them in block order, so the sum is the
//     same every call, and runs the epilogue.
//   - Contributors never wait; an owner waits only on blocks of lower index, and only after their data-parallel
//     tiles: no block waits on one that waits on it.
// Without a workspace (or where splitting gains nothing) dp_tiles is every tile and there is no stream-K part.
struct Schedule {
  int tiles_m = 0, tiles_n = 0, k_tiles = 0;
  int dp_tiles = 0, sk_tiles = 0, sk_blocks = 0;
  // First k-step (counted over the stream-K tiles) of block b's range; sk_begin(sk_blocks) is the end of the last.
  __host__ __device__ int64_t sk_begin(int b) const { return int64_t(b) * sk_tiles * k_tiles / sk_blocks; }
};

struct Work {
  int tile;               // index into tile_coord's order
  int k_begin, k_end;     // k-steps of the tile computed here
  bool owner;             // computes the tile's last k-step: adds the contributions, runs the epilogue
  int first_contributor;  // owner: contributors are blocks first_contributor .. this block - 1 (none when equal)
};

// Units of work of block `blk`: its data-parallel tiles, then its stream-K units (upper first).
__host__ __device__ inline int dp_units(const Schedule& s, int blk, int grid) {
  return blk < s.dp_tiles ? (s.dp_tiles - 1 - blk) / grid + 1 : 0;
}
__host__ __device__ inline int work_units(const Schedule& s, int blk, int grid) {
  int n = dp_units(s, blk, grid);
  if (blk < s.sk_blocks) {
    const int64_t begin = s.sk_begin(blk), end = s.sk_begin(blk + 1);
    const int64_t upper_start = (end - 1) / s.k_tiles * s.k_tiles;
    n += begin < upper_start ? 2 : 1;
  }
  return n;
}
__host__ __device__ inline Work work_unit(const Schedule& s, int blk, int grid, int u) {
  const int n_dp = dp_units(s, blk, grid);
  if (u < n_dp) return {blk + u * grid, 0, s.k_tiles, true, blk};
  const int64_t K = s.k_tiles, begin = s.sk_begin(blk), end = s.sk_begin(blk + 1);
  const int64_t upper = (end - 1) / K;  // stream-K tile of the range's last k-step
  const int64_t j = u == n_dp ? upper : upper - 1;
  const int64_t kb = u == n_dp ? (begin > upper * K ? begin : upper * K) : begin;
  const int64_t ke = u == n_dp ? end : upper * K;
  Work w{int(s.dp_tiles + j), int(kb - j * K), int(ke - j * K), ke == (j + 1) * K, blk};
  if (w.owner) {
    // Blocks below reach into tile j while their ranges end after its first k-step.
    while (w.first_contributor > 0 && s.sk_begin(w.first_contributor) > j * K) --w.first_contributor;
  }
  return w;
}

// The activation of the fused epilogue, out of line: inlined into the 128 accumulator stores per thread, erf/tanh/exp
// made the kernel half a megabyte of code, and ncu showed warps stalled on instruction fetch half the time.
// It touches no memory, so the calls do not wait on each other.
__device__ __noinline__ float activation_out_of_line(float z, Activation act) { return apply_activation(z, act); }

// One accumulator group of the TMA-store epilogue: row r, columns c and c + 1, then row r + 8, the same columns.
struct Float4 {
  float v[4];
};

// The TMA-store epilogue's staging buffer, per consumer: 64 rows (the consumer's) x kChunkCols columns, as boxes of
// 64 rows x 128 bytes, each row's 16-byte units swizzled by XOR with row % 8 (TMA's 128-byte swizzle).
template <typename T>
constexpr int kBoxCols = kRowBytes / int(sizeof(T));  // 64 halves or 32 floats
template <typename T>
constexpr int kChunkCols = kStagingBytes / (64 * int(sizeof(T)));  // 256 halves (the whole tile) or 128 floats
constexpr int kBoxBytes = 64 * kRowBytes;

// The activation the epilogue applies on its way from the accumulators to the staging, as a type: none or relu
// (the others are applied to the staging, activate_staging).
template <Activation A>
using ActivationC = std::integral_constant<Activation, A>;

#if defined(TORCHEXT_WGMMA_DEVICE)
// A lane's staging addresses for the four pairs of accumulator groups of a box (16-bit) or the four groups of a box
// (float); the box and, for float, the second row are constant offsets.
struct StagingLane {
  uint32_t addr[4];
};

template <typename T>
__device__ __forceinline__ StagingLane staging_lane_for(uint32_t base, int warp, int lane) {
  StagingLane s;
  if constexpr (sizeof(T) == 2) {
    // stmatrix x4 of groups (jj, jj + 1): matrices (jj, rows 0-7), (jj, rows 8-15), (jj + 1, 0-7), (jj + 1, 8-15)
    // of the warp's 16 rows. Lane l addresses row l % 8 of matrix l / 8: row 16 warp + 8 ((l / 8) % 2) + l % 8,
    // 16-byte unit jj % 8 + l / 16, stored at unit ^ (row % 8) = (jj % 8) ^ (l / 16) ^ (l % 8) (jj is even).
    const int row = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
    const int y = (lane >> 4) ^ (lane & 7);
#pragma unroll
    for (int k = 0; k < 4; ++k) s.addr[k] = base + row * kRowBytes + (((2 * k) ^ y) << 4);
  } else {
    // Group j' of a box (8 columns = 32 bytes): this lane's pair at byte 32 j' + 8 (lane % 4) of rows
    // 16 warp + lane / 4 (and + 8): unit 2 j' + (lane % 4) / 2, stored at unit ^ (row % 8), + 8 (lane % 2).
    const int row = warp * 16 + (lane >> 2);
    const int y = ((lane >> 1) & 1) ^ (row & 7);
#pragma unroll
    for (int k = 0; k < 4; ++k) s.addr[k] = base + row * kRowBytes + (((2 * k) ^ y) << 4) + (lane & 1) * 8;
  }
  return s;
}

template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float a, float b) {
  const Vec<T, 2> v{{T(a), T(b)}};
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// Accumulator groups jj and jj + 1 (jj even, counted within the chunk; z.v = row r: columns c, c + 1, then row
// r + 8: the same columns) into the staging buffer.
template <typename T>
__device__ __forceinline__ void staging_store_pairs(const StagingLane& s, int jj, const Float4& z0, const Float4& z1) {
  if constexpr (sizeof(T) == 2) {
    const uint32_t addr = s.addr[(jj % 8) / 2] + (jj / 8) * kBoxBytes;
    stmatrix_x4(addr, pack_pair<T>(z0.v[0], z0.v[1]), pack_pair<T>(z0.v[2], z0.v[3]), pack_pair<T>(z1.v[0], z1.v[1]),
                pack_pair<T>(z1.v[2], z1.v[3]));
  } else {
    const uint32_t box = (jj / 4) * kBoxBytes;
    const uint32_t a0 = s.addr[jj % 4] + box, a1 = s.addr[(jj + 1) % 4] + box;
    st_shared_v2(a0, z0.v[0], z0.v[1]);
    st_shared_v2(a0 + 8 * kRowBytes, z0.v[2], z0.v[3]);
    st_shared_v2(a1, z1.v[0], z1.v[1]);
    st_shared_v2(a1 + 8 * kRowBytes, z1.v[2], z1.v[3]);
  }
}

// act(z) in place over a consumer's staging buffer (kStagingBytes at `base`), 16 bytes per thread and step,
// consecutive threads on consecutive 16-byte units (conflict-free; the swizzle does not matter to an elementwise
// map). The loop is kept rolled: the erf / tanh / exp code is there once per activation.
template <typename T, Activation A>
__device__ __forceinline__ void activate_staging_as(uint32_t base, int tid) {
#pragma unroll 1
  for (int u = tid; u < kStagingBytes / 16; u += 128) {
    const uint32_t addr = base + u * 16;
    uint32_t w[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(addr)
                 : "memory");
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (sizeof(T) == 2) {
        Vec<T, 2> v;
        std::memcpy(&v, &w[i], 4);
        w[i] = pack_pair<T>(apply_activation(static_cast<float>(v.v[0]), A),
                            apply_activation(static_cast<float>(v.v[1]), A));
      } else {
        w[i] = __float_as_uint(apply_activation(__uint_as_float(w[i]), A));
      }
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  }
}

template <typename T>
__device__ __forceinline__ void activate_staging(uint32_t base, int tid, Activation act) {
  switch (act) {
    case Activation::relu:
      return activate_staging_as<T, Activation::relu>(base, tid);
    case Activation::gelu:
      return activate_staging_as<T, Activation::gelu>(base, tid);
    case Activation::gelu_tanh:
      return activate_staging_as<T, Activation::gelu_tanh>(base, tid);
    case Activation::silu:
      return activate_staging_as<T, Activation::silu>(base, tid);
    default:
      return;
  }
}
#endif  // TORCHEXT_WGMMA_DEVICE

// Output columns j and j + 1 of row i: z = acc + bias (b0, b1: 0 without bias), z to aux, act(z) to C.
template <typename T>
__device__ __forceinline__ void store_pair(const MatmulArgs<T>& p, bool pair_aligned, int64_t b, int64_t i, int64_t j,
                                           float b0, float b1, float v0, float v1) {
  if (i >= p.m || j >= p.n) return;
  const bool both = j + 1 < p.n;
  const float z0 = v0 + b0, z1 = v1 + b1;
  const int64_t off = b * p.c_bs + i * p.c_rs + j;
  if (p.aux != nullptr) {
    if (pair_aligned && both) {
      *reinterpret_cast<Vec<T, 2>*>(p.aux + off) = Vec<T, 2>{{T(z0), T(z1)}};
    } else {
      p.aux[off] = T(z0);
      if (both) p.aux[off + 1] = T(z1);
    }
  }
  float y0 = z0, y1 = z1;
  if (p.act == Activation::relu) {
    y0 = math::relu_forward(z0);
    y1 = math::relu_forward(z1);
  } else if (p.act != Activation::none) {
    y0 = activation_out_of_line(z0, p.act);
    y1 = activation_out_of_line(z1, p.act);
  }
  if (pair_aligned && both) {
    *reinterpret_cast<Vec<T, 2>*>(p.c + off) = Vec<T, 2>{{T(y0), T(y1)}};
  } else {
    p.c[off] = T(y0);
    if (both) p.c[off + 1] = T(y1);
  }
}

// Named barrier 2 + consumer over one consumer warpgroup (128 threads); barrier 0 is __syncthreads.
__device__ __forceinline__ void consumer_sync(int consumer) {
  asm volatile("bar.sync %0, 128;" ::"r"(2 + consumer) : "memory");
}

// A K-major: smem A tile is 128 rows (m) of 128 bytes (k). A M-major: two 64-wide chunks, each 64 k-rows of 64 m.
// B likewise with 256 rows (n) or four 64-wide chunks.
// `partials` and `flags` (stream-K, see Schedule): per block of the stream-K part, each consumer's 64 x 256 partial
// sums (as [register / 4][thread][4], so that each warp's 16-byte accesses are contiguous) and its flag, zeroed
// before the launch.
template <typename T, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(kThreads, 1)
    matmul_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_aux,
                        const MatmulArgs<T> p, const Schedule sched, float* partials, int* flags, int a_batched,
                        int b_batched, int pair_aligned, int tma_store) {
#if defined(TORCHEXT_WGMMA_DEVICE)
  extern __shared__ uint8_t smem_raw[];
  // 128-byte swizzling repeats every 1024 bytes and is computed from the address: stage buffers start on 1024.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* staging_base = smem + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(staging_base + kConsumers * kStagingBytes);
  uint64_t* empty = full + kStages;
  const int warpgroup = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const int units = work_units(sched, blockIdx.x, gridDim.x);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);                // the producer's arrive; the bytes come from the copies
      mbar_init(&empty[s], kConsumers * 4);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    // Producer: one thread issues every copy.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {
      int s = 0;
      uint32_t phase = 0;
      for (int u = 0; u < units; ++u) {
        const Work w = work_unit(sched, blockIdx.x, gridDim.x, u);
        const TileCoord tc = tile_coord(w.tile, sched.tiles_m, sched.tiles_n);
        const int ba = a_batched ? tc.b : 0, bb = b_batched ? tc.b : 0;
        for (int kt = w.k_begin; kt < w.k_end; ++kt) {
          mbar_wait(&empty[s], phase ^ 1);
          mbar_arrive_expect_tx(&full[s], kStageBytes);
          uint8_t* sa = smem + s * kStageBytes;
          uint8_t* sb = sa + kTileBytesA;
          const int k0 = kt * kBK<T>;
          if constexpr (kAKMajor) {
            tma_load_3d(sa, &map_a, &full[s], k0, tc.tm * kBM, ba);
          } else {
#pragma unroll
            for (int c = 0; c < kBM / 64; ++c)
              tma_load_3d(sa + c * kChunkBytes, &map_a, &full[s], tc.tm * kBM + c * 64, k0, ba);
          }
          if constexpr (kBKMajor) {
            tma_load_3d(sb, &map_b, &full[s], k0, tc.tn * kBN, bb);
          } else {
#pragma unroll
            for (int c = 0; c < kBN / 64; ++c)
              tma_load_3d(sb + c * kChunkBytes, &map_b, &full[s], tc.tn * kBN + c * 64, k0, bb);
          }
          if (++s == kStages) s = 0, phase ^= 1;
        }
      }
    }
  } else {
    // Consumers: warpgroup 1 computes rows 0-63 of the tile, warpgroup 2 rows 64-127.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int consumer = warpgroup - 1;
    const int warp = tid / 32, lane = tid % 32;
    using Mma = Wgmma<T, !kAKMajor, !kBKMajor>;
    constexpr int kSteps = kBK<T> / Mma::kK;  // wgmmas per stage: 4
    float d[128];
    // Stage `stage` is free again as far as this warp is concerned.
    auto release = [&](int stage) {
      if (lane == 0) mbar_arrive(&empty[stage]);
    };
    // The descriptors of stage 0, k-step 0 of this consumer's A rows and of B, computed once: a descriptor's low
    // 14 bits are the address / 16, so other stages and k-steps are constant offsets (shared addresses stay below
    // 2^18, so the field never carries over).
    const uint32_t stage0 = smem_addr(smem);
    const uint32_t desc_a = kAKMajor ? smem_desc_lo(stage0 + consumer * 64 * kRowBytes, 16)
                                     : smem_desc_lo(stage0 + consumer * kChunkBytes, kChunkBytes);
    const uint32_t desc_b = smem_desc_lo(stage0 + kTileBytesA, kBKMajor ? 16 : kChunkBytes);
    constexpr uint32_t kDescHi = smem_desc_hi(1024);
    constexpr int kStepBytesA = kAKMajor ? Mma::kK * int(sizeof(T)) : Mma::kK * kRowBytes;
    constexpr int kStepBytesB = kBKMajor ? Mma::kK * int(sizeof(T)) : Mma::kK * kRowBytes;
    uint8_t* staging = staging_base + consumer * kStagingBytes;  // the TMA-store epilogue's buffer
    const StagingLane staging_lane = staging_lane_for<T>(smem_addr(staging), warp, lane);
    int stage = 0, prev_stage = 0;
    uint32_t phase = 0;
    for (int u = 0; u < units; ++u) {
      const Work w = work_unit(sched, blockIdx.x, gridDim.x, u);
      const TileCoord tc = tile_coord(w.tile, sched.tiles_m, sched.tiles_n);
      const int64_t col0 = int64_t(tc.tn) * kBN;
      // The tile's 256 bias values, loaded now and used after the main loop: each lane holds column pairs lane,
      // lane + 32, lane + 64 and lane + 96, and the epilogue takes the pair it needs from its lane by a shuffle.
      // 16-bit pairs stay packed in one register each: they live through the main loop.
      constexpr int kWords = sizeof(T) == 2 ? 1 : 2;
      uint32_t bias_pairs[4][kWords];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t j = col0 + 2 * (lane + 32 * r);
        const bool load = p.bias != nullptr && w.owner;
        const T b0 = load && j < p.n ? p.bias[j] : T(0.f), b1 = load && j + 1 < p.n ? p.bias[j + 1] : T(0.f);
        if constexpr (kWords == 1) {
          Vec<T, 2> v{{b0, b1}};
          std::memcpy(&bias_pairs[r][0], &v, 4);
        } else {
          bias_pairs[r][0] = __float_as_uint(b0), bias_pairs[r][1] = __float_as_uint(b1);
        }
      }
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.f;
      for (int kt = w.k_begin; kt < w.k_end; ++kt) {
        mbar_wait(&full[stage], phase);
        const uint32_t stage_offset = uint32_t(stage * kStageBytes) >> 4;
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < kSteps; ++step) {
          Mma::run(d, smem_desc(desc_a + stage_offset + (step * kStepBytesA >> 4), kDescHi),
                   smem_desc(desc_b + stage_offset + (step * kStepBytesB >> 4), kDescHi));
        }
        wgmma_commit();
        // Keep this stage's wgmmas in flight; the previous stage's are done, so its buffers go back.
        wgmma_wait<1>();
        if (kt > w.k_begin) release(prev_stage);
        prev_stage = stage;
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      release(prev_stage);  // every unit has at least one k-step
      fence_accumulators(d);

      // Stream-K: a contributor leaves its partial sums for the tile's owner; the owner adds those of the blocks
      // below it, lowest first.
      if (!w.owner) {
        float4* part = reinterpret_cast<float4*>(partials + (size_t(blockIdx.x) * kConsumers + consumer) * (128 * 128));
#pragma unroll
        for (int i = 0; i < 32; ++i)
          __stcg(part + i * 128 + tid, make_float4(d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]));
        __threadfence();
        consumer_sync(consumer);
        if (tid == 0) flag_release(&flags[blockIdx.x * kConsumers + consumer]);
        continue;
      }
      for (int c = w.first_contributor; c < int(blockIdx.x); ++c) {
        if (tid == 0) flag_wait(&flags[c * kConsumers + consumer]);
        consumer_sync(consumer);
        const float4* part =
            reinterpret_cast<const float4*>(partials + (size_t(c) * kConsumers + consumer) * (128 * 128));
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float4 v = __ldcg(part + i * 128 + tid);
          d[4 * i] += v.x, d[4 * i + 1] += v.y, d[4 * i + 2] += v.z, d[4 * i + 3] += v.w;
        }
      }

      // Accumulator layout of m64nNk16: warp w holds rows 16w + lane/4 and 16w + lane/4 + 8; register 4j + e
      // holds column 8j + 2 (lane % 4) + (e & 1), the second row for e >= 2. Column pair 4j + lane % 4 of the
      // tile is bias pair j / 8 of lane 4 (j % 8) + lane % 4.
      // Only called with a bias.
      auto bias_pair = [&](int j) {
        float2 v;
        const int src = 4 * (j % 8) + lane % 4;
        if constexpr (kWords == 1) {
          const uint32_t bits = __shfl_sync(0xffffffffu, bias_pairs[j / 8][0], src);
          Vec<T, 2> pair;
          std::memcpy(&pair, &bits, 4);
          v.x = static_cast<float>(pair.v[0]), v.y = static_cast<float>(pair.v[1]);
        } else {
          v.x = __uint_as_float(__shfl_sync(0xffffffffu, bias_pairs[j / 8][0], src));
          v.y = __uint_as_float(__shfl_sync(0xffffffffu, bias_pairs[j / 8][1], src));
        }
        return v;
      };
      if (tma_store) {
        // Through shared memory and the copy engine: the warpgroup writes its 64 rows into a 128-byte-swizzled
        // staging buffer (conflict-free), one thread stores it with TMA, and the warpgroup goes back to the main
        // loop while the copy drains. Chunks of kChunkCols<T> columns (the whole tile in 16 bits, half of it in
        // float), in boxes of 64 rows x 128 bytes.
        //   - No aux and no activation or relu: act(z) goes to the staging straight from the accumulators. Whether
        //     there is a bias and which of the two applies is decided once per chunk: the code of each case is
        //     straight-line (an earlier version tested them per accumulator group, ~35 instructions per 8 columns
        //     where the plain GEMM needs 3).
        //   - Otherwise z goes to the staging (and from there to aux, the pre-activation that gelu / silu
        //     backward reads), then the warpgroup applies the activation to the staging in place, 16 bytes per
        //     thread and step, in a loop that is not unrolled. The activation then reads z rounded to T, as
        //     PyTorch's Linear followed by the activation does. Applied to the accumulators instead, through an
        //     out-of-line call per 4 values (inlined, erf / tanh / exp made the kernel half a megabyte), it took
        //     twice the instructions, and z was written to the staging twice.
        const bool staged_act = p.aux != nullptr || (p.act != Activation::none && p.act != Activation::relu);
#pragma unroll
        for (int q = 0; q < kBN / kChunkCols<T>; ++q) {
          if (tid == 0) tma_store_wait_read();  // the last copy out of the buffer (previous chunk or tile) has read it
          consumer_sync(consumer);
          auto write = [&](auto kind, auto has_bias) {
            constexpr Activation kAct = decltype(kind)::value;
            constexpr bool kBias = decltype(has_bias)::value;
            // z = acc + bias, and relu, for accumulator group j (columns 8j .. 8j + 7 of the tile).
            auto group = [&](int j) {
              Float4 z{{d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]}};
              if constexpr (kBias) {
                const float2 bj = bias_pair(j);
                z.v[0] += bj.x, z.v[1] += bj.y, z.v[2] += bj.x, z.v[3] += bj.y;
              }
              if constexpr (kAct == Activation::relu) {
#pragma unroll
                for (int e = 0; e < 4; ++e) z.v[e] = math::relu_forward(z.v[e]);
              }
              return z;
            };
#pragma unroll
            for (int jj = 0; jj < kChunkCols<T> / 8; jj += 2) {
              const int j = q * (kChunkCols<T> / 8) + jj;
              staging_store_pairs<T>(staging_lane, jj, group(j), group(j + 1));
            }
          };
          const bool bias = p.bias != nullptr;
          if (staged_act || p.act == Activation::none) {
            bias ? write(ActivationC<Activation::none>{}, std::true_type{})
                 : write(ActivationC<Activation::none>{}, std::false_type{});
          } else {
            bias ? write(ActivationC<Activation::relu>{}, std::true_type{})
                 : write(ActivationC<Activation::relu>{}, std::false_type{});
          }
          fence_proxy_async();
          consumer_sync(consumer);
          auto store = [&](const CUtensorMap* map) {
#pragma unroll
            for (int box = 0; box < kChunkCols<T> / kBoxCols<T>; ++box) {
              tma_store_3d(map, staging + box * kBoxBytes, tc.tn * kBN + q * kChunkCols<T> + box * kBoxCols<T>,
                           tc.tm * kBM + consumer * 64, tc.b);
            }
            tma_store_commit();
          };
          if (staged_act) {
            if (p.aux != nullptr) {
              if (tid == 0) {
                store(&map_aux);
                tma_store_wait_read();
              }
              consumer_sync(consumer);
            }
            if (p.act != Activation::none) {
              activate_staging<T>(smem_addr(staging), tid, p.act);
              fence_proxy_async();
              consumer_sync(consumer);
            }
          }
          if (tid == 0) store(&map_c);
        }
      } else {
        const int64_t row = int64_t(tc.tm) * kBM + consumer * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          const int64_t col = col0 + 8 * j + 2 * (lane % 4);
          const float2 bj = p.bias != nullptr ? bias_pair(j) : float2{0.f, 0.f};
          store_pair(p, pair_aligned != 0, tc.b, row, col, bj.x, bj.y, d[4 * j], d[4 * j + 1]);
          store_pair(p, pair_aligned != 0, tc.b, row + 8, col, bj.x, bj.y, d[4 * j + 2], d[4 * j + 3]);
        }
      }
    }
    if (tma_store && tid == 0) tma_store_wait_all();
  }
#endif  // TORCHEXT_WGMMA_DEVICE
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

// How one operand is read: `major` is the dimension with unit stride ("inner", TMA's dimension 0), `lead` the
// element stride of the other one. X is (rows, cols) = A (m, k) or B^T (n, k), so K-major means cols are inner.
struct OperandPlan {
  bool k_major = true;
  int64_t lead = 0;  // stride between k rows (M/N-major) or m/n rows (K-major), in elements
  bool ok = false;
};

// rows x cols operand with strides rs (between rows) and cs (between cols); cols is k.
inline OperandPlan plan_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  OperandPlan o;
  // A stride of 0 (a broadcast, as from expand) has no TMA form: its dimension would be read as distinct rows.
  if (cs == 1 || cols <= 1) {  // K-major: each row's k values contiguous
    o.k_major = true;
    o.lead = rows <= 1 ? 0 : rs;
    o.ok = rows <= 1 || rs > 0;
  } else if (rs == 1 || rows <= 1) {  // M/N-major
    o.k_major = false;
    o.lead = cols <= 1 ? 0 : cs;
    o.ok = cols <= 1 || cs > 0;
  }
  return o;
}

template <typename T>
bool check_args(const MatmulArgs<T>& a, OperandPlan& pa, OperandPlan& pb, const char** why) {
  auto fail = [&](const char* msg) {
    if (why) *why = msg;
    return false;
  };
  if constexpr (std::is_same_v<T, double>) {
    return fail("wgmma has no float64 form");
  } else {
#if !defined(TORCHEXT_BUILT_SM90A)
    return fail("this build has no sm_90a code (build with 9.0 in TORCH_CUDA_ARCH_LIST)");
#endif
    if (compute_capability() != 90) return fail("wgmma needs an sm_90 GPU (H100 / H200)");
    if (encode_tiled_fn() == nullptr) return fail("the driver has no cuTensorMapEncodeTiled");
    if (std::is_same_v<T, float> && !a.allow_tf32) return fail("float32 inputs need tf32 to be allowed");
    if (a.k == 0) return fail("k == 0");
    const int64_t limit = int64_t(1) << 31;
    if (a.m >= limit || a.n >= limit || a.k >= limit || a.batch >= limit) return fail("a dimension is >= 2^31");
    pa = plan_operand(a.m, a.k, a.a_rs, a.a_cs);
    // B is (k, n); as an operand it is B^T = (n, k) with row stride b_cs and column stride b_rs.
    pb = plan_operand(a.n, a.k, a.b_cs, a.b_rs);
    if (!pa.ok || !pb.ok)
      return fail(
          "an operand has no unit stride, or a zero stride (TMA reads a contiguous inner dimension and distinct rows)");
    if (std::is_same_v<T, float> && (!pa.k_major || !pb.k_major))
      return fail("tf32 wgmma reads K-major operands only (A row-major, B column-major)");
    constexpr int64_t s = sizeof(T);
    auto aligned = [&](const void* ptr, int64_t lead, int64_t bs, bool batched) {
      return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && (lead * s) % 16 == 0 && (!batched || (bs * s) % 16 == 0) &&
             lead * s < (int64_t(1) << 40) && bs * s < (int64_t(1) << 40);
    };
    if (!aligned(a.a, pa.lead, a.a_bs, a.a_bs != 0 && a.batch > 1) ||
        !aligned(a.b, pb.lead, a.b_bs, a.b_bs != 0 && a.batch > 1))
      return fail("TMA needs 16-byte aligned operands and strides");
    return true;
  }
}

// A 3-D map (inner, outer, batch) over one operand, read in boxes of (box_inner, box_outer) with 128-byte
// swizzling; the box's inner extent is always 128 bytes.
template <typename T>
cudaError_t make_map(CUtensorMap* map, const T* base, int64_t inner, int64_t outer, int64_t batch, int64_t outer_stride,
                     int64_t batch_stride, int box_outer, bool round_tf32 = true) {
  constexpr int64_t s = sizeof(T);
  const int64_t os = outer_stride > 0 ? outer_stride * s : 16;
  cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(outer), cuuint64_t(batch)};
  cuuint64_t strides[2] = {cuuint64_t(os), cuuint64_t(batch > 1 ? batch_stride * s : os)};
  cuuint32_t box[3] = {cuuint32_t(kRowBytes / s), cuuint32_t(box_outer), 1};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dtype =
      std::is_same_v<T, float> && !round_tf32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : tma_dtype<T>();
  CUresult r = encode_tiled_fn()(map, dtype, 3, const_cast<T*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The schedule of a product with the given tile counts on `sms` multiprocessors; `split`: stream-K is allowed.
// Stream-K could take the tiles of any last, partial wave; it is used only where that wave is the whole product and
// fills at most half of the GPU, with a long k (at least kMinSplitKTiles k-steps per tile). Measured on an H200
// (benchmarks/matmul_check.cu --linear, bf16, interleaved medians), against every tile whole:
//   1024 x 1024 x 8192 (32 tiles): 0.048 vs 0.089 ms;
//   2048^3 (128 tiles): 0.043 vs 0.035; 4096 x 784 x 256: 0.025 vs 0.016; 512^3: 0.020 vs 0.016;
//   8192 x 4096 x 4096 (1024 tiles, 7.76 waves): 0.374 vs 0.372; 4096^3: 0.197 vs 0.189.
// With many tiles the GPU runs at its power limit and the partial wave costs less than its share of the tiles;
// with short pieces the fixed costs (zeroing the flags, the partial sums' round trip through L2) outweigh the gain.
// Each extra piece of a tile costs its owner a read of its partial sums, and shortens the tail: at most sqrt(k_tiles)
// pieces per tile.
constexpr int64_t kMinSplitKTiles = 16;
inline Schedule plan_schedule(int64_t tiles_m, int64_t tiles_n, int64_t batch, int64_t k_tiles, int sms, bool split) {
  Schedule s;
  s.tiles_m = int(tiles_m), s.tiles_n = int(tiles_n), s.k_tiles = int(k_tiles);
  const int64_t total = tiles_m * tiles_n * batch;
  s.dp_tiles = int(total);
  if (!split || sms <= 0 || 2 * total > sms || k_tiles < kMinSplitKTiles) return s;
  const int64_t rem = total % sms;  // tiles of the partial wave (here every tile)
  const int64_t pieces = int64_t(std::sqrt(double(k_tiles)));
  const int64_t blocks = std::min<int64_t>(sms, rem * pieces);
  if (rem == 0 || blocks <= rem) return s;
  s.dp_tiles = int(total - rem);
  s.sk_tiles = int(rem);
  s.sk_blocks = int(blocks);
  return s;
}

// Workspace of a stream-K schedule: the flags (zeroed before each launch), then one 128 x 256 float tile of
// partial sums per stream-K block.
constexpr size_t kFlagBytesAlign = 256;
inline size_t flag_bytes(const Schedule& s) {
  return (size_t(s.sk_blocks) * kConsumers * sizeof(int) + kFlagBytesAlign - 1) / kFlagBytesAlign * kFlagBytesAlign;
}
inline size_t workspace_bytes(const Schedule& s) {
  return s.sk_blocks == 0 ? 0 : flag_bytes(s) + size_t(s.sk_blocks) * kBM * kBN * sizeof(float);
}

template <typename T>
Schedule schedule_for(const MatmulArgs<T>& a, bool split) {
  return plan_schedule((a.m + kBM - 1) / kBM, (a.n + kBN - 1) / kBN, a.batch, (a.k + kBK<T> - 1) / kBK<T>, sm_count(),
                       split);
}

template <typename T, bool kAKMajor, bool kBKMajor>
cudaError_t launch(const MatmulArgs<T>& a, const OperandPlan& pa, const OperandPlan& pb, cudaStream_t stream,
                   void* workspace) {
  constexpr int bk = kBK<T>;
  const bool a_batched = a.a_bs != 0 && a.batch > 1, b_batched = a.b_bs != 0 && a.batch > 1;
  const int64_t total = ((a.m + kBM - 1) / kBM) * ((a.n + kBN - 1) / kBN) * a.batch;
  if (total >= (int64_t(1) << 31)) return cudaErrorNotSupported;
  cudaError_t err;

  constexpr auto kernel = matmul_wgmma_kernel<T, kAKMajor, kBKMajor>;
  err = prepare_kernel<kernel>(kSmemBytes);
  if (err != cudaSuccess) return err;
  const Schedule sched = schedule_for(a, workspace != nullptr);

  CUtensorMap map_a, map_b;
  std::memset(&map_a, 0, sizeof(map_a));
  std::memset(&map_b, 0, sizeof(map_b));
  // A K-major: inner k, outer m, box (bk, 128). M-major: inner m, outer k, box (64, bk). B likewise (256 n-rows).
  err = kAKMajor ? make_map(&map_a, a.a, a.k, a.m, a_batched ? a.batch : 1, pa.lead, a.a_bs, kBM)
                 : make_map(&map_a, a.a, a.m, a.k, a_batched ? a.batch : 1, pa.lead, a.a_bs, bk);
  if (err != cudaSuccess) return err;
  err = kBKMajor ? make_map(&map_b, a.b, a.k, a.n, b_batched ? a.batch : 1, pb.lead, a.b_bs, kBN)
                 : make_map(&map_b, a.b, a.n, a.k, b_batched ? a.batch : 1, pb.lead, a.b_bs, bk);
  if (err != cudaSuccess) return err;

  // C (and aux, which shares C's strides) through TMA when the rows are 16-byte aligned.
  CUtensorMap map_c, map_aux;
  std::memset(&map_c, 0, sizeof(map_c));
  std::memset(&map_aux, 0, sizeof(map_aux));
  constexpr int64_t s = sizeof(T);
  const bool c_batched = a.batch > 1;
  bool tma_store = reinterpret_cast<uintptr_t>(a.c) % 16 == 0 && (a.c_rs * s) % 16 == 0 &&
                   (!c_batched || (a.c_bs * s) % 16 == 0) && (a.m <= 1 || a.c_rs > 0) &&
                   (a.aux == nullptr || reinterpret_cast<uintptr_t>(a.aux) % 16 == 0);
  if (tma_store) {
    tma_store = make_map(&map_c, static_cast<const T*>(a.c), a.n, a.m, c_batched ? a.batch : 1, a.c_rs, a.c_bs, 64,
                         /*round_tf32=*/false) == cudaSuccess;
  }
  if (tma_store && a.aux != nullptr) {
    tma_store = make_map(&map_aux, static_cast<const T*>(a.aux), a.n, a.m, c_batched ? a.batch : 1, a.c_rs, a.c_bs, 64,
                         /*round_tf32=*/false) == cudaSuccess;
  }
  const bool pair_aligned = a.c_rs % 2 == 0 && a.c_bs % 2 == 0 &&
                            reinterpret_cast<uintptr_t>(a.c) % (2 * sizeof(T)) == 0 &&
                            (a.aux == nullptr || reinterpret_cast<uintptr_t>(a.aux) % (2 * sizeof(T)) == 0);

  int* flags = nullptr;
  float* partials = nullptr;
  int grid = int(std::min<int64_t>(total, sm_count()));
  if (sched.sk_blocks > 0) {
    flags = static_cast<int*>(workspace);
    partials = reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + flag_bytes(sched));
    err = cudaMemsetAsync(flags, 0, flag_bytes(sched), stream);
    if (err != cudaSuccess) return err;
    // Every block when there is a data-parallel part (dp_tiles is a multiple of the multiprocessor count).
    grid = sched.dp_tiles > 0 ? sm_count() : sched.sk_blocks;
  }
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(map_a, map_b, map_c, map_aux, a, sched, partials, flags, a_batched,
                                                 b_batched, pair_aligned, int(tma_store));
  return cudaGetLastError();
}

}  // namespace

template <typename T>
bool matmul_wgmma_supported(const MatmulArgs<T>& args, const char** why) {
  OperandPlan pa, pb;
  return check_args(args, pa, pb, why);
}

template <typename T>
size_t matmul_wgmma_workspace_bytes(const MatmulArgs<T>& args) {
  OperandPlan pa, pb;
  if (!check_args(args, pa, pb, nullptr) || args.m == 0 || args.n == 0 || args.batch == 0) return 0;
  return workspace_bytes(schedule_for(args, true));
}

template <typename T>
cudaError_t matmul_wgmma(const MatmulArgs<T>& args, cudaStream_t stream, void* workspace) {
  OperandPlan pa, pb;
  if (!check_args(args, pa, pb, nullptr)) return cudaErrorNotSupported;
  if (args.m == 0 || args.n == 0 || args.batch == 0) return cudaSuccess;
  if constexpr (std::is_same_v<T, double>) {
    return cudaErrorNotSupported;
  } else if constexpr (std::is_same_v<T, float>) {
    return launch<T, true, true>(args, pa, pb, stream, workspace);
  } else {
    if (pa.k_major) {
      return pb.k_major ? launch<T, true, true>(args, pa, pb, stream, workspace)
                        : launch<T, true, false>(args, pa, pb, stream, workspace);
    }
    return pb.k_major ? launch<T, false, true>(args, pa, pb, stream, workspace)
                      : launch<T, false, false>(args, pa, pb, stream, workspace);
  }
}

#define TORCHEXT_INSTANTIATE_WGMMA(T)                                          \
  template bool matmul_wgmma_supported<T>(const MatmulArgs<T>&, const char**); \
  template size_t matmul_wgmma_workspace_bytes<T>(const MatmulArgs<T>&);       \
  template cudaError_t matmul_wgmma<T>(const MatmulArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_WGMMA(float)
TORCHEXT_INSTANTIATE_WGMMA(double)
TORCHEXT_INSTANTIATE_WGMMA(__half)
TORCHEXT_INSTANTIATE_WGMMA(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_WGMMA

}  // namespace torchext::cuda_ops
