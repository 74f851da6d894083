// CPU kernels for torchext::conv2d, conv2d_stats and conv2d_backward, float32 and float64: im2col + the CPU GEMM of
// csrc/matmul_cpu.cpp (gemm_cpu, on the engine's MatmulArgs).
//
//   x is the input (N, C, H, W), w the weight (K, C / G, R, S), y the output (N, K, P, Q), G groups; one image's
//   patch matrix col is (P Q, C R S), row p Q + q holding x[n, c, p sh - ph + r dh, q sw - pw + s dw] at column
//   (c R + r) S + s (zero where that falls in the padding). Group g owns columns [g C/G R S, (g + 1) C/G R S) of col
//   and rows [g K/G, (g + 1) K/G) of w viewed as (K, C/G R S):
//     forward          y_g  = w_g col_g^T        (K/G x P Q per image; an NHWC output takes col_g w_g^T instead)
//     backward input   dcol_g = dy_g^T w_g       (P Q x C/G R S), then col2im adds dcol into dx
//     backward weight  dw_g = sum_n dy_g col_g^T (K/G x C/G R S)
//
// Images are processed in chunks: the chunk's patch matrices (rows n P Q + p Q + q) fill a workspace of at most
// kColBytes, and each group is one GEMM over the whole chunk (the weight gradient reduces over the chunk's N P Q
// rows inside the GEMM; chunks are added in order). The chunk size depends only on the shapes, so results do not
// depend on the thread count. Parallelism: im2col over output rows, col2im over (image, channel) planes (each task
// writes one plane of dx, in a fixed order), the GEMM over its own blocks.
//
// Layouts: x is read through its four strides (any layout: channels-last, sliced, expanded; no copy); w is made
// contiguous once (it is small); grad_output is made channels-last (NHWC) once in backward. The output and
// grad_input are channels-last when input suggests it, else contiguous; grad_weight takes weight's suggested format;
// grad_bias is contiguous (csrc/conv2d.h's rule).
//
// Accumulation: float32 accumulates in float32 (the GEMM's FMA chains, as torch's CPU convolutions do), float64 in
// float64. The epilogue adds the bias and applies relu to the accumulated value; conv2d_stats' per-channel sums and
// grad_bias are summed in float64 over fixed chunks (deterministic), stored as float32 (float64 for float64).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "activation_math.h"
#include "checks.h"
#include "conv2d.h"
#include "matmul.h"

namespace torchext {
namespace {

using cuda_ops::Conv2dShape;
using cuda_ops::MatmulArgs;

// Workspace for one chunk's patch matrices (and their gradient).
constexpr int64_t kColBytes = int64_t{16} << 20;

// The CPU runs one kernel, "cpu"; the CUDA ladder's names are refused with a pointer to the device they need.
void check_cpu_variant(std::string_view op, const std::optional<c10::string_view>& variant) {
  if (!variant.has_value() || *variant == "cpu") return;
  const std::string_view name(variant->data(), variant->size());
  for (const char* cuda_name : cuda_ops::kConv2dKernelNames) {
    TORCH_CHECK_VALUE(name != cuda_name, op, ": variant '", name,
                      "' runs on CUDA tensors; CPU tensors take variant=None or 'cpu'");
  }
  TORCH_CHECK_VALUE(false, op, ": unknown variant '", name, "'; valid names are 'cpu' (CPU tensors) and ",
                    cuda_conv2d_kernel_list(), " (CUDA tensors)");
}

// The sizes every pass needs, from the engine's shape struct.
struct Dims {
  int64_t n, c, h, w, k, r, s, p, q, g;
  int64_t pq, rs, crs, cg_rs, kg;  // P Q, R S, C R S, C/G R S, K/G

  explicit Dims(const Conv2dShape& sh)
      : n(sh.n), c(sh.c), h(sh.h), w(sh.w), k(sh.k), r(sh.r), s(sh.s), p(sh.p), q(sh.q), g(sh.groups) {
    pq = p * q;
    rs = r * s;
    crs = c * rs;
    cg_rs = c / g * rs;
    kg = k / g;
  }

