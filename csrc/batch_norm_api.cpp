// The C++ API of batch_norm, batch_norm_relu and batch_norm_add_relu (csrc/include/torchext/batch_norm.h). The
// modules compute the exponential-average factor and count num_batches_tracked as torch::nn::BatchNorm2d's forward
// (and torchext/nn.py's BatchNorm2d) do.
#include <ATen/ATen.h>
#include <torchext/batch_norm.h>

#include <sstream>
#include <tuple>

#include "api.h"
#include "batch_norm.h"

namespace torchext {

namespace {

using Tensor = at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using BatchNormSignature = batch_norm_signatures::BatchNorm;
using BatchNormReluSignature = batch_norm_signatures::BatchNormRelu;
using BatchNormAddReluSignature = batch_norm_signatures::BatchNormAddRelu;

// (training, momentum, running_mean, running_var) for one forward of a BatchNormImplBase module, as
// torch::nn::BatchNormImplBase::forward computes them (counting the batch in num_batches_tracked when it trains).
template <typename Module>
std::tuple<bool, double, OptionalTensor, OptionalTensor> module_args(Module& m) {
  double factor = m.options.momentum().value_or(0.0);
  if (m.is_training() && m.options.track_running_stats() && m.num_batches_tracked.defined()) {
    m.num_batches_tracked += 1;
    factor =
        m.options.momentum().has_value() ? *m.options.momentum() : 1.0 / m.num_batches_tracked.template item<double>();
  }
  return {m.is_training() || !m.options.track_running_stats(), factor, as_optional(m.running_mean),
          as_optional(m.running_var)};
}

void check_4d(const char* module, const Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() == 4, "torchext::nn::", module, ": expected 4D input (got ", input.dim(), "D input)");
}

// torch's check where the batch's statistics normalize: a channel's statistics need more than one value (N times
// the spatial size); torch's message after the module's name.
void check_batch_size(const char* module, const Tensor& input, bool training) {
  if (!training || input.dim() < 2) return;
  int64_t per_channel = input.size(0);
  for (int64_t d = 2; d < input.dim(); ++d) per_channel *= input.size(d);
  TORCH_CHECK_VALUE(per_channel != 1, "torchext::nn::", module,
                    ": Expected more than 1 value per channel when training, got input size ", input.sizes());
}

void print_options(std::ostream& stream, const char* name, const torch::nn::BatchNormOptions& o) {
  stream << std::boolalpha << "torchext::nn::" << name << "(" << o.num_features() << ", eps=" << o.eps()
         << ", momentum=";
  if (o.momentum().has_value()) {
    stream << *o.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << o.affine() << ", track_running_stats=" << o.track_running_stats();
}

}  // namespace

Tensor batch_norm(const Tensor& input, const OptionalTensor& weight, const OptionalTensor& bias,
                  const OptionalTensor& running_mean, const OptionalTensor& running_var, bool training, double momentum,
                  double eps, const OptionalTensor& sum, const OptionalTensor& sum_sq,
                  std::optional<std::string_view> kernel) {
  static const auto op = find_op<BatchNormSignature>("torchext::batch_norm");
  check_defined("batch_norm", "input", input);
  return std::get<0>(op.call(input, weight, bias, running_mean, running_var, training, momentum, eps, sum, sum_sq,
                             kernel, std::nullopt));
}

Tensor batch_norm_relu(const Tensor& input, const OptionalTensor& weight, const OptionalTensor& bias,
                       const OptionalTensor& running_mean, const OptionalTensor& running_var, bool training,
                       double momentum, double eps, const OptionalTensor& sum, const OptionalTensor& sum_sq,
                       std::optional<std::string_view> kernel) {
  static const auto op = find_op<BatchNormReluSignature>("torchext::batch_norm_relu");
  check_defined("batch_norm_relu", "input", input);
  return std::get<0>(op.call(input, weight, bias, running_mean, running_var, training, momentum, eps, sum, sum_sq,
                             kernel, std::nullopt));
}

Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const OptionalTensor& weight,
                           const OptionalTensor& bias, const OptionalTensor& running_mean,
                           const OptionalTensor& running_var, bool training, double momentum, double eps,
                           const OptionalTensor& sum, const OptionalTensor& sum_sq,
                           std::optional<std::string_view> kernel) {
  static const auto op = find_op<BatchNormAddReluSignature>("torchext::batch_norm_add_relu");
  check_defined("batch_norm_add_relu", "input", input);
  check_defined("batch_norm_add_relu", "residual", residual);
  return std::get<0>(op.call(input, residual, weight, bias, running_mean, running_var, training, momentum, eps, sum,
                             sum_sq, kernel, std::nullopt));
}

