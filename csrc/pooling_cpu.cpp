// CPU kernels for torchext::max_pool2d, avg_pool2d, adaptive_avg_pool2d and their *_backward ops, float32, float64,
// float16 and bfloat16 (the sums in float32 for float32 and the half types, float64 for float64: at::opmath_type,
// as torch's CPU pooling). The window arithmetic is cuda_ops/pooling_args.h's, shared with the CUDA kernels.
//
//   x is the input (N, C, H, W), y the output (N, C, OH, OW), indices (N, C, OH, OW) int64 holding ih W + iw.
//   max:      y = the largest element of the window; NaN wins over any number, and of several NaNs the last in
//             row-major order; of equal maxima the first (torch's rule: `v > max || isnan(v)`, from -inf and the
//             window's first in-bounds position). A window entirely in the padding gives -inf and that position.
//   avg:      y = (sum of the window) / divisor (cuda_ops/pooling_args.h).
//   adaptive: y = (sum of the window) / (its height x width).
// Backward: each element of grad_input sums, in (oh, ow) order, what it received from the outputs whose window
// spans it: for max, grad_output where indices names it (scattered per image or plane: no two tasks write the same
// element); for avg, grad_output / divisor and for adaptive, grad_output / window size (gathered: each task computes
// whole elements). (oh, ow) order is the order torch's CPU kernels add in, so float32 results match theirs bit for
// bit, and the CUDA kernels' gathers use it too.
//
// Loops follow the result's layout (csrc/pooling.h's rule): channels-last results run one task per pixel (n, h, w)
// or image with C innermost (contiguous in a channels-last input); contiguous results one task per (n, c) plane.
// Inputs are read through their strides, whatever their layout. The windows are tabulated once per call (Windows).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "pooling.h"
#include "pooling_args.h"

namespace torchext {
namespace {

using cuda_ops::Pool2dGeometry;
using cuda_ops::PoolRange;
using cuda_ops::Strides4;

// Tasks (pixels or planes) per parallel chunk: about GRAIN_SIZE elements of work each.
int64_t grain(int64_t work_per_task) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, work_per_task));
}

// torch's rule: a larger value or a NaN replaces the running maximum (so NaN propagates, the last NaN and the first
// of equal maxima win). v != v is isnan without a library call.
template <typename A>
bool takes_max(A v, A best) {
  return v > best || v != v;
}

// --- the windows --------------------------------------------------------------------------------------------------
// Where output (oh, ow)'s window lies and what it divides by, and which outputs cover an input row, tabulated once
// per call (OH + OW + H + W ranges and OH OW divisors), so the loops do no division.

struct Windows {
  std::vector<PoolRange<>> row, col, row_cover, col_cover;
  std::vector<int64_t> divisors;  // OH x OW
  int64_t ow = 0, work = 1;       // output width; input elements per window (the parallel grain)

  PoolRange<> rows(int64_t oh) const { return row[oh]; }
  PoolRange<> cols(int64_t ow_) const { return col[ow_]; }
  int64_t divisor(int64_t oh, int64_t ow_) const { return divisors[oh * ow + ow_]; }
  PoolRange<> rows_covering(int64_t ih) const { return row_cover[ih]; }
  PoolRange<> cols_covering(int64_t iw) const { return col_cover[iw]; }

  template <typename Row, typename Col, typename RowCover, typename ColCover, typename Divisor>
  Windows(const Pool2dGeometry& g, Row r, Col c, RowCover rc, ColCover cc, Divisor d) : ow(g.ow) {
    for (int64_t i = 0; i < g.oh; ++i) row.push_back(r(i));
    for (int64_t i = 0; i < g.ow; ++i) col.push_back(c(i));
    for (int64_t i = 0; i < g.h; ++i) row_cover.push_back(rc(i));
    for (int64_t i = 0; i < g.w; ++i) col_cover.push_back(cc(i));
    divisors.resize(g.oh * g.ow);
    for (int64_t i = 0; i < g.oh; ++i) {
      for (int64_t j = 0; j < g.ow; ++j) divisors[i * g.ow + j] = d(i, j);
    }
    int64_t most_h = 1, most_w = 1;
    for (const PoolRange<>& x : row) most_h = std::max(most_h, x.end - x.begin);
    for (const PoolRange<>& x : col) most_w = std::max(most_w, x.end - x.begin);
    work = most_h * most_w;
  }
};

