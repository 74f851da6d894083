// The target-check mode (csrc/target_checks.h) and torchext.ops.check_targets(); the deferred queue itself is
// CUDA-only (csrc/target_checks_cuda.cpp).
#include "target_checks.h"

#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

namespace torchext {

TargetCheckMode target_check_mode() {
  const char* env = std::getenv("TORCHEXT_CHECK_TARGETS");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "deferred") == 0) return TargetCheckMode::Deferred;
  if (std::strcmp(env, "sync") == 0 || std::strcmp(env, "1") == 0) return TargetCheckMode::Sync;
  if (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0) return TargetCheckMode::Off;
  TORCH_CHECK_VALUE(false, "TORCHEXT_CHECK_TARGETS=", env,
                    ": expected 'deferred' (the default), 'sync' (or 1) or 'off' (or 0)");
}

const char* target_check_note(bool deferred) {
  return deferred ? " (found after the call that received them, which returned NaN for those rows: the check reads "
                    "its result back without stopping the GPU; TORCHEXT_CHECK_TARGETS=sync makes the call itself raise)"
                  : "";
}

#ifndef TORCHEXT_WITH_CUDA
void flush_target_checks() {}  // nothing is ever deferred without CUDA
#endif

namespace {
// Holds no state: a TorchBind class only to give Python the static method below.
struct TargetChecks : torch::CustomClassHolder {};
}  // namespace

TORCH_LIBRARY_FRAGMENT(torchext, m) {
  m.class_<TargetChecks>("TargetChecks").def_static("flush", [] { flush_target_checks(); });
}

}  // namespace torchext
