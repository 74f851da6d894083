// Helpers shared by the Autograd kernels (csrc/autograd.cpp and the per-family csrc/*_autograd.cpp files): finding
// a registered op, calling it below autograd, and asking whether a call must record a graph.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <optional>
#include <utility>

namespace torchext {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Runs an op on the kernel below autograd (the backend's, or the fake kernel under torch.compile).
template <typename Signature, typename... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(std::forward<Args>(args)...);
}

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }

// Whether a call must record a graph: grad mode on and a tensor argument requiring grad. When it is false, a
// *_backward op's Autograd kernel goes straight to the kernel below (no autograd node, no saved tensors).
template <typename... Args>
bool needs_graph(const Args&... args) {
  return at::GradMode::is_enabled() && (requires_grad(args) || ...);
}

// A defined optional tensor, else undefined; and back.
inline at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
inline std::optional<at::Tensor> as_optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace torchext
