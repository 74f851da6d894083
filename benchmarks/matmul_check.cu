// Standalone check and timing of the tensor-core matmul kernels against cuBLAS, without torch: compiles in seconds
// on the GPU machine, so a kernel can be iterated on without rebuilding the extension.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DTORCHEXT_BUILT_SM90A -gencode=arch=compute_90a,code=sm_90a \
//        -I cuda_ops benchmarks/matmul_check.cu cuda_ops/matmul_wgmma.cu cuda_ops/common.cu -lcublas -o matmul_check
//   ./matmul_check [--quick]
//
//   ./matmul_check --linear   (the three GEMMs of Linear 8192 x 4096 -> 4096, timed)
//
// For every case: relative Frobenius error of the kernel and of cuBLAS (same dtype) against a float64 cuBLAS
// product of the same inputs, a check that every output element was written (outputs are poisoned with NaN
// first), and for the large cases the median times over 40 interleaved rounds (CUDA events, warm-up). The kernel runs
// with its workspace (stream-K where there are few tiles and a long k) and without (each tile whole): both must be
// right, the first must give the same bits twice, and both are timed.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "matmul.cuh"

using namespace torchext::cuda_ops;

#define CHECK_CUBLAS(x)                                                                      \
  do {                                                                                       \
    cublasStatus_t s_ = (x);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

__device__ inline float hash_uniform(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return float(x >> 40) / float(1ull << 24) * 2.f - 1.f;
}

template <typename T>
__global__ void fill_kernel(T* x, double* x64, int64_t n, uint64_t seed, bool integers) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float u = hash_uniform(i, seed);
    if (integers) u = rintf(u * 3.f);
    const T v = T(u);
    x[i] = v;
    if (x64) x64[i] = double(float(v));
  }
}

template <typename T>
__global__ void error_kernel(const T* c, int64_t c_rs, const double* ref, int64_t m, int64_t n, int64_t batch,
                             double* acc /* [err2, ref2, unwritten] */) {
  double e2 = 0, r2 = 0, bad = 0;
  const int64_t total = m * n * batch;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (m * n), r = (i / n) % m, col = i % n;
    const double v = double(float(c[b * m * c_rs + r * c_rs + col]));
    const double w = ref[i];
    if (std::isnan(v)) bad += 1;
    e2 += (v - w) * (v - w);
    r2 += w * w;
  }
  atomicAdd(&acc[0], e2);
  atomicAdd(&acc[1], r2);
  atomicAdd(&acc[2], bad);
}

template <typename T>
cudaDataType cuda_type() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, __half>) return CUDA_R_16F;
  return CUDA_R_32F;
}

struct Case {
  const char* dtype;
  int64_t m, n, k, batch;
  bool a_kmajor, b_kmajor, b_broadcast;
  bool timed;
  bool bias_relu;
};

// Operands stored densely with leading dimensions padded to 8 elements (16 bytes) so TMA can read them.
static int64_t pad8(int64_t x) { return (x + 7) / 8 * 8; }

