// The launcher in front of the matmul ladder (cuda_ops/matmul.cuh): names, support checks, the default choice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common.cuh"
#include "matmul.cuh"

namespace torchext::cuda_ops {

template <typename T>
bool matmul_supported(MatmulKernel kernel, const MatmulArgs<T>& args, const char** why) {
  switch (kernel) {
    case MatmulKernel::mma_sync:
      return matmul_mma_sync_supported(args, why);
    case MatmulKernel::wgmma:
      return matmul_wgmma_supported(args, why);
    case MatmulKernel::naive:
    case MatmulKernel::smem_tiled:
    case MatmulKernel::register_blocked:
    case MatmulKernel::vectorized:
    case MatmulKernel::warp_tiled:
      return matmul_simt_supported(kernel, args, why);
    default:
      if (why) *why = "unknown kernel";
      return false;
  }
}

template <typename T>
size_t matmul_workspace_bytes(MatmulKernel kernel, const MatmulArgs<T>& args) {
  switch (kernel) {
    case MatmulKernel::mma_sync:
      return 0;
    case MatmulKernel::wgmma:
      return matmul_wgmma_workspace_bytes(args);
    default:
      return matmul_simt_workspace_bytes(kernel, args);
  }
}

template <typename T>
cudaError_t matmul(MatmulKernel kernel, const MatmulArgs<T>& args, cudaStream_t stream, void* workspace) {
  if (!matmul_supported(kernel, args)) return cudaErrorNotSupported;
  switch (kernel) {
    case MatmulKernel::mma_sync:
      return matmul_mma_sync(args, stream);
    case MatmulKernel::wgmma:
      return matmul_wgmma(args, stream, workspace);
    default:
      return matmul_simt(kernel, args, stream, workspace);
  }
}

template <typename T>
MatmulKernel matmul_default_kernel(const MatmulArgs<T>& args) {
  // A thin product (an output with at most 32 rows or columns, or k <= 32) of few flops, such as a 10-class
  // classifier's forward and weight gradient: the tensor-core kernels' 128-wide tiles compute mostly padding, in a
  // handful of blocks that each walk all of k (11-27 us on an H200 for the 512 x 512 -> 10 layer's three GEMMs,
  // against cuBLAS's 3-6 us). smem_tiled's 32 x 32 tiles with split-K spread the same work over the GPU.
  const bool thin = args.m <= 32 || args.n <= 32 || args.k <= 32;
  const bool small = args.batch * args.m * args.n * args.k <= (int64_t(1) << 27);
  if (thin && small && matmul_supported(MatmulKernel::smem_tiled, args)) return MatmulKernel::smem_tiled;
  // Tensor cores first (for float only when tf32 is allowed; the kernels refuse float otherwise), then the best
  // CUDA-core version that takes these strides, down to naive, which takes anything.
  for (MatmulKernel k : {MatmulKernel::wgmma, MatmulKernel::mma_sync}) {
    if (matmul_supported(k, args)) return k;
  }
  // On CUDA cores: warp_tiled where its grid, split along k where it has few tiles (matmul_simt.cu), keeps at
  // least a quarter of the multiprocessors busy; otherwise (a thin output, or few tiles and a short k) smem_tiled,
  // whose 32 x 32 tiles spread the work 16 times wider. Measured before these rules: Linear 512 x 512 -> 10 in
  // float32 took 71 us forward on warp_tiled; 4096 x 784 -> 256 fwd+bwd ran 0.30x PyTorch.
  if (!thin && matmul_supported(MatmulKernel::warp_tiled, args) &&
      4 * matmul_simt_blocks(MatmulKernel::warp_tiled, args) >= sm_count()) {
    return MatmulKernel::warp_tiled;
  }
  for (MatmulKernel k :
       {MatmulKernel::smem_tiled, MatmulKernel::warp_tiled, MatmulKernel::vectorized, MatmulKernel::register_blocked}) {
    if (matmul_supported(k, args)) return k;
  }
  return MatmulKernel::naive;
}

namespace {

constexpr int kTransposeTile = 32, kTransposeRowsPerPass = 8;

template <typename T>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRowsPerPass)
    transpose_copy_kernel(const T* __restrict__ src, int64_t rows, int64_t cols, int64_t src_cs, int64_t src_bs,
                          T* __restrict__ dst, int64_t col_tiles) {
  __shared__ T tile[kTransposeTile][kTransposeTile + 1];  // +1: the transposed reads hit 32 different banks
  const int64_t b = blockIdx.z;
  const int64_t r0 = int64_t(blockIdx.y) * kTransposeTile;
  for (int64_t ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
    const int64_t c0 = ct * kTransposeTile;
    // Read along the source's contiguous dimension (rows)...
#pragma unroll
    for (int i = 0; i < kTransposeTile; i += kTransposeRowsPerPass) {
      const int64_t r = r0 + threadIdx.x, c = c0 + threadIdx.y + i;
      if (r < rows && c < cols) tile[threadIdx.y + i][threadIdx.x] = src[b * src_bs + r + c * src_cs];
    }
    __syncthreads();
    // ...write along the destination's (cols).
#pragma unroll
    for (int i = 0; i < kTransposeTile; i += kTransposeRowsPerPass) {
      const int64_t r = r0 + threadIdx.y + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) dst[(b * rows + r) * cols + c] = tile[threadIdx.x][threadIdx.y + i];
    }
    __syncthreads();
  }
}

}  // namespace

template <typename T>
cudaError_t transpose_copy(const T* src, int64_t rows, int64_t cols, int64_t src_cs, int64_t batch, int64_t src_bs,
                           T* dst, cudaStream_t stream) {
  if (rows == 0 || cols == 0 || batch == 0) return cudaSuccess;
  const int64_t row_tiles = (rows + kTransposeTile - 1) / kTransposeTile;
  const int64_t col_tiles = (cols + kTransposeTile - 1) / kTransposeTile;
  if (row_tiles > 65535 || batch > 65535) return cudaErrorNotSupported;
  const dim3 grid(unsigned(col_tiles < 65535 ? col_tiles : 65535), unsigned(row_tiles), unsigned(batch));
  transpose_copy_kernel<T><<<grid, dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(src, rows, cols, src_cs,
                                                                                             src_bs, dst, col_tiles);
  return cudaGetLastError();
}

#define TORCHEXT_INSTANTIATE_MATMUL(T)                                                     \
  template bool matmul_supported<T>(MatmulKernel, const MatmulArgs<T>&, const char**);     \
  template size_t matmul_workspace_bytes<T>(MatmulKernel, const MatmulArgs<T>&);           \
  template cudaError_t matmul<T>(MatmulKernel, const MatmulArgs<T>&, cudaStream_t, void*); \
  template MatmulKernel matmul_default_kernel<T>(const MatmulArgs<T>&);                    \
  template cudaError_t transpose_copy<T>(const T*, int64_t, int64_t, int64_t, int64_t, int64_t, T*, cudaStream_t);
TORCHEXT_INSTANTIATE_MATMUL(float)
TORCHEXT_INSTANTIATE_MATMUL(double)
TORCHEXT_INSTANTIATE_MATMUL(__half)
TORCHEXT_INSTANTIATE_MATMUL(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_MATMUL

}  // namespace torchext::cuda_ops
