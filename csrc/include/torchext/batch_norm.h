// Batch normalization from C++: batch_norm (nn.functional.batch_norm's semantics), batch_norm_relu
// (relu(batch_norm(...)) in one pass) and batch_norm_add_relu (relu(batch_norm(input) + residual) in one pass), and
// the modules torchext::nn::BatchNorm2d (with an optional fused relu), torchext::nn::BatchNormAddReLU2d and
// torchext::nn::BatchNorm1d. input
// (N, C, ...); weight, bias, running_mean and running_var (C,), each optional. In training the batch's statistics
// normalize (biased variance) and the running buffers, when given, are updated in place (momentum is the
// exponential-average factor; running_var tracks the unbiased variance); in eval the running statistics normalize.
// `sum` and `sum_sq` (training only): input's per-channel sum and sum of squares over (N, H, W), e.g. from
// conv2d_stats, in place of the statistics pass. The output takes input's suggested memory format (csrc/batch_norm.h).
// Source: csrc/batch_norm_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace torchext {

// The CUDA ladder, slowest first (cuda_ops/batch_norm_args.h); CPU tensors run "cpu".
inline constexpr const char* kBatchNormKernels[] = {"simple", "vectorized", "fused"};

// `kernel` names one version of the CUDA ladder (kBatchNormKernels; "cpu" on the CPU; the schema calls it
// `variant`); nullopt picks the fastest that supports the arguments.
at::Tensor batch_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                      const std::optional<at::Tensor>& running_var, bool training, double momentum = 0.1,
                      double eps = 1e-5, const std::optional<at::Tensor>& sum = std::nullopt,
                      const std::optional<at::Tensor>& sum_sq = std::nullopt,
                      std::optional<std::string_view> kernel = std::nullopt);
// relu(batch_norm(...)); the backward reads a 1-bit mask, never the output.
at::Tensor batch_norm_relu(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                           const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                           const std::optional<at::Tensor>& running_var, bool training, double momentum = 0.1,
                           double eps = 1e-5, const std::optional<at::Tensor>& sum = std::nullopt,
                           const std::optional<at::Tensor>& sum_sq = std::nullopt,
                           std::optional<std::string_view> kernel = std::nullopt);
// relu(batch_norm(input, ...) + residual); residual is shaped like input and gets its gradient from the same pass.
at::Tensor batch_norm_add_relu(const at::Tensor& input, const at::Tensor& residual,
                               const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                               const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, bool training, double momentum = 0.1,
                               double eps = 1e-5, const std::optional<at::Tensor>& sum = std::nullopt,
                               const std::optional<at::Tensor>& sum_sq = std::nullopt,
                               std::optional<std::string_view> kernel = std::nullopt);

namespace nn {

// torch::nn::BatchNorm2d computed by torchext's batch_norm: the same options, parameters ("weight", "bias"), buffers
// ("running_mean", "running_var", "num_batches_tracked"), initialisation and state-dict keys (torch's own
// BatchNormImplBase holds them), the same training / eval behaviour (momentum nullopt: the cumulative average over
// num_batches_tracked; track_running_stats false: the batch's statistics in eval too); plus `activation` ("none" or
// "relu", fused: batch_norm_relu). Input (N, C, H, W).
class BatchNorm2dImpl : public torch::nn::BatchNormImplBase<2, BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(int64_t num_features, std::string activation = "none")
      : BatchNorm2dImpl(torch::nn::BatchNormOptions(num_features), std::move(activation)) {}
  explicit BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_, std::string activation = "none");
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;
  std::string activation;

 protected:
  void _check_input_dim(const at::Tensor& input) override;
};
TORCH_MODULE(BatchNorm2d);

// relu(BatchNorm2d(input) + residual) in one pass, a residual block's tail: forward(input, residual). Parameters,
// buffers and state-dict keys are torch::nn::BatchNorm2d's.
class BatchNormAddReLU2dImpl : public torch::nn::BatchNormImplBase<2, BatchNormAddReLU2dImpl> {
 public:
  explicit BatchNormAddReLU2dImpl(int64_t num_features)
      : BatchNormAddReLU2dImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNormAddReLU2dImpl(const torch::nn::BatchNormOptions& options_);
  at::Tensor forward(const at::Tensor& input, const at::Tensor& residual);
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) override;
};
TORCH_MODULE(BatchNormAddReLU2d);

// torch::nn::BatchNorm1d computed by torchext's batch_norm, as BatchNorm2d is torch::nn::BatchNorm2d's (the same
// options, parameters, buffers, state-dict keys and behaviour). Input (N, C) or (N, C, L).
class BatchNorm1dImpl : public torch::nn::BatchNormImplBase<1, BatchNorm1dImpl> {
 public:
  explicit BatchNorm1dImpl(int64_t num_features) : BatchNorm1dImpl(torch::nn::BatchNormOptions(num_features)) {}
  explicit BatchNorm1dImpl(const torch::nn::BatchNormOptions& options_);
  at::Tensor forward(const at::Tensor& input);
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) override;
};
TORCH_MODULE(BatchNorm1d);

}  // namespace nn
}  // namespace torchext
