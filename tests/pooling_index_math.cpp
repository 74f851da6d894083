// cuda_ops/pooling_args.h's window arithmetic against its definitions, by brute force over small sizes, in the index
// types the CUDA kernels use (int32_t and int64_t): what tests/test_pooling_index_math.py compiles and runs on the
// host (no GPU, no torch). Prints the number of failed checks and the first few.
#include <cstdint>
#include <cstdio>

#include "pooling_args.h"

using namespace torchext::cuda_ops;

static long failures = 0, checks = 0;

static void check(bool ok, const char* what, long a, long b, long c, long d, long e) {
  ++checks;
  if (!ok && failures++ < 10) std::printf("FAIL %s (%ld %ld %ld %ld %ld)\n", what, a, b, c, d, e);
}

template <typename I>
void run() {
  for (I in = 1; in <= 9; ++in) {
    for (I k = 1; k <= 5; ++k) {
      for (I s = 1; s <= 4; ++s) {
        for (I p = 0; p <= k / 2; ++p) {
          for (I d = 1; d <= 3; ++d) {
            const I span = d * (k - 1) + 1;
            if (in + 2 * p < span) continue;
            // Outputs exist while their window starts before in + p (ceil_mode's largest count); rows_covering is
            // also asked with one more (it clips to `out`).
            const I exist = (in + p - 1 + p) / s + 1, out = exist + 1;
            for (I i = 0; i < in; ++i) {
              const PoolRange<I> cover = rows_covering<I>(i, out, k, s, p, d);
              for (I o = 0; o < out; ++o) {
                const bool spans = o * s - p <= i && i <= o * s - p + (k - 1) * d;
                check(spans == (cover.begin <= o && o < cover.end), "rows_covering", i, o, k, s, p * 10 + d);
                if (o >= exist) continue;
                const PoolRange<I> m = max_window<I>(o, in, k, s, p, d);
                bool tap = false;
                for (I t = 0; t < k; ++t) tap |= o * s - p + t * d == i;
                bool visited = false;
                for (I r = m.begin; r < m.end; r += d) visited |= r == i;
                check(tap == visited, "max_window", i, o, k, s, p * 10 + d);
                if (d != 1) continue;
                I size = 0;
                const PoolRange<I> a = avg_window<I>(o, in, k, s, p, &size);
                check((a.begin <= i && i < a.end) == spans, "avg_window", i, o, k, s, p);
                I padded = 0;  // the window's taps inside [-p, in + p)
                for (I t = 0; t < k; ++t) padded += o * s - p + t >= -p && o * s - p + t < in + p;
                check(size == padded, "avg_window size", i, o, k, s, p);
              }
            }
          }
        }
      }
    }
  }
  for (I in = 1; in <= 12; ++in) {
    for (I out = 1; out <= 12; ++out) {
      for (I i = 0; i < in; ++i) {
        const PoolRange<I> cover = adaptive_rows_covering<I>(i, in, out);
        for (I o = 0; o < out; ++o) {
          const PoolRange<I> w = adaptive_window<I>(o, in, out);
          check((w.begin <= i && i < w.end) == (cover.begin <= o && o < cover.end), "adaptive", i, o, in, out, 0);
        }
      }
    }
  }
  // avg_divisor: the window's elements in the input (count_include_pad false), the padded size, or the override.
  Pool2dGeometry g;
  g.h = 1, g.w = 2, g.oh = 1, g.ow = 3, g.kh = 1, g.kw = 2, g.sh = 1, g.sw = 1, g.ph = 0, g.pw = 1;
  g.count_include_pad = false;
  const I expect[3] = {1, 2, 1};
  for (I o = 0; o < 3; ++o) check(avg_divisor<I>(g, 0, o) == expect[o], "avg_divisor", o, 0, 0, 0, 0);
  g.count_include_pad = true;
  for (I o = 0; o < 3; ++o) check(avg_divisor<I>(g, 0, o) == 2, "avg_divisor padded", o, 0, 0, 0, 0);
  g.divisor_override = -2;
  check(avg_divisor<I>(g, 0, 1) == -2, "avg_divisor override", 0, 0, 0, 0, 0);
}

int main() {
  run<int32_t>();
  run<int64_t>();
  std::printf("checks %ld failures %ld\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
