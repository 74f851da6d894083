// The C++ API of the memory pool (csrc/include/torchext/memory.h): the statistics of the device pools, and, in
// CPU-only builds, enable_pool and enabled_kind (CUDA builds define those in memory_cuda.cpp, beside the allocator).
#include <c10/util/Exception.h>
#include <torchext/memory.h>

#include "memory.h"

#ifdef TORCHEXT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace torchext::memory {

namespace {

// The pool of `device` (-1: the current device), or the error of a build without CUDA, naming the function.
Pool& pool_of(const char* function, int64_t device) {
#ifdef TORCHEXT_WITH_CUDA
  return device_pool(device == -1 ? static_cast<int64_t>(c10::cuda::current_device()) : device);
#else
  (void)device;
  TORCH_CHECK(false, "torchext.memory.", function, " needs a torchext build with CUDA; this one has none");
#endif
}

}  // namespace

#ifndef TORCHEXT_WITH_CUDA
void enable_pool(const std::string& kind) {
  check_pool_kind(kind);
  TORCH_CHECK(false, "torchext.memory.enable_pool needs a torchext build with CUDA; this one has none");
}

std::string enabled_kind() { return ""; }
#endif

bool is_enabled() { return !enabled_kind().empty(); }

Stats stats(int64_t device) {
  const PoolStats s = pool_of("stats", device).stats();
  Stats out;
  out.allocated_bytes = s.allocated_bytes;
  out.allocated_bytes_peak = s.allocated_bytes_peak;
  out.requested_bytes = s.requested_bytes;
  out.requested_bytes_peak = s.requested_bytes_peak;
  out.reserved_bytes = s.reserved_bytes;
  out.reserved_bytes_peak = s.reserved_bytes_peak;
  out.active_blocks = s.active_blocks;
  out.allocations = s.allocations;
  out.cache_hits = s.cache_hits;
  out.segments = s.segments;
  out.device_allocs = s.device_allocs;
  out.device_frees = s.device_frees;
  out.cross_stream_reuses = s.cross_stream_reuses;
  out.pending_free_bytes = s.pending_free_bytes;
  out.largest_free_block = s.largest_free_block;
  out.free_bytes = s.free_bytes;
  out.oom_retries = s.oom_retries;
  out.ooms = s.ooms;
  out.graph_pools = s.graph_pools;
  out.graph_pool_bytes = s.graph_pool_bytes;
  out.fragmentation = s.fragmentation();
  return out;
}

void reset_peak_stats(int64_t device) { pool_of("reset_peak_stats", device).reset_peak_stats(); }

int64_t empty_cache(int64_t device) { return static_cast<int64_t>(pool_of("empty_cache", device).empty_cache()); }

}  // namespace torchext::memory
