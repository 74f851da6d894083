// torch.classes.torchext.Pool: a memory pool as a TorchBind object, for torchext.memory, its tests and the benchmark. A
// Pool is either standalone (its own segments, on the host backend or a CUDA device) or a handle on the process-wide
// pool of a CUDA device, the one PyTorch allocates from after enable_pool().
//
// Addresses and streams cross into Python as integers (a cudaStream_t is torch.cuda.Stream.cuda_stream).
#include "memory.h"

#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <stdexcept>

namespace torchext::memory {

namespace {

// Runs `f`, turning the pool's exceptions into the ones torch maps to Python: bad arguments become ValueError.
template <typename F>
auto translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, "torchext.memory: ", e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchext.memory: ", e.what());
  }
}

void* as_ptr(int64_t address) { return reinterpret_cast<void*>(static_cast<uintptr_t>(address)); }
StreamId as_stream(int64_t stream) { return static_cast<StreamId>(stream); }
PoolId as_pool_id(int64_t first, int64_t second) {
  return {static_cast<uint64_t>(first), static_cast<uint64_t>(second)};
}

double time_pool_alloc_free(Pool& pool, StreamId stream, const std::vector<int64_t>& sizes, int64_t live,
                            int64_t rounds) {
  return time_loop(
      sizes, live, rounds,
      [&](size_t n) {
        void* p = pool.allocate(n, stream);
        TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "time_alloc_free: ", pool.last_error());
        return p;
      },
      [&](void* p) { pool.free(p); });
}

}  // namespace

struct PoolObject : torch::CustomClassHolder {
  std::unique_ptr<Pool> owned;  // standalone pools
  Pool* pool = nullptr;         // owned.get(), or a device's process-wide pool
  HostBackend* host = nullptr;  // the backend, when it is the host one

  PoolObject(const std::string& kind, const std::string& backend, int64_t device, int64_t capacity) {
    TORCH_CHECK_VALUE(capacity >= 0, "torchext.memory.Pool: `capacity` must be >= 0 (0: unlimited), got ", capacity);
    if (backend == "host") {
      auto b = std::make_unique<HostBackend>(static_cast<size_t>(capacity));
      host = b.get();
      owned = translate([&] { return make_pool(kind, std::move(b)); });
    } else if (backend == "cuda") {
#ifdef TORCHEXT_WITH_CUDA
      TORCH_CHECK_VALUE(capacity == 0, "torchext.memory.Pool: `capacity` applies to the host backend only");
      owned = translate([&] { return make_cuda_pool(kind, device); });
#else
      TORCH_CHECK(false,
                  "torchext.memory.Pool: backend 'cuda' needs a "
                  "torchext build with CUDA; this one has none");
#endif
    } else {
      TORCH_CHECK_VALUE(false, "torchext.memory.Pool: `backend` must be 'host' or 'cuda', got '", backend, "'");
    }
    pool = owned.get();
  }
  explicit PoolObject(Pool* shared) : pool(shared) {}

  HostBackend& host_backend(const char* what) {
    TORCH_CHECK(host != nullptr, "torchext.memory.Pool.", what, ": only for pools on the host backend");
    return *host;
  }

  int64_t allocate(int64_t size, int64_t stream) {
    TORCH_CHECK_VALUE(size >= 0, "torchext.memory.Pool.allocate: `size` must be >= 0, got ", size);
    void* p = translate([&] { return pool->allocate(static_cast<size_t>(size), as_stream(stream)); });
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr || size == 0, "torchext.memory: ", pool->last_error());
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p));
  }

  void free(int64_t address) {
    translate([&] { pool->free(as_ptr(address)); });
  }

  void record_stream(int64_t address, int64_t stream) {
    translate([&] { pool->record_stream(as_ptr(address), as_stream(stream)); });
  }

  c10::Dict<std::string, double> stats() {
    const PoolStats s = translate([&] { return pool->stats(); });
    c10::Dict<std::string, double> d;
    auto put = [&](const char* k, int64_t v) { d.insert(k, static_cast<double>(v)); };
    put("allocated_bytes", s.allocated_bytes);
    put("allocated_bytes_peak", s.allocated_bytes_peak);
    put("requested_bytes", s.requested_bytes);
    put("requested_bytes_peak", s.requested_bytes_peak);
    put("reserved_bytes", s.reserved_bytes);
    put("reserved_bytes_peak", s.reserved_bytes_peak);
    put("active_blocks", s.active_blocks);
    put("allocations", s.allocations);
    put("cache_hits", s.cache_hits);
    put("segments", s.segments);
    put("device_allocs", s.device_allocs);
    put("device_frees", s.device_frees);
    put("cross_stream_reuses", s.cross_stream_reuses);
    put("pending_free_bytes", s.pending_free_bytes);
    put("largest_free_block", s.largest_free_block);
    put("free_bytes", s.free_bytes);
    put("oom_retries", s.oom_retries);
    put("ooms", s.ooms);
    put("graph_pools", s.graph_pools);
    put("graph_pool_bytes", s.graph_pool_bytes);
    d.insert("fragmentation", s.fragmentation());
    return d;
  }

  // One row of 9 integers per block, segments in address order and blocks in address order within each: segment
  // address, segment size, small segment (0/1), block address, block size, stream, in use (0/1), and the id of the
  // private pool the segment belongs to (0, 0 for the device pool).
  std::vector<int64_t> snapshot() {
    std::vector<int64_t> rows;
    for (const SegmentInfo& seg : translate([&] { return pool->snapshot(); }))
      for (const BlockInfo& b : seg.blocks)
        for (int64_t v :
             {static_cast<int64_t>(seg.address), static_cast<int64_t>(seg.size), static_cast<int64_t>(seg.small),
              static_cast<int64_t>(b.address), static_cast<int64_t>(b.size), static_cast<int64_t>(b.stream),
              static_cast<int64_t>(b.allocated), static_cast<int64_t>(seg.pool.first),
              static_cast<int64_t>(seg.pool.second)})
          rows.push_back(v);
    return rows;
  }

  // Host tests of the CUDA-graph routing: requests on `streams` go to private pool (first, second).
  void begin_allocate_to_pool(int64_t first, int64_t second, std::vector<int64_t> streams) {
    StreamFilter filter = [streams = std::move(streams)](StreamId s) {
      return std::find(streams.begin(), streams.end(), static_cast<int64_t>(s)) != streams.end();
    };
    translate([&] { pool->begin_allocate_to_pool(as_pool_id(first, second), std::move(filter)); });
  }
};

