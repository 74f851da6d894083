// CPU kernels for the losses (mse_loss, binary_cross_entropy_with_logits, multi_margin_loss), float32 and float64,
// and the argument checks both backends share (declared in csrc/losses.h).
// The math is written out in cuda_ops/losses.cu's header comment. Elementwise parts are one at::parallel_for over
// the flat data; reductions add fixed chunks in parallel and then the chunk sums in order, in double, so a result
// does not depend on the number of threads.
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "checks.h"
#include "losses.h"

namespace torchext {
namespace losses {

void check_pointwise_args(const char* op, const at::Tensor& self, const at::Tensor& target) {
  check_floating(op, self, "self");
  check_like(op, self, "self", target, "target");
}

at::Tensor broadcast_operand(const char* op, const at::Tensor& self, const std::optional<at::Tensor>& operand,
                             const char* name, int64_t* period) {
  *period = 1;
  if (!operand.has_value() || !operand->defined()) return at::Tensor();
  const at::Tensor& t = *operand;
  check_same_device(op, self, "self", t, name);
  check_same_dtype(op, self, "self", t, name);
  TORCH_CHECK_VALUE(at::is_expandable_to(t.sizes(), self.sizes()), op, ": `", name, "` of shape ", t.sizes(),
                    " must broadcast to the shape of `self` ", self.sizes());
  if (t.numel() == 1) return t.reshape({1}).contiguous();
  if (t.dim() >= 1 && t.numel() == t.size(-1) && t.size(-1) == self.size(-1)) {
    *period = std::max<int64_t>(t.size(-1), 1);
    return t.reshape({t.size(-1)}).contiguous();
  }
  *period = std::max<int64_t>(self.numel(), 1);
  return t.expand(self.sizes()).contiguous();
}

BceOperands check_bce_args(const char* op, const at::Tensor& self, const at::Tensor& target,
                           const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& pos_weight) {
  check_pointwise_args(op, self, target);
  BceOperands o;
  o.weight = broadcast_operand(op, self, weight, "weight", &o.weight_period);
  o.pos_weight = broadcast_operand(op, self, pos_weight, "pos_weight", &o.pos_weight_period);
  return o;
}

at::Tensor check_grad_output(const char* op, const at::Tensor& grad_output, const at::Tensor& self,
                             at::IntArrayRef loss_shape, Reduction reduction) {
  check_same_device(op, self, "self", grad_output, "grad_output");
  check_same_dtype(op, self, "self", grad_output, "grad_output");
  if (reduction == Reduction::None) {
    TORCH_CHECK_VALUE(grad_output.sizes() == loss_shape, op, ": `grad_output` must have the loss's shape ", loss_shape,
                      " under reduction='none', got ", grad_output.sizes());
  } else {
    TORCH_CHECK_VALUE(grad_output.dim() == 0, op,
                      ": `grad_output` must be 0-dim under reduction='mean' or 'sum', got shape ", grad_output.sizes());
  }
  return grad_output.contiguous();
}

at::Tensor check_mse_weight(const char* op, const at::Tensor& self, const std::optional<at::Tensor>& weight) {
  if (!weight.has_value() || !weight->defined()) return at::Tensor();
  check_like(op, self, "self", *weight, "weight");
  return weight->contiguous();
}

void check_multi_margin_args(const char* op, const at::Tensor& self, const at::Tensor& target, int64_t p,
                             const std::optional<at::Tensor>& weight, int64_t* rows, int64_t* cols) {
  check_floating(op, self, "self");
  TORCH_CHECK_VALUE(p == 1 || p == 2, op, ": `p` must be 1 or 2, got ", p);
  TORCH_CHECK_VALUE(self.dim() <= 2 && (self.dim() == 0 || self.size(-1) > 0), op,
                    ": `self` must be (N, C) or (C,) with C > 0, or 0-dim, got shape ", self.sizes());
  check_same_device(op, self, "self", target, "target");
  TORCH_CHECK_TYPE(target.scalar_type() == at::kLong, op, ": `target` must be int64 (class indices), got ",
                   target.scalar_type());
  *rows = self.dim() == 2 ? self.size(0) : 1;
  *cols = self.dim() == 0 ? 1 : self.size(-1);
  TORCH_CHECK_VALUE(target.dim() <= 1 && target.numel() == *rows, op, ": `target` must hold one class index per row (",
                    *rows, "), got shape ", target.sizes());
  if (weight.has_value() && weight->defined()) {
    check_same_device(op, self, "self", *weight, "weight");
    check_same_dtype(op, self, "self", *weight, "weight");
    TORCH_CHECK_VALUE(weight->dim() == 1 && weight->numel() == *cols, op,
                      ": `weight` must be 1-D with one element per class (", *cols, "), got shape ", weight->sizes());
  }
}

std::vector<int64_t> multi_margin_loss_shape(const at::Tensor& target, Reduction reduction) {
  if (reduction == Reduction::None && target.dim() > 0) return {target.numel()};
  return {};
}

[[noreturn]] void report_bad_target(const char* op, int64_t row, int64_t value, int64_t cols, const char* note) {
  TORCH_CHECK_INDEX(false, op, ": `target` at row ", row, " is ", value, ", outside the valid class range [0, ", cols,
                    ")", note);
  __builtin_unreachable();
}

}  // namespace losses

namespace {

using losses::broadcast_operand;
using losses::check_grad_output;

// Sum of f(i) over [0, n) in double: fixed chunks in parallel, then the chunk sums in order.
template <typename F>
double chunked_sum(int64_t n, int64_t chunk, F f) {
  const int64_t nchunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(nchunks, 0.0);
  at::parallel_for(0, nchunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double s = 0.0;
      const int64_t stop = std::min(n, (c + 1) * chunk);
      for (int64_t i = c * chunk; i < stop; ++i) s += static_cast<double>(f(i));
      partial[c] = s;
    }
  });
  double s = 0.0;
  for (double v : partial) s += v;
  return s;
}

