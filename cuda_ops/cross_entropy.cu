// Cross entropy over class indices, fused: log-softmax, NLL, class weights, ignore_index and label smoothing in
// one pass over the logits forward and one pass backward.
//
// Shapes: logits x is (N, C) row-major, target t is (N,) int64, weight w is (C,) (w = 1 when absent), eps is the
// label smoothing. For a row i that is not ignored, with lse_i = log sum_c exp(x_ic) and W = sum_c w_c:
//   loss_i = (1 - eps) w_t (lse_i - x_it) + eps/C (W lse_i - sum_c w_c x_ic)
//   mean   = sum_i loss_i / sum_i w_{t_i}         (the sum over non-ignored rows: 'total_weight'; NaN where it is 0)
//   dloss_i/dx_ij = a_i softmax_ij - (1 - eps) w_t [j == t] - eps/C w_j,   a_i = (1 - eps) w_t + eps/C W
// which is PyTorch's cross_entropy (log_softmax + nll_loss + its label-smoothing term) written out.
//
// Kernels:
//   cross_entropy_forward_kernel        G threads per row (G = 1, 4 or 32, by C) accumulate an online
//                                       log-sum-exp (running max and scaled sum, one exp per element, one
//                                       rescale per chunk of four vectors) and sum_c w_c x_c in a single read
//                                       of the row; past 2048 classes
//   cross_entropy_forward_block_kernel  one block of 128 threads per row does the same with a block reduction.
//   Both write loss_i (reduction 'none') and lse_i, and leave per-block partial sums of loss, weight and bad
//   targets; cross_entropy_finalize_kernel (one block) adds the partials in a fixed order, so 'mean' and 'sum'
//   are deterministic, and writes the reduced loss, total_weight and the bad-target count.
//   cross_entropy_backward_kernel       elementwise over the N*C gradient with 16-byte vectors: softmax is
//                                       recomputed as exp(x - lse_i) from the saved lse, so backward reads x
//                                       once and writes the gradient once.
// Bytes moved, for N*C logits of s bytes: forward N*C*s + 8N (targets) + 4N (lse); backward 2*N*C*s + 12N.
// PyTorch's log_softmax + nll_loss forward and backward move about 6*N*C*s, and reduce 'mean' in one block.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "cross_entropy.cuh"

namespace torchext::cuda_ops {
namespace {

__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }

// Running log-sum-exp: max m and s = sum exp(x - m). -inf entries add nothing; NaN entries make s NaN.
template <typename A>
struct OnlineLse {
  A m = -INFINITY;
  A s = 0;

  // Folds in a chunk of values whose max is chunk_max: one rescale of s per chunk, then independent exps.
  __device__ __forceinline__ void rescale_to(A chunk_max) {
    const A nm = m > chunk_max ? m : chunk_max;
    s = (nm == A(-INFINITY)) ? s : s * fast_exp(m - nm);
    m = nm;
  }
  __device__ __forceinline__ void add_rescaled(A x) {
    if (m != A(-INFINITY)) s += fast_exp(x - m);
    else if (x != x) s = x;  // NaN in a row of -inf so far
  }
  __device__ __forceinline__ void merge(A om, A os) {
    const A nm = m > om ? m : om;
    if (nm == A(-INFINITY)) {
      s += os;
      return;
    }
    s = s * fast_exp(m - nm) + os * fast_exp(om - nm);
    m = nm;
  }
  __device__ __forceinline__ A lse() const { return m + log_(s); }
};

// Per-row statistics a thread (or group of threads) gathers in one read: the online lse and sum_c w_c x_c.
template <typename A>
struct RowStats {
  OnlineLse<A> lse;
  A wx = 0;
};

constexpr int kChunk = 4;  // vectors a thread loads before using any of them

template <typename T>
constexpr bool kHalfType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// Largest element of a vector in the computation type (NaN ignored, like fmaxf). Half types compare raw pairs,
// one packed max per two elements, and convert only the result.
template <typename A, typename T, int VEC>
__device__ __forceinline__ A vec_max(const Vec<T, VEC>& q) {
  if constexpr (kHalfType<T> && VEC % 2 == 0) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* p = reinterpret_cast<const T2*>(q.v);
    T2 m = p[0];
#pragma unroll
    for (int k = 1; k < VEC / 2; ++k) m = __hmax2(m, p[k]);
    return max(to_acc(m.x), to_acc(m.y));
  } else {
    A m = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) m = max(m, to_acc(q.v[k]));
    return m;
  }
}

