// Batch norm's channels-last (rows x C) kernels, kernel by kernel, against the machine's read and copy bandwidth, in
// one process without torch: the plan knobs of cuda_ops/batch_norm.cu (reduction blocks per pass, loads in flight,
// rows per thread of the elementwise passes, the finalize's block shape) swept at ResNet-18's BatchNorm shapes
// (batch 512, bf16). Each time is the median of 15 runs with L2 flushed before each (CUDA events). The statistics are
// checked against a float64 host reference for every reduction plan. The reductions sweep the tensor with all blocks
// together (RowsTile::for_rows_swept); the contiguous-chunk order it replaced is measured beside it in
// benchmarks/results/batch_norm_check_strided_h200.txt (this file at b7d1981).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I cuda_ops \
//        benchmarks/batch_norm_check.cu cuda_ops/common.cu -o /tmp/batch_norm_check && /tmp/batch_norm_check
//
// With --passes it times, besides the plain read and copy, only each direction through the library's launcher at
// every shape, median of 31: BN + ReLU, each direction followed by a plain read of its output (the next layer's
// read), BN + add + ReLU, its backward followed by a read of grad_residual, each elementwise pass alone after its
// reduction with L2 as that leaves it and flushed, the normalize against a copy, and the two finalize kernels alone
// (L2 flushed: their partial sums come from DRAM, where in the library they are in L2); then it prints a hash of BN
// + add + ReLU's outputs and statistics, the same bits across builds that change only how the passes run
// (benchmarks/results/batch_norm_check_normalize_bound_h200.txt; the other batch_norm_check_*_h200.txt files of
// 2026-11-29 came from earlier forms of this mode). With --read it times the library's two reductions against plain
// reads of the same bytes as one buffer (1, 4 or 8 loads in flight per thread) and against reads through the copy
// engine (bulk copies into a shared-memory ring): what a reduction costs beyond the device's read speed
// (benchmarks/results/batch_norm_check_read_h200.txt). -DBN_CHECK_FLOAT=1 builds it for float32 instead of bf16. With
// --profile it runs only a plain read and the library's two reductions (its launcher and plan), once each at the two
// large shapes, for ncu:
//   ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats /tmp/batch_norm_check \
//       --profile
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../cuda_ops/batch_norm.cu"  // the anonymous namespace's kernels and plans
#include "../cuda_ops/sm90.cuh"
#include "cuda_check.h"

using namespace torchext::cuda_ops;

namespace bn_check {

#if BN_CHECK_FLOAT  // -DBN_CHECK_FLOAT=1: the same passes in float32
using T = float;
inline T to_elem(float v) { return v; }
inline float from_elem(T v) { return v; }
#else
using T = __nv_bfloat16;
inline T to_elem(float v) { return __float2bfloat16(v); }
inline float from_elem(T v) { return __bfloat162float(v); }
#endif
char* g_flush = nullptr;
constexpr size_t kFlush = 256u << 20;

// Median of reps timings of fn() (CUDA events), L2 flushed before each; with a prefix, the prefix runs untimed between
// the flush and fn() (then, with flush_between, L2 is flushed again before fn()). One untimed call of fn() first.
float median_us(const std::function<void()>& fn, int reps = 15, const std::function<void()>& prefix = nullptr,
                bool flush_between = false) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn();
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaMemsetAsync(g_flush, r, kFlush));
    if (prefix) {
      prefix();
      if (flush_between) CK(cudaMemsetAsync(g_flush, r + 1, kFlush));
    }
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// FNV-1a of a device buffer's bytes (copied to the host): the same bits across builds.
uint64_t hash_dev(const void* p, size_t n) {
  std::vector<unsigned char> h(n);
  CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  uint64_t v = 1469598103934665603ull;
  for (unsigned char c : h) v = (v ^ c) * 1099511628211ull;
  return v;
}

