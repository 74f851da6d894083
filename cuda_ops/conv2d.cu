// The launcher in front of the convolution ladder (cuda_ops/conv2d.cuh): support checks, workspace sizes, the
// dispatch to the three families, the default choice, and two per-channel column reductions of y over (n, p, q):
// the bias gradient (conv2d_backward_bias) and the output statistics (conv2d_output_stats).
//
// Statistics: the forward's contract (cuda_ops/conv2d_args.h) is that args.stats, when set, receives y's per-channel
// sum and sum of squares. implicit_mma, implicit_wgmma and implicit_tma accumulate them in their epilogues and get
// args as they are; for direct, im2col and implicit_simt, conv2d() runs the family without stats and then
// conv2d_output_stats over the stored y, in the same workspace (the reduction follows the forward in stream order),
// so conv2d_workspace_bytes is the larger of the two.
//
// The default choice, fastest first: implicit_tma where conv2d_tma_supported says yes (as implicit_wgmma, with output
// rows TMA can read as boxes); else implicit_wgmma where conv2d_wgmma_supported says yes (an sm_90 GPU, bf16 / fp16,
// forward and backward_input); else implicit_mma where conv2d_implicit_supported says yes (tensor cores, NHWC / KRSC,
// groups == 1; csrc/conv2d_cuda.cpp converts layouts to get there); else implicit_simt where conv2d_simt_supported
// says yes (float32 without tf32, the same layouts); else im2col where it is supported (groups == 1, dense layouts)
// and its workspace stays under kDefaultIm2colWorkspaceCap (the patch matrix is chunked at 256 MiB, so
// this only refuses a single image whose patches are larger than the cap); else direct, which takes everything.
//
// The column reduction (both outputs): y viewed as M = N P Q rows of K channels. Pass 1 cuts the rows into `chunks`
// (a function of M only) and writes one partial sum per (chunk, channel) to the workspace, in acc_t<T>:
//   reduce_channels_fast_kernel  y channels-last (sc == 1): a (32, 8) block owns 32 adjacent channels of one chunk,
//                                thread (tx, ty) sums rows ty, ty + 8, ... (coalesced along k), then the 8 row groups
//                                are added in shared memory in order
//   reduce_rows_fast_kernel      otherwise (NCHW: q is the fastest dimension): a block per (channel, chunk), threads
//                                striding over the chunk's rows, then block_sum
// Pass 2 (finalize_kernel) adds the chunks' partials per channel in chunk order. Every order depends on the shape and
// layout only: the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>
#include <utility>

#include "common.cuh"
#include "conv2d.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr size_t kDefaultIm2colWorkspaceCap = size_t(1) << 30;
constexpr int64_t kRowsPerChunkMin = 512;
constexpr int64_t kMaxChunks = 256;
constexpr int kReduceThreads = 256;
constexpr int kStripCols = 32, kStripRows = 8;
constexpr int kFinalizeThreads = 256;

