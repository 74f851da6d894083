// Deferred target checks (csrc/target_checks.h): a process-wide queue of results copied into pinned host slots
// behind CUDA events.
//
// Host cost per check, the loss call's only overhead over an unchecked one: one cudaMemcpyAsync and one
// cudaEventRecord into a slot and an event taken from pools made once (kSlots pinned 8-byte slots in one
// allocation; events per device, reused), plus one cudaEventQuery of the oldest pending check. An earlier version
// allocated a pinned tensor, copied into it through ATen and created an event at every call: on an H100 machine
// that made cross_entropy forward+backward at 65536 x 10 cost 74 us more host time than with the check off.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "target_checks.h"

namespace torchext {
namespace {

// Past kSlots pending checks the oldest is waited for, which bounds what is held if the host runs far ahead.
constexpr size_t kSlots = 256;

struct PendingCheck {
  int slot;          // index into the pinned slots; valid once `done` has completed
  bool is_int64;     // the result's dtype (int32 otherwise)
  int device;        // the device whose event pool `done` returns to
  cudaEvent_t done;  // recorded on the loss's stream after the copy
  TargetReport report;
};

// Everything under one mutex. Leaked on purpose: destroying CUDA events or freeing pinned memory at exit, after
// the CUDA runtime has shut down, aborts.
struct Queue {
  std::mutex mutex;
  std::deque<PendingCheck> pending;  // oldest first
  int64_t* slots = nullptr;          // kSlots pinned values, allocated at the first check
  std::vector<int> free_slots;
  std::unordered_map<int, std::vector<cudaEvent_t>> free_events;  // per device
};
Queue& queue = *new Queue;

// Under queue.mutex.
void ensure_slots() {
  if (queue.slots != nullptr) return;
  void* p = nullptr;
  C10_CUDA_CHECK(cudaHostAlloc(&p, kSlots * sizeof(int64_t), cudaHostAllocDefault));
  queue.slots = static_cast<int64_t*>(p);
  for (int i = static_cast<int>(kSlots) - 1; i >= 0; --i) queue.free_slots.push_back(i);
}

// Under queue.mutex.
cudaEvent_t take_event(int device) {
  auto& pool = queue.free_events[device];
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

int64_t value_of(const PendingCheck& check) {
  const int64_t* slot = queue.slots + check.slot;
  if (check.is_int64) return *slot;
  int32_t v;
  std::memcpy(&v, slot, sizeof(v));
  return v;
}

// Under queue.mutex: takes the oldest check out of the queue (its copy complete), returns its slot and event to the
// pools, and adds its value and report to `ready`.
void pop_oldest(std::vector<std::pair<int64_t, TargetReport>>& ready) {
  PendingCheck& check = queue.pending.front();
  ready.emplace_back(value_of(check), std::move(check.report));
  queue.free_slots.push_back(check.slot);
  queue.free_events[check.device].push_back(check.done);
  queue.pending.pop_front();
}

// Runs the reports outside the lock, in order; the first error is rethrown once every report has run (or stored
// in `first` when given).
void run_reports(std::vector<std::pair<int64_t, TargetReport>>& ready, std::exception_ptr* first_out = nullptr) {
  std::exception_ptr first;
  for (auto& [value, report] : ready) {
    try {
      report(value, /*deferred=*/true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first_out != nullptr) {
    if (!*first_out) *first_out = first;
  } else if (first) {
    std::rethrow_exception(first);
  }
}

// Reports the checks that may be reported now (completed ones, or all with `wait`), oldest first.
void report_pending(bool wait) {
  std::vector<std::pair<int64_t, TargetReport>> ready;
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    while (!queue.pending.empty()) {
      const cudaEvent_t done = queue.pending.front().done;
      if (wait) {
        C10_CUDA_CHECK(cudaEventSynchronize(done));
      } else {
        const cudaError_t status = cudaEventQuery(done);
        if (status == cudaErrorNotReady) break;
        C10_CUDA_CHECK(status);
      }
      pop_oldest(ready);
    }
  }
  run_reports(ready);
}

}  // namespace

void check_targets(const at::Tensor& result, TargetReport report) {
  const TargetCheckMode mode = target_check_mode();
  // While the stream is captured into a CUDA graph neither this check nor the queue's may touch it: querying an
  // event or copying is not allowed there (cudaErrorStreamCaptureUnsupported, which invalidates the capture).
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return;
  // Earlier calls' errors first; this call's check is queued before one is raised, so that it is not lost.
  std::exception_ptr earlier;
  try {
    report_pending(/*wait=*/false);
  } catch (...) {
    earlier = std::current_exception();
  }
  if (mode == TargetCheckMode::Deferred) {
    TORCH_INTERNAL_ASSERT(result.numel() == 1 &&
                          (result.scalar_type() == at::kInt || result.scalar_type() == at::kLong));
    const c10::cuda::CUDAGuard guard(result.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(result.device().index()).stream();
    std::vector<std::pair<int64_t, TargetReport>> ready;
    {
      std::lock_guard<std::mutex> lock(queue.mutex);
      ensure_slots();
      if (queue.free_slots.empty()) {  // kSlots checks in flight: wait for the oldest to make room
        C10_CUDA_CHECK(cudaEventSynchronize(queue.pending.front().done));
        pop_oldest(ready);
      }
      PendingCheck entry;
      entry.slot = queue.free_slots.back();
      queue.free_slots.pop_back();
      entry.is_int64 = result.scalar_type() == at::kLong;
      entry.device = result.device().index();
      entry.done = take_event(entry.device);
      C10_CUDA_CHECK(cudaMemcpyAsync(queue.slots + entry.slot, result.const_data_ptr(), result.element_size(),
                                     cudaMemcpyDeviceToHost, stream));
      C10_CUDA_CHECK(cudaEventRecord(entry.done, stream));
      entry.report = std::move(report);
      queue.pending.push_back(std::move(entry));
    }
    run_reports(ready, &earlier);
  }
  if (earlier) std::rethrow_exception(earlier);
  if (mode == TargetCheckMode::Sync) {
    report(result.scalar_type() == at::kLong ? result.item<int64_t>() : result.item<int>(), /*deferred=*/false);
  }
}

void flush_target_checks() { report_pending(/*wait=*/true); }

}  // namespace torchext
