// Optimizer steps: the argument checks both backends share (defined in csrc/optim_cpu.cpp). The per-element update
// both kernels run is cuda_ops/optim_math.h.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace torchext::optim {

// sgd_'s lists, checked: equal lengths (momentum_buffers empty when momentum == 0), one floating dtype and one device
// for every tensor, each grad and buffer of its param's shape, every param and buffer dense (non-overlapping) with
// the buffer in its param's layout. Returns the grads in their params' layouts (a copy where a grad's strides differ).
// lr_tensor, if given: one float32 or float64 element on the params' device. autocast_copies, if given: float16 or
// bfloat16 (the CPU kernel has no copies to write: CPU autocast runs torchext's convolutions in float32).
std::vector<at::Tensor> check_sgd_args(const char* op, at::TensorList params, at::TensorList grads,
                                       at::TensorList momentum_buffers, double momentum,
                                       const std::optional<at::Tensor>& lr_tensor,
                                       std::optional<at::ScalarType> autocast_copies);

}  // namespace torchext::optim