// The loss f(i) of every element under 'none', else its sum divided by `divisor` as a 0-dim tensor.
template <typename scalar_t, typename F>
at::Tensor pointwise_loss(const at::Tensor& x, Reduction reduction, double divisor, F f) {
  const int64_t n = x.numel();
  if (reduction == Reduction::None) {
    at::Tensor out = at::empty(x.sizes(), x.options());
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) op[i] = f(i);
    });
    return out;
  }
  const double s = chunked_sum(n, at::internal::GRAIN_SIZE, f);
  return at::scalar_tensor(reduction == Reduction::Mean ? s / divisor : s, x.options());
}

// grad[i] = f(i) * scale * grad_output: under 'none' f(i) * scale * grad_output[i] (in that order, as torch's
// kernels multiply), otherwise f(i) times the scalar grad_output * scale (one rounding, in double).
template <typename scalar_t, typename F>
at::Tensor pointwise_grad(const at::Tensor& x, const at::Tensor& grad_output, Reduction reduction, double scale, F f) {
  at::Tensor grad = at::empty(x.sizes(), x.options());
  const scalar_t* gp = grad_output.const_data_ptr<scalar_t>();
  const bool per_element = reduction == Reduction::None;
  const scalar_t s = static_cast<scalar_t>(scale);
  const scalar_t g0 = per_element ? scalar_t(0) : static_cast<scalar_t>(static_cast<double>(gp[0]) * scale);
  scalar_t* out = grad.mutable_data_ptr<scalar_t>();
  at::parallel_for(0, x.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = per_element ? f(i) * s * gp[i] : f(i) * g0;
  });
  return grad;
}

template <typename scalar_t>
scalar_t operand_at(const scalar_t* p, int64_t period, int64_t i) {
  if (p == nullptr) return scalar_t(1);
  return p[period == 1 ? 0 : (i < period ? i : i % period)];
}

// softplus(-x) = log(1 + e^-x), without overflow for either sign of x.
template <typename scalar_t>
scalar_t softplus_neg(scalar_t x) {
  return std::log1p(std::exp(-std::abs(x))) + std::max(-x, scalar_t(0));
}

at::Tensor mse_loss_cpu(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                        c10::string_view reduction) {
  const char* op = "torchext::mse_loss";
  const Reduction r = parse_reduction(op, reduction);
  losses::check_pointwise_args(op, self, target);
  const at::Tensor w = losses::check_mse_weight(op, self, weight);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_mse_loss_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    double divisor = static_cast<double>(x.numel());
    if (wp != nullptr && r == Reduction::Mean) {
      divisor = chunked_sum(x.numel(), at::internal::GRAIN_SIZE, [=](int64_t i) { return wp[i]; });
    }
    out = pointwise_loss<scalar_t>(x, r, divisor, [=](int64_t i) {
      const scalar_t d = xp[i] - yp[i];
      return wp != nullptr ? wp[i] * d * d : d * d;
    });
  });
  return out;
}

