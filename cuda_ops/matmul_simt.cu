// The CUDA-core matmul ladder: C = act(A B + bias) on CUDA cores, for every dtype (cuda_ops/matmul.cuh).
//
//   For each batch b:  z[i, j] = sum_p A[i, p] B[p, j] (+ bias[j]),  C[i, j] = act(z[i, j]),  aux[i, j] = z[i, j]
//   A is (m, k) and B is (k, n), each read in place through a row, a column and a batch stride (any of them may be
//   0 or anything else, so transposed operands and broadcast batches cost nothing); C and aux are (m, n) with unit
//   column stride. Elements are loaded as T, products and sums are in acc_t<T> (float; double for double), and the
//   epilogue is store_epilogue (cuda_ops/matmul_epilogue.cuh) or store_epilogue_n, the same function on a short run
//   of columns. Sums of exact products stay exact in float below 2^24, so small integer inputs give bit-exact
//   results in every version, whatever the order of summation.
//
// Napkin math: 2 m n k flops. At 4096^3 that is 137 GFLOP, 2.0 ms at the H200's 67 TFLOP/s of FP32 FMA, against
// 3 x 64 MiB of unique traffic (0.05 ms at 4.8 TB/s): compute bound once each loaded element is reused from on-chip
// memory enough times. The ladder is the story of that reuse and of keeping the FMA pipes fed:
//
//   v1 naive             one thread per C element, A and B straight from global memory: 2 loads per FMA.
//   v2 smem_tiled        32x32 tiles of A and B staged through shared memory: each loaded element serves 32 FMAs,
//                        but every FMA still needs 2 shared-memory reads.
//   v3 register_blocked  a 128x128 block tile (64x64 for double) in k steps of BK = 8, 256 threads, each keeping an
//                        8x8 patch of C (4x4 for double) in registers: per k step a thread reads 8 + 8 values from
//                        shared memory and does 64 FMAs. Thread (ty, tx) owns rows ty + 16 i and columns tx + 16 j.
//   v4 vectorized        16-byte global loads (4 floats, 8 halves, 2 doubles) along whichever dimension of each
//                        operand is contiguous; the smem tiles are k-major (A stored transposed) so the inner loop
//                        reads 16-byte vectors of A and of B; rows padded by 4 elements so the transposing stores
//                        of a k-contiguous operand hit 32 distinct banks; two smem buffers: tile k+1 travels from
//                        global memory while tile k is computed, one barrier per k tile (through registers, or by
//                        cp.async straight into shared memory for an m / n-contiguous float or double operand on
//                        sm_80+). The 16x16 thread grid spans the block: thread (ty, tx) owns the 4x4 patches at rows
//                        ty*4 + 64 i and columns tx*4 + 64 j (i, j < 2).
//   v5 warp_tiled        the block tile split into warp tiles (32x64) and each warp tile among its lanes (4x8
//                        lanes, each owning 2x2 patches of 4x4): a warp's smem reads per k step touch 64 + 128
//                        bytes (one wavefront each) instead of v4's 32 + 256. And the fragments are double-buffered
//                        in registers: row kk + 1 is read from shared memory while row kk's 64 FMAs run, and the
//                        barrier sits inside the tile's last row, so neither smem latency nor the barrier stalls a
//                        warp between rows (float32 4096^3: 73% -> 80% of cuBLAS). Then three steps to 91% (H200):
//                        both operands by cp.async alone (a k-contiguous one one element per copy, landing
//                        transposed), so no tile data and one pointer per operand sit in registers; that room buys
//                        a 32-deep k tile (66 KiB of smem), a quarter of the barriers and loop overhead per FMA of
//                        BK = 8; and the FMAs of a row in 2x2 blocks walked as a snake, the order that gave ptxas's
//                        register allocation the fewest dispatch stalls. See V5Float below for the shapes measured.
//
// v4 and v5 read an operand with 16-byte vectors when it is contiguous along k (A row-major, B column-major) or
// along m / n (A column-major, B row-major) and its base pointer, its other stride and its batch stride keep every
// vector 16-byte aligned; otherwise that operand takes the scalar loader of v3 (any strides), decided per operand
// at launch (pick_load); v5 copies a float / double operand contiguous along k one element at a time instead (by
// cp.async). Tails in m, n and k load zeros and are never stored; k == 0 stores act(bias or 0).
// v3 to v5 store C through shared memory (tiled_gemm says how), so every warp writes whole rows.
//
// Scheduling, shared by all versions: one block per output tile, numbered over batch x tile rows x tile columns
// (grid.x, then grid.y only past 2^31 - 1 tiles, so the 65535 limit on grid.y / grid.z never binds) and walked in
// bands of 8 tile rows so that blocks running together share rows of A and columns of B in L2. Where a grid of v2-v5
// would have fewer tiles than the GPU has multiprocessors and k is long, each tile is also split along k (split-K,
// see split_k below), given a workspace for the partial sums (matmul_workspace_bytes in matmul.cuh).
#include <climits>
#include <type_traits>

#include "common.cuh"
#include "matmul.cuh"
#include "matmul_epilogue.cuh"
#include "simt_tile.cuh"

