// CPU kernels for torchext::batch_norm, batch_norm_relu, batch_norm_add_relu and batch_norm_backward: float32,
// float64, float16 and bfloat16, all computed in float64 (the CPU is the accurate reference path; torch's own CPU
// kernels accumulate float32 in float64 too), any layout (csrc/batch_norm.h's rule), deterministic.
//
//   x is viewed as (A, C, B) (cuda_ops/batch_norm_args.h): rows x C for channels-last, planes for contiguous.
//   forward   statistics: two passes in float64 over each channel, the mean, then sum (x - mean) and
//             sum (x - mean)^2 (cuda_ops/batch_norm_math.h turns them into mean and var_sum); or from given sums.
//             Then y = act((x - mean) w invstd + b [+ residual]) and the relu mask in one pass, in float64.
//   backward  sum dz and sum dz (x - mean) in float64 (dz = dy & mask), then dx and grad_residual in one pass, in
//             float64: dx = w invstd (dz - mean(dz) - (x - mean) invstd^2 mean(dz (x - mean))).
//
// Reductions are deterministic whatever the thread count: rows x C cuts the rows into fixed chunks of kRows, sums
// each chunk in parallel and adds the chunks in order; planes give each channel to one thread, in memory order.
// Elementwise passes run over units of 8 elements (one mask byte each) in parallel.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "activation_math.h"
#include "batch_norm.h"
#include "batch_norm_math.h"
#include "checks.h"

namespace torchext {
namespace {

using cuda_ops::BatchNormShape;

constexpr int64_t kRows = 256;  // rows per chunk of the rows x C reductions
constexpr int64_t kUnitsGrain = 4096;

// The CPU runs one kernel, "cpu"; the CUDA ladder's names are refused with a pointer to the device they need.
void check_cpu_variant(std::string_view op, const std::optional<c10::string_view>& variant) {
  if (!variant.has_value() || *variant == "cpu") return;
  const std::string_view name(variant->data(), variant->size());
  for (const char* cuda_name : cuda_ops::kBatchNormKernelNames) {
    TORCH_CHECK_VALUE(name != cuda_name, op, ": variant '", name,
                      "' runs on CUDA tensors; CPU tensors take variant=None or 'cpu'");
  }
  TORCH_CHECK_VALUE(false, op, ": unknown variant '", name, "'; valid names are 'cpu' (CPU tensors) and ",
                    cuda_batch_norm_kernel_list(), " (CUDA tensors)");
}

// The computation type of an element type: float for float, half and bfloat16, double for double.
template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// out[k C + c] = the sum over channel c's elements of f(offset, c)[k], in float64, deterministic (see the top).
template <int K, typename F>
void channel_reduce(const BatchNormShape& s, F f, double* out) {
  const int64_t A = s.a, C = s.c, B = s.b;
  std::fill(out, out + K * C, 0.0);
  if (A * B == 0 || C == 0) return;
  if (B == 1) {
    const int64_t chunks = (A + kRows - 1) / kRows;
    std::vector<double> partial(chunks * K * C, 0.0);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      std::array<double, K> v;
      for (int64_t ch = begin; ch < end; ++ch) {
        double* p = partial.data() + ch * K * C;
        for (int64_t row = ch * kRows; row < std::min(A, (ch + 1) * kRows); ++row) {
          for (int64_t c = 0; c < C; ++c) {
            f(row * C + c, c, v);
            for (int k = 0; k < K; ++k) p[k * C + c] += v[k];
          }
        }
      }
    });
    for (int64_t ch = 0; ch < chunks; ++ch) {
      for (int64_t i = 0; i < K * C; ++i) out[i] += partial[ch * K * C + i];
    }
    return;
  }
  at::parallel_for(0, C, 1, [&](int64_t begin, int64_t end) {
    std::array<double, K> v;
    for (int64_t c = begin; c < end; ++c) {
      std::array<double, K> acc{};
      for (int64_t a = 0; a < A; ++a) {
        for (int64_t b = 0, off = (a * C + c) * B; b < B; ++b, ++off) {
          f(off, c, v);
          for (int k = 0; k < K; ++k) acc[k] += v[k];
        }
      }
      for (int k = 0; k < K; ++k) out[k * C + c] = acc[k];
    }
  });
}

