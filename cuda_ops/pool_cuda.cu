// The pool's GPU backend (see pool.h): cudaMalloc/cudaFree for segments, cudaEvent_t for stream order. No kernels.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "pool.h"

namespace torchext::memory {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
}

// Makes `device` current for the scope, and restores the caller's device after. Does nothing when it already is, so a
// pool on device 1 never makes a context on device 0.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device)
      check(cudaSetDevice(device), "cudaSetDevice");
    else
      previous_ = -1;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// Makes the calling thread's stream capture mode relaxed for the scope, and restores it after.
class CaptureModeScope {
 public:
  CaptureModeScope() { check(cudaThreadExchangeStreamCaptureMode(&mode_), "cudaThreadExchangeStreamCaptureMode"); }
  ~CaptureModeScope() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  // In relaxed capture mode for the call, so that it works while a CUDA graph is being captured (in global mode even in
  // another thread): the graph keeps the address and replays never allocate, as with PyTorch's caching allocator.
  void* reserve(size_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    CaptureModeScope relaxed;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so that the next CUDA call does not report it
      return nullptr;
    }
    check(err, "cudaMalloc");
    return p;
  }

  void release(void* ptr, size_t) override {
    DeviceScope scope(device_);
    check(cudaFree(ptr), "cudaFree");
  }

  EventId record_event(StreamId stream) override {
    DeviceScope scope(device_);
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return e;
  }

  bool event_done(EventId event) override {
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(err, "cudaEventQuery");
    return true;
  }

  void wait_event(StreamId waiter, EventId event) override {
    DeviceScope scope(device_);
    check(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(waiter), static_cast<cudaEvent_t>(event), 0),
          "cudaStreamWaitEvent");
  }

  // Events are made per use and destroyed after: they are needed only when memory crosses streams, rarely enough
  // that a free list is not worth keeping. (Destroying an event a queued wait refers to is allowed.)
  void destroy_event(EventId event) override {
    DeviceScope scope(device_);
    check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy");
  }

  void synchronize() override {
    DeviceScope scope(device_);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  std::pair<int64_t, int64_t> device_memory() override {
    DeviceScope scope(device_);
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return {-1, -1};
    }
    return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total)};
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }

 private:
  int device_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace torchext::memory