namespace torchext::cuda_ops {
namespace {

// ------------------------------------------------------------------------------------------------------------------
// Tile scheduling

constexpr int64_t kBandRows = 8;  // tile rows walked together (L2 reuse of B's columns)

struct TileGrid {
  int64_t tiles_m = 0, tiles_n = 0, total = 0;  // total = batch * splits * tiles_m * tiles_n
  bool c_vec = false;                           // v4/v5: C and aux take VW-wide vector stores
  // Split-K (see split_k below): split s of a tile sums k in [s * k_chunk, min(k, (s + 1) * k_chunk)) and writes its
  // sums, in the accumulation type, to partial[((b * splits + s) * m + i) * n + j]; a second kernel adds the splits
  // up and applies the epilogue. splits == 1: no split, the tile stores C itself.
  int64_t splits = 1, k_chunk = 0;
  void* partial = nullptr;
};

TileGrid make_grid(int64_t batch, int64_t m, int64_t n, int64_t bm, int64_t bn) {
  TileGrid g;
  g.tiles_m = (m + bm - 1) / bm;
  g.tiles_n = (n + bn - 1) / bn;
  g.total = batch * g.tiles_m * g.tiles_n;
  return g;
}

struct SplitK {
  int64_t splits = 1, k_chunk = 0;
};

// g with each tile cut into sk.splits k chunks, the partial sums going to `partial`.
TileGrid with_split(TileGrid g, const SplitK& sk, void* partial) {
  if (sk.splits > 1) {
    g.splits = sk.splits;
    g.k_chunk = sk.k_chunk;
    g.partial = partial;
    g.total *= sk.splits;
  }
  return g;
}

// One block per tile, numbered blockIdx.y * gridDim.x + blockIdx.x: grid.x up to 2^31 - 1, grid.y (<= 65535) only
// for more tiles than that. False when even that is too few (2^46 tiles: more memory than any GPU has).
bool tile_launch_grid(const TileGrid& g, dim3& grid) {
  if (g.total <= 0) {  // nothing to launch
    grid = dim3(1);
    return true;
  }
  const int64_t x = g.total < INT_MAX ? g.total : INT_MAX;
  const int64_t y = (g.total + x - 1) / x;
  if (y > 65535) return false;
  grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
  return true;
}

// This block's tile: batch b, k split s, tile row mt, tile column nt; false past the last tile. Within a batch and
// split, bands of kBandRows tile rows are walked column by column.
__device__ __forceinline__ bool tile_coords(const TileGrid& g, int64_t& b, int64_t& s, int64_t& mt, int64_t& nt) {
  const int64_t t = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  if (t >= g.total) return false;
  const int64_t per_batch = g.tiles_m * g.tiles_n;
  const int64_t bs = t / per_batch;  // batch * splits + split
  b = bs / g.splits;
  s = bs - b * g.splits;
  const int64_t r = t - bs * per_batch;
  const int64_t first = r / (kBandRows * g.tiles_n) * kBandRows;
  const int64_t rows = g.tiles_m - first < kBandRows ? g.tiles_m - first : kBandRows;
  const int64_t in_band = r - first * g.tiles_n;
  mt = first + in_band % rows;
  nt = in_band / rows;
  return true;
}

// The k range [k0, k1) that split s sums.
__device__ __forceinline__ void split_range(const TileGrid& g, int64_t k, int64_t s, int64_t& k0, int64_t& k1) {
  if (g.splits == 1) {
    k0 = 0, k1 = k;
    return;
  }
  k0 = s * g.k_chunk;
  k1 = k0 + g.k_chunk < k ? k0 + g.k_chunk : k;
}

// Where split s of batch b writes its sum for element (i, j).
template <typename A>
__device__ __forceinline__ A* partial_at(const TileGrid& g, int64_t m, int64_t n, int64_t b, int64_t s, int64_t i,
                                         int64_t j) {
  return static_cast<A*>(g.partial) + ((b * g.splits + s) * m + i) * n + j;
}

// ------------------------------------------------------------------------------------------------------------------
// v1: one thread per element of C

constexpr int kNaiveRows = 8, kNaiveCols = 32;  // block (32, 8): threadIdx.x walks n, so B and C are coalesced

template <typename T>
__global__ void __launch_bounds__(kNaiveRows* kNaiveCols)
    matmul_v1_naive_kernel(const __grid_constant__ MatmulArgs<T> p, const __grid_constant__ TileGrid g) {
  using A = acc_t<T>;
  int64_t b, s, mt, nt;  // v1 is never split (s == 0)
  if (!tile_coords(g, b, s, mt, nt)) return;
  const int64_t i = mt * kNaiveRows + threadIdx.y, j = nt * kNaiveCols + threadIdx.x;
  if (i >= p.m || j >= p.n) return;
  const T* a = p.a + b * p.a_bs + i * p.a_rs;
  const T* bp = p.b + b * p.b_bs + j * p.b_cs;
  A acc = A(0);
  for (int64_t q = 0; q < p.k; ++q, a += p.a_cs, bp += p.b_rs) acc = mac(to_acc(*a), to_acc(*bp), acc);
  store_epilogue(p, b, i, j, acc);
}

// ------------------------------------------------------------------------------------------------------------------
// v2: 32x32 tiles through shared memory, one thread per element of C

constexpr int kTile2 = 32;

template <typename T>
__global__ void __launch_bounds__(kTile2* kTile2)
    matmul_v2_smem_tiled_kernel(const __grid_constant__ MatmulArgs<T> p, const __grid_constant__ TileGrid g) {
  using A = acc_t<T>;
  // Thread (ty, tx) stores As[ty][tx] = A[m0 + ty, k0 + tx] and Bs[ty][tx] = B[k0 + ty, n0 + tx], then reads
  // As[ty][*] (one address per warp: a broadcast) and Bs[*][tx] (consecutive words): no bank conflicts.
  __shared__ A As[kTile2][kTile2];
  __shared__ A Bs[kTile2][kTile2];
  int64_t b, s, mt, nt, kb, ke;
  if (!tile_coords(g, b, s, mt, nt)) return;
  split_range(g, p.k, s, kb, ke);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = mt * kTile2 + ty, j = nt * kTile2 + tx;
  const T* a = p.a + b * p.a_bs + i * p.a_rs;   // row i of A, read only when i < m
  const T* bc = p.b + b * p.b_bs + j * p.b_cs;  // column j of B, read only when j < n
  A acc = A(0);
  for (int64_t k0 = kb; k0 < ke; k0 += kTile2) {
    As[ty][tx] = (i < p.m && k0 + tx < ke) ? to_acc(a[(k0 + tx) * p.a_cs]) : A(0);
    Bs[ty][tx] = (k0 + ty < ke && j < p.n) ? to_acc(bc[(k0 + ty) * p.b_rs]) : A(0);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile2; ++kk) acc = mac(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();
  }
  if (i < p.m && j < p.n) {
    if (g.splits > 1) {
      *partial_at<A>(g, p.m, p.n, b, s, i, j) = acc;
    } else {
      store_epilogue(p, b, i, j, acc);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------------
// v3 / v4 / v5: block tiles in shared memory, thread tiles in registers
//
// Shared-memory tiles are k-major: As[kk * LDA + mm] holds A[m0 + mm, k0 + kk], Bs[kk * LDB + nn] holds
// B[k0 + kk, n0 + nn], both in the accumulation type (half / bfloat16 are widened once, on the way in).

// How one operand travels from global memory to a shared-memory tile.
enum class Load : int {
  vec_k,      // 16-byte vectors along k (A row-major, B column-major), stored transposed
  vec_mn,     // 16-byte vectors along m / n (A column-major, B row-major), stored as they come
  scalar_k,   // one element at a time through both strides, consecutive threads walking k
  scalar_mn,  // the same, consecutive threads walking m / n (coalesced when that stride is the small one)
};

// A tile loader moves one ROWS x BK tile of an operand (ROWS along m for A, along n for B) into a k-major smem tile
// s[kk * LD + r]: init() points it at the tile's first row; load(k_left, s) fetches the tile at the current k and
// steps one tile along k; store(s) then writes what load staged in registers. The copy into s is complete once
// wait() has returned (and visible to the block after the next barrier). Rows at or past `rows` and k past `k_left`
// load as 0; load<true> is for tiles known to be full along k (every one but the last, unless BK divides k).
// NT threads share the work; s_mn is the stride between rows (a_rs, or b_cs), s_k the stride along k.
template <Load MODE, typename T, int ROWS, int BK, int NT, int LD>
struct TileLoader;

// The vector loaders stage 16-byte vectors as raw uint4 words: kept as Vec<__half, 8>, the compiler would give
// each half a register of its own.
template <typename T>
__device__ __forceinline__ uint4 load_raw(const T* src) {
  return *reinterpret_cast<const uint4*>(src);
}
template <typename T, int N>
__device__ __forceinline__ uint4 to_raw(const Vec<T, N>& v) {
  static_assert(sizeof(v) == 16, "16-byte vectors");
  uint4 w;
  memcpy(&w, &v, 16);
  return w;
}
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> from_raw(const uint4& w) {
  Vec<T, N> v;
  memcpy(&v, &w, 16);
  return v;
}

// Whether AsyncTransposeLoader can move this operand tile (v5 takes it where it can; v4 keeps TileLoader<vec_k>).
template <typename T, int ROWS, int BK, int NT>
constexpr bool kAsyncTranspose =
    TORCHEXT_SIMT_CP_ASYNC && sizeof(T) == sizeof(acc_t<T>) && NT % kTransposeRun<T, BK> == 0 &&
    ROWS % (NT / kTransposeRun<T, BK>) == 0 && BK % kTransposeRun<T, BK> == 0;

// 16-byte vectors along k through registers: one global load per vector, then VEC transposing smem stores.
template <typename T, int ROWS, int BK, int NT, int LD>
struct TileLoader<Load::vec_k, T, ROWS, BK, NT, LD> {
  using A = acc_t<T>;
  static constexpr int VEC = kVec16<T>;
  static constexpr int KV = BK / VEC;          // vectors per row of the tile
  static constexpr int KVP = KV < 2 ? KV : 2;  // of those, taken by neighbouring threads (32 bytes: a sector)
  static constexpr int TOTAL = ROWS * KV;
  static constexpr int ITERS = (TOTAL + NT - 1) / NT;
  static_assert(BK % VEC == 0, "BK must hold whole 16-byte vectors");
  using V = Vec<T, VEC>;

  uint4 reg[ITERS];
  const T* src[ITERS];
  bool row_ok[ITERS];

  // Vector `it` of this thread: row r, k offset kv * VEC. A warp takes KVP vectors of each of 32 / KVP consecutive
  // rows: full sectors from global memory, and the transposing stores land on 32 distinct banks (LD = ROWS + 4).
  __device__ __forceinline__ static void slot(int it, int& r, int& kv) {
    const int idx = static_cast<int>(threadIdx.x) + it * NT;
    const int rest = idx / KVP;
    r = rest % ROWS;
    kv = rest / ROWS * KVP + idx % KVP;
  }
  __device__ __forceinline__ static bool live(int it) {
    return TOTAL % NT == 0 || static_cast<int>(threadIdx.x) + it * NT < TOTAL;
  }

  __device__ __forceinline__ void init(const T* base, int64_t s_mn, int64_t /*s_k == 1*/, int rows) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      int r, kv;
      slot(it, r, kv);
      src[it] = base + r * s_mn + kv * VEC;
      row_ok[it] = live(it) && r < rows;
    }
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, A* /*s*/) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      int r, kv;
      slot(it, r, kv);
      const int kp = kv * VEC;
      if (FULL || kp + VEC <= k_left) {
        reg[it] = row_ok[it] ? load_raw(src[it]) : make_uint4(0, 0, 0, 0);
      } else {
        V v;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v.v[e] = (row_ok[it] && kp + e < k_left) ? src[it][e] : from_acc<T>(A(0));
        reg[it] = to_raw(v);
      }
      src[it] += BK;
    }
  }
  __device__ __forceinline__ void store(A* s) const {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      if (!live(it)) continue;
      int r, kv;
      slot(it, r, kv);
      const V v = from_raw<T, VEC>(reg[it]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s[(kv * VEC + e) * LD + r] = to_acc(v.v[e]);
    }
  }
  __device__ __forceinline__ void wait() const {}
};

// Whether AsyncRowLoader can move this operand tile (v5 takes it where it can).
template <typename T, int ROWS, int BK, int NT>
constexpr bool kAsyncRows = TORCHEXT_SIMT_CP_ASYNC && sizeof(T) == sizeof(acc_t<T>) && ROWS % kVec16<T> == 0 &&
                            NT % (ROWS / kVec16<T>) == 0 && (BK * (ROWS / kVec16<T>)) % NT == 0;

// 16-byte vectors along m / n, one pointer per vector: through registers, or by cp.async for float and double.
template <typename T, int ROWS, int BK, int NT, int LD>
struct TileLoader<Load::vec_mn, T, ROWS, BK, NT, LD> {
  using A = acc_t<T>;
  static constexpr int VEC = kVec16<T>;
  static constexpr int RV = ROWS / VEC;  // vectors per k row of the tile
  static constexpr int TOTAL = BK * RV;
  static constexpr int ITERS = (TOTAL + NT - 1) / NT;
  static constexpr int W = 16 / static_cast<int>(sizeof(A));  // accumulator elements per 16-byte smem store
  // Float and double land in smem as they are: cp.async copies them without registers or store instructions.
  // Half and bfloat16 are widened on the way, through registers.
  static constexpr bool ASYNC = TORCHEXT_SIMT_CP_ASYNC && sizeof(T) == sizeof(A);
  static_assert(ROWS % VEC == 0 && VEC % W == 0, "tile rows must hold whole 16-byte vectors");
  static_assert(LD % W == 0, "smem rows must stay 16-byte aligned");
  using V = Vec<T, VEC>;

