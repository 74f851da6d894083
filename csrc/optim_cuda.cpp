// CUDA wrapper of the optimizer steps: the checks shared with the CPU backend (csrc/optim_cpu.cpp), device guard,
// dtype dispatch, then cuda_ops/optim.cu's multi-tensor launcher on the current stream. Nothing synchronizes the
// host: with `lr_tensor` the kernel reads the learning rate on the device, so the step can be captured into a CUDA
// graph and replayed while a scheduler updates that tensor. With autocast_copies the kernel also writes the params'
// autocast copies (csrc/autocast_copies.h), which the op's Autograd kernel confirms once the versions are bumped.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "autocast_copies.h"
#include "cuda_utils.h"
#include "optim.cuh"
#include "optim.h"

namespace torchext {
namespace {

void sgd_cuda(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum,
              double dampening, double weight_decay, bool nesterov, bool maximize, bool is_first_step,
              const std::optional<at::Tensor>& lr_tensor, std::optional<at::ScalarType> autocast_copies) {
  const char* op = "torchext::sgd_";
  const std::vector<at::Tensor> g =
      optim::check_sgd_args(op, params, grads, momentum_buffers, momentum, lr_tensor, autocast_copies);
  if (params.empty()) return;
  c10::cuda::CUDAGuard guard(params[0].device());
  // The autocast copies this step writes (float32 params only). Under a stream capture none: the graph's replays
  // would change the params without a version bump, so their copies are dropped for good. A step that writes no
  // copies makes the params' existing ones stale.
  std::vector<at::Tensor> copies;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    autocast_copies::forget(params);
  } else if (autocast_copies.has_value() && params[0].scalar_type() == at::kFloat) {
    copies.reserve(params.size());
    for (const at::Tensor& p : params) copies.push_back(autocast_copies::for_step(p, *autocast_copies));
  } else {
    autocast_copies::invalidate(params);
  }
  cuda_ops::SgdHyper h;
  h.lr = lr;
  h.momentum = momentum;
  h.dampening = dampening;
  h.weight_decay = weight_decay;
  h.nesterov = nesterov;
  h.maximize = maximize;
  h.is_first_step = is_first_step;
  if (!copies.empty()) {
    h.copy_dtype = *autocast_copies == at::kBFloat16 ? cuda_ops::SgdCopy::bfloat16 : cuda_ops::SgdCopy::float16;
  }
  if (lr_tensor.has_value() && lr_tensor->defined()) {
    if (lr_tensor->scalar_type() == at::kFloat) {
      h.lr_device_f32 = lr_tensor->const_data_ptr<float>();
    } else {
      h.lr_device_f64 = lr_tensor->const_data_ptr<double>();
    }
  }
  TORCHEXT_DISPATCH_CUDA_FLOATING(params[0].scalar_type(), "torchext_sgd_cuda", [&] {
    using T = cuda_t<scalar_t>;
    std::vector<cuda_ops::SgdTensor<T>> list;
    list.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      T* buf = nullptr;
      if (momentum != 0) {
        at::Tensor b = momentum_buffers[i];
        buf = cuda_mutable_ptr<scalar_t>(b);
      }
      void* copy = !copies.empty() && copies[i].defined() ? copies[i].data_ptr() : nullptr;
      list.push_back({cuda_mutable_ptr<scalar_t>(p), cuda_ptr<scalar_t>(g[i]), buf, p.numel(), copy});
    }
    C10_CUDA_CHECK(cuda_ops::sgd_step<T>(list.data(), static_cast<int64_t>(list.size()), h, current_stream()));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CUDA, m) { m.impl("sgd_", &sgd_cuda); }

}  // namespace torchext