// A plain read of n 16-byte vectors: a grid-stride loop, U vectors in flight per thread.
template <int U = 1>
__global__ void read_sum_kernel(const uint4* __restrict__ p, int64_t n, float* out) {
  float acc = 0;
  const int64_t total = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
#pragma unroll 1  // U loads in flight, not what the compiler's unrolling would make of it
  for (; i + (U - 1) * total < n; i += U * total) {
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) v[k] = p[i + k * total];
#pragma unroll
    for (int k = 0; k < U; ++k) {  // all four words used: one 16-byte load each
      acc += __uint_as_float(v[k].x) + __uint_as_float(v[k].y) + __uint_as_float(v[k].z) + __uint_as_float(v[k].w);
    }
  }
  for (; i < n; i += total) {
    const uint4 v = p[i];
    acc += __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
  }
  if (acc == 1.2345f) *out = acc;  // keeps the loads
}

// The same read through the copy engine (--read): tiles of TILE bytes, tile t to block t % gridDim.x, each block's
// tiles bulk-copied (cp.async.bulk, 1-D) into a ring of S shared-memory stages by one thread and summed from there by
// all; no registers hold loads in flight, so the bytes in flight are S x TILE per block.
template <int S, int TILE>
__global__ void read_bulk_kernel(const char* __restrict__ p, int64_t tiles, float* out) {
#if defined(TORCHEXT_WGMMA_DEVICE)
  extern __shared__ __align__(128) char ring[];
  __shared__ uint64_t full[S];
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) sm90::mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int s, int64_t t) {
    sm90::mbar_arrive_expect_tx(&full[s], TILE);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     sm90::smem_addr(ring + s * TILE)),
                 "l"(p + t * TILE), "r"(TILE), "r"(sm90::smem_addr(&full[s]))
                 : "memory");
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < S && blockIdx.x + int64_t(s) * gridDim.x < tiles; ++s)
      issue(s, blockIdx.x + int64_t(s) * gridDim.x);
  }
  float acc = 0;
  int k = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, ++k) {
    const int s = k % S;
    sm90::mbar_wait(&full[s], uint32_t(k / S) & 1u);
    const uint4* q = reinterpret_cast<const uint4*>(ring + s * TILE);
    for (int i = threadIdx.x; i < TILE / 16; i += blockDim.x) acc += __uint_as_float(q[i].x) + __uint_as_float(q[i].w);
    __syncthreads();  // the stage is read: refill it
    const int64_t next = t + int64_t(S) * gridDim.x;
    if (threadIdx.x == 0 && next < tiles) issue(s, next);
  }
  if (acc == 1.2345f) *out = acc;
#else
  __trap();  // built without sm_90a: no copy engine to time
#endif
}

template <int ILP, int MINB>
void launch_reduce_plan(const ReduceIn<T>& in, int64_t rows, int64_t C, const RowsPlan& p, bool bwd, float* partial) {
  const dim3 grid(unsigned(p.col_blocks), unsigned(p.chunks)), block(p.bx, p.by);
  if (bwd) {
    reduce_rows_vec_kernel<T, true, int32_t, ILP, MINB>
        <<<grid, block>>>(in, int32_t(rows), int32_t(C), int32_t(p.chunks), partial);
  } else {
    reduce_rows_vec_kernel<T, false, int32_t, ILP, MINB>
        <<<grid, block>>>(in, int32_t(rows), int32_t(C), int32_t(p.chunks), partial);
  }
}

// (ILP, MINB) pairs swept: loads in flight per thread, and the blocks per SM the registers are capped for.
constexpr int kConfigs[][2] = {{4, 1}, {4, 2}, {4, 3}, {2, 3}, {2, 4}, {8, 1}, {8, 2}};

template <int I = 0>
void reduce_config(int k, const ReduceIn<T>& in, int64_t rows, int64_t C, const RowsPlan& p, bool bwd, float* partial) {
  if constexpr (I < int(sizeof(kConfigs) / sizeof(kConfigs[0]))) {
    if (k == I) return launch_reduce_plan<kConfigs[I][0], kConfigs[I][1]>(in, rows, C, p, bwd, partial);
    reduce_config<I + 1>(k, in, rows, C, p, bwd, partial);
  }
}

