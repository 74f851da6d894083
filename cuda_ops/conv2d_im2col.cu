// Rung 2 of the convolution ladder (cuda_ops/conv2d.cuh): explicit im2col into a workspace, then the GEMM engine
// (cuda_ops/matmul.cuh, whichever version matmul_default_kernel picks: wgmma / mma_sync on tensor cores, the CUDA-core
// versions for float64 or odd strides). groups == 1 only: a grouped convolution is G independent products over
// channel slices, which would take G engine calls per chunk (or a batch over groups with per-group strides the
// engine's single batch stride cannot express for every layout); rung 1 (direct) takes groups > 1.
//
//   The patch matrix of x: cols (M = N P Q, Kd = C R S), row m = (n, p, q), column kd = (c, r, s) in the weight's
//   order: (c, r, s) for a KCRS weight, (r, s, c) for a KRSC (channels-last) one, so that the weight, seen as a
//   (K, Kd) matrix, is read in place through the engine's strides (MatmulArgs b_rs / b_cs):
//       cols[m, kd] = x[n, c, p sh - ph + r dh, q sw - pw + s dw]   (0 in the padding)
//   forward          y = act(cols W^T + bias)   as (N P Q, K) when y is channels-last (that product IS y, bias and
//                                               activation in the engine's epilogue); as W cols_n^T = (K, P Q) per
//                                               image when y is NCHW (a batch over the images; the engine's bias is
//                                               per column, so bias and activation follow in one elementwise pass)
//   backward_input   dcols = dy W  (N P Q, Kd), then col2im: each input element GATHERS its (r, s) taps from dcols
//                                               in a fixed order (deterministic, no atomics)
//   backward_weight  dW = dy^T cols  (K, Kd), written in place in the weight gradient's layout; dy is read in place
//                                               when its (n, p, q) are one uniform stride (channels-last), else copied
//                                               to a (K, N P Q) buffer first (NCHW); the engine splits the long k
//                                               (split-K / stream-K) in its own workspace
//
// Workspace: the batch is processed in chunks of images so that the patch matrix stays under kColsCapBytes (256
// MiB) unless one image alone is larger. backward_weight with several chunks adds each chunk's product (in T) into
// an acc_t<T> buffer (K, Kd) in a fixed order, then converts it into dW. Regions (each rounded up to 256 bytes):
//   cols     nb P Q Kd T            every pass (dcols for backward_input)
//   dyc      nb P Q K T             backward_weight with dy not uniform over (n, p, q)
//   tmp, acc K Kd T, K Kd acc_t<T>  backward_weight with several chunks, or a weight gradient whose kd stride is not 1
//   gemm     the largest matmul_workspace_bytes over the chunks' products (with a 256-aligned workspace base)
//
// Kernels: im2col_kernel (one thread per element of cols, kd fastest: coalesced writes, and reads along x's fastest
// dimension when the order matches x's layout), col2im_kernel (one thread per input element), nchw_epilogue_kernel,
// dy_copy_kernel, accumulate_kernel and store_weight_kernel (elementwise).
//
// Napkin math: ResNet-18's 64 -> 64 3x3 layer, batch 8, 32 x 32, bf16: cols is 8192 x 576 x 2 B = 9.4 MB written
// and read once (about 5 us at 4 TB/s) against a 0.6 GFLOP GEMM (about 1-2 us on H100 tensor cores at this size): the
// copy, not the product, is the cost; rung 3 (implicit GEMM) removes it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>
#include <utility>

#include "common.cuh"
#include "conv2d.cuh"
#include "matmul.cuh"
#include "matmul_epilogue.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr size_t kColsCapBytes = size_t(256) << 20;
constexpr size_t kAlign = 256;

size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The stride u with sum_i index_i * stride_i == (flattened index) * u for every index of these dimensions, given
// innermost first as (size, stride); false if there is none. Dimensions of size 1 do not constrain it.
bool flat_stride(std::initializer_list<std::pair<int64_t, int64_t>> dims, int64_t* u) {
  int64_t unit = 0, inner = 1;  // unit 0: not yet known
  for (const auto& [size, stride] : dims) {
    if (size == 0) {
      *u = 1;
      return true;  // empty: any stride describes it
    }
    if (size > 1) {
      if (unit == 0) {
        unit = stride;  // every inner dimension has size 1 here, so inner == 1
        if (unit == 0) return false;
      } else if (stride != unit * inner) {
        return false;
      }
    }
    inner *= size;
  }
  *u = unit == 0 ? 1 : unit;
  return true;
}

