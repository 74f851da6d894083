// Elementwise activations, forward and backward, and add, on flat arrays of n elements.
// T is float, double, __half or __nv_bfloat16. Every launcher runs on `stream` and returns the launch's error.
// The backward launchers take the saved tensor the derivative needs: the output y for relu, sigmoid and tanh, the
// input x for leaky_relu, gelu and silu (cuda_ops/activation_math.h), and grad_y_broadcast: true when grad_y is
// one element that stands for all n (an expanded gradient), read in place of n.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchext::cuda_ops {

template <typename T>
cudaError_t relu_forward(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t relu_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream);

template <typename T>
cudaError_t leaky_relu_forward(const T* x, T* y, int64_t n, double negative_slope, cudaStream_t stream);
template <typename T>
cudaError_t leaky_relu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, double negative_slope,
                                bool grad_y_broadcast, cudaStream_t stream);

template <typename T>
cudaError_t sigmoid_forward(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t sigmoid_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                             cudaStream_t stream);

template <typename T>
cudaError_t tanh_forward(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t tanh_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream);

// tanh_approx selects gelu(approximate='tanh').
template <typename T>
cudaError_t gelu_forward(const T* x, T* y, int64_t n, bool tanh_approx, cudaStream_t stream);
template <typename T>
cudaError_t gelu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, bool tanh_approx, bool grad_y_broadcast,
                          cudaStream_t stream);

template <typename T>
cudaError_t silu_forward(const T* x, T* y, int64_t n, cudaStream_t stream);
template <typename T>
cudaError_t silu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream);

// out = a + b, the half types added in float32 and rounded once (as torch's add).
template <typename T>
cudaError_t add_forward(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream);

}  // namespace torchext::cuda_ops