  uint4 reg[ASYNC ? 1 : ITERS];
  const T* src[ITERS];
  int64_t step;  // BK * s_k
  int rows;

  // Vector `it` of this thread: k row kk, rows rv * VEC ..; consecutive threads take consecutive vectors of a row.
  __device__ __forceinline__ static void slot(int it, int& kk, int& rv) {
    const int idx = static_cast<int>(threadIdx.x) + it * NT;
    rv = idx % RV;
    kk = idx / RV;
  }
  __device__ __forceinline__ static bool live(int it) {
    return TOTAL % NT == 0 || static_cast<int>(threadIdx.x) + it * NT < TOTAL;
  }

  __device__ __forceinline__ void init(const T* base, int64_t /*s_mn == 1*/, int64_t s_k, int rows_) {
    rows = rows_;
    step = BK * s_k;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      int kk, rv;
      slot(it, kk, rv);
      src[it] = base + rv * VEC + kk * s_k;
    }
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, A* s) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      int kk, rv;
      slot(it, kk, rv);
      const bool k_ok = live(it) && (FULL || kk < k_left);
      const int r0 = rv * VEC;
      if constexpr (ASYNC) {
        if (live(it)) {
          const int n = rows - r0 < VEC ? (rows - r0 > 0 ? rows - r0 : 0) : VEC;  // elements in range
          cp_async16(s + kk * LD + r0, src[it], k_ok ? n * static_cast<int>(sizeof(T)) : 0);
        }
      } else if (r0 + VEC <= rows) {
        reg[it] = k_ok ? load_raw(src[it]) : make_uint4(0, 0, 0, 0);
      } else {
        V v;
#pragma unroll
        for (int e = 0; e < VEC; ++e) v.v[e] = (k_ok && r0 + e < rows) ? src[it][e] : from_acc<T>(A(0));
        reg[it] = to_raw(v);
      }
      src[it] += step;
    }
  }
  __device__ __forceinline__ void store(A* s) const {
    if constexpr (!ASYNC) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        if (!live(it)) continue;
        int kk, rv;
        slot(it, kk, rv);
        A* d = s + kk * LD + rv * VEC;
        const V v = from_raw<T, VEC>(reg[it]);
#pragma unroll
        for (int c = 0; c < VEC / W; ++c) {
          Vec<A, W> w;
#pragma unroll
          for (int e = 0; e < W; ++e) w.v[e] = to_acc(v.v[c * W + e]);
          *reinterpret_cast<Vec<A, W>*>(d + c * W) = w;
        }
      }
    }
  }
  __device__ __forceinline__ void wait() const {
    if constexpr (ASYNC) cp_async_wait_all();
  }
};

