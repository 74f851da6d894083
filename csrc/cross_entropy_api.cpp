// The C++ API of cross_entropy (csrc/include/torchext/cross_entropy.h). The registered op takes (N, C) logits and
// (N,) targets; the other shapes are reshaped to it here as torchext/ops/cross_entropy.py does, with its messages.
#include <ATen/ATen.h>
#include <torchext/cross_entropy.h>

#include <tuple>

#include "api.h"
#include "target_checks.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using CrossEntropySignature = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const OptionalTensor&,
                                                                 c10::string_view, int64_t, double);

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const OptionalTensor& weight,
                     std::string_view reduction, int64_t ignore_index, double label_smoothing) {
  static const auto op = find_op<CrossEntropySignature>("torchext::cross_entropy");
  check_defined("cross_entropy", "input", input);
  check_defined("cross_entropy", "target", target);
  const auto loss_of = [&](const Tensor& logits, const Tensor& targets) {
    return std::get<0>(op.call(logits, targets, weight, reduction, ignore_index, label_smoothing));
  };
  TORCH_CHECK_VALUE(input.dim() > 0,
                    "torchext.ops.cross_entropy: `input` must have at least one dimension (the classes)");
  if (input.dim() == 1) {
    TORCH_CHECK_VALUE(target.dim() == 0,
                      "torchext.ops.cross_entropy: for 1-D `input` (C,), `target` must be 0-dim, got shape ",
                      python_shape(target.sizes()));
    const Tensor loss = loss_of(input.unsqueeze(0), target.reshape({1}));
    return reduction == "none" ? loss.reshape({}) : loss;
  }
  if (input.dim() == 2) return loss_of(input, target);
  std::vector<int64_t> expected{input.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) expected.push_back(input.size(d));
  TORCH_CHECK_VALUE(target.sizes() == at::IntArrayRef(expected),
                    "torchext.ops.cross_entropy: `target` must have shape ", python_shape(expected),
                    " for `input` of shape ", python_shape(input.sizes()), ", got ", python_shape(target.sizes()));
  const Tensor loss = loss_of(input.movedim(1, -1).reshape({-1, input.size(1)}), target.reshape({-1}));
  return reduction == "none" ? loss.reshape(target.sizes()) : loss;
}

void check_targets() { flush_target_checks(); }

namespace nn {

CrossEntropyLossImpl::CrossEntropyLossImpl(torch::nn::CrossEntropyLossOptions options_) : options(std::move(options_)) {
  reset();
}

void CrossEntropyLossImpl::reset() { weight = register_buffer("weight", options.weight()); }

Tensor CrossEntropyLossImpl::forward(const Tensor& input, const Tensor& target) {
  return torchext::cross_entropy(input, target, as_optional(weight), reduction_name(options.reduction()),
                                 options.ignore_index(), options.label_smoothing());
}

void CrossEntropyLossImpl::pretty_print(std::ostream& stream) const { stream << "torchext::nn::CrossEntropyLoss()"; }

}  // namespace nn
}  // namespace torchext