  // Images per chunk: as many patch matrices as fit in kColBytes, at least one.
  template <typename T>
  int64_t chunk() const {
    const int64_t per_image = std::max<int64_t>(1, pq * crs * static_cast<int64_t>(sizeof(T)));
    return std::clamp<int64_t>(kColBytes / per_image, 1, std::max<int64_t>(n, 1));
  }
};

// A tensor's data and element strides in (n, c, h, w) order.
template <typename T>
struct Strided4 {
  T* data;
  int64_t sn, sc, sh, sw;
};

template <typename T>
Strided4<T> strided4(const at::Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// The patch matrices of images [n0, n0 + nc) into col ((nc P Q) x (C R S), row-major).
template <typename T>
void im2col(const Strided4<const T>& x, const Dims& d, const Conv2dShape& sh, int64_t n0, int64_t nc, T* col) {
  const int64_t rows = nc * d.p;  // one task per (image, output row)
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, d.q * d.crs));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ni = t / d.p, p = t % d.p;
      const T* xn = x.data + (n0 + ni) * x.sn;
      const int64_t h0 = p * sh.stride_h - sh.pad_h;
      for (int64_t q = 0; q < d.q; ++q) {
        T* dst = col + (t * d.q + q) * d.crs;
        const int64_t w0 = q * sh.stride_w - sh.pad_w;
        for (int64_t c = 0; c < d.c; ++c) {
          const T* xc = xn + c * x.sc;
          for (int64_t r = 0; r < d.r; ++r, dst += d.s) {
            const int64_t ih = h0 + r * sh.dil_h;
            if (ih < 0 || ih >= d.h) {
              std::fill(dst, dst + d.s, T(0));
              continue;
            }
            const T* row = xc + ih * x.sh;
            for (int64_t s = 0; s < d.s; ++s) {
              const int64_t iw = w0 + s * sh.dil_w;
              dst[s] = iw >= 0 && iw < d.w ? row[iw * x.sw] : T(0);
            }
          }
        }
      }
    }
  });
}

// dx[n0 + ni, c] = the sum of dcol's entries that im2col read from it, for every image of the chunk: one task per
// (image, channel) plane, which it zeroes and then accumulates in a fixed order.
template <typename T>
void col2im(const T* dcol, const Dims& d, const Conv2dShape& sh, int64_t n0, int64_t nc, const Strided4<T>& dx) {
  const int64_t planes = nc * d.c;
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, d.pq * d.rs));
  at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t ni = t / d.c, c = t % d.c;
      T* plane = dx.data + (n0 + ni) * dx.sn + c * dx.sc;
      for (int64_t ih = 0; ih < d.h; ++ih) {
        for (int64_t iw = 0; iw < d.w; ++iw) plane[ih * dx.sh + iw * dx.sw] = T(0);
      }
      for (int64_t p = 0; p < d.p; ++p) {
        const int64_t h0 = p * sh.stride_h - sh.pad_h;
        for (int64_t q = 0; q < d.q; ++q) {
          const T* src = dcol + ((ni * d.p + p) * d.q + q) * d.crs + c * d.rs;
          const int64_t w0 = q * sh.stride_w - sh.pad_w;
          for (int64_t r = 0; r < d.r; ++r) {
            const int64_t ih = h0 + r * sh.dil_h;
            if (ih < 0 || ih >= d.h) continue;
            T* row = plane + ih * dx.sh;
            for (int64_t s = 0; s < d.s; ++s) {
              const int64_t iw = w0 + s * sh.dil_w;
              if (iw >= 0 && iw < d.w) row[iw * dx.sw] += src[r * d.s + s];
            }
          }
        }
      }
    }
  });
}

// Per-channel sum (and sum of squares, when sum_sq is set) of y over N, P, Q, in float64, deterministic. y is
// NCHW-contiguous (nhwc false) or NHWC-contiguous: element (n, k, pq) at n K P Q + k P Q + pq, or (n P Q + pq) K + k.
template <typename T>
void channel_sums(const T* y, const Dims& d, bool nhwc, double* sum, double* sum_sq) {
  if (!nhwc) {
    const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, d.n * d.pq));
    at::parallel_for(0, d.k, grain, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        double s1 = 0, s2 = 0;
        for (int64_t n = 0; n < d.n; ++n) {
          const T* plane = y + (n * d.k + k) * d.pq;
          for (int64_t i = 0; i < d.pq; ++i) {
            const double v = static_cast<double>(plane[i]);
            s1 += v;
            s2 += v * v;
          }
        }
        sum[k] = s1;
        if (sum_sq != nullptr) sum_sq[k] = s2;
      }
    });
    return;
  }
  // Rows (n, pq) of K values: fixed chunks of rows summed in parallel, then the chunks added in order.
  constexpr int64_t kRows = 256;
  const int64_t m = d.n * d.pq, chunks = (m + kRows - 1) / kRows;
  std::vector<double> partial(chunks * d.k * 2);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      double* s1 = partial.data() + ch * d.k * 2;
      double* s2 = s1 + d.k;
      std::fill(s1, s1 + 2 * d.k, 0.0);
      for (int64_t i = ch * kRows; i < std::min(m, (ch + 1) * kRows); ++i) {
        const T* row = y + i * d.k;
        for (int64_t k = 0; k < d.k; ++k) {
          const double v = static_cast<double>(row[k]);
          s1[k] += v;
          s2[k] += v * v;
        }
      }
    }
  });
  for (int64_t k = 0; k < d.k; ++k) {
    double s1 = 0, s2 = 0;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      s1 += partial[ch * d.k * 2 + k];
      s2 += partial[ch * d.k * 2 + d.k + k];
    }
    sum[k] = s1;
    if (sum_sq != nullptr) sum_sq[k] = s2;
  }
}