// 2^x in one instruction (the hardware approximation, about 2 ulp).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Reads this thread's vectors of one row: begin, begin + step, ... < nvec, kChunk at a time while whole chunks
// remain (no bounds checks inside), then one at a time. The exps of half-type rows are ex2(x log2e - m log2e), one
// FMA and one ex2 each: converting 16-bit values makes those rows instruction-bound, not memory-bound (Nsight
// Compute on an H200, bfloat16 at 32768 classes: SM 71% busy, DRAM 60%).
template <typename T, typename A, int VEC>
__device__ __forceinline__ void accumulate_row(const T* __restrict__ row, const T* __restrict__ weight, int64_t begin,
                                               int64_t nvec, int64_t step, bool smoothing, RowStats<A>& st) {
  using V = Vec<T, VEC>;
  const V* rv = reinterpret_cast<const V*>(row);
  auto fold = [&](const V* q, int count, int64_t v0) {
    A chunk_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < count; ++u) chunk_max = max(chunk_max, vec_max<A>(q[u]));
    st.lse.rescale_to(chunk_max);
    if constexpr (kHalfType<T>) {
      if (st.lse.m != A(-INFINITY) && !smoothing) {
        constexpr float kLog2e = 1.4426950408889634f;
        const float neg_ml = -st.lse.m * kLog2e;
        float s = 0;
#pragma unroll
        for (int u = 0; u < count; ++u) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) s += ex2_approx(fmaf(to_acc(q[u].v[k]), kLog2e, neg_ml));
        }
        st.lse.s += s;
        return;
      }
    }
#pragma unroll
    for (int u = 0; u < count; ++u) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A x = to_acc(q[u].v[k]);
        st.lse.add_rescaled(x);
        if (smoothing) st.wx += (weight ? to_acc(weight[(v0 + u * step) * VEC + k]) : A(1)) * x;
      }
    }
  };
  int64_t v0 = begin;
  for (; v0 + (kChunk - 1) * step < nvec; v0 += kChunk * step) {
    V q[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) q[u] = rv[v0 + u * step];
    fold(q, kChunk, v0);
  }
  for (; v0 < nvec; v0 += step) {
    const V q = rv[v0];
    fold(&q, 1, v0);
  }
}

// The loss of one row from its statistics; also reports its weight (0 when ignored) and whether it was bad.
template <typename T, typename A>
__device__ __forceinline__ A row_loss(const CrossEntropyArgs<T, A>& a, int64_t i, const RowStats<A>& st, A& lse_out,
                                      A& weight_out, A& bad_out) {
  const int64_t t = a.target[i];
  const A lse = st.lse.lse();
  lse_out = lse;
  weight_out = 0;
  bad_out = 0;
  if (t == a.ignore_index) return A(0);
  if (t < 0 || t >= a.classes) {
    bad_out = 1;
    return A(NAN);
  }
  const A eps = a.label_smoothing;
  const A wt = a.weight ? to_acc(a.weight[t]) : A(1);
  const A xt = to_acc(a.logits[i * a.classes + t]);
  A loss = (A(1) - eps) * wt * (lse - xt);
  if (eps > A(0)) {
    const A wsum = a.weight ? *a.weight_sum : static_cast<A>(a.classes);
    loss += eps / static_cast<A>(a.classes) * (wsum * lse - st.wx);
  }
  weight_out = wt;
  return loss;
}

// Finishes row i: writes its lse (and its loss under 'none') and adds it to this thread's partial sums.
template <typename T, typename A>
__device__ __forceinline__ void finish_row(const CrossEntropyArgs<T, A>& a, int64_t i, const RowStats<A>& st, T* loss,
                                           A* lse_out, A& loss_sum, A& weight_sum, A& bad_sum) {
  A lse, w, bad;
  const A li = row_loss(a, i, st, lse, w, bad);
  lse_out[i] = lse;
  if (a.reduction == LossReduction::None) loss[i] = from_acc<T>(li);
  loss_sum += li;
  weight_sum += w;
  bad_sum += bad;
}

