// The mma.sync building blocks shared by the tensor-core kernels of the GEMM engine (cuda_ops/matmul_mma.cu) and
// the implicit-GEMM convolution (cuda_ops/conv2d_implicit.cu): PTX wrappers for cp.async, ldmatrix and mma.sync,
// and the swizzle of the shared-memory tiles both use.
//
// Shared-memory layout of one operand tile of BX rows (BX = BM rows of m for A, BN rows of n for B), one stage:
//   K-major   BX lines of 128 bytes (BK elements of k); chunk c of line r sits at chunk c ^ (r % 8).
//   MN-major  BK lines of BX * sizeof(T) bytes (BX elements of m or n); within each group of 8 chunks, chunk c of
//             line k sits at c ^ (k % 8) for bf16/fp16 (ldmatrix.trans reads 8 lines at one chunk) and at
//             c ^ 2 (k % 4) for tf32 (ld.shared.b32 reads 4 lines at two adjacent chunks).
// Either way the tile is BX * 128 bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace torchext::cuda_ops::mma_sync {

constexpr int kLineBytes = 128;  // k extent of a stage in bytes: BK = 64 for bf16/fp16, 32 for tf32

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; bytes beyond src_bytes (0..16) are zero-filled and not read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d));
}

__device__ __forceinline__ uint32_t to_tf32(uint32_t x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
  return r;
}

// d += a b for one m16 x n8 fragment: k16 for bf16/fp16, k8 for tf32 (same register counts).
template <typename T>
__device__ __forceinline__ void mma_m16n8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma_m16n8<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8<float>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The chunk that chunk c of line k of an MN-major tile is stored at (see the layout above).
template <int ES>
__device__ __forceinline__ int mn_major_chunk(int c, int k) {
  const int x = ES == 2 ? (k & 7) : ((k & 3) << 1);
  return (c & ~7) | ((c ^ x) & 7);
}

// Copies one stage of a K-major operand: BX rows from row0, 8 chunks of k each, 16-byte cp.async per chunk.
// Thread tid copies chunk tid % 8 of rows tid / 8 + p * NT / 8; what does not change with the k-tile (the source
// pointer, the destination, which rows exist) is computed once.
template <typename T, int BX, int NT>
struct KMajorLoader {
  static constexpr int kElems = 16 / sizeof(T), kPasses = BX * 8 / NT, kRowsPerPass = NT / 8;
  static_assert(kRowsPerPass % 8 == 0, "the swizzle of a thread's chunks must not change between passes");
  const T* src;     // pass 0's chunk at k = 0
  uint32_t dst;     // its offset in the tile
  int kcol;         // its first k
  uint32_t row_ok;  // bit p: pass p's row is inside the matrix

  __device__ __forceinline__ KMajorLoader(const T* base, int64_t lead, int row0, int rows, int tid) {
    const int r = tid >> 3, c = tid & 7;
    src = base + static_cast<int64_t>(row0 + r) * lead + c * kElems;
    dst = r * kLineBytes + ((c ^ (r & 7)) << 4);
    kcol = c * kElems;
    row_ok = 0;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) row_ok |= static_cast<uint32_t>(row0 + r + p * kRowsPerPass < rows) << p;
  }

  // Interior tile (every row inside the matrix, k0 + BK <= k): whole chunks, no checks.
  __device__ __forceinline__ void load_interior(uint32_t tile, int64_t lead, int k0) const {
    const int64_t step = static_cast<int64_t>(kRowsPerPass) * lead;
    const T* s = src + k0;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      cp_async16(tile + dst + p * kRowsPerPass * kLineBytes, s);
      s += step;
    }
  }

  // Any tile: zero-fill what lies outside the matrix, part of the chunk at a ragged end of k. `fallback` is a
  // valid address for the copies that read nothing.
  __device__ __forceinline__ void load_edge(uint32_t tile, const T* fallback, int64_t lead, int k, int k0) const {
    const int64_t step = static_cast<int64_t>(kRowsPerPass) * lead;
    const T* s = src + k0;
    const int kk = k0 + kcol;
    const int kbytes = kk < k ? min(kElems, k - kk) * static_cast<int>(sizeof(T)) : 0;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const bool ok = ((row_ok >> p) & 1) != 0 && kbytes > 0;
      cp_async16(tile + dst + p * kRowsPerPass * kLineBytes, ok ? s : fallback, ok ? kbytes : 0);
      s += step;
    }
  }
};