template <int I = 0>
void elementwise_config(int k, bool bwd, const T* x, const T* g, T* y, uint8_t* mask, const float* chan, int64_t rows,
                        int64_t C, const RowsPlan& p) {
  if constexpr (I < int(sizeof(kConfigs) / sizeof(kConfigs[0]))) {
    if (k == I) {
      const dim3 grid(unsigned(p.col_blocks), unsigned(p.chunks)), block(p.bx, p.by);
      constexpr int ILP = kConfigs[I][0], MINB = kConfigs[I][1];
      if (bwd) {
        backward_rows_vec_kernel<T, int32_t, ILP, MINB><<<grid, block>>>(g, x, mask, y, nullptr, chan, int32_t(rows),
                                                                         int32_t(C), int32_t(p.rows_per_chunk),
                                                                         BackwardFlags{true, true, false, true});
      } else {
        normalize_rows_vec_kernel<T, false, int32_t, ILP, MINB>
            <<<grid, block>>>(x, nullptr, y, mask, chan, int32_t(rows), int32_t(C), int32_t(p.rows_per_chunk), true);
      }
      return;
    }
    elementwise_config<I + 1>(k, bwd, x, g, y, mask, chan, rows, C, p);
  }
}

template <int COLS, int ROWS>
void launch_finalize(const BatchNormForwardArgs<T, float>& args, const float* partial, int64_t chunks, float* chan) {
  finalize_forward_kernel<T, float, COLS, ROWS>
      <<<finalize_grid(args.shape.c, COLS), dim3(COLS, ROWS)>>>(args, partial, chunks, chan);
}

}  // namespace bn_check

using namespace bn_check;

