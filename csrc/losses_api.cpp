// The C++ API of the losses (csrc/include/torchext/losses.h). mse_loss's broadcasting of a target of another shape
// happens here, as in torchext/ops/losses.py (the op itself takes a target of input's shape), with its messages.
#include <ATen/ATen.h>
#include <torchext/losses.h>

#include "api.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using MseLossSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, c10::string_view);
using BceSignature = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, const OptionalTensor&,
                            c10::string_view);
using MultiMarginSignature = Tensor(const Tensor&, const Tensor&, int64_t, double, const OptionalTensor&,
                                    c10::string_view);

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, const OptionalTensor& weight, std::string_view reduction) {
  static const auto op = find_op<MseLossSignature>("torchext::mse_loss");
  check_defined("mse_loss", "input", input);
  check_defined("mse_loss", "target", target);
  if (target.sizes() == input.sizes()) return op.call(input, target, weight, reduction);
  TORCH_WARN("Using a target size (", target.sizes(), ") that is different to the input size (", input.sizes(),
             "). This will likely lead to incorrect results due to broadcasting. Please ensure they have the same "
             "size.");
  const bool has_weight = weight.has_value() && weight->defined();
  TORCH_CHECK_VALUE(!has_weight || weight->sizes() == input.sizes(),
                    "torchext mse_loss(): `weight` must have the input's size ", python_shape(input.sizes()), ", got ",
                    python_shape(weight->sizes()));
  std::vector<Tensor> broadcast;
  try {
    broadcast = at::broadcast_tensors({input, target});
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "torchext mse_loss(): `target` of shape ", python_shape(target.sizes()),
                " does not broadcast against `input` of shape ", python_shape(input.sizes()));
  }
  const Tensor x = broadcast[0].contiguous(), y = broadcast[1].contiguous();
  if (!has_weight) return op.call(x, y, std::nullopt, reduction);
  const Tensor expanded = weight->expand(x.sizes()).contiguous();
  // The weighted mean divides by the sum of the weight as given, not of its broadcast copy (as torch's does).
  if (reduction == "mean") return op.call(x, y, expanded, "sum") / weight->sum();
  return op.call(x, y, expanded, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const OptionalTensor& weight,
                                        const OptionalTensor& pos_weight, std::string_view reduction) {
  static const auto op = find_op<BceSignature>("torchext::binary_cross_entropy_with_logits");
  check_defined("binary_cross_entropy_with_logits", "input", input);
  check_defined("binary_cross_entropy_with_logits", "target", target);
  return op.call(input, target, weight, pos_weight, reduction);
}

Tensor multi_margin_loss(const Tensor& input, const Tensor& target, int64_t p, double margin,
                         const OptionalTensor& weight, std::string_view reduction) {
  static const auto op = find_op<MultiMarginSignature>("torchext::multi_margin_loss");
  check_defined("multi_margin_loss", "input", input);
  check_defined("multi_margin_loss", "target", target);
  return op.call(input, target, p, margin, weight, reduction);
}

namespace nn {

Tensor MSELossImpl::forward(const Tensor& input, const Tensor& target) {
  return torchext::mse_loss(input, target, std::nullopt, reduction_name(options.reduction()));
}
void MSELossImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::MSELoss()"; }

BCEWithLogitsLossImpl::BCEWithLogitsLossImpl(torch::nn::BCEWithLogitsLossOptions options_)
    : options(std::move(options_)) {
  reset();
}
void BCEWithLogitsLossImpl::reset() {
  weight = register_buffer("weight", options.weight());
  pos_weight = register_buffer("pos_weight", options.pos_weight());
}
Tensor BCEWithLogitsLossImpl::forward(const Tensor& input, const Tensor& target) {
  return torchext::binary_cross_entropy_with_logits(input, target, as_optional(weight), as_optional(pos_weight),
                                                    reduction_name(options.reduction()));
}
void BCEWithLogitsLossImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::BCEWithLogitsLoss()"; }

MultiMarginLossImpl::MultiMarginLossImpl(torch::nn::MultiMarginLossOptions options_) : options(std::move(options_)) {
  reset();
}
void MultiMarginLossImpl::reset() { weight = register_buffer("weight", options.weight()); }
Tensor MultiMarginLossImpl::forward(const Tensor& input, const Tensor& target) {
  return torchext::multi_margin_loss(input, target, options.p(), options.margin(), as_optional(weight),
                                     reduction_name(options.reduction()));
}
void MultiMarginLossImpl::pretty_print(std::ostream& stream) const {
  stream << "torchext::nn::MultiMarginLoss(p=" << options.p() << ", margin=" << options.margin() << ")";
}

}  // namespace nn
}  // namespace torchext