// max_pool2d's (rows step by the dilation; no divisor).
Windows max_windows(const Pool2dGeometry& g) {
  return Windows(
      g, [&](int64_t o) { return cuda_ops::max_window(o, g.h, g.kh, g.sh, g.ph, g.dh); },
      [&](int64_t o) { return cuda_ops::max_window(o, g.w, g.kw, g.sw, g.pw, g.dw); },
      [&](int64_t i) { return cuda_ops::rows_covering(i, g.oh, g.kh, g.sh, g.ph, g.dh); },
      [&](int64_t i) { return cuda_ops::rows_covering(i, g.ow, g.kw, g.sw, g.pw, g.dw); },
      [](int64_t, int64_t) { return int64_t{1}; });
}

Windows avg_windows(const Pool2dGeometry& g) {
  int64_t size;
  return Windows(
      g, [&](int64_t o) { return cuda_ops::avg_window(o, g.h, g.kh, g.sh, g.ph, &size); },
      [&](int64_t o) { return cuda_ops::avg_window(o, g.w, g.kw, g.sw, g.pw, &size); },
      [&](int64_t i) { return cuda_ops::rows_covering(i, g.oh, g.kh, g.sh, g.ph, int64_t{1}); },
      [&](int64_t i) { return cuda_ops::rows_covering(i, g.ow, g.kw, g.sw, g.pw, int64_t{1}); },
      [&](int64_t oh, int64_t ow) { return cuda_ops::avg_divisor(g, oh, ow); });
}

Windows adaptive_windows(const Pool2dGeometry& g) {
  const auto rows = [&](int64_t o) { return cuda_ops::adaptive_window(o, g.h, g.oh); };
  const auto cols = [&](int64_t o) { return cuda_ops::adaptive_window(o, g.w, g.ow); };
  return Windows(
      g, rows, cols, [&](int64_t i) { return cuda_ops::adaptive_rows_covering(i, g.h, g.oh); },
      [&](int64_t i) { return cuda_ops::adaptive_rows_covering(i, g.w, g.ow); },
      [&](int64_t oh, int64_t ow) {
        const PoolRange<> rh = rows(oh), rw = cols(ow);
        return (rh.end - rh.begin) * (rw.end - rw.begin);
      });
}

// --- max_pool2d ---------------------------------------------------------------------------------------------------

// One tap of a channels-last window: best and the tap's number updated along a row of C channels, with selects
// rather than branches and 32-bit tap numbers (as wide as a float), so that the loop vectorizes.
template <typename scalar_t, typename A>
void max_row(const scalar_t* __restrict__ px, int64_t stride, A* __restrict__ best, int32_t* __restrict__ tap_of,
             int64_t c, int32_t tap) {
  if (stride == 1) {
    for (int64_t i = 0; i < c; ++i) {
      const A v = static_cast<A>(px[i]);
      const bool take = takes_max(v, best[i]);
      best[i] = take ? v : best[i];
      tap_of[i] = take ? tap : tap_of[i];
    }
    return;
  }
  for (int64_t i = 0; i < c; ++i) {
    const A v = static_cast<A>(px[i * stride]);
    const bool take = takes_max(v, best[i]);
    best[i] = take ? v : best[i];
    tap_of[i] = take ? tap : tap_of[i];
  }
}

