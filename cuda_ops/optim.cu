// Optimizer steps (cuda_ops/optim.cuh). torch.optim.SGD's foreach form runs the update as four to six passes over
// each parameter list (the weight decay's add, the momentum's mul and add, Nesterov's add, the parameter's add), each
// a multi-tensor launch; here one pass reads param, grad and buffer once and writes param and buffer once, for up to
// 48 tensors per launch: the 62 tensors of ResNet-18 (11.2 M parameters) take two launches (H200: 74 us of GPU time
// against the foreach form's 196 in six kernels, benchmarks/results/optim_gpu_h200.md).
//
// Multi-tensor launch: the kernel's parameter block carries up to kTensors tensors' pointers and sizes and a table of
// up to kBlocks (tensor, chunk) pairs, one per block; a block updates kChunk elements of one tensor, with 16-byte
// loads and stores where the tensor's three arrays are 16-byte aligned. The launcher packs the list into as many such
// launches as it needs. No reduction: the result does not depend on the packing. With SgdHyper::copy_dtype, a float
// param's updated value is also written, rounded, into its copy (the autocast copies, csrc/autocast_copies.h): one
// 2-byte store more per element, where CUDA autocast would otherwise read the param and write the cast in the next
// forward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common.cuh"
#include "optim.cuh"
#include "optim_math.h"

