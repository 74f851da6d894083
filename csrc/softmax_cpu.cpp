// CPU kernels for softmax and log_softmax over the last dimension: one at::parallel_for over rows, float32 and
// float64. Each row subtracts its max before exp (no overflow) and sums in float64. The math is the one written out
// in cuda_ops/softmax.cu. A 0-dim tensor is one row of one element. Results are contiguous.
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "checks.h"

namespace torchext {
namespace {

// (rows, cols) of a tensor reduced over its last dimension.
std::pair<int64_t, int64_t> rows_cols(const at::Tensor& t) {
  const int64_t cols = t.dim() == 0 ? 1 : t.size(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

int64_t grain_rows(int64_t cols) { return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(cols, 1)); }

template <typename scalar_t>
void forward_rows(const scalar_t* x, scalar_t* y, int64_t rows, int64_t cols, bool log) {
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * cols;
      scalar_t* yr = y + r * cols;
      scalar_t m = xr[0];
      for (int64_t j = 1; j < cols; ++j) m = std::max(m, xr[j]);
      double s = 0;
      if (log) {
        for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - m);
        const auto ls = static_cast<scalar_t>(std::log(s));
        for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) - ls;
      } else {
        for (int64_t j = 0; j < cols; ++j) {
          yr[j] = std::exp(xr[j] - m);
          s += yr[j];
        }
        const auto inv = static_cast<scalar_t>(1.0 / s);
        for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
      }
    }
  });
}

template <typename scalar_t>
void backward_rows(const scalar_t* g, const scalar_t* y, scalar_t* gx, int64_t rows, int64_t cols, bool log) {
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* gr = g + r * cols;
      const scalar_t* yr = y + r * cols;
      scalar_t* out = gx + r * cols;
      double s = 0;
      if (log) {
        for (int64_t j = 0; j < cols; ++j) s += gr[j];
        const auto sum = static_cast<scalar_t>(s);
        for (int64_t j = 0; j < cols; ++j) out[j] = gr[j] - std::exp(yr[j]) * sum;
      } else {
        for (int64_t j = 0; j < cols; ++j) s += static_cast<double>(gr[j]) * yr[j];
        const auto sum = static_cast<scalar_t>(s);
        for (int64_t j = 0; j < cols; ++j) out[j] = yr[j] * (gr[j] - sum);
      }
    }
  });
}

at::Tensor forward_cpu(const char* op, const at::Tensor& self, bool log) {
  check_floating(op, self, "self");
  const at::Tensor x = self.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto [rows, cols] = rows_cols(x);
  if (rows == 0) return y;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "torchext_softmax_cpu", [&] {
    forward_rows(x.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), rows, cols, log);
  });
  return y;
}

at::Tensor backward_cpu(const char* op, const at::Tensor& grad_output, const at::Tensor& output, bool log) {
  check_floating(op, output, "output");
  check_like(op, output, "output", grad_output, "grad_output");
  const at::Tensor y = output.contiguous();
  const at::Tensor g = grad_output.contiguous();
  at::Tensor gx = at::empty(y.sizes(), y.options());
  const auto [rows, cols] = rows_cols(y);
  if (rows == 0) return gx;
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "torchext_softmax_backward_cpu", [&] {
    backward_rows(g.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), gx.mutable_data_ptr<scalar_t>(), rows,
                  cols, log);
  });
  return gx;
}

at::Tensor softmax_cpu(const at::Tensor& self) { return forward_cpu("torchext::softmax", self, false); }
at::Tensor softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  return backward_cpu("torchext::softmax_backward", grad_output, output, false);
}
at::Tensor log_softmax_cpu(const at::Tensor& self) { return forward_cpu("torchext::log_softmax", self, true); }
at::Tensor log_softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  return backward_cpu("torchext::log_softmax_backward", grad_output, output, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("softmax", &softmax_cpu);
  m.impl("softmax_backward", &softmax_backward_cpu);
  m.impl("log_softmax", &log_softmax_cpu);
  m.impl("log_softmax_backward", &log_softmax_backward_cpu);
}

}  // namespace torchext
