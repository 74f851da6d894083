// Stress test of the memory pool, without torch: cuda_ops/pool.{h,cpp}, and cuda_ops/pool_cuda.cu on the GPU. One
// source, two builds:
//   GPU   nvcc: the CUDA backend on device 0, streams are cudaStream_t. tests/test_memory_gpu.py::test_stress (also
//         under compute-sanitizer).
//           nvcc -std=c++17 -O2 -I cuda_ops tests/pool_stress.cu cuda_ops/pool.cpp cuda_ops/pool_cuda.cu -o pool_stress
//   host  any C++17 compiler, compiling this file as C++ (no CUDA needed): the host backend, streams are integer ids.
//         tests/test_pool_tsan.py builds it with -fsanitize=thread.
//           g++ -std=c++17 -O1 -g -fsanitize=thread -pthread -I cuda_ops cuda_ops/pool.cpp -x c++ tests/pool_stress.cu
//
//   ./pool_stress [kind=best_fit] [threads=4] [streams=4] [allocations per thread=1000000] [max bytes=268435456]
//                 [other calls per 1000 operations: 100 on the host, 0 on the GPU]
//
// Each thread allocates and frees at random (sizes log-uniform from 1 byte to max bytes) on streams picked at random
// from a shared set, keeping up to 16 blocks alive. Every block gets a tag (its first and last bytes, up to 512 each,
// set on its stream); blocks are read back before being freed (a sample of them on the GPU, all on the host) and the
// tag checked, so a block handed out twice, or reused before its stream's work finished, shows as a wrong tag. All live
// ranges are also kept in one host-side interval map and checked for overlap at every allocation.
//
// Between allocations, the threads call every other public method of the pool at the given rate: record_stream,
// block_size, stats (whose figures must add up), snapshot (whose blocks must tile their segments), empty_cache,
// reset_peak_stats, last_error, kind, CUDA-graph routing (a thread's call begins routing one stream to a new private
// pool, its next ends it and releases the pool, so that every thread's requests on that stream go to the private pool
// meanwhile and the pool goes back to the device when its last block is freed), and on the host backend
// complete_events, waits and set_capacity (switching between unlimited and a capacity small enough to run out of
// memory now and then). The routing has no real capture behind it, so it runs on the GPU too.
//
// At the end every block is freed, the cache emptied, and reserved bytes must be zero. Prints one JSON line (with the
// number of calls of each method); exits 1 on any failure.
#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool.h"

using namespace torchext::memory;

namespace {

#ifdef __CUDACC__
constexpr bool kHost = false;
using Stream = cudaStream_t;
#else
constexpr bool kHost = true;
using Stream = StreamId;
#endif

std::atomic<long> g_failures{0};
std::mutex g_ranges_mutex;
std::map<uintptr_t, size_t> g_ranges;  // live [address, address + size)

void fail(const std::string& what) {
  if (g_failures.fetch_add(1) < 10) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

void add_range(uintptr_t a, size_t n) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  auto next = g_ranges.lower_bound(a);
  if (next != g_ranges.end() && next->first < a + n) fail("overlap with the following live block");
  if (next != g_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > a) fail("overlap with the preceding live block");
  }
  g_ranges[a] = n;
}

void remove_range(uintptr_t a) {
  std::lock_guard<std::mutex> lock(g_ranges_mutex);
  g_ranges.erase(a);
}

struct Live {
  char* ptr;
  size_t size;
  unsigned char tag;
  Stream stream;
};

size_t tag_bytes(size_t size) { return size < 512 ? size : 512; }

// The device: tags written and read on a block's stream, the streams themselves. `host` is 1024 bytes of staging.
#ifdef __CUDACC__
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(2);
  }
}

void tag_block(const Live& b) {
  const size_t n = tag_bytes(b.size);
  check_cuda(cudaMemsetAsync(b.ptr, b.tag, n, b.stream), "cudaMemsetAsync");
  if (b.size > n) check_cuda(cudaMemsetAsync(b.ptr + b.size - n, b.tag, n, b.stream), "cudaMemsetAsync");
}

void read_tags(const Live& b, unsigned char* host) {
  const size_t n = tag_bytes(b.size);
  check_cuda(cudaMemcpyAsync(host, b.ptr, n, cudaMemcpyDeviceToHost, b.stream), "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(host + 512, b.ptr + b.size - n, n, cudaMemcpyDeviceToHost, b.stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
}

std::vector<Stream> make_streams(int n) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  std::vector<Stream> streams(n);
  for (auto& s : streams) check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return streams;
}
void destroy_streams(const std::vector<Stream>& streams) {
  for (Stream s : streams) cudaStreamDestroy(s);
}
void start_thread() { check_cuda(cudaSetDevice(0), "cudaSetDevice"); }
void synchronize_device() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
unsigned char* staging() {
  unsigned char* host = nullptr;
  check_cuda(cudaMallocHost(&host, 1024), "cudaMallocHost");
  return host;
}
void free_staging(unsigned char* host) { check_cuda(cudaFreeHost(host), "cudaFreeHost"); }
#else
void tag_block(const Live& b) {
  const size_t n = tag_bytes(b.size);
  std::memset(b.ptr, b.tag, n);
  std::memset(b.ptr + b.size - n, b.tag, n);
}