bool flat_stride(std::initializer_list<std::pair<int64_t, int64_t>> dims, int64_t* u) {
  int64_t unit = 0, inner = 1;
  for (const auto& [size, stride] : dims) {
    if (size == 0) {
      *u = 1;
      return true;
    }
    if (size > 1) {
      if (unit == 0) {
        unit = stride;
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

// Row m = (n, p, q) of y to its element offset (channel 0).
struct RowMap {
  int64_t pq, q, sn, sh, sw;
  int64_t u_all;  // stride per row when (n, p, q) are one uniform stride, else 0
  int64_t u_pq;   // stride per (p, q) when they are one uniform stride within an image, else 0
};

__device__ __forceinline__ int64_t row_offset(const RowMap& rm, int64_t m) {
  if (rm.u_all != 0) return m * rm.u_all;
  const int64_t n = m / rm.pq, pqi = m - n * rm.pq;
  if (rm.u_pq != 0) return n * rm.sn + pqi * rm.u_pq;
  const int64_t p = pqi / rm.q;
  return n * rm.sn + p * rm.sh + (pqi - p * rm.q) * rm.sw;
}

template <typename T>
RowMap row_map(const Tensor4<T>& y, const Conv2dShape& s) {
  RowMap rm{s.p * s.q, s.q, y.sn, y.sh, y.sw, 0, 0};
  int64_t u = 0;
  if (flat_stride({{s.q, y.sw}, {s.p, y.sh}, {s.n, y.sn}}, &u)) rm.u_all = u;
  if (flat_stride({{s.q, y.sw}, {s.p, y.sh}}, &u)) rm.u_pq = u;
  return rm;
}

struct Chunks {
  int64_t count = 0, rows = 0;  // chunks of `rows` rows each (the last may be shorter)
};

Chunks plan_chunks(int64_t m) {
  Chunks c;
  if (m <= 0) return c;
  int64_t count = (m + kRowsPerChunkMin - 1) / kRowsPerChunkMin;
  count = count < kMaxChunks ? count : kMaxChunks;
  c.rows = (m + count - 1) / count;
  c.count = (m + c.rows - 1) / c.rows;
  return c;
}

template <typename T>
bool channels_fast(const Tensor4<T>& y, const Conv2dShape& s) {
  return s.k > 1 && y.sc == 1;
}

// Partial sums (and sums of squares when SQ) of the chunk's rows; partial[chunk * K + k], partial[(chunks + chunk) *
// K + k] for the squares.
template <typename T, bool SQ>
__global__ void __launch_bounds__(kStripCols* kStripRows)
    reduce_channels_fast_kernel(const T* __restrict__ y, int64_t K, int64_t M, RowMap rm, int64_t rows_per_chunk,
                                int64_t chunks, acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A s_sum[kStripRows][kStripCols];
  __shared__ A s_sq[kStripRows][kStripCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t k = int64_t(blockIdx.x) * kStripCols + tx;
  const int64_t chunk = blockIdx.y;
  const int64_t m0 = chunk * rows_per_chunk;
  const int64_t m1 = m0 + rows_per_chunk < M ? m0 + rows_per_chunk : M;
  A sum = A(0), sq = A(0);
  if (k < K) {
    for (int64_t m = m0 + ty; m < m1; m += kStripRows) {
      const A v = to_acc<T>(y[row_offset(rm, m) + k]);
      sum += v;
      if (SQ) sq += v * v;
    }
  }
  s_sum[ty][tx] = sum;
  s_sq[ty][tx] = sq;
  __syncthreads();
  if (ty == 0 && k < K) {
    for (int i = 1; i < kStripRows; ++i) {
      sum += s_sum[i][tx];
      if (SQ) sq += s_sq[i][tx];
    }
    partial[chunk * K + k] = sum;
    if (SQ) partial[(chunks + chunk) * K + k] = sq;
  }
}

template <typename T, bool SQ>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_rows_fast_kernel(const T* __restrict__ y, int64_t sc, int64_t K, int64_t M, RowMap rm,
                            int64_t rows_per_chunk, int64_t chunks, acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const int64_t k = blockIdx.x, chunk = blockIdx.y;
  const int64_t m0 = chunk * rows_per_chunk;
  const int64_t m1 = m0 + rows_per_chunk < M ? m0 + rows_per_chunk : M;
  const T* yk = y + k * sc;
  A sum = A(0), sq = A(0);
  for (int64_t m = m0 + threadIdx.x; m < m1; m += blockDim.x) {
    const A v = to_acc<T>(yk[row_offset(rm, m)]);
    sum += v;
    if (SQ) sq += v * v;
  }
  sum = block_sum(sum, scratch);
  if (SQ) sq = block_sum(sq, scratch);
  if (threadIdx.x == 0) {
    partial[chunk * K + k] = sum;
    if (SQ) partial[(chunks + chunk) * K + k] = sq;
  }
}

// out_t[k] (and out_a[k], out_a[K + k]) from the chunks' partials, added in chunk order.
template <typename T, bool SQ>
__global__ void __launch_bounds__(kFinalizeThreads)
    finalize_kernel(const acc_t<T>* __restrict__ partial, int64_t K, int64_t chunks, T* __restrict__ out_t,
                    acc_t<T>* __restrict__ out_a, acc_t<T>* __restrict__ out_sq) {
  using A = acc_t<T>;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < K; k += int64_t(gridDim.x) * blockDim.x) {
    A sum = A(0), sq = A(0);
    for (int64_t c = 0; c < chunks; ++c) {
      sum += partial[c * K + k];
      if (SQ) sq += partial[(chunks + c) * K + k];
    }
    if (out_t != nullptr) out_t[k] = from_acc<T>(sum);
    if (out_a != nullptr) {
      out_a[k] = sum;
      if (SQ) out_sq[k] = sq;
    }
  }
}

// The shared reduction: grad_bias (T, sums only) or stats (acc_t, sums into out_a and squares into out_sq).
template <typename T, bool SQ>
cudaError_t reduce_channels(const Conv2dArgs<T>& args, T* out_t, acc_t<T>* out_a, acc_t<T>* out_sq,
                            cudaStream_t stream, void* workspace) {
  const Conv2dShape& s = args.shape;
  const int64_t K = s.k, M = s.n * s.p * s.q;
  if (K == 0) return cudaSuccess;
  if (M == 0) {  // an empty sum
    if (out_t != nullptr) return cudaMemsetAsync(out_t, 0, size_t(K) * sizeof(T), stream);
    const cudaError_t err = cudaMemsetAsync(out_a, 0, size_t(K) * sizeof(acc_t<T>), stream);
    if (err != cudaSuccess || !SQ) return err;
    return cudaMemsetAsync(out_sq, 0, size_t(K) * sizeof(acc_t<T>), stream);
  }
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const Chunks ch = plan_chunks(M);
  const RowMap rm = row_map(args.y, s);
  auto* partial = static_cast<acc_t<T>*>(workspace);
  if (channels_fast(args.y, s)) {
    const int64_t strips = (K + kStripCols - 1) / kStripCols;
    if (strips > 0x7fffffff) return cudaErrorNotSupported;
    reduce_channels_fast_kernel<T, SQ><<<dim3(unsigned(strips), unsigned(ch.count)), dim3(kStripCols, kStripRows), 0,
                                         stream>>>(args.y.data, K, M, rm, ch.rows, ch.count, partial);
  } else {
    if (K > 0x7fffffff) return cudaErrorNotSupported;
    reduce_rows_fast_kernel<T, SQ><<<dim3(unsigned(K), unsigned(ch.count)), kReduceThreads, 0, stream>>>(
        args.y.data, args.y.sc, K, M, rm, ch.rows, ch.count, partial);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  finalize_kernel<T, SQ><<<grid_for(K, kFinalizeThreads), kFinalizeThreads, 0, stream>>>(partial, K, ch.count, out_t,
                                                                                        out_a, out_sq);
  return cudaGetLastError();
}

template <typename T>
size_t reduce_workspace_bytes(const Conv2dArgs<T>& args) {
  const int64_t M = args.shape.n * args.shape.p * args.shape.q;
  return size_t(2) * size_t(plan_chunks(M).count) * size_t(args.shape.k < 0 ? 0 : args.shape.k) * sizeof(acc_t<T>);
}

// The forward's statistics come from conv2d_output_stats after this family's kernels (see the top of the file).
bool stats_after(Conv2dKernel kernel, Conv2dPass pass) {
  return pass == Conv2dPass::forward && kernel != Conv2dKernel::implicit_mma &&
         kernel != Conv2dKernel::implicit_wgmma && kernel != Conv2dKernel::implicit_tma;
}

template <typename T>
Conv2dArgs<T> without_stats(const Conv2dArgs<T>& args) {
  Conv2dArgs<T> a = args;
  a.stats = nullptr;
  a.stats_sq = nullptr;
  return a;
}

}  // namespace

template <typename T>
bool conv2d_supported(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args, const char** why) {
  if (args.w_acc != nullptr && (pass != Conv2dPass::backward_weight ||
                                (kernel != Conv2dKernel::implicit_mma && kernel != Conv2dKernel::implicit_wgmma &&
                                 kernel != Conv2dKernel::implicit_tma))) {
    if (why != nullptr) *why = "w_acc (a float weight gradient) is written by implicit_mma and implicit_tma only";
    return false;
  }
  switch (kernel) {
    case Conv2dKernel::direct:
      return conv2d_direct_supported(pass, without_stats(args), why);
    case Conv2dKernel::im2col:
      return conv2d_im2col_supported(pass, without_stats(args), why);
    case Conv2dKernel::implicit_simt:
      return conv2d_simt_supported(pass, without_stats(args), why);
    case Conv2dKernel::implicit_mma:
      return conv2d_implicit_supported(pass, args, why);
    case Conv2dKernel::implicit_wgmma:
      return conv2d_wgmma_supported(pass, args, why);
    case Conv2dKernel::implicit_tma:
      return conv2d_tma_supported(pass, args, why);
    default:
      if (why != nullptr) *why = "unknown kernel";
      return false;
  }
}

template <typename T>
size_t conv2d_workspace_bytes(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args) {
  size_t bytes = 0;
  switch (kernel) {
    case Conv2dKernel::direct:
      break;
    case Conv2dKernel::im2col:
      bytes = conv2d_im2col_workspace_bytes(pass, without_stats(args));
      break;
    case Conv2dKernel::implicit_simt:
      bytes = conv2d_simt_workspace_bytes(pass, without_stats(args));
      break;
    case Conv2dKernel::implicit_mma:
      bytes = conv2d_implicit_workspace_bytes(pass, args);
      break;
    case Conv2dKernel::implicit_wgmma:
      bytes = conv2d_wgmma_workspace_bytes(pass, args);
      break;
    case Conv2dKernel::implicit_tma:
      bytes = conv2d_tma_workspace_bytes(pass, args);
      break;
    default:
      return 0;
  }
  if (stats_after(kernel, pass) && args.stats != nullptr) {
    const size_t st = reduce_workspace_bytes(args);
    bytes = st > bytes ? st : bytes;
  }
  return bytes;
}

template <typename T>
cudaError_t conv2d(Conv2dKernel kernel, Conv2dPass pass, const Conv2dArgs<T>& args, cudaStream_t stream,
                   void* workspace) {
  if (!conv2d_supported(kernel, pass, args, nullptr)) return cudaErrorNotSupported;
  cudaError_t err = cudaSuccess;
  switch (kernel) {
    case Conv2dKernel::direct:
      err = conv2d_direct(pass, without_stats(args), stream);
      break;
    case Conv2dKernel::im2col:
      err = conv2d_im2col(pass, without_stats(args), stream, workspace);
      break;
    case Conv2dKernel::implicit_simt:
      err = conv2d_simt(pass, without_stats(args), stream, workspace);
      break;
    case Conv2dKernel::implicit_mma:
      return conv2d_implicit(pass, args, stream, workspace);
    case Conv2dKernel::implicit_wgmma:
      return conv2d_wgmma(pass, args, stream, workspace);
    case Conv2dKernel::implicit_tma:
      return conv2d_tma(pass, args, stream, workspace);
    default:
      return cudaErrorNotSupported;
  }
  if (err != cudaSuccess) return err;
  if (stats_after(kernel, pass) && args.stats != nullptr) err = conv2d_output_stats(args, stream, workspace);
  return err;
}

// A 1x1 stride-2 forward (ResNet's downsampling shortcuts) reads every other input row and column: implicit_tma's
// strided TMA boxes lose to implicit_mma's cp.async gathers there (H200, bf16, conv2d_tma_gpu_h200.csv: 49.2 against
// 37.4 us for 64 -> 128 at 32x32, batch 512; 38.3 against 29.3 for torchvision's 64 -> 128 at 56x56; within 3% either
// way at the other four such shapes).
template <typename T>
bool strided_pointwise_forward(Conv2dPass pass, const Conv2dArgs<T>& args) {
  const Conv2dShape& s = args.shape;
  return pass == Conv2dPass::forward && s.r == 1 && s.s == 1 && (s.stride_h > 1 || s.stride_w > 1);
}

template <typename T>
Conv2dKernel conv2d_default_kernel(Conv2dPass pass, const Conv2dArgs<T>& args) {
  if (strided_pointwise_forward(pass, args) && conv2d_implicit_supported(pass, args, nullptr)) {
    return Conv2dKernel::implicit_mma;
  }
  if (conv2d_tma_supported(pass, args, nullptr)) return Conv2dKernel::implicit_tma;
  if (conv2d_wgmma_supported(pass, args, nullptr)) return Conv2dKernel::implicit_wgmma;
  if (conv2d_implicit_supported(pass, args, nullptr)) return Conv2dKernel::implicit_mma;
  const Conv2dArgs<T> a = without_stats(args);
  if (conv2d_simt_supported(pass, a, nullptr)) return Conv2dKernel::implicit_simt;
  if (conv2d_im2col_supported(pass, a, nullptr) &&
      conv2d_im2col_workspace_bytes(pass, a) <= kDefaultIm2colWorkspaceCap) {
    return Conv2dKernel::im2col;
  }
  return Conv2dKernel::direct;
}

template <typename T>
size_t conv2d_backward_bias_workspace_bytes(const Conv2dArgs<T>& args) {
  return reduce_workspace_bytes(args);
}

template <typename T>
cudaError_t conv2d_backward_bias(const Conv2dArgs<T>& args, T* grad_bias, cudaStream_t stream, void* workspace) {
  if (grad_bias == nullptr && args.shape.k > 0) return cudaErrorInvalidValue;
  return reduce_channels<T, false>(args, grad_bias, nullptr, nullptr, stream, workspace);
}

template <typename T>
cudaError_t conv2d_output_stats(const Conv2dArgs<T>& args, cudaStream_t stream, void* workspace) {
  if (args.stats == nullptr && args.shape.k > 0) return cudaErrorInvalidValue;
  return reduce_channels<T, true>(args, nullptr, args.stats, conv2d_stats_sq(args), stream, workspace);
}

#define TORCHEXT_INSTANTIATE_CONV2D(T)                                                                   \
  template bool conv2d_supported<T>(Conv2dKernel, Conv2dPass, const Conv2dArgs<T>&, const char**);      \
  template size_t conv2d_workspace_bytes<T>(Conv2dKernel, Conv2dPass, const Conv2dArgs<T>&);            \
  template cudaError_t conv2d<T>(Conv2dKernel, Conv2dPass, const Conv2dArgs<T>&, cudaStream_t, void*);  \
  template Conv2dKernel conv2d_default_kernel<T>(Conv2dPass, const Conv2dArgs<T>&);                     \
  template size_t conv2d_backward_bias_workspace_bytes<T>(const Conv2dArgs<T>&);                        \
  template cudaError_t conv2d_backward_bias<T>(const Conv2dArgs<T>&, T*, cudaStream_t, void*);           \
  template cudaError_t conv2d_output_stats<T>(const Conv2dArgs<T>&, cudaStream_t, void*);
TORCHEXT_INSTANTIATE_CONV2D(float)
TORCHEXT_INSTANTIATE_CONV2D(double)
TORCHEXT_INSTANTIATE_CONV2D(__half)
TORCHEXT_INSTANTIATE_CONV2D(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_CONV2D

}  // namespace torchext::cuda_ops