// The scalar loaders. With KFAST, thread t takes rows t / BK + it * NT / BK at k offset t % BK: consecutive threads
// walk k. Otherwise it takes row t % ROWS at k offsets t / ROWS + it * NT / ROWS: consecutive threads walk rows.
template <bool KFAST, typename T, int ROWS, int BK, int NT, int LD>
struct ScalarTileLoader {
  using A = acc_t<T>;
  static_assert(NT % ROWS == 0 && NT % BK == 0 && ROWS * BK % NT == 0, "threads must tile the operand tile evenly");
  static constexpr int ITERS = ROWS * BK / NT;
  static constexpr int DR = KFAST ? NT / BK : 0, DK = KFAST ? 0 : NT / ROWS;  // from one element to the next

  T reg[ITERS];
  const T* src;     // the thread's first element in the current k tile
  int64_t it_step;  // from one of its elements to the next
  int64_t k_step;   // from one k tile to the next: BK * s_k
  unsigned row_ok;  // bit it: element it lies in a row < rows

  __device__ __forceinline__ static int r0() { return KFAST ? threadIdx.x / BK : threadIdx.x % ROWS; }
  __device__ __forceinline__ static int kk0() { return KFAST ? threadIdx.x % BK : threadIdx.x / ROWS; }

  __device__ __forceinline__ void init(const T* base, int64_t s_mn, int64_t s_k, int rows) {
    src = base + r0() * s_mn + kk0() * s_k;
    it_step = DR * s_mn + DK * s_k;
    k_step = BK * s_k;
    row_ok = 0;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) row_ok |= (r0() + it * DR < rows ? 1u : 0u) << it;
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, A* /*s*/) {
    const T* q = src;
#pragma unroll
    for (int it = 0; it < ITERS; ++it, q += it_step) {
      const bool ok = (row_ok >> it & 1u) && (FULL || kk0() + it * DK < k_left);
      reg[it] = ok ? *q : from_acc<T>(A(0));
    }
    src += k_step;
  }
  __device__ __forceinline__ void store(A* s) const {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) s[(kk0() + it * DK) * LD + r0() + it * DR] = to_acc(reg[it]);
  }
  __device__ __forceinline__ void wait() const {}
};
template <typename T, int ROWS, int BK, int NT, int LD>
struct TileLoader<Load::scalar_k, T, ROWS, BK, NT, LD> : ScalarTileLoader<true, T, ROWS, BK, NT, LD> {};
template <typename T, int ROWS, int BK, int NT, int LD>
struct TileLoader<Load::scalar_mn, T, ROWS, BK, NT, LD> : ScalarTileLoader<false, T, ROWS, BK, NT, LD> {};

// Per-dtype shapes. Float-accumulating types (float, half, bfloat16) share one set; double has half the block
// edge (its patches are 4x4: 8x8 doubles would need 128 registers for the accumulators alone).
//                                 BM   BN   BK  GM   GN   TGM TGN VW PAD ST MINB
using V3Float = TileConfig<128, 128, 8, 128, 128, 16, 16, 1, 4, 1, 2>;
using V3Double = TileConfig<64, 64, 8, 64, 64, 16, 16, 1, 2, 1, 2>;
using V4Float = TileConfig<128, 128, 8, 128, 128, 16, 16, 4, 4, 2, 2>;
using V4Double = TileConfig<64, 64, 8, 64, 64, 16, 16, 2, 4, 2, 2>;
// v5 for float-accumulating types. TORCHEXT_MATMUL_V5_CONFIG picks the shape at build time; float32 4096^3 against
// cuBLAS SGEMM on an H200, benchmarks/simt_check.cu, this source (NOTES_matmul.md has the earlier steps):
//   0 (default)  128x128x32, 8 warps as 4x2 of 32x64, lanes 4x8, thread 8x8 (2x2 patches of 4x4), 2 blocks / SM,
//                66 KiB of shared memory per block: 91-92% (NOTES_matmul.md: 2.45 G instructions, cuBLAS 2.43 G)
//   1            128x128x16, the same warps: 86.5%
//   2            128x128x8,  the same warps (the default until BK = 32 fitted): 82%
//   3            256x128x8,  8 warps as 4x2 of 64x64, thread 16x8, 1 block / SM (the shape of cuBLAS's own kernel
//                here, sm80_xmma_gemm_f32f32_..._tilesize256x128x8_stage3_warpsize4x2x1_ffma): 81-82%
//   4            256x128x16, the same warps, 1 block / SM: 72%
// A deeper k tile halves the barriers and the loop's overhead per FMA: at BK = 32 the kernel issues as many
// instructions as cuBLAS's (2.44 G against 2.43 G). It fits the 128 registers of 2 blocks / SM because the async
// loaders hold no data and one pointer each. Configs 0-2 are capped at 128 registers; with CUDA 13.0 on sm_90a,
// float spills at most 8 bytes, outside the k loop.
#ifndef TORCHEXT_MATMUL_V5_CONFIG
#define TORCHEXT_MATMUL_V5_CONFIG 0
#endif
#if TORCHEXT_MATMUL_V5_CONFIG == 1
using V5Float = TileConfig<128, 128, 16, 32, 64, 4, 8, 4, 4, 2, 2, true>;
#elif TORCHEXT_MATMUL_V5_CONFIG == 2
using V5Float = TileConfig<128, 128, 8, 32, 64, 4, 8, 4, 4, 2, 2, true>;
#elif TORCHEXT_MATMUL_V5_CONFIG == 3
using V5Float = TileConfig<256, 128, 8, 64, 64, 4, 8, 4, 4, 2, 1, true>;
#elif TORCHEXT_MATMUL_V5_CONFIG == 4
using V5Float = TileConfig<256, 128, 16, 64, 64, 4, 8, 4, 4, 2, 1, true>;
#else
using V5Float = TileConfig<128, 128, 32, 32, 64, 4, 8, 4, 4, 2, 2, true>;
#endif
// v5 takes V5Float's deep k tile where both operands travel by cp.async (float, contiguous along m, n or k with
// aligned vectors: the usual case). With a loader that stages data in registers (scalar loaders, or half / bfloat16
// widened on the way) a 32-deep tile spills hundreds of bytes; those pairs take V5FloatStaged, the same warps at
// BK = 8.
using V5FloatStaged = TileConfig<V5Float::BM, V5Float::BN, 8, V5Float::GM, V5Float::GN, V5Float::TGM, V5Float::TGN,
                                 V5Float::VW, 4, 2, V5Float::MIN_BLOCKS, true>;