// The order of the patch matrix's columns kd.
enum class ColOrder { crs, rsc };

struct Kd {
  int64_t c, r, s;
};

__host__ __device__ __forceinline__ Kd split_kd(int64_t kd, ColOrder order, int64_t C, int64_t R, int64_t S) {
  Kd o;
  if (order == ColOrder::crs) {
    o.s = kd % S;
    kd /= S;
    o.r = kd % R;
    o.c = kd / R;
  } else {
    o.c = kd % C;
    kd /= C;
    o.s = kd % S;
    o.r = kd / S;
  }
  return o;
}

struct Plan {
  const char* why = nullptr;  // nullptr: supported
  ColOrder order = ColOrder::crs;
  int64_t wu = 1;             // the weight's stride per column index kd (0: not uniform; backward_weight only)
  int64_t kd = 0, pq = 0, nb = 0, chunks = 0;
  bool y_nhwc = true;         // forward: the (N P Q, K) product; else (K, P Q) per image
  bool accumulate = false;    // backward_weight: chunks added in an acc_t buffer, then stored through w's strides
  size_t cols_off = 0, dyc_off = 0, tmp_off = 0, acc_off = 0, gemm_off = 0, gemm_bytes = 0, total = 0;
};

template <typename T>
Plan make_plan(Conv2dPass pass, const Conv2dArgs<T>& a) {
  Plan pl;
  const Conv2dShape& s = a.shape;
  auto fail = [&pl](const char* why) {
    pl.why = why;
    return pl;
  };
  if (s.n < 0 || s.c < 0 || s.h < 0 || s.w < 0 || s.k < 0 || s.r < 0 || s.s < 0 || s.p < 0 || s.q < 0) {
    return fail("im2col: negative size");
  }
  if (s.groups != 1) {
    return fail("im2col: groups must be 1 (a grouped convolution is one GEMM per group; the direct version takes it)");
  }
  if (s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 || s.dil_w < 1 || s.pad_h < 0 || s.pad_w < 0) {
    return fail("im2col: stride and dilation must be at least 1, padding non-negative");
  }
  pl.kd = s.c * s.r * s.s;
  pl.pq = s.p * s.q;
  // The column order: the weight's own, so that it is read (or its gradient written) in place.
  int64_t u_crs = 0, u_rsc = 0;
  const bool crs = flat_stride({{s.s, a.w.sw}, {s.r, a.w.sh}, {s.c, a.w.sc}}, &u_crs);
  const bool rsc = flat_stride({{s.c, a.w.sc}, {s.s, a.w.sw}, {s.r, a.w.sh}}, &u_rsc);
  if (rsc && (u_rsc == 1 || !crs || u_crs != 1)) {
    pl.order = ColOrder::rsc;
    pl.wu = u_rsc;
  } else if (crs) {
    pl.order = ColOrder::crs;
    pl.wu = u_crs;
  } else if (pass == Conv2dPass::backward_weight) {
    pl.order = a.w.sc == 1 ? ColOrder::rsc : ColOrder::crs;  // written through its strides by store_weight_kernel
    pl.wu = 0;
  } else {
    return fail("im2col: the weight's (c, r, s) must be one uniform stride in (c, r, s) or (r, s, c) order (KCRS or KRSC)");
  }
  int64_t yu = 0;
  const bool y_pq_flat = flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}}, &yu);
  if (pass == Conv2dPass::forward) {
    if (y_pq_flat && (s.k <= 1 || a.y.sc == 1)) {
      pl.y_nhwc = true;
    } else if (y_pq_flat && yu == 1) {
      pl.y_nhwc = false;
    } else {
      return fail("im2col: the output must be NCHW or channels-last within each image");
    }
  } else if (pass == Conv2dPass::backward_input && !y_pq_flat) {
    return fail("im2col: grad_output's (p, q) must be one uniform stride within each image");
  }
  // Chunks of nb images: the patch matrix (and dy's copy) under the cap.
  int64_t u = 0;
  const bool dy_flat_all = flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}, {s.n, a.y.sn}}, &u);
  const size_t per_image = size_t(pl.pq) * size_t(pl.kd) * sizeof(T) +
                           (pass == Conv2dPass::backward_weight && !dy_flat_all ? size_t(pl.pq * s.k) * sizeof(T) : 0);
  if (s.n > 0) {
    const int64_t fit = per_image > 0 ? int64_t(kColsCapBytes / per_image) : s.n;
    pl.nb = fit < 1 ? 1 : (fit < s.n ? fit : s.n);
    pl.nb = (s.n + (s.n + pl.nb - 1) / pl.nb - 1) / ((s.n + pl.nb - 1) / pl.nb);  // even chunks, none empty
    pl.chunks = (s.n + pl.nb - 1) / pl.nb;
  }
  size_t off = 0;
  pl.cols_off = off;
  off += round_up(size_t(pl.nb) * size_t(pl.pq) * size_t(pl.kd) * sizeof(T));
  if (pass == Conv2dPass::backward_weight) {
    const bool dy_flat = flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}, {pl.nb, a.y.sn}}, &u);
    pl.dyc_off = off;
    if (!dy_flat) off += round_up(size_t(pl.nb) * size_t(pl.pq) * size_t(s.k) * sizeof(T));
    pl.accumulate = pl.chunks > 1 || pl.wu != 1;
    if (pl.accumulate) {
      pl.tmp_off = off;
      off += round_up(size_t(s.k) * size_t(pl.kd) * sizeof(T));
      pl.acc_off = off;
      off += round_up(size_t(s.k) * size_t(pl.kd) * sizeof(acc_t<T>));
    }
  }
  pl.gemm_off = off;
  pl.total = off;
  return pl;
}