at::Tensor mse_loss_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                 const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::mse_loss_backward";
  const Reduction r = parse_reduction(op, reduction);
  losses::check_pointwise_args(op, self, target);
  const at::Tensor w = losses::check_mse_weight(op, self, weight);
  const at::Tensor g = check_grad_output(op, grad_output, self, self.sizes(), r);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor grad;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_mse_loss_backward_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    // The factor 2 goes into the scale, as torch's mse_loss_backward folds it into 2 / n: 2 (x - y) would overflow
    // for |x - y| above half the dtype's range where (2 / n) (x - y) does not.
    double scale = 2.0;
    if (r == Reduction::Mean) {
      scale = wp != nullptr ? 2.0 / chunked_sum(x.numel(), at::internal::GRAIN_SIZE, [=](int64_t i) { return wp[i]; })
                            : 2.0 / static_cast<double>(x.numel());
    }
    grad = pointwise_grad<scalar_t>(x, g, r, scale, [=](int64_t i) {
      const scalar_t d = xp[i] - yp[i];
      return wp != nullptr ? wp[i] * d : d;
    });
  });
  return grad;
}

at::Tensor binary_cross_entropy_with_logits_cpu(const at::Tensor& self, const at::Tensor& target,
                                                const std::optional<at::Tensor>& weight,
                                                const std::optional<at::Tensor>& pos_weight,
                                                c10::string_view reduction) {
  const char* op = "torchext::binary_cross_entropy_with_logits";
  const Reduction r = parse_reduction(op, reduction);
  const losses::BceOperands o = losses::check_bce_args(op, self, target, weight, pos_weight);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_binary_cross_entropy_with_logits_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const scalar_t* wp = o.weight.defined() ? o.weight.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* pwp = o.pos_weight.defined() ? o.pos_weight.const_data_ptr<scalar_t>() : nullptr;
    out = pointwise_loss<scalar_t>(x, r, static_cast<double>(x.numel()), [=](int64_t i) {
      const scalar_t xi = xp[i], yi = yp[i];
      const scalar_t lw = scalar_t(1) + (operand_at(pwp, o.pos_weight_period, i) - scalar_t(1)) * yi;
      return operand_at(wp, o.weight_period, i) * ((scalar_t(1) - yi) * xi + lw * softplus_neg(xi));
    });
  });
  return out;
}

at::Tensor binary_cross_entropy_with_logits_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self,
                                                         const at::Tensor& target,
                                                         const std::optional<at::Tensor>& weight,
                                                         const std::optional<at::Tensor>& pos_weight,
                                                         c10::string_view reduction, bool wrt_target) {
  const char* op = "torchext::binary_cross_entropy_with_logits_backward";
  const Reduction r = parse_reduction(op, reduction);
  const losses::BceOperands o = losses::check_bce_args(op, self, target, weight, pos_weight);
  const at::Tensor g = check_grad_output(op, grad_output, self, self.sizes(), r);
  const at::Tensor x = self.contiguous(), y = target.contiguous();
  const double scale = r == Reduction::Mean ? 1.0 / static_cast<double>(x.numel()) : 1.0;
  at::Tensor grad;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_binary_cross_entropy_with_logits_backward_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const scalar_t* wp = o.weight.defined() ? o.weight.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* pwp = o.pos_weight.defined() ? o.pos_weight.const_data_ptr<scalar_t>() : nullptr;
    grad = pointwise_grad<scalar_t>(x, g, r, scale, [=](int64_t i) {
      const scalar_t xi = xp[i], yi = yp[i], pwi = operand_at(pwp, o.pos_weight_period, i);
      // d/dy without pos_weight is -x; with it pw softplus(-x) - softplus(x), torch's form: either is inf at
      // x = -inf where (pw - 1) softplus(-x) - x would give inf - inf.
      const scalar_t d = wrt_target ? (pwp == nullptr ? -xi : pwi * softplus_neg(xi) - softplus_neg(-xi))
                                    : (scalar_t(1) + (pwi - scalar_t(1)) * yi) / (scalar_t(1) + std::exp(-xi)) - pwi * yi;
      return operand_at(wp, o.weight_period, i) * d;
    });
  });
  return grad;
}