TORCH_LIBRARY_FRAGMENT(torchext, m) {
  m.class_<PoolObject>("Pool")
      .def(torch::init<std::string, std::string, int64_t, int64_t>())
      .def("allocate", &PoolObject::allocate)
      .def("free", &PoolObject::free)
      .def("record_stream", &PoolObject::record_stream)
      .def("stats", &PoolObject::stats)
      .def("snapshot", &PoolObject::snapshot)
      .def("reset_peak_stats", [](const c10::intrusive_ptr<PoolObject>& self) { self->pool->reset_peak_stats(); })
      .def("empty_cache",
           [](const c10::intrusive_ptr<PoolObject>& self) {
             return static_cast<int64_t>(translate([&] { return self->pool->empty_cache(); }));
           })
      .def("block_size", [](const c10::intrusive_ptr<PoolObject>& self,
                            int64_t address) { return static_cast<int64_t>(self->pool->block_size(as_ptr(address))); })
      .def("begin_allocate_to_pool", &PoolObject::begin_allocate_to_pool)
      .def("end_allocate_to_pool",
           [](const c10::intrusive_ptr<PoolObject>& self, int64_t first, int64_t second) {
             translate([&] { self->pool->end_allocate_to_pool(as_pool_id(first, second)); });
           })
      .def("release_pool",
           [](const c10::intrusive_ptr<PoolObject>& self, int64_t first, int64_t second) {
             translate([&] { self->pool->release_pool(as_pool_id(first, second)); });
           })
      .def("create_or_incref_pool",
           [](const c10::intrusive_ptr<PoolObject>& self, int64_t first, int64_t second) {
             translate([&] { self->pool->create_or_incref_pool(as_pool_id(first, second)); });
           })
      .def("pool_use_count",
           [](const c10::intrusive_ptr<PoolObject>& self, int64_t first, int64_t second) {
             return static_cast<int64_t>(
                 translate([&] { return self->pool->pool_use_count(as_pool_id(first, second)); }));
           })
      .def("kind", [](const c10::intrusive_ptr<PoolObject>& self) { return self->pool->kind(); })
      .def("backend", [](const c10::intrusive_ptr<PoolObject>& self) { return self->pool->backend().name(); })
      .def("last_error", [](const c10::intrusive_ptr<PoolObject>& self) { return self->pool->last_error(); })
      .def(
          "time_alloc_free",
          [](const c10::intrusive_ptr<PoolObject>& self, std::vector<int64_t> sizes, int64_t live, int64_t rounds,
             int64_t stream) {
            return translate([&] { return time_pool_alloc_free(*self->pool, as_stream(stream), sizes, live, rounds); });
          })
      // Host backend only: let the simulated device catch up, change its capacity, list cross-stream waits.
      .def("complete_events",
           [](const c10::intrusive_ptr<PoolObject>& self) { self->host_backend("complete_events").complete_events(); })
      .def("set_capacity",
           [](const c10::intrusive_ptr<PoolObject>& self, int64_t capacity) {
             TORCH_CHECK_VALUE(capacity >= 0, "torchext.memory.Pool.set_capacity: `capacity` must be >= 0");
             self->host_backend("set_capacity").set_capacity(static_cast<size_t>(capacity));
           })
      .def("set_capture_underway",
           [](const c10::intrusive_ptr<PoolObject>& self, bool underway) {
             self->host_backend("set_capture_underway").set_capture_underway(underway);
           })
      .def("waits",
           [](const c10::intrusive_ptr<PoolObject>& self) {
             std::vector<int64_t> out;
             for (auto [waiter, on] : self->host_backend("waits").waits()) {
               out.push_back(static_cast<int64_t>(waiter));
               out.push_back(static_cast<int64_t>(on));
             }
             return out;
           })
      .def_static("device_pool",
                  [](int64_t device) {
#ifdef TORCHEXT_WITH_CUDA
                    return c10::make_intrusive<PoolObject>(&device_pool(device));
#else
                    TORCH_CHECK(false, "torchext.memory: device pools need a torchext build with CUDA; "
                                "this one has none");
                    return c10::intrusive_ptr<PoolObject>();
#endif
                  })
      .def_static("enable", [](std::string kind) { enable_pool(kind); })
      .def_static("enabled_kind", []() -> std::string { return enabled_kind(); })
      .def_static("time_baseline_alloc_free",
                  [](std::string allocator, int64_t device, std::vector<int64_t> sizes, int64_t live, int64_t rounds) {
#ifdef TORCHEXT_WITH_CUDA
                    return time_baseline_alloc_free(allocator, device, sizes, live, rounds);
#else
                    TORCH_CHECK(false, "time_baseline_alloc_free needs a torchext build with CUDA; this one has none");
                    return 0.0;
#endif
                  });
}

}  // namespace torchext::memory