// Whether backward_weight reads dy through a copy (its (n, p, q) are not one stride over a chunk's images).
template <typename T>
bool needs_dy_copy(const Conv2dArgs<T>& a, const Plan& pl) {
  int64_t u = 0;
  return !flat_stride({{a.shape.q, a.y.sw}, {a.shape.p, a.y.sh}, {pl.nb, a.y.sn}}, &u);
}

// The engine's arguments for the chunk of nb images from n0, with the workspace at `ws`.
template <typename T>
MatmulArgs<T> gemm_args(Conv2dPass pass, const Conv2dArgs<T>& a, const Plan& pl, int64_t n0, int64_t nb, char* ws) {
  const Conv2dShape& s = a.shape;
  T* cols = reinterpret_cast<T*>(ws + pl.cols_off);
  MatmulArgs<T> g;
  g.allow_tf32 = a.allow_tf32;
  int64_t u = 0;
  if (pass == Conv2dPass::forward) {
    T* y = a.y.data + n0 * a.y.sn;
    if (pl.y_nhwc) {
      // y (nb P Q, K) = cols (nb P Q, Kd) W^T (Kd, K), bias and the activation in the epilogue.
      g.n = s.k;
      g.k = pl.kd;
      g.a = cols;
      g.a_rs = pl.kd;
      g.a_cs = 1;
      g.b = a.w.data;
      g.b_rs = pl.wu;
      g.b_cs = a.w.sn;
      g.c = y;
      g.bias = a.bias;
      g.act = a.act;
      if (flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}, {nb, a.y.sn}}, &u)) {
        g.m = nb * pl.pq;
        g.c_rs = u;
      } else {
        flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}}, &u);
        g.m = pl.pq;
        g.batch = nb;
        g.a_bs = pl.pq * pl.kd;
        g.c_rs = u;
        g.c_bs = a.y.sn;
      }
    } else {
      // y_n (K, P Q) = W (K, Kd) cols_n^T (Kd, P Q), one per image; bias and activation afterwards.
      g.m = s.k;
      g.n = pl.pq;
      g.k = pl.kd;
      g.batch = nb;
      g.a = a.w.data;
      g.a_rs = a.w.sn;
      g.a_cs = pl.wu;
      g.b = cols;
      g.b_rs = 1;
      g.b_cs = pl.kd;
      g.b_bs = pl.pq * pl.kd;
      g.c = y;
      g.c_rs = a.y.sc;
      g.c_bs = a.y.sn;
    }
  } else if (pass == Conv2dPass::backward_input) {
    // dcols (nb P Q, Kd) = dy (nb P Q, K) W (K, Kd).
    const T* dy = a.y.data + n0 * a.y.sn;
    g.n = pl.kd;
    g.k = s.k;
    g.a = dy;
    g.a_cs = a.y.sc;
    g.b = a.w.data;
    g.b_rs = a.w.sn;
    g.b_cs = pl.wu;
    g.c = cols;
    g.c_rs = pl.kd;
    if (flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}, {nb, a.y.sn}}, &u)) {
      g.m = nb * pl.pq;
      g.a_rs = u;
    } else {
      flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}}, &u);
      g.m = pl.pq;
      g.batch = nb;
      g.a_rs = u;
      g.a_bs = a.y.sn;
      g.c_bs = pl.pq * pl.kd;
    }
  } else {
    // dW (K, Kd) = dy^T (K, nb P Q) cols (nb P Q, Kd).
    g.m = s.k;
    g.n = pl.kd;
    g.k = nb * pl.pq;
    if (needs_dy_copy(a, pl)) {
      g.a = reinterpret_cast<const T*>(ws + pl.dyc_off);
      g.a_rs = nb * pl.pq;
      g.a_cs = 1;
    } else {
      flat_stride({{s.q, a.y.sw}, {s.p, a.y.sh}, {nb, a.y.sn}}, &u);
      g.a = a.y.data + n0 * a.y.sn;
      g.a_rs = a.y.sc;
      g.a_cs = u;
    }
    g.b = cols;
    g.b_rs = pl.kd;
    g.b_cs = 1;
    if (pl.accumulate) {
      g.c = reinterpret_cast<T*>(ws + pl.tmp_off);
      g.c_rs = pl.kd;
    } else {
      g.c = a.w.data;
      g.c_rs = a.w.sn;
    }
  }
  return g;
}

