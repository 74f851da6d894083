// Standalone timing of the CUDA-core ladder's float32 versions against cuBLAS SGEMM (tf32 off), without torch:
// used to pick the v5 tile shape (cuda_ops/matmul_simt.cu, TORCHEXT_MATMUL_V5_CONFIG) in one GPU call.
// TORCHEXT_SIMT_FLOAT_ONLY builds the float kernels alone (20 s instead of 90 per config).
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I cuda_ops \
//        -DTORCHEXT_SIMT_FLOAT_ONLY -DTORCHEXT_MATMUL_V5_CONFIG=0 \
//        benchmarks/simt_check.cu cuda_ops/matmul_simt.cu cuda_ops/common.cu -lcublas
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "matmul.cuh"

#ifndef TORCHEXT_MATMUL_V5_CONFIG
#define TORCHEXT_MATMUL_V5_CONFIG 0  // as in cuda_ops/matmul_simt.cu
#endif

using namespace torchext::cuda_ops;

__global__ void fill(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    x[i] = float(h & 0xFFFF) / 32768.f - 1.f;
  }
}

// SIMT_ONCE=1 in the environment: one launch of each (for ncu), no timing.
int main() {
  const int n = 4096;
  const bool once = std::getenv("SIMT_ONCE") != nullptr;
  float *a, *b, *c, *r;
  cudaMalloc(&a, sizeof(float) * n * n), cudaMalloc(&b, sizeof(float) * n * n);
  cudaMalloc(&c, sizeof(float) * n * n), cudaMalloc(&r, sizeof(float) * n * n);
  fill<<<1024, 256>>>(a, int64_t(n) * n, 1), fill<<<1024, 256>>>(b, int64_t(n) * n, 2);
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1, zero = 0;
  auto cublas = [&] { cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, n, a, n, &zero, r, n); };
  MatmulArgs<float> p;
  p.m = p.n = p.k = n, p.a = a, p.a_rs = n, p.a_cs = 1, p.b = b, p.b_rs = n, p.b_cs = 1, p.c = c, p.c_rs = n;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  auto time = [&](auto&& fn) {
    std::vector<float> ms;
    for (int i = 0; i < 3; ++i) fn();
    for (int i = 0; i < 15; ++i) {
      cudaEventRecord(e0), fn(), cudaEventRecord(e1), cudaEventSynchronize(e1);
      float t;
      cudaEventElapsedTime(&t, e0, e1), ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  cublas();
  for (MatmulKernel k : {MatmulKernel::register_blocked, MatmulKernel::vectorized, MatmulKernel::warp_tiled}) {
    if (matmul_simt(k, p, 0) != cudaSuccess) return std::printf("launch failed\n"), 1;
    cudaDeviceSynchronize();
    if (once) continue;
    std::vector<float> hc(size_t(n) * n), hr(size_t(n) * n);
    cudaMemcpy(hc.data(), c, hc.size() * 4, cudaMemcpyDeviceToHost),
        cudaMemcpy(hr.data(), r, hr.size() * 4, cudaMemcpyDeviceToHost);
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < hc.size(); ++i) e2 += double(hc[i] - hr[i]) * (hc[i] - hr[i]), r2 += double(hr[i]) * hr[i];
    const float t_k = time([&] { matmul_simt(k, p, 0); }), t_c = time(cublas);
    const float t_k2 = time([&] { matmul_simt(k, p, 0); }), t_c2 = time(cublas);
    std::printf("config %d %-16s %.3f ms vs cuBLAS %.3f ms: %.1f%% (rel diff %.1e)\n", TORCHEXT_MATMUL_V5_CONFIG,
                matmul_kernel_name(k), (t_k + t_k2) / 2, (t_c + t_c2) / 2, 100.0 * (t_c + t_c2) / (t_k + t_k2),
                std::sqrt(e2 / r2));
  }
  return 0;
}