namespace torchext::cuda_ops {
namespace {

constexpr int kThreads = 512;
constexpr int kTensors = 48;       // per launch: 48 x 32 bytes of pointers and sizes
constexpr int kBlocks = 320;       // per launch: the (tensor, chunk) table, 6 bytes a block
constexpr int64_t kChunk = 65536;  // elements per block: 128 a thread
static_assert(kTensors <= 32767, "the block table stores tensor indices as int16_t");

template <typename T>
struct SgdBatch {
  T* param[kTensors];
  const T* grad[kTensors];
  T* buf[kTensors];
  void* copy[kTensors];
  int64_t n[kTensors];
  bool vec[kTensors];  // param, grad, buffer and copy all 16-byte aligned
  int16_t tensor[kBlocks];
  int32_t chunk[kBlocks];
};
// The kernel's parameters must fit the 4 KiB every supported architecture and toolkit accepts.
static_assert(sizeof(SgdBatch<double>) + sizeof(SgdHyper) <= 4096, "SgdBatch too large for a kernel parameter");

// The updated float param element written to its low-precision copy: round to nearest even, as ATen's casts.
__device__ inline void write_copy(void* copy, int64_t j, float v, SgdCopy dtype) {
  if (dtype == SgdCopy::bfloat16) {
    static_cast<__nv_bfloat16*>(copy)[j] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(copy)[j] = __float2half_rn(v);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) sgd_kernel(const SgdBatch<T> batch, const SgdHyper h) {
  using A = acc_t<T>;
  const int t = batch.tensor[blockIdx.x];
  const int64_t start = int64_t(batch.chunk[blockIdx.x]) * kChunk;
  const int64_t n = batch.n[t];
  const int64_t end = n < start + kChunk ? n : start + kChunk;
  T* __restrict__ param = batch.param[t];
  const T* __restrict__ grad = batch.grad[t];
  T* __restrict__ buf = batch.buf[t];
  void* const copy = std::is_same_v<T, float> && h.copy_dtype != SgdCopy::none ? batch.copy[t] : nullptr;
  const double lr = h.lr_device_f32 != nullptr   ? double(*h.lr_device_f32)
                    : h.lr_device_f64 != nullptr ? *h.lr_device_f64
                                                 : h.lr;
  const math::SgdUpdate<T, A> up{A(lr),      A(h.momentum), A(h.dampening),  A(h.weight_decay),
                                 h.nesterov, h.maximize,    h.is_first_step, buf != nullptr};
  constexpr int V = kVec16<T>;
  int64_t i = start;
  if (batch.vec[t]) {  // start is a multiple of kChunk, hence of V: [start, vend) is whole vectors
    const int64_t vend = start + (end - start) / V * V;
    for (int64_t j = start + int64_t(threadIdx.x) * V; j < vend; j += int64_t(kThreads) * V) {
      Vec<T, V> p = *reinterpret_cast<const Vec<T, V>*>(param + j);
      const Vec<T, V> g = *reinterpret_cast<const Vec<T, V>*>(grad + j);
      Vec<T, V> b;
      if (buf != nullptr) b = *reinterpret_cast<const Vec<T, V>*>(buf + j);
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = up(p.v[k], g.v[k], b.v[k]);
      *reinterpret_cast<Vec<T, V>*>(param + j) = p;
      if (buf != nullptr) *reinterpret_cast<Vec<T, V>*>(buf + j) = b;
      if constexpr (std::is_same_v<T, float>) {
        if (copy != nullptr) {
#pragma unroll
          for (int k = 0; k < V; ++k) write_copy(copy, j + k, p.v[k], h.copy_dtype);
        }
      }
    }
    i = vend;
  }
  for (int64_t j = i + threadIdx.x; j < end; j += kThreads) {
    T b = buf != nullptr ? buf[j] : T{};
    const T v = up(param[j], grad[j], b);
    param[j] = v;
    if (buf != nullptr) buf[j] = b;
    if constexpr (std::is_same_v<T, float>) {
      if (copy != nullptr) write_copy(copy, j, v, h.copy_dtype);
    }
  }
}

}  // namespace

template <typename T>
cudaError_t sgd_step(const SgdTensor<T>* tensors, int64_t count, const SgdHyper& hyper, cudaStream_t stream) {
  SgdBatch<T> batch{};
  int nt = 0, nb = 0;
  auto launch = [&]() -> cudaError_t {
    if (nb == 0) {
      nt = 0;
      return cudaSuccess;
    }
    sgd_kernel<T><<<nb, kThreads, 0, stream>>>(batch, hyper);
    nt = nb = 0;
    return cudaGetLastError();
  };
  for (int64_t k = 0; k < count; ++k) {
    const SgdTensor<T>& s = tensors[k];
    if (s.n <= 0) continue;
    if (nt == kTensors) {
      if (cudaError_t e = launch(); e != cudaSuccess) return e;
    }
    auto put = [&](int slot) {
      batch.param[slot] = s.param;
      batch.grad[slot] = s.grad;
      batch.buf[slot] = s.momentum_buffer;
      batch.copy[slot] = s.copy;
      batch.n[slot] = s.n;
      batch.vec[slot] = aligned_to(s.param, 16) && aligned_to(s.grad, 16) &&
                        (s.momentum_buffer == nullptr || aligned_to(s.momentum_buffer, 16)) &&
                        (s.copy == nullptr || aligned_to(s.copy, 16));
    };
    put(nt);
    const int64_t chunks = (s.n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (nb == kBlocks) {
        // The table is full mid-tensor: launch, and carry this tensor over as the next launch's first.
        if (cudaError_t e = launch(); e != cudaSuccess) return e;
        put(0);
      }
      batch.tensor[nb] = static_cast<int16_t>(nt);
      batch.chunk[nb] = static_cast<int32_t>(c);
      ++nb;
    }
    ++nt;
  }
  return launch();
}

#define TORCHEXT_SGD_INSTANTIATE(T) \
  template cudaError_t sgd_step<T>(const SgdTensor<T>*, int64_t, const SgdHyper&, cudaStream_t);
TORCHEXT_SGD_INSTANTIATE(float)
TORCHEXT_SGD_INSTANTIATE(double)
TORCHEXT_SGD_INSTANTIATE(__half)
TORCHEXT_SGD_INSTANTIATE(__nv_bfloat16)
#undef TORCHEXT_SGD_INSTANTIATE

}  // namespace torchext::cuda_ops
