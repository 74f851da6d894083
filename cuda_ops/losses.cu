// Loss kernels: mse_loss, binary_cross_entropy_with_logits and multi_margin_loss, forward and backward.
//
// Math (A is the computation type: float for float32/float16/bfloat16, double for float64):
//   mse_loss                          l_i = w_i (x_i - y_i)^2
//                                     dl/dx_i = 2 w_i (x_i - y_i)                (dl/dy_i = -dl/dx_i, in Python)
//                                     (the 2 is folded into the reduction's scale, 2 / n for 'mean', as torch
//                                     does, so that 2 (x_i - y_i) cannot overflow where the gradient does not)
//   binary_cross_entropy_with_logits  lw_i = 1 + (pw_i - 1) y_i
//                                     sp_i = softplus(-x_i) = log1p(e^-|x_i|) + max(-x_i, 0)
//                                     l_i = w_i ((1 - y_i) x_i + lw_i sp_i)
//                                     dl/dx_i = w_i (lw_i sigmoid(x_i) - pw_i y_i)
//                                     dl/dy_i = -w_i x_i, or w_i (pw_i sp_i - softplus(x_i)) with pos_weight
//                                     (torch's forms: both are inf at x_i = -inf, where (pw_i - 1) sp_i - x_i
//                                     would be inf - inf)
//   multi_margin_loss                 l_r = w[t_r] / C  sum_{j != t_r} max(0, margin - x_{r,t_r} + x_{r,j})^p
//                                     dl/dx_{r,j} = w[t_r] / C  p max(0, z_j)^(p-1)  (j != t_r), minus their sum at t_r
// Reductions: none keeps l; sum adds it up; mean divides the sum by n (rows for multi_margin_loss), or by sum(w)
// for a weighted mse_loss (torch.nn.functional.mse_loss's weighted mean).
//
// Shapes: x, y and a full weight are flat arrays of n elements; a broadcast weight / pos_weight is read as
// w[i % period]; multi_margin_loss's x is (rows, cols) row-major, target (rows,), weight (cols,).
//
// Kernels (one version each):
//   loss_map_kernel            out[i] = f(i, x[i], y[i]), grid-stride over n: the 'none' forward and every
//                              elementwise backward; x, y and out move as 16-byte vectors when aligned
//   loss_partial_sum_kernel    per-block sums of f (and optionally of a second term, the weight) in A
//   loss_finalize_kernel       one block adds the partial sums in a fixed order, applies the mean's division
//   multi_margin_loss_forward_kernel / _backward_kernel
//                              one warp per row, the lanes striding over the classes; the forward either writes
//                              each row's loss or feeds per-block partial sums to loss_finalize_kernel
// These kernels are bound by memory traffic (2-4 reads and one write per element): the two full-size streams
// (input and target) and the output move as 16-byte vectors where aligned; weights, a broadcast pos_weight and
// grad_output under 'none' are read by index, and multi_margin_loss's rows by one warp's scalar loads.
#include "common.cuh"
#include "losses.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // partial sums per reduction; the workspace holds two sets of them plus a scalar

template <typename T>
__device__ __forceinline__ acc_t<T> load(const T* p, int64_t i) {
  return to_acc(p[i]);
}

// Operand value at flat index i; 1 where the operand is absent.
template <typename T>
__device__ __forceinline__ acc_t<T> load(LossOperand<T> op, int64_t i) {
  using A = acc_t<T>;
  if (op.data == nullptr) return A(1);
  if (op.period == 1) return to_acc(op.data[0]);
  return to_acc(op.data[i < op.period ? i : i % op.period]);
}

// softplus(-x) = log(1 + e^-x), without overflow for either sign of x.
template <typename A>
__device__ __forceinline__ A softplus_neg(A x) {
  return log1p(exp(-fabs(x))) + max(-x, A(0));
}

template <typename A>
__device__ __forceinline__ A sigmoid(A x) {
  return A(1) / (A(1) + exp(-x));
}

