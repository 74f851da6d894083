// The SGD update of one element, written once for the CPU kernel (csrc/optim_cpu.cpp) and the CUDA kernel
// (cuda_ops/optim.cu). T is the storage type, A the arithmetic type (float; double for double).
#pragma once

#include "activation_math.h"  // TORCHEXT_HD

namespace torchext::math {

// torch.optim.SGD's update, as its single-tensor form writes it:
//   g = maximize ? -grad : grad;  g += weight_decay * param;
//   has_buf:  buf = first ? g : momentum * buf + (1 - dampening) * g   (stored in T)
//             g = nesterov ? g + momentum * buf : buf
//   param -= lr * g
template <typename T, typename A>
struct SgdUpdate {
  A lr, momentum, dampening, weight_decay;
  bool nesterov, maximize, first, has_buf;

  // One element: returns the new parameter and updates `buf` when has_buf.
  TORCHEXT_HD T operator()(T p, T g, T& buf) const {
    A d = static_cast<A>(g);
    if (maximize) d = -d;
    const A pa = static_cast<A>(p);
    if (weight_decay != A(0)) d += weight_decay * pa;
    if (has_buf) {
      // The buffer is stored in T, and torch's next use of it (Nesterov's add, the parameter's update) reads the
      // stored value: round it first.
      const T b = static_cast<T>(first ? d : momentum * static_cast<A>(buf) + (A(1) - dampening) * d);
      buf = b;
      d = nesterov ? d + momentum * static_cast<A>(b) : static_cast<A>(b);
    }
    return static_cast<T>(pa - lr * d);
  }
};

}  // namespace torchext::math
