// The C++ API of the optimizer step (csrc/include/torchext/optim.h).
#include <ATen/ATen.h>
#include <torchext/optim.h>

#include "api.h"

namespace torchext {

void sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum,
          double dampening, double weight_decay, bool nesterov, bool maximize, bool is_first_step,
          const std::optional<at::Tensor>& lr_tensor, std::optional<at::ScalarType> autocast_copies) {
  // Nothing to update: the dispatcher needs a tensor to choose a backend.
  if (params.empty() && grads.empty() && momentum_buffers.empty()) return;
  static const auto op = find_op<void(at::TensorList, at::TensorList, at::TensorList, double, double, double, double,
                                      bool, bool, bool, const std::optional<at::Tensor>&,
                                      std::optional<at::ScalarType>)>("torchext::sgd_");
  op.call(params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov, maximize, is_first_step,
          lr_tensor, autocast_copies);
}

}  // namespace torchext