// grad_output at flat index i times `scale`: per element under 'none', else the scalar, divided by *denom when
// given (the weighted mean's sum of weights, computed on the device).
template <typename T>
struct GradOutput {
  using A = acc_t<T>;
  const T* g;
  bool per_element;
  A scale;
  const A* denom;
  __device__ __forceinline__ A operator()(int64_t i) const {
    if (per_element) return scale * to_acc(g[i]);
    const A v = to_acc(g[0]) * scale;
    return denom != nullptr ? v / *denom : v;
  }
};

// The second sum's term: none (NoTerm) or the weight (a weighted mean divides by its sum).
struct NoTerm {
  static constexpr bool kActive = false;
};

// Also usable as a summed term on its own (f in loss_partial_sum_kernel): its one stream is the weight.
template <typename T>
struct WeightTerm {
  static constexpr bool kActive = true;
  const T* a;  // the weight
  const T* b = nullptr;
  __device__ __forceinline__ acc_t<T> operator()(int64_t i) const { return load(a, i); }
  __device__ __forceinline__ acc_t<T> operator()(int64_t, acc_t<T> wi, acc_t<T>) const { return wi; }
};

// The functors f below read two full-size streams, f.a and f.b (f.b may be null), which the kernels load for
// them, 16 bytes at a time where every stream and the output are aligned, and pass as f(i, a[i], b[i]); anything
// else (a weight, a broadcast pos_weight, grad_output) the functor loads by index.
template <typename T, int VEC>
struct StreamValues {
  acc_t<T> a[VEC], b[VEC];
};

template <typename T, int VEC, typename F>
__device__ __forceinline__ StreamValues<T, VEC> load_streams(const F& f, int64_t v) {
  StreamValues<T, VEC> s;
  const Vec<T, VEC> va = reinterpret_cast<const Vec<T, VEC>*>(f.a)[v];
#pragma unroll
  for (int k = 0; k < VEC; ++k) s.a[k] = to_acc(va.v[k]);
  if (f.b != nullptr) {
    const Vec<T, VEC> vb = reinterpret_cast<const Vec<T, VEC>*>(f.b)[v];
#pragma unroll
    for (int k = 0; k < VEC; ++k) s.b[k] = to_acc(vb.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) s.b[k] = acc_t<T>(0);
  }
  return s;
}

template <typename T, typename F>
__device__ __forceinline__ acc_t<T> apply_at(const F& f, int64_t i) {
  return f(i, load(f.a, i), f.b != nullptr ? load(f.b, i) : acc_t<T>(0));
}

template <typename T, int VEC, typename F>
__global__ void __launch_bounds__(kThreads) loss_map_kernel(T* __restrict__ out, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / VEC;
  for (int64_t v = tid; v < nvec; v += stride) {
    const StreamValues<T, VEC> s = load_streams<T, VEC>(f, v);
    Vec<T, VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) o.v[k] = from_acc<T>(f(v * VEC + k, s.a[k], s.b[k]));
    reinterpret_cast<Vec<T, VEC>*>(out)[v] = o;
  }
  for (int64_t i = nvec * VEC + tid; i < n; i += stride) out[i] = from_acc<T>(apply_at<T>(f, i));
}

// partials[b] = sum of f over block b's share; partials[kMaxBlocks + b] = sum of g(i) when G is active.
template <typename A, typename T, int VEC, typename F, typename G>
__global__ void __launch_bounds__(kThreads) loss_partial_sum_kernel(A* __restrict__ partials, int64_t n, F f, G g) {
  __shared__ A scratch[32];
  A s = 0, d = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / VEC;
  for (int64_t v = tid; v < nvec; v += stride) {
    const StreamValues<T, VEC> sv = load_streams<T, VEC>(f, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      s += f(v * VEC + k, sv.a[k], sv.b[k]);
      if constexpr (G::kActive) d += g(v * VEC + k);
    }
  }
  for (int64_t i = nvec * VEC + tid; i < n; i += stride) {
    s += apply_at<T>(f, i);
    if constexpr (G::kActive) d += g(i);
  }
  s = block_sum(s, scratch);
  if constexpr (G::kActive) d = block_sum(d, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = s;
    if constexpr (G::kActive) partials[kMaxBlocks + blockIdx.x] = d;
  }
}