template <typename scalar_t>
void max_pool2d_forward(const at::Tensor& x4, at::Tensor& y4, at::Tensor& idx4, const Pool2dGeometry& g, bool cl) {
  const Windows win = max_windows(g);
  using A = at::opmath_type<scalar_t>;
  const scalar_t* x = x4.const_data_ptr<scalar_t>();
  scalar_t* y = y4.mutable_data_ptr<scalar_t>();
  int64_t* idx = idx4.mutable_data_ptr<int64_t>();
  const Strides4 xs = strides4(x4), ys = strides4(y4);
  const int64_t window = g.kh * g.kw;
  if (cl) {
    at::parallel_for(0, g.n * g.oh * g.ow, grain(window * g.c), [&](int64_t begin, int64_t end) {
      std::vector<A> best(g.c);
      std::vector<int32_t> tap_of(g.c);             // the tap that gave best, per channel
      std::vector<int64_t> tap_pos(window + 1, 0);  // ih W + iw of each tap (tap 0 also for an empty window)
      for (int64_t t = begin; t < end; ++t) {
        const int64_t ow = t % g.ow, oh = t / g.ow % g.oh, n = t / (g.ow * g.oh);
        const PoolRange<> rh = win.rows(oh);
        const PoolRange<> rw = win.cols(ow);
        std::fill(best.begin(), best.end(), -std::numeric_limits<A>::infinity());
        std::fill(tap_of.begin(), tap_of.end(), 0);
        tap_pos[0] = rh.begin * g.w + rw.begin;
        int32_t tap = 0;
        for (int64_t ih = rh.begin; ih < rh.end; ih += g.dh) {
          for (int64_t iw = rw.begin; iw < rw.end; iw += g.dw, ++tap) {
            tap_pos[tap] = ih * g.w + iw;
            max_row(x + n * xs.n + ih * xs.h + iw * xs.w, xs.c, best.data(), tap_of.data(), g.c, tap);
          }
        }
        const int64_t o = n * ys.n + oh * ys.h + ow * ys.w;
        for (int64_t c = 0; c < g.c; ++c) {
          y[o + c] = static_cast<scalar_t>(best[c]);
          idx[o + c] = tap_pos[tap_of[c]];
        }
      }
    });
    return;
  }
  at::parallel_for(0, g.n * g.c, grain(g.oh * g.ow * window), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / g.c, c = t % g.c;
      const scalar_t* px = x + n * xs.n + c * xs.c;
      scalar_t* py = y + t * g.oh * g.ow;
      int64_t* pi = idx + t * g.oh * g.ow;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        const PoolRange<> rh = win.rows(oh);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const PoolRange<> rw = win.cols(ow);
          A best = -std::numeric_limits<A>::infinity();
          int64_t where = rh.begin * g.w + rw.begin;
          for (int64_t ih = rh.begin; ih < rh.end; ih += g.dh) {
            for (int64_t iw = rw.begin; iw < rw.end; iw += g.dw) {
              const A v = static_cast<A>(px[ih * xs.h + iw * xs.w]);
              const bool take = takes_max(v, best);
              best = take ? v : best;
              where = take ? ih * g.w + iw : where;
            }
          }
          py[oh * g.ow + ow] = static_cast<scalar_t>(best);
          pi[oh * g.ow + ow] = where;
        }
      }
    }
  });
}

