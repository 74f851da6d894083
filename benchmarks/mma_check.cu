// Standalone GPU check of matmul_mma_sync (not part of the repo). Build from the repo root:
//   nvcc -std=c++17 -O2 --expt-relaxed-constexpr -I cuda_ops -gencode=arch=compute_90a,code=sm_90a \
//        /path/mma_check.cu cuda_ops/matmul_mma.cu cuda_ops/common.cu -o /tmp/mma_check && /tmp/mma_check
// Small integer inputs make every product and sum exact in fp32, so C must match a naive reference bit for bit
// (act none / relu); smooth activations are compared with a tolerance. Prints one line per failing case.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_check.h"
#include "matmul.cuh"
#include "matmul_epilogue.cuh"

using namespace torchext::cuda_ops;

template <typename T>
__global__ void reference_kernel(MatmulArgs<T> p) {
  const int64_t total = p.batch * p.m * p.n;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total; idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = idx / (p.m * p.n), i = (idx / p.n) % p.m, j = idx % p.n;
    double acc = 0;
    for (int64_t q = 0; q < p.k; ++q) {
      acc += (double)(float)p.a[b * p.a_bs + i * p.a_rs + q * p.a_cs] * (double)(float)p.b[b * p.b_bs + q * p.b_rs + j * p.b_cs];
    }
    store_epilogue(p, b, i, j, (float)acc);
  }
}

template <typename T>
float to_f(T v) { return (float)v; }

struct Case {
  int64_t m, n, k, batch;
  bool a_col, b_col;  // column-major (M-major A, K-major... see below)
  int pad;            // extra elements in the leading dimension (0 keeps it dense)
  int offset;         // elements added to the base pointers (misalignment)
  bool a_bcast;       // A batch stride 0
  Activation act;
  bool bias, aux;
};

template <typename T>
int run_case(const Case& cs, bool tf32) {
  // A: (m, k); a_col -> column-major (a_rs = 1, a_cs = ld). B: (k, n); b_col -> column-major (b_rs = 1).
  const int64_t lda = (cs.a_col ? cs.m : cs.k) + cs.pad, ldb = (cs.b_col ? cs.k : cs.n) + cs.pad;
  const int64_t a_mat = (cs.a_col ? cs.k : cs.m) * lda, b_mat = (cs.b_col ? cs.n : cs.k) * ldb;
  const int64_t a_elems = (cs.a_bcast ? 1 : cs.batch) * a_mat + cs.offset + 8, b_elems = cs.batch * b_mat + cs.offset + 8;
  const int64_t c_elems = cs.batch * cs.m * cs.n + cs.offset + 8;
  std::vector<T> ha(a_elems), hb(b_elems), hbias(cs.n + 8);
  srand(1234);
  for (auto& v : ha) v = (T)(float)(rand() % 9 - 4);
  for (auto& v : hb) v = (T)(float)(rand() % 9 - 4);
  for (auto& v : hbias) v = (T)(float)(rand() % 9 - 4);
  T *da, *db, *dc, *dr, *dbias, *daux, *draux;
  CK(cudaMalloc(&da, a_elems * sizeof(T)));
  CK(cudaMalloc(&db, b_elems * sizeof(T)));
  CK(cudaMalloc(&dc, c_elems * sizeof(T)));
  CK(cudaMalloc(&dr, c_elems * sizeof(T)));
  CK(cudaMalloc(&daux, c_elems * sizeof(T)));
  CK(cudaMalloc(&draux, c_elems * sizeof(T)));
  CK(cudaMalloc(&dbias, (cs.n + 8) * sizeof(T)));
  CK(cudaMemcpy(da, ha.data(), a_elems * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), b_elems * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbias, hbias.data(), (cs.n + 8) * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0xff, c_elems * sizeof(T)));
  CK(cudaMemset(dr, 0xff, c_elems * sizeof(T)));
  CK(cudaMemset(daux, 0xff, c_elems * sizeof(T)));
  CK(cudaMemset(draux, 0xff, c_elems * sizeof(T)));

  MatmulArgs<T> p;
  p.m = cs.m; p.n = cs.n; p.k = cs.k; p.batch = cs.batch;
  p.a = da + cs.offset; p.a_rs = cs.a_col ? 1 : lda; p.a_cs = cs.a_col ? lda : 1; p.a_bs = cs.a_bcast ? 0 : a_mat;
  p.b = db + cs.offset; p.b_rs = cs.b_col ? 1 : ldb; p.b_cs = cs.b_col ? ldb : 1; p.b_bs = b_mat;
  p.c = dc + cs.offset; p.c_rs = cs.n; p.c_bs = cs.m * cs.n;
  p.bias = cs.bias ? dbias : nullptr;
  p.act = cs.act;
  p.aux = cs.aux ? daux + cs.offset : nullptr;
  p.allow_tf32 = tf32;
  const char* why = nullptr;
  if (!matmul_mma_sync_supported(p, &why)) {
    printf("unsupported: %s\n", why);
    return 1;
  }
  CK(matmul_mma_sync(p, 0));
  CK(cudaDeviceSynchronize());
  MatmulArgs<T> r = p;
  r.c = dr + cs.offset;
  r.aux = cs.aux ? draux + cs.offset : nullptr;
  reference_kernel<<<1024, 256>>>(r);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<T> hc(c_elems), hr(c_elems), hx(c_elems), hrx(c_elems);
  CK(cudaMemcpy(hc.data(), dc, c_elems * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hr.data(), dr, c_elems * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hx.data(), daux, c_elems * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hrx.data(), draux, c_elems * sizeof(T), cudaMemcpyDeviceToHost));
  const bool exact = cs.act == Activation::none || cs.act == Activation::relu;
  int64_t bad = 0;
  for (int64_t i = 0; i < c_elems; ++i) {
    // untouched guard regions must still hold the 0xff poison in both
    const float x = to_f(hc[i]), y = to_f(hr[i]);
    const bool same_bits = memcmp(&hc[i], &hr[i], sizeof(T)) == 0;
    bool ok = same_bits || (!exact && std::fabs(x - y) <= 1e-2f * (1 + std::fabs(y)));
    if (cs.aux) ok = ok && memcmp(&hx[i], &hrx[i], sizeof(T)) == 0;
    if (!ok && bad++ < 3) printf("  mismatch at %lld: got %g want %g\n", (long long)i, x, y);
  }
  cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dr); cudaFree(dbias); cudaFree(daux); cudaFree(draux);
  return bad ? 1 : 0;
}

