// CPU kernels for torchext::matmul, torchext::linear and torchext::linear_backward, float32 and float64.
//
// The GEMM, C = act(A B + bias) with A (m, k) and B (k, n) read through strides, is BLIS's loop nest (Goto and
// van de Geijn, "Anatomy of high-performance matrix multiplication"):
//
//   for jc in n by NC:                      B panel (KC x NC) packed once per (jc, pc)
//     for pc in k by KC:
//       pack B[pc:pc+KC, jc:jc+NC] into KC x NR micro-panels
//       for ic in m by MC:                  A block (MC x KC, in L2) packed once per (jc, pc, ic)
//         pack A[ic:ic+MC, pc:pc+KC] into MR x KC micro-panels
//         for jr in NC by NR, ir in MC by MR:
//           micro-kernel: an MR x NR tile of C in registers, KC rank-1 updates from the two packed panels
//
// Packing reads A and B through their row and column strides, so transposed and non-contiguous operands cost no
// copy, and pads edge panels with zeros, so the micro-kernel always computes full tiles. The micro-kernel is plain
// C++ on GCC/Clang vector types that the compiler turns into FMA instructions; it is compiled once per instruction
// set (AVX-512, AVX2+FMA, and the build's baseline) and picked at run time (TORCHEXT_CPU_GEMM_ISA=avx2|generic
// lowers the choice, for tests). at::parallel_for gives each thread one block of C: whole batch entries first,
// then a grid of row and column ranges chosen to repack as little as possible. The order in which each element
// of C is accumulated does not depend on that split, so results do not depend on the thread count.
//
// The epilogue runs as a tile's last K block is stored: z = acc + bias[j], aux = z (when asked), C = act(z), with
// the activation math of cuda_ops/activation_math.h, the function every CUDA kernel computes.
//
// linear_backward: grad_z = grad_out * act'(saved) and the bias gradient (column sums, in a fixed order: rows in
// fixed chunks summed in float64, chunks added in order) in one pass, then grad_input = grad_z @ weight and
// grad_weight = grad_z^T @ input through the GEMM with strides (no transposed copies).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "activation_math.h"
#include "checks.h"
#include "matmul.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define TORCHEXT_GEMM_X86 1
#else
#define TORCHEXT_GEMM_X86 0
#endif
#if defined(__GNUC__) || defined(__clang__)
#define TORCHEXT_GEMM_VECTOR_EXT 1
#define TORCHEXT_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define TORCHEXT_GEMM_VECTOR_EXT 0
#define TORCHEXT_ALWAYS_INLINE inline
#endif

namespace torchext {
namespace {

// The engine's arguments, the same struct the CUDA launchers take (cuda_ops/matmul_args.h).
template <typename T>
using GemmArgs = cuda_ops::MatmulArgs<T>;

// ---------------------------------------------------------------------------------------------------------------
// Micro-kernels

// tile (MR x NR, row-major) = sum over p < kc of a[p * MR + i] * b[p * NR + j]: the packed A micro-panel holds MR
// values per p, the packed B micro-panel NR values per p. VB is the vector width in bytes; the MR x NR / lanes
// accumulators stay in registers.
template <typename T, int MR, int NR, int VB>
TORCHEXT_ALWAYS_INLINE void micro_kernel(int64_t kc, const T* __restrict a, const T* __restrict b, T* __restrict tile) {
#if TORCHEXT_GEMM_VECTOR_EXT
  constexpr int kLanes = VB / static_cast<int>(sizeof(T));
  constexpr int kVecs = NR / kLanes;
  static_assert(NR % kLanes == 0, "NR must be a whole number of vectors");
  typedef T Vec __attribute__((vector_size(VB)));
  Vec acc[MR][kVecs];
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < kVecs; ++v) acc[i][v] = Vec{};
  }
  for (int64_t p = 0; p < kc; ++p) {
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) std::memcpy(&bv[v], b + p * NR + v * kLanes, VB);
    for (int i = 0; i < MR; ++i) {
      const T ai = a[p * MR + i];
      for (int v = 0; v < kVecs; ++v) acc[i][v] += bv[v] * ai;
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < kVecs; ++v) std::memcpy(tile + i * NR + v * kLanes, &acc[i][v], VB);
  }