// max_pool2d's backward scatters on the CPU (the gather of the CUDA kernels would test every candidate window of
// every input element): one task per image (channels-last) or per (n, c) plane, which owns the part of dx it writes;
// each output's gradient is added at its index in (oh, ow) order (torch's order; the gather's too) into a float32
// (float64) buffer, then rounded once. Indices outside the plane are ignored, as the gather ignores them.
template <typename scalar_t>
void max_pool2d_backward_kernel(const at::Tensor& dy4, const at::Tensor& idx4, at::Tensor& dx4, const Pool2dGeometry& g,
                                bool cl) {
  using A = at::opmath_type<scalar_t>;
  const scalar_t* dy = dy4.const_data_ptr<scalar_t>();
  const int64_t* idx = idx4.const_data_ptr<int64_t>();
  scalar_t* dx = dx4.mutable_data_ptr<scalar_t>();
  const Strides4 gs = strides4(dy4), is = strides4(idx4), xs = strides4(dx4);
  const int64_t plane = g.h * g.w, outputs = g.oh * g.ow;
  if (cl) {
    at::parallel_for(0, g.n, grain(std::max(outputs, plane) * g.c), [&](int64_t begin, int64_t end) {
      std::vector<A> acc(plane * g.c);  // (H W, C)
      for (int64_t n = begin; n < end; ++n) {
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t o = 0; o < outputs; ++o) {
          const int64_t oh = o / g.ow, ow = o % g.ow;
          const scalar_t* pg = dy + n * gs.n + oh * gs.h + ow * gs.w;
          const int64_t* pi = idx + n * is.n + oh * is.h + ow * is.w;
          for (int64_t c = 0; c < g.c; ++c) {
            const int64_t k = pi[c * is.c];
            if (k >= 0 && k < plane) acc[k * g.c + c] += static_cast<A>(pg[c * gs.c]);
          }
        }
        for (int64_t k = 0; k < plane; ++k) {
          scalar_t* px = dx + n * xs.n + k / g.w * xs.h + k % g.w * xs.w;
          for (int64_t c = 0; c < g.c; ++c) px[c] = static_cast<scalar_t>(acc[k * g.c + c]);
        }
      }
    });
    return;
  }
  at::parallel_for(0, g.n * g.c, grain(std::max(outputs, plane)), [&](int64_t begin, int64_t end) {
    std::vector<A> acc(plane);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / g.c, c = t % g.c;
      const scalar_t* pg = dy + n * gs.n + c * gs.c;
      const int64_t* pi = idx + n * is.n + c * is.c;
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const int64_t k = pi[oh * is.h + ow * is.w];
          if (k >= 0 && k < plane) acc[k] += static_cast<A>(pg[oh * gs.h + ow * gs.w]);
        }
      }
      scalar_t* px = dx + t * plane;
      for (int64_t k = 0; k < plane; ++k) px[k] = static_cast<scalar_t>(acc[k]);
    }
  });
}

// --- avg_pool2d and adaptive_avg_pool2d: one forward and one backward, given their Windows ------------------------

template <typename scalar_t>
void avg_forward(const at::Tensor& x4, at::Tensor& y4, const Pool2dGeometry& g, const Windows& win, bool cl) {
  using A = at::opmath_type<scalar_t>;
  const scalar_t* x = x4.const_data_ptr<scalar_t>();
  scalar_t* y = y4.mutable_data_ptr<scalar_t>();
  const Strides4 xs = strides4(x4), ys = strides4(y4);
  if (cl) {
    at::parallel_for(0, g.n * g.oh * g.ow, grain(win.work * g.c), [&](int64_t begin, int64_t end) {
      std::vector<A> acc(g.c);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t ow = t % g.ow, oh = t / g.ow % g.oh, n = t / (g.ow * g.oh);
        const PoolRange<> rh = win.rows(oh), rw = win.cols(ow);
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t ih = rh.begin; ih < rh.end; ++ih) {
          for (int64_t iw = rw.begin; iw < rw.end; ++iw) {
            const scalar_t* px = x + n * xs.n + ih * xs.h + iw * xs.w;
            for (int64_t c = 0; c < g.c; ++c) acc[c] += static_cast<A>(px[c * xs.c]);
          }
        }
        const A div = static_cast<A>(win.divisor(oh, ow));
        scalar_t* py = y + n * ys.n + oh * ys.h + ow * ys.w;
        for (int64_t c = 0; c < g.c; ++c) py[c] = static_cast<scalar_t>(acc[c] / div);
      }
    });
    return;
  }
  at::parallel_for(0, g.n * g.c, grain(g.oh * g.ow * win.work), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const scalar_t* px = x + t / g.c * xs.n + t % g.c * xs.c;
      scalar_t* py = y + t * g.oh * g.ow;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        const PoolRange<> rh = win.rows(oh);
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const PoolRange<> rw = win.cols(ow);
          A acc = 0;
          for (int64_t ih = rh.begin; ih < rh.end; ++ih) {
            for (int64_t iw = rw.begin; iw < rw.end; ++iw) acc += static_cast<A>(px[ih * xs.h + iw * xs.w]);
          }
          py[oh * g.ow + ow] = static_cast<scalar_t>(acc / static_cast<A>(win.divisor(oh, ow)));
        }
      }
    }
  });
}

