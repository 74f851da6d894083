// The CUDA-core GEMM's building blocks, shared by the matmul ladder's v5 (cuda_ops/matmul_simt.cu, where each one
// is explained with what it bought) and the convolution's implicit GEMM on CUDA cores (cuda_ops/conv2d_simt.cu):
// cp.async copies, the two operand loaders that move a float / double tile by cp.async alone, the tile shapes
// (TileConfig), the thread's fragment reads and FMAs, and v5's k loop (simt_k_loop).
//
// Shared-memory tiles are k-major: As[kk * LDA + mm] holds A[m0 + mm, k0 + kk], Bs[kk * LDB + nn] holds
// B[k0 + kk, n0 + nn]. A loader moves one ROWS x BK operand tile into such a tile: load<FULL>(k_left, s) issues the
// copies of the tile at the current k and steps one tile along k (k past k_left and rows past the loader's row count
// land as 0; FULL: the tile is known to be full along k), store(s) writes what load staged in registers (nothing,
// for the cp.async loaders), wait() returns once this thread's copies have landed.
// Internal to the files that include it (an anonymous namespace: each gets its own copy).
#pragma once

#include <cstdint>
#include <cstring>

#include "common.cuh"

namespace torchext::cuda_ops {
namespace {

__device__ __forceinline__ float mac(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double mac(double a, double b, double c) { return fma(a, b, c); }

// cp.async (sm_80+): 16 bytes from global straight to shared memory, bypassing registers and L1; the first `bytes`
// are copied and the rest zero-filled (bytes == 0 reads nothing). The host version is for host-side emulation only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define TORCHEXT_SIMT_CP_ASYNC 1
#else
#define TORCHEXT_SIMT_CP_ASYNC 0
#endif
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes)
      : "memory");
#elif !defined(__CUDA_ARCH__)
  memcpy(dst, src, bytes);
  memset(static_cast<char*>(dst) + bytes, 0, 16 - bytes);
#endif
}
// The same for one element of SIZE = 4 or 8 bytes (cp.async.ca: sizes below 16 go through L1), copied when
// INDEX < limit, else zero-filled. The comparison sits inside the asm so the compiler cannot hoist one predicate per
// copy out of the k loop: kept live across it, those predicates cost a register each and made v5 spill (CUDA 13.0).
template <int SIZE, int INDEX>
__device__ __forceinline__ void cp_async_elem_if_below(void* dst, const void* src, int limit) {
  static_assert(SIZE == 4 || SIZE == 8, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  .reg .u32 n;\n"
      "  setp.lt.s32 p, %3, %4;\n"
      "  selp.u32 n, %2, 0, p;\n"
      "  cp.async.ca.shared.global [%0], [%1], %2, n;\n"
      "}\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
      "l"(src), "n"(SIZE), "n"(INDEX), "r"(limit)
      : "memory");
#elif !defined(__CUDA_ARCH__)
  if (INDEX < limit) {
    memcpy(dst, src, SIZE);
  } else {
    memset(dst, 0, SIZE);
  }
#endif
}
// Waits for this thread's copies; a barrier after it publishes them to the block.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Float and double operands contiguous along k travel by cp.async, one element per copy, each landing at its
// transposed place in the smem tile: no registers, no store instructions. A warp copies runs of KW consecutive k
// (32 bytes: one sector) from 32 / KW consecutive rows, so it reads whole sectors and its transposing writes land on
// 32 distinct banks (LD = ROWS + 4). Thread t copies k offsets t % KW + KW * kq of rows t / KW + RP * rr, for
// rr < ROWS / RP and kq < BK / KW (RP = NT / KW rows per pass).
template <typename T, int BK>
constexpr int kTransposeRun = BK < 32 / int(sizeof(T)) ? BK : 32 / int(sizeof(T));  // KW: a sector's elements

template <typename T, int ROWS, int BK, int NT, int LD>
struct AsyncTransposeLoader {
  using A = acc_t<T>;
  static constexpr int KW = kTransposeRun<T, BK>, RP = NT / KW;
  static constexpr int PASSES = ROWS / RP, ITERS = PASSES * (BK / KW);
  static_assert(sizeof(T) == sizeof(A) && NT % KW == 0 && ROWS % RP == 0 && BK % KW == 0, "whole passes");

  const T* src;     // the thread's first element in the current k tile
  int64_t it_step;  // RP rows: from one of its rows to the next
  int rows_left;    // rows - r0(): the thread's pass rr lies in the tile's rows when rr * RP < rows_left

  __device__ __forceinline__ static int r0() { return threadIdx.x / KW; }
  __device__ __forceinline__ static int kk0() { return threadIdx.x % KW; }

