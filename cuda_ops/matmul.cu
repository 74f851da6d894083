// The launcher in front of the matmul ladder (cuda_ops/matmul.cuh): names, support checks, the default choice.
#include "matmul.cuh"

#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace torchext::cuda_ops {

const char* matmul_kernel_name(MatmulKernel kernel) {
  switch (kernel) {
    case MatmulKernel::naive:
      return "naive";
    case MatmulKernel::smem_tiled:
      return "smem_tiled";
    case MatmulKernel::register_blocked:
      return "register_blocked";
    case MatmulKernel::vectorized:
      return "vectorized";
    case MatmulKernel::warp_tiled:
      return "warp_tiled";
    case MatmulKernel::mma_sync:
      return "mma_sync";
    case MatmulKernel::wgmma:
      return "wgmma";
    default:
      return "unknown";
  }
}

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
cudaError_t matmul(MatmulKernel kernel, const MatmulArgs<T>& args, cudaStream_t stream) {
  if (!matmul_supported(kernel, args)) return cudaErrorNotSupported;
  switch (kernel) {
    case MatmulKernel::mma_sync:
      return matmul_mma_sync(args, stream);
    case MatmulKernel::wgmma:
      return matmul_wgmma(args, stream);
    default:
      return matmul_simt(kernel, args, stream);
  }
}

template <typename T>
MatmulKernel matmul_default_kernel(const MatmulArgs<T>& args) {
  // Tensor cores first (for float only when tf32 is allowed; the kernels refuse float otherwise), then the best
  // CUDA-core version that takes these strides, down to naive, which takes anything.
  for (MatmulKernel k : {MatmulKernel::wgmma, MatmulKernel::mma_sync}) {
    if (matmul_supported(k, args)) return k;
  }
  // Few output tiles on CUDA cores: with fewer 128 x 128 tiles than a quarter of the multiprocessors, warp_tiled
  // leaves most of the GPU idle (and, for a thin output such as a 10-class classifier, computes mostly padding);
  // smem_tiled's 32 x 32 tiles spread the work 16 times wider. The quarter is where the two cross on an H200
  // (warp_tiled ~38, smem_tiled ~8.6 TFLOP/s on a full GPU at 4096). Measured before this rule: Linear
  // 512 x 512 -> 10 in float32 took 71 us forward on warp_tiled; 4096 x 784 -> 256 fwd+bwd ran 0.30x PyTorch.
  const int64_t big_tiles = ((args.m + 127) / 128) * ((args.n + 127) / 128) * args.batch;
  if (4 * big_tiles < sm_count() && matmul_supported(MatmulKernel::smem_tiled, args)) {
    return MatmulKernel::smem_tiled;
  }
  for (MatmulKernel k : {MatmulKernel::warp_tiled, MatmulKernel::vectorized, MatmulKernel::register_blocked,
                         MatmulKernel::smem_tiled}) {
    if (matmul_supported(k, args)) return k;
  }
  return MatmulKernel::naive;
}

#define TORCHEXT_INSTANTIATE_MATMUL(T)                                                            \
  template bool matmul_supported<T>(MatmulKernel, const MatmulArgs<T>&, const char**);           \
  template cudaError_t matmul<T>(MatmulKernel, const MatmulArgs<T>&, cudaStream_t);              \
  template MatmulKernel matmul_default_kernel<T>(const MatmulArgs<T>&);
TORCHEXT_INSTANTIATE_MATMUL(float)
TORCHEXT_INSTANTIATE_MATMUL(double)
TORCHEXT_INSTANTIATE_MATMUL(__half)
TORCHEXT_INSTANTIATE_MATMUL(__nv_bfloat16)
#undef TORCHEXT_INSTANTIATE_MATMUL

}  // namespace torchext::cuda_ops