template <typename scalar_t>
void avg_backward(const at::Tensor& dy4, at::Tensor& dx4, const Pool2dGeometry& g, const Windows& win, bool cl) {
  using A = at::opmath_type<scalar_t>;
  const scalar_t* dy = dy4.const_data_ptr<scalar_t>();
  scalar_t* dx = dx4.mutable_data_ptr<scalar_t>();
  const Strides4 gs = strides4(dy4), xs = strides4(dx4);
  if (cl) {
    at::parallel_for(0, g.n * g.h * g.w, grain(win.work * g.c), [&](int64_t begin, int64_t end) {
      std::vector<A> acc(g.c);
      for (int64_t t = begin; t < end; ++t) {
        const int64_t iw = t % g.w, ih = t / g.w % g.h, n = t / (g.w * g.h);
        const PoolRange<> rh = win.rows_covering(ih), rw = win.cols_covering(iw);
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t oh = rh.begin; oh < rh.end; ++oh) {
          for (int64_t ow = rw.begin; ow < rw.end; ++ow) {
            const scalar_t* pg = dy + n * gs.n + oh * gs.h + ow * gs.w;
            const A div = static_cast<A>(win.divisor(oh, ow));
            for (int64_t c = 0; c < g.c; ++c) acc[c] += static_cast<A>(pg[c * gs.c]) / div;
          }
        }
        scalar_t* px = dx + n * xs.n + ih * xs.h + iw * xs.w;
        for (int64_t c = 0; c < g.c; ++c) px[c] = static_cast<scalar_t>(acc[c]);
      }
    });
    return;
  }
  at::parallel_for(0, g.n * g.c, grain(g.h * g.w * win.work), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const scalar_t* pg = dy + t / g.c * gs.n + t % g.c * gs.c;
      scalar_t* px = dx + t * g.h * g.w;
      for (int64_t ih = 0; ih < g.h; ++ih) {
        const PoolRange<> rh = win.rows_covering(ih);
        for (int64_t iw = 0; iw < g.w; ++iw) {
          const PoolRange<> rw = win.cols_covering(iw);
          A acc = 0;
          for (int64_t oh = rh.begin; oh < rh.end; ++oh) {
            for (int64_t ow = rw.begin; ow < rw.end; ++ow) {
              acc += static_cast<A>(pg[oh * gs.h + ow * gs.w]) / static_cast<A>(win.divisor(oh, ow));
            }
          }
          px[ih * g.w + iw] = static_cast<scalar_t>(acc);
        }
      }
    }
  });
}

#define TORCHEXT_DISPATCH_POOL_CPU(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

// --- the ops ----------------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> max_pool2d_cpu(const at::Tensor& input, at::IntArrayRef kernel_size,
                                                  at::IntArrayRef stride, at::IntArrayRef padding,
                                                  at::IntArrayRef dilation, bool ceil_mode) {
  constexpr const char* op = "torchext::max_pool2d";
  const Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, dilation, ceil_mode);
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  at::Tensor idx = empty_pool_output(input, g, at::kLong);
  if (y.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_max_pool2d_cpu", [&] {
      max_pool2d_forward<scalar_t>(as_4d(input), y, idx, g, pool_channels_last(input));
    });
  }
  return {with_input_dims(y, input), with_input_dims(idx, input)};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                   bool ceil_mode, const at::Tensor& indices) {
  constexpr const char* op = "torchext::max_pool2d_backward";
  const Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, dilation, ceil_mode);
  check_pool_grad_output(op, grad_output, input, g);
  check_pool_grad_output(op, indices, input, g, "indices");
  at::Tensor dx = empty_pool_grad_input(input);
  if (dx.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_max_pool2d_backward_cpu", [&] {
      max_pool2d_backward_kernel<scalar_t>(as_4d(grad_output), as_4d(indices), dx, g, pool_channels_last(input));
    });
  }
  return with_input_dims(dx, input);
}