template <typename T, typename A>
__device__ __forceinline__ void write_partials(A loss_sum, A weight_sum, A bad_sum, A* partials) {
  __shared__ A scratch[32];
  loss_sum = block_sum(loss_sum, scratch);
  weight_sum = block_sum(weight_sum, scratch);
  bad_sum = block_sum(bad_sum, scratch);
  if (threadIdx.x == 0) {
    partials[3 * blockIdx.x + 0] = loss_sum;
    partials[3 * blockIdx.x + 1] = weight_sum;
    partials[3 * blockIdx.x + 2] = bad_sum;
  }
}

constexpr int kForwardThreads = 256;
constexpr int kBlockRowThreads = 128;

// G consecutive lanes of a warp share one row. All lanes of a warp run the same number of iterations (so the
// shuffles see every lane); lanes whose row is past the end just carry empty statistics.
template <typename T, typename A, int G, int VEC>
__global__ void __launch_bounds__(kForwardThreads)
    cross_entropy_forward_kernel(CrossEntropyArgs<T, A> a, T* __restrict__ loss, A* __restrict__ lse_out,
                                 A* __restrict__ partials) {
  constexpr int kRowsPerWarp = 32 / G;
  const int lane = threadIdx.x % 32, sub = lane % G;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t nvec = a.classes / VEC;
  const bool smoothing = a.label_smoothing > A(0);
  A loss_sum = 0, weight_sum = 0, bad_sum = 0;
  for (int64_t r0 = warp * kRowsPerWarp; r0 < a.rows; r0 += nwarps * kRowsPerWarp) {
    const int64_t i = r0 + lane / G;
    RowStats<A> st;
    if (i < a.rows) accumulate_row<T, A, VEC>(a.logits + i * a.classes, a.weight, sub, nvec, G, smoothing, st);
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) {
      const A om = __shfl_xor_sync(0xffffffffu, st.lse.m, o, G);
      const A os = __shfl_xor_sync(0xffffffffu, st.lse.s, o, G);
      st.lse.merge(om, os);
      st.wx += __shfl_xor_sync(0xffffffffu, st.wx, o, G);
    }
    if (sub == 0 && i < a.rows) finish_row(a, i, st, loss, lse_out, loss_sum, weight_sum, bad_sum);
  }
  write_partials<T, A>(loss_sum, weight_sum, bad_sum, partials);
}

// One block per row, for rows too long for a warp.
template <typename T, typename A, int VEC>
__global__ void __launch_bounds__(kBlockRowThreads)
    cross_entropy_forward_block_kernel(CrossEntropyArgs<T, A> a, T* __restrict__ loss, A* __restrict__ lse_out,
                                       A* __restrict__ partials) {
  __shared__ A sm[32], ss[32], sw[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const int64_t nvec = a.classes / VEC;
  const bool smoothing = a.label_smoothing > A(0);
  A loss_sum = 0, weight_sum = 0, bad_sum = 0;
  for (int64_t i = blockIdx.x; i < a.rows; i += gridDim.x) {
    RowStats<A> st;
    accumulate_row<T, A, VEC>(a.logits + i * a.classes, a.weight, threadIdx.x, nvec, blockDim.x, smoothing, st);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const A om = __shfl_xor_sync(0xffffffffu, st.lse.m, o);
      const A os = __shfl_xor_sync(0xffffffffu, st.lse.s, o);
      st.lse.merge(om, os);
      st.wx += __shfl_xor_sync(0xffffffffu, st.wx, o);
    }
    __syncthreads();  // the previous row's readers of sm/ss/sw are done
    if (lane == 0) {
      sm[warp] = st.lse.m;
      ss[warp] = st.lse.s;
      sw[warp] = st.wx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      RowStats<A> row;
      for (int k = 0; k < nwarps; ++k) {
        row.lse.merge(sm[k], ss[k]);
        row.wx += sw[k];
      }
      finish_row(a, i, row, loss, lse_out, loss_sum, weight_sum, bad_sum);
    }
  }
  write_partials<T, A>(loss_sum, weight_sum, bad_sum, partials);
}

template <typename T, typename A>
__global__ void cross_entropy_finalize_kernel(const A* __restrict__ partials, int nblocks, LossReduction reduction,
                                              T* __restrict__ loss, A* __restrict__ total_weight,
                                              int* __restrict__ bad_targets) {
  __shared__ A scratch[32];
  A l = 0, w = 0, b = 0;
  for (int k = threadIdx.x; k < nblocks; k += blockDim.x) {
    l += partials[3 * k];
    w += partials[3 * k + 1];
    b += partials[3 * k + 2];
  }
  l = block_sum(l, scratch);
  w = block_sum(w, scratch);
  b = block_sum(b, scratch);
  if (threadIdx.x == 0) {
    *total_weight = w;
    *bad_targets = static_cast<int>(b);
    if (reduction == LossReduction::Mean) *loss = from_acc<T>(weighted_mean(l, w));
    if (reduction == LossReduction::Sum) *loss = from_acc<T>(l);
  }
}

