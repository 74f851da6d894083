// Helpers shared by every kernel file: accumulation types, 16-byte vectors, launch sizing, warp/block reductions.
// CUDA only, no ATen: everything here works on raw pointers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "acc_type.h"  // AccType, acc_t

namespace torchext::cuda_ops {

template <typename T>
__device__ __forceinline__ acc_t<T> to_acc(T v) {
  return static_cast<acc_t<T>>(v);
}
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v) {
  return static_cast<T>(v);
}

// N elements loaded or stored as one aligned access; 16 / sizeof(T) elements make the 16-byte form.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
template <typename T>
constexpr int kVec16 = 16 / sizeof(T);

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Multiprocessor count of the current device, cached per device.
int sm_count();

// Compute capability of the current device as 10 * major + minor (90 for H100/H200), cached per device; 0 if the
// query fails.
int compute_capability();

// The most shared memory one block of the current device can opt in to, in bytes, cached per device; 0 if the query
// fails.
int smem_optin();

// Blocks for a grid-stride loop over `work` items at `threads` per block: enough to fill every multiprocessor a
// few times over, never more than the work needs.
inline unsigned grid_for(int64_t work, int threads, int blocks_per_sm = 8) {
  int64_t need = (work + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(sm_count()) * blocks_per_sm;
  int64_t g = need < cap ? need : cap;
  return static_cast<unsigned>(g > 0 ? g : 1);
}

// Blocks for a grid-stride kernel: as many as can be resident at once (occupancy from the kernel's registers and
// shared memory), never more than the work needs. More would leave a partial second wave running alone at the
// end of the loop; fewer would leave multiprocessors idle. Cached per kernel and block size (the first device's
// answer; the kernels run with one block size each).
template <auto Kernel>
unsigned resident_grid(int threads, int64_t work, int64_t work_per_block, size_t smem = 0) {
  static const int per_sm = [&] {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, smem) == cudaSuccess && n > 0 ? n : 1;
  }();
  const int64_t need = (work + work_per_block - 1) / work_per_block;
  const int64_t cap = static_cast<int64_t>(sm_count()) * per_sm;
  const int64_t g = need < cap ? need : cap;
  return static_cast<unsigned>(g > 0 ? g : 1);
}

// Lets Kernel launch with `smem_bytes` of dynamic shared memory (past the 48 KiB default) and asks for the
// largest shared-memory carveout. Function attributes belong to each device's context: they are set once per
// device (the first 64 devices; beyond those, on every call).
template <auto Kernel>
cudaError_t prepare_kernel(int smem_bytes) {
  static std::atomic<uint64_t> ready{0};  // bit d: attributes set on device d
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (ready.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  if (err == cudaSuccess && bit != 0) ready.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// exp for reductions where a couple of ulps don't matter (softmax sums): the hardware ex2 for float.
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }

template <typename A>
__device__ __forceinline__ A warp_sum(A v, int width = 32) {
#pragma unroll
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, width);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v, int width = 32) {
#pragma unroll
  for (int o = width / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o, width));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values; safe to call repeatedly.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : A(0);
  return warp_sum(v);
}

template <typename A>
__device__ __forceinline__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace torchext::cuda_ops
