// Elementwise activation kernels: y = f(x) forward, grad_x = f'(saved) * grad_y backward, on flat arrays; and add,
// z = a + b (binary_kernel with a sum for its functor).
//
// Shapes: every pointer is a flat array of n elements (the caller flattens any dense layout).
// Memory traffic is the whole cost: forward reads n and writes n elements, backward reads 2n and writes n, so the
// goal is device-to-device copy bandwidth. Two kernels serve every activation through a functor:
//   unary_kernel   y = op(x)
//   binary_kernel  z = op(a, b)
// each moving 16-byte vectors (4 floats, 8 halves, 2 doubles), kIlp of them in flight per thread before the first
// is used; the last block also finishes the n % vector-width tail element by element. The vector path needs every
// pointer 16-byte aligned; a misaligned view (a slice at an odd offset) takes the one-element path.
// Each block handles one chunk of kThreads x kIlp vectors and exits, as ATen's vectorized kernel does: 2^28 elements
// make 65536 blocks. A resident grid walking the array (the previous scheme) ran at 94-97% of copy bandwidth on an
// H100, one chunk per block at 100-102% (benchmarks/elementwise_check.cu). Grids larger than CUDA allows loop over
// the chunks.
#include "activation_math.h"
#include "activations.cuh"
#include "common.cuh"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr int kIlp = 2;
constexpr int64_t kMaxGrid = 0x7fffffff;

// Vector index i of the chunk `c` for the thread's j-th load: consecutive threads take consecutive vectors.
__device__ __forceinline__ int64_t chunk_index(int64_t c, int j) {
  return c * (kThreads * kIlp) + j * kThreads + threadIdx.x;
}

template <typename T, int VEC, typename Op>
__global__ void __launch_bounds__(kThreads) unary_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, Op op) {
  using V = Vec<T, VEC>;
  const int64_t nvec = n / VEC;
  const int64_t nchunks = (nvec + kThreads * kIlp - 1) / (kThreads * kIlp);
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    V in[kIlp];
#pragma unroll
    for (int j = 0; j < kIlp; ++j) {
      const int64_t i = chunk_index(c, j);
      if (i < nvec) in[j] = reinterpret_cast<const V*>(x)[i];
    }
#pragma unroll
    for (int j = 0; j < kIlp; ++j) {
      const int64_t i = chunk_index(c, j);
      if (i < nvec) {
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_acc<T>(op(to_acc(in[j].v[k])));
        reinterpret_cast<V*>(y)[i] = out;
      }
    }
  }
  if (blockIdx.x == gridDim.x - 1) {
    for (int64_t i = nvec * VEC + threadIdx.x; i < n; i += kThreads) y[i] = from_acc<T>(op(to_acc(x[i])));
  }
}

// a_broadcast: `a` is one element standing for all n (the gradient of a sum or a mean, expanded), read once
// instead of being copied out to n elements first.
template <typename T, int VEC, typename Op>
__global__ void __launch_bounds__(kThreads)
    binary_kernel(const T* __restrict__ a, bool a_broadcast, const T* __restrict__ b, T* __restrict__ z, int64_t n,
                  Op op) {
  using V = Vec<T, VEC>;
  const int64_t nvec = n / VEC;
  const int64_t nchunks = (nvec + kThreads * kIlp - 1) / (kThreads * kIlp);
  V a_all;
  if (a_broadcast) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) a_all.v[k] = a[0];
  }
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    V va[kIlp], vb[kIlp];
#pragma unroll
    for (int j = 0; j < kIlp; ++j) {
      const int64_t i = chunk_index(c, j);
      if (i < nvec) {
        va[j] = a_broadcast ? a_all : reinterpret_cast<const V*>(a)[i];
        vb[j] = reinterpret_cast<const V*>(b)[i];
      }
    }
#pragma unroll
    for (int j = 0; j < kIlp; ++j) {
      const int64_t i = chunk_index(c, j);
      if (i < nvec) {
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_acc<T>(op(to_acc(va[j].v[k]), to_acc(vb[j].v[k])));
        reinterpret_cast<V*>(z)[i] = out;
      }
    }
  }
  if (blockIdx.x == gridDim.x - 1) {
    for (int64_t i = nvec * VEC + threadIdx.x; i < n; i += kThreads) {
      z[i] = from_acc<T>(op(to_acc(a[a_broadcast ? 0 : i]), to_acc(b[i])));
    }
  }
}