int main(int argc, char** argv) {
  const bool profile = argc > 1 && std::string(argv[1]) == "--profile";
  const bool passes = argc > 1 && std::string(argv[1]) == "--passes";
  const bool read_mode = argc > 1 && std::string(argv[1]) == "--read";
  int dev = 0;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("# batch_norm_check on %s (%d SMs), %s, batch 512, channels-last\n\n", prop.name,
              prop.multiProcessorCount, sizeof(T) == 4 ? "float32" : "bf16");
  CK(cudaMalloc(&g_flush, kFlush));
  const int64_t shapes[][2] = {{512 * 32 * 32, 64}, {512 * 16 * 16, 128}, {512 * 8 * 8, 256}, {512 * 4 * 4, 512}};
  std::mt19937 rng(0);
  for (auto& sh : shapes) {
    if (profile && sh[1] > 128) break;
    const int64_t rows = sh[0], C = sh[1], E = rows * C;
    std::vector<T> hx(E), hg(E);
    std::vector<uint8_t> hm(E / 8);
    std::normal_distribution<float> nd(0.5f, 1.f);
    for (int64_t i = 0; i < E; ++i) {
      hx[i] = to_elem(nd(rng));
      hg[i] = to_elem(nd(rng));
    }
    for (auto& m : hm) m = uint8_t(rng());
    T *x, *g, *y;
    uint8_t* mask;
    float *mean, *partial, *chan, *save_mean, *save_invstd, *out;
    CK(cudaMalloc(&x, E * sizeof(T)));
    CK(cudaMalloc(&g, E * sizeof(T)));
    CK(cudaMalloc(&y, E * sizeof(T)));
    CK(cudaMalloc(&mask, E / 8));
    uint8_t* mask2;  // the forward's output mask (--passes), so that the backward's stays as drawn
    CK(cudaMalloc(&mask2, E / 8));
    CK(cudaMalloc(&mean, C * sizeof(float)));
    CK(cudaMalloc(&partial, 2 * 8192 * C * sizeof(float)));
    CK(cudaMalloc(&chan, 4 * C * sizeof(float)));
    CK(cudaMalloc(&save_mean, C * sizeof(float)));
    CK(cudaMalloc(&save_invstd, C * sizeof(float)));
    CK(cudaMalloc(&out, sizeof(float)));
    CK(cudaMemcpy(x, hx.data(), E * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g, hg.data(), E * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(mask, hm.data(), E / 8, cudaMemcpyHostToDevice));
    CK(cudaMemset(mean, 0, C * sizeof(float)));
    // float64 host reference of the means
    std::vector<double> ref(C, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) ref[c] += from_elem(hx[r * C + c]);
    for (auto& v : ref) v /= double(rows);

    const double mb = double(E) * sizeof(T) / 1e6;
    std::printf("## %lld x %lld (one tensor %.1f MB)\n\n", (long long)rows, (long long)C, mb);
    if (!profile) {
      const float t_read = median_us([&] {
        read_sum_kernel<><<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const uint4*>(x),
                                                                 E * int64_t(sizeof(T)) / 16, out);
      });
      const float t_copy = median_us([&] { CK(cudaMemcpyAsync(y, x, E * sizeof(T), cudaMemcpyDeviceToDevice)); });
      std::printf("read one tensor: %.1f us (%.0f GB/s); copy one tensor: %.1f us (%.0f GB/s moved)\n\n", t_read,
                  mb / t_read * 1e3, t_copy, 2 * mb / t_copy * 1e3);
    }

    BatchNormForwardArgs<T, float> fa;
    fa.shape = {rows, C, 1};
    fa.x = x;
    fa.y = y;
    fa.save_mean = save_mean;
    fa.save_invstd = save_invstd;
    // the reduction's inputs (the backward's mask and mean too), and the largest error of the means that the
    // finalize makes of a forward reduction's partials, against the float64 host reference
    auto reduce_in = [&](bool bwd) {
      ReduceIn<T> in;
      in.x = x;
      if (bwd) {
        in.dy = g;
        in.mask = mask;
        in.mean = mean;
      }
      return in;
    };
    auto mean_error = [&](const std::function<void()>& reduce, int64_t chunks) {
      reduce();
      launch_finalize<4, 64>(fa, partial, chunks, chan);
      std::vector<float> hmean(C);
      CK(cudaMemcpy(hmean.data(), save_mean, C * sizeof(float), cudaMemcpyDeviceToHost));
      double err = 0;
      for (int64_t c = 0; c < C; ++c) err = std::max(err, std::fabs(hmean[c] - ref[c]));
      return err;
    };
    if (passes) {  // each direction through the library's launcher (and the passes alone), L2 flushed before each
      BatchNormForwardArgs<T, float> f = fa;
      f.mask = mask2;
      BatchNormBackwardArgs<T, float> b;
      b.shape = fa.shape;
      b.grad_out = g;
      b.x = x;
      b.mask = mask;
      b.save_mean = save_mean;
      b.save_invstd = save_invstd;
      b.grad_input = y;
      const BatchNormKernel v = BatchNormKernel::vectorized;
      void* ws = nullptr;
      CK(cudaMalloc(&ws,
                    std::max(batch_norm_forward_workspace_bytes(v, f), batch_norm_backward_workspace_bytes(v, b))));
      const float tf = median_us([&] { CK(batch_norm_forward(v, f, nullptr, ws)); }, 31);
      const float tb = median_us([&] { CK(batch_norm_backward(v, b, nullptr, ws)); }, 31);
      std::printf("BN + ReLU forward %.1f us, backward %.1f us\n", tf, tb);
      // each direction followed by the next layer's read of its output (a plain read of y, of dx): what the
      // output's cache policy costs or saves the reader
      auto read = [&](const T* p) {
        read_sum_kernel<><<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const uint4*>(p),
                                                                 E * int64_t(sizeof(T)) / 16, out);
      };
      const float tfc = median_us(
          [&] {
            CK(batch_norm_forward(v, f, nullptr, ws));
            read(y);
          },
          31);
      const float tbc = median_us(
          [&] {
            CK(batch_norm_backward(v, b, nullptr, ws));
            read(y);
          },
          31);
      std::printf("BN + ReLU forward then a read of y %.1f us, backward then a read of dx %.1f us\n", tfc, tbc);
      // BN + add + ReLU: the residual (grad_out's values, in its own buffer) and grad_residual's output
      T *res, *gres;
      CK(cudaMalloc(&res, E * sizeof(T)));
      CK(cudaMalloc(&gres, E * sizeof(T)));
      CK(cudaMemcpy(res, hg.data(), E * sizeof(T), cudaMemcpyHostToDevice));
      f.residual = res;
      b.grad_residual = gres;
      const float tfr = median_us([&] { CK(batch_norm_forward(v, f, nullptr, ws)); }, 31);
      const float tbr = median_us([&] { CK(batch_norm_backward(v, b, nullptr, ws)); }, 31);
      std::printf("BN + add + ReLU forward %.1f us, backward %.1f us\n", tfr, tbr);
      const float tbrc = median_us(
          [&] {
            CK(batch_norm_backward(v, b, nullptr, ws));
            read(gres);
          },
          31);
      std::printf("BN + add + ReLU backward then a read of grad_residual %.1f us\n", tbrc);
      // The elementwise passes alone, after their direction's reduction and finalize, with L2 as those leave it and
      // flushed in between: what each pass finds in L2 (it walks the rows in reverse, from those read last).
      const int64_t chunks = reduce_chunks(Path::rows, fa.shape);  // as the launcher splits ws
      const Workspace<float> w = split_workspace<float>(ws, chunks, C);
      {
        const RowsPlan p = rows_plan(rows, C, false);
        const dim3 grid(unsigned(p.col_blocks), unsigned(p.chunks)), block(p.bx, p.by);
        ReduceIn<T> fin_in, bin_in;
        fin_in.x = x;
        bin_in.x = x;
        bin_in.dy = g;
        bin_in.mask = mask;
        bin_in.mean = save_mean;
        auto fwd_prefix = [&] {
          CK(launch_reduce<T>(Path::rows, fin_in, fa.shape, chunks, false, w.partial, nullptr));
          launch_finalize<kFinalizeCols, kFinalizeRows>(f, w.partial, chunks, w.vectors);
        };
        auto bwd_prefix = [&] {
          CK(launch_reduce<T>(Path::rows, bin_in, fa.shape, chunks, true, w.partial, nullptr));
          finalize_backward_kernel<T, float>
              <<<finalize_grid(C), dim3(kFinalizeCols, kFinalizeRows)>>>(b, w.partial, chunks, w.vectors);
        };
        auto after = [&](const std::function<void()>& prefix, const std::function<void()>& fn, bool flush_between) {
          return median_us(fn, 31, prefix, flush_between);
        };
        auto normalize = [&](const T* r) {
          if (r != nullptr) {
            normalize_rows_vec_kernel<T, true, int>
                <<<grid, block>>>(x, r, y, mask2, w.vectors, int(rows), int(C), int(p.rows_per_chunk), true);
          } else {
            normalize_rows_vec_kernel<T, false, int>
                <<<grid, block>>>(x, nullptr, y, mask2, w.vectors, int(rows), int(C), int(p.rows_per_chunk), true);
          }
        };
        auto backward = [&] {
          backward_rows_vec_kernel<T, int><<<grid, block>>>(g, x, mask, y, nullptr, w.vectors, int(rows), int(C),
                                                            int(p.rows_per_chunk),
                                                            BackwardFlags{true, true, false, true});
        };
        const float n_l2 = after(fwd_prefix, [&] { normalize(nullptr); }, false);
        const float n_fl = after(fwd_prefix, [&] { normalize(nullptr); }, true);
        const float r_l2 = after(fwd_prefix, [&] { normalize(res); }, false);
        const float r_fl = after(fwd_prefix, [&] { normalize(res); }, true);
        const float b_l2 = after(bwd_prefix, backward, false);
        const float b_fl = after(bwd_prefix, backward, true);
        std::printf(
            "after the reduction, L2 as left / flushed: normalize %.1f / %.1f us, with the residual %.1f / %.1f, "
            "backward elementwise %.1f / %.1f\n",
            n_l2, n_fl, r_l2, r_fl, b_l2, b_fl);
        // what bounds the normalize when x is in L2: without the relu mask's byte stores, after a plain read of x
        // instead of the reduction, and a copy of x to y after that read (a read from L2 and a write, no arithmetic)
        auto read_x = [&] { read(x); };
        const float n_nomask = after(
            fwd_prefix,
            [&] {
              normalize_rows_vec_kernel<T, false, int>
                  <<<grid, block>>>(x, nullptr, y, nullptr, w.vectors, int(rows), int(C), int(p.rows_per_chunk), false);
            },
            false);
        const float n_read = after(read_x, [&] { normalize(nullptr); }, false);
        const float copy_read =
            after(read_x, [&] { CK(cudaMemcpyAsync(y, x, E * sizeof(T), cudaMemcpyDeviceToDevice)); }, false);
        std::printf(
            "normalize (L2 as left) without the mask %.1f us; after a plain read of x: normalize %.1f us, a copy of "
            "x to y %.1f us\n",
            n_nomask, n_read, copy_read);
      }
      // the finalize kernels alone; then one more forward and backward, and a hash of their outputs and statistics (the
      // same bits across builds that change only how the passes run)
      const float tff =
          median_us([&] { launch_finalize<kFinalizeCols, kFinalizeRows>(f, w.partial, chunks, w.vectors); }, 31);
      const float tfb = median_us(
          [&] {
            finalize_backward_kernel<T, float>
                <<<finalize_grid(C), dim3(kFinalizeCols, kFinalizeRows)>>>(b, w.partial, chunks, w.vectors);
          },
          31);
      std::printf("finalize forward %.1f us, backward %.1f us\n", tff, tfb);
      CK(batch_norm_forward(v, f, nullptr, ws));
      const uint64_t hy = hash_dev(y, E * sizeof(T)), hmean = hash_dev(save_mean, C * 4),
                     hinv = hash_dev(save_invstd, C * 4);
      CK(batch_norm_backward(v, b, nullptr, ws));
      std::printf("hash (BN + add + ReLU): y %016llx mean %016llx invstd %016llx dx %016llx grad_residual %016llx\n",
                  (unsigned long long)hy, (unsigned long long)hmean, (unsigned long long)hinv,
                  (unsigned long long)hash_dev(y, E * sizeof(T)), (unsigned long long)hash_dev(gres, E * sizeof(T)));
      CK(cudaFree(res));
      CK(cudaFree(gres));
      CK(cudaFree(ws));
    } else if (read_mode) {  // the reductions against plain reads of their bytes, and reads through the copy engine
      // one buffer of the backward's bytes (dy, x and the mask), rounded up to whole 16 KiB tiles
      const int64_t b1 = E * int64_t(sizeof(T)), b2 = (2 * b1 + E / 8 + 16383) / 16384 * 16384;
      char* buf;
      CK(cudaMalloc(&buf, b2));
      CK(cudaMemset(buf, 1, b2));
      const int sms = prop.multiProcessorCount;
      auto bulk = [&](const char* p, int64_t bytes) {
        constexpr int S = 4, kTile = 16384;
        static bool once = [] {
          CK(cudaFuncSetAttribute(read_bulk_kernel<S, kTile>, cudaFuncAttributeMaxDynamicSharedMemorySize, S * kTile));
          return true;
        }();
        (void)once;
        read_bulk_kernel<S, kTile><<<sms * 2, 256, S * kTile>>>(p, bytes / kTile, out);
      };
      std::printf(
          "| bytes | plain read, 1 x 16 B a thread, 8 blocks/SM | 8 x 16 B, 2 blocks/SM | 4 x 16 B, 8 blocks/SM "
          "| bulk copies, 4 x 16 KiB stages, 2 blocks/SM | the library's reduction |\n|---|---|---|---|---|---|\n");
      for (int bwd = 0; bwd < 2; ++bwd) {
        const char* p = bwd ? buf : reinterpret_cast<const char*>(x);
        const int64_t bytes = bwd ? b2 : b1, n = bytes / 16;
        const auto* v = reinterpret_cast<const uint4*>(p);
        const float t1 = median_us([&] { read_sum_kernel<1><<<sms * 8, 256>>>(v, n, out); }, 31);
        const float t8 = median_us([&] { read_sum_kernel<8><<<sms * 2, 256>>>(v, n, out); }, 31);
        const float t4 = median_us([&] { read_sum_kernel<4><<<sms * 8, 256>>>(v, n, out); }, 31);
        const float tb = median_us([&] { bulk(p, bytes); }, 31);
        const ReduceIn<T> in = reduce_in(bwd);
        const float tr = median_us(
            [&] {
              CK(launch_reduce<T>(Path::rows, in, fa.shape, reduce_chunks(Path::rows, fa.shape), bwd, partial,
                                  nullptr));
            },
            31);
        std::printf("| %.1f MB (%s) | %.1f us | %.1f | %.1f | %.1f | %.1f (%s, %.1f MB) |\n", bytes / 1e6,
                    bwd ? "dy, x, mask" : "x", t1, t8, t4, tb, tr, bwd ? "backward" : "forward statistics",
                    (bwd ? 2 * b1 + E / 8 : b1) / 1e6);
      }
      CK(cudaFree(buf));
    } else if (profile) {  // one launch of each, for ncu (which flushes the caches between kernels by default)
      read_sum_kernel<>
          <<<prop.multiProcessorCount * 8, 256>>>(reinterpret_cast<const uint4*>(x), E * int64_t(sizeof(T)) / 16, out);
      for (int bwd = 0; bwd < 2; ++bwd) {  // the library's own launcher and plan
        CK(launch_reduce<T>(Path::rows, reduce_in(bwd), fa.shape, reduce_chunks(Path::rows, fa.shape), bwd, partial,
                            nullptr));
      }
      CK(cudaDeviceSynchronize());
      std::printf("profiled %lld x %lld\n", (long long)rows, (long long)C);
    } else {
      std::printf(
          "| pass | target blocks | config | chunks | us | GB/s | max mean err |\n|---|---|---|---|---|---|---|\n");
      for (int bwd = 0; bwd < 2; ++bwd) {
        for (int64_t target : {264, 396, 528, 792, 1056, 1584}) {
          for (int k = 0; k < int(sizeof(kConfigs) / sizeof(kConfigs[0])); ++k) {
            const RowsPlan p = rows_plan(rows, C, true, target, 4);
            const ReduceIn<T> in = reduce_in(bwd);
            auto run = [&] { reduce_config(k, in, rows, C, p, bwd, partial); };
            const float t = median_us(run);
            const double err = bwd ? 0.0 : mean_error(run, p.chunks);
            std::printf("| %s reduce | %lld | ILP %d MINB %d | %lld | %.1f | %.0f | %.2e |\n", bwd ? "bwd" : "fwd",
                        (long long)target, kConfigs[k][0], kConfigs[k][1], (long long)p.chunks, t,
                        (bwd ? 2 : 1) * mb / t * 1e3, err);
          }
        }
      }
      // the finalize: the current block shape and taller ones, at the default plan's chunk count and at 256
      for (int64_t chunks : {rows_plan(rows, C, true).chunks, int64_t(256)}) {
        const float t32x8 = median_us([&] { launch_finalize<32, 8>(fa, partial, chunks, chan); });
        const float t8x32 = median_us([&] { launch_finalize<8, 32>(fa, partial, chunks, chan); });
        const float t4x64 = median_us([&] { launch_finalize<4, 64>(fa, partial, chunks, chan); });
        const float t2x128 = median_us([&] { launch_finalize<2, 128>(fa, partial, chunks, chan); });
        std::printf("\nfinalize, %lld chunks: 32x8 %.1f us, 8x32 %.1f us, 4x64 %.1f us, 2x128 %.1f us\n",
                    (long long)chunks, t32x8, t8x32, t4x64, t2x128);
      }
      // elementwise passes: rows per thread
      std::printf("\n| pass | rows/thread | config | chunks | us | GB/s |\n|---|---|---|---|---|---|\n");
      for (int bwd = 0; bwd < 2; ++bwd) {
        for (int64_t items : {8, 16, 32}) {
          for (int k = 0; k < int(sizeof(kConfigs) / sizeof(kConfigs[0])); ++k) {
            const RowsPlan p = rows_plan(rows, C, false, kTargetBlocks, items);
            const float t = median_us([&] { elementwise_config(k, bwd, x, g, y, mask, chan, rows, C, p); });
            std::printf("| %s | %lld | ILP %d MINB %d | %lld | %.1f | %.0f |\n", bwd ? "backward" : "normalize",
                        (long long)items, kConfigs[k][0], kConfigs[k][1], (long long)p.chunks, t,
                        ((bwd ? 3 : 2) * mb + mb / 16) / t * 1e3);
          }
        }
      }
    }
    std::printf("\n");
    for (void* p : {(void*)x, (void*)g, (void*)y, (void*)mask, (void*)mean, (void*)partial, (void*)chan,
                    (void*)save_mean, (void*)save_invstd, (void*)out, (void*)mask2})
      CK(cudaFree(p));
  }
  return 0;
}
