// Deferred target checks (csrc/target_checks.h): a process-wide queue of pinned-memory results behind CUDA events.
#include "target_checks.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <mutex>

namespace torchext {
namespace {

struct PendingCheck {
  at::Tensor host;  // pinned, one element (of any shape); valid once `done` has completed
  std::shared_ptr<at::cuda::CUDAEvent> done;
  TargetReport report;
};

// Pending checks, oldest first. Past kMaxPending the oldest is waited for, which bounds the pinned memory held if
// the host runs far ahead of the GPU.
// Both are leaked on purpose: destroying a CUDA event at exit, after the CUDA runtime has shut down, aborts.
constexpr size_t kMaxPending = 256;
std::mutex& pending_mutex = *new std::mutex;
std::deque<PendingCheck>& pending = *new std::deque<PendingCheck>;

int64_t value_of(const at::Tensor& host) {
  return host.scalar_type() == at::kLong ? *host.const_data_ptr<int64_t>() : *host.const_data_ptr<int>();
}

// Takes the checks that may be reported now (completed ones, or all with `wait`) out of the queue, in order, and
// runs their reports after the lock is released; the first error is rethrown once every report has run.
void report_pending(bool wait) {
  std::deque<PendingCheck> ready;
  {
    std::lock_guard<std::mutex> lock(pending_mutex);
    while (!pending.empty() && (wait || pending.size() > kMaxPending || pending.front().done->query())) {
      ready.push_back(std::move(pending.front()));
      pending.pop_front();
    }
  }
  std::exception_ptr first;
  for (PendingCheck& check : ready) {
    check.done->synchronize();
    try {
      check.report(value_of(check.host), /*deferred=*/true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
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
    PendingCheck entry;
    entry.host = at::empty(result.sizes(), result.options().device(at::kCPU).pinned_memory(true));
    entry.host.copy_(result, /*non_blocking=*/true);
    entry.done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    entry.done->record(c10::cuda::getCurrentCUDAStream());
    entry.report = std::move(report);
    std::lock_guard<std::mutex> lock(pending_mutex);
    pending.push_back(std::move(entry));
  }
  if (earlier) std::rethrow_exception(earlier);
  if (mode == TargetCheckMode::Sync) {
    report(result.scalar_type() == at::kLong ? result.item<int64_t>() : result.item<int>(), /*deferred=*/false);
  }
}

void flush_target_checks() { report_pending(/*wait=*/true); }

}  // namespace torchext