  __device__ __forceinline__ void init(const T* base, int64_t s_mn, int64_t /*s_k == 1*/, int rows) {
    src = base + r0() * s_mn + kk0();
    it_step = RP * s_mn;
    rows_left = rows - r0();
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, A* s) {
    copy<FULL, 0>(s + kk0() * LD + r0(), src, k_left);
    src += BK;
  }
  // Copy IT: pass rr = IT % PASSES of k run kq = IT / PASSES.
  template <bool FULL, int IT>
  __device__ __forceinline__ void copy(A* dst, const T* q, int k_left) const {
    if constexpr (IT < ITERS) {
      constexpr int rr = IT % PASSES, kq = IT / PASSES;
      const int limit = FULL || kk0() + kq * KW < k_left ? rows_left : 0;
      cp_async_elem_if_below<sizeof(T), rr * RP>(dst + kq * KW * LD + rr * RP, q + kq * KW, limit);
      copy<FULL, IT + 1>(dst, rr + 1 == PASSES ? q - rr * it_step : q + it_step, k_left);
    }
  }
  __device__ __forceinline__ void store(A* /*s*/) const {}
  __device__ __forceinline__ void wait() const { cp_async_wait_all(); }
};

// Float and double operands contiguous along m / n land in smem as they are, by 16-byte cp.async copies: thread t
// copies vector t % RV of k rows t / RV + it * (NT / RV), so all its copies cover the same rows (one byte count:
// the vector's elements inside the tile, zero-filled past them).
template <typename T, int ROWS, int BK, int NT, int LD>
struct AsyncRowLoader {
  using A = acc_t<T>;
  static constexpr int VEC = kVec16<T>, RV = ROWS / VEC, DK = NT / RV, ITERS = BK * RV / NT;
  static_assert(sizeof(T) == sizeof(A) && ROWS % VEC == 0 && NT % RV == 0 && (BK * RV) % NT == 0,
                "whole vectors per thread");

  const T* src;     // the thread's first vector in the current k tile
  int64_t it_step;  // DK k rows: from one of its vectors to the next
  int64_t k_step;   // BK k rows
  int bytes;        // of its vector, inside the tile's rows

  __device__ __forceinline__ static int rv() { return threadIdx.x % RV; }
  __device__ __forceinline__ static int kk0() { return threadIdx.x / RV; }

  __device__ __forceinline__ void init(const T* base, int64_t /*s_mn == 1*/, int64_t s_k, int rows) {
    src = base + rv() * VEC + kk0() * s_k;
    it_step = DK * s_k;
    k_step = BK * s_k;
    const int n = rows - rv() * VEC;
    bytes = (n < 0 ? 0 : n < VEC ? n : VEC) * static_cast<int>(sizeof(T));
  }
  template <bool FULL>
  __device__ __forceinline__ void load(int k_left, A* s) {
    A* dst = s + kk0() * LD + rv() * VEC;
    const T* q = src;
#pragma unroll
    for (int it = 0; it < ITERS; ++it, q += it_step) {
      cp_async16(dst + it * DK * LD, q, FULL || kk0() + it * DK < k_left ? bytes : 0);
    }
    src += k_step;
  }
  __device__ __forceinline__ void store(A* /*s*/) const {}
  __device__ __forceinline__ void wait() const { cp_async_wait_all(); }
};

// Block tile BM x BN x BK, split into (BM / GM) x (BN / GN) thread groups of TGM x TGN threads; a group's GM x GN tile
// is covered by its threads in VW x VW patches, ITM x ITN of them per thread, patch (i, j) of thread (tm, tn) at
// rows i * TGM * VW + tm * VW and columns j * TGN * VW + tn * VW. VW is also the width of the inner loop's smem
// reads. STAGES = 2 double-buffers the smem tiles. PAD is added to each smem row (LDA = BM + PAD, LDB = BN + PAD).
template <int BM_, int BN_, int BK_, int GM_, int GN_, int TGM_, int TGN_, int VW_, int PAD_, int STAGES_,
          int MIN_BLOCKS_, bool ASYNC_K_ = false>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, GM = GM_, GN = GN_, TGM = TGM_, TGN = TGN_, VW = VW_;
  static constexpr int STAGES = STAGES_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr bool ASYNC_K = ASYNC_K_;  // float / double operands by AsyncTransposeLoader / AsyncRowLoader
  static constexpr int GROUPS_N = BN / GN, THREADS = (BM / GM) * GROUPS_N * TGM * TGN;
  static constexpr int ITM = GM / (TGM * VW), ITN = GN / (TGN * VW), TM = ITM * VW, TN = ITN * VW;
  static constexpr int LDA = BM + PAD_, LDB = BN + PAD_;
  static_assert(BM % GM == 0 && BN % GN == 0 && GM % (TGM * VW) == 0 && GN % (TGN * VW) == 0, "tile shapes");
  static_assert(STAGES == 1 || STAGES == 2, "one or two smem buffers");
};