// A stand-in workspace base for sizing: aligned like the caching allocator's blocks, never dereferenced.
char* sizing_base() { return reinterpret_cast<char*>(uintptr_t(1) << 20); }

// The gemm region: the largest engine workspace any chunk's product asks for.
template <typename T>
size_t gemm_bytes(Conv2dPass pass, const Conv2dArgs<T>& a, const Plan& pl) {
  size_t most = 0;
  for (int64_t i = 0; i < pl.chunks; ++i) {
    const int64_t n0 = i * pl.nb, nb = pl.nb < a.shape.n - n0 ? pl.nb : a.shape.n - n0;
    const MatmulArgs<T> g = gemm_args(pass, a, pl, n0, nb, sizing_base());
    const size_t b = matmul_workspace_bytes(matmul_default_kernel(g), g);
    most = b > most ? b : most;
  }
  return most;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    im2col_kernel(const Tensor4<T> x, Conv2dShape s, ColOrder order, int64_t n0, int64_t nb, T* __restrict__ cols) {
  const int64_t kdn = s.c * s.r * s.s, pq = s.p * s.q;
  const int64_t total = nb * pq * kdn;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t kd = i % kdn, m = i / kdn;
    const Kd t = split_kd(kd, order, s.c, s.r, s.s);
    const int64_t n = n0 + m / pq, pqi = m % pq, p = pqi / s.q, q = pqi % s.q;
    const int64_t ih = p * s.stride_h - s.pad_h + t.r * s.dil_h, iw = q * s.stride_w - s.pad_w + t.s * s.dil_w;
    T v = from_acc<T>(acc_t<T>(0));
    if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w) v = x.data[n * x.sn + t.c * x.sc + ih * x.sh + iw * x.sw];
    cols[i] = v;
  }
}

// dx[n, c, h, w] = sum over the taps (r, s) that reach it of dcols[(n - n0, p, q), kd(c, r, s)], in (r, s) order.
template <typename T>
__global__ void __launch_bounds__(kThreads) col2im_kernel(const T* __restrict__ dcols, Conv2dShape s, ColOrder order,
                                                          int64_t n0, int64_t nb, Tensor4<T> x, bool chan_fast) {
  using A = acc_t<T>;
  const int64_t total = nb * s.c * s.h * s.w;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t n, c, h, w, t = i;
    if (chan_fast) {
      c = t % s.c;
      t /= s.c;
      w = t % s.w;
      t /= s.w;
      h = t % s.h;
      n = t / s.h;
    } else {
      w = t % s.w;
      t /= s.w;
      h = t % s.h;
      t /= s.h;
      c = t % s.c;
      n = t / s.c;
    }
    A acc = A(0);
    for (int64_t r = 0; r < s.r; ++r) {
      const int64_t th = h + s.pad_h - r * s.dil_h;
      if (th < 0) break;
      if (th % s.stride_h != 0) continue;
      const int64_t p = th / s.stride_h;
      if (p >= s.p) continue;
      for (int64_t ss = 0; ss < s.s; ++ss) {
        const int64_t tw = w + s.pad_w - ss * s.dil_w;
        if (tw < 0) break;
        if (tw % s.stride_w != 0) continue;
        const int64_t q = tw / s.stride_w;
        if (q >= s.q) continue;
        const int64_t kd = order == ColOrder::crs ? (c * s.r + r) * s.s + ss : (r * s.s + ss) * s.c + c;
        acc += to_acc<T>(dcols[((n * s.p + p) * s.q + q) * (s.c * s.r * s.s) + kd]);
      }
    }
    x.data[(n0 + n) * x.sn + c * x.sc + h * x.sh + w * x.sw] = from_acc<T>(acc);
  }
}

