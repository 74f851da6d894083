// The memory pool's torch side (torchext.memory). The pool itself is cuda_ops/pool.h (no torch); here live the
// TorchBind class torch.classes.torchext.Pool (csrc/memory.cpp) and, in CUDA builds, the process-wide pool of each
// device and the allocator PyTorch runs on after torchext.memory.enable_pool() (csrc/memory_cuda.cpp).
#pragma once

#include <c10/util/Exception.h>
#include <torchext/memory.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "pool.h"

namespace torchext::memory {

// Nanoseconds per allocate+free pair, in a loop that cycles through `sizes` keeping the last `live` allocations alive
// (first in, first out), run `rounds` times after one untimed warm-up round.
template <typename Alloc, typename Free>
double time_loop(const std::vector<int64_t>& sizes, int64_t live, int64_t rounds, Alloc&& alloc, Free&& free_fn) {
  TORCH_CHECK_VALUE(!sizes.empty(), "time_alloc_free: `sizes` must not be empty");
  TORCH_CHECK_VALUE(live >= 0 && rounds >= 1, "time_alloc_free: `live` must be >= 0 and `rounds` >= 1");
  std::deque<void*> ring;
  // Whatever is still held goes back, also when an allocation fails midway.
  struct FreeRing {
    std::deque<void*>& ring;
    Free& free_fn;
    ~FreeRing() {
      for (void* p : ring) free_fn(p);
    }
  } free_ring{ring, free_fn};
  auto run = [&](int64_t n) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t s : sizes) {
        ring.push_back(alloc(static_cast<size_t>(s)));
        if (static_cast<int64_t>(ring.size()) > live) {
          free_fn(ring.front());
          ring.pop_front();
        }
      }
  };
  run(1);
  const auto t0 = std::chrono::steady_clock::now();
  run(rounds);
  const auto t1 = std::chrono::steady_clock::now();
  const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
  return ns / static_cast<double>(rounds * static_cast<int64_t>(sizes.size()));
}

// enable_pool's check of its argument, made first in every build.
inline void check_pool_kind(const std::string& kind) {
  TORCH_CHECK_VALUE(kind == "best_fit" || kind == "pow2",
                    "torchext.memory.enable_pool: `kind` must be 'best_fit' or 'pow2', got '", kind, "'");
}

// enable_pool and enabled_kind are the public API's (csrc/include/torchext/memory.h): defined in memory_cuda.cpp, and
// in memory_api.cpp for CPU-only builds. Everything below is defined in memory_cuda.cpp and exists only in CUDA builds.

// The process-wide pool of a CUDA device: made on first use with the policy chosen by enable_pool ("best_fit" when none
// was), never destroyed. Throws for a device index that does not exist.
Pool& device_pool(int64_t device);
// A standalone pool (not PyTorch's allocator) on a CUDA device.
std::unique_ptr<Pool> make_cuda_pool(const std::string& kind, int64_t device);
// Nanoseconds per allocate+free pair of a baseline allocator on `device` in a C++ loop (see time_alloc_free in
// memory.cpp): "caching" (PyTorch's CUDA caching allocator, through c10), "cuda_malloc_async", "cuda_malloc".
double time_baseline_alloc_free(const std::string& allocator, int64_t device, const std::vector<int64_t>& sizes,
                                int64_t live, int64_t rounds);

}  // namespace torchext::memory