// What backward needs of one row: grad_ij = scale * (coef * exp(x_ij - lse_i) - hot * [j == t] - eps/C w_j).
template <typename T, typename A>
struct BackwardRow {
  A scale, coef, hot, lse;
  int64_t t;
};

// Constants shared by every row of a backward launch.
template <typename T, typename A>
struct BackwardContext {
  CrossEntropyArgs<T, A> a;
  const T* grad_loss;
  const A* lse;
  A eps, eps_c, wsum, reduced_scale;

  __device__ BackwardContext(const CrossEntropyArgs<T, A>& args, const T* g, const A* l, const A* total_weight)
      : a(args), grad_loss(g), lse(l) {
    eps = a.label_smoothing;
    eps_c = eps / static_cast<A>(a.classes);
    wsum = (a.weight && eps > A(0)) ? *a.weight_sum : static_cast<A>(a.classes);
    reduced_scale = 0;
    if (a.reduction == LossReduction::Mean) reduced_scale = weighted_mean(to_acc(grad_loss[0]), *total_weight);
    if (a.reduction == LossReduction::Sum) reduced_scale = to_acc(grad_loss[0]);
  }

  __device__ __forceinline__ BackwardRow<T, A> row(int64_t r) const {
    BackwardRow<T, A> row;
    row.t = a.target[r];
    row.lse = lse[r];
    const bool ignored = row.t == a.ignore_index;
    const bool bad = !ignored && (row.t < 0 || row.t >= a.classes);
    const A wt = (ignored || bad || !a.weight) ? A(1) : to_acc(a.weight[row.t]);
    row.scale = ignored ? A(0)
                : bad   ? A(NAN)
                        : (a.reduction == LossReduction::None ? to_acc(grad_loss[r]) : reduced_scale);
    row.coef = (A(1) - eps) * wt + eps_c * wsum;
    row.hot = (A(1) - eps) * wt;
    return row;
  }

  __device__ __forceinline__ A grad(const BackwardRow<T, A>& row, int64_t c, A x) const {
    A g = row.coef * fast_exp(x - row.lse);
    if (c == row.t) g -= row.hot;
    if (eps > A(0)) g -= eps_c * (a.weight ? to_acc(a.weight[c]) : A(1));
    return row.scale * g;
  }
};

// Backward, elementwise over the flat N*C gradient, for short rows (a vector may span rows). Row constants are
// refreshed when the column index wraps, so a thread divides once per vector, not once per element.
template <typename T, typename A, int VEC, typename Index>
__global__ void __launch_bounds__(256)
    cross_entropy_backward_kernel(CrossEntropyArgs<T, A> a, const T* __restrict__ grad_loss,
                                  const A* __restrict__ lse, const A* __restrict__ total_weight,
                                  T* __restrict__ grad) {
  using V = Vec<T, VEC>;
  const BackwardContext<T, A> ctx(a, grad_loss, lse, total_weight);
  const Index C = static_cast<Index>(a.classes);
  const Index n = static_cast<Index>(a.rows) * C;
  const Index nvec = n / VEC;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index v0 = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; v0 < nvec; v0 += stride * kChunk) {
    V x[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (v0 + u * stride < nvec) x[u] = reinterpret_cast<const V*>(a.logits)[v0 + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const Index v = v0 + u * stride;
      if (v >= nvec) break;
      Index r = (v * VEC) / C;
      Index c = v * VEC - r * C;
      BackwardRow<T, A> row = ctx.row(r);
      V out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if (k > 0 && c == C) {
          c = 0;
          row = ctx.row(++r);
        }
        out.v[k] = from_acc<T>(ctx.grad(row, c, to_acc(x[u].v[k])));
        ++c;
      }
      reinterpret_cast<V*>(grad)[v] = out;
    }
  }
  for (Index e = nvec * VEC + static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const Index r = e / C;
    grad[e] = from_acc<T>(ctx.grad(ctx.row(r), e - r * C, to_acc(a.logits[e])));
  }
}

