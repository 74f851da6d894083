// torchext's activations from C++: relu, leaky_relu, sigmoid, tanh, gelu, silu, and their torch::nn-style modules;
// and add. Each function calls the registered op (torchext::<name>) through the dispatcher, so it runs the same
// kernels and C++ autograd (double backward included) as torch.ops.torchext.<name> from Python. Elementwise: any shape
// and strides, the result takes the input's memory format. dtypes: float32 and float64 on CPU; float16, bfloat16,
// float32 and float64 on CUDA (add: all four on both). Source: csrc/activations_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/activation.h>
#include <torch/nn/pimpl.h>

#include <ostream>
#include <string_view>

namespace torchext {

at::Tensor relu(const at::Tensor& input);
at::Tensor leaky_relu(const at::Tensor& input, double negative_slope = 0.01);
at::Tensor sigmoid(const at::Tensor& input);
at::Tensor tanh(const at::Tensor& input);
// approximate: "none" (the erf form) or "tanh".
at::Tensor gelu(const at::Tensor& input, std::string_view approximate = "none");
at::Tensor silu(const at::Tensor& input);
// input + other, of the same shape, dtype and device (no broadcasting, no type promotion): the residual add where it
// is not fused into batch_norm_add_relu.
at::Tensor add(const at::Tensor& input, const at::Tensor& other);

namespace nn {

// torch::nn's activation modules, computed by the functions above; same options. `inplace` is accepted and ignored
// (torchext ops never write into their inputs; the result is a new tensor).
class ReLUImpl : public torch::nn::Cloneable<ReLUImpl> {
 public:
  explicit ReLUImpl(const torch::nn::ReLUOptions& options_ = {}) : options(options_) {}
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::ReLUOptions options;
};
TORCH_MODULE(ReLU);

class LeakyReLUImpl : public torch::nn::Cloneable<LeakyReLUImpl> {
 public:
  explicit LeakyReLUImpl(const torch::nn::LeakyReLUOptions& options_ = {}) : options(options_) {}
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::LeakyReLUOptions options;
};
TORCH_MODULE(LeakyReLU);

class SigmoidImpl : public torch::nn::Cloneable<SigmoidImpl> {
 public:
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
};
TORCH_MODULE(Sigmoid);

class TanhImpl : public torch::nn::Cloneable<TanhImpl> {
 public:
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
};
TORCH_MODULE(Tanh);

class GELUImpl : public torch::nn::Cloneable<GELUImpl> {
 public:
  explicit GELUImpl(torch::nn::GELUOptions options_ = {}) : options(std::move(options_)) {}
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::GELUOptions options;
};
TORCH_MODULE(GELU);

class SiLUImpl : public torch::nn::Cloneable<SiLUImpl> {
 public:
  at::Tensor forward(const at::Tensor& input);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
};
TORCH_MODULE(SiLU);

}  // namespace nn
}  // namespace torchext