#else
  T acc[MR][NR] = {};
  for (int64_t p = 0; p < kc; ++p) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) acc[i][j] += a[p * MR + i] * b[p * NR + j];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) tile[i * NR + j] = acc[i][j];
  }
#endif
}

template <typename T>
using MicroKernel = void (*)(int64_t, const T*, const T*, T*);

// Tile shapes: NR is two vectors and MR = 6 rows, 12 accumulators of the 32 (AVX-512) or 16 (AVX2) vector
// registers; the baseline (SSE2 / NEON, 16-byte vectors) uses 4 x 2 of its 16.
#if TORCHEXT_GEMM_X86
__attribute__((target("avx512f"))) void micro_avx512_f32(int64_t kc, const float* a, const float* b, float* t) {
  micro_kernel<float, 6, 32, 64>(kc, a, b, t);
}
__attribute__((target("avx512f"))) void micro_avx512_f64(int64_t kc, const double* a, const double* b, double* t) {
  micro_kernel<double, 6, 16, 64>(kc, a, b, t);
}
__attribute__((target("avx2,fma"))) void micro_avx2_f32(int64_t kc, const float* a, const float* b, float* t) {
  micro_kernel<float, 6, 16, 32>(kc, a, b, t);
}
__attribute__((target("avx2,fma"))) void micro_avx2_f64(int64_t kc, const double* a, const double* b, double* t) {
  micro_kernel<double, 6, 8, 32>(kc, a, b, t);
}
#endif
void micro_generic_f32(int64_t kc, const float* a, const float* b, float* t) {
  micro_kernel<float, 4, 8, 16>(kc, a, b, t);
}
void micro_generic_f64(int64_t kc, const double* a, const double* b, double* t) {
  micro_kernel<double, 4, 4, 16>(kc, a, b, t);
}

enum class CpuIsa : int { generic = 0, avx2, avx512 };

CpuIsa detected_isa() {
#if TORCHEXT_GEMM_X86
  // __builtin_cpu_supports also checks that the OS saves the wider registers.
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return CpuIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::avx2;
    return CpuIsa::generic;
  }();
  return isa;
#else
  return CpuIsa::generic;
#endif
}

// The best micro-kernel this CPU runs, or a lower one named by TORCHEXT_CPU_GEMM_ISA (so that tests can run each).
CpuIsa gemm_isa() {
  const CpuIsa best = detected_isa();
  const char* env = std::getenv("TORCHEXT_CPU_GEMM_ISA");
  if (env == nullptr || env[0] == '\0') return best;
  const std::string_view name(env);
  CpuIsa asked = CpuIsa::generic;
  if (name == "avx512") {
    asked = CpuIsa::avx512;
  } else if (name == "avx2") {
    asked = CpuIsa::avx2;
  } else {
    TORCH_CHECK_VALUE(name == "generic", "TORCHEXT_CPU_GEMM_ISA must be 'avx512', 'avx2' or 'generic', got '", name,
                      "'");
  }
  return std::min(asked, best);
}

// ---------------------------------------------------------------------------------------------------------------
// Packing

// A[i, p] for i < mc, p < kc (a points at the block's first element) into micro-panels of MR rows: panel r holds,
// for each p, the MR values A[r * MR + i, p]; rows at or past mc are zero.
template <typename T, int MR>
void pack_a(const T* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, T* dst) {
  for (int64_t ir = 0; ir < mc; ir += MR, dst += MR * kc) {
    const int64_t mr = std::min<int64_t>(MR, mc - ir);
    const T* s = a + ir * rs;
    if (mr == MR && cs == 1) {
      for (int i = 0; i < MR; ++i) {
        const T* row = s + i * rs;
        for (int64_t p = 0; p < kc; ++p) dst[p * MR + i] = row[p];
      }
    } else if (mr == MR && rs == 1) {
      for (int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = s[p * cs + i];
      }
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < MR; ++i) dst[p * MR + i] = i < mr ? s[i * rs + p * cs] : T(0);
      }
    }
  }
}