// v5 for double: 8 warps as 2x4 of 32x16, lanes 8x4, thread 4x4 (2x2 patches of 2x2).
using V5Double = TileConfig<64, 64, 8, 32, 16, 8, 4, 2, 4, 2, 2, true>;
static_assert(V5Float::TGM * V5Float::TGN == 32 && V5Double::TGM * V5Double::TGN == 32, "v5 groups are warps");

template <typename T>
using V3Config = std::conditional_t<std::is_same_v<acc_t<T>, double>, V3Double, V3Float>;
template <typename T>
using V4Config = std::conditional_t<std::is_same_v<acc_t<T>, double>, V4Double, V4Float>;
template <typename T>
using V5Config = std::conditional_t<std::is_same_v<acc_t<T>, double>, V5Double, V5Float>;

// The outer product of one kk row: TM x TN FMAs, row by row.
template <class C, typename A>
__device__ __forceinline__ void outer_product(const A (&a)[C::TM], const A (&b)[C::TN], A (&acc)[C::TM][C::TN]) {
#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
#pragma unroll
    for (int j = 0; j < C::TN; ++j) acc[i][j] = mac(a[i], b[j], acc[i][j]);
  }
}

// One BK step of the block tile for this thread: per kk, the fragments then their outer product.
template <class C, typename A>
__device__ __forceinline__ void compute_tile(const A* __restrict__ As, const A* __restrict__ Bs, A (&acc)[C::TM][C::TN],
                                             int a_off, int b_off) {
#pragma unroll
  for (int kk = 0; kk < C::BK; ++kk) {
    A a[C::TM], b[C::TN];
    load_fragments<C>(As, Bs, kk, a_off, b_off, a, b);
    outer_product<C>(a, b, acc);
  }
}

// Stores an N-element vector to global memory as one access of its size. Plain C++ stores get split into scalar
// ones here: the optimizer merges them with the element-by-element tail path next to them.
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* dst, const Vec<T, N>& v) {
  constexpr int BYTES = sizeof(Vec<T, N>);
  static_assert(BYTES == 16 || BYTES == 8 || N == 1, "vectors of 1 element, 8 or 16 bytes");
#if defined(__CUDA_ARCH__)
  if constexpr (BYTES == 16) {
    uint4 w;
    memcpy(&w, &v, 16);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w)
                 : "memory");
    return;
  } else if constexpr (BYTES == 8) {
    uint2 w;
    memcpy(&w, &v, 8);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(w.x), "r"(w.y) : "memory");
    return;
  }
#endif
  memcpy(dst, &v, BYTES);  // one element, or host-side emulation
}

// store_epilogue for N consecutive columns j .. j + N - 1 of row i (those < n): the same function, z = acc + bias,
// aux = z, C = act(z), computed element by element; stored as one N-wide vector when `vec` (C, aux, c_rs and c_bs
// aligned to N elements) and all N columns are in range, else element by element.
template <typename T, typename A, int N>
__device__ __forceinline__ void store_epilogue_n(const MatmulArgs<T>& p, int64_t b, int64_t i, int64_t j,
                                                 const Vec<A, N>& acc, bool vec) {
  Vec<T, N> z, y;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    A ze = acc.v[e];
    if (p.bias != nullptr && j + e < p.n) ze += static_cast<A>(p.bias[j + e]);
    z.v[e] = static_cast<T>(ze);
    y.v[e] = static_cast<T>(apply_activation(ze, p.act));
  }
  const int64_t off = b * p.c_bs + i * p.c_rs + j;
  if (N > 1 && vec && j + N <= p.n) {
    if (p.aux != nullptr) store_vec(p.aux + off, z);
    store_vec(p.c + off, y);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if (j + e >= p.n) break;
      if (p.aux != nullptr) p.aux[off + e] = z.v[e];
      p.c[off + e] = y.v[e];
    }
  }
}

// Whether loader mode L moves a ROWS-row operand tile of config C by cp.async alone (one of the two loaders below).
template <class C, Load L, typename T, int ROWS>
constexpr bool kAsyncOnly = C::ASYNC_K && ((L == Load::vec_k && kAsyncTranspose<T, ROWS, C::BK, C::THREADS>) ||
                                           (L == Load::vec_mn && kAsyncRows<T, ROWS, C::BK, C::THREADS>));

// The loader of an operand in mode L. Where the config asks for them (v5), the cp.async loaders that hold one
// pointer and no data: AsyncTransposeLoader for a k-contiguous float / double operand, AsyncRowLoader for an m / n
// contiguous one. Else TileLoader (v4: the same code as before v5 had them, whose register allocation ran v4 4%
// faster than with AsyncRowLoader).
template <class C, Load L, typename T, int ROWS, int LD>
using LoaderFor =
    std::conditional_t<!kAsyncOnly<C, L, T, ROWS>, TileLoader<L, T, ROWS, C::BK, C::THREADS, LD>,
                       std::conditional_t<L == Load::vec_k, AsyncTransposeLoader<T, ROWS, C::BK, C::THREADS, LD>,
                                          AsyncRowLoader<T, ROWS, C::BK, C::THREADS, LD>>>;

// Shared memory of tiled_gemm, in elements of A: the operand tiles, and later the epilogue's stage (R rows of LDS).
template <class C, typename A>
struct TileSmem {
  static constexpr int A_TILE = C::BK * C::LDA, B_TILE = C::BK * C::LDB;
  static constexpr int R = C::BM / C::GM * C::TGM;                      // one stage row per thread row of the block
  static constexpr int LDS = C::BN + 64 / static_cast<int>(sizeof(A));  // rows a half bank-sweep apart: no conflicts
  static constexpr int MAIN = C::STAGES * (A_TILE + B_TILE), ELEMS = MAIN > (R * LDS) ? MAIN : R * LDS;
  static constexpr int BYTES = ELEMS * static_cast<int>(sizeof(A));
  // Past the 48 KiB of a static allocation, dynamic shared memory (prepare_kernel raises the limit).
  static constexpr bool DYNAMIC = BYTES > 48 * 1024;
};