// 16-byte vectors when f's streams and out (if any) allow them.
template <typename T, typename F>
bool can_vectorize(const F& f, const T* out) {
  return aligned_to(f.a, 16) && (f.b == nullptr || aligned_to(f.b, 16)) && (out == nullptr || aligned_to(out, 16));
}

template <typename T, typename F>
void launch_map(T* out, int64_t n, const F& f, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  if (can_vectorize(f, out)) {
    loss_map_kernel<T, V><<<grid_for(n / V + 1, kThreads), kThreads, 0, stream>>>(out, n, f);
  } else {
    loss_map_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, n, f);
  }
}

template <typename T, typename F, typename G>
void launch_partial_sums(acc_t<T>* partials, unsigned blocks, int64_t n, const F& f, const G& g, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  if (can_vectorize<T>(f, nullptr)) {
    loss_partial_sum_kernel<acc_t<T>, T, V><<<blocks, kThreads, 0, stream>>>(partials, n, f, g);
  } else {
    loss_partial_sum_kernel<acc_t<T>, T, 1><<<blocks, kThreads, 0, stream>>>(partials, n, f, g);
  }
}

// One block: s = sum(partials[0, nblocks)), in a fixed order. Writes s / divisor, or s / sum(partials[kMaxBlocks +
// ...]) when by_second_sum, to *out (as T) and/or *out_acc (as A).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    loss_finalize_kernel(const acc_t<T>* __restrict__ partials, int nblocks, bool by_second_sum, double divisor,
                         T* __restrict__ out, acc_t<T>* __restrict__ out_acc) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  A s = 0, d = 0;
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) {
    s += partials[b];
    if (by_second_sum) d += partials[kMaxBlocks + b];
  }
  s = block_sum(s, scratch);
  if (by_second_sum) d = block_sum(d, scratch);
  if (threadIdx.x == 0) {
    const A v = by_second_sum ? s / d : divisor == 1.0 ? s : static_cast<A>(static_cast<double>(s) / divisor);
    if (out != nullptr) *out = from_acc<T>(v);
    if (out_acc != nullptr) *out_acc = v;
  }
}

unsigned reduce_grid(int64_t n) {
  const unsigned g = grid_for(n, kThreads);
  return g < kMaxBlocks ? g : kMaxBlocks;
}

// Runs f over n elements: writes each value under 'none', else reduces them into out[0]. `g` is the second sum a
// weighted mean divides by (NoTerm for a plain mean over n).
template <typename T, typename F, typename G>
cudaError_t launch_loss(T* out, int64_t n, LossReduction reduction, F f, G g, void* workspace, cudaStream_t stream) {
  using A = acc_t<T>;
  if (reduction == LossReduction::None) {
    if (n == 0) return cudaSuccess;
    launch_map(out, n, f, stream);
    return cudaGetLastError();
  }
  A* partials = static_cast<A*>(workspace);
  const unsigned blocks = reduce_grid(n);
  const bool mean = reduction == LossReduction::Mean;
  if (mean && G::kActive) {
    launch_partial_sums<T>(partials, blocks, n, f, g, stream);
  } else {
    launch_partial_sums<T>(partials, blocks, n, f, NoTerm{}, stream);
  }
  const double divisor = mean ? static_cast<double>(n) : 1.0;
  loss_finalize_kernel<T><<<1, kThreads, 0, stream>>>(partials, blocks, mean && G::kActive, divisor, out, nullptr);
  return cudaGetLastError();
}

// Streams: a = input x, b = target y.
template <typename T>
struct MseLossForward {
  const T* a;
  const T* b;
  const T* w;
  __device__ __forceinline__ acc_t<T> operator()(int64_t i, acc_t<T> xi, acc_t<T> yi) const {
    const acc_t<T> d = xi - yi;
    return w != nullptr ? load(w, i) * d * d : d * d;
  }
};