// B[p, j] for p < kc, j < nc into micro-panels of NR columns: panel q holds, for each p, the NR values
// B[p, q * NR + j]; columns at or past nc are zero.
template <typename T, int NR>
void pack_b(const T* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, T* dst) {
  const int64_t full = nc / NR * NR;
  if (cs == 1) {
    for (int64_t p = 0; p < kc; ++p) {
      const T* row = b + p * rs;
      for (int64_t jr = 0; jr < full; jr += NR) std::memcpy(dst + jr * kc + p * NR, row + jr, NR * sizeof(T));
    }
  } else if (rs == 1) {
    for (int64_t jr = 0; jr < full; jr += NR) {
      T* d = dst + jr * kc;
      for (int j = 0; j < NR; ++j) {
        const T* col = b + (jr + j) * cs;
        for (int64_t p = 0; p < kc; ++p) d[p * NR + j] = col[p];
      }
    }
  } else {
    for (int64_t jr = 0; jr < full; jr += NR) {
      T* d = dst + jr * kc;
      for (int64_t p = 0; p < kc; ++p) {
        for (int j = 0; j < NR; ++j) d[p * NR + j] = b[p * rs + (jr + j) * cs];
      }
    }
  }
  if (full < nc) {
    const int64_t nr = nc - full;
    T* d = dst + full * kc;
    for (int64_t p = 0; p < kc; ++p) {
      for (int j = 0; j < NR; ++j) d[p * NR + j] = j < nr ? b[p * rs + (full + j) * cs] : T(0);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Epilogue

template <typename T, typename F>
inline void map_row(T* out, const T* z, int64_t n, F f) {
  for (int64_t j = 0; j < n; ++j) out[j] = f(z[j]);
}

// out[j] = act(z[j]) for j < n.
template <typename T>
void activate_row(T* out, const T* z, int64_t n, MatmulActivation act) {
  switch (act) {
    case MatmulActivation::relu:
      return map_row(out, z, n, [](T x) { return math::relu_forward(x); });
    case MatmulActivation::gelu:
      return map_row(out, z, n, [](T x) { return math::gelu_forward(x); });
    case MatmulActivation::gelu_tanh:
      return map_row(out, z, n, [](T x) { return math::gelu_tanh_forward(x); });
    case MatmulActivation::silu:
      return map_row(out, z, n, [](T x) { return math::silu_forward(x); });
    default:
      if (out != z) std::copy(z, z + n, out);
  }
}

// Stores the micro-kernel's tile (mr x nr of it) into C at c (row stride ldc): written on the first K block, added
// on later ones. On the last K block: z = sum + bias[j], aux = z when aux is set, C = act(z).
template <typename T, int MR, int NR>
void store_tile(const T* tile, int64_t mr, int64_t nr, bool first, bool last, T* c, int64_t ldc, T* aux, const T* bias,
                MatmulActivation act) {
  if (!last && mr == MR && nr == NR) {
    for (int i = 0; i < MR; ++i) {
      T* crow = c + i * ldc;
      const T* trow = tile + i * NR;
      if (first) {
        for (int j = 0; j < NR; ++j) crow[j] = trow[j];
      } else {
        for (int j = 0; j < NR; ++j) crow[j] += trow[j];
      }
    }
    return;
  }
  T z[NR];
  for (int64_t i = 0; i < mr; ++i) {
    T* crow = c + i * ldc;
    const T* trow = tile + i * NR;
    if (first) {
      for (int64_t j = 0; j < nr; ++j) z[j] = trow[j];
    } else {
      for (int64_t j = 0; j < nr; ++j) z[j] = crow[j] + trow[j];
    }
    if (!last) {
      std::copy(z, z + nr, crow);
      continue;
    }
    if (bias != nullptr) {
      for (int64_t j = 0; j < nr; ++j) z[j] += bias[j];
    }
    if (aux != nullptr) std::copy(z, z + nr, aux + i * ldc);
    activate_row(crow, z, nr, act);
  }
}

// k == 0: every element is z = bias[j] (or 0).
template <typename T>
void store_empty_product(const GemmArgs<T>& g) {
  std::vector<T> z(g.n, T(0));
  if (g.bias != nullptr) std::copy(g.bias, g.bias + g.n, z.begin());
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    for (int64_t i = 0; i < g.m; ++i) {
      const int64_t off = bi * g.c_bs + i * g.c_rs;
      if (g.aux != nullptr) std::copy(z.begin(), z.end(), g.aux + off);
      activate_row(g.c + off, z.data(), g.n, g.act);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Blocked GEMM

// Block sizes (elements). KC x NR of B (32 KB for both dtypes at AVX-512's NR) is reused from L1 across an A
// block; MC x KC of A (120 KB / 240 KB) stays in L2 across the B panel.
constexpr int64_t kKc = 256;
constexpr int64_t kNc = 2048;
template <int MR>
constexpr int64_t kMc = 20 * MR;
// Below this many flops per thread, splitting costs more than it saves.
constexpr double kMinFlopsPerThread = 1 << 21;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 64-byte aligned scratch that need not be zeroed.
template <typename T>
struct Scratch {
  explicit Scratch(int64_t n) : storage(new T[n + 64 / sizeof(T)]) {
    const auto addr = reinterpret_cast<uintptr_t>(storage.get());
    data = reinterpret_cast<T*>((addr + 63) / 64 * 64);
  }
  std::unique_ptr<T[]> storage;
  T* data;
};

// Asks for the C tile's cache lines before the micro-kernel runs, so that its store does not wait on them (C's rows
// are far apart: the hardware prefetchers do not see the pattern).
template <typename T>
inline void prefetch_tile(const T* c, int64_t ldc, int64_t rows, int64_t row_bytes) {
#if defined(__GNUC__) || defined(__clang__)
  for (int64_t i = 0; i < rows; ++i) {
    const char* row = reinterpret_cast<const char*>(c + i * ldc);
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + off, 1);
    __builtin_prefetch(row + row_bytes - 1, 1);
  }
#endif
}

// Rows [r0, r1) x columns [c0, c1) of batch entry bi, on the calling thread.
template <typename T, int MR, int NR>
void gemm_block(const GemmArgs<T>& g, MicroKernel<T> kernel, int64_t bi, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                T* buf_a, T* buf_b) {
  const T* A = g.a + bi * g.a_bs;
  const T* B = g.b + bi * g.b_bs;
  T* C = g.c + bi * g.c_bs;
  T* aux = g.aux != nullptr ? g.aux + bi * g.c_bs : nullptr;
  alignas(64) T tile[MR * NR];
  for (int64_t jc = c0; jc < c1; jc += kNc) {
    const int64_t nc = std::min(kNc, c1 - jc);
    for (int64_t pc = 0; pc < g.k; pc += kKc) {
      const int64_t kc = std::min(kKc, g.k - pc);
      const bool first = pc == 0, last = pc + kc == g.k;
      pack_b<T, NR>(B + pc * g.b_rs + jc * g.b_cs, g.b_rs, g.b_cs, kc, nc, buf_b);
      for (int64_t ic = r0; ic < r1; ic += kMc<MR>) {
        const int64_t mc = std::min(kMc<MR>, r1 - ic);
        pack_a<T, MR>(A + ic * g.a_rs + pc * g.a_cs, g.a_rs, g.a_cs, mc, kc, buf_a);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = std::min<int64_t>(NR, nc - jr), j = jc + jr;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = std::min<int64_t>(MR, mc - ir), i = ic + ir;
            prefetch_tile(C + i * g.c_rs + j, g.c_rs, mr, nr * static_cast<int64_t>(sizeof(T)));
            kernel(kc, buf_a + ir * kc, buf_b + jr * kc, tile);
            store_tile<T, MR, NR>(tile, mr, nr, first, last, C + i * g.c_rs + j, g.c_rs,
                                  aux != nullptr ? aux + i * g.c_rs + j : nullptr,
                                  g.bias != nullptr ? g.bias + j : nullptr, g.act);
          }
        }
      }
    }
  }
}

// Splits each matrix into gr x gc blocks (gr * gc == per) with the least repacking (A is packed once per column
// block, B once per row block), within the number of micro-panels.
void choose_grid(int64_t per, int64_t m, int64_t n, int64_t row_panels, int64_t col_panels, int64_t& gr, int64_t& gc) {
  gr = gc = 1;
  for (; per > 1; --per) {
    double best = -1;
    for (int64_t r = 1; r <= per; ++r) {
      if (per % r != 0 || r > row_panels || per / r > col_panels) continue;
      const double cost = static_cast<double>(r) * n + static_cast<double>(per / r) * m;
      if (best < 0 || cost < best) {
        best = cost;
        gr = r;
        gc = per / r;
      }
    }
    if (best >= 0) return;
  }
}

template <typename T, int MR, int NR>
void gemm_blocked(const GemmArgs<T>& g, MicroKernel<T> kernel) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0) return store_empty_product(g);
  const double flops = 2.0 * g.m * g.n * g.k * g.batch;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t want = std::max<int64_t>(1, std::min<double>(threads, flops / kMinFlopsPerThread));
  const int64_t row_panels = (g.m + MR - 1) / MR, col_panels = (g.n + NR - 1) / NR;
  int64_t gr = 1, gc = 1;
  if (want > g.batch) choose_grid((want + g.batch - 1) / g.batch, g.m, g.n, row_panels, col_panels, gr, gc);
  const int64_t blocks = gr * gc, tasks = g.batch * blocks;
  const int64_t a_size = std::min(kMc<MR>, round_up(g.m, MR)) * std::min(kKc, g.k);
  const int64_t b_size = std::min(kNc, round_up(g.n, NR)) * std::min(kKc, g.k);

  auto run = [&](int64_t begin, int64_t end) {
    Scratch<T> buf_a(a_size), buf_b(b_size);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bi = t / blocks, ri = (t % blocks) / gc, ci = t % gc;
      const int64_t r0 = std::min(g.m, row_panels * ri / gr * MR), r1 = std::min(g.m, row_panels * (ri + 1) / gr * MR);
      const int64_t c0 = std::min(g.n, col_panels * ci / gc * NR), c1 = std::min(g.n, col_panels * (ci + 1) / gc * NR);
      if (r0 < r1 && c0 < c1) gemm_block<T, MR, NR>(g, kernel, bi, r0, r1, c0, c1, buf_a.data, buf_b.data);
    }
  };
  if (want == 1 || tasks == 1) {
    run(0, tasks);
  } else {
    at::parallel_for(0, tasks, (tasks + want - 1) / want, run);
  }
}

}  // namespace

