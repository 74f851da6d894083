// Autocast copies: low-precision copies of float32 CUDA weights that torchext's optimizer keeps up to date, so that
// CUDA autocast need not cast each weight again in every forward (csrc/autocast_copies.cpp).
//
// Under CUDA autocast a training step casts every float32 weight to the autocast dtype in its forward (an ATen copy
// kernel and an autograd node each) and casts the weight's gradient back in its backward. With
// torchext.optim.SGD(autocast_copies=dtype), the optimizer's kernel also writes each updated float32 parameter,
// rounded to `dtype`, into a copy held here; conv2d's and conv2d_stats' CUDA autocast kernels then read that copy in
// place of casting, and their autograd node returns the weight's gradient in float32 itself. The same bits reach the
// kernels and the parameters as through the casts.
//
// A copy is used only while it is known to hold the parameter's value: it was written by an eager step of the
// optimizer (the op's Autograd kernel confirmed the step), the parameter's version counter and data pointer have not
// changed since, and no CUDA graph captured a step of it. Anything else falls back to autocast's cast. What the
// version counter cannot see, a write through `param.data`, is the one way to leave a stale copy
// (docs/autocast_copies.md).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace torchext::autocast_copies {

// A dense CUDA tensor seen as itself: no tensor subclass or mode (fake tensors, functionalization, functorch), no
// tracer, not an inference tensor. Copies are used only for such weights, with such inputs.
bool plain(const at::Tensor& t);

// The copy of `weight` in `dtype` if one holds weight's current value and may be used here (a plain CUDA tensor,
// not traced, not under a stream capture, the autocast cache enabled), else nullopt.
std::optional<at::Tensor> fresh(const at::Tensor& weight, at::ScalarType dtype);

// For the optimizer's CUDA kernel: the copy of float32 `param` in `dtype` that the step is to write, made or
// re-made where needed (no copy, another layout or size, or one still held elsewhere, e.g. saved by a graph that was
// not run backward), and marked as being written. Not under a stream capture (see forget).
at::Tensor for_step(const at::Tensor& param, at::ScalarType dtype);

// A step that writes the parameters but not their copies (without autocast_copies, or in another dtype): their
// copies, if any, stop being fresh (the step's version bump may not happen, e.g. under torch.inference_mode()).
void invalidate(at::TensorList params);

// After an eager step wrote them and bumped the parameters' version counters: the copies being written become
// fresh at the parameters' new versions.
void confirm_step(at::TensorList params);

// The parameters' copies are dropped for good: a step of theirs was captured into a CUDA graph, whose replays change
// them without a version bump.
void forget(at::TensorList params);

}  // namespace torchext::autocast_copies