// y = act(y + bias[k]) in place (the NCHW forward, whose product had no epilogue).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    nchw_epilogue_kernel(Tensor4<T> y, Conv2dShape s, const T* __restrict__ bias, Activation act) {
  const int64_t total = s.n * s.k * s.p * s.q;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i;
    const int64_t q = t % s.q;
    t /= s.q;
    const int64_t p = t % s.p;
    t /= s.p;
    const int64_t k = t % s.k, n = t / s.k;
    T* e = y.data + n * y.sn + k * y.sc + p * y.sh + q * y.sw;
    acc_t<T> z = to_acc<T>(*e);
    if (bias != nullptr) z += to_acc<T>(bias[k]);
    *e = from_acc<T>(apply_activation(z, act));
  }
}

// dyc (K, nb P Q) row-major from dy's images n0 .. n0 + nb - 1 (m fastest: NCHW dy is read along q).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dy_copy_kernel(const Tensor4<T> dy, Conv2dShape s, int64_t n0, int64_t nb, T* __restrict__ dyc) {
  const int64_t pq = s.p * s.q, mn = nb * pq, total = s.k * mn;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i % mn, k = i / mn;
    const int64_t n = n0 + m / pq, pqi = m % pq, p = pqi / s.q, q = pqi % s.q;
    dyc[i] = dy.data[n * dy.sn + k * dy.sc + p * dy.sh + q * dy.sw];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(const T* __restrict__ part, acc_t<T>* __restrict__ acc, int64_t total, bool first) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    acc[i] = (first ? acc_t<T>(0) : acc[i]) + to_acc<T>(part[i]);
  }
}

// w[k, c, r, s] = acc[k, kd(c, r, s)] through w's strides (0 where acc is nullptr: an empty reduction).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    store_weight_kernel(const acc_t<T>* __restrict__ acc, Tensor4<T> w, Conv2dShape s, ColOrder order) {
  const int64_t kdn = s.c * s.r * s.s, total = s.k * kdn;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t kd = i % kdn, k = i / kdn;
    const Kd t = split_kd(kd, order, s.c, s.r, s.s);
    w.data[k * w.sn + t.c * w.sc + t.r * w.sh + t.s * w.sw] = from_acc<T>(acc != nullptr ? acc[i] : acc_t<T>(0));
  }
}

inline bool channels_fastest(int64_t channels, int64_t sc, int64_t sw) {
  return channels > 1 && (sc == 1 || (sw != 1 && sc < sw));
}

// One engine call, with its workspace from the gemm region when it fits (else none: the engine then does not split,
// same result).
template <typename T>
cudaError_t run_gemm(const MatmulArgs<T>& g, char* gemm_ws, size_t gemm_ws_bytes, cudaStream_t stream) {
  const MatmulKernel kernel = matmul_default_kernel(g);
  const size_t need = matmul_workspace_bytes(kernel, g);
  return matmul(kernel, g, stream, need > 0 && need <= gemm_ws_bytes ? gemm_ws : nullptr);
}

}  // namespace

template <typename T>
bool conv2d_im2col_supported(Conv2dPass pass, const Conv2dArgs<T>& args, const char** why) {
  const Plan pl = make_plan(pass, args);
  if (pl.why != nullptr) {
    if (why != nullptr) *why = pl.why;
    return false;
  }
  // Every chunk's product must be one the engine can run (chunks differ in their base pointers and the last one's
  // size, which can change the engine's choice but not whether some version takes it).
  for (int64_t i = 0; i < pl.chunks; ++i) {
    const int64_t n0 = i * pl.nb, nb = pl.nb < args.shape.n - n0 ? pl.nb : args.shape.n - n0;
    const MatmulArgs<T> g = gemm_args(pass, args, pl, n0, nb, sizing_base());
    if (!matmul_supported(matmul_default_kernel(g), g, why)) return false;
    if (i == 0 && pl.chunks > 2) i = pl.chunks - 2;  // the first, and the last (the only other size)
  }
  return true;
}