// The CPU GEMM on the engine's arguments (declared in csrc/matmul.h, used by csrc/conv2d_cpu.cpp as well).
void gemm_cpu(const cuda_ops::MatmulArgs<float>& g) {
  switch (gemm_isa()) {
#if TORCHEXT_GEMM_X86
    case CpuIsa::avx512:
      return gemm_blocked<float, 6, 32>(g, &micro_avx512_f32);
    case CpuIsa::avx2:
      return gemm_blocked<float, 6, 16>(g, &micro_avx2_f32);
#endif
    default:
      return gemm_blocked<float, 4, 8>(g, &micro_generic_f32);
  }
}

void gemm_cpu(const cuda_ops::MatmulArgs<double>& g) {
  switch (gemm_isa()) {
#if TORCHEXT_GEMM_X86
    case CpuIsa::avx512:
      return gemm_blocked<double, 6, 16>(g, &micro_avx512_f64);
    case CpuIsa::avx2:
      return gemm_blocked<double, 6, 8>(g, &micro_avx2_f64);
#endif
    default:
      return gemm_blocked<double, 4, 4>(g, &micro_generic_f64);
  }
}

namespace {

// Runs a plan (csrc/matmul.h): c = act(a @ b + bias), with z stored to aux when given. c and aux are contiguous
// with the plan's output layout.
template <typename T>
void run_plan(const MatmulPlan& plan, const at::Tensor& a, const at::Tensor& b, at::Tensor& c, const at::Tensor& bias,
              MatmulActivation act, at::Tensor* aux) {
  if (plan.empty()) return;
  GemmArgs<T> g;
  g.m = plan.m;
  g.n = plan.n;
  g.k = plan.k;
  g.batch = plan.batch;
  g.a_rs = plan.a_rs;
  g.a_cs = plan.a_cs;
  g.a_bs = plan.a_bs;
  g.b_rs = plan.b_rs;
  g.b_cs = plan.b_cs;
  g.b_bs = plan.b_bs;
  g.c_rs = plan.c_rs;
  g.c_bs = plan.c_bs;
  g.bias = bias.defined() ? bias.const_data_ptr<T>() : nullptr;
  g.act = act;
  const T* a0 = a.const_data_ptr<T>();
  const T* b0 = b.const_data_ptr<T>();
  T* c0 = c.mutable_data_ptr<T>();
  T* aux0 = aux != nullptr ? aux->mutable_data_ptr<T>() : nullptr;
  for (int64_t l = 0; l < plan.loops(); ++l) {
    int64_t oa, ob, oc;
    plan.offsets(l, oa, ob, oc);
    g.a = a0 + oa;
    g.b = b0 + ob;
    g.c = c0 + oc;
    g.aux = aux0 != nullptr ? aux0 + oc : nullptr;
    gemm_cpu(g);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Ops

// The CPU runs one kernel, "cpu"; the CUDA ladder's names are refused with a pointer to the device they need.
void check_cpu_kernel(std::string_view op, const std::optional<c10::string_view>& kernel) {
  if (!kernel.has_value() || *kernel == "cpu") return;
  const std::string_view name(kernel->data(), kernel->size());
  for (const char* cuda_name : cuda_ops::kMatmulKernelNames) {
    TORCH_CHECK_VALUE(name != cuda_name, op, ": kernel '", name,
                      "' runs on CUDA tensors; CPU tensors take kernel=None or 'cpu'");
  }
  TORCH_CHECK_VALUE(false, op, ": unknown kernel '", name, "'; valid names are 'cpu' (CPU tensors) and ",
                    cuda_matmul_kernel_list(), " (CUDA tensors)");
}

at::Tensor matmul_cpu(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> kernel) {
  constexpr const char* op = "torchext::matmul";
  check_matmul_args(op, a, b);
  check_cpu_kernel(op, kernel);
  const MatmulPlan plan = plan_matmul(op, a, b);
  at::Tensor c = at::empty(plan.out_shape, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "torchext_matmul_cpu",
                             [&] { run_plan<scalar_t>(plan, a, b, c, at::Tensor(), MatmulActivation::none, nullptr); });
  return c;
}

std::string matmul_kernel_cpu(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> kernel) {
  constexpr const char* op = "torchext::matmul_kernel";
  check_matmul_args(op, a, b);
  check_cpu_kernel(op, kernel);
  return "cpu";
}

std::tuple<at::Tensor, at::Tensor> linear_cpu(const at::Tensor& input, const at::Tensor& weight,
                                              const std::optional<at::Tensor>& bias, c10::string_view activation) {
  constexpr const char* op = "torchext::linear";
  check_linear_args(op, input, weight, bias);
  const MatmulActivation act = parse_activation(op, activation);
  // (*, K) @ weight.t(): the transpose is a view, read through its strides.
  const at::Tensor x = input.dim() == 1 ? input.unsqueeze(0) : input;
  const at::Tensor wt = weight.t();
  const MatmulPlan plan = plan_matmul(op, x, wt);
  const std::vector<int64_t> shape = linear_out_shape(input, weight);
  at::Tensor out = at::empty(shape, input.options());
  at::Tensor saved =
      activation_saves_preactivation(act) ? at::empty(shape, input.options()) : at::empty({0}, input.options());
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "torchext_linear_cpu", [&] {
    run_plan<scalar_t>(plan, x, wt, out, b, act, activation_saves_preactivation(act) ? &saved : nullptr);
  });
  return {out, saved};
}

template <typename T, typename F>
void map_grad_row(T* gz, const T* g, const T* s, int64_t n, F f) {
  for (int64_t j = 0; j < n; ++j) gz[j] = f(g[j], s[j]);
}

// gz = g * act'(s) row by row (when act != none) and gb = column sums of gz (when gb is set), all (m, n)
// contiguous. The sums run over fixed chunks of rows in float64 and add the chunks in order: deterministic.
template <typename T>
void linear_backward_epilogue_cpu(const T* g, const T* s, T* gz, T* gb, int64_t m, int64_t n, MatmulActivation act) {
  constexpr int64_t kRows = 64;
  const int64_t chunks = (m + kRows - 1) / kRows;
  std::vector<double> partial(gb != nullptr ? chunks * n : 0);
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, kRows * n));
  at::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      double* sums = gb != nullptr ? partial.data() + ch * n : nullptr;
      if (sums != nullptr) std::fill(sums, sums + n, 0.0);
      for (int64_t i = ch * kRows; i < std::min(m, (ch + 1) * kRows); ++i) {
        const T* gi = g + i * n;
        const T* row = gi;  // grad_z's row: grad_out's own for act == none
        if (act != MatmulActivation::none) {
          const T* si = s + i * n;
          T* gzi = gz + i * n;
          switch (act) {
            case MatmulActivation::relu:
              map_grad_row(gzi, gi, si, n, [](T a, T b) { return math::relu_backward(a, b); });
              break;
            case MatmulActivation::gelu:
              map_grad_row(gzi, gi, si, n, [](T a, T b) { return math::gelu_backward(a, b); });
              break;
            case MatmulActivation::gelu_tanh:
              map_grad_row(gzi, gi, si, n, [](T a, T b) { return math::gelu_tanh_backward(a, b); });
              break;
            default:
              map_grad_row(gzi, gi, si, n, [](T a, T b) { return math::silu_backward(a, b); });
          }
          row = gzi;
        }
        if (sums != nullptr) {
          for (int64_t j = 0; j < n; ++j) sums[j] += static_cast<double>(row[j]);
        }
      }
    }
  });
  if (gb == nullptr) return;
  at::parallel_for(0, n, at::internal::GRAIN_SIZE / std::max<int64_t>(1, chunks), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double total = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) total += partial[ch * n + j];
      gb[j] = static_cast<T>(total);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_backward_cpu(const at::Tensor& grad_out, const at::Tensor& input,
                                                                   const at::Tensor& weight, const at::Tensor& out,
                                                                   const at::Tensor& saved, c10::string_view activation,
                                                                   bool has_bias, std::array<bool, 3> output_mask) {
  constexpr const char* op = "torchext::linear_backward";
  const MatmulActivation act = parse_activation(op, activation);
  check_linear_backward_args(op, grad_out, input, weight, out, saved, act);
  const int64_t N = weight.size(0), K = weight.size(1);
  const bool need_bias = has_bias && output_mask[2];
  // grad_out and what the activation's derivative reads, as (M, N) row-major matrices.
  const int64_t M = c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
  const at::Tensor g = grad_out.contiguous().view({M, N});
  at::Tensor s;
  if (act == MatmulActivation::relu) s = out.contiguous().view({M, N});
  if (activation_saves_preactivation(act)) s = saved.contiguous().view({M, N});
  at::Tensor gz = act == MatmulActivation::none ? g : at::empty({M, N}, g.options());
  at::Tensor gb = need_bias ? at::empty({N}, g.options()) : at::empty({0}, g.options());
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "torchext_linear_backward_cpu", [&] {
    if (act != MatmulActivation::none || need_bias) {
      linear_backward_epilogue_cpu<scalar_t>(g.const_data_ptr<scalar_t>(),
                                             s.defined() ? s.const_data_ptr<scalar_t>() : nullptr,
                                             act == MatmulActivation::none ? nullptr : gz.mutable_data_ptr<scalar_t>(),
                                             need_bias ? gb.mutable_data_ptr<scalar_t>() : nullptr, M, N, act);
    }
  });
  at::Tensor grad_input = at::empty({0}, g.options()), grad_weight = at::empty({0}, g.options());
  if (output_mask[0]) {
    // (M, N) @ (N, K), weight read in place.
    grad_input = at::empty(input.sizes(), g.options());
    const MatmulPlan plan = plan_matmul(op, gz, weight);
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "torchext_linear_backward_cpu", [&] {
      run_plan<scalar_t>(plan, gz, weight, grad_input, at::Tensor(), MatmulActivation::none, nullptr);
    });
  }
  if (output_mask[1]) {
    // (N, M) @ (M, K): grad_z read transposed through its strides; input as (M, K), a view where its strides
    // allow one.
    grad_weight = at::empty({N, K}, g.options());
    const at::Tensor gzt = gz.t(), x = input.reshape({M, K});
    const MatmulPlan plan = plan_matmul(op, gzt, x);
    AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "torchext_linear_backward_cpu", [&] {
      run_plan<scalar_t>(plan, gzt, x, grad_weight, at::Tensor(), MatmulActivation::none, nullptr);
    });
  }
  return {grad_input, grad_weight, gb};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("matmul", &matmul_cpu);
  m.impl("matmul_kernel", &matmul_kernel_cpu);
  m.impl("linear", &linear_cpu);
  m.impl("linear_backward", &linear_backward_cpu);
}

}  // namespace torchext
