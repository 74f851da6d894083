// The optimizer step from C++ (torchext::sgd_, the op under Python's torchext.optim.SGD). Source: csrc/optim_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace torchext {

// torch.optim.SGD's update of every params[i] (and momentum_buffers[i]) in place from grads[i]: momentum_buffers
// empty when momentum == 0; is_first_step sets each buffer to its first gradient instead of blending. One dtype and
// one device for every tensor; params dense. lr_tensor (one float32/float64 element on the params' device), if
// given, replaces lr and is read on the device. autocast_copies (at::kHalf or at::kBFloat16), for float32 CUDA
// params: the step also writes the copies that conv2d's CUDA autocast reads in place of casting each weight
// (docs/autocast_copies.md). Call it under torch::NoGradGuard, as optimizers do.
void sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum = 0,
          double dampening = 0, double weight_decay = 0, bool nesterov = false, bool maximize = false,
          bool is_first_step = false, const std::optional<at::Tensor>& lr_tensor = std::nullopt,
          std::optional<at::ScalarType> autocast_copies = std::nullopt);

}  // namespace torchext
