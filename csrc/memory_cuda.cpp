// The process-wide pool of each CUDA device, and the allocator PyTorch runs on after torchext.memory.enable_pool().
//
// The allocator is torch's CUDAPluggableAllocator (the C++ class behind torch.cuda.memory.CUDAPluggableAllocator) with
// our allocate and free, plus what the Python class cannot set and a real training loop needs:
//   record_stream  Tensor.record_stream reaches the pool, which keeps the block until those streams are done;
//   empty_cache    torch.cuda.empty_cache() gives the pools' free segments back;
//   stats          torch.cuda.memory_allocated(), memory_reserved(), max_memory_*() and memory_stats() read the
//                  pool, and reset_peak_memory_stats() resets its peaks (the base class raises for these);
//   cacheInfo      the largest free block, which cuDNN asks for when cudnn.benchmark sizes its workspaces (the base
//                  class raises there, so benchmark mode would fail);
//   CUDA graphs    beginAllocateToPool, endAllocateToPool, releasePool, createOrIncrefPool and getPoolUseCount reach
//                  the device's pool, which serves each graph from a private pool of its own (cuda_ops/pool.h), so
//                  torch.cuda.graph, make_graphed_callables and torch.cuda.MemPool work on it.
// Out of memory raises torch.OutOfMemoryError with the pool's statistics in the message.
//
// The extern "C" functions at the end are the same pools for torch.cuda.memory.CUDAPluggableAllocator, which is how
// torchext.memory.pool_scope() feeds a torch.cuda.MemPool.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <sys/types.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>

#include "memory.h"

namespace torchext::memory {

namespace {

constexpr int kMaxDevices = 64;

std::mutex g_mutex;
std::array<std::atomic<Pool*>, kMaxDevices> g_pools{};
std::string g_enabled_kind;  // "" until enable_pool

int device_index(int64_t device) {
  const int64_t count = c10::cuda::device_count();
  TORCH_CHECK_VALUE(device >= 0 && device < count && device < kMaxDevices, "torchext.memory: CUDA device ", device,
                    " does not exist (", count, " visible)");
  return static_cast<int>(device);
}

void* allocate_or_throw(size_t size, int device, cudaStream_t stream) {
  Pool& pool = device_pool(device);
  void* p = pool.allocate(size, reinterpret_cast<StreamId>(stream));
  TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr || size == 0, "CUDA ", pool.last_error());
  return p;
}

void free_block(void* ptr, size_t, int device, cudaStream_t) { device_pool(device).free(ptr); }

// record_stream gets no device: the block's pool is the one that knows the pointer.
void record_block_stream(void* ptr, cudaStream_t stream) {
  for (int d = 0; d < kMaxDevices; ++d) {
    Pool* pool = g_pools[d].load(std::memory_order_acquire);
    if (pool != nullptr && pool->block_size(ptr) != 0) {
      pool->record_stream(ptr, reinterpret_cast<StreamId>(stream));
      return;
    }
  }
  TORCH_CHECK(false, "torchext.memory: record_stream on a pointer no torchext pool allocated");
}

void empty_all_caches() {
  for (auto& slot : g_pools) {
    Pool* pool = slot.load(std::memory_order_acquire);
    if (pool != nullptr) pool->empty_cache();
  }
}

PoolId pool_id(c10::cuda::MempoolId_t id) {
  return {static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}

// The pool's std::invalid_argument (a bad pool id) as the ValueError torch maps it to; c10::Error passes through.
template <typename F>
void translate_errors(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "torchext.memory: ", e.what());
  }
}

using PluggableAllocator = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
using DeviceStats = c10::cuda::CUDACachingAllocator::DeviceStats;

class PoolAllocator final : public PluggableAllocator {
 public:
  PoolAllocator() : PluggableAllocator(allocate_or_throw, free_block) {
    set_record_stream_fn(record_block_stream);
    set_reset_fn(empty_all_caches);
  }

