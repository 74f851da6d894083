// The memory pool's torch side (torchext.memory). The pool itself is
// cuda_ops/pool.h (no torch); here live the TorchBind class
// torch.classes.torchext.Pool (csrc/memory.cpp) and, in CUDA builds, the
// process-wide pool of each device and the allocator PyTorch runs on after
// torchext.memory.enable_pool() (csrc/memory_cuda.cpp).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pool.h"

namespace torchext::memory {

// Everything below is defined in memory_cuda.cpp and exists only in CUDA
// builds.

// The process-wide pool of a CUDA device: made on first use with the policy
// chosen by enable_pool ("best_fit" when none was), never destroyed. Throws for
// a device index that does not exist.
Pool &device_pool(int64_t device);
// Makes the pool PyTorch's CUDA allocator for the rest of the process. Throws
// if PyTorch's allocator was already initialised (CUDA was used) or another
// kind was enabled before.
void enable_pool(const std::string &kind);
// "" when PyTorch runs on its own allocator, else the kind passed to
// enable_pool.
std::string enabled_kind();
// A standalone pool (not PyTorch's allocator) on a CUDA device.
std::unique_ptr<Pool> make_cuda_pool(const std::string &kind, int64_t device);
// Nanoseconds per allocate+free pair of a baseline allocator on `device` in a
// C++ loop (see time_alloc_free in memory.cpp): "caching" (PyTorch's CUDA
// caching allocator, through c10), "cuda_malloc_async", "cuda_malloc".
double time_baseline_alloc_free(const std::string &allocator, int64_t device,
                                const std::vector<int64_t> &sizes, int64_t live,
                                int64_t rounds);

} // namespace torchext::memory