// y = act(conv(x, w) + bias), y a new NCHW- or NHWC-contiguous tensor; w (K, C/G, R, S) contiguous.
template <typename T>
void forward_impl(const at::Tensor& input, const at::Tensor& w, const T* bias, MatmulActivation act,
                  const Conv2dShape& sh, at::Tensor& out, bool nhwc) {
  const Dims d(sh);
  if (d.n == 0 || d.k == 0) return;
  const Strided4<const T> x{input.const_data_ptr<T>(), input.stride(0), input.stride(1), input.stride(2),
                            input.stride(3)};
  const T* w0 = w.const_data_ptr<T>();
  T* y = out.mutable_data_ptr<T>();
  const int64_t chunk = d.chunk<T>();
  std::unique_ptr<T[]> col(new T[std::max<int64_t>(1, chunk * d.pq * d.crs)]);
  for (int64_t n0 = 0; n0 < d.n; n0 += chunk) {
    const int64_t nc = std::min(chunk, d.n - n0);
    im2col(x, d, sh, n0, nc, col.get());
    for (int64_t g = 0; g < d.g; ++g) {
      MatmulArgs<T> a;
      if (nhwc) {
        // (nc P Q x C/G R S) @ w_g^T: rows (n, pq) of the output, K apart; bias and relu in the GEMM's epilogue.
        a.m = nc * d.pq;
        a.n = d.kg;
        a.k = d.cg_rs;
        a.a = col.get() + g * d.cg_rs;
        a.a_rs = d.crs;
        a.a_cs = 1;
        a.b = w0 + g * d.kg * d.cg_rs;
        a.b_rs = 1;
        a.b_cs = d.cg_rs;
        a.c = y + n0 * d.pq * d.k + g * d.kg;
        a.c_rs = d.k;
        a.bias = bias != nullptr ? bias + g * d.kg : nullptr;
        a.act = act;
      } else {
        // w_g @ col_g^T per image (batched): (K/G x C/G R S) @ (C/G R S x P Q) into the image's channels of group g.
        a.batch = nc;
        a.m = d.kg;
        a.n = d.pq;
        a.k = d.cg_rs;
        a.a = w0 + g * d.kg * d.cg_rs;
        a.a_rs = d.cg_rs;
        a.a_cs = 1;
        a.b = col.get() + g * d.cg_rs;
        a.b_rs = 1;
        a.b_cs = d.crs;
        a.b_bs = d.pq * d.crs;
        a.c = y + (n0 * d.k + g * d.kg) * d.pq;
        a.c_rs = d.pq;
        a.c_bs = d.k * d.pq;
      }
      gemm_cpu(a);
    }
    if (!nhwc && (bias != nullptr || act != MatmulActivation::none)) {
      // The epilogue per (image, channel) plane: z + bias[k], then relu.
      const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / d.pq);
      at::parallel_for(0, nc * d.k, grain, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          T* plane = y + (n0 * d.k + t) * d.pq;
          const T b = bias != nullptr ? bias[t % d.k] : T(0);
          if (act == MatmulActivation::relu) {
            for (int64_t i = 0; i < d.pq; ++i) plane[i] = math::relu_forward(plane[i] + b);
          } else {
            for (int64_t i = 0; i < d.pq; ++i) plane[i] += b;
          }
        }
      });
    }
  }
}

struct ForwardResult {
  at::Tensor out;
  bool nhwc;
  Conv2dShape shape;
};