Pool2dGeometry avg_pool2d_geometry(std::string_view op, const at::Tensor& input, at::IntArrayRef kernel_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                                   bool count_include_pad, const std::optional<int64_t>& divisor_override) {
  Pool2dGeometry g = check_pool2d_args(op, input, kernel_size, stride, padding, {1}, ceil_mode);
  g.count_include_pad = count_include_pad;
  g.divisor_override = check_divisor_override(op, divisor_override);
  return g;
}

at::Tensor avg_pool2d_cpu(const at::Tensor& input, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                          at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                          std::optional<int64_t> divisor_override) {
  constexpr const char* op = "torchext::avg_pool2d";
  const Pool2dGeometry g =
      avg_pool2d_geometry(op, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  if (y.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_avg_pool2d_cpu", [&] {
      avg_forward<scalar_t>(as_4d(input), y, g, avg_windows(g), pool_channels_last(input));
    });
  }
  return with_input_dims(y, input);
}

at::Tensor avg_pool2d_backward_cpu(const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef kernel_size,
                                   at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                                   bool count_include_pad, std::optional<int64_t> divisor_override) {
  constexpr const char* op = "torchext::avg_pool2d_backward";
  const Pool2dGeometry g =
      avg_pool2d_geometry(op, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
  check_pool_grad_output(op, grad_output, input, g);
  at::Tensor dx = empty_pool_grad_input(input);
  if (dx.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_avg_pool2d_backward_cpu", [&] {
      avg_backward<scalar_t>(as_4d(grad_output), dx, g, avg_windows(g), pool_channels_last(input));
    });
  }
  return with_input_dims(dx, input);
}

at::Tensor adaptive_avg_pool2d_cpu(const at::Tensor& input, at::IntArrayRef output_size) {
  constexpr const char* op = "torchext::adaptive_avg_pool2d";
  const Pool2dGeometry g = check_adaptive_avg_pool2d_args(op, input, output_size);
  at::Tensor y = empty_pool_output(input, g, input.scalar_type());
  if (y.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_adaptive_avg_pool2d_cpu", [&] {
      avg_forward<scalar_t>(as_4d(input), y, g, adaptive_windows(g), pool_channels_last(input));
    });
  }
  return with_input_dims(y, input);
}

at::Tensor adaptive_avg_pool2d_backward_cpu(const at::Tensor& grad_output, const at::Tensor& input) {
  constexpr const char* op = "torchext::adaptive_avg_pool2d_backward";
  const Pool2dGeometry g = check_adaptive_avg_pool2d_backward_args(op, grad_output, input);
  at::Tensor dx = empty_pool_grad_input(input);
  if (dx.numel() > 0) {
    TORCHEXT_DISPATCH_POOL_CPU(input.scalar_type(), "torchext_adaptive_avg_pool2d_backward_cpu", [&] {
      avg_backward<scalar_t>(as_4d(grad_output), dx, g, adaptive_windows(g), pool_channels_last(input));
    });
  }
  return with_input_dims(dx, input);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("max_pool2d", &max_pool2d_cpu);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cpu);
  m.impl("avg_pool2d", &avg_pool2d_cpu);
  m.impl("avg_pool2d_backward", &avg_pool2d_backward_cpu);
  m.impl("adaptive_avg_pool2d", &adaptive_avg_pool2d_cpu);
  m.impl("adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward_cpu);
}

}  // namespace torchext
