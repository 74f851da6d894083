// Stress test of the memory pool on a GPU, without torch: cuda_ops/pool.{h,cpp} + cuda_ops/pool_cuda.cu only.
// tests/test_memory_gpu.py::test_stress compiles and runs it (also under compute-sanitizer).
//
//   nvcc -std=c++17 -O2 -I cuda_ops tests/pool_stress.cu cuda_ops/pool.cpp cuda_ops/pool_cuda.cu -o pool_stress
//   ./pool_stress [kind=best_fit] [threads=4] [streams=4] [allocations per thread=1000000] [max bytes=268435456]
//
// Each thread allocates and frees at random (sizes log-uniform from 1 byte to max bytes) on streams picked at random
// from a shared set, keeping up to 16 blocks alive. Every block gets a tag (its first and last bytes, up to 512 each,
// set with cudaMemsetAsync on its stream); a sample of blocks is read back before being freed and the tag checked, so a
// block handed out twice, or reused before its stream's work finished, shows as a wrong tag. All live ranges are also
// kept in one host-side interval map and checked for overlap at every allocation. At the end every block is freed, the
// cache emptied, and reserved bytes must be zero. Prints one JSON line; exits 1 on any failure.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool.h"

using namespace torchext::memory;

namespace {

std::atomic<long> g_failures{0};
std::mutex g_ranges_mutex;
std::map<uintptr_t, size_t> g_ranges;  // live [address, address + size)

void fail(const std::string& what) {
  if (g_failures.fetch_add(1) < 10) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::exit(2);
  }
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
  cudaStream_t stream;
};

size_t tag_bytes(size_t size) { return size < 512 ? size : 512; }

void tag_block(const Live& b) {
  const size_t n = tag_bytes(b.size);
  check_cuda(cudaMemsetAsync(b.ptr, b.tag, n, b.stream), "cudaMemsetAsync");
  if (b.size > n) check_cuda(cudaMemsetAsync(b.ptr + b.size - n, b.tag, n, b.stream), "cudaMemsetAsync");
}

void verify_block(const Live& b, unsigned char* host) {
  const size_t n = tag_bytes(b.size);
  check_cuda(cudaMemcpyAsync(host, b.ptr, n, cudaMemcpyDeviceToHost, b.stream), "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(host + 512, b.ptr + b.size - n, n, cudaMemcpyDeviceToHost, b.stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  for (size_t i = 0; i < n; ++i)
    if (host[i] != b.tag || host[512 + i] != b.tag) {
      fail("tag of a live block was overwritten (size " + std::to_string(b.size) + ")");
      return;
    }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc > 1 ? argv[1] : "best_fit";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 4;
  const int nstreams = argc > 3 ? std::atoi(argv[3]) : 4;
  const long per_thread = argc > 4 ? std::atol(argv[4]) : 1000000;
  const double max_bytes = argc > 5 ? std::atof(argv[5]) : 268435456.0;

  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  std::vector<cudaStream_t> streams(nstreams);
  for (auto& s : streams) check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<Pool> pool = make_pool(kind, make_cuda_backend(0));

  std::atomic<long> verified{0}, ooms{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      check_cuda(cudaSetDevice(0), "cudaSetDevice");
      std::mt19937_64 rng(1234 + t);
      std::uniform_real_distribution<double> log_size(0.0, std::log(max_bytes));
      std::uniform_int_distribution<int> pick_stream(0, nstreams - 1);
      unsigned char* host = nullptr;
      check_cuda(cudaMallocHost(&host, 1024), "cudaMallocHost");
      std::vector<Live> live;
      long made = 0;
      unsigned counter = 0;
      auto release = [&](size_t i) {
        Live b = live[i];
        live[i] = live.back();
        live.pop_back();
        if ((counter++ & 255) == 0) {
          verify_block(b, host);
          ++verified;
        }
        remove_range(reinterpret_cast<uintptr_t>(b.ptr));
        pool->free(b.ptr);
      };
      while (made < per_thread) {
        if (live.size() >= 16 || (!live.empty() && rng() % 2 == 0)) {
          release(rng() % live.size());
          continue;
        }
        const size_t size = static_cast<size_t>(std::exp(log_size(rng)));
        cudaStream_t s = streams[pick_stream(rng)];
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
      while (!live.empty()) release(live.size() - 1);
      check_cuda(cudaFreeHost(host), "cudaFreeHost");
    });
  }
  for (auto& w : workers) w.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  const PoolStats before = pool->stats();
  pool->empty_cache();
  const PoolStats after = pool->stats();
  if (before.allocated_bytes != 0 || before.active_blocks != 0) fail("blocks still allocated after freeing all");
  if (after.reserved_bytes != 0 || after.segments != 0) fail("reserved bytes not zero after empty_cache");
  std::printf(
      "{\"kind\": \"%s\", \"threads\": %d, \"streams\": %d, "
      "\"allocations\": %ld, \"seconds\": %.2f, "
      "\"verified_blocks\": %ld, \"ooms\": %ld, \"peak_reserved\": "
      "%lld, \"device_allocs\": %lld, "
      "\"cross_stream_reuses\": %lld, \"reserved_after_empty_cache\": "
      "%lld, \"failures\": %ld}\n",
      kind.c_str(), threads, nstreams, per_thread * threads, seconds, verified.load(), ooms.load(),
      static_cast<long long>(before.reserved_bytes_peak), static_cast<long long>(before.device_allocs),
      static_cast<long long>(before.cross_stream_reuses), static_cast<long long>(after.reserved_bytes),
      g_failures.load());
  for (auto& s : streams) cudaStreamDestroy(s);
  return g_failures.load() == 0 ? 0 : 1;
}