template <typename T>
void run_case(cublasHandle_t h, const Case& cs, bool integers) {
  const int64_t m = cs.m, n = cs.n, k = cs.k, batch = cs.batch;
  // A (m, k): K-major -> row-major with ld pad8(k); M-major -> column-major with ld pad8(m).
  const int64_t a_ld = cs.a_kmajor ? pad8(k) : pad8(m);
  const int64_t a_size = cs.a_kmajor ? m * a_ld : k * a_ld;
  const int64_t b_ld = cs.b_kmajor ? pad8(k) : pad8(n);
  const int64_t b_size = cs.b_kmajor ? n * b_ld : k * b_ld;
  const int64_t b_batches = cs.b_broadcast ? 1 : batch;
  const int64_t c_ld = n;
  T *a, *b, *c, *cb;
  double *a64, *b64, *ref, *acc;
  T* bias = nullptr;
  CK(cudaMalloc(&a, a_size * batch * sizeof(T)));
  CK(cudaMalloc(&b, b_size * b_batches * sizeof(T)));
  CK(cudaMalloc(&c, m * c_ld * batch * sizeof(T)));
  CK(cudaMalloc(&cb, m * c_ld * batch * sizeof(T)));
  CK(cudaMalloc(&a64, a_size * batch * sizeof(double)));
  CK(cudaMalloc(&b64, b_size * b_batches * sizeof(double)));
  CK(cudaMalloc(&ref, m * n * batch * sizeof(double)));
  CK(cudaMalloc(&acc, 3 * sizeof(double)));
  fill_kernel<<<1024, 256>>>(a, a64, a_size * batch, 1, integers);
  fill_kernel<<<1024, 256>>>(b, b64, b_size * b_batches, 2, integers);
  CK(cudaGetLastError());

  MatmulArgs<T> p;
  p.m = m, p.n = n, p.k = k, p.batch = batch;
  p.a = a, p.a_rs = cs.a_kmajor ? a_ld : 1, p.a_cs = cs.a_kmajor ? 1 : a_ld, p.a_bs = a_size;
  p.b = b, p.b_rs = cs.b_kmajor ? 1 : b_ld, p.b_cs = cs.b_kmajor ? b_ld : 1, p.b_bs = cs.b_broadcast ? 0 : b_size;
  p.c = c, p.c_rs = c_ld, p.c_bs = m * c_ld;
  p.allow_tf32 = true;
  if (cs.bias_relu) {
    CK(cudaMalloc(&bias, n * sizeof(T)));
    fill_kernel<<<64, 256>>>(bias, (double*)nullptr, n, 3, integers);
    p.bias = bias;
    p.act = Activation::relu;
  }

  // float64 reference, per batch: column-major view C^T (n x m) = B^T A^T.
  const cublasOperation_t op_b = cs.b_kmajor ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = cs.a_kmajor ? CUBLAS_OP_N : CUBLAS_OP_T;
  const double one = 1, zero = 0;
  for (int64_t bi = 0; bi < batch; ++bi) {
    CHECK_CUBLAS(cublasDgemm(h, op_b, op_a, n, m, k, &one, b64 + (cs.b_broadcast ? 0 : bi * b_size), b_ld,
                             a64 + bi * a_size, a_ld, &zero, ref + bi * m * n, n));
  }
  if (cs.bias_relu) {
    // ref = relu(ref + bias), on the host (small cases only).
    std::vector<double> r(m * n * batch);
    std::vector<T> hb(n);
    CK(cudaMemcpy(r.data(), ref, r.size() * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), bias, n * sizeof(T), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::max(0.0, r[i] + double(float(hb[i % n])));
    CK(cudaMemcpy(ref, r.data(), r.size() * 8, cudaMemcpyHostToDevice));
  }

  auto measure_error = [&](const T* out, double* rel, double* unwritten) {
    CK(cudaMemset(acc, 0, 3 * sizeof(double)));
    error_kernel<<<1024, 256>>>(out, c_ld, ref, m, n, batch, acc);
    double h_acc[3];
    CK(cudaMemcpy(h_acc, acc, sizeof(h_acc), cudaMemcpyDeviceToHost));
    *rel = std::sqrt(h_acc[0] / std::max(h_acc[1], 1e-300));
    *unwritten = h_acc[2];
  };

  const char* why = nullptr;
  if (!matmul_wgmma_supported(p, &why)) {
    std::printf("%-5s %5ld x %5ld x %5ld b%ld A%s B%s: unsupported: %s\n", cs.dtype, long(m), long(n), long(k),
                long(batch), cs.a_kmajor ? "k" : "m", cs.b_kmajor ? "k" : "n", why);
    return;
  }
  const size_t ws_bytes = matmul_wgmma_workspace_bytes(p);
  void* ws = nullptr;
  if (ws_bytes > 0) CK(cudaMalloc(&ws, ws_bytes));
  // Without the workspace: each tile computed whole by one block.
  auto whole_tiles = [&] { return matmul_wgmma(p, 0, nullptr); };
  CK(cudaMemset(c, 0xFF, m * c_ld * batch * sizeof(T)));  // NaN in every float type
  CK(whole_tiles());
  CK(cudaDeviceSynchronize());
  double err_whole, bad_whole;
  measure_error(c, &err_whole, &bad_whole);
  // With it (stream-K where the schedule splits), twice: the same bits each time.
  const size_t c_bytes = m * c_ld * batch * sizeof(T);
  std::vector<uint8_t> first(c_bytes), second(c_bytes);
  CK(cudaMemset(ws, 0x5A, ws_bytes));  // garbage in the workspace, as from the caching allocator
  CK(cudaMemset(c, 0xFF, c_bytes));
  CK(matmul_wgmma(p, 0, ws));
  CK(cudaMemcpy(first.data(), c, c_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemset(c, 0xFF, c_bytes));
  CK(matmul_wgmma(p, 0, ws));
  CK(cudaMemcpy(second.data(), c, c_bytes, cudaMemcpyDeviceToHost));
  const bool same_bits = first == second;
  double err, bad;
  measure_error(c, &err, &bad);

  // cuBLAS in the same dtype (no epilogue: compare its error only on plain products).
  const float onef = 1, zerof = 0;
  const cublasComputeType_t ct = std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  auto cublas_run = [&]() {
    for (int64_t bi = 0; bi < batch; ++bi) {
      CHECK_CUBLAS(cublasGemmEx(h, op_b, op_a, n, m, k, &onef, b + (cs.b_broadcast ? 0 : bi * b_size), cuda_type<T>(),
                                b_ld, a + bi * a_size, cuda_type<T>(), a_ld, &zerof, cb + bi * m * c_ld, cuda_type<T>(),
                                c_ld, ct, CUBLAS_GEMM_DEFAULT));
    }
  };
  double err_cublas = NAN, bad_cublas = 0;
  if (!cs.bias_relu) {
    cublas_run();
    CK(cudaDeviceSynchronize());
    measure_error(cb, &err_cublas, &bad_cublas);
  }
  auto good = [&](double e, double b) {
    // tf32: cuBLAS runs some shapes (k = 17) in full float32 even where tf32 is allowed; tf32's own rounding
    // (2^-11 relative per operand) bounds the error at about 1e-3 whatever cuBLAS chose.
    const double floor = std::strcmp(cs.dtype, "tf32") == 0 ? 1e-3 : 1e-7;
    return b == 0 && (integers ? e <= err_cublas : (cs.bias_relu || e <= 2 * err_cublas + floor));
  };
  std::printf(
      "%-5s %5ld x %5ld x %5ld b%ld A%s B%s%s: err %.3e, whole tiles %.3e (cuBLAS %.3e) unwritten/NaN %.0f/%.0f "
      "workspace %s, same bits twice %s  %s\n",
      cs.dtype, long(m), long(n), long(k), long(batch), cs.a_kmajor ? "k" : "m", cs.b_kmajor ? "k" : "n",
      cs.bias_relu ? " +bias+relu" : "", err, err_whole, err_cublas, bad, bad_whole, ws_bytes > 0 ? "yes" : "no",
      same_bits ? "yes" : "NO", (good(err, bad) && good(err_whole, bad_whole) && same_bits) ? "ok" : "FAIL");

  if (cs.timed) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // The three interleaved, one call of each per round in rotating order, so that clock and power drift hit all
    // three alike (a large GEMM holds an H200 at its power limit): medians over the rounds.
    std::vector<float> ms[3];
    auto one = [&](int which) {
      CK(cudaEventRecord(e0));
      if (which == 0) CK(matmul_wgmma(p, 0, ws));
      if (which == 1) CK(whole_tiles());
      if (which == 2) cublas_run();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      return t;
    };
    for (int i = 0; i < 3; ++i) one(0), one(1), one(2);
    for (int round = 0; round < 40; ++round) {
      for (int j = 0; j < 3; ++j) {
        const int which = (round + j) % 3;
        ms[which].push_back(one(which));
      }
    }
    auto median = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const float t_sk = median(ms[0]), t_whole = median(ms[1]), t_cublas = median(ms[2]);
    const double flop = 2.0 * m * n * k * batch;
    auto tf = [&](float t) { return flop / (t * 1e9); };
    std::printf(
        "      time: wgmma %.3f ms %.1f TFLOP/s, whole tiles %.3f ms %.1f | cuBLAS %.3f ms %.1f TFLOP/s | ratio %.3f "
        "(whole tiles %.3f)\n",
        t_sk, tf(t_sk), t_whole, tf(t_whole), t_cublas, tf(t_cublas), t_cublas / t_sk, t_cublas / t_whole);
  }
  if (ws) cudaFree(ws);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(cb), cudaFree(a64), cudaFree(b64), cudaFree(ref), cudaFree(acc);
  if (bias) cudaFree(bias);
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool profile = argc > 1 && std::strcmp(argv[1], "--profile") == 0;  // one bf16 4096^3 product, for ncu
  const bool linear = argc > 1 && std::strcmp(argv[1], "--linear") == 0;
  cublasHandle_t h;
  CHECK_CUBLAS(cublasCreate(&h));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::vector<Case> cases;
  for (const char* dt : {"bf16", "fp16", "tf32"}) {
    const bool tf32 = std::strcmp(dt, "tf32") == 0;
    for (int lay = 0; lay < 4; ++lay) {
      const bool ak = lay & 1, bk = lay & 2;
      if (tf32 && !(ak && bk)) continue;
      cases.push_back({dt, 7, 13, 5, 1, ak, bk, false, false, false});
      cases.push_back({dt, 1023, 1025, 17, 1, ak, bk, false, false, false});
      cases.push_back({dt, 300, 520, 1000, 3, ak, bk, false, false, false});
      cases.push_back({dt, 300, 520, 1000, 3, ak, bk, true, false, false});
      cases.push_back({dt, 129, 257, 72, 1, ak, bk, false, false, true});
      // Few tiles and a long k (stream-K over every tile), batched and broadcast, and with the epilogue.
      cases.push_back({dt, 300, 520, 4000, 1, ak, bk, false, false, false});
      cases.push_back({dt, 200, 300, 2000, 3, ak, bk, true, false, false});
      cases.push_back({dt, 129, 700, 3000, 1, ak, bk, false, false, true});
      // Three tile-rows, batched and broadcast.
      cases.push_back({dt, 300, 520, 200, 3, ak, bk, false, false, false});
      cases.push_back({dt, 300, 520, 200, 3, ak, bk, true, false, false});
      cases.push_back({dt, 300, 700, 100, 1, ak, bk, false, false, true});
      cases.push_back({dt, 4096, 4096, 4096, 1, ak, bk, false, !quick || (ak && !bk), false});
      if (!quick && ak && !bk) cases.push_back({dt, 8192, 8192, 8192, 1, ak, bk, false, true, false});
      if (!quick && ak && bk) cases.push_back({dt, 8192, 4096, 4096, 1, ak, bk, false, true, false});
      if (ak && bk) cases.push_back({dt, 8192, 4096, 4096, 1, ak, bk, false, true, true});  // linear + bias + relu
    }
  }
  if (profile) cases = {{"bf16", 4096, 4096, 4096, 1, true, false, false, false, false}};
  // Linear 8192 x 4096 -> 4096: forward (x K-major, weight K-major, + bias + relu), grad_input (grad_z K-major,
  // weight N-major), grad_weight (grad_z^T M-major, x N-major), and the forward without the epilogue.
  if (linear) {
    cases = {{"bf16", 8192, 4096, 4096, 1, true, true, false, true, true},
             {"bf16", 8192, 4096, 4096, 1, true, true, false, true, false},
             {"bf16", 8192, 4096, 4096, 1, true, false, false, true, false},
             {"bf16", 4096, 4096, 8192, 1, false, false, false, true, false},
             {"bf16", 4096, 4096, 4096, 1, true, false, false, true, false},
             {"bf16", 2048, 2048, 2048, 1, true, false, false, true, false},
             {"bf16", 1024, 1024, 8192, 1, true, false, false, true, false},
             {"bf16", 512, 512, 512, 1, true, false, false, true, false},
             {"bf16", 4096, 784, 256, 1, true, false, false, true, false},
             {"bf16", 2048, 8192, 2048, 1, true, false, false, true, false},
             // k = 2048 and 8192 beside the forward's 4096: time = fixed cost per tile + k-steps x time per k-step
             {"bf16", 8192, 4096, 2048, 1, true, true, false, true, false},
             {"bf16", 8192, 4096, 8192, 1, true, true, false, true, false}};
  }
  for (const Case& cs : cases) {
    const bool integers = cs.m < 4096 && !cs.bias_relu;  // small integer values: exact in float accumulation
    if (std::strcmp(cs.dtype, "bf16") == 0) run_case<__nv_bfloat16>(h, cs, false);
    if (std::strcmp(cs.dtype, "fp16") == 0) run_case<__half>(h, cs, false);
    if (std::strcmp(cs.dtype, "tf32") == 0) run_case<float>(h, cs, false);
    if (integers && std::strcmp(cs.dtype, "bf16") == 0) run_case<__nv_bfloat16>(h, cs, true);
  }
  cublasDestroy(h);
  return 0;
}