// Backward for long rows whose length is a multiple of VEC (rows start aligned): a block walks one row at a time,
// its threads striding over the row's vectors, kChunk in flight; no index division, row constants loaded once.
template <typename T, typename A, int VEC>
__global__ void __launch_bounds__(256)
    cross_entropy_backward_rows_kernel(CrossEntropyArgs<T, A> a, const T* __restrict__ grad_loss,
                                       const A* __restrict__ lse, const A* __restrict__ total_weight,
                                       T* __restrict__ grad) {
  using V = Vec<T, VEC>;
  const BackwardContext<T, A> ctx(a, grad_loss, lse, total_weight);
  const int64_t nvec = a.classes / VEC;
  const int64_t step = blockDim.x;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const BackwardRow<T, A> row = ctx.row(r);
    const V* xr = reinterpret_cast<const V*>(a.logits + r * a.classes);
    V* gr = reinterpret_cast<V*>(grad + r * a.classes);
    auto emit = [&](const V& x, int64_t v) {
      V out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_acc<T>(ctx.grad(row, v * VEC + k, to_acc(x.v[k])));
      gr[v] = out;
    };
    int64_t v0 = threadIdx.x;
    for (; v0 + (kChunk - 1) * step < nvec; v0 += kChunk * step) {
      V x[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) x[u] = xr[v0 + u * step];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) emit(x[u], v0 + u * step);
    }
    for (; v0 < nvec; v0 += step) emit(xr[v0], v0);
  }
}

// Widest vector (in elements) that divides C and that the logits pointer is aligned for.
template <typename T>
int forward_vec(const T* logits, int64_t classes) {
  for (int v = kVec16<T>; v > 1; v /= 2) {
    if (classes % v == 0 && aligned_to(logits, v * sizeof(T))) return v;
  }
  return 1;
}

// Threads that share a row: 1, 4 or 32 (a warp) by the row's length, so that each thread reads a handful of
// vectors or more; past 2048 classes a block of 128 threads per row. Long rows in warps would leave a partial last
// round of rows (8192 rows of 32768 classes over ~3200 resident warps: 2.6 rounds, measured on an H200 at 64% of
// read bandwidth in bfloat16); 128-thread blocks are scheduled row by row and their reduction is 4 warps deep.
int threads_per_row(int64_t classes) {
  if (classes <= 16) return 1;
  if (classes <= 128) return 4;
  if (classes <= 2048) return 32;
  return 0;  // a whole block
}

// The most blocks the forward may launch, which sizes the partial-sum workspace: a group kernel runs what fits on
// the GPU at once (at most 2048 / 256 blocks per multiprocessor); the block-per-row kernel runs many short waves
// so that the last one is a small part of the whole.
unsigned forward_grid_cap(int64_t rows, int64_t classes) {
  const int g = threads_per_row(classes);
  if (g == 0) return grid_for(rows, 1, 32);
  return grid_for(rows, kForwardThreads / g, 2048 / kForwardThreads);
}

template <auto Kernel>
unsigned group_grid(int64_t rows, int g, unsigned cap) {
  const unsigned resident = resident_grid<Kernel>(kForwardThreads, rows, kForwardThreads / g);
  return resident < cap ? resident : cap;
}

// Launches the forward for vector width VEC; returns the grid it used.
template <typename T, typename A, int VEC>
unsigned launch_forward_vec(const CrossEntropyArgs<T, A>& a, T* loss, A* lse, A* partials, cudaStream_t stream) {
  const unsigned cap = forward_grid_cap(a.rows, a.classes);
  unsigned grid = cap;
  switch (threads_per_row(a.classes)) {
    case 1:
      grid = group_grid<cross_entropy_forward_kernel<T, A, 1, VEC>>(a.rows, 1, cap);
      cross_entropy_forward_kernel<T, A, 1, VEC><<<grid, kForwardThreads, 0, stream>>>(a, loss, lse, partials);
      break;
    case 4:
      grid = group_grid<cross_entropy_forward_kernel<T, A, 4, VEC>>(a.rows, 4, cap);
      cross_entropy_forward_kernel<T, A, 4, VEC><<<grid, kForwardThreads, 0, stream>>>(a, loss, lse, partials);
      break;
    case 32:
      grid = group_grid<cross_entropy_forward_kernel<T, A, 32, VEC>>(a.rows, 32, cap);
      cross_entropy_forward_kernel<T, A, 32, VEC><<<grid, kForwardThreads, 0, stream>>>(a, loss, lse, partials);
      break;
    default:
      cross_entropy_forward_block_kernel<T, A, VEC><<<grid, kBlockRowThreads, 0, stream>>>(a, loss, lse, partials);
  }
  return grid;
}

}  // namespace