// One block per chunk of kThreads x kIlp vectors of VEC elements (at least one block, for the tail).
template <int VEC>
unsigned chunk_grid(int64_t n) {
  const int64_t per_block = static_cast<int64_t>(kThreads) * kIlp;
  const int64_t chunks = (n / VEC + per_block - 1) / per_block;
  return static_cast<unsigned>(chunks < 1 ? 1 : (chunks < kMaxGrid ? chunks : kMaxGrid));
}

template <typename T, typename Op>
cudaError_t launch_unary(const T* x, T* y, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  if (aligned_to(x, 16) && aligned_to(y, 16)) {
    unary_kernel<T, V><<<chunk_grid<V>(n), kThreads, 0, stream>>>(x, y, n, op);
  } else {
    unary_kernel<T, 1><<<chunk_grid<1>(n), kThreads, 0, stream>>>(x, y, n, op);
  }
  return cudaGetLastError();
}

template <typename T, typename Op>
cudaError_t launch_binary(const T* a, bool a_broadcast, const T* b, T* z, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  if ((a_broadcast || aligned_to(a, 16)) && aligned_to(b, 16) && aligned_to(z, 16)) {
    binary_kernel<T, V><<<chunk_grid<V>(n), kThreads, 0, stream>>>(a, a_broadcast, b, z, n, op);
  } else {
    binary_kernel<T, 1><<<chunk_grid<1>(n), kThreads, 0, stream>>>(a, a_broadcast, b, z, n, op);
  }
  return cudaGetLastError();
}

// One functor per activation and direction; A is the computation type.
template <typename A>
struct ReluForward {
  __device__ A operator()(A x) const { return math::relu_forward(x); }
};
template <typename A>
struct ReluBackward {
  __device__ A operator()(A g, A y) const { return math::relu_backward(g, y); }
};
template <typename A>
struct LeakyReluForward {
  A slope;
  __device__ A operator()(A x) const { return math::leaky_relu_forward(x, slope); }
};
template <typename A>
struct LeakyReluBackward {
  A slope;
  __device__ A operator()(A g, A x) const { return math::leaky_relu_backward(g, x, slope); }
};
template <typename A>
struct SigmoidForward {
  __device__ A operator()(A x) const { return math::sigmoid_forward(x); }
};
template <typename A>
struct SigmoidBackward {
  __device__ A operator()(A g, A y) const { return math::sigmoid_backward(g, y); }
};
template <typename A>
struct TanhForward {
  __device__ A operator()(A x) const { return math::tanh_forward(x); }
};
template <typename A>
struct TanhBackward {
  __device__ A operator()(A g, A y) const { return math::tanh_backward(g, y); }
};
template <typename A>
struct GeluForward {
  __device__ A operator()(A x) const { return math::gelu_forward(x); }
};
template <typename A>
struct GeluBackward {
  __device__ A operator()(A g, A x) const { return math::gelu_backward(g, x); }
};
template <typename A>
struct GeluTanhForward {
  __device__ A operator()(A x) const { return math::gelu_tanh_forward(x); }
};
template <typename A>
struct GeluTanhBackward {
  __device__ A operator()(A g, A x) const { return math::gelu_tanh_backward(g, x); }
};
template <typename A>
struct SiluForward {
  __device__ A operator()(A x) const { return math::silu_forward(x); }
};
template <typename A>
struct SiluBackward {
  __device__ A operator()(A g, A x) const { return math::silu_backward(g, x); }
};
template <typename A>
struct AddForward {
  __device__ A operator()(A a, A b) const { return a + b; }
};

}  // namespace