// One kk row of this thread's operands: ITM + ITN VW-wide smem reads into a (TM values) and b (TN values).
template <class C, typename A>
__device__ __forceinline__ void load_fragments(const A* __restrict__ As, const A* __restrict__ Bs, int kk, int a_off,
                                               int b_off, A (&a)[C::TM], A (&b)[C::TN]) {
  using V = Vec<A, C::VW>;
#pragma unroll
  for (int i = 0; i < C::ITM; ++i) {
    const V v = *reinterpret_cast<const V*>(As + kk * C::LDA + a_off + i * C::TGM * C::VW);
#pragma unroll
    for (int e = 0; e < C::VW; ++e) a[i * C::VW + e] = v.v[e];
  }
#pragma unroll
  for (int j = 0; j < C::ITN; ++j) {
    const V v = *reinterpret_cast<const V*>(Bs + kk * C::LDB + b_off + j * C::TGN * C::VW);
#pragma unroll
    for (int e = 0; e < C::VW; ++e) b[j * C::VW + e] = v.v[e];
  }
}

// v5's order for the same FMAs: 2x2 blocks walked as a snake, so that each FMA shares an operand with the one before
// it (the order of cuBLAS's FFMA kernels). ptxas keeps the order and allocates registers from it: in v5 at 4096^3
// it ran 3% faster than row by row, and 6% faster than column by column, with fewer dispatch stalls
// (NOTES_matmul.md). In v3 / v4, whose fragments are not double-buffered, it made float spill.
template <class C, typename A>
__device__ __forceinline__ void outer_product_snake(const A (&a)[C::TM], const A (&b)[C::TN], A (&acc)[C::TM][C::TN]) {
  static_assert(C::TM % 2 == 0 && C::TN % 2 == 0, "2x2 blocks");
#pragma unroll
  for (int i = 0; i < C::TM; i += 2) {
#pragma unroll
    for (int jj = 0; jj < C::TN; jj += 2) {
      const int j = i / 2 % 2 == 0 ? jj : C::TN - 2 - jj;
      acc[i][j] = mac(a[i], b[j], acc[i][j]);
      acc[i][j + 1] = mac(a[i], b[j + 1], acc[i][j + 1]);
      acc[i + 1][j + 1] = mac(a[i + 1], b[j + 1], acc[i + 1][j + 1]);
      acc[i + 1][j] = mac(a[i + 1], b[j], acc[i + 1][j]);
    }
  }
}

// v5's k loop over ktiles BK-deep tiles into the thread's accumulators, two smem buffers (As(stage) at smem +
// stage * BK * LDA, Bs(stage) after both A buffers) and the fragments double-buffered in registers. While the FMAs
// of row kk run, the smem reads of row kk + 1 are in flight, so no warp waits on shared-memory latency at the start
// of a row. The barrier moves into the last row of the tile: the next tile's stores, the barrier, then the reads of
// the next tile's first row, all before the last row's FMAs, which cover that latency too. Buffer cur ^ 1 was last
// read in tile kt - 1 (rows up to BK - 1, read while row BK - 2 computed), before that tile's barrier. Tiles before
// the last are full along k, and so is the last when last_left == BK. Ends with a barrier: smem may be reused.
template <class C, typename A, class LA, class LB>
__device__ __forceinline__ void simt_k_loop(LA& la, LB& lb, A* smem, int64_t ktiles, int last_left, int a_off,
                                            int b_off, A (&acc)[C::TM][C::TN]) {
  static_assert(C::STAGES == 2 && C::BK % 2 == 0, "two smem buffers; fragment buffers alternate within a tile");
  constexpr int A_TILE = C::BK * C::LDA, B_TILE = C::BK * C::LDB;
  auto As = [&](int stage) { return smem + stage * A_TILE; };
  auto Bs = [&](int stage) { return smem + 2 * A_TILE + stage * B_TILE; };
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
  if (ktiles > 0) {
    load(0, 0);
    store(0);
  }
  wait();
  __syncthreads();
  A fa[2][C::TM], fb[2][C::TN];
  if (ktiles > 0) load_fragments<C>(As(0), Bs(0), 0, a_off, b_off, fa[0], fb[0]);
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    const int cur = static_cast<int>(kt & 1);
    const bool more = kt + 1 < ktiles;
    if (more) load(kt + 1, cur ^ 1);
#pragma unroll
    for (int kk = 0; kk < C::BK; ++kk) {
      if (kk == C::BK - 1) {
        if (more) store(cur ^ 1);
        wait();
        __syncthreads();
        if (more) load_fragments<C>(As(cur ^ 1), Bs(cur ^ 1), 0, a_off, b_off, fa[0], fb[0]);
      } else {
        load_fragments<C>(As(cur), Bs(cur), kk + 1, a_off, b_off, fa[(kk + 1) & 1], fb[(kk + 1) & 1]);
      }
      outer_product_snake<C>(fa[kk & 1], fb[kk & 1], acc);
    }
  }
}

}  // namespace
}  // namespace torchext::cuda_ops
