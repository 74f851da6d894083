// Launch schemes for the elementwise activation kernels, timed against a device-to-device copy in one process
// (no torch). Each variant computes relu forward (1 read + 1 write) and relu backward (2 reads + 1 write) over 2^28
// elements; the result is checked against a host reference on a sample of positions.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I cuda_ops benchmarks/elementwise_check.cu \
//        cuda_ops/common.cu -o /tmp/elementwise_check && /tmp/elementwise_check
//
// Variants:
//   gridstride  a resident grid (occupancy x SMs) walking the array, kIlp 16-byte vectors in flight per thread
//   chunk       one block per chunk of threads x ilp vectors, no loop (what ATen's vectorized kernel does)
//   *_cs        the same with streaming cache hints (ld.global.cs / st.global.cs: evict-first)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.cuh"
#include "cuda_check.h"

using namespace torchext::cuda_ops;

template <typename V, bool CS>
__device__ __forceinline__ V load(const V* p) {
  if constexpr (CS) {
    return __ldcs(p);
  } else {
    return *p;
  }
}
template <typename V, bool CS>
__device__ __forceinline__ void store(V* p, const V& v) {
  if constexpr (CS) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

struct Relu {
  __device__ float operator()(float x) const { return x < 0.f ? 0.f : x; }
  __device__ float operator()(float g, float y) const { return y <= 0.f ? 0.f : g; }
};

// float4 / uint4 have __ldcs overloads; use them as the 16-byte carrier and reinterpret.
template <typename T>
struct Carrier;
template <>
struct Carrier<float> {
  using type = float4;
};
template <>
struct Carrier<__nv_bfloat16> {
  using type = uint4;
};

// One pass of both schemes: ILP vectors first, first + step, ... (those below nvec) loaded, then op applied and
// stored.
template <typename T, int ILP, bool CS, bool BINARY>
__device__ __forceinline__ void ilp_pass(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ z,
                                         int64_t nvec, int64_t first, int64_t step) {
  using C = typename Carrier<T>::type;
  constexpr int VEC = 16 / sizeof(T);
  Relu op;
  C va[ILP], vb[ILP];
#pragma unroll
  for (int j = 0; j < ILP; ++j) {
    const int64_t i = first + j * step;
    if (i < nvec) {
      va[j] = load<C, CS>(reinterpret_cast<const C*>(a) + i);
      if constexpr (BINARY) vb[j] = load<C, CS>(reinterpret_cast<const C*>(b) + i);
    }
  }
#pragma unroll
  for (int j = 0; j < ILP; ++j) {
    const int64_t i = first + j * step;
    if (i < nvec) {
      C out;
      const T* pa = reinterpret_cast<const T*>(&va[j]);
      const T* pb = reinterpret_cast<const T*>(&vb[j]);
      T* po = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        po[k] = static_cast<T>(BINARY ? op(static_cast<float>(pa[k]), static_cast<float>(pb[k]))
                                      : op(static_cast<float>(pa[k])));
      }
      store<C, CS>(reinterpret_cast<C*>(z) + i, out);
    }
  }
}

// A resident grid walking the array: thread tid handles vectors tid, tid + stride, ... ILP at a time.
template <typename T, int THREADS, int ILP, bool CS, bool BINARY>
__global__ void __launch_bounds__(THREADS)
    gridstride_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ z, int64_t n) {
  const int64_t nvec = n / (16 / sizeof(T));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * THREADS;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;
  for (int64_t base = tid; base < nvec; base += stride * ILP) ilp_pass<T, ILP, CS, BINARY>(a, b, z, nvec, base, stride);
}

// One block per THREADS * ILP vectors; thread t of the block handles vectors t, t + THREADS, ... (coalesced).
template <typename T, int THREADS, int ILP, bool CS, bool BINARY>
__global__ void __launch_bounds__(THREADS)
    chunk_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ z, int64_t n) {
  const int64_t nvec = n / (16 / sizeof(T));
  const int64_t base = static_cast<int64_t>(blockIdx.x) * THREADS * ILP + threadIdx.x;
  ilp_pass<T, ILP, CS, BINARY>(a, b, z, nvec, base, THREADS);
}

struct Variant {
  const char* name;
  void (*launch)(const void*, const void*, void*, int64_t, cudaStream_t);
};

template <typename T, int THREADS, int ILP, bool CS, bool BINARY>
void launch_gridstride(const void* a, const void* b, void* z, int64_t n, cudaStream_t s) {
  auto k = gridstride_kernel<T, THREADS, ILP, CS, BINARY>;
  const unsigned grid = resident_grid<gridstride_kernel<T, THREADS, ILP, CS, BINARY>>(
      THREADS, n, static_cast<int64_t>(THREADS) * ILP * (16 / sizeof(T)));
  k<<<grid, THREADS, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(z), n);
}