void check_targets_cpu(const char* op, const at::Tensor& target, int64_t cols) {
  const int64_t* tp = target.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < target.numel(); ++r) {
    if (tp[r] < 0 || tp[r] >= cols) losses::report_bad_target(op, r, tp[r], cols);
  }
}

// Row r's loss: w[t] / C * sum over j != t of max(0, margin - x[t] + x[j])^p, the sum in double.
template <typename scalar_t>
scalar_t multi_margin_row(const scalar_t* xr, int64_t t, const scalar_t* wp, int64_t cols, int64_t p, scalar_t margin) {
  const scalar_t xt = xr[t];
  double s = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    const scalar_t z = margin - xt + xr[j];
    if (j != t && z > scalar_t(0)) s += p == 1 ? z : z * z;
  }
  return static_cast<scalar_t>((wp != nullptr ? static_cast<double>(wp[t]) * s : s) / static_cast<double>(cols));
}

at::Tensor multi_margin_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t p, double margin,
                                 const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::multi_margin_loss";
  const Reduction r = parse_reduction(op, reduction);
  int64_t rows = 0, cols = 0;
  losses::check_multi_margin_args(op, self, target, p, weight, &rows, &cols);
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  check_targets_cpu(op, t, cols);
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / cols);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_multi_margin_loss_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t m = static_cast<scalar_t>(margin);
    auto row_loss = [=](int64_t i) { return multi_margin_row(xp + i * cols, tp[i], wp, cols, p, m); };
    if (r == Reduction::None) {
      out = at::empty(losses::multi_margin_loss_shape(target, r), x.options());
      scalar_t* op_ = out.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) op_[i] = row_loss(i);
      });
    } else {
      const double s = chunked_sum(rows, grain, row_loss);
      out = at::scalar_tensor(r == Reduction::Mean ? s / static_cast<double>(rows) : s, x.options());
    }
  });
  return out;
}

at::Tensor multi_margin_loss_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self,
                                          const at::Tensor& target, int64_t p, double margin,
                                          const std::optional<at::Tensor>& weight, c10::string_view reduction) {
  const char* op = "torchext::multi_margin_loss_backward";
  const Reduction r = parse_reduction(op, reduction);
  int64_t rows = 0, cols = 0;
  losses::check_multi_margin_args(op, self, target, p, weight, &rows, &cols);
  const at::Tensor g = check_grad_output(op, grad_output, self, losses::multi_margin_loss_shape(target, r), r);
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() && weight->defined() ? weight->contiguous() : at::Tensor();
  check_targets_cpu(op, t, cols);
  const double frames = r == Reduction::Mean ? static_cast<double>(rows) : 1.0;
  const double scale = 1.0 / (frames * static_cast<double>(cols));
  at::Tensor grad = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_multi_margin_loss_backward_cpu", [&] {
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    scalar_t* gxp = grad.mutable_data_ptr<scalar_t>();
    const scalar_t m = static_cast<scalar_t>(margin);
    const bool per_row = r == Reduction::None;
    at::parallel_for(0, rows, std::max<int64_t>(1, at::internal::GRAIN_SIZE / cols), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xr = xp + i * cols;
        scalar_t* gr = gxp + i * cols;
        const int64_t ti = tp[i];
        scalar_t gi = static_cast<scalar_t>(static_cast<double>(gp[per_row ? i : 0]) * scale);
        if (wp != nullptr) gi *= wp[ti];
        double sum = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
          const scalar_t z = m - xr[ti] + xr[j];
          const scalar_t h = j != ti && z > scalar_t(0) ? (p == 1 ? gi : scalar_t(2) * gi * z) : scalar_t(0);
          gr[j] = h;
          sum += h;
        }
        gr[ti] = static_cast<scalar_t>(-sum);
      }
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("mse_loss", &mse_loss_cpu);
  m.impl("mse_loss_backward", &mse_loss_backward_cpu);
  m.impl("binary_cross_entropy_with_logits", &binary_cross_entropy_with_logits_cpu);
  m.impl("binary_cross_entropy_with_logits_backward", &binary_cross_entropy_with_logits_backward_cpu);
  m.impl("multi_margin_loss", &multi_margin_loss_cpu);
  m.impl("multi_margin_loss_backward", &multi_margin_loss_backward_cpu);
}

}  // namespace torchext
