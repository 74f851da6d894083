// Autocast kernels for torchext ops in one line each: `m.impl("relu", autocast_to_float32<"torchext::relu",
// Tensor(const Tensor&), c10::DeviceType::CPU>())` under TORCH_LIBRARY_IMPL(torchext, AutocastCPU, m). The kernel casts
// the op's floating tensors on that device, float64 excepted, to float32 (ATen's CastPolicy::fp32, the rule PyTorch
// applies to softmax and the losses, and torchext's for every op under CPU autocast: its CPU kernels are float32 /
// float64), then runs the op with autocast off. Being C++, the rules hold for LibTorch callers as for Python's.
#pragma once

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "autograd.h"  // find_op

namespace torchext {

// An op's qualified name as a template argument.
template <size_t N>
struct OpName {
  char value[N];
  constexpr OpName(const char (&name)[N]) { std::copy_n(name, N, value); }  // NOLINT: implicit on purpose
};

// The op called through the dispatcher (from inside the autocast wrapper, which has excluded its autocast key).
template <OpName Name, typename Signature>
struct Redispatch;
template <OpName Name, typename Ret, typename... Args>
struct Redispatch<Name, Ret(Args...)> {
  static Ret call(Args... args) {
    static const auto op = find_op<Ret(Args...)>(Name.value);
    return op.call(std::forward<Args>(args)...);
  }
};

template <OpName Name, typename Signature, c10::DeviceType Device>
constexpr auto autocast_to_float32() {
  return &at::autocast::WrapFunction<at::autocast::CastPolicy::fp32, Device, Signature, Signature,
                                     &Redispatch<Name, Signature>::call>::type::call;
}

}  // namespace torchext