template <typename T>
cudaError_t relu_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  return launch_unary(x, y, n, ReluForward<acc_t<T>>{}, stream);
}
template <typename T>
cudaError_t relu_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream) {
  return launch_binary(grad_y, grad_y_broadcast, y, grad_x, n, ReluBackward<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t leaky_relu_forward(const T* x, T* y, int64_t n, double negative_slope, cudaStream_t stream) {
  return launch_unary(x, y, n, LeakyReluForward<acc_t<T>>{static_cast<acc_t<T>>(negative_slope)}, stream);
}
template <typename T>
cudaError_t leaky_relu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, double negative_slope,
                                bool grad_y_broadcast, cudaStream_t stream) {
  return launch_binary(grad_y, grad_y_broadcast, x, grad_x, n,
                       LeakyReluBackward<acc_t<T>>{static_cast<acc_t<T>>(negative_slope)}, stream);
}

template <typename T>
cudaError_t sigmoid_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  return launch_unary(x, y, n, SigmoidForward<acc_t<T>>{}, stream);
}
template <typename T>
cudaError_t sigmoid_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                             cudaStream_t stream) {
  return launch_binary(grad_y, grad_y_broadcast, y, grad_x, n, SigmoidBackward<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t tanh_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  return launch_unary(x, y, n, TanhForward<acc_t<T>>{}, stream);
}
template <typename T>
cudaError_t tanh_backward(const T* grad_y, const T* y, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream) {
  return launch_binary(grad_y, grad_y_broadcast, y, grad_x, n, TanhBackward<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t gelu_forward(const T* x, T* y, int64_t n, bool tanh_approx, cudaStream_t stream) {
  return tanh_approx ? launch_unary(x, y, n, GeluTanhForward<acc_t<T>>{}, stream)
                     : launch_unary(x, y, n, GeluForward<acc_t<T>>{}, stream);
}
template <typename T>
cudaError_t gelu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, bool tanh_approx, bool grad_y_broadcast,
                          cudaStream_t stream) {
  return tanh_approx ? launch_binary(grad_y, grad_y_broadcast, x, grad_x, n, GeluTanhBackward<acc_t<T>>{}, stream)
                     : launch_binary(grad_y, grad_y_broadcast, x, grad_x, n, GeluBackward<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t silu_forward(const T* x, T* y, int64_t n, cudaStream_t stream) {
  return launch_unary(x, y, n, SiluForward<acc_t<T>>{}, stream);
}
template <typename T>
cudaError_t silu_backward(const T* grad_y, const T* x, T* grad_x, int64_t n, bool grad_y_broadcast,
                          cudaStream_t stream) {
  return launch_binary(grad_y, grad_y_broadcast, x, grad_x, n, SiluBackward<acc_t<T>>{}, stream);
}

template <typename T>
cudaError_t add_forward(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  return launch_binary(a, false, b, out, n, AddForward<acc_t<T>>{}, stream);
}

#define TORCHEXT_INSTANTIATE_ACTIVATIONS(T)                                                                 \
  template cudaError_t relu_forward<T>(const T*, T*, int64_t, cudaStream_t);                                \
  template cudaError_t relu_backward<T>(const T*, const T*, T*, int64_t, bool, cudaStream_t);               \
  template cudaError_t leaky_relu_forward<T>(const T*, T*, int64_t, double, cudaStream_t);                  \
  template cudaError_t leaky_relu_backward<T>(const T*, const T*, T*, int64_t, double, bool, cudaStream_t); \
  template cudaError_t sigmoid_forward<T>(const T*, T*, int64_t, cudaStream_t);                             \
  template cudaError_t sigmoid_backward<T>(const T*, const T*, T*, int64_t, bool, cudaStream_t);            \
  template cudaError_t tanh_forward<T>(const T*, T*, int64_t, cudaStream_t);                                \
  template cudaError_t tanh_backward<T>(const T*, const T*, T*, int64_t, bool, cudaStream_t);               \
  template cudaError_t gelu_forward<T>(const T*, T*, int64_t, bool, cudaStream_t);                          \
  template cudaError_t gelu_backward<T>(const T*, const T*, T*, int64_t, bool, bool, cudaStream_t);         \
  template cudaError_t silu_forward<T>(const T*, T*, int64_t, cudaStream_t);                                \
  template cudaError_t silu_backward<T>(const T*, const T*, T*, int64_t, bool, cudaStream_t);               \
  template cudaError_t add_forward<T>(const T*, const T*, T*, int64_t, cudaStream_t);

TORCHEXT_INSTANTIATE_ACTIVATIONS(float)
TORCHEXT_INSTANTIATE_ACTIVATIONS(double)
TORCHEXT_INSTANTIATE_ACTIVATIONS(__half)
TORCHEXT_INSTANTIATE_ACTIVATIONS(__nv_bfloat16)

}  // namespace torchext::cuda_ops
