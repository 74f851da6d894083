// The accumulation type of each element type, in plain C++ (no CUDA device code), so that host code that names
// engine structs templated on it (cuda_ops/conv2d.cuh's Conv2dArgs, included by csrc/conv2d_cuda.cpp) compiles with
// the host compiler. cuda_ops/common.cuh includes it.
#pragma once

namespace torchext::cuda_ops {

// Half types compute and accumulate in float32; float64 stays float64.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccType<T>::type;

}  // namespace torchext::cuda_ops