void read_tags(const Live& b, unsigned char* host) {
  const size_t n = tag_bytes(b.size);
  std::memcpy(host, b.ptr, n);
  std::memcpy(host + 512, b.ptr + b.size - n, n);
}

std::vector<Stream> make_streams(int n) {
  std::vector<Stream> streams(n);
  for (int i = 0; i < n; ++i) streams[i] = static_cast<Stream>(i + 1);
  return streams;
}
void destroy_streams(const std::vector<Stream>&) {}
void start_thread() {}
void synchronize_device() {}
unsigned char* staging() { return new unsigned char[1024]; }
void free_staging(unsigned char* host) { delete[] host; }
#endif

void verify_block(const Live& b, unsigned char* host) {
  read_tags(b, host);
  const size_t n = tag_bytes(b.size);
  for (size_t i = 0; i < n; ++i)
    if (host[i] != b.tag || host[512 + i] != b.tag) {
      fail("tag of a live block was overwritten (size " + std::to_string(b.size) + ")");
      return;
    }
}

// Every public method other than allocate and free, by name; the host backend's own three come last.
enum Method {
  kRecordStream,
  kBlockSize,
  kStats,
  kSnapshot,
  kEmptyCache,
  kResetPeakStats,
  kLastError,
  kKind,
  kGraphPool,
  kCompleteEvents,
  kWaits,
  kSetCapacity,
  kMethods
};
const char* const kMethodNames[kMethods] = {"record_stream", "block_size",       "stats",      "snapshot",
                                            "empty_cache",   "reset_peak_stats", "last_error", "kind",
                                            "graph_pool",    "complete_events",  "waits",      "set_capacity"};
constexpr int kCommonMethods = kCompleteEvents;  // the ones every backend has
std::array<std::atomic<long>, kMethods> g_calls{};

// Reserved memory is exactly what is handed out, waiting on other streams, or free in the pool.
void check_stats(const PoolStats& s) {
  if (s.allocated_bytes < 0 || s.active_blocks < 0 || s.free_bytes < 0 || s.pending_free_bytes < 0 ||
      s.allocated_bytes + s.pending_free_bytes + s.free_bytes != s.reserved_bytes ||
      s.largest_free_block > s.free_bytes)
    fail("stats do not add up: " + describe(s));
}