  // torch.cuda.graph: capture_begin calls beginAllocateToPool before cudaStreamBeginCapture, capture_end
  // endAllocateToPool, and the graph's destruction releasePool. The filter asks CUDA whether a stream is capturing
  // into this graph.
  void beginAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    translate_errors([&] {
      device_pool(device).begin_allocate_to_pool(
          pool_id(id), [filter = std::move(filter)](StreamId s) { return filter(reinterpret_cast<cudaStream_t>(s)); });
    });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    translate_errors([&] { device_pool(device).end_allocate_to_pool(pool_id(id)); });
  }
  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    translate_errors([&] { device_pool(device).release_pool(pool_id(id)); });
  }
  // torch.cuda.MemPool() with no allocator of its own: a private pool of this allocator.
  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                          std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "torchext.memory: a torch.cuda.MemPool with an allocator of its own cannot be used while torchext's "
                "pool is PyTorch's allocator");
    translate_errors([&] { device_pool(device).create_or_incref_pool(pool_id(id)); });
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    return device_pool(device).pool_use_count(pool_id(id));
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const PoolStats s = device_pool(device).stats();
    DeviceStats d;
    auto set = [](auto& stat, int64_t current, int64_t peak) {
      stat[0].current = current;  // [0]: the aggregate over small and large blocks
      stat[0].peak = peak;
    };
    set(d.allocated_bytes, s.allocated_bytes, s.allocated_bytes_peak);
    set(d.requested_bytes, s.requested_bytes, s.requested_bytes_peak);
    set(d.reserved_bytes, s.reserved_bytes, s.reserved_bytes_peak);
    // Active: handed out, or freed and waiting on other streams. The pool keeps no separate peak for it.
    set(d.active_bytes, s.allocated_bytes + s.pending_free_bytes, s.allocated_bytes_peak);
    set(d.allocation, s.active_blocks, s.active_blocks);
    set(d.segment, s.segments, s.segments);
    d.num_alloc_retries = s.oom_retries;
    d.num_ooms = s.ooms;
    d.num_device_alloc = s.device_allocs;
    d.num_device_free = s.device_frees;
    return d;
  }

  void resetPeakStats(c10::DeviceIndex device) override { device_pool(device).reset_peak_stats(); }
  void resetAccumulatedStats(c10::DeviceIndex) override {}

  // As PyTorch's caching allocator answers: when asked with *largest == 0, start from the device's free memory (what a
  // new segment could get), then take the largest cached block if that is bigger.
  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    Pool& pool = device_pool(device);
    if (*largest == 0) {
      c10::cuda::CUDAGuard guard(device);
      size_t free_bytes = 0, total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      *largest = free_bytes;
    }
    *largest = std::max(*largest, static_cast<size_t>(pool.stats().largest_free_block));
  }
};

}  // namespace

Pool& device_pool(int64_t device) {
  const int d = device_index(device);
  Pool* pool = g_pools[d].load(std::memory_order_acquire);
  if (pool != nullptr) return *pool;
  std::lock_guard<std::mutex> lock(g_mutex);
  pool = g_pools[d].load(std::memory_order_relaxed);
  if (pool == nullptr) {
    // Never destroyed: PyTorch may free tensors during interpreter shutdown, after static destructors would run.
    pool = make_pool(g_enabled_kind.empty() ? "best_fit" : g_enabled_kind, make_cuda_backend(d)).release();
    g_pools[d].store(pool, std::memory_order_release);
  }
  return *pool;
}

