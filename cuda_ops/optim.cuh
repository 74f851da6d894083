// Optimizer steps on raw pointers: SGD (momentum, dampening, Nesterov, weight decay, maximize) over a list of tensors
// in one pass per element and few launches. T is float, double, __half or __nv_bfloat16; the arithmetic runs in
// acc_t<T> (float, double for double). Every array is dense: a parameter, its gradient and its momentum buffer share
// one memory layout, so element i of the three is the same element (the caller makes it so).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchext::cuda_ops {

// One tensor of the list: n elements of param, grad and (with momentum) momentum_buffer.
template <typename T>
struct SgdTensor {
  T* param;
  const T* grad;
  T* momentum_buffer;  // nullptr when momentum == 0
  int64_t n;
  // float params only: where the updated param, rounded to SgdHyper::copy_dtype, is also written (nullptr: nowhere).
  // Same layout as param: element i of the copy is element i of param (csrc/autocast_copies.h).
  void* copy = nullptr;
};

enum class SgdCopy : int { none, bfloat16, float16 };

// torch.optim.SGD's update, element by element, as its single-tensor form writes it:
//   g = maximize ? -grad : grad;  g += weight_decay * param;
//   momentum != 0:  buf = is_first_step ? g : momentum * buf + (1 - dampening) * g   (stored in T)
//                   g = nesterov ? g + momentum * buf : buf
//   param -= lr * g
// lr is `lr`, or *lr_device (float32 or float64 on the device: read by the kernel, so a captured CUDA graph follows
// the scheduler's updates) when one of those is non-null.
struct SgdHyper {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false, is_first_step = false;
  const float* lr_device_f32 = nullptr;
  const double* lr_device_f64 = nullptr;
  SgdCopy copy_dtype = SgdCopy::none;  // the dtype of every SgdTensor::copy
};

// The whole list in launches of up to 48 tensors (a block per 64 Ki-element chunk of a tensor, up to 320 blocks per
// launch; cuda_ops/optim.cu): two launches for ResNet-18's 62 tensors.
template <typename T>
cudaError_t sgd_step(const SgdTensor<T>* tensors, int64_t count, const SgdHyper& hyper, cudaStream_t stream);

}  // namespace torchext::cuda_ops