int64_t cross_entropy_workspace_size(int64_t rows, int64_t classes) {
  return 3 * static_cast<int64_t>(forward_grid_cap(rows, classes));
}

template <typename T, typename A>
cudaError_t cross_entropy_forward(const CrossEntropyArgs<T, A>& a, T* loss, A* lse, A* total_weight,
                                  int* bad_targets, A* workspace, cudaStream_t stream) {
  unsigned grid = 0;
  if (a.rows > 0) {
    const int vec = forward_vec(a.logits, a.classes);
    if (vec == kVec16<T>) {
      grid = launch_forward_vec<T, A, kVec16<T>>(a, loss, lse, workspace, stream);
    } else if (vec >= 2) {  // e.g. 10 float32 classes: 8-byte pairs
      grid = launch_forward_vec<T, A, 2>(a, loss, lse, workspace, stream);
    } else {
      grid = launch_forward_vec<T, A, 1>(a, loss, lse, workspace, stream);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int nblocks = static_cast<int>(grid);
  cross_entropy_finalize_kernel<T, A><<<1, 512, 0, stream>>>(workspace, nblocks, a.reduction, loss, total_weight,
                                                              bad_targets);
  return cudaGetLastError();
}

template <typename T, typename A>
cudaError_t cross_entropy_backward(const CrossEntropyArgs<T, A>& a, const T* grad_loss, const A* lse,
                                   const A* total_weight, T* grad_logits, cudaStream_t stream) {
  const int64_t n = a.rows * a.classes;
  if (n == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec = aligned_to(a.logits, 16) && aligned_to(grad_logits, 16);
  const bool small = n < (int64_t{1} << 31);
  if (vec && a.classes % V == 0 && a.classes >= 1024) {
    const unsigned grid = grid_for(a.rows, 1, 32);  // many short waves of rows
    cross_entropy_backward_rows_kernel<T, A, V>
        <<<grid, 256, 0, stream>>>(a, grad_loss, lse, total_weight, grad_logits);
    return cudaGetLastError();
  }
  const int64_t per_block = 256 * kChunk * (vec ? V : 1);
  if (vec && small) {
    cross_entropy_backward_kernel<T, A, V, uint32_t>
        <<<resident_grid<cross_entropy_backward_kernel<T, A, V, uint32_t>>(256, n, per_block), 256, 0, stream>>>(
            a, grad_loss, lse, total_weight, grad_logits);
  } else if (vec) {
    cross_entropy_backward_kernel<T, A, V, int64_t>
        <<<resident_grid<cross_entropy_backward_kernel<T, A, V, int64_t>>(256, n, per_block), 256, 0, stream>>>(
            a, grad_loss, lse, total_weight, grad_logits);
  } else if (small) {
    cross_entropy_backward_kernel<T, A, 1, uint32_t>
        <<<resident_grid<cross_entropy_backward_kernel<T, A, 1, uint32_t>>(256, n, per_block), 256, 0, stream>>>(
            a, grad_loss, lse, total_weight, grad_logits);
  } else {
    cross_entropy_backward_kernel<T, A, 1, int64_t>
        <<<resident_grid<cross_entropy_backward_kernel<T, A, 1, int64_t>>(256, n, per_block), 256, 0, stream>>>(
            a, grad_loss, lse, total_weight, grad_logits);
  }
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_CROSS_ENTROPY(T, A)                                                                \
  template cudaError_t cross_entropy_forward<T, A>(const CrossEntropyArgs<T, A>&, T*, A*, A*, int*, A*,         \
                                                   cudaStream_t);                                               \
  template cudaError_t cross_entropy_backward<T, A>(const CrossEntropyArgs<T, A>&, const T*, const A*, const A*, \
                                                    T*, cudaStream_t);

TORCHEXT_INSTANTIATE_CROSS_ENTROPY(float, float)
TORCHEXT_INSTANTIATE_CROSS_ENTROPY(double, double)
TORCHEXT_INSTANTIATE_CROSS_ENTROPY(__half, float)
TORCHEXT_INSTANTIATE_CROSS_ENTROPY(__nv_bfloat16, float)

}  // namespace torchext::cuda_ops
