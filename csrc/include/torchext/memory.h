// torchext's GPU memory pool from C++ (what torchext.memory offers Python): make it PyTorch's CUDA allocator for the
// whole program, and read its statistics. The pool is cuda_ops/pool.h (stream-ordered, coalescing best-fit, or the
// power-of-two baseline); docs/memory.md has what it does and does not support. Everything here but enabled_kind()
// and is_enabled() needs a torchext build with CUDA and throws otherwise. Source: csrc/memory_api.cpp (CPU builds)
// and csrc/memory_cuda.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace torchext::memory {

// The pool's policies: best-fit with splitting and coalescing, and the power-of-two free-list baseline.
inline constexpr const char* kKinds[] = {"best_fit", "pow2"};

// Makes the pool PyTorch's CUDA allocator for the rest of the process: every CUDA tensor, and
// c10::cuda::CUDACachingAllocator's statistics, come from it. Call it first, before anything touches CUDA (PyTorch
// cannot switch allocators once its own was initialised: c10::Error). Calling it again with the same kind does
// nothing; another kind throws. kind: kKinds (else c10::ValueError).
void enable_pool(const std::string& kind = "best_fit");
// The kind enable_pool installed, or "" while PyTorch runs on its own allocator.
std::string enabled_kind();
bool is_enabled();

// The statistics of a device's pool (torchext.memory.stats() in Python; cuda_ops/pool.h's PoolStats). All figures
// cover the device pool and the CUDA graphs' private pools together, except largest_free_block.
struct Stats {
  int64_t allocated_bytes = 0, allocated_bytes_peak = 0;  // blocks handed out (multiples of 512 bytes)
  int64_t requested_bytes = 0, requested_bytes_peak = 0;  // the sizes asked for
  int64_t reserved_bytes = 0, reserved_bytes_peak = 0;    // segments held from the device
  int64_t active_blocks = 0, allocations = 0, cache_hits = 0, segments = 0;
  int64_t device_allocs = 0, device_frees = 0;  // cudaMalloc and cudaFree calls
  int64_t cross_stream_reuses = 0, pending_free_bytes = 0, largest_free_block = 0, free_bytes = 0;
  int64_t oom_retries = 0, ooms = 0, graph_pools = 0, graph_pool_bytes = 0;
  double fragmentation = 0;  // 1 - largest_free_block / free_bytes (0 when nothing is free)
};

// device: a CUDA device index, -1 for the current device. The pool of a device is made on first use (with the kind
// enable_pool installed, else best_fit), whether or not PyTorch runs on it.
Stats stats(int64_t device = -1);
void reset_peak_stats(int64_t device = -1);
// Gives the pool's unused segments back to the driver; returns the bytes released.
int64_t empty_cache(int64_t device = -1);

}  // namespace torchext::memory
