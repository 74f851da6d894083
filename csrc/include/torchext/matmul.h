// The GEMM engine from C++: matmul (torch.matmul for operands of at least 2 dimensions, batch dimensions broadcast),
// matmul_kernel (which kernel matmul would run), linear (act(input weight^T + bias), the activation fused into the
// GEMM's epilogue) and the module torchext::nn::Linear. Operands are read through their strides (transposed or
// sliced operands are not copied); every result is a new contiguous tensor. Source: csrc/matmul_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace torchext {

// The CUDA ladder, slowest first (cuda_ops/matmul_args.h); CPU tensors run "cpu".
inline constexpr const char* kMatmulKernels[] = {
    "naive", "smem_tiled", "register_blocked", "vectorized", "warp_tiled", "mma_sync", "wgmma"};
// linear's activations ("none" applies none).
inline constexpr const char* kLinearActivations[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};

// a (*, M, K) @ b ((K, N) or (*, K, N)) -> (*batch, M, N). `kernel` names one rung of the CUDA ladder (kMatmulKernels;
// "cpu" on the CPU); nullopt picks the fastest that supports the arguments. Differentiable in a and b (the backward
// runs the default kernel).
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, std::optional<std::string_view> kernel = std::nullopt);
// The kernel matmul(a, b, kernel) would run ("cpu" for CPU tensors); throws as matmul would where it cannot.
std::string matmul_kernel(const at::Tensor& a, const at::Tensor& b,
                          std::optional<std::string_view> kernel = std::nullopt);
// act(input weight^T + bias): input (*, in_features), weight (out_features, in_features), bias (out_features).
at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias = std::nullopt, std::string_view activation = "none");

namespace nn {

// torch::nn::Linear with an activation fused into the GEMM: same options, parameters ("weight", "bias"),
// initialisation and state-dict keys, plus `activation` (kLinearActivations).
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, std::string activation = "none")
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features), std::move(activation)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options_, std::string activation = "none");
  at::Tensor forward(const at::Tensor& input);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  torch::nn::LinearOptions options;
  std::string activation;
  at::Tensor weight, bias;
};
TORCH_MODULE(Linear);

}  // namespace nn
}  // namespace torchext