// f(e, c) for every element e (memory order) with its channel c, over units of 8 elements: f_unit(u) is called
// after unit u's elements (to store its mask byte). Parallel over units.
template <typename F, typename U>
void for_each_unit(const BatchNormShape& s, int64_t numel, F f, U f_unit) {
  const int64_t units = (numel + 7) / 8;
  at::parallel_for(0, units, kUnitsGrain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t e0 = u * 8, e1 = std::min(numel, e0 + 8);
      int64_t c = s.b == 1 ? e0 % s.c : (e0 / s.b) % s.c;
      int64_t b = s.b == 1 ? 0 : e0 % s.b;
      for (int64_t e = e0; e < e1; ++e) {
        f(e, c, e - e0);
        if (++b == s.b) {
          b = 0;
          if (++c == s.c) c = 0;
        }
      }
      f_unit(u);
    }
  });
}

template <typename T, typename P>
struct ForwardPointers {
  const T* x;
  const T* residual;
  T* y;
  uint8_t* mask;
  const P* weight;
  const P* bias;
  P* running_mean;
  P* running_var;
  const opmath_t<T>* sum;
  const opmath_t<T>* sum_sq;
  opmath_t<T>* save_mean;
  opmath_t<T>* save_invstd;
};

template <typename T, typename P>
void forward_impl(const ForwardPointers<T, P>& p, const BatchNormShape& s, int64_t numel, bool training,
                  double momentum, double eps) {
  using A = opmath_t<T>;
  const int64_t C = s.c, n = s.a * s.b;
  std::vector<double> mean(C), invstd(C);
  if (training) {
    std::vector<double> var_sum(C);
    if (p.sum != nullptr) {
      for (int64_t c = 0; c < C; ++c) {
        const auto st = math::stats_from_shifted_sums(0.0, p.sum[c], p.sum_sq[c], n);
        mean[c] = st.mean;
        var_sum[c] = st.var_sum;
      }
    } else {
      std::vector<double> s1(C), s2(2 * C);
      const T* x = p.x;
      channel_reduce<1>(
          s, [x](int64_t e, int64_t, std::array<double, 1>& v) { v[0] = static_cast<double>(x[e]); }, s1.data());
      for (int64_t c = 0; c < C; ++c) s1[c] = n > 0 ? s1[c] / static_cast<double>(n) : 0.0;
      const double* m = s1.data();
      channel_reduce<2>(
          s,
          [x, m](int64_t e, int64_t c, std::array<double, 2>& v) {
            const double d = static_cast<double>(x[e]) - m[c];
            v[0] = d;
            v[1] = d * d;
          },
          s2.data());
      for (int64_t c = 0; c < C; ++c) {
        const auto st = math::stats_from_shifted_sums(m[c], s2[c], s2[C + c], n);
        mean[c] = st.mean;
        var_sum[c] = st.var_sum;
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      if (n == 0) {  // nothing to normalize: no statistics, the running ones untouched
        mean[c] = 0;
        invstd[c] = 0;
        continue;
      }
      invstd[c] = math::inv_std(var_sum[c] / static_cast<double>(n), eps);
      if (p.running_mean != nullptr) {
        p.running_mean[c] =
            static_cast<P>(math::running_update(momentum, mean[c], static_cast<double>(p.running_mean[c])));
      }
      if (p.running_var != nullptr) {
        p.running_var[c] = static_cast<P>(
            math::running_update(momentum, math::unbiased_var(var_sum[c], n), static_cast<double>(p.running_var[c])));
      }
    }
  } else {
    for (int64_t c = 0; c < C; ++c) {
      mean[c] = static_cast<double>(p.running_mean[c]);
      invstd[c] = math::inv_std(static_cast<double>(p.running_var[c]), eps);
    }
  }
  std::vector<double> scale(C), shift(C);
  for (int64_t c = 0; c < C; ++c) {
    p.save_mean[c] = static_cast<A>(mean[c]);
    p.save_invstd[c] = static_cast<A>(invstd[c]);
    const double w = p.weight != nullptr ? static_cast<double>(p.weight[c]) : 1.0;
    scale[c] = w * invstd[c];
    shift[c] = p.bias != nullptr ? static_cast<double>(p.bias[c]) : 0.0;
  }
  if (numel == 0) return;
  const bool relu = p.mask != nullptr;
  for_each_unit(
      s, numel,
      [&](int64_t e, int64_t c, int64_t j) {
        double v = (static_cast<double>(p.x[e]) - mean[c]) * scale[c] + shift[c];
        if (p.residual != nullptr) v += static_cast<double>(p.residual[e]);
        if (relu) {
          // The unit's byte is assembled in the mask itself: it is this thread's alone.
          const uint8_t bit = math::relu_bit(v) ? uint8_t(1u << j) : uint8_t(0);
          p.mask[e / 8] = j == 0 ? bit : uint8_t(p.mask[e / 8] | bit);
          v = math::relu_forward(v);
        }
        p.y[e] = static_cast<T>(v);
      },
      [](int64_t) {});
}

template <typename T, typename P>
struct BackwardPointers {
  const T* grad_out;
  const T* x;
  const uint8_t* mask;
  const P* weight;
  const opmath_t<T>* save_mean;
  const opmath_t<T>* save_invstd;
  T* grad_input;
  P* grad_weight;
  P* grad_bias;
  T* grad_residual;
};

template <typename T>
inline double masked(const T* g, const uint8_t* mask, int64_t e) {
  if (mask != nullptr && ((mask[e / 8] >> (e % 8)) & 1) == 0) return 0.0;
  return static_cast<double>(g[e]);
}

template <typename T, typename P>
void backward_impl(const BackwardPointers<T, P>& p, const BatchNormShape& s, int64_t numel, bool training) {
  using A = opmath_t<T>;
  const int64_t C = s.c, n = s.a * s.b;
  const bool need_sums = p.grad_weight != nullptr || p.grad_bias != nullptr || (training && p.grad_input != nullptr);
  std::vector<double> sums(2 * C, 0.0);
  if (need_sums) {
    const T* g = p.grad_out;
    const T* x = p.x;
    const uint8_t* mask = p.mask;
    const A* m = p.save_mean;
    channel_reduce<2>(
        s,
        [=](int64_t e, int64_t c, std::array<double, 2>& v) {
          const double dz = masked(g, mask, e);
          v[0] = dz;
          v[1] = dz * (static_cast<double>(x[e]) - static_cast<double>(m[c]));
        },
        sums.data());
  }
  std::vector<double> k(C), q(C), r(C), mean(C);
  for (int64_t c = 0; c < C; ++c) {
    const double invstd = static_cast<double>(p.save_invstd[c]);
    const double w = p.weight != nullptr ? static_cast<double>(p.weight[c]) : 1.0;
    if (p.grad_bias != nullptr) p.grad_bias[c] = static_cast<P>(sums[c]);
    if (p.grad_weight != nullptr) p.grad_weight[c] = static_cast<P>(sums[C + c] * invstd);
    // dx = k (dz - r - q (x - mean)): mean(dz) and invstd^2 mean(dz (x - mean)) in training, else 0
    k[c] = w * invstd;
    mean[c] = static_cast<double>(p.save_mean[c]);
    const bool stats = training && n > 0;
    q[c] = stats ? invstd * invstd * sums[C + c] / static_cast<double>(n) : 0.0;
    r[c] = stats ? sums[c] / static_cast<double>(n) : 0.0;
  }
  if (numel == 0 || (p.grad_input == nullptr && p.grad_residual == nullptr)) return;
  for_each_unit(
      s, numel,
      [&](int64_t e, int64_t c, int64_t) {
        const double dz = masked(p.grad_out, p.mask, e);
        if (p.grad_residual != nullptr) p.grad_residual[e] = static_cast<T>(dz);
        if (p.grad_input != nullptr) {
          const double v = training ? dz - r[c] - q[c] * (static_cast<double>(p.x[e]) - mean[c]) : dz;
          p.grad_input[e] = static_cast<T>(k[c] * v);
        }
      },
      [](int64_t) {});
}

template <typename T>
const T* opt_ptr(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr<T>() : nullptr;
}

// Runs fn.template operator()<P>() with P the parameters' C++ type: scalar_t, or float for a float32 parameter of a
// half / bfloat16 input.
template <typename scalar_t, typename F>
void dispatch_params(at::ScalarType pdt, F&& fn) {
  if constexpr (std::is_same_v<scalar_t, c10::Half> || std::is_same_v<scalar_t, c10::BFloat16>) {
    if (pdt == at::kFloat) return fn.template operator()<float>();
  }
  fn.template operator()<scalar_t>();
}

// A running buffer the kernel can update in place: itself where contiguous, else a contiguous copy written back by
// finish().
struct Buffer {
  std::optional<at::Tensor> given, work;
  explicit Buffer(const std::optional<at::Tensor>& t) : given(t) {
    if (t.has_value() && t->defined()) work = t->is_contiguous() ? *t : t->contiguous();
  }
  template <typename P>
  P* ptr() {
    return work.has_value() ? work->mutable_data_ptr<P>() : nullptr;
  }
  void finish() {
    if (work.has_value() && !work->is_same(*given)) given->copy_(*work);
  }
};

// The three forward ops: `relu` adds the mask output, `residual` the add.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    std::string_view op, const at::Tensor& input, const at::Tensor* residual, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    const std::optional<c10::string_view>& variant, bool relu, const std::optional<at::Tensor>& num_batches_tracked) {
  const at::ScalarType pdt = check_batch_norm_args(op, input, residual, weight, bias, running_mean, running_var,
                                                   training, sum, sum_sq, num_batches_tracked);
  check_cpu_variant(op, variant);
  const at::MemoryFormat fmt = batch_norm_memory_format(input);
  const BatchNormShape s = batch_norm_shape(input, fmt);
  const at::Tensor x = in_format(input, fmt);
  const at::Tensor res = residual != nullptr ? in_format(*residual, fmt) : at::Tensor();
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(fmt));
  at::Tensor mask = relu ? at::empty({batch_norm_mask_bytes(input.numel())}, input.options().dtype(at::kByte))
                         : at::empty({0}, input.options().dtype(at::kByte));
  const auto st_opts = input.options().dtype(batch_norm_stats_dtype(input.scalar_type()));
  at::Tensor save_mean = at::empty({s.c}, st_opts), save_invstd = at::empty({s.c}, st_opts);
  Buffer rm(training ? running_mean : std::nullopt), rv(training ? running_var : std::nullopt);
  const at::Tensor rm_eval = training ? at::Tensor() : running_mean->contiguous();
  const at::Tensor rv_eval = training ? at::Tensor() : running_var->contiguous();
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  const at::Tensor sum_c = sum.has_value() && sum->defined() ? sum->contiguous() : at::Tensor();
  const at::Tensor sum_sq_c = sum_c.defined() ? sum_sq->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "torchext_batch_norm_cpu", [&] {
    using A = opmath_t<scalar_t>;
    dispatch_params<scalar_t>(pdt, [&]<typename P>() {
      ForwardPointers<scalar_t, P> p{};
      p.x = x.const_data_ptr<scalar_t>();
      p.residual = res.defined() ? res.const_data_ptr<scalar_t>() : nullptr;
      p.y = out.mutable_data_ptr<scalar_t>();
      p.mask = relu ? mask.mutable_data_ptr<uint8_t>() : nullptr;
      p.weight = w.defined() ? w.const_data_ptr<P>() : nullptr;
      p.bias = b.defined() ? b.const_data_ptr<P>() : nullptr;
      p.running_mean = training ? rm.ptr<P>() : const_cast<P*>(rm_eval.const_data_ptr<P>());
      p.running_var = training ? rv.ptr<P>() : const_cast<P*>(rv_eval.const_data_ptr<P>());
      p.sum = sum_c.defined() ? sum_c.const_data_ptr<A>() : nullptr;
      p.sum_sq = sum_c.defined() ? sum_sq_c.const_data_ptr<A>() : nullptr;
      p.save_mean = save_mean.mutable_data_ptr<A>();
      p.save_invstd = save_invstd.mutable_data_ptr<A>();
      forward_impl<scalar_t, P>(p, s, input.numel(), training, momentum, eps);
    });
  });
  rm.finish();
  rv.finish();
  if (num_batches_tracked.has_value() && num_batches_tracked->defined()) num_batches_tracked->add_(1);
  return {out, mask, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_cpu(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  auto [out, mask, save_mean, save_invstd] =
      forward("torchext::batch_norm", input, nullptr, weight, bias, running_mean, running_var, training, momentum, eps,
              sum, sum_sq, variant, false, num_batches_tracked);
  return {out, save_mean, save_invstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_relu_cpu(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps, const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  return forward("torchext::batch_norm_relu", input, nullptr, weight, bias, running_mean, running_var, training,
                 momentum, eps, sum, sum_sq, variant, true, num_batches_tracked);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_add_relu_cpu(
    const at::Tensor& input, const at::Tensor& residual, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    const std::optional<at::Tensor>& sum, const std::optional<at::Tensor>& sum_sq,
    std::optional<c10::string_view> variant, const std::optional<at::Tensor>& num_batches_tracked) {
  return forward("torchext::batch_norm_add_relu", input, &residual, weight, bias, running_mean, running_var, training,
                 momentum, eps, sum, sum_sq, variant, true, num_batches_tracked);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const at::Tensor& save_mean, const at::Tensor& save_invstd, const std::optional<at::Tensor>& mask, bool training,
    double eps, std::array<bool, 4> output_mask, std::optional<c10::string_view> variant) {
  constexpr const char* op = "torchext::batch_norm_backward";
  const at::ScalarType gdt =
      check_batch_norm_backward_args(op, grad_out, input, weight, save_mean, save_invstd, mask, output_mask);
  check_cpu_variant(op, variant);
  (void)eps;  // the kernels read save_invstd; eps is the composed double backward's (csrc/batch_norm_autograd.cpp)
  const at::MemoryFormat fmt = batch_norm_memory_format(input);
  const BatchNormShape s = batch_norm_shape(input, fmt);
  const at::TensorOptions opts = input.options();
  const at::Tensor empty = at::empty({0}, opts);
  at::Tensor grad_input = output_mask[0] ? at::empty(input.sizes(), opts.memory_format(fmt)) : empty;
  at::Tensor grad_weight = output_mask[1] ? at::empty({s.c}, opts.dtype(gdt)) : at::empty({0}, opts.dtype(gdt));
  at::Tensor grad_bias = output_mask[2] ? at::empty({s.c}, opts.dtype(gdt)) : at::empty({0}, opts.dtype(gdt));
  at::Tensor grad_residual = output_mask[3] ? at::empty(input.sizes(), opts.memory_format(fmt)) : at::empty({0}, opts);
  if (!(output_mask[0] || output_mask[1] || output_mask[2] || output_mask[3])) {
    return {grad_input, grad_weight, grad_bias, grad_residual};
  }
  const at::Tensor x = in_format(input, fmt);
  const at::Tensor g = in_format(grad_out, fmt);
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  const at::Tensor m = mask.has_value() && mask->defined() ? mask->contiguous() : at::Tensor();
  const at::Tensor sm = save_mean.contiguous(), si = save_invstd.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "torchext_batch_norm_backward_cpu", [&] {
        using A = opmath_t<scalar_t>;
        dispatch_params<scalar_t>(gdt, [&]<typename P>() {
          BackwardPointers<scalar_t, P> p{};
          p.grad_out = g.const_data_ptr<scalar_t>();
          p.x = x.const_data_ptr<scalar_t>();
          p.mask = m.defined() ? m.const_data_ptr<uint8_t>() : nullptr;
          p.weight = w.defined() ? w.const_data_ptr<P>() : nullptr;
          p.save_mean = sm.const_data_ptr<A>();
          p.save_invstd = si.const_data_ptr<A>();
          p.grad_input = output_mask[0] ? grad_input.mutable_data_ptr<scalar_t>() : nullptr;
          p.grad_weight = output_mask[1] ? grad_weight.mutable_data_ptr<P>() : nullptr;
          p.grad_bias = output_mask[2] ? grad_bias.mutable_data_ptr<P>() : nullptr;
          p.grad_residual = output_mask[3] ? grad_residual.mutable_data_ptr<scalar_t>() : nullptr;
          backward_impl<scalar_t, P>(p, s, input.numel(), training);
        });
      });
  return {grad_input, grad_weight, grad_bias, grad_residual};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("batch_norm", &batch_norm_cpu);
  m.impl("batch_norm_relu", &batch_norm_relu_cpu);
  m.impl("batch_norm_add_relu", &batch_norm_add_relu_cpu);
  m.impl("batch_norm_backward", &batch_norm_backward_cpu);
}

}  // namespace torchext
