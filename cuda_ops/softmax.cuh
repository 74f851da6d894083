// Softmax and log-softmax over the last dimension of a row-major (rows, cols) array, forward and backward.
// T is float, double, __half or __nv_bfloat16; __half and __nv_bfloat16 compute in float32. Every launcher runs on
// `stream` and returns the launch's error; rows == 0 or cols == 0 launches nothing.
//
//   forward:   y = softmax(x) = exp(x - max) / sum(exp(x - max))       log: y = x - max - log(sum(exp(x - max)))
//   backward:  grad_x = y * (grad_y - sum(grad_y * y))                 log: grad_x = grad_y - exp(y) * sum(grad_y)
//
// `path` picks one kernel of cuda_ops/softmax.cu (for benchmarks and tests); kAuto picks by row width. A forced path
// that cannot take `cols` returns cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchext::cuda_ops {

enum class SoftmaxPath {
  kAuto,
  kTile,     // cols <= 32: a tile of rows staged in shared memory, one thread per row
  kWarp,     // cols <= 1024: 8 to 32 lanes of a warp per row, the row in registers
  kBlock,    // cols <= 32768 (16384 in float64): one block per row, the row in registers (and shared memory)
  kTwoPass,  // any cols: one block per row, reads the row twice
};

template <typename T>
cudaError_t softmax_forward(const T* x, T* y, int64_t rows, int64_t cols, bool log, cudaStream_t stream,
                            SoftmaxPath path = SoftmaxPath::kAuto);

template <typename T>
cudaError_t softmax_backward(const T* grad_y, const T* y, T* grad_x, int64_t rows, int64_t cols, bool log,
                             cudaStream_t stream, SoftmaxPath path = SoftmaxPath::kAuto);

}  // namespace torchext::cuda_ops