template <typename T>
int run_all(const char* name, bool tf32) {
  const int64_t shapes[][4] = {{1, 1, 1, 1},       {7, 13, 5, 1},     {1023, 1025, 17, 1}, {128, 256, 64, 1},
                               {256, 512, 512, 1}, {300, 260, 200, 1}, {129, 257, 193, 3}, {64, 64, 1000, 2},
                               {512, 10, 512, 1},  {512, 512, 10, 1},  {2048, 2048, 256, 1}, {1, 300, 70, 1},
                               {300, 1, 70, 1},    {200, 136, 0, 1},   {8, 8, 8, 70000}};
  int fails = 0, total = 0;
  for (auto& s : shapes) {
    for (int lay = 0; lay < 4; ++lay) {
      for (int variant = 0; variant < 4; ++variant) {
        if (s[3] > 1000 && (lay > 0 || variant > 0)) continue;
        Case cs{s[0], s[1], s[2], s[3], (lay & 1) != 0, (lay & 2) != 0, 0, 0, false, Activation::none, false, false};
        if (variant == 1) { cs.pad = 8; cs.bias = true; cs.act = Activation::relu; cs.aux = true; }
        if (variant == 2) { cs.pad = 3; cs.offset = 1; cs.act = Activation::gelu; cs.bias = true; }
        if (variant == 3) { cs.a_bcast = true; cs.act = Activation::silu; cs.aux = true; }
        ++total;
        const int f = run_case<T>(cs, tf32);
        if (f) printf("FAIL %s m=%lld n=%lld k=%lld batch=%lld a_col=%d b_col=%d variant=%d\n", name, (long long)s[0],
                      (long long)s[1], (long long)s[2], (long long)s[3], cs.a_col, cs.b_col, variant);
        fails += f;
      }
    }
  }
  printf("%s: %d of %d cases failed\n", name, fails, total);
  return fails;
}

template <typename T>
double time_gemm(int64_t n, bool a_col, bool b_col, bool tf32) {
  T *a, *b, *c;
  CK(cudaMalloc(&a, n * n * sizeof(T)));
  CK(cudaMalloc(&b, n * n * sizeof(T)));
  CK(cudaMalloc(&c, n * n * sizeof(T)));
  CK(cudaMemset(a, 0, n * n * sizeof(T)));
  CK(cudaMemset(b, 0, n * n * sizeof(T)));
  MatmulArgs<T> p;
  p.m = p.n = p.k = n;
  p.a = a; p.a_rs = a_col ? 1 : n; p.a_cs = a_col ? n : 1;
  p.b = b; p.b_rs = b_col ? 1 : n; p.b_cs = b_col ? n : 1;
  p.c = c; p.c_rs = n;
  p.allow_tf32 = tf32;
  for (int i = 0; i < 3; ++i) CK(matmul_mma_sync(p, 0));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  const int iters = 20;
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) matmul_mma_sync(p, 0);
  cudaEventRecord(e1);
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a); cudaFree(b); cudaFree(c);
  return 2.0 * n * n * n / (ms / iters * 1e-3) / 1e12;
}

int main() {
  int fails = 0;
  fails += run_all<__nv_bfloat16>("bf16", false);
  fails += run_all<__half>("fp16", false);
  fails += run_all<float>("tf32", true);
  for (int64_t n : {1024, 2048, 4096, 8192}) {
    printf("n=%lld  bf16 TN %.1f  NN %.1f  NT %.1f  TT %.1f TFLOP/s   tf32 NN %.1f  fp16 NN %.1f\n", (long long)n,
           time_gemm<__nv_bfloat16>(n, false, true, false), time_gemm<__nv_bfloat16>(n, false, false, false),
           time_gemm<__nv_bfloat16>(n, true, false, false), time_gemm<__nv_bfloat16>(n, true, true, false),
           time_gemm<float>(n, false, false, true), time_gemm<__half>(n, false, false, false));
  }
  return fails ? 1 : 0;
}
