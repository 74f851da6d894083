// CPU kernel for torchext::cross_entropy: per row, a max pass and a sum-of-exp pass give lse; the loss and the
// gradient follow the formulas in cuda_ops/cross_entropy.cu. at::parallel_for over rows; the reduction over rows
// runs serially in float64 so 'mean' and 'sum' do not depend on the thread count.
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cross_entropy.h"
#include "loss_reduction.h"

namespace torchext {
namespace {

constexpr const char* kOp = "torchext::cross_entropy";

void check_targets_in_range(const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  const int64_t* t = target.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i) {
    TORCH_CHECK_INDEX(t[i] == ignore_index || (t[i] >= 0 && t[i] < classes), kOp, ": `target` values must be in [0, ",
                      classes, ") or equal ignore_index (", ignore_index, "); found ", t[i], " at position ", i);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cross_entropy_cpu(const at::Tensor& self, const at::Tensor& target,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 c10::string_view reduction, int64_t ignore_index,
                                                                 double label_smoothing) {
  check_cross_entropy_args(kOp, self, target, weight, label_smoothing);
  const Reduction red = parse_reduction(kOp, reduction);
  const int64_t N = self.size(0), C = self.size(1);
  const at::Tensor x = self.contiguous(), t = target.contiguous();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  check_targets_in_range(t, C, ignore_index);

  at::Tensor loss = red == Reduction::None ? at::empty({N}, self.options()) : at::empty({}, self.options());
  at::Tensor lse = at::empty({N}, self.options());
  at::Tensor total_weight = at::empty({}, self.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_cross_entropy_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t eps = static_cast<scalar_t>(label_smoothing);
    scalar_t wsum = static_cast<scalar_t>(C);
    if (wp) wsum = std::accumulate(wp, wp + C, scalar_t(0));
    std::vector<scalar_t> row_loss(N), row_weight(N);
    scalar_t* lse_p = lse.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = xp + i * C;
        scalar_t m = -INFINITY;
        for (int64_t c = 0; c < C; ++c) m = std::max(m, row[c]);
        scalar_t s = 0, wx = 0;
        for (int64_t c = 0; c < C; ++c) {
          s += std::isinf(m) && m < 0 ? scalar_t(0) : std::exp(row[c] - m);
          wx += (wp ? wp[c] : scalar_t(1)) * row[c];
        }
        const scalar_t l = m + std::log(s);
        lse_p[i] = l;
        if (tp[i] == ignore_index) {
          row_loss[i] = row_weight[i] = 0;
          continue;
        }
        const scalar_t wt = wp ? wp[tp[i]] : scalar_t(1);
        scalar_t li = (1 - eps) * wt * (l - row[tp[i]]);
        if (eps > 0) li += eps / C * (wsum * l - wx);
        row_loss[i] = li;
        row_weight[i] = wt;
      }
    });
    double loss_sum = 0, weight_sum = 0;
    for (int64_t i = 0; i < N; ++i) {
      loss_sum += row_loss[i];
      weight_sum += row_weight[i];
    }
    total_weight.fill_(weight_sum);
    if (red == Reduction::None) {
      std::copy(row_loss.begin(), row_loss.end(), loss.mutable_data_ptr<scalar_t>());
    } else {
      loss.fill_(red == Reduction::Mean ? cuda_ops::weighted_mean(loss_sum, weight_sum) : loss_sum);
    }
  });
  return {loss, lse, total_weight};
}

at::Tensor cross_entropy_backward_cpu(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight, c10::string_view reduction,
                                      int64_t ignore_index, double label_smoothing, const at::Tensor& lse,
                                      const at::Tensor& total_weight) {
  constexpr const char* op = "torchext::cross_entropy_backward";
  const Reduction red = parse_reduction(op, reduction);
  check_cross_entropy_backward_args(op, grad_output, self, target, weight, label_smoothing, red, lse, total_weight);
  const int64_t N = self.size(0), C = self.size(1);
  const at::Tensor x = self.contiguous(), t = target.contiguous(), g = grad_output.contiguous();
  const at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  const at::Tensor lse_c = lse.to(self.scalar_type()).contiguous();
  at::Tensor grad = at::empty({N, C}, self.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_cross_entropy_backward_cpu", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const int64_t* tp = t.const_data_ptr<int64_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* lp = lse_c.const_data_ptr<scalar_t>();
    scalar_t* out = grad.mutable_data_ptr<scalar_t>();
    const scalar_t eps = static_cast<scalar_t>(label_smoothing);
    scalar_t wsum = static_cast<scalar_t>(C);
    if (wp) wsum = std::accumulate(wp, wp + C, scalar_t(0));
    scalar_t scale = 0;
    if (red == Reduction::Mean) scale = cuda_ops::weighted_mean(gp[0], total_weight.item<scalar_t>());
    if (red == Reduction::Sum) scale = gp[0];
    at::parallel_for(0, N, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        scalar_t* gi = out + i * C;
        const int64_t ti = tp[i];
        if (ti == ignore_index) {
          std::fill(gi, gi + C, scalar_t(0));
          continue;
        }
        TORCH_CHECK_INDEX(ti >= 0 && ti < C, "torchext::cross_entropy_backward: `target` value ", ti,
                          " out of range [0, ", C, ")");
        const scalar_t wt = wp ? wp[ti] : scalar_t(1);
        const scalar_t s = red == Reduction::None ? gp[i] : scale;
        const scalar_t coef = (1 - eps) * wt + eps / C * wsum;
        for (int64_t c = 0; c < C; ++c) {
          scalar_t v = coef * std::exp(xp[i * C + c] - lp[i]);
          if (c == ti) v -= (1 - eps) * wt;
          if (eps > 0) v -= eps / C * (wp ? wp[c] : scalar_t(1));
          gi[c] = s * v;
        }
      }
    });
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("cross_entropy", &cross_entropy_cpu);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cpu);
}

}  // namespace torchext
