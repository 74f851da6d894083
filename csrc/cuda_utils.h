// Glue between ATen and cuda_ops/: dtype mapping and the launch pattern every CUDA wrapper uses.
// Included only by csrc/*_cuda.cpp files.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>


#include "checks.h"
#include "loss_reduction.h"

namespace torchext {

// The CUDA type cuda_ops/ kernels are instantiated for, for each ATen scalar type (same bit layout).
template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<c10::Half> {
  using type = __half;
};
template <>
struct CudaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using cuda_t = typename CudaType<T>::type;

template <typename T>
const cuda_t<T>* cuda_ptr(const at::Tensor& t) {
  return reinterpret_cast<const cuda_t<T>*>(t.const_data_ptr<T>());
}
template <typename T>
cuda_t<T>* cuda_mutable_ptr(at::Tensor& t) {
  return reinterpret_cast<cuda_t<T>*>(t.mutable_data_ptr<T>());
}

inline cuda_ops::LossReduction to_cuda_reduction(Reduction r) {
  switch (r) {
    case Reduction::None:
      return cuda_ops::LossReduction::None;
    case Reduction::Mean:
      return cuda_ops::LossReduction::Mean;
    default:
      return cuda_ops::LossReduction::Sum;
  }
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace torchext

// Dispatch over the four floating dtypes the CUDA kernels are built for; inside, scalar_t is the ATen type.
// NAME must be a string literal (a constant expression for torch >= 2.14).
#define TORCHEXT_DISPATCH_CUDA_FLOATING(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)
