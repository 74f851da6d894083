// mse_loss, binary_cross_entropy_with_logits and multi_margin_loss from C++, and their modules. Semantics are
// torch.nn.functional's (mse_loss's weighted mean: sum(w (x - y)^2) / sum(w)); reduction "none" | "mean" | "sum".
// Arguments in the order of the schemas (torchext::mse_loss, ...). Gradients with respect to `weight` and
// `pos_weight` are not implemented (c10::NotImplementedError at backward). Source: csrc/losses_api.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/loss.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

namespace torchext {

// weight: input's shape (optional). A target of another shape is broadcast against input with a warning, as
// torch.nn.functional.mse_loss does.
at::Tensor mse_loss(const at::Tensor& input, const at::Tensor& target,
                    const std::optional<at::Tensor>& weight = std::nullopt, std::string_view reduction = "mean");
// target: input's shape; weight and pos_weight broadcast to it (pos_weight typically one value per class).
at::Tensor binary_cross_entropy_with_logits(const at::Tensor& input, const at::Tensor& target,
                                            const std::optional<at::Tensor>& weight = std::nullopt,
                                            const std::optional<at::Tensor>& pos_weight = std::nullopt,
                                            std::string_view reduction = "mean");
// input (N, C) or (C,), target (N,) or () int64 class indices; p 1 or 2.
at::Tensor multi_margin_loss(const at::Tensor& input, const at::Tensor& target, int64_t p = 1, double margin = 1.0,
                             const std::optional<at::Tensor>& weight = std::nullopt,
                             std::string_view reduction = "mean");

namespace nn {

class MSELossImpl : public torch::nn::Cloneable<MSELossImpl> {
 public:
  explicit MSELossImpl(torch::nn::MSELossOptions options_ = {}) : options(std::move(options_)) {}
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  torch::nn::MSELossOptions options;
};
TORCH_MODULE(MSELoss);

// `weight` and `pos_weight` are registered as buffers, as torch does.
class BCEWithLogitsLossImpl : public torch::nn::Cloneable<BCEWithLogitsLossImpl> {
 public:
  explicit BCEWithLogitsLossImpl(torch::nn::BCEWithLogitsLossOptions options_ = {});
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::nn::BCEWithLogitsLossOptions options;
  at::Tensor weight, pos_weight;
};
TORCH_MODULE(BCEWithLogitsLoss);

// `weight` is registered as a buffer, as torch does.
class MultiMarginLossImpl : public torch::nn::Cloneable<MultiMarginLossImpl> {
 public:
  explicit MultiMarginLossImpl(torch::nn::MultiMarginLossOptions options_ = {});
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::nn::MultiMarginLossOptions options;
  at::Tensor weight;
};
TORCH_MODULE(MultiMarginLoss);

}  // namespace nn
}  // namespace torchext