template <typename T>
struct MseLossBackward {
  const T* a;
  const T* b;
  GradOutput<T> g;
  const T* w;
  __device__ __forceinline__ acc_t<T> operator()(int64_t i, acc_t<T> xi, acc_t<T> yi) const {
    using A = acc_t<T>;
    const A d = xi - yi;
    return (w != nullptr ? load(w, i) * d : d) * g(i);
  }
};

template <typename T>
struct BceWithLogitsForward {
  const T* a;
  const T* b;
  LossOperand<T> w;
  LossOperand<T> pw;
  __device__ __forceinline__ acc_t<T> operator()(int64_t i, acc_t<T> xi, acc_t<T> yi) const {
    using A = acc_t<T>;
    const A lw = pw.data != nullptr ? A(1) + (load(pw, i) - A(1)) * yi : A(1);
    return load(w, i) * ((A(1) - yi) * xi + lw * softplus_neg(xi));
  }
};

template <typename T>
struct BceWithLogitsBackward {
  const T* a;
  const T* b;
  GradOutput<T> g;
  LossOperand<T> w;
  LossOperand<T> pw;
  bool wrt_target;
  __device__ __forceinline__ acc_t<T> operator()(int64_t i, acc_t<T> xi, acc_t<T> yi) const {
    using A = acc_t<T>;
    const A pwi = load(pw, i);
    const A d = wrt_target ? (pw.data == nullptr ? -xi : pwi * softplus_neg(xi) - softplus_neg(-xi))
                           : (A(1) + (pwi - A(1)) * yi) * sigmoid(xi) - pwi * yi;
    return load(w, i) * d * g(i);
  }
};

// One warp per row. Writes each row's loss to out (reduction none) or per-block sums to partials.
template <typename T, int P>
__global__ void __launch_bounds__(kThreads)
    multi_margin_loss_forward_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                                     const T* __restrict__ w, T* __restrict__ out, acc_t<T>* __restrict__ partials,
                                     int64_t rows, int64_t cols, acc_t<T> margin, int64_t* __restrict__ bad_row) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  A total = 0;
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int64_t t = target[r];
    const T* xr = x + r * cols;
    A loss;
    if (t < 0 || t >= cols) {
      if (lane == 0) atomicMin(reinterpret_cast<long long*>(bad_row), static_cast<long long>(r));
      loss = static_cast<A>(NAN);
    } else {
      const A xt = to_acc(xr[t]);
      A s = 0;
      for (int64_t j = lane; j < cols; j += 32) {
        const A z = margin - xt + to_acc(xr[j]);
        if (j != t && z > A(0)) s += P == 1 ? z : z * z;
      }
      s = warp_sum(s);
      loss = (w != nullptr ? to_acc(w[t]) * s : s) / static_cast<A>(cols);
    }
    if (out != nullptr) {
      if (lane == 0) out[r] = from_acc<T>(loss);
    } else {
      total += loss;  // the same value on every lane; lane 0's copy is summed below
    }
  }
  if (partials != nullptr) {
    total = block_sum(lane == 0 ? total : A(0), scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
  }
}

// One warp per row. grad_output is per row (reduction none) or one scalar; `scale` is 1 / cols, or 1 / (rows cols)
// for the mean.
template <typename T, int P>
__global__ void __launch_bounds__(kThreads)
    multi_margin_loss_backward_kernel(const T* __restrict__ grad_output, bool per_row, acc_t<T> scale,
                                      const T* __restrict__ x, const int64_t* __restrict__ target,
                                      const T* __restrict__ w, T* __restrict__ grad_x, int64_t rows, int64_t cols,
                                      acc_t<T> margin, int64_t* __restrict__ bad_row) {
  using A = acc_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int64_t t = target[r];
    const T* xr = x + r * cols;
    T* gr = grad_x + r * cols;
    if (t < 0 || t >= cols) {
      if (lane == 0) atomicMin(reinterpret_cast<long long*>(bad_row), static_cast<long long>(r));
      for (int64_t j = lane; j < cols; j += 32) gr[j] = from_acc<T>(static_cast<A>(NAN));
      continue;
    }
    A g = to_acc(grad_output[per_row ? r : 0]) * scale;
    if (w != nullptr) g *= to_acc(w[t]);
    const A xt = to_acc(xr[t]);
    A sum = 0;
    for (int64_t j = lane; j < cols; j += 32) {
      if (j == t) continue;
      const A z = margin - xt + to_acc(xr[j]);
      const A h = z > A(0) ? (P == 1 ? g : A(2) * g * z) : A(0);
      gr[j] = from_acc<T>(h);
      sum += h;
    }
    sum = warp_sum(sum);
    if (lane == 0) gr[t] = from_acc<T>(-sum);
  }
}