// The body of v3, v4 and v5. The k loop streams BK-deep slices of A and B through shared memory (double-buffered
// when STAGES == 2) into the thread's TM x TN accumulators. The epilogue then goes through shared memory in TM
// rounds: in round (i, ii) every thread writes row ii of its patches i (TN values) into an R x BN stage, and the
// block stores the stage row by row, consecutive threads on consecutive VW-wide vectors, so each warp writes one
// contiguous run of a row of C (512 bytes for float); the activation code sits in one loop instead of being
// unrolled over all TM x TN accumulators.
template <typename T, class C, Load LA, Load LB, bool PIPELINE>
__device__ __forceinline__ void tiled_gemm(const MatmulArgs<T>& p, const TileGrid& g) {
  using A = acc_t<T>;
  using S = TileSmem<C, A>;
  constexpr int A_TILE = S::A_TILE, B_TILE = S::B_TILE, R = S::R, LDS = S::LDS;
  A* smem;
  if constexpr (S::DYNAMIC) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    smem = reinterpret_cast<A*>(smem_bytes);
  } else {
    __shared__ __align__(16) A smem_static[S::ELEMS];
    smem = smem_static;
  }

  int64_t b, s, mt, nt, kb, ke;
  if (!tile_coords(g, b, s, mt, nt)) return;
  split_range(g, p.k, s, kb, ke);
  // The k loop covers [kb, ke): A and B from this split's first k on (k_chunk is a multiple of 32, so the vector
  // loaders' alignment holds), klen of k.
  const int64_t klen = ke - kb;
  const int64_t m0 = mt * C::BM, n0 = nt * C::BN;
  const int tid = threadIdx.x;
  const int group = tid / (C::TGM * C::TGN), lane = tid % (C::TGM * C::TGN);
  const int a_off = group / C::GROUPS_N * C::GM + lane / C::TGN * C::VW;  // first row of this thread's patches
  const int b_off = group % C::GROUPS_N * C::GN + lane % C::TGN * C::VW;  // first column
  const int64_t ktiles = (klen + C::BK - 1) / C::BK;
  auto As = [&](int stage) { return smem + stage * A_TILE; };
  auto Bs = [&](int stage) { return smem + C::STAGES * A_TILE + stage * B_TILE; };

  LoaderFor<C, LA, T, C::BM, C::LDA> la;
  LoaderFor<C, LB, T, C::BN, C::LDB> lb;
  la.init(p.a + b * p.a_bs + m0 * p.a_rs + kb * p.a_cs, p.a_rs, p.a_cs,
          static_cast<int>(p.m - m0 < C::BM ? p.m - m0 : C::BM));
  lb.init(p.b + b * p.b_bs + n0 * p.b_cs + kb * p.b_rs, p.b_cs, p.b_rs,
          static_cast<int>(p.n - n0 < C::BN ? p.n - n0 : C::BN));

  A acc[C::TM][C::TN];
#pragma unroll
  for (int i = 0; i < C::TM; ++i) {
#pragma unroll
    for (int j = 0; j < C::TN; ++j) acc[i][j] = A(0);
  }

  // Tiles before the last are full along k, and so is the last when BK divides k.
  const int last_left = static_cast<int>(klen - (ktiles - 1) * C::BK);
  auto load = [&](int64_t kt, int stage) {
    if (kt + 1 < ktiles || last_left == C::BK) {
      la.template load<true>(C::BK, As(stage));
      lb.template load<true>(C::BK, Bs(stage));
    } else {
      la.template load<false>(last_left, As(stage));
      lb.template load<false>(last_left, Bs(stage));
    }
  };
  auto store = [&](int stage) {
    la.store(As(stage));
    lb.store(Bs(stage));
  };
  auto wait = [&] {
    la.wait();
    lb.wait();
  };

  if constexpr (C::STAGES == 2 && PIPELINE) {
    // v5: simt_k_loop (cuda_ops/simt_tile.cuh) on the same buffers, with the fragments double-buffered in registers
    // and the barrier inside the tile's last row.
    simt_k_loop<C>(la, lb, smem, ktiles, last_left, a_off, b_off, acc);
  } else if constexpr (C::STAGES == 2) {
    // Tile kt + 1 is fetched before tile kt is computed (into registers, or by cp.async straight into the other
    // buffer) and stored into the other buffer after: that buffer was last read in step kt - 1, which ended with the
    // barrier.
    if (ktiles > 0) {
      load(0, 0);
      store(0);
    }
    wait();
    __syncthreads();
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int cur = static_cast<int>(kt & 1);
      const bool more = kt + 1 < ktiles;
      if (more) load(kt + 1, cur ^ 1);
      compute_tile<C>(As(cur), Bs(cur), acc, a_off, b_off);
      if (more) store(cur ^ 1);
      wait();
      __syncthreads();
    }
  } else {
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      load(kt, 0);
      store(0);
      wait();
      __syncthreads();
      compute_tile<C>(As(0), Bs(0), acc, a_off, b_off);
      __syncthreads();
    }
  }

  // Epilogue (the k loop ended with a barrier, so the stage may overwrite the operand tiles). Stage row sr holds
  // tile row sr / TGM * GM + i * TGM * VW + sr % TGM * VW + ii in round (i, ii).
  using V = Vec<A, C::VW>;
  constexpr int CV = C::BN / C::VW;  // vectors per stage row
  A* const stage = smem;
  const int s_row = group / C::GROUPS_N * C::TGM + lane / C::TGN;
#pragma unroll
  for (int i = 0; i < C::ITM; ++i) {
#pragma unroll
    for (int ii = 0; ii < C::VW; ++ii) {
      if (i + ii > 0) __syncthreads();  // the previous round's stage has been stored
#pragma unroll
      for (int j = 0; j < C::ITN; ++j) {
        V v;
#pragma unroll
        for (int e = 0; e < C::VW; ++e) v.v[e] = acc[i * C::VW + ii][j * C::VW + e];
        *reinterpret_cast<V*>(stage + s_row * LDS + b_off + j * C::TGN * C::VW) = v;
      }
      __syncthreads();
#pragma unroll 1
      for (int idx = tid; idx < R * CV; idx += C::THREADS) {
        const int sr = idx / CV, cv = idx % CV;
        const int64_t row = m0 + sr / C::TGM * C::GM + i * C::TGM * C::VW + sr % C::TGM * C::VW + ii;
        const int64_t col = n0 + cv * C::VW;
        if (row < p.m && col < p.n) {
          const V v = *reinterpret_cast<const V*>(stage + sr * LDS + cv * C::VW);
          if (g.splits > 1) {
            A* dst = partial_at<A>(g, p.m, p.n, b, s, row, col);
#pragma unroll
            for (int e = 0; e < C::VW; ++e) {
              if (col + e < p.n) dst[e] = v.v[e];
            }
          } else {
            store_epilogue_n<T, A, C::VW>(p, b, row, col, v, g.c_vec);
          }
        }
      }
    }
  }
}

template <typename T, class C, Load LA, Load LB>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    matmul_v3_register_blocked_kernel(const __grid_constant__ MatmulArgs<T> p, const __grid_constant__ TileGrid g) {
  tiled_gemm<T, C, LA, LB, false>(p, g);
}

template <typename T, class C, Load LA, Load LB>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    matmul_v4_vectorized_kernel(const __grid_constant__ MatmulArgs<T> p, const __grid_constant__ TileGrid g) {
  tiled_gemm<T, C, LA, LB, false>(p, g);
}

