// The activation functions and their derivatives, written once for the CPU kernels (csrc/activations_cpu.cpp), the
// CUDA kernels (cuda_ops/activations.cu) and any kernel that fuses an activation into its epilogue.
// A is the computation type: float for float32/float16/bfloat16 data, double for float64.
//
//   relu(x)        = max(x, 0)                          d/dx from y: y > 0
//   leaky_relu(x)  = x > 0 ? x : s*x                    d/dx from x: x > 0 ? 1 : s
//   sigmoid(x)     = 1 / (1 + e^-x)                     d/dx from y: y (1 - y)
//   tanh(x)                                             d/dx from y: 1 - y^2
//   gelu(x)        = x/2 (1 + erf(x/sqrt2))             d/dx from x: Phi(x) + x phi(x)
//   gelu_tanh(x)   = x/2 (1 + tanh(k0 (x + k1 x^3)))    d/dx from x: (1+t)/2 + x/2 (1-t^2) k0 (1 + 3 k1 x^2)
//   silu(x)        = x sigmoid(x)                       d/dx from x: s (1 + x (1 - s))
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define TORCHEXT_HD __host__ __device__ __forceinline__
#else
#define TORCHEXT_HD inline
#endif

namespace torchext::math {

// NaN-propagating like torch: relu(NaN) = NaN, and relu_backward passes the gradient where y is NaN.
template <typename A>
TORCHEXT_HD A relu_forward(A x) {
  return x < A(0) ? A(0) : x;
}
template <typename A>
TORCHEXT_HD A relu_backward(A g, A y) {
  return y <= A(0) ? A(0) : g;
}

template <typename A>
TORCHEXT_HD A leaky_relu_forward(A x, A slope) {
  return x > A(0) ? x : x * slope;
}
template <typename A>
TORCHEXT_HD A leaky_relu_backward(A g, A x, A slope) {
  return x > A(0) ? g : g * slope;
}

template <typename A>
TORCHEXT_HD A sigmoid_forward(A x) {
  return A(1) / (A(1) + std::exp(-x));
}
template <typename A>
TORCHEXT_HD A sigmoid_backward(A g, A y) {
  return g * y * (A(1) - y);
}

template <typename A>
TORCHEXT_HD A tanh_forward(A x) {
  return std::tanh(x);
}
template <typename A>
TORCHEXT_HD A tanh_backward(A g, A y) {
  return g * (A(1) - y * y);
}

template <typename A>
TORCHEXT_HD A gelu_forward(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(M_SQRT1_2)));
}
template <typename A>
TORCHEXT_HD A gelu_backward(A g, A x) {
  const A cdf = A(0.5) * (A(1) + std::erf(x * A(M_SQRT1_2)));
  const A pdf = std::exp(A(-0.5) * x * x) * A(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1/sqrt(2 pi)
  return g * (cdf + x * pdf);
}

template <typename A>
TORCHEXT_HD A gelu_tanh_forward(A x) {
  const A k0 = A(M_SQRT2 * M_2_SQRTPI * 0.5), k1 = A(0.044715);  // k0 = sqrt(2/pi)
  return A(0.5) * x * (A(1) + std::tanh(k0 * (x + k1 * x * x * x)));
}
template <typename A>
TORCHEXT_HD A gelu_tanh_backward(A g, A x) {
  const A k0 = A(M_SQRT2 * M_2_SQRTPI * 0.5), k1 = A(0.044715);
  const A t = std::tanh(k0 * (x + k1 * x * x * x));
  const A dinner = k0 * (A(1) + A(3) * k1 * x * x);
  return g * (A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner);
}

template <typename A>
TORCHEXT_HD A silu_forward(A x) {
  return x / (A(1) + std::exp(-x));
}
template <typename A>
TORCHEXT_HD A silu_backward(A g, A x) {
  const A s = A(1) / (A(1) + std::exp(-x));
  return g * s * (A(1) + x * (A(1) - s));
}

}  // namespace torchext::math