unsigned rows_grid(int64_t rows, bool reduce) {
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned g = grid_for((rows + kRowsPerBlock - 1) / kRowsPerBlock * kThreads, kThreads);
  return reduce && g > kMaxBlocks ? kMaxBlocks : g;
}

}  // namespace

size_t loss_workspace_bytes() { return (2 * kMaxBlocks + 1) * sizeof(double); }

template <typename T>
cudaError_t mse_loss_forward(const T* x, const T* y, const T* w, T* out, int64_t n, LossReduction reduction,
                             void* workspace, cudaStream_t stream) {
  const MseLossForward<T> f{x, y, w};
  if (w != nullptr) return launch_loss(out, n, reduction, f, WeightTerm<T>{w}, workspace, stream);
  return launch_loss(out, n, reduction, f, NoTerm{}, workspace, stream);
}

template <typename T>
cudaError_t mse_loss_backward(const T* grad_output, const T* x, const T* y, const T* w, T* grad_x, int64_t n,
                              LossReduction reduction, void* workspace, cudaStream_t stream) {
  using A = acc_t<T>;
  if (n == 0) return cudaSuccess;
  GradOutput<T> g{grad_output, reduction == LossReduction::None, A(2), nullptr};  // the 2 of d/dx (x - y)^2
  if (reduction == LossReduction::Mean && w != nullptr) {
    // sum(w) into the scalar slot after the partial sums.
    A* partials = static_cast<A*>(workspace);
    A* denom = partials + 2 * kMaxBlocks;
    const unsigned blocks = reduce_grid(n);
    launch_partial_sums<T>(partials, blocks, n, WeightTerm<T>{w}, NoTerm{}, stream);
    loss_finalize_kernel<T><<<1, kThreads, 0, stream>>>(partials, blocks, false, 1.0, nullptr, denom);
    g.denom = denom;
  } else if (reduction == LossReduction::Mean) {
    g.scale = static_cast<A>(2.0 / static_cast<double>(n));
  }
  launch_map(grad_x, n, MseLossBackward<T>{x, y, g, w}, stream);
  return cudaGetLastError();
}

template <typename T>
cudaError_t binary_cross_entropy_with_logits_forward(const T* x, const T* y, LossOperand<T> weight,
                                                     LossOperand<T> pos_weight, T* out, int64_t n,
                                                     LossReduction reduction, void* workspace, cudaStream_t stream) {
  return launch_loss(out, n, reduction, BceWithLogitsForward<T>{x, y, weight, pos_weight}, NoTerm{}, workspace, stream);
}

template <typename T>
cudaError_t binary_cross_entropy_with_logits_backward(const T* grad_output, const T* x, const T* y,
                                                      LossOperand<T> weight, LossOperand<T> pos_weight, T* grad,
                                                      int64_t n, LossReduction reduction, bool wrt_target,
                                                      cudaStream_t stream) {
  using A = acc_t<T>;
  if (n == 0) return cudaSuccess;
  const A scale = reduction == LossReduction::Mean ? static_cast<A>(1.0 / static_cast<double>(n)) : A(1);
  const GradOutput<T> g{grad_output, reduction == LossReduction::None, scale, nullptr};
  launch_map(grad, n, BceWithLogitsBackward<T>{x, y, g, weight, pos_weight, wrt_target}, stream);
  return cudaGetLastError();
}