// Copies one stage of an MN-major operand: BK lines of k from k0, each BX elements from row0. Thread tid copies
// chunk tid % (chunks per line) of lines tid / (chunks per line) + p * (lines per pass).
template <typename T, int BX, int NT>
struct MnMajorLoader {
  static constexpr int ES = sizeof(T), kElems = 16 / ES, kChunksPerLine = BX / kElems, kLines = kLineBytes / ES;
  static constexpr int kPasses = kLines * kChunksPerLine / NT, kLinesPerPass = NT / kChunksPerLine;
  static_assert(kLinesPerPass % (ES == 2 ? 8 : 4) == 0, "the swizzle must not change between passes");
  const T* src;  // pass 0's chunk at k = 0
  uint32_t dst;  // its offset in the tile
  int kline;     // its line
  int cbytes;    // bytes of it inside the matrix (0..16)

  __device__ __forceinline__ MnMajorLoader(const T* base, int64_t lead, int row0, int rows, int tid) {
    const int c = tid % kChunksPerLine;
    const int col = row0 + c * kElems;
    kline = tid / kChunksPerLine;
    cbytes = col < rows ? min(kElems, rows - col) * ES : 0;
    src = base + static_cast<int64_t>(kline) * lead + col;
    dst = kline * (BX * ES) + (mn_major_chunk<ES>(c, kline) << 4);
  }

  __device__ __forceinline__ void load_interior(uint32_t tile, int64_t lead, int k0) const {
    const int64_t step = static_cast<int64_t>(kLinesPerPass) * lead;
    const T* s = src + static_cast<int64_t>(k0) * lead;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      cp_async16(tile + dst + p * kLinesPerPass * (BX * ES), s);
      s += step;
    }
  }

  __device__ __forceinline__ void load_edge(uint32_t tile, const T* fallback, int64_t lead, int k, int k0) const {
    const int64_t step = static_cast<int64_t>(kLinesPerPass) * lead;
    const T* s = src + static_cast<int64_t>(k0) * lead;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const bool ok = k0 + kline + p * kLinesPerPass < k && cbytes > 0;
      cp_async16(tile + dst + p * kLinesPerPass * (BX * ES), ok ? s : fallback, ok ? cbytes : 0);
      s += step;
    }
  }
};

// The fragments of one warp's 64 x 64 tile (MI m16 and NI n8 fragments) for one k-step of 32 bytes, read from a
// stage's A and B tiles (layouts above) with ldmatrix (.trans for MN-major bf16/fp16; ld.shared.b32 for MN-major
// tf32). kLineA / kLineB are the MN-major line lengths in bytes (BM or BN elements). The per-thread offsets are
// computed once; a k-step s or fragment index enters by XOR on the chunk bits or by an immediate.
template <typename T, int MI, int NI, int kLineA, int kLineB, bool kAKMajor, bool kBKMajor>
struct Fragments {
  static constexpr int ES = sizeof(T);
  static constexpr bool kTf32 = sizeof(T) == 4;
  uint32_t a_frag, b_frag;