namespace nn {

BatchNorm2dImpl::BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_, std::string activation_)
    : torch::nn::BatchNormImplBase<2, BatchNorm2dImpl>(options_), activation(std::move(activation_)) {
  // A clear error now rather than at the first forward.
  TORCH_CHECK_VALUE(activation == "none" || activation == "relu",
                    "torchext::nn::BatchNorm2d: `activation` must be 'none' or 'relu', got '", activation, "'");
}

void BatchNorm2dImpl::_check_input_dim(const Tensor& input) { check_4d("BatchNorm2d", input); }

Tensor BatchNorm2dImpl::forward(const Tensor& input) {
  check_defined("nn::BatchNorm2d::forward", "input", input);
  _check_input_dim(input);
  const auto [training, momentum, running_mean, running_var] = module_args(*this);
  check_batch_size("BatchNorm2d", input, training);
  const auto fn = activation == "relu" ? torchext::batch_norm_relu : torchext::batch_norm;
  return fn(input, as_optional(weight), as_optional(bias), running_mean, running_var, training, momentum, options.eps(),
            std::nullopt, std::nullopt, std::nullopt);
}

void BatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  print_options(stream, "BatchNorm2d", options);
  if (activation != "none") stream << ", activation=" << activation;
  stream << ")";
}

BatchNormAddReLU2dImpl::BatchNormAddReLU2dImpl(const torch::nn::BatchNormOptions& options_)
    : torch::nn::BatchNormImplBase<2, BatchNormAddReLU2dImpl>(options_) {}

void BatchNormAddReLU2dImpl::_check_input_dim(const Tensor& input) { check_4d("BatchNormAddReLU2d", input); }

Tensor BatchNormAddReLU2dImpl::forward(const Tensor& input, const Tensor& residual) {
  check_defined("nn::BatchNormAddReLU2d::forward", "input", input);
  check_defined("nn::BatchNormAddReLU2d::forward", "residual", residual);
  _check_input_dim(input);
  const auto [training, momentum, running_mean, running_var] = module_args(*this);
  check_batch_size("BatchNormAddReLU2d", input, training);
  return torchext::batch_norm_add_relu(input, residual, as_optional(weight), as_optional(bias), running_mean,
                                       running_var, training, momentum, options.eps());
}

void BatchNormAddReLU2dImpl::pretty_print(std::ostream& stream) const {
  print_options(stream, "BatchNormAddReLU2d", options);
  stream << ")";
}

BatchNorm1dImpl::BatchNorm1dImpl(const torch::nn::BatchNormOptions& options_)
    : torch::nn::BatchNormImplBase<1, BatchNorm1dImpl>(options_) {}

void BatchNorm1dImpl::_check_input_dim(const Tensor& input) {
  TORCH_CHECK_VALUE(input.dim() == 2 || input.dim() == 3, "torchext::nn::BatchNorm1d: expected 2D or 3D input (got ",
                    input.dim(), "D input)");
}

Tensor BatchNorm1dImpl::forward(const Tensor& input) {
  check_defined("nn::BatchNorm1d::forward", "input", input);
  _check_input_dim(input);
  const auto [training, momentum, running_mean, running_var] = module_args(*this);
  check_batch_size("BatchNorm1d", input, training);
  return torchext::batch_norm(input, as_optional(weight), as_optional(bias), running_mean, running_var, training,
                              momentum, options.eps());
}

void BatchNorm1dImpl::pretty_print(std::ostream& stream) const {
  print_options(stream, "BatchNorm1d", options);
  stream << ")";
}

}  // namespace nn
}  // namespace torchext