template <typename T>
cudaError_t multi_margin_loss_forward(const T* x, const int64_t* target, const T* w, T* out, int64_t rows, int64_t cols,
                                      int p, double margin, LossReduction reduction, void* workspace, int64_t* bad_row,
                                      cudaStream_t stream) {
  using A = acc_t<T>;
  const bool reduce = reduction != LossReduction::None;
  if (rows == 0 && !reduce) return cudaSuccess;
  A* partials = reduce ? static_cast<A*>(workspace) : nullptr;
  T* rows_out = reduce ? nullptr : out;
  const unsigned blocks = rows_grid(rows, reduce);
  const A m = static_cast<A>(margin);
  if (p == 1) {
    multi_margin_loss_forward_kernel<T, 1>
        <<<blocks, kThreads, 0, stream>>>(x, target, w, rows_out, partials, rows, cols, m, bad_row);
  } else {
    multi_margin_loss_forward_kernel<T, 2>
        <<<blocks, kThreads, 0, stream>>>(x, target, w, rows_out, partials, rows, cols, m, bad_row);
  }
  if (reduce) {
    const double divisor = reduction == LossReduction::Mean ? static_cast<double>(rows) : 1.0;
    loss_finalize_kernel<T><<<1, kThreads, 0, stream>>>(partials, blocks, false, divisor, out, nullptr);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t multi_margin_loss_backward(const T* grad_output, const T* x, const int64_t* target, const T* w, T* grad_x,
                                       int64_t rows, int64_t cols, int p, double margin, LossReduction reduction,
                                       int64_t* bad_row, cudaStream_t stream) {
  using A = acc_t<T>;
  if (rows == 0) return cudaSuccess;
  const double frames = reduction == LossReduction::Mean ? static_cast<double>(rows) : 1.0;
  const A scale = static_cast<A>(1.0 / (frames * static_cast<double>(cols)));
  const bool per_row = reduction == LossReduction::None;
  const unsigned blocks = rows_grid(rows, false);
  const A m = static_cast<A>(margin);
  if (p == 1) {
    multi_margin_loss_backward_kernel<T, 1>
        <<<blocks, kThreads, 0, stream>>>(grad_output, per_row, scale, x, target, w, grad_x, rows, cols, m, bad_row);
  } else {
    multi_margin_loss_backward_kernel<T, 2>
        <<<blocks, kThreads, 0, stream>>>(grad_output, per_row, scale, x, target, w, grad_x, rows, cols, m, bad_row);
  }
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_LOSSES(T)                                                                                 \
  template cudaError_t mse_loss_forward<T>(const T*, const T*, const T*, T*, int64_t, LossReduction, void*,            \
                                           cudaStream_t);                                                              \
  template cudaError_t mse_loss_backward<T>(const T*, const T*, const T*, const T*, T*, int64_t, LossReduction, void*, \
                                            cudaStream_t);                                                             \
  template cudaError_t binary_cross_entropy_with_logits_forward<T>(const T*, const T*, LossOperand<T>, LossOperand<T>, \
                                                                   T*, int64_t, LossReduction, void*, cudaStream_t);   \
  template cudaError_t binary_cross_entropy_with_logits_backward<T>(                                                   \
      const T*, const T*, const T*, LossOperand<T>, LossOperand<T>, T*, int64_t, LossReduction, bool, cudaStream_t);   \
  template cudaError_t multi_margin_loss_forward<T>(const T*, const int64_t*, const T*, T*, int64_t, int64_t, int,     \
                                                    double, LossReduction, void*, int64_t*, cudaStream_t);             \
  template cudaError_t multi_margin_loss_backward<T>(const T*, const T*, const int64_t*, const T*, T*, int64_t,        \
                                                     int64_t, int, double, LossReduction, int64_t*, cudaStream_t);

TORCHEXT_INSTANTIATE_LOSSES(float)
TORCHEXT_INSTANTIATE_LOSSES(double)
TORCHEXT_INSTANTIATE_LOSSES(__half)
TORCHEXT_INSTANTIATE_LOSSES(__nv_bfloat16)

}  // namespace torchext::cuda_ops