// The shared part of conv2d and conv2d_stats: checks, the output in the layout rule's format, the forward pass.
ForwardResult conv2d_forward(std::string_view op, const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation, int64_t groups, MatmulActivation act,
                             const std::optional<c10::string_view>& variant) {
  const Conv2dParams p = check_conv2d_args(op, input, weight, bias, stride, padding, dilation, groups);
  check_cpu_variant(op, variant);
  const Conv2dShape sh = conv2d_shape(input, weight, p);
  const at::MemoryFormat fmt = conv2d_memory_format(input, weight);
  at::Tensor out = at::empty(conv2d_out_shape(input, weight, p), input.options().memory_format(fmt));
  const bool nhwc = fmt == at::MemoryFormat::ChannelsLast;
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "torchext_conv2d_cpu", [&] {
    forward_impl<scalar_t>(input, w, b.defined() ? b.const_data_ptr<scalar_t>() : nullptr, act, sh, out, nhwc);
  });
  return {out, nhwc, sh};
}

at::Tensor conv2d_cpu(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                      c10::string_view activation, std::optional<c10::string_view> variant) {
  constexpr const char* op = "torchext::conv2d";
  const MatmulActivation act = parse_conv2d_activation(op, activation);
  return conv2d_forward(op, input, weight, bias, stride, padding, dilation, groups, act, variant).out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_stats_cpu(const at::Tensor& input, const at::Tensor& weight,
                                                                const std::optional<at::Tensor>& bias,
                                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                                at::IntArrayRef dilation, int64_t groups,
                                                                std::optional<c10::string_view> variant) {
  constexpr const char* op = "torchext::conv2d_stats";
  const ForwardResult f =
      conv2d_forward(op, input, weight, bias, stride, padding, dilation, groups, MatmulActivation::none, variant);
  const Dims d(f.shape);
  const int64_t k = d.k;
  // The statistics' dtype is the input's on the CPU: float32 or float64.
  at::Tensor sum = at::empty({k}, input.options()), sum_sq = at::empty({k}, input.options());
  std::vector<double> s1(k), s2(k);
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "torchext_conv2d_stats_cpu", [&] {
    channel_sums<scalar_t>(f.out.const_data_ptr<scalar_t>(), d, f.nhwc, s1.data(), s2.data());
    for (int64_t i = 0; i < k; ++i) {
      sum.mutable_data_ptr<scalar_t>()[i] = static_cast<scalar_t>(s1[i]);
      sum_sq.mutable_data_ptr<scalar_t>()[i] = static_cast<scalar_t>(s2[i]);
    }
  });
  return {f.out, sum, sum_sq};
}