void enable_pool(const std::string& kind) {
  check_pool_kind(kind);
  TORCH_CHECK(c10::cuda::device_count() > 0, "torchext.memory.enable_pool needs a CUDA device; none is available");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_enabled_kind.empty()) {
    TORCH_CHECK(kind == g_enabled_kind, "torchext.memory.enable_pool: the '", g_enabled_kind,
                "' pool is already PyTorch's allocator in this process; it "
                "cannot change to '",
                kind, "'");
    return;
  }
  for (auto& slot : g_pools) {
    Pool* pool = slot.load();
    TORCH_CHECK(pool == nullptr || pool->kind() == kind,
                "torchext.memory.enable_pool: the device pools were already "
                "made as '",
                pool == nullptr ? "" : pool->kind(), "' (by pool_scope or Pool.device_pool)");
  }
  TORCH_CHECK(!c10::cuda::CUDACachingAllocator::allocator.load()->initialized(),
              "torchext.memory.enable_pool: PyTorch's CUDA allocator is "
              "already initialised in this process (CUDA "
              "was used before), so it can no longer be replaced. Call "
              "enable_pool() before anything touches CUDA.");
  g_enabled_kind = kind;
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(std::make_shared<PoolAllocator>());
}

std::string enabled_kind() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_enabled_kind;
}

std::unique_ptr<Pool> make_cuda_pool(const std::string& kind, int64_t device) {
  return make_pool(kind, make_cuda_backend(device_index(device)));
}

double time_baseline_alloc_free(const std::string& allocator, int64_t device, const std::vector<int64_t>& sizes,
                                int64_t live, int64_t rounds) {
  const int d = device_index(device);
  c10::cuda::CUDAGuard guard(d);
  cudaStream_t stream = nullptr;  // the legacy default stream, as the pool's timing uses by default
  auto timed = [&](auto&& alloc, auto&& free_fn) { return time_loop(sizes, live, rounds, alloc, free_fn); };
  if (allocator == "caching") {
    TORCH_CHECK(enabled_kind().empty(),
                "time_baseline_alloc_free('caching'): "
                "PyTorch's allocator was replaced by "
                "torchext's pool in this process");
    return timed([&](size_t n) { return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(n, stream); },
                 [](void* p) { c10::cuda::CUDACachingAllocator::raw_delete(p); });
  }
  if (allocator == "cuda_malloc_async") {
    // Keep freed memory in the stream-ordered pool (as PyTorch's cudaMallocAsync backend does) instead of returning it
    // at every synchronisation.
    cudaMemPool_t mempool;
    C10_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&mempool, d));
    uint64_t threshold = UINT64_MAX;
    C10_CUDA_CHECK(cudaMemPoolSetAttribute(mempool, cudaMemPoolAttrReleaseThreshold, &threshold));
    const double ns = timed(
        [&](size_t n) {
          void* p = nullptr;
          C10_CUDA_CHECK(cudaMallocAsync(&p, n, stream));
          return p;
        },
        [&](void* p) { C10_CUDA_CHECK(cudaFreeAsync(p, stream)); });
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    C10_CUDA_CHECK(cudaMemPoolTrimTo(mempool, 0));
    return ns;
  }
  if (allocator == "cuda_malloc") {
    return timed(
        [](size_t n) {
          void* p = nullptr;
          C10_CUDA_CHECK(cudaMalloc(&p, n));
          return p;
        },
        [](void* p) { C10_CUDA_CHECK(cudaFree(p)); });
  }
  TORCH_CHECK_VALUE(false,
                    "time_baseline_alloc_free: `allocator` must be 'caching', "
                    "'cuda_malloc_async' or "
                    "'cuda_malloc', got '",
                    allocator, "'");
  return 0.0;
}

}  // namespace torchext::memory

// For torch.cuda.memory.CUDAPluggableAllocator(torchext._C.__file__, "torchext_pool_alloc", "torchext_pool_free"). C
// functions may not throw: out of memory returns nullptr (what torch.cuda.MemPool expects of an allocator), and an
// error in free is printed.
extern "C" {
void* torchext_pool_alloc(ssize_t size, int device, cudaStream_t stream) {
  try {
    return torchext::memory::device_pool(device).allocate(static_cast<size_t>(size),
                                                          reinterpret_cast<torchext::memory::StreamId>(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchext_pool_alloc: %s\n", e.what());
    return nullptr;
  }
}

void torchext_pool_free(void* ptr, ssize_t, int device, cudaStream_t) {
  try {
    torchext::memory::device_pool(device).free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torchext_pool_free: %s\n", e.what());
  }
}
}