template <typename T, int THREADS, int ILP, bool CS, bool BINARY>
void launch_chunk(const void* a, const void* b, void* z, int64_t n, cudaStream_t s) {
  const int64_t nvec = n / (16 / sizeof(T));
  const int64_t per_block = static_cast<int64_t>(THREADS) * ILP;
  const unsigned grid = static_cast<unsigned>((nvec + per_block - 1) / per_block);
  chunk_kernel<T, THREADS, ILP, CS, BINARY>
      <<<grid, THREADS, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(z), n);
}

template <typename T, bool BINARY>
std::vector<Variant> variants() {
  return {
      {"gridstride_256x4", launch_gridstride<T, 256, 4, false, BINARY>},
      {"gridstride_256x4_cs", launch_gridstride<T, 256, 4, true, BINARY>},
      {"gridstride_512x2", launch_gridstride<T, 512, 2, false, BINARY>},
      {"chunk_128x1", launch_chunk<T, 128, 1, false, BINARY>},
      {"chunk_128x2", launch_chunk<T, 128, 2, false, BINARY>},
      {"chunk_128x4", launch_chunk<T, 128, 4, false, BINARY>},
      {"chunk_256x2", launch_chunk<T, 256, 2, false, BINARY>},
      {"chunk_256x4", launch_chunk<T, 256, 4, false, BINARY>},
      {"chunk_128x4_cs", launch_chunk<T, 128, 4, true, BINARY>},
      {"chunk_256x2_cs", launch_chunk<T, 256, 2, true, BINARY>},
      {"chunk_512x1", launch_chunk<T, 512, 1, false, BINARY>},
  };
}

__global__ void fill(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = (h & 0xffffff) / float(0x800000) - 1.0f;  // [-1, 1)
  }
}
__global__ void to_bf16(const float* in, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}

template <typename T>
void run(const char* dtype, int64_t n, int reps) {
  const size_t bytes = n * sizeof(T);
  float* tmp;
  T *a, *b, *z;
  char* flush;
  const size_t flush_bytes = 256 << 20;
  CK(cudaMalloc(&tmp, n * sizeof(float)));
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMalloc(&z, bytes));
  CK(cudaMalloc(&flush, flush_bytes));
  fill<<<1024, 256>>>(tmp, n, 1);
  if constexpr (sizeof(T) == 4) {
    CK(cudaMemcpy(a, tmp, bytes, cudaMemcpyDeviceToDevice));
  } else {
    to_bf16<<<1024, 256>>>(tmp, reinterpret_cast<__nv_bfloat16*>(a), n);
  }
  fill<<<1024, 256>>>(tmp, n, 2);
  if constexpr (sizeof(T) == 4) {
    CK(cudaMemcpy(b, tmp, bytes, cudaMemcpyDeviceToDevice));
  } else {
    to_bf16<<<1024, 256>>>(tmp, reinterpret_cast<__nv_bfloat16*>(b), n);
  }
  CK(cudaDeviceSynchronize());
  std::vector<T> ha(1 << 16), hb(1 << 16), hz(1 << 16);
  CK(cudaMemcpy(ha.data(), a + (n - (1 << 16)), ha.size() * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), b + (n - (1 << 16)), hb.size() * sizeof(T), cudaMemcpyDeviceToHost));

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time = [&](auto fn) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 3; ++r) {
      CK(cudaMemsetAsync(flush, r, flush_bytes));
      CK(cudaEventRecord(e0));
      fn();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const float copy_ms = time([&] { CK(cudaMemcpyAsync(z, a, bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * bytes / copy_ms / 1e6;
  std::printf("%s n=%lld copy %.1f us %.0f GB/s\n", dtype, (long long)n, copy_ms * 1e3, copy_gbs);
  for (int binary = 0; binary < 2; ++binary) {
    auto vs = binary ? variants<T, true>() : variants<T, false>();
    for (auto& v : vs) {
      // interleave with copy: time each variant twice, report the median of both runs' medians
      CK(cudaMemset(z, 0xff, bytes));
      v.launch(a, b, z, n, 0);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hz.data(), z + (n - (1 << 16)), hz.size() * sizeof(T), cudaMemcpyDeviceToHost));
      int bad = 0;
      for (size_t i = 0; i < hz.size(); ++i) {
        const float x = static_cast<float>(ha[i]), g = static_cast<float>(hb[i]);
        const float want = binary ? (g <= 0.f ? 0.f : x) : (x < 0.f ? 0.f : x);
        if (static_cast<float>(hz[i]) != want) ++bad;
      }
      const float ms = time([&] { v.launch(a, b, z, n, 0); });
      const double moved = (binary ? 3.0 : 2.0) * bytes;
      std::printf("%-6s %-4s %-22s %8.1f us %6.0f GB/s %5.1f%% of copy%s\n", dtype, binary ? "bwd" : "fwd", v.name,
                  ms * 1e3, moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs, bad ? "  WRONG" : "");
    }
  }
  CK(cudaFree(tmp));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(z));
  CK(cudaFree(flush));
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 28);
  run<float>("fp32", n, 30);
  run<__nv_bfloat16>("bf16", n, 30);
  return 0;
}