// dx (mask[0]) and dw (mask[1], into gw: (K, C/G R S) contiguous) from dy (NHWC-contiguous).
template <typename T>
void backward_impl(const T* dy, const at::Tensor& input, const at::Tensor& w, const Conv2dShape& sh,
                   at::Tensor* grad_input, T* gw) {
  const Dims d(sh);
  const int64_t chunk = d.chunk<T>();
  const int64_t col_size = std::max<int64_t>(1, chunk * d.pq * d.crs);
  if (grad_input != nullptr && d.n > 0) {
    const Strided4<T> dx = strided4<T>(*grad_input);
    const T* w0 = w.const_data_ptr<T>();
    std::unique_ptr<T[]> dcol(new T[col_size]);
    for (int64_t n0 = 0; n0 < d.n; n0 += chunk) {
      const int64_t nc = std::min(chunk, d.n - n0);
      for (int64_t g = 0; g < d.g; ++g) {
        // dy_g^T (nc P Q x K/G, rows K apart) @ w_g (K/G x C/G R S) into group g's columns of dcol.
        MatmulArgs<T> a;
        a.m = nc * d.pq;
        a.n = d.cg_rs;
        a.k = d.kg;
        a.a = dy + n0 * d.pq * d.k + g * d.kg;
        a.a_rs = d.k;
        a.a_cs = 1;
        a.b = w0 + g * d.kg * d.cg_rs;
        a.b_rs = d.cg_rs;
        a.b_cs = 1;
        a.c = dcol.get() + g * d.cg_rs;
        a.c_rs = d.crs;
        gemm_cpu(a);
      }
      col2im(dcol.get(), d, sh, n0, nc, dx);
    }
  }
  if (gw != nullptr) {
    const int64_t numel = d.k * d.cg_rs;
    if (d.n == 0) {
      std::fill(gw, gw + numel, T(0));
      return;
    }
    const Strided4<const T> x{input.const_data_ptr<T>(), input.stride(0), input.stride(1), input.stride(2),
                              input.stride(3)};
    std::unique_ptr<T[]> col(new T[col_size]);
    std::unique_ptr<T[]> partial(d.n > chunk ? new T[std::max<int64_t>(1, numel)] : nullptr);
    for (int64_t n0 = 0; n0 < d.n; n0 += chunk) {
      const int64_t nc = std::min(chunk, d.n - n0);
      T* dst = n0 == 0 ? gw : partial.get();
      im2col(x, d, sh, n0, nc, col.get());
      for (int64_t g = 0; g < d.g; ++g) {
        // dy_g (K/G x nc P Q, columns K apart) @ col_g (nc P Q x C/G R S): the reduction over the chunk's images
        // and positions is the GEMM's K dimension.
        MatmulArgs<T> a;
        a.m = d.kg;
        a.n = d.cg_rs;
        a.k = nc * d.pq;
        a.a = dy + n0 * d.pq * d.k + g * d.kg;
        a.a_rs = 1;
        a.a_cs = d.k;
        a.b = col.get() + g * d.cg_rs;
        a.b_rs = d.crs;
        a.b_cs = 1;
        a.c = dst + g * d.kg * d.cg_rs;
        a.c_rs = d.cg_rs;
        gemm_cpu(a);
      }
      if (n0 > 0) {
        at::parallel_for(0, numel, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) gw[i] += dst[i];
        });
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> output_mask,
    std::optional<c10::string_view> variant, std::optional<at::ScalarType> grad_weight_dtype) {
  constexpr const char* op = "torchext::conv2d_backward";
  const Conv2dParams p = check_conv2d_backward_args(op, grad_output, input, weight, stride, padding, dilation, groups);
  // float32 and float64 only here, so grad_weight_dtype can only name the weight's own dtype.
  check_grad_weight_dtype(op, weight, grad_weight_dtype);
  check_cpu_variant(op, variant);
  const Conv2dShape sh = conv2d_shape(input, weight, p);
  const Dims d(sh);
  const at::TensorOptions opts = grad_output.options();
  at::Tensor grad_input = at::empty({0}, opts), grad_weight = at::empty({0}, opts), grad_bias = at::empty({0}, opts);
  if (!(output_mask[0] || output_mask[1] || output_mask[2])) return {grad_input, grad_weight, grad_bias};
  // grad_output in NHWC: rows (n, p, q) of K values, whatever layout it came in.
  const at::Tensor dy = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  if (output_mask[0]) grad_input = at::empty(input.sizes(), opts.memory_format(conv2d_memory_format(input, weight)));
  at::Tensor gw;
  if (output_mask[1]) {
    const at::MemoryFormat wfmt = conv2d_memory_format(weight);  // csrc/conv2d.h's rule, for grad_weight
    grad_weight = at::empty(weight.sizes(), opts.memory_format(wfmt));
    gw = wfmt == at::MemoryFormat::Contiguous ? grad_weight : at::empty(weight.sizes(), opts);
  }
  if (output_mask[2]) grad_bias = at::empty({d.k}, opts);
  const at::Tensor w = output_mask[0] ? weight.contiguous() : weight;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "torchext_conv2d_backward_cpu", [&] {
    const scalar_t* dy0 = dy.const_data_ptr<scalar_t>();
    if (output_mask[0] || output_mask[1]) {
      backward_impl<scalar_t>(dy0, input, w, sh, output_mask[0] ? &grad_input : nullptr,
                              output_mask[1] ? gw.mutable_data_ptr<scalar_t>() : nullptr);
    }
    if (output_mask[2]) {
      std::vector<double> s1(d.k);
      channel_sums<scalar_t>(dy0, d, /*nhwc=*/true, s1.data(), nullptr);
      scalar_t* gb = grad_bias.mutable_data_ptr<scalar_t>();
      for (int64_t k = 0; k < d.k; ++k) gb[k] = static_cast<scalar_t>(s1[k]);
    }
  });
  if (output_mask[1] && !gw.is_same(grad_weight)) grad_weight.copy_(gw);
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("conv2d", &conv2d_cpu);
  m.impl("conv2d_stats", &conv2d_stats_cpu);
  m.impl("conv2d_backward", &conv2d_backward_cpu);
}

}  // namespace torchext