template <typename T, class C, Load LA, Load LB>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    matmul_v5_warp_tiled_kernel(const __grid_constant__ MatmulArgs<T> p, const __grid_constant__ TileGrid g) {
  tiled_gemm<T, C, LA, LB, true>(p, g);
}

// ------------------------------------------------------------------------------------------------------------------
// Launch

// The loader for one operand: base pointer, stride between rows (m for A, n for B), stride along k, batch stride,
// the extents. 16-byte vectors need a unit stride along one dimension and every vector start aligned: the base,
// the other stride (unless that dimension is a single row) and the batch stride (unless there is one batch).
// Otherwise one element at a time, consecutive threads walking the dimension with the smaller stride.
template <typename T>
Load pick_load(const T* base, int64_t s_mn, int64_t s_k, int64_t s_b, int64_t mn, int64_t k, int64_t batch) {
  constexpr int64_t V = kVec16<T>;
  const bool base_ok = aligned_to(base, 16) && (batch <= 1 || s_b % V == 0);
  const bool k_ok = base_ok && s_k == 1 && (mn <= 1 || s_mn % V == 0);
  const bool mn_ok = base_ok && s_mn == 1 && (k <= 1 || s_k % V == 0);
  if (k_ok && (!mn_ok || k >= mn)) return Load::vec_k;
  if (mn_ok) return Load::vec_mn;
  return (s_k < 0 ? -s_k : s_k) <= (s_mn < 0 ? -s_mn : s_mn) ? Load::scalar_k : Load::scalar_mn;
}

// v3 loads one element at a time, walking the same dimension the vector loaders would.
Load scalar_only(Load l) { return l == Load::vec_k ? Load::scalar_k : l == Load::vec_mn ? Load::scalar_mn : l; }

template <typename T>
bool c_vec_ok(const MatmulArgs<T>& p, int vw) {
  const size_t bytes = static_cast<size_t>(vw) * sizeof(T);
  return aligned_to(p.c, bytes) && (p.aux == nullptr || aligned_to(p.aux, bytes)) && (p.m <= 1 || p.c_rs % vw == 0) &&
         (p.batch <= 1 || p.c_bs % vw == 0);
}

template <int VERSION, typename T, class C, Load LA, Load LB>
constexpr auto tiled_kernel() {
  if constexpr (VERSION == 3) {
    return matmul_v3_register_blocked_kernel<T, C, LA, LB>;
  } else if constexpr (VERSION == 4) {
    return matmul_v4_vectorized_kernel<T, C, LA, LB>;
  } else {
    return matmul_v5_warp_tiled_kernel<T, C, LA, LB>;
  }
}

template <int VERSION, typename T, class C, Load LA, Load LB>
cudaError_t launch_tiled(const MatmulArgs<T>& p, const TileGrid& g, cudaStream_t stream) {
  if constexpr (std::is_same_v<C, V5Float> && !std::is_same_v<C, V5FloatStaged> &&
                !(kAsyncOnly<C, LA, T, C::BM> && kAsyncOnly<C, LB, T, C::BN>)) {
    return launch_tiled<VERSION, T, V5FloatStaged, LA, LB>(p, g, stream);
  } else {
    constexpr auto kernel = tiled_kernel<VERSION, T, C, LA, LB>();
    using S = TileSmem<C, acc_t<T>>;
    if constexpr (S::DYNAMIC) {
      const cudaError_t err = prepare_kernel<kernel>(S::BYTES);
      if (err != cudaSuccess) return err;
    }
    dim3 grid;
    tile_launch_grid(g, grid);  // matmul_simt_supported checked that it fits
    kernel<<<grid, C::THREADS, S::DYNAMIC ? S::BYTES : 0, stream>>>(p, g);
    return cudaSuccess;
  }
}

template <int VERSION, typename T, class C, Load LA>
cudaError_t launch_tiled(const MatmulArgs<T>& p, const TileGrid& g, Load lb, cudaStream_t stream) {
  switch (lb) {
    case Load::vec_k:
      if constexpr (VERSION != 3) return launch_tiled<VERSION, T, C, LA, Load::vec_k>(p, g, stream);
      break;
    case Load::vec_mn:
      if constexpr (VERSION != 3) return launch_tiled<VERSION, T, C, LA, Load::vec_mn>(p, g, stream);
      break;
    case Load::scalar_k:
      return launch_tiled<VERSION, T, C, LA, Load::scalar_k>(p, g, stream);
    default:
      return launch_tiled<VERSION, T, C, LA, Load::scalar_mn>(p, g, stream);
  }
  return cudaErrorNotSupported;  // v3 never takes a vector loader
}

// v3 reads both operands with the scalar loaders; v4 and v5 pick a loader per operand.
template <int VERSION, typename T, class C>
cudaError_t launch_tiled(const MatmulArgs<T>& p, const SplitK& sk, void* partial, cudaStream_t stream) {
  TileGrid g = with_split(make_grid(p.batch, p.m, p.n, C::BM, C::BN), sk, partial);
  Load la = pick_load(p.a, p.a_rs, p.a_cs, p.a_bs, p.m, p.k, p.batch);
  Load lb = pick_load(p.b, p.b_cs, p.b_rs, p.b_bs, p.n, p.k, p.batch);
  if constexpr (VERSION == 3) {
    la = scalar_only(la);
    lb = scalar_only(lb);
  } else {
    g.c_vec = c_vec_ok(p, C::VW);
  }
  switch (la) {
    case Load::vec_k:
      if constexpr (VERSION != 3) return launch_tiled<VERSION, T, C, Load::vec_k>(p, g, lb, stream);
      break;
    case Load::vec_mn:
      if constexpr (VERSION != 3) return launch_tiled<VERSION, T, C, Load::vec_mn>(p, g, lb, stream);
      break;
    case Load::scalar_k:
      return launch_tiled<VERSION, T, C, Load::scalar_k>(p, g, lb, stream);
    default:
      return launch_tiled<VERSION, T, C, Load::scalar_mn>(p, g, lb, stream);
  }
  return cudaErrorNotSupported;  // v3 never takes a vector loader
}

// The tiles of `kernel`'s grid for these sizes.
template <typename T>
TileGrid version_grid(MatmulKernel kernel, const MatmulArgs<T>& p) {
  switch (kernel) {
    case MatmulKernel::naive:
      return make_grid(p.batch, p.m, p.n, kNaiveRows, kNaiveCols);
    case MatmulKernel::smem_tiled:
      return make_grid(p.batch, p.m, p.n, kTile2, kTile2);
    case MatmulKernel::register_blocked:
      return make_grid(p.batch, p.m, p.n, V3Config<T>::BM, V3Config<T>::BN);
    case MatmulKernel::vectorized:
      return make_grid(p.batch, p.m, p.n, V4Config<T>::BM, V4Config<T>::BN);
    default:
      return make_grid(p.batch, p.m, p.n, V5Config<T>::BM, V5Config<T>::BN);
  }
}

