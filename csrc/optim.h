// Optimizer steps: the argument checks both backends share (csrc/optim_cpu.cpp) and the per-element SGD update the
// CPU kernel runs (the CUDA kernel's is cuda_ops/optim.cu's `Update`, the same arithmetic in the same order).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace torchext::optim {

// sgd_'s lists, checked: equal lengths (momentum_buffers empty when momentum == 0), one floating dtype and one device
// for every tensor, each grad and buffer of its param's shape, every param and buffer dense (non-overlapping) with
// the buffer in its param's layout. Returns the grads in their params' layouts (a copy where a grad's strides differ).
// lr_tensor, if given: one float32 or float64 element on the params' device.
std::vector<at::Tensor> check_sgd_args(const char* op, at::TensorList params, at::TensorList grads,
                                       at::TensorList momentum_buffers, double momentum,
                                       const std::optional<at::Tensor>& lr_tensor);

// torch.optim.SGD's update of one element (A: float, double for double): returns the new parameter; updates `buf`
// when has_buf. The buffer is rounded to its storage type T before its next use, as torch's stored buffer is.
template <typename T, typename A>
struct SgdUpdate {
  A lr, momentum, dampening, weight_decay;
  bool nesterov, maximize, first, has_buf;

  T operator()(T p, T g, T& buf) const {
    A d = static_cast<A>(g);
    if (maximize) d = -d;
    const A pa = static_cast<A>(p);
    if (weight_decay != A(0)) d += weight_decay * pa;
    if (has_buf) {
      const T b = static_cast<T>(first ? d : momentum * static_cast<A>(buf) + (A(1) - dampening) * d);
      buf = b;
      d = nesterov ? d + momentum * static_cast<A>(b) : static_cast<A>(b);
    }
    return static_cast<T>(pa - lr * d);
  }
};

}  // namespace torchext::optim
