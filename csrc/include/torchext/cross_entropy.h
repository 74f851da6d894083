// cross_entropy from C++: fused log-softmax + negative log-likelihood over class indices, and the module
// torchext::nn::CrossEntropyLoss. torch.nn.functional.cross_entropy's semantics for class-index targets: input (C,),
// (N, C) or (N, C, d1, ..., dk) logits, target (), (N,) or (N, d1, ..., dk) int64; class weights, ignore_index,
// label_smoothing; reduction "none" | "mean" | "sum". Arguments in the order of the schema torchext::cross_entropy
// (and of at::cross_entropy_loss). Probability targets are not supported (a floating target: c10::TypeError).
// A bad target raises c10::IndexError naming `target`; on CUDA from a later loss call or check_targets() unless
// TORCHEXT_CHECK_TARGETS=sync (csrc/target_checks.h). Source: csrc/cross_entropy_api.cpp.
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

at::Tensor cross_entropy(const at::Tensor& input, const at::Tensor& target,
                         const std::optional<at::Tensor>& weight = std::nullopt, std::string_view reduction = "mean",
                         int64_t ignore_index = -100, double label_smoothing = 0.0);

// Waits for the target checks that cross_entropy and multi_margin_loss calls on CUDA have left pending and throws
// the c10::IndexError of the oldest that found an out-of-range target. A no-op on the CPU (whose checks raise at the
// call) and under TORCHEXT_CHECK_TARGETS=sync or off.
void check_targets();

namespace nn {

// torch::nn::CrossEntropyLoss's options; `weight` is registered as the buffer "weight", as torch does.
class CrossEntropyLossImpl : public torch::nn::Cloneable<CrossEntropyLossImpl> {
 public:
  explicit CrossEntropyLossImpl(torch::nn::CrossEntropyLossOptions options_ = {});
  at::Tensor forward(const at::Tensor& input, const at::Tensor& target);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::nn::CrossEntropyLossOptions options;
  at::Tensor weight;
};
TORCH_MODULE(CrossEntropyLoss);

}  // namespace nn
}  // namespace torchext