// Every segment is tiled by its blocks, in address order.
void check_snapshot(const std::vector<SegmentInfo>& segments) {
  for (const SegmentInfo& seg : segments) {
    uintptr_t at = seg.address;
    for (const BlockInfo& b : seg.blocks) {
      if (b.address != at) fail("snapshot: blocks do not tile their segment");
      at += b.size;
    }
    if (at != seg.address + seg.size) fail("snapshot: blocks do not cover their segment");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "best_fit";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 4;
  const int nstreams = argc > 3 ? std::atoi(argv[3]) : 4;
  const long per_thread = argc > 4 ? std::atol(argv[4]) : 1000000;
  const double max_bytes = argc > 5 ? std::atof(argv[5]) : 268435456.0;
  const int other_rate = argc > 6 ? std::atoi(argv[6]) : (kHost ? 100 : 0);

  const std::vector<Stream> streams = make_streams(nstreams);
#ifdef __CUDACC__
  HostBackend* host_backend = nullptr;
  std::unique_ptr<Pool> pool = make_pool(kind, make_cuda_backend(0));
#else
  auto backend = std::make_unique<HostBackend>();
  HostBackend* host_backend = backend.get();
  std::unique_ptr<Pool> pool = make_pool(kind, std::move(backend));
#endif
  // Small enough that 4 threads with 16 blocks of up to max bytes each run out now and then.
  const size_t small_capacity = static_cast<size_t>(max_bytes) * 2;
  const int methods = host_backend != nullptr ? kMethods : kCommonMethods;

  std::atomic<long> verified{0}, ooms{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      start_thread();
      std::mt19937_64 rng(1234 + t);
      std::uniform_real_distribution<double> log_size(0.0, std::log(max_bytes));
      std::uniform_int_distribution<int> pick_stream(0, nstreams - 1);
      unsigned char* host = staging();
      std::vector<Live> live;
      long made = 0;
      unsigned counter = 0;
      PoolId graph{0, 0};  // the private pool this thread routes a stream to now, if any
      uint64_t graphs = 0;
      auto release = [&](size_t i) {
        Live b = live[i];
        live[i] = live.back();
        live.pop_back();
        if (kHost || (counter++ & 255) == 0) {
          verify_block(b, host);
          ++verified;
        }
        remove_range(reinterpret_cast<uintptr_t>(b.ptr));
        pool->free(b.ptr);
      };
      auto call_other = [&](Method m) {
        ++g_calls[m];
        switch (m) {
          case kRecordStream:
            if (!live.empty())
              pool->record_stream(live[rng() % live.size()].ptr, reinterpret_cast<StreamId>(streams[pick_stream(rng)]));
            break;
          case kBlockSize:
            if (!live.empty()) {
              const Live& b = live[rng() % live.size()];
              if (pool->block_size(b.ptr) < b.size) fail("block_size of a live block is smaller than its request");
            }
            break;
          case kStats:
            check_stats(pool->stats());
            break;
          case kSnapshot:
            check_snapshot(pool->snapshot());
            break;
          case kEmptyCache:
            pool->empty_cache();
            break;
          case kResetPeakStats:
            pool->reset_peak_stats();
            break;
          case kLastError:
            (void)pool->last_error().size();
            break;
          case kKind:
            if (pool->kind() != kind || pool->backend().name().empty()) fail("kind or backend name changed");
            break;
          case kGraphPool:
            if (graph == PoolId{0, 0}) {
              graph = {static_cast<uint64_t>(t) + 1, ++graphs};
              const StreamId routed = reinterpret_cast<StreamId>(streams[pick_stream(rng)]);
              pool->begin_allocate_to_pool(graph, [routed](StreamId s) { return s == routed; });
            } else {
              pool->end_allocate_to_pool(graph);
              if (pool->pool_use_count(graph) != 1) fail("a private pool's use count is not 1");
              pool->release_pool(graph);
              graph = {0, 0};
            }
            break;
          case kCompleteEvents:
            host_backend->complete_events();
            break;
          case kWaits:
            (void)host_backend->waits().size();
            break;
          case kSetCapacity:
            host_backend->set_capacity(rng() % 2 == 0 ? 0 : small_capacity);
            break;
          case kMethods:
            break;
        }
      };
      while (made < per_thread) {
        if (other_rate > 0 && static_cast<int>(rng() % 1000) < other_rate) {
          call_other(static_cast<Method>(rng() % methods));
          continue;
        }
        if (live.size() >= 16 || (!live.empty() && rng() % 2 == 0)) {
          release(rng() % live.size());
          continue;
        }
        const size_t size = static_cast<size_t>(std::exp(log_size(rng)));
        Stream s = streams[pick_stream(rng)];
        void* p = pool->allocate(size < 1 ? 1 : size, reinterpret_cast<StreamId>(s));
        ++made;
        if (p == nullptr) {
          ++ooms;
          continue;
        }
        Live b{static_cast<char*>(p), size < 1 ? 1 : size, static_cast<unsigned char>(1 + (made + 37 * t) % 251), s};
        add_range(reinterpret_cast<uintptr_t>(b.ptr), b.size);
        tag_block(b);
        live.push_back(b);
      }
      if (graph != PoolId{0, 0}) {
        pool->end_allocate_to_pool(graph);
        pool->release_pool(graph);
      }
      while (!live.empty()) release(live.size() - 1);
      free_staging(host);
    });
  }
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)pool->stats();  // records the record_stream events put off while private pools were routed to
  synchronize_device();
  if (host_backend != nullptr) host_backend->complete_events();

  const PoolStats before = pool->stats();
  pool->empty_cache();
  const PoolStats after = pool->stats();
  if (before.allocated_bytes != 0 || before.active_blocks != 0) fail("blocks still allocated after freeing all");
  if (after.reserved_bytes != 0 || after.segments != 0) fail("reserved bytes not zero after empty_cache");
  if (after.graph_pools != 0) fail("private pools left after every one was released and its blocks freed");
  std::string calls;
  for (int m = 0; m < methods; ++m)
    calls += std::string(m ? ", " : "") + "\"" + kMethodNames[m] + "\": " + std::to_string(g_calls[m].load());
  std::printf(
      "{\"kind\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"streams\": %d, \"allocations\": %ld, "
      "\"seconds\": %.2f, \"verified_blocks\": %ld, \"ooms\": %ld, \"peak_reserved\": %lld, \"device_allocs\": %lld, "
      "\"cross_stream_reuses\": %lld, \"reserved_after_empty_cache\": %lld, \"calls\": {%s}, \"failures\": %ld}\n",
      kind.c_str(), pool->backend().name().c_str(), threads, nstreams, per_thread * threads, seconds, verified.load(),
      ooms.load(), static_cast<long long>(before.reserved_bytes_peak), static_cast<long long>(before.device_allocs),
      static_cast<long long>(before.cross_stream_reuses), static_cast<long long>(after.reserved_bytes), calls.c_str(),
      g_failures.load());
  destroy_streams(streams);
  return g_failures.load() == 0 ? 0 : 1;
}