template <typename T>
size_t conv2d_im2col_workspace_bytes(Conv2dPass pass, const Conv2dArgs<T>& args) {
  const Plan pl = make_plan(pass, args);
  if (pl.why != nullptr) return 0;
  return pl.total + gemm_bytes(pass, args, pl);
}

template <typename T>
cudaError_t conv2d_im2col(Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if (!conv2d_im2col_supported(pass, args, nullptr)) return cudaErrorNotSupported;
  const Plan pl = make_plan(pass, args);
  const Conv2dShape& s = args.shape;
  char* ws = static_cast<char*>(workspace);
  const size_t gemm_ws_bytes = conv2d_im2col_workspace_bytes(pass, args) - pl.total;
  if (ws == nullptr && pl.total + gemm_ws_bytes > 0) return cudaErrorInvalidValue;
  char* gemm_ws = ws + pl.gemm_off;
  T* cols = reinterpret_cast<T*>(ws + pl.cols_off);
  cudaError_t err = cudaSuccess;
  auto check = [&]() {
    if (err == cudaSuccess) err = cudaGetLastError();
    return err == cudaSuccess;
  };

  if (pass == Conv2dPass::backward_weight) {
    const int64_t wtotal = s.k * pl.kd;
    if (wtotal == 0) return cudaSuccess;
    if (s.n * pl.pq == 0) {  // an empty reduction: dW = 0
      store_weight_kernel<T><<<grid_for(wtotal, kThreads), kThreads, 0, stream>>>(nullptr, args.w, s, pl.order);
      return cudaGetLastError();
    }
  }
  for (int64_t i = 0; i < pl.chunks; ++i) {
    const int64_t n0 = i * pl.nb, nb = pl.nb < s.n - n0 ? pl.nb : s.n - n0;
    const MatmulArgs<T> g = gemm_args(pass, args, pl, n0, nb, ws);
    if (pass != Conv2dPass::backward_input) {
      const int64_t total = nb * pl.pq * pl.kd;
      if (total > 0) {
        im2col_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(args.x, s, pl.order, n0, nb, cols);
        if (!check()) return err;
      }
    }
    if (pass == Conv2dPass::backward_weight && needs_dy_copy(args, pl)) {
      const int64_t total = s.k * nb * pl.pq;
      dy_copy_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(args.y, s, n0, nb,
                                                                              reinterpret_cast<T*>(ws + pl.dyc_off));
      if (!check()) return err;
    }
    err = run_gemm(g, gemm_ws, gemm_ws_bytes, stream);
    if (!check()) return err;
    if (pass == Conv2dPass::backward_input) {
      const int64_t total = nb * s.c * s.h * s.w;
      if (total > 0) {
        col2im_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
            cols, s, pl.order, n0, nb, args.x, channels_fastest(s.c, args.x.sc, args.x.sw));
        if (!check()) return err;
      }
    }
    if (pass == Conv2dPass::backward_weight && pl.accumulate) {
      const int64_t total = s.k * pl.kd;
      accumulate_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          reinterpret_cast<const T*>(ws + pl.tmp_off), reinterpret_cast<acc_t<T>*>(ws + pl.acc_off), total, i == 0);
      if (!check()) return err;
    }
  }
  if (pass == Conv2dPass::forward && !pl.y_nhwc && (args.bias != nullptr || args.act != Activation::none)) {
    const int64_t total = s.n * s.k * pl.pq;
    if (total > 0) {
      nchw_epilogue_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(args.y, s, args.bias, args.act);
      if (!check()) return err;
    }
  }
  if (pass == Conv2dPass::backward_weight && pl.accumulate) {
    store_weight_kernel<T><<<grid_for(s.k * pl.kd, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const acc_t<T>*>(ws + pl.acc_off), args.w, s, pl.order);
    if (!check()) return err;
  }
  return cudaSuccess;
}

#define TORCHEXT_INSTANTIATE_CONV2D_IM2COL(T)                                                     \
  template bool conv2d_im2col_supported<T>(Conv2dPass, const Conv2dArgs<T>&, const char**);      \
  template size_t conv2d_im2col_workspace_bytes<T>(Conv2dPass, const Conv2dArgs<T>&);            \
  template cudaError_t conv2d_im2col<T>(Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D_IM2COL(float)
TORCHEXT_INSTANTIATE_CONV2D_IM2COL(double)
TORCHEXT_INSTANTIATE_CONV2D_IM2COL(__half)
TORCHEXT_INSTANTIATE_CONV2D_IM2COL(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D_IM2COL

}  // namespace torchext::cuda_ops
