// Checking class targets on the GPU without stopping it (cross_entropy, multi_margin_loss).
//
// The loss kernels record bad targets on the device (a count, or the first bad row). Reading that back at once
// costs a device-to-host copy and a stream synchronization per call: the host then cannot queue work ahead of the
// GPU (its cost alone was not measured; with Python autograd it made torchext-compare's first GPU run 11-26%
// slower than stock, see benchmarks/results/cifar10/README.md). TORCHEXT_CHECK_TARGETS chooses, at each call:
//   unset, "deferred": the result is copied into pinned host memory behind an event, and the error is raised by
//                      the first torchext loss call after the copy has landed, or by torchext.ops.check_targets()
//                      (which waits for it), or, at interpreter exit, printed to stderr (torchext/ops/
//                      cross_entropy.py). The loss of the offending call holds NaN for the bad rows. This is the
//                      default: PyTorch's own losses check with a device-side assert, which also reports late (and
//                      kills the CUDA context, which this does not).
//   "sync" or "1":     read back at once; the call itself raises (the behaviour of torchext 0.1).
//   "0" or "off":      no check; bad rows give NaN.
// Inside CUDA-graph capture nothing is checked (no copy or synchronization may be captured).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace torchext {

enum class TargetCheckMode { Deferred, Sync, Off };

// The mode TORCHEXT_CHECK_TARGETS names; an unknown value raises a ValueError listing the valid ones.
TargetCheckMode target_check_mode();

// Throws the op's error for `value` (the device-side result read back) when it reports bad targets, else returns.
// `deferred` is true when the check runs after the call that made the result.
using TargetReport = std::function<void(int64_t value, bool deferred)>;

#ifdef TORCHEXT_WITH_CUDA
// For an op that has just queued a kernel writing `result` (one int32 or int64 element, any shape) on the current
// stream:
// checks it according to target_check_mode(). First raises for any earlier deferred check that has completed.
void check_targets(const at::Tensor& result, TargetReport report);
#endif

// "" for a check made at its call; for a deferred one, a sentence saying so, to end the error message with.
const char* target_check_note(bool deferred);

// Waits for every deferred check and raises the error of the oldest that found bad targets (all are consumed).
void flush_target_checks();

}  // namespace torchext