// Split-K. When a version's grid has fewer tiles than the GPU has multiprocessors (a thin output, such as a
// classifier's 10 columns, or a weight gradient's few tiles with a long k), k is cut into `splits` chunks that run
// as blocks of their own: about two blocks per multiprocessor, each chunk at least kSplitMinK deep and a multiple of
// 32 (the vector loaders' alignment holds at every chunk's start), at most kSplitMaxSplits of them and
// kSplitMaxWorkspace bytes of partial sums. split_k_reduce_kernel then adds the chunks up in a fixed order
// (deterministic) and applies the epilogue. Sums of exact products stay exact, so integer inputs stay bit-exact.
constexpr int64_t kSplitMinK = 64, kSplitMaxSplits = 32, kSplitAlign = 32;
constexpr int64_t kSplitMaxWorkspace = int64_t(64) << 20;

template <typename T>
SplitK split_k(MatmulKernel kernel, const MatmulArgs<T>& p) {
  SplitK r;
  if (kernel == MatmulKernel::naive || p.m <= 0 || p.n <= 0 || p.batch <= 0) return r;
  const int64_t tiles = version_grid(kernel, p).total, sms = sm_count();
  if (tiles <= 0 || tiles >= sms || p.k < 2 * kSplitMinK) return r;
  int64_t splits = (2 * sms + tiles - 1) / tiles;
  splits = splits < p.k / kSplitMinK ? splits : p.k / kSplitMinK;
  splits = splits < kSplitMaxSplits ? splits : kSplitMaxSplits;
  const int64_t per_split = p.batch * p.m * p.n * static_cast<int64_t>(sizeof(acc_t<T>));
  splits = splits < kSplitMaxWorkspace / per_split ? splits : kSplitMaxWorkspace / per_split;
  if (splits < 2) return r;
  const int64_t chunk = ((p.k + splits - 1) / splits + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  r.splits = (p.k + chunk - 1) / chunk;
  r.k_chunk = chunk;
  return r.splits < 2 ? SplitK{} : r;
}

template <typename T>
__global__ void __launch_bounds__(256) split_k_reduce_kernel(const __grid_constant__ MatmulArgs<T> p,
                                                             const acc_t<T>* __restrict__ partial, int64_t splits) {
  using A = acc_t<T>;
  const int64_t mn = p.m * p.n, total = p.batch * mn;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = idx / mn, r = idx - b * mn, i = r / p.n, j = r - i * p.n;
    const A* src = partial + b * splits * mn + r;
    A z = A(0);
    for (int64_t s = 0; s < splits; ++s) z += src[s * mn];
    store_epilogue(p, b, i, j, z);
  }
}

}  // namespace

template <typename T>
size_t matmul_simt_workspace_bytes(MatmulKernel kernel, const MatmulArgs<T>& args) {
  if (!matmul_simt_supported(kernel, args, nullptr)) return 0;
  const SplitK sk = split_k(kernel, args);
  return sk.splits > 1 ? static_cast<size_t>(sk.splits * args.batch * args.m * args.n) * sizeof(acc_t<T>) : 0;
}

template <typename T>
int64_t matmul_simt_blocks(MatmulKernel kernel, const MatmulArgs<T>& args) {
  return version_grid(kernel, args).total * split_k(kernel, args).splits;
}

template <typename T>
bool matmul_simt_supported(MatmulKernel kernel, const MatmulArgs<T>& args, const char** why) {
  switch (kernel) {
    case MatmulKernel::naive:
    case MatmulKernel::smem_tiled:
    case MatmulKernel::register_blocked:
    case MatmulKernel::vectorized:
    case MatmulKernel::warp_tiled:
      break;
    default:
      if (why) *why = "not a CUDA-core kernel";
      return false;
  }
  if (args.m < 0 || args.n < 0 || args.k < 0 || args.batch < 0) {
    if (why) *why = "negative size";
    return false;
  }
  dim3 grid;
  if (!tile_launch_grid(version_grid(kernel, args), grid)) {
    if (why) *why = "more output tiles than one launch can hold";
    return false;
  }
  return true;
}

template <typename T>
cudaError_t matmul_simt(MatmulKernel kernel, const MatmulArgs<T>& args, cudaStream_t stream, void* workspace) {
  if (!matmul_simt_supported(kernel, args, nullptr)) return cudaErrorNotSupported;
  if (args.m == 0 || args.n == 0 || args.batch == 0) return cudaSuccess;
  // Without a workspace (the caller did not ask matmul_simt_workspace_bytes), no split.
  const SplitK sk = workspace != nullptr ? split_k(kernel, args) : SplitK{};
  cudaError_t err = cudaSuccess;
  switch (kernel) {
    case MatmulKernel::naive: {
      const TileGrid g = version_grid(kernel, args);
      dim3 grid;
      tile_launch_grid(g, grid);
      matmul_v1_naive_kernel<T><<<grid, dim3(kNaiveCols, kNaiveRows), 0, stream>>>(args, g);
      break;
    }
    case MatmulKernel::smem_tiled: {
      const TileGrid g = with_split(version_grid(kernel, args), sk, workspace);
      dim3 grid;
      tile_launch_grid(g, grid);
      matmul_v2_smem_tiled_kernel<T><<<grid, dim3(kTile2, kTile2), 0, stream>>>(args, g);
      break;
    }
    case MatmulKernel::register_blocked:
      err = launch_tiled<3, T, V3Config<T>>(args, sk, workspace, stream);
      break;
    case MatmulKernel::vectorized:
      err = launch_tiled<4, T, V4Config<T>>(args, sk, workspace, stream);
      break;
    default:
      err = launch_tiled<5, T, V5Config<T>>(args, sk, workspace, stream);
      break;
  }
  if (err != cudaSuccess) return err;
  if (sk.splits > 1) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    split_k_reduce_kernel<T><<<grid_for(args.batch * args.m * args.n, 256), 256, 0, stream>>>(
        args, static_cast<const acc_t<T>*>(workspace), sk.splits);
  }
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_MATMUL_SIMT(T)                                                 \
  template bool matmul_simt_supported<T>(MatmulKernel, const MatmulArgs<T>&, const char**); \
  template size_t matmul_simt_workspace_bytes<T>(MatmulKernel, const MatmulArgs<T>&);       \
  template int64_t matmul_simt_blocks<T>(MatmulKernel, const MatmulArgs<T>&);               \
  template cudaError_t matmul_simt<T>(MatmulKernel, const MatmulArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_MATMUL_SIMT(float)
#ifndef TORCHEXT_SIMT_FLOAT_ONLY  // benchmarks/simt_check.cu's quick builds
TORCHEXT_INSTANTIATE_MATMUL_SIMT(double)
TORCHEXT_INSTANTIATE_MATMUL_SIMT(__half)
TORCHEXT_INSTANTIATE_MATMUL_SIMT(__nv_bfloat16)
#endif
#undef TORCHEXT_INSTANTIATE_MATMUL_SIMT

}  // namespace torchext::cuda_ops