  __device__ __forceinline__ Fragments(int lane, int wm0, int wn0) {
    const int g = lane >> 2, t = lane & 3;
    if constexpr (kAKMajor) {  // ldmatrix: rows wm0 + (lane % 16), chunk 2s + lane / 16
      a_frag = (wm0 + (lane & 15)) * kLineBytes + (((lane >> 4) ^ (lane & 7)) << 4);
    } else if constexpr (!kTf32) {  // ldmatrix.trans: k rows (lane % 8) + 8 (lane / 16), m chunk 2i + (lane / 8) % 2
      a_frag = ((lane & 7) + ((lane >> 4) << 3)) * kLineA + wm0 * ES + ((((lane >> 3) & 1) ^ (lane & 7)) << 4);
    } else {  // ld.shared: k row t, m = g (+ 8, + 16 i)
      a_frag = t * kLineA + wm0 * ES + (((g >> 2) ^ (t << 1)) << 4) + (g & 3) * 4;
    }
    if constexpr (kBKMajor) {  // ldmatrix: n rows (lane % 8) + 8 (lane / 16), chunk 2s + (lane / 8) % 2
      b_frag = (wn0 + (lane & 7) + ((lane >> 4) << 3)) * kLineBytes + ((((lane >> 3) & 1) ^ (lane & 7)) << 4);
    } else if constexpr (!kTf32) {  // ldmatrix.trans: k rows (lane % 8) + 8 ((lane / 8) % 2), n chunk 2jp + lane / 16
      b_frag = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kLineB + wn0 * ES + (((lane >> 4) ^ (lane & 7)) << 4);
    } else {  // ld.shared: k row t, n = g (+ 8 j)
      b_frag = t * kLineB + wn0 * ES + (((g >> 2) ^ (t << 1)) << 4) + (g & 3) * 4;
    }
  }

  // Fragments of k-step s (0..3) of the A tile at sa and the B tile at sb.
  __device__ __forceinline__ void load(uint32_t (&fa)[MI][4], uint32_t (&fb)[NI][2], uint32_t sa, uint32_t sb,
                                      int s) const {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if constexpr (kAKMajor) {
        ldsm_x4(sa + ((a_frag ^ (s << 5)) + i * 16 * kLineBytes), fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
      } else if constexpr (!kTf32) {
        ldsm_x4_trans(sa + s * 16 * kLineA + (a_frag ^ (i << 5)), fa[i][0], fa[i][1], fa[i][2], fa[i][3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // q = e + 2 kh: rows g + 8e, k t + 4kh
          const int e = q & 1, kh = q >> 1;
          fa[i][q] = lds32(sa + (a_frag ^ ((((i & 1) << 2) | (e << 1)) << 4)) + (8 * s + 4 * kh) * kLineA + (i >> 1) * 128);
        }
      }
      if constexpr (kTf32) {
#pragma unroll
        for (int q = 0; q < 4; ++q) fa[i][q] = to_tf32(fa[i][q]);
      }
    }
#pragma unroll
    for (int jp = 0; jp < NI / 2; ++jp) {
      if constexpr (kBKMajor) {
        ldsm_x4(sb + ((b_frag ^ (s << 5)) + jp * 16 * kLineBytes), fb[2 * jp][0], fb[2 * jp][1], fb[2 * jp + 1][0],
                fb[2 * jp + 1][1]);
      } else if constexpr (!kTf32) {
        ldsm_x4_trans(sb + s * 16 * kLineB + (b_frag ^ (jp << 5)), fb[2 * jp][0], fb[2 * jp][1], fb[2 * jp + 1][0],
                      fb[2 * jp + 1][1]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // q = jj + 2 kh: fragment 2jp + jj, k t + 4kh
          const int j = 2 * jp + (q & 1), kh = q >> 1;
          fb[j][kh] = lds32(sb + (b_frag ^ (((j & 3) << 1) << 4)) + (8 * s + 4 * kh) * kLineB + (j >> 2) * 128);
        }
      }
      if constexpr (kTf32) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          fb[2 * jp][q] = to_tf32(fb[2 * jp][q]);
          fb[2 * jp + 1][q] = to_tf32(fb[2 * jp + 1][q]);
        }
      }
    }
  }
};

}  // namespace torchext::cuda_ops::mma_sync
